// End to end: single-model mode (`aotid serve --model-dir DIR --model-name
// NAME`), as KServe runs a runtime: the package in a read-only folder the
// daemon did not fill, a store of its own for the builds, and
// /v2/health/ready saying 200 only once the model answers.
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <string>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

class SingleModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    models_ = dir_.path() + "/mnt/models";
    store_ = dir_.path() + "/state";
    // Where a storage initializer puts a package: a level down, read-only.
    ASSERT_OK(fs::MakeDirs(models_ + "/1"));
    Place("mlp.pt2");
  }
  // The folder holds `file` (from the test data) alone, as model.pt2.
  void Place(const std::string& file) {
    ::chmod(models_.c_str(), 0755);
    ::chmod((models_ + "/1").c_str(), 0755);
    auto bytes = fs::ReadFile(TestData(file));
    ASSERT_OK(bytes.status());
    ASSERT_OK(fs::WriteFileAtomic(models_ + "/1/model.pt2", *bytes));
    ::chmod((models_ + "/1/model.pt2").c_str(), 0444);
    ::chmod((models_ + "/1").c_str(), 0555);
    ::chmod(models_.c_str(), 0555);
  }
  StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::string& log) {
    RunOptions opts;
    opts.obey_file_modes = true;  // the folder is read-only even to root
    return DaemonProcess::Start({"--store", store_, "--listen", "127.0.0.1:0", "--model-dir",
                                 dir_.path() + "/mnt/models", "--model-name", "demo"},
                                dir_.path() + "/" + log, opts);
  }
  // Polls /v2/health/ready until 200; counts the 503s before it.
  bool WaitServerReady(int port, int* not_ready, json* last_not_ready) {
    return WaitFor(
        [&] {
          Reply r = Get(port, "/v2/health/ready");
          if (r.status == 200) return true;
          ++*not_ready;
          *last_not_ready = r.body;
          return false;
        },
        600);
  }

  TempDir dir_;
  std::string models_, store_;
};

TEST_F(SingleModelTest, ServesTheFolderReadyOnlyOnceLoadedAndAdoptsItOnce) {
  // A model of the store's own, added beside: single-model mode serves the
  // folder's model alone.
  std::string out;
  ASSERT_EQ(RunAotid({"--store", store_, "add", TestData("mlp_so.pt2"), "--name", "other"}, &out), 0) << out;

  auto d = Start("first.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  int port = (*d)->port();
  int not_ready = 0;
  json why;
  ASSERT_TRUE(WaitServerReady(port, &not_ready, &why)) << (*d)->Log();
  // The build takes seconds: the probe said 503 meanwhile, naming the model.
  EXPECT_GT(not_ready, 0);
  ASSERT_TRUE(why.contains("not_ready")) << why.dump();
  EXPECT_EQ(why["not_ready"][0]["name"], "demo") << why.dump();
  // Ready means loaded: the model answers at once, as eager PyTorch does.
  Reply ready = Get(port, "/v2/models/demo/ready");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body.value("resident", false), true) << ready.body.dump();
  ExpectCasesMatchEager(port, "demo", "mlp");
  EXPECT_EQ(Get(port, "/v2/models/other").status, 404);
  Reply index = Post(port, "/v2/repository/index", "{}");
  ASSERT_EQ(index.status, 200);
  ASSERT_EQ(index.body.size(), 1u) << index.body.dump();
  EXPECT_EQ(index.body[0]["name"], "demo");
  // The one model is not unloaded through the repository (the pod would be
  // ready for nothing), nor is another loaded.
  for (const char* path : {"/v2/repository/models/demo/unload", "/v2/repository/models/other/load"}) {
    Reply refused = Post(port, path, "{}");
    EXPECT_EQ(refused.status, 409) << path << " " << refused.body.dump();
    EXPECT_NE(refused.body.value("error", "").find("single-model mode"), std::string::npos)
        << refused.body.dump();
  }
  EXPECT_EQ(Get(port, "/v2/health/ready").status, 200);
  ExpectCasesMatchEager(port, "demo", "mlp");
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();

  // A restart over the same store adopts nothing new and loads the cached
  // build: ready without building.
  auto again = Start("second.log");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  not_ready = 0;
  ASSERT_TRUE(WaitServerReady((*again)->port(), &not_ready, &why)) << (*again)->Log();
  EXPECT_NE((*again)->Log().find("as demo:1, the store's already"), std::string::npos) << (*again)->Log();
  EXPECT_EQ((*again)->Log().find("build started"), std::string::npos) << (*again)->Log();
  ExpectCasesMatchEager((*again)->port(), "demo", "mlp");
  EXPECT_EQ((*again)->Stop(), 0);

  // Another package in the folder (a new storage URI) is a new version,
  // served in place of the first.
  Place("mlp_so.pt2");
  auto third = Start("third.log");
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_TRUE(WaitServerReady((*third)->port(), &not_ready, &why)) << (*third)->Log();
  Reply meta = Get((*third)->port(), "/v2/models/demo");
  EXPECT_EQ(meta.body.value("version", ""), "2") << meta.body.dump();
  EXPECT_EQ(meta.body["versions"], json::array({"2"})) << meta.body.dump();
  // The first version left the store with its package (its build stays).
  std::string ls;
  ASSERT_EQ(RunAotid({"--store", store_, "ls"}, &ls), 0) << ls;
  EXPECT_EQ(LsRow(ls, "demo")["VERSION"], "2") << ls;  // the first row: no version 1
  ExpectCasesMatchEager((*third)->port(), "demo", "mlp");
  EXPECT_EQ((*third)->Stop(), 0);
}

