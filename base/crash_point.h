// Crash points for tests of crash safety. When the environment variable
// AOTID_TEST_CRASH_AT names a point, the process kills itself with SIGKILL
// on reaching it: no destructors, no flushes, no rollback, as after kill -9
// or a power cut. Unset (always, outside tests), a point costs one cached
// string compare.
#pragma once

#include <string_view>

namespace aotid {

void CrashPoint(std::string_view name);

}  // namespace aotid
