// What is resident, as the control plane last saw it: for `aotid ps`
// (GET /v2/resident) and /metrics. Made on the loop thread
// (control/residency.h), read by HTTP threads as an immutable snapshot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace aotid::serving {

struct ResidentVersionReport {
  std::string name;
  int64_t version = 0;
  // "resident", "loading", "waiting for memory", "draining" (unloaded once
  // its requests end, to make room), "not resident".
  std::string state;
  int runners = 0;             // runner instances (num_runners) while resident
  uint64_t bytes = 0;          // its runner's memory measured now (PSS on Linux); 0 when not resident
  uint64_t size_bytes = 0;     // what it counts for in the budget when resident or loading
  bool size_measured = false;  // size_bytes was measured at a load (else an estimate from its files)
  int64_t idle_ms = -1;        // since its last request ended; -1 while one is in flight, or never used
  int64_t unload_in_ms = -1;   // when keep_alive unloads it; -1 when it will not (always, busy, not resident)
  int in_flight = 0;           // requests running or waiting for it
  std::string keep_alive;      // "5m", "0", "always"
  // Whether it can fit the budget at all beside what keep_alive `always`
  // holds: false answers every request 503 at once, so it is not ready.
  bool fits = true;
  std::string why_not;  // when it does not fit, why
  uint64_t loads = 0;   // loads since the daemon started
  uint64_t unloads = 0;
};

struct ResidencyReport {
  uint64_t budget_bytes = 0;    // 0: no budget
  std::string budget_source;    // how the budget was chosen
  uint64_t used_bytes = 0;      // what resident and loading versions count for against it
  uint64_t measured_bytes = 0;  // the runners' memory measured now, together
  std::string pressure;         // the kernel's memory pressure, in words
  std::vector<ResidentVersionReport> versions;
};

}  // namespace aotid::serving
