#include "control/store_watch.h"

#include "base/log.h"

namespace aotid::control {

void StoreWatch::Start(uv_loop_t* file_events) {
  auto v = store_->DataVersion();
  seen_version_ = v.ok() ? *v : -1;
  *alive_ = true;
  loop_->RunAfter(kTickMs, [this, alive = alive_] {
    if (*alive) Tick();
  });
  if (file_events == nullptr) return;
  dir_event_ = new uv_fs_event_t;
  uv_fs_event_init(file_events, dir_event_);
  dir_event_->data = this;
  int rc = uv_fs_event_start(
      dir_event_,
      [](uv_fs_event_t* h, const char* file, int, int) {
        std::string_view f = file ? file : "";
        if (f.empty() || f.rfind("aotid.db", 0) == 0) static_cast<StoreWatch*>(h->data)->Wake();
      },
      store_->dir().c_str(), 0);
  if (rc != 0)
    LOG_WARNING << "cannot watch " << store_->dir() << " (" << uv_strerror(rc) << "); checking every second";
}

void StoreWatch::Tick() {
  Check();
  loop_->RunAfter(kTickMs, [this, alive = alive_] {
    if (*alive) Tick();
  });
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
  Settle(++wake_generation_, 0);
}

void StoreWatch::Settle(uint64_t generation, int step) {
  static constexpr int64_t kDelayMs[] = {1, 5, 25};
  if (step >= 3) return;
  loop_->RunAfter(kDelayMs[step], [this, alive = alive_, generation, step] {
    if (!*alive || generation != wake_generation_) return;
    if (!Check()) Settle(generation, step + 1);
  });
}

void StoreWatch::Stop() {
  *alive_ = false;
  if (dir_event_ != nullptr) {
    uv_fs_event_stop(dir_event_);
    uv_close(reinterpret_cast<uv_handle_t*>(dir_event_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_fs_event_t*>(h); });
    dir_event_ = nullptr;
  }
}

}  // namespace aotid::control
