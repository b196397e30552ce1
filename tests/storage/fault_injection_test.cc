// The store under a power cut at every point of a run of writes. kill -9
// keeps the page cache, so only dropping what was never synced shows a
// missing fsync: the blobs and directories go through a FaultInjectionEnv,
// aotid.db and its WAL through a VFS that reports to the same env.
//
// A run of store operations is done once to learn how many file-system
// operations it makes and the store's state after each step; then, for
// every operation k, a fresh store runs it again with the disk stopping at
// k, the unsynced part is dropped, and the store is reopened on the real
// file system. It must open clean, hold everything a step that returned ok
// wrote, and show the step that was cut either whole or not at all.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "base/fs.h"
#include "storage/model_store.h"
#include "test_util.h"
#include "tests/base/fault_env.h"
#include "tests/storage/fault_vfs.h"
#include "zip_util.h"

namespace aotid::storage {
namespace {

using aotid::testing::FaultInjectionEnv;

// What a step can change, as one comparable text: every model with its
// policy and enabled flag, every version with its blob and settings, every
// event (kind, model, version).
StatusOr<std::string> Describe(ModelStore* store) {
  std::ostringstream out;
  ASSIGN_OR_RETURN(auto models, store->ListModels());
  for (const auto& m : models) {
    out << "model " << m.name << " " << FormatVersionPolicy(m.policy) << " enabled=" << m.enabled << "\n";
    for (const auto& v : m.versions) {
      out << "  v" << v.version << " " << v.artifact << " " << v.size
          << " batch=" << v.settings.max_batch_size << "\n";
    }
  }
  ASSIGN_OR_RETURN(auto events, store->ListEvents());
  for (const auto& e : events) out << "event " << e.kind << " " << e.model << ":" << e.version << "\n";
  return out.str();
}

// The store opens clean, and every version's blob is there with its digest.
void ExpectSound(ModelStore* store) {
  ASSERT_OK(store->CheckIntegrity());
  EXPECT_EQ(store->SchemaVersion(), kSchemaVersion);
  auto versions = store->ListVersions();
  ASSERT_TRUE(versions.ok()) << versions.status().ToString();
  for (const auto& v : *versions) {
    auto sha = fs::Sha256File(store->BlobPath(v.artifact));
    EXPECT_TRUE(sha.ok() && *sha == v.artifact)
        << v.model << ":" << v.version << " names blob " << v.artifact << ", which is "
        << (sha.ok() ? "sha256:" + *sha : sha.status().ToString());
  }
  auto gc = store->CollectGarbage(/*dry_run=*/true);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_TRUE(gc->missing_blobs.empty());
}

AddRequest Req(const std::string& file, const std::string& name, bool move = false) {
  AddRequest r;
  r.file = file;
  r.name = name;
  r.move_file = move;
  return r;
}

class StoreFaultInjection : public ::testing::Test {
 protected:
  void SetUp() override {
    // The real file system sees only the checks' own fsyncs (the env makes
    // none); on tmpfs, where Linux has one, they cost nothing.
    std::string parent = fs::IsDirectory("/dev/shm") && ::access("/dev/shm", W_OK) == 0
                             ? "/dev/shm"
                             : std::filesystem::temp_directory_path().string();
    auto root = fs::MakeTempDir(parent, "aotid-fault-");
    ASSERT_TRUE(root.ok()) << root.status().ToString();
    root_ = fs::RealPath(*root);  // SQLite names files by their real path
    std::filesystem::create_directories(root_ + "/in");
    std::filesystem::create_directories(root_ + "/scratch");
    // Three small packages of different sizes.
    for (int i = 0; i < 3; ++i) {
      ASSERT_NO_FATAL_FAILURE(aotid::testing::WriteZip(
          Package(i),
          {{"p/models/model.json", "{}"},
           {"p/data/weights/w" + std::to_string(i), std::string(1000 + 7919 * i, char('a' + i))}}));
    }
    env_ = std::make_unique<FaultInjectionEnv>(root_ + "/scratch");
    vfs_ = aotid::testing::UseFaultVfs(env_.get());
  }

  std::string Package(int i) const { return root_ + "/in/p" + std::to_string(i) + ".pt2"; }
  std::string StoreDir() const { return root_ + "/store"; }

  StatusOr<std::unique_ptr<ModelStore>> OpenFaulty() {
    StoreOptions o;
    o.env = env_.get();
    o.sqlite_vfs = vfs_;
    return ModelStore::Open(StoreDir(), o);
  }

