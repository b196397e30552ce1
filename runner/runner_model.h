// A model version served by a runner process: the daemon's side.
//
// RunnerModel is a LoadedModel whose runs happen in a child process
// (`aotid internal-runner`, runner/runner_main.h), so a kernel that aborts,
// a package that segfaults or a run that never ends costs that version a
// restart, never the daemon or another model. Tensors cross through
// shared memory (runner/channel.h): one slot per run in flight, so the
// version's runners (num_runners) are that many slots served by one
// process, sharing one copy of the weights.
//
// Supervision. A thread per version watches its runner (a pidfd) and reads
// its stderr into the daemon's log. When the runner dies:
//  - every run it held fails with Internal naming the cause (the signal or
//    exit status and the error it printed last, e.g. a kernel's "index out
//    of bounds: 0 <= tmp2 < 30522");
//  - on_event gets kCrashed, and a new runner is started at once (after a
//    doubling wait when crashes repeat); runs that arrive meanwhile wait
//    for it;
//  - after max_crashes crashes within crash_window_ms it is not started
//    again: on_event gets kFailed and every run answers Unavailable with
//    the reason.
// Inputs that crash it. The runs a runner held when it crashed are
// remembered by a keyed hash of their inputs (dtype, shape and bytes); an
// input that was in flight at kCrashesToRefuse crashes is refused from then
// on (InvalidArgument naming the crash) without being sent. So one client
// repeating an input that crashes a kernel every time (an index out of
// bounds) costs the version two restarts, never the max_crashes that take
// it down for everyone. Kills the daemon makes (a deadline) do not count.
// A run that takes longer than run_timeout_ms answers DeadlineExceeded;
// its runner is killed (the runs it held fail) and replaced the same way.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "model/cache_entry.h"
#include "model/loaded_model.h"
#include "runner/channel.h"
#include "runtime/torch_plugin.h"

