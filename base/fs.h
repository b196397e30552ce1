// File system helpers with the durability rules aotid relies on: anything
// that must survive a crash is written to a temporary name in the same
// directory, fsynced, renamed into place, and the directory fsynced.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/env.h"
#include "base/status.h"

namespace aotid::fs {

// Creates `path` and its parents (mode 0755 unless given), each durable
// (its parent fsynced) before it returns. Ok if it exists; an existing
// directory keeps its mode.
Status MakeDirs(const std::string& path, unsigned mode = 0755);
// The same through `env`.
Status MakeDirs(Env* env, const std::string& path, unsigned mode = 0755);

// fsyncs a directory so that renames and creations inside it are durable.
Status FsyncDir(const std::string& path);

// Writes `data` to `path` atomically: temp file, fsync, rename, fsync dir.
Status WriteFileAtomic(const std::string& path, std::string_view data);
// The same through `env`.
Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data);

// Reads the whole file.
StatusOr<std::string> ReadFile(const std::string& path);

// Copies `src` to `dst` (which must not exist), fsyncs it, and returns the
// lowercase hex sha256 of the bytes copied. `dst` is removed on failure.
StatusOr<std::string> CopyAndHash(const std::string& src, const std::string& dst);
// The same into an open file descriptor (`dst` names it in errors); the
// caller owns the file and removes it on failure.
StatusOr<std::string> CopyAndHashInto(const std::string& src, int dst_fd, const std::string& dst);
// The same into a file opened through an Env.
StatusOr<std::string> CopyAndHashInto(const std::string& src, WritableFile* dst);

// Writes all of `n` bytes (retrying short writes and EINTR); `what` names
// the file in the error.
Status WriteAll(int fd, const char* p, size_t n, const std::string& what);

// Gives the file open at `fd` its first `bytes` bytes on disk, blocks
// allocated (not a sparse hole), so that freeing the file later frees them.
// posix_fallocate; macOS has none and takes fcntl(F_PREALLOCATE) then
// ftruncate. An error naming `what` when the disk is full.
Status Allocate(int fd, int64_t bytes, const std::string& what);

// Lowercase hex sha256 of a file's contents.
StatusOr<std::string> Sha256File(const std::string& path);
// Lowercase hex sha256 of `data`.
std::string Sha256Hex(std::string_view data);

// True for exactly 64 lowercase hex digits: the only digests from which a
// path is ever derived.
bool IsSha256Hex(std::string_view s);

// `path` with every link and "." or ".." resolved; `path` unchanged when
// it cannot be (it does not exist, or a folder on the way is closed).
std::string RealPath(const std::string& path);

// The running executable's absolute path ("" when the OS will not say).
std::string ExecutablePath();

// A new, empty, uniquely named directory inside `parent`.
StatusOr<std::string> MakeTempDir(const std::string& parent, std::string_view prefix);

// Removes a file or a directory tree; ok if absent.
Status RemoveAll(const std::string& path);

bool Exists(const std::string& path);
bool IsDirectory(const std::string& path);

// The default store directory: $AOTID_HOME, else $XDG_DATA_HOME/aotid, else
// ~/.local/share/aotid.
std::string DefaultStoreDir();

// Expands a leading "~/" with $HOME.
std::string ExpandHome(const std::string& path);

// `path` from the root: a relative one is taken from the working directory
// now, so that it means the same to a child that runs elsewhere (a build's
// compiler runs in a folder of its own). Unchanged when the working
// directory cannot be read.
std::string Absolute(const std::string& path);

}  // namespace aotid::fs
