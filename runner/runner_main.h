// The runner process, `aotid internal-runner ...`: runs one loaded model
// version for the daemon (runner/runner_model.h starts and supervises it).
// Its command line, file descriptors and start-up reply are defined here
// once, for both sides.
//
// File descriptors it is started with:
//   0        /dev/null
//   1, 2     a pipe the daemon reads (its log; the last lines name a crash)
//   3        the start-up reply, one line, then closed:
//              "ready <threads> <settled> <how threads were chosen>\n"
//              (settled: 1 when a timing on a quiet machine chose them,
//              runtime/thread_choice.h; the note is "-" when not chosen)
//              "error <StatusCode number> <message>\n"
//   4 ..     one shared-memory slot per run that may be in flight
//            (runner/channel.h), `--slots` of them
// Nothing else stays open.
//
// Start-up order: limits and no new privileges, then libtorch (the plugin),
// then the sandbox (runner/sandbox.h), and only then the package's
// model.so, so code from a package never runs outside the sandbox.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace aotid::runner {

inline constexpr char kRunnerCommand[] = "internal-runner";
inline constexpr int kReadyFd = 3;
inline constexpr int kFirstSlotFd = 4;

struct RunnerArgs {
  std::string label = "model";  // "demo:1": for `ps` and its log
  std::string entry_dir;        // the build's cache entry (model.so, spec.json)
  std::string device = "cpu";
  int slots = 1;                        // runs at once (the version's num_runners)
  int threads = 0;                      // OpenMP threads per run; 0 leaves torch's default
  int64_t choose_threads_at_batch = 0;  // > 0: time 1 vs `threads` threads at this batch
  uint64_t memory_limit_bytes = 0;      // 0: none
  std::string scratch;                  // the one directory it may write
  int parent_pid = 0;
};

std::vector<std::string> RunnerArgv(const std::string& self_exe, const RunnerArgs& args);
// Parses what follows the subcommand; InvalidArgument naming the flag.
StatusOr<RunnerArgs> ParseRunnerArgs(const std::vector<std::string>& args);
// Runs the runner in this process; returns its exit code (it returns only
// when it cannot start).
int RunRunner(const RunnerArgs& args);

}  // namespace aotid::runner
