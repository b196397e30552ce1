#include "runtime/hardware.h"

#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "base/shell.h"
#include "runtime/torch_version.h"

namespace aotid::runtime {
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
      "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
      "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
      "asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm"};
  for (const char* f : kInteresting) {
    if (flags.count(f)) hw->cpu_features.emplace_back(f);
  }
  auto has = [&](const char* f) { return flags.count(f) > 0; };
  if (hw->arch == "x86_64") {
    if (has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq")) hw->vector_isa = "avx512";
    else if (has("avx2") && has("fma")) hw->vector_isa = "avx2";
    else hw->vector_isa = "default";
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

// AOTID_CPU_ONLY=<reason>: the accelerators found are not to be used, for
// the reason given (a CI machine whose GPU is there but cannot allocate):
// `auto` means the CPU, an explicit mps or cuda is refused with the reason,
// and doctor shows it.
void KeepToTheCpuIfAsked(HardwareInfo* hw) {
  const char* why = std::getenv("AOTID_CPU_ONLY");
  if (why == nullptr || *why == '\0') return;
  std::string reason = std::string("AOTID_CPU_ONLY is set: ") + why;
  for (std::string* missing : {&hw->mps_missing, &hw->cuda_missing}) {
    if (missing->empty()) *missing = reason;
  }
  hw->accelerators.push_back("cpu only: " + reason);
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
  if (hw.os == "darwin" && hw.arch == "arm64") {
    hw.accelerators.push_back("mps: Apple Silicon GPU (Metal Performance Shaders)");
    hw.mps_missing.clear();
  } else {
    hw.accelerators.push_back("mps: none (not Apple Silicon)");
    hw.mps_missing = "this machine is not an Apple Silicon Mac";
  }
  std::ifstream gpus("/proc/driver/nvidia/version");
  bool nvidia = gpus.good();
  bool cpu_torch = hw.torch_version.find("+cpu") != std::string::npos;
  if (!nvidia) {
    hw.accelerators.push_back("cuda: none (no NVIDIA driver)");
    hw.cuda_missing = "no NVIDIA driver";
  } else if (cpu_torch) {
    hw.accelerators.push_back("cuda: NVIDIA driver present, but this aotid's torch (" + hw.torch_version +
                              ") is a CPU build");
    hw.cuda_missing = "this aotid's torch " + hw.torch_version + " is a CPU build";
  } else {
    hw.accelerators.push_back("cuda: NVIDIA driver present");
    hw.cuda_missing.clear();
  }
  KeepToTheCpuIfAsked(&hw);
  return hw;
}

Status DeviceAvailable(const HardwareInfo& hw, const std::string& device) {
  if (device == "cpu") return Status::OK();
  const std::string* missing = device == "mps" ? &hw.mps_missing : device == "cuda" ? &hw.cuda_missing : nullptr;
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
  std::string all = hw.os + "|" + hw.arch + "|" + hw.vector_isa + "|" + hw.torch_version + "|" +
                    hw.compiler + "|";
  for (const auto& f : hw.cpu_features) all += f + ",";
  char hash[9];
  std::snprintf(hash, sizeof hash, "%08x", Fnv1a(all));
  return hw.os + "-" + hw.arch + "-" + hw.vector_isa + "-torch" + hw.torch_version + "-" + hash;
}

}  // namespace aotid::runtime
