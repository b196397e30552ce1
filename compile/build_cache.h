// The cache of builds for this machine, under <store>/cache:
//
//   <artifact sha256>/<package model>.<device>.<fingerprint>[.<sha256 of options>]/
//       model.so      the compiled model with its weights, loaded in place
//       spec.json     inputs and outputs (names, datatypes, shapes)
//       package.json  the package's metadata (AOTInductor's and the author's)
//       generate.json a language model's generate spec and tokenizer (only those)
//       embed.json    a sentence encoder's embed spec and tokenizer (only those)
//       *.cubin ...   kernel files a device model opens by name from the
//                     folder its runner is given (IsKernelFile); only those
//       build.log     the build's output
//       manifest.json what the entry holds, with file sizes; written last
//   <artifact sha256>/<entry>.failed.log   the log of the last build of that
//       entry that failed (removed when one succeeds)
//   .staging/<owner>/       entries being built by one BuildCache (one
//       daemon), and its runners' scratch directories; never read
//   .staging/<owner>.lock   held (flock) by that owner for its life
//   .locks/<digest>.lock    held by the daemon building that key (LockBuild)
//
// Several daemons, each with a store of its own, may share one cache (a
// node's builds, `build.cache_dir`): each builds in a staging directory of
// its own, and a start cleans only the staging of owners that are gone
// (whose lock it can take), never a live one's. A build committed for a
// key that another daemon committed first keeps the one already there.
//
// An entry appears by rename of a complete staging directory, so a crash
// leaves either a whole entry or none. An entry whose files do not match its
// manifest is treated as absent (and rebuilt).
#pragma once

#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "base/env.h"
#include "base/status.h"
#include "model/cache_entry.h"
#include "model/tensor.h"

namespace aotid::compile {

// Whether `name` is a kernel file a compiled model opens at run time from
// the folder its runner is given (bin_dir), rather than from model.so:
// CUDA's .cubin and .fatbin (torch writes one per Triton kernel unless
// aot_inductor.embed_kernel_binary), ROCm's .hsaco, XPU's .spv. A build
// keeps a package's kernel files beside model.so, by their own names.
bool IsKernelFile(const std::string& name);

struct BuildKey {
  std::string artifact;  // sha256 hex
  std::string package_model;
  std::string device;  // "cpu", "cuda", "mps"
  std::string fingerprint;
  std::string options;  // inductor options (JSON object text), "" for none

  bool operator==(const BuildKey&) const = default;
  // "artifact/package_model/device/fingerprint/options", for logs and maps.
  std::string ToString() const;
};

// Threads per run that timing this build on this machine chose
// (runtime/thread_choice.h), kept in its entry (threads.json, one record
// per key: versions sharing a build may time it at different batches) so
// that later loads use a settled one rather than time it again.
struct RecordedFootprint {
  std::string key;
  uint64_t at_load = 0;  // just after a load
  uint64_t peak = 0;     // the most it was measured at
  int64_t at_ms = 0;     // when, wall clock
};

struct RecordedThreads {
  std::string key;  // what the timing depended on (machine, most threads, batch); reused only on a match
  int threads = 0;
  std::string note;  // as the timing said it
  int64_t at_ms = 0;
  bool settled = true;  // false: the machine was busy; kept only so that `set threads=` can ask again
};

// One entry as `aotid cache ls` shows it.
struct CacheListing {
  std::string dir;
  BuildKey key;
  int64_t bytes = 0;
  Status status;  // ok, or what is wrong with it (missing files, older layout)
};

class BuildCache {
 public:
  // `env`: the file system entries are published through (Commit); it
  // must outlive the cache.
  explicit BuildCache(std::string root, Env* env = Env::Default()) : root_(std::move(root)), env_(env) {}
  // Removes this cache's own staging directory, if it made one, and lets
  // its lock go.
  ~BuildCache();
  BuildCache(const BuildCache&) = delete;
  BuildCache& operator=(const BuildCache&) = delete;

  // Ok with the entry when it is complete and intact and its manifest names
  // exactly `key`; NotFound when absent; Corruption (with what is wrong)
  // when present but damaged or built for another key. When a load of the
  // entry ended its process (LoadCrashed): Corruption if model.so no longer
  // matches its digest (rebuild it); FailedPrecondition once that happened
  // kMaxUnfinishedLoads times in a row to an intact entry (do not load it
  // again).
  StatusOr<model::CacheEntry> Lookup(const BuildKey& key) const;

  // model.so against the digest its manifest recorded; Corruption on a
  // mismatch. Reads the whole file.
  Status VerifyDigest(const model::CacheEntry& entry) const;

  // Lookup, and VerifyDigest of what it found: an entry that a build may
  // take as its own (another daemon sharing the cache made it) rather than
  // replace. Damage in place, which Lookup alone cannot see, is what a
  // rebuild of an entry of that key may be for.
  StatusOr<model::CacheEntry> LookupSound(const BuildKey& key) const;

