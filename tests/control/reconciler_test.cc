// The reconciler's decisions, with builds, loads and time faked
// (tests/control/fakes.h) and a real store and build cache in a temporary
// directory. Each case is one that the end-to-end tests cover with real
// compiles; here each takes milliseconds.
#include "control/reconciler.h"

#include <algorithm>
#include <future>

#include "control/fakes.h"
#include "control/model_commands.h"
#include "serving/batcher.h"
#include "storage/model_store.h"
#include "test_util.h"

namespace aotid::control {
namespace {

using serving::ServeState;
using testing::FakeBuilds;
using testing::FakeLoader;
using testing::FakeLoop;
using testing::InertModel;

// The build folder of a served fake model, behind the queue every served
// model has in front of it.
std::string InertDir(const std::shared_ptr<model::LoadedModel>& served) {
  auto* queue = dynamic_cast<const serving::BatchingModel*>(served.get());
  return std::static_pointer_cast<InertModel>(queue ? queue->inner() : served)->dir();
}

constexpr int kRetryMs = 10'000;

model::ModelSpec MlpSpec() {
  model::ModelSpec s;
  s.inputs.push_back({"x", model::DType::kFloat32, {-1, 8}});
  s.outputs.push_back({"y", model::DType::kFloat32, {-1, 4}});
  return s;
}

class ReconcilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = storage::ModelStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    cache_ = std::make_unique<compile::BuildCache>(store_->CacheDir());
    builds_ = std::make_unique<FakeBuilds>(cache_.get());
    Start();
  }

  // A reconciler as the daemon makes one at start (also after a restart:
  // the store and cache stay, builds and loads in flight are forgotten).
  void Start() {
    reconciler_.reset();
    std::string cuda_missing = cuda_missing_;
    registry_ = std::make_unique<serving::ModelRegistry>();
    loader_ = std::make_unique<FakeLoader>();
    ReconcilerOptions opts;
    opts.fingerprint = "linux-x86_64-avx2-torchtest-00000000";
    opts.hardware.cores = 2;
    opts.hardware.mps_missing = "not on this machine";
    opts.hardware.cuda_missing = cuda_missing;
    opts.retry_initial_ms = kRetryMs;
    opts.max_attempts = 3;
    opts.only_model = only_model_;
    ReconcilerParts parts;
    parts.loop = &loop_;
    parts.store = store_.get();
    parts.cache = cache_.get();
    parts.builds = builds_.get();
    parts.loader = loader_.get();
    parts.registry = registry_.get();
    if (residency_options_) {
      residency_ = std::make_unique<Residency>(&loop_, &probe_, *residency_options_);
      parts.residency = residency_.get();
    }
    reconciler_ = std::make_unique<Reconciler>(parts, opts);
  }
  // From the next Start() on, versions come and go within `budget`.
  void ManageResidency(uint64_t budget, int64_t keep_alive_ms = 300'000) {
    ResidencyOptions o;
    o.budget_bytes = budget;
    o.budget_source = "the test's";
    o.keep_alive_ms = keep_alive_ms;
    residency_options_ = o;
  }

  int64_t Add(const std::string& name, std::vector<std::pair<std::string, std::string>> settings = {},
              const std::string& file = "mlp.pt2") {
    storage::AddRequest req;
    req.file = aotid::testing::TestData(file);
    req.name = name;
    auto added = store_->Add(req);
    EXPECT_TRUE(added.ok()) << added.status().ToString();
    if (!settings.empty()) EXPECT_TRUE(store_->Set(name, added->version, settings).ok());
    return added.ok() ? added->version : 0;
  }
  void Set(const std::string& name, std::optional<int64_t> v,
           std::vector<std::pair<std::string, std::string>> kv) {
    auto changed = store_->Set(name, v, kv);
    ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  }
  void Reconcile() { ASSERT_OK(reconciler_->Reconcile()); }

  // The state a served version is in; "absent" when it is not served.
  std::string State(const std::string& name, int64_t v) const {
    auto m = registry_->Find(name, v);
    return m ? std::string(serving::ServeStateName(m->state)) : "absent";
  }
  std::shared_ptr<const serving::ServedModel> Served(const std::string& name, int64_t v) const {
    return registry_->Find(name, v);
  }
  std::vector<std::string> Events(const std::string& name, int64_t v) {
    auto events = store_->ListEvents(0, 1000, name);
    std::vector<std::string> kinds;
    if (events.ok()) {
      for (const auto& e : *events) {
        if (e.version == v) kinds.push_back(e.kind);
      }
    }
    return kinds;
  }
  bool HasEvent(const std::string& name, int64_t v, const std::string& kind) {
    auto k = Events(name, v);
    return std::find(k.begin(), k.end(), kind) != k.end();
  }
  std::optional<storage::BuildRecord> BuildRow(const compile::BuildKey& key) {
    auto rows = store_->ListBuilds(key.artifact);
    if (!rows.ok()) return std::nullopt;
    for (const auto& r : *rows) {
      if (r.device == key.device && r.options == key.options) return r;
    }
    return std::nullopt;
  }
  // Builds and loads the only pending build, as a daemon would.
  void BuildAndLoad() {
    ASSERT_EQ(builds_->live(), 1u);
    builds_->Succeed(MlpSpec());
    ASSERT_EQ(loader_->pending(), 1u);
    loader_->Succeed();
  }

  aotid::testing::TempDir dir_;
  std::unique_ptr<storage::ModelStore> store_;
  std::unique_ptr<compile::BuildCache> cache_;
  std::string cuda_missing_ = "no NVIDIA driver";
  std::string only_model_;  // ReconcilerOptions::only_model from the next Start()
  FakeLoop loop_;
  std::unique_ptr<FakeBuilds> builds_;
  std::unique_ptr<FakeLoader> loader_;
  std::unique_ptr<serving::ModelRegistry> registry_;
  std::optional<ResidencyOptions> residency_options_;
  struct Probe final : MemoryProbe {
    StatusOr<uint64_t> ProcessBytes(int) override { return uint64_t{40} << 20; }
    platform::MemoryPressure Pressure() override { return {}; }
    std::optional<uint64_t> OomKills() override { return std::nullopt; }
  } probe_;
  std::unique_ptr<Residency> residency_;
  std::unique_ptr<Reconciler> reconciler_;
};

TEST_F(ReconcilerTest, NewVersionIsBuiltLoadedAndServedWithEachStepRecorded) {
  int64_t v = Add("mlp");
  Reconcile();
  EXPECT_EQ(State("mlp", v), "queued");
  ASSERT_EQ(builds_->submitted.size(), 1u);
  EXPECT_EQ(builds_->submitted[0].device, "cpu");  // auto on a machine without accelerators
  builds_->StartNext();
  EXPECT_EQ(State("mlp", v), "building");
  auto row = BuildRow(builds_->submitted[0]);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->state, storage::BuildState::kBuilding);

  builds_->Succeed(MlpSpec());
  EXPECT_EQ(State("mlp", v), "loading");
  EXPECT_EQ(BuildRow(builds_->submitted[0])->state, storage::BuildState::kReady);
  ASSERT_EQ(loader_->requests.size(), 1u);
  EXPECT_EQ(loader_->requests[0].options.device, "cpu");
  EXPECT_EQ(loader_->requests[0].options.threads, 2);          // cores / 1 runner
  EXPECT_EQ(loader_->requests[0].choose_threads_at_batch, 1);  // threads = 0: auto, timed at batch 1
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v), "ready");
  EXPECT_TRUE(registry_->startup_done());
  EXPECT_EQ(Events("mlp", v),
            (std::vector<std::string>{"added", "build_queued", "build_started", "build_ready", "loaded"}));

  Reconcile();  // idempotent: nothing more happens
  EXPECT_EQ(builds_->submitted.size(), 1u);
  EXPECT_EQ(loader_->requests.size(), 1u);
}

