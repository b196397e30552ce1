#include "daemon/api_client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "base/fd.h"
#include "base/fs.h"

namespace aotid::daemon {

HttpAnswer ApiCall(const http::ServerOptions& where, const std::string& method, const std::string& path,
                   const std::string& token, int timeout_ms, const std::string& body) {
  HttpAnswer a;
  int fd = -1;
  if (!where.unix_path.empty()) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (where.unix_path.size() >= sizeof addr.sun_path) return {0, "", "socket path too long"};
    std::memcpy(addr.sun_path, where.unix_path.c_str(), where.unix_path.size());
    fd = fd::Socket(AF_UNIX, SOCK_STREAM);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      a.error = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return a;
    }
  } else {
    std::string host = where.host.empty() || where.host == "0.0.0.0" ? "127.0.0.1"
                       : where.host == "::"                          ? "::1"
                                                                     : where.host;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), std::to_string(where.port).c_str(), &hints, &res); rc != 0) {
      return {0, "", ::gai_strerror(rc)};
    }
    fd = fd::Socket(res->ai_family, SOCK_STREAM);
    int rc = fd < 0 ? -1 : ::connect(fd, res->ai_addr, res->ai_addrlen);
    int e = errno;
    ::freeaddrinfo(res);
    if (rc != 0) {
      if (fd >= 0) ::close(fd);
      return {0, "", std::strerror(e)};
    }
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  if (!token.empty()) req += "Authorization: Bearer " + token + "\r\n";
  if (!body.empty() || method == "POST") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string in;
  char buf[4096];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0) {
      a.error = "no answer within " + std::to_string(timeout_ms / 1000) + " s";
      break;
    }
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    if (in.size() > (8 << 20)) break;
  }
  ::close(fd);
  if (in.compare(0, 5, "HTTP/") == 0 && in.size() > 12) {
    a.status = std::atoi(in.c_str() + 9);
    if (size_t start = in.find("\r\n\r\n"); start != std::string::npos) a.body = in.substr(start + 4);
    a.error.clear();
  } else if (a.error.empty()) {
    a.error = "not an HTTP answer";
  }
  return a;
}

std::string ReadTokenQuietly(const std::string& token_file) {
  if (token_file.empty()) return "";
  auto t = fs::ReadFile(token_file);
  if (!t.ok()) return "";
  std::string token = *t;
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  size_t first = token.find_first_not_of(" \t\r\n");
  return first == std::string::npos ? "" : token.substr(first);
}

}  // namespace aotid::daemon
