// End to end: real exported models, the real binary, real HTTP over
// loopback. The models are compiled once (the first daemon start) and the
// whole suite shares them; the restart test proves the cache is used.
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "storage/model_store.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

using json = nlohmann::json;
constexpr int64_t kMaxBody = 256 * 1024;

struct Reply {
  int status = 0;
  json body;
};

Reply Post(int port, const std::string& path, const std::string& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post(path.c_str(), body, "application/json");
  if (!r) return {};
  return {r->status, json::parse(r->body, nullptr, false)};
}

Reply Get(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get(path.c_str());
  if (!r) return {};
  return {r->status, json::parse(r->body, nullptr, false)};
}

// Polls until the model is ready; the bound covers two cold compiles on 2 cores.
bool WaitReady(int port, const std::string& model, int timeout_s = 900) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    Reply r = Get(port, "/v2/models/" + model + "/ready");
    if (r.status == 200) return true;
    if (r.status == 503 && r.body.value("state", "") == "failed") return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

int CountEvents(const std::string& store_dir, const std::string& kind, const std::string& contains = "") {
  auto store = storage::ModelStore::Open(store_dir, false);
  if (!store.ok()) return -1;
  auto events = (*store)->ListEvents(0, 100000);
  int n = 0;
  for (const auto& e : *events) {
    if (e.kind == kind && e.message.find(contains) != std::string::npos) ++n;
  }
  return n;
}

// Every output of every recorded case matches eager PyTorch.
// `cases_of` names the exported model whose cases apply (default: `model`).
void ExpectCasesMatchEager(int port, const std::string& model, std::string cases_of = "") {
  if (cases_of.empty()) cases_of = model;
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  ASSERT_TRUE(cases.contains(cases_of));
  for (const auto& c : cases[cases_of]) {
    json req{{"id", "case"}, {"inputs", c["inputs"]}};
    Reply r = Post(port, "/v2/models/" + model + "/infer", req.dump());
    ASSERT_EQ(r.status, 200) << r.body.dump();
    EXPECT_EQ(r.body["model_name"], model);
    EXPECT_EQ(r.body["id"], "case");
    ASSERT_EQ(r.body["outputs"].size(), c["outputs"].size());
    for (size_t i = 0; i < c["outputs"].size(); ++i) {
      const json& want = c["outputs"][i];
      const json& got = r.body["outputs"][i];
      EXPECT_EQ(got["name"], want["name"]);
      EXPECT_EQ(got["datatype"], want["datatype"]);
      EXPECT_EQ(got["shape"], want["shape"]);
      ASSERT_EQ(got["data"].size(), want["data"].size());
      for (size_t k = 0; k < want["data"].size(); ++k) {
        double w = want["data"][k].get<double>(), g = got["data"][k].get<double>();
        EXPECT_NEAR(g, w, 1e-5 + 1e-5 * std::fabs(w)) << model << " output " << i << " element " << k;
      }
    }
  }
}

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    store_ = dir_->path() + "/store";
    config_ = dir_->path() + "/aotid.toml";
    ASSERT_OK(fs::WriteFileAtomic(config_, "[server]\nmax_body_bytes = " + std::to_string(kMaxBody) +
                                               "\nthreads = 4\n[build]\njobs = 1\n"));
    for (const char* m : {"mlp", "embed"}) {
      std::string out;
      int rc = RunAotid({"--config", config_, "--store", store_, "add", TestData(std::string(m) + ".pt2"),
                         "--name", m}, &out);
      ASSERT_EQ(rc, 0) << out;
      EXPECT_NE(out.find(std::string("added ") + m + ":1"), std::string::npos) << out;
    }
    auto d = DaemonProcess::Start({"--config", config_, "--store", store_, "--listen", "127.0.0.1:0"},
                                  dir_->path() + "/daemon1.log");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = d->release();
    // The first request lands while the builds are still running (each takes
    // many seconds): it must be refused with 503, not block or crash.
    first_reply_ = new Reply(Post(daemon_->port(), "/v2/models/embed/infer", R"({"inputs":[]})"));
    ASSERT_TRUE(WaitReady(daemon_->port(), "mlp")) << daemon_->Log();
    ASSERT_TRUE(WaitReady(daemon_->port(), "embed")) << daemon_->Log();
  }
  static void TearDownTestSuite() {
    delete daemon_;
    delete first_reply_;
    delete dir_;
  }
  void SetUp() override { ASSERT_NE(daemon_, nullptr); }
  int port() const { return daemon_->port(); }

  static TempDir* dir_;
  static std::string store_, config_;
  static DaemonProcess* daemon_;
  static Reply* first_reply_;
};
TempDir* ServeTest::dir_ = nullptr;
std::string ServeTest::store_, ServeTest::config_;
DaemonProcess* ServeTest::daemon_ = nullptr;
Reply* ServeTest::first_reply_ = nullptr;

TEST_F(ServeTest, ModelAnswers503WhileItsBuildRuns) {
  EXPECT_EQ(first_reply_->status, 503);
  std::string msg = first_reply_->body.value("error", "");
  EXPECT_TRUE(msg.find("building") != std::string::npos || msg.find("queued") != std::string::npos) << msg;
}

