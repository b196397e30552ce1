#include "daemon/config.h"

#include <unistd.h>

#include <map>
#include <sstream>

#include "base/fs.h"
#include "storage/version_settings.h"
#include "test_util.h"

namespace aotid::daemon {
namespace {

TEST(Config, ShippedConfigFileParsesToTheDefaults) {
  auto text = fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/configs/aotid.toml");
  ASSERT_TRUE(text.ok());
  auto c = ParseConfig(*text, "aotid.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Config defaults;
  // Every server option, as the HTTP layer's own defaults have it.
  EXPECT_TRUE(c->api == defaults.api);
  EXPECT_TRUE(c->api.server == http::ServerOptions{});
  EXPECT_EQ(FormatListen(c->api.server), "127.0.0.1:8765");
  EXPECT_EQ(c->api.server.threads, defaults.api.server.threads);
  EXPECT_EQ(c->api.server.limits.max_body_bytes, defaults.api.server.limits.max_body_bytes);
  EXPECT_EQ(c->max_queued_requests, defaults.max_queued_requests);
  EXPECT_EQ(c->token_file, defaults.token_file);
  EXPECT_EQ(c->build_jobs, defaults.build_jobs);
  EXPECT_EQ(c->build_timeout_s, defaults.build_timeout_s);
  EXPECT_EQ(c->build_retry_initial_s, defaults.build_retry_initial_s);
  EXPECT_EQ(c->build_max_attempts, defaults.build_max_attempts);
  EXPECT_EQ(c->cxx, defaults.cxx);
  EXPECT_EQ(c->log_level, defaults.log_level);
  EXPECT_EQ(c->log_file, defaults.log_file);
  EXPECT_EQ(c->log_max_size_mb, defaults.log_max_size_mb);
  EXPECT_EQ(c->log_keep, defaults.log_keep);
  EXPECT_EQ(c->keep_alive_s, defaults.keep_alive_s);
  EXPECT_EQ(c->memory_budget_mb, defaults.memory_budget_mb);
  EXPECT_EQ(c->load_wait_s, defaults.load_wait_s);
  EXPECT_EQ(c->unload_on_pressure, defaults.unload_on_pressure);
  EXPECT_TRUE(*c == [] {
    Config d;
    d.source = "aotid.toml";
    return d;
  }());
}

// A reload names what changed: each key of the shipped file, set alone to
// another value, is named, and only it; kept at its running value, it is
// named no more. The file and the config's table list the same keys.
TEST(Config, ChangedKeysNamesEachKeyOfTheShippedFile) {
  auto text = fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/configs/aotid.toml");
  ASSERT_TRUE(text.ok());
  auto base = ParseConfig(*text, "aotid.toml");
  ASSERT_TRUE(base.ok());
  const std::map<std::string, std::string> other = {
      {"server.listen", "\"127.0.0.1:8766\""},         {"server.grpc_listen", "\"127.0.0.1:8767\""},
      {"server.token_scope", "\"repository\""},        {"log.level", "\"debug\""},
      {"server.cors_origins", "[\"http://a.local\"]"}, {"residency.keep_alive", "\"10m\""}};
  std::string section;
  std::vector<std::string> file_keys;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("[")) section = line.substr(1, line.find(']') - 1);
    size_t eq = line.find(" = ");
    if (line.empty() || line[0] == '#' || line[0] == '[' || eq == std::string::npos) continue;
    std::string key = section + "." + line.substr(0, eq), value = line.substr(eq + 3);
    std::string changed = other.count(key)   ? other.at(key)
                          : value == "\"\""  ? "\"/x\""
                          : value == "[]"    ? "[\"a\"]"
                          : value[0] == '"'  ? "\"x\""
                          : value == "true"  ? "false"
                          : value == "false" ? "true"
                                             : std::to_string(std::stoll(value) + 1);
    auto c = ParseConfig("[" + section + "]\n" + line.substr(0, eq) + " = " + changed + "\n", "x.toml");
    ASSERT_TRUE(c.ok()) << key << ": " << c.status().ToString();
    Config defaults;
    EXPECT_EQ(ChangedKeys(defaults, *c), std::vector<std::string>{key}) << line;
    EXPECT_TRUE(ChangedKeys(*base, *base).empty());
    // A key that waits for a restart keeps its running value: kept, it is
    // no longer a change, and a change to another key stays.
    Config next = *c;
    const bool keep_is_key = key == "log.keep";
    (keep_is_key ? next.log_max_size_mb : next.log_keep) += 7;
    KeepRunningValues(defaults, {key}, &next);
    EXPECT_EQ(ChangedKeys(defaults, next),
              std::vector<std::string>{keep_is_key ? "log.max_size_mb" : "log.keep"})
        << key;
    file_keys.push_back(key);
  }
  // The file documents every key the config knows, in the table's order.
  file_keys.emplace_back("sync");
  EXPECT_EQ(file_keys, ConfigKeyNames());
}

// When each key takes effect, as a reload reports it and as the daemon
// applies it (daemon/serve.cc's Reload).
TEST(Config, EachKeyHasTheReloadRuleTheDaemonApplies) {
  for (const char* live :
       {"log.level", "server.token_file", "server.cors_origins", "build.jobs", "sync", "residency.keep_alive",
        "residency.memory_budget_mb", "residency.load_wait_s", "residency.unload_on_pressure"})
    EXPECT_EQ(ReloadRuleOf(live), ReloadRule::kLive) << live;
  for (const char* loads : {"runner.timeout_s", "runner.memory_limit_mb", "server.max_queued_requests"})
    EXPECT_EQ(ReloadRuleOf(loads), ReloadRule::kNextLoad) << loads;
  for (const char* restart :
       {"store.path", "server.listen", "server.write_timeout_s", "build.cxx", "build.cache_dir"})
    EXPECT_EQ(ReloadRuleOf(restart), ReloadRule::kRestart) << restart;
}

// The [server] keys land in the options the HTTP API is given, unchanged
// on their way (serve copies them whole).
TEST(Config, ServerKeysSetTheHttpOptions) {
  auto c = ParseConfig(
      "[server]\nlisten = \"0.0.0.0:9001\"\nthreads = 3\nmax_body_bytes = 2048\n"
      "max_header_bytes = 4096\nrequest_timeout_s = 7\nidle_timeout_s = 9\n"
      "max_connections_per_address = 12\ndrain_timeout_s = 4\ntoken_scope = \"repository\"\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const http::ServerOptions& s = c->api.server;
  EXPECT_EQ(s.host, "0.0.0.0");
  EXPECT_EQ(s.port, 9001);
  EXPECT_EQ(s.unix_path, "");
  EXPECT_EQ(s.threads, 3);
  EXPECT_EQ(s.limits.max_body_bytes, 2048);
  EXPECT_EQ(s.limits.max_header_bytes, 4096u);
  EXPECT_EQ(s.request_timeout_s, 7);
  EXPECT_EQ(s.idle_timeout_s, 9);
  EXPECT_EQ(s.max_connections_per_address, 12);
  EXPECT_EQ(s.drain_timeout_s, 4);
  EXPECT_FALSE(c->api.token_for_all);
  auto bad = ParseConfig("[server]\ntoken_scope = \"some\"\n", "x.toml");
  EXPECT_EQ(bad.status().message(), "x.toml: 'server.token_scope' must be all or repository, got 'some'");
  auto listen = ParseConfig("[server]\nlisten = \"localhost\"\n", "x.toml");
  std::string want = "x.toml: 'server.listen': listen address 'localhost' has no port";
  EXPECT_EQ(listen.status().message().rfind(want, 0), 0u) << listen.status().message();
}

TEST(Config, ListenAddressesRoundTripThroughTheServerOptions) {
  for (std::string listen : {"127.0.0.1:8765", "[::1]:9000", "unix:/run/aotid/aotid.sock"}) {
    http::ServerOptions s;
    ASSERT_OK(SetListen(listen, &s));
    EXPECT_EQ(FormatListen(s), listen);
  }
  http::ServerOptions s;
  ASSERT_OK(SetListen("unix:/run/aotid.sock", &s));
  EXPECT_EQ(s.unix_path, "/run/aotid.sock");
  ASSERT_OK(SetListen("[::1]:0", &s));
  EXPECT_EQ(s.unix_path, "");
  EXPECT_EQ(s.host, "::1");
  EXPECT_EQ(s.port, 0);
  http::ServerOptions before = s;
  EXPECT_FALSE(SetListen("h:99999", &s).ok());
  EXPECT_TRUE(s == before);
}

TEST(Config, GoodFileSetsValues) {
  auto c = ParseConfig(
      "[server]\nlisten = \"[::1]:9000\"\nthreads = 3\n[build]\njobs = 2\n[log]\nlevel = \"debug\"\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(FormatListen(c->api.server), "[::1]:9000");
  EXPECT_EQ(c->api.server.threads, 3);
  EXPECT_EQ(c->build_jobs, 2);
  EXPECT_EQ(c->log_level, "debug");
}

// A relative store is taken from the working directory at start: a
// build's compiler, which runs in a folder of its own, found no temporary
// folder under a relative TMPDIR and failed ("Cannot create temporary file
// in /tmp/").
TEST(Config, ARelativeStorePathIsMadeAbsolute) {
  aotid::testing::TempDir dir;
  ASSERT_OK(fs::WriteFileAtomic(dir.path() + "/aotid.toml", "[store]\npath = \"./my-store\"\n"));
  auto c = LoadConfig(dir.path() + "/aotid.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  EXPECT_EQ(c->store_path, std::string(cwd) + "/my-store");
  EXPECT_EQ(fs::Absolute("/abs/path"), "/abs/path");
  EXPECT_EQ(fs::Absolute("rel/a"), std::string(cwd) + "/rel/a");
  EXPECT_EQ(fs::Absolute("."), std::string(cwd));
}

// build.cache_dir: the build cache's folder, made absolute like the store;
// unset, the store's own cache/.
TEST(Config, BuildCacheDirNamesTheCachesFolder) {
  aotid::testing::TempDir dir;
  ASSERT_OK(fs::WriteFileAtomic(dir.path() + "/plain.toml", "[store]\npath = \"/srv/store\"\n"));
  auto plain = LoadConfig(dir.path() + "/plain.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->cache_dir, "");
  EXPECT_EQ(plain->CachePath(), "/srv/store/cache");
  EXPECT_FALSE(plain->CacheIsSeparate());

  ASSERT_OK(fs::WriteFileAtomic(dir.path() + "/shared.toml",
                                "[store]\npath = \"/srv/store\"\n[build]\ncache_dir = \"./node-cache\"\n"));
  auto shared = LoadConfig(dir.path() + "/shared.toml");
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  EXPECT_EQ(shared->cache_dir, std::string(cwd) + "/node-cache");
  EXPECT_EQ(shared->CachePath(), std::string(cwd) + "/node-cache");
  EXPECT_TRUE(shared->CacheIsSeparate());
  EXPECT_EQ(ChangedKeys(*plain, *shared), std::vector<std::string>{"build.cache_dir"});

  // Naming the store's own cache is no separate cache.
  Config same = *plain;
  same.cache_dir = "/srv/store/cache";
  EXPECT_FALSE(same.CacheIsSeparate());
  EXPECT_EQ(same.CachePath(), plain->CachePath());

  auto bad = ParseConfig("[build]\ncache_dir = 3\n", "my.toml");
  EXPECT_FALSE(bad.ok());
}

TEST(Config, RunnerSectionSetsTheRunnersLimits) {
  auto c = ParseConfig(
      "[runner]\ntimeout_s = 7\nmemory_limit_mb = 2048\nmax_crashes = 2\ncrash_window_s = 30\n", "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->run_timeout_s, 7);
  EXPECT_EQ(c->memory_limit_mb, 2048);
  EXPECT_EQ(c->runner_max_crashes, 2);
  EXPECT_EQ(c->runner_crash_window_s, 30);
  auto zero = ParseConfig("[runner]\ntimeout_s = 0\n", "x.toml");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("runner.timeout_s"), std::string::npos) << zero.status().message();
}

// [residency]: keep_alive as `aotid set` takes a version's, less
// "default" (this is what a version's default means); the rest by type and
// range, each error naming the key.
TEST(Config, ResidencySectionSetsItsKeysAndNamesBadOnes) {
  auto c = ParseConfig(
      "[residency]\nkeep_alive = \"2h\"\nmemory_budget_mb = 4096\nload_wait_s = 0\n"
      "unload_on_pressure = false\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->keep_alive_s, 7200);
  EXPECT_EQ(c->memory_budget_mb, 4096);
  EXPECT_EQ(c->load_wait_s, 0);
  EXPECT_FALSE(c->unload_on_pressure);
  for (auto [text, seconds] : std::vector<std::pair<std::string, int>>{
           {"0", 0}, {"90s", 90}, {"always", storage::kKeepAliveAlways}, {"-1", storage::kKeepAliveAlways}}) {
    auto k = ParseConfig("[residency]\nkeep_alive = \"" + text + "\"\n", "x.toml");
    ASSERT_TRUE(k.ok()) << text << ": " << k.status().ToString();
    EXPECT_EQ(k->keep_alive_s, seconds) << text;
  }

  auto error = [](const std::string& text) {
    auto r = ParseConfig(text, "x.toml");
    return r.ok() ? std::string("(accepted)") : r.status().message();
  };
  for (const char* bad : {"soon", "default", "721h", "5d"}) {
    EXPECT_EQ(
        error("[residency]\nkeep_alive = \"" + std::string(bad) + "\"\n"),
        "x.toml: 'residency.keep_alive' must be a duration (0, 90s, 5m, 2h) of at most 720h, or always, "
        "got '" +
            std::string(bad) + "'");
  }
  EXPECT_EQ(error("[residency]\nkeep_alive = 300\n"), "x.toml:2:14: 'residency.keep_alive' must be a string");
  EXPECT_EQ(error("[residency]\nmemory_budget_mb = -1\n"),
            "x.toml:2:20: 'residency.memory_budget_mb' must be between 0 and 16777216, got -1");
  EXPECT_EQ(error("[residency]\nload_wait_s = 3601\n"),
            "x.toml:2:15: 'residency.load_wait_s' must be between 0 and 3600, got 3601");
  EXPECT_EQ(error("[residency]\nunload_on_pressure = \"yes\"\n"),
            "x.toml:2:22: 'residency.unload_on_pressure' must be true or false");
  EXPECT_EQ(error("[residency]\nunload_on_pressure = 1\n"),
            "x.toml:2:22: 'residency.unload_on_pressure' must be true or false");
}

TEST(Config, UnknownKeyNamesFileLineAndKey) {
  auto c = ParseConfig("[server]\nlisten = \"127.0.0.1:1\"\nlisen = 3\n", "my.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "my.toml:3:9: unknown key 'server.lisen'");
}

TEST(Config, UnknownSectionIsAnError) {
  auto c = ParseConfig("[sever]\nx = 1\n", "my.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("my.toml:1:"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("'sever'"), std::string::npos);
}

TEST(Config, WrongTypeNamesFileLineAndKey) {
  auto c = ParseConfig("[server]\nthreads = \"8\"\n", "my.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "my.toml:2:11: 'server.threads' must be an integer");
  auto s = ParseConfig("[build]\npython = 3\n", "my.toml");
  EXPECT_EQ(s.status().message(), "my.toml:2:10: 'build.python' must be a string");
}

TEST(Config, OutOfRangeAndBadListenAreErrors) {
  auto c = ParseConfig("[build]\njobs = 0\n", "my.toml");
  EXPECT_NE(c.status().message().find("'build.jobs' must be between 1 and 64, got 0"), std::string::npos)
      << c.status().message();
  auto l = ParseConfig("[server]\nlisten = \"localhost\"\n", "my.toml");
  EXPECT_NE(l.status().message().find("has no port"), std::string::npos) << l.status().message();
}

TEST(Config, SyntaxErrorHasPosition) {
  auto c = ParseConfig("[server\n", "my.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind("my.toml:1:", 0), 0u) << c.status().message();
}

TEST(Config, ExplicitMissingFileIsAnError) {
  auto c = LoadConfig("/nonexistent/aotid.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/aotid.toml"), std::string::npos);
}

TEST(Config, ParseListenAcceptsV4AndBracketedV6) {
  std::string host;
  int port = 0;
  ASSERT_OK(ParseListen("127.0.0.1:8765", &host, &port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8765);
  ASSERT_OK(ParseListen("[::1]:0", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 0);
  EXPECT_FALSE(ParseListen("::1:80", &host, &port).ok());
  EXPECT_FALSE(ParseListen("h:99999", &host, &port).ok());
  ASSERT_OK(ParseListen("unix:/run/aotid/aotid.sock", &host, &port));
  EXPECT_EQ(host, "unix:/run/aotid/aotid.sock");
  Status relative = ParseListen("unix:aotid.sock", &host, &port);
  EXPECT_NE(relative.message().find("needs an absolute socket path"), std::string::npos)
      << relative.message();
  EXPECT_FALSE(ParseListen("unix:/" + std::string(200, 'x'), &host, &port).ok());
}

TEST(Config, AGrpcListenAddressIsHostAndPortAndItsHintSaysSo) {
  ASSERT_OK(CheckGrpcListen("127.0.0.1:8766"));
  ASSERT_OK(CheckGrpcListen("[::1]:0"));
  Status unix_socket = CheckGrpcListen("unix:/run/aotid/grpc.sock");
  EXPECT_NE(unix_socket.message().find("not on a unix socket"), std::string::npos) << unix_socket.message();
  // The hint offers what gRPC takes: no unix socket.
  Status garbage = CheckGrpcListen("garbage");
  EXPECT_NE(garbage.message().find("'garbage' has no port (expected HOST:PORT"), std::string::npos)
      << garbage.message();
  EXPECT_EQ(garbage.message().find("unix:"), std::string::npos) << garbage.message();
  std::string host;
  int port = 0;
  EXPECT_NE(ParseListen("garbage", &host, &port).message().find("or unix:/absolute/path"), std::string::npos);
}

TEST(Config, SecurityKeysParseAndAreChecked) {
  auto c = ParseConfig(
      "[server]\ntoken_file = \"/etc/aotid/token\"\nallowed_hosts = [\"mybox.local\"]\n"
      "cors_origins = [\"http://localhost:3000\", \"*\"]\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->token_file, "/etc/aotid/token");
  EXPECT_EQ(c->api.allowed_hosts, std::vector<std::string>{"mybox.local"});
  EXPECT_EQ(c->api.cors_origins, (std::vector<std::string>{"http://localhost:3000", "*"}));
  auto not_list = ParseConfig("[server]\nallowed_hosts = \"mybox.local\"\n", "x.toml");
  EXPECT_EQ(not_list.status().message(), "x.toml:2:17: 'server.allowed_hosts' must be a list of strings");
  auto mixed = ParseConfig("[server]\ncors_origins = [\"http://a\", 3]\n", "x.toml");
  EXPECT_NE(mixed.status().message().find("must be a list of strings"), std::string::npos);
  auto bare = ParseConfig("[server]\ncors_origins = [\"localhost:3000\"]\n", "x.toml");
  EXPECT_NE(bare.status().message().find("entries are origins like"), std::string::npos)
      << bare.status().message();
}

}  // namespace
}  // namespace aotid::daemon

namespace aotid::daemon {
namespace {

// [[sync]] tables: the sources the daemon follows, each checked where it
// is written.
TEST(Config, SyncTablesListTheSourcesAndBadOnesAreNamed) {
  auto c = ParseConfig(R"([[sync]]
source = "oci://127.0.0.1:5000/models/mlp:stable"
interval_s = 60
keep = 2
name = "mlp-stable"

[[sync]]
source = "oci://registry.example.com/models/resnet"
insecure = true
)",
                       "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->sync.size(), 2u);
  EXPECT_EQ(c->sync[0].source, "oci://127.0.0.1:5000/models/mlp:stable");
  EXPECT_EQ(c->sync[0].interval_s, 60);
  EXPECT_EQ(c->sync[0].keep, 2);
  EXPECT_EQ(c->sync[0].name, "mlp-stable");
  EXPECT_EQ(c->sync[1].interval_s, 300);
  EXPECT_TRUE(c->sync[1].insecure);
  Config other = *c;
  other.sync.pop_back();
  EXPECT_EQ(ChangedKeys(*c, other), std::vector<std::string>{"sync"});

  auto error = [](const std::string& text) {
    auto r = ParseConfig(text, "x.toml");
    return r.ok() ? std::string("(accepted)") : r.status().message();
  };
  EXPECT_NE(error("[[sync]]\ninterval_s = 5\n").find("x.toml:1:1: a [[sync]] needs a source"),
            std::string::npos);
  EXPECT_NE(error("[[sync]]\nsource = \"oci://x/Upper\"\n").find("is not an OCI reference"),
            std::string::npos);
  EXPECT_NE(error("[[sync]]\nsource = \"models\"\n").find("or a folder's absolute path, got 'models'"),
            std::string::npos);
  EXPECT_NE(
      error("[[sync]]\nsource = \"oci://h/m:1\"\nevery = 5\n").find("x.toml:3:1: unknown key 'sync.every'"),
      std::string::npos);
  EXPECT_NE(error("[[sync]]\nsource = \"oci://h/m:1\"\ninterval_s = 0\n")
                .find("'sync.interval_s' must be an integer"),
            std::string::npos);
  EXPECT_NE(error("[[sync]]\nsource = \"oci://h/m\"\nname = \"x\"\n").find("needs a source with one tag"),
            std::string::npos);
  EXPECT_NE(error("[sync]\nsource = \"oci://h/m:1\"\n").find("'sync' must be tables ([[sync]])"),
            std::string::npos);
  EXPECT_NE(error("[[sync]]\nsource = \"oci://h/m:1\"\n[[sync]]\nsource = \"oci://h/m:1\"\nname = \"b\"\n")
                .find("x.toml:3:1: the source oci://h/m:1 is in two [[sync]] tables"),
            std::string::npos);
}

// A key of many dotted parts (or a table header of them) would take the
// TOML parser's recursion past the stack; it is refused, with where it is,
// before it is parsed. Dots inside quotes and multi-line strings are text.
TEST(Config, KeysOfTooManyDottedPartsAreRefusedBeforeTheyAreParsed) {
  std::string deep;
  for (int i = 0; i < 40000; ++i) deep += "a.";
  for (const std::string& text :
       {"[log]\n" + deep + "b = 1\n", "[" + deep + "b]\n", "# ok\n[" + deep + "b]]\n"}) {
    auto c = ParseConfig(text, "deep.toml");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().message().rfind("deep.toml:", 0), 0u) << c.status().message();
    EXPECT_NE(c.status().message().find("more than 64 dotted parts"), std::string::npos)
        << c.status().message();
  }
  std::string dots(500, '.');
  auto fine = ParseConfig("[log]\nlevel = \"debug\" # " + dots + "\nfile = '''" + dots +
                              "'''\n"
                              "[server]\n\"cors_origins\" = [\"http://a." +
                              dots + "\"]\n",
                          "x.toml");
  EXPECT_TRUE(fine.ok()) << fine.status().ToString();
  auto multi = ParseConfig("[log]\nfile = \"\"\"\n" + dots + " = 1\n\"\"\"\n", "x.toml");
  EXPECT_TRUE(multi.ok()) << multi.status().ToString();
}

}  // namespace
}  // namespace aotid::daemon
