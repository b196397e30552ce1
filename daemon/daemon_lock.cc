#include "daemon/daemon_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "base/fs.h"

namespace aotid::daemon {
namespace {

std::string LockPath(const std::string& dir) { return dir + "/daemon.lock"; }

void Rewrite(int fd, const std::string& text) {
  if (::ftruncate(fd, 0) != 0) return;
  ssize_t unused = ::pwrite(fd, text.data(), text.size(), 0);
  (void)unused;
}

}  // namespace

StatusOr<int> LockStore(const std::string& dir) {
  std::string path = LockPath(dir);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open " + path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return FailedPrecondition("another aotid serve is already using the store " + dir);
  }
  Rewrite(fd, std::to_string(::getpid()) + "\n");
  return fd;
}

void AnnounceAddress(int lock_fd, const std::string& address) {
  Rewrite(lock_fd, std::to_string(::getpid()) + "\n" + address + "\n");
}

std::optional<RunningDaemon> FindDaemon(const std::string& dir) {
  std::string path = LockPath(dir);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  // A shared lock is granted unless a daemon holds the exclusive one.
  bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);
  if (!held) return std::nullopt;
  RunningDaemon d;
  auto text = fs::ReadFile(path);
  if (text.ok()) {
    size_t nl = text->find('\n');
    d.pid = text->substr(0, nl);
    if (nl != std::string::npos) {
      size_t end = text->find('\n', nl + 1);
      d.address = text->substr(nl + 1, end == std::string::npos ? std::string::npos : end - nl - 1);
    }
  }
  return d;
}

}  // namespace aotid::daemon
