#include "storage/model_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>
#include <thread>

#include "base/crash_point.h"
#include "base/fs.h"
#include "base/log.h"

namespace aotid::storage {
namespace {

// Each entry migrates schema version i to i+1. Never edit a shipped entry;
// append a new one and bump kSchemaVersion.
const char* const kMigrations[] = {
    // 0 -> 1
    R"sql(
    CREATE TABLE artifacts(
      sha256 TEXT PRIMARY KEY CHECK(length(sha256) = 64),
      kind TEXT NOT NULL,
      size INTEGER NOT NULL,
      added_at_ms INTEGER NOT NULL);
    CREATE TABLE models(
      id INTEGER PRIMARY KEY,
      name TEXT NOT NULL UNIQUE,
      created_at_ms INTEGER NOT NULL);
    CREATE TABLE versions(
      model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
      version INTEGER NOT NULL CHECK(version >= 1),
      artifact TEXT NOT NULL REFERENCES artifacts(sha256),
      package_model TEXT NOT NULL DEFAULT 'model',
      device TEXT NOT NULL DEFAULT 'auto',
      num_runners INTEGER NOT NULL DEFAULT 1,
      created_at_ms INTEGER NOT NULL,
      PRIMARY KEY(model_id, version));
    CREATE TABLE builds(
      artifact TEXT NOT NULL REFERENCES artifacts(sha256) ON DELETE CASCADE,
      package_model TEXT NOT NULL,
      fingerprint TEXT NOT NULL,
      device TEXT NOT NULL,
      state TEXT NOT NULL,
      error TEXT NOT NULL DEFAULT '',
      started_at_ms INTEGER NOT NULL DEFAULT 0,
      finished_at_ms INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY(artifact, package_model, fingerprint));
    CREATE TABLE events(
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      at_ms INTEGER NOT NULL,
      model TEXT NOT NULL DEFAULT '',
      version INTEGER NOT NULL DEFAULT 0,
      kind TEXT NOT NULL,
      message TEXT NOT NULL);
    )sql",
    // 1 -> 2: per-version serving settings, per-model version policy, and
    // the indexes that `rm`, `gc` and `show` use.
    R"sql(
    ALTER TABLE versions ADD COLUMN fallback_cpu INTEGER NOT NULL DEFAULT 1
      CHECK(fallback_cpu IN (0, 1));
    ALTER TABLE versions ADD COLUMN max_batch_size INTEGER NOT NULL DEFAULT 1
      CHECK(max_batch_size >= 1);
    ALTER TABLE versions ADD COLUMN max_batch_delay_us INTEGER NOT NULL DEFAULT 0
      CHECK(max_batch_delay_us >= 0);
    ALTER TABLE models ADD COLUMN version_policy TEXT NOT NULL DEFAULT 'latest';
    CREATE INDEX versions_by_artifact ON versions(artifact);
    CREATE INDEX events_by_model ON events(model, id);
    )sql",
    // 2 -> 3: whether a model is served at all (the repository API's
    // load/unload, `aotid set NAME enabled=...`).
    R"sql(
    ALTER TABLE models ADD COLUMN enabled INTEGER NOT NULL DEFAULT 1 CHECK(enabled IN (0, 1));
    )sql",
    // 3 -> 4: threads per runner and inductor options per version; builds
    // keyed by device and options too (a fallback build for the CPU sits
    // beside the failed one for the device), with their progress and the
    // number of attempts.
    R"sql(
    ALTER TABLE versions ADD COLUMN threads INTEGER NOT NULL DEFAULT 0 CHECK(threads >= 0);
    ALTER TABLE versions ADD COLUMN inductor_options TEXT NOT NULL DEFAULT '';
    CREATE TABLE builds4(
      artifact TEXT NOT NULL REFERENCES artifacts(sha256) ON DELETE CASCADE,
      package_model TEXT NOT NULL,
      fingerprint TEXT NOT NULL,
      device TEXT NOT NULL,
      options TEXT NOT NULL DEFAULT '',
      state TEXT NOT NULL,
      error TEXT NOT NULL DEFAULT '',
      started_at_ms INTEGER NOT NULL DEFAULT 0,
      finished_at_ms INTEGER NOT NULL DEFAULT 0,
      progress TEXT NOT NULL DEFAULT '',
      attempts INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY(artifact, package_model, fingerprint, device, options));
    INSERT INTO builds4(artifact, package_model, fingerprint, device, state, error, started_at_ms, finished_at_ms,
                        attempts)
      SELECT artifact, package_model, fingerprint, device, state, error, started_at_ms, finished_at_ms, 1 FROM builds;
    DROP TABLE builds;
    ALTER TABLE builds4 RENAME TO builds;
    )sql",
    // 4 -> 5: a version's own runner limits (0: the daemon's).
    R"sql(
    ALTER TABLE versions ADD COLUMN timeout_s INTEGER NOT NULL DEFAULT 0 CHECK(timeout_s >= 0);
    ALTER TABLE versions ADD COLUMN memory_limit_mb INTEGER NOT NULL DEFAULT 0 CHECK(memory_limit_mb >= 0);
    )sql",
    // 5 -> 6: the sequences a language model serves at once (0: as many
    // as its cache holds).
    R"sql(
    ALTER TABLE versions ADD COLUMN max_sequences INTEGER NOT NULL DEFAULT 0 CHECK(max_sequences >= 0);
    )sql",
    // 6 -> 7: how long a version stays loaded without requests, in seconds
    // (-1: the config's residency.keep_alive; -2: always).
    R"sql(
    ALTER TABLE versions ADD COLUMN keep_alive_s INTEGER NOT NULL DEFAULT -1 CHECK(keep_alive_s >= -2);
    )sql",
};
static_assert(std::size(kMigrations) == kSchemaVersion);

