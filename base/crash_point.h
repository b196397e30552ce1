// Crash and pause points for tests. Crash points test crash safety. When the environment variable
// AOTID_TEST_CRASH_AT names a point, the process kills itself with SIGKILL
// on reaching it: no destructors, no flushes, no rollback, as after kill -9
// or a power cut. Unset (always, outside tests), a point costs one cached
// string compare.
#pragma once

#include <string_view>

namespace aotid {

void CrashPoint(std::string_view name);

// Pause points, for tests that need a step to be slow (a model run that
// keeps requests queued): when AOTID_TEST_PAUSE_AT is NAME=MS, reaching the
// point NAME sleeps MS milliseconds. Unset, it costs what a crash point does.
void PausePoint(std::string_view name);

}  // namespace aotid
