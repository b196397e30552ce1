#include "daemon/service_manager.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/fd.h"
#include "base/log.h"

namespace aotid::daemon {
namespace {

// $NAME as a number, or nullopt when unset or not a whole number.
std::optional<int64_t> EnvNumber(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

constexpr int kFirstActivatedFd = 3;  // SD_LISTEN_FDS_START

}  // namespace

ServiceManager ServiceManager::FromEnvironment() {
  ServiceManager m;
  if (const char* path = std::getenv("NOTIFY_SOCKET"); path && (path[0] == '/' || path[0] == '@')) {
    m.socket_path_ = path;
  }
  auto watchdog_pid = EnvNumber("WATCHDOG_PID");
  if (!watchdog_pid || *watchdog_pid == ::getpid()) {
    if (auto usec = EnvNumber("WATCHDOG_USEC"); usec && *usec > 0) m.watchdog_usec_ = *usec;
  }
  // The journal's stream is the daemon's stderr alone: runners and builds
  // write to pipes the daemon reads (and logs with priorities).
  log::DetectJournal();
  for (const char* name : {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"})
    ::unsetenv(name);
  return m;
}

void ServiceManager::Notify(const std::string& state) {
  if (socket_path_.empty()) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof addr.sun_path) {
    if (!warned_) LOG_WARNING << "NOTIFY_SOCKET is too long for a socket address; not notifying";
    warned_ = true;
    return;
  }
  std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_path_.size());
  if (socket_path_[0] == '@') {
    addr.sun_path[0] = '\0';  // abstract: the length says where the name ends
  } else {
    ++len;  // a path: with its terminating NUL
  }
  int fd = fd::Socket(AF_UNIX, SOCK_DGRAM);
  if (fd < 0) return;
  ssize_t sent =
      ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), len);
  int e = errno;
  ::close(fd);
  if (sent < 0 && !warned_) {
    LOG_WARNING << "cannot notify the service manager at " << socket_path_ << ": " << std::strerror(e);
    warned_ = true;
  }
}

StatusOr<std::optional<int>> TakeActivatedSocket() {
  auto pid = EnvNumber("LISTEN_PID");
  auto fds = EnvNumber("LISTEN_FDS");
  bool ours = pid && *pid == ::getpid() && fds && *fds > 0;
  for (const char* name : {"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"}) ::unsetenv(name);
  if (!ours) return std::optional<int>();
  if (*fds != 1) {
    return InvalidArgument("socket activation passed " + std::to_string(*fds) +
                           " sockets; aotid serves on one (give its .socket unit one Listen line)");
  }
  const int fd = kFirstActivatedFd;
  int type = 0, listening = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) {
    return InvalidArgument("socket activation passed fd 3, which is not a stream socket");
  }
  len = sizeof listening;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) {
    return InvalidArgument("socket activation passed fd 3, which is not listening");
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // runners and builds must not inherit it
  return std::optional<int>(fd);
}

}  // namespace aotid::daemon
