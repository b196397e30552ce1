// A clock that moves only when a test says so (base/clock.h). A wait ends
// when its deadline is reached by Advance, or when it is signalled. A
// waiter's mutex and condition variable must outlive any Advance that may
// see them (tests move the clock from the thread that owns the waiter).
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "base/clock.h"

namespace aotid::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t now_ms = 1'000'000, int64_t wall_ms = 1'800'000'000'000)
      : now_ms_(now_ms), wall_ms_(wall_ms) {}

  int64_t NowMs() const override {
    MutexLock lock(&mu_);
    return now_ms_;
  }
  int64_t WallMs() const override {
    MutexLock lock(&mu_);
    return wall_ms_;
  }
  // Both clocks move by `ms`; waiters whose deadline passed wake.
  void Advance(int64_t ms) { Move(ms, ms); }
  // The wall clock alone steps (a time server's correction, a person).
  void StepWall(int64_t ms) { Move(0, ms); }
  // Waits in WaitUntil now.
  int Waiters() const {
    MutexLock lock(&mu_);
    return static_cast<int>(waiters_.size());
  }
  // Until `n` threads wait in WaitUntil (a thread has done its work and
  // gone to sleep); false after 10 s of real time.
  bool AwaitWaiters(int n) const {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    MutexLock lock(&mu_);
    while (static_cast<int>(waiters_.size()) != n) {
      if (!waiters_changed_.WaitUntil(&mu_, deadline) && static_cast<int>(waiters_.size()) != n) return false;
    }
    return true;
  }

  void WaitUntil(CondVar* cv, Mutex* mu, int64_t deadline_ms) const override REQUIRES(mu) {
    {
      MutexLock lock(&mu_);
      if (now_ms_ >= deadline_ms) return;
      waiters_.emplace_back(cv, mu);
      waiters_changed_.SignalAll();
    }
    // Advance takes *mu before it signals, so a move between the check
    // above and this wait is not missed.
    cv->Wait(mu);
    MutexLock lock(&mu_);
    auto it = std::find(waiters_.begin(), waiters_.end(), std::make_pair(cv, mu));
    if (it != waiters_.end()) waiters_.erase(it);
    waiters_changed_.SignalAll();
  }

 private:
  void Move(int64_t steady_ms, int64_t wall_ms) {
    std::vector<std::pair<CondVar*, Mutex*>> waiting;
    {
      MutexLock lock(&mu_);
      now_ms_ += steady_ms;
      wall_ms_ += wall_ms;
      waiting = waiters_;
    }
    for (auto& [cv, mu] : waiting) {
      MutexLock lock(mu);
      cv->SignalAll();
    }
  }

  mutable Mutex mu_;
  int64_t now_ms_ GUARDED_BY(mu_);
  int64_t wall_ms_ GUARDED_BY(mu_);
  mutable std::vector<std::pair<CondVar*, Mutex*>> waiters_ GUARDED_BY(mu_);
  mutable CondVar waiters_changed_;
};

}  // namespace aotid::testing
