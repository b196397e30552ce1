// The control loop's core: makes what is served match what the store says.
//
// Each model's version policy names the versions it wants served (the
// latest, a pinned one, or all). For each such version the reconciler looks
// in the build cache; on a hit it loads the build (on the libuv thread pool,
// off the loop), on a miss it queues a build (one per build key, however
// many versions share the artifact). Every step is recorded in the store
// (builds table and event log) and published to the ModelRegistry that HTTP
// threads read.
//
// What keeps serving while things change:
//  - a version the policy no longer wants (a newer one was added, the pin
//    moved) serves until one the policy wants is ready, so a failed build
//    or load of a new version leaves the old one serving;
//  - a version whose settings changed serves with the old settings until it
//    is reloaded with the new ones;
//  - a version removed from the store is unloaded at once (requests in
//    flight finish on the model they hold).
// Work whose version was removed or changed meanwhile is dropped when it
// finishes; a build nobody wants any more is cancelled.
//
// Devices: `auto` is MPS on Apple Silicon, CUDA where present, else the
// CPU. An exported program whose device is missing here, or fails to build
// or load there, runs on the CPU when fallback_cpu is on, with the reason
// in the event log, `aotid show` and the metadata route; with it off the
// version fails with that reason. An AOTInductor package runs on the device
// it was compiled for or not at all.
//
// Builds that fail in a way that may pass (killed, timed out) are retried
// with a doubling wait, up to max_attempts; a compile error is not.
//
// What it drives comes through small interfaces, so its logic is tested
// with fakes in milliseconds: builds (compile::BuildRunner), loads
// (ModelLoader), time and wake-ups (Loop). The store and the build cache
// are the real ones (a SQLite file and a directory).
//
// Runs on the loop thread only. Reconcile() is idempotent: calling it again
// changes nothing unless the store changed.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "compile/build_cache.h"
#include "compile/builder.h"
#include "control/loop.h"
#include "control/model_loader.h"
#include "control/residency.h"
#include "platform/hardware.h"
#include "serving/metrics.h"
#include "serving/model_registry.h"
#include "storage/model_store.h"

namespace aotid::control {

struct ReconcilerOptions {
  std::string fingerprint;
  platform::HardwareInfo hardware;
  int max_queued_requests = 256;
  int retry_initial_ms = 10000;
  int max_attempts = 4;
  int progress_interval_ms = 1000;  // how often a running build's progress is published
  // Runner processes (control::LoadRequest).
  int64_t run_timeout_ms = 120'000;
  uint64_t memory_limit_bytes = 0;
  int runner_max_crashes = 5;
  int64_t runner_crash_window_ms = 60'000;
  // Set: this model alone is served (single-model mode); the store's other
  // models are neither built nor loaded, nor listed as served.
  std::string only_model;
};

// What the reconciler drives and where it publishes; each must outlive it.
struct ReconcilerParts {
  Loop* loop = nullptr;
  storage::ModelStore* store = nullptr;
  const compile::BuildCache* cache = nullptr;
  compile::BuildRunner* builds = nullptr;
  ModelLoader* loader = nullptr;
  serving::ModelRegistry* registry = nullptr;
  serving::Metrics* metrics = nullptr;  // optional
  // Optional: where versions load and unload within a memory budget
  // (control/residency.h). Without it every ready version stays loaded.
  Residency* residency = nullptr;
};

// How long a build of an artifact of `size` bytes and `kind` may take, from
// the builds that finished here: the one of that kind nearest in size,
// scaled by the size ratio (within half to twice its time). 0 when none is
// of that kind.
int64_t EstimateBuildMs(const std::vector<storage::ModelStore::BuildTime>& past, int64_t size,
                        const std::string& kind);

class Reconciler {
 public:
  Reconciler(ReconcilerParts parts, ReconcilerOptions options);
  ~Reconciler();
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // Brings the served set in line with the store.
  Status Reconcile();
  // Forgets what failed for good or waits for a retry among the versions of
  // `name`, and reconciles: they are tried again now (a repository load of
  // a model that is loaded already).
  Status RetryFailed(const std::string& name);
  // A reload's limits (max_attempts, retry_initial_ms, the runner limits,
  // max_queued_requests): for builds and loads from now on. Loop thread.
  void SetLimits(const ReconcilerOptions& fresh);
  // No new work after this; work in flight finishes (its outcome is still
  // recorded). Callbacks that arrive after the reconciler is destroyed do
  // nothing.
  void Stop();

 private:
  // Where one version runs, and why there when it is not where it asked.
  struct DevicePlan {
    std::string device;
    std::string note;
  };
  struct PendingBuild {
    compile::BuildKey key;
    std::vector<storage::ModelVersion> waiters;
    std::shared_ptr<storage::BuildRecord> record;
  };
  struct Retry {
    int attempts = 0;
    int64_t at_ms = 0;  // Loop::NowMs()
  };