// A served version carries the kind of its weights, as its package lists
// them (the metadata route shows it); before it is loaded it has none.
TEST_F(ReconcilerTest, AServedVersionSaysTheKindOfItsWeights) {
  int64_t v = Add("int8", {}, "tiny_llm_int8.pt2");
  Reconcile();
  builds_->StartNext();
  EXPECT_EQ(Served("int8", v)->weights, "");
  builds_->Succeed(MlpSpec());
  loader_->Succeed();
  ASSERT_EQ(State("int8", v), "ready");
  EXPECT_EQ(Served("int8", v)->weights, "int8");
}

TEST_F(ReconcilerTest, RestartLoadsFromTheCacheWithoutBuilding) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  Start();  // the daemon restarts
  Reconcile();
  EXPECT_EQ(State("mlp", v), "loading");
  EXPECT_EQ(builds_->submitted.size(), 1u);  // the first build only
  EXPECT_FALSE(registry_->startup_done());   // not ready before its models are
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v), "ready");
  EXPECT_TRUE(registry_->startup_done());
  EXPECT_TRUE(HasEvent("mlp", v, "load_started"));
}

// Single-model mode: the store's other models are neither built, loaded
// nor listed, whenever they came.
TEST_F(ReconcilerTest, OnlyTheOneModelIsServedWhenOneIsNamed) {
  only_model_ = "demo";
  Start();
  int64_t other = Add("other", {}, "mlp2.pt2");
  int64_t demo = Add("demo");
  Reconcile();
  ASSERT_EQ(builds_->submitted.size(), 1u);
  EXPECT_EQ(builds_->submitted[0].artifact, store_->GetModel("demo")->versions[0].artifact);
  BuildAndLoad();
  EXPECT_EQ(State("demo", demo), "ready");
  EXPECT_EQ(State("other", other), "absent");
  EXPECT_TRUE(registry_->startup_done());
  Add("later", {}, "mlp2.pt2");
  Reconcile();
  EXPECT_EQ(builds_->submitted.size(), 1u);
  EXPECT_EQ(loader_->requests.size(), 1u);
  auto catalog = registry_->GetCatalog();
  ASSERT_EQ(catalog->size(), 1u);
  EXPECT_EQ((*catalog)[0].name, "demo");
}

TEST_F(ReconcilerTest, VersionsSharingAnArtifactShareOneBuild) {
  int64_t a = Add("mlp");
  int64_t b = Add("other");
  Reconcile();
  ASSERT_EQ(builds_->submitted.size(), 1u);
  builds_->Succeed(MlpSpec());
  loader_->SucceedAll();
  EXPECT_EQ(State("mlp", a), "ready");
  EXPECT_EQ(State("other", b), "ready");
}

TEST_F(ReconcilerTest, NewerVersionReplacesTheOldOnlyOnceReady) {
  int64_t v1 = Add("mlp");
  Reconcile();
  BuildAndLoad();
  int64_t v2 = Add("mlp", {{"inductor.max_autotune", "true"}});  // another build key
  Reconcile();
  EXPECT_EQ(State("mlp", v1), "ready");  // keeps serving while v2 builds
  EXPECT_EQ(registry_->Find("mlp")->version, v1);
  builds_->Succeed(MlpSpec());
  EXPECT_EQ(State("mlp", v1), "ready");  // and while v2 loads
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v2), "ready");
  EXPECT_EQ(State("mlp", v1), "absent");  // retired once v2 could answer
  EXPECT_EQ(registry_->Find("mlp")->version, v2);
}

TEST_F(ReconcilerTest, FailedBuildOfANewVersionKeepsTheOldServing) {
  int64_t v1 = Add("mlp");
  Reconcile();
  BuildAndLoad();
  int64_t v2 = Add("mlp", {{"inductor.nonexistent_option", "1"}});
  Reconcile();
  builds_->Fail("unknown inductor option 'nonexistent_option'", /*permanent=*/true);
  EXPECT_EQ(State("mlp", v2), "failed");
  EXPECT_NE(Served("mlp", v2)->message.find("nonexistent_option"), std::string::npos);
  EXPECT_EQ(State("mlp", v1), "ready");
  EXPECT_EQ(registry_->Find("mlp")->version, v1);  // requests without a version still answered
  EXPECT_TRUE(HasEvent("mlp", v2, "build_failed"));
  Reconcile();  // a permanent failure is not tried again until the version changes
  EXPECT_EQ(builds_->submitted.size(), 2u);
  Set("mlp", v2, {{"inductor.nonexistent_option", ""}});
  Reconcile();
  EXPECT_EQ(builds_->submitted.size(), 2u);  // same key as v1's build: cached, loaded
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v2), "ready");
  EXPECT_EQ(State("mlp", v1), "absent");
}

// A build's time is estimated from the builds that finished here: the one of
// its kind nearest in size, scaled by the size ratio within half to twice.
TEST(EstimateBuildMs, NearestOfItsKindScaledBySize) {
  using T = storage::ModelStore::BuildTime;
  std::vector<T> past = {
      {1000, "exported_program", 20000}, {100000, "exported_program", 90000}, {1000, "aoti_source", 5000}};
  EXPECT_EQ(EstimateBuildMs(past, 1000, "exported_program"), 20000);
  EXPECT_EQ(EstimateBuildMs(past, 1500, "exported_program"), 30000);     // nearest 1000, x1.5
  EXPECT_EQ(EstimateBuildMs(past, 400000, "exported_program"), 180000);  // nearest 100000, at most x2
  EXPECT_EQ(EstimateBuildMs(past, 100, "exported_program"), 10000);      // at least half
  EXPECT_EQ(EstimateBuildMs(past, 1000, "aoti_source"), 5000);
  EXPECT_EQ(EstimateBuildMs(past, 1000, "aoti_compiled"), 0);  // nothing of that kind yet
  EXPECT_EQ(EstimateBuildMs({}, 1000, "exported_program"), 0);
}

// The next build of that kind is given an estimate from the store's record
// of a finished one on this machine.
TEST_F(ReconcilerTest, ABuildIsGivenAnEstimateFromTheBuildsBeforeIt) {
  int64_t v1 = Add("mlp");
  Reconcile();
  ASSERT_EQ(builds_->estimates.back(), 0);  // the first build here: no idea
  BuildAndLoad();
  // As if it had taken 40 s.
  auto rec = store_->GetBuild(builds_->submitted.back().artifact, "model",
                              builds_->submitted.back().fingerprint, "cpu");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  storage::BuildRecord b = **rec;
  b.finished_at_ms = b.started_at_ms + 40000;
  ASSERT_OK(store_->PutBuild(b));
  Set("mlp", v1, {{"inductor.max_autotune", "true"}});  // another build key, the same artifact
  Reconcile();
  ASSERT_EQ(builds_->estimates.size(), 2u);
  EXPECT_EQ(builds_->estimates.back(), 40000);
}

