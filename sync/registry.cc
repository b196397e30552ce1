#include "sync/registry.h"

#include <fcntl.h>
#include <httplib.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/fs.h"
#include "base/json.h"
#include "base/mutex.h"
#include "http/host.h"

namespace aotid::sync {
namespace {

// Clients in flight, with the cancel flag each answers to: StopTransfers
// closes their sockets, since a registry that sends nothing never reaches
// the download's own check of the flag and would hold a stopping daemon
// for its whole read timeout.
struct LiveClients {
  Mutex mu;
  std::vector<std::pair<const std::atomic<bool>*, httplib::Client*>> clients GUARDED_BY(mu);
};
LiveClients& Live() {
  static auto* live = new LiveClients;
  return *live;
}

class LiveClient {
 public:
  LiveClient(httplib::Client* c, const std::atomic<bool>* cancel) : c_(c), cancel_(cancel) {
    if (cancel_ == nullptr) return;
    MutexLock lock(&Live().mu);
    Live().clients.emplace_back(cancel_, c_);
  }
  ~LiveClient() {
    if (cancel_ == nullptr) return;
    MutexLock lock(&Live().mu);
    auto& v = Live().clients;
    v.erase(std::remove(v.begin(), v.end(), std::make_pair(cancel_, c_)), v.end());
  }
  LiveClient(const LiveClient&) = delete;
  LiveClient& operator=(const LiveClient&) = delete;
  // After registering: a cancel that came before it is seen here.
  bool cancelled() const { return cancel_ != nullptr && cancel_->load(); }

