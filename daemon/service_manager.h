// What the daemon tells the service manager that started it, and the
// listening socket it may be handed: systemd's notify protocol
// ($NOTIFY_SOCKET: READY=1, STATUS=..., STOPPING=1, WATCHDOG=1) and socket
// activation ($LISTEN_PID, $LISTEN_FDS). Both are small datagram and
// environment protocols, done here without libsystemd; outside systemd
// (no such variables) every call does nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace aotid::daemon {

class ServiceManager {
 public:
  // Reads $NOTIFY_SOCKET and $WATCHDOG_USEC (when $WATCHDOG_PID is unset
  // or this process) and removes them from the environment, so that the
  // processes the daemon starts (runners, builds) do not speak for it.
  static ServiceManager FromEnvironment();

  bool notifying() const { return !socket_path_.empty(); }
  // Sends one notification ("READY=1", "STATUS=2/3 models ready", several
  // lines at once). Errors are logged once, never fatal.
  void Notify(const std::string& state);
  // Half the watchdog interval the manager asked for, in ms; 0 without one.
  int64_t watchdog_ping_ms() const {
    return watchdog_usec_ > 0 ? std::max<int64_t>(1, watchdog_usec_ / 2000) : 0;
  }

 private:
  std::string socket_path_;  // '@' first for the abstract namespace
  int64_t watchdog_usec_ = 0;
  bool warned_ = false;
};

// The listening socket passed by socket activation: fd 3 when $LISTEN_PID
// is this process and $LISTEN_FDS is 1 (it is then made close-on-exec and
// the variables removed); nullopt when there is none. InvalidArgument for
// more than one socket, or an fd that is not a listening stream socket.
StatusOr<std::optional<int>> TakeActivatedSocket();

}  // namespace aotid::daemon
