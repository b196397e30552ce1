// A minimal keep-alive HTTP/1.1 client on a raw socket, for the
// benchmarks that time aotid's HTTP API from the client's side.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace aotid::bench {

// A minimal keep-alive HTTP/1.1 client on a raw socket: the request bytes
// are built once, and a reply is read up to its Content-Length. It costs
// about what the echo client costs, so the server's share of a round trip
// is what is left (the httplib client adds its own parsing on top).
class RawHttp {
 public:
  explicit RawHttp(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawHttp() { ::close(fd_); }
  static std::string Request(const std::string& method, const std::string& path, const std::string& body,
                             std::optional<size_t> header_length = std::nullopt) {
    std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    if (header_length) {
      r += "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: " +
           std::to_string(*header_length) + "\r\n";
    } else if (!body.empty()) {
      r += "Content-Type: application/json\r\n";
    }
    if (!body.empty()) r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    return r + "\r\n" + body;
  }
  // Sends `request`, reads one reply; its status code, or -1.
  int RoundTrip(const std::string& request) {
    if (!ok_ || ::write(fd_, request.data(), request.size()) != static_cast<ssize_t>(request.size()))
      return -1;
    buf_.clear();
    size_t head_end = std::string::npos, need = 0;
    char chunk[65536];
    for (;;) {
      if (head_end != std::string::npos && buf_.size() >= need) break;
      ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n <= 0) return -1;
      buf_.append(chunk, static_cast<size_t>(n));
      if (head_end == std::string::npos && (head_end = buf_.find("\r\n\r\n")) != std::string::npos) {
        size_t cl = buf_.find("Content-Length: ");
        need =
            head_end + 4 + (cl == std::string::npos || cl > head_end ? 0 : std::stoul(buf_.substr(cl + 16)));
      }
    }
    return buf_.size() > 12 ? std::atoi(buf_.c_str() + 9) : -1;
  }
  // The last reply, head and body.
  const std::string& reply() const { return buf_; }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string buf_;
};

}  // namespace aotid::bench
