#include "compile/build_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "base/fs.h"
#include "test_util.h"
#include "tests/base/fault_env.h"

namespace aotid::compile {
namespace {

using testing::TempDir;

class BuildCacheTest : public ::testing::Test {
 protected:
  BuildKey key_{std::string(64, 'a'), "model", "cpu", "linux-x86_64-avx2-torch2-0"};
  TempDir dir_;
  BuildCache cache_{dir_.path()};

  std::string Stage() {
    auto s = cache_.NewStaging(key_);
    EXPECT_TRUE(s.ok());
    model::ModelSpec spec;
    spec.inputs.push_back({"x", model::DType::kFloat32, {-1, 2}});
    EXPECT_OK(fs::WriteFileAtomic(*s + "/model.so", "model bytes"));
    EXPECT_OK(fs::WriteFileAtomic(*s + "/spec.json", spec.ToJson()));
    EXPECT_OK(fs::WriteFileAtomic(*s + "/package.json", R"({"kind": "exported_program"})"));
    return *s;
  }
};

TEST_F(BuildCacheTest, CommitThenLookupFindsEntry) {
  EXPECT_EQ(cache_.Lookup(key_).status().code(), StatusCode::kNotFound);
  auto e = cache_.Commit(Stage(), key_);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto found = cache_.Lookup(key_);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->spec.inputs[0].name, "x");
  EXPECT_EQ(*fs::ReadFile(found->so_path), "model bytes");
  EXPECT_EQ(found->so_path, cache_.EntryDir(key_) + "/model.so");
  EXPECT_EQ(found->package_json, R"({"kind": "exported_program"})");
}

// A language model's generate.json and a sentence encoder's embed.json go
// with the build to whoever loads it; one gone is a damaged entry.
TEST_F(BuildCacheTest, GenerateAndEmbedSpecsTravelWithTheEntry) {
  BuildKey lm = key_, encoder = key_;
  lm.package_model = "lm";
  encoder.package_model = "encoder";
  std::string staging = Stage();
  ASSERT_OK(fs::WriteFileAtomic(staging + "/generate.json", R"({"kind": "causal_lm"})"));
  ASSERT_TRUE(cache_.Commit(staging, lm).ok());
  staging = Stage();
  ASSERT_OK(fs::WriteFileAtomic(staging + "/embed.json", R"({"kind": "sentence_embedding"})"));
  auto committed = cache_.Commit(staging, encoder);
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  EXPECT_EQ(committed->embed_path, cache_.EntryDir(encoder) + "/embed.json");

  auto with_generate = cache_.Lookup(lm);
  ASSERT_TRUE(with_generate.ok()) << with_generate.status().ToString();
  EXPECT_EQ(fs::ReadFile(with_generate->generate_path).value_or(""), R"({"kind": "causal_lm"})");
  EXPECT_EQ(with_generate->embed_path, "");
  auto with_embed = cache_.Lookup(encoder);
  ASSERT_TRUE(with_embed.ok()) << with_embed.status().ToString();
  EXPECT_EQ(fs::ReadFile(with_embed->embed_path).value_or(""), R"({"kind": "sentence_embedding"})");
  EXPECT_EQ(with_embed->generate_path, "");
  EXPECT_EQ(cache_.Lookup(key_).status().code(), StatusCode::kNotFound);  // neither: a plain model's key

  ASSERT_EQ(::unlink(with_embed->embed_path.c_str()), 0);
  auto found = cache_.Lookup(encoder);
  EXPECT_EQ(found.status().code(), StatusCode::kCorruption);
  EXPECT_NE(found.status().message().find("embed.json is missing"), std::string::npos)
      << found.status().message();
}

// A CUDA model opens its .cubin files by name from the entry's folder when
// it loads: they are part of the entry, and one gone is a damaged entry.
TEST_F(BuildCacheTest, KernelFilesAreKeptInTheEntryAndOneMissingIsCorruption) {
  BuildKey cuda = key_;
  cuda.device = "cuda";
  std::string staging = Stage();
  ASSERT_OK(fs::WriteFileAtomic(staging + "/triton_poi_0.cubin", "kernel bytes"));
  ASSERT_OK(fs::WriteFileAtomic(staging + "/notes.txt", "not a kernel"));
  auto e = cache_.Commit(staging, cuda);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(fs::ReadFile(e->dir + "/triton_poi_0.cubin").value_or(""), "kernel bytes");
  std::string manifest = *fs::ReadFile(e->dir + "/manifest.json");
  EXPECT_NE(manifest.find("\"triton_poi_0.cubin\": 12"), std::string::npos) << manifest;
  EXPECT_EQ(manifest.find("notes.txt"), std::string::npos) << manifest;
  ASSERT_TRUE(cache_.Lookup(cuda).ok());
  ASSERT_EQ(::unlink((e->dir + "/triton_poi_0.cubin").c_str()), 0);
  auto found = cache_.Lookup(cuda);
  EXPECT_EQ(found.status().code(), StatusCode::kCorruption);
  EXPECT_NE(found.status().message().find("kernel file triton_poi_0.cubin is missing"), std::string::npos)
      << found.status().message();
}

TEST(IsKernelFile, NamesTheFilesAModelOpensFromItsBinDir) {
  for (const char* yes : {"triton_poi_fused_0.cubin", "k.fatbin", "k.hsaco", "k.spv"}) {
    EXPECT_TRUE(IsKernelFile(yes)) << yes;
  }
  for (const char* no :
       {"model.so", "spec.json", ".cubin", "a/b.cubin", "../x.cubin", "x.cubin.o", "x.cpp"}) {
    EXPECT_FALSE(IsKernelFile(no)) << no;
  }
}

TEST_F(BuildCacheTest, TruncatedModelIsCorruptionAndRecommitReplacesIt) {
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());
  ASSERT_OK(fs::WriteFileAtomic(cache_.EntryDir(key_) + "/model.so", "model"));
  auto found = cache_.Lookup(key_);
  EXPECT_EQ(found.status().code(), StatusCode::kCorruption);
  EXPECT_NE(found.status().message().find("model.so"), std::string::npos);
  auto listed = cache_.List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].status.code(), StatusCode::kCorruption);
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());
  EXPECT_TRUE(cache_.Lookup(key_).ok());
}

