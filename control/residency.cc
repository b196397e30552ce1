#include "control/residency.h"

#include <algorithm>
#include <cstdio>

#include "base/log.h"

namespace aotid::control {
namespace {

constexpr int kKeepAliveDefault = -1;
constexpr int kKeepAliveAlways = -2;

std::string Mb(uint64_t bytes) { return std::to_string((bytes + (1 << 19)) >> 20) + " MiB"; }

std::string Duration(int64_t ms) {
  if (ms < 0) return "always";
  if (ms == 0) return "0";
  int64_t s = ms / 1000;
  if (s % 3600 == 0) return std::to_string(s / 3600) + "h";
  if (s % 60 == 0) return std::to_string(s / 60) + "m";
  if (ms % 1000 == 0) return std::to_string(s) + "s";
  return std::to_string(ms) + "ms";
}

// Whether a runner's end says an allocation failed.
bool AllocationFailed(const std::string& message) {
  for (const char* sign : {"bad_alloc", "out of memory", "Cannot allocate memory"}) {
    if (message.find(sign) != std::string::npos) return true;
  }
  return false;
}

// Whether it was killed outright: the OOM killer sends SIGKILL (the
// daemon's own kills say why instead).
bool Killed(const std::string& message) {
  return message.find("SIGKILL") != std::string::npos && message.find("time limit") == std::string::npos;
}

std::string PressureWords(const platform::MemoryPressure& p) {
  if (!p.known) return "unknown (" + p.source + ")";
  const char* level = p.level == platform::PressureLevel::kCritical  ? "critical"
                      : p.level == platform::PressureLevel::kWarning ? "warning"
                                                                     : "normal";
  char detail[128];
  if (p.source.find("pressure") != std::string::npos && p.source.starts_with("/proc")) {
    std::snprintf(detail, sizeof detail, " (PSI some %.1f%%, full %.1f%% over 10 s)", p.some_avg10,
                  p.full_avg10);
  } else {
    std::snprintf(detail, sizeof detail, " (%s)", p.source.c_str());
  }
  return level + std::string(detail);
}

}  // namespace

Residency::Residency(Loop* loop, MemoryProbe* probe, ResidencyOptions options, ResidencyHooks hooks)
    : loop_(loop), probe_(probe), options_(std::move(options)), hooks_(std::move(hooks)) {}

Residency::~Residency() {
  Stop();
  *alive_ = false;
  // Requests still waiting for a load get an answer (a waiting request's
  // answer holds its model: left waiting, both would stay for ever).
  for (auto& [key, e] : entries_) e.v.model->Retire(Unavailable("the daemon is stopping"));
}

void Residency::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // No load starts any more: the requests waiting for one are answered.
  const std::vector<std::string> queued = queue_;
  for (const std::string& key : queued) Fail(key, Unavailable("the daemon is stopping"));
}

std::function<void()> Residency::Guard(std::function<void()> fn) {
  return [alive = alive_, fn = std::move(fn)] {
    if (*alive) fn();
  };
}

std::string Residency::Key(const std::string& name, int64_t version) {
  return name + ":" + std::to_string(version);
}