// A version row: these columns, then its settings (version_settings.h).
constexpr int kVersionSettingsColumn = 7;
const std::string& VersionColumns() {
  static const auto* columns = new std::string(
      "m.name, v.version, v.artifact, a.kind, v.package_model, a.size, v.created_at_ms, " +
      SettingColumns("v") +
      " FROM versions v JOIN models m ON m.id = v.model_id JOIN artifacts a ON a.sha256 = v.artifact");
  return *columns;
}

ModelVersion ReadVersion(const Stmt& s) {
  ModelVersion v;
  v.model = s.Text(0);
  v.version = s.Int(1);
  v.artifact = s.Text(2);
  v.kind = package::ParsePackageKind(s.Text(3)).value_or(package::PackageKind::kExportedProgram);
  v.package_model = s.Text(4);
  v.size = s.Int(5);
  v.created_at_ms = s.Int(6);
  ReadSettings(s, kVersionSettingsColumn, &v.settings);
  return v;
}

// "?, ?, ?" for n parameters.
std::string Placeholders(size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += i ? ", ?" : "?";
  return out;
}

std::string JoinVersions(const std::vector<int64_t>& vs) {
  std::string out;
  for (int64_t v : vs) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

// An flock on blobs/.lock orders blob renames (adds, shared) against blob
// deletions (gc, exclusive), across processes. Waits up to 10 s, like the
// database's busy timeout.
class BlobLock {
 public:
  static StatusOr<BlobLock> Take(const std::string& store_dir, bool exclusive) {
    std::string path = store_dir + "/blobs/.lock";
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("open " + path, errno);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK || std::chrono::steady_clock::now() > deadline) {
        int e = errno;
        ::close(fd);
        if (e == EWOULDBLOCK)
          return Unavailable("store " + store_dir + " is busy (gc or add holds blobs/.lock)");
        return ErrnoError("lock " + path, e);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return BlobLock(fd);
  }
  BlobLock(BlobLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ~BlobLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  explicit BlobLock(int fd) : fd_(fd) {}
  int fd_;
};

// A partial copy in blobs/tmp, locked for as long as this process holds it
// so that gc in another process leaves it alone; removed on destruction
// unless it was renamed into place.
class TmpBlob {
 public:
  static StatusOr<std::unique_ptr<TmpBlob>> Create(Env* env, const std::string& tmp_dir) {
    RETURN_IF_ERROR(fs::MakeDirs(env, tmp_dir));
    for (int attempt = 0;; ++attempt) {
      std::string path = tmp_dir + "/import-" + std::to_string(::getpid()) + "-" + std::to_string(NowMs()) +
                         "-" + std::to_string(attempt);
      auto file = env->OpenForWrite(path, Env::OpenMode::kCreateNew);
      if (file.status().code() == StatusCode::kAlreadyExists && attempt < 100) continue;
      if (!file.ok()) return file.status();
      // gc in another process may lock and delete a new file before its
      // writer locks it: then start over with another name.
      int fd = (*file)->fd();
      struct stat by_fd, by_path;
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || ::fstat(fd, &by_fd) != 0 ||
          ::stat(path.c_str(), &by_path) != 0 || by_fd.st_ino != by_path.st_ino) {
        if (attempt >= 100) return Unavailable("cannot create a temporary file in " + tmp_dir);
        continue;
      }
      return std::unique_ptr<TmpBlob>(new TmpBlob(env, std::move(path), std::move(file).value()));
    }
  }
  ~TmpBlob() {
    // An adopted file that did not go into place goes back where it was.
    if (!renamed_ && (adopted_from_.empty() || !env_->Rename(path_, adopted_from_).ok())) {
      (void)env_->RemoveFile(path_);
    }
    file_.reset();
    if (adopted_fd_ >= 0) ::close(adopted_fd_);
  }
  WritableFile* file() const { return file_.get(); }
  const std::string& path() const { return path_; }
  // Takes `file` (same file system) in place of this empty copy, locked
  // before it is renamed here so that gc never finds it unlocked, then
  // hashes it and makes it durable. Returns its sha256.
  StatusOr<std::string> Adopt(const std::string& file) {
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("open " + file, errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return Unavailable(file + " is in use by another process");
    }
    if (Status s = env_->Rename(file, path_); !s.ok()) {
      ::close(fd);
      return s.WithContext("move " + file + " into " + path_);
    }
    file_.reset();  // our empty copy, replaced by the rename
    adopted_fd_ = fd;
    adopted_from_ = file;
    ASSIGN_OR_RETURN(std::string sha, fs::Sha256File(path_));
    ASSIGN_OR_RETURN(file_, env_->OpenForWrite(path_, Env::OpenMode::kExisting));
    RETURN_IF_ERROR(file_->Sync());
    return sha;
  }
  void MarkRenamed() { renamed_ = true; }

 private:
  TmpBlob(Env* env, std::string path, std::unique_ptr<WritableFile> file)
      : env_(env), path_(std::move(path)), file_(std::move(file)) {}
  Env* env_;
  std::string path_;
  std::unique_ptr<WritableFile> file_;  // holds the lock until the adopted file's takes over
  int adopted_fd_ = -1;                 // the adopted file, locked
  bool renamed_ = false;
  std::string adopted_from_;
};

}  // namespace

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FormatTimestamp(int64_t ms) {
  if (ms <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

Status ValidateModelName(std::string_view name) {
  auto shown = [&] {
    std::string out;
    for (char c : name.substr(0, 64)) {
      unsigned char u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", u);
        out += buf;
      } else {
        out += c;
      }
    }
    return out + (name.size() > 64 ? "..." : "");
  };
  if (name.empty() || name.size() > 128) {
    return InvalidArgument("model name must be 1 to 128 characters long, got " + std::to_string(name.size()));
  }
  auto ok_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  };
  for (char c : name) {
    if (!ok_char(c)) {
      return InvalidArgument("model name '" + shown() +
                             "' may only contain letters, digits, '_', '.' and '-'");
    }
  }
  if (name[0] == '_' || name[0] == '.' || name[0] == '-') {
    return InvalidArgument("model name '" + shown() + "' must start with a letter or digit");
  }
  if (name.find("..") != std::string_view::npos) {
    return InvalidArgument("model name '" + shown() + "' must not contain '..'");
  }
  return Status::OK();
}