// Auto threads are timed once per build and machine and recorded with the
// build; removing the record (what `aotid set NAME threads=...` does) has
// the version loaded again and timed anew, while the loaded one serves.
TEST_F(ReconcilerTest, RemovingARecordedThreadChoiceReloadsTheVersionToTimeItAgain) {
  loader_->record_threads = true;
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  ASSERT_EQ(State("mlp", v), "ready");
  const LoadRequest first = loader_->requests.back();
  EXPECT_EQ(first.choose_threads_at_batch, 1);
  EXPECT_NE(first.threads_key.find("2 cores; up to 2 threads; batch 1"), std::string::npos)
      << first.threads_key;
  ASSERT_TRUE(cache_->ReadThreads(first.entry.dir, first.threads_key).has_value());

  Reconcile();  // nothing changed: nothing loads
  EXPECT_EQ(loader_->pending(), 0u);

  ASSERT_TRUE(cache_->ForgetThreads(first.entry.dir));
  Reconcile();
  ASSERT_EQ(loader_->pending(), 1u);    // loaded again, to be timed
  EXPECT_EQ(State("mlp", v), "ready");  // the loaded one serves meanwhile
  EXPECT_TRUE(HasEvent("mlp", v, "reloading"));
  EXPECT_EQ(loader_->requests.back().choose_threads_at_batch, 1);
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v), "ready");
  Reconcile();
  EXPECT_EQ(loader_->pending(), 0u);  // the new record stands

  // Explicit threads: nothing to time, nothing recorded to watch.
  Set("mlp", v, {{"threads", "1"}});
  Reconcile();
  ASSERT_EQ(loader_->pending(), 1u);
  EXPECT_EQ(loader_->requests.back().choose_threads_at_batch, 0);
  EXPECT_TRUE(loader_->requests.back().threads_key.empty());
}

// A version superseded while it builds or loads (the same file added again:
// one build serves both) is not loaded, logged or recorded as serving: its
// route would answer 404 at once.
TEST_F(ReconcilerTest, AVersionSupersededWhileItBuildsIsNotLoaded) {
  int64_t v1 = Add("twin");
  Reconcile();
  int64_t v2 = Add("twin");  // same artifact: the build under way is v2's too
  Reconcile();
  ASSERT_EQ(builds_->live(), 1u);
  builds_->Succeed(MlpSpec());
  ASSERT_EQ(loader_->pending(), 1u);  // v2's load only
  loader_->SucceedAll();
  EXPECT_EQ(State("twin", v2), "ready");
  EXPECT_EQ(State("twin", v1), "absent");
  auto v1_events = Events("twin", v1);
  EXPECT_EQ(std::count(v1_events.begin(), v1_events.end(), "loaded"), 0);

  // Superseded while its load runs: the finished load is dropped.
  int64_t v3 = Add("twin");
  Reconcile();  // cached: v3's load starts
  ASSERT_EQ(loader_->pending(), 1u);
  Add("twin");  // v4, before v3's load finishes
  Reconcile();
  loader_->SucceedAll();
  EXPECT_EQ(State("twin", v3), "absent");
  auto v3_events = Events("twin", v3);
  EXPECT_EQ(std::count(v3_events.begin(), v3_events.end(), "loaded"), 0);
}

TEST_F(ReconcilerTest, SettingsChangeReloadsWhileTheOldInstanceServes) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  auto before = Served("mlp", v);
  Set("mlp", v, {{"num_runners", "2"}});
  Reconcile();
  EXPECT_EQ(builds_->submitted.size(), 1u);  // runners do not change the build
  ASSERT_EQ(loader_->pending(), 1u);
  EXPECT_EQ(loader_->requests.back().options.num_runners, 2);
  EXPECT_EQ(Served("mlp", v), before);  // the old instance answers meanwhile
  EXPECT_TRUE(HasEvent("mlp", v, "reloading"));
  loader_->Succeed();
  auto after = Served("mlp", v);
  EXPECT_NE(after, before);
  EXPECT_EQ(after->state, ServeState::kReady);
  EXPECT_EQ(after->settings.num_runners, 2);
}

TEST_F(ReconcilerTest, FailedReloadKeepsTheOldInstance) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  auto before = Served("mlp", v);
  Set("mlp", v, {{"num_runners", "3"}});
  Reconcile();
  loader_->Fail("out of memory");
  EXPECT_EQ(Served("mlp", v), before);
  EXPECT_TRUE(HasEvent("mlp", v, "load_failed"));
}

TEST_F(ReconcilerTest, PolicySwitchServesThePinnedVersionAndRetiresTheOther) {
  int64_t v1 = Add("mlp");
  Reconcile();
  BuildAndLoad();
  int64_t v2 = Add("mlp", {{"num_runners", "2"}});
  Reconcile();
  loader_->Succeed();
  ASSERT_EQ(State("mlp", v2), "ready");
  ASSERT_EQ(State("mlp", v1), "absent");

  Set("mlp", std::nullopt, {{"version_policy", "pinned:1"}});
  Reconcile();
  EXPECT_EQ(State("mlp", v2), "ready");  // serves until v1 is ready again
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v1), "ready");
  EXPECT_EQ(State("mlp", v2), "absent");

  Set("mlp", std::nullopt, {{"version_policy", "all"}});
  Reconcile();
  loader_->SucceedAll();
  EXPECT_EQ(State("mlp", v1), "ready");
  EXPECT_EQ(State("mlp", v2), "ready");
  EXPECT_EQ(registry_->Find("mlp")->version, v2);  // no version asked: the newest
}

TEST_F(ReconcilerTest, RemovedVersionIsUnloadedAtOnceAndItsBuildCancelled) {
  int64_t v1 = Add("mlp");
  Reconcile();
  BuildAndLoad();
  int64_t v2 = Add("mlp", {{"inductor.freezing", "true"}});
  Reconcile();
  ASSERT_EQ(builds_->live(), 1u);
  compile::BuildKey v2_build = builds_->key(0);
  ASSERT_TRUE(store_->Remove({{"mlp", v2}}).ok());
  Reconcile();
  ASSERT_EQ(builds_->cancelled.size(), 1u);  // nothing wants that build any more
  EXPECT_EQ(builds_->cancelled[0], v2_build);
  EXPECT_EQ(State("mlp", v2), "absent");
  EXPECT_EQ(State("mlp", v1), "ready");
  ASSERT_TRUE(store_->Remove({{"mlp", std::nullopt}}).ok());
  Reconcile();
  EXPECT_EQ(State("mlp", v1), "absent");
  EXPECT_EQ(registry_->Find("mlp"), nullptr);
}

TEST_F(ReconcilerTest, DisabledModelIsUnloadedAndServedAgainWhenEnabled) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  Set("mlp", std::nullopt, {{"enabled", "false"}});
  Reconcile();
  EXPECT_EQ(State("mlp", v), "absent");
  Set("mlp", std::nullopt, {{"enabled", "true"}});
  Reconcile();
  EXPECT_EQ(builds_->submitted.size(), 1u);  // from the cache
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v), "ready");
}

