// Which accelerators the torch that builds use can use on this machine, as
// torch itself says: the compile worker's probe (python -m
// aotid_worker.probe) asks torch.backends.mps and torch.cuda, makes a first
// tensor on each device it lists, and says why for each one it cannot use
// ("mps: macOS 13.6 (MPS needs 14)", "cuda: this torch (2.13.0+cpu) is a CPU
// build"). Guessing from the OS or a driver file is wrong too often: torch
// 2.13's MPS needs macOS 14, a hosted Mac lists a GPU that cannot allocate,
// and a CPU wheel need not say "+cpu".
//
// The answer is asked once per torch and machine and kept in one small file
// beside the build cache (<store>/cache/devices.json) under a key made of
// the machine's fingerprint and what else changes it (the Python, the OS
// release, the NVIDIA driver, CUDA_VISIBLE_DEVICES), so a start with the
// answer kept reads one file and runs no Python. A probe that fails, times
// out or answers garbage leaves the CPU only, with the reason; it is not
// kept, so the next start asks again.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"
#include "platform/hardware.h"

namespace aotid::platform {

// One accelerator, as the probe found it.
struct DeviceState {
  bool usable = false;
  std::string reason;      // why not, when not usable
  std::string name;        // the device, when usable ("NVIDIA H100 80GB HBM3")
  std::string capability;  // CUDA compute capability ("9.0"); "" for MPS
  int count = 0;           // CUDA devices visible
  std::string note;        // more to show (CUDA and Triton versions, the macOS release)
};

struct DeviceAnswer {
  std::string torch_version;  // of the Python that answered
  DeviceState mps;
  DeviceState cuda;
};

// The answer in the probe's output: the JSON after the last line that
// starts with "aotid-devices: ". InvalidArgument saying what is wrong when
// there is none or it does not read as one.
StatusOr<DeviceAnswer> ParseDeviceProbeOutput(const std::string& output);
// The answer as JSON (the probe's form), and back.
std::string DeviceAnswerToJson(const DeviceAnswer& answer);
StatusOr<DeviceAnswer> DeviceAnswerFromJson(const std::string& text);

inline constexpr int kDeviceProbeTimeoutMs = 60000;

struct DeviceProbeOptions {
  std::string python;      // the interpreter builds use (with torch)
  std::string worker_dir;  // holds aotid_worker/ (PYTHONPATH)
  std::string cache_file;  // where the answer is kept; "" keeps none. Written only when its folder exists.
  int timeout_ms = kDeviceProbeTimeoutMs;  // the probe is killed after this, and the CPU only is used
  bool refresh = false;                    // ask the worker even when the kept answer is current (doctor)
  // Runs the probe and returns its output (stdout and stderr), or why it
  // gave none. Empty: RunWorkerProbe. Tests pass a fake.
  std::function<StatusOr<std::string>(const DeviceProbeOptions&)> run;
};

// The options for the build cache at `cache_dir` (the store's cache/, or
// build.cache_dir): the answer kept in <cache_dir>/devices.json, beside the
// builds it decides.
DeviceProbeOptions DeviceProbeForCache(const std::string& cache_dir, const std::string& python,
                                       const std::string& worker_dir);

// Runs `python -m aotid_worker.probe` with PYTHONPATH=worker_dir, stdin
// from /dev/null, and returns what it printed. Unavailable when it could
// not start, exited other than 0 (with its last lines) or ran past
// timeout_ms (then it and what it started are killed). Blocks; at most
// timeout_ms plus the time to reap it.
StatusOr<std::string> RunWorkerProbe(const DeviceProbeOptions& options);

// What changes the answer: the fingerprint, the Python, the OS release
// (a macOS update), the NVIDIA driver's version and CUDA_VISIBLE_DEVICES.
std::string DeviceProbeKey(const HardwareInfo& hw, const std::string& python);

// The answer kept in `cache_file` under `key`. NotFound when there is no
// file, FailedPrecondition when it was kept for another key (stale),
// Corruption saying what is wrong when it does not read.
StatusOr<DeviceAnswer> ReadKeptDevices(const std::string& cache_file, const std::string& key);

// How ProbeDevices came by its answer.
struct DeviceProbeReport {
  bool from_cache = false;  // the kept answer was current and used
  bool ran = false;         // the worker's probe ran
  Status status;            // ok, or why there is no answer (the CPU only is used)
  int64_t probe_ms = 0;     // how long the probe ran
  std::string note;         // for doctor and the log: where the answer came from, or why there is none
};

// Fills hw's mps_missing, cuda_missing and accelerators from the kept
// answer when it is current (and not `refresh`), else from a run of the
// probe, kept when it answered. Without an answer, both accelerators are
// missing with the reason. AOTID_CPU_ONLY=<reason> then applies as
// ApplyDeviceAnswer says. Never fails: the report says what happened.
DeviceProbeReport ProbeDevices(const DeviceProbeOptions& options, HardwareInfo* hw);

// Sets hw's mps_missing, cuda_missing and accelerators from `answer`, then
// honours AOTID_CPU_ONLY=<reason>: accelerators that were usable are
// refused with that reason (`auto` is the CPU) and doctor shows it.
void ApplyDeviceAnswer(const DeviceAnswer& answer, HardwareInfo* hw);

}  // namespace aotid::platform
