// Residency's decisions (control/residency.h), with time, loads and memory
// faked: each case walks requests, loads and the clock step by step, in
// milliseconds. The end-to-end test (tests/e2e/residency_test.cc) runs the
// same policy with real runners.
#include "control/residency.h"

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <map>
#include <thread>

#include "base/fs.h"
#include "base/log.h"
#include "control/fakes.h"
#include "test_util.h"

namespace aotid::control {
namespace {

using testing::FakeLoop;

constexpr uint64_t kMb = uint64_t{1} << 20;

// A loaded model whose submitted runs wait until the test ends them.
class HeldModel final : public model::LoadedModel {
 public:
  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>&,
                                                 const model::RunContext&) override {
    ++runs;
    while (infer_waits) std::this_thread::yield();
    return std::vector<model::HostTensor>{};
  }
  Status Submit(std::vector<model::HostTensor>, model::RunContext, Done done,
                std::unique_ptr<model::Announcement>) override {
    ++runs;
    held.push_back(std::move(done));
    return Status::OK();
  }
  // Ends the oldest run still held.
  void FinishOne() {
    Done d = std::move(held.front());
    held.pop_front();
    d(std::vector<model::HostTensor>{});
  }
  int runs = 0;
  std::deque<Done> held;
  std::atomic<bool> infer_waits{false};  // while set, Infer calls wait

 private:
  model::ModelSpec spec_;
  std::string device_ = "cpu";
};

class FakeProbe final : public MemoryProbe {
 public:
  StatusOr<uint64_t> ProcessBytes(int pid) override {
    auto it = bytes.find(pid);
    if (it == bytes.end()) return NotFound("no process " + std::to_string(pid));
    return it->second;
  }
  platform::MemoryPressure Pressure() override { return pressure; }
  std::optional<uint64_t> OomKills() override { return oom_kills; }
  std::map<int, uint64_t> bytes;
  std::optional<uint64_t> oom_kills = 3;
  platform::MemoryPressure pressure{.known = true, .source = "test"};
};

class ResidencyTest : public ::testing::Test {
 protected:
  struct Version {
    std::shared_ptr<ResidentModel> model;
    std::shared_ptr<HeldModel> loaded;  // the runner of its last load
    int pid = 0;
    uint64_t bytes = 0;  // what its runner measures at
    int loads_started = 0;
    std::deque<std::function<void(StatusOr<LoadedRunner>)>> loading;
    std::vector<Footprint> learned;
    std::vector<std::pair<std::string, std::string>> events;
  };

  void SetUp() override { Make(); }
  // Requests still waiting are answered as the residency goes: before the
  // answers they land in.
  void TearDown() override { residency_.reset(); }

  void Make(uint64_t budget = 250 * kMb, int64_t keep_alive_ms = 300'000) {
    ResidencyOptions o;
    o.budget_bytes = budget;
    o.budget_source = "set by the test";
    o.keep_alive_ms = keep_alive_ms;
    o.load_wait_ms = 30'000;
    o.sample_ms = 1000;
    ResidencyHooks hooks;
    hooks.unloaded = [this](const std::string& name, int64_t, const std::string& cause) {
      unloads.push_back(name + " " + cause);
    };
    residency_ = std::make_unique<Residency>(&loop_, &probe_, o, hooks);
  }

  // Serves `name` (version 1), measuring `bytes` once loaded.
  Version& Serve(const std::string& name, uint64_t bytes, int keep_alive_s = -1, bool learned = true,
                 bool language_model = false, const std::string& build = "") {
    Version& v = versions_[name];
    v.bytes = bytes;
    v.pid = next_pid_++;
    ResidentVersion rv;
    rv.name = name;
    rv.version = 1;
    rv.keep_alive_s = keep_alive_s;
    rv.language_model = language_model;
    rv.files_bytes = bytes / 2;
    rv.build = build;
    if (learned) rv.learned = Footprint{bytes, bytes};
    rv.load = [this, name](std::function<void(StatusOr<LoadedRunner>)> done) {
      Version& me = versions_[name];
      ++me.loads_started;
      me.loading.push_back(std::move(done));
    };
    rv.learn = [this, name](const Footprint& f) { versions_[name].learned.push_back(f); };
    rv.record = [this, name](const std::string& kind, const std::string& message) {
      versions_[name].events.push_back({kind, message});
    };
    rv.model = v.model = residency_->NewModel(name, 1, model::ModelSpec{}, "cpu");
    residency_->Add(std::move(rv));
    return v;
  }

