// The file-system operations that decide what survives a crash, behind one
// interface, so that a test can stand between the store (or the build
// cache) and the disk: count the operations, stop at any one of them, and
// drop what was never made durable (tests/base/fault_env.h).
//
// Env::Default() is the real file system. EnvWrapper forwards every call to
// another Env, so a test overrides only what it watches. Reads, locks and
// directory listings stay outside: they change nothing on disk.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace aotid {

// A file open for writing, appended to in order. Closed by its destructor.
// Not thread-safe.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends all of `data` at the end of the file; IOError naming the file.
  virtual Status Append(std::string_view data) = 0;
  // fsync: everything appended so far survives a crash once this returns ok.
  virtual Status Sync() = 0;
  // The descriptor, for advisory locks (flock) only: bytes go through Append.
  virtual int fd() const = 0;
  virtual const std::string& path() const = 0;
};

class Env {
 public:
  virtual ~Env() = default;

  // The real file system; never null, never destroyed.
  static Env* Default();

  enum class OpenMode {
    kCreateNew,  // the file must not exist (O_EXCL): AlreadyExists if it does
    kTruncate,   // created, or emptied when it exists
    kExisting,   // the file must exist; appends go after its current end
  };
  // Opens `path` for writing; a created file gets mode `perm`. A new name
  // is durable only once its directory is synced (SyncDir).
  virtual StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path, OpenMode mode,
                                                               unsigned perm = 0644) = 0;
  // rename(2): replaces `to` when it exists. Durable once the directory of
  // `to` is synced.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // unlink(2); NotFound when absent. Durable once its directory is synced.
  virtual Status RemoveFile(const std::string& path) = 0;
  // truncate(2) to `size` bytes; durable once the file is synced.
  virtual Status Truncate(const std::string& path, int64_t size) = 0;
  // mkdir(2) of one directory (its parent must exist); AlreadyExists when
  // something is at `path`. Durable once its parent directory is synced.
  virtual Status CreateDir(const std::string& path, unsigned mode) = 0;
  // fsyncs a file written by someone else (another process): its bytes so
  // far survive a crash once this returns ok.
  virtual Status SyncFile(const std::string& path) = 0;
  // fsyncs a directory: the creations, renames and removals in it so far
  // survive a crash.
  virtual Status SyncDir(const std::string& path) = 0;
  // The whole file.
  virtual StatusOr<std::string> ReadFile(const std::string& path) = 0;
};

// Forwards every call to `target`, which must outlive it.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path, OpenMode mode,
                                                       unsigned perm = 0644) override {
    return target_->OpenForWrite(path, mode, perm);
  }
  Status Rename(const std::string& from, const std::string& to) override { return target_->Rename(from, to); }
  Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  Status Truncate(const std::string& path, int64_t size) override { return target_->Truncate(path, size); }
  Status CreateDir(const std::string& path, unsigned mode) override { return target_->CreateDir(path, mode); }
  Status SyncFile(const std::string& path) override { return target_->SyncFile(path); }
  Status SyncDir(const std::string& path) override { return target_->SyncDir(path); }
  StatusOr<std::string> ReadFile(const std::string& path) override { return target_->ReadFile(path); }

 private:
  Env* target_;
};

}  // namespace aotid
