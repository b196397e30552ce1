#include "tests/base/fault_env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <limits>

namespace aotid::testing {
namespace stdfs = std::filesystem;

std::string CleanPath(const std::string& path) {
  std::string p = stdfs::path(path).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A file whose appends and syncs go through the env's bookkeeping.
class FaultWritableFile : public WritableFile {
 public:
  FaultWritableFile(FaultInjectionEnv* env, std::unique_ptr<WritableFile> target)
      : env_(env), target_(std::move(target)), path_(CleanPath(target_->path())) {}

  Status Append(std::string_view data) override {
    struct stat st;
    if (::fstat(target_->fd(), &st) != 0) return ErrnoError("stat " + path_, errno);
    RETURN_IF_ERROR(env_->BeforeWrite(path_, st.st_size, static_cast<int64_t>(data.size())));
    return target_->Append(data);
  }
  Status Sync() override { return env_->FileSynced(path_); }
  int fd() const override { return target_->fd(); }
  const std::string& path() const override { return target_->path(); }

 private:
  FaultInjectionEnv* env_;
  std::unique_ptr<WritableFile> target_;
  std::string path_;
};

}  // namespace

FaultInjectionEnv::FaultInjectionEnv(std::string scratch)
    : EnvWrapper(Env::Default()), scratch_(CleanPath(scratch)) {}

void FaultInjectionEnv::CrashAtOp(int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  crash_at_ = n;
}

int64_t FaultInjectionEnv::ops() const {
  std::lock_guard<std::mutex> l(mu_);
  return ops_;
}

bool FaultInjectionEnv::crashed() const {
  std::lock_guard<std::mutex> l(mu_);
  return crashed_;
}

std::string FaultInjectionEnv::Parent(const std::string& path) {
  return stdfs::path(path).parent_path().string();
}

void FaultInjectionEnv::Repath(Undo* u, const std::string& from, const std::string& to) {
  if (u->path == from) {
    // A creation of the old name stays with the old name (Rename decides
    // what undoing it means).
    if (u->kind == Undo::kContent || u->kind == Undo::kRename) u->path = to;
  } else if (u->path.starts_with(from + "/")) {
    u->path = to + u->path.substr(from.size());  // inside a renamed directory
  }
}

std::string FaultInjectionEnv::Backup() { return scratch_ + "/removed-" + std::to_string(backups_++); }

Status FaultInjectionEnv::Step(const std::string& what) {
  if (!crashed_ && ops_ == crash_at_) crashed_ = true;
  ++ops_;
  if (crashed_) return IOError("injected crash: " + what + " was not done");
  return Status::OK();
}

Status FaultInjectionEnv::SaveContent(const std::string& path, int64_t offset, int64_t end) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("fault env: open " + path, errno);
  struct stat st;
  ::fstat(fd, &st);
  Undo u{Undo::kContent, path};
  u.offset = offset;
  u.old_size = st.st_size;
  int64_t stop = std::min<int64_t>(end, st.st_size);
  if (stop > offset) {
    u.old_bytes.resize(static_cast<size_t>(stop - offset));
    ssize_t r = ::pread(fd, u.old_bytes.data(), u.old_bytes.size(), offset);
    if (r != static_cast<ssize_t>(u.old_bytes.size())) {
      ::close(fd);
      return IOError("fault env: short read of " + path);
    }
  }
  ::close(fd);
  undo_.push_back(std::move(u));
  return Status::OK();
}

Status FaultInjectionEnv::BeforeWrite(const std::string& path, int64_t offset, int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  std::string p = CleanPath(path);
  RETURN_IF_ERROR(Step("write " + p));
  return SaveContent(p, offset, offset + n);
}

Status FaultInjectionEnv::BeforeTruncate(const std::string& path, int64_t size) {
  std::lock_guard<std::mutex> l(mu_);
  std::string p = CleanPath(path);
  RETURN_IF_ERROR(Step("truncate " + p));
  return SaveContent(p, size, std::numeric_limits<int64_t>::max());
}

Status FaultInjectionEnv::BeforeCreate(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  std::string p = CleanPath(path);
  RETURN_IF_ERROR(Step("create " + p));
  undo_.push_back(Undo{Undo::kCreate, p});
  return Status::OK();
}

Status FaultInjectionEnv::FileSynced(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  std::string p = CleanPath(path);
  RETURN_IF_ERROR(Step("sync " + p));
  std::erase_if(undo_, [&](const Undo& u) { return u.kind == Undo::kContent && u.path == p; });
  return Status::OK();
}

StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::OpenForWrite(const std::string& path,
                                                                        OpenMode mode, unsigned perm) {
  std::string p = CleanPath(path);
  bool exists = Exists(p);
  if (!exists && mode != OpenMode::kExisting) {
    RETURN_IF_ERROR(BeforeCreate(p));
  } else if (exists && mode == OpenMode::kTruncate) {
    RETURN_IF_ERROR(BeforeTruncate(p, 0));
  }
  ASSIGN_OR_RETURN(auto file, target()->OpenForWrite(path, mode, perm));
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, std::move(file)));
}

