// The HTTP API (Open Inference Protocol v2) over cpp-httplib.
//
// Handlers never throw: every error becomes {"error": "..."} with the status
// from HttpStatusFor(). HTTP threads never wait on a build: a model that is
// not ready answers 503 at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "daemon/model_registry.h"

namespace httplib {
class Server;
}

namespace aotid::daemon {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8765;  // 0 picks a free port; see HttpApi::port()
  int threads = 8;
  int64_t max_body_bytes = 64 << 20;
};

// The one mapping from Status to HTTP status.
int HttpStatusFor(const Status& s);

class HttpApi {
 public:
  HttpApi(const ModelRegistry* registry, HttpOptions options);
  ~HttpApi();

  // Binds the socket. Unavailable (naming the address) when it is taken.
  Status Bind();
  int port() const { return port_; }
  // Serves until Stop(); call from the thread that should run the accept loop.
  void Serve();
  // Safe from any thread.
  void Stop();

 private:
  void Routes();
  const ModelRegistry* registry_;
  HttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
};

}  // namespace aotid::daemon
