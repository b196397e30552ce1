// What this machine is, as far as a compiled model cares, and the
// fingerprint that keys the build cache: a build is reused only on a machine
// with the same fingerprint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace aotid::platform {

struct HardwareInfo {
  std::string os;          // "linux", "darwin"
  std::string arch;        // "x86_64", "arm64", "aarch64"
  std::string cpu_model;   // as the OS reports it
  std::string vector_isa;  // best ISA inductor can target: "avx512", "avx2", "neon", "sve", "default"
  std::vector<std::string> cpu_features;  // the relevant flags that are present
  int cores = 0;  // the CPUs this process may run on (its affinity), at most those online
  int64_t memory_bytes = 0;
  std::string torch_version;  // of the libtorch aotid is linked against
  std::string compiler;       // first line of `$CXX --version`
  // Accelerators, one line each ("mps: Apple M2 (macOS 14.5)", "cuda: not
  // available: this torch (2.13.0+cpu) is a CPU build"), and why each one
  // cannot be used here (empty when it can): set by ProbeDevices
  // (platform/device_probe.h) from what torch says, never by ProbeHardware.
  // Not part of the fingerprint: the device a build is for is in its cache key.
  std::vector<std::string> accelerators;
  std::string mps_missing = "not probed (torch was not asked)";
  std::string cuda_missing = "not probed (torch was not asked)";
};

// Ok when `device` (cpu, mps, cuda) can run models here; otherwise
// Unavailable saying why ("device 'cuda' is not available here: no NVIDIA driver").
Status DeviceAvailable(const HardwareInfo& hw, const std::string& device);
// What `auto` means here: mps where torch can use it, else cuda where torch
// can use it, else cpu (cpu also where AOTID_CPU_ONLY=<reason> is set, and
// before ProbeDevices has said).
std::string AutoDevice(const HardwareInfo& hw);

// Probes the machine: OS, CPU, memory, torch and compiler; the accelerators
// are left "not probed" (ProbeDevices asks torch). `cxx` is the compiler
// builds use (its version is part of the fingerprint); the probe runs it once.
HardwareInfo ProbeHardware(const std::string& cxx = "c++");

// "<os>-<arch>-<isa>-torch<version>-<8 hex digits over every field>": readable
// at a glance and different whenever anything that affects a build differs.
std::string Fingerprint(const HardwareInfo& hw);

}  // namespace aotid::platform
