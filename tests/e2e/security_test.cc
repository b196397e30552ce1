// Local-first protections of the HTTP API, against a real daemon over
// loopback: the Host check that stops DNS rebinding, the bearer token, and
// CORS. No model is needed, so no build runs.
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "raw_http.h"
#include "runner/runner_model.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

using json = nlohmann::json;

class ApiSecurity : public ::testing::Test {
 protected:
  void Start(const std::string& config_text) {
    config_ = dir_ / "aotid.toml";
    ASSERT_OK(fs::WriteFileAtomic(config_, config_text));
    auto d = DaemonProcess::Start({"--config", config_, "--store", dir_ / "store", "--listen", "127.0.0.1:0"},
                                  dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
  }
  httplib::Result Get(const std::string& path, const httplib::Headers& headers = {}) {
    httplib::Client c("127.0.0.1", daemon_->port());
    return c.Get(path.c_str(), headers);
  }
  static std::string Error(const httplib::Result& r) {
    return r ? json::parse(r->body, nullptr, false).value("error", "") : "no response";
  }

  TempDir dir_;
  std::string config_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(ApiSecurity, BearerTokenIsRequiredAndChecked) {
  std::string token_file = dir_ / "token";
  ASSERT_OK(fs::WriteFileAtomic(token_file, "s3cret-token\n"));
  ::chmod(token_file.c_str(), 0600);
  Start("[server]\ntoken_file = \"" + token_file + "\"\n");

  auto missing = Get("/v2");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(missing->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_NE(Error(missing).find("needs a bearer token"), std::string::npos) << missing->body;

  for (const std::string& wrong : std::vector<std::string>{"Bearer s3cret", "Bearer s3cret-token2",
                                                           "Basic czNjcmV0LXRva2Vu", "Bearer "}) {
    auto r = Get("/v2/health/ready", {{"Authorization", wrong}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << wrong;
    EXPECT_EQ(Error(r), "wrong bearer token");
  }
  auto ok = Get("/v2", {{"Authorization", "Bearer s3cret-token"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(json::parse(ok->body)["name"], "aotid");
  auto unknown = Get("/v2/models/nope", {{"Authorization", "Bearer s3cret-token"}});
  EXPECT_EQ(unknown->status, 404);  // past the token, the routes answer as usual
  EXPECT_TRUE(daemon_->Alive());
}

TEST_F(ApiSecurity, TokenScopeRepositoryGuardsOnlyTheRepositoryRoutes) {
  std::string token_file = dir_ / "token";
  ASSERT_OK(fs::WriteFileAtomic(token_file, "t0ken"));
  ::chmod(token_file.c_str(), 0600);
  Start("[server]\ntoken_file = \"" + token_file + "\"\ntoken_scope = \"repository\"\n");
  EXPECT_EQ(Get("/v2")->status, 200);
  httplib::Client c("127.0.0.1", daemon_->port());
  auto index = c.Post("/v2/repository/index", "", "application/json");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 401);
  auto unload = c.Post("/v2/repository/models/x/unload", httplib::Headers{{"Authorization", "Bearer nope"}},
                       "", "application/json");
  ASSERT_TRUE(unload);
  EXPECT_EQ(unload->status, 403);
  auto ok = c.Post("/v2/repository/index", httplib::Headers{{"Authorization", "Bearer t0ken"}}, "",
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "[]");
}

TEST_F(ApiSecurity, TokenFileMustExistAndNotBeEmpty) {
  std::string empty = dir_ / "empty-token";
  ASSERT_OK(fs::WriteFileAtomic(empty, " \n"));
  ASSERT_OK(fs::WriteFileAtomic(dir_ / "a.toml", "[server]\ntoken_file = \"" + empty + "\"\n"));
  std::string out;
  EXPECT_EQ(
      RunAotid({"--config", dir_ / "a.toml", "--store", dir_ / "store", "serve", "--listen", "127.0.0.1:0"},
               &out),
      1);
  EXPECT_NE(out.find("server.token_file " + empty + " is empty"), std::string::npos) << out;
  ASSERT_OK(fs::WriteFileAtomic(dir_ / "b.toml", "[server]\ntoken_file = \"" + (dir_ / "absent") + "\"\n"));
  EXPECT_EQ(
      RunAotid({"--config", dir_ / "b.toml", "--store", dir_ / "store", "serve", "--listen", "127.0.0.1:0"},
               &out),
      1);
  EXPECT_NE(out.find("server.token_file"), std::string::npos) << out;
  EXPECT_NE(out.find("absent"), std::string::npos) << out;
}

// A web page on evil.example that rebinds its name to 127.0.0.1 still sends
// "Host: evil.example"; only loopback names (and those configured) pass.
TEST_F(ApiSecurity, HostHeaderCheckStopsDnsRebinding) {
  Start("[server]\nallowed_hosts = [\"mybox.local\"]\n");
  std::string port = std::to_string(daemon_->port());
  for (const std::string& host : std::vector<std::string>{"evil.example", "evil.example:" + port,
                                                          "127.0.0.1.evil.example", "10.0.0.1"}) {
    auto r = Get("/v2/health/live", {{"Host", host}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << host;
    EXPECT_NE(Error(r).find("is not allowed"), std::string::npos) << r->body;
  }
  for (const std::string& host :
       std::vector<std::string>{"localhost", "localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port,
                                "127.1.2.3", "mybox.local:" + port}) {
    auto r = Get("/v2/health/live", {{"Host", host}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << host << ": " << r->body;
  }
  EXPECT_TRUE(daemon_->Alive());
}

TEST_F(ApiSecurity, CorsIsOffUnlessOriginsAreConfigured) {
  Start("");
  auto plain = Get("/v2", {{"Origin", "http://localhost:3000"}});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 403);  // a page's request: refused unless its origin is configured
  EXPECT_FALSE(plain->has_header("Access-Control-Allow-Origin"));
  EXPECT_EQ(Get("/v2", {})->status, 200);  // curl sends no Origin
  httplib::Client c("127.0.0.1", daemon_->port());
  auto preflight = c.Options(
      "/v2/models/m/infer", {{"Origin", "http://localhost:3000"}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 403);
  EXPECT_NE(Error(preflight).find("not in server.cors_origins"), std::string::npos) << preflight->body;
}

TEST_F(ApiSecurity, CorsAnswersConfiguredOriginsOnly) {
  Start("[server]\ncors_origins = [\"http://localhost:3000\"]\n");
  httplib::Client c("127.0.0.1", daemon_->port());
  auto preflight = c.Options(
      "/v2/models/m/infer", {{"Origin", "http://localhost:3000"}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Content-Type"),
            std::string::npos);
  auto allowed = Get("/v2", {{"Origin", "http://localhost:3000"}});
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  auto other = Get("/v2", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 403);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  auto bad_preflight = c.Options("/v2", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(bad_preflight);
  EXPECT_EQ(bad_preflight->status, 403);
}

// listen = "unix:/path": a socket file of mode 0660, the API over it, and
// no TCP port at all.
#ifdef __linux__  // the daemon's memory is read from /proc
// The daemon's resident memory in MB: the least of five readings 100 ms
// apart, so that what it keeps is measured, not what a connection still
// closing holds for a moment.
double ResidentMb(pid_t pid) {
  double least = -1;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto status = fs::ReadFile("/proc/" + std::to_string(pid) + "/status");
    size_t at = status.ok() ? status->find("VmRSS:") : std::string::npos;
    if (at == std::string::npos) return -1;
    double mb = std::stod(status->substr(at + 6)) / 1024;
    least = least < 0 ? mb : std::min(least, mb);
  }
  return least;
}

// Bodies of 16 MiB of '[' to every route that reads JSON, eight at once
// (one for each worker) and twice over: each refused, and the daemon's
// memory back within 16 MB of where it was after a first round that met
// every worker (each worker's heap is made then).
// Each bomb once cost ~1 GB at /generate, and any 16 MiB body stayed in the
// heap of every worker that met it: +200 MB after four, and growing.
TEST_F(ApiSecurity, NestingBombsLeaveNoMemoryBehind) {
  Start("");
  const std::string bomb(16 << 20, '[');
  const char* routes[] = {"/v2/repository/index", "/v2/models/none/infer", "/v2/models/none/generate"};
  auto round = [&] {
    for (const char* route : routes) {
      std::vector<std::thread> clients;
      for (int i = 0; i < 8; ++i) {
        clients.emplace_back([&, route] {
          httplib::Client c("127.0.0.1", daemon_->port());
          c.set_read_timeout(60, 0);
          auto r = c.Post(route, bomb, "application/json");
          ASSERT_TRUE(r) << route;
          EXPECT_GE(r->status, 400) << route;
          EXPECT_LT(r->status, 500) << route << " " << r->body.substr(0, 200);
        });
      }
      for (auto& t : clients) t.join();
    }
  };
  round();
  const double before = ResidentMb(daemon_->pid());
  ASSERT_GT(before, 0);
  round();
  round();
  const double after = ResidentMb(daemon_->pid());
  std::cout << "daemon resident memory: " << before << " MB after one round of 24 bombs, " << after
            << " MB after two more\n";
  EXPECT_LT(after - before, 16.0);
  EXPECT_TRUE(daemon_->Alive());
}
#endif  // __linux__

TEST(ApiListen, UnixSocketServesTheApiWithMode0660) {
  TempDir dir;
  std::string sock = dir / "aotid.sock", log = dir / "daemon.log";
  auto pid = SpawnAotid({"serve", "--store", dir / "store", "--listen", "unix:" + sock}, log);
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  bool up = WaitFor(
      [&] { return fs::ReadFile(log).value_or("").find("serving on unix:" + sock) != std::string::npos; },
      60);
  ASSERT_TRUE(up) << fs::ReadFile(log).value_or("");
  struct stat st;
  ASSERT_EQ(::lstat(sock.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  for (int round = 0; round < 2; ++round) {  // two connections, the second after the first closed
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, sock.c_str(), sock.size() + 1);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
    // Keep-alive: two requests on one connection.
    std::string live = Exchange(fd, "GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n");
    EXPECT_NE(live.find("HTTP/1.1 200"), std::string::npos) << live;
    EXPECT_NE(live.find(R"({"live":true})"), std::string::npos) << live;
    std::string meta = Exchange(fd, "GET /v2 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    EXPECT_NE(meta.find(R"("name":"aotid")"), std::string::npos) << meta;
    ::close(fd);
  }
  ASSERT_EQ(::kill(*pid, SIGTERM), 0);
  EXPECT_EQ(WaitExitFor(*pid, 30), 0);
  EXPECT_FALSE(fs::Exists(sock));  // removed on the way out
}

// A client that trickles its request is cut off at server.request_timeout_s,
// however steadily it sends; headers past the limit get an error; and the
// daemon answers the next request at once.
TEST_F(ApiSecurity, SlowAndOversizedRequestsAreCutOff) {
  Start("[server]\nrequest_timeout_s = 2\nthreads = 4\n");
  int slow = ConnectTcp(daemon_->port());
  ASSERT_GE(slow, 0);
  auto t0 = std::chrono::steady_clock::now();
  std::string head = "GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  bool cut = false;
  for (int i = 0; i < 100 && !cut; ++i) {  // one byte every 100 ms: each read is quick, the request is not
    char c = i < static_cast<int>(head.size()) ? head[i] : 'a';
    cut = ::send(slow, &c, 1, MSG_NOSIGNAL) != 1;
    pollfd p{slow, POLLIN, 0};
    if (!cut && ::poll(&p, 1, 100) > 0) cut = true;  // the server closed the connection (or said why first)
  }
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(cut) << "the trickling client was never cut off";
  EXPECT_LT(took, 6.0);
  EXPECT_GE(took, 1.5);
  ::close(slow);

  int big = ConnectTcp(daemon_->port());
  std::string reply =
      Exchange(big, "GET /v2 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
  ::close(big);
  EXPECT_EQ(reply.find("HTTP/1.1 431"), 0u) << reply.substr(0, 200);
  EXPECT_NE(reply.find("request headers are larger than 16384 bytes"), std::string::npos)
      << reply.substr(0, 300);

  auto ok = Get("/v2/health/live");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(daemon_->Alive());
}

// Reads from `fd` until `done(reply)` or `timeout_ms` passes.
std::string ReadUntil(int fd, const std::function<bool(const std::string&)>& done, int timeout_ms = 5000) {
  std::string reply;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  while (!done(reply)) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  return reply;
}

bool PeerClosedWithin(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  char c;
  return ::poll(&p, 1, timeout_ms) > 0 && ::recv(fd, &c, 1, 0) == 0;
}

// HTTP/1.1 as clients other than the usual ones speak it, over real
// connections: pipelining, chunked bodies, Expect: 100-continue, HEAD,
// 405, HTTP/1.0, smuggling shapes; and more keep-alive connections than
// worker threads, all served.
TEST_F(ApiSecurity, HttpFramingAndMoreConnectionsThanThreads) {
  Start("[server]\nthreads = 2\nidle_timeout_s = 20\nmax_body_bytes = 4096\n");
  const int port = daemon_->port();
  // Two requests in one write: two answers, in order.
  int fd = ConnectTcp(port);
  ASSERT_GE(fd, 0);
  std::string both =
      "GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\nGET /v2 HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ::send(fd, both.data(), both.size(), MSG_NOSIGNAL);
  std::string two =
      ReadUntil(fd, [](const std::string& r) { return r.find("\"name\":\"aotid\"") != std::string::npos; });
  size_t live = two.find("{\"live\":true}"), meta = two.find("\"name\":\"aotid\"");
  ASSERT_NE(live, std::string::npos) << two;
  ASSERT_NE(meta, std::string::npos) << two;
  EXPECT_LT(live, meta);
  EXPECT_EQ(two.find("HTTP/1.1 200 OK\r\n"), 0u) << two;

  // A chunked body is decoded: the handler sees the JSON it spells.
  std::string chunked =
      "POST /v2/repository/index HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\n{\"rea\r\n8;x=y\r\ndy\": 5}\r\n0\r\n\r\n";
  std::string reply = Exchange(fd, chunked);
  EXPECT_EQ(reply.find("HTTP/1.1 400"), 0u) << reply;
  EXPECT_NE(reply.find("'ready' must be true or false"), std::string::npos) << reply;
  // Expect: 100-continue: told to go on, then answered; too large: 413 at once.
  std::string body = "{\"ready\": true}";
  std::string head =
      "POST /v2/repository/index HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  std::string go_on =
      ReadUntil(fd, [](const std::string& r) { return r.find("\r\n\r\n") != std::string::npos; });
  EXPECT_EQ(go_on, "HTTP/1.1 100 Continue\r\n\r\n");
  reply = Exchange(fd, body);
  EXPECT_EQ(reply.find("HTTP/1.1 200"), 0u) << reply;
  EXPECT_NE(reply.find("\r\n\r\n[]"), std::string::npos) << reply;  // no models in this store
  // HEAD: the head of GET's answer, no body.
  std::string head_req = "HEAD /v2 HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ::send(fd, head_req.data(), head_req.size(), MSG_NOSIGNAL);
  reply = ReadUntil(
      fd, [](const std::string&) { return false; }, 500);
  EXPECT_EQ(reply.find("HTTP/1.1 200"), 0u) << reply;
  EXPECT_NE(reply.find("Content-Length: "), std::string::npos) << reply;
  EXPECT_EQ(reply.find("\r\n\r\n"), reply.size() - 4) << reply;
  // A method the route does not take.
  reply = Exchange(fd, "DELETE /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(reply.find("HTTP/1.1 405"), 0u) << reply;
  EXPECT_NE(reply.find("Allow: GET, HEAD\r\n"), std::string::npos) << reply;
  // Content-Length and Transfer-Encoding together: refused, connection closed.
  reply = Exchange(fd,
                   "POST /v2/repository/index HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
  EXPECT_EQ(reply.find("HTTP/1.1 400"), 0u) << reply;
  EXPECT_NE(reply.find("both Content-Length and Transfer-Encoding"), std::string::npos) << reply;
  EXPECT_TRUE(PeerClosedWithin(fd, 3000));
  ::close(fd);

  fd = ConnectTcp(port);
  reply = Exchange(fd,
                   "POST /v2/repository/index HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
                   "Content-Length: 1000000000\r\n\r\n");
  EXPECT_EQ(reply.find("HTTP/1.1 413"), 0u) << reply;
  EXPECT_NE(reply.find("exceeds the limit of 4096 bytes"), std::string::npos) << reply;
  ::close(fd);
  // HTTP/1.0 without keep-alive: answered, then closed.
  fd = ConnectTcp(port);
  reply = Exchange(fd, "GET /v2/health/live HTTP/1.0\r\n\r\n");
  EXPECT_EQ(reply.find("HTTP/1.1 200"), 0u) << reply;
  EXPECT_NE(reply.find("Connection: close\r\n"), std::string::npos) << reply;
  EXPECT_TRUE(PeerClosedWithin(fd, 3000));
  ::close(fd);

  // Ten keep-alive connections on two workers: every one is answered, twice,
  // long before the 20 s idle timeout would free a worker.
  std::vector<int> conns;
  for (int i = 0; i < 10; ++i) conns.push_back(ConnectTcp(port));
  auto t0 = std::chrono::steady_clock::now();
  for (int round = 0; round < 2; ++round) {
    for (int c : conns) {
      std::string r = Exchange(c, "GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n", 5000);
      EXPECT_EQ(r.find("HTTP/1.1 200"), 0u) << "round " << round << ": " << r;
    }
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  for (int c : conns) ::close(c);
  EXPECT_TRUE(daemon_->Alive());
}

// A secret under /etc, where the system service keeps its config and token
// file, that no child of the daemon may read: made for the test where it can
// be (the tests run as root), else /etc/hostname, which is not on the list
// a child may read either. Removed at the end.
class EtcSecret {
 public:
  EtcSecret() {
    std::string made = "/etc/aotid-test-secret-" + std::to_string(::getpid());
    if (fs::WriteFileAtomic(made, "ETC-SECRET-TOKEN\n").ok()) {
      path_ = made;
      made_ = true;
    }
  }
  ~EtcSecret() {
    if (made_) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_ = "/etc/hostname";
  bool made_ = false;
};

// A package whose model.so attacks at load (its constructor runs inside
// the runner): each attempt is refused, and the refusals are logged; the
// one place it may write is its scratch directory. The real runner binary,
// sandbox and kernel; tests/runner/hostile_model.c is the package's code.
// Linux only, as the sandbox is: macOS runners have rlimits alone
// (docs/RUNNERS.md).
#ifdef __linux__
TEST(RunnerSandbox, HostilePackageCodeIsRefusedTheNetworkOtherBlobsTheCacheAndProcesses) {
  TempDir dir;
  std::string cache = dir / "store/cache", blobs = dir / "store/blobs";
  std::string entry = cache + "/abc/model.cpu.x";
  ASSERT_OK(fs::MakeDirs(entry));
  ASSERT_OK(fs::MakeDirs(blobs));
  ASSERT_OK(fs::MakeDirs(cache + "/.staging"));
  ASSERT_OK(fs::WriteFileAtomic(blobs + "/secret", "TOP-SECRET-WEIGHTS"));
  std::string cmd =
      "cc -shared -fPIC -o " + entry + "/model.so " + AOTID_SOURCE_DIR + "/tests/runner/hostile_model.c";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ASSERT_OK(fs::WriteFileAtomic(entry + "/spec.json", R"({"inputs":[],"outputs":[]})"));
  ::setenv("HOSTILE_BLOB", (blobs + "/secret").c_str(), 1);
  ::setenv("HOSTILE_PLANT", (cache + "/planted").c_str(), 1);
  EtcSecret etc;
  ::setenv("HOSTILE_ETC", etc.path().c_str(), 1);

  model::CacheEntry e;
  e.dir = entry;
  e.so_path = entry + "/model.so";
  runner::RunnerOptions o;
  o.self_exe = AOTID_BINARY;
  o.label = "hostile:1";
  o.scratch_root = cache + "/.staging";
  o.memory_limit_bytes = uint64_t{384} << 20;
  ::testing::internal::CaptureStderr();
  auto started = runner::RunnerModel::Start(e, o);
  std::string log = ::testing::internal::GetCapturedStderr();
  ::unsetenv("HOSTILE_BLOB");
  ::unsetenv("HOSTILE_PLANT");
  ::unsetenv("HOSTILE_ETC");

  // It is no model, so it does not load; what matters is what it could do first.
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.status().message().find("loading " + e.so_path), std::string::npos)
      << started.status().message();
  EXPECT_NE(log.find("hostile: write its scratch: DONE"), std::string::npos) << log;  // it did run
  for (const char* refused :
       {"hostile: inet socket: Operation not permitted", "hostile: unix socket: Operation not permitted",
        "hostile: read another blob: Permission denied", "hostile: write into the cache: Permission denied",
        "hostile: fork: Operation not permitted", "hostile: signal its parent: Operation not permitted",
        "hostile: allocate 512 MiB: Cannot allocate memory",
        "hostile: read a secret under /etc: Permission denied",
        "hostile: read its parent's environ: Permission denied",
        "hostile: read its parent's cmdline: Permission denied",
        "hostile: read its own /proc/self/status: DONE",
        // seccomp's refusals name the call in the log
        "the sandbox refused socket()", "the sandbox refused clone()", "the sandbox refused kill()"}) {
    EXPECT_NE(log.find(refused), std::string::npos) << refused << "\n" << log;
  }
  EXPECT_EQ(log.find("TOP-SECRET"), std::string::npos) << log;
  EXPECT_EQ(log.find("hostile: leaked"), std::string::npos) << log;
  EXPECT_FALSE(fs::Exists(cache + "/planted"));
}
#endif  // __linux__

// A copy of the package `from` with each entry whose name ends in `suffix`
// replaced by `bytes`.
void RepackWith(const std::string& from, const std::string& to, const std::string& suffix,
                const std::string& bytes) {
  ASSERT_OK(fs::WriteFileAtomic(to, *fs::ReadFile(from)));
  int err = 0;
  zip_t* z = zip_open(to.c_str(), 0, &err);
  ASSERT_NE(z, nullptr);
  int replaced = 0;
  for (zip_int64_t k = 0; k < zip_get_num_entries(z, 0); ++k) {
    std::string name = zip_get_name(z, static_cast<zip_uint64_t>(k), 0);
    if (!name.ends_with(suffix)) continue;
    zip_source_t* src = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
    ASSERT_EQ(zip_file_replace(z, static_cast<zip_uint64_t>(k), src, 0), 0) << zip_strerror(z);
    ++replaced;
  }
  ASSERT_GT(replaced, 0) << suffix;
  ASSERT_EQ(zip_close(z), 0);
}

// The build child runs a package's code as well (a compiled package's
// model.so for its first run; a source package's flags and C++ through the
// compiler), and is confined like a runner (on Linux: macOS has no
// sandbox to confine it with, and there only the flags are checked).
TEST(RunnerSandbox, BuildChildConfinesThePackagesCodeAndFlags) {
  TempDir dir;
  std::string cache = dir / "store/cache", blobs = dir / "store/blobs";
  ASSERT_OK(fs::MakeDirs(cache + "/.staging/b1"));
  ASSERT_OK(fs::MakeDirs(cache + "/.staging/b2"));
  ASSERT_OK(fs::MakeDirs(blobs));
  std::string out;
  int rc = 0;
#ifdef __linux__
  ASSERT_OK(fs::WriteFileAtomic(blobs + "/secret", "TOP-SECRET-WEIGHTS"));
  std::string so = dir / "hostile.so";
  std::string cmd = "cc -shared -fPIC -o " + so + " " + AOTID_SOURCE_DIR + "/tests/runner/hostile_model.c";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  RepackWith(TestData("mlp_so.pt2"), dir / "evil_so.pt2", ".so", *fs::ReadFile(so));
  EtcSecret etc;
  RunOptions env;
  env.env = {"HOSTILE_BLOB=" + blobs + "/secret", "HOSTILE_PLANT=" + cache + "/planted",
             "HOSTILE_ETC=" + etc.path()};
  rc = RunAotid({"internal-build", "--artifact", dir / "evil_so.pt2", "--out", cache + "/.staging/b1",
                 "--kind", "aoti_compiled"},
                env, &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("hostile: write its scratch: DONE"), std::string::npos) << out;  // its code ran
  for (const char* refused :
       {"hostile: inet socket: Operation not permitted", "hostile: read another blob: Permission denied",
        "hostile: write into the cache: Permission denied", "hostile: fork: Operation not permitted",
        "hostile: read a secret under /etc: Permission denied",
        "hostile: read its parent's environ: Permission denied",
        "hostile: read its parent's cmdline: Permission denied",
        "hostile: read its own /proc/self/status: DONE", "the sandbox refused socket()"}) {
    EXPECT_NE(out.find(refused), std::string::npos) << refused << "\n" << out;
  }
  EXPECT_EQ(out.find("TOP-SECRET"), std::string::npos) << out;
  EXPECT_EQ(out.find("hostile: leaked"), std::string::npos) << out;
  EXPECT_FALSE(fs::Exists(cache + "/planted"));
#endif  // __linux__

  // A source package whose flags would run a shell command: refused, not run.
  std::string flags =
      R"({"definitions": [], "cflags": ["O2", "fPIC", "std=c++20"], "passthrough_args": ["", "-wrapper /bin/sh,-c,touch )" +
      dir.path() + R"(/wrapped"]})";
  RepackWith(TestData("mlp_src.pt2"), dir / "wrap_src.pt2", "_compile_flags.json", flags);
  rc = RunAotid({"internal-build", "--artifact", dir / "wrap_src.pt2", "--out", cache + "/.staging/b2",
                 "--kind", "aoti_source"},
                &out);
  EXPECT_EQ(rc, 2) << out;  // permanent: retrying will not help
  EXPECT_NE(out.find("asks for the compiler flag '-wrapper', which aotid does not pass on"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::Exists(dir / "wrapped"));
}

// Linux only: the build children are confined there alone (docs/RUNNERS.md).
#ifdef __linux__
// The compile worker deserializes exported programs that may come from a
// registry, with torch: a flaw there runs the package's code in the worker.
// A stand-in worker (build.worker_dir points at it) runs such code from the
// first line, as the daemon starts the real one: each attempt is refused
// but the compiler and its staging folder, and its own /proc/self/status
// says it runs with seccomp and no new privileges.
TEST(RunnerSandbox, CompileWorkerIsConfinedLikeARunner) {
  TempDir dir;
  std::string store = dir / "store", worker = dir / "worker";
  ASSERT_OK(fs::MakeDirs(worker + "/aotid_worker"));
  ASSERT_OK(fs::MakeDirs(store + "/blobs"));
  ASSERT_OK(fs::WriteFileAtomic(store + "/blobs/secret", "TOP-SECRET-WEIGHTS"));
  EtcSecret etc;
  ASSERT_OK(fs::WriteFileAtomic(worker + "/aotid_worker/__init__.py", ""));
  ASSERT_OK(
      fs::WriteFileAtomic(worker + "/aotid_worker/compile.py", R"(import os, socket, subprocess, sys, tempfile
def attempt(what, act):
    try:
        got = act()
        print(f"hostile worker: {what}: DONE {got or ''}", flush=True)
    except OSError as e:
        print(f"hostile worker: {what}: {e.strerror}", flush=True)
def read(path):
    with open(path, "rb") as f:
        print("hostile worker: leaked", f.read(64), flush=True)
def write(path):
    with open(path, "w") as f:
        f.write("planted")
out = sys.argv[sys.argv.index("--out") + 1]
parent = os.getppid()
attempt("read a secret under /etc", lambda: read(")" + etc.path() + R"("))
attempt("read another blob", lambda: read(")" + store + R"(/blobs/secret"))
attempt("read its parent's environ", lambda: read(f"/proc/{parent}/environ"))
attempt("read its parent's cmdline", lambda: read(f"/proc/{parent}/cmdline"))
attempt("inet socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("unix socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("write into the cache", lambda: write(")" + store + R"(/cache/planted"))
attempt("write its staging folder", lambda: write(os.path.join(out, "ok")))
attempt("write its TMPDIR", lambda: tempfile.NamedTemporaryFile().close())
attempt("signal its parent", lambda: os.kill(parent, 0))
attempt("run the compiler", lambda: subprocess.run(["c++", "--version"], check=True, capture_output=True).args[0])
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith(("NoNewPrivs:", "Seccomp:")):
            print("hostile worker:", " ".join(line.split()), flush=True)
print("error: the hostile worker is done", flush=True)
sys.exit(2)
)"));
  std::string config = dir / "aotid.toml";
  ASSERT_OK(fs::WriteFileAtomic(config, "[build]\nworker_dir = \"" + worker + "\"\n"));
  std::string out;
  ASSERT_EQ(
      RunAotid({"--config", config, "--store", store, "add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0)
      << out;
  auto d = DaemonProcess::Start({"--config", config, "--store", store, "--listen", "127.0.0.1:0"},
                                dir / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::string log;
  bool failed = WaitFor(
      [&] {
        std::error_code ec;
        for (auto it = std::filesystem::recursive_directory_iterator(store + "/cache", ec);
             !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
          if (it->path().string().ends_with(".failed.log")) log = *fs::ReadFile(it->path().string());
        }
        return log.find("error: the hostile worker is done") != std::string::npos;
      },
      60);
  ASSERT_TRUE(failed) << log << (*d)->Log();
  for (const char* want :
       {"hostile worker: read a secret under /etc: Permission denied",
        "hostile worker: read another blob: Permission denied",
        "hostile worker: read its parent's environ: Permission denied",
        "hostile worker: read its parent's cmdline: Permission denied",
        "hostile worker: inet socket: Operation not permitted",
        "hostile worker: unix socket: Operation not permitted",
        "hostile worker: write into the cache: Permission denied",
        "hostile worker: signal its parent: Operation not permitted",
        "hostile worker: write its staging folder: DONE", "hostile worker: write its TMPDIR: DONE",
        "hostile worker: run the compiler: DONE c++", "hostile worker: NoNewPrivs: 1",
        "hostile worker: Seccomp: 2"}) {
    EXPECT_NE(log.find(want), std::string::npos) << want << "\n" << log;
  }
  EXPECT_EQ(log.find("hostile worker: leaked"), std::string::npos) << log;
  EXPECT_FALSE(fs::Exists(store + "/cache/planted"));
  EXPECT_TRUE((*d)->Alive());
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();
}
#endif  // __linux__

// A compiled package whose extra/aotid.json states other shapes than its
// model was compiled for (finding 7: x*2+1 compiled for [-1, 8], declared
// [-1, 1], then read 7 values past each row) is refused at build with the
// input named: by the C++ checks it carries, and without them by the
// compiled model's own input checks on the first runs. The honest package
// without its C++ still builds (its first run retried at the least size
// the model takes).
TEST(LyingPackages, DeclaredShapesTheModelWasNotCompiledForAreRefusedAtBuild) {
  TempDir dir;
  std::string json = R"({"format": 1, "input_names": ["x"], "output_names": ["y"], "metadata": {},
    "models": {"model": {"inputs": [{"name": "x", "datatype": "FP32", "shape": SHAPE}],
                         "outputs": [{"name": "y", "datatype": "FP32", "shape": OUT}]}}})";
  auto declaring = [&](const std::string& shape, const std::string& out = "[-1, 4]") {
    std::string j = json;
    j.replace(j.find("SHAPE"), 5, shape);
    j.replace(j.find("OUT"), 3, out);
    return j;
  };
  RepackWith(TestData("mlp_so.pt2"), dir / "lie.pt2", "aotid.json", declaring("[-1, 1]"));
  RepackWith(dir / "lie.pt2", dir / "lie_nocpp.pt2", ".cpp", "");
  RepackWith(TestData("mlp_so.pt2"), dir / "dyn.pt2", "aotid.json", declaring("[-1, -1]"));
  RepackWith(dir / "dyn.pt2", dir / "dyn_nocpp.pt2", ".cpp", "");
  RepackWith(TestData("mlp_so.pt2"), dir / "honest_nocpp.pt2", ".cpp", "");
  RepackWith(TestData("mlp_so.pt2"), dir / "out.pt2", "aotid.json", declaring("[-1, 8]", "[-1, 2]"));
  RepackWith(TestData("mlp_so.pt2"), dir / "one.pt2", "aotid.json", declaring("[1, 8]", "[1, 4]"));
  RepackWith(dir / "one.pt2", dir / "one_nocpp.pt2", ".cpp", "");
  RepackWith(TestData("mlp_so.pt2"), dir / "bad.pt2", "aotid.json", declaring("\"abc\""));
  struct Case {
    std::string package, want;
  } cases[] = {
      {"lie.pt2", "extra/aotid.json declares input 'x' with shape [-1, 1] but the model's C++ takes [-1, 8]"},
      {"lie_nocpp.pt2",
       "the compiled model's own input checks refuse inputs of shape [2, 1], which its declared "
       "inputs allow: input_handles[0]: unmatched dim value at 1, expected: 8"},
      {"dyn_nocpp.pt2", "input_handles[0]: unmatched dim value at 1, expected: 8, but got: 1"},
      {"out.pt2", "output 'y' is declared [-1, 2] but the model returns [2, 4]"},
      {"bad.pt2", "extra/aotid.json"},  // does not parse: permanent, not retried
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.package);
    std::string out;
    int rc = RunAotid({"internal-build", "--artifact", dir / c.package, "--out",
                       dir / ("b" + std::to_string(n++)), "--kind", "aoti_compiled"},
                      &out);
    EXPECT_EQ(rc, 2) << out;  // permanent: a retry will not help
    EXPECT_NE(out.find(c.want), std::string::npos) << out;
    EXPECT_FALSE(fs::Exists(dir / ("b" + std::to_string(n - 1)) + "/spec.json"));
  }
  // Declared dynamic where the C++ fixes the dim: fixed, and the C++'s
  // upper bound taken (the daemon then refuses what the kernels were not
  // compiled for).
  std::string out;
  ASSERT_EQ(RunAotid({"internal-build", "--artifact", dir / "dyn.pt2", "--out", dir / "dyn", "--kind",
                      "aoti_compiled"},
                     &out),
            0)
      << out;
  auto spec = model::ModelSpec::FromJson(*fs::ReadFile(dir / "dyn/spec.json"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->inputs[0].shape, (std::vector<int64_t>{-1, 8}));
  ASSERT_EQ(spec->inputs[0].dims.size(), 2u);
  ASSERT_TRUE(spec->inputs[0].dims[0].has_value());
  EXPECT_EQ(spec->inputs[0].dims[0]->min, 1);
  EXPECT_EQ(spec->inputs[0].dims[0]->max, 65536);
  ASSERT_EQ(RunAotid({"internal-build", "--artifact", dir / "honest_nocpp.pt2", "--out", dir / "honest",
                      "--kind", "aoti_compiled"},
                     &out),
            0)
      << out;
  EXPECT_NE(out.find("running at 2"), std::string::npos) << out;
  // The same build without CAP_SYS_ADMIN (any user but root): Landlock
  // then needs no_new_privs first, which the build child sets.
  RunOptions user;
  user.without_sys_admin = true;
  ASSERT_EQ(RunAotid({"internal-build", "--artifact", TestData("mlp_so.pt2"), "--out", dir / "as_user",
                      "--kind", "aoti_compiled"},
                     user, &out),
            0)
      << out;
  EXPECT_EQ(out.find("cannot restrict"), std::string::npos) << out;
  // Declared for batch 1 alone, of a model traced for at least 2: served
  // (checked at 2, which its checks take).
  for (const char* one : {"one.pt2", "one_nocpp.pt2"}) {
    ASSERT_EQ(RunAotid({"internal-build", "--artifact", dir / one, "--out", dir / (std::string(one) + ".out"),
                        "--kind", "aoti_compiled"},
                       &out),
              0)
        << one << "\n"
        << out;
  }
}

}  // namespace
}  // namespace aotid::testing
