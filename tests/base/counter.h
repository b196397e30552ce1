// A count that other threads move and a test waits on: how a test learns
// that something happened on another thread (a request queued, a callback
// ran) rather than sleeping and hoping it has. Waits are bounded by 10 s of
// real time and say false when it passes, so a broken feature fails the
// test instead of hanging it.
#pragma once

#include <chrono>

#include "base/mutex.h"

namespace aotid::testing {

class Counter {
 public:
  void Add(int n = 1) {
    MutexLock lock(&mu_);
    count_ += n;
    changed_.SignalAll();
  }
  void Set(int n) {
    MutexLock lock(&mu_);
    count_ = n;
    changed_.SignalAll();
  }
  int Get() const {
    MutexLock lock(&mu_);
    return count_;
  }
  // Until the count is at least `n` (AwaitAtLeast) or exactly `n` (Await).
  bool AwaitAtLeast(int n) const { return AwaitFor(n, false); }
  bool Await(int n) const { return AwaitFor(n, true); }

 private:
  bool AwaitFor(int n, bool exact) const {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    MutexLock lock(&mu_);
    while (exact ? count_ != n : count_ < n) {
      if (!changed_.WaitUntil(&mu_, deadline)) return exact ? count_ == n : count_ >= n;
    }
    return true;
  }

  mutable Mutex mu_;
  mutable CondVar changed_;
  int count_ GUARDED_BY(mu_) = 0;
};

}  // namespace aotid::testing
