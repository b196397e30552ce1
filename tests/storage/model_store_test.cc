#include "storage/model_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "base/fs.h"
#include "test_util.h"
#include "zip_util.h"

namespace aotid::storage {
namespace {

using testing::DirSnapshot;
using testing::TempDir;
using testing::TestData;

AddRequest Req(const std::string& file, const std::string& name,
               std::optional<int64_t> version = std::nullopt) {
  AddRequest r;
  r.file = file;
  r.name = name;
  r.version = version;
  return r;
}

TEST(ModelStore, AddThenListShowsVersionWithBlobOnDisk) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto added = (*store)->Add(Req(TestData("mlp.pt2"), "mlp"));
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_EQ(added->version, 1);
  auto second = (*store)->Add(Req(TestData("mlp.pt2"), "mlp"));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->version, 2);  // default is one past the latest

  auto list = (*store)->ListVersions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].model, "mlp");
  EXPECT_EQ((*list)[0].artifact, *fs::Sha256File(TestData("mlp.pt2")));
  EXPECT_EQ((*list)[0].kind, package::PackageKind::kExportedProgram);
  EXPECT_EQ(*fs::Sha256File((*store)->BlobPath((*list)[0].artifact)), (*list)[0].artifact);
  auto events = (*store)->ListEvents();
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].kind, "added");
}

TEST(ModelStore, AddSameVersionTwiceIsAlreadyExistsAndChangesNothing) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp", 3)).ok());
  auto before = DirSnapshot(d.path());
  auto again = (*store)->Add(Req(TestData("embed.pt2"), "mlp", 3));
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("already has version 3"), std::string::npos);
  EXPECT_EQ(DirSnapshot(d.path()), before);
}

// Versions end at 2^53 (what a JSON number holds exactly): past it, an add
// without --version is refused instead of making a version nothing can name.
// A sync's download is moved into the blob store, not copied; an add that
// fails after the move (here: the database refuses the row) puts it back
// for the next try.
// The whole file is read back to check its digest before the store's write
// lock is taken: another writer (the daemon's events) gets the lock
// meanwhile at once. (With a multi-GB package it once waited past its 10 s
// busy timeout.) Both reads are covered: a new blob's copy, and a blob the
// store has already.
TEST(ModelStore, AddChecksTheBlobWithoutHoldingTheWriteLock) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  int checks = 0, writes_refused = 0;
  (*store)->TEST_SetWhileCheckingBlob([&] {
    ++checks;
    sqlite3* other = nullptr;
    ASSERT_EQ(sqlite3_open((d.path() + "/aotid.db").c_str(), &other), SQLITE_OK);
    sqlite3_busy_timeout(other, 0);  // no waiting: the lock is free, or it is refused
    if (sqlite3_exec(other, "BEGIN IMMEDIATE; COMMIT;", nullptr, nullptr, nullptr) != SQLITE_OK)
      ++writes_refused;
    sqlite3_close(other);
  });
  ASSERT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp")).ok());  // its copy read back
  ASSERT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp")).ok());  // the stored blob read
  EXPECT_EQ(checks, 2);
  EXPECT_EQ(writes_refused, 0);
}

TEST(ModelStore, MovedFileGoesIntoTheBlobStoreOrBackWhereItWas) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  ASSERT_OK(fs::MakeDirs(d / "downloads"));
  std::string sha = *fs::Sha256File(TestData("mlp.pt2"));
  std::string download = d / ("downloads/" + sha + ".partial");
  ASSERT_OK(fs::CopyAndHash(TestData("mlp.pt2"), download).status());
  ASSERT_TRUE((*store)->Add(Req(TestData("embed.pt2"), "mlp", 1)).ok());
  auto exec = [&](const char* sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((d / "aotid.db").c_str(), &db), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  };
  exec(
      "CREATE TRIGGER refuse BEFORE INSERT ON versions BEGIN SELECT RAISE(ABORT, 'refused by the test'); "
      "END");

  AddRequest req = Req(download, "mlp");
  req.move_file = true;
  auto refused = (*store)->Add(req);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("refused by the test"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(*fs::Sha256File(download), sha);  // back where it was, whole
  EXPECT_FALSE(fs::Exists((*store)->BlobPath(sha)));
  exec("DROP TRIGGER refuse");

  auto added = (*store)->Add(req);
  ASSERT_TRUE(added.ok()) << added.status().message();
  EXPECT_EQ(added->artifact, sha);
  EXPECT_EQ(added->version, 2);
  EXPECT_FALSE(fs::Exists(download));
  EXPECT_EQ(*fs::Sha256File((*store)->BlobPath(sha)), sha);
  std::error_code ec;
  EXPECT_TRUE(std::filesystem::is_empty(d / "blobs/tmp", ec));
}

