// The model store: the desired state of one aotid installation.
//
// A directory holding
//   aotid.db              SQLite (WAL): models, versions, artifacts, builds, events
//   blobs/sha256/<hex>    content-addressed artifacts (.pt2 files)
//   blobs/tmp/            partial copies; anything here after a crash is garbage
//
// Any process may open and write the store. One ModelStore holds one
// connection and is not thread-safe: give each thread its own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "storage/package.h"
#include "storage/sqlite.h"

namespace aotid::storage {

// The schema version this binary writes. Older stores are migrated forward on
// open; a newer one is refused.
inline constexpr int kSchemaVersion = 1;

// Model names: 1-128 characters of [A-Za-z0-9_.-], starting with a letter or
// digit, with no "..". They appear in URLs and file names, so nothing else.
Status ValidateModelName(std::string_view name);
// Versions are integers from 1 to 2^53.
Status ValidateVersion(int64_t version);

struct VersionSettings {
  std::string device = "auto";  // auto | cpu | mps | cuda
  int num_runners = 1;          // concurrent model instances
};

struct ModelVersion {
  std::string model;
  int64_t version = 0;
  std::string artifact;  // sha256 hex of the .pt2 blob
  PackageKind kind = PackageKind::kExportedProgram;
  std::string package_model = "model";  // model_name inside the package
  int64_t size = 0;
  VersionSettings settings;
  int64_t created_at = 0;  // unix seconds
};

enum class BuildState { kQueued, kBuilding, kReady, kFailed };
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
  VersionSettings settings;
};

class ModelStore {
 public:
  // Opens the store in `dir`, creating it when `create` is set, and migrates
  // its schema. Corruption when aotid.db is not a database; NotFound when it
  // does not exist and `create` is false.
  static StatusOr<std::unique_ptr<ModelStore>> Open(const std::string& dir, bool create = true);

  // Checks the request and the file without touching any store: the name,
  // version and settings, and that the file is a package aotid can add.
  static StatusOr<PackageInfo> CheckAddRequest(const AddRequest& req);

  // Validates the request and the file, copies the file into the blob
  // directory and records the version. On any error the store is unchanged
  // (at most an unreferenced blob remains, which gc removes).
  StatusOr<ModelVersion> Add(const AddRequest& req);

  // All versions of all models, by model name then version.
  StatusOr<std::vector<ModelVersion>> ListVersions();

  std::string BlobPath(const std::string& sha256) const;

  // Inserts or replaces the build row for (artifact, package_model, fingerprint).
  Status PutBuild(const BuildRecord& b);
  StatusOr<std::optional<BuildRecord>> GetBuild(const std::string& artifact,
                                                const std::string& package_model,
                                                const std::string& fingerprint);

  Status AppendEvent(const std::string& model, int64_t version, const std::string& kind,
                     const std::string& message);
  // Events with id > after_id, oldest first, at most `limit`.
  StatusOr<std::vector<Event>> ListEvents(int64_t after_id = 0, int limit = 1000);

  // SQLite's PRAGMA data_version: changes when another connection (any
  // process) commits to the store, never for this connection's own writes.
  StatusOr<int64_t> DataVersion();

  const std::string& dir() const { return dir_; }
  int SchemaVersion() const { return schema_version_; }
  Db* db() { return db_.get(); }

 private:
  ModelStore(std::string dir, std::unique_ptr<Db> db) : dir_(std::move(dir)), db_(std::move(db)) {}
  Status Migrate();
  StatusOr<std::string> ImportBlob(const std::string& file);

  std::string dir_;
  std::unique_ptr<Db> db_;
  int schema_version_ = 0;
};

// Milliseconds since the Unix epoch.
int64_t NowMs();

}  // namespace aotid::storage
