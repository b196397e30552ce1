// Which cached builds may be removed, and why: the one rule behind `aotid
// gc` (builds no stored version uses) and `aotid cache prune` (those, and
// builds that are damaged or were made for another machine). Callers say
// what the store still references; the store never deletes runtime's
// directories by rules of its own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "compile/build_cache.h"

namespace aotid::compile {

// A stored version, as the cache sees it: it needs builds of one model of
// one artifact.
struct CacheUser {
  std::string artifact;  // sha256 hex
  std::string package_model;
  std::string name;  // "model:version", shown by `aotid cache ls`
};

// An entry's state as `aotid cache ls` shows it.
enum class CacheState { kOk, kDamaged, kOtherMachine };
std::string_view CacheStateName(CacheState state);  // "ok", "damaged", "other-machine"

enum class PruneScope {
  kUnused,  // `aotid gc`: builds no stored version uses, whatever their state
  kStale,   // `aotid cache prune`: those, damaged builds, builds for another fingerprint
  kAll,     // `aotid cache prune --all`: every build
};

struct CacheVerdict {
  CacheListing entry;
  CacheState state = CacheState::kOk;
  std::vector<std::string> used_by;  // names of the users of the entry
  bool remove = false;
  std::string why;            // why it goes; empty when it stays
  bool artifact_used = true;  // some user has the entry's artifact
};

// One verdict per entry, in the order given. An entry is used when a user
// has its artifact and package model; an entry whose manifest cannot be
// read (its package model unknown) is used when a user has its artifact.
// `fingerprint` is this machine's (platform/hardware.h); kUnused removes by
// use alone and may be given "" (the states are then not meaningful).
// `others_may_use`: the cache is shared with other stores (build.cache_dir),
// so an entry no user here has is not removed for that (kAll still does).
std::vector<CacheVerdict> JudgeCacheEntries(const std::vector<CacheListing>& entries,
                                            const std::vector<CacheUser>& users,
                                            const std::string& fingerprint, PruneScope scope,
                                            bool others_may_use = false);

// Deletes the entry's directory and, when no user has its artifact, the
// artifact's directory if that is then empty. IOError when it cannot.
Status RemoveCacheEntry(const CacheVerdict& verdict);

}  // namespace aotid::compile
