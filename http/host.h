// Host names as the HTTP layer checks them: the Host header against DNS
// rebinding, and whether a listen address is reachable from this machine only.
#pragma once

#include <string>

namespace aotid::http {

// What a Host header names, without its port ("[::1]:8765" -> "::1");
// empty when what follows the name is not a port ("localhost:evil.com",
// "[::1]evil.com").
std::string HostWithoutPort(const std::string& host_header);

// True for addresses only this machine can reach: 127.0.0.0/8, ::1 in any
// spelling, and "localhost" in any case.
bool IsLoopbackHost(const std::string& host);

}  // namespace aotid::http