 private:
  httplib::Client* c_;
  const std::atomic<bool>* cancel_;
};

constexpr char kManifestMediaType[] = "application/vnd.oci.image.manifest.v1+json";
constexpr int kMaxRedirects = 5;

// Whether a reference's or an origin's host ("127.0.0.1", "[::1]",
// "localhost") is this machine: the HTTP layer's address check, not a
// prefix ("127.example.com" is a name anyone's DNS may answer).
bool IsLoopback(std::string host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return http::IsLoopbackHost(host);
}

// OCI distribution's repository name: path components of lowercase
// letters and digits joined by '.', '_', '__' or '-'s.
bool ValidRepo(std::string_view repo) {
  if (repo.empty() || repo.size() > 255) return false;
  size_t start = 0;
  while (start <= repo.size()) {
    size_t end = repo.find('/', start);
    std::string_view part =
        repo.substr(start, end == std::string_view::npos ? repo.size() - start : end - start);
    if (part.empty() || !std::isalnum(static_cast<unsigned char>(part.front())) ||
        !std::isalnum(static_cast<unsigned char>(part.back()))) {
      return false;
    }
    for (size_t i = 0; i < part.size(); ++i) {
      char c = part[i];
      bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
      if (!ok || (c == '.' && i + 1 < part.size() && !std::isalnum(static_cast<unsigned char>(part[i + 1]))))
        return false;
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return true;
}

bool ValidTag(std::string_view tag) {
  if (tag.empty() || tag.size() > 128 || tag.front() == '.' || tag.front() == '-') return false;
  return std::all_of(tag.begin(), tag.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

std::string Base64(std::string_view in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t n = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += {k[n >> 18], k[(n >> 12) & 63], k[(n >> 6) & 63], k[n & 63]};
  }
  if (i + 1 == in.size()) {
    uint32_t n = uint8_t(in[i]) << 16;
    out += {k[n >> 18], k[(n >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    uint32_t n = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {k[n >> 18], k[(n >> 12) & 63], k[(n >> 6) & 63], '='};
  }
  return out;
}

// The parameters of a `WWW-Authenticate: Bearer realm="..",service="..",scope=".."`.
std::map<std::string, std::string> ChallengeParams(std::string_view s) {
  std::map<std::string, std::string> out;
  size_t i = s.find(' ');
  while (i != std::string_view::npos && i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
    size_t eq = s.find('=', i);
    if (eq == std::string_view::npos) break;
    std::string key(s.substr(i, eq - i));
    std::string value;
    size_t j = eq + 1;
    if (j < s.size() && s[j] == '"') {
      size_t close = s.find('"', j + 1);
      if (close == std::string_view::npos) break;
      value = s.substr(j + 1, close - j - 1);
      i = close + 1;
    } else {
      size_t comma = s.find(',', j);
      value = s.substr(j, comma == std::string_view::npos ? std::string_view::npos : comma - j);
      i = comma;
    }
    std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
    out[key] = value;
  }
  return out;
}

// "https://auth.example.com:443/token" -> origin and path.
bool SplitUrl(const std::string& url, std::string* origin, std::string* path) {
  size_t scheme = url.find("://");
  if (scheme == std::string::npos ||
      (url.compare(0, scheme, "http") != 0 && url.compare(0, scheme, "https") != 0))
    return false;
  size_t slash = url.find('/', scheme + 3);
  *origin = url.substr(0, slash);
  *path = slash == std::string::npos ? "/" : url.substr(slash);
  return true;
}

std::string HostOf(const std::string& origin) {
  size_t start = origin.find("://");
  std::string hostport = origin.substr(start == std::string::npos ? 0 : start + 3);
  if (hostport.starts_with("[")) return hostport.substr(0, hostport.find(']') + 1);
  return hostport.substr(0, hostport.find(':'));
}

std::string UrlEncode(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// "http://host:port" with the scheme's port made explicit: credentials go
// only where scheme, host and port are all the registry's.
std::string CanonicalOrigin(const std::string& origin) {
  size_t scheme = origin.find("://");
  std::string s = origin.substr(0, scheme), hostport = origin.substr(scheme + 3);
  bool has_port = hostport.starts_with("[") ? hostport.find("]:") != std::string::npos
                                            : hostport.find(':') != std::string::npos;
  return has_port ? origin : origin + (s == "https" ? ":443" : ":80");
}

bool IsLoopbackOrigin(const std::string& origin) { return IsLoopback(HostOf(origin)); }

std::string ErrorText(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect";
    case httplib::Error::Read:
      return "no answer in time, or the connection closed (a slow registry needs a longer --timeout)";
    case httplib::Error::Write: return "sending failed (the connection closed, or no progress in time)";
    case httplib::Error::SSLConnection: return "the TLS handshake failed";
    case httplib::Error::SSLServerVerification:
      return "the registry's certificate is not trusted by this machine's CA store";
    case httplib::Error::ConnectionTimeout: return "connecting timed out";
    default: return httplib::to_string(e);
  }
}

}  // namespace

// Text from a registry, made safe to print and log: control characters
// (a forged log line, terminal escapes) become '?', and it is cut short.
std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 300)) out += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
  if (s.size() > 300) out += "...";
  return out;
}

struct Registry::Answer {
  int status = 0;
  httplib::Headers headers;
  std::string body;
  std::string Header(const std::string& key) const {
    auto it = headers.find(key);
    return it == headers.end() ? "" : it->second;
  }
};

std::string OciRef::Origin() const {
  return std::string(plain_http ? "http://" : "https://") + host + (port ? ":" + std::to_string(port) : "");
}

std::string OciRef::ToString() const {
  return "oci://" + host + (port ? ":" + std::to_string(port) : "") + "/" + repo +
         (tag.empty() ? "" : ":" + tag);
}

void StopTransfers(const std::atomic<bool>* cancel) {
  MutexLock lock(&Live().mu);
  for (const auto& [flag, client] : Live().clients) {
    if (flag == cancel) client->stop();
  }
}

bool IsValidDigest(std::string_view digest) {
  return digest.starts_with("sha256:") && fs::IsSha256Hex(digest.substr(7));
}

StatusOr<OciRef> ParseOciRef(std::string_view text, bool insecure) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("'" + std::string(text) +
                           "' is not an OCI reference (oci://HOST[:PORT]/REPO[:TAG]): " + why);
  };
  if (!text.starts_with("oci://")) return bad("it does not start with oci://");
  std::string_view rest = text.substr(6);
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0) return bad("no repository after the host");
  std::string_view hostport = rest.substr(0, slash);
  std::string_view path = rest.substr(slash + 1);
  if (hostport.find('@') != std::string_view::npos) {
    return InvalidArgument("a reference with credentials in it is not taken (they would show in logs and " +
                           std::string("`ps`); give them with --credentials FILE"));
  }
  OciRef ref;
  if (hostport.starts_with("[")) {
    size_t close = hostport.find(']');
    if (close == std::string_view::npos) return bad("unclosed [ in the host");
    ref.host = std::string(hostport.substr(0, close + 1));
    hostport = hostport.substr(close + 1);
    if (!hostport.empty() && hostport.front() != ':') return bad("unexpected text after the host");
  } else {
    size_t colon = hostport.find(':');
    ref.host = std::string(hostport.substr(0, colon));
    hostport = colon == std::string_view::npos ? std::string_view() : hostport.substr(colon);
  }
  if (ref.host.empty() || ref.host.find_first_of("@?#%/ ") != std::string::npos) return bad("bad host");
  if (!hostport.empty()) {
    std::string_view p = hostport.substr(1);
    auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), ref.port);
    if (ec != std::errc() || end != p.data() + p.size() || ref.port < 1 || ref.port > 65535)
      return bad("bad port '" + std::string(p) + "'");
  }
  size_t colon = path.rfind(':');
  if (colon != std::string_view::npos && path.find('/', colon) == std::string_view::npos) {
    ref.tag = std::string(path.substr(colon + 1));
    path = path.substr(0, colon);
    if (!ValidTag(ref.tag))
      return bad("bad tag '" + ref.tag +
                 "' (letters, digits, '_', '.', '-', starting with a letter, digit or '_'; at most 128)");
  }
  ref.repo = std::string(path);
  if (!ValidRepo(ref.repo)) {
    return bad("bad repository '" + ref.repo +
               "' (lowercase letters and digits, joined by '.', '_' or '-', in /-separated parts)");
  }
  ref.plain_http = insecure || IsLoopback(ref.host);
  return ref;
}

