// The torch runtime lives in a plugin, libaotid_torch.so, loaded the first
// time a model is loaded. Commands that never load a model (add, ls, show,
// set, rm, gc, events) then never pay libtorch's start-up, which is most of
// a CLI command's time (about 0.2 s of static initialisation).
//
// The plugin is found, in order: $AOTID_TORCH_PLUGIN alone when set; else
// in ../lib/aotid/ from the running executable (an install), beside it, and
// at the top of the build tree it lies in (platform/install_layout.h).
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "model/cache_entry.h"
#include "model/loaded_model.h"

namespace aotid::runtime {

struct LoadOptions {
  std::string device = "cpu";  // the AOTInductor runner: cpu, cuda, mps
  int num_runners = 1;         // model instances that run at once
  int threads = 0;             // OpenMP threads per run; 0 leaves torch's default
};

// Threads per run for a version: its own setting, else the cores shared
// among its runners (at least one each), so runners x threads fits the
// machine instead of every runner spinning a thread per core.
int ThreadsPerRunner(int threads_setting, int num_runners, int cores);

// Loads a cache entry's model.so in place (no copy, no extraction) through
// the runner for its device. Errors name the file and carry torch's message
// without its backtrace.
StatusOr<std::unique_ptr<model::LoadedModel>> LoadCompiledModel(const model::CacheEntry& entry,
                                                                const LoadOptions& options);

// The plugin's one entry point. Bump the name when its signature changes.
using LoadCompiledModelFn = StatusOr<std::unique_ptr<model::LoadedModel>> (*)(const model::CacheEntry&,
                                                                              const LoadOptions&);
inline constexpr char kTorchPluginEntry[] = "aotid_torch_load_v2";

// Whether the plugin is loaded in this process (for tests and `doctor`).
bool TorchPluginLoaded();

// Loads the plugin now if it is not loaded yet; its path, or why it cannot
// be loaded (every place tried). Costs libtorch's start-up the first time.
StatusOr<std::string> LoadTorchPlugin();

}  // namespace aotid::runtime
