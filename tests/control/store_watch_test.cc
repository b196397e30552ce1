#include "control/store_watch.h"

#include "control/fakes.h"
#include "test_util.h"

namespace aotid::control {
namespace {

using testing::FakeLoop;

class StoreWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto watched = storage::ModelStore::Open(dir_.path());
    ASSERT_TRUE(watched.ok()) << watched.status().ToString();
    watched_ = std::move(watched).value();
    auto other = storage::ModelStore::Open(dir_.path());  // another process's connection
    ASSERT_TRUE(other.ok());
    other_ = std::move(other).value();
    watch_ = std::make_unique<StoreWatch>(watched_.get(), &loop_, [this] { ++changes_; });
    watch_->Start(nullptr);
  }
  void CommitElsewhere() { ASSERT_OK(other_->AppendEvent("m", 1, "note", "a commit")); }

  aotid::testing::TempDir dir_;
  std::unique_ptr<storage::ModelStore> watched_, other_;
  FakeLoop loop_;
  std::unique_ptr<StoreWatch> watch_;
  int changes_ = 0;
};

TEST_F(StoreWatchTest, FileEventAfterACommitReportsItOnce) {
  CommitElsewhere();
  watch_->Wake();
  EXPECT_EQ(changes_, 1);
  watch_->Wake();  // nothing new
  loop_.Advance(100);
  EXPECT_EQ(changes_, 1);
}

TEST_F(StoreWatchTest, CommitVisibleShortlyAfterItsFileEventIsFoundBySettleLooks) {
  watch_->Wake();  // the -wal write woke us; the commit is not visible yet
  EXPECT_EQ(changes_, 0);
  CommitElsewhere();
  loop_.Advance(6);  // the looks at 1 and 5 ms
  EXPECT_EQ(changes_, 1);
}

TEST_F(StoreWatchTest, WithoutFileEventsTheTickFindsTheCommitWithinASecond) {
  CommitElsewhere();
  loop_.Advance(StoreWatch::kTickMs - 1);
  EXPECT_EQ(changes_, 0);
  loop_.Advance(1);
  EXPECT_EQ(changes_, 1);
  CommitElsewhere();
  loop_.Advance(StoreWatch::kTickMs);  // and keeps ticking
  EXPECT_EQ(changes_, 2);
}

TEST_F(StoreWatchTest, StoppedWatchReportsNothing) {
  watch_->Wake();
  watch_->Stop();
  CommitElsewhere();
  loop_.Advance(10 * StoreWatch::kTickMs);
  EXPECT_EQ(changes_, 0);
  EXPECT_EQ(loop_.pending(), 0u);  // nothing re-armed
}

}  // namespace
}  // namespace aotid::control