TEST(ModelStore, NoVersionIsNumberedPastTheHighest) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp", int64_t{1} << 53)).ok());
  auto before = DirSnapshot(d.path());
  auto next = (*store)->Add(Req(TestData("mlp.pt2"), "mlp"));
  EXPECT_EQ(next.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(next.status().message().find("has version 2^53 already"), std::string::npos)
      << next.status().ToString();
  EXPECT_EQ(DirSnapshot(d.path()), before);
  EXPECT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp", 7)).ok());
}

TEST(ModelStore, BadFilesAndNamesAreRefusedAndStoreUnchanged) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp")).ok());
  // A package whose metadata nests past the limit (it would grow into a
  // gigabyte-sized record in the cache).
  TempDir t;
  ASSERT_NO_FATAL_FAILURE(testing::WriteZip(
      t / "deep.pt2",
      {{"p/extra/aotid.json", R"({"metadata": )" + std::string(30000, '[') + std::string(30000, ']') + "}"},
       {"p/data/aotinductor/model/m.so", "so"}}));
  auto before = DirSnapshot(d.path());
  struct Case {
    AddRequest req;
    StatusCode code;
    std::string needle;
  } cases[] = {
      {Req(TestData("not_a_model.pt2"), "m"), StatusCode::kInvalidArgument, "not a .pt2 package"},
      {Req(TestData("empty.pt2"), "m"), StatusCode::kInvalidArgument, "holds no model"},
      {Req(TestData("no_such_file.pt2"), "m"), StatusCode::kNotFound, "no_such_file"},
      {Req(TestData("mlp.pt2"), "../evil"), StatusCode::kInvalidArgument, "may only contain"},
      {Req(TestData("mlp.pt2"), "a..b"), StatusCode::kInvalidArgument, ".."},
      {Req(TestData("mlp.pt2"), ""), StatusCode::kInvalidArgument, "1 to 128"},
      {Req(TestData("mlp.pt2"), "ok", 0), StatusCode::kInvalidArgument, "version"},
      {Req(t / "deep.pt2", "m"), StatusCode::kInvalidArgument, "aotid.json nests deeper than 16 levels"},
  };
  for (const auto& c : cases) {
    auto r = (*store)->Add(c.req);
    EXPECT_EQ(r.status().code(), c.code) << c.req.name << " " << c.req.file << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(DirSnapshot(d.path()), before);
}

TEST(ModelStore, NotSqliteFileIsCorruptionWithClearMessage) {
  TempDir d;
  ASSERT_OK(fs::WriteFileAtomic(d / "aotid.db", std::string(4096, 'z')));
  auto store = ModelStore::Open(d.path());
  EXPECT_EQ(store.status().code(), StatusCode::kCorruption);
  EXPECT_NE(store.status().message().find("not an SQLite database"), std::string::npos);
  EXPECT_EQ(*fs::ReadFile(d / "aotid.db"), std::string(4096, 'z'));
}

TEST(ModelStore, ReopenKeepsModelsAndSchemaVersion) {
  TempDir d;
  {
    auto store = ModelStore::Open(d.path());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Add(Req(TestData("embed.pt2"), "embed")).ok());
  }
  auto store = ModelStore::Open(d.path(), /*create=*/false);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->SchemaVersion(), kSchemaVersion);
  auto list = (*store)->ListVersions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].model, "embed");
}

TEST(ModelStore, BuildRecordsRoundTrip) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  auto mv = (*store)->Add(Req(TestData("mlp.pt2"), "mlp"));
  ASSERT_TRUE(mv.ok());
  BuildRecord b{mv->artifact,
                "model",
                "fp1",
                "cuda",
                BuildState::kFailed,
                "compiler said no",
                10,
                20,
                R"({"max_autotune":true})",
                "",
                2};
  ASSERT_OK((*store)->PutBuild(b));
  // The CPU build of the same artifact (a fallback) is a row of its own.
  BuildRecord cpu{mv->artifact, "model", "fp1", "cpu", BuildState::kBuilding, "", 30, 0, "", "step 3/4", 1};
  ASSERT_OK((*store)->PutBuild(cpu));
  auto got = (*store)->GetBuild(mv->artifact, "model", "fp1", "cuda", R"({"max_autotune":true})");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->state, BuildState::kFailed);
  EXPECT_EQ((*got)->error, "compiler said no");
  EXPECT_EQ((*got)->attempts, 2);
  auto got_cpu = (*store)->GetBuild(mv->artifact, "model", "fp1", "cpu");
  ASSERT_TRUE(got_cpu.ok() && got_cpu->has_value());
  EXPECT_EQ((*got_cpu)->progress, "step 3/4");
  EXPECT_EQ((*store)->ListBuilds(mv->artifact)->size(), 2u);
  auto other = (*store)->GetBuild(mv->artifact, "model", "fp2", "cpu");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
}