// A model that fails for good (its build cannot succeed) ends the daemon
// with an error, so that the orchestrator shows a failed container and its
// log, rather than a pod that never says ready.
TEST_F(SingleModelTest, AModelThatFailsForGoodStopsTheDaemonWithItsReason) {
  const std::string log = dir_.path() + "/failed.log";
  auto pid = SpawnAotid({"--store", store_, "serve", "--listen", "127.0.0.1:0", "--model-dir",
                         TestData("broken_program.pt2"), "--model-name", "broken"},
                        log);
  ASSERT_OK(pid.status());
  EXPECT_EQ(WaitExitFor(*pid, 300), 1);
  auto text = fs::ReadFile(log);
  ASSERT_OK(text.status());
  EXPECT_NE(text->find("broken:1 failed: build exited"), std::string::npos) << *text;
}

TEST_F(SingleModelTest, WhatCannotBeServedIsRefusedAtStartNamingWhy) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  ASSERT_OK(fs::MakeDirs(dir_.path() + "/empty"));
  ASSERT_OK(fs::MakeDirs(dir_.path() + "/two"));
  for (const char* f : {"a.pt2", "b.pt2"}) {
    ASSERT_OK(fs::WriteFileAtomic(dir_.path() + "/two/" + f, *fs::ReadFile(TestData("mlp_so.pt2"))));
  }
  const std::string config = dir_.path() + "/sync.toml";
  ASSERT_OK(fs::WriteFileAtomic(config, "[[sync]]\nsource = \"oci://127.0.0.1:9/models\"\n"));
  const std::vector<Case> cases = {
      {{"--model-dir", dir_.path() + "/none", "--model-name", "demo"}, "does not exist"},
      {{"--model-dir", dir_.path() + "/empty", "--model-name", "demo"}, "no .pt2 package in --model-dir"},
      {{"--model-dir", dir_.path() + "/two", "--model-name", "demo"}, "several .pt2 packages (a.pt2, b.pt2)"},
      {{"--model-dir", TestData("not_a_model.pt2"), "--model-name", "demo"}, "is not a .pt2 package"},
      {{"--model-dir", models_, "--model-name", "no good"}, "model name 'no good'"},
      {{"--model-dir", models_}, "--model-dir needs --model-name"},
      {{"--config", config, "--model-dir", models_, "--model-name", "demo"}, "[[sync]]"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"--store", store_, "serve", "--listen", "127.0.0.1:0"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    std::string out;
    int rc = RunAotid(args, &out);
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << c.says << "\n" << out;
  }
  // Nothing was adopted by the refused starts.
  std::string ls;
  ASSERT_EQ(RunAotid({"--store", store_, "ls"}, &ls), 0) << ls;
  EXPECT_EQ(ls.find("demo"), std::string::npos) << ls;
}

}  // namespace
}  // namespace aotid::testing