Status Registry::Authorize(const std::string& challenge) {
  if (challenge.rfind("Basic", 0) == 0 || challenge.rfind("basic", 0) == 0) {
    if (creds_.user.empty())
      return FailedPrecondition(ref_.Origin() + " asks for a user name and password (--credentials FILE)");
    return Status::OK();  // basic credentials go with every request already
  }
  if (challenge.rfind("Bearer", 0) != 0 && challenge.rfind("bearer", 0) != 0)
    return FailedPrecondition(ref_.Origin() +
                              " asks for an authentication aotid does not speak: " + Printable(challenge));
  auto params = ChallengeParams(challenge);
  std::string origin, path;
  if (!SplitUrl(params["realm"], &origin, &path)) {
    return FailedPrecondition(ref_.Origin() + " names a token realm that is not an http(s) URL: '" +
                              Printable(params["realm"]) + "'");
  }
  // Credentials go only to the registry's own origin (scheme, host, port).
  // A token service elsewhere is asked anonymously (as public registries
  // have it), which sends it nothing of ours.
  const bool elsewhere = CanonicalOrigin(origin) != CanonicalOrigin(ref_.Origin());
  if (elsewhere && !creds_.user.empty()) {
    return FailedPrecondition(ref_.Origin() + " names a token service elsewhere (" + Printable(origin) +
                              "); aotid sends the credentials only to the registry itself");
  }
  if (origin.starts_with("http://") && !ref_.plain_http)
    return FailedPrecondition("the token realm " + origin + " is plain HTTP while the registry is not");
  std::string query = "?service=" + UrlEncode(params["service"]);
  if (!params["scope"].empty()) query += "&scope=" + UrlEncode(params["scope"]);
  httplib::Client cli(origin);
  cli.set_connection_timeout(limits_.timeout_s);
  cli.set_read_timeout(limits_.timeout_s);
  LiveClient live(&cli, cancel_);
  if (live.cancelled()) return Cancelled("the sync was stopped");
  httplib::Headers headers;
  if (!creds_.user.empty())
    headers.emplace("Authorization", "Basic " + Base64(creds_.user + ":" + creds_.password));
  auto res = cli.Get(path + query, headers);
  if (!res) return Unavailable("asking " + origin + " for a token: " + ErrorText(res.error()));
  if (res->status == 401 || res->status == 403)
    return FailedPrecondition(origin + " refused the credentials (HTTP " + std::to_string(res->status) + ")");
  if (res->status != 200)
    return Unavailable(origin + " answered HTTP " + std::to_string(res->status) + " for a token");
  nlohmann::json j = ParseJsonOrDiscarded(res->body);
  std::string token;
  if (j.is_object() && j.contains("token") && j["token"].is_string()) token = j["token"];
  if (token.empty() && j.is_object() && j.contains("access_token") && j["access_token"].is_string())
    token = j["access_token"];
  if (token.empty() || token.find_first_of("\r\n") != std::string::npos)
    return Unavailable(origin + " gave no usable token");
  bearer_ = token;
  return Status::OK();
}

