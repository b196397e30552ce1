// aotid's HTTP/1.1 server: the listening socket, connections, request
// parsing, routing and responses. It knows nothing of inference; HttpApi
// (http_api.h) gives it the routes.
//
// Why its own: the request path is most of what a small model's request
// costs. A request is read with one recv() in the common case, parsed in
// place (no regex, no per-header allocation beyond the strings kept), and
// answered with one sendmsg() of head and body together. It also bounds
// what a general library did not let aotid bound: one deadline for a whole
// request (slowloris), header bytes (431), body bytes (413, refused before
// the body is read, also after "Expect: 100-continue"), and it serves more
// keep-alive connections than it has threads.
//
// Threads: one poller thread accepts connections and watches idle
// keep-alive ones; `threads` workers serve requests. A worker keeps the
// connection it serves while nobody waits for a worker, so a client at
// concurrency 1 pays no hand-off; once connections queue up, a worker
// serves its connection for a slice of a few milliseconds, then parks it
// with the poller (between requests) and takes the next one, so no client
// waits for another's keep-alive timeout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace aotid::http {

struct Header {
  std::string name, value;
};

struct Request {
  std::string method;
  std::string target;     // as sent: path and query
  std::string path;       // the target's path, still percent-encoded
  std::string query;      // after '?', without it
  int minor_version = 1;  // HTTP/1.x
  std::vector<Header> headers;
  std::string body;
  // What the route's "*" segments matched, percent-decoded.
  std::vector<std::string> params;
  // The connection it came on (-1 when none, as in tests), for ClientGone().
  int connection_fd = -1;

  // Header lookups, by name case-insensitively; the first of that name.
  const std::string* Find(std::string_view name) const;
  std::string Get(std::string_view name) const;
  bool Has(std::string_view name) const { return Find(name) != nullptr; }
};

struct Response;
struct Deferred;

// Fills in a deferred response; it runs on a server worker, so the costly
// part of an answer (encoding it) is spread over the workers.
using Finish = std::function<void(Response&)>;

// The answer to a request that comes later (Response::Defer()). Call it
// once, from any thread: the connection goes back to a worker, which runs
// `finish` and sends the response; later calls are ignored. A Reply whose
// every copy is gone without a call answers 500, so a lost completion
// never leaves its client hanging.
class Reply {
 public:
  Reply() = default;
  void operator()(Finish finish) const;

 private:
  friend struct Response;
  std::shared_ptr<Deferred> state_;
};

struct Response {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<Header> headers;  // besides Content-Type, Content-Length and Connection
  // A body sent while it is made (Server-Sent Events), instead of `body`:
  // the head goes out first (chunked to an HTTP/1.1 client; to HTTP/1.0
  // the connection closes after it), then `stream` runs on the worker and
  // each write() sends its bytes at once. write() returns false once the
  // client is gone or stops reading (server.write_timeout_s): the stream
  // should then end.
  std::function<void(const std::function<bool(std::string_view)>& write)> stream;
  // Set by Defer(): the answer comes later, through the Reply.
  std::shared_ptr<Deferred> deferred;

  // Answers later, off the worker that read the request (a request that
  // waits for its batch holds no worker): the handler returns at once, the
  // worker goes on to other connections, and the connection waits, unread,
  // until the Reply is called. Headers set on this response before the
  // handler returns (CORS) are kept in the one the Reply finishes.
  Reply Defer();

  void Set(std::string content, std::string_view type) {
    body = std::move(content);
    content_type = type;
  }
  void SetHeader(std::string name, std::string value) {
    headers.push_back({std::move(name), std::move(value)});
  }
};

using Handler = std::function<void(const Request&, Response&)>;

struct Limits {
  size_t max_header_bytes = 16 << 10;  // request line and headers together: 431 past it (414 for the line)
  size_t max_headers = 100;            // 431 past it
  int64_t max_body_bytes = 64 << 20;   // 413 past it

  bool operator==(const Limits&) const = default;
};

// The reason phrase of a status ("Not Found"); "Unknown" for others.
std::string_view ReasonPhrase(int status);

// Parses a request's head (request line and headers) at the start of
// `data`. kIncomplete: more bytes are needed (and the head so far is within
// the limits). kError: `status` and `error` say what is wrong; the
// connection cannot be trusted past it.
struct HeadResult {
  enum State { kIncomplete, kDone, kError } state = kIncomplete;
  size_t consumed = 0;  // bytes of the head, with its blank line (kDone)
  int status = 0;       // kError
  std::string error;    // kError
};
HeadResult ParseHead(std::string_view data, const Limits& limits, Request* req);

// How the body of a parsed head is framed. kError for a request smuggling
// shape (Content-Length and Transfer-Encoding both, conflicting lengths), a
// malformed length, or a transfer coding other than chunked.
struct BodyFraming {
  enum Kind { kNone, kLength, kChunked, kError } kind = kNone;
  uint64_t length = 0;  // kLength
  int status = 0;       // kError
  std::string error;
};
BodyFraming FramingOf(const Request& req);

