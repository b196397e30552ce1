#include "http/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "base/clock.h"
#include "base/fd.h"
#include "base/log.h"
#include "base/mutex.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0  // macOS: SO_NOSIGPIPE is set on each connection instead
#endif

namespace aotid::http {
namespace {

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

// RFC 9110 token characters (methods, header names).
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

bool IsToken(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar); }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The next line of `data` from `pos`, without its CRLF (or bare LF);
// npos in *next when no line end is there yet.
std::string_view NextLine(std::string_view data, size_t pos, size_t* next) {
  size_t nl = data.find('\n', pos);
  if (nl == std::string_view::npos) {
    *next = std::string_view::npos;
    return {};
  }
  *next = nl + 1;
  size_t end = nl > pos && data[nl - 1] == '\r' ? nl - 1 : nl;
  return data.substr(pos, end - pos);
}

// A refusal, as the parse results carry it (HeadResult, ChunkedResult).
template <typename Result>
Result Fail(int status, std::string error) {
  Result r;
  r.state = Result::kError;
  r.status = status;
  r.error = std::move(error);
  return r;
}
constexpr auto HeadError = Fail<HeadResult>;

bool ParseRequestLine(std::string_view line, Request* req, HeadResult* err) {
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1 || line.find(' ', sp2 + 1) != std::string_view::npos) {
    *err = HeadError(400, "malformed request line: expected 'METHOD /path HTTP/1.1'");
    return false;
  }
  std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                   version = line.substr(sp2 + 1);
  if (!IsToken(method)) {
    *err = HeadError(400, "malformed request line: bad method");
    return false;
  }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || version[5] < '0' ||
      version[5] > '9' || version[7] < '0' || version[7] > '9') {
    *err = HeadError(400, "malformed request line: bad HTTP version");
    return false;
  }
  if (version[5] != '1') {
    *err = HeadError(505,
                     "HTTP version " + std::string(version.substr(5)) + " is not supported (HTTP/1.x only)");
    return false;
  }
  bool origin_form = !target.empty() && target.front() == '/';
  if (!origin_form && !(target == "*" && method == "OPTIONS")) {
    *err = HeadError(400, "request target must be a path starting with '/'");
    return false;
  }
  for (char c : target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      *err = HeadError(400, "request target contains a control character");
      return false;
    }
  }
  req->method = method;
  req->target = target;
  size_t q = target.find('?');
  req->path = target.substr(0, q);
  req->query = q == std::string_view::npos ? std::string() : std::string(target.substr(q + 1));
  req->minor_version = version[7] - '0';
  return true;
}

bool ParseDigits(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

const std::string* Request::Find(std::string_view name) const {
  for (const auto& h : headers) {
    if (IEquals(h.name, name)) return &h.value;
  }
  return nullptr;
}

std::string Request::Get(std::string_view name) const {
  const std::string* v = Find(name);
  return v ? *v : std::string();
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

HeadResult ParseHead(std::string_view data, const Limits& limits, Request* req) {
  size_t pos = 0;
  // A client may send an empty line or two before a request (RFC 9112 2.2).
  while (pos < data.size() && pos < 4 && (data[pos] == '\r' || data[pos] == '\n')) ++pos;
  size_t next;
  std::string_view line = NextLine(data, pos, &next);
  if (next == std::string_view::npos) {
    if (data.size() > limits.max_header_bytes) {
      return HeadError(414,
                       "request line is longer than " + std::to_string(limits.max_header_bytes) + " bytes");
    }
    return {};
  }
  if (next > limits.max_header_bytes) {
    return HeadError(414,
                     "request line is longer than " + std::to_string(limits.max_header_bytes) + " bytes");
  }
  HeadResult err;
  if (!ParseRequestLine(line, req, &err)) return err;
  req->headers.clear();
  req->headers.reserve(16);
  pos = next;
  for (;;) {
    line = NextLine(data, pos, &next);
    if (next == std::string_view::npos || next > limits.max_header_bytes) {
      if (data.size() > limits.max_header_bytes) {
        return HeadError(
            431, "request headers are larger than " + std::to_string(limits.max_header_bytes) + " bytes");
      }
      return {};
    }
    pos = next;
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') {
      return HeadError(400, "malformed header: folded header lines are not accepted");
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IsToken(line.substr(0, colon))) {
      return HeadError(400, "malformed header line '" + std::string(line.substr(0, 40)) + "'");
    }
    std::string_view value = Trim(line.substr(colon + 1));
    for (char c : value) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
        return HeadError(400,
                         "header '" + std::string(line.substr(0, colon)) + "' contains a control character");
      }
    }
    if (req->headers.size() >= limits.max_headers) {
      return HeadError(431, "more than " + std::to_string(limits.max_headers) + " request headers");
    }
    req->headers.push_back({std::string(line.substr(0, colon)), std::string(value)});
  }
  if (req->minor_version >= 1) {
    int hosts = 0;
    for (const auto& h : req->headers) hosts += IEquals(h.name, "Host");
    if (hosts != 1)
      return HeadError(400,
                       hosts == 0 ? "HTTP/1.1 request without a Host header" : "more than one Host header");
  }
  HeadResult done;
  done.state = HeadResult::kDone;
  done.consumed = pos;
  return done;
}

BodyFraming FramingOf(const Request& req) {
  BodyFraming f;
  auto error = [&](int status, std::string message) {
    f.kind = BodyFraming::kError;
    f.status = status;
    f.error = std::move(message);
    return f;
  };
  const std::string* length = nullptr;
  bool chunked = false;
  for (const auto& h : req.headers) {
    if (IEquals(h.name, "Transfer-Encoding")) {
      if (chunked || !IEquals(Trim(h.value), "chunked")) {
        return error(501, "Transfer-Encoding '" + h.value + "' is not supported (only chunked)");
      }
      chunked = true;
    } else if (IEquals(h.name, "Content-Length")) {
      if (length && *length != h.value) return error(400, "conflicting Content-Length headers");
      length = &h.value;
    }
  }
  if (chunked && length)
    return error(400, "a request must not have both Content-Length and Transfer-Encoding");
  if (chunked) {
    f.kind = BodyFraming::kChunked;
    return f;
  }
  if (length) {
    if (!ParseDigits(*length, &f.length))
      return error(400, "Content-Length must be a byte count, got '" + *length + "'");
    f.kind = f.length > 0 ? BodyFraming::kLength : BodyFraming::kNone;
  }
  return f;
}

