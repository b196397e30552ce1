#include "daemon/reconciler.h"

#include "base/log.h"

namespace aotid::daemon {
namespace {

std::string Key(const storage::ModelVersion& v) { return v.model + ":" + std::to_string(v.version); }

struct LoadWork {
  uv_work_t req{};
  Reconciler* owner = nullptr;
  storage::ModelVersion version;
  runtime::CacheEntry entry;
  bool built_now = false;
  StatusOr<std::unique_ptr<runtime::LoadedModel>> result{Internal("not run")};
  std::function<void(LoadWork*)> done;
};

}  // namespace

Reconciler::Reconciler(uv_loop_t* loop, storage::ModelStore* store, const runtime::BuildCache* cache,
                       runtime::Builder* builder, ModelRegistry* registry, std::string fingerprint)
    : loop_(loop), store_(store), cache_(cache), builder_(builder), registry_(registry),
      fingerprint_(std::move(fingerprint)) {}

Status Reconciler::Reconcile() {
  if (stopping_) return Status::OK();
  ASSIGN_OR_RETURN(auto versions, store_->ListVersions());
  // The latest version of each model is the one served.
  std::map<std::string, storage::ModelVersion> desired;
  for (auto& v : versions) desired[v.model] = v;  // listed by name, then version ascending
  for (const auto& [name, v] : desired) Ensure(v);
  for (const auto& [name, served] : *registry_->All()) {
    if (!desired.count(name)) {
      LOG_INFO << "model " << name << " is no longer in the store; unloading";
      registry_->Remove(name);
    }
  }
  startup_pass_done_ = true;
  MaybeStartupDone();
  return Status::OK();
}

StatusOr<std::string> Reconciler::ResolveDevice(const storage::ModelVersion& v) const {
  const std::string& d = v.settings.device;
  if (d == "auto" || d == "cpu") return std::string("cpu");
  return FailedPrecondition("device '" + d + "' is not available on this machine");
}

void Reconciler::Ensure(const storage::ModelVersion& v) {
  auto current = registry_->Find(v.model);
  if (current && current->version == v.version) return;  // served, or work in flight/failed
  if (in_flight_.count(Key(v)) || failed_.count(Key(v))) return;

  auto device = ResolveDevice(v);
  if (!device.ok()) {
    failed_.insert(Key(v));
    Publish(v, ServeState::kFailed, device.status().message());
    Record(v, "build_failed", device.status().message());
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
  in_flight_.insert(Key(v));
  Publish(v, ServeState::kQueued, "queued for build");
  storage::BuildRecord rec{v.artifact, v.package_model, fingerprint_, key.device, storage::BuildState::kQueued, "",
                           0, 0};
  (void)store_->PutBuild(rec);

  runtime::BuildJob job;
  job.key = key;
  job.artifact_path = store_->BlobPath(v.artifact);
  job.on_start = [this, v, rec]() mutable {
    rec.state = storage::BuildState::kBuilding;
    rec.started_at_ms = storage::NowMs();
    (void)store_->PutBuild(rec);
    Record(v, "build_started", "compiling for " + rec.device + " on " + fingerprint_);
    Publish(v, ServeState::kBuilding, "building for " + rec.device);
  };
  job.on_done = [this, v, rec](const runtime::BuildResult& r) mutable {
    rec.finished_at_ms = storage::NowMs();
    if (!r.status.ok()) {
      in_flight_.erase(Key(v));
      failed_.insert(Key(v));
      rec.state = storage::BuildState::kFailed;
      rec.error = r.status.message();
      (void)store_->PutBuild(rec);
      LOG_ERROR << "build of " << Key(v) << " failed: " << r.status.message();
      Record(v, "build_failed", r.status.message());
      Publish(v, ServeState::kFailed, r.status.message());
      MaybeStartupDone();
      return;
    }
    rec.state = storage::BuildState::kReady;
    (void)store_->PutBuild(rec);
    Record(v, "build_ready", "built in " + std::to_string(r.duration_ms) + " ms");
    LOG_INFO << "build of " << Key(v) << " ready in " << r.duration_ms << " ms";
    in_flight_.erase(Key(v));
    if (!stopping_) StartLoad(v, r.entry, /*built_now=*/true);
  };
  builder_->Submit(std::move(job));
}

void Reconciler::StartLoad(const storage::ModelVersion& v, const runtime::CacheEntry& entry, bool built_now) {
  in_flight_.insert(Key(v));
  Publish(v, ServeState::kLoading, built_now ? "loading the new build" : "loading the cached build");
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
        self->in_flight_.erase(Key(v));
        if (status != 0 || !work->result.ok()) {
          std::string why = status != 0 ? "load cancelled" : work->result.status().message();
          LOG_ERROR << "loading " << Key(v) << " failed: " << why;
          self->failed_.insert(Key(v));
          self->Record(v, "load_failed", why);
          self->Publish(v, ServeState::kFailed, why);
        } else {
          std::shared_ptr<runtime::LoadedModel> model = std::move(work->result).value();
          std::string how = work->built_now ? "after build" : "from cache";
          LOG_INFO << "serving " << Key(v) << " on " << model->device() << " (" << how << ")";
          self->Record(v, "loaded", "loaded " + how + " on " + model->device());
          self->Publish(v, ServeState::kReady, "", std::move(model));
        }
        self->MaybeStartupDone();
      });
  if (rc != 0) {
    in_flight_.erase(Key(v));
    Publish(v, ServeState::kFailed, std::string("cannot queue load: ") + uv_strerror(rc));
    delete w;
  }
}

void Reconciler::Publish(const storage::ModelVersion& v, ServeState state, std::string message,
                         std::shared_ptr<runtime::LoadedModel> model) {
  // A newer version keeps serving while an older one's work finishes, and a
  // ready older version keeps serving until its successor is ready.
  auto current = registry_->Find(v.model);
  if (current && current->version > v.version) return;
  if (current && current->version < v.version && current->state == ServeState::kReady &&
      state != ServeState::kReady) {
    return;
  }
  ServedModel m;
  m.name = v.model;
  m.version = v.version;
  m.state = state;
  m.message = std::move(message);
  m.device = model ? model->device() : (current ? current->device : "");
  m.artifact = v.artifact;
  m.model = std::move(model);
  registry_->Put(std::move(m));
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