TEST_F(ReconcilerTest, BuildThatMayPassIsRetriedWithDoublingWaitThenFails) {
  int64_t v = Add("mlp");
  Reconcile();
  builds_->Fail("compile worker killed by signal 9", /*permanent=*/false);
  EXPECT_EQ(State("mlp", v), "queued");
  EXPECT_NE(Served("mlp", v)->message.find("retrying in 10 s"), std::string::npos)
      << Served("mlp", v)->message;
  EXPECT_TRUE(HasEvent("mlp", v, "build_retry"));
  loop_.Advance(kRetryMs - 10);
  EXPECT_EQ(builds_->submitted.size(), 1u);  // not before its time
  loop_.Advance(20);
  ASSERT_EQ(builds_->submitted.size(), 2u);
  builds_->StartNext();
  EXPECT_EQ(BuildRow(builds_->submitted[1])->attempts, 2);
  builds_->Fail("compile worker killed by signal 9", /*permanent=*/false);
  loop_.Advance(2 * kRetryMs - 10);
  EXPECT_EQ(builds_->submitted.size(), 2u);  // the wait doubled
  loop_.Advance(20);
  ASSERT_EQ(builds_->submitted.size(), 3u);
  builds_->Fail("compile worker killed by signal 9", /*permanent=*/false);
  EXPECT_EQ(State("mlp", v), "failed");  // max_attempts = 3
  loop_.Advance(10 * kRetryMs);
  EXPECT_EQ(builds_->submitted.size(), 3u);
}

// A build cancelled before it started (here: its model was unloaded; the
// daemon's stop ends builds the same way) reads as cancelled in the builds
// table and the events, not as failed, and uses up no attempt.
TEST_F(ReconcilerTest, ACancelledBuildReadsAsCancelledAndUsesNoAttempt) {
  int64_t v = Add("mlp");
  Reconcile();
  builds_->Fail("compile worker killed by signal 9", /*permanent=*/false);  // attempt 1 of 3
  loop_.Advance(kRetryMs + 1);
  ASSERT_EQ(builds_->submitted.size(), 2u);  // attempt 2, queued
  compile::BuildKey key = builds_->submitted[1];
  Set("mlp", std::nullopt, {{"enabled", "false"}});
  Reconcile();
  ASSERT_EQ(builds_->cancelled.size(), 1u);
  auto row = BuildRow(key);
  ASSERT_TRUE(row);
  EXPECT_EQ(storage::BuildStateName(row->state), "cancelled");
  EXPECT_NE(row->error.find("cancelled"), std::string::npos) << row->error;
  std::vector<std::string> events = Events("mlp", v);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "build_cancelled");
  EXPECT_EQ(std::count(events.begin(), events.end(), "build_failed"), 1);  // attempt 1's alone

  // Loaded again: the cancelled attempt is made again, not counted.
  Set("mlp", std::nullopt, {{"enabled", "true"}});
  Reconcile();
  ASSERT_EQ(builds_->submitted.size(), 3u);
  builds_->StartNext();
  EXPECT_EQ(BuildRow(key)->attempts, 2);
  builds_->Fail("compile worker killed by signal 9", /*permanent=*/false);
  EXPECT_EQ(State("mlp", v), "queued");  // attempt 3 of 3 is still to come
  loop_.Advance(2 * kRetryMs + 1);
  BuildAndLoad();
  EXPECT_EQ(State("mlp", v), "ready");
}

TEST_F(ReconcilerTest, RetrySucceedsAndServes) {
  int64_t v = Add("mlp");
  Reconcile();
  builds_->Fail("build timed out", /*permanent=*/false);
  loop_.Advance(kRetryMs + 1);
  BuildAndLoad();
  EXPECT_EQ(State("mlp", v), "ready");
}

TEST_F(ReconcilerTest, MissingDeviceFallsBackToTheCpuAndSaysWhy) {
  int64_t v = Add("mlp", {{"device", "cuda"}});
  Reconcile();
  ASSERT_EQ(builds_->submitted.size(), 1u);
  EXPECT_EQ(builds_->submitted[0].device, "cpu");
  BuildAndLoad();
  auto m = Served("mlp", v);
  ASSERT_EQ(m->state, ServeState::kReady);
  EXPECT_NE(m->device_note.find("no NVIDIA driver"), std::string::npos) << m->device_note;
  EXPECT_TRUE(HasEvent("mlp", v, "device_fallback"));
}

TEST_F(ReconcilerTest, MissingDeviceWithoutFallbackFailsWithTheReason) {
  int64_t v = Add("mlp", {{"device", "cuda"}, {"fallback_cpu", "false"}});
  Reconcile();
  EXPECT_TRUE(builds_->submitted.empty());
  ASSERT_EQ(State("mlp", v), "failed");
  EXPECT_NE(Served("mlp", v)->message.find("fallback_cpu is off"), std::string::npos);
  auto rows = store_->ListBuilds(Served("mlp", v)->artifact);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);  // `aotid ls` shows it failed, and why
  EXPECT_EQ((*rows)[0].state, storage::BuildState::kFailed);
}

TEST_F(ReconcilerTest, LoadFailureOnTheDeviceFallsBackToACpuBuild) {
  cuda_missing_ = "";  // a machine with a GPU
  Start();
  int64_t v = Add("mlp");
  Reconcile();
  ASSERT_EQ(builds_->submitted.size(), 1u);
  EXPECT_EQ(builds_->submitted[0].device, "cuda");  // auto
  builds_->Succeed(MlpSpec());
  loader_->Fail("CUDA error: no kernel image is available");
  EXPECT_TRUE(HasEvent("mlp", v, "device_fallback"));
  ASSERT_EQ(builds_->submitted.size(), 2u);
  EXPECT_EQ(builds_->submitted[1].device, "cpu");
  BuildAndLoad();
  auto m = Served("mlp", v);
  ASSERT_EQ(m->state, ServeState::kReady);
  EXPECT_EQ(m->device, "cpu");
  EXPECT_NE(m->device_note.find("no kernel image"), std::string::npos) << m->device_note;
}

// The compile worker exits "cannot be built here" (2) when this torch
// cannot use the device or move the program to it: the fallback follows at
// once, with the worker's reason, and the device build is never retried.
TEST_F(ReconcilerTest, DeviceBuildThatCannotPassFallsBackToTheCpuWithoutARetry) {
  cuda_missing_ = "";  // the probe sees a GPU that the worker's torch cannot use
  Start();
  int64_t v = Add("mlp");
  Reconcile();
  ASSERT_EQ(builds_->submitted.size(), 1u);
  EXPECT_EQ(builds_->submitted[0].device, "cuda");
  builds_->Fail("cannot build for cuda: torch finds no usable CUDA device", /*permanent=*/true);
  EXPECT_FALSE(HasEvent("mlp", v, "build_retry"));
  EXPECT_TRUE(HasEvent("mlp", v, "device_fallback"));
  ASSERT_EQ(builds_->submitted.size(), 2u);
  EXPECT_EQ(builds_->submitted[1].device, "cpu");
  BuildAndLoad();
  auto m = Served("mlp", v);
  ASSERT_EQ(m->state, ServeState::kReady);
  EXPECT_EQ(m->device, "cpu");
  EXPECT_NE(m->device_note.find("torch finds no usable CUDA device"), std::string::npos) << m->device_note;
  loop_.Advance(10 * kRetryMs);
  EXPECT_EQ(builds_->submitted.size(), 2u);
}