Status ValidateVersion(int64_t version) {
  if (version < 1 || version > (int64_t{1} << 53)) {
    return InvalidArgument("version must be an integer from 1 to 2^53, got " + std::to_string(version));
  }
  return Status::OK();
}

Status ParseModelRef(std::string_view ref, std::string* name, std::optional<int64_t>* version) {
  size_t colon = ref.rfind(':');
  *name = std::string(ref.substr(0, colon));
  version->reset();
  RETURN_IF_ERROR(ValidateModelName(*name));
  if (colon != std::string_view::npos) {
    const std::string_view digits = ref.substr(colon + 1);
    auto v = ParseInt("version", digits);
    if (!v.ok())
      return InvalidArgument("'" + std::string(ref) + "': the version after ':' must be an integer");
    RETURN_IF_ERROR(ValidateVersion(*v));
    // One version, one spelling: "mlp:01" read as mlp:1 would make two
    // names of one model (in URLs, in logs, in an answer's "model").
    if (digits.front() == '0') {
      return InvalidArgument("'" + std::string(ref) + "': the version after ':' has a leading zero; write " +
                             *name + ":" + std::to_string(*v));
    }
    *version = *v;
  }
  return Status::OK();
}

std::string FormatVersionPolicy(const VersionPolicy& p) {
  switch (p.kind) {
    case VersionPolicy::kLatest: return "latest";
    case VersionPolicy::kAll: return "all";
    case VersionPolicy::kPinned: return "pinned:" + std::to_string(p.pinned);
  }
  return "latest";
}

StatusOr<VersionPolicy> ParseVersionPolicy(std::string_view text) {
  VersionPolicy p;
  if (text == "latest") return p;
  if (text == "all") {
    p.kind = VersionPolicy::kAll;
    return p;
  }
  if (text.starts_with("pinned:")) {
    auto v = ParseInt("version_policy", text.substr(7));
    if (v.ok() && ValidateVersion(*v).ok()) {
      p.kind = VersionPolicy::kPinned;
      p.pinned = *v;
      return p;
    }
  }
  return InvalidArgument("version_policy must be latest, all or pinned:VERSION, got '" + std::string(text) +
                         "'");
}

std::set<int64_t> WantedVersions(const ModelInfo& m) {
  std::set<int64_t> want;
  if (!m.enabled || m.versions.empty()) return want;
  switch (m.policy.kind) {
    case VersionPolicy::kLatest: want.insert(m.versions.back().version); break;
    case VersionPolicy::kAll:
      for (const auto& v : m.versions) want.insert(v.version);
      break;
    case VersionPolicy::kPinned:
      for (const auto& v : m.versions) {
        if (v.version == m.policy.pinned) want.insert(v.version);
      }
      break;
  }
  return want;
}

std::string_view BuildStateName(BuildState s) {
  switch (s) {
    case BuildState::kQueued: return "queued";
    case BuildState::kBuilding: return "building";
    case BuildState::kReady: return "ready";
    case BuildState::kFailed: return "failed";
    case BuildState::kCancelled: return "cancelled";
  }
  return "unknown";
}

bool ParseBuildState(std::string_view name, BuildState* out) {
  for (auto s : {BuildState::kQueued, BuildState::kBuilding, BuildState::kReady, BuildState::kFailed,
                 BuildState::kCancelled}) {
    if (BuildStateName(s) == name) {
      *out = s;
      return true;
    }
  }
  return false;
}

namespace {

// Free bytes on the file system holding `dir`; -1 when unknown.
int64_t FreeBytes(const std::string& dir) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

// The reserve: given back when the disk is full (before SQLite opens the
// store, which may need room for its -wal and -shm files)...
void ReleaseReserveIfFull(const std::string& dir) {
  int64_t free = FreeBytes(dir);
  if (free < 0 || free >= 2 * ModelStore::kReserveBytes) return;
  if (::unlink((dir + "/reserve").c_str()) == 0) {
    LOG_WARNING << "the disk holding the store " << dir << " is full: gave back the store's "
                << (ModelStore::kReserveBytes >> 20)
                << " MiB reserve so aotid can still work; free space (aotid gc, aotid rm) and it is set "
                   "aside again";
  }
}

// ...and set aside again, in a store that opened, once there is room.
void SetReserveAside(const std::string& dir) {
  std::string path = dir + "/reserve";
  int64_t free = FreeBytes(dir);
  if (free < 4 * ModelStore::kReserveBytes || fs::Exists(path)) return;
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  bool ok = fs::Allocate(fd, ModelStore::kReserveBytes, tmp).ok();
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
}

}  // namespace

StatusOr<std::unique_ptr<ModelStore>> ModelStore::Open(const std::string& dir, bool create) {
  StoreOptions options;
  options.create = create;
  return Open(dir, options);
}

