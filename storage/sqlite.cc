#include "storage/sqlite.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace aotid::storage {

StatusOr<std::unique_ptr<Db>> Db::Open(const std::string& path, bool create, const std::string& vfs) {
  sqlite3* raw = nullptr;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0);
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, vfs.empty() ? nullptr : vfs.c_str());
  if (rc != SQLITE_OK) {
    std::string msg = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close(raw);
    if (rc == SQLITE_CANTOPEN && !create) return NotFound("no store database at " + path);
    return IOError("open " + path + ": " + msg);
  }
  sqlite3_extended_result_codes(raw, 1);
  std::unique_ptr<Db> db(new Db(raw, path));
  sqlite3_busy_timeout(raw, 10000);
  // journal_mode is the first statement that reads the file, so a file that
  // is not SQLite is reported here. Switching a new database to WAL needs an
  // exclusive lock, for which SQLite does not call the busy handler: when
  // several processes create one store at once, the losers retry, within
  // the same 10 s as the busy timeout. (WAL is then recorded in the file,
  // and later opens do not switch again.)
  Status s;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int delay_ms = 1;; delay_ms = std::min(delay_ms * 2, 50)) {
    s = db->Exec("PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON; PRAGMA synchronous=FULL;");
    if (s.code() != StatusCode::kUnavailable || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  }
  if (!s.ok()) {
    int code = sqlite3_extended_errcode(raw);
    if ((code & 0xff) == SQLITE_NOTADB) {
      return Corruption(path + " is not an SQLite database (is --store pointing at the right place?)");
    }
    return s;
  }
  return db;
}

Db::~Db() { sqlite3_close_v2(db_); }

Status Db::Error(std::string_view what) const {
  int code = sqlite3_extended_errcode(db_);
  std::string msg = std::string(what) + ": " + sqlite3_errmsg(db_) + " (" + path_ + ")";
  switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return Unavailable(msg);
    case SQLITE_CONSTRAINT:
      switch (code) {
        // Only a key that is taken means the row already exists.
        case SQLITE_CONSTRAINT_UNIQUE:
        case SQLITE_CONSTRAINT_PRIMARYKEY:
        case SQLITE_CONSTRAINT_ROWID: return AlreadyExists(msg);
        // A value the schema refuses.
        case SQLITE_CONSTRAINT_CHECK:
        case SQLITE_CONSTRAINT_NOTNULL:
        case SQLITE_CONSTRAINT_DATATYPE: return InvalidArgument(msg);
        // A foreign key, trigger or hook: the store's own writes must never
        // break these, so it is a bug, not the caller's input.
        default: return Internal(msg);
      }
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return Corruption(msg);
    case SQLITE_READONLY:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_FULL:
    case SQLITE_PERM: return IOError(msg);
    default: return Internal(msg);
  }
}

Status Db::Exec(std::string_view sql) {
  std::string s(sql);
  char* err = nullptr;
  if (sqlite3_exec(db_, s.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    sqlite3_free(err);
    return Error("sqlite exec");
  }
  return Status::OK();
}

StatusOr<Stmt> Db::Prepare(std::string_view sql) {
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &s, nullptr) != SQLITE_OK) {
    return Error("sqlite prepare");
  }
  return Stmt(this, s);
}

Stmt::~Stmt() {
  if (stmt_) sqlite3_finalize(stmt_);
}

Stmt& Stmt::Bind(int i, int64_t v) {
  sqlite3_bind_int64(stmt_, i, v);
  return *this;
}
Stmt& Stmt::Bind(int i, std::string_view v) {
  sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

StatusOr<bool> Stmt::Step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Error("sqlite step");
}

Status Stmt::Run() {
  for (;;) {
    auto r = Step();
    if (!r.ok()) return r.status();
    if (!*r) return Status::OK();
  }
}

int64_t Stmt::Int(int col) const { return sqlite3_column_int64(stmt_, col); }
std::string Stmt::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : "";
}
bool Stmt::IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

StatusOr<std::unique_ptr<WriteTxn>> WriteTxn::Begin(Db* db) {
  RETURN_IF_ERROR(db->Exec("BEGIN IMMEDIATE"));
  return std::unique_ptr<WriteTxn>(new WriteTxn(db));
}

WriteTxn::~WriteTxn() {
  if (!done_) (void)db_->Exec("ROLLBACK");
}

Status WriteTxn::Commit() {
  RETURN_IF_ERROR(db_->Exec("COMMIT"));
  done_ = true;
  return Status::OK();
}

}  // namespace aotid::storage
