// The control loop's core: makes what is served match what the store says.
//
// For each model the latest version should be served. For that version the
// reconciler looks in the build cache; on a hit it loads the build (on the
// libuv thread pool, off the loop), on a miss it queues a build. Every step
// is recorded in the store (builds table and event log) and published to
// the ModelRegistry that HTTP threads read.
//
// Runs on the loop thread only. Reconcile() is idempotent: calling it again
// changes nothing unless the store changed.
#pragma once

#include <uv.h>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "daemon/model_registry.h"
#include "runtime/build_cache.h"
#include "runtime/builder.h"
#include "storage/model_store.h"

namespace aotid::daemon {

class Reconciler {
 public:
  Reconciler(uv_loop_t* loop, storage::ModelStore* store, const runtime::BuildCache* cache,
             runtime::Builder* builder, ModelRegistry* registry, std::string fingerprint);

  // Brings the served set in line with the store.
  Status Reconcile();
  // No new work after this; work in flight finishes.
  void Stop() { stopping_ = true; }

 private:
  struct Pending;
  void Ensure(const storage::ModelVersion& v);
  void StartBuild(const storage::ModelVersion& v, const runtime::BuildKey& key);
  void StartLoad(const storage::ModelVersion& v, const runtime::CacheEntry& entry, bool built_now);
  void Publish(const storage::ModelVersion& v, ServeState state, std::string message,
               std::shared_ptr<runtime::LoadedModel> model = nullptr);
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
  bool stopping_ = false;
  // name:version of work in flight (building or loading).
  std::set<std::string> in_flight_;
  // name:version whose build or load failed: not retried on every reconcile.
  std::set<std::string> failed_;
  bool startup_pass_done_ = false;
};

}  // namespace aotid::daemon
