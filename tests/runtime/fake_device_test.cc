// Device tensors, proven on a machine without a device. The test makes a
// device of its own: torch's PrivateUse1 key under the name "aotidfake",
// with memory that lives on the host (its own allocator, and the three
// kernels a transfer needs), and registers an AOTInductor runner for it
// through torch's public registry (RegisterAOTIModelRunner), as a real
// backend registers "cuda" or "mps". The runner runs the real CPU build of
// the test MLP, and refuses any input that is not on its device, as the MPS
// and CUDA runtimes do. So the plugin's model (runtime/aoti_model.cc) is
// checked for what a GPU would need of it: inputs moved to the model's
// device once each, outputs brought back to the host equal to eager, the
// build's kernel files where the runner is told to look, and a compiled
// package's first runs made on its own device.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner_cpu.h>
#include <torch/csrc/inductor/aoti_torch/tensor_converter.h>
#include <torch/library.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "compile/aoti_build.h"
#include "compile/build_cache.h"
#include "compile/package_build.h"
#include "model/loaded_model.h"
#include "package/archive.h"
#include "package/package.h"
#include "platform/hardware.h"
#include "runtime/torch_plugin.h"
#include "test_util.h"

namespace aotid::runtime {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::TestData;

constexpr char kFakeDevice[] = "aotidfake";

// ---- the device: host memory that torch counts as another device ----

void FreeFake(void* p) { std::free(p); }

struct FakeAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n == 0 ? nullptr : std::malloc(n);
    return {p, p, &FreeFake, c10::Device(c10::DeviceType::PrivateUse1, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &FreeFake; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
FakeAllocator fake_allocator;

// Transfers between the host and the fake device, each way; every one goes
// through FakeCopyFrom below.
std::atomic<int> to_device{0}, to_host{0};

// A device tensor's bytes seen as a CPU tensor (no copy): its memory is the
// host's.
at::Tensor HostView(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), at::TensorOptions().dtype(t.scalar_type()));
}

at::Tensor FakeEmpty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                     std::optional<at::Device>, std::optional<bool>, std::optional<at::MemoryFormat> format) {
  return at::detail::empty_generic(size, &fake_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor FakeEmptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                            std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                            std::optional<at::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &fake_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// torch sends every copy that touches a device it does not know here.
at::Tensor FakeCopyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  if (self.is_cpu() && dst.is_privateuseone()) ++to_device;
  if (self.is_privateuseone() && dst.is_cpu()) ++to_host;
  at::Tensor from = self.is_cpu() ? self : HostView(self);
  at::Tensor into = dst.is_cpu() ? dst : HostView(dst);
  into.copy_(from);
  return dst;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &FakeEmpty);
  m.impl("empty_strided", &FakeEmptyStrided);
  m.impl("_copy_from", &FakeCopyFrom);
}
C10_REGISTER_GUARD_IMPL(PrivateUse1, c10::impl::FakeGuardImpl<c10::DeviceType::PrivateUse1>);

// ---- the runner for it, registered as any backend registers its own ----

// What the runner was given, for the tests to look at.
struct Seen {
  std::string device_str, bin_dir;
  std::vector<std::string> kernel_files_in_bin_dir;  // when the runner was made
  std::vector<c10::Device> input_devices;
  std::vector<const void*> input_data;
  std::vector<std::vector<float>> first_inputs;  // the values of the first input, per run
  int runs = 0;
};
std::mutex seen_mu;
Seen seen;

class FakeDeviceRunner final : public torch::inductor::AOTIModelContainerRunner {
 public:
  FakeDeviceRunner(const std::string& so, size_t num_models, c10::Device device, bool single_threaded)
      : cpu_(so, num_models, single_threaded), device_(device) {}

