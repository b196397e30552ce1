// End to end: real exported models, the real binary, real HTTP over
// loopback. The models are compiled once (the first daemon start) and the
// whole suite shares them; the restart test proves the cache is used.
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "platform/device_probe.h"
#include "platform/hardware.h"
#include "storage/model_store.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

using json = nlohmann::json;
constexpr int64_t kMaxBody = 256 * 1024;

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    store_ = dir_->path() + "/store";
    config_ = dir_->path() + "/aotid.toml";
    ASSERT_OK(
        fs::WriteFileAtomic(config_, "[server]\nmax_body_bytes = " + std::to_string(kMaxBody) +
                                         "\nthreads = 4\n[build]\njobs = 1\n[runner]\ntimeout_s = 3\n"));
    for (const char* m : {"mlp", "embed"}) {
      std::string out;
      int rc = RunAotid(
          {"--config", config_, "--store", store_, "add", TestData(std::string(m) + ".pt2"), "--name", m},
          &out);
      ASSERT_EQ(rc, 0) << out;
      EXPECT_NE(out.find(std::string("added ") + m + ":1"), std::string::npos) << out;
    }
    auto d = DaemonProcess::Start({"--config", config_, "--store", store_, "--listen", "127.0.0.1:0"},
                                  dir_->path() + "/daemon1.log");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = d->release();
    // The first request lands while the builds are still running (each takes
    // many seconds): it must be refused with 503, not block or crash.
    first_reply_ = new Reply(Post(daemon_->port(), "/v2/models/embed/infer", R"({"inputs":[]})"));
    ASSERT_TRUE(WaitReady(daemon_->port(), "mlp")) << daemon_->Log();
    ASSERT_TRUE(WaitReady(daemon_->port(), "embed")) << daemon_->Log();
  }
  static void TearDownTestSuite() {
    delete daemon_;
    delete first_reply_;
    delete dir_;
  }
  void SetUp() override { ASSERT_NE(daemon_, nullptr); }
  int port() const { return daemon_->port(); }

  static TempDir* dir_;
  static std::string store_, config_;
  static DaemonProcess* daemon_;
  static Reply* first_reply_;
};
TempDir* ServeTest::dir_ = nullptr;
std::string ServeTest::store_, ServeTest::config_;
DaemonProcess* ServeTest::daemon_ = nullptr;
Reply* ServeTest::first_reply_ = nullptr;

TEST_F(ServeTest, ModelAnswers503WhileItsBuildRuns) {
  EXPECT_EQ(first_reply_->status, 503);
  std::string msg = first_reply_->body.value("error", "");
  EXPECT_TRUE(msg.find("building") != std::string::npos || msg.find("queued") != std::string::npos) << msg;
}

TEST_F(ServeTest, HealthAndMetadataDescribeTheModels) {
  EXPECT_EQ(Get(port(), "/v2/health/live").status, 200);
  EXPECT_EQ(Get(port(), "/v2/health/ready").status, 200);
  Reply m = Get(port(), "/v2/models/mlp");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.body["state"], "ready");
  // Added with the default device, auto: this machine's choice, as the
  // daemon's device probe answered and kept it (the CPU here; MPS on an
  // Apple Silicon Mac whose torch can use it, unless AOTID_CPU_ONLY says
  // otherwise).
  auto kept = fs::ReadFile(store_ + "/cache/devices.json");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  auto answer = platform::DeviceAnswerFromJson(json::parse(*kept)["answer"].dump());
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  platform::HardwareInfo hw = platform::ProbeHardware();
  platform::ApplyDeviceAnswer(*answer, &hw);
  EXPECT_EQ(m.body["device"], platform::AutoDevice(hw));
  // Dynamic dims stay -1 in the shape (OIP clients read nothing else); their
  // names and traced ranges come as the parameters extension.
  EXPECT_EQ(m.body["inputs"], json::parse(R"([{"name":"x","datatype":"FP32","shape":[-1,8],
      "parameters":{"dynamic_dims":[{"dim":0,"name":"batch","min":1,"max":65536,"typical":2}]}}])"));
  EXPECT_EQ(m.body["outputs"], json::parse(R"([{"name":"y","datatype":"FP32","shape":[-1,4]}])"));
  Reply e = Get(port(), "/v2/models/embed");
  EXPECT_EQ(e.body["inputs"], json::parse(R"([{"name":"ids","datatype":"INT64","shape":[2,5]}])"));
  EXPECT_EQ(Get(port(), "/v2/models/embed/versions/1/ready").status, 200);
}

// A build keeps one copy of the compiled model: in its cache entry, beside
// its manifest. Inductor's own cache (a second copy, as large as the
// weights) goes with the build's staging folder.
TEST_F(ServeTest, BuildsLeaveOneCopyOfTheCompiledModelOnDisk) {
  namespace stdfs = std::filesystem;
  int libraries = 0;
  std::error_code ec;
  for (auto it = stdfs::recursive_directory_iterator(store_, ec); it != stdfs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string path = it->path().string();
    EXPECT_EQ(path.find("/.inductor"), std::string::npos) << path;
    if (!it->is_regular_file() || it->path().extension() != ".so") continue;
    ++libraries;
    bool in_entry = false;
    for (auto dir = it->path().parent_path(); dir.string().size() > store_.size(); dir = dir.parent_path()) {
      in_entry = in_entry || stdfs::exists(dir / "manifest.json");
    }
    EXPECT_TRUE(in_entry) << path << " lies outside a committed build";
  }
  EXPECT_EQ(libraries, 2);  // mlp's and embed's
}

