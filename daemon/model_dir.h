// Single-model mode (`aotid serve --model-dir DIR --model-name NAME`): the
// model is the package in a folder someone else fills (KServe's storage
// initializer puts it at /mnt/models), read-only, with no `aotid add`. The
// daemon adopts it into its own store, a writable folder where the builds
// are kept too, and serves that one model.
#pragma once

#include <string>

#include "base/status.h"
#include "storage/model_store.h"

namespace aotid::daemon {

// How far below --model-dir a package is looked for: the folder a storage
// initializer made may hold the file a level or two down.
inline constexpr int kModelDirDepth = 3;

// The package `path` names: `path` itself when it is a file; else the one
// `.pt2` file within kModelDirDepth levels below it (following links,
// leaving out names that start with a dot; one file reached through links
// by several paths counts once). Where there are several, the
// one named NAME.pt2 or model.pt2 at the top is taken. NotFound when there
// is none; InvalidArgument naming them when there are several to choose
// from.
StatusOr<std::string> FindModelPackage(const std::string& path, const std::string& name);

// The version of `name` that serves `file`: the model's newest version when
// it holds the same bytes (a restart over the same store), else a new
// version added from it, kept loaded (keep_alive always). The model is
// enabled and follows its newest version either way, and its other
// versions are removed, with the blobs nothing else uses and the partial
// copies of killed adds (the cached builds stay). `added` says which.
StatusOr<storage::ModelVersion> AdoptModel(storage::ModelStore* store, const std::string& file,
                                           const std::string& name, bool* added);

}  // namespace aotid::daemon
