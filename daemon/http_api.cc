#include "daemon/http_api.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "daemon/config.h"
#include "daemon/tensor_codec.h"

namespace aotid::daemon {
namespace {

// cpp-httplib's request handling (routing, the handlers below, 413s, the
// exception handler) on a connection aotid accepted itself.
class ConnectionServer final : public httplib::Server {
 public:
  bool Process(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
    return process_request(strm, close_connection, connection_closed, nullptr);
  }
};

// The connection the calling HTTP thread is serving (-1 outside one).
thread_local int t_connection_fd = -1;

// Whether the peer of `fd` has closed its end (or the connection broke).
// A client that half-closes after sending its request counts as gone; HTTP
// clients do not do that.
bool PeerClosed(int fd) {
#ifdef POLLRDHUP
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
#else
  pollfd p{fd, POLLIN, 0};
  char c;
  return ::poll(&p, 1, 0) > 0 && ((p.revents & (POLLHUP | POLLERR)) != 0 || ::recv(fd, &c, 1, MSG_PEEK) == 0);
#endif
}

using json = nlohmann::json;
constexpr char kJson[] = "application/json";
// The binary tensor extension: the JSON part's length, the rest is tensor bytes.
constexpr char kHeaderLength[] = "Inference-Header-Content-Length";

void SendError(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(json{{"error", message}}.dump(), kJson);
}

void SendStatus(httplib::Response& res, const Status& s) {
  if (s.code() == StatusCode::kResourceExhausted) res.set_header("Retry-After", "1");  // a full queue drains fast
  SendError(res, HttpStatusFor(s), s.message());
}

json TensorList(const std::vector<runtime::TensorSpec>& specs) {
  json arr = json::array();
  for (const auto& t : specs) {
    arr.push_back({{"name", t.name}, {"datatype", runtime::DTypeName(t.dtype)}, {"shape", t.shape}});
  }
  return arr;
}

// Finds the model a request names, honouring an optional version segment.
// Names and versions are checked like everywhere else before any lookup.
StatusOr<std::shared_ptr<const ServedModel>> Resolve(const ModelRegistry* registry, const httplib::Request& req) {
  std::string name = req.matches[1];
  RETURN_IF_ERROR(storage::ValidateModelName(name));
  std::string v = req.matches.size() > 2 ? std::string(req.matches[2]) : "";
  if (v.empty()) {
    auto m = registry->Find(name);
    if (!m) return NotFound("unknown model '" + name + "'");
    return m;
  }
  std::string unused;
  std::optional<int64_t> version;
  RETURN_IF_ERROR(storage::ParseModelRef(name + ":" + v, &unused, &version));
  auto m = registry->Find(name, *version);
  if (m) return m;
  auto served = registry->All();
  auto it = served->find(name);
  if (it == served->end()) return NotFound("unknown model '" + name + "'");
  std::string have;
  for (const auto& [n, sm] : it->second) have += (have.empty() ? "" : ", ") + std::to_string(n);
  return NotFound("model '" + name + "' has no served version " + v + " (serving: " + have + ")");
}

Status NotReady(const ServedModel& m) {
  std::string what = "model '" + m.name + "' version " + std::to_string(m.version);
  switch (m.state) {
    case ServeState::kQueued: return Unavailable(what + " is queued for its build; try again shortly");
    case ServeState::kLoading: return Unavailable(what + " is loading; try again shortly");
    case ServeState::kBuilding:
      return Unavailable(what + " is " + (m.message.empty() ? "building" : m.message) + "; try again shortly");
    case ServeState::kFailed: return Unavailable(what + " failed: " + m.message);
    case ServeState::kReady: break;
  }
  return Unavailable(what + " is not ready");
}

// Compares without stopping at the first difference, so the time taken
// says nothing about how much of a guess was right.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

bool OriginAllowed(const std::vector<std::string>& allowed, const std::string& origin) {
  for (const auto& o : allowed) {
    if (o == "*" || o == origin) return true;
  }
  return false;
}

}  // namespace

std::string HostWithoutPort(const std::string& host_header) {
  if (!host_header.empty() && host_header.front() == '[') {
    size_t close = host_header.find(']');
    return close == std::string::npos ? host_header : host_header.substr(1, close - 1);
  }
  size_t colon = host_header.find(':');
  if (colon != std::string::npos && host_header.find(':', colon + 1) == std::string::npos) {
    return host_header.substr(0, colon);
  }
  return host_header;
}

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAlreadyExists: return 409;
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kResourceExhausted: return 503;
    default: return 500;
  }
}

