#include "sync/syncer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <nlohmann/json.hpp>
#include <random>

#include "base/fs.h"
#include "base/json.h"
#include "base/log.h"
#include "storage/model_store.h"
#include "sync/model_sync.h"
#include "sync/registry.h"

namespace aotid::sync {
namespace {

using json = nlohmann::json;

// The model's versions beyond the newest `keep` go, but never the one its
// policy pins, nor the newest one with a ready build: until a new version
// is built, the one before it serves, and removing it would leave nothing
// (a later sync removes it once the new one is ready). Returns what was
// removed, for the line.
std::string Trim(storage::ModelStore& store, const std::string& name, int keep) {
  if (keep <= 0) return "";
  auto model = store.GetModel(name);
  if (!model.ok() || static_cast<int>(model->versions.size()) <= keep) return "";
  int64_t serving = 0;
  for (auto it = model->versions.rbegin(); it != model->versions.rend() && serving == 0; ++it) {
    auto builds = store.ListBuilds(it->artifact);
    if (!builds.ok()) continue;
    for (const auto& b : *builds) {
      if (b.package_model == it->package_model && b.state == storage::BuildState::kReady)
        serving = it->version;
    }
  }
  std::vector<storage::ModelStore::ModelRef> refs;
  std::string removed;
  for (size_t i = 0; i + keep < model->versions.size(); ++i) {
    int64_t v = model->versions[i].version;
    if (v == serving) continue;
    if (model->policy.kind == storage::VersionPolicy::Kind::kPinned && model->policy.pinned == v) continue;
    refs.emplace_back(name, v);
    removed += (removed.empty() ? "" : ", ") + name + ":" + std::to_string(v);
  }
  if (refs.empty() || !store.Remove(refs).ok()) return "";
  return "; removed " + removed + " (keep = " + std::to_string(keep) + ")";
}

}  // namespace

SyncOnce StoreSync(const std::string& store_dir) {
  return [store_dir](const SyncSource& s, const std::atomic<bool>& cancel,
                     const MayAdd& may_add) -> StatusOr<std::string> {
    if (!s.source.starts_with("oci://")) {  // a folder of .pt2 files
      ASSIGN_OR_RETURN(auto store, storage::ModelStore::Open(store_dir, /*create=*/false));
      auto results = PullDir(*store, s.source, s.name, may_add);
      if (!results.ok()) {
        (void)store->AppendEvent(s.name, 0, "sync_failed", s.source + ": " + results.status().message());
        return results.status();
      }
      // Each file on its own: one that fails is an event and fails the
      // sync (so it is tried again sooner); the others are synced.
      std::string said, failed;
      for (const auto& r : *results) {
        if (!r.error.ok()) {
          (void)store->AppendEvent(r.model, 0, "sync_failed", r.error.message());
          failed += (failed.empty() ? "" : "; ") + r.error.message();
          continue;
        }
        std::string line = (r.added ? "added " : "up to date: ") + r.model + ":" + std::to_string(r.version) +
                           Trim(*store, r.model, s.keep);
        if (r.added) LOG_INFO << "sync: " << line << " from " << r.ref;
        said += (said.empty() ? "" : "; ") + line;
      }
      if (!failed.empty()) return Unavailable(failed + (said.empty() ? "" : " (and " + said + ")"));
      return said.empty() ? s.source + " has no .pt2 files" : said;
    }
    ASSIGN_OR_RETURN(OciRef ref, ParseOciRef(s.source, s.insecure));
    ASSIGN_OR_RETURN(Credentials creds, ReadCredentials(s.credentials, ref));
    ASSIGN_OR_RETURN(auto store, storage::ModelStore::Open(store_dir, /*create=*/false));
    RegistryLimits limits;
    limits.timeout_s = s.timeout_s;
    std::vector<std::string> tags;
    if (ref.tag.empty()) {
      Registry registry(ref, creds, limits, &cancel);
      ASSIGN_OR_RETURN(tags, registry.ListTags());
      if (tags.empty()) return ref.ToString() + " has no tags";
    } else {
      tags.push_back(ref.tag);
    }
    std::string said;
    for (const auto& tag : tags) {
      OciRef one = ref;
      one.tag = tag;
      PullOptions o;
      o.any_version = ref.tag.empty();
      o.cancel = &cancel;
      o.creds = creds;
      o.limits = limits;
      o.name = s.name;
      o.may_add = may_add;
      auto r = Pull(*store, one, o);
      if (!r.ok()) {
        if (cancel.load()) return Cancelled("the daemon is stopping");  // not the registry's failure
        (void)store->AppendEvent(s.name, 0, "sync_failed", one.ToString() + ": " + r.status().message());
        return r.status();
      }
      // Trimmed at every sync: a version kept because it served while
      // the new one built goes once the new one is ready.
      std::string line = (r->added ? "added " + r->model + ":" + std::to_string(r->version) + " from " +
                                         r->ref + " (" + std::to_string(r->bytes) + " bytes)"
                                   : "up to date: " + r->model + ":" + std::to_string(r->version)) +
                         Trim(*store, r->model, s.keep);
      if (line.find("added") != std::string::npos || line.find("removed") != std::string::npos)
        LOG_INFO << "sync: " << line;
      said += (said.empty() ? "" : "; ") + line;
    }
    return said;
  };
}

int64_t Syncer::BackoffMs(int failures, int interval_s) {
  int64_t cap = int64_t{interval_s} * 1000;
  int64_t wait = 5000;
  for (int i = 1; i < failures && wait < cap; ++i) wait *= 2;
  return std::min(wait, cap);
}

Syncer::Syncer(std::vector<SyncSource> sources, SyncOnce sync_once, std::string status_file,
               const Clock* clock)
    : clock_(clock), sync_once_(std::move(sync_once)), status_file_(std::move(status_file)) {
  SetSources(std::move(sources));
  thread_ = std::thread([this] { Run(); });
}

Syncer::~Syncer() {
  cancel_.store(true);  // a download under way stops at its next chunk
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  // A request waiting on a silent registry is closed, not waited out; one
  // that starts meanwhile sees the flag, or the next round closes it.
  for (int i = 0; i < 250 && !finished_.load(); ++i) {
    StopTransfers(&cancel_);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (thread_.joinable()) thread_.join();
}

void Syncer::SetSources(std::vector<SyncSource> sources) {
  std::vector<SourceStatus> snapshot;
  int64_t generation = 0;
  {
    MutexLock lock(&mu_);
    std::vector<SourceStatus> status;
    for (const auto& s : sources) {
      SourceStatus st;
      st.source = s.source;
      // A source kept across a reload keeps its history.
      for (const auto& old : status_) {
        if (old.source == s.source) st = old;
      }
      st.interval_s = s.interval_s;
      st.keep = s.keep;
      status.push_back(st);
    }
    sources_ = std::move(sources);
    status_ = std::move(status);
    due_ms_.assign(sources_.size(), clock_->NowMs());  // now
    snapshot = Snapshot();
    generation = ++generation_;
  }
  wake_.SignalAll();
  WriteStatus(std::move(snapshot), generation);
}

std::vector<SourceStatus> Syncer::Status() const {
  MutexLock lock(&mu_);
  return Snapshot();
}

std::vector<SourceStatus> Syncer::Snapshot() const {
  std::vector<SourceStatus> out = status_;
  const int64_t now = clock_->NowMs(), wall = clock_->WallMs();
  for (size_t i = 0; i < out.size() && i < due_ms_.size(); ++i) out[i].next_at_ms = wall + (due_ms_[i] - now);
  return out;
}

void Syncer::Run() {
  std::mt19937_64 rng(static_cast<uint64_t>(::getpid()) ^ static_cast<uint64_t>(clock_->WallMs()));
  MutexLock lock(&mu_);
  while (!stop_) {
    // The source due first.
    int64_t now = clock_->NowMs();
    size_t due = sources_.size();
    int64_t earliest = INT64_MAX;
    for (size_t i = 0; i < due_ms_.size(); ++i) {
      if (due_ms_[i] < earliest) {
        earliest = due_ms_[i];
        due = i;
      }
    }
    if (due == sources_.size()) {
      wake_.Wait(&mu_);
      continue;
    }
    if (earliest > now) {
      clock_->WaitUntil(&wake_, &mu_, earliest);
      continue;
    }
    SyncSource source = sources_[due];
    // The sync runs without the lock: SetSources and Status stay quick.
    lock.Unlock();
    MayAdd may_add = [this, from = source.source](const std::string& model) -> aotid::Status {
      MutexLock lock(&mu_);
      auto it = owners_.find(model);
      bool other_feeds_it = it != owners_.end() && it->second != from &&
                            std::any_of(sources_.begin(), sources_.end(),
                                        [&](const SyncSource& s) { return s.source == it->second; });
      if (other_feeds_it) {
        return FailedPrecondition("model '" + model + "' is synced from " + Printable(it->second) +
                                  " too; two sources of one model would replace each other's version at "
                                  "every sync (give one of them a name of its own)");
      }
      owners_[model] = from;
      return aotid::Status::OK();
    };
    StatusOr<std::string> result = sync_once_(source, cancel_, may_add);
    lock.Lock();
    if (cancel_.load()) break;  // stopping: what it cut short is no result
    // The sources may have changed meanwhile: the result goes to its own.
    for (size_t i = 0; i < sources_.size(); ++i) {
      if (!(sources_[i] == source)) continue;
      SourceStatus& st = status_[i];
      st.last_at_ms = clock_->WallMs();
      st.ok = result.ok();
      st.message = result.ok() ? *result : result.status().message();
      int64_t wait = int64_t{source.interval_s} * 1000;
      if (result.ok()) {
        st.failures = 0;
        st.last_ok_at_ms = st.last_at_ms;
        ++st.runs_ok;
      } else {
        ++st.failures;
        ++st.runs_failed;
        wait = BackoffMs(st.failures, source.interval_s);
        LOG_WARNING << "sync of " << source.source << " failed (" << st.failures
                    << " in a row): " << st.message;
      }
      std::uniform_real_distribution<double> jitter(0.8, 1.2);
      due_ms_[i] = clock_->NowMs() + static_cast<int64_t>(static_cast<double>(wait) * jitter(rng));
    }
    std::vector<SourceStatus> snapshot = Snapshot();
    int64_t generation = ++generation_;
    lock.Unlock();
    WriteStatus(std::move(snapshot), generation);
    lock.Lock();
  }
  finished_.store(true);
}

void Syncer::WriteStatus(std::vector<SourceStatus> status, int64_t generation) {
  if (status_file_.empty()) return;
  MutexLock lock(&write_mu_);
  if (generation <= written_generation_) return;  // a newer one is on disk
  written_generation_ = generation;
  json out = json::array();
  for (const auto& s : status) {
    out.push_back({{"source", s.source},
                   {"last_at_ms", s.last_at_ms},
                   {"ok", s.ok},
                   {"message", s.message},
                   {"failures", s.failures},
                   {"next_at_ms", s.next_at_ms},
                   {"last_ok_at_ms", s.last_ok_at_ms},
                   {"interval_s", s.interval_s},
                   {"keep", s.keep}});
  }
  (void)fs::WriteFileAtomic(status_file_, out.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

std::vector<SourceStatus> ReadSyncStatus(const std::string& status_file) {
  std::vector<SourceStatus> out;
  auto text = fs::ReadFile(status_file);
  if (!text.ok()) return out;
  json j = ParseJsonOrDiscarded(*text);
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    if (!e.is_object()) continue;
    SourceStatus s;
    s.source = e.value("source", "");
    s.last_at_ms = e.value("last_at_ms", int64_t{0});
    s.ok = e.value("ok", false);
    s.message = e.value("message", "");
    s.failures = e.value("failures", 0);
    s.next_at_ms = e.value("next_at_ms", int64_t{0});
    s.last_ok_at_ms = e.value("last_ok_at_ms", int64_t{0});
    s.interval_s = e.value("interval_s", 0);
    s.keep = e.value("keep", 0);
    out.push_back(s);
  }
  return out;
}

}  // namespace aotid::sync
