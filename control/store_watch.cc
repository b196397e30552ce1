#include "control/store_watch.h"

#include "base/log.h"

namespace aotid::control {

void StoreWatch::Start(uv_loop_t* loop) {
  auto v = store_->DataVersion();
  seen_version_ = v.ok() ? *v : -1;
  uv_timer_init(loop, &tick_);
  tick_.data = this;
  uv_timer_start(&tick_, [](uv_timer_t* t) { static_cast<StoreWatch*>(t->data)->Check(); }, 1000, 1000);
  uv_timer_init(loop, &settle_);
  settle_.data = this;
  uv_fs_event_init(loop, &dir_event_);
  dir_event_.data = this;
  int rc = uv_fs_event_start(
      &dir_event_,
      [](uv_fs_event_t* h, const char* file, int, int) {
        std::string_view f = file ? file : "";
        if (f.empty() || f.rfind("aotid.db", 0) == 0) static_cast<StoreWatch*>(h->data)->Wake();
      },
      store_->dir().c_str(), 0);
  if (rc != 0) LOG_WARNING << "cannot watch " << store_->dir() << " (" << uv_strerror(rc) << "); checking every second";
  started_ = true;
}

bool StoreWatch::Check() {
  auto v = store_->DataVersion();
  if (!v.ok()) {
    LOG_WARNING << "store check: " << v.status().message();
    return false;
  }
  if (*v == seen_version_) return false;
  seen_version_ = *v;
  on_change_();
  return true;
}

void StoreWatch::Wake() {
  if (Check()) return;
  settle_step_ = 0;
  uv_timer_start(&settle_, OnSettle, 1, 0);
}

void StoreWatch::OnSettle(uv_timer_t* t) {
  static constexpr uint64_t kNextDelayMs[] = {5, 25};
  auto* self = static_cast<StoreWatch*>(t->data);
  if (self->Check() || self->settle_step_ >= 2) return;
  uv_timer_start(t, OnSettle, kNextDelayMs[self->settle_step_++], 0);
}

void StoreWatch::Stop() {
  if (!started_) return;
  started_ = false;
  uv_timer_stop(&tick_);
  uv_timer_stop(&settle_);
  uv_close(reinterpret_cast<uv_handle_t*>(&tick_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&settle_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&dir_event_), nullptr);
}

}  // namespace aotid::control
