#include "daemon/model_dir.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <vector>

#include "base/fs.h"
#include "base/log.h"
#include "storage/version_settings.h"

namespace aotid::daemon {
namespace {

bool EndsWithPt2(const std::string& name) { return name.size() > 4 && name.ends_with(".pt2"); }

// Collects the .pt2 files under `dir`, `depth` levels down at most; stops
// once there are more than `cap` (a folder of many is refused anyway).
// Names ending in .pt2 that are no file (a folder, a pipe, a link that
// leads nowhere or to itself) go to `odd`, with what they are.
void Collect(const std::string& dir, int depth, size_t cap, std::vector<std::string>* found,
             std::vector<std::string>* odd) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (!n.empty() && n[0] != '.') names.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    if (found->size() > cap) return;
    std::string p = dir + "/" + n;
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) {
      if (EndsWithPt2(n)) odd->push_back(p + " is a link that leads nowhere");
      continue;
    }
    if (S_ISREG(st.st_mode) && EndsWithPt2(n)) {
      found->push_back(p);
    } else if (S_ISDIR(st.st_mode)) {
      if (EndsWithPt2(n)) odd->push_back(p + " is a folder");
      if (depth > 1) Collect(p, depth - 1, cap, found, odd);
    } else if (EndsWithPt2(n)) {
      odd->push_back(p + " is not a regular file");
    }
  }
}

}  // namespace

StatusOr<std::string> FindModelPackage(const std::string& path, const std::string& name) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return NotFound("--model-dir " + path + " does not exist");
  if (S_ISREG(st.st_mode)) return path;
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("--model-dir " + path + " is neither a file nor a folder");
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::vector<std::string> found, odd;
  Collect(dir, kModelDirDepth, 20, &found, &odd);
  if (found.empty()) {
    std::string why = odd.empty() ? "" : ": " + odd[0].substr(dir.size() + 1);
    return NotFound("no .pt2 package in --model-dir " + path + " (nor in its folders, " +
                    std::to_string(kModelDirDepth - 1) + " levels down)" + why);
  }
  // One file reached by several paths (a link to a folder: `current ->
  // v3`) is one package.
  std::set<std::string> seen;
  std::erase_if(found, [&seen](const std::string& p) { return !seen.insert(fs::RealPath(p)).second; });
  if (found.size() == 1) return found[0];
  for (const std::string& top : {dir + "/" + name + ".pt2", dir + "/model.pt2"}) {
    if (std::find(found.begin(), found.end(), top) != found.end()) return top;
  }
  std::string list;
  for (size_t i = 0; i < found.size() && i < 5; ++i) {
    list += (i ? ", " : "") + found[i].substr(dir.size() + 1);
  }
  if (found.size() > 5) list += ", ...";
  return InvalidArgument("--model-dir " + path + " holds several .pt2 packages (" + list +
                         "): name the one to serve (--model-dir FILE), or put it at the top as " + name +
                         ".pt2");
}

StatusOr<storage::ModelVersion> AdoptModel(storage::ModelStore* store, const std::string& file,
                                           const std::string& name, bool* added) {
  *added = false;
  storage::AddRequest req;
  req.file = file;
  req.name = name;
  // One model, for as long as the daemon runs: never unloaded for idling.
  req.settings.keep_alive_s = storage::kKeepAliveAlways;
  // What is not a package is refused before its bytes are all read.
  RETURN_IF_ERROR(storage::ModelStore::CheckAddRequest(req).status());
  struct stat st {};
  ::stat(file.c_str(), &st);
  LOG_INFO << "single-model mode: reading " << file << " (" << (st.st_size >> 20) << " MiB)";
  std::optional<storage::ModelVersion> serving;
  if (auto m = store->GetModel(name); m.ok()) {
    // Hashed only to compare: a store without the model (a new pod's)
    // learns the digest as the add copies the file.
    if (!m->versions.empty()) {
      ASSIGN_OR_RETURN(std::string digest, fs::Sha256File(file));
      if (m->versions.back().artifact == digest) serving = m->versions.back();
    }
  } else if (m.status().code() != StatusCode::kNotFound) {
    return m.status();
  }
  if (!serving) {
    ASSIGN_OR_RETURN(serving, store->Add(req));
    *added = true;
  }
  // The newest version, whatever an earlier `aotid set` left: this is the
  // folder's model, and it is what is served.
  RETURN_IF_ERROR(
      store->Set(name, std::nullopt, {{"enabled", "true"}, {"version_policy", "latest"}}).status());
  // Nothing serves the earlier versions again: they go, and with them what
  // only they used, and the copies a killed start left (the store's disk is
  // a pod's, often small). The builds stay in the cache, which may be shared.
  ASSIGN_OR_RETURN(storage::ModelInfo model, store->GetModel(name));
  std::vector<storage::ModelStore::ModelRef> earlier;
  for (const auto& v : model.versions) {
    if (v.version != serving->version) earlier.emplace_back(name, v.version);
  }
  if (!earlier.empty()) RETURN_IF_ERROR(store->Remove(earlier).status());
  auto gc = store->CollectGarbage();
  if (!gc.ok()) {
    LOG_WARNING << "single-model mode: cleaning the store: " << gc.status().message();
  } else if (gc->bytes_freed > 0) {
    LOG_INFO << "single-model mode: " << (gc->bytes_freed >> 20) << " MiB freed in the store ("
             << earlier.size() << " earlier version" << (earlier.size() == 1 ? "" : "s") << ", "
             << gc->tmp_files.size() << " partial cop" << (gc->tmp_files.size() == 1 ? "y" : "ies") << ")";
  }
  return *serving;
}

}  // namespace aotid::daemon
