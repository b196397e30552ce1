// aotid under a service manager, as systemd runs it: the notify protocol
// ($NOTIFY_SOCKET) and socket activation ($LISTEN_FDS), against the real
// binary, with the test in the service manager's place.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "raw_http.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

// A datagram socket bound where $NOTIFY_SOCKET will point: the messages the
// daemon sends, in order.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = fd::Socket(AF_UNIX, SOCK_DGRAM);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~NotifySocket() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  // Reads messages until one contains `want` or `timeout_ms` passes; every
  // message read is kept in all().
  bool WaitFor(const std::string& want, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      for (size_t i = seen_; i < messages_.size(); ++i) {
        if (messages_[i].find(want) != std::string::npos) {
          seen_ = i + 1;
          return true;
        }
      }
      seen_ = messages_.size();
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) messages_.emplace_back(buf, static_cast<size_t>(n));
    }
  }
  std::string all() const {
    std::string out;
    for (const auto& m : messages_) out += "[" + m + "]\n";
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
  std::vector<std::string> messages_;
  size_t seen_ = 0;
};

int PortInLog(const std::string& log) {
  static const std::regex kServing(R"(serving on http://[^\s]*:(\d+)\n)");
  std::smatch m;
  return std::regex_search(log, m, kServing) ? std::stoi(m[1]) : 0;
}

// READY=1 comes once the API answers; STATUS= follows the models until they
// are ready; STOPPING=1 on SIGTERM, and the exit is clean. The variables
// are not passed on to the runners (they would speak for the daemon).
TEST(ServiceManager, NotifiesReadyStatusAndStopping) {
  TempDir dir;
  std::string store = dir / "store";
  ASSERT_EQ(RunAotid({"--store", store, "add", TestData("mlp_so.pt2"), "--name", "mlp"}), 0);
  NotifySocket notify(dir / "notify.sock");
  ASSERT_TRUE(notify.bound());
  RunOptions opts;
  opts.env = {"NOTIFY_SOCKET=" + (dir / "notify.sock"), "WATCHDOG_USEC=400000"};
  std::string log = dir / "daemon.log";
  auto pid = SpawnAotid({"--store", store, "serve", "--listen", "127.0.0.1:0"}, log, opts);
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();

  ASSERT_TRUE(notify.WaitFor("READY=1", 60000)) << notify.all() << *fs::ReadFile(log);
  int port = PortInLog(*fs::ReadFile(log));
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  auto live = client.Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);

  EXPECT_TRUE(notify.WaitFor("STATUS=1/1 models ready", 60000)) << notify.all() << *fs::ReadFile(log);
  // The watchdog asked for 0.4 s: pinged at least every 0.2 s.
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", 2000)) << notify.all();
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", 2000)) << notify.all();

  auto runners = Pids("internal-runner --label mlp:1 --entry " + store + "/");
  ASSERT_EQ(runners.size(), 1u) << *fs::ReadFile(log);
  std::string env = *fs::ReadFile("/proc/" + std::to_string(runners[0]) + "/environ");
  EXPECT_EQ(env.find("NOTIFY_SOCKET"), std::string::npos);
  EXPECT_EQ(env.find("WATCHDOG_USEC"), std::string::npos);

  ASSERT_EQ(::kill(*pid, SIGTERM), 0);
  EXPECT_TRUE(notify.WaitFor("STOPPING=1", 10000)) << notify.all();
  EXPECT_EQ(WaitExitFor(*pid, 30), 0) << *fs::ReadFile(log);
}

