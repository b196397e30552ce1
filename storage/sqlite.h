// Thin RAII wrappers over the SQLite C API: one Db per owner (never shared
// across threads), statements prepared, bound, stepped and finalized by
// their destructors. Errors come back as Status with SQLite's extended
// message read right after the failing call.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace aotid::storage {

class Stmt;

class Db {
 public:
  // Opens (creating if asked) the database file and applies aotid's
  // connection settings: WAL, busy timeout, foreign keys. `vfs` names a
  // registered SQLite VFS to open it with; empty: SQLite's default.
  static StatusOr<std::unique_ptr<Db>> Open(const std::string& path, bool create,
                                            const std::string& vfs = "");
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Runs one or more statements that return no rows.
  Status Exec(std::string_view sql);
  StatusOr<Stmt> Prepare(std::string_view sql);
  // Status for the connection's last error, prefixed with `what`: a taken
  // key (UNIQUE, PRIMARY KEY) is AlreadyExists, a refused value (CHECK, NOT
  // NULL) InvalidArgument, another constraint (FOREIGN KEY) Internal, BUSY
  // Unavailable, a damaged file Corruption, I/O and permissions IOError.
  Status Error(std::string_view what) const;
  sqlite3* raw() const { return db_; }
  const std::string& path() const { return path_; }

 private:
  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_;
  std::string path_;
};

// A prepared statement. Bind indexes are 1-based, column indexes 0-based.
class Stmt {
 public:
  Stmt(Db* db, sqlite3_stmt* s) : db_(db), stmt_(s) {}
  Stmt(Stmt&& o) noexcept : db_(o.db_), stmt_(o.stmt_) { o.stmt_ = nullptr; }
  Stmt(const Stmt&) = delete;
  ~Stmt();

  Stmt& Bind(int i, int64_t v);
  Stmt& Bind(int i, std::string_view v);
  // Returns true while a row is available, false when done.
  StatusOr<bool> Step();
  // Steps to completion, expecting no rows.
  Status Run();
  // Steps through every row, calling f(*this) on each.
  template <typename F>
  Status ForEachRow(F&& f) {
    for (;;) {
      ASSIGN_OR_RETURN(bool row, Step());
      if (!row) return Status::OK();
      f(*this);
    }
  }
  // Every row, each turned into a T by read(*this).
  template <typename T, typename Read>
  StatusOr<std::vector<T>> Collect(Read read) {
    std::vector<T> out;
    RETURN_IF_ERROR(ForEachRow([&](const Stmt& s) { out.push_back(read(s)); }));
    return out;
  }

  int64_t Int(int col) const;
  std::string Text(int col) const;
  bool IsNull(int col) const;

 private:
  Db* db_;
  sqlite3_stmt* stmt_;
};

// BEGIN IMMEDIATE on construction; ROLLBACK on destruction unless Commit()ed.
class WriteTxn {
 public:
  static StatusOr<std::unique_ptr<WriteTxn>> Begin(Db* db);
  ~WriteTxn();
  Status Commit();

 private:
  explicit WriteTxn(Db* db) : db_(db) {}
  Db* db_;
  bool done_ = false;
};

}  // namespace aotid::storage