Status FaultInjectionEnv::Rename(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> l(mu_);
  std::string f = CleanPath(from), t = CleanPath(to);
  RETURN_IF_ERROR(Step("rename " + f + " to " + t));
  if (!Exists(f)) return NotFound("rename " + f + ": no such file");
  Undo u{Undo::kRename, t};
  u.from = f;
  if (Exists(t)) {
    u.backup = Backup();
    if (::rename(t.c_str(), u.backup.c_str()) != 0) return ErrnoError("fault env: set aside " + t, errno);
  }
  if (Status s = target()->Rename(f, t); !s.ok()) {
    if (!u.backup.empty()) ::rename(u.backup.c_str(), t.c_str());
    return s;
  }
  // A name that was never durable (its latest arrival is a creation, not a
  // rename): undoing the rename undoes the creation.
  for (size_t i = undo_.size(); i-- > 0;) {
    const Undo& x = undo_[i];
    if (x.path != f || (x.kind != Undo::kCreate && x.kind != Undo::kRename)) continue;
    if (x.kind == Undo::kCreate) {
      u.created = true;
      undo_.erase(undo_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    break;
  }
  // What is recorded of the file (or of what is in the directory) follows
  // it to its new name.
  for (Undo& x : undo_) Repath(&x, f, t);
  undo_.push_back(std::move(u));
  return Status::OK();
}

Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  std::string p = CleanPath(path);
  RETURN_IF_ERROR(Step("remove " + p));
  if (!Exists(p)) return NotFound("remove " + p + ": no such file");
  Undo u{Undo::kRemove, p};
  u.backup = Backup();
  if (::rename(p.c_str(), u.backup.c_str()) != 0) return ErrnoError("remove " + p, errno);
  undo_.push_back(std::move(u));
  return Status::OK();
}

Status FaultInjectionEnv::Truncate(const std::string& path, int64_t size) {
  RETURN_IF_ERROR(BeforeTruncate(path, size));
  return target()->Truncate(path, size);
}

Status FaultInjectionEnv::CreateDir(const std::string& path, unsigned mode) {
  std::lock_guard<std::mutex> l(mu_);
  std::string p = CleanPath(path);
  RETURN_IF_ERROR(Step("mkdir " + p));
  RETURN_IF_ERROR(target()->CreateDir(p, mode));
  undo_.push_back(Undo{Undo::kMkdir, p});
  return Status::OK();
}

Status FaultInjectionEnv::SyncDir(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  std::string d = CleanPath(path);
  RETURN_IF_ERROR(Step("sync directory " + d));
  std::vector<std::string> removed;  // names whose removal is now durable
  std::erase_if(undo_, [&](const Undo& u) {
    if (u.kind == Undo::kContent || Parent(u.path) != d) return false;
    if (!u.backup.empty()) {
      std::error_code ec;
      stdfs::remove_all(u.backup, ec);
    }
    if (u.kind == Undo::kRemove) removed.push_back(u.path);
    return true;
  });
  // The unsynced writes of a file whose removal is durable went with it.
  for (const auto& r : removed) {
    std::erase_if(undo_, [&](const Undo& u) { return u.kind == Undo::kContent && u.path == r; });
  }
  return Status::OK();
}

Status FaultInjectionEnv::DropUnsynced() {
  std::lock_guard<std::mutex> l(mu_);
  Status first;
  auto note = [&](Status s) {
    if (first.ok() && !s.ok()) first = s;
  };
  for (size_t i = undo_.size(); i-- > 0;) {
    const Undo& u = undo_[i];
    std::error_code ec;
    switch (u.kind) {
      case Undo::kContent: {
        int fd = ::open(u.path.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0) break;  // removed, durably
        if (!u.old_bytes.empty() && ::pwrite(fd, u.old_bytes.data(), u.old_bytes.size(), u.offset) !=
                                        static_cast<ssize_t>(u.old_bytes.size())) {
          note(ErrnoError("fault env: restore " + u.path, errno));
        }
        if (::ftruncate(fd, u.old_size) != 0) note(ErrnoError("fault env: truncate " + u.path, errno));
        ::close(fd);
        break;
      }
      case Undo::kCreate:
      case Undo::kMkdir: stdfs::remove_all(u.path, ec); break;
      case Undo::kRename: {
        if (u.created) {
          stdfs::remove_all(u.path, ec);
        } else {
          if (::rename(u.path.c_str(), u.from.c_str()) != 0)
            note(ErrnoError("fault env: undo rename", errno));
          for (size_t j = 0; j < i; ++j) Repath(&undo_[j], u.path, u.from);
        }
        if (!u.backup.empty() && ::rename(u.backup.c_str(), u.path.c_str()) != 0)
          note(ErrnoError("fault env: restore " + u.path, errno));
        break;
      }
      case Undo::kRemove:
        if (::rename(u.backup.c_str(), u.path.c_str()) != 0)
          note(ErrnoError("fault env: restore " + u.path, errno));
        break;
    }
    if (ec) note(IOError("fault env: undo " + u.path + ": " + ec.message()));
  }
  undo_.clear();
  ops_ = 0;
  crash_at_ = -1;
  crashed_ = false;
  return first;
}

}  // namespace aotid::testing