TEST_F(ServeTest, InferMatchesEagerPyTorch) {
  ExpectCasesMatchEager(port(), "mlp");
  ExpectCasesMatchEager(port(), "embed");
}

// The binary tensor extension over real HTTP: input bytes after a JSON
// header, outputs back as bytes, against eager PyTorch.
TEST_F(ServeTest, BinaryTensorsBothWays) {
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  const json& c = cases["mlp"][1];  // batch 3
  std::vector<float> x;
  for (const auto& v : c["inputs"][0]["data"]) x.push_back(v.get<float>());
  json header{{"inputs",
               {{{"name", "x"},
                 {"datatype", "FP32"},
                 {"shape", c["inputs"][0]["shape"]},
                 {"parameters", {{"binary_data_size", x.size() * 4}}}}}},
              {"parameters", {{"binary_data_output", true}}}};
  std::string head = header.dump();
  std::string body = head + std::string(reinterpret_cast<const char*>(x.data()), x.size() * 4);
  httplib::Client client("127.0.0.1", port());
  auto r =
      client.Post("/v2/models/mlp/infer", {{"Inference-Header-Content-Length", std::to_string(head.size())}},
                  body, "application/octet-stream");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  size_t json_len = std::stoul(r->get_header_value("Inference-Header-Content-Length"));
  json reply = json::parse(r->body.substr(0, json_len));
  const json& y = reply["outputs"][0];
  EXPECT_EQ(y["shape"], c["outputs"][0]["shape"]);
  ASSERT_EQ(y["parameters"]["binary_data_size"].get<size_t>(), r->body.size() - json_len);
  std::vector<float> got((r->body.size() - json_len) / 4);
  std::memcpy(got.data(), r->body.data() + json_len, got.size() * 4);
  const json& want = c["outputs"][0]["data"];
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i].get<double>(), 1e-5 + 1e-5 * std::fabs(want[i].get<double>())) << i;
  }

  // A truncated body and a malformed header: 400 naming the problem.
  auto cut =
      client.Post("/v2/models/mlp/infer", {{"Inference-Header-Content-Length", std::to_string(head.size())}},
                  body.substr(0, body.size() - 5), "application/octet-stream");
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->status, 400);
  EXPECT_NE(cut->body.find("runs past the end of the body"), std::string::npos) << cut->body;
  auto bad = client.Post("/v2/models/mlp/infer", {{"Inference-Header-Content-Length", "12abc"}}, body,
                         "application/octet-stream");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("must be a byte count"), std::string::npos) << bad->body;
  ExpectCasesMatchEager(port(), "mlp");  // JSON still answers as JSON
}

// GET /metrics, as "name{labels}" -> value. Every line must parse.
std::map<std::string, double> Scrape(int port) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/metrics");
  std::map<std::string, double> out;
  EXPECT_TRUE(r && r->status == 200);
  if (!r) return out;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  std::istringstream lines(r->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST_F(ServeTest, MetricsCountRequestsBuildsAndMemory) {
  auto before = Scrape(port());
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  std::string good = json{{"inputs", cases["mlp"][0]["inputs"]}}.dump();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Post(port(), "/v2/models/mlp/infer", good).status, 200);
  ASSERT_EQ(Post(port(), "/v2/models/mlp/infer", R"({"inputs":[]})").status, 400);
  ASSERT_EQ(Post(port(), "/v2/models/nobody/infer", good).status, 404);
  auto after = Scrape(port());
  const std::string series = R"({model="mlp",version="1")";
  auto delta = [&](const std::string& key) { return after[key] - before[key]; };
  EXPECT_EQ(delta("aotid_inference_requests_total" + series + R"(,code="200"})"), 3);
  EXPECT_EQ(delta("aotid_inference_requests_total" + series + R"(,code="400"})"), 1);
  EXPECT_EQ(delta("aotid_inference_duration_seconds_count" + series + "}"), 4);
  EXPECT_EQ(delta("aotid_compute_duration_seconds_count" + series + "}"), 3);  // the 400 never ran the model
  EXPECT_EQ(after["aotid_inference_duration_seconds_bucket" + series + R"(,le="+Inf"})"],
            after["aotid_inference_duration_seconds_count" + series + "}"]);
  EXPECT_GT(after["aotid_inference_duration_seconds_sum" + series + "}"], 0);
  for (const auto& [key, value] : after) EXPECT_EQ(key.find("nobody"), std::string::npos) << key;
  EXPECT_EQ(after["aotid_models_loaded"], 2);
  EXPECT_EQ(after["aotid_builds_total{outcome=\"ready\"}"], 2);  // mlp and embed, built by this daemon
  EXPECT_EQ(after["aotid_build_duration_seconds_count"], 2);
  EXPECT_EQ(after["aotid_inflight_requests"], 0);
  // Models run in runner processes: libtorch never enters the daemon.
  EXPECT_GT(after["aotid_process_resident_memory_bytes"], 1e6);
  EXPECT_LT(after["aotid_process_resident_memory_bytes"], 100e6);
}

