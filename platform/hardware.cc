#include "platform/hardware.h"

#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "base/shell.h"
#include "platform/torch_version.h"

namespace aotid::platform {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

void ProbeLinuxCpu(HardwareInfo* hw) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string value = line.substr(std::min(line.size(), colon + 2));
    if ((key == "model name" || key == "Model") && hw->cpu_model.empty()) hw->cpu_model = value;
    if ((key == "flags" || key == "Features") && flags.empty()) {
      std::istringstream words(value);
      std::string w;
      while (words >> w) flags.insert(w);
    }
  }
  static const char* kInteresting[] = {
      "sse4_2",   "avx",      "avx2",        "fma",         "f16c",        "avx512f",  "avx512bw",
      "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
      "amx_int8", "asimd",    "asimdhp",     "sve",         "sve2",        "bf16",     "i8mm"};
  for (const char* f : kInteresting) {
    if (flags.count(f)) hw->cpu_features.emplace_back(f);
  }
  auto has = [&](const char* f) { return flags.count(f) > 0; };
  if (hw->arch == "x86_64") {
    if (has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq"))
      hw->vector_isa = "avx512";
    else if (has("avx2") && has("fma"))
      hw->vector_isa = "avx2";
    else
      hw->vector_isa = "default";
  } else if (hw->arch == "aarch64" || hw->arch == "arm64") {
    hw->vector_isa = has("sve") ? "sve" : (has("asimd") ? "neon" : "default");
  } else {
    hw->vector_isa = "default";
  }
}

uint32_t Fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

}  // namespace

HardwareInfo ProbeHardware(const std::string& cxx) {
  HardwareInfo hw;
  struct utsname u;
  if (::uname(&u) == 0) {
    hw.os = Lower(u.sysname);
    hw.arch = u.machine;
  }
  hw.cores = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
#ifdef __linux__
  // The CPUs this process may run on (taskset, a cpuset): threads beyond
  // them would only take turns.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) {
    hw.cores = std::min(hw.cores, CPU_COUNT(&allowed));
  }
#endif
  hw.memory_bytes = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  if (hw.os == "linux") {
    ProbeLinuxCpu(&hw);
  } else {
    hw.vector_isa = (hw.arch == "arm64") ? "neon" : "default";
  }
  hw.torch_version = kTorchVersion;
  std::string version = RunShell(cxx + " --version").out;
  hw.compiler = version.substr(0, version.find('\n'));
  return hw;
}

Status DeviceAvailable(const HardwareInfo& hw, const std::string& device) {
  if (device == "cpu") return Status::OK();
  const std::string* missing = device == "mps"    ? &hw.mps_missing
                               : device == "cuda" ? &hw.cuda_missing
                                                  : nullptr;
  if (missing == nullptr) return InvalidArgument("unknown device '" + device + "'");
  if (missing->empty()) return Status::OK();
  return Unavailable("device '" + device + "' is not available here: " + *missing);
}

std::string AutoDevice(const HardwareInfo& hw) {
  if (hw.mps_missing.empty()) return "mps";
  if (hw.cuda_missing.empty()) return "cuda";
  return "cpu";
}

std::string Fingerprint(const HardwareInfo& hw) {
  std::string all =
      hw.os + "|" + hw.arch + "|" + hw.vector_isa + "|" + hw.torch_version + "|" + hw.compiler + "|";
  for (const auto& f : hw.cpu_features) all += f + ",";
  char hash[9];
  std::snprintf(hash, sizeof hash, "%08x", Fnv1a(all));
  return hw.os + "-" + hw.arch + "-" + hw.vector_isa + "-torch" + hw.torch_version + "-" + hash;
}

}  // namespace aotid::platform
