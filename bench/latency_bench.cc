// One infer over HTTP (keep-alive, loopback) against the same call made
// in-process on the same build, and against the floor: a bare TCP echo of
// the same number of bytes over loopback. All interleaved in one run.
//
// The cost of running models in runner processes, side by side: the
// benchmark serves the model itself, through the daemon's HTTP API code,
// twice: loaded in this process (as before runners) and in a runner process
// (runner::RunnerModel, as the daemon now does), and calls both directly
// too. It reports resident memory (this process without a model, with the
// runner's daemon side, with the in-process model; the runner process),
// and the time from a runner's kill -9 until an infer succeeds again.
//
//   aotid_latency_bench --store DIR --model NAME --port PORT --request FILE
//                       [--iterations N] [--crashes K] [--aotid PATH] [--handoff-rounds R]
//                       [--header-length L]
//
// FILE is an infer request body: JSON, or with L, the binary tensor
// extension (the first L bytes JSON, the tensors' bytes after them); PORT
// is the daemon's. Both local
// models load the cached build of the model's latest version for this
// machine, as the daemon does. PATH is the aotid binary runners run
// (default: ../aotid from this benchmark's folder). First, R round trips of
// the shared-memory hand-off alone (no model) for a few spin times.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/fs.h"
#include "base/memory.h"
#include "bench/cached_model.h"
#include "bench/raw_http.h"
#include "runner/channel.h"
#include "serving/http_api.h"
#include "serving/metrics.h"
#include "serving/model_registry.h"
#include "serving/tensor_codec.h"

namespace {

using aotid::bench::RawHttp;

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

// The median of a[i] - b[i]: for a model whose run time drifts by more
// than the overhead measured, each HTTP round trip is compared with the
// call made next to it in time.
double PairedMedian(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return Percentile(std::move(d), 0.5);
}

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// A line's KiB from /proc/<pid>/<file> ("VmRSS:", "Pss:"), 0 when absent.
long ProcKiB(pid_t pid, const char* file, std::string_view key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(key)) return std::atol(line.c_str() + key.size());
  }
  return 0;
}

// Resident memory of a process in KiB (VmRSS).
long RssKiB(pid_t pid) { return ProcKiB(pid, "status", "VmRSS:"); }

double MiB(long kib) { return kib / 1024.0; }

