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

#include "base/mutex.h"
#include "base/status.h"
#include "compile/build_cache.h"
#include "model/loaded_model.h"
#include "runner/runner_model.h"
#include "serving/embeddings.h"
#include "serving/generate.h"

namespace aotid::control {

struct LoadRequest {
  model::CacheEntry entry;
  runtime::LoadOptions options;  // device, runners, threads per run
  // threads = 0 (auto) on the CPU: time the model with 1 and with
  // options.threads threads at this batch and keep the faster
  // (runtime/thread_choice.h). 0: keep options.threads.
  int64_t choose_threads_at_batch = 0;
  // What such a timing depends on besides the build (the machine, the most
  // threads, the batch). A choice recorded in the build's entry under this
  // key is used without timing; a settled new one is recorded under it.
  std::string threads_key;
  // The runner process it runs in (runner/runner_model.h).
  std::string label;  // "demo:1"
  // A language model's sequences at once (VersionSettings::max_sequences;
  // 0: as many as its cache holds).
  int64_t max_sequences = 0;
  int64_t run_timeout_ms = 0;  // 0: none
  uint64_t memory_limit_bytes = 0;
  int max_crashes = 5;
  int64_t crash_window_ms = 60'000;
  // Reads the generate and embed specs and checks them, starting no
  // runner: a version that is ready to serve but not resident (it loads on
  // its first request). LoadResult::model is then an OK nullptr.
  bool prepare_only = false;
  // What happens to the runner later (crashes, giving up); called on the
  // loop thread, for as long as the model is loaded.
  std::function<void(const runner::RunnerEvent&)> on_runner_event;
};

struct LoadResult {
  // Corruption: the build's files are damaged (rebuild it).
  StatusOr<std::shared_ptr<model::LoadedModel>> model{Internal("not loaded")};
  int threads = 0;           // threads per run it serves with
  std::string threads_note;  // how auto threads were chosen; empty when they were not
  // The choice is recorded in the build's entry (read from it, or written
  // now): removing the record asks for a new timing.
  bool threads_recorded = false;
  // A language model's token loop (its build has a generate spec).
  std::shared_ptr<const serving::Generator> generator;
  // An embedding model's spec and tokenizer (its build has an embed spec).
  std::shared_ptr<const serving::EmbedSpec> embed;
  // The runner's process id now (0 while none runs, as during a restart):
  // what its memory is measured by.
  std::function<int()> runner_pid;
};

class ModelLoader {
 public:
  virtual ~ModelLoader() = default;
  // Starts a load; `done` runs once, on the loop thread, with its result.
  virtual void Load(LoadRequest request, std::function<void(LoadResult)> done) = 0;
};

struct RunnerPlace {
  std::string self_exe;      // the aotid binary, run as `internal-runner`
  std::string scratch_root;  // runners' scratch directories go here
};

// The real one: starts the version's runner process (runner::RunnerModel,
// which loads the build and chooses its threads) on libuv's thread pool,
// so the loop never waits for a load. Loads that hang (a runner stopped
// mid-load, a package that never finishes loading) each hold a pool
// thread until the runner's start time limit; `aotid serve` makes the pool
// kThreadPoolSize threads so that a few of them do not hold up the rest. Each load is bracketed with the
// cache's load marker (BuildCache::BeginLoad) as well: a build whose load
// kills its runner is then known as such at the next start too.
class ThreadPoolLoader final : public ModelLoader {
 public:
  static constexpr int kThreadPoolSize = 32;
  ThreadPoolLoader(uv_loop_t* loop, const compile::BuildCache* cache, RunnerPlace place);
  ~ThreadPoolLoader() override;
  void Load(LoadRequest request, std::function<void(LoadResult)> done) override;
  // Stops passing runner events to the loop (they are dropped from now
  // on) and lets the loop end. On the loop thread.
  void Close();

  // Runner events from their supervisor threads, handed to the loop thread.
  struct Inbox;

 private:
  uv_loop_t* loop_;
  const compile::BuildCache* cache_;
  RunnerPlace place_;
  std::shared_ptr<Inbox> inbox_;
};

}  // namespace aotid::control