// A store written by every earlier schema opens with this binary, keeps
// its models, builds and events, reads new settings as their defaults, and
// takes new versions. Each schema bump must ship a fixture of the old one.
TEST(ModelStoreMigration, EveryEarlierSchemaOpensAndKeepsItsModels) {
  for (int from = 1; from < kSchemaVersion; ++from) {
    SCOPED_TRACE("from schema " + std::to_string(from));
    std::string fixture =
        std::string(AOTID_SOURCE_DIR) + "/tests/storage/testdata/store_v" + std::to_string(from) + ".sql";
    auto sql = fs::ReadFile(fixture);
    ASSERT_TRUE(sql.ok()) << "schema " << from << " has no fixture: " << sql.status().ToString();
    TempDir d;
    {
      auto db = Db::Open(d / "aotid.db", /*create=*/true);
      ASSERT_TRUE(db.ok());
      ASSERT_OK((*db)->Exec(*sql));
    }
    auto store = ModelStore::Open(d.path(), /*create=*/false);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ((*store)->SchemaVersion(), kSchemaVersion);
    EXPECT_OK((*store)->CheckIntegrity());

    auto models = (*store)->ListModels();
    ASSERT_TRUE(models.ok()) << models.status().ToString();
    ASSERT_EQ(models->size(), 2u);
    const ModelInfo& embed = (*models)[0];
    const ModelInfo& mlp = (*models)[1];
    EXPECT_EQ(embed.name, "embed");
    EXPECT_EQ(mlp.name, "mlp");
    EXPECT_EQ(mlp.policy, VersionPolicy{});
    EXPECT_TRUE(mlp.enabled);
    ASSERT_EQ(mlp.versions.size(), 2u);
    EXPECT_EQ(mlp.versions[0].version, 1);
    EXPECT_EQ(mlp.versions[1].version, 5);
    EXPECT_EQ(mlp.versions[0].artifact, mlp.versions[1].artifact);
    ASSERT_EQ(embed.versions.size(), 1u);
    VersionSettings want;
    want.num_runners = 2;
    EXPECT_EQ(embed.versions[0].settings, want);  // kept, and the new settings at their defaults
    auto builds = (*store)->ListBuilds(mlp.versions[0].artifact);
    ASSERT_TRUE(builds.ok());
    ASSERT_EQ(builds->size(), 1u);
    EXPECT_EQ((*builds)[0].state, BuildState::kReady);
    auto events = (*store)->ListEvents();
    ASSERT_TRUE(events.ok());
    EXPECT_GE(events->size(), 3u);

    // Writable with the new schema: a setting only it has, and a new version.
    auto set = (*store)->Set("mlp", std::nullopt, {{"max_batch_size", "4"}});
    ASSERT_TRUE(set.ok()) << set.status().ToString();
    EXPECT_EQ(set->size(), 2u);
    auto added = (*store)->Add(Req(TestData("mlp.pt2"), "mlp"));
    ASSERT_TRUE(added.ok()) << added.status().ToString();
    EXPECT_EQ(added->version, 6);
    EXPECT_OK((*store)->CheckIntegrity());
  }
}

TEST(ModelStoreMigration, NewerSchemaIsRefused) {
  TempDir d;
  {
    auto db = Db::Open(d / "aotid.db", true);
    ASSERT_TRUE(db.ok());
    ASSERT_OK((*db)->Exec("PRAGMA user_version = " + std::to_string(kSchemaVersion + 1)));
  }
  auto store = ModelStore::Open(d.path(), false);
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("newer than this aotid understands"), std::string::npos);
}

