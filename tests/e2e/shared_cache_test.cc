// End to end: daemons with stores of their own sharing one build cache
// (--cache-dir), as the pods of a node share a hostPath: the model is
// built once for all of them, a daemon killed mid-build leaves nothing
// behind at the next start, and no start disturbs a live daemon's build.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

class SharedCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = dir_.path() + "/node-cache";
    models_ = dir_.path() + "/models";
    ASSERT_OK(fs::MakeDirs(models_));
    auto bytes = fs::ReadFile(TestData("mlp.pt2"));
    ASSERT_OK(bytes.status());
    ASSERT_OK(fs::WriteFileAtomic(models_ + "/model.pt2", *bytes));
  }
  // A daemon serving the folder's model as "demo", with the store `name`
  // of its own and the shared cache.
  StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::string& name) {
    return DaemonProcess::Start({"--store", dir_.path() + "/" + name, "--cache-dir", cache_, "--listen",
                                 "127.0.0.1:0", "--model-dir", models_, "--model-name", "demo"},
                                dir_.path() + "/" + name + ".log");
  }
  // What the cache's staging folder holds: the owners' directories and
  // their locks.
  std::vector<std::string> Staging() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(cache_ + "/.staging", ec))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  // The one owner directory in staging that is not in `besides`.
  std::string NewOwner(const std::vector<std::string>& besides = {}) const {
    std::string found;
    for (const auto& name : Staging()) {
      if (name.ends_with(".lock") || std::find(besides.begin(), besides.end(), name) != besides.end())
        continue;
      EXPECT_TRUE(found.empty()) << "two new owners: " << found << ", " << name;
      found = name;
    }
    return found;
  }
  static int Count(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }
  static bool Ready(int port) { return Get(port, "/v2/health/ready").status == 200; }

  TempDir dir_;
  std::string cache_, models_;
};

TEST_F(SharedCacheTest, DaemonsWithTheirOwnStoresBuildOnceAndKeepTheirStagingApart) {
  // A daemon killed while it builds: its staging directory, and the lock
  // it held, stay behind.
  auto killed = Start("killed");
  ASSERT_TRUE(killed.ok()) << killed.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return (*killed)->Log().find("build started") != std::string::npos; }, 120))
      << (*killed)->Log();
  const std::string dead = NewOwner();
  ASSERT_FALSE(dead.empty());
  ASSERT_TRUE(fs::Exists(cache_ + "/.staging/" + dead + ".lock"));
  ASSERT_FALSE(std::filesystem::is_empty(cache_ + "/.staging/" + dead));  // the build in progress
  (*killed)->Kill();

  // The next daemon on the cache, with another store, removes what the dead
  // one left, and builds the model.
  auto a = Start("a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_FALSE(fs::Exists(cache_ + "/.staging/" + dead)) << (*a)->Log();
  EXPECT_FALSE(fs::Exists(cache_ + "/.staging/" + dead + ".lock"));
  ASSERT_TRUE(WaitFor([&] { return (*a)->Log().find("build started") != std::string::npos; }, 60))
      << (*a)->Log();
  const std::string a_owner = NewOwner();
  ASSERT_FALSE(a_owner.empty());
  ASSERT_FALSE(std::filesystem::is_empty(cache_ + "/.staging/" + a_owner));

  // A second daemon starts while the first builds: its start leaves the
  // first's build alone, and it waits for that build instead of making
  // its own.
  auto b = Start("b");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(fs::Exists(cache_ + "/.staging/" + a_owner + ".lock"));
  EXPECT_FALSE(std::filesystem::is_empty(cache_ + "/.staging/" + a_owner)) << (*b)->Log();
  ASSERT_TRUE(WaitFor([&] { return Ready((*a)->port()); }, 300)) << (*a)->Log();
  ASSERT_TRUE(WaitFor([&] { return Ready((*b)->port()); }, 120)) << (*b)->Log();
  EXPECT_EQ(Count((*a)->Log(), "build started"), 1) << (*a)->Log();
  EXPECT_EQ((*a)->Log().find("build failed"), std::string::npos) << (*a)->Log();
  EXPECT_EQ((*b)->Log().find("build started"), std::string::npos) << (*b)->Log();
  EXPECT_NE((*b)->Log().find("waits: another daemon sharing the build cache is building it"),
            std::string::npos)
      << (*b)->Log();
  EXPECT_NE((*b)->Log().find("built by another daemon sharing the build cache"), std::string::npos)
      << (*b)->Log();
  ExpectCasesMatchEager((*a)->port(), "demo", "mlp");
  ExpectCasesMatchEager((*b)->port(), "demo", "mlp");

  // The second's store says where its build came from.
  std::string show;
  ASSERT_EQ(RunAotid({"--store", dir_.path() + "/b", "--cache-dir", cache_, "show", "demo", "--json"}, &show),
            0)
      << show;
  EXPECT_NE(show.find("built by another daemon sharing the build cache"), std::string::npos) << show;

  // A third, started once the build is there, loads it at once.
  auto c = Start("c");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return Ready((*c)->port()); }, 120)) << (*c)->Log();
  EXPECT_EQ((*c)->Log().find("build started"), std::string::npos) << (*c)->Log();
  EXPECT_EQ((*c)->Log().find("waits"), std::string::npos) << (*c)->Log();
  ExpectCasesMatchEager((*c)->port(), "demo", "mlp");
  // The stores themselves hold no builds: the cache is elsewhere.
  EXPECT_FALSE(fs::Exists(dir_.path() + "/c/cache/")) << "a store's own cache was used";

  // Each daemon that stops takes its staging with it.
  EXPECT_EQ((*a)->Stop(), 0) << (*a)->Log();
  EXPECT_EQ((*b)->Stop(), 0) << (*b)->Log();
  EXPECT_EQ((*c)->Stop(), 0) << (*c)->Log();
  EXPECT_TRUE(Staging().empty()) << Staging()[0];
}

}  // namespace
}  // namespace aotid::testing
