// aotid's configuration: built-in defaults, then a TOML file, then flags.
// configs/aotid.toml documents every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace aotid::daemon {

struct Config {
  // [store]
  std::string store_path;  // resolved: never empty after LoadConfig
  // [server]
  std::string listen = "127.0.0.1:8765";
  int threads = 8;
  int request_timeout_s = 60;  // reading one request must finish within this
  int idle_timeout_s = 30;     // a keep-alive connection's wait for its next request
  int64_t max_body_bytes = 64 << 20;
  int max_header_bytes = 16 << 10;  // request line and headers: 431 past it
  int max_queued_requests = 256;          // per batched model version; more get 503
  std::string token_file;                 // empty: no token required
  std::string token_scope = "all";        // "all" routes, or "repository" routes only
  std::vector<std::string> allowed_hosts;  // Host names accepted besides loopback ones
  std::vector<std::string> cors_origins;   // empty: no CORS headers at all
  // [build]
  std::string python;      // resolved to the build-time venv when empty
  std::string worker_dir;  // resolved to the build-time python/ when empty
  int build_jobs = 1;
  int build_timeout_s = 1800;
  int build_retry_initial_s = 10;  // first wait before retrying a build that may pass; doubles each time
  int build_max_attempts = 4;      // builds tried per version before it stays failed
  std::string cxx = "c++";
  // [log]
  std::string log_level = "info";

  std::string source;  // the file it came from, or "built-in defaults"
};

// Parses TOML text. Errors read "FILE:LINE:COL: what is wrong with KEY".
StatusOr<Config> ParseConfig(const std::string& text, const std::string& file_name);

// Finds the config file (explicit path, $AOTID_CONFIG, user, system), parses
// it, and fills in defaults that depend on the environment. An explicit path
// that does not exist is an error; absent implicit ones are not.
StatusOr<Config> LoadConfig(const std::string& explicit_path);

// Splits "HOST:PORT" or "[V6]:PORT"; InvalidArgument naming the value.
Status ParseListen(const std::string& listen, std::string* host, int* port);

}  // namespace aotid::daemon
