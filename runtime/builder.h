// Runs builds as child processes on a libuv loop: the Python compile worker
// for exported programs, with a time limit, a concurrency limit and the
// worker's output captured in the entry's build.log.
//
// All methods run on the loop thread, and completion callbacks run there too.
#pragma once

#include <uv.h>

#include <deque>
#include <functional>
#include <string>

#include "base/status.h"
#include "runtime/build_cache.h"

namespace aotid::runtime {

struct BuilderOptions {
  std::string python;         // interpreter with the pinned torch
  std::string worker_dir;     // put on PYTHONPATH; holds aotid_worker/
  std::string torch_version;  // the worker must match it
  std::string scratch_dir;    // inductor's own cache (TORCHINDUCTOR_CACHE_DIR)
  int jobs = 1;               // builds at once
  int timeout_s = 1800;       // a build running longer is killed
};

struct BuildResult {
  Status status;      // ok, or why the build failed with the log's last lines
  bool permanent = false;  // the artifact cannot be built; a retry will not help
  CacheEntry entry;   // when ok
  int64_t duration_ms = 0;
};

struct BuildJob {
  BuildKey key;
  std::string artifact_path;
  std::function<void()> on_start;  // when the child process starts
  std::function<void(const BuildResult&)> on_done;
};

class Builder {
 public:
  Builder(uv_loop_t* loop, const BuildCache* cache, BuilderOptions options);
  ~Builder();
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  // Queues a build; it starts when fewer than `jobs` are running.
  void Submit(BuildJob job);
  int running() const { return running_; }
  size_t queued() const { return queue_.size(); }
  // Kills running builds (their callbacks still run, with an error) and
  // drops queued ones.
  void Shutdown();

 private:
  struct Running;
  void StartNext();
  void Start(BuildJob job);
  void Finish(Running* r, int64_t exit_status, int term_signal);

  uv_loop_t* loop_;
  const BuildCache* cache_;
  BuilderOptions options_;
  std::deque<BuildJob> queue_;
  int running_ = 0;
  bool shut_down_ = false;
  std::vector<Running*> live_;
};

}  // namespace aotid::runtime
