#include "serving/model_registry.h"

namespace aotid::serving {

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

std::string_view TaskWords(std::string_view task) {
  return task == "generate" ? "text generation" : task == "embed" ? "embeddings" : "tensors";
}

std::shared_ptr<const ServedModel> ModelRegistry::Find(const std::string& name) const {
  auto snap = All();
  auto it = snap->find(name);
  if (it == snap->end() || it->second.empty()) return nullptr;
  for (auto v = it->second.rbegin(); v != it->second.rend(); ++v) {
    if (v->second->state == ServeState::kReady) return v->second;
  }
  return it->second.rbegin()->second;
}

std::shared_ptr<const ServedModel> ModelRegistry::Find(const std::string& name, int64_t version) const {
  auto snap = All();
  auto it = snap->find(name);
  if (it == snap->end()) return nullptr;
  auto v = it->second.find(version);
  return v == it->second.end() ? nullptr : v->second;
}

std::shared_ptr<const ModelRegistry::Snapshot> ModelRegistry::All() const {
  MutexLock lock(&mu_);
  return snapshot_;
}

void ModelRegistry::SetCatalog(Catalog catalog) {
  auto next = std::make_shared<const Catalog>(std::move(catalog));
  MutexLock lock(&mu_);
  catalog_ = std::move(next);
}

void ModelRegistry::SetResidency(std::shared_ptr<const ResidencyReport> report) {
  MutexLock lock(&mu_);
  residency_ = std::move(report);
}

std::shared_ptr<const ResidencyReport> ModelRegistry::GetResidency() const {
  MutexLock lock(&mu_);
  return residency_;
}

std::shared_ptr<const ModelRegistry::Catalog> ModelRegistry::GetCatalog() const {
  MutexLock lock(&mu_);
  return catalog_;
}

void ModelRegistry::Put(ServedModel m) {
  auto entry = std::make_shared<const ServedModel>(std::move(m));
  MutexLock lock(&mu_);
  auto next = std::make_shared<Snapshot>(*snapshot_);
  (*next)[entry->name][entry->version] = std::move(entry);
  snapshot_ = std::move(next);
}

void ModelRegistry::Remove(const std::string& name, int64_t version) {
  MutexLock lock(&mu_);
  auto it = snapshot_->find(name);
  if (it == snapshot_->end() || !it->second.count(version)) return;
  auto next = std::make_shared<Snapshot>(*snapshot_);
  auto& versions = (*next)[name];
  versions.erase(version);
  if (versions.empty()) next->erase(name);
  snapshot_ = std::move(next);
}

}  // namespace aotid::serving
