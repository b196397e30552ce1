// aotid's configuration: built-in defaults, then a TOML file, then flags.
// configs/aotid.toml documents every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "http/server.h"
#include "serving/http_api.h"
#include "sync/syncer.h"

namespace aotid::daemon {

// residency.memory_budget_mb = 0: this percentage of the memory this
// process may use.
inline constexpr int kDefaultBudgetPercent = 60;

struct Config {
  // [store]
  std::string store_path;  // resolved: never empty after LoadConfig
  // [server]: the HTTP API's options, defaults and all (http::ServerOptions,
  // serving::HttpOptions). The config sets listen (host, port or unix_path),
  // threads, timeouts, limits, allowed_hosts, cors_origins and token_scope
  // (token_for_all); serve fills in the token, store_dir and check_host.
  serving::HttpOptions api;
  std::string token_file;  // empty: no token required
  // Where the gRPC API listens (HOST:PORT); "" for not at all. Its limits
  // are the HTTP server's where both have one (serving/grpc_api.h).
  std::string grpc_listen;
  int max_queued_requests = 256;  // per batched model version; more get 503
  // [build]
  std::string python;      // when empty, found beside aotid (platform/install_layout.h)
  std::string worker_dir;  // when empty, found beside aotid (platform/install_layout.h)
  int build_jobs = 1;
  int build_timeout_s = 1800;
  int build_retry_initial_s = 10;  // first wait before retrying a build that may pass; doubles each time
  int build_max_attempts = 4;      // builds tried per version before it stays failed
  std::string cxx = "c++";
  // Where compiled builds are kept; "" for <store_path>/cache. Several
  // daemons, each with a store of its own, may share one (compile/build_cache.h).
  std::string cache_dir;
  // [runner]
  int run_timeout_s = 120;      // a run past this gets 504 and its runner is replaced
  int64_t memory_limit_mb = 0;  // per runner; 0: three quarters of this machine's memory
  int runner_max_crashes = 5;   // crashes within runner_crash_window_s before a version fails
  int runner_crash_window_s = 60;
  // [residency]: which built versions stay loaded.
  // For versions whose keep_alive is "default"; storage::kKeepAliveAlways for always.
  int keep_alive_s = 300;
  // Runners' memory together; 0: kDefaultBudgetPercent of the memory this process may use.
  int64_t memory_budget_mb = 0;
  // A request whose model's load does not fit waits this long for memory, then 503.
  int load_wait_s = 30;
  bool unload_on_pressure = true;  // unload idle versions when the kernel reports memory pressure
  // [log]
  std::string log_level = "info";
  std::string log_file;      // "": stderr (the journal under systemd)
  int log_max_size_mb = 10;  // the file rotates past this
  int log_keep = 3;          // rotated files kept: FILE.1 .. FILE.3

  // [[sync]]: registries the daemon syncs from on a timer (sync/syncer.h).
  std::vector<sync::SyncSource> sync;

  std::string source;  // the file it came from, or "built-in defaults"

  // The build cache's folder: cache_dir, or the store's own cache/.
  std::string CachePath() const { return cache_dir.empty() ? store_path + "/cache" : cache_dir; }
  // Whether the build cache is a folder of its own, which other stores'
  // daemons may share: what this store does not use may be theirs.
  bool CacheIsSeparate() const { return !cache_dir.empty() && cache_dir != store_path + "/cache"; }

  bool operator==(const Config&) const = default;
};

// Every key, one table in config.cc drives them all: parsing, comparing,
// keeping a running value and when a change takes effect.
//
// The keys whose values differ ("server.listen", "log.level", ...), in the
// order configs/aotid.toml lists them.
std::vector<std::string> ChangedKeys(const Config& a, const Config& b);
// Every key the config knows, in that order ("sync" for the [[sync]] tables).
std::vector<std::string> ConfigKeyNames();

// When a changed key takes effect at a reload (SIGHUP).
enum class ReloadRule {
  kLive,      // at once
  kNextLoad,  // for model versions loaded from now on
  kRestart,   // at the next start; until then the running value is kept
};
// The rule of `key` as ChangedKeys names it; kRestart for one it does not know.
ReloadRule ReloadRuleOf(const std::string& key);
// Sets each of `keys` in `next` back to its value in `running`.
void KeepRunningValues(const Config& running, const std::vector<std::string>& keys, Config* next);

// Parses TOML text. Errors read "FILE:LINE:COL: what is wrong with KEY".
StatusOr<Config> ParseConfig(const std::string& text, const std::string& file_name);

// Finds the config file (explicit path, $AOTID_CONFIG, user, system), parses
// it, and fills in defaults that depend on the environment. An explicit path
// that does not exist is an error; absent implicit ones are not.
StatusOr<Config> LoadConfig(const std::string& explicit_path);

// Splits "HOST:PORT" or "[V6]:PORT"; InvalidArgument naming the value.
// "unix:/PATH" comes back whole as the host, with port 0; with `unix_ok`
// false it is refused, and the error's hint offers HOST:PORT alone.
Status ParseListen(const std::string& listen, std::string* host, int* port, bool unix_ok = true);
// A gRPC listen address: HOST:PORT as ParseListen takes it, not unix:.
Status CheckGrpcListen(const std::string& listen);
// Sets where `server` listens (host and port, or unix_path) from a listen
// address as ParseListen takes it; `server` is unchanged on error.
Status SetListen(const std::string& listen, http::ServerOptions* server);
// The listen address `server` has, spelled as the config spells it.
std::string FormatListen(const http::ServerOptions& server);

}  // namespace aotid::daemon