// Each model runs in its own runner process. A runner killed mid-request
// and one that hangs cost the requests they held and a restart, never the
// daemon or the other model. An input that would trip a kernel's bounds
// check (it aborts inside an OpenMP region) is refused before it runs.
TEST_F(ServeTest, CrashedKilledOrHungRunnerCostsItsRequestsNotTheDaemon) {
  // This daemon's runner for `label`: other daemons on the machine (other
  // test runs) may serve the same labels from their own stores.
  auto runner_of = [&](const std::string& label) {
    auto pids = Pids("internal-runner --label " + label + " --entry " + store_ + "/");
    return pids.size() == 1 ? pids[0] : pid_t{0};
  };
  const std::string embed = "embed:1";
  const pid_t mlp_runner = runner_of("mlp:1");
  ASSERT_GT(mlp_runner, 0);
  auto ids = [](const std::string& values) {
    return R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[2,5],"data":[1,2,3,4,5,)" + values +
           "]}]}";
  };
  auto embed_serves = [&] { return Post(port(), "/v2/models/embed/infer", ids("1,2,3,4,5")).status == 200; };
  int crashes = CountEvents(store_, "runner_crashed");

  // An id outside the embedding table would read past it (the kernel's
  // bounds check aborts the runner); the range recorded at build refuses it
  // before anything runs, and the runner is left alone.
  const pid_t first = runner_of(embed);
  ASSERT_GT(first, 0);
  for (auto [bad, held] :
       {std::pair{"1,2,3,4,1000000000", "1000000000 (element 9)"}, {"-5,1,2,3,4", "-5 (element 5)"}}) {
    Reply r = Post(port(), "/v2/models/embed/infer", ids(bad));
    EXPECT_EQ(r.status, 400) << r.body.dump();
    EXPECT_EQ(r.body.value("error", ""), "input 'ids' holds " + std::string(held) + ", valid range [0, 50)")
        << r.body.dump();
  }
  EXPECT_EQ(runner_of(embed), first);
  EXPECT_EQ(CountEvents(store_, "runner_crashed"), crashes);
  ExpectCasesMatchEager(port(), "embed");

  // kill -9 while a request waits in the runner (stopped, so it is surely
  // mid-request): that request gets 500 naming the signal.
  pid_t runner = runner_of(embed);
  ASSERT_GT(runner, 0);
  ASSERT_EQ(::kill(runner, SIGSTOP), 0);
  std::thread held([&] {
    Reply r = Post(port(), "/v2/models/embed/infer", ids("1,2,3,4,5"));
    EXPECT_EQ(r.status, 500) << r.body.dump();
    EXPECT_NE(r.body.dump().find("signal 9"), std::string::npos) << r.body.dump();
  });
  // It is in flight: decoded and sent on at once to the stopped runner.
  ASSERT_TRUE(WaitFor([&] { return Scrape(port())["aotid_inflight_requests"] >= 1; }, 10)) << daemon_->Log();
  ASSERT_EQ(::kill(runner, SIGKILL), 0);
  held.join();
  ASSERT_TRUE(WaitFor(embed_serves, 10)) << daemon_->Log();

  // A runner that hangs: 504 after runner.timeout_s (3 s here), and it is
  // replaced. The 16 requests sent to it meanwhile wait holding no HTTP
  // worker (this daemon has 4): the other model and the health route are
  // answered at once. (Each once held a worker: the 4 were taken, and every
  // model waited for the timeout.)
  runner = runner_of(embed);
  ASSERT_EQ(::kill(runner, SIGSTOP), 0);
  std::vector<Reply> held_replies(16);
  std::vector<std::thread> holders;
  for (auto& r : held_replies)
    holders.emplace_back([&r, this, &ids] { r = Post(port(), "/v2/models/embed/infer", ids("1,2,3,4,5")); });
  // All 16 are in (bounded: the metrics route needs a free worker too).
  ASSERT_TRUE(WaitFor([&] { return Scrape(port())["aotid_inflight_requests"] >= 16; }, 2)) << daemon_->Log();
  json mlp_case = json::parse(*fs::ReadFile(TestData("cases.json")))["mlp"][0];
  std::vector<double> bystander_s;
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Reply live = Get(port(), "/v2/health/live");
    Reply other = Post(port(), "/v2/models/mlp/infer", json{{"inputs", mlp_case["inputs"]}}.dump());
    double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(live.status, 200);
    EXPECT_EQ(other.status, 200) << other.body.dump();
    bystander_s.push_back(took_s);
  }
  // Answered while the 16 still wait (they leave only at the time limit),
  // so not behind them. Said by order, not by a timing.
  EXPECT_GE(Scrape(port())["aotid_inflight_requests"], 16)
      << "the other model waited behind the hung runner's requests";
  std::sort(bystander_s.begin(), bystander_s.end());
  std::cout << "while a stopped runner held 16 requests: health + the other model's infer, median "
            << bystander_s[1] * 1000 << " ms\n";
  for (auto& t : holders) t.join();
  int timed_out = 0;
  for (const Reply& hung : held_replies) {
    if (hung.status == 504) {
      ++timed_out;
      EXPECT_NE(hung.body.dump().find("time limit"), std::string::npos) << hung.body.dump();
    } else {
      // Run by the runner that replaced it, or told to try again while it
      // started (a request that waited its whole time for a runner).
      EXPECT_TRUE(hung.status == 200 || hung.status == 503) << hung.status << " " << hung.body.dump();
    }
  }
  EXPECT_GE(timed_out, 1);
  ASSERT_TRUE(WaitFor(embed_serves, 10)) << daemon_->Log();
  EXPECT_NE(runner_of(embed), runner);
  ExpectCasesMatchEager(port(), "embed");

  EXPECT_EQ(runner_of("mlp:1"), mlp_runner);
  EXPECT_EQ(CountEvents(store_, "runner_crashed"), crashes + 2);
  httplib::Client c("127.0.0.1", port());
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("aotid_runner_crashes_total{model=\"embed\",version=\"1\"} 2"),
            std::string::npos)
      << metrics->body;

  // Killed more than runner.max_crashes (5) times within
  // runner.crash_window_s: not restarted, 503 with the reason. A repository
  // load of the model, loaded already, tries it again.
  Reply failed;
  auto given_up = [&] {
    return failed.status == 503 && failed.body.dump().find("not restarted") != std::string::npos;
  };
  for (int kills = 0; kills < 10 && !given_up(); ++kills) {
    pid_t r = runner_of(embed);
    ASSERT_GT(r, 0);
    ASSERT_EQ(::kill(r, SIGKILL), 0);
    // Served again by a new runner, or given up on (a request sent before
    // the daemon saw the kill gets 500).
    ASSERT_TRUE(WaitFor(
        [&] {
          failed = Post(port(), "/v2/models/embed/infer", ids("1,2,3,4,5"));
          return failed.status == 200 || given_up();
        },
        20))
        << failed.body.dump();
  }
  EXPECT_EQ(failed.status, 503) << failed.body.dump();
  EXPECT_NE(failed.body.dump().find("is not restarted"), std::string::npos) << failed.body.dump();
  EXPECT_EQ(runner_of(embed), 0);
  Reply load = Post(port(), "/v2/repository/models/embed/load", "");
  EXPECT_EQ(load.status, 200) << load.body.dump();
  EXPECT_EQ(load.body.value("state", ""), "ready") << load.body.dump();
  Reply again = Post(port(), "/v2/models/embed/infer", ids("1,2,3,4,5"));
  EXPECT_EQ(again.status, 200) << again.body.dump() << daemon_->Log();
  EXPECT_EQ(runner_of("mlp:1"), mlp_runner);
}

