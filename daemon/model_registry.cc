#include "daemon/model_registry.h"

namespace aotid::daemon {

std::string_view ServeStateName(ServeState s) {
  switch (s) {
    case ServeState::kQueued: return "queued";
    case ServeState::kBuilding: return "building";
    case ServeState::kLoading: return "loading";
    case ServeState::kReady: return "ready";
    case ServeState::kFailed: return "failed";
  }
  return "unknown";
}

std::shared_ptr<const ServedModel> ModelRegistry::Find(const std::string& name) const {
  auto snap = All();
  auto it = snap->find(name);
  return it == snap->end() ? nullptr : it->second;
}

std::shared_ptr<const ModelRegistry::Snapshot> ModelRegistry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void ModelRegistry::Put(ServedModel m) {
  auto entry = std::make_shared<const ServedModel>(std::move(m));
  std::lock_guard<std::mutex> lock(mu_);
  auto next = std::make_shared<Snapshot>(*snapshot_);
  (*next)[entry->name] = std::move(entry);
  snapshot_ = std::move(next);
}

void ModelRegistry::Remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto next = std::make_shared<Snapshot>(*snapshot_);
  next->erase(name);
  snapshot_ = std::move(next);
}

}  // namespace aotid::daemon