// A compiled package runs only on the device it was compiled for: where
// that device is missing it is failed with the reason, never built; where
// it is present it is built (and first run) for that device.
TEST_F(ReconcilerTest, ACompiledPackageIsBuiltForItsOwnDeviceOrFailedWithTheReason) {
  int64_t v = Add("cuda", {}, "cuda_so.pt2");
  Reconcile();
  EXPECT_TRUE(builds_->submitted.empty());
  ASSERT_EQ(State("cuda", v), "failed");
  EXPECT_NE(
      Served("cuda", v)->message.find("package was built for cuda; this machine has none (device 'cuda' is "
                                      "not available here: no NVIDIA driver)"),
      std::string::npos)
      << Served("cuda", v)->message;
  cuda_missing_ = "";
  Start();
  Reconcile();
  ASSERT_EQ(builds_->submitted.size(), 1u);
  EXPECT_EQ(builds_->submitted[0].device, "cuda");
}

TEST_F(ReconcilerTest, LoadFailureOnTheCpuFailsTheVersion) {
  int64_t v = Add("mlp", {{"device", "cpu"}});
  Reconcile();
  builds_->Succeed(MlpSpec());
  loader_->Fail("cannot map model.so");
  EXPECT_EQ(State("mlp", v), "failed");  // already on the CPU: nothing to fall back to
  EXPECT_TRUE(HasEvent("mlp", v, "load_failed"));
}

TEST_F(ReconcilerTest, DamagedCacheEntryIsRebuilt) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  std::string so = InertDir(Served("mlp", v)->model) + "/model.so";
  ASSERT_OK(fs::WriteFileAtomic(so, "x"));  // another size than its manifest says
  Start();
  Reconcile();
  EXPECT_EQ(builds_->submitted.size(), 2u);
  EXPECT_TRUE(HasEvent("mlp", v, "cache_invalid"));
  BuildAndLoad();
  EXPECT_EQ(State("mlp", v), "ready");
}

// A load that killed its runner, of a build whose model.so no longer
// matches its digest: rebuilt once, then served; not failed.
TEST_F(ReconcilerTest, LoadOfABuildDamagedInPlaceRebuildsIt) {
  int64_t v = Add("mlp", {{"device", "cpu"}});
  Reconcile();
  builds_->Succeed(MlpSpec());
  loader_->Fail("model.so does not match the digest its build recorded", StatusCode::kCorruption);
  EXPECT_TRUE(HasEvent("mlp", v, "cache_invalid"));
  EXPECT_FALSE(HasEvent("mlp", v, "load_failed"));
  ASSERT_EQ(builds_->submitted.size(), 2u);
  builds_->Succeed(MlpSpec());
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v), "ready");
}

// A runner that no longer starts because its build was pruned from the
// cache while it served: the build is made again, not the version failed.
TEST_F(ReconcilerTest, RunnerWhoseBuildLeftTheCacheIsRebuiltNotFailed) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  std::string dir = InertDir(Served("mlp", v)->model);
  ASSERT_OK(fs::RemoveAll(dir));
  loader_->requests.back().on_runner_event(
      {runner::RunnerEvent::Kind::kFailed,
       "mlp:1 is not restarted: open spec.json: No such file or directory"});
  EXPECT_TRUE(HasEvent("mlp", v, "cache_invalid"));
  ASSERT_EQ(builds_->submitted.size(), 2u);
  BuildAndLoad();
  EXPECT_EQ(State("mlp", v), "ready");
}

// A served version's runner events go to the event log.
TEST_F(ReconcilerTest, RunnerCrashesAreRecorded) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  ASSERT_FALSE(loader_->requests.empty());
  const LoadRequest& req = loader_->requests.back();
  EXPECT_EQ(req.label, "mlp:" + std::to_string(v));
  ASSERT_TRUE(req.on_runner_event);
  req.on_runner_event({runner::RunnerEvent::Kind::kCrashed, "the runner for mlp:1 was killed by signal 6"});
  req.on_runner_event({runner::RunnerEvent::Kind::kFailed, "mlp:1 is not restarted"});
  EXPECT_TRUE(HasEvent("mlp", v, "runner_crashed"));
  EXPECT_TRUE(HasEvent("mlp", v, "runner_failed"));
  // Given up on: failed with the reason, not shown as ready.
  EXPECT_EQ(State("mlp", v), "failed");
  EXPECT_EQ(
      Served("mlp", v)->message,
      "mlp:1 is not restarted; loading it again (POST /v2/repository/models/mlp/load) starts it afresh");
  Reconcile();  // and not loaded again by itself
  EXPECT_EQ(State("mlp", v), "failed");
  EXPECT_EQ(loader_->pending(), 0u);
  // Unloading and loading it again (the repository API) starts it afresh.
  Set("mlp", std::nullopt, {{"enabled", "false"}});
  Reconcile();
  Set("mlp", std::nullopt, {{"enabled", "true"}});
  Reconcile();
  EXPECT_EQ(loader_->pending(), 1u);
}

// A repository load of a model that is loaded already tries its failed
// version again, without an unload (its runner crashed too often).
TEST_F(ReconcilerTest, RetryFailedLoadsAFailedVersionAgain) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  loader_->requests.back().on_runner_event({runner::RunnerEvent::Kind::kFailed, "mlp:1 is not restarted"});
  EXPECT_EQ(State("mlp", v), "failed");
  Reconcile();
  EXPECT_EQ(loader_->pending(), 0u);
  ASSERT_OK(reconciler_->RetryFailed("other"));  // another model's: nothing
  EXPECT_EQ(loader_->pending(), 0u);
  ASSERT_OK(reconciler_->RetryFailed("mlp"));
  EXPECT_EQ(loader_->pending(), 1u);  // its build is in the cache: loaded again
  EXPECT_EQ(builds_->live(), 0u);
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v), "ready");
}

// A version's own timeout_s and memory_limit_mb reach its runner; at 0
// the daemon's [runner] values do. Changing one starts a new runner.
TEST_F(ReconcilerTest, RunnerLimitsAreTheVersionsOwnOrTheDaemons) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  ASSERT_FALSE(loader_->requests.empty());
  ReconcilerOptions defaults;
  EXPECT_EQ(loader_->requests.back().run_timeout_ms, defaults.run_timeout_ms);
  EXPECT_EQ(loader_->requests.back().memory_limit_bytes, defaults.memory_limit_bytes);
  size_t before = loader_->requests.size();
  Set("mlp", v, {{"timeout_s", "7"}, {"memory_limit_mb", "300"}});
  Reconcile();
  ASSERT_EQ(loader_->requests.size(), before + 1);
  EXPECT_EQ(loader_->requests.back().run_timeout_ms, 7000);
  EXPECT_EQ(loader_->requests.back().memory_limit_bytes, uint64_t{300} << 20);
}

TEST_F(ReconcilerTest, BuildThatEndedTheDaemonTwiceWhileLoadingIsNotLoadedAgain) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  std::string dir = InertDir(Served("mlp", v)->model);
  ASSERT_OK(fs::WriteFileAtomic(dir + "/load.pending", "999999999 2\n"));  // two crashed starts
  Start();
  Reconcile();
  EXPECT_EQ(State("mlp", v), "failed");
  EXPECT_NE(Served("mlp", v)->message.find("ended its process 2 times"), std::string::npos);
  EXPECT_EQ(loader_->requests.size(), 0u);  // not loaded again
  EXPECT_EQ(builds_->submitted.size(), 1u);
}

