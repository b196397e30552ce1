// `aotid serve`: the daemon. One libuv loop thread owns the control plane
// (store, builds, reconcile, signals); the HTTP server's workers own the data plane.
#pragma once

#include <functional>

#include "daemon/config.h"

namespace aotid::daemon {

// Runs until SIGTERM or SIGINT. Returns the process exit code: 0 after a
// clean shutdown, 1 when the daemon cannot start (the reason is logged).
// At SIGHUP `reload` reads the configuration again (file and flags): the
// log settings take effect at once; other changes are named in the log as
// waiting for a restart; a configuration that does not load is refused and
// the running one kept.
int Serve(const Config& config, std::function<StatusOr<Config>()> reload = nullptr);

}  // namespace aotid::daemon
