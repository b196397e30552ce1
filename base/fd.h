// File descriptors made close-on-exec from the start: pipes and sockets
// that no process aotid starts (runners, builds) inherits by accident.
#pragma once

#include <sys/socket.h>

#include <string>

#include "base/status.h"

namespace aotid::fd {

// Creates a pipe whose ends are close-on-exec, and non-blocking when asked.
// Linux makes it atomically (pipe2). Elsewhere (macOS has no pipe2 before
// macOS 27) it is pipe + fcntl: a process another thread starts between the
// two calls may inherit the ends, which is why the runner's spawn closes
// every descriptor it does not hand over. IOError when out of descriptors.
Status Pipe(int fds[2], bool nonblocking = false);

// socket(2) with close-on-exec set: atomically where the platform has
// SOCK_CLOEXEC (Linux), else with fcntl at once. -1 with errno set, as
// socket(2).
int Socket(int domain, int type, int protocol = 0);

// A TCP socket listening on host:port (port 0: a free one), close-on-exec
// and non-blocking, in *out (-1 on error); the port it has. InvalidArgument
// for a host that does not resolve, Unavailable when the address cannot be
// bound; each names `what` ("", " for gRPC") and the address, and the
// latter `hint`, the setting that chooses it.
StatusOr<int> ListenTcp(const std::string& host, int port, const std::string& what, const std::string& hint,
                        int* out);

// The address of a TCP peer, as text (an IPv4 client on a dual-stack
// socket as IPv4); empty for other kinds.
std::string PeerAddress(const sockaddr_storage& peer);

// Sets close-on-exec on `fd` (and O_NONBLOCK when asked); false with errno
// set when fcntl fails.
bool SetCloseOnExec(int fd, bool nonblocking = false);

}  // namespace aotid::fd