StatusOr<std::unique_ptr<ModelStore>> ModelStore::Open(const std::string& dir, const StoreOptions& options) {
  const bool create = options.create;
  Env* env = options.env != nullptr ? options.env : Env::Default();
  std::string db_path = dir + "/aotid.db";
  if (!create && !fs::Exists(db_path)) return NotFound("no aotid store at " + dir);
  if (create) {
    RETURN_IF_ERROR(fs::MakeDirs(env, dir, 0750).WithContext("creating the store"));
    // Writers need the directory (SQLite's -wal and -shm files live there)
    // and the blob directories; say so plainly rather than fail half-way.
    for (const std::string& d : {dir, dir + "/blobs", dir + "/blobs/sha256", dir + "/blobs/tmp"}) {
      if (fs::Exists(d) && ::access(d.c_str(), W_OK) != 0) {
        return IOError("the store directory " + d + " is read-only for this user (" + std::strerror(errno) +
                       "); aotid must be able to write its store");
      }
    }
    RETURN_IF_ERROR(fs::MakeDirs(env, dir + "/blobs/sha256").WithContext("creating the store"));
  }
  ReleaseReserveIfFull(dir);
  ASSIGN_OR_RETURN(auto db, Db::Open(db_path, create, options.sqlite_vfs));
  std::unique_ptr<ModelStore> store(new ModelStore(dir, std::move(db), env));
  RETURN_IF_ERROR(store->Migrate());
  SetReserveAside(dir);
  return store;
}

Status ModelStore::Migrate() {
  auto read_version = [this]() -> StatusOr<int> {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare("PRAGMA user_version"));
    ASSIGN_OR_RETURN(bool row, s.Step());
    return row ? static_cast<int>(s.Int(0)) : 0;
  };
  ASSIGN_OR_RETURN(int v, read_version());
  if (v > kSchemaVersion) {
    return FailedPrecondition("store " + dir_ + " has schema version " + std::to_string(v) +
                              ", newer than this aotid understands (" + std::to_string(kSchemaVersion) +
                              "); upgrade aotid");
  }
  if (v == kSchemaVersion) {
    schema_version_ = v;
    return Status::OK();
  }
  ASSIGN_OR_RETURN(auto txn, WriteTxn::Begin(db_.get()));
  ASSIGN_OR_RETURN(v, read_version());  // another process may have migrated meanwhile
  for (; v < kSchemaVersion; ++v) {
    RETURN_IF_ERROR(
        db_->Exec(kMigrations[v]).WithContext("migrating store schema from version " + std::to_string(v)));
    RETURN_IF_ERROR(db_->Exec("PRAGMA user_version = " + std::to_string(v + 1)));
  }
  RETURN_IF_ERROR(txn->Commit());
  schema_version_ = v;
  return Status::OK();
}

std::string ModelStore::BlobPath(const std::string& sha256) const {
  // Paths come only from validated digests; anything else maps nowhere.
  if (!fs::IsSha256Hex(sha256)) return dir_ + "/blobs/sha256/invalid";
  return dir_ + "/blobs/sha256/" + sha256;
}

StatusOr<ModelStore::AddPlan> ModelStore::CheckAddRequest(const AddRequest& req) {
  RETURN_IF_ERROR(ValidateModelName(req.name));
  if (req.version) RETURN_IF_ERROR(ValidateVersion(*req.version));
  RETURN_IF_ERROR(ValidateSettings(req.settings));
  ASSIGN_OR_RETURN(package::PackageInfo info, package::InspectPackage(req.file));
  std::string names;
  for (const auto& n : info.model_names) names += (names.empty() ? "" : ", ") + n;
  if (!req.package_model.empty()) {
    for (const auto& n : info.model_names) {
      if (n == req.package_model) return AddPlan{n, info.kind};
    }
    return NotFound(req.file + " has no model '" + req.package_model + "' (it holds: " + names + ")");
  }
  if (info.model_names.size() != 1) {
    return InvalidArgument(req.file + " holds " + std::to_string(info.model_names.size()) + " models (" +
                           names + "); choose one with --package-model");
  }
  return AddPlan{info.model_names[0], info.kind};
}