  // Brackets a load of `entry` by this process with a marker file, so the
  // next process to look the entry up knows when a load ended the process
  // that made it (a damaged build can crash while loading).
  Status BeginLoad(const model::CacheEntry& entry) const;
  void EndLoad(const model::CacheEntry& entry) const;
  // A load of `entry` by another process that never finished: how many in
  // a row, and what is known of the last. Nothing when none is known, or
  // when the load is another live daemon's (a cache shared by several).
  struct UnfinishedLoad {
    int attempts = 1;
    std::string why;
  };
  std::optional<UnfinishedLoad> LoadCrashed(const model::CacheEntry& entry) const;
  // Unfinished loads of an intact entry before Lookup stops offering it.
  static constexpr int kMaxUnfinishedLoads = 2;

  // A fresh, empty staging directory for a build of `key`, inside this
  // cache's own staging directory (OpenStaging, done here if not yet).
  StatusOr<std::string> NewStaging(const BuildKey& key) const;

  // Checks the staging directory holds model.so, package.json and a valid spec.json,
  // writes the manifest (which names its kernel files too, so that Lookup
  // finds one missing), and renames it into place (replacing a damaged
  // entry). When the place already holds a sound entry for `key` (another
  // daemon sharing the cache committed it first), that one is kept, and
  // returned: an entry another process may be loading is never moved. The
  // one `replaces` names (EntryIdentity, taken when the build started: the
  // entry it was asked to mend) is replaced, sound or not. The staging
  // directory is gone afterwards either way.
  StatusOr<model::CacheEntry> Commit(const std::string& staging, const BuildKey& key,
                                     const std::string& replaces = "") const;
  // Which entry is at `entry_dir`: its manifest's file ("" when none). An
  // entry committed anew there is another.
  static std::string EntryIdentity(const std::string& entry_dir);

  // Makes this cache's own staging directory (.staging/<owner>/), holding
  // its lock for the cache's life, and removes the staging of every owner
  // that is gone: one whose lock it can take (a daemon that ended, killed
  // or not), or a directory with no lock (an older aotid's). Owners alive
  // in other processes are left alone. `before_removing` is called with
  // each such directory first (serve kills the processes a killed
  // daemon's builds left in it). Idempotent: a second call does nothing.
  Status OpenStaging(const std::function<void(const std::string& dir)>& before_removing = {}) const;
  // Takes the lock of builds of `key` among the daemons sharing the cache,
  // without waiting: its descriptor (close it to let go), or -1 when
  // another holds it (a build of that key is running elsewhere).
  StatusOr<int> LockBuild(const BuildKey& key) const;

  // This cache's own staging directory; "" before OpenStaging. Runners'
  // scratch directories go beneath it too.
  std::string staging_dir() const;

  // Every entry (complete or not) under the root.
  std::vector<CacheListing> List() const;

  // The entry's recorded threads for `key`; nullopt when none (or
  // unreadable: it is only a shortcut, and timing again replaces it).
  std::optional<RecordedThreads> ReadThreads(const std::string& entry_dir, const std::string& key) const;
  // Every well-formed record of the entry.
  std::vector<RecordedThreads> ListThreads(const std::string& entry_dir) const;
  // Adds or replaces the record of r.key (at most 16 kept, the newest).
  Status RecordThreads(const std::string& entry_dir, const RecordedThreads& r) const;
  // Removes the record, so the next load times the build again; true when
  // there was one.
  bool ForgetThreads(const std::string& entry_dir) const;

  // What versions running this build measured in memory (control/residency.h),
  // kept in its entry (footprint.json, one record per key: the settings
  // that change it, such as runners and sequences), so that later loads
  // are admitted by the measured size. nullopt when none or unreadable.
  std::optional<RecordedFootprint> ReadFootprint(const std::string& entry_dir, const std::string& key) const;
  // Adds or replaces the record of r.key (at most 16 kept, the newest).
  Status RecordFootprint(const std::string& entry_dir, const RecordedFootprint& r) const;
  // The bytes of the entry's files: its code and weights.
  static uint64_t EntryBytes(const std::string& entry_dir);

  std::string EntryDir(const BuildKey& key) const;
  // Where the log of the last failed build of `key` is kept.
  std::string FailedLogPath(const BuildKey& key) const { return EntryDir(key) + ".failed.log"; }
  // Removes the failed builds' logs of every artifact not in `used`, and
  // the artifact folders they leave empty; how many logs (with `dry_run`:
  // would be removed).
  int RemoveFailedLogs(const std::set<std::string>& used, bool dry_run) const;
  const std::string& root() const { return root_; }

 private:
  StatusOr<model::CacheEntry> LookupFiles(const BuildKey& key) const;
  Status OpenStagingLocked(const std::function<void(const std::string& dir)>& before_removing) const;
  // The name of this cache's staging owner ("" before OpenStaging), and
  // whether another's still lives (holds its lock).
  std::string OwnerId() const;
  bool OwnerAlive(const std::string& owner) const;
  std::string root_;
  Env* env_;
  // This cache's staging (OpenStaging): made once, on first need, by
  // whichever thread asks; the lock file's descriptor is held until the end.
  mutable std::mutex staging_mu_;
  mutable std::string staging_dir_;
  mutable int staging_lock_fd_ = -1;
};

}  // namespace aotid::compile
