// What the data plane serves: for each model name, the versions being
// served, each an immutable snapshot. Writers (the control loop) replace
// entries; readers (HTTP threads) take a shared_ptr, so a request in flight
// keeps the model it started with even when a newer version, or the same
// version with new settings, replaces it, or when it is removed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "model/loaded_model.h"
#include "serving/embeddings.h"
#include "serving/generate.h"
#include "serving/residency_report.h"
#include "storage/model_store.h"

namespace aotid::serving {

// Where a served version is on its way to answering requests. Differs from a
// build's state: a cached build still has to be loaded.
enum class ServeState { kQueued, kBuilding, kLoading, kReady, kFailed };
std::string_view ServeStateName(ServeState s);  // "queued", "building", ...

struct ServedModel {
  std::string name;
  int64_t version = 0;
  ServeState state = ServeState::kQueued;
  std::string message;  // the error when failed; what is happening otherwise
  std::string device;
  std::string device_note;   // why it runs where it runs, when not where asked (CPU fallback)
  std::string package_json;  // the build's package.json: the package's metadata
  std::string artifact;
  std::string build_key;              // the build it runs (compile::BuildKey::ToString()); "" until loaded
  int64_t created_at_ms = 0;          // when the version was added to the store
  storage::VersionSettings settings;  // what `model` was loaded with
  std::shared_ptr<model::LoadedModel> model;  // set when ready
  // Set for a language model (its build has a generate spec): the token
  // loop, and the turn-taking every run of this model goes through.
  std::shared_ptr<const Generator> generator;
  // Set for an embedding model (its build has an embed spec): its
  // tokenizer, truncation and vector size (serving/embeddings.h).
  std::shared_ptr<const EmbedSpec> embed;
  // The kind of the package's weights (package::WeightsKind: "float32",
  // "int8"); "" when the package does not say.
  std::string weights;
};

// What a model is for, in the words the metadata route and `aotid ls`
// use: "text generation" for a package's "generate" task (a language
// model), "embeddings" for "embed", "tensors" for neither.
std::string_view TaskWords(std::string_view task);

// Every version in the store, as of the last reconcile: what the
// repository index lists, served or not.
struct CatalogEntry {
  std::string name;
  int64_t version = 0;
  bool enabled = true;
  bool wanted = false;  // its model's version policy serves it
  std::string policy;   // "latest", "all", "pinned:3"
};

class ModelRegistry {
 public:
  using Catalog = std::vector<CatalogEntry>;
  using Versions = std::map<int64_t, std::shared_ptr<const ServedModel>>;
  using Snapshot = std::map<std::string, Versions>;

  // The version a request without one goes to: the newest ready version,
  // else the newest of any state (so the caller can say why it is not
  // ready). nullptr when no version of the model is served.
  std::shared_ptr<const ServedModel> Find(const std::string& name) const EXCLUDES(mu_);
  // Exactly that version, or nullptr.
  std::shared_ptr<const ServedModel> Find(const std::string& name, int64_t version) const EXCLUDES(mu_);
  std::shared_ptr<const Snapshot> All() const EXCLUDES(mu_);

  void SetCatalog(Catalog catalog) EXCLUDES(mu_);
  std::shared_ptr<const Catalog> GetCatalog() const EXCLUDES(mu_);

  void Put(ServedModel m) EXCLUDES(mu_);
  void Remove(const std::string& name, int64_t version) EXCLUDES(mu_);

  // What is resident, as the control loop last said (control/residency.h);
  // nullptr where nothing manages residency.
  void SetResidency(std::shared_ptr<const ResidencyReport> report) EXCLUDES(mu_);
  std::shared_ptr<const ResidencyReport> GetResidency() const EXCLUDES(mu_);

  // Server readiness: set by the control loop once every model present at
  // start has been built and loaded, or has failed.
  void SetStartupDone() { startup_done_.store(true); }
  bool startup_done() const { return startup_done_.load(); }

 private:
  mutable Mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_ GUARDED_BY(mu_) = std::make_shared<Snapshot>();
  std::shared_ptr<const Catalog> catalog_ GUARDED_BY(mu_) = std::make_shared<Catalog>();
  std::shared_ptr<const ResidencyReport> residency_ GUARDED_BY(mu_);
  std::atomic<bool> startup_done_{false};
};

}  // namespace aotid::serving
