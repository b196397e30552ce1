#include "compile/cache_policy.h"

#include <unistd.h>

#include <cerrno>

#include "base/fs.h"

namespace aotid::compile {

std::string_view CacheStateName(CacheState state) {
  switch (state) {
    case CacheState::kOk: return "ok";
    case CacheState::kDamaged: return "damaged";
    case CacheState::kOtherMachine: return "other-machine";
  }
  return "unknown";
}

std::vector<CacheVerdict> JudgeCacheEntries(const std::vector<CacheListing>& entries,
                                            const std::vector<CacheUser>& users,
                                            const std::string& fingerprint, PruneScope scope,
                                            bool others_may_use) {
  std::vector<CacheVerdict> out;
  out.reserve(entries.size());
  for (const CacheListing& e : entries) {
    CacheVerdict v;
    v.entry = e;
    v.artifact_used = false;
    for (const CacheUser& u : users) {
      if (u.artifact != e.key.artifact) continue;
      v.artifact_used = true;
      if (e.key.package_model.empty() || u.package_model == e.key.package_model) v.used_by.push_back(u.name);
    }
    v.state = !e.status.ok()                     ? CacheState::kDamaged
              : e.key.fingerprint != fingerprint ? CacheState::kOtherMachine
                                                 : CacheState::kOk;
    const bool used = !v.used_by.empty();
    const std::string unused = "no stored version uses it";
    switch (scope) {
      case PruneScope::kUnused:
        if (!used && !others_may_use) v.why = unused;
        break;
      case PruneScope::kStale:
      case PruneScope::kAll:
        if (v.state == CacheState::kDamaged) {
          v.why = e.status.message();
        } else if (v.state == CacheState::kOtherMachine) {
          v.why = "built for " + e.key.fingerprint + ", this machine is " + fingerprint;
        } else if (!used && !others_may_use) {
          v.why = unused;
        } else if (scope == PruneScope::kAll) {
          v.why = "--all";
        }
        break;
    }
    v.remove = !v.why.empty();
    out.push_back(std::move(v));
  }
  return out;
}

Status RemoveCacheEntry(const CacheVerdict& verdict) {
  const std::string& dir = verdict.entry.dir;
  RETURN_IF_ERROR(fs::RemoveAll(dir));
  if (verdict.artifact_used) return Status::OK();
  // The artifact's folder goes with its last entry; rmdir leaves it when
  // anything else is in it.
  std::string parent = dir.substr(0, dir.rfind('/'));
  if (::rmdir(parent.c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT) {
    return ErrnoError("remove " + parent, errno);
  }
  return Status::OK();
}

}  // namespace aotid::compile
