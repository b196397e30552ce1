#include "base/fd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

namespace aotid::fd {

bool SetCloseOnExec(int fd, bool nonblocking) {
  if (::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return false;
  if (!nonblocking) return true;
  int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

Status Pipe(int fds[2], bool nonblocking) {
#ifdef __linux__
  if (::pipe2(fds, O_CLOEXEC | (nonblocking ? O_NONBLOCK : 0)) != 0)
    return IOError(std::string("pipe: ") + std::strerror(errno));
#else
  if (::pipe(fds) != 0) return IOError(std::string("pipe: ") + std::strerror(errno));
  for (int i = 0; i < 2; ++i) {
    if (!SetCloseOnExec(fds[i], nonblocking)) {
      int e = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      fds[0] = fds[1] = -1;
      return IOError(std::string("pipe: fcntl: ") + std::strerror(e));
    }
  }
#endif
  return Status::OK();
}

int Socket(int domain, int type, int protocol) {
#ifdef SOCK_CLOEXEC
  return ::socket(domain, type | SOCK_CLOEXEC, protocol);
#else
  int fd = ::socket(domain, type, protocol);
  if (fd >= 0 && !SetCloseOnExec(fd)) {
    int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
#endif
}

StatusOr<int> ListenTcp(const std::string& host, int port, const std::string& what, const std::string& hint,
                        int* out) {
  *out = -1;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return InvalidArgument("cannot listen" + what + " on " + host + ": " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owner(res, ::freeaddrinfo);
  int fd = Socket(res->ai_family, SOCK_STREAM);
  if (fd < 0) return ErrnoError("socket", errno);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    int e = errno;
    ::close(fd);
    return Unavailable("cannot listen" + what + " on " + host + ":" + service + ": " + std::strerror(e) +
                       " (" + hint + ")");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  *out = fd;
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

std::string PeerAddress(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
  } else if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      ::inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    }
  }
  return text;
}

}  // namespace aotid::fd