 protected:
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& handles, void* /*stream*/) override {
    std::vector<at::Tensor> inputs =
        torch::aot_inductor::alloc_tensors_by_stealing_from_handles(handles.data(), handles.size());
    std::vector<at::Tensor> on_host;
    {
      std::lock_guard<std::mutex> lock(seen_mu);
      ++seen.runs;
      for (const at::Tensor& t : inputs) {
        seen.input_devices.push_back(t.device());
        seen.input_data.push_back(t.data_ptr());
      }
    }
    for (const at::Tensor& t : inputs) {
      // As MPS refuses a CPU tensor ("Passed CPU tensor to MPS op").
      TORCH_CHECK(t.device().type() == device_.type(), "Passed a ", t.device(), " tensor to a model on ",
                  device_);
      on_host.push_back(HostView(t));  // the CPU build reads the device's bytes in place
    }
    if (!on_host.empty() && on_host[0].scalar_type() == at::kFloat) {
      at::Tensor first = on_host[0].contiguous();
      std::lock_guard<std::mutex> lock(seen_mu);
      seen.first_inputs.emplace_back(first.data_ptr<float>(), first.data_ptr<float>() + first.numel());
    }
    std::vector<at::Tensor> outs = cpu_.run(on_host);
    // Outputs are left on the device, as a GPU model leaves them.
    for (at::Tensor& o : outs) {
      if (device_.is_cpu()) continue;
      at::Tensor on_device = at::empty(o.sizes(), o.options().device(c10::DeviceType::PrivateUse1, 0));
      HostView(on_device).copy_(o);
      o = on_device;
    }
    return outs;
  }

 private:
  torch::inductor::AOTIModelContainerRunnerCpu cpu_;
  c10::Device device_;  // where it takes its inputs and leaves its outputs
};

std::unique_ptr<torch::inductor::AOTIModelContainerRunner> CreateFakeRunner(const std::string& so,
                                                                            size_t num_models,
                                                                            const std::string& device_str,
                                                                            const std::string& bin_dir,
                                                                            const bool single_threaded) {
  {
    std::lock_guard<std::mutex> lock(seen_mu);
    seen.device_str = device_str;
    seen.bin_dir = bin_dir;
    seen.kernel_files_in_bin_dir.clear();
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(bin_dir, ec)) {
      std::string name = f.path().filename().string();
      if (compile::IsKernelFile(name)) seen.kernel_files_in_bin_dir.push_back(name);
    }
  }
  return std::make_unique<FakeDeviceRunner>(so, num_models, c10::Device(device_str), single_threaded);
}

// Before any test names the device: "aotidfake" then parses as a device.
const bool registered = [] {
  c10::register_privateuse1_backend(kFakeDevice);
  static torch::inductor::RegisterAOTIModelRunner runner(kFakeDevice, &CreateFakeRunner);
  return true;
}();

void Forget() {
  std::lock_guard<std::mutex> lock(seen_mu);
  seen = Seen{};
  to_device = 0;
  to_host = 0;
}

// The package's kernel file (tests/models/make_test_models.py KERNEL_FILE):
// its name and bytes.
std::pair<std::string, std::string> PackagedKernelFile(const std::string& package) {
  auto archive = package::Archive::Open(package);
  if (!archive.ok()) return {};
  for (const auto& name : archive->names()) {
    std::string base = name.substr(name.rfind('/') + 1);
    if (compile::IsKernelFile(base)) return {base, archive->Read(name).value_or("")};
  }
  return {};
}

// The test MLP's package for the fake device, built into `dir` as the
// build child builds it (checks, model.so and the kernel file copied out).
StatusOr<model::CacheEntry> BuildFakeDevicePackage(const std::string& dir) {
  compile::PackageBuildRequest req;
  req.artifact_path = TestData("fake_device_so.pt2");
  req.kind = package::PackageKind::kAotiCompiled;
  req.device = kFakeDevice;
  req.out_dir = dir;
  std::ostringstream log;
  ASSIGN_OR_RETURN(compile::PackageBuildResult built,
                   compile::BuildFromAotiPackage(req, platform::ProbeHardware(), log));
  model::CacheEntry entry;
  entry.dir = dir;
  entry.so_path = dir + "/model.so";
  entry.spec = built.spec;
  return entry;
}

// The test MLP's compiled package for the CPU, built into `dir` as the
// build child builds it.
StatusOr<compile::PackageBuildResult> BuildCpuPackage(const std::string& dir) {
  compile::PackageBuildRequest req;
  req.artifact_path = TestData("mlp_so.pt2");
  req.kind = package::PackageKind::kAotiCompiled;
  req.device = "cpu";
  req.out_dir = dir;
  std::ostringstream log;
  return compile::BuildFromAotiPackage(req, platform::ProbeHardware(), log);
}

