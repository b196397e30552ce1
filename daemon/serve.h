// `aotid serve`: the daemon. One libuv loop thread owns the control plane
// (store, builds, reconcile, signals); the HTTP server's workers own the data plane.
#pragma once

#include "daemon/config.h"

namespace aotid::daemon {

// Runs until SIGTERM or SIGINT. Returns the process exit code: 0 after a
// clean shutdown, 1 when the daemon cannot start (the reason is logged).
int Serve(const Config& config);

}  // namespace aotid::daemon
