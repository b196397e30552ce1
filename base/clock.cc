#include "base/clock.h"

#include <chrono>

namespace aotid {
namespace {

class SystemClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  int64_t WallMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  void WaitUntil(CondVar* cv, Mutex* mu, int64_t deadline_ms) const override REQUIRES(mu) {
    cv->WaitUntil(mu, std::chrono::steady_clock::time_point(std::chrono::milliseconds(deadline_ms)));
  }
  int64_t NowUs() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void WaitUntilUs(CondVar* cv, Mutex* mu, int64_t deadline_us) const override REQUIRES(mu) {
    cv->WaitUntil(mu, std::chrono::steady_clock::time_point(std::chrono::microseconds(deadline_us)));
  }
};

}  // namespace

const Clock* RealClock() {
  static const SystemClock* clock = new SystemClock;
  return clock;
}

}  // namespace aotid