model::HostTensor FromCase(const json& t) {
  model::HostTensor h;
  h.name = t["name"].get<std::string>();
  h.dtype = model::DType::kFloat32;
  h.shape = t["shape"].get<std::vector<int64_t>>();
  std::vector<float> values = t["data"].get<std::vector<float>>();
  h.data.resize(values.size() * sizeof(float));
  std::memcpy(h.data.data(), values.data(), h.data.size());
  return h;
}

std::vector<float> Floats(const model::HostTensor& h) {
  std::vector<float> v(h.data.size() / sizeof(float));
  std::memcpy(v.data(), h.data.data(), h.data.size());
  return v;
}

TEST(FakeDevice, InputsArriveOnTheDeviceAndOutputsComeBackToTheHostEqualToEager) {
  ASSERT_TRUE(registered);
  TempDir dir;
  auto entry = BuildFakeDevicePackage(dir.path());
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  Forget();
  LoadOptions opts;
  opts.device = kFakeDevice;
  auto model = LoadCompiledModel(*entry, opts);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(seen.device_str, kFakeDevice);
  EXPECT_EQ((*model)->device(), kFakeDevice);

  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  ASSERT_FALSE(cases["mlp"].empty());
  for (const json& c : cases["mlp"]) {
    Forget();
    std::vector<model::HostTensor> inputs;
    for (const json& t : c["inputs"]) inputs.push_back(FromCase(t));
    auto outputs = (*model)->Infer(inputs, {});
    ASSERT_TRUE(outputs.ok()) << outputs.status().ToString();

    // In: on the device, each input copied there once, never the request's
    // own memory handed over.
    ASSERT_EQ(seen.input_devices.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_EQ(seen.input_devices[i].type(), c10::DeviceType::PrivateUse1) << seen.input_devices[i];
      EXPECT_NE(seen.input_data[i], static_cast<const void*>(inputs[i].data.data()));
    }
    EXPECT_EQ(to_device.load(), static_cast<int>(inputs.size()));
    ASSERT_EQ(seen.first_inputs.size(), 1u);
    EXPECT_EQ(seen.first_inputs[0], Floats(inputs[0]));

    // Out: back on the host, one copy each, equal to eager.
    ASSERT_EQ(outputs->size(), c["outputs"].size());
    EXPECT_EQ(to_host.load(), static_cast<int>(outputs->size()));
    for (size_t i = 0; i < outputs->size(); ++i) {
      const model::HostTensor& got = (*outputs)[i];
      const json& want = c["outputs"][i];
      EXPECT_EQ(got.name, want["name"].get<std::string>());
      EXPECT_EQ(got.dtype, model::DType::kFloat32);
      EXPECT_EQ(got.shape, want["shape"].get<std::vector<int64_t>>());
      std::vector<float> values = Floats(got), eager = want["data"].get<std::vector<float>>();
      ASSERT_EQ(values.size(), eager.size());
      for (size_t k = 0; k < values.size(); ++k) {
        EXPECT_NEAR(values[k], eager[k], 1e-5 + 1e-5 * std::fabs(eager[k])) << "output " << i << " at " << k;
      }
    }
  }
}

// On the CPU nothing moves: the model reads the request's own memory.
// (The fake runner, registered under "cpu" for this test only, records
// what the CPU runner would be given.)
TEST(FakeDevice, OnTheCpuTheModelReadsTheRequestsOwnMemory) {
  ASSERT_TRUE(registered);
  TempDir dir;
  auto built = BuildCpuPackage(dir.path());
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  auto& registry = torch::inductor::getAOTIModelRunnerRegistry();
  struct Restore {
    torch::inductor::CreateAOTIModelRunnerFunc cpu;
    ~Restore() { torch::inductor::getAOTIModelRunnerRegistry()["cpu"] = cpu; }
  } restore{registry.at("cpu")};
  registry["cpu"] = &CreateFakeRunner;
  Forget();
  model::CacheEntry entry{dir.path(), dir / "model.so", built->spec, "", ""};
  LoadOptions opts;
  opts.device = "cpu";
  auto model = LoadCompiledModel(entry, opts);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  const json& c = cases["mlp"][0];
  std::vector<model::HostTensor> inputs;
  for (const json& t : c["inputs"]) inputs.push_back(FromCase(t));
  auto outputs = (*model)->Infer(inputs, {});
  ASSERT_TRUE(outputs.ok()) << outputs.status().ToString();
  ASSERT_EQ(seen.input_devices.size(), 1u);
  EXPECT_TRUE(seen.input_devices[0].is_cpu());
  EXPECT_EQ(seen.input_data[0], static_cast<const void*>(inputs[0].data.data()));
  EXPECT_EQ(to_device.load() + to_host.load(), 0);
  ASSERT_EQ(outputs->size(), 1u);
  std::vector<float> values = Floats((*outputs)[0]),
                     eager = c["outputs"][0]["data"].get<std::vector<float>>();
  ASSERT_EQ(values.size(), eager.size());
  for (size_t k = 0; k < values.size(); ++k)
    EXPECT_NEAR(values[k], eager[k], 1e-5 + 1e-5 * std::fabs(eager[k]));
}

