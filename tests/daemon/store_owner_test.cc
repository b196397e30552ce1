// GiveStoreToItsOwner: what root makes in a store another user owns is
// given to that user, and a tree the owner changes meanwhile cannot send
// root's chown outside the store.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "base/fs.h"
#include "daemon/cli.h"
#include "test_util.h"

namespace aotid::daemon {
namespace {

using testing::TempDir;

uid_t OwnerOf(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
}

constexpr uid_t kOwner = 4242;

TEST(GiveStoreToItsOwner, WhatRootMadeGoesToTheOwnerAndAFolderSwappedForALinkIsNotEntered) {
  if (::geteuid() != 0) GTEST_SKIP() << "root's chown: run as root (CI is)";
  TempDir d;
  const std::string store = d / "store", outside = d / "outside";
  ASSERT_OK(fs::MakeDirs(store + "/blobs/sha256"));
  ASSERT_OK(fs::WriteFileAtomic(store + "/blobs/sha256/x", "blob"));
  ASSERT_OK(fs::MakeDirs(store + "/cache/entry"));
  ASSERT_OK(fs::WriteFileAtomic(store + "/cache/entry/model.so", "so"));
  ASSERT_OK(fs::MakeDirs(outside));
  ASSERT_OK(fs::WriteFileAtomic(outside + "/secret", "root's"));
  ASSERT_EQ(::chown(store.c_str(), kOwner, kOwner), 0);
  const std::string cache = fs::RealPath(store) + "/cache";
  int entered = 0;
  // The owner swaps cache/ for a link to a folder of root's, after the walk
  // has listed it as a folder and before it enters it.
  GiveStoreToItsOwner(store, [&](const std::string& path) {
    ++entered;
    if (path != cache) return;
    ASSERT_EQ(std::rename(cache.c_str(), (cache + ".old").c_str()), 0);
    ASSERT_EQ(::symlink(outside.c_str(), cache.c_str()), 0);
  });
  EXPECT_GE(entered, 3);  // blobs, blobs/sha256, cache
  EXPECT_EQ(OwnerOf(store + "/blobs"), kOwner);
  EXPECT_EQ(OwnerOf(store + "/blobs/sha256/x"), kOwner);
  EXPECT_EQ(OwnerOf(store + "/cache.old"), kOwner);  // given while listed, before the swap
  // Root's files behind the link are left as they were.
  EXPECT_EQ(OwnerOf(outside), 0u);
  EXPECT_EQ(OwnerOf(outside + "/secret"), 0u);
}

}  // namespace
}  // namespace aotid::daemon
