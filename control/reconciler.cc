#include "control/reconciler.h"

#include <chrono>

#include "base/log.h"
#include "package/aoti_metadata.h"
#include "serving/batcher.h"
#include "runtime/thread_choice.h"

namespace aotid::control {
namespace {

std::string Name(const storage::ModelVersion& v) { return v.model + ":" + std::to_string(v.version); }

// Identifies one piece of work: the version as the store described it.
std::string WorkKey(const storage::ModelVersion& v) {
  const auto& s = v.settings;
  return Name(v) + "@" + v.artifact + "/" + v.package_model + "/" + s.device + "/" + (s.fallback_cpu ? "f" : "-") +
         "/" + std::to_string(s.num_runners) + "/" + std::to_string(s.max_batch_size) + "/" +
         std::to_string(s.max_batch_delay_us) + "/" + std::to_string(s.threads) + "/" + s.inductor_options;
}

std::string BuildKeyString(const runtime::BuildKey& k) {
  return k.artifact + "/" + k.package_model + "/" + k.device + "/" + k.fingerprint + "/" + k.options;
}

struct LoadWork {
  uv_work_t req{};
  Reconciler* owner = nullptr;
  storage::ModelVersion version;
  runtime::CacheEntry entry;
  bool built_now = false;
  std::string device;
  std::string note;
  int threads = 0;
  std::string threads_note;  // how auto threads were chosen
  StatusOr<std::unique_ptr<runtime::LoadedModel>> result{Internal("not run")};
};

int64_t SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Reconciler::Reconciler(uv_loop_t* loop, storage::ModelStore* store, const runtime::BuildCache* cache,
                       runtime::Builder* builder, serving::ModelRegistry* registry, ReconcilerOptions options,
                       serving::Metrics* metrics)
    : loop_(loop), store_(store), cache_(cache), builder_(builder), registry_(registry),
      options_(std::move(options)), metrics_(metrics) {
  uv_timer_init(loop_, &retry_timer_);
  uv_timer_init(loop_, &progress_timer_);
  retry_timer_.data = progress_timer_.data = this;
  timers_open_ = true;
  uv_timer_start(&progress_timer_, [](uv_timer_t* t) { static_cast<Reconciler*>(t->data)->UpdateProgress(); },
                 1000, 1000);
}

Reconciler::~Reconciler() { Stop(); }

void Reconciler::Stop() {
  stopping_ = true;
  if (!timers_open_) return;
  timers_open_ = false;
  uv_close(reinterpret_cast<uv_handle_t*>(&retry_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&progress_timer_), nullptr);
}

std::shared_ptr<runtime::LoadedModel> Reconciler::MaybeBatch(const storage::ModelVersion& v,
                                                             std::shared_ptr<runtime::LoadedModel> model) {
  if (v.settings.max_batch_size <= 1) return model;
  if (Status ok = serving::CanBatch(model->spec()); !ok.ok()) {
    LOG_WARNING << Name(v) << ": max_batch_size " << v.settings.max_batch_size << " ignored: " << ok.message();
    Record(v, "batching_off", ok.message());
    return model;
  }
  serving::BatchOptions opts;
  opts.max_batch_size = v.settings.max_batch_size;
  opts.max_delay_us = v.settings.max_batch_delay_us;
  opts.max_queued = options_.max_queued_requests;
  opts.workers = v.settings.num_runners;
  serving::Metrics* metrics = metrics_;
  std::string name = v.model;
  int64_t version = v.version;
  return std::make_shared<serving::BatchingModel>(std::move(model), opts, [metrics, name, version](
                                                                            const serving::BatchReport& r) {
    if (metrics && r.rows > 0) metrics->RecordBatch(name, version, r.rows, r.queue_seconds);
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

  serving::ModelRegistry::Catalog catalog;
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
  CancelUnwanted();
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
    wanted_ready |= IsDesired(name, version) && sm->state == serving::ServeState::kReady;
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
    } else if (!IsDesired(name, version) && (wanted_ready || sm->state != serving::ServeState::kReady)) {
      LOG_INFO << "unloading " << name << ":" << version << ": its version policy no longer serves it";
      registry_->Remove(name, version);
    }
  }
}

StatusOr<Reconciler::DevicePlan> Reconciler::PlanDevice(const storage::ModelVersion& v) const {
  const runtime::HardwareInfo& hw = options_.hardware;
  const std::string& asked = v.settings.device;
  if (v.kind != package::PackageKind::kExportedProgram) {
    // A compiled or source package is for the device it was compiled for.
    ASSIGN_OR_RETURN(package::AotiMetadata md, package::ReadAotiMetadata(store_->BlobPath(v.artifact), v.package_model));
    if (asked != "auto" && asked != md.device_key) {
      return FailedPrecondition("package was compiled for device '" + md.device_key + "', the version asks for '" +
                                asked + "'; a compiled package cannot be rebuilt for another device");
    }
    if (Status ok = runtime::DeviceAvailable(hw, md.device_key); !ok.ok()) {
      return FailedPrecondition("package was compiled for device '" + md.device_key + "': " + ok.message() +
                                " (a compiled package cannot fall back to the CPU; add its exported program instead)");
    }
    return DevicePlan{md.device_key, ""};
  }
  std::string want = asked == "auto" ? runtime::AutoDevice(hw) : asked;
  if (auto it = fell_back_.find(WorkKey(v)); it != fell_back_.end()) return DevicePlan{"cpu", it->second};
  Status ok = runtime::DeviceAvailable(hw, want);
  if (ok.ok()) return DevicePlan{want, ""};
  if (!v.settings.fallback_cpu) return FailedPrecondition(ok.message() + ", and fallback_cpu is off");
  return DevicePlan{"cpu", ok.message() + "; running on the CPU (fallback_cpu)"};
}

runtime::BuildKey Reconciler::KeyFor(const storage::ModelVersion& v, const std::string& device) const {
  // Inductor options only shape builds of exported programs.
  bool compiles = v.kind == package::PackageKind::kExportedProgram;
  return runtime::BuildKey{v.artifact, v.package_model, device, fingerprint_,
                           compiles ? v.settings.inductor_options : ""};
}

void Reconciler::Ensure(const storage::ModelVersion& v) {
  auto current = registry_->Find(v.model, v.version);
  // Serving as the store says. Anything else (in flight, failed, waiting
  // for a retry) is told apart by the work sets below.
  if (current && current->artifact == v.artifact && current->settings == v.settings &&
      current->state == serving::ServeState::kReady) {
    return;
  }
  std::string work = WorkKey(v);
  if (in_flight_.count(work) || failed_.count(work)) return;
  if (auto r = retries_.find(work); r != retries_.end() && r->second.at_ms > SteadyNowMs()) return;
  if (current && current->state == serving::ServeState::kReady) {
    LOG_INFO << "reloading " << Name(v) << " with its new settings";
    Record(v, "reloading", "settings changed; the loaded model serves until the new one is ready");
  }

  auto plan = PlanDevice(v);
  if (!plan.ok()) {
    failed_.insert(work);
    // A build row, so `aotid ls` and `show` say it failed here and why.
    (void)store_->PutBuild({v.artifact, v.package_model, fingerprint_, v.settings.device, storage::BuildState::kFailed,
                            plan.status().message(), storage::NowMs(), storage::NowMs(), v.settings.inductor_options,
                            "", 0});
    LOG_ERROR << Name(v) << ": " << plan.status().message();
    Record(v, "build_failed", plan.status().message());
    Publish(v, serving::ServeState::kFailed, plan.status().message());
    return;
  }
  if (!plan->note.empty() && !fell_back_.count(work)) {
    LOG_WARNING << Name(v) << ": " << plan->note;
    Record(v, "device_fallback", plan->note);
    fell_back_[work] = plan->note;
  }
  runtime::BuildKey key = KeyFor(v, plan->device);
  auto entry = cache_->Lookup(key);
  if (entry.ok()) {
    StartLoad(v, *entry, /*built_now=*/false, *plan);
    return;
  }
  if (entry.status().code() == StatusCode::kCorruption) {
    LOG_WARNING << entry.status().message() << "; rebuilding";
    Record(v, "cache_invalid", entry.status().message() + "; rebuilding");
  }
  StartBuild(v, key);
}

bool Reconciler::FallBack(const storage::ModelVersion& v, const std::string& device, const std::string& why) {
  if (device == "cpu" || !v.settings.fallback_cpu || v.kind != package::PackageKind::kExportedProgram) return false;
  std::string note = "device '" + device + "' failed (" + why + "); running on the CPU (fallback_cpu)";
  LOG_WARNING << Name(v) << ": " << note;
  Record(v, "device_fallback", note);
  fell_back_[WorkKey(v)] = note;
  if (!stopping_ && IsCurrent(v)) Ensure(v);
  return true;
}

void Reconciler::StartBuild(const storage::ModelVersion& v, const runtime::BuildKey& key) {
  in_flight_.insert(WorkKey(v));
  Publish(v, serving::ServeState::kQueued, "queued for a build for " + key.device);
  Record(v, "build_queued", "queued for a build for " + key.device);
  std::string bkey = BuildKeyString(key);
  auto [pending, first] = builds_.try_emplace(bkey);
  pending->second.waiters.push_back(v);
  if (!first) return;  // another version with the same artifact is building it

  int attempts = 1;
  if (auto r = retries_.find(WorkKey(v)); r != retries_.end()) attempts = r->second.attempts + 1;
  auto rec = std::make_shared<storage::BuildRecord>();
  *rec = storage::BuildRecord{v.artifact, v.package_model, fingerprint_, key.device, storage::BuildState::kQueued,
                              "", 0, 0, key.options, "queued", attempts};
  (void)store_->PutBuild(*rec);
  pending->second.key = key;
  pending->second.record = rec;

  runtime::BuildJob job;
  job.key = key;
  job.kind = v.kind;
  job.artifact_path = store_->BlobPath(v.artifact);
  job.on_start = [this, rec, bkey]() {
    rec->state = storage::BuildState::kBuilding;
    rec->started_at_ms = storage::NowMs();
    rec->progress = "started";
    (void)store_->PutBuild(*rec);
    for (const auto& w : builds_[bkey].waiters) {
      Record(w, "build_started", "compiling for " + rec->device + " on " + fingerprint_ +
                                     (rec->attempts > 1 ? " (attempt " + std::to_string(rec->attempts) + ")" : ""));
      Publish(w, serving::ServeState::kBuilding, "building for " + rec->device);
    }
  };
  job.on_done = [this, bkey](const runtime::BuildResult& r) { BuildDone(bkey, r); };
  builder_->Submit(std::move(job));
}

void Reconciler::BuildDone(const std::string& bkey, const runtime::BuildResult& r) {
  PendingBuild done = std::move(builds_[bkey]);
  builds_.erase(bkey);
  auto rec = done.record;
  rec->finished_at_ms = storage::NowMs();
  rec->state = r.status.ok() ? storage::BuildState::kReady : storage::BuildState::kFailed;
  rec->error = r.status.ok() ? "" : r.status.message();
  rec->progress.clear();
  (void)store_->PutBuild(*rec);
  if (metrics_ && !r.cancelled) metrics_->RecordBuild(r.status.ok(), static_cast<double>(r.duration_ms) / 1000);
  if (r.status.ok()) {
    LOG_INFO << "build of " << rec->artifact.substr(0, 12) << " for " << rec->device << " ready in " << r.duration_ms
             << " ms";
  } else if (r.cancelled) {
    LOG_INFO << "build of " << rec->artifact.substr(0, 12) << " cancelled: no served version needs it";
  } else {
    LOG_ERROR << "build of " << rec->artifact.substr(0, 12) << " failed: " << r.status.message();
  }
  for (const auto& w : done.waiters) {
    std::string work = WorkKey(w);
    in_flight_.erase(work);
    if (r.cancelled) {
      if (IsCurrent(w)) Record(w, "build_cancelled", "the build was cancelled");
      continue;
    }
    if (r.status.ok()) {
      retries_.erase(work);
      Record(w, "build_ready", "built in " + std::to_string(r.duration_ms) + " ms");
      if (!stopping_ && IsCurrent(w)) {
        auto plan = PlanDevice(w);
        StartLoad(w, r.entry, /*built_now=*/true, plan.ok() ? *plan : DevicePlan{rec->device, ""});
      }
      continue;
    }
    Record(w, "build_failed", r.status.message());
    if (r.permanent && FallBack(w, rec->device, r.status.message())) continue;
    if (!r.permanent && rec->attempts < options_.max_attempts) {
      int64_t wait_ms = static_cast<int64_t>(options_.retry_initial_ms) << std::min(rec->attempts - 1, 16);
      retries_[work] = Retry{rec->attempts, SteadyNowMs() + wait_ms};
      std::string msg = "build failed (attempt " + std::to_string(rec->attempts) + " of " +
                        std::to_string(options_.max_attempts) + "); retrying in " +
                        std::to_string((wait_ms + 999) / 1000) + " s: " + r.status.message();
      Record(w, "build_retry", msg);
      Publish(w, serving::ServeState::kQueued, msg);
      ScheduleRetry(retries_[work].at_ms);
      continue;
    }
    retries_.erase(work);
    failed_.insert(work);
    Publish(w, serving::ServeState::kFailed, r.status.message());
  }
  MaybeStartupDone();
}

void Reconciler::ScheduleRetry(int64_t at_ms) {
  if (!timers_open_ || stopping_) return;
  uint64_t due = uv_timer_get_due_in(&retry_timer_);
  int64_t wait = std::max<int64_t>(0, at_ms - SteadyNowMs());
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&retry_timer_)) && due <= static_cast<uint64_t>(wait)) return;
  uv_timer_start(&retry_timer_, [](uv_timer_t* t) {
    auto* self = static_cast<Reconciler*>(t->data);
    int64_t next = 0;
    for (const auto& [work, r] : self->retries_) {
      if (r.at_ms > SteadyNowMs() && (next == 0 || r.at_ms < next)) next = r.at_ms;
    }
    if (Status s = self->Reconcile(); !s.ok()) LOG_WARNING << "reconcile for a retry: " << s.message();
    if (next != 0) self->ScheduleRetry(next);
  }, static_cast<uint64_t>(wait) + 1, 0);
}

