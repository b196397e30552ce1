#include "compile/cache_policy.h"

#include "base/fs.h"
#include "test_util.h"

namespace aotid::compile {
namespace {

using testing::TempDir;

const std::string kHere = "linux-x86_64-avx2-torch2.13.0-aaaa";
const std::string kArtifactA(64, 'a');
const std::string kArtifactB(64, 'b');

CacheListing Entry(const std::string& artifact, const std::string& model, const std::string& fingerprint,
                   Status status = Status::OK()) {
  CacheListing l;
  l.key = {artifact, model, "cpu", fingerprint, ""};
  l.dir = "/cache/" + artifact + "/" + model + ".cpu." + fingerprint;
  l.bytes = 100;
  l.status = std::move(status);
  return l;
}

// The one table both commands act on: which entries go under each scope.
TEST(CachePolicy, EachScopeRemovesExactlyWhatItsCommandDocuments) {
  std::vector<CacheListing> entries = {
      Entry(kArtifactA, "model", kHere),                                 // 0: used, ok
      Entry(kArtifactA, "head", kHere),                                  // 1: artifact used, model not
      Entry(kArtifactB, "model", kHere),                                 // 2: artifact no longer used
      Entry(kArtifactA, "model", "darwin-arm64-neon-torch2.13.0-bbbb"),  // 3: used, other machine
      Entry(kArtifactA, "model", kHere, Corruption("model.so is 4096 bytes, manifest says 8192")),  // 4
  };
  std::vector<CacheUser> users = {{kArtifactA, "model", "mlp:1"}, {kArtifactA, "model", "mlp:2"}};
  auto removed = [&](PruneScope scope) {
    std::vector<int> out;
    auto verdicts = JudgeCacheEntries(entries, users, kHere, scope);
    EXPECT_EQ(verdicts.size(), entries.size());
    for (size_t i = 0; i < verdicts.size(); ++i) {
      EXPECT_EQ(verdicts[i].remove, !verdicts[i].why.empty()) << i;
      if (verdicts[i].remove) out.push_back(static_cast<int>(i));
    }
    return out;
  };
  // gc: unused builds only; a damaged or foreign build that a version uses
  // is left to `cache prune` (the store may feed other machines).
  EXPECT_EQ(removed(PruneScope::kUnused), (std::vector<int>{1, 2}));
  // cache prune: those, and whatever this machine cannot load.
  EXPECT_EQ(removed(PruneScope::kStale), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(removed(PruneScope::kAll), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(CachePolicy, VerdictsSayWhyAndWhoUsesEachEntry) {
  std::vector<CacheListing> entries = {
      Entry(kArtifactA, "model", kHere),
      Entry(kArtifactB, "model", kHere),
      Entry(kArtifactA, "model", "other-fp"),
      Entry(kArtifactA, "model", kHere, Corruption("no readable manifest")),
  };
  std::vector<CacheUser> users = {{kArtifactA, "model", "mlp:1"}};
  auto v = JudgeCacheEntries(entries, users, kHere, PruneScope::kStale);
  EXPECT_EQ(v[0].state, CacheState::kOk);
  EXPECT_EQ(v[0].used_by, std::vector<std::string>{"mlp:1"});
  EXPECT_EQ(v[1].why, "no stored version uses it");
  EXPECT_FALSE(v[1].artifact_used);
  EXPECT_EQ(v[2].state, CacheState::kOtherMachine);
  EXPECT_EQ(v[2].why, "built for other-fp, this machine is " + kHere);
  EXPECT_EQ(v[3].state, CacheState::kDamaged);
  EXPECT_EQ(v[3].why, "no readable manifest");
  EXPECT_EQ(CacheStateName(v[2].state), "other-machine");
  auto all = JudgeCacheEntries(entries, users, kHere, PruneScope::kAll);
  EXPECT_EQ(all[0].why, "--all");
}

// An entry without a readable manifest has no known package model: it
// counts as used while its artifact is, and goes with the artifact.
TEST(CachePolicy, AnEntryOfUnknownModelIsKeptByGcWhileItsArtifactIsUsed) {
  CacheListing unknown = Entry(kArtifactA, "", "", Corruption("no readable manifest"));
  std::vector<CacheUser> users = {{kArtifactA, "model", "mlp:1"}};
  EXPECT_FALSE(JudgeCacheEntries({unknown}, users, kHere, PruneScope::kUnused)[0].remove);
  EXPECT_TRUE(JudgeCacheEntries({unknown}, {}, kHere, PruneScope::kUnused)[0].remove);
}

TEST(CachePolicy, RemovingTheLastEntryOfAnUnusedArtifactRemovesItsFolder) {
  TempDir d;
  BuildCache cache(d.path());
  for (const std::string& dir : {d / (kArtifactA + "/model.cpu.x"), d / (kArtifactA + "/head.cpu.x"),
                                 d / (kArtifactB + "/model.cpu.x")}) {
    ASSERT_OK(fs::MakeDirs(dir));
    ASSERT_OK(fs::WriteFileAtomic(dir + "/model.so", "so"));
  }
  std::vector<CacheUser> users = {{kArtifactA, "model", "mlp:1"}};
  // model.cpu.x of A has no manifest, so its model is unknown and A's use
  // keeps it; B's entry goes, and B's folder with it.
  auto verdicts = JudgeCacheEntries(cache.List(), users, kHere, PruneScope::kUnused);
  ASSERT_EQ(verdicts.size(), 3u);
  for (const auto& v : verdicts) {
    if (v.remove) ASSERT_OK(RemoveCacheEntry(v));
  }
  EXPECT_TRUE(fs::Exists(d / kArtifactA));
  EXPECT_TRUE(fs::Exists(d / (kArtifactA + "/head.cpu.x")));
  EXPECT_FALSE(fs::Exists(d / kArtifactB));
}

}  // namespace
}  // namespace aotid::compile
