// Model versions to and from OCI registries (docs/SYNC.md): `aotid push`
// and `aotid sync`.
//
// A version is an OCI image manifest of artifactType kArtifactType with a
// small JSON config (the model's name, its version where it was pushed from,
// its package model and serving settings, the author's metadata) and one
// layer: the .pt2, byte for byte.
//
// Pulling checks every digest's form before it is used, reads manifests and
// configs up to limits, downloads the layer into a partial file under the
// store (resumed by the next sync after an interruption), checks its
// sha256, and only then adds it to the store, which moves it into the
// blob store (a rename: the download is not copied again) and records the
// version in one transaction. A failed sync
// leaves the store as it was.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "storage/model_store.h"
#include "sync/registry.h"

namespace aotid::sync {

inline constexpr char kArtifactType[] = "application/vnd.aotid.model.v1";
inline constexpr char kConfigMediaType[] = "application/vnd.aotid.model.config.v1+json";
inline constexpr char kPackageMediaType[] = "application/vnd.aotid.package.v1.pt2";
inline constexpr char kOciManifestMediaType[] = "application/vnd.oci.image.manifest.v1+json";

// What one sync did, or a push.
struct SyncResult {
  std::string ref;                 // "oci://host/repo:tag"
  std::string manifest;            // its digest
  std::string model;               // "mlp"
  int64_t version = 0;             // the store's version now serving it (pull), or pushed (push)
  bool added = false;              // false: the store had it already (pull); the registry had it (push)
  int64_t bytes = 0;               // transferred
  int64_t resumed_from = 0;        // bytes a partial download already had
  std::vector<std::string> notes;  // settings ignored, and the like
  Status error;                    // a folder's file that could not be synced (PullDir goes on)
};

// Asked before a sync adds a version of `model`: an error refuses it (the
// daemon's check that two sources do not feed one model).
using MayAdd = std::function<Status(const std::string& model)>;

struct PushOptions {
  Credentials creds;
  RegistryLimits limits;
  Progress progress;
};

// Pushes `name`:`version` (the newest when unset) to `ref`; the tag is the
// ref's, else the version number.
StatusOr<SyncResult> Push(storage::ModelStore& store, const std::string& name, std::optional<int64_t> version,
                          const OciRef& ref, const PushOptions& options);

struct PullOptions {
  Credentials creds;
  RegistryLimits limits;
  Progress progress;
  std::string name;  // the store's name for it; empty: the repository's last part ("models/mlp": mlp)
  // Up to date when any version of the model is this package, not only
  // the newest (syncing every tag of a repository).
  bool any_version = false;
  const std::atomic<bool>* cancel = nullptr;  // stops a download once set
  MayAdd may_add;                             // none: always
};

// Syncs one tag (the ref's) into the store, as the model named by
// `options.name` or the repository's last part: when the model's newest
// version there is already this artifact, nothing changes; otherwise it is
// added as the model's next version, with the pushed settings (but never
// the pushed inductor options, which reach the compiler's command line).
StatusOr<SyncResult> Pull(storage::ModelStore& store, const OciRef& ref, const PullOptions& options);

// Syncs a folder of .pt2 files into the store: every `*.pt2` in `dir`,
// named by its file name without `.pt2`, or as `dir/index.json` says:
// {"models": [{"file": "mlp.pt2", "name": "mlp", "settings": {"max_batch_size": "4"}}]}
// (plain file names only). Each is added as its model's next version unless
// the newest already is that file. `name` (one file only) overrides. A
// folder that is not one, or a bad index (two files for one model among
// them), is an error; a file that cannot be synced is its result's `error`,
// and the others go on.
StatusOr<std::vector<SyncResult>> PullDir(storage::ModelStore& store, const std::string& dir,
                                          const std::string& name, const MayAdd& may_add = nullptr);

// What aotid reads of a registry's manifest: its config's digest and size,
// and its one package layer (digests checked for form, sizes against
// `limits`). InvalidArgument naming the fault for anything else, a
// document nested past 32 levels included; ResourceExhausted past a limit.
struct Manifest {
  std::string config_digest;
  int64_t config_size = 0;
  struct {
    std::string digest;
    int64_t size = 0;
  } layer;
};
StatusOr<Manifest> ParseManifest(std::string_view text, const RegistryLimits& limits);

// What aotid takes of a registry's config: the package's model and the
// pushed settings, apart from those a registry may not set (inductor
// options: they reach the compiler's command line) and those this aotid
// does not know, each said in `notes`. The config's name is not taken.
struct RemoteConfig {
  std::string package_model;
  storage::VersionSettings settings;
  std::vector<std::string> notes;
};
StatusOr<RemoteConfig> ParseRemoteConfig(std::string_view text);

// The manifest and config a push writes, for docs and tests.
std::string MakeConfig(const storage::ModelVersion& v, const std::string& author_metadata);
std::string MakeManifest(const std::string& config, const storage::ModelVersion& v,
                         const std::string& file_name);

}  // namespace aotid::sync