  // The run of writes, each step returning ok or the first error. Step 0
  // opens (creates) the store.
  std::vector<std::function<Status()>> Steps() {
    auto status = [](const auto& r) { return r.status(); };
    return {
        [&] {
          auto s = OpenFaulty();
          if (s.ok()) store_ = std::move(s).value();
          return s.status();
        },
        [&] { return status(store_->Add(Req(Package(0), "alpha"))); },
        [&] { return status(store_->Add(Req(Package(1), "beta"))); },
        [&] { return status(store_->Add(Req(Package(0), "alpha"))); },  // a blob the store has
        [&] {
          return status(store_->Set("alpha", std::nullopt, {{"max_batch_size", "4"}}));
        },
        [&] { return store_->AppendEvent("beta", 1, "loaded", "loaded by a test"); },
        [&] {
          return status(store_->Remove({{"beta", std::nullopt}}));
        },
        [&] {  // closing checkpoints the WAL into aotid.db and deletes it
          store_.reset();
          auto s = OpenFaulty();
          if (s.ok()) store_ = std::move(s).value();
          return s.status();
        },
        [&] {  // a download on the same disk is moved in, not copied
          std::filesystem::copy_file(Package(2), root_ + "/in/download.pt2",
                                     std::filesystem::copy_options::overwrite_existing);
          return status(store_->Add(Req(root_ + "/in/download.pt2", "gamma", /*move=*/true)));
        },
        [&] {
          return status(store_->Set("gamma", std::nullopt, {{"enabled", "false"}}));
        },
    };
  }

  // Runs the steps in a fresh store; returns how many returned ok (all of
  // them unless the env crashed), recording the state after each.
  size_t Run(std::vector<std::string>* states) {
    std::filesystem::remove_all(StoreDir());
    auto steps = Steps();
    size_t done = 0;
    for (; done < steps.size(); ++done) {
      Status s = steps[done]();
      if (!s.ok()) {
        EXPECT_TRUE(env_->crashed()) << "step " << done << " failed with no crash: " << s.ToString();
        break;
      }
      if (states != nullptr) {
        auto d = Describe(store_.get());
        EXPECT_TRUE(d.ok()) << d.status().ToString();
        states->push_back(d.ok() ? *d : "");
      }
    }
    store_.reset();
    return done;
  }

  void TearDown() override {
    store_.reset();
    std::error_code ec;
    if (!root_.empty()) std::filesystem::remove_all(root_, ec);
  }

  std::string root_;
  std::unique_ptr<FaultInjectionEnv> env_;
  std::string vfs_;
  std::unique_ptr<ModelStore> store_;
};

TEST_F(StoreFaultInjection, EveryCrashPointLeavesACleanStoreWithNothingAcknowledgedLost) {
  std::vector<std::string> states;  // after each step of a run with no crash
  ASSERT_EQ(Run(&states), Steps().size());
  const int64_t total = env_->ops();
  ASSERT_OK(env_->DropUnsynced());  // only the WAL's deletion on close was not synced
  {
    auto store = ModelStore::Open(StoreDir(), /*create=*/false);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_NO_FATAL_FAILURE(ExpectSound(store->get()));
    auto d = Describe(store->get());
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, states.back());
  }
  ASSERT_GT(total, 50);

  for (int64_t k = 0; k < total; ++k) {
    SCOPED_TRACE("crash at file-system operation " + std::to_string(k) + " of " + std::to_string(total));
    env_->CrashAtOp(k);
    size_t done = Run(nullptr);
    ASSERT_TRUE(env_->crashed());
    ASSERT_LE(done, states.size());  // all of them: cut while the store closed
    ASSERT_OK(env_->DropUnsynced());

    auto store = ModelStore::Open(StoreDir(), /*create=*/false);
    if (done == 0 && store.status().code() == StatusCode::kNotFound) continue;  // cut before it existed
    ASSERT_TRUE(store.ok()) << "after step " << done << ": " << store.status().ToString();
    ASSERT_NO_FATAL_FAILURE(ExpectSound(store->get()));
    auto d = Describe(store->get());
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    // Everything up to the last step that returned ok; the cut step whole or
    // not at all.
    std::string before = done == 0 ? "" : states[done - 1];
    if (*d != before && done < states.size()) {
      ASSERT_EQ(*d, states[done]) << "step " << done << " was cut; the store holds neither the state "
                                  << "before it:\n"
                                  << before << "nor after it";
    }
  }
}

}  // namespace
}  // namespace aotid::storage