ChunkedResult DecodeChunked(std::string_view data, int64_t max_body_bytes, std::string* body) {
  ChunkedResult r;
  constexpr auto error = Fail<ChunkedResult>;
  constexpr size_t kMaxLine = 4096;  // a size line with extensions, or a trailer
  size_t pos = 0;
  uint64_t counted = 0;  // the body's bytes so far when `body` is null
  for (;;) {
    const uint64_t have = body ? body->size() : counted;
    size_t next;
    std::string_view line = NextLine(data, pos, &next);
    if (next == std::string_view::npos) {
      if (data.size() - pos > kMaxLine) return error(400, "malformed chunked body: chunk size line too long");
      return r;
    }
    std::string_view size_text = line.substr(0, line.find(';'));
    uint64_t size = 0;
    if (size_text.empty() || size_text.size() > 15)
      return error(400, "malformed chunked body: bad chunk size");
    auto [p, ec] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), size, 16);
    if (ec != std::errc() || p != size_text.data() + size_text.size()) {
      return error(400,
                   "malformed chunked body: bad chunk size '" + std::string(size_text.substr(0, 20)) + "'");
    }
    if (size == 0) {
      // Trailers, then the blank line that ends the body. They are read
      // and dropped: nothing here needs them.
      size_t t = next;
      for (;;) {
        size_t after;
        std::string_view trailer = NextLine(data, t, &after);
        if (after == std::string_view::npos) {
          if (data.size() - t > kMaxLine) return error(431, "chunked body trailers are too large");
          return r;
        }
        t = after;
        if (trailer.empty()) break;
      }
      r.state = ChunkedResult::kDone;
      r.consumed = t;
      return r;
    }
    if (static_cast<uint64_t>(max_body_bytes) < size || have > static_cast<uint64_t>(max_body_bytes) - size) {
      return error(413, "request body exceeds the limit of " + std::to_string(max_body_bytes) + " bytes");
    }
    if (data.size() - next < size + 1) return r;  // the chunk and at least its LF
    std::string_view chunk = data.substr(next, size);
    size_t end = next + size;
    if (data[end] == '\r') {
      if (data.size() - end < 2) return r;
      if (data[end + 1] != '\n') return error(400, "malformed chunked body: chunk not followed by CRLF");
      end += 2;
    } else if (data[end] == '\n') {
      end += 1;
    } else {
      return error(400, "malformed chunked body: chunk not followed by CRLF");
    }
    if (body) {
      body->append(chunk);
    } else {
      counted += size;
    }
    pos = end;
    r.consumed = pos;
  }
}

bool PercentDecode(std::string_view in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    uint8_t v = 0;
    auto [p, ec] = std::from_chars(in.data() + i + 1, in.data() + i + 3, v, 16);
    if (ec != std::errc() || p != in.data() + i + 3) return false;
    out->push_back(static_cast<char>(v));
    i += 2;
  }
  return true;
}

namespace {

std::vector<std::string_view> Segments(std::string_view path) {
  std::vector<std::string_view> out;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  for (;;) {
    size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) return out;
    path.remove_prefix(slash + 1);
  }
}

}  // namespace

void Router::Add(std::string method, std::string_view pattern, Handler handler) {
  Route r{std::move(method), {}, std::move(handler)};
  for (auto s : Segments(pattern)) r.segments.emplace_back(s);
  routes_.push_back(std::move(r));
}

void Router::Dispatch(Request& req, Response& res) const {
  std::vector<std::string_view> segs = Segments(req.path);
  const std::string want = req.method == "HEAD" ? "GET" : req.method;
  std::string allow;
  for (const Route& r : routes_) {
    if (r.segments.size() != segs.size()) continue;
    bool match = true;
    for (size_t i = 0; i < segs.size() && match; ++i)
      match = r.segments[i] == "*" || r.segments[i] == segs[i];
    if (!match) continue;
    if (r.method != want) {
      if (allow.find(r.method) == std::string::npos) allow += (allow.empty() ? "" : ", ") + r.method;
      continue;
    }
    req.params.clear();
    for (size_t i = 0; i < segs.size(); ++i) {
      if (r.segments[i] != "*") continue;
      std::string decoded;
      if (!PercentDecode(segs[i], &decoded)) {
        res.status = 400;
        res.Set(error_body_("malformed percent-escape in the path '" + req.path + "'"), "application/json");
        return;
      }
      req.params.push_back(std::move(decoded));
    }
    r.handler(req, res);
    return;
  }
  if (!allow.empty()) {
    if (allow.find("GET") != std::string::npos) allow += ", HEAD";
    res.status = 405;
    res.SetHeader("Allow", allow);
    res.Set(
        error_body_("method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")"),
        "application/json");
  } else {
    res.status = 404;
    res.Set(error_body_("no route for " + req.method + " " + req.path), "application/json");
  }
}

bool ClientGone(int fd) {
  if (fd < 0) return false;
#ifdef POLLRDHUP
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
#else
  pollfd p{fd, POLLIN, 0};
  char c;
  return ::poll(&p, 1, 0) > 0 && ((p.revents & (POLLHUP | POLLERR)) != 0 || ::recv(fd, &c, 1, MSG_PEEK) == 0);
#endif
}

namespace {

// The machine's steady clock, for what is scheduling rather than a
// timeout a person sets (a worker's slice, a pause): a test's clock must
// not stop those. Timeouts read the server's Clock.
int64_t NowMs() { return RealClock()->NowMs(); }

// Bytes read from a connection and not yet consumed.
class Buffer {
 public:
  std::string_view View() const { return {data_.data() + begin_, end_ - begin_}; }
  bool Empty() const { return begin_ == end_; }
  void Consume(size_t n) {
    begin_ += n;
    if (begin_ == end_) begin_ = end_ = 0;
  }
  // Room for at least `n` more bytes at Tail().
  char* Reserve(size_t n) {
    if (data_.size() - end_ < n) {
      if (begin_ > 0) {  // compact first
        std::memmove(data_.data(), data_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      if (data_.size() - end_ < n) data_.resize(end_ + n);
    }
    return data_.data() + end_;
  }
  size_t Room() const { return data_.size() - end_; }
  void Commit(size_t n) { end_ += n; }

 private:
  std::vector<char> data_;
  size_t begin_ = 0, end_ = 0;
};

// Open connections by the client's address, for
// ServerOptions::max_connections_per_address.
class PeerCounts {
 public:
  // Counts one more from `peer`; false (nothing counted) when that would
  // pass `cap`.
  bool Add(const std::string& peer, int cap) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    int& n = open_[peer];
    if (n >= cap) {
      if (n == 0) open_.erase(peer);
      return false;
    }
    ++n;
    return true;
  }
  void Remove(const std::string& peer) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = open_.find(peer);
    if (it != open_.end() && --it->second <= 0) open_.erase(it);
  }

