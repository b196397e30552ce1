// Loading a cached build for serving, as the control plane sees it: a
// request goes out, a result comes back later on the loop thread. Loads
// take from milliseconds to seconds (dlopen, weights, timing the threads),
// so the real loader runs them on libuv's thread pool and the loop stays
// free; tests use a fake that answers when they say.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "runtime/build_cache.h"
#include "runtime/loaded_model.h"

namespace aotid::control {

struct LoadRequest {
  runtime::CacheEntry entry;
  runtime::LoadOptions options;  // device, runners, threads per run
  // threads = 0 (auto) on the CPU: time the model with 1 and with
  // options.threads threads at this batch and keep the faster
  // (runtime/thread_choice.h). 0: keep options.threads.
  int64_t choose_threads_at_batch = 0;
};

struct LoadResult {
  StatusOr<std::shared_ptr<runtime::LoadedModel>> model{Internal("not loaded")};
  int threads = 0;           // threads per run it serves with
  std::string threads_note;  // how auto threads were chosen; empty when they were not
};

class ModelLoader {
 public:
  virtual ~ModelLoader() = default;
  // Starts a load; `done` runs once, on the loop thread, with its result.
  virtual void Load(LoadRequest request, std::function<void(LoadResult)> done) = 0;
};

// The real one: runtime::LoadCompiledModel (and the thread choice) on
// libuv's thread pool, one load at a time in the pool's order.
// Each load is bracketed with the cache's load marker (BuildCache::BeginLoad),
// so a build that crashes the process while loading is known at the next
// start instead of crashing it again.
class ThreadPoolLoader final : public ModelLoader {
 public:
  ThreadPoolLoader(uv_loop_t* loop, const runtime::BuildCache* cache) : loop_(loop), cache_(cache) {}
  void Load(LoadRequest request, std::function<void(LoadResult)> done) override;

 private:
  uv_loop_t* loop_;
  const runtime::BuildCache* cache_;
};

}  // namespace aotid::control