  // Finishes the oldest load of `name`: its runner is up.
  void FinishLoad(const std::string& name) {
    Version& v = versions_[name];
    ASSERT_FALSE(v.loading.empty()) << name << " is not loading";
    auto done = std::move(v.loading.front());
    v.loading.pop_front();
    v.loaded = std::make_shared<HeldModel>();
    probe_.bytes[v.pid] = v.bytes;
    const int pid = v.pid;
    done(LoadedRunner{v.loaded, [pid] { return pid; }});
    loop_.RunPosted();
  }
  void FailLoad(const std::string& name, const Status& why) {
    Version& v = versions_[name];
    ASSERT_FALSE(v.loading.empty());
    auto done = std::move(v.loading.front());
    v.loading.pop_front();
    done(why);
    loop_.RunPosted();
  }

  // Submits a request to `name`; its answer lands in `answers_[name]`.
  Status Request(const std::string& name) {
    Status s =
        versions_[name].model->Submit({}, {}, [this, name](StatusOr<std::vector<model::HostTensor>> out) {
          answers_[name].push_back(out.status());
        });
    loop_.RunPosted();
    return s;
  }
  void Finish(const std::string& name) {
    versions_[name].loaded->FinishOne();
    loop_.RunPosted();
  }
  bool Resident(const std::string& name) { return versions_[name].model->state().resident; }