HttpApi::HttpApi(const ModelRegistry* registry, Metrics* metrics, HttpOptions options)
    : registry_(registry), metrics_(metrics), options_(std::move(options)),
      server_(std::make_unique<ConnectionServer>()) {
  server_->set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  Routes();
}

HttpApi::~HttpApi() = default;

void HttpApi::Routes() {
  auto& s = *server_;
  const ModelRegistry* reg = registry_;

  s.set_pre_routing_handler([opts = options_](const httplib::Request& req, httplib::Response& res) {
    using R = httplib::Server::HandlerResponse;
    if (opts.check_host && req.has_header("Host")) {
      std::string host = HostWithoutPort(req.get_header_value("Host"));
      bool ok = IsLoopbackHost(host) ||
                std::find(opts.allowed_hosts.begin(), opts.allowed_hosts.end(), host) != opts.allowed_hosts.end();
      if (!ok) {
        SendError(res, 403, "Host '" + host + "' is not allowed: aotid listens on loopback and answers only "
                            "requests addressed to a loopback name (add the name to server.allowed_hosts to "
                            "allow it)");
        return R::Handled;
      }
    }
    std::string origin = req.get_header_value("Origin");
    if (req.method == "OPTIONS") {  // CORS preflight
      if (origin.empty() || !OriginAllowed(opts.cors_origins, origin)) {
        SendError(res, 403, origin.empty() ? "OPTIONS is only answered as a CORS preflight"
                                           : "origin '" + origin + "' is not in server.cors_origins");
        return R::Handled;
      }
      res.status = 204;
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Content-Type, Authorization, Inference-Header-Content-Length");
      res.set_header("Access-Control-Max-Age", "600");
      return R::Handled;
    }
    bool needs_token = opts.token_for_all || req.path.rfind("/v2/repository/", 0) == 0;
    if (!opts.token.empty() && needs_token) {
      std::string auth = req.get_header_value("Authorization");
      if (auth.empty()) {
        res.set_header("WWW-Authenticate", "Bearer");
        SendError(res, 401, "this aotid needs a bearer token: send 'Authorization: Bearer <token>' "
                            "(the token is in the file server.token_file names)");
        return R::Handled;
      }
      if (auth.rfind("Bearer ", 0) != 0 || !ConstantTimeEquals(auth.substr(7), opts.token)) {
        SendError(res, 403, "wrong bearer token");
        return R::Handled;
      }
    }
    return R::Unhandled;
  });
  if (!options_.cors_origins.empty()) {
    s.set_post_routing_handler([origins = options_.cors_origins](const httplib::Request& req, httplib::Response& res) {
      std::string origin = req.get_header_value("Origin");
      if (!origin.empty() && OriginAllowed(origins, origin)) {
        res.set_header("Access-Control-Allow-Origin", origin);
        res.set_header("Vary", "Origin");
      }
    });
  }

  s.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"live":true})", kJson);
  });
  s.Get("/v2/health/ready", [reg](const httplib::Request&, httplib::Response& res) {
    bool ready = reg->startup_done();
    res.status = ready ? 200 : 503;
    res.set_content(json{{"ready", ready}}.dump(), kJson);
  });
  s.Get("/v2", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"name", "aotid"}, {"version", AOTID_VERSION}, {"extensions", json::array()}}.dump(),
                    kJson);
  });

  auto metadata = [reg](const httplib::Request& req, httplib::Response& res) {
    auto m = Resolve(reg, req);
    if (!m.ok()) return SendStatus(res, m.status());
    const ServedModel& sm = **m;
    json versions = json::array();
    auto served = reg->All();
    if (auto it = served->find(sm.name); it != served->end()) {
      for (const auto& [n, unused] : it->second) versions.push_back(std::to_string(n));
    }
    json j{{"name", sm.name},
           {"version", std::to_string(sm.version)},
           {"versions", versions},
           {"platform", "aotid_aoti"},
           {"state", ServeStateName(sm.state)},
           {"device", sm.device}};
    if (sm.model) {
      j["inputs"] = TensorList(sm.model->spec().inputs);
      j["outputs"] = TensorList(sm.model->spec().outputs);
    } else {
      j["inputs"] = json::array();
      j["outputs"] = json::array();
    }
    if (sm.state == ServeState::kFailed) j["error"] = sm.message;
    if (!sm.device_note.empty()) j["device_note"] = sm.device_note;
    if (!sm.package_json.empty()) {
      json p = json::parse(sm.package_json, nullptr, false);
      if (p.is_object()) {
        j["parameters"] = {{"package_kind", p.value("kind", "")},
                           {"aoti", p.value("aoti", json::object())},
                           {"author", p.value("author", json::object())}};
      }
    }
    res.set_content(j.dump(), kJson);
  };
  s.Get(R"(/v2/models/([^/]+))", metadata);
  s.Get(R"(/v2/models/([^/]+)/versions/([^/]+))", metadata);

  auto ready = [reg](const httplib::Request& req, httplib::Response& res) {
    auto m = Resolve(reg, req);
    if (!m.ok()) return SendStatus(res, m.status());
    bool ok = (*m)->state == ServeState::kReady;
    res.status = ok ? 200 : 503;
    json j{{"name", (*m)->name}, {"ready", ok}, {"state", ServeStateName((*m)->state)}};
    if (!ok) j["error"] = NotReady(**m).message();
    res.set_content(j.dump(), kJson);
  };
  s.Get(R"(/v2/models/([^/]+)/ready)", ready);
  s.Get(R"(/v2/models/([^/]+)/versions/([^/]+)/ready)", ready);

  Metrics* metrics = metrics_;
  auto infer = [reg, metrics](const httplib::Request& req, httplib::Response& res) {
    using Clock = std::chrono::steady_clock;
    auto start = Clock::now();
    Metrics::InFlight in_flight(metrics);
    auto m = Resolve(reg, req);
    if (!m.ok()) return SendStatus(res, m.status());  // not counted: the name is the caller's, not a model
    std::shared_ptr<const ServedModel> sm = *m;
    double compute_s = 0;
    // Records the request however the handler returns.
    struct Done {
      Metrics* metrics;
      const ServedModel& sm;
      const httplib::Response& res;
      Clock::time_point start;
      const double& compute_s;
      ~Done() {
        metrics->RecordInfer(sm.name, sm.version, res.status,
                             std::chrono::duration<double>(Clock::now() - start).count(), compute_s);
      }
    } done{metrics, *sm, res, start, compute_s};
    if (sm->state != ServeState::kReady || !sm->model) return SendStatus(res, NotReady(*sm));
    std::optional<size_t> json_length;
    if (req.has_header(kHeaderLength)) {
      std::string v = req.get_header_value(kHeaderLength);
      size_t n = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (v.empty() || ec != std::errc() || p != v.data() + v.size()) {
        return SendError(res, 400, std::string(kHeaderLength) + " must be a byte count, got '" + v + "'");
      }
      json_length = n;
    }
    auto decoded = DecodeInferRequest(req.body, sm->model->spec(), {}, json_length);
    if (!decoded.ok()) return SendStatus(res, decoded.status());
    // A request whose client has gone is not run (here, or by the batcher
    // when it forms the batch); it counts as 499, as nginx has it.
    int fd = t_connection_fd;
    if (fd >= 0 && PeerClosed(fd)) return SendError(res, 499, runtime::kClientGone);
    runtime::SetClientAlive(fd >= 0 ? runtime::ClientAlive([fd] { return !PeerClosed(fd); }) : nullptr);
    auto run_start = Clock::now();
    auto outputs = sm->model->Infer(decoded->inputs);
    compute_s = std::chrono::duration<double>(Clock::now() - run_start).count();
    runtime::SetClientAlive(nullptr);
    if (!outputs.ok() && outputs.status().message() == runtime::kClientGone) {
      return SendError(res, 499, runtime::kClientGone);
    }
    if (!outputs.ok()) return SendStatus(res, outputs.status());
    res.status = 200;
    EncodedResponse encoded = EncodeInferResponse(sm->name, sm->version, *decoded, *outputs);
    if (encoded.has_binary) {
      res.set_header(kHeaderLength, std::to_string(encoded.json_length));
      res.set_content(std::move(encoded.body), "application/octet-stream");
    } else {
      res.set_content(std::move(encoded.body), kJson);
    }
  };
  s.Post(R"(/v2/models/([^/]+)/infer)", infer);
  s.Post(R"(/v2/models/([^/]+)/versions/([^/]+)/infer)", infer);

  s.Get("/metrics", [reg, metrics](const httplib::Request&, httplib::Response& res) {
    int loaded = 0;
    for (const auto& [name, versions] : *reg->All()) {
      for (const auto& [v, sm] : versions) loaded += sm->state == ServeState::kReady;
    }
    metrics->SetModelsLoaded(loaded);
    res.set_content(metrics->Render(), "text/plain; version=0.0.4");
  });

  // The model repository extension: what the store holds, and whether each
  // model is served. Load and unload write the store (so they outlast a
  // restart) and wait, boundedly, for the daemon to act on it.
  s.Post("/v2/repository/index", [reg](const httplib::Request& req, httplib::Response& res) {
    bool only_ready = false;
    if (!req.body.empty()) {
      json body = json::parse(req.body, nullptr, false);
      if (!body.is_object()) return SendError(res, 400, "repository index body must be a JSON object");
      if (body.contains("ready")) {
        if (!body["ready"].is_boolean()) return SendError(res, 400, "'ready' must be true or false");
        only_ready = body["ready"].get<bool>();
      }
    }
    auto catalog = reg->GetCatalog();
    json out = json::array();
    for (const auto& e : *catalog) {
      auto sm = reg->Find(e.name, e.version);
      std::string state = "UNAVAILABLE", reason;
      if (sm) {
        switch (sm->state) {
          case ServeState::kReady: state = "READY"; break;
          case ServeState::kFailed: reason = sm->message; break;
          default: state = "LOADING"; reason = std::string(ServeStateName(sm->state)); break;
        }
        if (!e.wanted && sm->state == ServeState::kReady) reason = "serving until a newer version is ready";
      } else {
        reason = !e.enabled ? "unloaded" : "not served by version policy '" + e.policy + "'";
      }
      if (only_ready && state != "READY") continue;
      json item{{"name", e.name}, {"version", std::to_string(e.version)}, {"state", state}};
      if (!reason.empty()) item["reason"] = reason;
      out.push_back(std::move(item));
    }
    res.set_content(out.dump(), kJson);
  });
  auto set_enabled = [reg, dir = options_.store_dir](bool enable) {
    return [reg, dir, enable](const httplib::Request& req, httplib::Response& res) {
      std::string name = req.matches[1];
      if (Status s = storage::ValidateModelName(name); !s.ok()) return SendStatus(res, s);
      auto store = storage::ModelStore::Open(dir, /*create=*/false);
      if (!store.ok()) return SendStatus(res, store.status());
      auto changed = (*store)->Set(name, std::nullopt, {{"enabled", enable ? "true" : "false"}});
      if (!changed.ok()) return SendStatus(res, changed.status());
      // The store watch sees the commit within milliseconds; wait (at most
      // 5 s) until the registry shows it, so the reply describes the result.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (std::chrono::steady_clock::now() < deadline && (reg->Find(name) != nullptr) != enable) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      auto sm = reg->Find(name);
      json j{{"name", name}, {"enabled", enable}};
      j["state"] = sm ? std::string(ServeStateName(sm->state)) : "unloaded";
      res.set_content(j.dump(), kJson);
    };
  };
  s.Post(R"(/v2/repository/models/([^/]+)/load)", set_enabled(true));
  s.Post(R"(/v2/repository/models/([^/]+)/unload)", set_enabled(false));

  // Bodies for statuses the library produces itself (404 no route, 413, 400).
  s.set_error_handler(httplib::Server::HandlerWithResponse([max = options_.max_body_bytes](
                                                              const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    switch (res.status) {
      case 404: msg = "no route for " + req.method + " " + req.path; break;
      case 413: msg = "request body exceeds the limit of " + std::to_string(max) + " bytes (server.max_body_bytes)"; break;
      case 414: msg = "request URI too long"; break;
      case 400: msg = "malformed HTTP request"; break;
      default: msg = "HTTP status " + std::to_string(res.status);
    }
    res.set_content(json{{"error", msg}}.dump(), kJson);
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    LOG_ERROR << "internal error on " << req.method << " " << req.path << ": " << what;
    SendError(res, 500, "internal error: " + what);
  });
}

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One accepted connection as httplib reads and writes it. Every read of a
// request shares one deadline, so a client that trickles its headers or
// body (slowloris) is cut off after the request time limit, not after each
// byte's timeout.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(int fd, std::string peer, int write_timeout_ms)
      : fd_(fd), peer_(std::move(peer)), write_timeout_ms_(write_timeout_ms) {}

  void StartRequest(int64_t deadline_ms) { deadline_ms_ = deadline_ms; }

  bool is_readable() const override {
    return pos_ < end_ || Wait(POLLIN, std::max<int64_t>(0, deadline_ms_ - NowMs()));
  }
  bool is_writable() const override { return Wait(POLLOUT, write_timeout_ms_); }
  // Buffered: httplib reads the request line and headers a byte at a time.
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == end_) {
      if (size >= sizeof buf_) return Recv(ptr, size);  // a large body: straight into place
      ssize_t n = Recv(buf_, sizeof buf_);
      if (n <= 0) return n;
      pos_ = 0;
      end_ = static_cast<size_t>(n);
    }
    size_t n = std::min(size, end_ - pos_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  bool HasBuffered() const { return pos_ < end_; }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }
  ssize_t Recv(char* ptr, size_t size) {
    if (!Wait(POLLIN, std::max<int64_t>(0, deadline_ms_ - NowMs()))) return -1;
    ssize_t n;
    do n = ::recv(fd_, ptr, size, 0);
    while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = peer_;
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "";
    port = 0;
  }
  socket_t socket() const override { return fd_; }

 private:
  bool Wait(short events, int64_t timeout_ms) const {
    pollfd p{fd_, events, 0};
    int r;
    do r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(timeout_ms, 1 << 30)));
    while (r < 0 && errno == EINTR);
    return r > 0 && (p.revents & (events | POLLHUP)) != 0;
  }

  int fd_;
  std::string peer_;
  int write_timeout_ms_;
  int64_t deadline_ms_ = 0;
  char buf_[4096];
  size_t pos_ = 0, end_ = 0;
};