#if defined(__linux__) && defined(__x86_64__)
// A CPU model may use AMX tiles where the CPU has them: loading it asks
// Linux for the tile state, without which the first tile instruction is
// SIGILL (an int8 model of several sequence slots died so in its runner).
// Each test runs in a process of its own (gtest_discover_tests), so nothing
// else here has asked before the load.
TEST(CpuModel, LoadingOneLetsThisProcessUseAmxTiles) {
  std::string cpuinfo = fs::ReadFile("/proc/cpuinfo").value_or("");
  if (cpuinfo.find(" amx_tile") == std::string::npos) GTEST_SKIP() << "this CPU has no AMX tiles";
  constexpr int kGetPermitted = 0x1022;  // ARCH_GET_XCOMP_PERM
  constexpr int kTileData = 18;          // XFEATURE_XTILEDATA
  auto permitted = [] {
    uint64_t features = 0;
    return ::syscall(SYS_arch_prctl, kGetPermitted, &features) == 0 && (features >> kTileData & 1) != 0;
  };
  ASSERT_FALSE(permitted()) << "something asked before the load: this test would prove nothing";
  TempDir dir;
  auto built = BuildCpuPackage(dir.path());
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  model::CacheEntry entry{dir.path(), dir / "model.so", built->spec, "", ""};
  LoadOptions opts;
  opts.device = "cpu";
  auto model = LoadCompiledModel(entry, opts);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE(permitted());
}
#endif

// A compiled package is built as the build child builds it: checked, its
// model.so and kernel file copied out, loaded, and run on zeros under its
// own input checks, on the device it was compiled for.
TEST(FakeDevice, ACompiledPackageIsCheckedOnItsOwnDeviceWithItsKernelFilesWhereTheRunnerLooks) {
  ASSERT_TRUE(registered);
  TempDir dir;
  compile::PackageBuildArgs args;
  args.artifact = TestData("fake_device_so.pt2");
  args.out = dir / "staging";
  args.kind = "aoti_compiled";
  args.device = kFakeDevice;
  ASSERT_OK(fs::MakeDirs(args.out));
  Forget();
  ASSERT_EQ(compile::RunPackageBuild(args), compile::kBuildExitOk);
  EXPECT_EQ(seen.device_str, kFakeDevice);
  // The first runs: at the least batch and one larger, on the device.
  EXPECT_GE(seen.runs, 2);
  ASSERT_FALSE(seen.input_devices.empty());
  for (const auto& d : seen.input_devices) EXPECT_EQ(d.type(), c10::DeviceType::PrivateUse1) << d;
  EXPECT_TRUE(fs::Exists(args.out + "/spec.json"));

  // The kernel file: in the folder the runner was told to look in, by its
  // own name, before the model was made.
  auto [kernel, bytes] = PackagedKernelFile(args.artifact);
  ASSERT_FALSE(kernel.empty());
  EXPECT_EQ(seen.bin_dir, args.out);
  EXPECT_EQ(seen.kernel_files_in_bin_dir, std::vector<std::string>{kernel});
  EXPECT_EQ(fs::ReadFile(seen.bin_dir + "/" + kernel).value_or(""), bytes);
}

}  // namespace
}  // namespace aotid::runtime