 private:
  Mutex mu_;
  std::unordered_map<std::string, int> open_ GUARDED_BY(mu_);
};

struct Conn {
  int fd = -1;
  bool tcp = true;
  std::string peer;              // the client's address, when counted
  PeerCounts* counts = nullptr;  // where it is counted
  Buffer in;
  int64_t idle_until_ms = 0;  // while parked
  // When the request whose first bytes are in `in` must have arrived whole;
  // 0 while no request is under way.
  int64_t request_deadline_ms = 0;
  bool continued = false;  // the poller sent "100 Continue" for the request under way
  // A deferred request (Response::Defer): its state while the handler's
  // work is under way, and what the worker needs to send its answer.
  std::shared_ptr<Deferred> deferred;
  Finish finish;  // set once the answer is ready: a worker runs and sends it
  // An answer the client has not taken yet: the poller writes the rest as
  // its socket drains, so a client that stops reading holds no worker. A
  // client that takes none of it until `out_until_ms` (write_timeout_s
  // after its last progress) is closed; once all is out the connection
  // closes, or waits for the next request.
  std::string out;
  size_t out_at = 0;
  int64_t out_until_ms = 0;
  bool close_after_out = false;
  // A refusal the poller sent (a request past its deadline): once it is
  // out, the client's further bytes are read and dropped until then, so
  // that it reads the answer rather than a reset. 0: none.
  int64_t linger_until_ms = 0;
  struct {
    bool keep_alive = false;  // the client's wish; draining may still close
    bool head_only = false;
    bool http11 = true;
    std::vector<Header> headers;  // set before the handler returned
    std::string what;             // method and path, for the log
    std::string path;             // for the error hook
  } later;
  ~Conn() {
    if (fd >= 0) ::close(fd);
    if (counts) counts->Remove(peer);
  }
};

// What the workers, the poller and deferred replies share: the queue of
// connections waiting for a worker. Replies may come after the server is
// gone (a batch that finishes after a drain timed out), so it is held by
// them too; once `closed`, a connection handed back is just closed.
struct Shared {
  Mutex mu;
  CondVar cv;                                                 // workers wait here for ready
  std::deque<std::unique_ptr<Conn>> ready GUARDED_BY(mu);     // waiting for a worker
  std::vector<std::unique_ptr<Conn>> to_park GUARDED_BY(mu);  // handed to the poller
  std::atomic<size_t> queued{0};                              // ready.size(), read without the lock
  int busy GUARDED_BY(mu) = 0;                                // workers serving a connection
  int deferred GUARDED_BY(mu) = 0;                            // connections waiting for a Reply
  bool closed GUARDED_BY(mu) = false;                         // Serve() has returned
  PeerCounts peer_counts;                                     // outlives every Conn

  void Enqueue(std::unique_ptr<Conn> c, bool first = false) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      if (closed) {
        lock.Unlock();
        return;  // c closes here
      }
      if (first) {
        ready.push_front(std::move(c));
      } else {
        ready.push_back(std::move(c));
      }
      queued.store(ready.size());
    }
    cv.Signal();
  }

  // A deferred connection whose answer is ready goes to the front: it
  // finishes work under way before new requests are read.
  void Resume(std::unique_ptr<Conn> c) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      --deferred;
    }
    Enqueue(std::move(c), /*first=*/true);
  }
};

}  // namespace

struct Deferred {
  Mutex mu;
  bool replied GUARDED_BY(mu) = false;
  Finish finish GUARDED_BY(mu);               // a reply that came before the connection was handed over
  std::unique_ptr<Conn> conn GUARDED_BY(mu);  // handed over, waiting for the reply
  std::shared_ptr<Shared> shared GUARDED_BY(mu);

  ~Deferred() {
    // Never replied: nothing will answer, so say so rather than hang.
    MutexLock lock(&mu);
    if (!conn) return;
    conn->finish = [](Response& res) {
      res.status = 500;
      res.Set(R"({"error":"internal error: the request was dropped without an answer"})", "application/json");
    };
    shared->Resume(std::move(conn));
  }
};

Reply Response::Defer() {
  deferred = std::make_shared<Deferred>();
  Reply r;
  r.state_ = deferred;
  return r;
}

void Reply::operator()(Finish finish) const {
  if (!state_) return;
  std::unique_ptr<Conn> conn;
  std::shared_ptr<Shared> shared;
  {
    MutexLock lock(&state_->mu);
    if (state_->replied) return;
    state_->replied = true;
    if (!state_->conn) {
      state_->finish = std::move(finish);  // the worker that hands the connection over sends it
      return;
    }
    conn = std::move(state_->conn);
    shared = std::move(state_->shared);
  }
  conn->finish = std::move(finish);
  shared->Resume(std::move(conn));
}

