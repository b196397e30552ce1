// What a runner process may do once it has loaded libtorch and before it
// loads a package's code: only what running a model needs.
//
// On Linux, in layers, each of which stands without the others:
//  - rlimits: the version's memory limit (RLIMIT_DATA: the heap, anonymous
//    mappings and thread stacks; a model that allocates past it fails its
//    run, not the machine), no core files, a bound on files it writes;
//  - no new privileges, and death with the daemon (PR_SET_PDEATHSIG);
//  - Landlock (kernel 5.13+): files can be read only beneath the system's
//    library directories (/usr, /lib*, /bin, /sys), a handful of files
//    under /etc (the dynamic loader's, the time zone's), its own /proc/PID
//    and a few of /proc's files about the machine, the directories of the
//    libraries already loaded (libtorch's), and the paths it is given;
//    written only beneath the paths it is given to write. The rest of /etc
//    (the config and the token file), another blob of the store, another
//    build and every other process's /proc (the daemon's environment) cannot
//    be opened. Where the kernel has Landlock's network and scope rules
//    (ABI 4 and 6) TCP and abstract sockets and signals to processes outside
//    the sandbox are refused too;
//  - seccomp (libseccomp): no sockets, no ptrace, mount, namespaces, BPF,
//    io_uring, kernel keys or modules; for a runner also no exec, no fork
//    (threads only) and signals only to itself. A runner's refused call
//    fails with EPERM and writes one line to stderr naming the call, which
//    the daemon logs.
//
// Where Landlock is missing, seccomp also refuses a runner every open for
// writing and every call that creates, removes or renames a file; reads are
// then not confined, nor a compiler's files. macOS has neither; runners
// there run with the rlimits only (docs/RUNNERS.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace aotid::runner {

struct SandboxOptions {
  std::vector<std::string> read_paths;   // beyond the system's and the loaded libraries' directories
  std::vector<std::string> write_paths;  // read, write, create and remove beneath these
  uint64_t memory_limit_bytes = 0;       // RLIMIT_DATA; 0 leaves it as it is
  bool gpu = false;                      // allow the GPU's device files and libraries (FindGpuPaths)
  // A compiler and Python run inside: processes may be started (fork and
  // exec, in no new namespace) and signalled, and the few more files they
  // read under /etc are allowed (the alternatives' links, the user
  // database, Debian's /etc/pythonX.Y).
  bool processes = false;
};

// What was put in place, for the runner's log line.
struct SandboxReport {
  int landlock_abi = 0;  // 0: no Landlock
  bool seccomp = false;
  std::string Describe() const;
};

// What this machine offers runners, without entering anything (for
// `aotid doctor`).
struct SandboxSupport {
  int landlock_abi = 0;
  bool seccomp = false;
  std::string Describe() const;
};
SandboxSupport ProbeSandbox();

// What a process that runs models on an NVIDIA GPU opens besides the
// system's files, as found here: the driver's device files in `dev_dir`
// (every nvidia* entry: nvidia0..N, nvidiactl, nvidia-uvm, nvidia-modeset,
// the nvidia-caps folder; and dri), and, for each of `library_dirs` (the
// folders of the libraries loaded so far) that is a pip-installed torch's
// lib/ or an NVIDIA package's folder beneath site-packages/nvidia, that
// torch package and the site-packages/nvidia beside it, whole: a CUDA torch
// loads parts of those libraries only at first use (cuDNN's engines,
// NVRTC's builtins), after the sandbox is in place. Only paths that exist;
// sorted, each once.
struct GpuPaths {
  std::vector<std::string> devices;       // read and written
  std::vector<std::string> library_dirs;  // read only
};
GpuPaths FindGpuPaths(const std::string& dev_dir, const std::vector<std::string>& library_dirs);

// The part that must come first, before anything is loaded: limits, no
// new privileges, death with the parent `parent_pid` (an error when the
// parent is already gone).
Status EnterLimits(const SandboxOptions& options, int parent_pid);

// Landlock and seccomp, after libtorch is loaded and before the package's
// model.so is. Irreversible.
StatusOr<SandboxReport> EnterSandbox(const SandboxOptions& options);

// The two layers alone, for the build children, which run a compiler or
// Python inside them: Landlock (file access; the ABI entered, 0 where the
// kernel has none), then seccomp (`landlocked`: whether Landlock confines
// files already). Both last across exec and are inherited by every process
// started after; a second seccomp filter narrows the first.
StatusOr<int> EnterLandlock(const SandboxOptions& options);
Status EnterSeccomp(const SandboxOptions& options, bool landlocked);

}  // namespace aotid::runner