void Registry::PreferTls() {
  if (tls_probed_) return;
  tls_probed_ = true;
  if (!ref_.plain_http) return;
  OciRef tls = ref_;
  tls.plain_http = false;
  httplib::Client cli(tls.Origin());
  cli.set_connection_timeout(limits_.timeout_s);
  cli.set_read_timeout(limits_.timeout_s);
  LiveClient live(&cli, cancel_);
  if (live.cancelled()) return;
  auto res = cli.Get("/v2/");
  // A handshake that failed is a registry that speaks plain HTTP; any
  // answer, or a certificate this machine does not trust, is one that
  // speaks TLS (and the request says so).
  if (res || res.error() == httplib::Error::SSLServerVerification) ref_.plain_http = false;
}

StatusOr<Registry::Answer> Registry::Call(const std::string& method, const std::string& path_or_url,
                                          std::vector<std::pair<std::string, std::string>> headers,
                                          const std::string& body, int64_t max_body,
                                          const std::function<bool(int, const char*, size_t)>& sink) {
  PreferTls();
  std::string origin = ref_.Origin(), path = path_or_url;
  if (path_or_url.find("://") != std::string::npos && !SplitUrl(path_or_url, &origin, &path))
    return Unavailable("the registry sent aotid to '" + Printable(path_or_url) + "'");
  const std::string registry_origin = CanonicalOrigin(ref_.Origin());
  bool authorized_once = false;
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    // The registry itself: same scheme, host and port. Anywhere else (a
    // redirect to storage, another port) gets no credentials.
    const bool same_host = CanonicalOrigin(origin) == registry_origin;
    if (origin.starts_with("http://") && !ref_.plain_http && !IsLoopbackOrigin(origin)) {
      return FailedPrecondition("the registry sends aotid to plain HTTP (" + Printable(origin) +
                                "); it goes there only with --insecure");
    }
    if (origin.starts_with("http://") && registry_origin.starts_with("https://")) {
      return FailedPrecondition("the registry sends aotid from HTTPS to plain HTTP (" + Printable(origin) +
                                ")");
    }
    httplib::Client cli(origin);
    cli.set_connection_timeout(limits_.timeout_s);
    cli.set_read_timeout(limits_.timeout_s);
    cli.set_write_timeout(limits_.timeout_s);
    LiveClient live(&cli, cancel_);
    if (live.cancelled()) return Cancelled("the sync was stopped");
    httplib::Request req;
    req.method = method;
    req.path = path;
    for (const auto& [k, v] : headers) req.headers.emplace(k, v);
    // Credentials only for the registry's host, never a redirect's.
    if (same_host && !bearer_.empty()) {
      req.headers.emplace("Authorization", "Bearer " + bearer_);
    } else if (same_host && !creds_.user.empty()) {
      req.headers.emplace("Authorization", "Basic " + Base64(creds_.user + ":" + creds_.password));
    }
    req.body = body;
    if (!body.empty() && !req.has_header("Content-Type"))
      req.headers.emplace("Content-Type", "application/octet-stream");
    Answer a;
    bool too_big = false;
    bool streaming = false;
    req.response_handler = [&](const httplib::Response& r) {
      a.status = r.status;
      a.headers = r.headers;
      streaming = sink && (r.status == 200 || r.status == 206);
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (streaming) return sink(a.status, data, n);
      if (static_cast<int64_t>(a.body.size() + n) > max_body) {
        too_big = true;
        return false;
      }
      a.body.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    bool ok = cli.send(req, res, err);
    if (ok && a.status == 0) {  // a HEAD, whose handlers are not called
      a.status = res.status;
      a.headers = res.headers;
    }
    if (too_big) {
      return ResourceExhausted(method + " " + origin + path + ": the answer is over " +
                               std::to_string(max_body) + " bytes, the limit");
    }
    if (!ok && a.status == 0) return Unavailable(method + " " + origin + path + ": " + ErrorText(err));
    if (!ok && streaming)
      return Unavailable(method + " " + origin + path + ": the transfer broke off: " + ErrorText(err));
    if (a.status == 401 && same_host && !authorized_once) {
      authorized_once = true;
      RETURN_IF_ERROR(Authorize(a.Header("WWW-Authenticate")));
      --hop;
      continue;
    }
    if (a.status == 401 && same_host) {
      return FailedPrecondition(ref_.Origin() + " refused the credentials" +
                                (creds_.user.empty() ? std::string() : " of user '" + creds_.user + "'") +
                                " (HTTP 401 on " + method + " " + path + ")");
    }
    if ((a.status == 301 || a.status == 302 || a.status == 303 || a.status == 307 || a.status == 308) &&
        (method == "GET" || method == "HEAD")) {
      std::string loc = a.Header("Location");
      if (loc.empty()) return Unavailable(origin + path + " redirects nowhere");
      if (loc.starts_with("/")) {
        path = loc;
      } else if (!SplitUrl(loc, &origin, &path)) {
        return Unavailable(origin + path + " redirects to '" + Printable(loc) + "'");
      }
      continue;
    }
    return a;
  }
  return Unavailable(method + " " + path_or_url + ": more than " + std::to_string(kMaxRedirects) +
                     " redirects");
}

