// Runs builds as child processes on a libuv loop, with a time limit, a
// concurrency limit and the child's output captured in the entry's
// build.log: the Python compile worker for exported programs, and aotid
// itself (`aotid internal-build`, no Python) for AOTInductor packages, so a
// package that crashes when run kills a child, never the daemon.
//
// All methods run on the loop thread, and completion callbacks run there too.
#pragma once

#include <uv.h>

#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "base/status.h"
#include "compile/build_cache.h"
#include "package/package.h"

namespace aotid::compile {

struct BuilderOptions {
  std::string python;         // interpreter with the pinned torch
  std::string worker_dir;     // put on PYTHONPATH; holds aotid_worker/
  std::string torch_version;  // the worker must match it
  int jobs = 1;               // builds at once
  int timeout_s = 1800;       // a build running longer is killed
  // This aotid: it runs builds of packages (`internal-build`) and starts
  // the compile worker confined (`internal-confine`). Empty: the worker
  // runs unconfined, for tests of the Builder's own logic with a stand-in.
  std::string self_exe;
  std::string cxx = "c++";  // compiler for source packages
};

struct BuildResult {
  Status status;            // ok, or why the build failed with the log's last lines
  bool permanent = false;   // the artifact cannot be built; a retry will not help
  bool cancelled = false;   // Cancel() or Shutdown() stopped it (status is Cancelled)
  model::CacheEntry entry;  // when ok
  int64_t duration_ms = 0;
  // Ok without building here: another daemon sharing the cache built the
  // key (this one waited for it rather than compile it twice).
  bool built_elsewhere = false;
};

struct BuildJob {
  BuildKey key;
  std::string artifact_path;
  package::PackageKind kind = package::PackageKind::kExportedProgram;
  int64_t estimate_ms = 0;         // how long it may take (past builds here); 0: no idea
  std::function<void()> on_start;  // when the child process starts
  std::function<void(const BuildResult&)> on_done;
};

// What the control plane needs of builds: start one, stop one, ask how far
// it got. Builder is the real one; tests use a fake that finishes builds
// when they say. Called on the loop thread; callbacks run there too.
class BuildRunner {
 public:
  virtual ~BuildRunner() = default;
  // Queues a build. job.on_start runs when it starts, job.on_done exactly
  // once when it ends (ok, failed, or cancelled).
  virtual void Submit(BuildJob job) = 0;
  // Stops the build of `key`, queued or running; its on_done runs with
  // `cancelled` set. False when there is no such build.
  virtual bool Cancel(const BuildKey& key) = 0;
  // The last step a running build of `key` reported ("step 3/4: compiling
  // for cpu ..."), with its elapsed time; empty when it is not running.
  virtual std::string Progress(const BuildKey& key) const = 0;
};

// Kills (SIGKILL) the processes whose command line names a path under
// `dir` or whose working directory is in it: at start, what is left of the
// builds of a daemon that was killed (a compiler the build child started
// outlives it; PDEATHSIG reaches only the child). Returns how many. Linux;
// elsewhere 0.
int KillLeftoverBuilds(const std::string& dir);

// Among daemons sharing a cache (build.cache_dir), a key is built by one at
// a time (BuildCache::LockBuild): a build whose key another is building
// waits, on a timer, until that one ends, then takes its entry when sound
// (BuildCache::LookupSound; built_elsewhere), or builds when it left none.
// A sound entry found when a build starts is taken the same way.
class Builder final : public BuildRunner {
 public:
  Builder(uv_loop_t* loop, const BuildCache* cache, BuilderOptions options);
  ~Builder() override;
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  // Starts when fewer than `jobs` are running.
  void Submit(BuildJob job) override;
  int running() const { return running_; }
  size_t queued() const { return queue_.size(); }
  // Builds waiting for another daemon's build of their key.
  size_t waiting() const { return waiting_.size(); }
  // How often a waiting build looks again (tests shorten it).
  void set_wait_poll_ms(uint64_t ms) { wait_poll_ms_ = ms; }
  bool Cancel(const BuildKey& key) override;
  std::string Progress(const BuildKey& key) const override;
  // Kills running builds and ends queued ones, all as cancelled (their
  // callbacks run with `cancelled` set: the queued ones' at once, the
  // running ones' when they exit). Nothing starts after it.
  void Shutdown();

  // A reload's build.jobs and build.timeout_s: for builds started from now
  // on (more jobs start queued builds at once). Loop thread.
  void SetLimits(int jobs, int timeout_s);

 private:
  struct Running;
  struct Waiting {
    BuildJob job;
    int64_t since_ms = 0;
  };
  void StartNext();
  void Start(BuildJob job);
  // Parks a job whose key another process is building; LookAgain() polls.
  void Wait(BuildJob job);
  void LookAgain();
  void Finish(Running* r, int64_t exit_status, int term_signal);
  std::vector<std::string> Command(const BuildJob& job, const std::string& staging) const;

  uv_loop_t* loop_;
  const BuildCache* cache_;
  BuilderOptions options_;
  std::deque<BuildJob> queue_;
  int running_ = 0;
  bool shut_down_ = false;
  std::vector<Running*> live_;
  std::vector<Waiting> waiting_;
  std::set<std::string> no_wait_;             // keys that waited past timeout_s: built without the lock
  std::map<std::string, std::string> taken_;  // key -> the manifest of the entry taken as built elsewhere
  uv_timer_t* wait_timer_ = nullptr;
  uint64_t wait_poll_ms_ = 1000;
};

}  // namespace aotid::compile
