#include "storage/model_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "base/fs.h"

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
};
static_assert(std::size(kMigrations) == kSchemaVersion);

constexpr char kVersionColumns[] =
    "m.name, v.version, v.artifact, a.kind, v.package_model, a.size, v.device, v.num_runners, "
    "v.created_at_ms FROM versions v JOIN models m ON m.id = v.model_id "
    "JOIN artifacts a ON a.sha256 = v.artifact";

ModelVersion ReadVersion(const Stmt& s) {
  ModelVersion v;
  v.model = s.Text(0);
  v.version = s.Int(1);
  v.artifact = s.Text(2);
  ParsePackageKind(s.Text(3), &v.kind);
  v.package_model = s.Text(4);
  v.size = s.Int(5);
  v.settings.device = s.Text(6);
  v.settings.num_runners = static_cast<int>(s.Int(7));
  v.created_at = s.Int(8) / 1000;
  return v;
}

Status ValidateSettings(const VersionSettings& s) {
  if (s.device != "auto" && s.device != "cpu" && s.device != "mps" && s.device != "cuda") {
    return InvalidArgument("device '" + s.device + "' is not one of auto, cpu, mps, cuda");
  }
  if (s.num_runners < 1 || s.num_runners > 64) {
    return InvalidArgument("num_runners must be between 1 and 64, got " +
                           std::to_string(s.num_runners));
  }
  return Status::OK();
}

}  // namespace

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status ValidateModelName(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return InvalidArgument("model name must be 1 to 128 characters long");
  }
  auto ok_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
  };
  for (char c : name) {
    if (!ok_char(c)) {
      return InvalidArgument("model name '" + std::string(name) +
                             "' may only contain letters, digits, '_', '.' and '-'");
    }
  }
  if (!ok_char(name[0]) || name[0] == '_' || name[0] == '.' || name[0] == '-') {
    return InvalidArgument("model name '" + std::string(name) + "' must start with a letter or digit");
  }
  if (name.find("..") != std::string_view::npos) {
    return InvalidArgument("model name '" + std::string(name) + "' must not contain '..'");
  }
  return Status::OK();
}

Status ValidateVersion(int64_t version) {
  if (version < 1 || version > (int64_t{1} << 53)) {
    return InvalidArgument("version must be an integer from 1 to 2^53, got " + std::to_string(version));
  }
  return Status::OK();
}

std::string_view BuildStateName(BuildState s) {
  switch (s) {
    case BuildState::kQueued: return "queued";
    case BuildState::kBuilding: return "building";
    case BuildState::kReady: return "ready";
    case BuildState::kFailed: return "failed";
  }
  return "unknown";
}

bool ParseBuildState(std::string_view name, BuildState* out) {
  for (auto s : {BuildState::kQueued, BuildState::kBuilding, BuildState::kReady, BuildState::kFailed}) {
    if (BuildStateName(s) == name) {
      *out = s;
      return true;
    }
  }
  return false;
}