std::string PeerName(const sockaddr_storage& addr) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, buf, sizeof buf);
  } else if (addr.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, buf, sizeof buf);
  } else {
    return "unix";
  }
  return buf;
}

}  // namespace

// The listening socket and its accept loop. aotid accepts connections
// itself (TCP or a unix socket) and hands each to a worker thread, which
// runs httplib's request handling on it: Debian's cpp-httplib (0.11.4) can
// neither listen on a unix socket nor bound the time a whole request takes,
// and it listens with a backlog of 5, which a burst of clients overflows.
class HttpApi::Listener {
 public:
  Listener(ConnectionServer* server, const HttpOptions& options) : server_(server), options_(options) {}
  ~Listener() {
    Stop();
    if (fd_ >= 0) ::close(fd_);
    if (!options_.unix_path.empty() && bound_) ::unlink(options_.unix_path.c_str());
  }

  StatusOr<int> Bind() {
    if (!options_.unix_path.empty()) return BindUnix();
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    std::string port = std::to_string(options_.port);
    if (int rc = ::getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      return InvalidArgument("cannot listen on " + options_.host + ": " + ::gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> owner(res, ::freeaddrinfo);
    fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return ErrnoError("socket", errno);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd_, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd_, SOMAXCONN) != 0) {
      int e = errno;
      return Unavailable("cannot listen on " + options_.host + ":" + port + ": " + std::strerror(e) +
                         " (set server.listen or --listen)");
    }
    bound_ = true;
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }

