// A build that cannot run marks its version failed with the reason, and the
// daemon keeps answering. No compile happens here, so it is cheap.
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

using json = nlohmann::json;

TEST(BuildFailure, MissingWorkerPythonFailsVersionWithReasonAndDaemonServes) {
  TempDir dir;
  std::string store = dir / "store", config = dir / "aotid.toml";
  ASSERT_OK(fs::WriteFileAtomic(config, "[build]\npython = \"/nonexistent/bin/python3\"\n"));
  std::string out;
  ASSERT_EQ(
      RunAotid({"--config", config, "--store", store, "add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0)
      << out;
  auto d = DaemonProcess::Start({"--config", config, "--store", store, "--listen", "127.0.0.1:0"},
                                dir / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  httplib::Client c("127.0.0.1", (*d)->port());
  json ready;
  WaitFor(
      [&] {
        auto r = c.Get("/v2/models/mlp/ready");
        ready = r ? json::parse(r->body, nullptr, false) : json{{"state", "no answer"}};
        return !r || ready.value("state", "") == "failed";
      },
      30);
  ASSERT_EQ(ready.value("state", ""), "failed") << ready.dump() << "\n" << (*d)->Log();
  std::string why = ready.value("error", "");
  EXPECT_NE(why.find("cannot start the build /nonexistent/bin/python3"), std::string::npos) << why;
  EXPECT_NE(why.find("build.python"), std::string::npos) << why;

  auto infer = c.Post("/v2/models/mlp/infer", R"({"inputs":[]})", "application/json");
  ASSERT_TRUE(infer);
  EXPECT_EQ(infer->status, 503);
  EXPECT_EQ(c.Get("/v2/health/live")->status, 200);
  // A model that should be served and is not holds readiness back, named.
  auto health = c.Get("/v2/health/ready");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_NE(health->body.find(R"("name":"mlp")"), std::string::npos) << health->body;
  EXPECT_NE(health->body.find(R"("state":"failed")"), std::string::npos) << health->body;
  EXPECT_TRUE((*d)->Alive());

  // The failure is recorded in the store, where `aotid ls` shows it.
  ASSERT_EQ(RunAotid({"--config", config, "--store", store, "ls"}, &out), 0) << out;
  EXPECT_NE(out.find("failed"), std::string::npos) << out;
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();
  // Nothing was left in the cache.
  EXPECT_FALSE(fs::Exists(store + "/cache/" + (*fs::Sha256File(TestData("mlp.pt2")))));
}

// New settings whose build fails leave the version answering with the
// build it had: `ls` tells what is served apart from how its newest build
// went (it once said only "failed" while the model answered).
TEST(BuildFailure, LsTellsServingFromAFailedRebuild) {
  TempDir dir;
  std::string store = dir / "store";
  std::string out;
  ASSERT_EQ(RunAotid({"--store", store, "add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  ASSERT_EQ(RunAotid({"--store", store, "ls"}, &out), 0) << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
  auto row = LsRow(out, "mlp");
  EXPECT_EQ(row["VERSION"], "1") << out;
  EXPECT_EQ(row["POLICY"], "serve") << out;
  EXPECT_EQ(row["SERVING"], "-") << out;  // no daemon: nothing can say what is served
  EXPECT_EQ(row["BUILD"], "none") << out;
  auto d = DaemonProcess::Start({"--store", store, "--listen", "127.0.0.1:0"}, dir / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(WaitReady((*d)->port(), "mlp", 300)) << (*d)->Log();
  // `set` checks inductor options with the Python it is configured with;
  // given none it can run, it leaves them to the build, which fails.
  std::string unchecked = dir / "unchecked.toml";
  ASSERT_OK(fs::WriteFileAtomic(unchecked, "[build]\npython = \"/nonexistent/python3\"\n"));
  ASSERT_EQ(
      RunAotid({"--config", unchecked, "--store", store, "set", "mlp", "inductor.no_such_option=1"}, &out), 0)
      << out;
  EXPECT_NE(out.find("the inductor options were not checked"), std::string::npos) << out;
  bool failed = WaitFor(
      [&] {
        RunAotid({"--store", store, "ls", "--json"}, &out);
        json ls = json::parse(out, nullptr, false);
        return ls.is_array() && !ls.empty() && ls[0].value("build", "") == "failed";
      },
      300);
  ASSERT_TRUE(failed) << out << (*d)->Log();
  json ls = json::parse(out);
  EXPECT_EQ(ls[0]["serving"], true) << out;
  ASSERT_EQ(RunAotid({"--store", store, "ls"}, &out), 0) << out;
  row = LsRow(out, "mlp");
  EXPECT_EQ(row["SERVING"], "yes") << out;
  EXPECT_EQ(row["BUILD"], "failed") << out;
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  Reply r = Post((*d)->port(), "/v2/models/mlp/infer", json{{"inputs", cases["mlp"][0]["inputs"]}}.dump());
  EXPECT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();
  // With the daemon gone, ls no longer claims to know.
  ASSERT_EQ(RunAotid({"--store", store, "ls", "--json"}, &out), 0) << out;
  EXPECT_TRUE(json::parse(out)[0]["serving"].is_null()) << out;
}

}  // namespace
}  // namespace aotid::testing
