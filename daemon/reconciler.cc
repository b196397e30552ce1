#include "daemon/reconciler.h"

#include "base/log.h"
#include "runtime/batcher.h"

namespace aotid::daemon {
namespace {

std::string Name(const storage::ModelVersion& v) { return v.model + ":" + std::to_string(v.version); }

// Identifies one piece of work: the version as the store described it.
std::string WorkKey(const storage::ModelVersion& v) {
  const auto& s = v.settings;
  return Name(v) + "@" + v.artifact + "/" + v.package_model + "/" + s.device + "/" + (s.fallback_cpu ? "f" : "-") +
         "/" + std::to_string(s.num_runners) + "/" + std::to_string(s.max_batch_size) + "/" +
         std::to_string(s.max_batch_delay_us);
}

std::string BuildKeyString(const runtime::BuildKey& k) {
  return k.artifact + "/" + k.package_model + "/" + k.device + "/" + k.fingerprint;
}

struct LoadWork {
  uv_work_t req{};
  Reconciler* owner = nullptr;
  storage::ModelVersion version;
  runtime::CacheEntry entry;
  bool built_now = false;
  StatusOr<std::unique_ptr<runtime::LoadedModel>> result{Internal("not run")};
};

}  // namespace

Reconciler::Reconciler(uv_loop_t* loop, storage::ModelStore* store, const runtime::BuildCache* cache,
                       runtime::Builder* builder, ModelRegistry* registry, std::string fingerprint,
                       Metrics* metrics, int max_queued_requests)
    : loop_(loop), store_(store), cache_(cache), builder_(builder), registry_(registry),
      fingerprint_(std::move(fingerprint)), metrics_(metrics), max_queued_requests_(max_queued_requests) {}

std::shared_ptr<runtime::LoadedModel> Reconciler::MaybeBatch(const storage::ModelVersion& v,
                                                             std::shared_ptr<runtime::LoadedModel> model) {
  if (v.settings.max_batch_size <= 1) return model;
  if (Status ok = runtime::CanBatch(model->spec()); !ok.ok()) {
    LOG_WARNING << Name(v) << ": max_batch_size " << v.settings.max_batch_size << " ignored: " << ok.message();
    Record(v, "batching_off", ok.message());
    return model;
  }
  runtime::BatchOptions opts;
  opts.max_batch_size = v.settings.max_batch_size;
  opts.max_delay_us = v.settings.max_batch_delay_us;
  opts.max_queued = max_queued_requests_;
  opts.workers = v.settings.num_runners;
  Metrics* metrics = metrics_;
  std::string name = v.model;
  int64_t version = v.version;
  return std::make_shared<runtime::BatchingModel>(std::move(model), opts, [metrics, name, version](
                                                                            const runtime::BatchReport& r) {
    if (metrics) metrics->RecordBatch(name, version, r.rows, r.queue_seconds);
  });
}

Status Reconciler::Reconcile() {
  if (stopping_) return Status::OK();
  ASSIGN_OR_RETURN(auto models, store_->ListModels());
  stored_.clear();
  desired_.clear();
  for (const auto& m : models) {
    auto& versions = stored_[m.name];
    for (const auto& v : m.versions) versions[v.version] = v;
    if (versions.empty() || !m.enabled) continue;  // a disabled model wants nothing, at once (Retire)
    auto& want = desired_[m.name];
    switch (m.policy.kind) {
      case storage::VersionPolicy::kLatest: want.insert(versions.rbegin()->first); break;
      case storage::VersionPolicy::kAll:
        for (const auto& [n, v] : versions) want.insert(n);
        break;
      case storage::VersionPolicy::kPinned:
        if (versions.count(m.policy.pinned)) {
          want.insert(m.policy.pinned);
        } else {
          LOG_WARNING << "model " << m.name << " is pinned to version " << m.policy.pinned
                      << ", which the store does not have; serving none";
        }
        break;
    }
  }

  ModelRegistry::Catalog catalog;
  for (const auto& m : models) {
    for (const auto& v : m.versions) {
      catalog.push_back({m.name, v.version, m.enabled, IsDesired(m.name, v.version),
                         storage::FormatVersionPolicy(m.policy)});
    }
  }
  registry_->SetCatalog(std::move(catalog));

  for (const auto& [name, want] : desired_) {
    for (int64_t version : want) Ensure(stored_[name][version]);
  }
  auto served = registry_->All();
  for (const auto& [name, versions] : *served) Retire(name);
  startup_pass_done_ = true;
  MaybeStartupDone();
  return Status::OK();
}

bool Reconciler::IsCurrent(const storage::ModelVersion& v) const {
  auto m = stored_.find(v.model);
  if (m == stored_.end()) return false;
  auto it = m->second.find(v.version);
  return it != m->second.end() && it->second.artifact == v.artifact && it->second.settings == v.settings;
}

bool Reconciler::IsDesired(const std::string& name, int64_t version) const {
  auto it = desired_.find(name);
  return it != desired_.end() && it->second.count(version);
}

void Reconciler::Retire(const std::string& name) {
  auto served = registry_->All();
  auto it = served->find(name);
  if (it == served->end()) return;
  bool wanted_ready = false;
  for (const auto& [version, sm] : it->second) {
    wanted_ready |= IsDesired(name, version) && sm->state == ServeState::kReady;
  }
  for (const auto& [version, sm] : it->second) {
    auto m = stored_.find(name);
    bool in_store = m != stored_.end() && m->second.count(version);
    if (!in_store) {
      LOG_INFO << "unloading " << name << ":" << version << ": removed from the store";
      registry_->Remove(name, version);
    } else if (!desired_.count(name)) {
      LOG_INFO << "unloading " << name << ":" << version << ": the model is disabled";
      registry_->Remove(name, version);
    } else if (!IsDesired(name, version) && (wanted_ready || sm->state != ServeState::kReady)) {
      LOG_INFO << "unloading " << name << ":" << version << ": its version policy no longer serves it";
      registry_->Remove(name, version);
    }
  }
}

StatusOr<std::string> Reconciler::ResolveDevice(const storage::ModelVersion& v) const {
  const std::string& d = v.settings.device;
  if (d == "auto" || d == "cpu") return std::string("cpu");
  if (v.settings.fallback_cpu) return std::string("cpu");
  return FailedPrecondition("device '" + d + "' is not available on this machine and fallback_cpu is off");
}

void Reconciler::Ensure(const storage::ModelVersion& v) {
  auto current = registry_->Find(v.model, v.version);
  if (current && current->artifact == v.artifact && current->settings == v.settings) return;
  std::string work = WorkKey(v);
  if (in_flight_.count(work) || failed_.count(work)) return;
  if (current && current->state == ServeState::kReady) {
    LOG_INFO << "reloading " << Name(v) << " with its new settings";
    Record(v, "reloading", "settings changed; the loaded model serves until the new one is ready");
  }

  auto device = ResolveDevice(v);
  if (!device.ok()) {
    failed_.insert(work);
    Record(v, "build_failed", device.status().message());
    Publish(v, ServeState::kFailed, device.status().message());
    return;
  }
  runtime::BuildKey key{v.artifact, v.package_model, *device, fingerprint_};
  auto entry = cache_->Lookup(key);
  if (entry.ok()) {
    StartLoad(v, *entry, /*built_now=*/false);
    return;
  }
  if (entry.status().code() == StatusCode::kCorruption) {
    LOG_WARNING << entry.status().message() << "; rebuilding";
    Record(v, "cache_invalid", entry.status().message() + "; rebuilding");
  }
  StartBuild(v, key);
}

void Reconciler::StartBuild(const storage::ModelVersion& v, const runtime::BuildKey& key) {
  in_flight_.insert(WorkKey(v));
  Publish(v, ServeState::kQueued, "queued for build");
  Record(v, "build_queued", "queued for a build for " + key.device);
  std::string bkey = BuildKeyString(key);
  auto [waiting, first] = builds_.try_emplace(bkey);
  waiting->second.push_back(v);
  if (!first) return;  // another version with the same artifact is building it

  auto rec = std::make_shared<storage::BuildRecord>(
      storage::BuildRecord{v.artifact, v.package_model, fingerprint_, key.device, storage::BuildState::kQueued, "", 0, 0});
  (void)store_->PutBuild(*rec);

  runtime::BuildJob job;
  job.key = key;
  job.artifact_path = store_->BlobPath(v.artifact);
  job.on_start = [this, rec, bkey]() {
    rec->state = storage::BuildState::kBuilding;
    rec->started_at_ms = storage::NowMs();
    (void)store_->PutBuild(*rec);
    for (const auto& w : builds_[bkey]) {
      Record(w, "build_started", "compiling for " + rec->device + " on " + fingerprint_);
      Publish(w, ServeState::kBuilding, "building for " + rec->device);
    }
  };
  job.on_done = [this, rec, bkey](const runtime::BuildResult& r) {
    std::vector<storage::ModelVersion> waiters = std::move(builds_[bkey]);
    builds_.erase(bkey);
    rec->finished_at_ms = storage::NowMs();
    rec->state = r.status.ok() ? storage::BuildState::kReady : storage::BuildState::kFailed;
    rec->error = r.status.ok() ? "" : r.status.message();
    (void)store_->PutBuild(*rec);
    if (metrics_) metrics_->RecordBuild(r.status.ok(), static_cast<double>(r.duration_ms) / 1000);
    if (r.status.ok()) {
      LOG_INFO << "build of " << rec->artifact.substr(0, 12) << " for " << rec->device << " ready in "
               << r.duration_ms << " ms";
    } else {
      LOG_ERROR << "build of " << rec->artifact.substr(0, 12) << " failed: " << r.status.message();
    }
    for (const auto& w : waiters) {
      in_flight_.erase(WorkKey(w));
      if (!r.status.ok()) {
        failed_.insert(WorkKey(w));
        Record(w, "build_failed", r.status.message());
        Publish(w, ServeState::kFailed, r.status.message());
        continue;
      }
      Record(w, "build_ready", "built in " + std::to_string(r.duration_ms) + " ms");
      if (!stopping_ && IsCurrent(w)) StartLoad(w, r.entry, /*built_now=*/true);
    }
    MaybeStartupDone();
  };
  builder_->Submit(std::move(job));
}

void Reconciler::StartLoad(const storage::ModelVersion& v, const runtime::CacheEntry& entry, bool built_now) {
  in_flight_.insert(WorkKey(v));
  Publish(v, ServeState::kLoading, built_now ? "loading the new build" : "loading the cached build");
  if (!built_now) Record(v, "load_started", "loading the cached build for " + entry.dir.substr(entry.dir.rfind('/') + 1));
  auto* w = new LoadWork;
  w->req.data = w;
  w->owner = this;
  w->version = v;
  w->entry = entry;
  w->built_now = built_now;
  int rc = uv_queue_work(
      loop_, &w->req,
      [](uv_work_t* req) {  // thread pool: no store, no registry
        auto* work = static_cast<LoadWork*>(req->data);
        runtime::LoadOptions opts;
        opts.package_model = work->version.package_model;
        opts.device = "cpu";
        opts.num_runners = work->version.settings.num_runners;
        work->result = runtime::LoadAotiPackage(work->entry, opts);
      },
      [](uv_work_t* req, int status) {  // loop thread
        std::unique_ptr<LoadWork> work(static_cast<LoadWork*>(req->data));
        Reconciler* self = work->owner;
        const auto& v = work->version;
        self->in_flight_.erase(WorkKey(v));
        if (status != 0 || !work->result.ok()) {
          std::string why = status != 0 ? "load cancelled" : work->result.status().message();
          LOG_ERROR << "loading " << Name(v) << " failed: " << why;
          self->failed_.insert(WorkKey(v));
          self->Record(v, "load_failed", why);
          self->Publish(v, ServeState::kFailed, why);
        } else if (!self->IsCurrent(v)) {
          LOG_INFO << "dropping the load of " << Name(v) << ": the store changed it meanwhile";
        } else {
          std::shared_ptr<runtime::LoadedModel> model = self->MaybeBatch(v, std::move(work->result).value());
          std::string how = work->built_now ? "after build" : "from cache";
          LOG_INFO << "serving " << Name(v) << " on " << model->device() << " (" << how << ", "
                   << v.settings.num_runners << " runner" << (v.settings.num_runners == 1 ? "" : "s")
                   << (dynamic_cast<runtime::BatchingModel*>(model.get())
                           ? ", batching up to " + std::to_string(v.settings.max_batch_size) + " rows"
                           : std::string()) << ")";
          self->Record(v, "loaded", "loaded " + how + " on " + model->device());
          self->Publish(v, ServeState::kReady, "", std::move(model));
        }
        self->MaybeStartupDone();
      });
  if (rc != 0) {
    in_flight_.erase(WorkKey(v));
    Publish(v, ServeState::kFailed, std::string("cannot queue load: ") + uv_strerror(rc));
    delete w;
  }
}

void Reconciler::Publish(const storage::ModelVersion& v, ServeState state, std::string message,
                         std::shared_ptr<runtime::LoadedModel> model) {
  if (!IsCurrent(v)) return;  // removed or changed since this work began
  auto current = registry_->Find(v.model, v.version);
  // A ready model keeps serving through a reload, and through its failure.
  if (current && current->state == ServeState::kReady && state != ServeState::kReady) return;
  if (!current && !IsDesired(v.model, v.version)) return;
  ServedModel m;
  m.name = v.model;
  m.version = v.version;
  m.state = state;
  m.message = std::move(message);
  m.device = model ? model->device() : (current ? current->device : "");
  m.artifact = v.artifact;
  m.settings = v.settings;
  m.model = std::move(model);
  registry_->Put(std::move(m));
  if (state == ServeState::kReady || state == ServeState::kFailed) Retire(v.model);
}

void Reconciler::Record(const storage::ModelVersion& v, const std::string& kind, const std::string& message) {
  Status s = store_->AppendEvent(v.model, v.version, kind, message);
  if (!s.ok()) LOG_WARNING << "cannot record event: " << s.message();
}

void Reconciler::MaybeStartupDone() {
  if (startup_pass_done_ && in_flight_.empty() && !registry_->startup_done()) {
    registry_->SetStartupDone();
    LOG_INFO << "startup complete: every model is ready or failed";
  }
}

}  // namespace aotid::daemon