namespace {

// Waits until `fd` is readable or `deadline_ms` on `clock` passes; false
// then. (A test's clock moved meanwhile is seen once the poll ends.)
bool WaitReadable(int fd, int64_t deadline_ms, const Clock* clock) {
  for (;;) {
    int64_t left = deadline_ms - clock->NowMs();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// Whether `fd` has bytes (or its end) to read now.
bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

// Reads what is there (at least one byte; the socket is readable) into the
// buffer; false when the peer closed or the read failed.
bool RecvSome(Conn& c) {
  char* tail = c.in.Reserve(16 << 10);
  ssize_t n;
  do n = ::recv(c.fd, tail, c.in.Room(), 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  c.in.Commit(static_cast<size_t>(n));
  return true;
}

// The same, waiting for bytes until `deadline_ms`.
bool ReadSome(Conn& c, int64_t deadline_ms, const Clock* clock) {
  return WaitReadable(c.fd, deadline_ms, clock) && RecvSome(c);
}

// Whether `in` holds what a worker needs to answer a request without
// waiting on the client: a whole head and a body of known length, or
// something to refuse at once. A chunked body counts once its last chunk
// and trailers are here (or its framing is wrong), so a client that
// trickles chunks holds no worker either. A request with "Expect:
// 100-continue" whose body is acceptable and not here yet sets
// *send_continue: the client waits for a 100 before it sends its body.
bool RequestBuffered(std::string_view in, const Limits& limits, bool* send_continue) {
  if (in.empty()) return false;
  Request probe;
  HeadResult head = ParseHead(in, limits, &probe);
  if (head.state == HeadResult::kIncomplete) return false;
  if (head.state == HeadResult::kError) return true;
  BodyFraming framing = FramingOf(probe);
  if (const std::string* expect = probe.Find("Expect")) {
    if (!IEquals(*expect, "100-continue") || framing.kind == BodyFraming::kNone ||
        framing.kind == BodyFraming::kError ||
        (framing.kind == BodyFraming::kLength &&
         framing.length > static_cast<uint64_t>(limits.max_body_bytes))) {
      return true;  // the worker answers at once (417, 413, ...)
    }
    *send_continue = true;
  }
  if (framing.kind == BodyFraming::kChunked) {
    ChunkedResult chunks = DecodeChunked(in.substr(head.consumed), limits.max_body_bytes, nullptr);
    return chunks.state != ChunkedResult::kIncomplete;
  }
  if (framing.kind != BodyFraming::kLength) return true;
  return framing.length > static_cast<uint64_t>(limits.max_body_bytes) ||
         in.size() - head.consumed >= framing.length;
}

ssize_t SendIovecs(int fd, iovec* iov, int count, int flags) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(count);
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL | flags);
}

// Moves *iov and *count past the first `sent` bytes.
void SkipSent(iovec** iov, int* count, size_t sent) {
  while (*count > 0 && sent >= (*iov)->iov_len) {
    sent -= (*iov)->iov_len;
    ++*iov;
    --*count;
  }
  if (*count > 0) {
    (*iov)->iov_base = static_cast<char*>((*iov)->iov_base) + sent;
    (*iov)->iov_len -= sent;
  }
}

// Writes all of the iovecs (the socket has a send timeout); false when the
// peer is gone or too slow.
bool WriteAll(int fd, iovec* iov, int count) {
  while (count > 0) {
    ssize_t n = SendIovecs(fd, iov, count, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    SkipSent(&iov, &count, static_cast<size_t>(n));
  }
  return true;
}

// How long a worker waits for a client to take more of its answer before
// it leaves the rest to the poller. A client that reads as the bytes come
// never waits this long, and is served by the worker to the end, as fast
// as a blocking write; one that stalls holds the worker this long at most.
constexpr int kWorkerWriteStallMs = 10;

// Writes the iovecs while the client takes them, then keeps what is left
// in c.out for the poller once it has taken nothing for
// kWorkerWriteStallMs (empty when all went); false when the peer is gone.
bool WriteOrKeep(Conn& c, iovec* iov, int count, int write_timeout_s, const Clock* clock) {
  while (count > 0) {
    ssize_t n = SendIovecs(c.fd, iov, count, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{c.fd, POLLOUT, 0};
      int r = ::poll(&p, 1, kWorkerWriteStallMs);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      continue;
    }
    if (n <= 0) return false;
    SkipSent(&iov, &count, static_cast<size_t>(n));
  }
  c.out.clear();
  c.out_at = 0;
  for (int i = 0; i < count; ++i) c.out.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
  if (!c.out.empty()) c.out_until_ms = clock->NowMs() + int64_t{write_timeout_s} * 1000;
  return true;
}

// Writes more of c.out without waiting, giving the client write_timeout_s
// more from any progress; false when the peer is gone.
bool WriteKept(Conn& c, int write_timeout_s, const Clock* clock) {
  while (c.out_at < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_at, c.out.size() - c.out_at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) return false;
    c.out_at += static_cast<size_t>(n);
    c.out_until_ms = clock->NowMs() + int64_t{write_timeout_s} * 1000;
  }
  c.out.clear();
  c.out.shrink_to_fit();
  c.out_at = 0;
  return true;
}

bool WantsKeepAlive(const Request& req) {
  const std::string* c = req.Find("Connection");
  auto has = [&](std::string_view token) {
    if (!c) return false;
    std::string_view rest = *c;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      if (IEquals(Trim(rest.substr(0, comma)), token)) return true;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    return false;
  };
  return req.minor_version >= 1 ? !has("close") : has("keep-alive");
}

// The path of the request whose first bytes are `data`, as far as they go
// ("" before it starts): a refusal of a request that was not read whole
// (414, 408) still says where it was going.
std::string_view PathSoFar(std::string_view data) {
  size_t at = 0;
  while (at < data.size() && at < 4 && (data[at] == '\r' || data[at] == '\n')) ++at;
  size_t space = data.find(' ', at);
  if (space == std::string_view::npos) return {};
  std::string_view target = data.substr(space + 1);
  return target.substr(0, target.find_first_of(" ?\r\n"));
}

}  // namespace

class Server::Impl {
 public:
  Impl(ServerOptions options, std::function<void(Request&, Response&)> handler,
       std::function<std::string(std::string_view)> error_body, const Clock* clock)
      : opts_(std::move(options)),
        handler_(std::move(handler)),
        error_body_(std::move(error_body)),
        clock_(clock) {
    if (!fd::Pipe(wake_, /*nonblocking=*/true).ok()) wake_[0] = wake_[1] = -1;
  }
  ~Impl() {
    for (int fd : wake_) {
      if (fd >= 0) ::close(fd);
    }
    if (listen_fd_ >= 0) ::close(listen_fd_);
    // Removed only by the process that holds its lock: never another's.
    if (!opts_.unix_path.empty() && bound_ && socket_lock_fd_ >= 0) ::unlink(opts_.unix_path.c_str());
    if (socket_lock_fd_ >= 0) ::close(socket_lock_fd_);
  }

  StatusOr<int> Bind() {
    if (opts_.inherited_fd >= 0) return Adopt(opts_.inherited_fd);
    if (!opts_.unix_path.empty()) return BindUnix();
    ASSIGN_OR_RETURN(int port,
                     fd::ListenTcp(opts_.host, opts_.port, "", "set server.listen or --listen", &listen_fd_));
    bound_ = true;
    return port;
  }

  // The poller: accepts, watches parked connections, ends idle ones.
  void Serve() {
    std::vector<std::thread> workers;
    for (int i = 0; i < std::max(1, opts_.threads); ++i) workers.emplace_back([this] { Work(); });
    std::vector<std::unique_ptr<Conn>> parked;
    std::vector<pollfd> fds;
    int64_t accept_paused_until = 0;
    int64_t drain_until = -1;
    while (!stopping_.load()) {
      {
        MutexLock lock(&shared_->mu);
        for (auto& c : shared_->to_park) parked.push_back(std::move(c));
        shared_->to_park.clear();
      }
      if (draining_.load()) {
        if (drain_until < 0) {
          drain_until = clock_->NowMs() + int64_t{opts_.drain_timeout_s} * 1000;
          // New connections are refused from here on; what the kernel
          // accepted but nobody took is reset.
          ::close(listen_fd_);
          listen_fd_ = -1;
        }
        // Idle keep-alive connections have nothing to finish; one whose
        // request is still in its socket, unread, does.
        // One whose answer is still being written does too.
        std::erase_if(parked, [](const std::unique_ptr<Conn>& c) {
          return c->out.empty() && c->in.Empty() && !Readable(c->fd);
        });
        bool idle;
        {
          MutexLock lock(&shared_->mu);
          idle = parked.empty() && shared_->ready.empty() && shared_->to_park.empty() && shared_->busy == 0 &&
                 shared_->deferred == 0;
        }
        if (idle || clock_->NowMs() >= drain_until) {
          if (!idle) LOG_WARNING << "server.drain_timeout_s passed; closing the connections still open";
          break;
        }
      }
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      bool accepting = NowMs() >= accept_paused_until && listen_fd_ >= 0;
      fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
      for (const auto& c : parked)
        fds.push_back({c->fd, static_cast<short>(c->out.empty() ? POLLIN : POLLOUT), 0});
      int r = ::poll(fds.data(), fds.size(), 100);
      if (stopping_.load()) break;
      if (r < 0) continue;
      if (fds[0].revents) {
        char drain[64];
        while (::read(wake_[0], drain, sizeof drain) > 0) {
        }
      }
      if (fds[1].revents & POLLIN) {
        if (!Accept()) accept_paused_until = NowMs() + 100;  // out of descriptors: let some close first
      }
      // The poller reads parked connections itself: only a whole request
      // (or one to refuse, or one past its deadline, answered 408) goes to a
      // worker, so clients that trickle their bytes hold no worker. Ones
      // idle past their time, or that hung up, are closed.
      int64_t now = clock_->NowMs();
      std::vector<std::unique_ptr<Conn>> still;
      for (size_t i = 0; i < parked.size(); ++i) {
        Conn& c = *parked[i];
        if (c.linger_until_ms != 0 && c.out.empty()) {
          if (now >= c.linger_until_ms || (fds[i + 2].revents != 0 && !DropSome(c.fd))) {
            parked[i].reset();
          } else {
            still.push_back(std::move(parked[i]));
          }
          continue;
        }
        if (!c.out.empty()) {
          // An answer being written: more of it as the socket takes it.
          // Once it is all out the connection closes or, kept alive, waits
          // for the next request (one that came meanwhile goes to a worker).
          if (fds[i + 2].revents != 0 && !WriteKept(c, opts_.write_timeout_s, clock_)) {
            parked[i].reset();
          } else if (!c.out.empty()) {
            if (clock_->NowMs() >= c.out_until_ms) {
              LOG_DEBUG << "closing a connection whose client read none of its answer for "
                           "server.write_timeout_s";
              parked[i].reset();
            } else {
              still.push_back(std::move(parked[i]));
            }
          } else if (c.linger_until_ms != 0) {
            ::shutdown(c.fd, SHUT_WR);
            still.push_back(std::move(parked[i]));
          } else if (c.close_after_out) {
            parked[i].reset();
          } else {
            bool gone = false;
            c.idle_until_ms = now + int64_t{opts_.idle_timeout_s} * 1000;
            if (WholeRequest(c, &gone)) {
              Enqueue(std::move(parked[i]));
            } else if (gone) {
              parked[i].reset();
            } else {
              still.push_back(std::move(parked[i]));
            }
          }
          continue;
        }
        if (fds[i + 2].revents != 0) {
          if (!RecvSome(c)) {
            parked[i].reset();
            continue;
          }
          if (c.request_deadline_ms == 0)
            c.request_deadline_ms = now + int64_t{opts_.request_timeout_s} * 1000;
          // A client that expects a 100 gets it here, and its body is
          // then collected like any other.
          bool gone = false;
          if (WholeRequest(c, &gone)) {
            Enqueue(std::move(parked[i]));
            continue;
          }
          if (gone) {
            parked[i].reset();
            continue;
          }
        }
        if (!c.in.Empty() ? now >= c.request_deadline_ms : now >= c.idle_until_ms) {
          if (c.in.Empty()) {
            parked[i].reset();
          } else if (RefuseLate(c, now)) {
            still.push_back(std::move(parked[i]));
          } else {
            parked[i].reset();
          }
        } else {
          still.push_back(std::move(parked[i]));
        }
      }
      parked.swap(still);
    }
    if (TEST_before_stopping_workers_) TEST_before_stopping_workers_();
    {
      // Set under the lock the workers check it under: a worker between
      // its check and its wait would otherwise miss the signal and sleep
      // forever, and the join below with it.
      MutexLock lock(&shared_->mu);
      stopping_.store(true);
    }
    shared_->cv.SignalAll();
    for (auto& t : workers) t.join();
    // Closed outside the lock: a connection's end may answer a Reply.
    std::deque<std::unique_ptr<Conn>> ready;
    std::vector<std::unique_ptr<Conn>> to_park;
    MutexLock lock(&shared_->mu);
    shared_->closed = true;
    ready.swap(shared_->ready);
    to_park.swap(shared_->to_park);
    lock.Unlock();
  }

