// Runs the real aotid binary for black-box tests.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace aotid::testing {

struct RunOptions {
  std::vector<std::string> env;  // NAME=VALUE, replacing or adding to this process's environment
  // Drop the capabilities through which root ignores file modes, so that a
  // read-only directory is read-only even when the tests run as root.
  bool obey_file_modes = false;
  // Without CAP_SYS_ADMIN, as any user but root runs it (the tests run as
  // root): what the kernel then refuses shows.
  bool without_sys_admin = false;
  // Socket activation: this listening socket is passed as fd 3, with
  // LISTEN_FDS=1 and LISTEN_PID the child's pid, as systemd passes one.
  int listen_fd = -1;
  // Run as this user (uid and gid alike, no supplementary groups) when >= 0.
  int uid = -1;
};

// Runs `aotid ARGS...` to completion; returns its exit code (128 + signal
// when killed by one) and its output (stdout and stderr together).
int RunAotid(const std::vector<std::string>& args, std::string* output = nullptr);
int RunAotid(const std::vector<std::string>& args, const RunOptions& opts, std::string* output = nullptr);

// The cells of `aotid ls`'s row for `name` (first column), keyed by the
// header's column names; empty when no row names it. The table's columns
// are cut where the header's words start, so padding and added columns do
// not matter to a test that asks for the ones it means.
std::map<std::string, std::string> LsRow(const std::string& ls_output, const std::string& name);

// Starts `aotid ARGS...` with stdout and stderr appended to `out_path`.
StatusOr<pid_t> SpawnAotid(const std::vector<std::string>& args, const std::string& out_path,
                           const RunOptions& opts = {});
// Waits for a spawned process; its exit code as RunAotid reports it.
int WaitExit(pid_t pid);
// The same, but kills it (SIGKILL) after `timeout_s`: then 137.
int WaitExitFor(pid_t pid, int timeout_s);

// `aotid serve` on 127.0.0.1 with a port the kernel picks.
class DaemonProcess {
 public:
  // Starts the daemon with `args` after "serve" and waits (bounded) for the
  // "serving on" line that carries the port.
  static StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::vector<std::string>& args,
                                                        const std::string& log_path, const RunOptions& opts = {});
  ~DaemonProcess();

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string Log() const;
  bool Alive();
  // SIGTERM, then waits up to `grace_s` before SIGKILL. Returns the exit code
  // (128 + signal when killed by one).
  int Stop(int grace_s = 30);
  // SIGKILL at once (a crash); returns 137.
  int Kill();

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
  int exit_code_ = -1;
};

}  // namespace aotid::testing
