// An Env for crash tests: it writes through to the real files, counts every
// operation that changes the disk, stops at a chosen one, and then puts the
// disk back as a power cut at that point would have left it.
//
// What it models, for files written through it (and SQLite's files, through
// tests/storage/fault_vfs.h):
//   - bytes written or truncated since the file's last sync are lost;
//   - a file or directory created, renamed or removed since the last sync
//     of the directory that holds its (new) name is not: a creation is
//     undone, a rename moved back (or, when its source was itself never
//     made durable, undone as a creation), a removal undone (removed files
//     are kept aside until their directory is synced);
//   - a directory whose creation is undone takes everything in it along.
// What it does not: a sync that makes only some of the unsynced writes
// durable, writes reordered or torn within a sync, and files changed
// behind its back (those count as durable). It never fsyncs for real: the
// power cut is its own.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "base/env.h"

namespace aotid::testing {

class FaultInjectionEnv : public EnvWrapper {
 public:
  // `scratch`: an empty directory on the same file system as the files
  // written, where removed files wait until their removal is durable.
  explicit FaultInjectionEnv(std::string scratch);

  // The operation numbered `n` (0-based) and every one after it fail with
  // IOError and change nothing. -1 (the default): none fails.
  void CrashAtOp(int64_t n);
  // Operations counted so far (the one refused included).
  int64_t ops() const;
  bool crashed() const;

  // Undoes, newest first, everything not made durable (see above). Call it
  // after every file written through this env is closed; afterwards the env
  // is back to counting from a clean disk, crash point cleared.
  Status DropUnsynced();

  // Env.
  StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path, OpenMode mode,
                                                       unsigned perm = 0644) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status RemoveFile(const std::string& path) override;
  Status Truncate(const std::string& path, int64_t size) override;
  Status CreateDir(const std::string& path, unsigned mode) override;
  Status SyncFile(const std::string& path) override { return FileSynced(path); }
  Status SyncDir(const std::string& path) override;

  // For wrappers that apply the change themselves (the SQLite VFS): each
  // counts as one operation and fails, changing nothing, once crashed;
  // when ok, the caller applies the change.
  Status BeforeWrite(const std::string& path, int64_t offset, int64_t n);
  Status BeforeTruncate(const std::string& path, int64_t size);
  Status BeforeCreate(const std::string& path);  // a new file, about to be created
  Status FileSynced(const std::string& path);

 private:
  struct Undo {
    enum Kind { kContent, kCreate, kMkdir, kRename, kRemove } kind;
    std::string path;       // the file, or the new name of a rename
    std::string from;       // kRename: the old name
    std::string backup;     // kRename: the file it replaced; kRemove: the file
    bool created = false;   // kRename: its source name was never durable
    int64_t offset = 0;     // kContent: where old_bytes go back
    std::string old_bytes;  // kContent
    int64_t old_size = 0;   // kContent: the size to truncate back to
  };
  Status Step(const std::string& what);                                      // REQUIRES: mu_ held
  Status SaveContent(const std::string& path, int64_t offset, int64_t end);  // REQUIRES: mu_ held
  std::string Backup();                                                      // REQUIRES: mu_ held
  static std::string Parent(const std::string& path);
  static void Repath(Undo* u, const std::string& from, const std::string& to);

  const std::string scratch_;
  mutable std::mutex mu_;
  int64_t ops_ = 0;
  int64_t crash_at_ = -1;
  bool crashed_ = false;
  int64_t backups_ = 0;
  std::vector<Undo> undo_;  // oldest first
};

// Normalizes a path the way the env compares them.
std::string CleanPath(const std::string& path);

}  // namespace aotid::testing
