// The HTTP API (Open Inference Protocol v2) over aotid's HTTP server (http/server.h).
//
// Handlers never throw: every error becomes {"error": "..."} with the status
// from HttpStatusFor(). HTTP threads never wait on a build: a model that is
// not ready answers 503 at once.
//
// Before any route: the Host check (403), the bearer token (401 missing, 403
// wrong) and CORS (preflight answered here; other responses get the
// headers when their Origin is allowed).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "http/server.h"
#include "serving/metrics.h"
#include "serving/model_registry.h"
#include "serving/oip.h"

namespace aotid::serving {

struct HttpOptions {
  http::ServerOptions server;  // where it listens, workers, timeouts, limits
  std::string token;           // when set, requests need "Authorization: Bearer <token>"
  bool token_for_all = true;   // false: only the repository routes need it
  std::string store_dir;       // the repository routes write the store here
  // Host-header check against DNS rebinding: on for loopback binds. Loopback
  // names and addresses are always accepted, plus `allowed_hosts`.
  bool check_host = true;
  std::vector<std::string> allowed_hosts;
  std::vector<std::string> cors_origins;  // "*" for any; empty: no CORS
  // /v2/health/ready also waits for every served version to be loaded
  // (single-model mode: an orchestrator sends traffic once it is ready).
  bool ready_needs_resident = false;

  bool operator==(const HttpOptions&) const = default;
};

// {"error": message} as JSON; bytes of `message` that are not UTF-8 (quoted
// from a request) become U+FFFD. Never throws.
std::string ErrorBody(std::string_view message);

// The one mapping from Status to HTTP status.
int HttpStatusFor(const Status& s);

class HttpApi {
 public:
  // `metrics` records infer requests and renders GET /metrics; it must
  // outlive the server.
  HttpApi(const ModelRegistry* registry, Metrics* metrics, HttpOptions options);
  ~HttpApi();

  // Binds the socket. Unavailable (naming the address) when it is taken.
  Status Bind();
  int port() const { return port_; }
  // Where it listens, for people: "http://127.0.0.1:8765", "unix:/run/aotid.sock".
  std::string Address() const;
  // Serves until Stop(); call from the thread that should run the accept loop.
  void Serve();
  // Safe from any thread.
  void Stop();
  // What POST /v2/repository/models/NAME/load and .../unload ask of the
  // control plane (oip.h). The route's worker is free meanwhile. Set
  // before Serve(); without it the routes answer 503.
  using ModelControl = serving::ModelControl;
  void OnRepositoryCommand(ModelControl control) { *model_control_ = std::move(control); }
  // A reload's token, token scope, allowed hosts and CORS origins: every
  // request that starts after it is admitted by them. Safe from any thread.
  void UpdateAccess(const HttpOptions& fresh) EXCLUDES(access_mu_);

 private:
  void Routes();
  void Handle(http::Request& req, http::Response& res) const;
  bool Admit(const http::Request& req, http::Response& res, const HttpOptions& opts) const;
  std::shared_ptr<const HttpOptions> Access() const EXCLUDES(access_mu_);
  const ModelRegistry* registry_;
  Metrics* metrics_;
  HttpOptions options_;  // as started; the access fields as of Access()
  mutable Mutex access_mu_;
  std::shared_ptr<const HttpOptions> access_ GUARDED_BY(access_mu_);
  http::Router router_;
  std::unique_ptr<http::Server> server_;
  int port_ = 0;
  // Set by Stop(): sequences being generated end (as "cancelled") rather
  // than hold the stop for as long as they would run.
  std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<ModelControl> model_control_ = std::make_shared<ModelControl>();
};

}  // namespace aotid::serving
