// Time and deferred work for the control plane. The control loop's logic
// (reconciler, store watch) asks this for the time and for later wake-ups
// instead of calling libuv, so tests drive it with a clock they advance.
//
// Everything runs on one thread: callbacks run on the thread that runs the
// loop, never concurrently with each other.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>

namespace aotid::control {

class Loop {
 public:
  virtual ~Loop() = default;
  // Milliseconds on a steady clock (never goes back; its zero is arbitrary).
  virtual int64_t NowMs() const = 0;
  // Runs `fn` once on the loop thread, `delay_ms` (at least 0) from now.
  // A callback still pending at the loop's Close() is dropped unrun.
  virtual void RunAfter(int64_t delay_ms, std::function<void()> fn) = 0;
  // Runs `fn` once on the loop thread, soon. The one call here that any
  // thread may make (a request's thread telling the control plane that a
  // model is wanted). Dropped unrun once the loop is closed.
  virtual void Post(std::function<void()> fn) = 0;
  // Post, as a function that stays safe to call from any thread after the
  // loop is gone (it does nothing then): for callbacks that may outlive
  // the loop, such as a model's, held by a request still in flight.
  virtual std::function<void(std::function<void()>)> Poster() = 0;
};

// The real one, on a libuv loop: each RunAfter is a one-shot uv timer.
class UvLoop final : public Loop {
 public:
  explicit UvLoop(uv_loop_t* loop);
  ~UvLoop() override { Close(); }
  UvLoop(const UvLoop&) = delete;
  UvLoop& operator=(const UvLoop&) = delete;

  int64_t NowMs() const override;
  void RunAfter(int64_t delay_ms, std::function<void()> fn) override;
  void Post(std::function<void()> fn) override;
  std::function<void(std::function<void()>)> Poster() override;
  // Closes the pending timers unrun (so uv_run can return); later
  // RunAfter and Post calls are ignored.
  void Close();
  uv_loop_t* uv() const { return loop_; }

 private:
  struct Timer;
  struct Inbox;  // what other threads post, behind a uv_async_t
  uv_loop_t* loop_;
  std::shared_ptr<Inbox> inbox_;
  std::set<Timer*> pending_;
  bool closed_ = false;
};

}  // namespace aotid::control