namespace aotid::runner {

struct RunnerEvent {
  enum class Kind {
    kCrashed,  // it died (or was killed past its deadline) and is being restarted
    kFailed,   // it crashed too often and is not restarted
  };
  Kind kind = Kind::kCrashed;
  std::string message;
};

struct RunnerOptions {
  std::string self_exe;                 // the aotid binary, run as `internal-runner`
  std::string label = "model";          // "demo:1", for logs and messages
  runtime::LoadOptions load;            // device, num_runners (slots), threads
  int64_t choose_threads_at_batch = 0;  // see control::LoadRequest
  int64_t run_timeout_ms = 0;           // 0: no limit
  int64_t start_timeout_ms = 300'000;   // loading the model, in the runner
  uint64_t memory_limit_bytes = 0;      // 0: none
  std::string scratch_root;             // each runner gets a fresh directory beneath it
  int max_crashes = 5;
  int64_t crash_window_ms = 60'000;
  // Called on the supervisor thread; must not call back into the model.
  std::function<void(const RunnerEvent&)> on_event;
};

class RunnerModel final : public model::LoadedModel {
 public:
  // Starts the runner and waits until it has loaded the model (or failed
  // to: its message, e.g. a load error from torch).
  static StatusOr<std::unique_ptr<RunnerModel>> Start(const model::CacheEntry& entry, RunnerOptions options);
  ~RunnerModel() override;
  RunnerModel(const RunnerModel&) = delete;
  RunnerModel& operator=(const RunnerModel&) = delete;

  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return options_.load.device; }
  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>& inputs,
                                                 const model::RunContext& ctx) override;

  // Threads per run, as the runner chose them, and how ("" when not chosen).
  int threads() const { return threads_; }
  const std::string& threads_note() const { return threads_note_; }
  // Chosen by a timing on a quiet machine: worth recording with the build.
  bool threads_settled() const { return threads_settled_; }
  // The runner's process id now; 0 while none runs.
  pid_t pid() const { return pid_.load(); }
  // Runners started after the first.
  int restarts() const { return restarts_.load(); }
  // A new runner starts with the model's buffers as the build made them.
  int64_t state_epoch() const override { return restarts_.load(); }

  // Crashes an input must have been in flight for before it is refused: two,
  // so that one crash that had nothing to do with it (a kill by another
  // hand, a neighbour's input in the same runner) refuses nobody.
  static constexpr int kCrashesToRefuse = 2;
  // Inputs remembered, the oldest forgotten first.
  static constexpr size_t kMaxSuspects = 256;

 private:
  struct Process {
    pid_t pid = -1;
    int pidfd = -1;   // -1 where the kernel has none: polled instead
    int err_fd = -1;  // its stdout and stderr
    std::string scratch;
    int threads = 0;  // as its reply said
    std::string threads_note;
    bool threads_settled = false;
  };

  RunnerModel(const model::CacheEntry& entry, RunnerOptions options);
  // Starts a runner process and waits for its reply.
  StatusOr<Process> Spawn(int threads, int64_t choose_threads_at_batch);
  void Supervise();
  // Reads what the runner wrote; false at its end.
  bool DrainErr(int fd);
  // What the runner said last that names its failure.
  std::string LastError() const;
  // The process ended with wait status `status` (reaped): fail its runs,
  // and restart it or give up.
  void Died(int status);
  // Waits for the process (unless already reaped: pid -1) and closes what
  // was its.
  void Reap(Process* p, int* status);
  Status DeadRun(uint64_t generation);
  // For a start that failed for want of memory: the limit it had, and where
  // it is set; "" otherwise.
  std::string MemoryNote(const std::string& failure) const;
  void KillForDeadline(uint64_t generation);
  // The crashes `fingerprint` was in flight for, and the last one's cause.
  struct Suspect {
    int crashes = 0;
    std::string cause;
  };
  void SuspectLocked(uint64_t fingerprint, const std::string& cause) REQUIRES(mu_);
  uint64_t Fingerprint(const std::vector<model::HostTensor>& inputs) const;
  // Waits up to `ms` unless the model is being destroyed; false when it is.
  bool Pause(int64_t ms);

  const model::ModelSpec spec_;
  const std::string entry_dir_;
  const RunnerOptions options_;
  std::vector<Slot> slots_;  // fixed after Start
  int threads_ = 0;
  std::string threads_note_;
  bool threads_settled_ = false;
  int stop_fd_[2] = {-1, -1};  // written once at destruction
  std::thread supervisor_;
  std::atomic<pid_t> pid_{0};
  std::atomic<int> restarts_{0};

  // The supervisor thread's own.
  Process proc_;
  std::string err_tail_;  // the last few KiB the runner wrote
  std::string err_line_;  // a line not yet ended
  int logged_lines_ = 0;  // of its output, since the last crash
  std::deque<int64_t> crashes_ms_;

  Mutex mu_;
  CondVar changed_;
  std::vector<int> free_ GUARDED_BY(mu_);
  bool up_ GUARDED_BY(mu_) = false;
  bool failed_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  std::string down_cause_ GUARDED_BY(mu_);  // why the last runner ended
  std::string kill_cause_ GUARDED_BY(mu_);  // set when the daemon kills it
  // Why each of the last few runners ended, by generation: a run learns
  // the cause of the runner it was sent to even once the next one is up
  // and down_cause_ is cleared.
  std::deque<std::pair<uint64_t, std::string>> ended_ GUARDED_BY(mu_);
  const uint64_t hash_key_;                        // per model, so no one can aim a collision
  std::vector<uint64_t> running_ GUARDED_BY(mu_);  // by slot: its run's fingerprint, 0 when idle
  std::unordered_map<uint64_t, Suspect> suspects_ GUARDED_BY(mu_);
  std::deque<uint64_t> suspect_order_ GUARDED_BY(mu_);  // oldest first
};

}  // namespace aotid::runner
