// `aotid serve`: the daemon. One libuv loop thread owns the control plane
// (store, builds, reconcile, signals); the HTTP server's workers own the data plane.
#pragma once

#include <functional>
#include <string>

#include "daemon/config.h"

namespace aotid::daemon {

// Runs until SIGTERM or SIGINT. Returns the process exit code: 0 after a
// clean shutdown, 1 when the daemon cannot start (the reason is logged).
// At SIGHUP `reload` reads the configuration again (file and flags): the
// log settings take effect at once; other changes are named in the log as
// waiting for a restart; a configuration that does not load is refused and
// the running one kept.
//
// With `single` set (single-model mode, daemon/model_dir.h) it serves the
// package found at single.model_dir as single.model_name, alone: adopted
// into the store at start, kept loaded, and /v2/health/ready waits until
// it is loaded.
struct SingleModel {
  std::string model_dir;  // a .pt2 file, or a folder holding one
  std::string model_name;
};
int Serve(const Config& config, std::function<StatusOr<Config>()> reload = nullptr,
          const SingleModel& single = {});

}  // namespace aotid::daemon
