// One daemon per store, and what other commands can learn of it.
//
// <store>/daemon.lock is held (flock, exclusive) by the `aotid serve` that
// uses the store, and says "PID\nADDRESS\n": its process id, and where it
// serves once it listens. Any command can tell whether a daemon runs on the
// store (the lock is taken) and where it answers.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"

namespace aotid::daemon {

// Takes the store's lock for this process and writes its pid; the returned
// descriptor holds it until closed. FailedPrecondition when another daemon
// holds it.
StatusOr<int> LockStore(const std::string& store_dir);
// Records where the daemon holding `lock_fd` serves ("http://127.0.0.1:8765").
void AnnounceAddress(int lock_fd, const std::string& address);

struct RunningDaemon {
  std::string pid;
  std::string address;  // empty until it listens
};
// The daemon that holds the store's lock now; nothing when none does.
std::optional<RunningDaemon> FindDaemon(const std::string& store_dir);

}  // namespace aotid::daemon