// 64 clients at once on 4 HTTP workers (a request waiting for
// its batch holds none), each with its own row (32 rows, each sent twice):
// batched runs join them, and every client still gets exactly its row's
// eager output.
TEST_F(ServeTest, DynamicBatchingGivesEachClientItsOwnRows) {
  std::string out;
  int loads = CountEvents(store_, "loaded");
  ASSERT_EQ(RunAotid({"--store", store_, "set", "mlp", "max_batch_size=8", "max_batch_delay_us=20000"}, &out),
            0)
      << out;
  ASSERT_TRUE(WaitFor([&] { return CountEvents(store_, "loaded") > loads; }, 30)) << daemon_->Log();
  EXPECT_NE(daemon_->Log().find("batching up to 8 rows"), std::string::npos) << daemon_->Log();
  auto before = Scrape(port());

  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  const json& rows = cases["mlp_rows"];
  ASSERT_EQ(rows.size(), 32u);
  std::atomic<int> right{0};
  const size_t clients_n = 2 * rows.size();
  std::vector<std::string> problems(clients_n);
  std::vector<std::thread> clients;
  for (size_t c = 0; c < clients_n; ++c) {
    clients.emplace_back([&, c] {
      const json& row = rows[c % rows.size()];
      Reply r = Post(port(), "/v2/models/mlp/infer",
                     json{{"inputs", row["inputs"]}, {"id", std::to_string(c)}}.dump());
      if (r.status == 200 && OutputsMatch(r.body["outputs"], row["outputs"]) &&
          r.body["id"] == std::to_string(c)) {
        right++;
      } else {
        problems[c] = std::to_string(r.status) + " " + r.body.dump();
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(right, 64);
  for (const auto& p : problems) EXPECT_TRUE(p.empty()) << p;

  auto after = Scrape(port());
  const std::string series = R"({model="mlp",version="1")";
  double runs =
      after["aotid_batch_rows_count" + series + "}"] - before["aotid_batch_rows_count" + series + "}"];
  double rows_run =
      after["aotid_batch_rows_sum" + series + "}"] - before["aotid_batch_rows_sum" + series + "}"];
  EXPECT_EQ(rows_run, 64);
  EXPECT_LT(runs, 64) << "no run joined two requests";
  EXPECT_GT(after["aotid_queue_duration_seconds_count" + series + "}"], 0);

  loads = CountEvents(store_, "loaded");
  ASSERT_EQ(RunAotid({"--store", store_, "set", "mlp", "max_batch_size=1", "max_batch_delay_us=0"}, &out), 0)
      << out;
  ASSERT_TRUE(WaitFor([&] { return CountEvents(store_, "loaded") > loads; }, 30)) << daemon_->Log();
}

TEST_F(ServeTest, BadRequestsGetClearErrorsAndDaemonKeepsServing) {
  struct Case {
    std::string path, body;
    int status;
    std::string needle;
  } cases[] = {
      {"/v2/models/nope/infer", "{}", 404, "unknown model 'nope'"},
      {"/v2/models/mlp/versions/9/infer", "{}", 404, "no served version 9"},
      {"/v2/models/mlp/infer", "{\"inputs\": [", 400, "not valid JSON"},
      {"/v2/models/mlp/infer",
       R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,7],"data":[1,2,3,4,5,6,7]}]})", 400,
       "input 'x' has shape [1, 7], expected [-1, 8]"},
      {"/v2/models/mlp/infer",
       R"({"inputs":[{"name":"x","datatype":"INT64","shape":[1,8],"data":[1,2,3,4,5,6,7,8]}]})", 400,
       "input 'x' has datatype INT64, expected FP32"},
      {"/v2/models/mlp/infer", R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,8],"data":[1,2,3]}]})",
       400, "'data' has 3 elements, shape [1, 8] needs 8"},
      {"/v2/models/embed/infer",
       R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[2,5],"data":[1,2,3,4,5,6,7,8,9,1.5]}]})", 400,
       "input 'ids': element 9 is number, expected an integer"},
      {"/v2/models/mlp/infer",
       R"({"inputs":[{"name":"x","datatype":"FP32","shape":[4000000000,8],"data":[]}]})", 400,
       "has more than"},
      {"/v2/models/mlp/infer", std::string(kMaxBody + 10, ' '), 413, "exceeds the limit of 262144 bytes"},
      {"/v2/nowhere", "{}", 404, "no route"},
      {"/v2/models/a..b/infer", "{}", 400, "must not contain '..'"},
      {"/v2/models/.hidden/infer", "{}", 400, "must start with a letter or digit"},
      {"/v2/models/a%20b/infer", "{}", 400, "may only contain letters"},
      {"/v2/models/mlp/versions/abc/infer", "{}", 400, "must be an integer"},
      {"/v2/models/mlp/versions/0/infer", "{}", 400, "version must be an integer from 1"},
  };
  for (const auto& c : cases) {
    Reply r = Post(port(), c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body.substr(0, 200) << " -> " << r.body.dump();
    ASSERT_TRUE(r.body.is_object()) << "error body is not JSON for " << c.path;
    EXPECT_NE(r.body.value("error", "").find(c.needle), std::string::npos)
        << "expected '" << c.needle << "' in " << r.body.dump();
    ASSERT_TRUE(daemon_->Alive()) << daemon_->Log();
  }
  ExpectCasesMatchEager(port(), "mlp");  // still serving correctly
}

