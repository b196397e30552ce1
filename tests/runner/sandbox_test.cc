#include "runner/sandbox.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "test_util.h"

namespace aotid::runner {
namespace {

using testing::TempDir;
namespace stdfs = std::filesystem;

void Touch(const std::string& path) {
  stdfs::create_directories(stdfs::path(path).parent_path());
  ASSERT_OK(fs::WriteFileAtomic(path, "x"));
}

TEST(RunnerSandbox, GpuDevicesAreEveryNvidiaEntryOfDev) {
  TempDir dev;
  for (const char* name : {"nvidia0", "nvidia3", "nvidia4", "nvidia7", "nvidiactl", "nvidia-uvm",
                           "nvidia-uvm-tools", "nvidia-modeset", "null", "sda", "nvme0n1"}) {
    Touch(dev / name);
  }
  Touch(dev / "nvidia-caps/nvidia-cap1");
  Touch(dev / "dri/card0");
  GpuPaths paths = FindGpuPaths(dev.path(), {});
  std::vector<std::string> want;
  for (const char* name : {"dri", "nvidia-caps", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools",
                           "nvidia0", "nvidia3", "nvidia4", "nvidia7", "nvidiactl"}) {
    want.push_back(dev / name);
  }
  EXPECT_EQ(paths.devices, want);
  EXPECT_TRUE(paths.library_dirs.empty());
  EXPECT_TRUE(FindGpuPaths(dev / "absent", {}).devices.empty());
}

TEST(RunnerSandbox, GpuLibrariesAreTorchsPackageAndTheNvidiaPackagesBesideIt) {
  TempDir d;
  const std::string site = d / "venv/lib/python3.11/site-packages";
  Touch(site + "/torch/lib/libtorch_cuda.so");
  Touch(site + "/nvidia/cu13/lib/libcudart.so.13");
  Touch(site + "/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9");
  Touch(site + "/other/secret");
  // A second environment whose NVIDIA libraries were loaded without its
  // torch; a third with a torch but no NVIDIA packages (a CPU build).
  const std::string other = d / "other-env/site-packages";
  Touch(other + "/nvidia/nccl/lib/libnccl.so.2");
  const std::string cpu = d / "cpu-env/dist-packages";
  Touch(cpu + "/torch/lib/libtorch_cpu.so");
  // A folder named nvidia that is no package folder's: not widened.
  Touch(d / "opt/nvidia/lib64/libcuda.so.1");

  GpuPaths paths =
      FindGpuPaths(d / "no-dev", {site + "/torch/lib", site + "/torch/lib/", other + "/nvidia/nccl/lib",
                                  cpu + "/torch/lib", d / "opt/nvidia/lib64", "/usr/lib"});
  std::vector<std::string> want = {cpu + "/torch", other + "/nvidia", site + "/nvidia", site + "/torch"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(paths.library_dirs, want);
}

#ifdef __linux__
// A runner on a GPU, in the real sandbox: a library in site-packages/nvidia
// that nothing loaded before the sandbox (cuDNN loads its engines at first
// use) can still be read; the rest of site-packages cannot.
TEST(RunnerSandbox, GpuRunnerReadsNvidiaLibrariesFirstOpenedInsideTheSandbox) {
  if (ProbeSandbox().landlock_abi == 0) GTEST_SKIP() << "no Landlock on this kernel";
  TempDir d;
  const std::string site = d / "site-packages";
  stdfs::create_directories(site + "/torch/lib");
  const std::string lib = site + "/torch/lib/libfake_torch.so";
  ASSERT_EQ(std::system(("cc -shared -fPIC -o " + lib + " -x c /dev/null").c_str()), 0);
  const std::string late = site + "/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9";
  Touch(late);
  Touch(site + "/other/secret");

  // In a child: 0 when `late` opens and the secret does not.
  auto child = [&](bool gpu) {
    pid_t pid = ::fork();
    if (pid == 0) {
      if (::dlopen(lib.c_str(), RTLD_NOW) == nullptr) ::_exit(10);
      SandboxOptions options;
      options.gpu = gpu;
      if (!EnterLandlock(options).ok()) ::_exit(11);
      int late_fd = ::open(late.c_str(), O_RDONLY | O_CLOEXEC);
      int secret_fd = ::open((site + "/other/secret").c_str(), O_RDONLY | O_CLOEXEC);
      ::_exit(late_fd >= 0 && secret_fd < 0 && errno == EACCES ? 0 : late_fd < 0 ? 1 : 2);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(child(true), 0) << "1: the NVIDIA library was refused; 2: the secret was readable";
  EXPECT_EQ(child(false), 1) << "a CPU runner has no business in site-packages/nvidia";
}
#endif

}  // namespace
}  // namespace aotid::runner