TEST_F(ReconcilerTest, BuildProgressIsPublishedWhileItRuns) {
  int64_t v = Add("mlp");
  Reconcile();
  builds_->StartNext();
  loop_.Advance(1000);
  EXPECT_NE(Served("mlp", v)->message.find("step 2/4: compiling"), std::string::npos)
      << Served("mlp", v)->message;
  EXPECT_EQ(BuildRow(builds_->submitted[0])->progress, builds_->progress);
  BuildAndLoad();
  loop_.Advance(5000);
  EXPECT_EQ(loop_.pending(), 0u);  // no progress timer left once nothing builds
}

TEST_F(ReconcilerTest, BatchingWrapsTheModelOnlyWhenItsShapesAllowIt) {
  int64_t v = Add("mlp", {{"max_batch_size", "8"}, {"max_batch_delay_us", "100"}});
  Reconcile();
  BuildAndLoad();
  auto* batching = dynamic_cast<const serving::BatchingModel*>(Served("mlp", v)->model.get());
  ASSERT_NE(batching, nullptr);
  EXPECT_EQ(batching->options().max_batch_size, 8);
  EXPECT_EQ(loader_->requests[0].choose_threads_at_batch, 8);  // auto threads timed at the batch it will see
}

// A model that is not batched still gets a queue of its own that joins
// nothing: its requests wait for its runners holding no HTTP worker, so a
// runner that hangs cannot take the workers every other model needs.
TEST_F(ReconcilerTest, AnUnbatchedModelIsQueuedAloneWithItsOwnBound) {
  int64_t v = Add("mlp", {{"num_runners", "2"}});
  Reconcile();
  BuildAndLoad();
  auto* queue = dynamic_cast<const serving::BatchingModel*>(Served("mlp", v)->model.get());
  ASSERT_NE(queue, nullptr);
  EXPECT_EQ(queue->options().max_batch_size, 1);
  EXPECT_EQ(queue->options().workers, 2);  // one run per runner at once
  EXPECT_GT(queue->options().max_queued, 0);
}

// Joined rows never pass the range dim 0 was traced for: max_batch_size is
// lowered to it (and batching is off when it is 1).
TEST_F(ReconcilerTest, BatchesStayWithinTheTracedRowsOfDimZero) {
  for (int64_t traced_max : {4, 1}) {
    SCOPED_TRACE(traced_max);
    std::string name = "m" + std::to_string(traced_max);
    // Builds of their own (the options are part of the build's key).
    int64_t v =
        Add(name, {{"max_batch_size", "8"}, {"inductor.max_autotune", traced_max == 1 ? "true" : "false"}});
    Reconcile();
    model::ModelSpec spec = MlpSpec();
    spec.inputs[0].dims = {model::DimRange{"batch", 1, traced_max}, std::nullopt};
    builds_->Succeed(spec);
    loader_->Succeed();
    auto* batching = dynamic_cast<const serving::BatchingModel*>(Served(name, v)->model.get());
    ASSERT_NE(batching, nullptr);
    if (traced_max == 1) {
      EXPECT_EQ(batching->options().max_batch_size, 1);  // queued, never joined
      EXPECT_TRUE(HasEvent(name, v, "batching_off"));
    } else {
      EXPECT_EQ(batching->options().max_batch_size, 4);
      EXPECT_TRUE(HasEvent(name, v, "batching_capped"));
    }
  }
}

// An embedding model's batches join texts of different lengths: its ids
// are padded with its pad token, its attention mask with 0, in whatever
// order the compiled model takes them.
TEST_F(ReconcilerTest, AnEmbeddingModelsBatchesPadItsTokens) {
  int64_t v = Add("enc", {{"max_batch_size", "16"}});
  Reconcile();
  model::ModelSpec spec;
  spec.inputs.push_back({"attention_mask", model::DType::kInt64, {-1, -1}});
  spec.inputs.push_back({"input_ids", model::DType::kInt64, {-1, -1}});
  spec.outputs.push_back({"embedding", model::DType::kFloat32, {-1, 8}});
  builds_->Succeed(spec);
  auto embed = std::make_shared<serving::EmbedSpec>();
  embed->pad_id = 7;
  loader_->embed = embed;
  loader_->Succeed();
  auto* batching = dynamic_cast<const serving::BatchingModel*>(Served("enc", v)->model.get());
  ASSERT_NE(batching, nullptr);
  EXPECT_EQ(batching->options().max_batch_size, 16);
  EXPECT_EQ(batching->options().pad, (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(Served("enc", v)->embed, embed);
}

TEST_F(ReconcilerTest, LoadFinishingAfterTheReconcilerIsGoneDoesNothing) {
  Add("mlp");
  Reconcile();
  builds_->Succeed(MlpSpec());
  ASSERT_EQ(loader_->pending(), 1u);
  reconciler_.reset();
  loader_->Succeed();  // would crash if the callback reached the destroyed reconciler
  EXPECT_EQ(registry_->Find("mlp")->state, ServeState::kLoading);
}

}  // namespace
}  // namespace aotid::control