StatusOr<ModelVersion> ModelStore::Add(const AddRequest& req) {
  ASSIGN_OR_RETURN(AddPlan plan, CheckAddRequest(req));
  const std::string& package_model = plan.package_model;
  struct stat st;
  if (::stat(req.file.c_str(), &st) != 0) return ErrnoError("stat " + req.file, errno);

  auto duplicate = [&](int64_t version) {
    return AlreadyExists("model '" + req.name + "' already has version " + std::to_string(version) +
                         " (versions are immutable: remove it first, or add without --version)");
  };
  // Refuse a duplicate before copying anything.
  if (req.version) {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare("SELECT 1 FROM versions v JOIN models m ON m.id = v.model_id "
                                          "WHERE m.name = ? AND v.version = ?"));
    s.Bind(1, req.name).Bind(2, *req.version);
    ASSIGN_OR_RETURN(bool exists, s.Step());
    if (exists) return duplicate(*req.version);
  }

  // The slow part, with no lock held: copy into a private, locked temp file
  // while hashing.
  RETURN_IF_ERROR(fs::MakeDirs(env_, dir_ + "/blobs/sha256"));
  ASSIGN_OR_RETURN(auto tmp, TmpBlob::Create(env_, dir_ + "/blobs/tmp"));
  std::string sha;
  if (req.move_file) {
    ASSIGN_OR_RETURN(sha, tmp->Adopt(req.file));
  } else {
    ASSIGN_OR_RETURN(sha, fs::CopyAndHashInto(req.file, tmp->file()));
  }
  CrashPoint("add:copied");

  ASSIGN_OR_RETURN(BlobLock blob_lock, BlobLock::Take(dir_, /*exclusive=*/false));
  // The slow checks, read the whole file, before the store's write lock
  // (a multi-GB package held every other writer, the daemon's events
  // included, past their busy timeout). The shared blob lock keeps gc from
  // removing a blob found here until the rows referencing it commit.
  std::string final_path = BlobPath(sha);
  bool have_blob = false;
  if (fs::Exists(final_path)) {
    if (TEST_while_checking_blob_) TEST_while_checking_blob_();
    auto existing = fs::Sha256File(final_path);
    have_blob = existing.ok() && *existing == sha;  // otherwise replaced by our verified copy
  }
  if (!have_blob && !req.move_file) {
    // A copy is read back (a file changing while it was copied hashes
    // differently); a moved file was hashed as it lies.
    if (TEST_while_checking_blob_) TEST_while_checking_blob_();
    ASSIGN_OR_RETURN(std::string check, fs::Sha256File(tmp->path()));
    if (check != sha) {
      return Corruption(
          "the copy of " + req.file + " read back with a different digest (sha256:" + check.substr(0, 12) +
          ", expected sha256:" + sha.substr(0, 12) + "); was the file changing while it was added?");
    }
  }
  int64_t now = NowMs();
  ASSIGN_OR_RETURN(auto txn, WriteTxn::Begin(db_.get()));
  {
    ASSIGN_OR_RETURN(
        Stmt s,
        db_->Prepare("INSERT OR IGNORE INTO artifacts(sha256, kind, size, added_at_ms) VALUES(?,?,?,?)"));
    RETURN_IF_ERROR(s.Bind(1, sha)
                        .Bind(2, package::PackageKindName(plan.kind))
                        .Bind(3, int64_t{st.st_size})
                        .Bind(4, now)
                        .Run());
  }
  {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare("INSERT OR IGNORE INTO models(name, created_at_ms) VALUES(?, ?)"));
    RETURN_IF_ERROR(s.Bind(1, req.name).Bind(2, now).Run());
  }
  int64_t version = 0;
  {
    ASSIGN_OR_RETURN(
        Stmt s,
        db_->Prepare("SELECT id, (SELECT COALESCE(MAX(version), 0) FROM versions WHERE model_id = models.id) "
                     "FROM models WHERE name = ?"));
    s.Bind(1, req.name);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return Internal("model row vanished during add");
    int64_t model_id = s.Int(0);
    version = req.version.value_or(s.Int(1) + 1);
    if (!req.version && version > (int64_t{1} << 53)) {
      return InvalidArgument("model '" + req.name +
                             "' has version 2^53 already, the highest there is; give " +
                             "--version to add one below it");
    }
    static const auto* insert = new std::string(
        "INSERT INTO versions(model_id, version, artifact, package_model, created_at_ms, " +
        SettingColumns() + ") VALUES(" + Placeholders(5 + VersionSettingFields().size()) + ")");
    ASSIGN_OR_RETURN(Stmt ins, db_->Prepare(*insert));
    ins.Bind(1, model_id).Bind(2, version).Bind(3, sha).Bind(4, package_model).Bind(5, now);
    BindSettings(&ins, 6, req.settings);
    Status st_ins = ins.Run();
    if (st_ins.code() == StatusCode::kAlreadyExists) return duplicate(version);
    RETURN_IF_ERROR(st_ins);
  }
  RETURN_IF_ERROR(
      AppendEvent(req.name, version, "added", "added " + req.file + " as sha256:" + sha.substr(0, 12)));

  // The blob, verified above, enters blobs/sha256 under the write lock,
  // durable before the rows that reference it commit.
  if (!have_blob) {
    RETURN_IF_ERROR(env_->Rename(tmp->path(), final_path).WithContext("rename blob into place"));
    tmp->MarkRenamed();
    RETURN_IF_ERROR(env_->SyncDir(dir_ + "/blobs/sha256"));
  }
  CrashPoint("add:before_commit");
  RETURN_IF_ERROR(txn->Commit());

  ModelVersion mv;
  mv.model = req.name;
  mv.version = version;
  mv.artifact = sha;
  mv.kind = plan.kind;
  mv.package_model = package_model;
  mv.size = st.st_size;
  mv.settings = req.settings;
  mv.created_at_ms = now;
  return mv;
}

StatusOr<std::vector<ModelVersion>> ModelStore::QueryVersions(const std::string& where,
                                                              const std::string& name) {
  ASSIGN_OR_RETURN(Stmt s,
                   db_->Prepare("SELECT " + VersionColumns() + where + " ORDER BY m.name, v.version"));
  if (!name.empty()) s.Bind(1, name);
  return s.Collect<ModelVersion>(ReadVersion);
}

StatusOr<std::vector<ModelVersion>> ModelStore::ListVersions() { return QueryVersions("", ""); }

StatusOr<std::vector<ModelInfo>> ModelStore::ListModels() {
  ASSIGN_OR_RETURN(auto versions, ListVersions());
  ASSIGN_OR_RETURN(
      Stmt s, db_->Prepare("SELECT name, version_policy, created_at_ms, enabled FROM models ORDER BY name"));
  std::vector<ModelInfo> out;
  size_t vi = 0;
  RETURN_IF_ERROR(s.ForEachRow([&](const Stmt& row) {
    ModelInfo m;
    m.name = row.Text(0);
    auto policy = ParseVersionPolicy(row.Text(1));
    if (policy.ok()) m.policy = *policy;  // a policy this binary cannot read serves the latest
    m.created_at_ms = row.Int(2);
    m.enabled = row.Int(3) != 0;
    while (vi < versions.size() && versions[vi].model < m.name) ++vi;
    while (vi < versions.size() && versions[vi].model == m.name)
      m.versions.push_back(std::move(versions[vi++]));
    out.push_back(std::move(m));
  }));
  return out;
}

StatusOr<ModelInfo> ModelStore::GetModel(const std::string& name) {
  RETURN_IF_ERROR(ValidateModelName(name));
  ASSIGN_OR_RETURN(Stmt s,
                   db_->Prepare("SELECT version_policy, created_at_ms, enabled FROM models WHERE name = ?"));
  s.Bind(1, name);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFound("no model named '" + name + "' in the store " + dir_);
  ModelInfo m;
  m.name = name;
  auto policy = ParseVersionPolicy(s.Text(0));
  if (policy.ok()) m.policy = *policy;
  m.created_at_ms = s.Int(1);
  m.enabled = s.Int(2) != 0;
  ASSIGN_OR_RETURN(m.versions, QueryVersions(" WHERE m.name = ?1", name));
  return m;
}

