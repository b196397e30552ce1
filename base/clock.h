// Time, as the code below the control loop reads it: a steady clock for
// waits and schedules, the wall clock for what people read, and a wait on a
// condition variable that ends at a steady deadline. Tests hand in a clock
// of their own (tests/base/fake_clock.h) and move it by hand, so the order
// of events is theirs to set, not a sleep's.
#pragma once

#include <cstdint>

#include "base/mutex.h"

namespace aotid {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds on a steady clock: never goes back; its zero is arbitrary.
  virtual int64_t NowMs() const = 0;
  // Milliseconds since the Unix epoch: may step back or forward.
  virtual int64_t WallMs() const = 0;
  // Lets go of *mu until `cv` is signalled or NowMs() reaches
  // `deadline_ms`, then holds it again. May return early: wait in a loop.
  virtual void WaitUntil(CondVar* cv, Mutex* mu, int64_t deadline_ms) const REQUIRES(mu) = 0;

  // The same steady clock in microseconds, and a wait to a deadline on it,
  // for waits shorter than a millisecond (a batch's delay). By default
  // they read and wait in whole milliseconds (a deadline rounds up).
  virtual int64_t NowUs() const { return NowMs() * 1000; }
  virtual void WaitUntilUs(CondVar* cv, Mutex* mu, int64_t deadline_us) const REQUIRES(mu) {
    WaitUntil(cv, mu, deadline_us / 1000 + (deadline_us % 1000 > 0 ? 1 : 0));
  }
};

// The machine's clocks (CLOCK_MONOTONIC and CLOCK_REALTIME). Never null;
// lives as long as the process.
const Clock* RealClock();

}  // namespace aotid
