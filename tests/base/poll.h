// A bounded poll, for what a test cannot be told of: another process (a
// daemon coming up, a child that exits, a file it writes). Within one
// process, wait on a condition instead (tests/base/counter.h, a fake
// clock); a sleep there only guesses at the order of events.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace aotid::testing {

// Checks `done` every `every_ms` until it holds or `timeout_s` pass; the
// last check decides.
inline bool PollUntil(const std::function<bool()>& done, double timeout_s, int every_ms = 50) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(every_ms));
  }
  return done();
}

}  // namespace aotid::testing
