#include "platform/install_layout.h"

#ifdef __APPLE__
#include <mach-o/dyld.h>
#else
#include <link.h>
#endif

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "base/fs.h"

namespace aotid::platform {
namespace {

std::string Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool IsLibc10(const char* path) {
  const char* base = std::strrchr(path, '/');
  base = base ? base + 1 : path;
  return std::strncmp(base, "libc10.", 7) == 0;
}

}  // namespace

std::string ExecutableDir() {
  std::string path = fs::ExecutablePath();
  return path.empty() ? "" : Parent(path);
}

std::vector<std::string> PluginCandidates() {
  std::vector<std::string> out;
  if (std::string dir = ExecutableDir(); !dir.empty()) {
    out.push_back(Parent(dir) + "/lib/aotid/" + AOTID_TORCH_PLUGIN_NAME);  // an install
    out.push_back(dir + "/" + AOTID_TORCH_PLUGIN_NAME);                    // the build tree
    // A test or benchmark binary in a folder of the build tree.
    for (std::string up = dir; up != "/" && up != "."; up = Parent(up)) {
      if (fs::Exists(up + "/CMakeCache.txt")) {
        if (up != dir) out.push_back(up + "/" + AOTID_TORCH_PLUGIN_NAME);
        break;
      }
    }
  }
  return out;
}

std::string DefaultWorkerDir() {
  std::string dir = ExecutableDir();
  if (dir.empty()) return "";
  for (const char* rel : {"/lib/aotid/python", "/python", "/../python"}) {
    std::string candidate = Parent(dir) + rel;
    if (fs::Exists(candidate + "/aotid_worker/compile.py")) return fs::RealPath(candidate);
  }
  return "";
}

std::string DefaultPython() {
  std::string dir = ExecutableDir();
  if (!dir.empty()) {
    for (const char* rel : {"/python3", "/../.venv/bin/python3", "/../../.venv/bin/python3"}) {
      std::string candidate = dir + rel;
      // The directory is resolved, not python3 itself: a venv's python3 is
      // a link out of the venv, and only called through the venv is it the
      // venv's.
      // One that exists but this user cannot run (a venv made from a Python
      // under /root) is still the one meant: doctor then says why it fails.
      if (struct stat st; ::lstat(candidate.c_str(), &st) == 0) {
        return fs::RealPath(Parent(candidate)) + "/python3";
      }
    }
  }
  return "python3";
}

std::string LoadedTorchDir() {
  std::string lib;
#ifdef __APPLE__
  for (uint32_t i = 0, n = _dyld_image_count(); i < n; ++i) {
    const char* name = _dyld_get_image_name(i);
    if (name != nullptr && IsLibc10(name)) {
      lib = name;
      break;
    }
  }
#else
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name == nullptr || !IsLibc10(info->dlpi_name)) return 0;
        *static_cast<std::string*>(out) = info->dlpi_name;
        return 1;
      },
      &lib);
#endif
  if (lib.empty()) return "";
  return Parent(Parent(fs::RealPath(lib)));  // torch/lib/libc10.so -> torch
}

}  // namespace aotid::platform