  FakeLoop loop_;
  FakeProbe probe_;
  std::unique_ptr<Residency> residency_;
  std::map<std::string, Version> versions_;
  std::map<std::string, std::vector<Status>> answers_;
  std::vector<std::string> unloads;
  int next_pid_ = 100;
};

TEST_F(ResidencyTest, AVersionLoadsOnItsFirstRequestAndGoesAfterItsKeepAlive) {
  Serve("a", 100 * kMb);
  EXPECT_FALSE(Resident("a"));
  ASSERT_OK(Request("a"));
  ASSERT_OK(Request("a"));  // joins the same load
  EXPECT_EQ(versions_["a"].loads_started, 1);
  FinishLoad("a");
  ASSERT_TRUE(Resident("a"));
  EXPECT_EQ(versions_["a"].loaded->runs, 2);
  Finish("a");
  Finish("a");
  ASSERT_EQ(answers_["a"].size(), 2u);
  EXPECT_OK(answers_["a"][0]);
  loop_.Advance(299'000);
  EXPECT_TRUE(Resident("a"));
  // A request in between starts the wait again.
  ASSERT_OK(Request("a"));
  Finish("a");
  loop_.Advance(299'000);
  EXPECT_TRUE(Resident("a"));
  loop_.Advance(2'000);
  EXPECT_FALSE(Resident("a"));
  ASSERT_EQ(versions_["a"].events.size(), 1u);
  EXPECT_EQ(versions_["a"].events[0].first, "unloaded");
  EXPECT_EQ(versions_["a"].events[0].second, "idle for 5m (keep_alive)");
  // The next request loads it again.
  ASSERT_OK(Request("a"));
  EXPECT_EQ(versions_["a"].loads_started, 2);
}

TEST_F(ResidencyTest, KeepAliveZeroUnloadsAfterEachAnswerAndAlwaysNever) {
  Serve("zero", 50 * kMb, /*keep_alive_s=*/0);
  Serve("always", 50 * kMb, /*keep_alive_s=*/-2);
  ASSERT_OK(Request("zero"));
  ASSERT_OK(Request("always"));
  FinishLoad("zero");
  FinishLoad("always");
  Finish("zero");
  Finish("always");
  loop_.Advance(0);
  EXPECT_FALSE(Resident("zero"));
  loop_.Advance(24 * 3600 * 1000);
  EXPECT_TRUE(Resident("always"));
}

TEST_F(ResidencyTest, ALoadThatDoesNotFitUnloadsTheLeastRecentlyUsedIdleVersion) {
  Serve("a", 100 * kMb);
  Serve("b", 100 * kMb);
  Serve("c", 100 * kMb);
  for (const char* n : {"a", "b"}) {
    ASSERT_OK(Request(n));
    FinishLoad(n);
  }
  loop_.Advance(10);
  Finish("b");  // b is used first, a last: b is the least recent
  loop_.Advance(10);
  Finish("a");
  ASSERT_OK(Request("c"));
  EXPECT_FALSE(Resident("b"));
  EXPECT_TRUE(Resident("a"));
  EXPECT_EQ(versions_["c"].loads_started, 1);
  ASSERT_EQ(unloads, std::vector<std::string>{"b evicted"});
  EXPECT_EQ(versions_["b"].events.back().second, "unloaded to make room for c:1");
  FinishLoad("c");
  EXPECT_LE(residency_->Used(), 250 * kMb);
}

TEST_F(ResidencyTest, ABusyVersionIsNeverUnloadedItIsDrainedAndGoesWhenItsRequestsEnd) {
  Serve("a", 100 * kMb);
  Serve("b", 100 * kMb);
  Serve("c", 100 * kMb);
  ASSERT_OK(Request("a"));
  FinishLoad("a");
  loop_.Advance(10);
  ASSERT_OK(Request("b"));
  FinishLoad("b");
  Finish("b");  // b idle, a busy; a is the least recent
  ASSERT_OK(Request("c"));
  EXPECT_TRUE(Resident("a"));
  EXPECT_FALSE(Resident("b"));
  FinishLoad("c");
  // Now a and c are busy, and b wants to come back: a (the least recent)
  // is drained: its new requests wait, and it goes once its run ends.
  ASSERT_OK(Request("b"));
  EXPECT_EQ(versions_["b"].loads_started, 1);
  ASSERT_OK(Request("a"));
  EXPECT_EQ(versions_["a"].loaded->runs, 1) << "a draining version takes no new run";
  EXPECT_TRUE(Resident("a"));
  Finish("a");
  EXPECT_FALSE(Resident("a"));
  EXPECT_EQ(versions_["b"].loads_started, 2);
  FinishLoad("b");
  // a's waiting request asked for a load of its own, which waits for room
  // until c's request ends.
  EXPECT_EQ(residency_->Report()->versions[0].state, "waiting for memory");
  EXPECT_EQ(versions_["a"].loads_started, 1);
  Finish("c");
  EXPECT_EQ(versions_["a"].loads_started, 2);
  EXPECT_FALSE(Resident("c"));
  FinishLoad("a");
  Finish("a");
  ASSERT_EQ(answers_["a"].size(), 2u);
  for (const Status& s : answers_["a"]) EXPECT_OK(s);
  EXPECT_LE(residency_->Used(), 250 * kMb);
}

// A version loaded again with new settings is a new model under the same
// key: requests waiting for the old one, and any that found the old one
// just before the swap, are served by the new one, never refused.
TEST_F(ResidencyTest, AVersionLoadedAgainWithNewSettingsTakesOverTheOldModelsRequests) {
  Serve("a", 100 * kMb);
  ASSERT_OK(Request("a"));  // waits for the old model's load
  auto old_model = versions_["a"].model;
  auto old_load = std::move(versions_["a"].loading);
  versions_["a"].loading.clear();
  Serve("a", 100 * kMb);
  loop_.RunPosted();
  ASSERT_EQ(versions_["a"].loading.size(), 1u) << "the new model loads for the waiting request";
  FinishLoad("a");
  EXPECT_EQ(versions_["a"].loaded->runs, 1);
  Status late = old_model->Submit({}, {}, [this](StatusOr<std::vector<model::HostTensor>> out) {
    answers_["a"].push_back(out.status());
  });
  ASSERT_OK(late);
  EXPECT_EQ(versions_["a"].loaded->runs, 2);
  Finish("a");
  Finish("a");
  ASSERT_EQ(answers_["a"].size(), 2u);
  for (const Status& s : answers_["a"]) EXPECT_OK(s);
  // The old model's load, ending late, changes nothing.
  old_load.front()(LoadedRunner{std::make_shared<HeldModel>(), [] { return 1; }});
  loop_.RunPosted();
  EXPECT_EQ(residency_->Report()->versions.size(), 1u);
  EXPECT_EQ(residency_->Report()->versions[0].loads, 1u);
}

TEST_F(ResidencyTest, AFailedLoadAnswersEveryWaitingRequestWithItsReason) {
  Serve("a", 100 * kMb);
  ASSERT_OK(Request("a"));
  ASSERT_OK(Request("a"));
  FailLoad("a", Internal("the runner for a:1 did not start: boom"));
  ASSERT_EQ(answers_["a"].size(), 2u);
  for (const Status& s : answers_["a"]) EXPECT_EQ(s.message(), "the runner for a:1 did not start: boom");
  // A blocking caller (a generator's thread) gets it too.
  std::thread caller([&] {
    auto out = versions_["a"].model->Infer({}, {});
    EXPECT_EQ(out.status().message(), "second failure");
  });
  while (versions_["a"].loading.empty()) {
    loop_.RunPosted();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  FailLoad("a", Internal("second failure"));
  caller.join();
  EXPECT_EQ(residency_->Used(), 0u);
}

TEST_F(ResidencyTest, ALoadLargerThanTheBudgetLeavesIsRefusedAtOnceNamingWhatHoldsIt) {
  Serve("big", 200 * kMb, /*keep_alive_s=*/-2);
  Serve("c", 100 * kMb);
  ASSERT_OK(Request("big"));
  FinishLoad("big");
  ASSERT_OK(Request("c"));
  EXPECT_EQ(versions_["c"].loads_started, 0);
  ASSERT_EQ(answers_["c"].size(), 1u);
  const Status& s = answers_["c"][0];
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("budget of 250 MiB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("big:1 (200 MiB, keep_alive always)"), std::string::npos) << s.message();
  // So it is not ready: the report says it cannot fit, and why.
  auto report = residency_->Report();
  ASSERT_EQ(report->versions.size(), 2u);
  EXPECT_TRUE(report->versions[0].fits);  // big:1
  EXPECT_FALSE(report->versions[1].fits);
  EXPECT_NE(report->versions[1].why_not.find("c:1 needs about 100 MiB"), std::string::npos)
      << report->versions[1].why_not;
}

// A client that ignores Retry-After and asks thousands of times a second
// fills no disk: a version's refusals are logged once per 10 s.
TEST_F(ResidencyTest, RefusalsAreLoggedOncePerTenSecondsPerVersion) {
  Serve("big", 200 * kMb, /*keep_alive_s=*/-2);
  Serve("c", 100 * kMb);
  ASSERT_OK(Request("big"));
  FinishLoad("big");
  aotid::testing::TempDir dir;
  ASSERT_OK(log::SetFile(dir / "log", 1 << 20, 1));
  for (int i = 0; i < 50; ++i) ASSERT_OK(Request("c"));
  loop_.Advance(10'000);
  ASSERT_OK(Request("c"));
  log::ResetToStderr();
  EXPECT_EQ(answers_["c"].size(), 51u);
  std::string text = fs::ReadFile(dir / "log").value_or("");
  auto count = [&](const std::string& needle) {
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("c:1 needs about 100 MiB"), 2) << text;
  EXPECT_EQ(count("(and 49 refusals like it before, unlogged)"), 1) << text;
}

TEST_F(ResidencyTest, ALoadThatWaitsPastLoadWaitIsRefusedAndNothingWasUnloadedForIt) {
  // A language model's sequences hold it: it is never drained.
  Serve("llm", 200 * kMb, -1, true, /*language_model=*/true);
  Serve("c", 100 * kMb);
  auto hold = versions_["llm"].model->KeepResident();
  loop_.RunPosted();
  FinishLoad("llm");
  ASSERT_OK(Request("c"));
  loop_.Advance(29'000);
  EXPECT_TRUE(answers_["c"].empty());
  loop_.Advance(2'000);
  ASSERT_EQ(answers_["c"].size(), 1u);
  EXPECT_EQ(answers_["c"][0].code(), StatusCode::kResourceExhausted);
  EXPECT_NE(answers_["c"][0].message().find("waited 30s for memory"), std::string::npos)
      << answers_["c"][0].message();
  EXPECT_NE(answers_["c"][0].message().find("llm:1 (200 MiB, 1 request in flight)"), std::string::npos)
      << answers_["c"][0].message();
  EXPECT_TRUE(Resident("llm"));
  EXPECT_TRUE(unloads.empty());
}

TEST_F(ResidencyTest, SizesAreMeasuredAtLoadAndKeptWithTheBuild) {
  Serve("a", 120 * kMb, -1, /*learned=*/false);
  ASSERT_OK(Request("a"));
  FinishLoad("a");
  ASSERT_FALSE(versions_["a"].learned.empty());
  EXPECT_EQ(versions_["a"].learned.back().at_load, 120 * kMb);
  probe_.bytes[versions_["a"].pid] = 180 * kMb;  // it grew while running
  loop_.Advance(1000);
  EXPECT_EQ(versions_["a"].learned.back().peak, 180 * kMb);
  EXPECT_EQ(residency_->Used(), 180 * kMb);
}

TEST_F(ResidencyTest, MemoryPressureUnloadsIdleVersionsLeastRecentFirst) {
  Serve("a", 50 * kMb);
  Serve("b", 50 * kMb);
  for (const char* n : {"a", "b"}) {
    ASSERT_OK(Request(n));
    FinishLoad(n);
  }
  Finish("a");
  loop_.Advance(10);
  probe_.pressure.level = platform::PressureLevel::kWarning;
  loop_.Advance(1000);
  EXPECT_FALSE(Resident("a"));
  EXPECT_TRUE(Resident("b")) << "busy";
  EXPECT_EQ(unloads, std::vector<std::string>{"a pressure"});
  Finish("b");  // a run left held would hold its model for ever
}

TEST_F(ResidencyTest, ARunnerKilledForMemoryCountsForMoreAndGoesWhenIdle) {
  Serve("a", 100 * kMb);
  ASSERT_OK(Request("a"));
  FinishLoad("a");
  loop_.Advance(1000);  // a sample reads the OOM kill count
  // A kill -9 by a person: a crash like any other.
  residency_->RunnerCrashed("a", 1, "the runner for a:1 was killed by signal 9 (SIGKILL)");
  Finish("a");
  EXPECT_TRUE(Resident("a"));
  ASSERT_OK(Request("a"));
  // The OOM killer's: the kernel's count rose.
  probe_.oom_kills = 4;
  residency_->RunnerCrashed("a", 1, "the runner for a:1 was killed by signal 9 (SIGKILL)");
  EXPECT_TRUE(Resident("a")) << "its request is still in flight";
  Finish("a");
  EXPECT_FALSE(Resident("a"));
  EXPECT_EQ(unloads, std::vector<std::string>{"a memory_kill"});
  EXPECT_EQ(versions_["a"].events.back().second,
            "its runner was killed for memory; it counts for 125 MiB from now on and loads again only within "
            "the budget");
  ASSERT_FALSE(versions_["a"].learned.empty());
  EXPECT_EQ(versions_["a"].learned.back().peak, 125 * kMb);
  // A crash of another kind changes nothing.
  Serve("b", 100 * kMb);
  ASSERT_OK(Request("b"));
  FinishLoad("b");
  Finish("b");
  residency_->RunnerCrashed("b", 1, "the runner for b:1 was killed by signal 11 (SIGSEGV)");
  EXPECT_TRUE(Resident("b"));
  // An allocation that failed is memory's doing, whatever the kernel counted.
  residency_->RunnerCrashed("b", 1, "the runner for b:1 exited with status 1: std::bad_alloc");
  EXPECT_FALSE(Resident("b"));
}

// A request submitted while the version is retired gets an answer: it is
// never left in a queue emptied just before it joined. (A race: each round
// retires the version while requests are being submitted.)
TEST(ResidentModelTest, ARequestSubmittedAsTheVersionIsRetiredIsAnswered) {
  for (int round = 0; round < 200; ++round) {
    auto rm = std::make_shared<ResidentModel>(model::ModelSpec{}, "cpu", ResidentModel::Hooks{});
    std::atomic<int> answered{0};
    int accepted = 0;
    std::thread submitter([&] {
      while (rm->Submit({}, {}, [&](StatusOr<std::vector<model::HostTensor>>) { ++answered; }).ok())
        ++accepted;
    });
    while (rm->state().waiting < 20) std::this_thread::yield();
    rm->Retire(Unavailable("gone"));
    submitter.join();
    ASSERT_EQ(answered, accepted) << "round " << round << ": accepted, never answered";
    EXPECT_EQ(rm->state().in_flight, 0);
  }
}

// A blocking caller woken by its load is about to run on it: the model is
// not unloaded under it (it would wait for another load, again and again
// with keep_alive 0).
TEST(ResidentModelTest, ACallerWokenByItsLoadIsNotUnloadedUnderIt) {
  for (int round = 0; round < 20; ++round) {
    auto rm = std::make_shared<ResidentModel>(model::ModelSpec{}, "cpu", ResidentModel::Hooks{});
    auto held = std::make_shared<HeldModel>();
    held->infer_waits = true;
    StatusOr<std::vector<model::HostTensor>> out = Internal("not run");
    std::thread caller([&] { out = rm->Infer({}, {}); });
    while (rm->state().waiting == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    rm->Loaded(held);
    rm->SetDraining(true);  // even when drained before it woke
    if (rm->Unload()) {
      ADD_FAILURE() << "round " << round << ": unloaded under a caller about to run on it";
      rm->Loaded(held);
    }
    held->infer_waits = false;
    caller.join();
    EXPECT_OK(out.status());
    EXPECT_EQ(held->runs, 1);
    EXPECT_EQ(rm->state().in_flight, 0);
  }
}

// A runner not measured yet (its process not up to be read) counts for its
// version's estimate, not for nothing: a load is not admitted into room it
// holds.
TEST_F(ResidencyTest, AResidentVersionNotMeasuredYetCountsForItsEstimate) {
  Serve("a", 100 * kMb, -1, /*learned=*/false);  // 50 MB of files: about 200 MB
  Serve("b", 100 * kMb, -1, /*learned=*/false);  // the same
  ASSERT_OK(Request("a"));
  ASSERT_EQ(versions_["a"].loading.size(), 1u);
  auto done = std::move(versions_["a"].loading.front());
  versions_["a"].loading.pop_front();
  versions_["a"].loaded = std::make_shared<HeldModel>();
  done(LoadedRunner{versions_["a"].loaded, [] { return 0; }});
  loop_.RunPosted();
  ASSERT_TRUE(Resident("a"));
  EXPECT_EQ(residency_->Used(), 200 * kMb);
  ASSERT_OK(Request("b"));  // 200 MB more do not fit 250 MB beside a's request
  EXPECT_EQ(versions_["b"].loads_started, 0);
}

// A version never measured is estimated from its files plus what runners
// took here beyond theirs, as the sizes kept with builds say: after a
// restart as before it, not the 150 MiB guess made before any measurement.
TEST_F(ResidencyTest, AnUnmeasuredVersionIsEstimatedFromWhatOthersMeasuredBeyondTheirFiles) {
  Serve("a", 100 * kMb);                         // kept: 100 MiB, 50 of them its files
  Serve("b", 120 * kMb, -1, /*learned=*/false);  // 60 MB of files
  auto report = residency_->Report();
  ASSERT_EQ(report->versions.size(), 2u);
  EXPECT_FALSE(report->versions[1].size_measured);
  EXPECT_EQ(report->versions[1].size_bytes, 110 * kMb);
}

// What one version measured is what another version of the same build and
// settings counts for, before its own first load.
TEST_F(ResidencyTest, AVersionCountsForWhatAnotherVersionOfItsBuildMeasured) {
  Serve("a", 120 * kMb, -1, /*learned=*/false, false, /*build=*/"build-1 cpu");
  Serve("b", 120 * kMb, -1, /*learned=*/false, false, /*build=*/"build-1 cpu");
  Serve("c", 120 * kMb, -1, /*learned=*/false, false, /*build=*/"build-2 cpu");
  ASSERT_OK(Request("a"));
  FinishLoad("a");
  auto report = residency_->Report();
  ASSERT_EQ(report->versions.size(), 3u);
  const serving::ResidentVersionReport& b = report->versions[1];
  ASSERT_EQ(b.name, "b");
  EXPECT_TRUE(b.size_measured);
  EXPECT_EQ(b.size_bytes, 120 * kMb);
  EXPECT_FALSE(report->versions[2].size_measured);
}

// Stopping answers the requests whose loads wait for memory: no load
// starts any more to answer them.
TEST_F(ResidencyTest, StoppingAnswersTheRequestsWaitingForMemory) {
  Serve("a", 200 * kMb);
  Serve("b", 100 * kMb);
  ASSERT_OK(Request("a"));
  FinishLoad("a");
  ASSERT_OK(Request("b"));  // waits for a's request to end
  ASSERT_TRUE(answers_["b"].empty());
  residency_->Stop();
  ASSERT_EQ(answers_["b"].size(), 1u);
  EXPECT_EQ(answers_["b"][0].code(), StatusCode::kUnavailable);
  EXPECT_FALSE(versions_["a"].model->state().draining);
  Finish("a");  // a run left held would hold its model for ever
}

// A drain ends with the load it made room for: when that load is refused,
// the drained version stays once its requests end, as nothing needs its room.
TEST_F(ResidencyTest, AVersionDrainedForALoadThatWasRefusedStaysResident) {
  Serve("a", 200 * kMb);
  Serve("c", 100 * kMb);
  ASSERT_OK(Request("a"));
  FinishLoad("a");
  ASSERT_OK(Request("c"));  // a is drained to make room for c
  ASSERT_TRUE(versions_["a"].model->state().draining);
  loop_.Advance(31'000);  // c waited past load_wait
  ASSERT_EQ(answers_["c"].size(), 1u);
  EXPECT_EQ(answers_["c"][0].code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(versions_["a"].model->state().draining);
  Finish("a");
  EXPECT_TRUE(Resident("a"));
  EXPECT_TRUE(unloads.empty());
  EXPECT_EQ(residency_->Report()->versions[0].state, "resident");
}

// A language model's sequence holds its runner, where its cache is: the
// version loaded again with new settings takes new calls, while the
// sequence's own go on to the runner it started on until it ends.
TEST(ResidentModelTest, ASequenceHoldsItsRunnerThroughAReplacement) {
  auto old_model = std::make_shared<ResidentModel>(model::ModelSpec{}, "cpu", ResidentModel::Hooks{});
  auto old_runner = std::make_shared<HeldModel>();
  old_model->Loaded(old_runner);
  std::shared_ptr<void> keep = old_model->KeepResident();
  const int64_t epoch = old_model->state_epoch();
  auto next = std::make_shared<ResidentModel>(model::ModelSpec{}, "cpu", ResidentModel::Hooks{});
  auto new_runner = std::make_shared<HeldModel>();
  next->Loaded(new_runner);
  old_model->Replace(next);
  ASSERT_OK(old_model->Infer({}, {}).status());  // the sequence's next token
  EXPECT_EQ(old_runner->runs, 1);
  EXPECT_EQ(new_runner->runs, 0);
  EXPECT_EQ(old_model->state_epoch(), epoch);
  keep.reset();  // the sequence ended
  EXPECT_EQ(old_model->loaded(), nullptr);
  ASSERT_OK(old_model->Infer({}, {}).status());
  EXPECT_EQ(new_runner->runs, 1);
  EXPECT_EQ(old_model->state().in_flight, 0);
}

// A version removed or disabled while a sequence streams on it: the stream
// ends as it would have, on its runner; new requests are refused.
TEST(ResidentModelTest, ASequenceFinishesOnTheRunnerOfAVersionRetiredUnderIt) {
  auto m = std::make_shared<ResidentModel>(model::ModelSpec{}, "cpu", ResidentModel::Hooks{});
  auto runner = std::make_shared<HeldModel>();
  m->Loaded(runner);
  std::shared_ptr<void> keep = m->KeepResident();
  m->Retire(Unavailable("lm:1 was removed from the store"));
  ASSERT_OK(m->Infer({}, {}).status());  // the sequence's next token
  EXPECT_EQ(runner->runs, 1);
  EXPECT_EQ(m->KeepResident(), nullptr) << "no new sequence starts";
  EXPECT_EQ(m->Submit({}, {}, [](StatusOr<std::vector<model::HostTensor>>) {}).message(),
            "lm:1 was removed from the store");
  keep.reset();  // the sequence ended: the runner goes
  EXPECT_EQ(m->loaded(), nullptr);
  EXPECT_EQ(m->Infer({}, {}).status().message(), "lm:1 was removed from the store");
  EXPECT_EQ(m->state().in_flight, 0);
}

// A drain ends when the load it made room for starts in room found
// elsewhere: the drained version takes requests again and stays.
TEST_F(ResidencyTest, AVersionDrainedForALoadThatStartedElsewhereStaysResident) {
  Serve("a", 100 * kMb);
  Serve("b", 100 * kMb);
  Serve("c", 100 * kMb);
  ASSERT_OK(Request("a"));
  FinishLoad("a");
  loop_.Advance(10);
  ASSERT_OK(Request("b"));
  FinishLoad("b");
  ASSERT_OK(Request("c"));  // both busy: a, the least recent, is drained
  ASSERT_TRUE(versions_["a"].model->state().draining);
  Finish("b");  // b is idle: it goes instead, and c loads
  EXPECT_FALSE(Resident("b"));
  EXPECT_EQ(versions_["c"].loads_started, 1);
  EXPECT_FALSE(versions_["a"].model->state().draining);
  Finish("a");
  EXPECT_TRUE(Resident("a"));
  EXPECT_EQ(unloads, std::vector<std::string>{"b evicted"});
  FinishLoad("c");  // c's request, waiting for its load, runs and ends
  Finish("c");
}

// A version killed for memory goes once idle, even where it was drained
// meanwhile for a load that was then refused.
TEST_F(ResidencyTest, AVersionKilledForMemoryGoesEvenWhenADrainForItEnds) {
  Serve("a", 200 * kMb);
  Serve("c", 100 * kMb);
  ASSERT_OK(Request("a"));
  FinishLoad("a");
  residency_->RunnerCrashed("a", 1, "the runner for a:1 exited with status 1: std::bad_alloc");
  ASSERT_TRUE(Resident("a")) << "its request is in flight";
  ASSERT_OK(Request("c"));  // drains a
  loop_.Advance(31'000);    // c waited past load_wait
  ASSERT_EQ(answers_["c"].size(), 1u);
  Finish("a");
  EXPECT_FALSE(Resident("a"));
  EXPECT_EQ(unloads, std::vector<std::string>{"a memory_kill"});
}

}  // namespace
}  // namespace aotid::control
