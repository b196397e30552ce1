// Which versions are resident, within a memory budget (issue 35).
//
// Every served version is a ResidentModel (control/resident_model.h):
// ready to serve whether or not its runner is loaded. This class, on the
// loop thread, decides when runners load and unload:
//  - a request for a version that is not resident asks for a load; the
//    load waits its turn (first asked, first loaded) until it fits the
//    budget;
//  - a load that does not fit unloads the least recently used idle
//    versions first, when that is enough; when it is not, busy versions
//    that may be unloaded are drained (their new requests wait) and
//    unloaded once their requests end. Nothing is unloaded for a load that
//    would still not fit. A version with a request in flight is never
//    unloaded, nor one whose keep_alive is `always`;
//  - a load that has not fit after load_wait_ms fails its requests with
//    ResourceExhausted (503 with Retry-After), naming the budget and what
//    holds it; one larger than the budget can ever leave fails at once;
//  - a version whose last request ended is unloaded after its keep_alive
//    (0: at once);
//  - when the kernel reports memory pressure, idle versions are unloaded
//    (the least recently used first; every idle one when it is critical);
//  - a runner killed for memory counts for more (its size grows by what it
//    was measured at, by a quarter) and is unloaded once its requests end,
//    so it loads again only within the budget. Killed for memory: an
//    allocation failed, or it died of SIGKILL within a few seconds of the
//    kernel's OOM killer killing something (a kill -9 by a person is a
//    crash like any other).
// Sizes are measured, never guessed: each runner's memory is sampled every
// sample_ms (MemoryProbe: PSS on Linux, so pages runners share count
// once); what a version measured at its load and at its peak is kept with
// its build and used for its next loads. Before a version's first load its
// size is its build's files plus its cache plus what a runner took here
// over its files (150 MiB until one is measured). A language model's
// key/value cache counts in full while it is resident, although its pages
// become resident as sequences write them.
//
// Loop thread only, but for what ResidentModel's hooks post.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "control/loop.h"
#include "control/resident_model.h"
#include "platform/memory_probe.h"
#include "serving/residency_report.h"

namespace aotid::control {

// What residency measures. The real one asks the kernel; tests fake it.
class MemoryProbe {
 public:
  virtual ~MemoryProbe() = default;
  virtual StatusOr<uint64_t> ProcessBytes(int pid) = 0;
  virtual platform::MemoryPressure Pressure() = 0;
  // The kernel's OOM kills since boot; nullopt where it does not say.
  virtual std::optional<uint64_t> OomKills() = 0;
};

class SystemMemoryProbe final : public MemoryProbe {
 public:
  StatusOr<uint64_t> ProcessBytes(int pid) override { return platform::ProcessMemoryBytes(pid); }
  platform::MemoryPressure Pressure() override { return platform::ReadMemoryPressure(); }
  std::optional<uint64_t> OomKills() override { return platform::ReadOomKillCount(); }
};

struct ResidencyOptions {
  uint64_t budget_bytes = 0;        // 0: none
  std::string budget_source;        // how it was chosen, said with it ("60% of 23.4 GiB of physical memory")
  int64_t keep_alive_ms = 300'000;  // for versions whose keep_alive is "default"; < 0: always
  int64_t load_wait_ms = 30'000;    // a load that does not fit waits at most this long
  bool unload_on_pressure = true;
  int64_t sample_ms = 1000;  // how often runners are measured and pressure read
};

// What a version measured, kept with its build.
struct Footprint {
  uint64_t at_load = 0;  // just after its load
  uint64_t peak = 0;     // the most it was measured at
};

struct LoadedRunner {
  std::shared_ptr<model::LoadedModel> model;  // what requests go to (its queue)
  std::function<int()> pid;                   // the runner's process id now; 0 while none runs
};

// A served version, as the reconciler hands it over.
struct ResidentVersion {
  std::string name;
  int64_t version = 0;
  std::shared_ptr<ResidentModel> model;
  // Seconds: storage::kKeepAliveDefault (the options'), kKeepAliveAlways,
  // 0 or more.
  int keep_alive_s = -1;
  int runners = 1;
  bool language_model = false;       // its sequences hold it between calls: never drained
  uint64_t files_bytes = 0;          // its build's files (code and weights)
  uint64_t state_bytes = 0;          // a language model's cache
  std::optional<Footprint> learned;  // from an earlier load of the same build and settings
  // Its build and settings: what one version measures, another with the
  // same `build` counts for too. Empty: its own.
  std::string build;
  // Loads it: `done` runs once, on the loop thread.
  std::function<void(std::function<void(StatusOr<LoadedRunner>)> done)> load;
  // Keeps what was measured with its build.
  std::function<void(const Footprint&)> learn;
  // Records an event of the version's ("unloaded", why).
  std::function<void(const std::string& kind, const std::string& message)> record;
};

// What residency tells the rest of the daemon.
struct ResidencyHooks {
  // A new report, after every change and sample.
  std::function<void(std::shared_ptr<const serving::ResidencyReport>)> report;
  // A load's wait (from its asking to its runner up), and an unload's cause
  // ("idle", "evicted", "budget", "pressure", "memory_kill").
  std::function<void(const std::string& name, int64_t version, double wait_s)> loaded;
  std::function<void(const std::string& name, int64_t version, const std::string& cause)> unloaded;
};

class Residency {
 public:
  // What a runner took here over its files, until one is measured.
  static constexpr uint64_t kRunnerBaseBytes = uint64_t{150} << 20;

