// A small leveled logger writing one line per message to stderr.
// Thread-safe: each line is written with a single write(2).
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace aotid::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLevel(Level level);
Level GetLevel();
// Parses "debug", "info", "warning"/"warn", "error"; false if unknown.
bool ParseLevel(std::string_view text, Level* out);
void Write(Level level, std::string_view message);

class Line {
 public:
  explicit Line(Level level) : level_(level) {}
  ~Line() { Write(level_, stream_.str()); }
  template <typename T>
  Line& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  Level level_;
  std::ostringstream stream_;
};

}  // namespace aotid::log

// A loop that runs at most once: safe inside an unbraced if/else, and the
// message is not even formatted when the level is off.
#define AOTID_LOG(level)                                                            \
  for (bool aotid_log_once = ::aotid::log::Level::level >= ::aotid::log::GetLevel(); \
       aotid_log_once; aotid_log_once = false)                                     \
  ::aotid::log::Line(::aotid::log::Level::level)
#define LOG_DEBUG AOTID_LOG(kDebug)
#define LOG_INFO AOTID_LOG(kInfo)
#define LOG_WARNING AOTID_LOG(kWarning)
#define LOG_ERROR AOTID_LOG(kError)