TEST(Names, OnlyTheDocumentedPatternIsAccepted) {
  for (std::string ok :
       {std::string("mlp"), std::string("MLP-v2.1_x"), std::string("0model"), std::string(128, 'a')}) {
    EXPECT_OK(ValidateModelName(ok));
  }
  std::string nul("a\0b", 3);
  struct Case {
    std::string name, needle;
  } bad[] = {
      {"", "1 to 128"},
      {std::string(129, 'a'), "1 to 128"},
      {"../x", "may only contain"},
      {"a/b", "may only contain"},
      {nul, "a\\x00b"},
      {"a\nb", "a\\x0ab"},
      {"a b", "may only contain"},
      {"a%2fb", "may only contain"},
      {".hidden", "must start with"},
      {"_x", "must start with"},
      {"-x", "must start with"},
      {"a..b", "must not contain '..'"},
      {"caf\xc3\xa9", "may only contain"},
  };
  for (const auto& c : bad) {
    Status s = ValidateModelName(c.name);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
  }
  std::string name;
  std::optional<int64_t> version;
  ASSERT_OK(ParseModelRef("mlp:12", &name, &version));
  EXPECT_EQ(name, "mlp");
  EXPECT_EQ(version, 12);
  ASSERT_OK(ParseModelRef("mlp", &name, &version));
  EXPECT_FALSE(version.has_value());
  EXPECT_EQ(ParseModelRef("mlp:", &name, &version).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelRef("mlp:0", &name, &version).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelRef("mlp:1x", &name, &version).code(), StatusCode::kInvalidArgument);
  // One spelling per version: not 01 for 1.
  EXPECT_EQ(ParseModelRef("mlp:01", &name, &version).message(),
            "'mlp:01': the version after ':' has a leading zero; write mlp:1");
  EXPECT_EQ(ParseModelRef("mlp:0012", &name, &version).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelRef("mlp:+1", &name, &version).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(ParseModelRef("mlp:10", &name, &version));
  EXPECT_EQ(version, 10);
  EXPECT_EQ(ParseModelRef("../a:1", &name, &version).code(), StatusCode::kInvalidArgument);
}

TEST(VersionPolicyText, RoundTripsAndRefusesNonsense) {
  for (std::string text : {"latest", "all", "pinned:3"}) {
    auto p = ParseVersionPolicy(text);
    ASSERT_TRUE(p.ok()) << text;
    EXPECT_EQ(FormatVersionPolicy(*p), text);
  }
  for (std::string text : {"", "newest", "pinned:", "pinned:0", "pinned:x", "pinned:-1"}) {
    EXPECT_EQ(ParseVersionPolicy(text).status().code(), StatusCode::kInvalidArgument) << text;
  }
}

// The one answer to "which versions does the policy serve", which the
// reconciler serves and `aotid ls` and `show` print.
TEST(VersionPolicy, WantedVersionsAreWhatThePolicyServes) {
  ModelInfo m;
  m.name = "mlp";
  EXPECT_TRUE(WantedVersions(m).empty());  // no versions
  for (int64_t v : {1, 3, 7}) m.versions.push_back(ModelVersion{.model = "mlp", .version = v});
  EXPECT_EQ(WantedVersions(m), std::set<int64_t>{7});
  m.policy = VersionPolicy{VersionPolicy::kAll};
  EXPECT_EQ(WantedVersions(m), (std::set<int64_t>{1, 3, 7}));
  m.policy = VersionPolicy{VersionPolicy::kPinned, 3};
  EXPECT_EQ(WantedVersions(m), std::set<int64_t>{3});
  m.policy = VersionPolicy{VersionPolicy::kPinned, 5};
  EXPECT_TRUE(WantedVersions(m).empty());  // pinned to a version the model does not have
  m.policy = VersionPolicy{VersionPolicy::kAll};
  m.enabled = false;
  EXPECT_TRUE(WantedVersions(m).empty());
}

// gc never touches a copy another process is still writing (it holds a
// lock on it), nor files in blobs/sha256 whose names are not digests.
TEST(ModelStoreGc, LeavesLockedCopiesAndForeignFilesAlone) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp")).ok());
  ASSERT_OK(fs::MakeDirs(d / "blobs/tmp"));
  ASSERT_OK(fs::WriteFileAtomic(d / "blobs/tmp/import-live", "partial"));
  ASSERT_OK(fs::WriteFileAtomic(d / "blobs/tmp/import-dead", "partial"));
  ASSERT_OK(fs::WriteFileAtomic(d / "blobs/sha256/README", "not ours"));
  std::string orphan(64, 'a');
  ASSERT_OK(fs::WriteFileAtomic(d / ("blobs/sha256/" + orphan), "crash debris"));
  int fd = ::open((d / "blobs/tmp/import-live").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  // gc runs in a child process: flock locks belong to open files, so the
  // child's own open of the file must find it locked.
  pid_t pid = ::fork();
  if (pid == 0) {
    auto child = ModelStore::Open(d.path(), false);
    auto r = child.ok() ? (*child)->CollectGarbage() : StatusOr<GcReport>(child.status());
    ::_exit(r.ok() && r->tmp_files == std::vector<std::string>{"import-dead"} &&
                    r->orphan_blobs == std::vector<std::string>{orphan} && r->artifacts.empty()
                ? 0
                : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(fs::Exists(d / "blobs/tmp/import-live"));
  EXPECT_FALSE(fs::Exists(d / "blobs/tmp/import-dead"));
  EXPECT_TRUE(fs::Exists(d / "blobs/sha256/README"));
  EXPECT_FALSE(fs::Exists(d / ("blobs/sha256/" + orphan)));
  EXPECT_TRUE(fs::Exists((*store)->BlobPath(*fs::Sha256File(TestData("mlp.pt2")))));
}

// A sync's downloads/<sha>.partial: an old, empty or already stored one is
// debris; a recent one is kept for the next sync to resume, and one a sync
// is writing (locked) is never touched.
TEST(ModelStoreGc, RemovesStaleDownloadsAndKeepsResumableOnes) {
  namespace stdfs = std::filesystem;
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp")).ok());
  std::string stored = *fs::Sha256File(TestData("mlp.pt2"));
  ASSERT_OK(fs::MakeDirs(d / "downloads"));
  auto partial = [&](char c) { return d / ("downloads/" + std::string(64, c) + ".partial"); };
  ASSERT_OK(fs::WriteFileAtomic(partial('a'), "recent"));
  ASSERT_OK(fs::WriteFileAtomic(partial('b'), "a month old"));
  ASSERT_OK(fs::WriteFileAtomic(partial('c'), ""));
  ASSERT_OK(fs::WriteFileAtomic(partial('d'), "old, but a sync is writing it"));
  ASSERT_OK(fs::WriteFileAtomic(d / ("downloads/" + stored + ".partial"), "the store has it"));
  ASSERT_OK(fs::WriteFileAtomic(d / "downloads/notes.txt", "not ours"));
  auto month_ago = stdfs::file_time_type::clock::now() - std::chrono::hours(24 * 30);
  stdfs::last_write_time(partial('b'), month_ago);
  stdfs::last_write_time(partial('d'), month_ago);
  stdfs::last_write_time(d / "downloads/notes.txt", month_ago);
  int fd = ::open(partial('d').c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  pid_t pid = ::fork();
  if (pid == 0) {  // another process, as flock locks belong to open files
    auto child = ModelStore::Open(d.path(), false);
    auto dry = child.ok() ? (*child)->CollectGarbage(/*dry_run=*/true) : StatusOr<GcReport>(child.status());
    auto r = child.ok() ? (*child)->CollectGarbage() : StatusOr<GcReport>(child.status());
    std::vector<std::string> want{std::string(64, 'b') + ".partial", std::string(64, 'c') + ".partial",
                                  stored + ".partial"};
    auto sorted = [](std::vector<std::string> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    ::_exit(dry.ok() && r.ok() && sorted(dry->stale_downloads) == sorted(want) &&
                    sorted(r->stale_downloads) == sorted(want) && r->bytes_freed == dry->bytes_freed
                ? 0
                : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(fs::Exists(partial('a')));
  EXPECT_FALSE(fs::Exists(partial('b')));
  EXPECT_FALSE(fs::Exists(partial('c')));
  EXPECT_TRUE(fs::Exists(partial('d')));
  EXPECT_FALSE(fs::Exists(d / ("downloads/" + stored + ".partial")));
  EXPECT_TRUE(fs::Exists(d / "downloads/notes.txt"));
  EXPECT_TRUE(fs::Exists((*store)->BlobPath(stored)));
}

TEST(ModelStoreGc, TrimsOldEventsKeepingTheNewest) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 30; ++i) ASSERT_OK((*store)->AppendEvent("m", 1, "test", std::to_string(i)));
  auto r = (*store)->CollectGarbage(false, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->events_trimmed, 20);
  auto events = (*store)->ListEvents();
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 10u);
  EXPECT_EQ(events->front().message, "20");
  EXPECT_EQ(events->back().message, "29");
}

}  // namespace
}  // namespace aotid::storage
