// Local-first protections of the HTTP API, against a real daemon over
// loopback: the Host check that stops DNS rebinding, the bearer token, and
// CORS. No model is needed, so no build runs.
#include <httplib.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

using json = nlohmann::json;

class ApiSecurity : public ::testing::Test {
 protected:
  void Start(const std::string& config_text) {
    config_ = dir_ / "aotid.toml";
    ASSERT_OK(fs::WriteFileAtomic(config_, config_text));
    auto d = DaemonProcess::Start({"--config", config_, "--store", dir_ / "store", "--listen", "127.0.0.1:0"},
                                  dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
  }
  httplib::Result Get(const std::string& path, const httplib::Headers& headers = {}) {
    httplib::Client c("127.0.0.1", daemon_->port());
    return c.Get(path.c_str(), headers);
  }
  static std::string Error(const httplib::Result& r) {
    return r ? json::parse(r->body, nullptr, false).value("error", "") : "no response";
  }

  TempDir dir_;
  std::string config_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(ApiSecurity, BearerTokenIsRequiredAndChecked) {
  std::string token_file = dir_ / "token";
  ASSERT_OK(fs::WriteFileAtomic(token_file, "s3cret-token\n"));
  ::chmod(token_file.c_str(), 0600);
  Start("[server]\ntoken_file = \"" + token_file + "\"\n");

  auto missing = Get("/v2");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(missing->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_NE(Error(missing).find("needs a bearer token"), std::string::npos) << missing->body;

  for (const std::string& wrong : std::vector<std::string>{"Bearer s3cret", "Bearer s3cret-token2", "Basic czNjcmV0LXRva2Vu", "Bearer "}) {
    auto r = Get("/v2/health/ready", {{"Authorization", wrong}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << wrong;
    EXPECT_EQ(Error(r), "wrong bearer token");
  }
  auto ok = Get("/v2", {{"Authorization", "Bearer s3cret-token"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(json::parse(ok->body)["name"], "aotid");
  auto unknown = Get("/v2/models/nope", {{"Authorization", "Bearer s3cret-token"}});
  EXPECT_EQ(unknown->status, 404);  // past the token, the routes answer as usual
  EXPECT_TRUE(daemon_->Alive());
}

TEST_F(ApiSecurity, TokenScopeRepositoryGuardsOnlyTheRepositoryRoutes) {
  std::string token_file = dir_ / "token";
  ASSERT_OK(fs::WriteFileAtomic(token_file, "t0ken"));
  ::chmod(token_file.c_str(), 0600);
  Start("[server]\ntoken_file = \"" + token_file + "\"\ntoken_scope = \"repository\"\n");
  EXPECT_EQ(Get("/v2")->status, 200);
  httplib::Client c("127.0.0.1", daemon_->port());
  auto index = c.Post("/v2/repository/index", "", "application/json");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 401);
  auto unload = c.Post("/v2/repository/models/x/unload", httplib::Headers{{"Authorization", "Bearer nope"}}, "",
                       "application/json");
  ASSERT_TRUE(unload);
  EXPECT_EQ(unload->status, 403);
  auto ok = c.Post("/v2/repository/index", httplib::Headers{{"Authorization", "Bearer t0ken"}}, "",
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "[]");
}

TEST_F(ApiSecurity, TokenFileMustExistAndNotBeEmpty) {
  std::string empty = dir_ / "empty-token";
  ASSERT_OK(fs::WriteFileAtomic(empty, " \n"));
  ASSERT_OK(fs::WriteFileAtomic(dir_ / "a.toml", "[server]\ntoken_file = \"" + empty + "\"\n"));
  std::string out;
  EXPECT_EQ(RunAotid({"--config", dir_ / "a.toml", "--store", dir_ / "store", "serve", "--listen", "127.0.0.1:0"},
                     &out),
            1);
  EXPECT_NE(out.find("server.token_file " + empty + " is empty"), std::string::npos) << out;
  ASSERT_OK(fs::WriteFileAtomic(dir_ / "b.toml", "[server]\ntoken_file = \"" + (dir_ / "absent") + "\"\n"));
  EXPECT_EQ(RunAotid({"--config", dir_ / "b.toml", "--store", dir_ / "store", "serve", "--listen", "127.0.0.1:0"},
                     &out),
            1);
  EXPECT_NE(out.find("server.token_file"), std::string::npos) << out;
  EXPECT_NE(out.find("absent"), std::string::npos) << out;
}

// A web page on evil.example that rebinds its name to 127.0.0.1 still sends
// "Host: evil.example"; only loopback names (and those configured) pass.
TEST_F(ApiSecurity, HostHeaderCheckStopsDnsRebinding) {
  Start("[server]\nallowed_hosts = [\"mybox.local\"]\n");
  std::string port = std::to_string(daemon_->port());
  for (const std::string& host : std::vector<std::string>{"evil.example", "evil.example:" + port, "127.0.0.1.evil.example", "10.0.0.1"}) {
    auto r = Get("/v2/health/live", {{"Host", host}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << host;
    EXPECT_NE(Error(r).find("is not allowed"), std::string::npos) << r->body;
  }
  for (const std::string& host : std::vector<std::string>{"localhost", "localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port,
                                  "127.1.2.3", "mybox.local:" + port}) {
    auto r = Get("/v2/health/live", {{"Host", host}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << host << ": " << r->body;
  }
  EXPECT_TRUE(daemon_->Alive());
}

TEST_F(ApiSecurity, CorsIsOffUnlessOriginsAreConfigured) {
  Start("");
  auto plain = Get("/v2", {{"Origin", "http://localhost:3000"}});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 200);
  EXPECT_FALSE(plain->has_header("Access-Control-Allow-Origin"));
  httplib::Client c("127.0.0.1", daemon_->port());
  auto preflight = c.Options("/v2/models/m/infer", {{"Origin", "http://localhost:3000"},
                                                    {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 403);
  EXPECT_NE(Error(preflight).find("not in server.cors_origins"), std::string::npos) << preflight->body;
}

TEST_F(ApiSecurity, CorsAnswersConfiguredOriginsOnly) {
  Start("[server]\ncors_origins = [\"http://localhost:3000\"]\n");
  httplib::Client c("127.0.0.1", daemon_->port());
  auto preflight = c.Options("/v2/models/m/infer", {{"Origin", "http://localhost:3000"},
                                                    {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Content-Type"), std::string::npos);
  auto allowed = Get("/v2", {{"Origin", "http://localhost:3000"}});
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  auto other = Get("/v2", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200);  // the browser, not the server, withholds the answer
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  auto bad_preflight = c.Options("/v2", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(bad_preflight);
  EXPECT_EQ(bad_preflight->status, 403);
}

}  // namespace
}  // namespace aotid::testing
