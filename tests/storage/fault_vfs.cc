#include "tests/storage/fault_vfs.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <mutex>

namespace aotid::testing {
namespace {

constexpr char kVfsName[] = "aotid-fault";

std::atomic<FaultInjectionEnv*> g_env{nullptr};
sqlite3_vfs* g_real = nullptr;

struct FaultFile {
  sqlite3_file base;  // first: SQLite sees this
  sqlite3_file* real;
  std::string* path;
  bool sync_dir_on_sync;  // a new WAL or journal: the unix VFS syncs its directory with its first sync
};

FaultFile* Cast(sqlite3_file* f) { return reinterpret_cast<FaultFile*>(f); }

int Close(sqlite3_file* f) {
  FaultFile* ff = Cast(f);
  int rc = ff->real->pMethods ? ff->real->pMethods->xClose(ff->real) : SQLITE_OK;
  delete ff->path;
  return rc;
}
int Read(sqlite3_file* f, void* buf, int n, sqlite3_int64 off) {
  return Cast(f)->real->pMethods->xRead(Cast(f)->real, buf, n, off);
}
int Write(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  FaultFile* ff = Cast(f);
  if (!g_env.load()->BeforeWrite(*ff->path, off, n).ok()) return SQLITE_IOERR_WRITE;
  return ff->real->pMethods->xWrite(ff->real, buf, n, off);
}
int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  FaultFile* ff = Cast(f);
  if (!g_env.load()->BeforeTruncate(*ff->path, size).ok()) return SQLITE_IOERR_TRUNCATE;
  return ff->real->pMethods->xTruncate(ff->real, size);
}
int Sync(sqlite3_file* f, int) {
  FaultFile* ff = Cast(f);
  // The env models durability; no real fsync (it would only make the test slow).
  if (!g_env.load()->FileSynced(*ff->path).ok()) return SQLITE_IOERR_FSYNC;
  if (ff->sync_dir_on_sync) {
    if (!g_env.load()->SyncDir(std::filesystem::path(*ff->path).parent_path().string()).ok())
      return SQLITE_IOERR_DIR_FSYNC;
    ff->sync_dir_on_sync = false;
  }
  return SQLITE_OK;
}
int FileSize(sqlite3_file* f, sqlite3_int64* size) {
  return Cast(f)->real->pMethods->xFileSize(Cast(f)->real, size);
}
int Lock(sqlite3_file* f, int level) { return Cast(f)->real->pMethods->xLock(Cast(f)->real, level); }
int Unlock(sqlite3_file* f, int level) { return Cast(f)->real->pMethods->xUnlock(Cast(f)->real, level); }
int CheckReservedLock(sqlite3_file* f, int* out) {
  return Cast(f)->real->pMethods->xCheckReservedLock(Cast(f)->real, out);
}
int FileControl(sqlite3_file* f, int op, void* arg) {
  return Cast(f)->real->pMethods->xFileControl(Cast(f)->real, op, arg);
}
int SectorSize(sqlite3_file* f) { return Cast(f)->real->pMethods->xSectorSize(Cast(f)->real); }
int DeviceCharacteristics(sqlite3_file* f) {
  return Cast(f)->real->pMethods->xDeviceCharacteristics(Cast(f)->real);
}
int ShmMap(sqlite3_file* f, int region, int size, int extend, void volatile** out) {
  return Cast(f)->real->pMethods->xShmMap(Cast(f)->real, region, size, extend, out);
}
int ShmLock(sqlite3_file* f, int offset, int n, int flags) {
  return Cast(f)->real->pMethods->xShmLock(Cast(f)->real, offset, n, flags);
}
void ShmBarrier(sqlite3_file* f) { Cast(f)->real->pMethods->xShmBarrier(Cast(f)->real); }
int ShmUnmap(sqlite3_file* f, int del) { return Cast(f)->real->pMethods->xShmUnmap(Cast(f)->real, del); }
int Fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** out) {
  return Cast(f)->real->pMethods->xFetch(Cast(f)->real, off, n, out);
}
int Unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return Cast(f)->real->pMethods->xUnfetch(Cast(f)->real, off, p);
}

