#include "base/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "base/fs.h"

namespace aotid {
namespace {

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override { ::close(fd_); }
  PosixWritableFile(const PosixWritableFile&) = delete;
  PosixWritableFile& operator=(const PosixWritableFile&) = delete;

  Status Append(std::string_view data) override { return fs::WriteAll(fd_, data.data(), data.size(), path_); }
  Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoError("fsync " + path_, errno);
    return Status::OK();
  }
  int fd() const override { return fd_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
};

// Opens `path` with `flags` and fsyncs it.
Status Fsync(const std::string& path, int flags, const std::string& what) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path, errno);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(what + path, e);
  return Status::OK();
}

class PosixEnv : public Env {
 public:
  StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path, OpenMode mode,
                                                       unsigned perm) override {
    int flags = O_WRONLY | O_CLOEXEC;
    switch (mode) {
      case OpenMode::kCreateNew: flags |= O_CREAT | O_EXCL; break;
      case OpenMode::kTruncate: flags |= O_CREAT | O_TRUNC; break;
      case OpenMode::kExisting: flags |= O_APPEND; break;
    }
    int fd = ::open(path.c_str(), flags, perm);
    if (fd < 0) {
      int e = errno;
      if (e == EEXIST) return AlreadyExists("create " + path + ": it exists");
      return ErrnoError((mode == OpenMode::kExisting ? "open " : "create ") + path, e);
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoError("rename " + from + " to " + to, errno);
    return Status::OK();
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) {
      if (errno == ENOENT) return NotFound("remove " + path + ": no such file");
      return ErrnoError("remove " + path, errno);
    }
    return Status::OK();
  }

  Status Truncate(const std::string& path, int64_t size) override {
    if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) return ErrnoError("truncate " + path, errno);
    return Status::OK();
  }

  Status CreateDir(const std::string& path, unsigned mode) override {
    if (::mkdir(path.c_str(), static_cast<mode_t>(mode)) != 0) {
      if (errno == EEXIST) return AlreadyExists("create directory " + path + ": it exists");
      return ErrnoError("create directory " + path, errno);
    }
    return Status::OK();
  }

  Status SyncFile(const std::string& path) override { return Fsync(path, O_RDONLY, "fsync "); }
  Status SyncDir(const std::string& path) override {
    return Fsync(path, O_RDONLY | O_DIRECTORY, "fsync directory ");
  }

  StatusOr<std::string> ReadFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("open " + path, errno);
    std::string out;
    char buf[65536];
    for (;;) {
      ssize_t r = ::read(fd, buf, sizeof buf);
      if (r < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        ::close(fd);
        return ErrnoError("read " + path, e);
      }
      if (r == 0) break;
      out.append(buf, static_cast<size_t>(r));
    }
    ::close(fd);
    return out;
  }
};

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv;
  return env;
}

}  // namespace aotid
