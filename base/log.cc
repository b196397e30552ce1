#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace aotid::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};

const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarning: return "warning";
    case Level::kError: return "error";
  }
  return "?";
}
}  // namespace

void SetLevel(Level level) { g_level.store(level); }
Level GetLevel() { return g_level.load(); }

bool ParseLevel(std::string_view text, Level* out) {
  if (text == "debug") *out = Level::kDebug;
  else if (text == "info") *out = Level::kInfo;
  else if (text == "warning" || text == "warn") *out = Level::kWarning;
  else if (text == "error") *out = Level::kError;
  else return false;
  return true;
}

void Write(Level level, std::string_view message) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string line;
  line.reserve(message.size() + 48);
  line += stamp;
  char frac[8];
  std::snprintf(frac, sizeof frac, ".%03dZ ", static_cast<int>(ms));
  line += frac;
  line += LevelName(level);
  line += ' ';
  line += message;
  line += '\n';
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace aotid::log
