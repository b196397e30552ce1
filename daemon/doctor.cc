#include "daemon/doctor.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "base/fs.h"
#include "base/shell.h"
#include "daemon/daemon_lock.h"
#include "platform/device_probe.h"
#include "platform/hardware.h"
#include "platform/torch_version.h"
#include "runner/sandbox.h"
#include "runtime/torch_plugin.h"
#include "storage/model_store.h"

namespace aotid::daemon {
namespace {

struct Report {
  int failures = 0;
  void Info(const std::string& what, const std::string& value) {
    std::printf("  %-16s %s\n", what.c_str(), value.c_str());
  }
  void Ok(const std::string& what, const std::string& detail) {
    std::printf("OK    %-16s %s\n", what.c_str(), detail.c_str());
  }
  void Warn(const std::string& what, const std::string& detail) {
    std::printf("WARN  %-16s %s\n", what.c_str(), detail.c_str());
  }
  void Fail(const std::string& what, const std::string& detail, const std::string& fix) {
    ++failures;
    std::printf("FAIL  %-16s %s\n      %-16s fix: %s\n", what.c_str(), detail.c_str(), "", fix.c_str());
  }
};

}  // namespace

int RunDoctor(const Config& config) {
  Report r;
  platform::HardwareInfo hw = platform::ProbeHardware(config.cxx);
  std::printf("machine\n");
  r.Info("os / arch", hw.os + " / " + hw.arch);
  r.Info("cpu", hw.cpu_model.empty() ? "(unknown)" : hw.cpu_model);
  r.Info("vector isa", hw.vector_isa);
  std::string features;
  for (const auto& f : hw.cpu_features) features += (features.empty() ? "" : " ") + f;
  r.Info("cpu features", features.empty() ? "(none of interest)" : features);
  r.Info("cores", std::to_string(hw.cores));
  r.Info("memory", std::to_string(hw.memory_bytes / (1024 * 1024)) + " MiB");
  // Asked afresh (the answer the daemon keeps is replaced): doctor is
  // where a changed driver or torch is looked into.
  platform::DeviceProbeOptions probe =
      platform::DeviceProbeForCache(config.CachePath(), config.python, config.worker_dir);
  probe.refresh = true;
  platform::DeviceProbeReport devices = platform::ProbeDevices(probe, &hw);
  for (const auto& a : hw.accelerators) r.Info("accelerator", a);
  r.Info("devices from", devices.note);
  r.Info("device auto", platform::AutoDevice(hw));
  r.Info("torch", hw.torch_version);
  r.Info("fingerprint", platform::Fingerprint(hw));
  std::printf("\nchecks\n");

  if (hw.compiler.empty()) {
    r.Fail("compiler", "no C++ compiler answers '" + config.cxx + " --version'",
           "install g++ (Debian: apt install g++), or set build.cxx in the config");
  } else {
    r.Ok("compiler", hw.compiler);
  }

  auto [rc, torch] = RunShell(ShellQuote(config.python) + " -c 'import torch; print(torch.__version__)'");
  if (rc != 0) {
    // Why: not there, not runnable by this user (a venv's python3 links to
    // the Python it was made from), or no torch.
    std::string real = fs::RealPath(config.python);
    struct stat link;
    bool is_path = config.python.find('/') != std::string::npos;
    std::string why =
        is_path && ::lstat(config.python.c_str(), &link) != 0 ? config.python + " does not exist"
        : is_path && !fs::Exists(config.python)
            ? config.python + " is a link to " + real + ", which does not exist or this user cannot reach"
        : config.python.find('/') != std::string::npos && ::access(real.c_str(), X_OK) != 0
            ? config.python + " cannot be run by this user: " + real + " is closed to it"
            : config.python + " cannot import torch";
    r.Fail("python", why,
           "set build.python to a Python with torch==" + std::string(platform::kTorchVersion) +
               " that this user can run (the venv aotid was installed into has one)");
  } else if (torch != platform::kTorchVersion) {
    r.Fail("python",
           config.python + " has torch " + torch + ", aotid was built against " + platform::kTorchVersion,
           "point build.python at a Python with torch " + std::string(platform::kTorchVersion) +
               ", or rebuild aotid against " + torch);
  } else {
    r.Ok("python", config.python + " (torch " + torch + ")");
  }

  if (!devices.status.ok()) {
    r.Warn("device probe", devices.status.message() + "; models are built for the CPU only");
  }

  std::string worker = config.worker_dir + "/aotid_worker/compile.py";
  if (fs::Exists(worker)) {
    r.Ok("compile worker", worker);
  } else {
    r.Fail("compile worker", worker + " does not exist",
           "set build.worker_dir to the directory holding aotid_worker/");
  }

  auto plugin = runtime::LoadTorchPlugin();
  if (plugin.ok()) {
    r.Ok("torch runtime", *plugin);
  } else {
    r.Fail("torch runtime", plugin.status().message(),
           "install libaotid_torch.so next to aotid or in ../lib/aotid/, or set AOTID_TORCH_PLUGIN");
  }

  runner::SandboxSupport sandbox = runner::ProbeSandbox();
  if (sandbox.landlock_abi > 0 && sandbox.seccomp) {
    r.Ok("runner sandbox", sandbox.Describe());
  } else {
    r.Warn("runner sandbox", sandbox.Describe() + " (docs/RUNNERS.md says what each layer refuses)");
  }

  auto store = storage::ModelStore::Open(config.store_path, /*create=*/false);
  if (store.ok()) {
    auto models = (*store)->ListModels();
    size_t n = models.ok() ? models->size() : 0;
    r.Ok("store", config.store_path + " (schema " + std::to_string((*store)->SchemaVersion()) + ", " +
                      std::to_string(n) + " model" + (n == 1 ? "" : "s") + ")");
    // Every version's package must be there to build it again.
    for (const auto& m : models.ok() ? *models : std::vector<storage::ModelInfo>{}) {
      for (const auto& v : m.versions) {
        std::string blob = (*store)->BlobPath(v.artifact);
        if (!fs::Exists(blob)) {
          r.Fail("blob", m.name + ":" + std::to_string(v.version) + "'s package " + blob + " is missing",
                 "add the package again ('aotid add FILE --name " + m.name +
                     "'), or remove the version ('aotid rm " + m.name + ":" + std::to_string(v.version) +
                     "')");
        }
      }
    }
  } else if (store.status().code() == StatusCode::kNotFound && fs::IsDirectory(config.store_path)) {
    // An empty directory made for it, as systemd's StateDirectory= does.
    if (::access(config.store_path.c_str(), W_OK) == 0) {
      r.Ok("store", config.store_path + " (empty; 'aotid add' or 'aotid serve' creates the store in it)");
    } else {
      r.Fail("store", config.store_path + " is not writable by this user",
             "set store.path (or --store) to a directory this user can write, or give it to this user");
    }
  } else if (store.status().code() == StatusCode::kNotFound) {
    // The nearest folder above it that exists must be writable.
    std::string parent = config.store_path;
    do {
      size_t slash = parent.find_last_of('/');
      parent = slash == std::string::npos ? "." : slash == 0 ? "/" : parent.substr(0, slash);
    } while (parent != "/" && parent != "." && !fs::Exists(parent));
    if (::access(parent.c_str(), W_OK) == 0) {
      r.Ok("store", config.store_path + " (not created yet; 'aotid add' creates it)");
    } else {
      r.Fail("store", config.store_path + " cannot be created: " + parent + " is not writable",
             "set store.path (or --store) to a directory this user can write");
    }
  } else {
    r.Fail("store", store.status().message(), "check --store; the file must be an aotid store");
  }

  if (config.CacheIsSeparate()) {
    // A folder of its own (build.cache_dir, --cache-dir), perhaps shared
    // with other stores' daemons: serve writes builds and locks in it.
    const std::string& dir = config.cache_dir;
    if (fs::IsDirectory(dir) ? ::access(dir.c_str(), W_OK) == 0 : true) {
      r.Ok("build cache",
           dir + (fs::IsDirectory(dir) ? " (its own folder)" : " (not created yet; serve creates it)"));
    } else {
      r.Fail("build cache", dir + " is not writable by this user",
             "give build.cache_dir (or --cache-dir) to the user the daemon runs as");
    }
  }

  if (auto d = FindDaemon(config.store_path)) {
    // Where it really serves (its --listen may differ from the config).
    r.Ok("daemon", "running on this store (pid " + d->pid + "), serving on " +
                       (d->address.empty() ? std::string("(not listening yet)") : d->address));
  } else {
    r.Ok("daemon", "not running on this store ('aotid serve' starts it; listen " +
                       FormatListen(config.api.server) + ")");
  }

  std::printf("\n%s\n", r.failures == 0 ? "everything aotid needs is in place"
                                        : (std::to_string(r.failures) + " check(s) failed").c_str());
  return r.failures == 0 ? 0 : 1;
}

}  // namespace aotid::daemon