// Another process adds a model and a new version while the daemon serves.
// Both share artifacts already built, so they load from the cache at once.
TEST_F(ServeTest, ModelsAddedByAnotherProcessAreServedWithoutRestart) {
  std::string out;
  ASSERT_EQ(RunAotid({"--store", store_, "add", TestData("embed.pt2"), "--name", "embed-live"}, &out), 0)
      << out;
  ASSERT_EQ(RunAotid({"--store", store_, "add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  EXPECT_NE(out.find("added mlp:2"), std::string::npos) << out;
  ASSERT_TRUE(WaitReady(port(), "embed-live", 30)) << daemon_->Log();
  ExpectCasesMatchEager(port(), "embed-live", "embed");
  // Version 2 replaces version 1 (bounded wait: the store watch fires within a second).
  bool v2 = WaitFor([&] { return Get(port(), "/v2/models/mlp").body["versions"] == json::array({"2"}); }, 15);
  ASSERT_TRUE(v2) << daemon_->Log();
  ExpectCasesMatchEager(port(), "mlp");
  EXPECT_EQ(CountEvents(store_, "build_started"), 2);  // nothing new was compiled
}

// Requests run without pause on two keep-alive connections while another
// process replaces the served version with one of other weights, changes
// its settings (a reload), adds a version that fails to build, removes it,
// and moves the version policy. Every request must be answered 200 by some
// version, with exactly that version's eager outputs.
TEST_F(ServeTest, LiveChangesUnderLoadDropNoRequest) {
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  const json& old_case = cases["mlp"][1];   // versions 1 and 2: mlp.pt2
  const json& new_case = cases["mlp2"][1];  // version 3: mlp2.pt2, same inputs
  std::string body = json{{"inputs", old_case["inputs"]}}.dump();
  struct Seen {
    int status = 0;
    std::string version;
    json outputs;
    std::string raw;
  };
  std::mutex mu;
  std::vector<Seen> seen;
  std::atomic<bool> stop{false};
  std::atomic<int> latest_v3{0};
  auto client = [&] {
    httplib::Client c("127.0.0.1", port());
    c.set_keep_alive(true);
    c.set_read_timeout(30, 0);
    while (!stop.load()) {
      Seen s;
      if (auto r = c.Post("/v2/models/mlp/infer", body, "application/json")) {
        s.status = r->status;
        s.raw = r->body.substr(0, 300);
        json j = json::parse(r->body, nullptr, false);
        if (j.is_object()) {
          s.version = j.value("model_version", "");
          s.outputs = j.value("outputs", json());
        }
      }
      if (s.version == "3") latest_v3 = 1;
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(std::move(s));
    }
  };
  auto served_versions = [&] { return Get(port(), "/v2/models/mlp").body.value("versions", json()); };
  std::thread t1(client), t2(client);
  std::string out;

  // A new version with other weights: compiled while version 2 serves.
  ASSERT_EQ(RunAotid({"--store", store_, "add", TestData("mlp2.pt2"), "--name", "mlp"}, &out), 0) << out;
  ASSERT_NE(out.find("added mlp:3"), std::string::npos) << out;
  EXPECT_TRUE(WaitFor([&] { return latest_v3.load() == 1; }, 300)) << daemon_->Log();
  EXPECT_TRUE(WaitFor([&] { return served_versions() == json::array({"3"}); }, 10)) << served_versions();

  // New settings: version 3 is reloaded, and serves throughout.
  int loads = CountEvents(store_, "loaded");
  ASSERT_EQ(RunAotid({"--store", store_, "set", "mlp:3", "num_runners=2"}, &out), 0) << out;
  EXPECT_TRUE(WaitFor([&] { return CountEvents(store_, "loaded") > loads; }, 30)) << daemon_->Log();

  // A version whose build fails leaves version 3 serving.
  ASSERT_EQ(RunAotid({"--store", store_, "add", TestData("broken_program.pt2"), "--name", "mlp"}, &out), 0)
      << out;
  ASSERT_NE(out.find("added mlp:4"), std::string::npos) << out;
  EXPECT_TRUE(WaitFor(
      [&] { return Get(port(), "/v2/models/mlp/versions/4/ready").body.value("state", "") == "failed"; },
      120))
      << daemon_->Log();
  Reply failed = Get(port(), "/v2/models/mlp/versions/4/ready");
  EXPECT_EQ(failed.status, 503);
  EXPECT_NE(failed.body.value("error", "").find("failed"), std::string::npos) << failed.body.dump();
  ASSERT_EQ(RunAotid({"--store", store_, "show", "mlp:4", "--json"}, &out), 0) << out;
  json show = json::parse(out);
  ASSERT_EQ(show["versions"][0]["builds"].size(), 1u) << out;
  const json& build = show["versions"][0]["builds"][0];
  EXPECT_EQ(build["state"], "failed") << out;
  EXPECT_FALSE(build["error"].get<std::string>().empty()) << out;
  // Its own reason, without torch's warning about the blob's name.
  EXPECT_EQ(build["error"].get<std::string>().find("Unable to load package"), std::string::npos) << out;
  std::string whole_log = fs::ReadFile(build["log"].get<std::string>()).value_or("");
  EXPECT_NE(whole_log.find("cannot load exported program"), std::string::npos) << whole_log;
  EXPECT_EQ(whole_log.find("Unable to load package"), std::string::npos) << whole_log;
  EXPECT_NE(build["started_at"], "-") << out;  // the build's timings are kept
  EXPECT_NE(build["finished_at"], "-") << out;

  // Removing it: gone from the API within the watch's bound.
  ASSERT_EQ(RunAotid({"--store", store_, "rm", "mlp:4"}, &out), 0) << out;
  EXPECT_TRUE(WaitFor([&] { return Get(port(), "/v2/models/mlp/versions/4").status == 404; }, 5));

  // Policy "all": every version addressable, each with its own weights.
  ASSERT_EQ(RunAotid({"--store", store_, "set", "mlp", "version_policy=all"}, &out), 0) << out;
  EXPECT_TRUE(WaitFor(
      [&] {
        return served_versions() == json::array({"1", "2", "3"});
      },
      10))
      << served_versions();
  EXPECT_TRUE(WaitFor([&] { return Get(port(), "/v2/models/mlp/versions/1/ready").status == 200; }, 30));
  for (auto [v, want] : {std::pair{"1", &old_case}, std::pair{"3", &new_case}}) {
    Reply r = Post(port(), std::string("/v2/models/mlp/versions/") + v + "/infer", body);
    ASSERT_EQ(r.status, 200) << r.body.dump();
    EXPECT_EQ(r.body["model_version"], v);
    EXPECT_TRUE(OutputsMatch(r.body["outputs"], (*want)["outputs"])) << v << ": " << r.body.dump();
  }
  // Pinned to 2: the others are unloaded once it serves.
  ASSERT_EQ(RunAotid({"--store", store_, "set", "mlp", "version_policy=pinned:2"}, &out), 0) << out;
  EXPECT_TRUE(WaitFor([&] { return served_versions() == json::array({"2"}); }, 10)) << served_versions();
  ASSERT_EQ(RunAotid({"--store", store_, "set", "mlp", "version_policy=latest"}, &out), 0) << out;
  EXPECT_TRUE(WaitFor([&] { return served_versions() == json::array({"3"}); }, 30)) << served_versions();

  stop = true;
  t1.join();
  t2.join();
  int by_old = 0, by_new = 0;
  for (const auto& s : seen) {
    ASSERT_EQ(s.status, 200) << "a request failed during the changes: " << s.raw;
    bool is_new = s.version == "3";
    EXPECT_TRUE(s.version == "1" || s.version == "2" || is_new) << s.raw;
    EXPECT_TRUE(OutputsMatch(s.outputs, (is_new ? new_case : old_case)["outputs"]))
        << s.version << ": " << s.raw;
    (is_new ? by_new : by_old)++;
  }
  EXPECT_GT(by_old, 0);
  EXPECT_GT(by_new, 0);
  std::printf("[ info ] %zu requests during live changes: %d by versions 1-2, %d by version 3\n", seen.size(),
              by_old, by_new);

  // A removed model is unloaded.
  ASSERT_EQ(RunAotid({"--store", store_, "rm", "embed-live"}, &out), 0) << out;
  EXPECT_TRUE(WaitFor([&] { return Get(port(), "/v2/models/embed-live").status == 404; }, 5))
      << daemon_->Log();
  EXPECT_TRUE(daemon_->Alive());
}

// The repository extension: the index lists every version in the store
// with its state; unload and load change the store, so they last.
TEST_F(ServeTest, RepositoryIndexLoadAndUnload) {
  auto index = [&](const std::string& body = "") {
    Reply r = Post(port(), "/v2/repository/index", body);
    EXPECT_EQ(r.status, 200) << r.body.dump();
    std::map<std::string, json> by_ref;
    for (const auto& e : r.body)
      by_ref[e["name"].get<std::string>() + ":" + e["version"].get<std::string>()] = e;
    return by_ref;
  };
  auto all = index();
  ASSERT_EQ(all.size(), 4u) << json(all).dump();  // mlp:1-3, embed:1
  EXPECT_EQ(all["mlp:3"]["state"], "READY");
  EXPECT_EQ(all["embed:1"]["state"], "READY");
  EXPECT_EQ(all["mlp:1"]["state"], "UNAVAILABLE");
  EXPECT_EQ(all["mlp:1"]["reason"], "not served by version policy 'latest'");
  auto ready = index(R"({"ready": true})");
  EXPECT_EQ(ready.size(), 2u) << json(ready).dump();
  EXPECT_EQ(Post(port(), "/v2/repository/index", R"({"ready": "yes"})").status, 400);

  Reply unload = Post(port(), "/v2/repository/models/embed/unload", "");
  ASSERT_EQ(unload.status, 200) << unload.body.dump();
  EXPECT_EQ(unload.body["state"], "unloaded");
  Reply after = Get(port(), "/v2/models/embed");  // the reply came after the unload
  EXPECT_EQ(after.status, 503);                   // the store has it: unloaded, not unknown
  EXPECT_NE(after.body.value("error", "").find("is unloaded"), std::string::npos) << after.body.dump();
  EXPECT_EQ(index()["embed:1"]["reason"], "unloaded");
  std::string out;
  ASSERT_EQ(RunAotid({"--store", store_, "show", "embed", "--json"}, &out), 0) << out;
  EXPECT_EQ(json::parse(out)["enabled"], false);  // in the store: it outlasts a restart

  // The load answers once the model serves again (its build is cached).
  Reply load = Post(port(), "/v2/repository/models/embed/load", "");
  ASSERT_EQ(load.status, 200) << load.body.dump();
  EXPECT_EQ(load.body.value("state", ""), "ready") << load.body.dump();
  ExpectCasesMatchEager(port(), "embed");

  EXPECT_EQ(Post(port(), "/v2/repository/models/nope/load", "").status, 404);
  Reply bad = Post(port(), "/v2/repository/models/..x/unload", "");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.value("error", "").find("must start with a letter or digit"), std::string::npos);
}

// Runs last (gtest keeps declaration order): restarts the shared daemon.
TEST_F(ServeTest, RestartLoadsFromCacheAndCompilesNothing) {
  // An unload lasts across the restart.
  ASSERT_EQ(Post(port(), "/v2/repository/models/embed/unload", "").status, 200);
  int builds_before = CountEvents(store_, "build_started");
  EXPECT_EQ(CountEvents(store_, "loaded", "after build"), 3);  // mlp, embed, mlp2
  int cache_loads_before = CountEvents(store_, "loaded", "from cache");
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  delete daemon_;
  daemon_ = nullptr;

  auto d = DaemonProcess::Start({"--config", config_, "--store", store_, "--listen", "127.0.0.1:0"},
                                dir_->path() + "/daemon2.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  daemon_ = d->release();
  ASSERT_TRUE(WaitReady(port(), "mlp", 60)) << daemon_->Log();
  EXPECT_EQ(Get(port(), "/v2/health/ready").status, 200);
  EXPECT_EQ(Get(port(), "/v2/models/embed").status, 503);                          // still unloaded
  EXPECT_EQ(CountEvents(store_, "loaded", "from cache") - cache_loads_before, 1);  // mlp:3 only
  ASSERT_EQ(Post(port(), "/v2/repository/models/embed/load", "").status, 200);
  ASSERT_TRUE(WaitReady(port(), "embed", 60)) << daemon_->Log();
  EXPECT_EQ(CountEvents(store_, "build_started"), builds_before);
  EXPECT_EQ(CountEvents(store_, "loaded", "from cache") - cache_loads_before, 2);  // and embed:1
  EXPECT_EQ(daemon_->Log().find("build started"), std::string::npos) << daemon_->Log();
  EXPECT_EQ(Get(port(), "/v2/models/mlp").body["versions"], json::array({"3"}));
  ExpectCasesMatchEager(port(), "mlp", "mlp2");
  ExpectCasesMatchEager(port(), "embed");
}

// Runs after the restart: the daemon again, now with room for one queued
// request, and each batched run held 1 s (a pause point) so that requests
// queue. Requests past it get 503 with Retry-After at once; the queued one
// completes; the daemon then answers normally.
TEST_F(ServeTest, FullBatchQueueAnswers503WithRetryAfterAndRecovers) {
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  delete daemon_;
  daemon_ = nullptr;
  std::string config = dir_->path() + "/queue.toml";
  ASSERT_OK(fs::WriteFileAtomic(config, "[server]\nthreads = 8\nmax_queued_requests = 1\n"));
  std::string out;
  ASSERT_EQ(
      RunAotid({"--store", store_, "set", "mlp", "max_batch_size=64", "max_batch_delay_us=1000000"}, &out), 0)
      << out;
  RunOptions slow_runs;
  slow_runs.env = {"AOTID_TEST_PAUSE_AT=batch_run=1000"};
  auto d = DaemonProcess::Start({"--config", config, "--store", store_, "--listen", "127.0.0.1:0"},
                                dir_->path() + "/daemon3.log", slow_runs);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  daemon_ = d->release();
  ASSERT_TRUE(WaitReady(port(), "mlp", 60)) << daemon_->Log();

  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  const json& c = cases["mlp2"][0];  // mlp serves version 3 (mlp2.pt2)
  std::string body = json{{"inputs", c["inputs"]}}.dump();
  std::atomic<int> ok{0}, full{0};
  std::vector<std::string> other;
  std::mutex mu;
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&] {
      httplib::Client client("127.0.0.1", port());
      client.set_read_timeout(30, 0);
      auto r = client.Post("/v2/models/mlp/infer", body, "application/json");
      json j = r ? json::parse(r->body, nullptr, false) : json();
      if (r && r->status == 200 && OutputsMatch(j["outputs"], c["outputs"])) {
        ok++;
      } else if (r && r->status == 503 && r->get_header_value("Retry-After") == "1" &&
                 j.value("error", "").find("queue is full") != std::string::npos) {
        full++;
      } else {
        std::lock_guard<std::mutex> lock(mu);
        other.push_back(r ? std::to_string(r->status) + " " + r->body : "no response");
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_TRUE(other.empty()) << other.front();
  EXPECT_GE(ok, 1);
  EXPECT_GE(full, 1);
  EXPECT_EQ(ok + full, 6);
  Reply after = Post(port(), "/v2/models/mlp/infer", body);
  EXPECT_EQ(after.status, 200) << after.body.dump();
  EXPECT_TRUE(daemon_->Alive());

  // A client that hangs up while its request waits for a batch (behind a
  // run that takes 1 s): the request is dropped before it runs, counted as
  // 499.
  auto before = Scrape(port());
  std::thread ahead([&] { EXPECT_EQ(Post(port(), "/v2/models/mlp/infer", body).status, 200); });
  EXPECT_TRUE(WaitFor([&] { return Scrape(port())["aotid_inflight_requests"] >= 1; }, 5));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::string request =
      "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  // Hang up once it waits for its batch: a request whose client leaves
  // before a worker reads it is dropped unseen, which a busy machine (the
  // other tests run beside this one) makes likely after a fixed sleep.
  EXPECT_TRUE(WaitFor([&] { return Scrape(port())["aotid_inflight_requests"] >= 2; }, 5));
  ::close(fd);
  ahead.join();
  const std::string series = R"({model="mlp",version="3")";
  auto code = [&](const std::map<std::string, double>& m, const char* c) {
    auto it = m.find("aotid_inference_requests_total" + series + ",code=\"" + c + "\"}");
    return it == m.end() ? 0.0 : it->second;
  };
  EXPECT_TRUE(WaitFor([&] { return code(Scrape(port()), "499") - code(before, "499") == 1; }, 5));
  EXPECT_EQ(Post(port(), "/v2/models/mlp/infer", body).status, 200);
}

}  // namespace
}  // namespace aotid::testing