  void Serve() {
    httplib::ThreadPool pool(static_cast<size_t>(std::max(1, options_.threads)));
    while (!stopping_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;  // wakes to notice Stop()
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      int conn = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
      if (conn < 0) continue;
      if (peer.ss_family != AF_UNIX) {
        int one = 1;
        ::setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small replies must not wait on Nagle
      }
      pool.enqueue([this, conn, name = PeerName(peer)] { Handle(conn, name); });
    }
    pool.shutdown();
  }

  void Stop() { stopping_.store(true); }

 private:
  StatusOr<int> BindUnix() {
    const std::string& path = options_.unix_path;
    sockaddr_un addr{};
    if (path.size() >= sizeof addr.sun_path) return InvalidArgument("unix socket path is too long: " + path);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    // A socket file left by an earlier run (the daemon holds the store lock,
    // so no other aotid is using it); anything else is not ours to remove.
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) return FailedPrecondition(path + " exists and is not a socket");
      ::unlink(path.c_str());
    }
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return ErrnoError("socket", errno);
    mode_t old = ::umask(0117);  // created 0660: owner and group
    int rc = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int e = errno;
    ::umask(old);
    if (rc != 0) return Unavailable("cannot listen on unix:" + path + ": " + std::strerror(e));
    bound_ = true;
    if (::chmod(path.c_str(), 0660) != 0) return ErrnoError("chmod 0660 " + path, errno);
    if (::listen(fd_, SOMAXCONN) != 0) return ErrnoError("listen on unix:" + path, errno);
    return 0;
  }

  void Handle(int fd, const std::string& peer) {
    ConnStream strm(fd, peer, 30'000);
    t_connection_fd = fd;
    while (!stopping_.load()) {
      // Idle between requests: wait for the next one's first byte (it may
      // already be buffered, pipelined behind the last request).
      if (!strm.HasBuffered()) {
        pollfd p{fd, POLLIN, 0};
        int64_t idle_until = NowMs() + int64_t{options_.idle_timeout_s} * 1000;
        int r = 0;
        while (!stopping_.load() && (r = ::poll(&p, 1, 100)) == 0 && NowMs() < idle_until) {
        }
        if (r <= 0 || (p.revents & POLLIN) == 0 || stopping_.load()) break;
      }
      int64_t deadline = NowMs() + int64_t{options_.request_timeout_s} * 1000;
      strm.StartRequest(deadline);
      bool closed = false;
      bool ok = server_->Process(strm, /*close_connection=*/false, closed);
      // A request that could not be read whole (timed out, malformed, cut
      // off) ends the connection: its remaining bytes cannot be trusted.
      if (closed || !ok || NowMs() >= deadline) break;
    }
    t_connection_fd = -1;
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }

  ConnectionServer* server_;
  HttpOptions options_;
  int fd_ = -1;
  bool bound_ = false;
  std::atomic<bool> stopping_{false};
};

Status HttpApi::Bind() {
  listener_ = std::make_unique<Listener>(static_cast<ConnectionServer*>(server_.get()), options_);
  ASSIGN_OR_RETURN(port_, listener_->Bind());
  return Status::OK();
}

std::string HttpApi::Address() const {
  if (!options_.unix_path.empty()) return "unix:" + options_.unix_path;
  std::string host = options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
  return "http://" + host + ":" + std::to_string(port_);
}

void HttpApi::Serve() {
  if (listener_) listener_->Serve();
}

void HttpApi::Stop() {
  if (listener_) listener_->Stop();
}

}  // namespace aotid::daemon
