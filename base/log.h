// A small leveled logger writing one line per message: to stderr, or to a
// file that rotates by size. Thread-safe: each line is written with a
// single write(2).
//
// On stderr a line is "2026-12-03T14:00:00.123Z info message". When stderr
// is the journal's stream (systemd sets $JOURNAL_STREAM to its device and
// inode) it is "<6>info message" instead: journald takes the priority from
// the prefix and stamps the time itself.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "base/status.h"

namespace aotid::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLevel(Level level);
Level GetLevel();
// Parses "debug", "info", "warning"/"warn", "error"; false if unknown.
bool ParseLevel(std::string_view text, Level* out);
void Write(Level level, std::string_view message);

// Looks at $JOURNAL_STREAM again (called once on its own at the first
// line; tests call it after changing stderr).
void DetectJournal();

// From now on lines go to `path` (created 0640, appended to) instead of
// stderr. When it passes `max_bytes` it becomes PATH.1, PATH.1 becomes
// PATH.2 and so on; PATH.`keep` is removed. launchd, unlike journald,
// rotates nothing. An error (the file cannot be opened) leaves stderr.
Status SetFile(const std::string& path, int64_t max_bytes, int keep);
// Back to stderr (for tests).
void ResetToStderr();

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
#define AOTID_LOG(level)                                                                             \
  for (bool aotid_log_once = ::aotid::log::Level::level >= ::aotid::log::GetLevel(); aotid_log_once; \
       aotid_log_once = false)                                                                       \
  ::aotid::log::Line(::aotid::log::Level::level)
#define LOG_DEBUG AOTID_LOG(kDebug)
#define LOG_INFO AOTID_LOG(kInfo)
#define LOG_WARNING AOTID_LOG(kWarning)
#define LOG_ERROR AOTID_LOG(kError)
