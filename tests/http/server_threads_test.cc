// The HTTP server over loopback with more keep-alive clients than workers,
// so connections are handed between the workers and the poller while
// requests run. Small and quick, so that `./dev test --tsan` can run it;
// the daemon's routes over real connections are tested in e2e/.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "http/server.h"
#include "test_util.h"

namespace aotid::http {
namespace {

std::string ErrorBody(std::string_view m) { return "{\"error\":\"" + std::string(m) + "\"}"; }

// One keep-alive client connection; Ask() sends a request and reads its answer.
class Client {
 public:
  explicit Client(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~Client() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return connected_; }

  // The body of the answer to POST `path` with `body`; "" on any failure.
  std::string Ask(const std::string& path, const std::string& body) {
    std::string req = "POST " + path +
                      " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + std::to_string(body.size()) +
                      "\r\n\r\n" + body;
    if (::send(fd_, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return "";
    size_t head_end;
    while ((head_end = in_.find("\r\n\r\n")) == std::string::npos) {
      if (!Read()) return "";
    }
    size_t at = in_.find("Content-Length: ");
    if (at == std::string::npos || at > head_end) return "";
    size_t length = std::stoul(in_.substr(at + 16));
    size_t end = head_end + 4 + length;
    while (in_.size() < end) {
      if (!Read()) return "";
    }
    std::string answer = in_.substr(head_end + 4, length);
    in_.erase(0, end);
    return answer;
  }

 private:
  bool Read() {
    char buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_;
  bool connected_ = false;
  std::string in_;
};

TEST(HttpServer, MoreKeepAliveClientsThanWorkersEachGetTheirOwnAnswers) {
  ServerOptions opts;
  opts.port = 0;  // a free port: tests run side by side
  opts.threads = 2;
  std::atomic<int> handled{0};
  Server server(
      opts,
      [&](Request& req, Response& res) {
        handled.fetch_add(1);
        res.Set(req.path + ":" + req.body, "text/plain");
      },
      ErrorBody);
  ASSERT_OK(server.Bind());
  std::thread poller([&] { server.Serve(); });

  constexpr int kClients = 6, kRequests = 25;
  std::atomic<int> right{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      Client client(server.port());
      if (!client.connected()) return;
      for (int r = 0; r < kRequests; ++r) {
        std::string body = std::to_string(c) + "-" + std::to_string(r);
        if (client.Ask("/echo/" + std::to_string(c), body) == "/echo/" + std::to_string(c) + ":" + body) {
          right.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  server.Stop();
  poller.join();

  EXPECT_EQ(right.load(), kClients * kRequests);
  EXPECT_EQ(handled.load(), kClients * kRequests);
}

TEST(HttpServer, StopsWhileClientsAreConnectedAndIdle) {
  ServerOptions opts;
  opts.port = 0;  // a free port: tests run side by side
  opts.threads = 1;
  auto answer_ok = [](Request&, Response& res) { res.Set("ok", "text/plain"); };
  Server server(opts, answer_ok, ErrorBody);
  ASSERT_OK(server.Bind());
  std::thread poller([&] { server.Serve(); });
  // One parked with the poller, one held by the worker between requests,
  // one that never sends a byte.
  Client parked(server.port()), held(server.port()), silent(server.port());
  ASSERT_TRUE(parked.connected() && held.connected() && silent.connected());
  EXPECT_EQ(parked.Ask("/a", ""), "ok");
  EXPECT_EQ(held.Ask("/b", ""), "ok");
  server.Stop();
  poller.join();  // returns: no worker is left waiting on an idle connection
}

}  // namespace
}  // namespace aotid::http
