#include "daemon/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <toml++/toml.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "base/fs.h"
#include "base/log.h"
#include "runtime/install_layout.h"
#include "storage/model_store.h"
#include "sync/registry.h"

namespace aotid::daemon {
namespace {

std::string Where(const std::string& file, const toml::source_region& src) {
  return file + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}

struct Key {
  enum Type { kString, kInt, kStringList } type;
  // Stores a value of the right type (and, for integers, in range). An
  // error says what is wrong with the value; the file name goes in front.
  std::function<Status(Config&, const toml::node&)> set;
  int64_t min = 0, max = 0;  // for integers
};

Key Text(std::string Config::*field) {
  return {Key::kString, [field](Config& c, const toml::node& n) {
            c.*field = *n.value<std::string>();
            return Status::OK();
          }};
}

// A string the config turns into something else, which may refuse it.
Key Parsed(std::function<Status(Config&, const std::string&)> parse) {
  return {Key::kString,
          [parse](Config& c, const toml::node& n) { return parse(c, *n.value<std::string>()); }};
}

Key Int(std::function<void(Config&, int64_t)> set, int64_t min, int64_t max) {
  return {Key::kInt,
          [set](Config& c, const toml::node& n) {
            set(c, *n.value<int64_t>());
            return Status::OK();
          },
          min, max};
}

Key List(std::vector<std::string> serving::HttpOptions::*field) {
  return {Key::kStringList, [field](Config& c, const toml::node& n) {
            std::vector<std::string> out;
            for (const auto& item : *n.as_array()) out.push_back(*item.value<std::string>());
            c.api.*field = std::move(out);
            return Status::OK();
          }};
}

const std::map<std::string, std::map<std::string, Key>>& Schema() {
  static const auto* schema = new std::map<std::string, std::map<std::string, Key>>{
      {"store", {{"path", Text(&Config::store_path)}}},
      {"server",
       {{"listen", Parsed([](Config& c, const std::string& v) {
           return SetListen(v, &c.api.server).WithContext("'server.listen'");
         })},
        {"threads", Int([](Config& c, int64_t v) { c.api.server.threads = static_cast<int>(v); }, 1, 1024)},
        {"max_body_bytes",
         Int([](Config& c, int64_t v) { c.api.server.limits.max_body_bytes = v; }, 1024, int64_t{1} << 40)},
        {"request_timeout_s",
         Int([](Config& c, int64_t v) { c.api.server.request_timeout_s = static_cast<int>(v); }, 1, 3600)},
        {"idle_timeout_s",
         Int([](Config& c, int64_t v) { c.api.server.idle_timeout_s = static_cast<int>(v); }, 1, 3600)},
        {"drain_timeout_s",
         Int([](Config& c, int64_t v) { c.api.server.drain_timeout_s = static_cast<int>(v); }, 0, 3600)},
        {"max_connections_per_address",
         Int([](Config& c, int64_t v) { c.api.server.max_connections_per_address = static_cast<int>(v); }, 0,
             1000000)},
        {"max_header_bytes",
         Int([](Config& c, int64_t v) { c.api.server.limits.max_header_bytes = static_cast<size_t>(v); },
             1024, 1 << 20)},
        {"max_queued_requests",
         Int([](Config& c, int64_t v) { c.max_queued_requests = static_cast<int>(v); }, 1, 1000000)},
        {"token_file", Text(&Config::token_file)},
        {"token_scope", Parsed([](Config& c, const std::string& v) {
           if (v != "all" && v != "repository") {
             return InvalidArgument("'server.token_scope' must be all or repository, got '" + v + "'");
           }
           c.api.token_for_all = v == "all";
           return Status::OK();
         })},
        {"allowed_hosts", List(&serving::HttpOptions::allowed_hosts)},
        {"cors_origins", List(&serving::HttpOptions::cors_origins)}}},
      {"build",
       {{"python", Text(&Config::python)},
        {"worker_dir", Text(&Config::worker_dir)},
        {"jobs", Int([](Config& c, int64_t v) { c.build_jobs = static_cast<int>(v); }, 1, 64)},
        {"timeout_s",
         Int([](Config& c, int64_t v) { c.build_timeout_s = static_cast<int>(v); }, 1, 7 * 24 * 3600)},
        {"retry_initial_s",
         Int([](Config& c, int64_t v) { c.build_retry_initial_s = static_cast<int>(v); }, 1, 3600)},
        {"max_attempts",
         Int([](Config& c, int64_t v) { c.build_max_attempts = static_cast<int>(v); }, 1, 100)},
        {"cxx", Text(&Config::cxx)}}},
      {"runner",
       {{"timeout_s", Int([](Config& c, int64_t v) { c.run_timeout_s = static_cast<int>(v); }, 1, 24 * 3600)},
        {"memory_limit_mb", Int([](Config& c, int64_t v) { c.memory_limit_mb = v; }, 0, int64_t{1} << 20)},
        {"max_crashes",
         Int([](Config& c, int64_t v) { c.runner_max_crashes = static_cast<int>(v); }, 0, 1000)},
        {"crash_window_s",
         Int([](Config& c, int64_t v) { c.runner_crash_window_s = static_cast<int>(v); }, 1, 24 * 3600)}}},
      {"log",
       {{"level", Text(&Config::log_level)},
        {"file", Text(&Config::log_file)},
        {"max_size_mb",
         Int([](Config& c, int64_t v) { c.log_max_size_mb = static_cast<int>(v); }, 1, 1 << 20)},
        {"keep", Int([](Config& c, int64_t v) { c.log_keep = static_cast<int>(v); }, 0, 100)}}},
  };
  return *schema;
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
  c->store_path = fs::ExpandHome(c->store_path);
  if (c->python.empty()) c->python = runtime::DefaultPython();
  if (c->worker_dir.empty()) c->worker_dir = runtime::DefaultWorkerDir();
  if (!c->token_file.empty()) c->token_file = fs::ExpandHome(c->token_file);
}

}  // namespace

std::vector<std::string> ChangedKeys(const Config& a, const Config& b) {
  const http::ServerOptions &sa = a.api.server, &sb = b.api.server;
  const std::pair<const char*, bool> keys[] = {
      {"store.path", a.store_path != b.store_path},
      {"server.listen", sa.host != sb.host || sa.port != sb.port || sa.unix_path != sb.unix_path},
      {"server.threads", sa.threads != sb.threads},
      {"server.max_body_bytes", sa.limits.max_body_bytes != sb.limits.max_body_bytes},
      {"server.max_header_bytes", sa.limits.max_header_bytes != sb.limits.max_header_bytes},
      {"server.request_timeout_s", sa.request_timeout_s != sb.request_timeout_s},
      {"server.idle_timeout_s", sa.idle_timeout_s != sb.idle_timeout_s},
      {"server.drain_timeout_s", sa.drain_timeout_s != sb.drain_timeout_s},
      {"server.max_connections_per_address",
       sa.max_connections_per_address != sb.max_connections_per_address},
      {"server.max_queued_requests", a.max_queued_requests != b.max_queued_requests},
      {"server.token_file", a.token_file != b.token_file},
      {"server.token_scope", a.api.token_for_all != b.api.token_for_all},
      {"server.allowed_hosts", a.api.allowed_hosts != b.api.allowed_hosts},
      {"server.cors_origins", a.api.cors_origins != b.api.cors_origins},
      {"build.python", a.python != b.python},
      {"build.worker_dir", a.worker_dir != b.worker_dir},
      {"build.jobs", a.build_jobs != b.build_jobs},
      {"build.timeout_s", a.build_timeout_s != b.build_timeout_s},
      {"build.retry_initial_s", a.build_retry_initial_s != b.build_retry_initial_s},
      {"build.max_attempts", a.build_max_attempts != b.build_max_attempts},
      {"build.cxx", a.cxx != b.cxx},
      {"runner.timeout_s", a.run_timeout_s != b.run_timeout_s},
      {"runner.memory_limit_mb", a.memory_limit_mb != b.memory_limit_mb},
      {"runner.max_crashes", a.runner_max_crashes != b.runner_max_crashes},
      {"runner.crash_window_s", a.runner_crash_window_s != b.runner_crash_window_s},
      {"log.level", a.log_level != b.log_level},
      {"log.file", a.log_file != b.log_file},
      {"log.max_size_mb", a.log_max_size_mb != b.log_max_size_mb},
      {"log.keep", a.log_keep != b.log_keep},
      {"sync", a.sync != b.sync},
  };
  std::vector<std::string> out;
  for (const auto& [name, changed] : keys) {
    if (changed) out.emplace_back(name);
  }
  return out;
}

StatusOr<Config> ParseConfig(const std::string& text, const std::string& file_name) {
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
    auto sit = Schema().find(section);
    if (sit == Schema().end()) {
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
      auto kit = sit->second.find(key);
      if (kit == sit->second.end()) {
        return InvalidArgument(Where(file_name, node.source()) + ": unknown key '" + full + "'");
      }
      const Key& spec = kit->second;
      if (spec.type == Key::kString && !node.is_string()) {
        return InvalidArgument(Where(file_name, node.source()) + ": '" + full + "' must be a string");
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

Status ParseListen(const std::string& listen, std::string* host, int* port) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("listen address '" + listen + "' " + why +
                           " (expected HOST:PORT, e.g. 127.0.0.1:8765, or unix:/absolute/path)");
  };
  if (listen.rfind("unix:", 0) == 0) {
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
