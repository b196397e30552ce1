#include "storage/model_store.h"

#include <filesystem>

#include "base/fs.h"
#include "storage/package.h"
#include "test_util.h"

namespace aotid::storage {
namespace {

using testing::TempDir;
using testing::TestData;

// Every file under `dir` with its contents: "unchanged" means equal
// snapshots. SQLite's -shm file is a shared-memory index that readers touch,
// not stored data, so it is left out.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    std::string p = e.path().string();
    if (e.is_regular_file() && !p.ends_with("-shm")) out[p] = *fs::ReadFile(p);
  }
  return out;
}

AddRequest Req(const std::string& file, const std::string& name, std::optional<int64_t> version = std::nullopt) {
  AddRequest r;
  r.file = file;
  r.name = name;
  r.version = version;
  return r;
}

TEST(Package, ExportedProgramIsRecognised) {
  auto info = InspectPackage(TestData("mlp.pt2"));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->kind, PackageKind::kExportedProgram);
  EXPECT_EQ(info->model_names, std::vector<std::string>{"model"});
}

TEST(Package, NonZipAndEmptyZipAreRefusedWithReason) {
  auto text = InspectPackage(TestData("not_a_model.pt2"));
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("not a .pt2 package"), std::string::npos);
  auto empty = InspectPackage(TestData("empty.pt2"));
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("holds no model"), std::string::npos);
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
  EXPECT_EQ((*list)[0].kind, PackageKind::kExportedProgram);
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
  auto before = Snapshot(d.path());
  auto again = (*store)->Add(Req(TestData("embed.pt2"), "mlp", 3));
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("already has version 3"), std::string::npos);
  EXPECT_EQ(Snapshot(d.path()), before);
}

TEST(ModelStore, BadFilesAndNamesAreRefusedAndStoreUnchanged) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Add(Req(TestData("mlp.pt2"), "mlp")).ok());
  auto before = Snapshot(d.path());
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
  };
  for (const auto& c : cases) {
    auto r = (*store)->Add(c.req);
    EXPECT_EQ(r.status().code(), c.code) << c.req.name << " " << c.req.file << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(Snapshot(d.path()), before);
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
  BuildRecord b{mv->artifact, "model", "fp1", "cpu", BuildState::kFailed, "compiler said no", 10, 20};
  ASSERT_OK((*store)->PutBuild(b));
  auto got = (*store)->GetBuild(mv->artifact, "model", "fp1");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->state, BuildState::kFailed);
  EXPECT_EQ((*got)->error, "compiler said no");
  auto other = (*store)->GetBuild(mv->artifact, "model", "fp2");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
}

}  // namespace
}  // namespace aotid::storage