// Decodes a chunked body from the start of `data`, appending the chunks'
// bytes to *body. It resumes: `consumed` counts the bytes of the whole
// chunks it took (their data is in *body), also when the result is
// kIncomplete; call again with the bytes after those and more data. kDone:
// the last chunk and the trailers are consumed too. With `body` null the
// chunks are only checked and counted (is the body whole yet?).
struct ChunkedResult {
  enum State { kIncomplete, kDone, kError } state = kIncomplete;
  size_t consumed = 0;
  int status = 0;
  std::string error;
};
ChunkedResult DecodeChunked(std::string_view data, int64_t max_body_bytes, std::string* body);

// Percent-decodes a path segment; false on a malformed escape.
bool PercentDecode(std::string_view in, std::string* out);

// Routes by method and path pattern. Patterns are literal segments and "*"
// for one whole segment ("/v2/models/*/infer"), captured into params.
// A path no pattern matches gets 404; one that matches only under other
// methods gets 405 with Allow. HEAD is answered as GET without the body.
class Router {
 public:
  // `error_body` makes the body of the 400, 404 and 405 answers (JSON).
  explicit Router(std::function<std::string(std::string_view message)> error_body)
      : error_body_(std::move(error_body)) {}
  void Add(std::string method, std::string_view pattern, Handler handler);
  void Dispatch(Request& req, Response& res) const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    Handler handler;
  };
  std::function<std::string(std::string_view)> error_body_;
  std::vector<Route> routes_;
};

// Whether the peer of a connection has closed its end (or it broke). A
// client that half-closes after sending its request counts as gone; HTTP
// clients do not do that.
bool ClientGone(int connection_fd);

// Where the server listens and what it bounds. These are aotid's defaults,
// written here only: the config ([server] in configs/aotid.toml) starts
// from them and the HTTP API passes them through.
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8765;        // 0: a free port, see Server::port()
  std::string unix_path;  // when set: listen on this unix socket, mode 0660, instead of host:port
  // A listening socket handed over (socket activation): served instead of
  // binding one; host, port or unix_path then only say what it is.
  int inherited_fd = -1;
  int threads = 8;             // workers
  int request_timeout_s = 60;  // the whole of one request: line, headers, body
  int idle_timeout_s = 30;     // a keep-alive connection between requests
  // A reply the client takes none of for this long closes its connection.
  // The worker writes a reply while the client reads it; one the client
  // stops reading is finished by the poller, so it holds no worker.
  int write_timeout_s = 30;
  int drain_timeout_s = 25;  // at Stop(), the most time the requests that arrived get to finish
  // Open TCP connections one client address may hold; more are answered
  // 503 and closed at once. 0: no cap. Unix-socket clients are not
  // counted (the socket's mode already says who may connect).
  int max_connections_per_address = 1024;
  Limits limits;

  bool operator==(const ServerOptions&) const = default;
};

class Server {
 public:
  // `handler` answers every well-formed request (errors of framing and
  // limits are answered here, with `error_body` making their body).
  // `clock` times the request, idle, write and drain timeouts (tests pass
  // a fake one to pass them at will); a worker's slice keeps the real one.
  Server(ServerOptions options, std::function<void(Request&, Response&)> handler,
         std::function<std::string(std::string_view message)> error_body, const Clock* clock = RealClock());
  ~Server();

  // Binds and listens. Unavailable (naming the address) when it is taken.
  Status Bind();
  int port() const { return port_; }
  // Serves until Stop(), on the calling thread (the poller) and the workers.
  void Serve();
  // Stops accepting connections and returns Serve() once the requests that
  // have arrived are answered (idle keep-alive connections are closed, the
  // others answered with Connection: close), or after drain_timeout_s.
  // Safe from any thread and from a signal-driven loop.
  void Stop();

  // `hook` sees every error answer (status 400 and up) before it is sent,
  // the handler's and the server's own (limits, framing, timeouts, an
  // exception), with the request's path as far as it was read ("" when
  // none was): an API whose clients read errors in another shape (OpenAI's
  // under /v1/) rewrites those of its paths. Set before Serve().
  void SetErrorHook(std::function<void(std::string_view path, Response& res)> hook);

  // Test hooks, set before Serve(). TEST_SetBeforeWorkerWaits: `hook` runs
  // on a worker that found no connection to serve, with the queue's lock
  // held, just before it waits for one. TEST_SetBeforeStoppingWorkers:
  // `hook` runs on the poller once the drain is done, just before it tells
  // the workers to end. TEST_stopping: whether they have been told.
  // TEST_SetOnWorkerTakes: `hook` runs on a worker each time it takes a
  // connection to serve, without the queue's lock.
  void TEST_SetBeforeWorkerWaits(std::function<void()> hook);
  void TEST_SetOnWorkerTakes(std::function<void()> hook);
  void TEST_SetBeforeStoppingWorkers(std::function<void()> hook);
  bool TEST_stopping() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace aotid::http