// Two daemons sharing one cache (build.cache_dir): the second's start
// cleans up staging, and must leave the first's builds in progress alone.
TEST_F(BuildCacheTest, AnotherCachesStartLeavesALiveOwnersStagingAlone) {
  const std::string building = Stage();
  ASSERT_FALSE(cache_.staging_dir().empty());
  EXPECT_EQ(building.rfind(cache_.staging_dir() + "/", 0), 0u) << building;
  std::vector<std::string> cleaned;
  BuildCache other(dir_.path());
  ASSERT_OK(other.OpenStaging([&](const std::string& d) { cleaned.push_back(d); }));
  EXPECT_TRUE(cleaned.empty()) << cleaned[0];
  EXPECT_NE(other.staging_dir(), cache_.staging_dir());
  EXPECT_TRUE(fs::Exists(building + "/model.so"));
  // Still the first's: its build commits.
  EXPECT_TRUE(cache_.Commit(building, key_).ok());
  // And the other way round.
  auto theirs = other.NewStaging(key_);
  ASSERT_TRUE(theirs.ok());
  BuildCache third(dir_.path());
  ASSERT_OK(third.OpenStaging());
  EXPECT_TRUE(fs::IsDirectory(*theirs));
  EXPECT_TRUE(fs::IsDirectory(other.staging_dir()));
}