StatusOr<std::vector<std::string>> ModelStore::Set(
    const std::string& name, std::optional<int64_t> version,
    const std::vector<std::pair<std::string, std::string>>& kv) {
  if (kv.empty()) return InvalidArgument("nothing to set: give KEY=VALUE");
  ASSIGN_OR_RETURN(auto txn, WriteTxn::Begin(db_.get()));
  ASSIGN_OR_RETURN(ModelInfo model, GetModel(name));
  std::vector<ModelVersion*> targets;
  for (auto& v : model.versions) {
    if (!version || v.version == *version) targets.push_back(&v);
  }
  if (version && targets.empty()) {
    std::vector<int64_t> have;
    for (const auto& v : model.versions) have.push_back(v.version);
    return NotFound("model '" + name + "' has no version " + std::to_string(*version) +
                    " (versions: " + JoinVersions(have) + ")");
  }

  std::vector<std::string> changes;
  std::optional<VersionPolicy> new_policy;
  std::optional<bool> new_enabled;
  std::vector<std::pair<std::string, std::string>> version_kv;
  for (const auto& [key, value] : kv) {
    if (key == "enabled") {
      if (version) {
        return InvalidArgument("enabled belongs to the model, not one version: use '" + name +
                               "' without ':" + std::to_string(*version) + "'");
      }
      ASSIGN_OR_RETURN(new_enabled, ParseBool(key, value));
    } else if (key == "version_policy") {
      if (version) {
        return InvalidArgument("version_policy belongs to the model, not one version: use '" + name +
                               "' without ':" + std::to_string(*version) + "'");
      }
      ASSIGN_OR_RETURN(new_policy, ParseVersionPolicy(value));
      if (new_policy->kind == VersionPolicy::kPinned) {
        bool exists = false;
        for (const auto& v : model.versions) exists |= v.version == new_policy->pinned;
        if (!exists) {
          return NotFound("cannot pin model '" + name + "' to version " + std::to_string(new_policy->pinned) +
                          ": no such version");
        }
      }
    } else {
      version_kv.emplace_back(key, value);
    }
  }
  static const auto* update = [] {
    std::string assignments;
    for (const auto& f : VersionSettingFields()) {
      assignments += (assignments.empty() ? "" : ", ") + std::string(f.column) + " = ?";
    }
    return new std::string("UPDATE versions SET " + assignments +
                           " WHERE version = ? AND model_id = (SELECT id FROM models WHERE name = ?)");
  }();
  for (ModelVersion* v : targets) {
    VersionSettings next = v->settings;
    for (const auto& [key, value] : version_kv) {
      if (FindSettingField(key) == nullptr) {
        return InvalidArgument("unknown setting '" + key + "'; known: " + SettingKeyList() +
                               ", version_policy, enabled");
      }
      RETURN_IF_ERROR(ApplySetting(&next, key, value));
    }
    RETURN_IF_ERROR(ValidateSettings(next));
    auto diff = DiffSettings(v->settings, next);
    if (diff.empty()) continue;
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare(*update));
    int next_param = BindSettings(&s, 1, next);
    RETURN_IF_ERROR(s.Bind(next_param, v->version).Bind(next_param + 1, name).Run());
    std::string what;
    for (const auto& [key, from, to] : diff) {
      std::string line = key + " " + from + " -> " + to;
      changes.push_back(name + ":" + std::to_string(v->version) + " " + line);
      what += (what.empty() ? "" : ", ") + line;
    }
    RETURN_IF_ERROR(AppendEvent(name, v->version, "settings", what));
  }
  if (new_policy && !(*new_policy == model.policy)) {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare("UPDATE models SET version_policy = ? WHERE name = ?"));
    RETURN_IF_ERROR(s.Bind(1, FormatVersionPolicy(*new_policy)).Bind(2, name).Run());
    std::string line =
        "version_policy " + FormatVersionPolicy(model.policy) + " -> " + FormatVersionPolicy(*new_policy);
    changes.push_back(name + " " + line);
    RETURN_IF_ERROR(AppendEvent(name, 0, "settings", line));
  }
  if (new_enabled && *new_enabled != model.enabled) {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare("UPDATE models SET enabled = ? WHERE name = ?"));
    RETURN_IF_ERROR(s.Bind(1, int64_t{*new_enabled}).Bind(2, name).Run());
    std::string line = std::string("enabled ") + (model.enabled ? "true" : "false") + " -> " +
                       (*new_enabled ? "true" : "false");
    changes.push_back(name + " " + line);
    RETURN_IF_ERROR(AppendEvent(name, 0, "settings", line));
  }
  RETURN_IF_ERROR(txn->Commit());
  return changes;
}

StatusOr<std::vector<std::vector<int64_t>>> ModelStore::Remove(const std::vector<ModelRef>& refs) {
  ASSIGN_OR_RETURN(auto txn, WriteTxn::Begin(db_.get()));
  std::vector<std::vector<int64_t>> result;
  for (const auto& [name, version] : refs) {
    ASSIGN_OR_RETURN(ModelInfo model, GetModel(name));  // reflects earlier refs of this call
    std::vector<int64_t> have, removed;
    for (const auto& v : model.versions) have.push_back(v.version);
    if (version) {
      if (std::find(have.begin(), have.end(), *version) == have.end()) {
        return NotFound("model '" + name + "' has no version " + std::to_string(*version) +
                        " (versions: " + JoinVersions(have) + ")");
      }
      if (model.policy.kind == VersionPolicy::kPinned && model.policy.pinned == *version && have.size() > 1) {
        return FailedPrecondition("model '" + name + "' is pinned to version " + std::to_string(*version) +
                                  "; change its version_policy first, or remove the whole model");
      }
      removed.push_back(*version);
    } else {
      removed = have;
    }
    for (int64_t v : removed) {
      ASSIGN_OR_RETURN(Stmt s, db_->Prepare("DELETE FROM versions WHERE version = ? AND model_id = (SELECT "
                                            "id FROM models WHERE name = ?)"));
      RETURN_IF_ERROR(s.Bind(1, v).Bind(2, name).Run());
    }
    if (removed.size() == have.size()) {
      ASSIGN_OR_RETURN(Stmt s, db_->Prepare("DELETE FROM models WHERE name = ?"));
      RETURN_IF_ERROR(s.Bind(1, name).Run());
      RETURN_IF_ERROR(AppendEvent(name, 0, "removed",
                                  "removed model '" + name + "' (versions " + JoinVersions(removed) + ")"));
    } else {
      RETURN_IF_ERROR(AppendEvent(name, *version, "removed", "removed version " + std::to_string(*version)));
    }
    result.push_back(std::move(removed));
  }
  RETURN_IF_ERROR(txn->Commit());
  return result;
}

