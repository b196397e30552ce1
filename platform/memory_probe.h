// What memory the kernel says processes hold, how pressed it is for
// memory, and how much of it this process may use: what a memory budget for
// runner processes is measured against.
//
// Linux and macOS; on other systems ProcessMemoryBytes is Unavailable,
// ReadMemoryPressure is not known and ReadUsableMemory is physical memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace aotid::platform {

// Bytes process `pid` holds that count against the machine, as measured by
// the kernel: on Linux its proportional set size plus swapped-out proportional
// share (Pss + SwapPss from /proc/PID/smaps_rollup), so pages shared with other
// processes (libtorch's text, a page cache) are split among them and the sum
// over runners is what they cost together; where smaps_rollup is missing (kernels
// before 4.14) the resident set from /proc/PID/statm. On macOS the process's
// physical footprint (proc_pid_rusage, RUSAGE_INFO_V2 ri_phys_footprint), what
// Activity Monitor shows as Memory. NotFound when the process is gone (reaped;
// on Linux also a zombie, which holds no memory, though through statm a zombie
// reads 0); other errors name the file (reading another user's smaps_rollup
// takes ptrace rights: IOError, permission denied). Unavailable on other systems.
StatusOr<uint64_t> ProcessMemoryBytes(int pid);

enum class PressureLevel { kNormal = 0, kWarning = 1, kCritical = 2 };
struct MemoryPressure {
  bool known = false;  // false where the kernel does not say (no PSI, unreadable)
  PressureLevel level = PressureLevel::kNormal;
  double some_avg10 = 0;  // Linux PSI: % of the last 10 s some task stalled on memory
  double full_avg10 = 0;  // ... all non-idle tasks stalled
  std::string source;     // "/proc/pressure/memory", "kern.memorystatus_vm_pressure_level", or why unknown
};
// Linux: PSI (/proc/pressure/memory); level kWarning when some avg10 >= kPsiWarnPercent,
// kCritical when full avg10 >= kPsiCriticalPercent. macOS: sysctl
// kern.memorystatus_vm_pressure_level (1 normal, 2 warn, 4 critical). Elsewhere, or
// when unreadable: known = false and source says why.
inline constexpr double kPsiWarnPercent = 10.0;
inline constexpr double kPsiCriticalPercent = 5.0;
MemoryPressure ReadMemoryPressure();
// The PSI text of /proc/pressure/memory (two lines "some avg10=0.00 avg60=... total=..."
// and "full ..."); InvalidArgument naming what does not parse. The "some" line is
// required; a missing "full" line reads as 0. The result is known, with its level;
// its source is left empty (ReadMemoryPressure names the file). Exposed for tests.
StatusOr<MemoryPressure> ParsePsi(std::string_view text);

// How many processes the kernel's OOM killer has killed since boot (Linux:
// /proc/vmstat's oom_kill, which counts a cgroup's kills too); nullopt
// where the kernel does not say (macOS, kernels before 4.13). A runner that
// died of SIGKILL while it grew was killed for memory, not by a person.
std::optional<uint64_t> ReadOomKillCount();
// For tests: the oom_kill count of a /proc/vmstat text.
std::optional<uint64_t> ParseOomKills(std::string_view vmstat);

// The memory this process may use: the smaller of the machine's physical memory and
// the limit of its cgroup (v2: memory.max of the cgroup named in /proc/self/cgroup under
// /sys/fs/cgroup; v1: memory/memory.limit_in_bytes), with where it came from. The
// cgroup's ancestors up to the mount's root are read too (a parent's limit binds its
// children, and a container without a cgroup namespace sees its own cgroup at the
// root while /proc/self/cgroup names the host's path); the smallest limit wins.
struct UsableMemory {
  uint64_t bytes = 0;
  std::string source;  // "physical memory" or "cgroup limit (/sys/fs/cgroup/.../memory.max)"
};
UsableMemory ReadUsableMemory();
// For tests: the limit a cgroup v2 memory.max or v1 limit_in_bytes text says ("max" or a
// v1 "unlimited" huge number: nullopt). Text that is not a number is nullopt too: no
// limit that can be read.
std::optional<uint64_t> ParseCgroupLimit(std::string_view text);

}  // namespace aotid::platform
