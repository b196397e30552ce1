// Loads the cached build the daemon serves for a model's latest version on
// this machine: in the benchmark's own process, or in a runner process
// (`aotid internal-runner`) started as the daemon's loader starts it.
#pragma once

#include <memory>
#include <string>

#include "base/fs.h"
#include "compile/build_cache.h"
#include "model/loaded_model.h"
#include "platform/hardware.h"
#include "runner/runner_model.h"
#include "runtime/thread_choice.h"
#include "storage/model_store.h"

namespace aotid::bench {

// The cache entry of a model's newest version on this machine, with the
// options the daemon would load it with.
struct CachedBuild {
  std::string cache_root;
  model::CacheEntry entry;
  runtime::LoadOptions options;
  bool auto_threads = false;  // the version's threads setting is 0
  int64_t batch = 1;          // the batch its threads are timed at
};

inline StatusOr<CachedBuild> FindCachedBuild(const std::string& store_dir, const std::string& model, int runners = 1) {
  ASSIGN_OR_RETURN(auto store, storage::ModelStore::Open(store_dir, false));
  ASSIGN_OR_RETURN(storage::ModelInfo info, store->GetModel(model));
  if (info.versions.empty()) return NotFound("model " + model + " has no versions");
  const auto& mv = info.versions.back();
  compile::BuildCache cache(store->CacheDir());
  platform::HardwareInfo hw = platform::ProbeHardware();
  CachedBuild b;
  b.cache_root = store->CacheDir();
  ASSIGN_OR_RETURN(
      b.entry,
      cache.Lookup({mv.artifact, mv.package_model, "cpu", platform::Fingerprint(hw),
                    mv.kind == package::PackageKind::kExportedProgram ? mv.settings.inductor_options : ""}));
  b.options.num_runners = runners;
  b.options.threads = runtime::ThreadsPerRunner(mv.settings.threads, runners, hw.cores);
  b.auto_threads = mv.settings.threads == 0;
  b.batch = mv.settings.max_batch_size > 1 ? mv.settings.max_batch_size : 1;
  return b;
}

inline StatusOr<std::unique_ptr<model::LoadedModel>> LoadCachedModel(const std::string& store_dir,
                                                                     const std::string& model,
                                                                     int runners = 1) {
  ASSIGN_OR_RETURN(CachedBuild b, FindCachedBuild(store_dir, model, runners));
  ASSIGN_OR_RETURN(auto loaded, runtime::LoadCompiledModel(b.entry, b.options));
  if (b.auto_threads && b.options.threads > 1) runtime::ChooseThreads(*loaded, b.options.threads, b.batch);
  return loaded;
}

// The aotid binary beside the benchmarks' folder (build/bench/../aotid):
// what runner processes run.
inline std::string DefaultAotid() {
  std::string self = fs::ExecutablePath();
  return self.substr(0, self.rfind('/')) + "/../aotid";
}

// The same build in a runner process, loaded with the options the daemon
// would use (threads timed in the runner when the setting is auto).
// `options` brings self_exe, scratch_root and the crash policy.
inline StatusOr<std::unique_ptr<runner::RunnerModel>> StartCachedRunner(const std::string& store_dir,
                                                                        const std::string& model,
                                                                        runner::RunnerOptions options,
                                                                        int runners = 1) {
  ASSIGN_OR_RETURN(CachedBuild b, FindCachedBuild(store_dir, model, runners));
  options.label = model;
  options.load = b.options;
  options.choose_threads_at_batch = b.auto_threads && b.options.threads > 1 ? b.batch : 0;
  return runner::RunnerModel::Start(b.entry, std::move(options));
}

}  // namespace aotid::bench