Residency::Entry* Residency::Find(const std::string& key) {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

void Residency::SetOptions(const ResidencyOptions& options) {
  options_ = options;
  for (auto& [key, e] : entries_) {
    if (!Busy(e) && e.phase == Phase::kIn) ScheduleKeepAlive(key);
  }
  Admit();
  Publish();
}

int64_t Residency::KeepAliveMs(int keep_alive_s) const {
  if (keep_alive_s == kKeepAliveDefault) return options_.keep_alive_ms;
  if (keep_alive_s == kKeepAliveAlways || keep_alive_s < 0) return -1;
  return int64_t{keep_alive_s} * 1000;
}

std::shared_ptr<ResidentModel> Residency::NewModel(const std::string& name, int64_t version,
                                                   model::ModelSpec spec, std::string device,
                                                   int64_t max_batch_rows) {
  // Posted from request threads; the model says which entry it was, since
  // a version reloaded with new settings is a new model under the same key.
  // The hooks hold it weakly: it holds them.
  const std::string key = Key(name, version);
  auto weak = std::make_shared<std::weak_ptr<ResidentModel>>();
  // A request still in flight when the daemon stops may end after this
  // residency and its loop are gone: the poster then drops its word, and
  // what it posted checks `alive` on the loop thread.
  auto post = loop_->Poster();
  ResidentModel::Hooks h;
  h.want = [this, alive = alive_, post, key, weak] {
    post([this, alive, key, weak] {
      if (*alive)
        if (auto m = weak->lock()) Want(key, m);
    });
  };
  h.idle = [this, alive = alive_, post, key, weak] {
    post([this, alive, key, weak] {
      if (*alive)
        if (auto m = weak->lock()) Idle(key, m);
    });
  };
  auto model =
      std::make_shared<ResidentModel>(std::move(spec), std::move(device), std::move(h), max_batch_rows);
  *weak = model;
  return model;
}

uint64_t Residency::Estimate(const ResidentVersion& v) const {
  if (v.learned) return std::max(v.learned->peak, v.learned->at_load + v.state_bytes);
  return v.files_bytes + v.state_bytes + runner_base_;
}

uint64_t Residency::Charge(const Entry& e) const {
  switch (e.phase) {
    case Phase::kLoading: return e.reserved;
    case Phase::kIn: {
      // Not measured yet (its process not up to be read): what it was
      // expected at, as while it loaded.
      if (!e.v.learned) return std::max(e.measured, Estimate(e.v));
      uint64_t c = e.measured;
      if (e.v.learned) c = std::max({c, e.v.learned->peak, e.v.learned->at_load + e.v.state_bytes});
      return c;
    }
    default: return 0;
  }
}

uint64_t Residency::Used() const {
  uint64_t used = 0;
  for (const auto& [key, e] : entries_) used += Charge(e);
  for (const auto& [key, bytes] : reserved_) used += bytes;
  return used;
}

bool Residency::Busy(const Entry& e) const {
  ResidentModel::State s = e.v.model->state();
  return s.in_flight - s.waiting > 0;
}

bool Residency::Reserve(const std::string& key, uint64_t bytes) {
  if (options_.budget_bytes > 0 && Used() + bytes > options_.budget_bytes) return false;
  reserved_[key] = bytes;
  return true;
}

void Residency::Unreserve(const std::string& key) {
  if (reserved_.erase(key) > 0) Admit();
}

void Residency::EndDrains(const std::string& key) {
  for (auto& [k, other] : entries_) {
    if (other.drained_for != key) continue;
    other.drained_for.clear();
    // Unloaded once idle no more, unless for its own sake (killed for
    // memory).
    if (other.evict_kind == "evicted") other.evict_when_idle = false;
    other.v.model->SetDraining(false);
  }
}

void Residency::Add(ResidentVersion v, std::optional<LoadedRunner> loaded) {
  const std::string key = Key(v.name, v.version);
  std::shared_ptr<ResidentModel> replaced;
  if (Entry* old = Find(key)) {
    // Loaded again with new settings: what still comes to the old model
    // goes to the new one.
    replaced = old->v.model;
    std::erase(queue_, key);
    EndDrains(key);
    entries_.erase(key);
  }
  Entry& e = entries_[key];
  e.v = std::move(v);
  e.learned_saved_peak = e.v.learned ? e.v.learned->peak : 0;
  // What a runner took here beyond its files, from a size kept with a
  // build: so a restart estimates unmeasured versions as the last run did.
  if (e.v.learned && e.v.learned->at_load > e.v.files_bytes) {
    const uint64_t over = e.v.learned->at_load - e.v.files_bytes;
    runner_base_ = base_measured_ ? std::max(runner_base_, over) : over;
    base_measured_ = true;
  }
  if (loaded) {
    e.phase = Phase::kIn;
    e.pid = loaded->pid;
    e.loads = 1;
    e.last_used_ms = loop_->NowMs();
    e.v.model->Loaded(loaded->model);
    Learn(e, /*force=*/false);
    ScheduleKeepAlive(key);
  }
  if (replaced) replaced->Replace(e.v.model);
  ScheduleSample();
  Publish();
}

void Residency::Remove(const std::string& name, int64_t version, const Status& why) {
  const std::string key = Key(name, version);
  Entry* e = Find(key);
  if (!e) return;
  if (e->phase == Phase::kIn) Learn(*e, /*force=*/true);
  e->v.model->Retire(why);
  std::erase(queue_, key);
  EndDrains(key);
  entries_.erase(key);
  Admit();
  Publish();
}

void Residency::SetKeepAlive(const std::string& name, int64_t version, int keep_alive_s) {
  const std::string key = Key(name, version);
  Entry* e = Find(key);
  if (!e || e->v.keep_alive_s == keep_alive_s) return;
  e->v.keep_alive_s = keep_alive_s;
  if (e->phase == Phase::kIn && !Busy(*e)) ScheduleKeepAlive(key);
  Publish();
}

void Residency::Want(const std::string& key, const std::shared_ptr<ResidentModel>& model) {
  Entry* e = Find(key);
  if (!e || e->v.model != model || stopped_) {
    if (stopped_) model->LoadFailed(Unavailable("the daemon is stopping"));
    return;
  }
  if (e->phase == Phase::kQueued || e->phase == Phase::kLoading) return;
  if (e->phase == Phase::kIn) {
    // Resident, yet it asked: its model was unloaded behind residency's
    // back (never so far); load it again.
    e->phase = Phase::kOut;
  }
  e->phase = Phase::kQueued;
  e->asked_ms = loop_->NowMs();
  e->ask_seq = ++seq_;
  queue_.push_back(key);
  const uint64_t ask = e->ask_seq;
  if (options_.budget_bytes > 0) {
    loop_->RunAfter(options_.load_wait_ms, Guard([this, key, ask] {
                      Entry* w = Find(key);
                      if (!w || w->phase != Phase::kQueued || w->ask_seq != ask) return;
                      FailWaiting(key,
                                  ResourceExhausted(key + " waited " + Duration(options_.load_wait_ms) +
                                                    " for memory and was not loaded: it needs about " +
                                                    Mb(Estimate(w->v)) + " and the memory budget of " +
                                                    Mb(options_.budget_bytes) + " is held by " + Holders()));
                    }));
  }
  Admit();
  Publish();
}

void Residency::FailWaiting(const std::string& key, const Status& why) {
  Fail(key, why);
  Admit();
  Publish();
}

void Residency::Fail(const std::string& key, const Status& why) {
  Entry* e = Find(key);
  if (!e) return;
  std::erase(queue_, key);
  e->phase = Phase::kOut;
  // Once a version per kRefusalLogMs at most: clients that ignore
  // Retry-After can ask thousands of times a second.
  const int64_t now = loop_->NowMs();
  if (e->refusal_logged_ms < 0 || now - e->refusal_logged_ms >= kRefusalLogMs) {
    LOG_WARNING << why.message()
                << (e->refusals_unlogged > 0 ? " (and " + std::to_string(e->refusals_unlogged) +
                                                   " refusals like it before, unlogged)"
                                             : std::string());
    e->refusal_logged_ms = now;
    e->refusals_unlogged = 0;
  } else {
    ++e->refusals_unlogged;
  }
  EndDrains(key);
  e->v.model->LoadFailed(why);
}

std::string Residency::Holders() const {
  std::vector<const Entry*> holders;
  for (const auto& [key, e] : entries_) {
    if (Charge(e) > 0) holders.push_back(&e);
  }
  std::sort(holders.begin(), holders.end(),
            [this](const Entry* a, const Entry* b) { return Charge(*a) > Charge(*b); });
  std::string out;
  for (const Entry* e : holders) {
    ResidentModel::State s = e->v.model->state();
    std::string why;
    if (e->phase == Phase::kLoading) {
      why = "loading";
    } else if (KeepAliveMs(e->v.keep_alive_s) < 0) {
      why = "keep_alive always";
    } else if (s.in_flight - s.waiting > 0) {
      why = std::to_string(s.in_flight - s.waiting) + " request" + (s.in_flight - s.waiting == 1 ? "" : "s") +
            " in flight";
    } else {
      why = "idle";
    }
    out +=
        (out.empty() ? "" : ", ") + Key(e->v.name, e->v.version) + " (" + Mb(Charge(*e)) + ", " + why + ")";
  }
  for (const auto& [key, bytes] : reserved_)
    out += (out.empty() ? "" : ", ") + key + " (" + Mb(bytes) + ", loading)";
  return out.empty() ? "nothing" : out;
}

void Residency::Admit() {
  if (stopped_) return;
  while (!queue_.empty()) {
    const std::string key = queue_.front();
    Entry& e = entries_.at(key);
    const uint64_t need = Estimate(e.v);
    const uint64_t budget = options_.budget_bytes;
    if (budget == 0 || Used() + need <= budget) {
      StartLoad(key);
      continue;
    }
    // What does not leave for it: keep_alive always; and what is loading,
    // which may end smaller than it was counted.
    uint64_t pinned = 0, passing = 0;
    for (const auto& [k, other] : entries_) {
      if (other.phase == Phase::kLoading) passing += Charge(other);
      if (other.phase == Phase::kIn && KeepAliveMs(other.v.keep_alive_s) < 0) pinned += Charge(other);
    }
    for (const auto& [k, bytes] : reserved_) passing += bytes;
    if (pinned + need > budget) {
      Fail(key, ResourceExhausted(key + " needs about " + Mb(need) + " of memory and the budget of " +
                                  Mb(budget) + " (" + options_.budget_source + ") leaves " +
                                  Mb(budget - std::min(budget, pinned)) + " beside " + Holders() +
                                  "; raise residency.memory_budget_mb or unload something"));
      continue;
    }
    if (pinned + passing + need > budget) return;  // wait for the loads in flight
    // The resident versions that may go, least recently used first: idle
    // ones, then busy ones (drained) where they must.
    std::vector<std::pair<int64_t, std::string>> idle, busy;
    for (const auto& [k, other] : entries_) {
      if (other.phase != Phase::kIn || KeepAliveMs(other.v.keep_alive_s) < 0) continue;
      if (!Busy(other)) {
        idle.push_back({other.last_used_ms, k});
      } else if (!other.v.language_model) {
        busy.push_back({other.last_used_ms, k});
      }
    }
    std::sort(idle.begin(), idle.end());
    std::sort(busy.begin(), busy.end());
    uint64_t used = Used();
    std::vector<std::string> evict;
    for (const auto& [t, k] : idle) {
      if (used + need <= budget) break;
      used -= std::min(used, Charge(entries_.at(k)));
      evict.push_back(k);
    }
    if (used + need <= budget) {
      for (const auto& k : evict) {
        Entry& victim = entries_.at(k);
        Unload(victim, "evicted", "unloaded to make room for " + key);
      }
      if (Used() + need <= budget) {
        StartLoad(key);
        continue;
      }
      return;  // one became busy meanwhile: wait for the next change
    }
    for (const auto& [t, k] : busy) {
      if (used + need <= budget) break;
      Entry& victim = entries_.at(k);
      used -= std::min(used, Charge(victim));
      if (victim.drained_for.empty()) {
        victim.drained_for = key;
        if (!victim.evict_when_idle) {  // else it goes anyway, for what it said (killed for memory)
          victim.evict_when_idle = true;
          victim.evict_kind = "evicted";
          victim.evict_cause = "unloaded to make room for " + key;
        }
        victim.v.model->SetDraining(true);
      }
    }
    return;  // the first asked waits; the others wait behind it
  }
}

void Residency::StartLoad(const std::string& key) {
  Entry& e = entries_.at(key);
  std::erase(queue_, key);
  // It fits beside what was drained for it, if anything: those stay.
  EndDrains(key);
  e.phase = Phase::kLoading;
  e.reserved = Estimate(e.v);
  const uint64_t ask = e.ask_seq;
  LOG_INFO << "loading " << key << " on demand (about " << Mb(e.reserved) << "; " << Mb(Used() - e.reserved)
           << " in use"
           << (options_.budget_bytes ? " of a budget of " + Mb(options_.budget_bytes) : std::string()) << ")";
  e.v.load([this, alive = alive_, key, ask](StatusOr<LoadedRunner> r) {
    if (*alive) LoadDone(key, ask, std::move(r));
  });
}

void Residency::LoadDone(const std::string& key, uint64_t ask_seq, StatusOr<LoadedRunner> r) {
  Entry* e = Find(key);
  if (!e || e->phase != Phase::kLoading || e->ask_seq != ask_seq) return;  // removed or replaced meanwhile
  e->reserved = 0;
  if (!r.ok()) {
    e->phase = Phase::kOut;
    e->v.model->LoadFailed(r.status());
  } else {
    e->phase = Phase::kIn;
    e->pid = r->pid;
    ++e->loads;
    e->last_used_ms = loop_->NowMs();
    const double wait_s = static_cast<double>(loop_->NowMs() - e->asked_ms) / 1000;
    Learn(*e, /*force=*/false);
    if (hooks_.loaded) hooks_.loaded(e->v.name, e->v.version, wait_s);
    e->v.model->Loaded(r->model);
    if (!Busy(*e)) ScheduleKeepAlive(key);
  }
  Admit();
  ScheduleSample();
  Publish();
}

bool Residency::Unload(Entry& e, const std::string& kind, const std::string& cause) {
  if (e.phase != Phase::kIn) return false;
  Learn(e, /*force=*/true);
  if (!e.v.model->Unload()) return false;
  const std::string key = Key(e.v.name, e.v.version);
  e.phase = Phase::kOut;
  e.measured = 0;
  e.pid = nullptr;
  e.evict_when_idle = false;
  e.drained_for.clear();
  ++e.unloads;
  LOG_INFO << "unloaded " << key << ": " << cause;
  if (e.v.record) e.v.record("unloaded", cause);
  if (hooks_.unloaded) hooks_.unloaded(e.v.name, e.v.version, kind);
  return true;
}

void Residency::Idle(const std::string& key, const std::shared_ptr<ResidentModel>& model) {
  Entry* e = Find(key);
  if (!e || e->v.model != model || e->phase != Phase::kIn || Busy(*e)) return;
  e->last_used_ms = loop_->NowMs();
  if (e->evict_when_idle) {
    Unload(*e, e->evict_kind, e->evict_cause);
  } else {
    ScheduleKeepAlive(key);
  }
  Admit();
  Publish();
}

void Residency::ScheduleKeepAlive(const std::string& key) {
  Entry* e = Find(key);
  if (!e || e->phase != Phase::kIn) return;
  const int64_t keep = KeepAliveMs(e->v.keep_alive_s);
  const uint64_t spell = ++e->idle_seq;
  if (keep < 0) return;
  if (e->last_used_ms < 0) e->last_used_ms = loop_->NowMs();
  const int64_t due = std::max<int64_t>(0, e->last_used_ms + keep - loop_->NowMs());
  loop_->RunAfter(due, Guard([this, key, spell, keep] {
                    Entry* w = Find(key);
                    if (!w || w->idle_seq != spell || w->phase != Phase::kIn || Busy(*w)) return;
                    // A request that came and went meanwhile set a new spell.
                    if (Unload(*w, "idle",
                               keep == 0 ? "idle: keep_alive 0 unloads it after each answer"
                                         : "idle for " + Duration(keep) + " (keep_alive)")) {
                      Admit();
                      Publish();
                    }
                  }));
}

void Residency::RunnerCrashed(const std::string& name, int64_t version, const std::string& message) {
  Entry* e = Find(Key(name, version));
  if (!e || e->phase != Phase::kIn) return;
  if (!AllocationFailed(message) && !(Killed(message) && RecentOomKill())) return;
  Footprint f = e->v.learned.value_or(Footprint{});
  const uint64_t grown = std::max(Charge(*e), f.peak) / 4 * 5;
  f.peak = std::max(f.peak, grown);
  if (f.at_load == 0) f.at_load = e->measured;
  e->v.learned = f;
  Learn(*e, /*force=*/true);
  e->evict_when_idle = true;
  e->evict_kind = "memory_kill";
  e->evict_cause = "its runner was killed for memory; it counts for " + Mb(f.peak) +
                   " from now on and loads again only within the budget";
  LOG_WARNING << Key(name, version) << ": " << e->evict_cause;
  if (!Busy(*e)) Unload(*e, e->evict_kind, e->evict_cause);
  Admit();
  Publish();
}

bool Residency::RecentOomKill() {
  std::optional<uint64_t> now = probe_->OomKills();
  if (now && oom_kills_ && *now > *oom_kills_) oom_rose_ms_ = loop_->NowMs();
  if (now) oom_kills_ = now;
  return oom_rose_ms_ >= 0 && loop_->NowMs() - oom_rose_ms_ <= kOomWindowMs;
}

void Residency::Learn(Entry& e, bool force) {
  if (e.phase != Phase::kIn || !e.pid) return;
  const int pid = e.pid();
  if (pid > 0) {
    if (auto bytes = probe_->ProcessBytes(pid); bytes.ok()) e.measured = *bytes;
  }
  if (e.measured == 0) return;
  if (!e.v.learned) {
    e.v.learned = Footprint{e.measured, e.measured};
    if (e.v.files_bytes < e.measured) {
      runner_base_ = base_measured_ ? std::max(runner_base_, e.measured - e.v.files_bytes)
                                    : e.measured - e.v.files_bytes;
      base_measured_ = true;
    }
    force = true;
  }
  e.v.learned->peak = std::max(e.v.learned->peak, e.measured);
  // The other versions of its build and settings count for it too (the
  // footprint kept with the build is read only when a version is added).
  if (!e.v.build.empty()) {
    for (auto& [key, other] : entries_) {
      if (&other == &e || other.v.build != e.v.build) continue;
      if (!other.v.learned) {
        other.v.learned = e.v.learned;
      } else {
        other.v.learned->peak = std::max(other.v.learned->peak, e.v.learned->peak);
      }
    }
  }
  // Kept with the build when first measured, when it grew by a tenth, and
  // at unload.
  if (e.v.learn && (force || e.v.learned->peak > e.learned_saved_peak + e.learned_saved_peak / 10)) {
    if (e.v.learned->peak != e.learned_saved_peak || force) e.v.learn(*e.v.learned);
    e.learned_saved_peak = e.v.learned->peak;
  }
}

void Residency::ScheduleSample() {
  if (sampling_ || stopped_ || options_.sample_ms <= 0) return;
  sampling_ = true;
  loop_->RunAfter(options_.sample_ms, Guard([this] {
                    sampling_ = false;
                    Sample();
                  }));
}

void Residency::Sample() {
  if (stopped_) return;
  bool any = false;
  for (auto& [key, e] : entries_) {
    if (e.phase != Phase::kIn) continue;
    any = true;
    Learn(e, /*force=*/false);
  }
  (void)RecentOomKill();  // keeps the count, and when it rose
  platform::MemoryPressure p = probe_->Pressure();
  pressure_text_ = PressureWords(p);
  if (options_.unload_on_pressure && p.known && p.level != platform::PressureLevel::kNormal) {
    std::vector<std::pair<int64_t, std::string>> idle;
    for (auto& [key, e] : entries_) {
      if (e.phase == Phase::kIn && KeepAliveMs(e.v.keep_alive_s) >= 0 && !Busy(e))
        idle.push_back({e.last_used_ms, key});
    }
    std::sort(idle.begin(), idle.end());
    const size_t n =
        p.level == platform::PressureLevel::kCritical ? idle.size() : std::min<size_t>(1, idle.size());
    for (size_t i = 0; i < n; ++i)
      Unload(entries_.at(idle[i].second), "pressure", "memory pressure: " + pressure_text_);
  }
  // Runners that grew past the budget: idle ones go, least recent first.
  if (options_.budget_bytes > 0 && Used() > options_.budget_bytes) {
    std::vector<std::pair<int64_t, std::string>> idle;
    for (auto& [key, e] : entries_) {
      if (e.phase == Phase::kIn && KeepAliveMs(e.v.keep_alive_s) >= 0 && !Busy(e))
        idle.push_back({e.last_used_ms, key});
    }
    std::sort(idle.begin(), idle.end());
    for (const auto& [t, key] : idle) {
      if (Used() <= options_.budget_bytes) break;
      Unload(
          entries_.at(key), "budget",
          "the runners grew to " + Mb(Used()) + ", past the memory budget of " + Mb(options_.budget_bytes));
    }
  }
  Admit();
  Publish();
  if (any || !queue_.empty()) ScheduleSample();
}

std::shared_ptr<const serving::ResidencyReport> Residency::Report() const {
  auto r = std::make_shared<serving::ResidencyReport>();
  r->budget_bytes = options_.budget_bytes;
  r->budget_source = options_.budget_source;
  r->used_bytes = Used();
  r->pressure = pressure_text_;
  const int64_t now = loop_->NowMs();
  for (const auto& [key, e] : entries_) {
    serving::ResidentVersionReport v;
    v.name = e.v.name;
    v.version = e.v.version;
    ResidentModel::State s = e.v.model->state();
    switch (e.phase) {
      case Phase::kIn: v.state = e.evict_when_idle ? "draining" : "resident"; break;
      case Phase::kLoading: v.state = "loading"; break;
      case Phase::kQueued: v.state = "waiting for memory"; break;
      case Phase::kOut: v.state = "not resident"; break;
    }
    v.runners = e.phase == Phase::kIn ? e.v.runners : 0;
    v.bytes = e.phase == Phase::kIn ? e.measured : 0;
    r->measured_bytes += v.bytes;
    if (e.phase == Phase::kIn || e.phase == Phase::kLoading) {
      v.size_bytes = Charge(e);
    } else if (e.v.learned) {
      v.size_bytes = std::max(e.v.learned->peak, e.v.learned->at_load + e.v.state_bytes);
    } else {
      v.size_bytes = Estimate(e.v);
    }
    v.size_measured = e.v.learned.has_value();
    v.in_flight = s.in_flight;
    const bool running = s.in_flight - s.waiting > 0;
    v.idle_ms = running || e.last_used_ms < 0 ? -1 : now - e.last_used_ms;
    const int64_t keep = KeepAliveMs(e.v.keep_alive_s);
    v.keep_alive = Duration(keep);
    if (e.phase == Phase::kIn && !running && keep >= 0 && e.last_used_ms >= 0)
      v.unload_in_ms = std::max<int64_t>(0, e.last_used_ms + keep - now);
    v.loads = e.loads;
    v.unloads = e.unloads;
    // Whether it can ever fit beside what keep_alive always holds.
    if (options_.budget_bytes > 0 && KeepAliveMs(e.v.keep_alive_s) >= 0) {
      uint64_t pinned = 0;
      for (const auto& [k, other] : entries_) {
        if (k != key && other.phase == Phase::kIn && KeepAliveMs(other.v.keep_alive_s) < 0)
          pinned += Charge(other);
      }
      const uint64_t need = e.phase == Phase::kIn ? Charge(e) : Estimate(e.v);
      if (pinned + need > options_.budget_bytes) {
        v.fits = false;
        v.why_not = key + " needs about " + Mb(need) + " of memory and the budget of " +
                    Mb(options_.budget_bytes) + " (" + options_.budget_source + ") leaves " +
                    Mb(options_.budget_bytes - std::min(options_.budget_bytes, pinned)) +
                    " beside the versions whose keep_alive is always";
      }
    }
    r->versions.push_back(std::move(v));
  }
  return r;
}

void Residency::Publish() {
  if (hooks_.report) hooks_.report(Report());
}

}  // namespace aotid::control