  Residency(Loop* loop, MemoryProbe* probe, ResidencyOptions options, ResidencyHooks hooks = {});
  ~Residency();
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  void SetOptions(const ResidencyOptions& options);
  const ResidencyOptions& options() const { return options_; }

  // A served version's model, whose requests tell this residency when
  // they want it loaded and when they are done: what ResidentVersion::model
  // must be.
  std::shared_ptr<ResidentModel> NewModel(const std::string& name, int64_t version, model::ModelSpec spec,
                                          std::string device, int64_t max_batch_rows = 1);
  // `v` is served from now on (replacing what served the same version
  // before, which is retired). `loaded`: its runner, when the reconciler
  // loaded it already (a preload; see Reserve).
  void Add(ResidentVersion v, std::optional<LoadedRunner> loaded = std::nullopt);
  // No longer served: its waiting requests get `why`.
  void Remove(const std::string& name, int64_t version, const Status& why);
  void SetKeepAlive(const std::string& name, int64_t version, int keep_alive_s);
  // The keep_alive a version's setting means, in ms; < 0: always.
  int64_t KeepAliveMs(int keep_alive_s) const;

  // What a version counts for before it is loaded: its learned size, or
  // the estimate from its files.
  uint64_t Estimate(const ResidentVersion& v) const;
  // A load made outside (the reconciler's first load of a version): true
  // when `bytes` fit now with nothing unloaded, and are then counted until
  // Unreserve.
  bool Reserve(const std::string& key, uint64_t bytes);
  void Unreserve(const std::string& key);

  // The runner of a version crashed with `message`; one killed for memory
  // counts for more and is unloaded once idle.
  void RunnerCrashed(const std::string& name, int64_t version, const std::string& message);

  // No more loads; timers do nothing.
  void Stop();

  std::shared_ptr<const serving::ResidencyReport> Report() const;
  // For tests and the report: what resident and loading versions count for.
  uint64_t Used() const;

 private:
  enum class Phase { kOut, kQueued, kLoading, kIn };
  struct Entry {
    ResidentVersion v;
    Phase phase = Phase::kOut;
    std::function<int()> pid;
    uint64_t measured = 0;            // at the last sample, while resident
    uint64_t learned_saved_peak = 0;  // the peak last kept with the build
    uint64_t reserved = 0;            // while loading: its estimate
    int64_t last_used_ms = -1;
    int64_t asked_ms = 0;   // when its load was asked
    uint64_t ask_seq = 0;   // which asking its deadline belongs to
    uint64_t idle_seq = 0;  // which idle spell a keep-alive timer belongs to
    bool evict_when_idle = false;
    std::string evict_cause, evict_kind;
    std::string drained_for;  // the load it drains for
    uint64_t loads = 0, unloads = 0;
    int64_t refusal_logged_ms = -1;  // when a refusal of its loads was last logged
    uint64_t refusals_unlogged = 0;  // since then
  };

  static std::string Key(const std::string& name, int64_t version);
  Entry* Find(const std::string& key);
  void Want(const std::string& key, const std::shared_ptr<ResidentModel>& model);
  void Idle(const std::string& key, const std::shared_ptr<ResidentModel>& model);
  // Starts what waits, in order, while it fits.
  void Admit();
  void StartLoad(const std::string& key);
  void LoadDone(const std::string& key, uint64_t ask_seq, StatusOr<LoadedRunner> r);
  // Answers a waiting load's requests with `why`; FailWaiting also
  // admits what may start now.
  void Fail(const std::string& key, const Status& why);
  void FailWaiting(const std::string& key, const Status& why);
  // Ends the drains made for `key`'s load: no longer needed.
  void EndDrains(const std::string& key);
  bool Unload(Entry& e, const std::string& kind, const std::string& cause);
  void ScheduleKeepAlive(const std::string& key);
  void Sample();
  void ScheduleSample();
  uint64_t Charge(const Entry& e) const;
  bool Busy(const Entry& e) const;
  // Versions that hold the budget, in words, for a refusal.
  std::string Holders() const;
  void Learn(Entry& e, bool force);
  // Reads the OOM kill count; true when it rose within kOomWindowMs.
  bool RecentOomKill();
  static constexpr int64_t kOomWindowMs = 5000;
  static constexpr int64_t kRefusalLogMs = 10'000;
  void Publish();
  std::function<void()> Guard(std::function<void()> fn);

  Loop* loop_;
  MemoryProbe* probe_;
  ResidencyOptions options_;
  ResidencyHooks hooks_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> queue_;  // loads waiting for memory, first asked first
  std::map<std::string, uint64_t> reserved_;
  uint64_t runner_base_ = kRunnerBaseBytes;
  bool base_measured_ = false;
  uint64_t seq_ = 0;
  bool sampling_ = false;
  bool stopped_ = false;
  std::string pressure_text_ = "not read yet";
  // The OOM kill count at the last sample, and when it last rose.
  std::optional<uint64_t> oom_kills_;
  int64_t oom_rose_ms_ = -1;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace aotid::control