StatusOr<GcReport> ModelStore::CollectGarbage(bool dry_run, int64_t keep_events) {
  namespace stdfs = std::filesystem;
  GcReport report;
  // Exclusive: no add may rename a blob in (or find one to reuse) while
  // blobs are being deleted.
  ASSIGN_OR_RETURN(BlobLock blob_lock, BlobLock::Take(dir_, /*exclusive=*/true));
  std::set<std::string> keep;  // artifacts that stay
  {
    ASSIGN_OR_RETURN(auto txn, WriteTxn::Begin(db_.get()));
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare("SELECT a.sha256, a.size, EXISTS(SELECT 1 FROM versions v WHERE "
                                          "v.artifact = a.sha256) FROM artifacts a"));
    RETURN_IF_ERROR(s.ForEachRow([&](const Stmt& row) {
      if (row.Int(2)) {
        keep.insert(row.Text(0));
      } else {
        report.artifacts.push_back(row.Text(0));
        report.bytes_freed += row.Int(1);
      }
    }));
    for (const auto& sha : report.artifacts) {
      ASSIGN_OR_RETURN(Stmt del, db_->Prepare("DELETE FROM artifacts WHERE sha256 = ?"));  // builds cascade
      RETURN_IF_ERROR(del.Bind(1, sha).Run());
    }
    if (keep_events >= 0) {
      ASSIGN_OR_RETURN(Stmt cut, db_->Prepare("SELECT COUNT(*) FROM events WHERE id <= (SELECT id FROM "
                                              "events ORDER BY id DESC LIMIT 1 OFFSET ?)"));
      cut.Bind(1, keep_events);
      ASSIGN_OR_RETURN(bool row, cut.Step());
      report.events_trimmed = row ? cut.Int(0) : 0;
      if (report.events_trimmed > 0) {
        ASSIGN_OR_RETURN(
            Stmt del,
            db_->Prepare(
                "DELETE FROM events WHERE id <= (SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?)"));
        RETURN_IF_ERROR(del.Bind(1, keep_events).Run());
      }
    }
    // Rows go first: a crash after this commit leaves blob files without
    // rows, which the next gc removes; never rows without blobs.
    if (!dry_run) RETURN_IF_ERROR(txn->Commit());
  }
  if (!dry_run) CrashPoint("gc:rows_removed");

  auto remove = [&](const std::string& path, int64_t size) -> Status {
    if (size >= 0) report.bytes_freed += size;  // counted with dry_run too
    if (dry_run) return Status::OK();
    return fs::RemoveAll(path);
  };
  for (const auto& sha : report.artifacts) RETURN_IF_ERROR(remove(BlobPath(sha), -1));

  std::error_code ec;
  for (auto& e : stdfs::directory_iterator(dir_ + "/blobs/sha256", ec)) {
    std::string name = e.path().filename().string();
    if (!fs::IsSha256Hex(name) || keep.count(name)) continue;  // never touch what is not a digest
    if (std::find(report.artifacts.begin(), report.artifacts.end(), name) != report.artifacts.end()) continue;
    report.orphan_blobs.push_back(name);
    RETURN_IF_ERROR(remove(e.path().string(), static_cast<int64_t>(e.file_size(ec))));
  }
  for (auto& e : stdfs::directory_iterator(dir_ + "/blobs/tmp", ec)) {
    // A copy in progress is locked by its writer; only unlocked ones are debris.
    int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    bool abandoned = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (abandoned) {
      report.tmp_files.push_back(e.path().filename().string());
      Status s = remove(e.path().string(), static_cast<int64_t>(e.file_size(ec)));
      ::close(fd);
      RETURN_IF_ERROR(s);
    } else {
      ::close(fd);
    }
  }
  const auto week_ago = stdfs::file_time_type::clock::now() - std::chrono::hours(24 * 7);
  for (auto& e : stdfs::directory_iterator(dir_ + "/downloads", ec)) {
    std::string name = e.path().filename().string();
    if (!name.ends_with(".partial") || !fs::IsSha256Hex(name.substr(0, name.size() - 8))) continue;
    int64_t size = static_cast<int64_t>(e.file_size(ec));
    if (ec) continue;
    bool stale = size == 0 || fs::Exists(BlobPath(name.substr(0, 64))) || e.last_write_time(ec) < week_ago;
    if (!stale || ec) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);  // a sync downloading it holds a lock
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      report.stale_downloads.push_back(name);
      Status s = remove(e.path().string(), size);
      ::close(fd);
      RETURN_IF_ERROR(s);
    } else {
      ::close(fd);
    }
  }
  for (const auto& sha : keep) {
    if (!fs::Exists(BlobPath(sha))) report.missing_blobs.push_back(sha);
  }
  return report;
}