// Socket activation: the listening socket the service manager binds
// (aotid.socket) is served, whatever server.listen says; a bad hand-over
// is refused with the reason.
TEST(ServiceManager, ServesOnTheSocketItIsHanded) {
  TempDir dir;
  std::string store = dir / "store";
  int listener = fd::Socket(AF_INET, SOCK_STREAM);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  RunOptions opts;
  opts.listen_fd = listener;
  std::string log = dir / "daemon.log";
  // server.listen names another port: the socket handed over wins.
  auto pid = SpawnAotid({"--store", store, "serve", "--listen", "127.0.0.1:1"}, log, opts);
  ASSERT_TRUE(pid.ok());
  std::string reply;
  WaitFor(
      [&] {
        if (PortInLog(fs::ReadFile(log).value_or("")) == 0) return false;
        int fd = ConnectTcp(port);
        reply = Exchange(fd, "GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        ::close(fd);
        return !reply.empty();
      },
      30);
  ::close(listener);  // the daemon holds its own copy
  EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 200") << reply << *fs::ReadFile(log);
  EXPECT_NE(fs::ReadFile(log)->find(
                "serving on the socket the service manager passed (127.0.0.1:" + std::to_string(port) + ")"),
            std::string::npos)
      << *fs::ReadFile(log);
  ASSERT_EQ(::kill(*pid, SIGTERM), 0);
  EXPECT_EQ(WaitExitFor(*pid, 30), 0) << *fs::ReadFile(log);

  // A socket that is not a listening stream socket: refused, naming why.
  std::string out;
  int dgram = fd::Socket(AF_INET, SOCK_DGRAM);
  RunOptions wrong;
  wrong.listen_fd = dgram;
  EXPECT_EQ(RunAotid({"--store", store, "serve"}, wrong, &out), 1) << out;
  EXPECT_NE(out.find("socket activation passed fd 3, which is not a stream socket"), std::string::npos)
      << out;
  ::close(dgram);
}

// --log-file (log.file): the daemon's lines go to that file, not stderr,
// and its runners' lines with them.
TEST(ServiceManager, LogFileTakesTheDaemonsLog) {
  TempDir dir;
  std::string store = dir / "store";
  ASSERT_EQ(RunAotid({"--store", store, "add", TestData("mlp_so.pt2"), "--name", "mlp"}), 0);
  std::string file = dir / "aotid.log";
  auto pid = SpawnAotid({"--store", store, "serve", "--listen", "127.0.0.1:0", "--log-file", file},
                        dir / "stderr.log");
  ASSERT_TRUE(pid.ok());
  bool ready = WaitFor(
      [&] {
        auto text = fs::ReadFile(file);
        return text.ok() && text->find("startup complete") != std::string::npos;
      },
      60);
  // logrotate's way: the file is moved away and SIGHUP makes a new one.
  ASSERT_EQ(::rename(file.c_str(), (file + ".moved").c_str()), 0);
  ASSERT_EQ(::kill(*pid, SIGHUP), 0);
  bool reopened =
      WaitFor([&] { return fs::ReadFile(file).value_or("").find("reloaded") != std::string::npos; }, 10);
  ASSERT_EQ(::kill(*pid, SIGTERM), 0);
  EXPECT_EQ(WaitExitFor(*pid, 30), 0);
  EXPECT_TRUE(reopened) << fs::ReadFile(file + ".moved").value_or("");
  std::string text = fs::ReadFile(file + ".moved").value_or("") + fs::ReadFile(file).value_or("");
  EXPECT_TRUE(ready) << text << *fs::ReadFile(dir / "stderr.log");
  for (const char* want : {"serving on http://127.0.0.1:", "for cpu: step 3/3: writing the build (",
                           "runner mlp:1: aotid runner", "serving mlp:1", "stopped"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  EXPECT_EQ(fs::ReadFile(dir / "stderr.log").value_or("x"), "");
}

// The daemon's start and stop go into the store's event log, and a start
// after a daemon that was killed says so.
TEST(ServiceManager, StartStopAndAKilledDaemonAreInTheEventLog) {
  TempDir dir;
  std::string store = dir / "store";
  int starts = 0;
  auto start = [&] {
    // A log of its own each: Start() waits for the "serving on" line.
    auto d = DaemonProcess::Start({"--store", store, "--listen", "127.0.0.1:0"},
                                  dir / ("daemon" + std::to_string(++starts) + ".log"));
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(d).value() : nullptr;
  };
  auto d = start();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->Stop(), 0);
  EXPECT_EQ(CountEvents(store, "daemon_started"), 1);
  EXPECT_EQ(CountEvents(store, "daemon_stopped"), 1);
  EXPECT_EQ(CountEvents(store, "daemon_recovered"), 0);  // it had stopped

  d = start();
  ASSERT_NE(d, nullptr);
  d->Kill();
  d = start();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(CountEvents(store, "daemon_recovered", "ended without stopping"), 1);
  EXPECT_EQ(d->Stop(), 0);
  std::string out;
  ASSERT_EQ(RunAotid({"--store", store, "events"}, &out), 0);
  EXPECT_NE(out.find("daemon_recovered"), std::string::npos) << out;
  EXPECT_EQ(CountEvents(store, "daemon_started"), 3);
}

// SIGHUP reads the configuration again: the log level applies at once,
// other keys are named as waiting for a restart, and a broken file is
// refused while the daemon keeps serving with what it had.
TEST(ServiceManager, SighupReloadsWhatCanChangeAndRefusesABrokenConfig) {
  TempDir dir;
  std::string store = dir / "store";
  std::string config = dir / "aotid.toml";
  std::string token_file = dir / "token";
  ASSERT_OK(fs::WriteFileAtomic(config, "[log]\nlevel = \"info\"\n"));
  ASSERT_OK(fs::WriteFileAtomic(token_file, "first-token\n"));
  ::chmod(token_file.c_str(), 0600);
  RunOptions opts;
  opts.env = {"AOTID_CONFIG=" + config};
  auto d = DaemonProcess::Start({"--store", store, "--listen", "127.0.0.1:0"}, dir / "daemon.log", opts);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const pid_t pid = (*d)->pid();
  auto log_has = [&](const std::string& text) {
    return WaitFor([&] { return (*d)->Log().find(text) != std::string::npos; }, 10);
  };
  httplib::Client c("127.0.0.1", (*d)->port());
  auto index_status = [&](const std::string& token, const std::string& origin = "") {
    httplib::Headers h;
    if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
    if (!origin.empty()) h.emplace("Origin", origin);
    auto r = c.Post("/v2/repository/index", h, "{}", "application/json");
    return r ? r->status : 0;
  };
  EXPECT_EQ(index_status(""), 200);  // no token yet
  EXPECT_EQ(index_status("", "http://app.local"), 403);

  // A token, CORS, a runner limit and a key that waits for a restart.
  ASSERT_OK(fs::WriteFileAtomic(
      config, "[log]\nlevel = \"debug\"\n[server]\nthreads = 3\ntoken_file = \"" + token_file +
                  "\"\ntoken_scope = \"repository\"\ncors_origins = [\"http://app.local\"]\n"
                  "[runner]\nmemory_limit_mb = 3000\n"));
  ASSERT_EQ(::kill(pid, SIGHUP), 0);
  EXPECT_TRUE(log_has("reloaded " + config +
                      ": applied server.token_file, server.token_scope, server.cors_origins, log.level; "
                      "runner.memory_limit_mb apply to model versions loaded from now on; "
                      "waiting for the next start: server.threads"))
      << (*d)->Log();
  EXPECT_EQ(index_status(""), 401);
  EXPECT_EQ(index_status("first-token"), 200);
  EXPECT_EQ(index_status("first-token", "http://app.local"), 200);
  EXPECT_EQ(Get((*d)->port(), "/v2/health/live").status, 200);  // scope: the repository routes alone
  // Debug lines now: a store change is reconciled with one.
  ASSERT_EQ(RunAotid({"--store", store, "add", TestData("mlp_so.pt2"), "--name", "mlp"}), 0);
  EXPECT_TRUE(log_has("debug store changed; reconciling")) << (*d)->Log();
  ASSERT_TRUE(WaitReady((*d)->port(), "mlp", 60)) << (*d)->Log();
  // The version loaded after the reload runs under the new memory limit.
  auto runners = Pids("internal-runner --label mlp:1 --entry " + store + "/");  // this store's runner
  ASSERT_EQ(runners.size(), 1u);
  std::string limits = fs::ReadFile("/proc/" + std::to_string(runners[0]) + "/limits").value_or("");
  EXPECT_NE(limits.find(std::to_string(int64_t{3000} << 20)), std::string::npos) << limits;

  // The token rotates in its file: a reload reads it again.
  ASSERT_OK(fs::WriteFileAtomic(token_file, "second-token\n"));
  ASSERT_EQ(::kill(pid, SIGHUP), 0);
  EXPECT_TRUE(log_has("applied the token in " + token_file + "; waiting for the next start: server.threads"))
      << (*d)->Log();
  EXPECT_EQ(index_status("first-token"), 403);
  EXPECT_EQ(index_status("second-token"), 200);

  // A broken file, and a token file that cannot be read, are refused: the
  // daemon goes on with what it had.
  ASSERT_OK(fs::WriteFileAtomic(config, "[log]\nlevel = \"loud\"\n[server\n"));
  ASSERT_EQ(::kill(pid, SIGHUP), 0);
  EXPECT_TRUE(log_has("reload refused, the running configuration is kept: ")) << (*d)->Log();
  ASSERT_OK(fs::WriteFileAtomic(config, "[server]\ntoken_file = \"" + dir / "missing" + "\"\n"));
  ASSERT_EQ(::kill(pid, SIGHUP), 0);
  EXPECT_TRUE(log_has("reload refused, the running configuration is kept: server.token_file")) << (*d)->Log();
  EXPECT_EQ(index_status("second-token"), 200);
  EXPECT_EQ(Post((*d)->port(), "/v2/models/mlp/infer", "{\"inputs\":[]}").status, 400);  // still serving
  EXPECT_TRUE(WaitReady((*d)->port(), "mlp", 5)) << (*d)->Log();
  EXPECT_EQ(CountEvents(store, "daemon_reloaded"), 2);
  EXPECT_EQ((*d)->Stop(), 0);
}

// SIGTERM during a build stops what the build runs too: the compiler of a
// source package does not outlive the daemon.
TEST(ServiceManager, StopEndsTheBuildsCompilerToo) {
  TempDir dir;
  std::string store = dir / "store";
  ASSERT_EQ(RunAotid({"--store", store, "add", TestData("mlp_src.pt2"), "--name", "src"}), 0);
  auto d = DaemonProcess::Start({"--store", store, "--listen", "127.0.0.1:0"}, dir / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  // The compiler runs in the build's staging directory, under the store.
  const std::string staging = store + "/cache/.staging/";
  auto compiling = [&] {
    for (pid_t p : Pids(staging)) {
      std::string exe = fs::ReadFile("/proc/" + std::to_string(p) + "/cmdline").value_or("");
      if (exe.find("internal-build") == std::string::npos) return true;  // a child of the build child
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(compiling, 60)) << (*d)->Log();
  EXPECT_EQ((*d)->Stop(), 0);
  EXPECT_TRUE(WaitFor([&] { return Pids(staging).empty(); }, 5)) << "left running: " << Pids(staging).size();
}

// SIGTERM while requests are in flight: two held by the two workers (each
// waiting up to 1 s for its batch to fill) and three that arrived but wait
// for a worker. Every one is answered 200 with its eager output, and the
// daemon exits 0 within its drain timeout.
TEST(ServiceManager, StopFinishesTheRequestsInFlight) {
  TempDir dir;
  std::string store = dir / "store";
  std::string out;
  ASSERT_EQ(RunAotid({"--store", store, "add", TestData("mlp_so.pt2"), "--name", "mlp", "--max-batch-size",
                      "8", "--max-batch-delay-us", "1000000"},
                     &out),
            0)
      << out;
  ASSERT_OK(fs::WriteFileAtomic(dir / "aotid.toml", "[server]\nthreads = 2\n"));
  RunOptions config;
  config.env = {"AOTID_CONFIG=" + (dir / "aotid.toml")};
  auto d = DaemonProcess::Start({"--store", store, "--listen", "127.0.0.1:0"}, dir / "daemon.log", config);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(WaitReady((*d)->port(), "mlp", 120)) << (*d)->Log();
  ASSERT_NE((*d)->Log().find("config " + (dir / "aotid.toml")), std::string::npos) << (*d)->Log();
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  const json& rows = cases["mlp_rows"];
  const int n = 5;
  std::vector<Reply> replies(n);
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      replies[i] = Post((*d)->port(), "/v2/models/mlp/infer", json{{"inputs", rows[i]["inputs"]}}.dump());
    });
  }
  // All five have arrived (two in their batch, three queued): the daemon
  // has taken them, each in flight or answered.
  auto taken = [&] {
    httplib::Client c("127.0.0.1", (*d)->port());
    auto r = c.Get("/metrics");
    double n = 0;
    std::istringstream lines(r ? r->body : "");
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with("aotid_inflight_requests ") || line.starts_with("aotid_inference_requests_total{"))
        n += std::stod(line.substr(line.rfind(' ') + 1));
    }
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return taken() >= n; }, 30)) << (*d)->Log();
  auto t0 = std::chrono::steady_clock::now();
  int code = (*d)->Stop(30);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& c : clients) c.join();
  EXPECT_EQ(code, 0) << (*d)->Log();
  EXPECT_LT(took, 20) << (*d)->Log();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(replies[i].status, 200) << replies[i].body.dump() << (*d)->Log();
    EXPECT_TRUE(OutputsMatch(replies[i].body["outputs"], rows[i]["outputs"])) << replies[i].body.dump();
  }
}

}  // namespace
}  // namespace aotid::testing
