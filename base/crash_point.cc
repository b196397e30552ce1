#include "base/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

namespace aotid {

void CrashPoint(std::string_view name) {
  static const std::string armed = [] {
    const char* v = std::getenv("AOTID_TEST_CRASH_AT");
    return std::string(v ? v : "");
  }();
  if (!armed.empty() && armed == name) ::kill(::getpid(), SIGKILL);
}

void PausePoint(std::string_view name) {
  static const std::pair<std::string, int> armed = [] {
    const char* v = std::getenv("AOTID_TEST_PAUSE_AT");
    std::string s = v ? v : "";
    size_t eq = s.find('=');
    if (eq == std::string::npos) return std::pair<std::string, int>{};
    return std::pair<std::string, int>{s.substr(0, eq), std::atoi(s.c_str() + eq + 1)};
  }();
  if (!armed.first.empty() && armed.first == name && armed.second > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(armed.second));
  }
}

}  // namespace aotid
