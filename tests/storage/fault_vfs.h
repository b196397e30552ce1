// A SQLite VFS that puts the database's files under a FaultInjectionEnv:
// it wraps SQLite's default VFS, and reports each write, truncation, sync,
// creation and deletion to the env first (which may refuse it: the crash
// point), so that the env can undo what was never synced.
//
// Modelled as SQLite's unix VFS behaves: a WAL or rollback journal created
// by SQLite has its directory synced with its first sync, and a delete
// asked with dirSync syncs the directory. The -shm file is passed through
// untouched: SQLite rebuilds it from the WAL after a crash.
#pragma once

#include <string>

#include "tests/base/fault_env.h"

namespace aotid::testing {

// Registers the VFS (once per process; not as the default) and points it at
// `env`, which must outlive every database opened with it. Returns its
// name, for StoreOptions::sqlite_vfs.
std::string UseFaultVfs(FaultInjectionEnv* env);

}  // namespace aotid::testing