const sqlite3_io_methods kMethods = {
    3,
    Close,
    Read,
    Write,
    Truncate,
    Sync,
    FileSize,
    Lock,
    Unlock,
    CheckReservedLock,
    FileControl,
    SectorSize,
    DeviceCharacteristics,
    ShmMap,
    ShmLock,
    ShmBarrier,
    ShmUnmap,
    Fetch,
    Unfetch,
};

int Open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
  FaultFile* ff = Cast(f);
  ff->base.pMethods = nullptr;
  ff->real = reinterpret_cast<sqlite3_file*>(ff + 1);
  ff->path = nullptr;
  ff->sync_dir_on_sync = false;
  struct stat st;
  bool create = name != nullptr && (flags & SQLITE_OPEN_CREATE) && ::stat(name, &st) != 0;
  if (create) {
    if (!g_env.load()->BeforeCreate(name).ok()) return SQLITE_CANTOPEN;
    ff->sync_dir_on_sync =
        (flags & (SQLITE_OPEN_WAL | SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_SUPER_JOURNAL)) != 0;
  }
  int rc = g_real->xOpen(g_real, name, ff->real, flags, out_flags);
  if (rc != SQLITE_OK) return rc;
  ff->path = new std::string(name != nullptr ? name : "");
  ff->base.pMethods = &kMethods;
  return SQLITE_OK;
}

int Delete(sqlite3_vfs*, const char* name, int sync_dir) {
  FaultInjectionEnv* env = g_env.load();
  Status s = env->RemoveFile(name);
  if (s.code() == StatusCode::kNotFound) return SQLITE_IOERR_DELETE_NOENT;
  if (!s.ok()) return SQLITE_IOERR_DELETE;
  if (sync_dir && !env->SyncDir(std::filesystem::path(name).parent_path().string()).ok())
    return SQLITE_IOERR_DIR_FSYNC;
  return SQLITE_OK;
}

int Access(sqlite3_vfs*, const char* name, int flags, int* out) {
  return g_real->xAccess(g_real, name, flags, out);
}
int FullPathname(sqlite3_vfs*, const char* name, int n, char* out) {
  return g_real->xFullPathname(g_real, name, n, out);
}
void* DlOpen(sqlite3_vfs*, const char* name) { return g_real->xDlOpen(g_real, name); }
void DlError(sqlite3_vfs*, int n, char* out) { g_real->xDlError(g_real, n, out); }
void (*DlSym(sqlite3_vfs*, void* h, const char* sym))(void) { return g_real->xDlSym(g_real, h, sym); }
void DlClose(sqlite3_vfs*, void* h) { g_real->xDlClose(g_real, h); }
int Randomness(sqlite3_vfs*, int n, char* out) { return g_real->xRandomness(g_real, n, out); }
int Sleep(sqlite3_vfs*, int us) { return g_real->xSleep(g_real, us); }
int CurrentTime(sqlite3_vfs*, double* out) { return g_real->xCurrentTime(g_real, out); }
int GetLastError(sqlite3_vfs*, int n, char* out) { return g_real->xGetLastError(g_real, n, out); }
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* out) { return g_real->xCurrentTimeInt64(g_real, out); }

}  // namespace

std::string UseFaultVfs(FaultInjectionEnv* env) {
  g_env.store(env);
  static std::once_flag once;
  std::call_once(once, [] {
    g_real = sqlite3_vfs_find(nullptr);
    static sqlite3_vfs vfs{};
    vfs.iVersion = 2;
    vfs.szOsFile = static_cast<int>(sizeof(FaultFile)) + g_real->szOsFile;
    vfs.mxPathname = g_real->mxPathname;
    vfs.zName = kVfsName;
    vfs.xOpen = Open;
    vfs.xDelete = Delete;
    vfs.xAccess = Access;
    vfs.xFullPathname = FullPathname;
    vfs.xDlOpen = DlOpen;
    vfs.xDlError = DlError;
    vfs.xDlSym = DlSym;
    vfs.xDlClose = DlClose;
    vfs.xRandomness = Randomness;
    vfs.xSleep = Sleep;
    vfs.xCurrentTime = CurrentTime;
    vfs.xGetLastError = GetLastError;
    vfs.xCurrentTimeInt64 = CurrentTimeInt64;
    sqlite3_vfs_register(&vfs, /*makeDflt=*/0);
  });
  return kVfsName;
}

}  // namespace aotid::testing
