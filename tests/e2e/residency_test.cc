// End to end: residency (issue 35). Three real models served by the real
// daemon under a memory budget that fits two of them; several clients
// cycle across all three at once. Every answer must equal eager PyTorch's,
// the runners' memory (their PSS, sampled from /proc throughout) must never
// pass the budget, versions must have been loaded and evicted on demand,
// and every version must be unloaded once idle past its keep_alive.
#include <dirent.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

// Three small models of similar runners. mlp comes compiled already (an
// AOTInductor package), so that only two compiles run, side by side.
const char* const kModels[] = {"mlp", "conv", "block"};
const char* const kFiles[] = {"mlp_so.pt2", "conv.pt2", "block.pt2"};

std::string Config(const std::string& keep_alive, uint64_t budget_mb) {
  return "[server]\nthreads = 8\n[build]\njobs = 2\n[residency]\nkeep_alive = \"" + keep_alive +
         "\"\nmemory_budget_mb = " + std::to_string(budget_mb) +
         "\nload_wait_s = 300\nunload_on_pressure = false\n";
}

// The daemon's runner processes: its children that run `aotid internal-runner`.
// /proc files are read with fs::ReadFile: a process that ends mid-read
// fails the read with ESRCH, which std::filebuf throws past istream's guard.
std::vector<pid_t> Runners(pid_t daemon) {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* d = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(d->d_name));
    if (pid <= 0) continue;
    const std::string dir = "/proc/" + std::to_string(pid);
    StatusOr<std::string> status = fs::ReadFile(dir + "/status");
    if (!status.ok()) continue;
    const size_t at = status->find("\nPPid:");
    if (at == std::string::npos || std::atoi(status->c_str() + at + 6) != daemon) continue;
    StatusOr<std::string> args = fs::ReadFile(dir + "/cmdline");
    if (args.ok() && args->find(std::string("internal-runner") + '\0') != std::string::npos)
      out.push_back(pid);
  }
  ::closedir(proc);
  return out;
}

// A process's proportional share of memory (Pss + SwapPss), in bytes; 0
// when it is gone.
uint64_t PssBytes(pid_t pid) {
  StatusOr<std::string> rollup = fs::ReadFile("/proc/" + std::to_string(pid) + "/smaps_rollup");
  if (!rollup.ok()) return 0;
  std::istringstream lines(*rollup);
  std::string line;
  uint64_t kb = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("Pss:", 0) == 0 || line.rfind("SwapPss:", 0) == 0) {
      std::istringstream in(line.substr(line.find(':') + 1));
      uint64_t n = 0;
      in >> n;
      kb += n;
    }
  }
  return kb << 10;
}