void Reconciler::CancelUnwanted() {
  for (const auto& [bkey, pending] : builds_) {
    bool needed = false;
    for (const auto& w : pending.waiters) needed |= IsCurrent(w) && IsDesired(w.model, w.version);
    if (!needed && builder_->Cancel(pending.key)) {
      LOG_INFO << "cancelling the build of " << pending.key.artifact.substr(0, 12) << " for " << pending.key.device
               << ": no version the store wants needs it";
    }
  }
}

void Reconciler::UpdateProgress() {
  for (auto& [bkey, pending] : builds_) {
    if (!pending.record || pending.record->state != storage::BuildState::kBuilding) continue;
    std::string p = builder_->Progress(pending.key);
    if (p.empty() || p == pending.record->progress) continue;
    pending.record->progress = p;
    (void)store_->PutBuild(*pending.record);
    for (const auto& w : pending.waiters) Publish(w, serving::ServeState::kBuilding, "building for " + pending.key.device + ": " + p);
  }
}

void Reconciler::StartLoad(const storage::ModelVersion& v, const runtime::CacheEntry& entry, bool built_now,
                           const DevicePlan& plan) {
  in_flight_.insert(WorkKey(v));
  Publish(v, serving::ServeState::kLoading, built_now ? "loading the new build" : "loading the cached build");
  if (!built_now) Record(v, "load_started", "loading the cached build for " + entry.dir.substr(entry.dir.rfind('/') + 1));
  auto* w = new LoadWork;
  w->req.data = w;
  w->owner = this;
  w->version = v;
  w->entry = entry;
  w->built_now = built_now;
  w->device = plan.device;
  w->note = plan.note;
  w->threads = runtime::ThreadsPerRunner(v.settings.threads, v.settings.num_runners, options_.hardware.cores);
  int rc = uv_queue_work(
      loop_, &w->req,
      [](uv_work_t* req) {  // thread pool: no store, no registry
        auto* work = static_cast<LoadWork*>(req->data);
        runtime::LoadOptions opts;
        opts.device = work->device;
        opts.num_runners = work->version.settings.num_runners;
        opts.threads = work->threads;
        work->result = runtime::LoadCompiledModel(work->entry, opts);
        // threads = 0 (auto) on the CPU: time the model both ways and keep
        // the faster (runtime/thread_choice.h).
        const auto& settings = work->version.settings;
        if (work->result.ok() && settings.threads == 0 && work->threads > 1 && work->device == "cpu") {
          int64_t batch = settings.max_batch_size > 1 ? settings.max_batch_size : 1;
          runtime::ThreadChoice choice = runtime::ChooseThreads(**work->result, work->threads, batch);
          work->threads = choice.threads;
          work->threads_note = choice.note;
        }
      },
      [](uv_work_t* req, int status) {  // loop thread
        std::unique_ptr<LoadWork> work(static_cast<LoadWork*>(req->data));
        Reconciler* self = work->owner;
        const auto& v = work->version;
        self->in_flight_.erase(WorkKey(v));
        if (status != 0 || !work->result.ok()) {
          std::string why = status != 0 ? "load cancelled" : work->result.status().message();
          LOG_ERROR << "loading " << Name(v) << " failed: " << why;
          self->Record(v, "load_failed", why);
          if (!self->FallBack(v, work->device, why)) {
            self->failed_.insert(WorkKey(v));
            self->Publish(v, serving::ServeState::kFailed, why);
          }
        } else if (!self->IsCurrent(v)) {
          LOG_INFO << "dropping the load of " << Name(v) << ": the store changed it meanwhile";
        } else {
          std::shared_ptr<runtime::LoadedModel> model = self->MaybeBatch(v, std::move(work->result).value());
          std::string how = work->built_now ? "after build" : "from cache";
          LOG_INFO << "serving " << Name(v) << " on " << model->device() << " (" << how << ", "
                   << v.settings.num_runners << " runner" << (v.settings.num_runners == 1 ? "" : "s") << " x "
                   << work->threads << " thread" << (work->threads == 1 ? "" : "s")
                   << (work->threads_note.empty() ? "" : " (auto, " + work->threads_note + ")")
                   << (dynamic_cast<serving::BatchingModel*>(model.get())
                           ? ", batching up to " + std::to_string(v.settings.max_batch_size) + " rows"
                           : std::string()) << ")";
          self->Record(v, "loaded", "loaded " + how + " on " + model->device() +
                                        (work->note.empty() ? "" : " (" + work->note + ")"));
          DevicePlan plan{work->device, work->note};
          self->Publish(v, serving::ServeState::kReady, "", std::move(model), &plan, work->entry.package_json);
        }
        self->MaybeStartupDone();
      });
  if (rc != 0) {
    in_flight_.erase(WorkKey(v));
    Publish(v, serving::ServeState::kFailed, std::string("cannot queue load: ") + uv_strerror(rc));
    delete w;
  }
}

void Reconciler::Publish(const storage::ModelVersion& v, serving::ServeState state, std::string message,
                         std::shared_ptr<runtime::LoadedModel> model, const DevicePlan* plan,
                         std::string package_json) {
  if (!IsCurrent(v)) return;  // removed or changed since this work began
  auto current = registry_->Find(v.model, v.version);
  // A ready model keeps serving through a reload, and through its failure.
  if (current && current->state == serving::ServeState::kReady && state != serving::ServeState::kReady) return;
  if (!current && !IsDesired(v.model, v.version)) return;
  serving::ServedModel m;
  m.name = v.model;
  m.version = v.version;
  m.state = state;
  m.message = std::move(message);
  m.device = model ? model->device() : (current ? current->device : "");
  m.device_note = plan ? plan->note : "";
  m.package_json = std::move(package_json);
  m.artifact = v.artifact;
  m.settings = v.settings;
  m.model = std::move(model);
  registry_->Put(std::move(m));
  if (state == serving::ServeState::kReady || state == serving::ServeState::kFailed) Retire(v.model);
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

}  // namespace aotid::control