Status ModelStore::PutBuild(const BuildRecord& b) {
  ASSIGN_OR_RETURN(
      Stmt s,
      db_->Prepare(
          "INSERT OR REPLACE INTO builds(artifact, package_model, fingerprint, device, state, error, "
          "started_at_ms, finished_at_ms, options, progress, attempts) SELECT "
          "?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11 "
          "WHERE EXISTS(SELECT 1 FROM artifacts WHERE sha256 = ?1)"));  // gc may have removed it meanwhile
  return s.Bind(1, b.artifact)
      .Bind(2, b.package_model)
      .Bind(3, b.fingerprint)
      .Bind(4, b.device)
      .Bind(5, BuildStateName(b.state))
      .Bind(6, b.error)
      .Bind(7, b.started_at_ms)
      .Bind(8, b.finished_at_ms)
      .Bind(9, b.options)
      .Bind(10, b.progress)
      .Bind(11, int64_t{b.attempts})
      .Run();
}

namespace {
BuildRecord ReadBuild(const Stmt& s) {
  BuildRecord b;
  b.artifact = s.Text(0);
  b.package_model = s.Text(1);
  b.fingerprint = s.Text(2);
  b.device = s.Text(3);
  ParseBuildState(s.Text(4), &b.state);
  b.error = s.Text(5);
  b.started_at_ms = s.Int(6);
  b.finished_at_ms = s.Int(7);
  b.options = s.Text(8);
  b.progress = s.Text(9);
  b.attempts = static_cast<int>(s.Int(10));
  return b;
}
constexpr char kBuildColumns[] =
    "SELECT artifact, package_model, fingerprint, device, state, error, started_at_ms, finished_at_ms, "
    "options, "
    "progress, attempts FROM builds ";
}  // namespace

StatusOr<std::optional<BuildRecord>> ModelStore::GetBuild(const std::string& artifact,
                                                          const std::string& package_model,
                                                          const std::string& fingerprint,
                                                          const std::string& device,
                                                          const std::string& options) {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare(std::string(kBuildColumns) +
                                        "WHERE artifact = ? AND package_model = ? AND fingerprint = ? "
                                        "AND device = ? AND options = ?"));
  s.Bind(1, artifact).Bind(2, package_model).Bind(3, fingerprint).Bind(4, device).Bind(5, options);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<BuildRecord>();
  return std::optional<BuildRecord>(ReadBuild(s));
}

StatusOr<std::vector<BuildRecord>> ModelStore::ListBuilds(const std::string& artifact) {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare(std::string(kBuildColumns) +
                                        "WHERE artifact = ? ORDER BY fingerprint, device, options"));
  s.Bind(1, artifact);
  return s.Collect<BuildRecord>(ReadBuild);
}

StatusOr<std::vector<ModelStore::BuildTime>> ModelStore::ReadyBuildTimes(const std::string& fingerprint,
                                                                         const std::string& device) {
  ASSIGN_OR_RETURN(
      Stmt s, db_->Prepare("SELECT a.size, a.kind, b.finished_at_ms - b.started_at_ms FROM builds b "
                           "JOIN artifacts a ON a.sha256 = b.artifact WHERE b.state = ? AND "
                           "b.fingerprint = ? AND b.device = ? AND b.started_at_ms > 0 AND "
                           "b.finished_at_ms > b.started_at_ms ORDER BY b.finished_at_ms DESC LIMIT 200"));
  s.Bind(1, BuildStateName(BuildState::kReady)).Bind(2, fingerprint).Bind(3, device);
  return s.Collect<BuildTime>([](const Stmt& row) { return BuildTime{row.Int(0), row.Text(1), row.Int(2)}; });
}

Status ModelStore::AppendEvent(const std::string& model, int64_t version, const std::string& kind,
                               const std::string& message) {
  ASSIGN_OR_RETURN(
      Stmt s, db_->Prepare("INSERT INTO events(at_ms, model, version, kind, message) VALUES(?,?,?,?,?)"));
  return s.Bind(1, NowMs()).Bind(2, model).Bind(3, version).Bind(4, kind).Bind(5, message).Run();
}

StatusOr<int64_t> ModelStore::DataVersion() {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare("PRAGMA data_version"));
  ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : int64_t{0};
}

Status ModelStore::CheckIntegrity() {
  std::string problems;
  for (const char* pragma : {"PRAGMA integrity_check", "PRAGMA foreign_key_check"}) {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare(pragma));
    RETURN_IF_ERROR(s.ForEachRow([&](const Stmt& row) {
      std::string line = row.Text(0);
      if (line != "ok")
        problems += std::string(pragma) + ": " + line + (row.IsNull(1) ? "" : " " + row.Text(1)) + "; ";
    }));
  }
  if (!problems.empty()) return Corruption("store " + dir_ + " failed its integrity check: " + problems);
  return Status::OK();
}

namespace {
Event ReadEvent(const Stmt& s) {
  return Event{s.Int(0), s.Int(1), s.Text(2), s.Int(3), s.Text(4), s.Text(5)};
}
}  // namespace

StatusOr<std::vector<Event>> ModelStore::ListEvents(int64_t after_id, int limit, const std::string& model) {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare("SELECT id, at_ms, model, version, kind, message FROM events WHERE "
                                        "id > ?1 AND (?3 = '' OR model = ?3) "
                                        "ORDER BY id LIMIT ?2"));
  s.Bind(1, after_id).Bind(2, int64_t{limit}).Bind(3, model);
  return s.Collect<Event>(ReadEvent);
}

StatusOr<std::vector<Event>> ModelStore::RecentEvents(int limit, const std::string& model) {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare("SELECT * FROM (SELECT id, at_ms, model, version, kind, message FROM "
                                        "events WHERE (?2 = '' OR model = ?2) "
                                        "ORDER BY id DESC LIMIT ?1) ORDER BY id"));
  s.Bind(1, int64_t{limit}).Bind(2, model);
  return s.Collect<Event>(ReadEvent);
}

}  // namespace aotid::storage