StatusOr<std::unique_ptr<ModelStore>> ModelStore::Open(const std::string& dir, bool create) {
  std::string db_path = dir + "/aotid.db";
  if (!create && !fs::Exists(db_path)) return NotFound("no aotid store at " + dir);
  if (create) {
    RETURN_IF_ERROR(fs::MakeDirs(dir, 0750));
    RETURN_IF_ERROR(fs::MakeDirs(dir + "/blobs/sha256"));
  }
  ASSIGN_OR_RETURN(auto db, Db::Open(db_path, create));
  std::unique_ptr<ModelStore> store(new ModelStore(dir, std::move(db)));
  RETURN_IF_ERROR(store->Migrate());
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
                              ", newer than this aotid understands (" +
                              std::to_string(kSchemaVersion) + "); upgrade aotid");
  }
  if (v == kSchemaVersion) {
    schema_version_ = v;
    return Status::OK();
  }
  ASSIGN_OR_RETURN(auto txn, WriteTxn::Begin(db_.get()));
  ASSIGN_OR_RETURN(v, read_version());  // another process may have migrated meanwhile
  for (; v < kSchemaVersion; ++v) {
    RETURN_IF_ERROR(db_->Exec(kMigrations[v]).WithContext(
        "migrating store schema from version " + std::to_string(v)));
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

StatusOr<std::string> ModelStore::ImportBlob(const std::string& file) {
  std::string tmp_dir = dir_ + "/blobs/tmp";
  RETURN_IF_ERROR(fs::MakeDirs(tmp_dir));
  std::string tmp = tmp_dir + "/import-" + std::to_string(::getpid()) + "-" + std::to_string(NowMs());
  ASSIGN_OR_RETURN(std::string sha, fs::CopyAndHash(file, tmp));
  std::string final_path = BlobPath(sha);
  if (fs::Exists(final_path)) {
    ::unlink(tmp.c_str());  // same content already stored
    return sha;
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("rename blob into " + final_path, e);
  }
  RETURN_IF_ERROR(fs::FsyncDir(dir_ + "/blobs/sha256"));
  return sha;
}

StatusOr<PackageInfo> ModelStore::CheckAddRequest(const AddRequest& req) {
  RETURN_IF_ERROR(ValidateModelName(req.name));
  if (req.version) RETURN_IF_ERROR(ValidateVersion(*req.version));
  RETURN_IF_ERROR(ValidateSettings(req.settings));
  ASSIGN_OR_RETURN(PackageInfo info, InspectPackage(req.file));
  if (info.kind != PackageKind::kExportedProgram) {
    return InvalidArgument(req.file + " is an AOTInductor package (" +
                           std::string(PackageKindName(info.kind)) +
                           "); this aotid accepts exported programs (torch.export.save) only");
  }
  if (info.model_names.size() != 1) {
    return InvalidArgument(req.file + " holds " + std::to_string(info.model_names.size()) +
                           " models; exactly one is supported");
  }
  return info;
}

StatusOr<ModelVersion> ModelStore::Add(const AddRequest& req) {
  ASSIGN_OR_RETURN(PackageInfo info, CheckAddRequest(req));
  struct stat st;
  if (::stat(req.file.c_str(), &st) != 0) return ErrnoError("stat " + req.file, errno);

  // Refuse a duplicate before copying anything.
  if (req.version) {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare("SELECT 1 FROM versions v JOIN models m ON m.id = "
                                          "v.model_id WHERE m.name = ? AND v.version = ?"));
    s.Bind(1, req.name).Bind(2, *req.version);
    ASSIGN_OR_RETURN(bool exists, s.Step());
    if (exists) {
      return AlreadyExists("model '" + req.name + "' already has version " +
                           std::to_string(*req.version));
    }
  }

  ASSIGN_OR_RETURN(std::string sha, ImportBlob(req.file));

  int64_t now = NowMs();
  ASSIGN_OR_RETURN(auto txn, WriteTxn::Begin(db_.get()));
  {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare(
        "INSERT OR IGNORE INTO artifacts(sha256, kind, size, added_at_ms) VALUES(?,?,?,?)"));
    RETURN_IF_ERROR(s.Bind(1, sha).Bind(2, PackageKindName(info.kind)).Bind(3, int64_t{st.st_size})
                        .Bind(4, now).Run());
  }
  {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare(
        "INSERT OR IGNORE INTO models(name, created_at_ms) VALUES(?, ?)"));
    RETURN_IF_ERROR(s.Bind(1, req.name).Bind(2, now).Run());
  }
  int64_t version = 0;
  {
    ASSIGN_OR_RETURN(Stmt s, db_->Prepare(
        "SELECT id, (SELECT COALESCE(MAX(version), 0) FROM versions WHERE model_id = models.id) "
        "FROM models WHERE name = ?"));
    s.Bind(1, req.name);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return Internal("model row vanished during add");
    int64_t model_id = s.Int(0);
    version = req.version.value_or(s.Int(1) + 1);
    ASSIGN_OR_RETURN(Stmt ins, db_->Prepare(
        "INSERT INTO versions(model_id, version, artifact, package_model, device, num_runners, "
        "created_at_ms) VALUES(?,?,?,?,?,?,?)"));
    Status st_ins = ins.Bind(1, model_id).Bind(2, version).Bind(3, sha)
                        .Bind(4, info.model_names[0]).Bind(5, req.settings.device)
                        .Bind(6, int64_t{req.settings.num_runners}).Bind(7, now).Run();
    if (st_ins.code() == StatusCode::kAlreadyExists) {
      return AlreadyExists("model '" + req.name + "' already has version " + std::to_string(version));
    }
    RETURN_IF_ERROR(st_ins);
  }
  RETURN_IF_ERROR(AppendEvent(req.name, version, "added",
                              "added " + req.file + " as sha256:" + sha.substr(0, 12)));
  RETURN_IF_ERROR(txn->Commit());

  ModelVersion mv;
  mv.model = req.name;
  mv.version = version;
  mv.artifact = sha;
  mv.kind = info.kind;
  mv.package_model = info.model_names[0];
  mv.size = st.st_size;
  mv.settings = req.settings;
  mv.created_at = now / 1000;
  return mv;
}

