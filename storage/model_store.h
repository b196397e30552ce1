// The model store: the desired state of one aotid installation.
//
// A directory holding
//   aotid.db              SQLite (WAL): models, versions, artifacts, builds, events
//   blobs/sha256/<hex>    content-addressed artifacts (.pt2 files)
//   blobs/tmp/            copies in progress, each locked (flock) by the
//                         process writing it; unlocked ones are crash debris
//   cache/                compiled builds (compile/build_cache.h)
//   reserve               8 MiB set aside while the disk has room, given
//                         back when it is full so that aotid can still open
//                         the store and free space (ls, show, rm, gc)
//
// Any process may open and write the store at any time, the daemon running
// or not. Writers take SQLite's write lock (BEGIN IMMEDIATE); a blob enters
// blobs/sha256 only under that lock and only after it is fsynced and its
// digest checked, so a committed row always has its blob, and gc (which
// deletes under the same lock) never removes a blob a commit is about to
// reference.
//
// One ModelStore holds one connection and is not thread-safe: give each
// thread its own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "package/package.h"
#include "storage/sqlite.h"
#include "storage/version_settings.h"

namespace aotid::storage {

// The schema version this binary writes. Older stores are migrated forward on
// open; a newer one is refused.
inline constexpr int kSchemaVersion = 7;

// Model names: 1-128 characters of [A-Za-z0-9_.-], starting with a letter or
// digit, with no "..". They appear in URLs and file names, so nothing else.
Status ValidateModelName(std::string_view name);
// Versions are integers from 1 to 2^53.
Status ValidateVersion(int64_t version);
// Parses "NAME" or "NAME:VERSION", validating both parts. VERSION is
// decimal without a leading zero: each version has one spelling.
Status ParseModelRef(std::string_view ref, std::string* name, std::optional<int64_t>* version);

// Which versions of a model are served.
struct VersionPolicy {
  enum Kind { kLatest, kAll, kPinned };
  Kind kind = kLatest;
  int64_t pinned = 0;  // with kPinned

  bool operator==(const VersionPolicy&) const = default;
};
std::string FormatVersionPolicy(const VersionPolicy& p);  // "latest", "all", "pinned:3"
StatusOr<VersionPolicy> ParseVersionPolicy(std::string_view text);

struct ModelVersion {
  std::string model;
  int64_t version = 0;
  std::string artifact;  // sha256 hex of the .pt2 blob
  package::PackageKind kind = package::PackageKind::kExportedProgram;
  std::string package_model = "model";  // model_name inside the package
  int64_t size = 0;
  VersionSettings settings;
  int64_t created_at_ms = 0;
};

struct ModelInfo {
  std::string name;
  VersionPolicy policy;
  bool enabled = true;  // false: kept in the store, served by no daemon
  int64_t created_at_ms = 0;
  std::vector<ModelVersion> versions;  // ascending
};

// The versions of `m` that its version policy serves: the newest, all, or
// the pinned one. None when the model is disabled, and none when it is
// pinned to a version it does not have.
std::set<int64_t> WantedVersions(const ModelInfo& m);

// kCancelled: stopped before it finished (nothing needed it any more, or
// the daemon stopped); says nothing of whether the artifact builds.
enum class BuildState { kQueued, kBuilding, kReady, kFailed, kCancelled };
std::string_view BuildStateName(BuildState s);
bool ParseBuildState(std::string_view name, BuildState* out);

// One build of an artifact for one hardware fingerprint and device.
struct BuildRecord {
  std::string artifact;
  std::string package_model = "model";
  std::string fingerprint;
  std::string device;
  BuildState state = BuildState::kQueued;
  std::string error;
  int64_t started_at_ms = 0;
  int64_t finished_at_ms = 0;
  std::string options;   // the inductor options it was built with
  std::string progress;  // while building: the build's last step
  int attempts = 0;      // builds tried for this key, retries included
};

struct Event {
  int64_t id = 0;
  int64_t at_ms = 0;
  std::string model;
  int64_t version = 0;  // 0 when not about one version
  std::string kind;     // e.g. "added", "build_started", "build_ready", "loaded"
  std::string message;
};

struct AddRequest {
  std::string file;
  std::string name;
  std::optional<int64_t> version;  // default: one past the latest
  std::string package_model;       // which model in the package; default: its only one
  VersionSettings settings;
  // The file is the store's own (a sync's download on the same disk): it is
  // moved into the blob store rather than copied (and is back where it was
  // when the add fails).
  bool move_file = false;
};

// What gc removed (or would remove, with dry_run).
struct GcReport {
  std::vector<std::string> artifacts;     // unreferenced artifacts: row, blob, build rows
  std::vector<std::string> orphan_blobs;  // blob files with no row (an add killed mid-way)
  std::vector<std::string> tmp_files;     // abandoned partial copies
  // downloads/<sha256>.partial of a sync that no one is running: empty
  // ones, ones whose blob the store has, and ones untouched for 7 days (a
  // newer one may still be resumed).
  std::vector<std::string> stale_downloads;
  int64_t events_trimmed = 0;
  int64_t bytes_freed = 0;                 // of the blobs and copies above
  std::vector<std::string> missing_blobs;  // referenced but absent: reported, not fixable here
};

// How a store is opened.
struct StoreOptions {
  // Create the store when it does not exist (else NotFound).
  bool create = true;
  // The file system its blobs and directories are written through; null:
  // Env::Default(). Must outlive the store.
  Env* env = nullptr;
  // A registered SQLite VFS for aotid.db and its -wal and -shm files;
  // empty: SQLite's default. Tests put the database under the same seam.
  std::string sqlite_vfs;
};

class ModelStore {
 public:
  // Opens the store in `dir`, creating it when `create` is set, and migrates
  // its schema. Corruption when aotid.db is not a database; NotFound when it
  // does not exist and `create` is false. On a full disk (under 16 MiB
  // free) it first gives back the store's reserve, with a warning, so that
  // SQLite has room for its -wal and -shm files and a delete; it sets the
  // reserve aside again once the disk has 32 MiB free.
  static StatusOr<std::unique_ptr<ModelStore>> Open(const std::string& dir, bool create = true);
  static StatusOr<std::unique_ptr<ModelStore>> Open(const std::string& dir, const StoreOptions& options);
  static constexpr int64_t kReserveBytes = int64_t{8} << 20;

