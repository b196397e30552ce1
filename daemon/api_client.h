// The commands' side of the daemon's HTTP API: one request to a daemon on
// this machine (loopback or a unix socket), bounded in time. `service
// status` asks for readiness with it, `ls` what is served.
#pragma once

#include <string>

#include "http/server.h"

namespace aotid::daemon {

struct HttpAnswer {
  int status = 0;  // 0: no answer (then `error` says why)
  std::string body;
  std::string error;
};

// `method` `path` with `body` (JSON) and the bearer token when not empty.
// A wildcard listen address (0.0.0.0, ::) is asked on loopback.
HttpAnswer ApiCall(const http::ServerOptions& where, const std::string& method, const std::string& path,
                   const std::string& token, int timeout_ms, const std::string& body = "");

// The token in `token_file` ("" when unset or unreadable).
std::string ReadTokenQuietly(const std::string& token_file);

}  // namespace aotid::daemon
