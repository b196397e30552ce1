// Loads, in the benchmark's own process, the cached build the daemon serves
// for a model's latest version on this machine, as the daemon does.
#pragma once

#include <memory>
#include <string>

#include "runtime/build_cache.h"
#include "runtime/hardware.h"
#include "runtime/loaded_model.h"
#include "storage/model_store.h"

namespace aotid::bench {

inline StatusOr<std::unique_ptr<runtime::LoadedModel>> LoadCachedModel(const std::string& store_dir,
                                                                        const std::string& model, int runners = 1) {
  ASSIGN_OR_RETURN(auto store, storage::ModelStore::Open(store_dir, false));
  ASSIGN_OR_RETURN(storage::ModelInfo info, store->GetModel(model));
  if (info.versions.empty()) return NotFound("model " + model + " has no versions");
  const auto& mv = info.versions.back();
  runtime::BuildCache cache(store->CacheDir());
  std::string fp = runtime::Fingerprint(runtime::ProbeHardware());
  ASSIGN_OR_RETURN(runtime::CacheEntry entry,
                   cache.Lookup({mv.artifact, mv.package_model, "cpu", fp, mv.settings.inductor_options}));
  runtime::LoadOptions opts;
  opts.num_runners = runners;
  opts.threads = runtime::ThreadsPerRunner(mv.settings.threads, runners, runtime::ProbeHardware().cores);
  return runtime::LoadCompiledModel(entry, opts);
}

}  // namespace aotid::bench
