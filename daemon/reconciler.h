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
// finishes.
//
// Runs on the loop thread only. Reconcile() is idempotent: calling it again
// changes nothing unless the store changed.
#pragma once

#include <uv.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/metrics.h"
#include "daemon/model_registry.h"
#include "runtime/build_cache.h"
#include "runtime/builder.h"
#include "storage/model_store.h"

namespace aotid::daemon {

class Reconciler {
 public:
  Reconciler(uv_loop_t* loop, storage::ModelStore* store, const runtime::BuildCache* cache,
             runtime::Builder* builder, ModelRegistry* registry, std::string fingerprint,
             Metrics* metrics = nullptr, int max_queued_requests = 256);

  // Brings the served set in line with the store.
  Status Reconcile();
  // No new work after this; work in flight finishes.
  void Stop() { stopping_ = true; }

 private:
  void Ensure(const storage::ModelVersion& v);
  void StartBuild(const storage::ModelVersion& v, const runtime::BuildKey& key);
  void StartLoad(const storage::ModelVersion& v, const runtime::CacheEntry& entry, bool built_now);
  // Puts the dynamic batcher in front of a loaded model when its settings
  // ask for batching and its spec allows it.
  std::shared_ptr<runtime::LoadedModel> MaybeBatch(const storage::ModelVersion& v,
                                                   std::shared_ptr<runtime::LoadedModel> model);
  void Publish(const storage::ModelVersion& v, ServeState state, std::string message,
               std::shared_ptr<runtime::LoadedModel> model = nullptr);
  // Drops the served versions of `name` that the store no longer has, and
  // those the policy no longer wants once a wanted one is ready.
  void Retire(const std::string& name);
  // True while `v` (artifact and settings) is what the store says.
  bool IsCurrent(const storage::ModelVersion& v) const;
  bool IsDesired(const std::string& name, int64_t version) const;
  void Record(const storage::ModelVersion& v, const std::string& kind, const std::string& message);
  void MaybeStartupDone();
  // Where a version should run on this machine, or why it cannot.
  StatusOr<std::string> ResolveDevice(const storage::ModelVersion& v) const;

  uv_loop_t* loop_;
  storage::ModelStore* store_;
  const runtime::BuildCache* cache_;
  runtime::Builder* builder_;
  ModelRegistry* registry_;
  std::string fingerprint_;
  Metrics* metrics_;
  int max_queued_requests_;
  bool stopping_ = false;
  // The store as of the last reconcile: every version, and the wanted ones.
  std::map<std::string, std::map<int64_t, storage::ModelVersion>> stored_;
  std::map<std::string, std::set<int64_t>> desired_;
  // Work keys (version + artifact + settings) of work in flight, and of work
  // that failed: not retried until the version or its settings change.
  std::set<std::string> in_flight_;
  std::set<std::string> failed_;
  // Builds in flight by build key, with the versions waiting for each.
  std::map<std::string, std::vector<storage::ModelVersion>> builds_;
  bool startup_pass_done_ = false;
};

}  // namespace aotid::daemon