namespace {

Status HttpError(const std::string& what, int status, const std::string& body) {
  std::string detail;
  nlohmann::json j = ParseJsonOrDiscarded(body);
  if (j.is_object() && j.contains("errors") && j["errors"].is_array() && !j["errors"].empty() &&
      j["errors"][0].is_object() && j["errors"][0].contains("message") &&
      j["errors"][0]["message"].is_string()) {
    detail = ": " + Printable(j["errors"][0]["message"].get<std::string>());
  }
  std::string text = what + ": HTTP " + std::to_string(status) + detail;
  if (status == 401 || status == 403) return FailedPrecondition(text);
  if (status == 404) return NotFound(text);
  return Unavailable(text);
}

}  // namespace

StatusOr<bool> Registry::HasBlob(const std::string& digest) {
  if (!IsValidDigest(digest)) return InvalidArgument("not a sha256 digest: '" + digest + "'");
  ASSIGN_OR_RETURN(Answer a, Call("HEAD", "/v2/" + ref_.repo + "/blobs/" + digest, {}, "", 0));
  if (a.status == 200) return true;
  if (a.status == 404) return false;
  return HttpError("HEAD blob " + digest, a.status, a.body);
}

namespace {

// Where an upload continues, from a Location header: an absolute URL or a
// path, to which the digest is added as a query parameter.
std::string WithDigest(const std::string& location, const std::string& digest) {
  return location + (location.find('?') == std::string::npos ? "?" : "&") + "digest=" + UrlEncode(digest);
}

}  // namespace

