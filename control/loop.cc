#include "control/loop.h"

#include <chrono>

namespace aotid::control {

struct UvLoop::Timer {
  uv_timer_t handle{};
  UvLoop* owner = nullptr;
  std::function<void()> fn;
};

int64_t UvLoop::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void UvLoop::RunAfter(int64_t delay_ms, std::function<void()> fn) {
  if (closed_) return;
  auto* t = new Timer;
  t->owner = this;
  t->fn = std::move(fn);
  t->handle.data = t;
  uv_timer_init(loop_, &t->handle);
  pending_.insert(t);
  uv_timer_start(
      &t->handle,
      [](uv_timer_t* h) {
        auto* timer = static_cast<Timer*>(h->data);
        timer->owner->pending_.erase(timer);
        std::function<void()> run = std::move(timer->fn);
        uv_close(reinterpret_cast<uv_handle_t*>(h),
                 [](uv_handle_t* c) { delete static_cast<Timer*>(c->data); });
        run();
      },
      static_cast<uint64_t>(std::max<int64_t>(0, delay_ms)), 0);
}

void UvLoop::Close() {
  closed_ = true;
  for (Timer* t : pending_) {
    uv_timer_stop(&t->handle);
    uv_close(reinterpret_cast<uv_handle_t*>(&t->handle),
             [](uv_handle_t* c) { delete static_cast<Timer*>(c->data); });
  }
  pending_.clear();
}

}  // namespace aotid::control