namespace aotid::control {
namespace {

// The answer a request to a served version gets, waited for a bounded time.
Status AnswerOf(const std::shared_ptr<model::LoadedModel>& m, FakeLoop* loop, FakeLoader* loader,
                bool finish_load) {
  auto answered = std::make_shared<std::promise<Status>>();
  auto answer = answered->get_future();
  model::HostTensor x{"x", model::DType::kFloat32, {1, 8}, std::vector<std::byte>(32)};
  Status submitted = m->Submit({x}, {}, [answered](StatusOr<std::vector<model::HostTensor>> out) {
    answered->set_value(out.status());
  });
  if (!submitted.ok()) return submitted;
  loop->RunPosted();
  if (finish_load) loader->Succeed();
  if (answer.wait_for(std::chrono::seconds(10)) != std::future_status::ready) return Internal("no answer");
  return answer.get();
}

class ResidentReconcilerTest : public ReconcilerTest {
 protected:
  // mlp, with keep_alive 0, built and ready but not resident, in a budget
  // of 1 GiB.
  int64_t ServeNotResident() {
    ManageResidency(uint64_t{1} << 30);
    Start();
    int64_t v = Add("mlp", {{"keep_alive", "0"}});
    Reconcile();
    builds_->Succeed(MlpSpec());
    loader_->Succeed();
    return v;
  }
  // Submits a request to `m`; its answer comes in the future.
  std::future<Status> Submit(const std::shared_ptr<model::LoadedModel>& m) {
    auto answered = std::make_shared<std::promise<Status>>();
    auto answer = answered->get_future();
    EXPECT_OK(m->Submit({}, {}, [answered](StatusOr<std::vector<model::HostTensor>> out) {
      answered->set_value(out.status());
    }));
    loop_.RunPosted();
    return answer;
  }
};

// keep_alive 0: nothing is loaded at start; the version is ready, and its
// first request loads its runner and runs on it.
TEST_F(ResidentReconcilerTest, AVersionWithKeepAliveZeroIsReadyAndLoadsOnItsFirstRequest) {
  ManageResidency(uint64_t{1} << 30);
  Start();
  int64_t v = Add("mlp", {{"keep_alive", "0"}});
  Reconcile();
  builds_->Succeed(MlpSpec());
  ASSERT_EQ(loader_->requests.size(), 1u);
  EXPECT_TRUE(loader_->requests[0].prepare_only);
  loader_->Succeed();
  ASSERT_EQ(State("mlp", v), "ready");
  EXPECT_TRUE(registry_->startup_done());
  EXPECT_TRUE(HasEvent("mlp", v, "ready"));
  auto served = Served("mlp", v);
  auto* resident = dynamic_cast<ResidentModel*>(served->model.get());
  ASSERT_NE(resident, nullptr);
  EXPECT_FALSE(resident->state().resident);
  // The inert test model answers "inert test model": the request ran on
  // the runner loaded for it.
  Status answer = AnswerOf(served->model, &loop_, loader_.get(), /*finish_load=*/true);
  EXPECT_EQ(answer.message(), "inert test model");
  ASSERT_EQ(loader_->requests.size(), 2u);
  EXPECT_FALSE(loader_->requests[1].prepare_only);
  EXPECT_TRUE(HasEvent("mlp", v, "loaded"));
  loop_.Advance(0);
  EXPECT_FALSE(resident->state().resident) << "keep_alive 0 unloads it after the answer";
  EXPECT_TRUE(HasEvent("mlp", v, "unloaded"));
  // What its runner measured is kept with its build.
  auto entry = cache_->Lookup(builds_->submitted[0]);
  ASSERT_OK(entry.status());
  EXPECT_TRUE(fs::Exists(entry->dir + "/footprint.json"));
}

TEST_F(ResidentReconcilerTest, ChangingKeepAliveDoesNotReloadTheVersion) {
  ManageResidency(uint64_t{1} << 30);
  Start();
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  ASSERT_EQ(State("mlp", v), "ready");
  auto before = Served("mlp", v)->model;
  Set("mlp", v, {{"keep_alive", "10m"}});
  Reconcile();
  EXPECT_EQ(loader_->requests.size(), 1u);
  EXPECT_EQ(Served("mlp", v)->model, before);
  EXPECT_EQ(Served("mlp", v)->settings.keep_alive_s, 600);
  ASSERT_EQ(residency_->Report()->versions.size(), 1u);
  EXPECT_EQ(residency_->Report()->versions[0].keep_alive, "10m");
}

// At start a version is loaded only where it fits beside what is loaded;
// one that does not is ready and loads on its first request.
TEST_F(ResidentReconcilerTest, AVersionThatDoesNotFitTheBudgetAtStartIsReadyNotResident) {
  ManageResidency(uint64_t{1} << 20);  // 1 MiB: no runner fits
  Start();
  int64_t v = Add("mlp");
  Reconcile();
  builds_->Succeed(MlpSpec());
  ASSERT_EQ(loader_->requests.size(), 1u);
  EXPECT_TRUE(loader_->requests[0].prepare_only);
  loader_->Succeed();
  EXPECT_EQ(State("mlp", v), "ready");
  // Its first request is refused: it can never fit, and says why.
  Status answer = AnswerOf(Served("mlp", v)->model, &loop_, loader_.get(), /*finish_load=*/false);
  EXPECT_EQ(answer.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(answer.message().find("budget of 1 MiB"), std::string::npos) << answer.message();
}

TEST_F(ResidentReconcilerTest, ALoadOnDemandThatFailsAnswersWithTheReasonAndIsRecorded) {
  int64_t v = ServeNotResident();
  auto answer = Submit(Served("mlp", v)->model);
  loader_->Fail("the runner for mlp:1 did not start: no memory");
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(answer.get().message(), "the runner for mlp:1 did not start: no memory");
  EXPECT_TRUE(HasEvent("mlp", v, "load_failed"));
  EXPECT_EQ(State("mlp", v), "ready") << "the next request tries again";
}

// What a version measured stays with its build through a change of a
// setting that does not change a runner's memory (its time limit), so it
// is admitted by that size, not by an estimate, after the reload.
TEST_F(ResidentReconcilerTest, AMeasuredSizeSurvivesASettingThatDoesNotChangeMemory) {
  int64_t v = ServeNotResident();
  EXPECT_EQ(AnswerOf(Served("mlp", v)->model, &loop_, loader_.get(), true).message(), "inert test model");
  loop_.Advance(0);
  ASSERT_TRUE(residency_->Report()->versions[0].size_measured);
  Set("mlp", v, {{"timeout_s", "60"}});
  Reconcile();
  loader_->Succeed();  // the reload: ready, not resident
  ASSERT_EQ(residency_->Report()->versions.size(), 1u);
  EXPECT_TRUE(residency_->Report()->versions[0].size_measured);
  EXPECT_EQ(residency_->Report()->versions[0].size_bytes, uint64_t{40} << 20);
}

// A version removed from the store is retired: a request waiting for its
// load gets an answer instead of waiting for ever.
TEST_F(ResidentReconcilerTest, RemovingAVersionAnswersTheRequestsWaitingForItsLoad) {
  int64_t v = ServeNotResident();
  auto answer = Submit(Served("mlp", v)->model);
  ASSERT_TRUE(store_->Remove({{"mlp", v}}).ok());
  Reconcile();
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(answer.get().code(), StatusCode::kUnavailable);
  EXPECT_EQ(State("mlp", v), "absent");
}

// A version loaded at start gives back the room it reserved only once its
// runner counts as resident: a load waiting for memory is not admitted
// into that room in between.
TEST_F(ResidentReconcilerTest, ALoadAtStartKeepsItsRoomUntilItsRunnerCounts) {
  const uint64_t budget = uint64_t{180} << 20;
  ManageResidency(budget);
  Start();
  int64_t a = Add("aa", {{"keep_alive", "0"}});  // loads on its first request
  int64_t b = Add("bb");                         // loaded at start, about 150 MB reserved
  Reconcile();
  builds_->Succeed(MlpSpec());  // one build serves both
  ASSERT_EQ(loader_->requests.size(), 2u);
  ASSERT_EQ(loader_->requests[0].label, "aa:" + std::to_string(a));
  ASSERT_TRUE(loader_->requests[0].prepare_only);
  ASSERT_FALSE(loader_->requests[1].prepare_only);
  loader_->Succeed();
  ASSERT_EQ(State("aa", a), "ready");
  // aa's first request waits: bb's reservation leaves no room for it.
  ASSERT_OK(Served("aa", a)->model->Submit({}, {}, [](StatusOr<std::vector<model::HostTensor>>) {}));
  loop_.RunPosted();
  ASSERT_EQ(loader_->requests.size(), 2u);
  loader_->Succeed();  // bb is up: it measures 40 MB
  loop_.RunPosted();
  ASSERT_EQ(State("bb", b), "ready");
  EXPECT_LE(residency_->Used(), budget);
}
// The repository's load, as HTTP's and gRPC's load calls make it: the
// answer comes once the model serves (a client loads, then infers), not
// while it loads; a load that fails is an error naming the version; one
// that must build answers at the deadline with the state it is in.
TEST_F(ReconcilerTest, ALoadAnswersOnceTheModelServesOrFailsNotWhileItLoads) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  Set("mlp", std::nullopt, {{"enabled", "false"}});
  Reconcile();
  ASSERT_EQ(State("mlp", v), "absent");
  ModelCommands commands({.store_dir = dir_.path(), .wait_ms = 5000, .load_wait_ms = 60000, .poll_ms = 20},
                         reconciler_.get(), registry_.get(), &loop_);
  std::optional<Status> answer;
  commands.SetEnabled("mlp", true, [&](Status s) { answer = s; });
  Reconcile();  // as the store watch would: the build is cached, so it loads
  ASSERT_EQ(State("mlp", v), "loading");
  loop_.Advance(30000);  // past wait_ms: a load from the cache is waited for longer
  EXPECT_FALSE(answer.has_value()) << "answered while loading";
  loader_->Succeed();
  loop_.Advance(20);
  ASSERT_TRUE(answer.has_value());
  EXPECT_OK(*answer);
  EXPECT_EQ(State("mlp", v), "ready");

  // Unloaded and loaded again, and this time the load fails.
  Set("mlp", std::nullopt, {{"enabled", "false"}});
  Reconcile();
  answer.reset();
  commands.SetEnabled("mlp", true, [&](Status s) { answer = s; });
  Reconcile();
  loader_->Fail("cannot map model.so");
  loop_.Advance(20);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->code(), StatusCode::kUnavailable);
  EXPECT_NE(answer->message().find("model 'mlp' version " + std::to_string(v) + " failed: "),
            std::string::npos)
      << answer->message();
  EXPECT_NE(answer->message().find("cannot map model.so"), std::string::npos) << answer->message();

