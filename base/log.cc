#include "base/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "base/mutex.h"

namespace aotid::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::atomic<int> g_journal{-1};  // -1: not looked at yet

// The log file, when there is one.
struct File {
  Mutex mu;
  int fd GUARDED_BY(mu) = -1;
  std::string path GUARDED_BY(mu);
  int64_t max_bytes GUARDED_BY(mu) = 0;
  int keep GUARDED_BY(mu) = 0;
  int64_t size GUARDED_BY(mu) = 0;
  bool rotate_failed GUARDED_BY(mu) = false;
};
File& TheFile() {
  static File* f = new File;
  return *f;
}

int Priority(Level level) {  // syslog's: debug 7, info 6, warning 4, error 3
  switch (level) {
    case Level::kDebug: return 7;
    case Level::kInfo: return 6;
    case Level::kWarning: return 4;
    case Level::kError: return 3;
  }
  return 6;
}

// Renames PATH.k to PATH.k+1 from the oldest on, PATH to PATH.1, and opens
// a new PATH.
void Rotate(File& f) REQUIRES(f.mu) {
  for (int k = f.keep - 1; k >= 1; --k) {
    std::string from = f.path + "." + std::to_string(k), to = f.path + "." + std::to_string(k + 1);
    ::rename(from.c_str(), to.c_str());
  }
  int moved = f.keep >= 1 ? ::rename(f.path.c_str(), (f.path + ".1").c_str()) : ::unlink(f.path.c_str());
  if (moved != 0) {
    // The file stays and grows; said once on stderr, not on every line.
    if (!f.rotate_failed) {
      std::string say = "aotid: cannot rotate log.file " + f.path + ": " + std::strerror(errno) +
                        " (its directory must be writable); it grows past log.max_size_mb\n";
      (void)!::write(STDERR_FILENO, say.data(), say.size());
    }
    f.rotate_failed = true;
    f.size = 0;  // tried again after another max_bytes
    return;
  }
  f.rotate_failed = false;
  int fd = ::open(f.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd >= 0) {
    ::close(f.fd);
    f.fd = fd;
    f.size = 0;
  }
}

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
  if (text == "debug")
    *out = Level::kDebug;
  else if (text == "info")
    *out = Level::kInfo;
  else if (text == "warning" || text == "warn")
    *out = Level::kWarning;
  else if (text == "error")
    *out = Level::kError;
  else
    return false;
  return true;
}

void DetectJournal() {
  // "DEV:INO" of the journal's stream; stderr is it when they match.
  bool journal = false;
  if (const char* stream = std::getenv("JOURNAL_STREAM")) {
    unsigned long long dev = 0, ino = 0;
    struct stat st;
    if (std::sscanf(stream, "%llu:%llu", &dev, &ino) == 2 && ::fstat(STDERR_FILENO, &st) == 0) {
      journal = static_cast<unsigned long long>(st.st_dev) == dev &&
                static_cast<unsigned long long>(st.st_ino) == ino;
    }
  }
  g_journal.store(journal ? 1 : 0);
}

Status SetFile(const std::string& path, int64_t max_bytes, int keep) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) return ErrnoError("open log.file " + path, errno);
  struct stat st;
  int64_t size = ::fstat(fd, &st) == 0 ? st.st_size : 0;
  File& f = TheFile();
  MutexLock lock(&f.mu);
  if (f.fd >= 0) ::close(f.fd);
  f.fd = fd;
  f.path = path;
  f.max_bytes = max_bytes;
  f.keep = keep;
  f.size = size;
  return Status::OK();
}

void ResetToStderr() {
  File& f = TheFile();
  MutexLock lock(&f.mu);
  if (f.fd >= 0) ::close(f.fd);
  f.fd = -1;
}

void Write(Level level, std::string_view message) {
  if (g_journal.load() < 0) DetectJournal();
  File& f = TheFile();
  bool to_file;
  {
    MutexLock lock(&f.mu);
    to_file = f.fd >= 0;
  }
  if (!to_file && g_journal.load() == 1) {
    // Each line of a message carries the priority: journald reads one line
    // as one entry (a build's compiler output spans many).
    const std::string prefix = "<" + std::to_string(Priority(level)) + ">";
    std::string line = prefix + LevelName(level) + " ";
    for (char ch : message) {
      line += ch;
      if (ch == '\n') line += prefix;
    }
    line += '\n';
    ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
    (void)unused;
    return;
  }
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
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
  {
    MutexLock lock(&f.mu);
    if (f.fd >= 0) {
      ssize_t n = ::write(f.fd, line.data(), line.size());
      if (n == static_cast<ssize_t>(line.size())) {
        f.size += n;
        if (f.max_bytes > 0 && f.size >= f.max_bytes) Rotate(f);
        return;
      }
      // The file takes no more (a full disk, /dev/full): the line goes to
      // stderr rather than nowhere.
    }
  }
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace aotid::log