  // Stops taking connections and lets the requests that have arrived
  // finish (bounded by drain_timeout_s); Serve() then returns.
  bool TEST_stopping() const { return stopping_.load(); }

  void Stop() {
    draining_.store(true);
    shared_->cv.SignalAll();
    Wake();
  }

 private:
  StatusOr<int> BindUnix() {
    const std::string& path = opts_.unix_path;
    sockaddr_un addr{};
    if (path.size() >= sizeof addr.sun_path) return InvalidArgument("unix socket path is too long: " + path);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    // PATH.lock is held for as long as this server owns the socket, so a
    // second server (of another store, or another program's aotid) can
    // neither take over a live socket nor remove it when it exits. The lock
    // file stays; removing it would race the next one to take it.
    std::string lock_path = path + ".lock";
    socket_lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (socket_lock_fd_ < 0) return ErrnoError("open " + lock_path, errno);
    if (::flock(socket_lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(socket_lock_fd_);
      socket_lock_fd_ = -1;
      return Unavailable("cannot listen on unix:" + path + ": another process serves on it (it holds " +
                         lock_path + ")");
    }
    // A socket file left by an earlier run may be replaced; one that still
    // answers belongs to a live server that does not use the lock; anything
    // else is not ours to remove.
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) return FailedPrecondition(path + " exists and is not a socket");
      int probe = fd::Socket(AF_UNIX, SOCK_STREAM);
      bool live = probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      if (probe >= 0) ::close(probe);
      if (live) return Unavailable("cannot listen on unix:" + path + ": another process is listening on it");
      ::unlink(path.c_str());
    }
    listen_fd_ = fd::Socket(AF_UNIX, SOCK_STREAM);
    if (listen_fd_ < 0) return ErrnoError("socket", errno);
    mode_t old = ::umask(0117);  // created 0660: owner and group
    int rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int e = errno;
    ::umask(old);
    if (rc != 0) return Unavailable("cannot listen on unix:" + path + ": " + std::strerror(e));
    bound_ = true;
    if (::chmod(path.c_str(), 0660) != 0) return ErrnoError("chmod 0660 " + path, errno);
    if (::listen(listen_fd_, SOMAXCONN) != 0) return ErrnoError("listen on unix:" + path, errno);
    ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
    return 0;
  }