  // A new model must build: answered at wait_ms, with OK, as it stands.
  int64_t other = Add("other", {}, "tiny_llm_int8.pt2");
  Set("other", std::nullopt, {{"enabled", "false"}});
  Reconcile();
  answer.reset();
  commands.SetEnabled("other", true, [&](Status s) { answer = s; });
  Reconcile();
  loop_.Advance(4900);
  EXPECT_FALSE(answer.has_value());
  loop_.Advance(200);
  ASSERT_TRUE(answer.has_value());
  EXPECT_OK(*answer);
  EXPECT_TRUE(State("other", other) == "queued" || State("other", other) == "building")
      << State("other", other);
}

// A retried load (of a model loaded already) whose failed version fails
// again answers at once with the failure, not at a deadline; commands
// still waiting at Stop() are answered then, and later ones at once.
TEST_F(ReconcilerTest, ARetriedLoadThatFailsAgainAnswersAtOnceAndStopAnswersTheRest) {
  int64_t v = Add("mlp");
  Reconcile();
  builds_->StartNext();
  builds_->Succeed(MlpSpec());
  loader_->Fail("cannot map model.so");
  ASSERT_EQ(State("mlp", v), "failed");
  ModelCommands commands({.store_dir = dir_.path()}, reconciler_.get(), registry_.get(), &loop_);
  std::optional<Status> answer;
  commands.SetEnabled("mlp", true, [&](Status s) { answer = s; });  // enabled already: a retry
  ASSERT_EQ(State("mlp", v), "loading");
  loader_->Fail("cannot map model.so again");
  loop_.Advance(100);
  ASSERT_TRUE(answer.has_value()) << "still waiting after a fresh failure";
  EXPECT_EQ(answer->code(), StatusCode::kUnavailable);
  EXPECT_NE(answer->message().find("cannot map model.so again"), std::string::npos) << answer->message();

  // A load that waits (a cached build loading) when the daemon stops.
  answer.reset();
  commands.SetEnabled("mlp", true, [&](Status s) { answer = s; });
  ASSERT_EQ(State("mlp", v), "loading");
  loop_.Advance(1000);
  ASSERT_FALSE(answer.has_value());
  commands.Stop();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->code(), StatusCode::kUnavailable);
  EXPECT_NE(answer->message().find("stopping"), std::string::npos) << answer->message();
  loop_.Advance(100'000);  // its timer finds it answered: no second answer
  std::optional<Status> late;
  commands.SetEnabled("mlp", false, [&](Status s) { late = s; });
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->code(), StatusCode::kUnavailable);
}

// A command reconciles as it writes, so it answers from its own effect,
// not from the registry as it was before (the store watch may not have
// run yet, or may not have seen another writer's change): an unload is
// answered at once with the model gone, and a load after another writer
// disabled a failed model (unseen) tries it again rather than answering
// with its old failure.
TEST_F(ReconcilerTest, ACommandActsAtOnceNotOnTheRegistryFromBeforeIt) {
  int64_t v = Add("mlp");
  Reconcile();
  BuildAndLoad();
  ASSERT_EQ(State("mlp", v), "ready");
  ModelCommands commands({.store_dir = dir_.path()}, reconciler_.get(), registry_.get(), &loop_);
  std::optional<Status> answer;
  commands.SetEnabled("mlp", false, [&](Status s) { answer = s; });  // no store watch runs here
  ASSERT_TRUE(answer.has_value()) << "the unload waited for a reconcile it should have made";
  EXPECT_OK(*answer);
  EXPECT_EQ(State("mlp", v), "absent");

  answer.reset();
  commands.SetEnabled("mlp", true, [&](Status s) { answer = s; });
  ASSERT_EQ(State("mlp", v), "loading");  // from the cached build
  loader_->Fail("cannot map model.so");
  loop_.Advance(20);
  ASSERT_TRUE(answer.has_value());
  ASSERT_EQ(answer->code(), StatusCode::kUnavailable);

  // Another writer (`aotid set mlp enabled=false`) disables it; before the
  // daemon sees that, a load enables it again.
  Set("mlp", std::nullopt, {{"enabled", "false"}});
  answer.reset();
  commands.SetEnabled("mlp", true, [&](Status s) { answer = s; });
  EXPECT_FALSE(answer.has_value()) << "answered with the old failure: " << answer->message();
  ASSERT_EQ(State("mlp", v), "loading");
  loader_->Succeed();
  loop_.Advance(20);
  ASSERT_TRUE(answer.has_value());
  EXPECT_OK(*answer);
  EXPECT_EQ(State("mlp", v), "ready");
}

// An unload stops a running build, whose process ends a moment later; a
// load in that moment finds the version still in flight. Once the stopped
// build ends, the version is built afresh and the load answered, rather
// than left enabled but never built.
TEST_F(ReconcilerTest, ALoadWhileAnUnloadStopsTheBuildBuildsItAfresh) {
  int64_t v = Add("mlp");
  Reconcile();
  builds_->StartNext();
  builds_->cancel_started_later = true;
  ModelCommands commands({.store_dir = dir_.path()}, reconciler_.get(), registry_.get(), &loop_);
  std::optional<Status> unloaded, loaded;
  commands.SetEnabled("mlp", false, [&](Status s) { unloaded = s; });
  ASSERT_EQ(builds_->cancelled.size(), 1u);
  ASSERT_TRUE(unloaded.has_value());
  EXPECT_OK(*unloaded);
  commands.SetEnabled("mlp", true, [&](Status s) { loaded = s; });
  builds_->FinishCancels();
  ASSERT_EQ(builds_->live(), 1u) << "the version was left enabled but not built";
  EXPECT_EQ(State("mlp", v), "queued");
  builds_->Succeed(MlpSpec());
  loader_->Succeed();
  loop_.Advance(20);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_OK(*loaded);
  EXPECT_EQ(State("mlp", v), "ready");
}

}  // namespace
}  // namespace aotid::control