TEST_F(ServeTest, HealthAndMetadataDescribeTheModels) {
  EXPECT_EQ(Get(port(), "/v2/health/live").status, 200);
  EXPECT_EQ(Get(port(), "/v2/health/ready").status, 200);
  Reply m = Get(port(), "/v2/models/mlp");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.body["state"], "ready");
  EXPECT_EQ(m.body["device"], "cpu");
  EXPECT_EQ(m.body["inputs"], json::parse(R"([{"name":"x","datatype":"FP32","shape":[-1,8]}])"));
  EXPECT_EQ(m.body["outputs"], json::parse(R"([{"name":"y","datatype":"FP32","shape":[-1,4]}])"));
  Reply e = Get(port(), "/v2/models/embed");
  EXPECT_EQ(e.body["inputs"], json::parse(R"([{"name":"ids","datatype":"INT64","shape":[2,5]}])"));
  EXPECT_EQ(Get(port(), "/v2/models/embed/versions/1/ready").status, 200);
}

TEST_F(ServeTest, InferMatchesEagerPyTorch) {
  ExpectCasesMatchEager(port(), "mlp");
  ExpectCasesMatchEager(port(), "embed");
}

TEST_F(ServeTest, BadRequestsGetClearErrorsAndDaemonKeepsServing) {
  struct Case {
    std::string path, body;
    int status;
    std::string needle;
  } cases[] = {
      {"/v2/models/nope/infer", "{}", 404, "unknown model 'nope'"},
      {"/v2/models/mlp/versions/9/infer", "{}", 404, "no served version 9"},
      {"/v2/models/mlp/infer", "{\"inputs\": [", 400, "not valid JSON"},
      {"/v2/models/mlp/infer", R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,7],"data":[1,2,3,4,5,6,7]}]})",
       400, "input 'x' has shape [1, 7], expected [-1, 8]"},
      {"/v2/models/mlp/infer", R"({"inputs":[{"name":"x","datatype":"INT64","shape":[1,8],"data":[1,2,3,4,5,6,7,8]}]})",
       400, "input 'x' has datatype INT64, expected FP32"},
      {"/v2/models/mlp/infer", R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,8],"data":[1,2,3]}]})",
       400, "'data' has 3 elements, shape [1, 8] needs 8"},
      {"/v2/models/embed/infer", R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[2,5],"data":[1,2,3,4,5,6,7,8,9,1.5]}]})",
       400, "input 'ids': element 9 is number, expected an integer"},
      {"/v2/models/mlp/infer", R"({"inputs":[{"name":"x","datatype":"FP32","shape":[4000000000,8],"data":[]}]})",
       400, "has more than"},
      {"/v2/models/mlp/infer", std::string(kMaxBody + 10, ' '), 413, "exceeds the limit of 262144 bytes"},
      {"/v2/nowhere", "{}", 404, "no route"},
  };
  for (const auto& c : cases) {
    Reply r = Post(port(), c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body.substr(0, 200) << " -> " << r.body.dump();
    ASSERT_TRUE(r.body.is_object()) << "error body is not JSON for " << c.path;
    EXPECT_NE(r.body.value("error", "").find(c.needle), std::string::npos)
        << "expected '" << c.needle << "' in " << r.body.dump();
    ASSERT_TRUE(daemon_->Alive()) << daemon_->Log();
  }
  ExpectCasesMatchEager(port(), "mlp");  // still serving correctly
}

// Another process adds a model and a new version while the daemon serves.
// Both share artifacts already built, so they load from the cache at once.
TEST_F(ServeTest, ModelsAddedByAnotherProcessAreServedWithoutRestart) {
  std::string out;
  ASSERT_EQ(RunAotid({"--store", store_, "add", TestData("embed.pt2"), "--name", "embed-live"}, &out), 0) << out;
  ASSERT_EQ(RunAotid({"--store", store_, "add", TestData("mlp.pt2"), "--name", "mlp"}, &out), 0) << out;
  EXPECT_NE(out.find("added mlp:2"), std::string::npos) << out;
  ASSERT_TRUE(WaitReady(port(), "embed-live", 30)) << daemon_->Log();
  ExpectCasesMatchEager(port(), "embed-live", "embed");
  // Version 2 replaces version 1 (bounded wait: the store watch fires within a second).
  bool v2 = false;
  for (int i = 0; i < 150 && !v2; ++i) {
    v2 = Get(port(), "/v2/models/mlp").body["versions"] == json::array({"2"});
    if (!v2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(v2) << daemon_->Log();
  ExpectCasesMatchEager(port(), "mlp");
  EXPECT_EQ(CountEvents(store_, "build_started"), 2);  // nothing new was compiled
}

// Runs last (gtest keeps declaration order): restarts the shared daemon.
TEST_F(ServeTest, RestartLoadsFromCacheAndCompilesNothing) {
  int builds_before = CountEvents(store_, "build_started");
  EXPECT_EQ(builds_before, 2);
  EXPECT_EQ(CountEvents(store_, "loaded", "after build"), 2);
  int cache_loads_before = CountEvents(store_, "loaded", "from cache");
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
  delete daemon_;
  daemon_ = nullptr;

  auto d = DaemonProcess::Start({"--config", config_, "--store", store_, "--listen", "127.0.0.1:0"},
                                dir_->path() + "/daemon2.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  daemon_ = d->release();
  ASSERT_TRUE(WaitReady(port(), "mlp", 60)) << daemon_->Log();
  ASSERT_TRUE(WaitReady(port(), "embed", 60)) << daemon_->Log();
  EXPECT_EQ(CountEvents(store_, "build_started"), builds_before);
  ASSERT_TRUE(WaitReady(port(), "embed-live", 60)) << daemon_->Log();
  EXPECT_EQ(CountEvents(store_, "loaded", "from cache") - cache_loads_before, 3);  // mlp:2, embed, embed-live
  EXPECT_EQ(daemon_->Log().find("build started"), std::string::npos) << daemon_->Log();
  ExpectCasesMatchEager(port(), "mlp");
  ExpectCasesMatchEager(port(), "embed");
}

}  // namespace
}  // namespace aotid::testing