StatusOr<std::vector<ModelVersion>> ModelStore::ListVersions() {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare(std::string("SELECT ") + kVersionColumns +
                                        " ORDER BY m.name, v.version"));
  std::vector<ModelVersion> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(ReadVersion(s));
  }
  return out;
}

Status ModelStore::PutBuild(const BuildRecord& b) {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare(
      "INSERT OR REPLACE INTO builds(artifact, package_model, fingerprint, device, state, error, "
      "started_at_ms, finished_at_ms) VALUES(?,?,?,?,?,?,?,?)"));
  return s.Bind(1, b.artifact).Bind(2, b.package_model).Bind(3, b.fingerprint).Bind(4, b.device)
      .Bind(5, BuildStateName(b.state)).Bind(6, b.error).Bind(7, b.started_at_ms)
      .Bind(8, b.finished_at_ms).Run();
}

StatusOr<std::optional<BuildRecord>> ModelStore::GetBuild(const std::string& artifact,
                                                          const std::string& package_model,
                                                          const std::string& fingerprint) {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare(
      "SELECT device, state, error, started_at_ms, finished_at_ms FROM builds "
      "WHERE artifact = ? AND package_model = ? AND fingerprint = ?"));
  s.Bind(1, artifact).Bind(2, package_model).Bind(3, fingerprint);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<BuildRecord>();
  BuildRecord b;
  b.artifact = artifact;
  b.package_model = package_model;
  b.fingerprint = fingerprint;
  b.device = s.Text(0);
  ParseBuildState(s.Text(1), &b.state);
  b.error = s.Text(2);
  b.started_at_ms = s.Int(3);
  b.finished_at_ms = s.Int(4);
  return std::optional<BuildRecord>(std::move(b));
}

Status ModelStore::AppendEvent(const std::string& model, int64_t version, const std::string& kind,
                               const std::string& message) {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare(
      "INSERT INTO events(at_ms, model, version, kind, message) VALUES(?,?,?,?,?)"));
  return s.Bind(1, NowMs()).Bind(2, model).Bind(3, version).Bind(4, kind).Bind(5, message).Run();
}

StatusOr<int64_t> ModelStore::DataVersion() {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare("PRAGMA data_version"));
  ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : int64_t{0};
}

StatusOr<std::vector<Event>> ModelStore::ListEvents(int64_t after_id, int limit) {
  ASSIGN_OR_RETURN(Stmt s, db_->Prepare(
      "SELECT id, at_ms, model, version, kind, message FROM events WHERE id > ? "
      "ORDER BY id LIMIT ?"));
  s.Bind(1, after_id).Bind(2, int64_t{limit});
  std::vector<Event> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(Event{s.Int(0), s.Int(1), s.Text(2), s.Int(3), s.Text(4), s.Text(5)});
  }
  return out;
}

}  // namespace aotid::storage
