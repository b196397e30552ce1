// The daemon's own sync on a timer: each `[[sync]]` source of its config is
// synced into its store every `interval_s`, on a thread of its own (a sync
// waits on the network; the loop never does). A sync that adds a version
// commits it to the store like `aotid sync` would, and the daemon's store
// watch serves it from there: the previous version serves until the new one
// is ready.
//
// A failed sync is tried again sooner, backing off: 5 s, doubling, capped at
// the interval, each wait jittered by ±20% so that a fleet whose registry
// came back does not return all at once. The last result of each source is
// kept in <store>/sync-status.json (`aotid sync status`); a sync that added
// a version or failed is also an event in the store.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "sync/model_sync.h"

namespace aotid::sync {

struct SyncSource {
  std::string source;  // oci://HOST[:PORT]/REPO[:TAG]
  int interval_s = 300;
  int keep = 0;             // versions of the model kept after a sync adds one; 0: all
  std::string name;         // the store's name for it; empty: the pushed name
  std::string credentials;  // a Docker config file; empty: the default ones
  bool insecure = false;
  int timeout_s = 30;

  bool operator==(const SyncSource&) const = default;
};

// What the last sync of a source did.
struct SourceStatus {
  std::string source;
  int64_t last_at_ms = 0;  // 0: not yet
  bool ok = false;
  std::string message;     // "up to date: mlp:3", "added mlp:4", or the error
  int failures = 0;        // in a row
  int64_t next_at_ms = 0;  // wall clock, as due now; the syncer itself waits on a steady clock
  int64_t last_ok_at_ms = 0;
  int interval_s = 0;  // the source's, as the daemon has it
  int keep = 0;
  int64_t runs_ok = 0;  // since the daemon started (for /metrics)
  int64_t runs_failed = 0;
};

// One sync of one source: what happened, in a line, or the error.
// `cancel` is set when the daemon stops: a download under way ends at its
// next chunk (and the next sync continues it).
// `may_add` is asked before it adds a version of a model: it refuses a
// model another source feeds already.
using SyncOnce = std::function<StatusOr<std::string>(const SyncSource&, const std::atomic<bool>& cancel,
                                                     const MayAdd& may_add)>;

// The real one: opens the store in `store_dir` and pulls every tag the
// source names (sync::Pull), then trims the model to `keep` versions.
SyncOnce StoreSync(const std::string& store_dir);

class Syncer {
 public:
  // `status_file`: where the sources' status is written ("" for none).
  // Syncs are scheduled on `clock`'s steady time, so a step of the wall
  // clock neither delays nor bunches them; the times it reports are wall
  // times.
  Syncer(std::vector<SyncSource> sources, SyncOnce sync_once, std::string status_file,
         const Clock* clock = RealClock());
  ~Syncer();  // stops, waiting for a sync under way to end
  Syncer(const Syncer&) = delete;
  Syncer& operator=(const Syncer&) = delete;

  // New sources (a reload): each is synced at once, then on its interval.
  void SetSources(std::vector<SyncSource> sources) EXCLUDES(mu_);
  std::vector<SourceStatus> Status() const EXCLUDES(mu_);

  // The wait after `failures` failures in a row, before jitter.
  static int64_t BackoffMs(int failures, int interval_s);

 private:
  void Run();
  // The status as it stands, next_at_ms in wall time.
  std::vector<SourceStatus> Snapshot() const REQUIRES(mu_);
  // Writes a snapshot taken under mu_ without holding it (a disk's fsync
  // must not hold up Status(), hence /metrics); a snapshot older than one
  // already written is dropped.
  void WriteStatus(std::vector<SourceStatus> status, int64_t generation) EXCLUDES(mu_, write_mu_);

  const Clock* const clock_;
  mutable Mutex mu_;
  CondVar wake_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<SyncSource> sources_ GUARDED_BY(mu_);
  std::vector<SourceStatus> status_ GUARDED_BY(mu_);
  std::vector<int64_t> due_ms_ GUARDED_BY(mu_);  // per source, on clock_'s steady time
  int64_t generation_ GUARDED_BY(mu_) = 0;       // of status_, for WriteStatus
  Mutex write_mu_;                               // never taken with mu_ held
  int64_t written_generation_ GUARDED_BY(write_mu_) = 0;
  // Which source added each model's versions: a second source feeding the
  // same model is refused (each sync would replace the other's version).
  std::map<std::string, std::string> owners_ GUARDED_BY(mu_);
  const SyncOnce sync_once_;
  std::atomic<bool> cancel_{false};
  std::atomic<bool> finished_{false};  // Run returned
  std::string status_file_;
  std::thread thread_;
};

// Reads what a daemon wrote to `status_file`; empty when there is none.
std::vector<SourceStatus> ReadSyncStatus(const std::string& status_file);

}  // namespace aotid::sync
