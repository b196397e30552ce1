#include "base/fs.h"

#include <sys/stat.h>

#include "test_util.h"

namespace aotid {
namespace {

using testing::TempDir;

TEST(Fs, Sha256OfKnownContent) {
  TempDir d;
  ASSERT_OK(fs::WriteFileAtomic(d / "f", "abc"));
  auto h = fs::Sha256File(d / "f");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Fs, CopyAndHashCopiesBytesAndRefusesExistingTarget) {
  TempDir d;
  std::string payload(3 << 20, 'x');  // spans several read buffers
  payload[12345] = 'y';
  ASSERT_OK(fs::WriteFileAtomic(d / "src", payload));
  auto h = fs::CopyAndHash(d / "src", d / "dst");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*h, *fs::Sha256File(d / "src"));
  EXPECT_EQ(*fs::ReadFile(d / "dst"), payload);
  EXPECT_FALSE(fs::CopyAndHash(d / "src", d / "dst").ok());
}

TEST(Fs, WriteFileAtomicReplacesAndLeavesNoTemporaries) {
  TempDir d;
  ASSERT_OK(fs::WriteFileAtomic(d / "f", "one"));
  ASSERT_OK(fs::WriteFileAtomic(d / "f", "two"));
  EXPECT_EQ(*fs::ReadFile(d / "f"), "two");
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(d.path())) (void)e, ++n;
  EXPECT_EQ(n, 1);
}

TEST(Fs, OnlyLowercaseHexDigestsAreAccepted) {
  EXPECT_TRUE(fs::IsSha256Hex(std::string(64, 'a')));
  EXPECT_FALSE(fs::IsSha256Hex(std::string(63, 'a')));
  EXPECT_FALSE(fs::IsSha256Hex(std::string(64, 'A')));
  EXPECT_FALSE(fs::IsSha256Hex("../" + std::string(61, 'a')));
}

}  // namespace
}  // namespace aotid