Status Registry::PushBlobBytes(const std::string& digest, const std::string& bytes) {
  if (!IsValidDigest(digest)) return InvalidArgument("not a sha256 digest: '" + digest + "'");
  ASSIGN_OR_RETURN(Answer start, Call("POST", "/v2/" + ref_.repo + "/blobs/uploads/", {}, "", 1 << 16));
  if (start.status != 202) return HttpError("starting the upload of " + digest, start.status, start.body);
  ASSIGN_OR_RETURN(Answer put, Call("PUT", WithDigest(start.Header("Location"), digest), {}, bytes, 1 << 16));
  if (put.status != 201) return HttpError("uploading " + digest, put.status, put.body);
  return Status::OK();
}

Status Registry::PushBlob(const std::string& digest, const std::string& path, int64_t size,
                          const Progress& progress) {
  if (!IsValidDigest(digest)) return InvalidArgument("not a sha256 digest: '" + digest + "'");
  // Starting the upload also settles the authentication, so the streamed
  // PUT goes with the right header at once.
  ASSIGN_OR_RETURN(Answer start, Call("POST", "/v2/" + ref_.repo + "/blobs/uploads/", {}, "", 1 << 16));
  if (start.status != 202) return HttpError("starting the upload of " + digest, start.status, start.body);
  std::string origin = ref_.Origin(), target = WithDigest(start.Header("Location"), digest);
  if (target.find("://") != std::string::npos && !SplitUrl(target, &origin, &target))
    return Unavailable("the registry gave an upload location aotid cannot use: " + start.Header("Location"));
  if (HostOf(origin) != ref_.host)
    return Unavailable("the registry sends the upload to another host: " + origin);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Internal("cannot open " + path);
  httplib::Client cli(origin);
  cli.set_connection_timeout(limits_.timeout_s);
  cli.set_read_timeout(limits_.timeout_s);
  cli.set_write_timeout(limits_.timeout_s);
  httplib::Headers headers;
  if (!bearer_.empty()) {
    headers.emplace("Authorization", "Bearer " + bearer_);
  } else if (!creds_.user.empty()) {
    headers.emplace("Authorization", "Basic " + Base64(creds_.user + ":" + creds_.password));
  }
  std::vector<char> buf(1 << 20);
  bool read_failed = false;
  auto res = cli.Put(
      target, headers, static_cast<size_t>(size),
      [&](size_t offset, size_t length, httplib::DataSink& sink) {
        size_t want = std::min(length, buf.size());
        ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(offset));
        if (n <= 0) {
          read_failed = true;
          return false;
        }
        sink.write(buf.data(), static_cast<size_t>(n));
        if (progress) progress(static_cast<int64_t>(offset) + n, size);
        return true;
      },
      "application/octet-stream");
  ::close(fd);
  if (read_failed) return Internal("reading " + path + " failed during the upload");
  if (!res) return Unavailable("uploading " + digest + ": " + ErrorText(res.error()));
  if (res->status != 201) return HttpError("uploading " + digest, res->status, res->body);
  return Status::OK();
}

StatusOr<std::string> Registry::PutManifest(const std::string& reference, const std::string& media_type,
                                            const std::string& body) {
  ASSIGN_OR_RETURN(Answer a, Call("PUT", "/v2/" + ref_.repo + "/manifests/" + reference,
                                  {{"Content-Type", media_type}}, body, 1 << 16));
  if (a.status != 201) return HttpError("putting the manifest " + reference, a.status, a.body);
  return "sha256:" + fs::Sha256Hex(body);
}

StatusOr<std::string> Registry::GetManifest(const std::string& reference) {
  ASSIGN_OR_RETURN(Answer a, Call("GET", "/v2/" + ref_.repo + "/manifests/" + reference,
                                  {{"Accept", kManifestMediaType}}, "", limits_.max_manifest_bytes));
  if (a.status != 200) return HttpError("the manifest of " + ref_.repo + ":" + reference, a.status, a.body);
  if (IsValidDigest(reference) && "sha256:" + fs::Sha256Hex(a.body) != reference)
    return Corruption("the manifest " + reference + " does not match its digest");
  return a.body;
}

