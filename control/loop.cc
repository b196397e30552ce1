#include "control/loop.h"

#include <chrono>
#include <deque>

#include "base/mutex.h"

namespace aotid::control {

struct UvLoop::Timer {
  uv_timer_t handle{};
  UvLoop* owner = nullptr;
  std::function<void()> fn;
};

// Shared with the threads that post: a post after Close finds it closed
// and drops its work.
struct UvLoop::Inbox {
  Mutex mu;
  bool closed GUARDED_BY(mu) = false;
  std::deque<std::function<void()>> work GUARDED_BY(mu);
  uv_async_t* async GUARDED_BY(mu) = nullptr;

  void Post(std::function<void()> fn) EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (closed) return;
    work.push_back(std::move(fn));
    uv_async_send(async);
  }
  void RunPosted() EXCLUDES(mu) {
    std::deque<std::function<void()>> now;
    {
      MutexLock lock(&mu);
      now.swap(work);
    }
    for (auto& fn : now) fn();
  }
};

UvLoop::UvLoop(uv_loop_t* loop) : loop_(loop), inbox_(std::make_shared<Inbox>()) {
  auto* async = new uv_async_t;
  async->data = inbox_.get();
  uv_async_init(loop_, async, [](uv_async_t* h) { static_cast<Inbox*>(h->data)->RunPosted(); });
  // Wakes the loop when work comes, never keeps it running by itself.
  uv_unref(reinterpret_cast<uv_handle_t*>(async));
  MutexLock lock(&inbox_->mu);
  inbox_->async = async;
}

void UvLoop::Post(std::function<void()> fn) { inbox_->Post(std::move(fn)); }

std::function<void(std::function<void()>)> UvLoop::Poster() {
  return [inbox = inbox_](std::function<void()> fn) { inbox->Post(std::move(fn)); };
}

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
  {
    MutexLock lock(&inbox_->mu);
    if (!inbox_->closed) {
      inbox_->closed = true;
      inbox_->work.clear();
      uv_close(reinterpret_cast<uv_handle_t*>(inbox_->async),
               [](uv_handle_t* h) { delete reinterpret_cast<uv_async_t*>(h); });
      inbox_->async = nullptr;
    }
  }
  for (Timer* t : pending_) {
    uv_timer_stop(&t->handle);
    uv_close(reinterpret_cast<uv_handle_t*>(&t->handle),
             [](uv_handle_t* c) { delete static_cast<Timer*>(c->data); });
  }
  pending_.clear();
}

}  // namespace aotid::control
