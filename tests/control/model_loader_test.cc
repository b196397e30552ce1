// The real loader (a libuv loop, its thread pool, runner processes) with
// the fake runner: auto threads are timed once per build and machine,
// recorded in the build's entry, and used from there at later loads.
#include "control/model_loader.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <cstdlib>
#include <optional>

#include "base/fs.h"
#include "test_util.h"

namespace aotid::control {
namespace {

class ModelLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    cache_ = std::make_unique<compile::BuildCache>(dir_.path() + "/cache");
    entry_.dir = dir_.path() + "/cache/entry";
    ASSERT_OK(fs::MakeDirs(entry_.dir));
    entry_.so_path = entry_.dir + "/model.so";
    entry_.spec.inputs = {{"ids", model::DType::kInt64, {1, -1}}};
    entry_.spec.outputs = {{"out", model::DType::kInt64, {1, -1}}};
    ::setenv("FAKE_RUNNER_STARTS", starts_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("FAKE_RUNNER_STARTS");
    ::unsetenv("FAKE_RUNNER_TIMING");
    uv_loop_close(&loop_);
  }

  // Loads the entry with auto threads (up to 2) under `key`, to the end.
  LoadResult Load(const std::string& key) {
    ThreadPoolLoader loader(&loop_, cache_.get(), {AOTID_FAKE_RUNNER, dir_.path()});
    LoadRequest req;
    req.entry = entry_;
    req.label = "fake:1";
    req.options.threads = 2;
    req.choose_threads_at_batch = 1;
    req.threads_key = key;
    std::optional<LoadResult> got;
    loader.Load(req, [&](LoadResult r) {
      got = std::move(r);
      loader.Close();
    });
    uv_run(&loop_, UV_RUN_DEFAULT);
    EXPECT_TRUE(got.has_value());
    return got ? std::move(*got) : LoadResult{};
  }
  // The runners' starts so far: "<threads> <choose_threads_at_batch>" each.
  std::string Starts() {
    auto text = fs::ReadFile(starts_);
    return text.ok() ? *text : "";
  }

  aotid::testing::TempDir dir_;
  std::string starts_ = dir_.path() + "/starts";
  uv_loop_t loop_{};
  std::unique_ptr<compile::BuildCache> cache_;
  model::CacheEntry entry_;
};

TEST_F(ModelLoaderTest, AutoThreadsAreTimedOnceAndThenTakenFromTheBuildsRecord) {
  LoadResult first = Load("cpu X; 2 cores; up to 2 threads; batch 1");
  ASSERT_TRUE(first.model.ok()) << first.model.status().ToString();
  EXPECT_EQ(first.threads, 1);
  EXPECT_TRUE(first.threads_recorded);
  auto rec = cache_->ReadThreads(entry_.dir, "cpu X; 2 cores; up to 2 threads; batch 1");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->key, "cpu X; 2 cores; up to 2 threads; batch 1");
  EXPECT_EQ(rec->threads, 1);
  EXPECT_EQ(rec->note, "1 of 2: fake timing");
  first.model = Internal("released");  // its runner ends

  // The same machine, setting and batch: the runner is started with the
  // recorded thread count and is not asked to time itself.
  LoadResult again = Load("cpu X; 2 cores; up to 2 threads; batch 1");
  ASSERT_TRUE(again.model.ok()) << again.model.status().ToString();
  EXPECT_EQ(again.threads, 1);
  EXPECT_TRUE(again.threads_recorded);
  EXPECT_EQ(again.threads_note.rfind("timed ", 0), 0u) << again.threads_note;
  EXPECT_NE(again.threads_note.find("1 of 2: fake timing"), std::string::npos) << again.threads_note;
  again.model = Internal("released");
  EXPECT_EQ(Starts(), "2 1\n1 0\n");

  // Another batch (another version sharing the build): timed again, and
  // recorded beside the first, which the first batch still uses.
  LoadResult other = Load("cpu X; 2 cores; up to 2 threads; batch 8");
  ASSERT_TRUE(other.model.ok());
  other.model = Internal("released");
  EXPECT_EQ(Starts(), "2 1\n1 0\n2 1\n");
  EXPECT_TRUE(cache_->ReadThreads(entry_.dir, "cpu X; 2 cores; up to 2 threads; batch 8").has_value());
  LoadResult first_again = Load("cpu X; 2 cores; up to 2 threads; batch 1");
  ASSERT_TRUE(first_again.model.ok());
  first_again.model = Internal("released");
  EXPECT_EQ(Starts(), "2 1\n1 0\n2 1\n1 0\n");
  EXPECT_EQ(cache_->ListThreads(entry_.dir).size(), 2u);
}

// A choice made while the machine was busy is used and recorded as not
// settled: the next load times again (and `aotid set NAME threads=...` can
// remove it to ask for that now).
TEST_F(ModelLoaderTest, ATimingOnABusyMachineIsUsedButNotReused) {
  ::setenv("FAKE_RUNNER_TIMING", "busy", 1);
  LoadResult r = Load("k");
  ASSERT_TRUE(r.model.ok()) << r.model.status().ToString();
  EXPECT_EQ(r.threads, 1);
  EXPECT_TRUE(r.threads_recorded);
  EXPECT_NE(r.threads_note.find("busy"), std::string::npos) << r.threads_note;
  ASSERT_TRUE(cache_->ReadThreads(entry_.dir, "k").has_value());
  EXPECT_FALSE(cache_->ReadThreads(entry_.dir, "k")->settled);
  r.model = Internal("released");
  ::unsetenv("FAKE_RUNNER_TIMING");
  r = Load("k");  // timed again, quiet now
  ASSERT_TRUE(r.model.ok());
  r.model = Internal("released");
  EXPECT_TRUE(cache_->ReadThreads(entry_.dir, "k")->settled);
  EXPECT_EQ(Starts(), "2 1\n2 1\n");

  // A damaged record is no record: timed again, and written anew.
  for (const char* bad :
       {R"({"k": {"threads": "many"}})", R"({"k": {"threads": 100000}})", "not json", "[1]"}) {
    ASSERT_OK(fs::WriteFileAtomic(entry_.dir + "/threads.json", bad));
    r = Load("k");
    ASSERT_TRUE(r.model.ok());
    r.model = Internal("released");
    EXPECT_EQ(cache_->ReadThreads(entry_.dir, "k")->threads, 1) << bad;
  }
  EXPECT_EQ(Starts(), "2 1\n2 1\n2 1\n2 1\n2 1\n2 1\n");
}

}  // namespace
}  // namespace aotid::control