// A daemon killed with builds in progress leaves its staging directory;
// its lock goes with the process, so the next start (of any daemon on the
// cache) removes it, after `before_removing` (which kills its leftovers).
TEST_F(BuildCacheTest, ADeadOwnersStagingIsRemovedAtTheNextStart) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Ends without destructors, as a killed daemon does.
    BuildCache dying(dir_.path());
    auto s = dying.NewStaging(key_);
    std::string out = s.ok() ? dying.staging_dir() + "\n" + *s : "";
    if (s.ok()) (void)fs::WriteFileAtomic(*s + "/model.so", "half");
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(s.ok() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string dead = got.substr(0, got.find('\n')), dead_build = got.substr(got.find('\n') + 1);
  ASSERT_TRUE(fs::Exists(dead_build + "/model.so"));
  ASSERT_TRUE(fs::Exists(dead + ".lock"));
  // An older aotid's staging (no owner, no lock): gone too.
  ASSERT_OK(fs::MakeDirs(dir_.path() + "/.staging/aaaaaaaaaaaa-XYZ123"));

  std::vector<std::string> cleaned;
  ASSERT_OK(cache_.OpenStaging([&](const std::string& d) { cleaned.push_back(d); }));
  std::vector<std::string> want = {dir_.path() + "/.staging/aaaaaaaaaaaa-XYZ123", dead};
  std::sort(cleaned.begin(), cleaned.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(cleaned, want);
  EXPECT_FALSE(fs::Exists(dead));
  EXPECT_FALSE(fs::Exists(dead + ".lock"));
  EXPECT_FALSE(fs::Exists(dir_.path() + "/.staging/aaaaaaaaaaaa-XYZ123"));
  EXPECT_TRUE(fs::IsDirectory(cache_.staging_dir()));
  // A second call does nothing more.
  cleaned.clear();
  ASSERT_OK(cache_.OpenStaging([&](const std::string& d) { cleaned.push_back(d); }));
  EXPECT_TRUE(cleaned.empty());
}

// A lock held elsewhere (another process's daemon: a lock is the open
// file's, so a descriptor of this process stands for it) keeps its
// owner's staging; let go, the staging goes at the next start.
TEST_F(BuildCacheTest, AStagingIsRemovedOnlyOnceItsLockIsFree) {
  const std::string owner = dir_.path() + "/.staging/0123456789abcdef";
  ASSERT_OK(fs::MakeDirs(owner + "/build-x"));
  int fd = ::open((owner + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  {
    BuildCache a(dir_.path());
    ASSERT_OK(a.OpenStaging());
    EXPECT_TRUE(fs::IsDirectory(owner + "/build-x"));
  }
  ::close(fd);
  BuildCache b(dir_.path());
  ASSERT_OK(b.OpenStaging());
  EXPECT_FALSE(fs::Exists(owner));
  EXPECT_FALSE(fs::Exists(owner + ".lock"));
}

// A cache that ends (a daemon stopping) removes its own staging.
TEST_F(BuildCacheTest, ACacheRemovesItsOwnStagingWhenItEnds) {
  std::string own;
  {
    BuildCache c(dir_.path());
    ASSERT_TRUE(c.NewStaging(key_).ok());
    own = c.staging_dir();
    ASSERT_TRUE(fs::IsDirectory(own));
  }
  EXPECT_FALSE(fs::Exists(own));
  EXPECT_FALSE(fs::Exists(own + ".lock"));
}

// Two daemons on one cache built the same key: the second to commit keeps
// the first's entry (it may be loading it) and gets it back, and its own
// staging goes.
TEST_F(BuildCacheTest, CommitKeepsASoundEntryAlreadyInPlace) {
  BuildCache other(dir_.path());
  const std::string ours = Stage();
  auto theirs = other.NewStaging(key_);
  ASSERT_TRUE(theirs.ok());
  model::ModelSpec spec;
  spec.inputs.push_back({"x", model::DType::kFloat32, {-1, 2}});
  ASSERT_OK(fs::WriteFileAtomic(*theirs + "/model.so", "THEIR model bytes"));
  ASSERT_OK(fs::WriteFileAtomic(*theirs + "/spec.json", spec.ToJson()));
  ASSERT_OK(fs::WriteFileAtomic(*theirs + "/package.json", R"({"kind": "exported_program"})"));
  auto first = other.Commit(*theirs, key_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  // The first's entry is being loaded (by its process, not this one).
  ASSERT_OK(fs::WriteFileAtomic(first->dir + "/load.pending", "999999999 1\n"));
  struct stat before;
  ASSERT_EQ(::stat(first->so_path.c_str(), &before), 0);

  auto second = cache_.Commit(ours, key_);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->dir, first->dir);
  EXPECT_EQ(second->so_path, first->so_path);
  EXPECT_EQ(fs::ReadFile(second->so_path).value_or(""), "THEIR model bytes");
  struct stat after;
  ASSERT_EQ(::stat(second->so_path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);  // the very file, never moved
  EXPECT_FALSE(fs::Exists(ours));
  EXPECT_EQ(second->spec.inputs.size(), 1u);
}

// Daemons sharing a cache load the same entries: another's load in
// progress is no unfinished load while that daemon lives (pids cannot
// tell: another container's may equal ours); once it is gone without
// ending the load, it is one.
TEST_F(BuildCacheTest, ALoadByAnotherLiveDaemonIsNotAnUnfinishedLoad) {
  ASSERT_OK(cache_.OpenStaging());
  auto e = cache_.Commit(Stage(), key_);
  ASSERT_TRUE(e.ok());
  auto other = std::make_unique<BuildCache>(dir_.path());
  ASSERT_OK(other->OpenStaging());
  ASSERT_OK(other->BeginLoad(*e));
  EXPECT_FALSE(cache_.LoadCrashed(*e).has_value());
  ASSERT_OK(cache_.BeginLoad(*e));  // loads side by side: still a first attempt
  ASSERT_OK(other->BeginLoad(*e));
  EXPECT_NE(fs::ReadFile(e->dir + "/load.pending").value_or("").find(" 1 "), std::string::npos);
  other.reset();  // gone with its load unfinished
  auto crashed = cache_.LoadCrashed(*e);
  ASSERT_TRUE(crashed.has_value());
  EXPECT_EQ(crashed->attempts, 1);
  EXPECT_TRUE(cache_.Lookup(key_).ok());  // intact: offered once more
}

// An entry damaged in place (its sizes right, its digest not) is no sound
// entry to keep: a rebuild's commit replaces it.
TEST_F(BuildCacheTest, CommitReplacesAnEntryDamagedInPlace) {
  auto e = cache_.Commit(Stage(), key_);
  ASSERT_TRUE(e.ok());
  ASSERT_OK(fs::WriteFileAtomic(e->so_path, "MODEL bytes"));  // same size
  ASSERT_TRUE(cache_.Lookup(key_).ok());
  EXPECT_EQ(cache_.LookupSound(key_).status().code(), StatusCode::kCorruption);
  auto again = cache_.Commit(Stage(), key_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(fs::ReadFile(again->so_path).value_or(""), "model bytes");
  EXPECT_TRUE(cache_.LookupSound(key_).ok());
}

// The entry a build was started to mend (it was in place when the build
// began) is replaced even though its files and digest look sound; another
// one, committed meanwhile, is kept.
TEST_F(BuildCacheTest, CommitReplacesTheEntryItWasAskedToMend) {
  auto first = cache_.Commit(Stage(), key_);
  ASSERT_TRUE(first.ok());
  const std::string mend = BuildCache::EntryIdentity(first->dir);
  ASSERT_FALSE(mend.empty());
  auto second = cache_.Commit(Stage(), key_, mend);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  const std::string now = BuildCache::EntryIdentity(second->dir);
  EXPECT_NE(now, mend);
  auto third = cache_.Commit(Stage(), key_, mend);  // the entry in place is another by now
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(BuildCache::EntryIdentity(third->dir), now);
  EXPECT_EQ(BuildCache::EntryIdentity(dir_.path() + "/none"), "");
}

TEST_F(BuildCacheTest, InductorOptionsMakeTheirOwnEntry) {
  BuildKey tuned = key_;
  tuned.options = R"({"max_autotune":true})";
  EXPECT_NE(cache_.EntryDir(tuned), cache_.EntryDir(key_));
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());
  EXPECT_EQ(cache_.Lookup(tuned).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(cache_.Commit(Stage(), tuned).ok());
  auto listed = cache_.List();
  ASSERT_EQ(listed.size(), 2u);
  for (const auto& l : listed) {
    EXPECT_OK(l.status);
    EXPECT_EQ(l.key.fingerprint, key_.fingerprint);
    EXPECT_GT(l.bytes, 0);
  }
}

TEST_F(BuildCacheTest, EntryOfAnOlderLayoutIsRebuiltNotLoaded) {
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());
  std::string manifest = *fs::ReadFile(cache_.EntryDir(key_) + "/manifest.json");
  manifest.replace(manifest.find("\"layout\": 2"), 11, "\"layout\": 1");
  ASSERT_OK(fs::WriteFileAtomic(cache_.EntryDir(key_) + "/manifest.json", manifest));
  auto found = cache_.Lookup(key_);
  EXPECT_EQ(found.status().code(), StatusCode::kCorruption);
  EXPECT_NE(found.status().message().find("older aotid"), std::string::npos) << found.status().message();
}

TEST_F(BuildCacheTest, StagingWithoutOutputsIsRefusedAndRemoved) {
  auto s = cache_.NewStaging(key_);
  ASSERT_TRUE(s.ok());
  auto e = cache_.Commit(*s, key_);
  EXPECT_FALSE(e.ok());
  EXPECT_FALSE(fs::Exists(*s));
  EXPECT_EQ(cache_.Lookup(key_).status().code(), StatusCode::kNotFound);
}

TEST_F(BuildCacheTest, KeysThatWouldEscapeTheCacheAreRefused) {
  BuildKey bad = key_;
  bad.artifact = "../../etc";
  EXPECT_EQ(cache_.Lookup(bad).status().code(), StatusCode::kInvalidArgument);
  bad = key_;
  bad.package_model = "../x";
  EXPECT_EQ(cache_.NewStaging(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(BuildCacheTest, OptionsAreNamedByTheirFullDigest) {
  BuildKey tuned = key_;
  tuned.options = R"({"freezing":true})";
  std::string dir = cache_.EntryDir(tuned);
  EXPECT_EQ(dir.substr(dir.rfind('.') + 1), fs::Sha256Hex(tuned.options));
}

// Two keys whose entries land in one directory (as a weak hash of the
// options could make them) must not load each other's build: the manifest
// names the key it was built for, and Lookup compares it.
TEST_F(BuildCacheTest, EntryWhoseManifestNamesAnotherKeyIsNeverLoaded) {
  BuildKey a = key_, b = key_;
  a.options = R"({"max_autotune":true})";
  b.options = R"({"max_autotune":false})";
  auto built = cache_.Commit(Stage(), a);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  std::filesystem::rename(built->dir, cache_.EntryDir(b));  // b's directory now holds a's build
  auto found = cache_.Lookup(b);
  EXPECT_EQ(found.status().code(), StatusCode::kCorruption);
  EXPECT_NE(found.status().message().find("holds a build for another key"), std::string::npos)
      << found.status().message();
}

// As a killed process leaves it: the marker of a load that never finished.
void LeaveUnfinishedLoad(const model::CacheEntry& e, int attempts) {
  ASSERT_OK(fs::WriteFileAtomic(e.dir + "/load.pending", "999999999 " + std::to_string(attempts) + "\n"));
}

// Bytes of model.so overwritten in place: the size still matches, so only
// the digest shows it. Loading such a build once crashed the daemon at
// every start.
TEST_F(BuildCacheTest, EntryDamagedInPlaceIsRebuiltAfterALoadDidNotFinish) {
  auto e = cache_.Commit(Stage(), key_);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_OK(cache_.VerifyDigest(*e));
  ASSERT_OK(fs::WriteFileAtomic(e->so_path, "MODEL bytes"));  // same size
  EXPECT_TRUE(cache_.Lookup(key_).ok());                      // sizes alone cannot tell
  EXPECT_EQ(cache_.VerifyDigest(*e).code(), StatusCode::kCorruption);
  LeaveUnfinishedLoad(*e, 1);
  auto found = cache_.Lookup(key_);
  EXPECT_EQ(found.status().code(), StatusCode::kCorruption);
  EXPECT_NE(found.status().message().find("does not match the digest"), std::string::npos)
      << found.status().message();
  EXPECT_NE(found.status().message().find("never finished"), std::string::npos);
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());  // the rebuild replaces it, marker and all
  EXPECT_TRUE(cache_.Lookup(key_).ok());
}

TEST_F(BuildCacheTest, IntactEntryIsOfferedAgainOnceThenNotAfterASecondUnfinishedLoad) {
  auto e = cache_.Commit(Stage(), key_);
  ASSERT_TRUE(e.ok());
  ASSERT_OK(cache_.BeginLoad(*e));
  EXPECT_TRUE(cache_.Lookup(key_).ok());  // our own load, still running: no crash
  cache_.EndLoad(*e);
  LeaveUnfinishedLoad(*e, 1);  // killed once while loading
  EXPECT_TRUE(cache_.Lookup(key_).ok());
  ASSERT_OK(cache_.BeginLoad(*e));                                            // the retry counts on
  ASSERT_OK(fs::WriteFileAtomic(e->dir + "/load.pending", "999999999 2\n"));  // and ends its process too
  auto found = cache_.Lookup(key_);
  EXPECT_EQ(found.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(found.status().message().find("ended its process 2 times"), std::string::npos)
      << found.status().message();
  cache_.EndLoad(*e);  // a load that finishes clears the count
  EXPECT_TRUE(cache_.Lookup(key_).ok());
}

// Publishing a build under a power cut at every file-system operation
// (tests/base/fault_env.h): afterwards Lookup finds the whole entry or none
// (NotFound, or Corruption, which rebuilds it), and the whole entry once
// Commit returned ok. The worker's files are written without an fsync, as
// a build child writes them: Commit must make them durable itself.
TEST(BuildCacheFaults, APowerCutLeavesTheWholeEntryOrNone) {
  TempDir dir;
  const std::string root = fs::RealPath(dir.path());
  ASSERT_OK(fs::MakeDirs(root + "/scratch"));
  testing::FaultInjectionEnv env(root + "/scratch");
  const BuildKey key{std::string(64, 'b'), "model", "cpu", "linux-x86_64-avx2-torch2-0"};
  model::ModelSpec spec;
  spec.inputs.push_back({"x", model::DType::kFloat32, {-1, 2}});
  const std::map<std::string, std::string> files = {{"model.so", std::string(5000, 'm')},
                                                    {"spec.json", spec.ToJson()},
                                                    {"package.json", R"({"kind": "exported_program"})"},
                                                    {"triton_0.cubin", "kernel"}};
  // The cache outlives each run, as the power cut comes before it ends:
  // ending, it would remove its staging directory.
  std::unique_ptr<BuildCache> live;
  auto run = [&]() -> Status {
    live.reset();
    std::filesystem::remove_all(root + "/cache");
    live = std::make_unique<BuildCache>(root + "/cache", &env);
    BuildCache& cache = *live;
    ASSIGN_OR_RETURN(std::string staging, cache.NewStaging(key));
    for (const auto& [name, bytes] : files) {
      ASSIGN_OR_RETURN(auto f, env.OpenForWrite(staging + "/" + name, Env::OpenMode::kCreateNew));
      RETURN_IF_ERROR(f->Append(bytes));
    }
    return cache.Commit(staging, key).status();
  };
  auto expect_whole = [&](const model::CacheEntry& e) {
    for (const auto& [name, bytes] : files)
      EXPECT_EQ(fs::ReadFile(e.dir + "/" + name).value_or(""), bytes) << name;
  };

  ASSERT_OK(run());
  const int64_t total = env.ops();
  ASSERT_OK(env.DropUnsynced());
  {
    auto e = BuildCache(root + "/cache").Lookup(key);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    expect_whole(*e);
  }
  for (int64_t k = 0; k < total; ++k) {
    SCOPED_TRACE("crash at file-system operation " + std::to_string(k) + " of " + std::to_string(total));
    env.CrashAtOp(k);
    EXPECT_FALSE(run().ok());
    ASSERT_OK(env.DropUnsynced());
    auto e = BuildCache(root + "/cache").Lookup(key);
    if (e.ok()) {
      expect_whole(*e);
    } else {
      EXPECT_TRUE(e.status().code() == StatusCode::kNotFound || e.status().code() == StatusCode::kCorruption)
          << e.status().ToString();
    }
  }
}

}  // namespace
}  // namespace aotid::compile
