#include "daemon/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>

#include "base/fs.h"
#include "base/log.h"
#include "platform/install_layout.h"
#include "storage/model_store.h"
#include "storage/version_settings.h"
#include "sync/registry.h"

namespace aotid::daemon {
namespace {

std::string Where(const std::string& file, const toml::source_region& src) {
  return file + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}

// One row per key: how it is parsed, how two configs compare on it, how a
// running value is kept, and when a change takes effect. The parser, the
// reload's report (ChangedKeys, ReloadRuleOf) and the values a reload keeps
// (KeepRunningValues) all read this table, so a key cannot be known to one
// and missing from another. Defaults are Config's member initializers (the
// HTTP options' own for [server]), and configs/aotid.toml documents each
// row; tests/daemon/config_test.cc checks the file and the table agree.
struct Key {
  std::string name;  // "section.key"
  enum Type { kString, kInt, kBool, kStringList } type;
  int64_t min = 0, max = 0;  // for integers
  ReloadRule reload;
  // Stores a value of the right type (and, for integers, in range). An
  // error says what is wrong with the value; the file name goes in front.
  std::function<Status(Config&, const toml::node&)> set;
  std::function<bool(const Config&, const Config&)> same;
  std::function<void(const Config& from, Config* to)> keep;
};

// `get` is a generic lambda giving the field (or a std::tie of fields) in
// a Config, const or not: comparison and keeping follow from it.
template <typename Get>
Key Row(std::string name, Key::Type type, ReloadRule reload, Get get,
        std::function<Status(Config&, const toml::node&)> set, int64_t min = 0, int64_t max = 0) {
  Key k{std::move(name), type, min, max, reload, std::move(set), nullptr, nullptr};
  k.same = [get](const Config& a, const Config& b) { return get(a) == get(b); };
  k.keep = [get](const Config& from, Config* to) { get(*to) = get(from); };
  return k;
}

template <typename Get>
Key Text(std::string name, ReloadRule reload, Get get) {
  return Row(std::move(name), Key::kString, reload, get, [get](Config& c, const toml::node& n) {
    get(c) = *n.value<std::string>();
    return Status::OK();
  });
}

// A string the config turns into something else, which may refuse it.
template <typename Get>
Key Parsed(std::string name, ReloadRule reload, Get get,
           std::function<Status(Config&, const std::string&)> parse) {
  return Row(std::move(name), Key::kString, reload, get,
             [parse](Config& c, const toml::node& n) { return parse(c, *n.value<std::string>()); });
}

template <typename Get>
Key Int(std::string name, ReloadRule reload, Get get, int64_t min, int64_t max) {
  return Row(
      std::move(name), Key::kInt, reload, get,
      [get](Config& c, const toml::node& n) {
        get(c) = static_cast<std::remove_reference_t<decltype(get(c))>>(*n.value<int64_t>());
        return Status::OK();
      },
      min, max);
}

template <typename Get>
Key Bool(std::string name, ReloadRule reload, Get get) {
  return Row(std::move(name), Key::kBool, reload, get, [get](Config& c, const toml::node& n) {
    get(c) = *n.value<bool>();
    return Status::OK();
  });
}

template <typename Get>
Key List(std::string name, ReloadRule reload, Get get) {
  return Row(std::move(name), Key::kStringList, reload, get, [get](Config& c, const toml::node& n) {
    std::vector<std::string> out;
    for (const auto& item : *n.as_array()) out.push_back(*item.value<std::string>());
    get(c) = std::move(out);
    return Status::OK();
  });
}

constexpr ReloadRule kLive = ReloadRule::kLive;
constexpr ReloadRule kLoads = ReloadRule::kNextLoad;
constexpr ReloadRule kRestart = ReloadRule::kRestart;

// In the order configs/aotid.toml lists them.
const std::vector<Key>& Keys() {
  static const auto* keys = new std::vector<Key>{
      Text(
          "store.path", kRestart, [](auto& c) -> auto& { return c.store_path; }),
      Parsed(
          "server.listen", kRestart,
          [](auto& c) { return std::tie(c.api.server.host, c.api.server.port, c.api.server.unix_path); },
          [](Config& c, const std::string& v) {
            return SetListen(v, &c.api.server).WithContext("'server.listen'");
          }),
      Parsed(
          "server.grpc_listen", kRestart, [](auto& c) -> auto& { return c.grpc_listen; },
          [](Config& c, const std::string& v) {
            if (!v.empty()) RETURN_IF_ERROR(CheckGrpcListen(v).WithContext("'server.grpc_listen'"));
            c.grpc_listen = v;
            return Status::OK();
          }),
      Int(
          "server.threads", kRestart, [](auto& c) -> auto& { return c.api.server.threads; }, 1, 1024),
      Int(
          "server.max_body_bytes", kRestart,
          [](auto& c) -> auto& { return c.api.server.limits.max_body_bytes; }, 1024, int64_t{1} << 40),
      Int(
          "server.max_header_bytes", kRestart,
          [](auto& c) -> auto& { return c.api.server.limits.max_header_bytes; }, 1024, 1 << 20),
      Int(
          "server.request_timeout_s", kRestart,
          [](auto& c) -> auto& { return c.api.server.request_timeout_s; }, 1, 3600),
      Int(
          "server.idle_timeout_s", kRestart, [](auto& c) -> auto& { return c.api.server.idle_timeout_s; }, 1,
          3600),
      Int(
          "server.write_timeout_s", kRestart, [](auto& c) -> auto& { return c.api.server.write_timeout_s; },
          1, 3600),
      Int(
          "server.drain_timeout_s", kRestart, [](auto& c) -> auto& { return c.api.server.drain_timeout_s; },
          0, 3600),
      Int(
          "server.max_connections_per_address", kRestart,
          [](auto& c) -> auto& { return c.api.server.max_connections_per_address; }, 0, 1000000),
      Int(
          "server.max_queued_requests", kLoads, [](auto& c) -> auto& { return c.max_queued_requests; }, 1,
          1000000),
      Text(
          "server.token_file", kLive, [](auto& c) -> auto& { return c.token_file; }),
      Parsed(
          "server.token_scope", kLive, [](auto& c) -> auto& { return c.api.token_for_all; },
          [](Config& c, const std::string& v) {
            if (v != "all" && v != "repository") {
              return InvalidArgument("'server.token_scope' must be all or repository, got '" + v + "'");
            }
            c.api.token_for_all = v == "all";
            return Status::OK();
          }),
      List(
          "server.allowed_hosts", kLive, [](auto& c) -> auto& { return c.api.allowed_hosts; }),
      List(
          "server.cors_origins", kLive, [](auto& c) -> auto& { return c.api.cors_origins; }),
      Text(
          "build.python", kRestart, [](auto& c) -> auto& { return c.python; }),
      Text(
          "build.worker_dir", kRestart, [](auto& c) -> auto& { return c.worker_dir; }),
      Int(
          "build.jobs", kLive, [](auto& c) -> auto& { return c.build_jobs; }, 1, 64),
      Int(
          "build.timeout_s", kLive, [](auto& c) -> auto& { return c.build_timeout_s; }, 1, 7 * 24 * 3600),
      Int(
          "build.retry_initial_s", kLive, [](auto& c) -> auto& { return c.build_retry_initial_s; }, 1, 3600),
      Int(
          "build.max_attempts", kLive, [](auto& c) -> auto& { return c.build_max_attempts; }, 1, 100),
      Text(
          "build.cxx", kRestart, [](auto& c) -> auto& { return c.cxx; }),
      Text(
          "build.cache_dir", kRestart, [](auto& c) -> auto& { return c.cache_dir; }),
      Int(
          "runner.timeout_s", kLoads, [](auto& c) -> auto& { return c.run_timeout_s; }, 1, 24 * 3600),
      Int(
          "runner.memory_limit_mb", kLoads, [](auto& c) -> auto& { return c.memory_limit_mb; }, 0,
          int64_t{1} << 20),
      Int(
          "runner.max_crashes", kLoads, [](auto& c) -> auto& { return c.runner_max_crashes; }, 0, 1000),
      Int(
          "runner.crash_window_s", kLoads, [](auto& c) -> auto& { return c.runner_crash_window_s; }, 1,
          24 * 3600),
      Parsed(
          "residency.keep_alive", kLive, [](auto& c) -> auto& { return c.keep_alive_s; },
          [](Config& c, const std::string& v) -> Status {
            // The versions' "default" is this value, so it has to be one.
            auto seconds = storage::ParseKeepAlive("residency.keep_alive", v);
            if (!seconds.ok() || *seconds == storage::kKeepAliveDefault) {
              return InvalidArgument(
                  "'residency.keep_alive' must be a duration (0, 90s, 5m, 2h) of at most " +
                  storage::FormatKeepAlive(storage::kKeepAliveMax) + ", or always, got '" + v + "'");
            }
            c.keep_alive_s = *seconds;
            return Status::OK();
          }),
      Int(
          "residency.memory_budget_mb", kLive, [](auto& c) -> auto& { return c.memory_budget_mb; }, 0,
          int64_t{1} << 24),
      Int(
          "residency.load_wait_s", kLive, [](auto& c) -> auto& { return c.load_wait_s; }, 0, 3600),
      Bool(
          "residency.unload_on_pressure", kLive, [](auto& c) -> auto& { return c.unload_on_pressure; }),
      Text(
          "log.level", kLive, [](auto& c) -> auto& { return c.log_level; }),
      Text(
          "log.file", kLive, [](auto& c) -> auto& { return c.log_file; }),
      Int(
          "log.max_size_mb", kLive, [](auto& c) -> auto& { return c.log_max_size_mb; }, 1, 1 << 20),
      Int(
          "log.keep", kLive, [](auto& c) -> auto& { return c.log_keep; }, 0, 100),
  };
  return *keys;
}

const Key* FindKey(const std::string& name) {
  for (const Key& k : Keys()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

// [[sync]] tables: source (required), interval_s, keep, name, credentials,
// insecure, timeout_s.
Status ParseSyncSources(const toml::node& node, const std::string& file_name,
                        std::vector<sync::SyncSource>* out) {
  const toml::array* arr = node.as_array();
  if (arr == nullptr || !arr->is_array_of_tables()) {
    return InvalidArgument(Where(file_name, node.source()) + ": 'sync' must be tables ([[sync]])");
  }
  for (const auto& item : *arr) {
    const toml::table& t = *item.as_table();
    sync::SyncSource s;
    for (auto&& entry : t) {
      const toml::key& k = entry.first;
      const toml::node& v = entry.second;  // named: the lint's clang cannot capture a structured binding
      std::string key(k.str());
      std::string at = Where(file_name, k.source());
      auto integer = [&](int min, int max, int* field) -> Status {
        if (!v.is_integer() || *v.value<int64_t>() < min || *v.value<int64_t>() > max) {
          return InvalidArgument(at + ": 'sync." + key + "' must be an integer between " +
                                 std::to_string(min) + " and " + std::to_string(max));
        }
        *field = static_cast<int>(*v.value<int64_t>());
        return Status::OK();
      };
      auto text = [&](std::string* field) -> Status {
        if (!v.is_string()) return InvalidArgument(at + ": 'sync." + key + "' must be a string");
        *field = *v.value<std::string>();
        return Status::OK();
      };
      if (key == "source") {
        RETURN_IF_ERROR(text(&s.source));
      } else if (key == "interval_s") {
        RETURN_IF_ERROR(integer(1, 7 * 24 * 3600, &s.interval_s));
      } else if (key == "keep") {
        RETURN_IF_ERROR(integer(0, 10000, &s.keep));
      } else if (key == "timeout_s") {
        RETURN_IF_ERROR(integer(1, 3600, &s.timeout_s));
      } else if (key == "name") {
        RETURN_IF_ERROR(text(&s.name));
      } else if (key == "credentials") {
        RETURN_IF_ERROR(text(&s.credentials));
        s.credentials = fs::ExpandHome(s.credentials);
      } else if (key == "insecure") {
        if (!v.is_boolean()) return InvalidArgument(at + ": 'sync.insecure' must be true or false");
        s.insecure = *v.value<bool>();
      } else {
        return InvalidArgument(at + ": unknown key 'sync." + key +
                               "' (source, interval_s, keep, name, credentials, insecure, timeout_s)");
      }
    }
    std::string at = Where(file_name, t.source());
    if (s.source.empty())
      return InvalidArgument(at +
                             ": a [[sync]] needs a source (oci://HOST[:PORT]/REPO[:TAG], or a folder's "
                             "absolute path)");
    if (!s.source.starts_with("oci://")) {
      s.source = fs::ExpandHome(s.source);
      if (!s.source.starts_with("/")) {
        return InvalidArgument(
            at + ": 'sync.source' is oci://HOST[:PORT]/REPO[:TAG] or a folder's absolute path, got '" +
            s.source + "'");
      }
    } else if (auto ref = sync::ParseOciRef(s.source, s.insecure); !ref.ok()) {
      return InvalidArgument(at + ": " + ref.status().message());
    } else if (!s.name.empty() && ref->tag.empty()) {
      return InvalidArgument(at + ": 'sync.name' needs a source with one tag, not every tag of " + s.source);
    }
    if (!s.name.empty())
      RETURN_IF_ERROR(storage::ValidateModelName(s.name).WithContext(at + ": 'sync.name'"));
    // One status and one metrics series per source.
    for (const auto& other : *out) {
      if (other.source == s.source)
        return InvalidArgument(at + ": the source " + s.source + " is in two [[sync]] tables");
    }
    out->push_back(std::move(s));
  }
  return Status::OK();
}

void ResolveDefaults(Config* c) {
  if (c->store_path.empty()) c->store_path = fs::DefaultStoreDir();
  c->store_path = fs::Absolute(fs::ExpandHome(c->store_path));
  if (!c->cache_dir.empty()) c->cache_dir = fs::Absolute(fs::ExpandHome(c->cache_dir));
  if (c->python.empty()) c->python = platform::DefaultPython();
  if (c->worker_dir.empty()) c->worker_dir = platform::DefaultWorkerDir();
  if (!c->token_file.empty()) c->token_file = fs::ExpandHome(c->token_file);
}

}  // namespace

std::vector<std::string> ChangedKeys(const Config& a, const Config& b) {
  std::vector<std::string> out;
  for (const Key& k : Keys()) {
    if (!k.same(a, b)) out.push_back(k.name);
  }
  if (a.sync != b.sync) out.emplace_back("sync");
  return out;
}

std::vector<std::string> ConfigKeyNames() {
  std::vector<std::string> out;
  for (const Key& k : Keys()) out.push_back(k.name);
  out.emplace_back("sync");
  return out;
}

ReloadRule ReloadRuleOf(const std::string& key) {
  if (key == "sync") return ReloadRule::kLive;
  const Key* k = FindKey(key);
  return k == nullptr ? ReloadRule::kRestart : k->reload;
}

void KeepRunningValues(const Config& running, const std::vector<std::string>& keys, Config* next) {
  for (const auto& name : keys) {
    if (name == "sync") {
      next->sync = running.sync;
    } else if (const Key* k = FindKey(name); k != nullptr) {
      k->keep(running, next);
    }
  }
}

// toml++ follows the parts of a dotted key ("a.b.c = 1", "[a.b.c]") by
// recursion, and a key of tens of thousands of parts overflows the stack.
// Keys of more than 64 parts are refused before the parser sees them. The
// scan skips strings and comments, and counts the dots between the
// characters that end a key or a value (= , [ ] { } and a line's end), so a
// float's one dot never adds up.
Status CheckDottedKeys(std::string_view text, const std::string& file_name) {
  constexpr int kMaxParts = 64;
  int line = 1, dots = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '"' || ch == '\'') {
      const bool multi = text.substr(i, 3) == std::string(3, ch);
      const std::string close = multi ? std::string(3, ch) : std::string(1, ch);
      size_t j = i + close.size();
      while (j < text.size() && text.compare(j, close.size(), close) != 0) {
        const bool escape = ch == '"' && text[j] == '\\' && j + 1 < text.size();
        if (text[j + (escape ? 1 : 0)] == '\n') ++line;
        j += escape ? 2 : 1;
      }
      i = std::min(text.size(), j + close.size()) - 1;
    } else if (ch == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if (ch == '.') {
      if (++dots >= kMaxParts) {
        return InvalidArgument(
            file_name + ":" + std::to_string(line) +
            ": a key of more than 64 dotted parts (the TOML parser would recurse for each)");
      }
    } else if (std::string_view("=,[]{}\n").find(ch) != std::string_view::npos) {
      dots = 0;
      if (ch == '\n') ++line;
    }
  }
  return Status::OK();
}

StatusOr<Config> ParseConfig(const std::string& text, const std::string& file_name) {
  RETURN_IF_ERROR(CheckDottedKeys(text, file_name));
  toml::table root;
  try {
    root = toml::parse(text, file_name);
  } catch (const toml::parse_error& e) {
    return InvalidArgument(Where(file_name, e.source()) + ": " + std::string(e.description()));
  }
  Config c;
  for (auto&& [section_key, section_node] : root) {
    std::string section(section_key.str());
    if (section == "sync") {
      RETURN_IF_ERROR(ParseSyncSources(section_node, file_name, &c.sync));
      continue;
    }
    bool known = std::any_of(Keys().begin(), Keys().end(),
                             [&](const Key& k) { return k.name.starts_with(section + "."); });
    if (!known) {
      return InvalidArgument(Where(file_name, section_node.source()) + ": unknown section or key '" +
                             section + "'");
    }
    const toml::table* table = section_node.as_table();
    if (table == nullptr) {
      return InvalidArgument(Where(file_name, section_node.source()) + ": '" + section +
                             "' must be a table ([" + section + "])");
    }
    for (auto&& [k, node] : *table) {
      std::string key(k.str());
      std::string full = section + "." + key;
      const Key* found = FindKey(full);
      if (found == nullptr) {
        return InvalidArgument(Where(file_name, node.source()) + ": unknown key '" + full + "'");
      }
      const Key& spec = *found;
      if (spec.type == Key::kString && !node.is_string()) {
        return InvalidArgument(Where(file_name, node.source()) + ": '" + full + "' must be a string");
      }
      if (spec.type == Key::kBool && !node.is_boolean()) {
        return InvalidArgument(Where(file_name, node.source()) + ": '" + full + "' must be true or false");
      }
      if (spec.type == Key::kStringList) {
        const toml::array* arr = node.as_array();
        bool ok = arr != nullptr;
        for (size_t i = 0; ok && i < arr->size(); ++i) ok = (*arr)[i].is_string();
        if (!ok) {
          return InvalidArgument(Where(file_name, node.source()) + ": '" + full +
                                 "' must be a list of strings");
        }
      }
      if (spec.type == Key::kInt) {
        if (!node.is_integer()) {
          return InvalidArgument(Where(file_name, node.source()) + ": '" + full + "' must be an integer");
        }
        int64_t v = *node.value<int64_t>();
        if (v < spec.min || v > spec.max) {
          return InvalidArgument(Where(file_name, node.source()) + ": '" + full + "' must be between " +
                                 std::to_string(spec.min) + " and " + std::to_string(spec.max) + ", got " +
                                 std::to_string(v));
        }
      }
      if (Status s = spec.set(c, node); !s.ok()) return s.WithContext(file_name);
    }
  }
  log::Level level;
  if (!log::ParseLevel(c.log_level, &level)) {
    return InvalidArgument(file_name + ": 'log.level' must be debug, info, warning or error, got '" +
                           c.log_level + "'");
  }
  for (const auto& o : c.api.cors_origins) {
    if (o != "*" && o.find("://") == std::string::npos) {
      return InvalidArgument(file_name +
                             ": 'server.cors_origins' entries are origins like "
                             "\"http://localhost:3000\" (or \"*\"), got '" +
                             o + "'");
    }
  }
  c.source = file_name;
  return c;
}

StatusOr<Config> LoadConfig(const std::string& explicit_path) {
  std::string path = explicit_path;
  if (path.empty()) {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("AOTID_CONFIG"); env && *env) {
      path = env;
    } else {
      const char* xdg = std::getenv("XDG_CONFIG_HOME");
      candidates.push_back(xdg && *xdg ? std::string(xdg) + "/aotid/aotid.toml"
                                       : fs::ExpandHome("~/.config/aotid/aotid.toml"));
      candidates.push_back("/etc/aotid/aotid.toml");
      for (const auto& c : candidates) {
        if (fs::Exists(c)) {
          path = c;
          break;
        }
      }
    }
  }
  Config c;
  c.source = "built-in defaults";
  if (!path.empty()) {
    auto text = fs::ReadFile(path);
    if (!text.ok()) return text.status().WithContext("reading config");
    ASSIGN_OR_RETURN(c, ParseConfig(*text, path));
  }
  ResolveDefaults(&c);
  return c;
}

Status SetListen(const std::string& listen, http::ServerOptions* server) {
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(ParseListen(listen, &host, &port));
  if (host.starts_with("unix:")) {
    server->unix_path = host.substr(5);
    server->host.clear();
    server->port = 0;
  } else {
    server->unix_path.clear();
    server->host = host;
    server->port = port;
  }
  return Status::OK();
}

std::string FormatListen(const http::ServerOptions& server) {
  if (!server.unix_path.empty()) return "unix:" + server.unix_path;
  std::string host = server.host.find(':') != std::string::npos ? "[" + server.host + "]" : server.host;
  return host + ":" + std::to_string(server.port);
}

Status CheckGrpcListen(const std::string& listen) {
  std::string host;
  int port = 0;
  return ParseListen(listen, &host, &port, /*unix_ok=*/false);
}

Status ParseListen(const std::string& listen, std::string* host, int* port, bool unix_ok) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("listen address '" + listen + "' " + why +
                           " (expected HOST:PORT, e.g. 127.0.0.1:8765" +
                           (unix_ok ? ", or unix:/absolute/path)" : ")"));
  };
  if (listen.rfind("unix:", 0) == 0) {
    if (!unix_ok)
      return InvalidArgument("gRPC listens on HOST:PORT only, not on a unix socket (got '" + listen + "')");
    std::string path = listen.substr(5);
    if (path.empty() || path.front() != '/') return bad("needs an absolute socket path");
    if (path.size() > 100) return bad("has a socket path longer than 100 bytes");
    *host = listen;
    *port = 0;
    return Status::OK();
  }
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("has no port");
  std::string h = listen.substr(0, colon);
  std::string p = listen.substr(colon + 1);
  if (h.front() == '[') {
    if (h.back() != ']') return bad("has an unclosed '['");
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return bad("is an IPv6 address without brackets");
  }
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
    return bad("has a bad port");
  }
  int v = std::stoi(p);
  if (v > 65535) return bad("has a port over 65535");
  *host = h;
  *port = v;
  return Status::OK();
}

}  // namespace aotid::daemon
