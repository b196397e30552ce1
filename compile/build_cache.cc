#include "compile/build_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>
#include <vector>

#include "base/fs.h"
#include "base/json.h"

namespace aotid::compile {
namespace {

constexpr const char* kEntryFiles[] = {"model.so", "spec.json", "package.json"};
// Written by some builds only: a language model's generate spec, a
// sentence encoder's embed spec.
constexpr char kGenerateFile[] = "generate.json";
constexpr char kEmbedFile[] = "embed.json";
constexpr const char* kOptionalFiles[] = {kGenerateFile, kEmbedFile};
// Entries written by an aotid with another layout are rebuilt, not loaded.
constexpr int kLayout = 2;

StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(path, errno);
  return static_cast<int64_t>(st.st_size);
}

Status CheckKey(const BuildKey& key) {
  if (!fs::IsSha256Hex(key.artifact)) return InvalidArgument("bad artifact digest '" + key.artifact + "'");
  for (const std::string* part : {&key.package_model, &key.device, &key.fingerprint}) {
    if (part->empty() || part->find('/') != std::string::npos || part->find("..") != std::string::npos) {
      return InvalidArgument("bad build key part '" + *part + "'");
    }
  }
  return Status::OK();
}

// The kernel files at the top of a staging directory.
std::vector<std::string> KernelFilesIn(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = f.path().filename().string();
    if (f.is_regular_file() && IsKernelFile(name)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Whether the descriptor is still the file at `path` (a lock file another
// process removed and maybe replaced is not).
bool SameFile(int fd, const std::string& path) {
  struct stat a, b;
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// Opens the lock file at `path` and takes its lock without waiting: the
// descriptor, or -1 when another holds it or it is gone (removed by
// whoever cleaned its owner up).
int TryLockFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || !SameFile(fd, path)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string RandomOwnerId() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

constexpr char kLockSuffix[] = ".lock";

}  // namespace

bool IsKernelFile(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos) return false;
  for (const char* ext : {".cubin", ".fatbin", ".hsaco", ".spv"}) {
    if (name.size() > std::strlen(ext) && name.ends_with(ext)) return true;
  }
  return false;
}

std::string BuildKey::ToString() const {
  return artifact + "/" + package_model + "/" + device + "/" + fingerprint + "/" + options;
}

std::string BuildCache::EntryDir(const BuildKey& key) const {
  std::string dir =
      root_ + "/" + key.artifact + "/" + key.package_model + "." + key.device + "." + key.fingerprint;
  // The options text can be long; its full sha256 names it. Lookup also
  // compares the manifest's key, so even a collision cannot load the wrong build.
  if (!key.options.empty()) dir += "." + fs::Sha256Hex(key.options);
  return dir;
}

StatusOr<model::CacheEntry> BuildCache::Lookup(const BuildKey& key) const {
  ASSIGN_OR_RETURN(model::CacheEntry e, LookupFiles(key));
  // A load of this entry that never finished took its process down. Damage
  // the sizes did not show is the likely cause: rebuild it. An intact entry
  // is tried once more (the process may have been killed for another
  // reason), and not loaded again after a second such end.
  auto crashed = LoadCrashed(e);
  if (crashed.has_value()) {
    Status digest = VerifyDigest(e);
    if (!digest.ok()) {
      return Corruption(digest.message() + " (a load of it did not finish: " + crashed->why + ")");
    }
    if (crashed->attempts >= kMaxUnfinishedLoads) {
      return FailedPrecondition("loading this build ended its process " + std::to_string(crashed->attempts) +
                                " times (" + crashed->why +
                                "), and its files are intact; it is not loaded again "
                                "(`aotid cache prune` removes it, and the next start builds it anew)");
    }
  }
  return e;
}

StatusOr<model::CacheEntry> BuildCache::LookupFiles(const BuildKey& key) const {
  RETURN_IF_ERROR(CheckKey(key));
  model::CacheEntry e;
  e.dir = EntryDir(key);
  std::string manifest_path = e.dir + "/manifest.json";
  if (!fs::Exists(manifest_path)) {
    if (fs::Exists(e.dir)) return Corruption("cache entry " + e.dir + " has no manifest");
    return NotFound("no build in cache for " + e.dir);
  }
  ASSIGN_OR_RETURN(std::string text, fs::ReadFile(manifest_path));
  auto m = ParseJsonOrDiscarded(text);
  if (m.is_discarded() || !m.contains("files") || !m["files"].is_object()) {
    return Corruption("cache entry " + e.dir + " has an unreadable manifest");
  }
  if (m.value("layout", 1) != kLayout) {
    return Corruption("cache entry " + e.dir + " was written by an older aotid (layout " +
                      std::to_string(m.value("layout", 1)) + ")");
  }
  BuildKey recorded{m.value("artifact", ""), m.value("package_model", ""), m.value("device", ""),
                    m.value("fingerprint", ""), m.value("options", "")};
  if (!(recorded == key)) {
    return Corruption("cache entry " + e.dir +
                      " holds a build for another key (manifest: " + recorded.ToString() + ")");
  }
  for (const char* name : kEntryFiles) {
    auto want = m["files"].find(name);
    auto have = FileSize(e.dir + "/" + name);
    if (want == m["files"].end() || !want->is_number_integer()) {
      return Corruption("cache entry " + e.dir + " manifest lacks " + name);
    }
    if (!have.ok()) return Corruption("cache entry " + e.dir + " is missing " + name);
    if (*have != want->get<int64_t>()) {
      return Corruption("cache entry " + e.dir + ": " + name + " is " + std::to_string(*have) +
                        " bytes, manifest says " + std::to_string(want->get<int64_t>()));
    }
  }
  // The kernel files its manifest names: a device model opens them by name
  // when it loads or first runs, so one missing is a damaged entry now.
  for (const auto& [name, want] : m["files"].items()) {
    if (!IsKernelFile(name)) continue;
    auto have = FileSize(e.dir + "/" + name);
    if (!have.ok() || !want.is_number_integer() || *have != want.get<int64_t>()) {
      return Corruption("cache entry " + e.dir + ": kernel file " + name +
                        " is missing or not the size its manifest says");
    }
  }
  ASSIGN_OR_RETURN(std::string spec_text, fs::ReadFile(e.dir + "/spec.json"));
  auto spec = model::ModelSpec::FromJson(spec_text);
  if (!spec.ok()) return spec.status().WithContext("cache entry " + e.dir);
  e.spec = std::move(spec).value();
  e.so_path = e.dir + "/model.so";
  ASSIGN_OR_RETURN(e.package_json, fs::ReadFile(e.dir + "/package.json"));
  for (const char* name : kOptionalFiles) {
    auto want = m["files"].find(name);
    if (want == m["files"].end()) continue;
    auto have = FileSize(e.dir + "/" + name);
    if (!have.ok() || !want->is_number_integer() || *have != want->get<int64_t>()) {
      return Corruption("cache entry " + e.dir + ": " + name +
                        " is missing or not the size its manifest says");
    }
    (std::string_view(name) == kGenerateFile ? e.generate_path : e.embed_path) = e.dir + "/" + name;
  }
  return e;
}

StatusOr<model::CacheEntry> BuildCache::LookupSound(const BuildKey& key) const {
  ASSIGN_OR_RETURN(model::CacheEntry e, Lookup(key));
  RETURN_IF_ERROR(VerifyDigest(e));
  return e;
}

Status BuildCache::VerifyDigest(const model::CacheEntry& e) const {
  ASSIGN_OR_RETURN(std::string text, fs::ReadFile(e.dir + "/manifest.json"));
  auto m = ParseJsonOrDiscarded(text);
  if (m.is_discarded()) return Corruption("cache entry " + e.dir + " has an unreadable manifest");
  auto want = m.contains("sha256") && m["sha256"].is_object() ? m["sha256"].value("model.so", "") : "";
  if (want.empty()) return Status::OK();  // written before digests were recorded
  ASSIGN_OR_RETURN(std::string have, fs::Sha256File(e.dir + "/model.so"));
  if (have != want) {
    return Corruption("cache entry " + e.dir +
                      ": model.so does not match the digest recorded when it was built");
  }
  return Status::OK();
}

namespace {
std::string LoadMarker(const model::CacheEntry& e) { return e.dir + "/load.pending"; }
}  // namespace

// load.pending holds "PID ATTEMPTS OWNER": the process loading the entry,
// how many loads in a row have not finished, this one included, and the
// staging owner of its cache (OpenStaging), which names the daemon among
// those sharing the cache (pids of other containers may be ours) and
// whose lock says whether it still lives. No owner before OpenStaging.
Status BuildCache::BeginLoad(const model::CacheEntry& e) const {
  auto crashed = LoadCrashed(e);
  int attempts = (crashed ? crashed->attempts : 0) + 1;
  std::string owner = OwnerId();
  return fs::WriteFileAtomic(LoadMarker(e), std::to_string(::getpid()) + " " + std::to_string(attempts) +
                                                (owner.empty() ? "" : " " + owner) + "\n");
}

std::string BuildCache::OwnerId() const {
  std::string dir = staging_dir();
  return dir.empty() ? "" : dir.substr(dir.rfind('/') + 1);
}

bool BuildCache::OwnerAlive(const std::string& owner) const {
  if (owner.empty() || owner.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  const std::string path = root_ + "/.staging/" + owner + kLockSuffix;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;  // removed: its owner is gone and was cleaned up
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // lets go at once of a lock taken
  return held;
}

void BuildCache::EndLoad(const model::CacheEntry& e) const { ::unlink(LoadMarker(e).c_str()); }

std::vector<RecordedThreads> BuildCache::ListThreads(const std::string& entry_dir) const {
  std::vector<RecordedThreads> out;
  auto text = fs::ReadFile(entry_dir + "/threads.json");
  if (!text.ok() || text->size() > (1 << 20)) return out;
  nlohmann::json j = ParseJsonOrDiscarded(*text);
  if (!j.is_object()) return out;
  for (const auto& [key, r] : j.items()) {
    if (!r.is_object() || !r.contains("threads") || !r["threads"].is_number_integer()) continue;
    int64_t threads = r["threads"].get<int64_t>();
    if (threads < 1 || threads > 4096) continue;
    RecordedThreads rec;
    rec.key = key;
    rec.threads = static_cast<int>(threads);
    if (r.contains("note") && r["note"].is_string()) rec.note = r["note"].get<std::string>().substr(0, 300);
    if (r.contains("at_ms") && r["at_ms"].is_number_integer()) rec.at_ms = r["at_ms"].get<int64_t>();
    if (r.contains("settled") && r["settled"].is_boolean()) rec.settled = r["settled"].get<bool>();
    out.push_back(std::move(rec));
  }
  return out;
}

std::optional<RecordedThreads> BuildCache::ReadThreads(const std::string& entry_dir,
                                                       const std::string& key) const {
  for (auto& r : ListThreads(entry_dir)) {
    if (r.key == key) return r;
  }
  return std::nullopt;
}

Status BuildCache::RecordThreads(const std::string& entry_dir, const RecordedThreads& r) const {
  std::vector<RecordedThreads> all = ListThreads(entry_dir);
  std::erase_if(all, [&](const RecordedThreads& x) { return x.key == r.key; });
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.at_ms > b.at_ms; });
  if (all.size() > 15) all.resize(15);
  all.push_back(r);
  nlohmann::json j = nlohmann::json::object();
  for (const auto& x : all) {
    j[x.key] = {
        {"threads", x.threads}, {"note", x.note.substr(0, 300)}, {"at_ms", x.at_ms}, {"settled", x.settled}};
  }
  return fs::WriteFileAtomic(entry_dir + "/threads.json",
                             j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

std::optional<RecordedFootprint> BuildCache::ReadFootprint(const std::string& entry_dir,
                                                           const std::string& key) const {
  auto text = fs::ReadFile(entry_dir + "/footprint.json");
  if (!text.ok() || text->size() > (1 << 20)) return std::nullopt;
  nlohmann::json j = ParseJsonOrDiscarded(*text);
  if (!j.is_object() || !j.contains(key)) return std::nullopt;
  const nlohmann::json& r = j[key];
  auto bytes = [&](const char* name) -> std::optional<uint64_t> {
    if (!r.is_object() || !r.contains(name) || !r[name].is_number_unsigned()) return std::nullopt;
    return r[name].get<uint64_t>();
  };
  auto at_load = bytes("at_load"), peak = bytes("peak");
  if (!at_load || !peak || *at_load == 0 || *peak < *at_load) return std::nullopt;
  RecordedFootprint f{key, *at_load, *peak, 0};
  if (r.contains("at_ms") && r["at_ms"].is_number_integer()) f.at_ms = r["at_ms"].get<int64_t>();
  return f;
}

Status BuildCache::RecordFootprint(const std::string& entry_dir, const RecordedFootprint& r) const {
  nlohmann::json all = nlohmann::json::object();
  if (auto text = fs::ReadFile(entry_dir + "/footprint.json"); text.ok() && text->size() <= (1 << 20)) {
    nlohmann::json j = ParseJsonOrDiscarded(*text);
    if (j.is_object()) all = std::move(j);
  }
  all.erase(r.key);
  while (all.size() > 15) {
    // The oldest goes.
    auto oldest = all.begin();
    for (auto it = all.begin(); it != all.end(); ++it) {
      auto at = [](const nlohmann::json& x) {
        return x.is_object() && x.contains("at_ms") && x["at_ms"].is_number_integer()
                   ? x["at_ms"].get<int64_t>()
                   : 0;
      };
      if (at(*it) < at(*oldest)) oldest = it;
    }
    all.erase(oldest);
  }
  all[r.key] = {{"at_load", r.at_load}, {"peak", r.peak}, {"at_ms", r.at_ms}};
  return fs::WriteFileAtomic(entry_dir + "/footprint.json",
                             all.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

uint64_t BuildCache::EntryBytes(const std::string& entry_dir) {
  std::error_code ec;
  uint64_t total = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(entry_dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const auto n = it->file_size(size_ec);
      if (!size_ec) total += n;
    }
  }
  return total;
}

bool BuildCache::ForgetThreads(const std::string& entry_dir) const {
  return ::unlink((entry_dir + "/threads.json").c_str()) == 0;
}

std::optional<BuildCache::UnfinishedLoad> BuildCache::LoadCrashed(const model::CacheEntry& e) const {
  auto text = fs::ReadFile(LoadMarker(e));
  if (!text.ok()) return std::nullopt;
  long pid = 0;
  int attempts = 1;
  char owner_text[33] = "";
  if (std::sscanf(text->c_str(), "%ld %d %32s", &pid, &attempts, owner_text) < 1) pid = 0;
  const std::string owner = owner_text;
  if (owner.empty()) {
    if (pid == ::getpid()) return std::nullopt;  // a load of ours, still running
  } else {
    // A load of ours, or of another daemon sharing the cache that still
    // runs: not finished yet, rather than never.
    if (owner == OwnerId() || OwnerAlive(owner)) return std::nullopt;
  }
  return UnfinishedLoad{std::max(attempts, 1),
                        "pid " + std::to_string(pid) + " began loading it and never finished"};
}

StatusOr<std::string> BuildCache::NewStaging(const BuildKey& key) const {
  RETURN_IF_ERROR(CheckKey(key));
  RETURN_IF_ERROR(OpenStaging());
  return fs::MakeTempDir(staging_dir(), key.artifact.substr(0, 12) + "-");
}

StatusOr<int> BuildCache::LockBuild(const BuildKey& key) const {
  RETURN_IF_ERROR(CheckKey(key));
  const std::string dir = root_ + "/.locks";
  RETURN_IF_ERROR(fs::MakeDirs(dir));
  // Kept once made: removing a lock file another process may be opening
  // would let two take "the" lock.
  const std::string path = dir + "/" + fs::Sha256Hex(key.ToString()) + kLockSuffix;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoError("open " + path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) return -1;
    return ErrnoError("lock " + path, err);
  }
  return fd;
}

BuildCache::~BuildCache() {
  if (staging_lock_fd_ < 0) return;
  // Removed while the lock is held, so no other start takes it for a dead
  // owner's meanwhile.
  (void)fs::RemoveAll(staging_dir_);
  ::unlink((staging_dir_ + kLockSuffix).c_str());
  ::close(staging_lock_fd_);
}

std::string BuildCache::staging_dir() const {
  std::lock_guard<std::mutex> lock(staging_mu_);
  return staging_dir_;
}

Status BuildCache::OpenStaging(const std::function<void(const std::string& dir)>& before_removing) const {
  std::lock_guard<std::mutex> lock(staging_mu_);
  if (staging_lock_fd_ >= 0) return Status::OK();
  return OpenStagingLocked(before_removing);
}

Status BuildCache::OpenStagingLocked(
    const std::function<void(const std::string& dir)>& before_removing) const {
  const std::string base = root_ + "/.staging";
  RETURN_IF_ERROR(fs::MakeDirs(base));
  // Our own first: the lock file, locked, then the directory it guards. A
  // start cleaning up at the same moment may take a fresh lock file before
  // its maker does and remove it; the maker sees that and tries a new name.
  for (int attempt = 0; staging_lock_fd_ < 0; ++attempt) {
    if (attempt == 16) return Internal("cannot make a staging directory in " + base);
    const std::string id = RandomOwnerId();
    const std::string lock_path = base + "/" + id + kLockSuffix;
    int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return ErrnoError("create " + lock_path, errno);
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || !SameFile(fd, lock_path)) {
      ::close(fd);
      continue;
    }
    // Who holds it, for a person looking: the pid is of its own namespace.
    const std::string who = std::to_string(::getpid()) + "\n";
    (void)!::write(fd, who.data(), who.size());
    if (::mkdir((base + "/" + id).c_str(), 0755) != 0) {
      Status s = ErrnoError("create " + base + "/" + id, errno);
      ::unlink(lock_path.c_str());
      ::close(fd);
      return s;
    }
    staging_dir_ = base + "/" + id;
    staging_lock_fd_ = fd;
  }
  const std::string own = staging_dir_.substr(base.size() + 1);
  auto remove = [&](const std::string& dir) {
    if (before_removing) before_removing(dir);
    return fs::RemoveAll(dir);
  };
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(base, ec))
    names.push_back(e.path().filename().string());
  for (const std::string& name : names) {
    if (name == own || name == own + kLockSuffix) continue;
    const std::string path = base + "/" + name;
    if (name.ends_with(kLockSuffix)) {
      // An owner's lock: taken only when the owner is gone.
      int fd = TryLockFile(path);
      if (fd < 0) continue;
      const std::string dir = path.substr(0, path.size() - std::strlen(kLockSuffix));
      Status s = fs::Exists(dir) ? remove(dir) : Status::OK();
      if (s.ok()) ::unlink(path.c_str());
      ::close(fd);
      RETURN_IF_ERROR(s);
    } else if (fs::IsDirectory(path) && !fs::Exists(path + kLockSuffix)) {
      // A lock file is made before its directory and removed after it: a
      // directory without one is no owner's (an older aotid's staging).
      RETURN_IF_ERROR(remove(path));
    }
  }
  return Status::OK();
}

std::string BuildCache::EntryIdentity(const std::string& entry_dir) {
  struct stat st;
  if (::stat((entry_dir + "/manifest.json").c_str(), &st) != 0) return "";
  // With its change time too: an inode number may be used again.
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
         std::to_string(static_cast<int64_t>(st.st_ctime));
}

StatusOr<model::CacheEntry> BuildCache::Commit(const std::string& staging, const BuildKey& key,
                                               const std::string& replaces) const {
  auto fail = [&](Status s) {
    (void)fs::RemoveAll(staging);
    return s;
  };
  Status key_ok = CheckKey(key);
  if (!key_ok.ok()) return fail(key_ok);
  nlohmann::json manifest;
  manifest["artifact"] = key.artifact;
  manifest["package_model"] = key.package_model;
  manifest["device"] = key.device;
  manifest["fingerprint"] = key.fingerprint;
  manifest["options"] = key.options;
  manifest["layout"] = kLayout;
  for (const char* name : kEntryFiles) {
    auto size = FileSize(staging + "/" + name);
    if (!size.ok()) return fail(Corruption("build produced no " + std::string(name)));
    manifest["files"][name] = *size;
  }
  for (const char* name : kOptionalFiles) {
    if (!fs::Exists(staging + "/" + name)) continue;
    auto size = FileSize(staging + "/" + name);
    if (!size.ok()) return fail(size.status());
    manifest["files"][name] = *size;
  }
  std::vector<std::string> kernels = KernelFilesIn(staging);
  for (const auto& name : kernels) {
    auto size = FileSize(staging + "/" + name);
    if (!size.ok()) return fail(size.status());
    manifest["files"][name] = *size;
  }
  // Damage that keeps a file's size shows only in its digest; it is checked
  // when a load of the entry did not finish (LoadCrashed) and by `cache ls`.
  auto digest = fs::Sha256File(staging + "/model.so");
  if (!digest.ok()) return fail(digest.status());
  manifest["sha256"]["model.so"] = *digest;
  auto spec_text = fs::ReadFile(staging + "/spec.json");
  if (!spec_text.ok()) return fail(spec_text.status());
  auto spec = model::ModelSpec::FromJson(*spec_text);
  if (!spec.ok()) return fail(spec.status().WithContext("build output"));
  // Everything the worker wrote is fsynced before the manifest names it.
  std::vector<std::string> written = {"model.so",    "spec.json", "package.json",
                                      kGenerateFile, kEmbedFile,  "build.log"};
  written.insert(written.end(), kernels.begin(), kernels.end());
  for (const auto& name : written) {
    std::string p = staging + "/" + name;
    if (!fs::Exists(p)) continue;
    if (Status synced = env_->SyncFile(p); !synced.ok()) return fail(synced);
  }
  Status s = fs::WriteFileAtomic(env_, staging + "/manifest.json", manifest.dump(2));
  if (!s.ok()) return fail(s);

  std::string dest = EntryDir(key);
  std::string parent = root_ + "/" + key.artifact;
  s = fs::MakeDirs(env_, parent);
  if (!s.ok()) return fail(s);
  // A sound entry already in place was committed by another daemon
  // sharing the cache (one that built the same key at the same time, or
  // since this build began): it stays, and ours goes. It may be loading.
  // One damaged, in its sizes or in place (its digest), is replaced.
  auto keep_existing = [&]() -> std::optional<model::CacheEntry> {
    if (!replaces.empty() && EntryIdentity(dest) == replaces) return std::nullopt;
    auto existing = LookupSound(key);
    if (!existing.ok()) return std::nullopt;
    (void)fs::RemoveAll(staging);
    return std::move(existing).value();
  };
  if (fs::Exists(dest)) {
    if (auto existing = keep_existing()) return std::move(*existing);
    // A damaged entry: move it aside first so the rename below cannot fail
    // on a non-empty directory, then drop it. When another daemon moved it
    // first, the rename below says whether ours or theirs is published.
    std::string old = staging + ".old";
    s = env_->Rename(dest, old);
    if (s.ok()) {
      (void)fs::RemoveAll(old);
    } else if (fs::Exists(dest)) {
      return fail(s.WithContext("move aside " + dest));
    }
  }
  s = env_->Rename(staging, dest);
  if (!s.ok()) {
    // Another daemon published its build between the check and the rename.
    if (fs::Exists(dest)) {
      if (auto existing = keep_existing()) return std::move(*existing);
    }
    return fail(s.WithContext("publish the build"));
  }
  s = env_->SyncDir(parent);
  if (!s.ok()) return s;
  model::CacheEntry e;
  e.dir = dest;
  e.so_path = dest + "/model.so";
  e.spec = std::move(spec).value();
  auto package_json = fs::ReadFile(dest + "/package.json");
  if (!package_json.ok()) return package_json.status();
  e.package_json = std::move(package_json).value();
  if (manifest["files"].contains(kGenerateFile)) e.generate_path = dest + "/" + kGenerateFile;
  if (manifest["files"].contains(kEmbedFile)) e.embed_path = dest + "/" + kEmbedFile;
  return e;
}

std::vector<CacheListing> BuildCache::List() const {
  std::vector<CacheListing> out;
  std::error_code ec;
  for (const auto& a : std::filesystem::directory_iterator(root_, ec)) {
    std::string artifact = a.path().filename().string();
    if (!a.is_directory() || !fs::IsSha256Hex(artifact)) continue;
    for (const auto& e : std::filesystem::directory_iterator(a.path(), ec)) {
      if (!e.is_directory()) continue;
      CacheListing l;
      l.dir = e.path().string();
      l.key.artifact = artifact;
      for (const auto& f : std::filesystem::recursive_directory_iterator(e.path(), ec)) {
        if (f.is_regular_file()) l.bytes += static_cast<int64_t>(f.file_size());
      }
      auto text = fs::ReadFile(l.dir + "/manifest.json");
      auto m = text.ok() ? ParseJsonOrDiscarded(*text) : nlohmann::json();
      if (!m.is_object()) {
        l.status = Corruption("no readable manifest (an interrupted or damaged entry)");
      } else {
        l.key.package_model = m.value("package_model", "");
        l.key.device = m.value("device", "");
        l.key.fingerprint = m.value("fingerprint", "");
        l.key.options = m.value("options", "");
        auto found = Lookup(l.key);
        l.status = found.ok()                 ? Status::OK()
                   : EntryDir(l.key) != l.dir ? Corruption("its manifest describes another entry")
                                              : found.status();
      }
      out.push_back(std::move(l));
    }
  }
  return out;
}

int BuildCache::RemoveFailedLogs(const std::set<std::string>& used, bool dry_run) const {
  int removed = 0;
  std::error_code ec;
  for (const auto& a : std::filesystem::directory_iterator(root_, ec)) {
    std::string artifact = a.path().filename().string();
    if (!a.is_directory() || !fs::IsSha256Hex(artifact) || used.count(artifact)) continue;
    std::error_code inner;
    for (const auto& f : std::filesystem::directory_iterator(a.path(), inner)) {
      if (!f.is_regular_file() || !f.path().filename().string().ends_with(".failed.log")) continue;
      ++removed;
      if (!dry_run) ::unlink(f.path().c_str());
    }
    if (!dry_run) ::rmdir(a.path().c_str());  // only when empty
  }
  return removed;
}

}  // namespace aotid::compile
