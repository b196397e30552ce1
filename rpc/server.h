// aotid's gRPC transport: its own listening socket, the connections it
// lets through, and a grpc::Server with aotid's limits serving them. It
// knows nothing of models; serving/grpc_api.h registers the service.
//
// Why its own socket: gRPC bounds streams per connection and message
// sizes, but not the connections one address may hold. Here each accepted
// connection is counted against its address (as the HTTP server counts
// them), one over the cap is closed at once, and the rest are handed to
// gRPC (grpc::AddInsecureChannelFromFd), which then owns them. A
// connection gRPC has closed is counted out by the next sweep (once a
// second, and at each accept): its descriptor no longer names the same
// socket.
//
// What gRPC bounds, as set here: a message's size both ways (the HTTP
// body limit), header metadata, streams per connection, pings (a client
// pinging more often than allowed is sent GOAWAY), idle connections, and
// a connection's age (after it, GOAWAY and a grace for the calls in
// flight, so that not even a slow sender holds one longer). The server
// pings a connection that has been quiet, and closes one whose peer does
// not answer: a client that stops reading is found that way.
//
// Beside the service, gRPC's standard health service
// (grpc.health.v1.Health, Check and Watch: what Kubernetes' gRPC probes
// and grpc-health-probe ask) answers for the names SetHealth() gives. It
// asks for no token: a probe cannot send one.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace grpc {
class Service;
}

namespace aotid::rpc {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8766;  // 0: a free port, see Server::port()
  // Open connections one client address may hold; more are closed at
  // once. 0: no cap.
  int max_connections_per_address = 1024;
  int64_t max_message_bytes = 64 << 20;  // a request's size; a larger one is RESOURCE_EXHAUSTED
  int max_metadata_bytes = 16 << 10;     // a call's headers
  int max_streams_per_connection = 128;  // calls at once on one connection
  int keepalive_time_s = 60;             // a quiet connection is pinged after this
  int keepalive_timeout_s = 20;          // and closed when the ping is not answered in this
  int min_ping_interval_s = 10;          // a client's pings may come no more often than this
  int idle_timeout_s = 300;              // a connection with no call for this long is closed
  int max_connection_age_s = 1800;       // then GOAWAY: the client opens a new one
  int max_connection_age_grace_s = 60;   // for the calls in flight at GOAWAY
  int drain_timeout_s = 25;              // at Stop(), the most time calls in flight get
  // What gRPC may hold in memory for all connections together (its
  // resource quota): among it the bytes read and not yet handed to a call,
  // a message being assembled (gRPC checks a message's size only once it
  // has all of it). Past it gRPC cuts calls to free memory (RST_STREAM).
  // 0: four of the largest message, 64 MiB at least.
  int64_t max_buffered_bytes = 0;

  bool operator==(const ServerOptions&) const = default;
};

// max_buffered_bytes as it applies.
int64_t BufferBudget(const ServerOptions& o);

// gRPC's and protobuf's own log lines, to aotid's log at debug level:
// what a client can make them say (a string that is not UTF-8, a ping
// flood) must not fill a daemon's log, unauthenticated, a line a call.
// Bind() does it; once per process.
void RouteLibraryLogs();

class Server {
 public:
  // `service` must outlive the server.
  Server(ServerOptions options, grpc::Service* service);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens, and starts gRPC. Unavailable (naming the address)
  // when it is taken; InvalidArgument when gRPC will not start.
  Status Bind();
  int port() const { return port_; }
  // Accepts connections until Stop(), on the calling thread.
  void Serve();
  // Stops accepting, lets the calls in flight finish (drain_timeout_s at
  // most: then they are cancelled), and returns Serve(). Safe from any
  // thread, once or more.
  void Stop();
  // How many of the service's calls are being answered: at Stop() they
  // are waited for (within drain_timeout_s) before gRPC's own shutdown,
  // which then gets a second. Without it gRPC's shutdown gets the whole
  // drain, and spends it on a connection that never made a call. Set
  // before Serve().
  void SetInFlight(std::function<size_t()> in_flight);
  // What the health service answers: each service name, and whether it
  // serves. Read at Bind() and then once a second; a name it does not
  // give is NOT_FOUND. At Stop() every name turns NOT_SERVING before the
  // drain, so that a balancer sends no more calls. Without it, "" alone
  // is SERVING. Set before Bind().
  using HealthStatuses = std::function<std::vector<std::pair<std::string, bool>>()>;
  void SetHealth(HealthStatuses statuses);

  // Connections counted now, over every address (for tests).
  size_t TEST_connections() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace aotid::rpc
