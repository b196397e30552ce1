#include "control/reconciler.h"

#include <algorithm>
#include <cmath>

#include "base/fs.h"
#include "base/log.h"
#include "compile/aoti_build.h"
#include "package/aoti_metadata.h"
#include "serving/batcher.h"

namespace aotid::control {
namespace {

std::string Name(const storage::ModelVersion& v) { return v.model + ":" + std::to_string(v.version); }

// Identifies one piece of work: the version as the store described it.
// Settings that apply without a reload (keep_alive) are not part of it.
std::string WorkKey(const storage::ModelVersion& v) {
  return Name(v) + "@" + v.artifact + "/" + v.package_model + "/" + storage::LoadText(v.settings);
}

// The bytes of a model's state inputs (a language model's cache).
uint64_t StateBytes(const model::ModelSpec& spec) {
  uint64_t total = 0;
  for (const auto& t : spec.state_inputs)
    total += static_cast<uint64_t>(model::NumElements(t.shape)) * model::DTypeSize(t.dtype);
  return total;
}

}  // namespace

Reconciler::Reconciler(ReconcilerParts parts, ReconcilerOptions options)
    : loop_(parts.loop),
      store_(parts.store),
      cache_(parts.cache),
      builds_runner_(parts.builds),
      loader_(parts.loader),
      registry_(parts.registry),
      metrics_(parts.metrics),
      residency_(parts.residency),
      options_(std::move(options)) {}

Reconciler::~Reconciler() {
  Stop();
  *alive_ = false;
}

void Reconciler::Stop() { stopping_ = true; }

std::function<void()> Reconciler::Guard(std::function<void()> fn) {
  return [alive = alive_, fn = std::move(fn)] {
    if (*alive) fn();
  };
}

std::shared_ptr<model::LoadedModel> Reconciler::Queue(const storage::ModelVersion& v,
                                                      std::shared_ptr<model::LoadedModel> model,
                                                      bool language_model, const serving::EmbedSpec* embed) {
  if (language_model) return model;
  serving::BatchOptions opts;
  opts.max_delay_us = v.settings.max_batch_delay_us;
  opts.max_queued = options_.max_queued_requests;
  opts.workers = v.settings.num_runners;
  auto queue_only = [&] {
    opts.max_batch_size = 1;
    return std::make_shared<serving::BatchingModel>(std::move(model), opts);
  };
  if (v.settings.max_batch_size <= 1) return queue_only();
  if (Status ok = serving::CanBatch(model->spec()); !ok.ok()) {
    LOG_WARNING << Name(v) << ": max_batch_size " << v.settings.max_batch_size
                << " ignored: " << ok.message();
    Record(v, "batching_off", ok.message());
    return queue_only();
  }
  // A batch must stay within the rows the model was traced for: joined
  // rows past an input's dim 0 range would run the kernels outside it.
  int64_t rows = v.settings.max_batch_size;
  std::string bounded_by;
  for (const auto& in : model->spec().inputs) {
    if (!in.dims.empty() && in.dims[0] && in.dims[0]->max < rows) {
      rows = in.dims[0]->max;
      bounded_by = in.name;
    }
  }
  if (!bounded_by.empty()) {
    std::string why = "max_batch_size " + std::to_string(v.settings.max_batch_size) + " lowered to " +
                      std::to_string(rows) + ": input '" + bounded_by + "' takes at most " +
                      std::to_string(rows) + " rows";
    LOG_WARNING << Name(v) << ": " << why;
    Record(v, rows > 1 ? "batching_capped" : "batching_off", why);
    if (rows <= 1) return queue_only();
  }
  opts.max_batch_size = static_cast<int>(rows);
  if (embed) {
    // The loader checked the model's two inputs are the ids and the mask.
    for (const auto& in : model->spec().inputs)
      opts.pad.push_back(in.name == embed->ids_input ? embed->pad_id : 0);
  }
  serving::Metrics* metrics = metrics_;
  std::string name = v.model;
  int64_t version = v.version;
  return std::make_shared<serving::BatchingModel>(
      std::move(model), opts, [metrics, name, version](const serving::BatchReport& r) {
        if (metrics && r.rows > 0) metrics->RecordBatch(name, version, r.rows, r.queue_seconds);
      });
}

int64_t EstimateBuildMs(const std::vector<storage::ModelStore::BuildTime>& past, int64_t size,
                        const std::string& kind) {
  const storage::ModelStore::BuildTime* nearest = nullptr;
  double best = 0;
  for (const auto& b : past) {
    if (b.kind != kind || b.ms <= 0 || b.artifact_size <= 0) continue;
    double apart = std::abs(std::log(static_cast<double>(std::max<int64_t>(size, 1)) / b.artifact_size));
    if (nearest == nullptr || apart < best) {
      nearest = &b;
      best = apart;
    }
  }
  if (nearest == nullptr) return 0;
  double ratio =
      std::clamp(static_cast<double>(std::max<int64_t>(size, 1)) / nearest->artifact_size, 0.5, 2.0);
  return static_cast<int64_t>(nearest->ms * ratio);
}

void Reconciler::SetLimits(const ReconcilerOptions& fresh) {
  options_.max_queued_requests = fresh.max_queued_requests;
  options_.retry_initial_ms = fresh.retry_initial_ms;
  options_.max_attempts = fresh.max_attempts;
  options_.run_timeout_ms = fresh.run_timeout_ms;
  options_.memory_limit_bytes = fresh.memory_limit_bytes;
  options_.runner_max_crashes = fresh.runner_max_crashes;
  options_.runner_crash_window_ms = fresh.runner_crash_window_ms;
}

Status Reconciler::RetryFailed(const std::string& name) {
  const std::string prefix = name + ":";
  size_t forgotten = std::erase_if(failed_, [&](const std::string& k) { return k.starts_with(prefix); });
  forgotten += std::erase_if(retries_, [&](const auto& r) { return r.first.starts_with(prefix); });
  if (forgotten > 0) LOG_INFO << "load of " << name << ": trying its failed versions again";
  return Reconcile();
}

Status Reconciler::Reconcile() {
  if (stopping_) return Status::OK();
  ASSIGN_OR_RETURN(auto models, store_->ListModels());
  if (!options_.only_model.empty()) {
    std::erase_if(models, [&](const storage::ModelInfo& m) { return m.name != options_.only_model; });
  }
  stored_.clear();
  desired_.clear();
  for (const auto& m : models) {
    auto& versions = stored_[m.name];
    for (const auto& v : m.versions) versions[v.version] = v;
    if (!m.enabled) {
      // A disabled model wants nothing, at once (Retire); loading it again
      // tries afresh what had failed.
      std::string prefix = m.name + ":";
      std::erase_if(failed_, [&](const std::string& k) { return k.starts_with(prefix); });
      continue;
    }
    if (versions.empty()) continue;
    const auto& want = desired_[m.name] = storage::WantedVersions(m);
    if (want.empty()) {  // pinned to a version the store does not have
      LOG_WARNING << "model " << m.name << " is pinned to version " << m.policy.pinned
                  << ", which the store does not have; serving none";
    }
  }

  // A recorded thread choice removed since its version loaded: time it again.
  std::set<std::string> current;
  for (const auto& [name, versions] : stored_) {
    for (const auto& [n, v] : versions) current.insert(WorkKey(v));
  }
  for (auto it = threads_records_.begin(); it != threads_records_.end();) {
    if (current.count(it->first) && !fs::Exists(it->second + "/threads.json")) retime_.insert(it->first);
    if (!current.count(it->first) || retime_.count(it->first)) {
      it = threads_records_.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(retime_, [&](const std::string& k) { return !current.count(k); });

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
  return it != m->second.end() && it->second.artifact == v.artifact &&
         storage::LoadText(it->second.settings) == storage::LoadText(v.settings);
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
      Unserve(name, version, "was removed from the store");
    } else if (!desired_.count(name)) {
      LOG_INFO << "unloading " << name << ":" << version << ": the model is disabled";
      Unserve(name, version, "is unloaded (its model is disabled)");
    } else if (!IsDesired(name, version) && (wanted_ready || sm->state != serving::ServeState::kReady)) {
      LOG_INFO << "unloading " << name << ":" << version << ": its version policy no longer serves it";
      Unserve(name, version, "is no longer served: its version policy serves another");
    }
  }
}

StatusOr<Reconciler::DevicePlan> Reconciler::PlanDevice(const storage::ModelVersion& v) const {
  const platform::HardwareInfo& hw = options_.hardware;
  const std::string& asked = v.settings.device;
  if (v.kind != package::PackageKind::kExportedProgram) {
    // A compiled or source package is for the device it was compiled for.
    ASSIGN_OR_RETURN(package::AotiMetadata md,
                     package::ReadAotiMetadata(store_->BlobPath(v.artifact), v.package_model));
    if (asked != "auto" && asked != md.device_key) {
      return FailedPrecondition("package was compiled for device '" + md.device_key +
                                "', the version asks for '" + asked +
                                "'; a compiled package cannot be rebuilt for another device");
    }
    if (Status here = compile::CheckPackageDevice(md, hw); !here.ok()) {
      return FailedPrecondition(here.message() +
                                "; a compiled package cannot fall back to the CPU: add its exported program "
                                "instead");
    }
    return DevicePlan{md.device_key, ""};
  }
  std::string want = asked == "auto" ? platform::AutoDevice(hw) : asked;
  if (auto it = fell_back_.find(WorkKey(v)); it != fell_back_.end()) return DevicePlan{"cpu", it->second};
  Status ok = platform::DeviceAvailable(hw, want);
  if (ok.ok()) return DevicePlan{want, ""};
  if (!v.settings.fallback_cpu) return FailedPrecondition(ok.message() + ", and fallback_cpu is off");
  return DevicePlan{"cpu", ok.message() + "; running on the CPU (fallback_cpu)"};
}

compile::BuildKey Reconciler::KeyFor(const storage::ModelVersion& v, const std::string& device) const {
  // Inductor options only shape builds of exported programs.
  bool compiles = v.kind == package::PackageKind::kExportedProgram;
  return compile::BuildKey{v.artifact, v.package_model, device, fingerprint_,
                           compiles ? v.settings.inductor_options : ""};
}

void Reconciler::Ensure(const storage::ModelVersion& v) {
  auto current = registry_->Find(v.model, v.version);
  // Serving as the store says. Anything else (in flight, failed, waiting
  // for a retry) is told apart by the work sets below.
  std::string work = WorkKey(v);
  const bool same = current && current->artifact == v.artifact &&
                    storage::LoadText(current->settings) == storage::LoadText(v.settings);
  if (same && current->settings != v.settings) {
    // A setting that applies as it is (keep_alive): no reload.
    if (residency_) residency_->SetKeepAlive(v.model, v.version, v.settings.keep_alive_s);
    serving::ServedModel m = *current;
    m.settings = v.settings;
    registry_->Put(std::move(m));
    current = registry_->Find(v.model, v.version);
  }
  if (same && current->state == serving::ServeState::kReady && !retime_.count(work)) return;
  if (in_flight_.count(work) || failed_.count(work)) return;
  if (auto r = retries_.find(work); r != retries_.end() && r->second.at_ms > loop_->NowMs()) return;
  if (current && current->state == serving::ServeState::kReady) {
    if (same) {
      LOG_INFO << "reloading " << Name(v) << " to time its threads again";
      Record(v, "reloading",
             "its recorded thread choice was removed; the loaded model serves until it is timed again");
    } else {
      LOG_INFO << "reloading " << Name(v) << " with its new settings";
      Record(v, "reloading", "settings changed; the loaded model serves until the new one is ready");
    }
  }
  retime_.erase(work);

  auto plan = PlanDevice(v);
  if (!plan.ok()) {
    failed_.insert(work);
    // A build row, so `aotid ls` and `show` say it failed here and why.
    SaveBuild({v.artifact, v.package_model, fingerprint_, v.settings.device, storage::BuildState::kFailed,
               plan.status().message(), storage::NowMs(), storage::NowMs(), v.settings.inductor_options, "",
               0});
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
  compile::BuildKey key = KeyFor(v, plan->device);
  auto entry = cache_->Lookup(key);
  if (entry.ok()) {
    StartLoad(v, *entry, /*built_now=*/false, *plan);
    return;
  }
  if (entry.status().code() == StatusCode::kFailedPrecondition) {
    // The build crashed the daemon while loading, and is intact: loading it
    // again would crash it again.
    failed_.insert(WorkKey(v));
    LOG_ERROR << Name(v) << ": " << entry.status().message();
    Record(v, "load_failed", entry.status().message());
    Publish(v, serving::ServeState::kFailed, entry.status().message());
    return;
  }
  if (entry.status().code() == StatusCode::kCorruption) {
    LOG_WARNING << entry.status().message() << "; rebuilding";
    Record(v, "cache_invalid", entry.status().message() + "; rebuilding");
  }
  StartBuild(v, key);
}

bool Reconciler::FallBack(const storage::ModelVersion& v, const std::string& device, const std::string& why) {
  if (device == "cpu" || !v.settings.fallback_cpu || v.kind != package::PackageKind::kExportedProgram)
    return false;
  std::string note = "device '" + device + "' failed (" + why + "); running on the CPU (fallback_cpu)";
  LOG_WARNING << Name(v) << ": " << note;
  Record(v, "device_fallback", note);
  fell_back_[WorkKey(v)] = note;
  if (!stopping_ && IsCurrent(v)) Ensure(v);
  return true;
}

void Reconciler::StartBuild(const storage::ModelVersion& v, const compile::BuildKey& key) {
  in_flight_.insert(WorkKey(v));
  Publish(v, serving::ServeState::kQueued, "queued for a build for " + key.device);
  Record(v, "build_queued", "queued for a build for " + key.device);
  std::string bkey = key.ToString();
  auto [pending, first] = builds_.try_emplace(bkey);
  pending->second.waiters.push_back(v);
  if (!first) return;  // another version with the same artifact is building it

  int attempts = 1;
  if (auto r = retries_.find(WorkKey(v)); r != retries_.end()) attempts = r->second.attempts + 1;
  ScheduleProgress();
  auto rec = std::make_shared<storage::BuildRecord>();
  *rec = storage::BuildRecord{
      v.artifact, v.package_model, fingerprint_, key.device, storage::BuildState::kQueued, "", 0,
      0,          key.options,     "queued",     attempts};
  SaveBuild(*rec);
  pending->second.key = key;
  pending->second.record = rec;

  compile::BuildJob job;
  job.key = key;
  job.kind = v.kind;
  if (auto past = store_->ReadyBuildTimes(fingerprint_, key.device); past.ok()) {
    job.estimate_ms = EstimateBuildMs(*past, v.size, std::string(package::PackageKindName(v.kind)));
  }
  job.artifact_path = store_->BlobPath(v.artifact);
  job.on_start = [this, alive = alive_, rec, bkey]() {
    if (!*alive) return;
    rec->state = storage::BuildState::kBuilding;
    rec->started_at_ms = storage::NowMs();
    rec->progress = "started";
    SaveBuild(*rec);
    for (const auto& w : builds_[bkey].waiters) {
      Record(w, "build_started",
             "compiling for " + rec->device + " on " + fingerprint_ +
                 (rec->attempts > 1 ? " (attempt " + std::to_string(rec->attempts) + ")" : ""));
      Publish(w, serving::ServeState::kBuilding, "building for " + rec->device);
    }
  };
  job.on_done = [this, alive = alive_, bkey](const compile::BuildResult& r) {
    if (*alive) BuildDone(bkey, r);
  };
  builds_runner_->Submit(std::move(job));
}

void Reconciler::BuildDone(const std::string& bkey, const compile::BuildResult& r) {
  PendingBuild done = std::move(builds_[bkey]);
  builds_.erase(bkey);
  auto rec = done.record;
  rec->finished_at_ms = storage::NowMs();
  // Cancelled (nothing needed it, or the daemon stopped) is no verdict on
  // the artifact: not a failure, and no attempt used up.
  rec->state = r.status.ok() ? storage::BuildState::kReady
               : r.cancelled ? storage::BuildState::kCancelled
                             : storage::BuildState::kFailed;
  rec->error = r.status.ok() ? "" : r.status.message();
  rec->progress.clear();
  SaveBuild(*rec);
  // A build another daemon made (a shared cache) took no time here.
  if (metrics_ && !r.cancelled && !r.built_elsewhere)
    metrics_->RecordBuild(r.status.ok(), static_cast<double>(r.duration_ms) / 1000);
  if (r.built_elsewhere) {
    LOG_INFO << "build of " << rec->artifact.substr(0, 12) << " for " << rec->device
             << " made by another daemon sharing the build cache";
  } else if (r.status.ok()) {
    LOG_INFO << "build of " << rec->artifact.substr(0, 12) << " for " << rec->device << " ready in "
             << r.duration_ms << " ms";
  } else if (r.cancelled) {
    LOG_INFO << "build of " << rec->artifact.substr(0, 12) << " for " << rec->device << ": "
             << r.status.message();
  } else {
    LOG_ERROR << "build of " << rec->artifact.substr(0, 12) << " failed: " << r.status.message();
  }
  for (const auto& w : done.waiters) {
    std::string work = WorkKey(w);
    in_flight_.erase(work);
    if (r.cancelled) {
      if (IsCurrent(w)) Record(w, "build_cancelled", r.status.message());
      // Wanted again while its build was being stopped (an unload, then a
      // load): Ensure passed it by as in flight, so it is built afresh.
      if (!stopping_ && IsCurrent(w) && IsDesired(w.model, w.version)) Ensure(w);
      continue;
    }
    if (r.status.ok()) {
      retries_.erase(work);
      Record(w, "build_ready",
             r.built_elsewhere ? std::string("built by another daemon sharing the build cache")
                               : "built in " + std::to_string(r.duration_ms) + " ms");
      // A version superseded meanwhile (a newer one is what its policy
      // serves) is not loaded: it would never answer.
      if (!stopping_ && IsCurrent(w) && IsDesired(w.model, w.version)) {
        auto plan = PlanDevice(w);
        StartLoad(w, r.entry, /*built_now=*/true, plan.ok() ? *plan : DevicePlan{rec->device, ""});
      }
      continue;
    }
    Record(w, "build_failed", r.status.message());
    if (r.permanent && FallBack(w, rec->device, r.status.message())) continue;
    if (!r.permanent && rec->attempts < options_.max_attempts) {
      int64_t wait_ms = static_cast<int64_t>(options_.retry_initial_ms) << std::min(rec->attempts - 1, 16);
      retries_[work] = Retry{rec->attempts, loop_->NowMs() + wait_ms};
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
  if (stopping_) return;
  // One wake-up at a time: the earliest. A later one is armed when it fires.
  if (retry_wake_at_ms_ >= 0 && retry_wake_at_ms_ <= at_ms) return;
  retry_wake_at_ms_ = at_ms;
  loop_->RunAfter(at_ms - loop_->NowMs() + 1, Guard([this, at_ms] {
                    if (retry_wake_at_ms_ != at_ms) return;  // superseded by an earlier one, which re-arms
                    retry_wake_at_ms_ = -1;
                    if (Status s = Reconcile(); !s.ok())
                      LOG_WARNING << "reconcile for a retry: " << s.message();
                    int64_t next = -1;
                    for (const auto& [work, r] : retries_) {
                      if (r.at_ms > loop_->NowMs() && (next < 0 || r.at_ms < next)) next = r.at_ms;
                    }
                    if (next >= 0) ScheduleRetry(next);
                  }));
}

void Reconciler::CancelUnwanted() {
  // Collected first: a queued build's cancellation completes at once, and
  // its completion removes it from builds_.
  std::vector<compile::BuildKey> unwanted;
  for (const auto& [bkey, pending] : builds_) {
    bool needed = false;
    for (const auto& w : pending.waiters) needed |= IsCurrent(w) && IsDesired(w.model, w.version);
    if (!needed) unwanted.push_back(pending.key);
  }
  for (const auto& key : unwanted) {
    if (builds_runner_->Cancel(key)) {
      LOG_INFO << "cancelling the build of " << key.artifact.substr(0, 12) << " for " << key.device
               << ": no version the store wants needs it";
    }
  }
}

void Reconciler::ScheduleProgress() {
  if (progress_scheduled_ || stopping_) return;
  progress_scheduled_ = true;
  loop_->RunAfter(options_.progress_interval_ms, Guard([this] {
                    progress_scheduled_ = false;
                    UpdateProgress();
                    if (!builds_.empty()) ScheduleProgress();
                  }));
}

void Reconciler::UpdateProgress() {
  for (auto& [bkey, pending] : builds_) {
    if (!pending.record || pending.record->state != storage::BuildState::kBuilding) continue;
    std::string p = builds_runner_->Progress(pending.key);
    if (p.empty() || p == pending.record->progress) continue;
    pending.record->progress = p;
    SaveBuild(*pending.record);
    for (const auto& w : pending.waiters)
      Publish(w, serving::ServeState::kBuilding, "building for " + pending.key.device + ": " + p);
  }
}

void Reconciler::StartLoad(const storage::ModelVersion& v, const model::CacheEntry& entry, bool built_now,
                           const DevicePlan& plan) {
  in_flight_.insert(WorkKey(v));
  Publish(v, serving::ServeState::kLoading, built_now ? "loading the new build" : "loading the cached build");
  if (!built_now)
    Record(v, "load_started", "loading the cached build for " + entry.dir.substr(entry.dir.rfind('/') + 1));
  // A language model keeps its sequence's cache inside the compiled model,
  // which every runner instance and every row of a batch would share.
  if (!entry.generate_path.empty() && (v.settings.num_runners > 1 || v.settings.max_batch_size > 1)) {
    std::string why =
        "a language model's key/value cache is inside the compiled model, where its generator "
        "schedules the sequences on the cache's slots; another runner or a batch's rows would "
        "have caches of their own or share its slots: set num_runners=1 and max_batch_size=1";
    in_flight_.erase(WorkKey(v));
    LOG_ERROR << "loading " << Name(v) << " failed: " << why;
    Record(v, "load_failed", why);
    failed_.insert(WorkKey(v));
    Publish(v, serving::ServeState::kFailed, why);
    MaybeStartupDone();
    return;
  }
  LoadRequest req = MakeLoadRequest(v, entry, plan);
  if (residency_) {
    // Loaded now when it fits beside what is loaded, unless it is to be
    // unloaded after each answer anyway; else it is ready to serve and
    // loads on its first request.
    const int64_t keep = residency_->KeepAliveMs(v.settings.keep_alive_s);
    ResidentVersion sized = Sized(v, entry, plan);
    const uint64_t estimate = residency_->Estimate(sized);
    req.prepare_only = keep == 0 || !residency_->Reserve(WorkKey(v), estimate);
    if (req.prepare_only && keep != 0) {
      LOG_INFO << Name(v) << ": not loaded now: about " << (estimate >> 20)
               << " MiB do not fit the memory budget beside what is loaded; it loads on its first request";
    }
  }
  loader_->Load(std::move(req), [this, alive = alive_, v, entry, built_now, plan](LoadResult result) {
    if (*alive) LoadDone(v, entry, built_now, plan, std::move(result));
  });
}

LoadRequest Reconciler::MakeLoadRequest(const storage::ModelVersion& v, const model::CacheEntry& entry,
                                        const DevicePlan& plan) {
  LoadRequest req;
  req.entry = entry;
  req.options.device = plan.device;
  req.options.num_runners = v.settings.num_runners;
  req.options.threads =
      runtime::ThreadsPerRunner(v.settings.threads, v.settings.num_runners, options_.hardware.cores);
  // threads = 0 (auto) on the CPU: the loader times the model both ways.
  if (v.settings.threads == 0 && plan.device == "cpu") {
    req.choose_threads_at_batch = v.settings.max_batch_size > 1 ? v.settings.max_batch_size : 1;
    const platform::HardwareInfo& hw = options_.hardware;
    req.threads_key = hw.cpu_model + "; " + std::to_string(hw.cores) + " cores; up to " +
                      std::to_string(req.options.threads) + " threads; batch " +
                      std::to_string(req.choose_threads_at_batch);
  }
  req.label = Name(v);
  req.max_sequences = v.settings.max_sequences;
  req.run_timeout_ms =
      v.settings.timeout_s > 0 ? int64_t{v.settings.timeout_s} * 1000 : options_.run_timeout_ms;
  req.memory_limit_bytes = v.settings.memory_limit_mb > 0
                               ? static_cast<uint64_t>(v.settings.memory_limit_mb) << 20
                               : options_.memory_limit_bytes;
  req.max_crashes = options_.runner_max_crashes;
  req.crash_window_ms = options_.runner_crash_window_ms;
  req.on_runner_event = [this, alive = alive_, v](const runner::RunnerEvent& e) {
    if (*alive) RunnerEvent(v, e);
  };
  return req;
}

std::string Reconciler::FootprintKey(const storage::ModelVersion& v, const std::string& device) {
  // What changes a runner's memory: where it runs, its instances, the rows
  // one run joins, its sequences, its threads. Not its time limit, memory
  // limit or keep_alive: a measured size survives a change of those.
  const storage::VersionSettings& s = v.settings;
  return device + " runners=" + std::to_string(s.num_runners) + " batch=" + std::to_string(s.max_batch_size) +
         " sequences=" + std::to_string(s.max_sequences) + " threads=" + std::to_string(s.threads);
}

ResidentVersion Reconciler::Sized(const storage::ModelVersion& v, const model::CacheEntry& entry,
                                  const DevicePlan& plan) const {
  ResidentVersion rv;
  rv.name = v.model;
  rv.version = v.version;
  rv.keep_alive_s = v.settings.keep_alive_s;
  rv.runners = v.settings.num_runners;
  rv.language_model = !entry.generate_path.empty();
  rv.files_bytes = compile::BuildCache::EntryBytes(entry.dir);
  rv.state_bytes = StateBytes(entry.spec);
  rv.build = entry.dir + " " + FootprintKey(v, plan.device);
  if (auto f = cache_->ReadFootprint(entry.dir, FootprintKey(v, plan.device)))
    rv.learned = Footprint{f->at_load, f->peak};
  return rv;
}

std::shared_ptr<model::LoadedModel> Reconciler::Resident(const storage::ModelVersion& v,
                                                         const model::CacheEntry& entry,
                                                         const DevicePlan& plan,
                                                         std::shared_ptr<model::LoadedModel> loaded,
                                                         std::function<int()> pid) {
  ResidentVersion rv = Sized(v, entry, plan);
  auto model = residency_->NewModel(v.model, v.version, entry.spec, plan.device,
                                    loaded ? loaded->max_batch_rows() : 1);
  rv.model = model;
  rv.load = [this, alive = alive_, v, entry, plan](std::function<void(StatusOr<LoadedRunner>)> done) {
    if (!*alive || stopping_) {
      done(Unavailable("the daemon is stopping"));
      return;
    }
    LoadAgain(v, entry, plan, std::move(done));
  };
  rv.learn = [cache = cache_, dir = entry.dir, key = FootprintKey(v, plan.device)](const Footprint& f) {
    Status s = cache->RecordFootprint(dir, {key, f.at_load, f.peak, storage::NowMs()});
    if (!s.ok()) LOG_WARNING << "cannot record a footprint in " << dir << ": " << s.message();
  };
  rv.record = [this, alive = alive_, v](const std::string& kind, const std::string& message) {
    if (*alive) Record(v, kind, message);
  };
  std::optional<LoadedRunner> runner;
  if (loaded) runner = LoadedRunner{std::move(loaded), std::move(pid)};
  residency_->Add(std::move(rv), std::move(runner));
  return model;
}

void Reconciler::LoadAgain(const storage::ModelVersion& v, const model::CacheEntry& entry,
                           const DevicePlan& plan, std::function<void(StatusOr<LoadedRunner>)> done) {
  Record(v, "load_started", "loading on demand");
  loader_->Load(MakeLoadRequest(v, entry, plan),
                [this, alive = alive_, v, plan, done = std::move(done)](LoadResult r) {
                  if (!*alive) {
                    done(Unavailable("the daemon is stopping"));
                    return;
                  }
                  if (!r.model.ok() || !*r.model) {
                    Status why = r.model.ok() ? Internal("the load returned no model") : r.model.status();
                    LOG_ERROR << "loading " << Name(v) << " on demand failed: " << why.message();
                    Record(v, "load_failed", why.message());
                    if (why.code() == StatusCode::kCorruption && !stopping_ && IsCurrent(v) &&
                        !in_flight_.count(WorkKey(v))) {
                      // Damaged in place: built again, and served anew once it is.
                      Record(v, "cache_invalid", why.message() + "; rebuilding");
                      StartBuild(v, KeyFor(v, plan.device));
                    }
                    done(why);
                    return;
                  }
                  const bool language_model = r.generator != nullptr;
                  std::shared_ptr<model::LoadedModel> model =
                      Queue(v, std::move(r.model).value(), language_model, r.embed.get());
                  LOG_INFO << "loaded " << Name(v) << " on demand on " << model->device() << " (" << r.threads
                           << " thread" << (r.threads == 1 ? "" : "s") << ")";
                  Record(v, "loaded", "loaded on demand on " + model->device());
                  done(LoadedRunner{std::move(model), std::move(r.runner_pid)});
                });
}

void Reconciler::Unserve(const std::string& name, int64_t version, const std::string& why) {
  registry_->Remove(name, version);
  if (residency_)
    residency_->Remove(name, version, Unavailable(name + ":" + std::to_string(version) + " " + why));
}

void Reconciler::LoadDone(const storage::ModelVersion& v, const model::CacheEntry& entry, bool built_now,
                          const DevicePlan& plan, LoadResult result) {
  in_flight_.erase(WorkKey(v));
  // The room reserved for the load is given back once its runner counts as
  // resident (Resident below), not before: a load admitted in between would
  // be counted into that room as well.
  if (result.model.status().code() == StatusCode::kCorruption && !stopping_ && IsCurrent(v)) {
    if (residency_) residency_->Unreserve(WorkKey(v));
    // Damaged in place since it was built: build it again (its new digest
    // then matches, so a build that crashes anyway fails below next time).
    std::string why = result.model.status().message();
    LOG_WARNING << "loading " << Name(v) << " failed: " << why << "; rebuilding";
    Record(v, "cache_invalid", why + "; rebuilding");
    StartBuild(v, KeyFor(v, plan.device));
    return;
  }
  const bool load_ok = result.model.ok();
  if (!load_ok) {
    if (residency_) residency_->Unreserve(WorkKey(v));  // before a fallback reserves anew
    std::string why = result.model.status().message();
    LOG_ERROR << "loading " << Name(v) << " failed: " << why;
    Record(v, "load_failed", why);
    if (!FallBack(v, plan.device, why)) {
      failed_.insert(WorkKey(v));
      Publish(v, serving::ServeState::kFailed, why);
    }
  } else if (!IsCurrent(v)) {
    LOG_INFO << "dropping the load of " << Name(v) << ": the store changed it meanwhile";
  } else if (!IsDesired(v.model, v.version)) {
    LOG_INFO << "dropping the load of " << Name(v) << ": its version policy no longer serves it";
  } else {
    std::shared_ptr<model::LoadedModel> loaded = std::move(result.model).value();
    if (loaded)
      loaded =
          Queue(v, std::move(loaded), /*language_model=*/result.generator != nullptr, result.embed.get());
    std::string how = built_now ? "after build" : "from cache";
    // Said once it serves: the event is what a watcher waits for.
    std::string event_kind, event;
    if (!loaded) {
      LOG_INFO << "ready to serve " << Name(v) << " on " << plan.device << " (" << how
               << "; not resident: it loads on its first request)";
      event_kind = "ready";
      event = "ready on " + plan.device + " " + how + "; not resident: it loads on its first request";
    } else {
      const int64_t batch_rows = loaded->max_batch_rows();
      LOG_INFO << "serving " << Name(v) << " on " << loaded->device() << " (" << how << ", "
               << v.settings.num_runners << " runner" << (v.settings.num_runners == 1 ? "" : "s") << " x "
               << result.threads << " thread" << (result.threads == 1 ? "" : "s")
               << (result.threads_note.empty() ? "" : " (auto, " + result.threads_note + ")")
               << (batch_rows > 1 ? ", batching up to " + std::to_string(batch_rows) + " rows"
                                  : std::string())
               << ")";
      event_kind = "loaded";
      event = "loaded " + how + " on " + loaded->device() + (plan.note.empty() ? "" : " (" + plan.note + ")");
    }
    std::shared_ptr<model::LoadedModel> model =
        residency_ ? Resident(v, entry, plan, std::move(loaded), std::move(result.runner_pid))
                   : std::move(loaded);
    if (result.threads_recorded) threads_records_[WorkKey(v)] = entry.dir;
    Publish(v, serving::ServeState::kReady, "", std::move(model), &plan, entry.package_json,
            std::move(result.generator), std::move(result.embed));
    Record(v, event_kind, event);
  }
  if (residency_ && load_ok) residency_->Unreserve(WorkKey(v));
  MaybeStartupDone();
}

void Reconciler::RunnerEvent(const storage::ModelVersion& v, const runner::RunnerEvent& e) {
  // Both kinds follow a runner's end; the last one is also why it is not restarted.
  if (metrics_) metrics_->RecordRunnerCrash(v.model, v.version);
  Record(v, e.kind == runner::RunnerEvent::Kind::kCrashed ? "runner_crashed" : "runner_failed", e.message);
  if (residency_ && e.kind == runner::RunnerEvent::Kind::kCrashed)
    residency_->RunnerCrashed(v.model, v.version, e.message);
  if (e.kind != runner::RunnerEvent::Kind::kFailed || !IsCurrent(v)) return;
  auto current = registry_->Find(v.model, v.version);
  // A runner that no longer starts because its build left the cache (cache
  // prune, a disk cleaner) or was damaged: build it again.
  if (current && !stopping_) {
    compile::BuildKey key = KeyFor(v, current->device);
    if (auto entry = cache_->Lookup(key); !entry.ok() && !in_flight_.count(WorkKey(v))) {
      std::string why =
          "its build is gone from the cache or damaged (" + entry.status().message() + "); rebuilding";
      LOG_WARNING << Name(v) << ": " << why;
      Record(v, "cache_invalid", why);
      StartBuild(v, key);
      return;
    }
  }
  // Its runner is not restarted any more: the version has failed, and says
  // so wherever its state is shown, until its settings change or it is
  // loaded again.
  failed_.insert(WorkKey(v));
  if (current) {
    serving::ServedModel m = *current;
    m.state = serving::ServeState::kFailed;
    m.message =
        e.message + "; loading it again (POST /v2/repository/models/" + v.model + "/load) starts it afresh";
    m.model = nullptr;
    const std::string why = m.message;
    registry_->Put(std::move(m));
    if (residency_) residency_->Remove(v.model, v.version, Unavailable(Name(v) + " failed: " + why));
  }
}

void Reconciler::Publish(const storage::ModelVersion& v, serving::ServeState state, std::string message,
                         std::shared_ptr<model::LoadedModel> model, const DevicePlan* plan,
                         std::string package_json, std::shared_ptr<const serving::Generator> generator,
                         std::shared_ptr<const serving::EmbedSpec> embed) {
  if (!IsCurrent(v)) return;  // removed or changed since this work began
  auto current = registry_->Find(v.model, v.version);
  // A ready model keeps serving through a reload, and through its failure.
  if (current && current->state == serving::ServeState::kReady && state != serving::ServeState::kReady)
    return;
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
  m.build_key = plan && model ? KeyFor(v, plan->device).ToString() : "";
  m.created_at_ms = v.created_at_ms;
  m.settings = v.settings;
  m.model = std::move(model);
  m.generator = std::move(generator);
  m.embed = std::move(embed);
  // The package lists an exported program's weights; a compiled one's are
  // in its code (WeightsKind says "").
  if (m.model) {
    if (auto archive = package::Archive::Open(store_->BlobPath(v.artifact)); archive.ok())
      m.weights = package::WeightsKind(*archive, v.package_model);
  }
  registry_->Put(std::move(m));
  if (state == serving::ServeState::kReady || state == serving::ServeState::kFailed) Retire(v.model);
}

void Reconciler::SaveBuild(const storage::BuildRecord& b) {
  // The row is what `aotid ls` and `show` report; serving goes on without it.
  Status s = store_->PutBuild(b);
  if (!s.ok())
    LOG_WARNING << "cannot record the build of " << b.artifact.substr(0, 12) << " for " << b.device << ": "
                << s.message();
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
