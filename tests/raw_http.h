// Raw HTTP/1.1 over loopback for tests that send bytes no client library
// would: hostile headers, broken framing, trickled requests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace aotid::testing {

// Raw HTTP over a connected socket: what was written, and all the reply
// until the server closes or `timeout_ms` passes.
inline std::string Exchange(int fd, const std::string& request, int timeout_ms = 5000) {
  if (!request.empty()) (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
    if (request.find("Connection: close") == std::string::npos &&
        reply.find("\r\n\r\n") != std::string::npos) {
      size_t cl = reply.find("Content-Length: ");
      size_t head = reply.find("\r\n\r\n") + 4;
      if (cl != std::string::npos && reply.size() >= head + std::stoul(reply.substr(cl + 16))) break;
    }
  }
  return reply;
}

// Connects to 127.0.0.1:port; from `from` (another loopback address,
// such as 127.0.0.2) when given; with a receive buffer of `rcvbuf` bytes
// when given (set before connecting: the kernel does not grow it then).
inline int ConnectTcp(int port, const char* from = nullptr, int rcvbuf = 0) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  if (from) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    if (::inet_pton(AF_INET, from, &local.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace aotid::testing