// The hand-off alone: a slot's state word between this process and a
// forked child, used as RunnerModel::Infer and the runner use it (store,
// wake, spin then futex), with the given spins, each request sent at once
// or after `pause_us` idle. The round trip's p50 and p90 in µs. Call it
// before any thread starts (it forks).
std::pair<double, double> HandOff(int64_t caller_spin_ns, int64_t runner_spin_ns, int pause_us, int rounds) {
  using namespace aotid::runner;
  auto slot = Slot::Create("aotid-bench-handoff", 1 << 20);
  if (!slot.ok()) return {0, 0};
  std::atomic<uint32_t>* state = &slot->header()->state;
  state->store(kIdle);
  pid_t child = ::fork();
  if (child == 0) {
    for (;;) {
      uint32_t v = state->load(std::memory_order_acquire);
      if (v == kDead) ::_exit(0);
      if (v != kRequest) {
        WaitWhile(state, v, runner_spin_ns, -1);
        continue;
      }
      state->store(kResponse, std::memory_order_release);
      Wake(state);
    }
  }
  std::vector<double> us;
  for (int i = 0; i < rounds + 50; ++i) {
    if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    auto t0 = Clock::now();
    state->store(kRequest, std::memory_order_release);
    Wake(state);
    WaitWhile(state, kRequest, caller_spin_ns, -1);
    auto t1 = Clock::now();
    state->store(kIdle, std::memory_order_release);
    if (i >= 50) us.push_back(Us(t1 - t0));
  }
  state->store(kDead, std::memory_order_release);
  Wake(state);
  ::waitpid(child, nullptr, 0);
  return {Percentile(us, 0.5), Percentile(us, 0.9)};
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

// The daemon's HTTP API on a free loopback port in this process, serving
// the given models (version 1 of each) on its own thread.
class LocalApi {
 public:
  LocalApi() : api_(&registry_, &metrics_, Options()) {}
  ~LocalApi() {
    api_.Stop();
    if (thread_.joinable()) thread_.join();
  }
  void Put(const std::string& name, std::shared_ptr<aotid::model::LoadedModel> model) {
    aotid::serving::ServedModel m;
    m.name = name;
    m.version = 1;
    m.state = aotid::serving::ServeState::kReady;
    m.device = model->device();
    m.model = std::move(model);
    registry_.Put(std::move(m));
  }
  aotid::Status Start() {
    RETURN_IF_ERROR(api_.Bind());
    thread_ = std::thread([this] { api_.Serve(); });
    return aotid::Status::OK();
  }
  int port() const { return api_.port(); }

 private:
  static aotid::serving::HttpOptions Options() {
    aotid::serving::HttpOptions o;
    o.server.port = 0;
    return o;
  }
  aotid::serving::ModelRegistry registry_;
  aotid::serving::Metrics metrics_;
  aotid::serving::HttpApi api_;
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  aotid::KeepFreedMemory(
      size_t{256}
      << 20);  // the in-process model keeps its freed activations, as a runner does (base/memory.h)
  std::string store_dir, model, request_file, aotid = aotid::bench::DefaultAotid();
  int port = 0, iterations = 2000, crashes = 10, handoff_rounds = 2000;
  std::optional<size_t> header_length;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    // clang-format off
    if (k == "--store") store_dir = v;
    else if (k == "--model") model = v;
    else if (k == "--port") port = std::stoi(v);
    else if (k == "--request") request_file = v;
    else if (k == "--iterations") iterations = std::stoi(v);
    else if (k == "--crashes") crashes = std::stoi(v);
    else if (k == "--aotid") aotid = v;
    else if (k == "--handoff-rounds") handoff_rounds = std::stoi(v);
    else if (k == "--header-length") header_length = std::stoul(v);
    else return Die("unknown flag " + k);
    // clang-format on
  }
  if (store_dir.empty() || model.empty() || port == 0 || request_file.empty()) {
    return Die(
        "usage: --store DIR --model NAME --port PORT --request FILE [--iterations N] [--crashes K] "
        "[--aotid PATH] [--handoff-rounds R] [--header-length L]");
  }
  auto body = aotid::fs::ReadFile(request_file);
  if (!body.ok()) return Die(body.status().message());
  std::signal(SIGPIPE, SIG_IGN);

  // The hand-off alone, with runner/'s spins (caller 50 µs, runner 100 µs),
  // shorter ones and none, back-to-back and after an idle pause.
  for (int pause_us : {0, 300}) {
    for (int64_t caller_ns : {int64_t{0}, int64_t{10'000}, int64_t{50'000}}) {
      for (int64_t runner_ns : {int64_t{0}, int64_t{10'000}, int64_t{100'000}}) {
        if (handoff_rounds <= 0) continue;
        auto [p50, p90] = HandOff(caller_ns, runner_ns, pause_us, handoff_rounds);
        std::printf("handoff caller_spin_us=%lld runner_spin_us=%lld pause_us=%d p50_us=%.1f p90_us=%.1f\n",
                    static_cast<long long>(caller_ns / 1000), static_cast<long long>(runner_ns / 1000),
                    pause_us, p50, p90);
      }
    }
  }

  // Resident memory first without a model, then with the runner's daemon
  // side (its slots, its supervisor), then with the model in this process.
  const long rss_bare = RssKiB(::getpid());
  auto scratch = aotid::fs::MakeTempDir("/tmp", "aotid-bench-");
  if (!scratch.ok()) return Die(scratch.status().message());
  struct RemoveScratch {
    std::string dir;
    ~RemoveScratch() { (void)aotid::fs::RemoveAll(dir); }
  } remove_scratch{*scratch};
  aotid::runner::RunnerOptions ropts;
  ropts.self_exe = aotid;
  ropts.scratch_root = *scratch;
  // Every kill below counts as a first crash: restarted at once. (The
  // daemon waits 0.1 s, 0.2 s, ... for crashes that repeat within
  // runner.crash_window_s, and gives up after runner.max_crashes.)
  ropts.crash_window_ms = 0;
  ropts.max_crashes = crashes + 1;
  auto started = aotid::bench::StartCachedRunner(store_dir, model, ropts);
  if (!started.ok()) return Die(started.status().message());
  std::shared_ptr<aotid::runner::RunnerModel> runner = std::move(started).value();
  auto req = aotid::serving::DecodeInferRequest(*body, runner->spec(), {}, header_length);
  if (!req.ok()) return Die(req.status().message());
  for (int i = 0; i < 50; ++i) {
    if (auto out = runner->Infer(req->inputs, {}); !out.ok()) return Die(out.status().message());
  }
  const long rss_runner_side = RssKiB(::getpid());
  // The runner's VmRSS counts libtorch's code, mapped from the same files
  // by every runner: its anonymous part is its own, its file-backed part is
  // shared, and Pss splits the shared pages among the processes using them.
  const pid_t runner_pid = runner->pid();
  const long rss_runner = RssKiB(runner_pid), anon_runner = ProcKiB(runner_pid, "status", "RssAnon:"),
             file_runner = ProcKiB(runner_pid, "status", "RssFile:"),
             pss_runner = ProcKiB(runner_pid, "smaps_rollup", "Pss:");

  auto loaded_or = aotid::bench::LoadCachedModel(store_dir, model);
  if (!loaded_or.ok()) return Die(loaded_or.status().message());
  std::shared_ptr<aotid::model::LoadedModel> loaded = std::move(loaded_or).value();
  for (int i = 0; i < 50; ++i) {
    if (auto out = loaded->Infer(req->inputs, {}); !out.ok()) return Die(out.status().message());
  }
  const long rss_inproc = RssKiB(::getpid());

  // Both served by this process's own HTTP API, as the daemon serves.
  LocalApi local;
  const std::string inproc_name = model + "-in-process", runner_name = model + "-runner";
  local.Put(inproc_name, loaded);
  local.Put(runner_name, runner);
  if (auto s = local.Start(); !s.ok()) return Die(s.message());

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

  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  std::string path = "/v2/models/" + model + "/infer";
  RawHttp raw(port), raw_local(local.port());
  std::string raw_infer = RawHttp::Request("POST", path, *body, header_length),
              raw_live = RawHttp::Request("GET", "/v2/health/live", "");
  std::string local_inproc =
      RawHttp::Request("POST", "/v2/models/" + inproc_name + "/infer", *body, header_length);
  std::string local_runner =
      RawHttp::Request("POST", "/v2/models/" + runner_name + "/infer", *body, header_length);
  httplib::Headers headers;
  if (header_length) headers.emplace("Inference-Header-Content-Length", std::to_string(*header_length));
  const char* content_type = header_length ? "application/octet-stream" : "application/json";
  std::vector<double> http_us, inproc_us, echo_us, live_us, raw_us, raw_live_us;
  // The sides of isolation's cost, each timed twice a round: after an idle
  // pause longer than the runner's spin (it sleeps on its futex when the
  // request comes), and at once again (it is still spinning), as a client
  // with think time and one that sends its next request at once find it.
  struct Side {
    const char* name;
    std::function<bool()> call;
    std::vector<double> idle_us, again_us;
  };
  std::vector<Side> sides = {
      {"echo",
       [&] {
         return ::write(echo_fd, body->data(), body->size()) == static_cast<ssize_t>(body->size()) &&
                Echo::ReadFull(echo_fd, echo_buf.data(), echo_buf.size());
       }},
      {"call_inproc", [&] { return loaded->Infer(req->inputs, {}).ok(); }},
      {"call_runner", [&] { return runner->Infer(req->inputs, {}).ok(); }},
      {"http_inproc", [&] { return raw_local.RoundTrip(local_inproc) == 200; }},
      {"http_runner", [&] { return raw_local.RoundTrip(local_runner) == 200; }},
  };
  constexpr auto kPause = std::chrono::microseconds(300);
  // Interleaved, so every side sees the same machine noise.
  for (int i = 0; i < iterations + 50; ++i) {
    auto t0 = Clock::now();
    auto r = client.Post(path, headers, *body, content_type);
    auto t1 = Clock::now();
    if (!r || r->status != 200) return fail("HTTP infer failed");
    auto out = loaded->Infer(req->inputs, {});
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
    for (Side& side : sides) {
      std::this_thread::sleep_for(kPause);
      auto s0 = Clock::now();
      bool ok = side.call();
      auto s1 = Clock::now();
      ok = ok && side.call();
      auto s2 = Clock::now();
      if (!ok) return fail(std::string(side.name) + " failed");
      if (i < 50) continue;
      side.idle_us.push_back(Us(s1 - s0));
      side.again_us.push_back(Us(s2 - s1));
    }
    if (i < 50) continue;  // warm-up
    http_us.push_back(Us(t1 - t0));
    inproc_us.push_back(Us(t2 - t1));
    echo_us.push_back(Us(t3 - t2));
    live_us.push_back(Us(t4 - t3));
    raw_us.push_back(Us(t5 - t4));
    raw_live_us.push_back(Us(t6 - t5));
  }
  ::close(echo_fd);
  double hp50 = Percentile(http_us, 0.5), hp99 = Percentile(http_us, 0.99);
  double ip50 = Percentile(inproc_us, 0.5), ip99 = Percentile(inproc_us, 0.99);
  double ep50 = Percentile(echo_us, 0.5), ep99 = Percentile(echo_us, 0.99);
  std::printf(
      "model=%s iterations=%d body_bytes=%zu http_p50_us=%.1f http_p99_us=%.1f inproc_p50_us=%.1f "
      "inproc_p99_us=%.1f overhead_p50_us=%.1f overhead_p99_us=%.1f echo_p50_us=%.1f echo_p99_us=%.1f "
      "overhead_over_echo_p50=%.2f health_get_p50_us=%.1f paired_overhead_p50_us=%.1f\n",
      model.c_str(), iterations, body->size(), hp50, hp99, ip50, ip99, hp50 - ip50, hp99 - ip99, ep50, ep99,
      (hp50 - ip50) / ep50, Percentile(live_us, 0.5), PairedMedian(http_us, inproc_us));
  // The same with the raw client: the server's own overhead.
  double rp50 = Percentile(raw_us, 0.5), rp99 = Percentile(raw_us, 0.99);
  std::printf(
      "model=%s raw_client http_p50_us=%.1f http_p99_us=%.1f overhead_p50_us=%.1f overhead_p99_us=%.1f "
      "overhead_over_echo_p50=%.2f health_get_p50_us=%.1f\n",
      model.c_str(), rp50, rp99, rp50 - ip50, rp99 - ip99, (rp50 - ip50) / ep50,
      Percentile(raw_live_us, 0.5));

  // Isolation's cost: the same server code (raw client), the model in this
  // process or in a runner. "over_echo" is the round trip over the echo's,
  // "overhead_over_echo" the same less the model's own run (the in-process
  // call), both at p50 and against the echo timed the same way.
  for (bool again : {false, true}) {
    std::map<std::string, std::pair<double, double>> p;  // side -> (p50, p90)
    std::map<std::string, const std::vector<double>*> samples;
    for (const Side& side : sides) {
      const auto& v = again ? side.again_us : side.idle_us;
      p[side.name] = {Percentile(v, 0.5), Percentile(v, 0.9)};
      samples[side.name] = &v;
    }
    double echo = p["echo"].first, run = p["call_inproc"].first;
    std::string timing = again ? "at_once" : "after_" + std::to_string(kPause.count()) + "us_idle";
    std::printf("model=%s isolation timing=%s", model.c_str(), timing.c_str());
    for (const Side& side : sides) {
      std::printf(" %s_p50_us=%.1f %s_p90_us=%.1f", side.name, p[side.name].first, side.name,
                  p[side.name].second);
    }
    std::printf(
        " http_inproc_over_echo=%.2f http_runner_over_echo=%.2f http_inproc_overhead_over_echo=%.2f "
        "http_runner_overhead_over_echo=%.2f runner_minus_inproc_http_us=%.1f "
        "runner_minus_inproc_call_us=%.1f paired_http_inproc_overhead_p50_us=%.1f "
        "paired_http_runner_overhead_p50_us=%.1f paired_http_runner_overhead_over_echo=%.2f\n",
        p["http_inproc"].first / echo, p["http_runner"].first / echo, (p["http_inproc"].first - run) / echo,
        (p["http_runner"].first - run) / echo, p["http_runner"].first - p["http_inproc"].first,
        p["call_runner"].first - run, PairedMedian(*samples["http_inproc"], *samples["call_inproc"]),
        PairedMedian(*samples["http_runner"], *samples["call_inproc"]),
        PairedMedian(*samples["http_runner"], *samples["call_inproc"]) / echo);
  }
  std::printf(
      "model=%s memory bench_no_model_mib=%.1f bench_with_runner_side_mib=%.1f "
      "bench_with_runner_and_inproc_model_mib=%.1f runner_process_mib=%.1f runner_anon_mib=%.1f "
      "runner_file_mib=%.1f runner_pss_mib=%.1f\n",
      model.c_str(), MiB(rss_bare), MiB(rss_runner_side), MiB(rss_inproc), MiB(rss_runner), MiB(anon_runner),
      MiB(file_runner), MiB(pss_runner));

  // Crash to serving: kill -9 the runner, then infer until a run on its
  // replacement succeeds.
  std::vector<double> recover_ms;
  int failed_runs = 0;
  for (int i = 0; i < crashes; ++i) {
    const int restarts = runner->restarts();
    const pid_t pid = runner->pid();
    if (pid <= 0) return Die("no runner to kill");
    auto t0 = Clock::now();
    ::kill(pid, SIGKILL);
    for (;;) {
      bool ok = runner->Infer(req->inputs, {}).ok();
      if (ok && runner->restarts() > restarts) break;
      if (!ok) ++failed_runs;
      if (Clock::now() - t0 > std::chrono::seconds(60))
        return Die("the runner did not come back within 60 s");
    }
    recover_ms.push_back(Us(Clock::now() - t0) / 1000);
    for (int j = 0; j < 20; ++j) (void)runner->Infer(req->inputs, {});  // settled before the next kill
  }
  if (!recover_ms.empty()) {
    std::printf(
        "model=%s crash_to_serving kills=%d median_ms=%.1f min_ms=%.1f max_ms=%.1f failed_runs=%d "
        "restarted_runner_mib=%.1f\n",
        model.c_str(), crashes, Percentile(recover_ms, 0.5), Percentile(recover_ms, 0),
        Percentile(recover_ms, 1), failed_runs, MiB(RssKiB(runner->pid())));
  }
  return 0;
}
