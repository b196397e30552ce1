// `aotid doctor`: what this machine is, and whether everything a build and
// the daemon need is in place. Each check prints OK, or FAIL with what to do.
#pragma once

#include "daemon/config.h"

namespace aotid::daemon {

// Prints the report to stdout; returns 0 when every check passed, else 1.
int RunDoctor(const Config& config);

}  // namespace aotid::daemon
