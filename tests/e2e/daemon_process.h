// Runs the real aotid binary for black-box tests.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace aotid::testing {

// Runs `aotid ARGS...` to completion; returns its exit code and output.
int RunAotid(const std::vector<std::string>& args, std::string* output = nullptr);

// `aotid serve` on 127.0.0.1 with a port the kernel picks.
class DaemonProcess {
 public:
  // Starts the daemon with `args` after "serve" and waits (bounded) for the
  // "serving on" line that carries the port.
  static StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::vector<std::string>& args,
                                                        const std::string& log_path);
  ~DaemonProcess();

  int port() const { return port_; }
  std::string Log() const;
  bool Alive();
  // SIGTERM, then waits up to `grace_s` before SIGKILL. Returns the exit code
  // (128 + signal when killed by one).
  int Stop(int grace_s = 30);

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
  int exit_code_ = -1;
};

}  // namespace aotid::testing
