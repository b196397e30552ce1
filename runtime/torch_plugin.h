// The torch runtime lives in a plugin, libaotid_torch.so, loaded the first
// time a model is loaded. Commands that never load a model (add, ls, show,
// set, rm, gc, events) then never pay libtorch's start-up, which is most of
// a CLI command's time (about 0.2 s of static initialisation).
//
// The plugin is found, in order: $AOTID_TORCH_PLUGIN alone when set; else
// in ../lib/aotid/ from the running executable (an install), beside it, and
// at the top of the build tree it lies in (runtime/install_layout.h).
#pragma once

#include <memory>

#include "base/status.h"
#include "runtime/loaded_model.h"

namespace aotid::runtime {

// The plugin's one entry point. Bump the name when its signature changes.
using LoadCompiledModelFn = StatusOr<std::unique_ptr<LoadedModel>> (*)(const CacheEntry&, const LoadOptions&);
inline constexpr char kTorchPluginEntry[] = "aotid_torch_load_v2";

// Whether the plugin is loaded in this process (for tests and `doctor`).
bool TorchPluginLoaded();

// Loads the plugin now if it is not loaded yet; its path, or why it cannot
// be loaded (every place tried). Costs libtorch's start-up the first time.
StatusOr<std::string> LoadTorchPlugin();

}  // namespace aotid::runtime