  void Ensure(const storage::ModelVersion& v);
  StatusOr<DevicePlan> PlanDevice(const storage::ModelVersion& v) const;
  compile::BuildKey KeyFor(const storage::ModelVersion& v, const std::string& device) const;
  void StartBuild(const storage::ModelVersion& v, const compile::BuildKey& key);
  void BuildDone(const std::string& bkey, const compile::BuildResult& r);
  // A version whose device build or load failed runs on the CPU next, when
  // it may; true when that was arranged.
  bool FallBack(const storage::ModelVersion& v, const std::string& device, const std::string& why);
  void StartLoad(const storage::ModelVersion& v, const model::CacheEntry& entry, bool built_now,
                 const DevicePlan& plan);
  // The load of `v`'s runner from `entry`, on `plan`'s device.
  LoadRequest MakeLoadRequest(const storage::ModelVersion& v, const model::CacheEntry& entry,
                              const DevicePlan& plan);
  // With residency: hands a ready version over (its runner, when it was
  // loaded now), and returns the model the registry serves.
  std::shared_ptr<model::LoadedModel> Resident(const storage::ModelVersion& v, const model::CacheEntry& entry,
                                               const DevicePlan& plan,
                                               std::shared_ptr<model::LoadedModel> loaded,
                                               std::function<int()> pid);
  // What residency counts a version for, from its build.
  ResidentVersion Sized(const storage::ModelVersion& v, const model::CacheEntry& entry,
                        const DevicePlan& plan) const;
  // A load residency asks for after the first: `done` gets the runner.
  void LoadAgain(const storage::ModelVersion& v, const model::CacheEntry& entry, const DevicePlan& plan,
                 std::function<void(StatusOr<LoadedRunner>)> done);
  // What footprint records of `v` are kept under in its build's entry: the
  // device and the settings that change a runner's memory.
  static std::string FootprintKey(const storage::ModelVersion& v, const std::string& device);
  // Drops a served version from the registry (and from residency).
  void Unserve(const std::string& name, int64_t version, const std::string& why);
  void LoadDone(const storage::ModelVersion& v, const model::CacheEntry& entry, bool built_now,
                const DevicePlan& plan, LoadResult result);
  void CancelUnwanted();
  // A served version's runner crashed, or crashed too often: recorded.
  void RunnerEvent(const storage::ModelVersion& v, const runner::RunnerEvent& e);
  void UpdateProgress();
  void ScheduleProgress();
  void ScheduleRetry(int64_t at_ms);
  // Wraps a callback so it does nothing once the reconciler is stopped or gone.
  std::function<void()> Guard(std::function<void()> fn);
  // Puts a queue in front of a loaded model: the dynamic batcher when its
  // settings ask for batching and its spec allows it, else a queue that
  // joins nothing. Either way a request waiting for the model's runners
  // holds no HTTP worker, and the model's waiting requests are bounded on
  // their own (server.max_queued_requests), so a runner that hangs costs
  // its own requests, not every model's. A language model (its generator
  // calls the model once a token) is left as it is; an embedding model's
  // batches pad its texts' tokens to the longest (`embed`, else null).
  std::shared_ptr<model::LoadedModel> Queue(const storage::ModelVersion& v,
                                            std::shared_ptr<model::LoadedModel> model, bool language_model,
                                            const serving::EmbedSpec* embed);
  void Publish(const storage::ModelVersion& v, serving::ServeState state, std::string message,
               std::shared_ptr<model::LoadedModel> model = nullptr, const DevicePlan* plan = nullptr,
               std::string package_json = "", std::shared_ptr<const serving::Generator> generator = nullptr,
               std::shared_ptr<const serving::EmbedSpec> embed = nullptr);
  // Drops the served versions of `name` that the store no longer has, and
  // those the policy no longer wants once a wanted one is ready.
  void Retire(const std::string& name);
  // True while `v` (artifact and settings) is what the store says.
  bool IsCurrent(const storage::ModelVersion& v) const;
  bool IsDesired(const std::string& name, int64_t version) const;
  void Record(const storage::ModelVersion& v, const std::string& kind, const std::string& message);
  void SaveBuild(const storage::BuildRecord& b);
  void MaybeStartupDone();

  Loop* loop_;
  storage::ModelStore* store_;
  const compile::BuildCache* cache_;
  compile::BuildRunner* builds_runner_;
  ModelLoader* loader_;
  serving::ModelRegistry* registry_;
  serving::Metrics* metrics_;
  Residency* residency_;
  ReconcilerOptions options_;
  const std::string& fingerprint_ = options_.fingerprint;
  bool stopping_ = false;
  // Shared with the callbacks handed out; false once destroyed.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  int64_t retry_wake_at_ms_ = -1;  // the earliest retry wake-up pending; -1 none
  bool progress_scheduled_ = false;
  // The store as of the last reconcile: every version, and the wanted ones.
  std::map<std::string, std::map<int64_t, storage::ModelVersion>> stored_;
  std::map<std::string, std::set<int64_t>> desired_;
  // Work keys (version + artifact + settings) of work in flight, and of work
  // that failed for good: not tried again until the version or its
  // settings change.
  std::set<std::string> in_flight_;
  std::set<std::string> failed_;
  // Work that failed in a way that may pass, with when to try again.
  std::map<std::string, Retry> retries_;
  // Work sent to the CPU after its device failed, with the reason.
  std::map<std::string, std::string> fell_back_;
  // Builds in flight by build key.
  std::map<std::string, PendingBuild> builds_;
  // Loaded versions whose auto threads are recorded in their build's entry
  // (work key -> entry dir). When the record goes (`aotid set NAME
  // threads=...` removes it) the version is loaded again and timed anew.
  std::map<std::string, std::string> threads_records_;
  std::set<std::string> retime_;
  bool startup_pass_done_ = false;
};

}  // namespace aotid::control
