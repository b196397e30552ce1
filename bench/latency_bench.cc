// One infer over HTTP (keep-alive, loopback) against the same call made
// in-process on the same build, and against the floor: a bare TCP echo of
// the same number of bytes over loopback. All three interleaved in one run.
//
//   aotid_latency_bench --store DIR --model NAME --port PORT --request FILE [--iterations N]
//
// FILE is an infer request body (JSON). The in-process side loads the cached
// build of the model's latest version for this machine, as the daemon does.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/fs.h"
#include "bench/cached_model.h"
#include "serving/tensor_codec.h"

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

int Die(const std::string& msg) {
  std::fprintf(stderr, "aotid_latency_bench: %s\n", msg.c_str());
  return 1;
}

// A loopback echo server on its own thread: reads `size` bytes, writes them
// back, until the client closes.
class Echo {
 public:
  explicit Echo(size_t size) : size_(size) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 1) != 0) {
      std::perror("echo server: bind or listen on loopback");
      std::abort();
    }
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::string buf(size_, '\0');
      while (ReadFull(fd, buf.data(), size_)) {
        if (::write(fd, buf.data(), size_) != static_cast<ssize_t>(size_)) break;
      }
      ::close(fd);
    });
  }
  ~Echo() {
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  static bool ReadFull(int fd, char* p, size_t n) {
    while (n > 0) {
      ssize_t r = ::read(fd, p, n);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }

 private:
  size_t size_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

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
  static std::string Request(const std::string& method, const std::string& path, const std::string& body) {
    std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    if (!body.empty()) r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    return r + "\r\n" + body;
  }
  // Sends `request`, reads one reply; its status code, or -1.
  int RoundTrip(const std::string& request) {
    if (!ok_ || ::write(fd_, request.data(), request.size()) != static_cast<ssize_t>(request.size())) return -1;
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
        need = head_end + 4 + (cl == std::string::npos || cl > head_end ? 0 : std::stoul(buf_.substr(cl + 16)));
      }
    }
    return buf_.size() > 12 ? std::atoi(buf_.c_str() + 9) : -1;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string buf_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string store_dir, model, request_file;
  int port = 0, iterations = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--store") store_dir = v;
    else if (k == "--model") model = v;
    else if (k == "--port") port = std::stoi(v);
    else if (k == "--request") request_file = v;
    else if (k == "--iterations") iterations = std::stoi(v);
    else return Die("unknown flag " + k);
  }
  if (store_dir.empty() || model.empty() || port == 0 || request_file.empty()) {
    return Die("usage: --store DIR --model NAME --port PORT --request FILE [--iterations N]");
  }
  auto body = aotid::fs::ReadFile(request_file);
  if (!body.ok()) return Die(body.status().message());

  auto loaded = aotid::bench::LoadCachedModel(store_dir, model);
  if (!loaded.ok()) return Die(loaded.status().message());
  auto req = aotid::serving::DecodeInferRequest(*body, (*loaded)->spec());
  if (!req.ok()) return Die(req.status().message());

  // The floor: the same bytes as the HTTP request body, echoed back.
  Echo echo(body->size());
  int echo_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(echo.port()));
    if (::connect(echo_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return Die("echo connect");
    int one = 1;
    ::setsockopt(echo_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  std::string echo_buf(body->size(), '\0');
  auto fail = [&](const std::string& msg) {
    ::close(echo_fd);  // ends the echo thread, which ~Echo joins
    return Die(msg);
  };
  std::vector<double> echo_us, live_us;

  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  std::string path = "/v2/models/" + model + "/infer";
  std::vector<double> http_us, inproc_us, raw_us, raw_live_us;
  RawHttp raw(port);
  std::string raw_infer = RawHttp::Request("POST", path, *body), raw_live = RawHttp::Request("GET", "/v2/health/live", "");
  // Interleaved, so both sides see the same machine noise.
  for (int i = 0; i < iterations + 50; ++i) {
    auto t0 = Clock::now();
    auto r = client.Post(path.c_str(), *body, "application/json");
    auto t1 = Clock::now();
    if (!r || r->status != 200) return fail("HTTP infer failed");
    auto out = (*loaded)->Infer(req->inputs, {});
    auto t2 = Clock::now();
    if (!out.ok()) return fail(out.status().message());
    if (::write(echo_fd, body->data(), body->size()) != static_cast<ssize_t>(body->size()) ||
        !Echo::ReadFull(echo_fd, echo_buf.data(), echo_buf.size())) {
      return fail("echo failed");
    }
    auto t3 = Clock::now();
    auto live = client.Get("/v2/health/live");  // the HTTP path with no model and no JSON decode
    auto t4 = Clock::now();
    if (!live || live->status != 200) return fail("health check failed");
    if (raw.RoundTrip(raw_infer) != 200) return fail("raw HTTP infer failed");
    auto t5 = Clock::now();
    if (raw.RoundTrip(raw_live) != 200) return fail("raw HTTP health check failed");
    auto t6 = Clock::now();
    if (i < 50) continue;  // warm-up
    raw_us.push_back(std::chrono::duration<double, std::micro>(t5 - t4).count());
    raw_live_us.push_back(std::chrono::duration<double, std::micro>(t6 - t5).count());
    live_us.push_back(std::chrono::duration<double, std::micro>(t4 - t3).count());
    http_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    inproc_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    echo_us.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
  }
  ::close(echo_fd);
  double hp50 = Percentile(http_us, 0.5), hp99 = Percentile(http_us, 0.99);
  double ip50 = Percentile(inproc_us, 0.5), ip99 = Percentile(inproc_us, 0.99);
  double ep50 = Percentile(echo_us, 0.5), ep99 = Percentile(echo_us, 0.99);
  std::printf("model=%s iterations=%d body_bytes=%zu http_p50_us=%.1f http_p99_us=%.1f inproc_p50_us=%.1f "
              "inproc_p99_us=%.1f overhead_p50_us=%.1f overhead_p99_us=%.1f echo_p50_us=%.1f echo_p99_us=%.1f "
              "overhead_over_echo_p50=%.2f health_get_p50_us=%.1f\n",
              model.c_str(), iterations, body->size(), hp50, hp99, ip50, ip99, hp50 - ip50, hp99 - ip99, ep50, ep99,
              (hp50 - ip50) / ep50, Percentile(live_us, 0.5));
  // The same with the raw client: the server's own overhead.
  double rp50 = Percentile(raw_us, 0.5), rp99 = Percentile(raw_us, 0.99);
  std::printf("model=%s raw_client http_p50_us=%.1f http_p99_us=%.1f overhead_p50_us=%.1f overhead_p99_us=%.1f "
              "overhead_over_echo_p50=%.2f health_get_p50_us=%.1f\n",
              model.c_str(), rp50, rp99, rp50 - ip50, rp99 - ip99, (rp50 - ip50) / ep50, Percentile(raw_live_us, 0.5));
  return 0;
}