StatusOr<std::vector<std::string>> Registry::ListTags() {
  ASSIGN_OR_RETURN(Answer a, Call("GET", "/v2/" + ref_.repo + "/tags/list?n=1000", {}, "", 1 << 20));
  if (a.status != 200) return HttpError("the tags of " + ref_.repo, a.status, a.body);
  nlohmann::json j = ParseJsonOrDiscarded(a.body);
  std::vector<std::string> tags;
  if (!j.is_object() || !j.contains("tags"))
    return Corruption("the tag list of " + ref_.repo + " is not JSON");
  if (j["tags"].is_null()) return tags;
  if (!j["tags"].is_array()) return Corruption("the tag list of " + ref_.repo + " is malformed");
  // Each tag is a pull of its own: a registry that names more than a sync
  // of every tag should take is refused rather than walked for hours.
  constexpr size_t kMaxTags = 1000;
  if (j["tags"].size() > kMaxTags) {
    return LimitExceeded("the tag list of " + ref_.repo + " names " + std::to_string(j["tags"].size()) +
                         " tags, more than the " + std::to_string(kMaxTags) +
                         " a sync of every tag takes; name the tag to sync (oci://HOST/" + ref_.repo +
                         ":TAG)");
  }
  for (const auto& t : j["tags"]) {
    if (t.is_string() && ValidTag(t.get<std::string>())) tags.push_back(t.get<std::string>());
  }
  return tags;
}

StatusOr<std::string> Registry::GetSmallBlob(const std::string& digest, int64_t max_bytes) {
  if (!IsValidDigest(digest)) return InvalidArgument("not a sha256 digest: '" + digest + "'");
  ASSIGN_OR_RETURN(Answer a, Call("GET", "/v2/" + ref_.repo + "/blobs/" + digest, {}, "", max_bytes));
  if (a.status != 200) return HttpError("blob " + digest, a.status, a.body);
  if ("sha256:" + fs::Sha256Hex(a.body) != digest)
    return Corruption("blob " + digest + " does not match its digest");
  return a.body;
}