  // Checks the request and the file without touching any store: the name,
  // version and settings, and that the file is a package aotid can add.
  // Returns the package model the version will serve and the package kind.
  struct AddPlan {
    std::string package_model;
    package::PackageKind kind;
  };
  static StatusOr<AddPlan> CheckAddRequest(const AddRequest& req);

  // Validates the request and the file, copies the file into the blob
  // directory and records the version. On any error the store is unchanged
  // (at most an unreferenced blob remains, which gc removes).
  StatusOr<ModelVersion> Add(const AddRequest& req);
  // Test hook: runs in Add while it reads a blob back to check its digest
  // (the part that takes as long as the file is large).
  void TEST_SetWhileCheckingBlob(std::function<void()> hook) { TEST_while_checking_blob_ = std::move(hook); }

  // All versions of all models, by model name then version.
  StatusOr<std::vector<ModelVersion>> ListVersions();
  // All models with their policy and versions, by name.
  StatusOr<std::vector<ModelInfo>> ListModels();
  // One model; NotFound names it.
  StatusOr<ModelInfo> GetModel(const std::string& name);

  // Applies KEY=VALUE settings to one version, or to every version of the
  // model when `version` is empty; `version_policy` and `enabled` apply to
  // the model and take no version. All or nothing: one bad key or value changes nothing.
  // Returns a line per change ("mlp:2 num_runners 1 -> 2"); unchanged values
  // are left out.
  StatusOr<std::vector<std::string>> Set(const std::string& name, std::optional<int64_t> version,
                                         const std::vector<std::pair<std::string, std::string>>& kv);

  // Removes versions ("NAME:V") or whole models ("NAME"), all or nothing: if
  // any is missing, nothing is removed. A version the model's policy pins
  // cannot be removed while other versions stay. Blobs and builds stay until
  // gc. Returns, per reference, the versions removed.
  using ModelRef = std::pair<std::string, std::optional<int64_t>>;
  StatusOr<std::vector<std::vector<int64_t>>> Remove(const std::vector<ModelRef>& refs);

  // Removes what nothing references: artifacts no version uses (row, blob,
  // build rows), blob files without a row, unlocked partial copies, and
  // events beyond the newest `keep_events`. The build cache under CacheDir()
  // is runtime's: `aotid gc` prunes it by compile/cache_policy.h.
  StatusOr<GcReport> CollectGarbage(bool dry_run = false, int64_t keep_events = 10000);

  std::string BlobPath(const std::string& sha256) const;
  std::string CacheDir() const { return dir_ + "/cache"; }

  // Inserts or replaces the build row for (artifact, package_model, fingerprint, device, options).
  Status PutBuild(const BuildRecord& b);
  StatusOr<std::optional<BuildRecord>> GetBuild(const std::string& artifact, const std::string& package_model,
                                                const std::string& fingerprint, const std::string& device,
                                                const std::string& options = "");
  // Every build row of an artifact, any machine.
  StatusOr<std::vector<BuildRecord>> ListBuilds(const std::string& artifact);
  // How long the finished builds on this machine and device took, newest
  // first (at most 200), with their artifact's size and kind: what an
  // estimate of the next build's time is made from.
  struct BuildTime {
    int64_t artifact_size = 0;
    std::string kind;
    int64_t ms = 0;
  };
  StatusOr<std::vector<BuildTime>> ReadyBuildTimes(const std::string& fingerprint, const std::string& device);

  Status AppendEvent(const std::string& model, int64_t version, const std::string& kind,
                     const std::string& message);
  // Events with id > after_id, oldest first, at most `limit`; only one
  // model's when `model` is set.
  StatusOr<std::vector<Event>> ListEvents(int64_t after_id = 0, int limit = 1000,
                                          const std::string& model = "");
  // The newest `limit` events (of one model when set), oldest first.
  StatusOr<std::vector<Event>> RecentEvents(int limit, const std::string& model = "");

  // SQLite's PRAGMA data_version: changes when another connection (any
  // process) commits to the store, never for this connection's own writes.
  StatusOr<int64_t> DataVersion();
  // PRAGMA integrity_check and foreign_key_check; ok or Corruption with
  // what they found.
  Status CheckIntegrity();

  const std::string& dir() const { return dir_; }
  int SchemaVersion() const { return schema_version_; }

 private:
  ModelStore(std::string dir, std::unique_ptr<Db> db, Env* env)
      : dir_(std::move(dir)), db_(std::move(db)), env_(env) {}
  Status Migrate();
  StatusOr<std::vector<ModelVersion>> QueryVersions(const std::string& where, const std::string& name);

  std::string dir_;
  std::unique_ptr<Db> db_;
  Env* env_;
  std::function<void()> TEST_while_checking_blob_;
  int schema_version_ = 0;
};

// Milliseconds since the Unix epoch.
int64_t NowMs();
// `ms` as UTC, "2026-12-03T20:10:05.123Z"; "-" for 0 or less.
std::string FormatTimestamp(int64_t ms);

}  // namespace aotid::storage
