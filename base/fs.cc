#include "base/fs.h"

#ifdef __APPLE__
#include <mach-o/dyld.h>
#endif
#include <fcntl.h>
#include <openssl/evp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <vector>

namespace aotid::fs {
namespace stdfs = std::filesystem;

namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

std::string DirName(const std::string& path) {
  auto parent = stdfs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

std::string RandomSuffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

struct EvpCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

std::string Hex(const unsigned char* p, unsigned n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (unsigned i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

// Streams `src` through sha256, handing each piece to `sink` when it is set.
StatusOr<std::string> HashStream(const std::string& src,
                                 const std::function<Status(std::string_view)>& sink) {
  Fd in(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) return ErrnoError("open " + src, errno);
  std::unique_ptr<EVP_MD_CTX, EvpCtxDeleter> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Internal("sha256 init failed");
  }
  std::unique_ptr<char[]> buf(new char[1 << 20]);
  for (;;) {
    ssize_t r = ::read(in.get(), buf.get(), 1 << 20);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read " + src, errno);
    }
    if (r == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.get(), static_cast<size_t>(r));
    if (sink) RETURN_IF_ERROR(sink(std::string_view(buf.get(), static_cast<size_t>(r))));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return Hex(md, len);
}

}  // namespace

Status WriteAll(int fd, const char* p, size_t n, const std::string& what) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write " + what, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Status MakeDirs(const std::string& path, unsigned mode) { return MakeDirs(Env::Default(), path, mode); }

Status MakeDirs(Env* env, const std::string& path, unsigned mode) {
  if (IsDirectory(path)) return Status::OK();
  // Missing levels from the top down; intermediate ones get the default
  // mode (less the umask), the last one `mode` exactly.
  std::vector<std::string> missing;
  stdfs::path p = stdfs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/"
  for (; !p.empty() && !IsDirectory(p.string()); p = p.parent_path()) {
    missing.push_back(p.string());
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    bool last = it + 1 == missing.rend();
    Status s = env->CreateDir(*it, last ? mode : 0777);
    if (s.code() == StatusCode::kAlreadyExists && IsDirectory(*it)) continue;  // made by another process
    if (!s.ok()) return s.WithContext("create directory " + path);
    if (last) ::chmod(it->c_str(), mode);  // exactly `mode`, whatever the umask
    // A new directory is only a name in its parent until the parent is
    // synced: a power cut would take it, and whatever was made durable in
    // it, away.
    RETURN_IF_ERROR(env->SyncDir(DirName(*it)));
  }
  return Status::OK();
}

Status FsyncDir(const std::string& path) { return Env::Default()->SyncDir(path); }

Status WriteFileAtomic(const std::string& path, std::string_view data) {
  return WriteFileAtomic(Env::Default(), path, data);
}

Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data) {
  std::string tmp = path + ".tmp-" + RandomSuffix();
  {
    ASSIGN_OR_RETURN(auto file, env->OpenForWrite(tmp, Env::OpenMode::kCreateNew));
    Status s = file->Append(data);
    if (s.ok()) s = file->Sync();
    if (!s.ok()) {
      (void)env->RemoveFile(tmp);
      return s;
    }
  }
  if (Status s = env->Rename(tmp, path); !s.ok()) {
    (void)env->RemoveFile(tmp);
    return s;
  }
  return env->SyncDir(DirName(path));
}

StatusOr<std::string> ReadFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("open " + path, errno);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd.get(), buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read " + path, errno);
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

StatusOr<std::string> CopyAndHashInto(const std::string& src, int dst_fd, const std::string& dst) {
  ASSIGN_OR_RETURN(std::string hex, HashStream(src, [&](std::string_view piece) {
                     return WriteAll(dst_fd, piece.data(), piece.size(), dst);
                   }));
  if (::fsync(dst_fd) != 0) return ErrnoError("fsync " + dst, errno);
  return hex;
}

StatusOr<std::string> CopyAndHashInto(const std::string& src, WritableFile* dst) {
  ASSIGN_OR_RETURN(std::string hex,
                   HashStream(src, [&](std::string_view piece) { return dst->Append(piece); }));
  RETURN_IF_ERROR(dst->Sync());
  return hex;
}

StatusOr<std::string> CopyAndHash(const std::string& src, const std::string& dst) {
  Fd out(::open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (out.get() < 0) return ErrnoError("create " + dst, errno);
  auto hex = CopyAndHashInto(src, out.get(), dst);
  if (!hex.ok()) ::unlink(dst.c_str());
  return hex;
}

StatusOr<std::string> Sha256File(const std::string& path) { return HashStream(path, nullptr); }

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return Hex(md, len);
}

bool IsSha256Hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StatusOr<std::string> MakeTempDir(const std::string& parent, std::string_view prefix) {
  RETURN_IF_ERROR(MakeDirs(parent));
  std::string templ = parent + "/" + std::string(prefix) + "XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return ErrnoError("mkdtemp in " + parent, errno);
  return templ;
}

Status RemoveAll(const std::string& path) {
  std::error_code ec;
  stdfs::remove_all(path, ec);
  if (ec) return IOError("remove " + path + ": " + ec.message());
  return Status::OK();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string ExpandHome(const std::string& path) {
  if (path == "~" || path.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    // Without $HOME (a service, `env -i`), the user's home from the
    // password database: never a folder named "~" in the working directory.
    if (home == nullptr || *home == '\0') {
      const passwd* pw = ::getpwuid(::getuid());
      home = pw != nullptr ? pw->pw_dir : nullptr;
    }
    if (home != nullptr && *home != '\0') return std::string(home) + path.substr(1);
  }
  return path;
}

std::string DefaultStoreDir() {
  if (const char* h = std::getenv("AOTID_HOME"); h != nullptr && *h) return h;
  if (const char* x = std::getenv("XDG_DATA_HOME"); x != nullptr && *x) {
    return std::string(x) + "/aotid";
  }
  return ExpandHome("~/.local/share/aotid");
}

std::string Absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof cwd) == nullptr) return path;
  std::string out = cwd;
  std::string_view rest = path;
  while (rest.rfind("./", 0) == 0) rest.remove_prefix(2);
  if (rest == ".") return out;
  return out + (out.back() == '/' ? "" : "/") + std::string(rest);
}

std::string RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

Status Allocate(int fd, int64_t bytes, const std::string& what) {
#ifdef F_PREALLOCATE  // macOS: no posix_fallocate
  fstore_t store{};
  store.fst_flags = F_ALLOCATEALL;
  store.fst_posmode = F_PEOFPOSMODE;
  store.fst_length = bytes;
  if (::fcntl(fd, F_PREALLOCATE, &store) != 0) return ErrnoError("allocating " + what, errno);
  if (::ftruncate(fd, bytes) != 0) return ErrnoError("allocating " + what, errno);
#else
  if (int e = ::posix_fallocate(fd, 0, bytes); e != 0) return ErrnoError("allocating " + what, e);
#endif
  return Status::OK();
}

std::string ExecutablePath() {
#ifdef __APPLE__
  uint32_t size = 0;
  _NSGetExecutablePath(nullptr, &size);
  std::string path(size, '\0');
  if (_NSGetExecutablePath(path.data(), &size) != 0) return "";
  path.resize(std::strlen(path.c_str()));
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) ? std::string(resolved) : path;
#else
  std::vector<char> buf(4096);
  ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
#endif
}

}  // namespace aotid::fs