  // Serves on a socket someone else bound and listens on (and owns: its
  // file, for a unix socket, is never removed here).
  StatusOr<int> Adopt(int fd) {
    listen_fd_ = fd;
    ::fcntl(listen_fd_, F_SETFD, FD_CLOEXEC);
    ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return ErrnoError("getsockname of the socket handed over", errno);
    }
    if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    return 0;
  }

  // Accepts what is waiting; false when out of file descriptors.
  bool Accept() {
    for (int i = 0; i < 64; ++i) {
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      int fd = ::accept(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
          LOG_WARNING << "cannot accept a connection: " << std::strerror(errno);
          return false;
        }
        return true;  // EAGAIN: nothing more waiting (or a connection that went away)
      }
      ::fcntl(fd, F_SETFD, FD_CLOEXEC);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->tcp = peer.ss_family != AF_UNIX;
      if (c->tcp && opts_.max_connections_per_address > 0) {
        std::string address = fd::PeerAddress(peer);
        if (!shared_->peer_counts.Add(address, opts_.max_connections_per_address)) {
          RefuseAtOnce(*c, 503,
                       "too many connections from " + address + " (server.max_connections_per_address is " +
                           std::to_string(opts_.max_connections_per_address) + ")");
          continue;
        }
        c->peer = std::move(address);
        c->counts = &shared_->peer_counts;
      }
      int one = 1;
      if (c->tcp)
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small replies must not wait
#ifdef SO_NOSIGPIPE
      ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
      timeval tv{opts_.write_timeout_s, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      if (Readable(fd)) {
        Enqueue(std::move(c));
      } else {
        // Nothing sent yet: it waits with the poller, not on a worker. A
        // burst of silent connections was served a worker's slice each
        // before anyone behind them (0.6 ms a connection for a fresh
        // client's answer).
        c->idle_until_ms = clock_->NowMs() + int64_t{opts_.idle_timeout_s} * 1000;
        MutexLock lock(&shared_->mu);
        shared_->to_park.push_back(std::move(c));
      }
    }
    return true;
  }

  // Answers `status` on a connection just accepted, without waiting for
  // it: the poller must not be held by the client it refuses. What the
  // client sent already is read first, so that it gets the answer rather
  // than a reset.
  void RefuseAtOnce(Conn& c, int status, const std::string& message) {
    char sink[16384];
    ssize_t first = ::recv(c.fd, sink, sizeof sink, MSG_DONTWAIT);
    std::string path(PathSoFar(std::string_view(sink, static_cast<size_t>(std::max<ssize_t>(first, 0)))));
    while (first > 0 && ::recv(c.fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    Response res;
    res.status = status;
    res.Set(error_body_(message), "application/json");
    ShapeError(path, res);
    std::string all = ResponseHead(res, /*keep_alive=*/false) + res.body;
    (void)!::send(c.fd, all.data(), all.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(c.fd, SHUT_WR);
  }

  void Enqueue(std::unique_ptr<Conn> c) { shared_->Enqueue(std::move(c)); }

  // Answers 408 to a parked request past its deadline, from the poller: a
  // worker would drain each client for up to a second, and 200 tricklers
  // cut at once held every worker for half a minute. The answer is written
  // as the socket takes it, and the client's bytes dropped for a second
  // after (Conn::linger_until_ms). False when the client is gone.
  bool RefuseLate(Conn& c, int64_t now) {
    Response res;
    res.status = 408;
    res.Set(error_body_("the request was not received within server.request_timeout_s"), "application/json");
    ShapeError(PathSoFar(c.in.View()), res);
    c.in.Consume(c.in.View().size());
    c.out = ResponseHead(res, /*keep_alive=*/false) + res.body;
    c.out_at = 0;
    c.out_until_ms = now + int64_t{opts_.write_timeout_s} * 1000;
    c.close_after_out = true;
    c.linger_until_ms = now + 1000;
    if (!WriteKept(c, opts_.write_timeout_s, clock_)) return false;
    if (c.out.empty()) ::shutdown(c.fd, SHUT_WR);
    return true;
  }

  // Reads and drops what a lingering client sends; false at its end.
  static bool DropSome(int fd) {
    char sink[16384];
    for (int round = 0; round < 64; ++round) {  // at most 1 MiB a turn: others wait
      ssize_t n = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      if (n > 0) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
    return true;
  }

  // Whether a whole request is in `c` (RequestBuffered); sends "100
  // Continue" first when its client waits for one. False too when that
  // cannot be sent (*gone).
  bool WholeRequest(Conn& c, bool* gone) {
    bool send_continue = false;
    if (RequestBuffered(c.in.View(), opts_.limits, &send_continue)) return true;
    if (send_continue && !c.continued && !SendContinue(c)) *gone = true;
    return false;
  }

  // Tells a client that waits for it to send its body; false when the
  // client is gone.
  static bool SendContinue(Conn& c) {
    static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    iovec v{const_cast<char*>(kContinue), sizeof kContinue - 1};
    c.continued = true;
    return WriteAll(c.fd, &v, 1);
  }

  void Park(std::unique_ptr<Conn> c) EXCLUDES(shared_->mu) {
    bool gone = false;
    if (WholeRequest(*c, &gone)) return Enqueue(std::move(c));  // e.g. pipelined
    if (gone) return;
    c->idle_until_ms = clock_->NowMs() + int64_t{opts_.idle_timeout_s} * 1000;
    {
      MutexLock lock(&shared_->mu);
      shared_->to_park.push_back(std::move(c));
    }
    Wake();
  }

  // The rest of an answer goes to the poller, which writes it as the client
  // reads (Conn::out); the worker is free meanwhile.
  void WriteBehind(std::unique_ptr<Conn> c) EXCLUDES(shared_->mu) {
    {
      MutexLock lock(&shared_->mu);
      shared_->to_park.push_back(std::move(c));
    }
    Wake();
  }

  void Wake() {
    char b = 1;
    if (wake_[1] >= 0) (void)!::write(wake_[1], &b, 1);
  }

  void Work() {
    for (;;) {
      std::unique_ptr<Conn> c;
      {
        MutexLock lock(&shared_->mu);
        while (!stopping_.load() && shared_->ready.empty()) {
          if (TEST_before_worker_waits_) TEST_before_worker_waits_();
          shared_->cv.Wait(&shared_->mu);
        }
        if (stopping_.load()) return;
        c = std::move(shared_->ready.front());
        shared_->ready.pop_front();
        shared_->queued.store(shared_->ready.size());
        ++shared_->busy;
      }
      if (TEST_on_worker_takes_) TEST_on_worker_takes_();
      for (;;) {
        Outcome outcome = ServeConnection(*c);
        if (outcome == Outcome::kPark) Park(std::move(c));
        if (outcome == Outcome::kWriteBehind) WriteBehind(std::move(c));
        if (outcome != Outcome::kDefer) break;
        c = HandOver(std::move(c));
        if (!c) break;  // the Reply brings it back
      }
      c.reset();
      {
        MutexLock lock(&shared_->mu);
        --shared_->busy;
      }
      if (draining_.load()) Wake();  // the poller may be done
    }
  }

  // How long a worker keeps serving one connection while other connections
  // wait for a worker. Handing a connection to the poller and back costs a
  // few wake-ups; doing it after every request halved the test MLP's
  // throughput at 64 clients on 8 workers. A few milliseconds keeps that
  // cost small and the wait of a queued connection short.
  static constexpr int64_t kSliceMs = 5;

  // Hands a deferred connection to its Reply, which brings it back to a
  // worker when the answer is ready. When the answer came already, the
  // connection is returned, to be served on at once.
  std::unique_ptr<Conn> HandOver(std::unique_ptr<Conn> c) {
    std::shared_ptr<Deferred> state = std::move(c->deferred);
    MutexLock lock(&state->mu);
    if (state->replied) {
      c->finish = std::move(state->finish);
      return c;
    }
    {
      MutexLock shared_lock(&shared_->mu);
      ++shared_->deferred;
    }
    state->conn = std::move(c);
    state->shared = shared_;
    return nullptr;
  }

  enum class Outcome { kClose, kPark, kDefer, kWriteBehind };

  // Serves requests on `c` until it closes, should wait parked while this
  // worker serves others, or waits for a deferred answer.
  Outcome ServeConnection(Conn& c) {
    const int64_t slice_end = NowMs() + kSliceMs;
    auto others_wait = [&] { return shared_->queued.load() > 0; };
    if (c.finish) {
      switch (SendDeferred(c)) {
        case Next::kClose: return Outcome::kClose;
        case Next::kWriteBehind: return Outcome::kWriteBehind;
        default: break;
      }
    }
    int64_t idle_until = clock_->NowMs() + int64_t{opts_.idle_timeout_s} * 1000;
    for (;;) {
      // Wait until a whole request is here (RequestBuffered), giving the
      // connection up to the poller once its slice is over if others are
      // waiting for a worker: between requests, and also while a client
      // trickles one in.
      for (bool gone = false; !WholeRequest(c, &gone);) {
        if (gone || stopping_.load()) return Outcome::kClose;
        if (draining_.load() && c.in.Empty() && !Readable(c.fd))
          return Outcome::kClose;  // idle: nothing to finish
        int64_t now = clock_->NowMs();
        if (!c.in.Empty() && c.request_deadline_ms == 0) {
          c.request_deadline_ms = now + int64_t{opts_.request_timeout_s} * 1000;
        }
        int64_t until = c.in.Empty() ? idle_until : c.request_deadline_ms;
        if (others_wait() && NowMs() >= slice_end) return Outcome::kPark;
        if (now >= until) {
          if (c.in.Empty()) return Outcome::kClose;
          break;  // ServeRequest answers 408
        }
        int64_t wait = std::min<int64_t>(10, until - now);
        if (others_wait()) wait = std::min(wait, slice_end - NowMs());
        pollfd p{c.fd, POLLIN, 0};
        int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, wait)));
        if (r < 0 && errno != EINTR) return Outcome::kClose;
        if (r > 0 && !RecvSome(c)) return Outcome::kClose;  // the peer closed
      }
      if (c.request_deadline_ms == 0)
        c.request_deadline_ms = clock_->NowMs() + int64_t{opts_.request_timeout_s} * 1000;
      Next next = ServeRequest(c);
      c.request_deadline_ms = 0;
      switch (next) {
        case Next::kKeep: break;
        case Next::kClose: return Outcome::kClose;
        case Next::kDefer: return Outcome::kDefer;
        case Next::kWriteBehind: return Outcome::kWriteBehind;
      }
      if (others_wait() && NowMs() >= slice_end) return Outcome::kPark;
      idle_until = clock_->NowMs() + int64_t{opts_.idle_timeout_s} * 1000;
    }
  }

  // kWriteBehind: the answer is partly sent, the rest in Conn::out.
  enum class Next { kKeep, kClose, kDefer, kWriteBehind };

  // Sends a response for an error of framing or limits and closes; bytes the
  // client may still be sending are drained first (briefly), so that it
  // reads the answer instead of a reset.
  Next Refuse(Conn& c, std::string_view path, int status, const std::string& message) {
    Response res;
    res.status = status;
    res.Set(error_body_(message), "application/json");
    ShapeError(path, res);
    Send(c, res, /*keep_alive=*/false, /*head_only=*/false);
    ::shutdown(c.fd, SHUT_WR);
    int64_t until = NowMs() + 1000;
    char sink[16384];
    size_t drained = 0;
    while (drained < (64u << 20) && WaitReadable(c.fd, until, RealClock())) {
      ssize_t n = ::recv(c.fd, sink, sizeof sink, 0);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
    return Next::kClose;
  }

  // A read that got nothing: 408 naming `what` once the request's time is
  // up, else the peer has gone.
  Next ReadFailed(Conn& c, std::string_view path, int64_t deadline, const char* what) {
    if (clock_->NowMs() < deadline) return Next::kClose;
    return Refuse(c, path, 408, std::string(what) + " was not received within server.request_timeout_s");
  }

  Next ServeRequest(Conn& c) {
    const int64_t deadline = c.request_deadline_ms;  // from the request's first byte
    Request req;
    req.connection_fd = c.fd;
    HeadResult head;
    for (;;) {
      head = ParseHead(c.in.View(), opts_.limits, &req);
      if (head.state != HeadResult::kIncomplete) break;
      if (!ReadSome(c, deadline, clock_)) {
        return ReadFailed(c, PathSoFar(c.in.View()), deadline, "the request");
      }
    }
    if (head.state == HeadResult::kError) return Refuse(c, PathSoFar(c.in.View()), head.status, head.error);
    c.in.Consume(head.consumed);
    BodyFraming framing = FramingOf(req);
    if (framing.kind == BodyFraming::kError) return Refuse(c, req.path, framing.status, framing.error);
    const int64_t max_body = opts_.limits.max_body_bytes;
    if (framing.kind == BodyFraming::kLength && framing.length > static_cast<uint64_t>(max_body)) {
      return Refuse(
          c, req.path, 413,
          "request body exceeds the limit of " + std::to_string(max_body) + " bytes (server.max_body_bytes)");
    }
    if (const std::string* expect = req.Find("Expect")) {
      if (!IEquals(*expect, "100-continue"))
        return Refuse(c, req.path, 417, "Expect '" + *expect + "' is not supported");
      if (framing.kind != BodyFraming::kNone && c.in.Empty() && !c.continued && !SendContinue(c)) {
        return Next::kClose;
      }
    }
    if (framing.kind == BodyFraming::kLength) {
      // Straight into the body: what is buffered, then the rest from the socket.
      size_t n = static_cast<size_t>(framing.length);
      req.body.resize(n);
      size_t have = std::min(n, c.in.View().size());
      std::memcpy(req.body.data(), c.in.View().data(), have);
      c.in.Consume(have);
      while (have < n) {
        if (!WaitReadable(c.fd, deadline, clock_)) {
          return ReadFailed(c, req.path, deadline, "the request body");
        }
        ssize_t r;
        do r = ::recv(c.fd, req.body.data() + have, n - have, 0);
        while (r < 0 && errno == EINTR);
        if (r <= 0) return Next::kClose;
        have += static_cast<size_t>(r);
      }
    } else if (framing.kind == BodyFraming::kChunked) {
      for (;;) {
        ChunkedResult chunked = DecodeChunked(c.in.View(), max_body, &req.body);
        c.in.Consume(chunked.consumed);
        if (chunked.state == ChunkedResult::kDone) break;
        if (chunked.state == ChunkedResult::kError) {
          return Refuse(c, req.path, chunked.status,
                        chunked.status == 413 ? chunked.error + " (server.max_body_bytes)" : chunked.error);
        }
        if (!ReadSome(c, deadline, clock_)) {
          return ReadFailed(c, req.path, deadline, "the request body");
        }
      }
    }
    c.continued = false;  // the next request on this connection is a new one
    Response res;
    try {
      handler_(req, res);
    } catch (const std::exception& e) {
      LOG_ERROR << "internal error on " << req.method << " " << req.path << ": " << e.what();
      res = Response{};
      res.status = 500;
      res.Set(error_body_(std::string("internal error: ") + e.what()), "application/json");
    } catch (...) {
      LOG_ERROR << "internal error on " << req.method << " " << req.path;
      res = Response{};
      res.status = 500;
      res.Set(error_body_("internal error"), "application/json");
    }
    if (res.deferred) {
      c.deferred = std::move(res.deferred);
      c.later.keep_alive = WantsKeepAlive(req);
      c.later.head_only = req.method == "HEAD";
      c.later.http11 = req.minor_version >= 1;
      c.later.headers = std::move(res.headers);
      c.later.what = req.method + " " + req.path.substr(0, 200);
      c.later.path = req.path;
      return Next::kDefer;
    }
    ShapeError(req.path, res);
    return Answer(c, res, WantsKeepAlive(req), req.method == "HEAD", req.minor_version >= 1);
  }

  // Sends the answer of a request that was deferred, made now by its Finish.
  Next SendDeferred(Conn& c) {
    Finish finish = std::move(c.finish);
    c.finish = nullptr;
    Response res;
    res.headers = std::move(c.later.headers);
    try {
      finish(res);
    } catch (const std::exception& e) {
      LOG_ERROR << "internal error on " << c.later.what << ": " << e.what();
      res = Response{};
      res.status = 500;
      res.Set(error_body_(std::string("internal error: ") + e.what()), "application/json");
    }
    if (res.deferred) {  // deferred twice: not supported
      LOG_ERROR << "internal error on " << c.later.what << ": its answer was deferred again";
      res = Response{};
      res.status = 500;
      res.Set(error_body_("internal error"), "application/json");
    }
    ShapeError(c.later.path, res);
    return Answer(c, res, c.later.keep_alive, c.later.head_only, c.later.http11);
  }

  // Sends `res`; whether the connection then serves another request.
  Next Answer(Conn& c, const Response& res, bool wants_keep_alive, bool head_only, bool http11) {
    // While draining, a connection stays open only for the requests it has
    // sent already (pipelined): they arrived, so they are answered.
    bool more_here = false;
    if (draining_.load()) {
      bool unused = false;
      more_here = !c.in.Empty() && RequestBuffered(c.in.View(), opts_.limits, &unused);
    }
    bool keep_alive = wants_keep_alive && !stopping_.load() && (!draining_.load() || more_here);
    if (res.stream) {
      return SendStream(c, res, keep_alive && http11, http11) ? Next::kKeep : Next::kClose;
    }
    // What the socket does not take at once is written by the poller: a
    // client that does not read its answer holds no worker.
    std::string head = ResponseHead(res, keep_alive);
    // HTTP/1.0 closes after each answer unless the answer says it stays
    // open (ApacheBench's -k, older proxies).
    if (keep_alive && !http11) head.insert(head.size() - 2, "Connection: keep-alive\r\n");
    iovec v[2] = {{head.data(), head.size()}, {const_cast<char*>(res.body.data()), res.body.size()}};
    if (!WriteOrKeep(c, v, head_only || res.body.empty() ? 1 : 2, opts_.write_timeout_s, clock_))
      return Next::kClose;
    if (!c.out.empty()) {
      c.close_after_out = !keep_alive;
      return Next::kWriteBehind;
    }
    return keep_alive ? Next::kKeep : Next::kClose;
  }

  // A streamed body: chunked when the client speaks HTTP/1.1, else raw
  // bytes and the connection's end as the body's. True when the connection
  // can serve another request.
  bool SendStream(Conn& c, const Response& res, bool keep_alive, bool chunked) {
    std::string head = ResponseHead(res, keep_alive && chunked, /*length=*/false);
    head.insert(head.size() - 2, chunked ? "Transfer-Encoding: chunked\r\n" : "");
    iovec h{head.data(), head.size()};
    bool ok = WriteAll(c.fd, &h, 1);
    auto write = [&](std::string_view bytes) {
      if (!ok || bytes.empty()) return ok;
      char size[24];
      int n = chunked ? std::snprintf(size, sizeof size, "%zx\r\n", bytes.size()) : 0;
      char crlf[] = "\r\n";
      iovec v[3] = {
          {size, static_cast<size_t>(n)}, {const_cast<char*>(bytes.data()), bytes.size()}, {crlf, 2}};
      ok = chunked ? WriteAll(c.fd, v, 3) : WriteAll(c.fd, v + 1, 1);
      return ok;
    };
    try {
      res.stream(write);
    } catch (const std::exception& e) {
      LOG_ERROR << "internal error in a streamed response: " << e.what();
      return false;  // the body is cut short: closing says so
    } catch (...) {
      LOG_ERROR << "internal error in a streamed response";
      return false;
    }
    if (ok && chunked) {
      char last[] = "0\r\n\r\n";
      iovec v{last, 5};
      ok = WriteAll(c.fd, &v, 1);
    }
    return ok && keep_alive && chunked;
  }

  static std::string ResponseHead(const Response& res, bool keep_alive, bool length = true) {
    std::string head;
    head.reserve(160);
    head += "HTTP/1.1 ";
    head += std::to_string(res.status);
    head += ' ';
    head += ReasonPhrase(res.status);
    head += "\r\n";
    if (!res.content_type.empty()) {
      head += "Content-Type: ";
      head += res.content_type;
      head += "\r\n";
    }
    if (res.status != 204 && length) {
      head += "Content-Length: ";
      head += std::to_string(res.body.size());
      head += "\r\n";
    }
    for (const auto& h : res.headers) {
      head += h.name;
      head += ": ";
      head += h.value;
      head += "\r\n";
    }
    if (!keep_alive) head += "Connection: close\r\n";
    head += "\r\n";
    return head;
  }

  // Gives an error answer the shape its path's API wants (SetErrorHook).
  void ShapeError(std::string_view path, Response& res) const {
    if (error_hook_ && res.status >= 400) error_hook_(path, res);
  }

  bool Send(Conn& c, const Response& res, bool keep_alive, bool head_only) {
    std::string head = ResponseHead(res, keep_alive);
    iovec v[2] = {{head.data(), head.size()}, {const_cast<char*>(res.body.data()), res.body.size()}};
    return WriteAll(c.fd, v, head_only || res.body.empty() ? 1 : 2);
  }

  ServerOptions opts_;
  std::function<void(Request&, Response&)> handler_;
  std::function<std::string(std::string_view)> error_body_;
  std::function<void(std::string_view, Response&)> error_hook_;
  const Clock* clock_;  // request, idle, write and drain timeouts
  int listen_fd_ = -1;
  int socket_lock_fd_ = -1;  // flock on unix_path + ".lock" while we own the socket
  bool bound_ = false;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::function<void()> TEST_before_worker_waits_;
  std::function<void()> TEST_on_worker_takes_;
  std::function<void()> TEST_before_stopping_workers_;
  std::atomic<bool> draining_{false};  // Stop() was called: finishing what arrived
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();

  friend class Server;
};

Server::Server(ServerOptions options, std::function<void(Request&, Response&)> handler,
               std::function<std::string(std::string_view)> error_body, const Clock* clock)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler), std::move(error_body), clock)) {}

Server::~Server() = default;

Status Server::Bind() {
  ASSIGN_OR_RETURN(port_, impl_->Bind());
  return Status::OK();
}

void Server::Serve() { impl_->Serve(); }

void Server::Stop() { impl_->Stop(); }

void Server::SetErrorHook(std::function<void(std::string_view path, Response& res)> hook) {
  impl_->error_hook_ = std::move(hook);
}

void Server::TEST_SetBeforeWorkerWaits(std::function<void()> hook) {
  impl_->TEST_before_worker_waits_ = std::move(hook);
}

void Server::TEST_SetOnWorkerTakes(std::function<void()> hook) {
  impl_->TEST_on_worker_takes_ = std::move(hook);
}

void Server::TEST_SetBeforeStoppingWorkers(std::function<void()> hook) {
  impl_->TEST_before_stopping_workers_ = std::move(hook);
}

bool Server::TEST_stopping() const { return impl_->TEST_stopping(); }

}  // namespace aotid::http