// The sum over /metrics lines of `family` whose labels contain `labels`.
double MetricSum(int port, const std::string& family, const std::string& labels = "") {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/metrics");
  if (!r) return -1;
  double sum = 0;
  std::istringstream in(r->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(family + "{", 0) != 0 || line.find(labels) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// GET /v2/resident's entry for `model`.
json ResidentEntry(const json& report, const std::string& model) {
  for (const auto& m : report["models"])
    if (m.value("name", "") == model) return m;
  return json();
}

class ResidencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = dir_.path() + "/store";
    config_ = dir_.path() + "/aotid.toml";
    // First no budget (0 is a share of this machine's memory, far more
    // than three small runners) and a long keep_alive. One thread a
    // runner: with threads auto a load may choose another count than the
    // last (timed again when the machine is busy), and a runner's memory
    // with it, past what was measured.
    ASSERT_OK(fs::WriteFileAtomic(config_, Config("10m", 0)));
    for (size_t i = 0; i < std::size(kModels); ++i) {
      std::string out;
      ASSERT_EQ(RunAotid({"--config", config_, "--store", store_, "add", TestData(kFiles[i]), "--name",
                          kModels[i], "--threads", "1"},
                         &out),
                0)
          << out;
    }
    cases_ = json::parse(fs::ReadFile(TestData("cases.json")).value());
    auto d = DaemonProcess::Start({"--config", config_, "--store", store_, "--listen", "127.0.0.1:0"},
                                  dir_.path() + "/daemon.log");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
    for (const char* m : kModels) ASSERT_TRUE(WaitReady(port(), m)) << daemon_->Log();
  }

  int port() const { return daemon_->port(); }
  json Resident() const { return Get(port(), "/v2/resident").body; }
  bool NoneResident() const {
    json r = Resident();
    if (!r.contains("models") || r["models"].size() != std::size(kModels)) return false;
    for (const auto& m : r["models"])
      if (m.value("state", "") != "not resident") return false;
    return true;
  }
  // Case `k` of `model`: 200 and eager's outputs, or why not.
  std::string Check(const std::string& model, size_t k) const {
    const json& c = cases_[model][k % cases_[model].size()];
    Reply r = Post(port(), "/v2/models/" + model + "/infer", json{{"inputs", c["inputs"]}}.dump());
    if (r.status != 200) return model + ": HTTP " + std::to_string(r.status) + " " + r.body.dump();
    if (!OutputsMatch(r.body["outputs"], c["outputs"])) return model + ": not eager's outputs";
    return "";
  }
  void Reload(const std::string& config) {
    ASSERT_OK(fs::WriteFileAtomic(config_, config));
    ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  }

  TempDir dir_;
  std::string store_, config_;
  std::unique_ptr<DaemonProcess> daemon_;
  json cases_;
};

