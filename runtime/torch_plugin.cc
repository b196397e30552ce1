#include "runtime/torch_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "base/fs.h"
#include "platform/install_layout.h"

namespace aotid::runtime {
namespace {

std::atomic<bool> g_loaded{false};
std::string g_path;  // set once, before g_loaded

StatusOr<LoadCompiledModelFn> Resolve() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("AOTID_TORCH_PLUGIN"); env && *env) {
    candidates.push_back(env);
  } else {
    candidates = platform::PluginCandidates();
  }
  std::string tried;
  for (const auto& path : candidates) {
    if (!fs::Exists(path)) {
      tried += "\n  " + path + ": no such file";
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      tried += "\n  " + path + ": " + ::dlerror();
      continue;
    }
    auto fn = reinterpret_cast<LoadCompiledModelFn>(::dlsym(handle, kTorchPluginEntry));
    if (fn == nullptr) {
      tried += "\n  " + path + ": no " + kTorchPluginEntry + " (a plugin from another aotid version?)";
      continue;  // never unloaded: its code may be running
    }
    g_path = path;
    g_loaded = true;
    return fn;
  }
  return FailedPrecondition("cannot load the torch runtime plugin " + std::string(AOTID_TORCH_PLUGIN_NAME) +
                            "; tried:" + tried);
}

}  // namespace

bool TorchPluginLoaded() { return g_loaded.load(); }

int ThreadsPerRunner(int threads_setting, int num_runners, int cores) {
  if (threads_setting > 0) return threads_setting;
  return std::max(1, cores / std::max(1, num_runners));
}

namespace {
const StatusOr<LoadCompiledModelFn>& Plugin() {
  static std::once_flag once;
  static StatusOr<LoadCompiledModelFn> fn = Status(StatusCode::kInternal, "not resolved");
  std::call_once(once, [] { fn = Resolve(); });
  return fn;
}
}  // namespace

StatusOr<std::string> LoadTorchPlugin() {
  if (!Plugin().ok()) return Plugin().status();
  return g_path;
}

StatusOr<std::unique_ptr<model::LoadedModel>> LoadCompiledModel(const model::CacheEntry& entry,
                                                                const LoadOptions& options) {
  const auto& fn = Plugin();
  if (!fn.ok()) return fn.status();
  return (*fn)(entry, options);
}

}  // namespace aotid::runtime
