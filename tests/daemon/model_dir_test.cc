// Single-model mode's two steps: finding the package in the folder a
// storage initializer filled, and adopting it into the store once.
#include "daemon/model_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "storage/version_settings.h"
#include "test_util.h"

namespace aotid::daemon {
namespace {

using testing::TempDir;
using testing::TestData;

void Touch(const std::string& path) {
  ASSERT_OK(fs::MakeDirs(path.substr(0, path.rfind('/'))));
  ASSERT_OK(fs::WriteFileAtomic(path, "x"));
}

TEST(FindModelPackage, TheFileItselfOrTheOnePackageBelow) {
  TempDir t;
  Touch(t.path() + "/a/b/model.pt2");
  Touch(t.path() + "/a/README.md");
  Touch(t.path() + "/a/.hidden/other.pt2");  // a storage initializer's own files
  EXPECT_EQ(*FindModelPackage(t.path() + "/a", "m"), t.path() + "/a/b/model.pt2");
  EXPECT_EQ(*FindModelPackage(t.path() + "/a/", "m"), t.path() + "/a/b/model.pt2");
  EXPECT_EQ(*FindModelPackage(t.path() + "/a/README.md", "m"), t.path() + "/a/README.md");
  // Through a link, as a mounted volume's files often are.
  ASSERT_EQ(::symlink((t.path() + "/a").c_str(), (t.path() + "/link").c_str()), 0);
  EXPECT_EQ(*FindModelPackage(t.path() + "/link", "m"), t.path() + "/link/b/model.pt2");
  // One file by two paths (a `current` link beside the folder it names, a
  // link to the folder itself) is one package.
  ASSERT_EQ(::symlink("b", (t.path() + "/a/current").c_str()), 0);
  ASSERT_EQ(::symlink(".", (t.path() + "/a/self").c_str()), 0);
  EXPECT_EQ(*FindModelPackage(t.path() + "/a", "m"), t.path() + "/a/b/model.pt2");
}

TEST(FindModelPackage, NoneTooDeepOrSeveralAreRefusedNamingThem) {
  TempDir t;
  Touch(t.path() + "/deep/1/2/3/model.pt2");
  auto deep = FindModelPackage(t.path() + "/deep", "m");
  EXPECT_EQ(deep.status().code(), StatusCode::kNotFound);
  EXPECT_NE(deep.status().message().find("no .pt2 package"), std::string::npos) << deep.status().ToString();
  EXPECT_EQ(FindModelPackage(t.path() + "/absent", "m").status().code(), StatusCode::kNotFound);

  // Names of packages that are no file are named in the refusal.
  ASSERT_OK(fs::MakeDirs(t.path() + "/odd/model.pt2"));
  auto folder = FindModelPackage(t.path() + "/odd", "m");
  EXPECT_NE(folder.status().message().find("levels down): model.pt2 is a folder"), std::string::npos)
      << folder.status().ToString();
  ASSERT_EQ(::symlink("gone.pt2", (t.path() + "/dangling/m.pt2").c_str()), -1);  // no folder yet
  Touch(t.path() + "/dangling/README");
  ASSERT_EQ(::symlink("gone.pt2", (t.path() + "/dangling/m.pt2").c_str()), 0);
  auto dangling = FindModelPackage(t.path() + "/dangling", "m");
  EXPECT_NE(dangling.status().message().find("m.pt2 is a link that leads nowhere"), std::string::npos)
      << dangling.status().ToString();
  ASSERT_EQ(::mkfifo((t.path() + "/dangling/z.pt2").c_str(), 0600), 0);
  ASSERT_EQ(::unlink((t.path() + "/dangling/m.pt2").c_str()), 0);
  auto fifo = FindModelPackage(t.path() + "/dangling", "m");
  EXPECT_NE(fifo.status().message().find("z.pt2 is not a regular file"), std::string::npos)
      << fifo.status().ToString();

  Touch(t.path() + "/two/x/a.pt2");
  Touch(t.path() + "/two/b.pt2");
  auto two = FindModelPackage(t.path() + "/two", "m");
  EXPECT_EQ(two.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("b.pt2, x/a.pt2"), std::string::npos) << two.status().ToString();
  // One named for the model, or model.pt2, at the top is the choice.
  Touch(t.path() + "/two/m.pt2");
  EXPECT_EQ(*FindModelPackage(t.path() + "/two", "m"), t.path() + "/two/m.pt2");
  Touch(t.path() + "/three/model.pt2");
  Touch(t.path() + "/three/old/model.pt2");
  EXPECT_EQ(*FindModelPackage(t.path() + "/three", "m"), t.path() + "/three/model.pt2");
}

TEST(AdoptModel, AddsOnceAndAddsAgainOnlyWhenTheBytesChange) {
  TempDir t;
  auto store = storage::ModelStore::Open(t.path() + "/store");
  ASSERT_OK(store.status());
  bool added = false;
  auto v1 = AdoptModel(store->get(), TestData("mlp_so.pt2"), "demo", &added);
  ASSERT_OK(v1.status());
  EXPECT_TRUE(added);
  EXPECT_EQ(v1->version, 1);
  EXPECT_EQ(v1->settings.keep_alive_s, storage::kKeepAliveAlways);
  // A user turned it off and pinned it: the folder's model is served anyway.
  ASSERT_OK(
      (*store)->Set("demo", std::nullopt, {{"enabled", "false"}, {"version_policy", "pinned:1"}}).status());
  auto same = AdoptModel(store->get(), TestData("mlp_so.pt2"), "demo", &added);
  ASSERT_OK(same.status());
  EXPECT_FALSE(added);
  EXPECT_EQ(same->version, 1);
  auto m = (*store)->GetModel("demo");
  ASSERT_OK(m.status());
  EXPECT_TRUE(m->enabled);
  EXPECT_EQ(storage::FormatVersionPolicy(m->policy), "latest");

  // A copy a killed add left behind.
  ASSERT_OK(fs::MakeDirs((*store)->dir() + "/blobs/tmp"));
  ASSERT_OK(fs::WriteFileAtomic((*store)->dir() + "/blobs/tmp/import-1-x-0", std::string(4096, 'x')));

  auto v2 = AdoptModel(store->get(), TestData("mlp.pt2"), "demo", &added);
  ASSERT_OK(v2.status());
  EXPECT_TRUE(added);
  EXPECT_EQ(v2->version, 2);
  // The first version went, and its blob and the partial copy with it.
  auto model = (*store)->GetModel("demo");
  ASSERT_OK(model.status());
  ASSERT_EQ(model->versions.size(), 1u);
  EXPECT_EQ(model->versions[0].version, 2);
  EXPECT_FALSE(fs::Exists((*store)->BlobPath(v1->artifact)));
  EXPECT_TRUE(fs::Exists((*store)->BlobPath(v2->artifact)));
  EXPECT_FALSE(fs::Exists((*store)->dir() + "/blobs/tmp/import-1-x-0"));
  // Back to the first bytes: a newer version again, so that it is the one
  // the policy serves.
  auto v3 = AdoptModel(store->get(), TestData("mlp_so.pt2"), "demo", &added);
  ASSERT_OK(v3.status());
  EXPECT_TRUE(added);
  EXPECT_EQ(v3->version, 3);

  auto bad = AdoptModel(store->get(), TestData("not_a_model.pt2"), "demo", &added);
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(added);
  model = (*store)->GetModel("demo");
  ASSERT_EQ(model->versions.size(), 1u);
  EXPECT_EQ(model->versions[0].version, 3);
}

}  // namespace
}  // namespace aotid::daemon