TEST_F(ResidencyTest, ThreeModelsInABudgetOfTwoAnswerLikeEagerWithinIt) {
  // Each version answers and stays: `aotid ps` shows it.
  for (const char* m : kModels) EXPECT_EQ(Check(m, 0), "");
  std::string ps;
  ASSERT_EQ(RunAotid({"--config", config_, "--store", store_, "ps"}, &ps), 0) << ps;
  std::string ps_json;
  ASSERT_EQ(RunAotid({"--config", config_, "--store", store_, "ps", "--json"}, &ps_json), 0) << ps_json;
  json listed = json::parse(ps_json, nullptr, false);
  ASSERT_TRUE(listed.is_object() && listed["models"].is_array()) << ps_json;
  for (const char* m : kModels) {
    EXPECT_EQ(ResidentEntry(listed, m).value("state", ""), "resident") << ps_json;
    EXPECT_NE(ps.find(std::string(m) + ":1 "), std::string::npos) << ps;
  }
  EXPECT_EQ(Runners(daemon_->pid()).size(), std::size(kModels));

  // keep_alive 0 (live, on SIGHUP): every version goes at once. Then each
  // version alone, as the clients below will use it (four at a time, every
  // case, so batches join): its runner is measured alone (runners share
  // pages, which PSS splits between them), at its largest batches, and at
  // each unload after an answer.
  Reload(Config("0", 0));
  ASSERT_TRUE(WaitFor([&] { return NoneResident(); }, 60)) << Resident().dump();
  for (const char* m : kModels) {
    std::vector<std::thread> users;
    std::vector<std::string> why(4);
    for (size_t c = 0; c < why.size(); ++c)
      users.emplace_back([&, c] {
        for (size_t k = 0; k < 2 * cases_[m].size() && why[c].empty(); ++k) why[c] = Check(m, c + k);
      });
    for (auto& u : users) u.join();
    for (const auto& w : why) EXPECT_EQ(w, "");
    ASSERT_TRUE(WaitFor([&] { return NoneResident(); }, 60)) << Resident().dump();
  }
  std::vector<uint64_t> sizes;
  json report = Resident();
  for (const char* m : kModels) {
    json e = ResidentEntry(report, m);
    ASSERT_TRUE(e.value("size_measured", false)) << e.dump();
    sizes.push_back(e.value("size_bytes", uint64_t{0}));
  }
  std::sort(sizes.rbegin(), sizes.rend());
  // Room for the two largest together, never for all three, and for the
  // runners' PSS to grow past what was measured: they share libtorch's
  // pages with every process on the machine that maps it, and PSS splits
  // those among them all.
  const uint64_t budget_mb = (sizes[0] + sizes[1] + sizes[2] / 4 * 3) >> 20;
  const uint64_t budget = budget_mb << 20;
  ASSERT_GE(budget, sizes[0] + sizes[1]);
  ASSERT_LT(budget, sizes[0] + sizes[1] + sizes[2]);

  Reload(Config("3s", budget_mb));
  ASSERT_TRUE(WaitFor([&] { return Resident().value("budget_bytes", uint64_t{0}) == budget; }, 30))
      << Resident().dump();
  EXPECT_EQ(Resident()["budget_source"], "residency.memory_budget_mb");

  const double loads = MetricSum(port(), "aotid_model_loads_total");
  const double idle = MetricSum(port(), "aotid_model_unloads_total", "cause=\"idle\"");
  // Meanwhile, the runners' memory together, every 20 ms.
  std::atomic<bool> stop{false};
  uint64_t most = 0;
  size_t most_runners = 0, samples = 0;
  std::thread sampler([&] {
    while (!stop.load()) {
      uint64_t sum = 0;
      std::vector<pid_t> runners = Runners(daemon_->pid());
      for (pid_t pid : runners) sum += PssBytes(pid);
      most = std::max(most, sum);
      most_runners = std::max(most_runners, runners.size());
      ++samples;
      ::usleep(20'000);
    }
  });
  // Four clients, each cycling across the three models from its own start.
  constexpr int kClients = 4, kRounds = 3;
  std::mutex mu;
  std::vector<std::string> failures;
  int answered = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int k = 0; k < kRounds * 3; ++k) {
        std::string why = Check(kModels[(c + k) % 3], static_cast<size_t>(c + k));
        std::lock_guard<std::mutex> lock(mu);
        ++answered;
        if (!why.empty()) failures.push_back(why);
      }
    });
  }
  for (auto& c : clients) c.join();

  // Every version goes once idle past its keep_alive, and its runner with it.
  EXPECT_TRUE(WaitFor([&] { return NoneResident(); }, 60)) << Resident().dump();
  EXPECT_TRUE(WaitFor([&] { return Runners(daemon_->pid()).empty(); }, 30));
  stop = true;
  sampler.join();

  std::cout << "sizes " << (sizes[0] >> 20) << ", " << (sizes[1] >> 20) << ", " << (sizes[2] >> 20)
            << " MiB; budget " << budget_mb << " MiB; the runners' PSS at most " << (most >> 20) << " MiB ("
            << samples << " samples, up to " << most_runners << " runners); "
            << MetricSum(port(), "aotid_model_loads_total") - loads << " loads, "
            << MetricSum(port(), "aotid_model_unloads_total", "cause=\"evicted\"") << " evictions\n";
  EXPECT_EQ(answered, kClients * kRounds * 3);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, the first: " << failures.front();
  EXPECT_GT(samples, 10u);
  EXPECT_GE(most_runners, 2u) << "the runners never overlapped: the test proves nothing";
  EXPECT_LE(most, budget) << "the runners' PSS reached " << (most >> 20) << " MiB, past the budget of "
                          << budget_mb << " MiB\n"
                          << daemon_->Log();
  // Loads and evictions happened: three versions did not all stay.
  EXPECT_GE(MetricSum(port(), "aotid_model_loads_total") - loads, 3);
  EXPECT_GT(MetricSum(port(), "aotid_model_unloads_total", "cause=\"evicted\""), 0);
  EXPECT_GT(MetricSum(port(), "aotid_model_unloads_total", "cause=\"idle\"") - idle, 0);
  // The store's log says why each went.
  EXPECT_GT(CountEvents(store_, "unloaded", "unloaded to make room for "), 0);
  EXPECT_GT(CountEvents(store_, "unloaded", "idle for 3s (keep_alive)"), 0);
}

}  // namespace
}  // namespace aotid::testing