StatusOr<int64_t> Registry::FetchBlob(const std::string& digest, int64_t size, const std::string& partial,
                                      const Progress& progress) {
  if (!IsValidDigest(digest)) return InvalidArgument("not a sha256 digest: '" + Printable(digest) + "'");
  if (size < 0 || size > limits_.max_layer_bytes) {
    return ResourceExhausted("blob " + digest + " is " + std::to_string(size) + " bytes, over the limit of " +
                             std::to_string(limits_.max_layer_bytes));
  }
  int fd = ::open(partial.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return IOError("cannot open " + partial);
  // One download of a blob at a time (the daemon's timer and a hand sync).
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return Unavailable("another sync is downloading blob " + digest + " into " + partial +
                       "; try again after it");
  }
  off_t have = ::lseek(fd, 0, SEEK_END);
  if (have > size) {  // not this blob's: start again
    (void)::ftruncate(fd, 0);
    (void)::lseek(fd, 0, SEEK_SET);
    have = 0;
  }
  // Room for what is left, and a margin the store needs for its copy.
  struct statvfs vfs {};
  if (::fstatvfs(fd, &vfs) == 0) {
    uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    uint64_t need = static_cast<uint64_t>(size - have) + static_cast<uint64_t>(size) + (uint64_t{64} << 20);
    if (free_bytes < need) {
      ::close(fd);
      return ResourceExhausted("blob " + digest + " needs " + std::to_string(need >> 20) +
                               " MiB free (the download " + "and the store's copy); the disk has " +
                               std::to_string(free_bytes >> 20) + " MiB");
    }
  }
  const int64_t resumed = have;
  int64_t fetched = 0;
  bool write_failed = false, over = false, cancelled = false, too_slow = false;
  auto start = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, std::string>> headers;
  if (have > 0 && have < size) headers.emplace_back("Range", "bytes=" + std::to_string(have) + "-");
  bool first = true;
  // The client hands over 4 KiB at a time: written in 1 MiB pieces.
  std::string pending;
  pending.reserve(1 << 20);
  auto flush = [&] {
    if (!pending.empty() && !fs::WriteAll(fd, pending.data(), pending.size(), partial).ok())
      write_failed = true;
    pending.clear();
    return !write_failed;
  };
  auto sink = [&](int status, const char* data, size_t n) {
    if (first) {
      first = false;
      if (status == 200 && have > 0) {  // the registry ignored the Range: it sends the whole
        (void)::ftruncate(fd, 0);
        (void)::lseek(fd, 0, SEEK_SET);
        have = 0;
      }
    }
    if (cancel_ && cancel_->load()) {
      cancelled = true;
      return false;
    }
    if (have + fetched + static_cast<int64_t>(n) > size) {
      over = true;
      return false;
    }
    pending.append(data, n);
    if (pending.size() >= (1 << 20) && !flush()) return false;
    fetched += static_cast<int64_t>(n);
    // A registry that trickles (a byte a second passes every read timeout)
    // is cut off: under 1 KB/s on average once past twice the timeout.
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 2.0 * limits_.timeout_s && static_cast<double>(fetched) / s < 1024) {
      too_slow = true;
      return false;
    }
    if (progress) progress(have + fetched, size);
    return true;
  };
  StatusOr<Answer> a = Answer{};
  if (have < size) a = Call("GET", "/v2/" + ref_.repo + "/blobs/" + digest, headers, "", 1 << 16, sink);
  if (!over) flush();  // what arrived stays for the next sync to continue from
  fetched = std::min<int64_t>(fetched, ::lseek(fd, 0, SEEK_END) - have);
  // No fsync: the partial file is verified against its digest before use,
  // and the store syncs its own copy; a crash that loses its tail only
  // makes the next sync fetch more (or start over on a mismatch).
  auto fail = [&](Status s) {
    ::close(fd);
    return s;
  };
  if (over) {
    ::unlink(partial.c_str());
    return fail(Corruption("blob " + digest + " is longer than the " + std::to_string(size) +
                           " bytes its manifest says"));
  }
  if (write_failed) return fail(IOError("writing " + partial + " failed (is the disk full?)"));
  if (cancelled)
    return fail(Cancelled("the download of " + digest + " was stopped; the next sync continues it"));
  if (too_slow) {
    return fail(Unavailable("blob " + digest + ": the registry sends under 1 KB/s; stopped at " +
                            std::to_string(have + fetched) + " of " + std::to_string(size) +
                            " bytes, and the next sync continues from there"));
  }
  if (!a.ok()) {
    if (have + fetched == 0) return fail(a.status());
    return fail(Unavailable(a.status().message() + ", at " + std::to_string(have + fetched) + " of " +
                            std::to_string(size) + " bytes; the next sync continues from there"));
  }
  if (have < size && a->status != 0 && a->status != 200 && a->status != 206)
    return fail(HttpError("blob " + digest, a->status, a->body));
  if (have + fetched != size) {
    return fail(Unavailable("blob " + digest + ": the transfer ended at " + std::to_string(have + fetched) +
                            " of " + std::to_string(size) + " bytes; the next sync continues from there"));
  }
  auto got = fs::Sha256File(partial);
  if (!got.ok()) return fail(got.status());
  if ("sha256:" + *got != digest) {
    ::unlink(partial.c_str());
    // What was on disk before (a crash's torn write) was bad, not what the
    // registry sent now: start over at once, rather than fail this sync.
    if (resumed > 0) {
      ::close(fd);
      return FetchBlob(digest, size, partial, progress);
    }
    return fail(Corruption("blob " + digest + " does not match its digest (its bytes hash to sha256:" + *got +
                           "); the download is removed"));
  }
  ::close(fd);
  return fetched;
}

}  // namespace aotid::sync
