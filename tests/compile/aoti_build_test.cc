#include "compile/aoti_build.h"

#include <sstream>

#include "base/fs.h"
#include "package/archive.h"
#include "platform/hardware.h"
#include "test_util.h"

namespace aotid::compile {
namespace {

using package::PackageKind;
using testing::TempDir;
using testing::TestData;

platform::HardwareInfo Avx2Machine() {
  platform::HardwareInfo hw;
  hw.os = "linux";
  hw.arch = "x86_64";
  hw.vector_isa = "avx2";
  hw.cpu_features = {"avx", "avx2", "fma", "f16c"};
  return hw;
}

// A source package exported on Linux says -fopenmp; on macOS Apple's clang
// refuses it and takes -Xclang -fopenmp, linking torch's libomp by name.
TEST(AotiBuild, OpenMpFlagsAreThePlatformsOwn) {
  OpenMpFlags linux_flags = OpenMpFlagsFor("linux");
  EXPECT_EQ(linux_flags.compile, std::vector<std::string>{"-fopenmp"});
  EXPECT_EQ(linux_flags.link, std::vector<std::string>{"-fopenmp"});
  OpenMpFlags mac = OpenMpFlagsFor("darwin");
  EXPECT_EQ(mac.compile, (std::vector<std::string>{"-Xclang", "-fopenmp"}));
  EXPECT_EQ(mac.link, std::vector<std::string>{"-lomp"});
}

TEST(AotiBuild, MetadataIsCheckedAgainstThisMachine) {
  platform::HardwareInfo hw = Avx2Machine();
  EXPECT_OK(CheckFitsMachine({"cpu", "linux", "x86_64", "AVX2", "{}"}, hw));
  EXPECT_OK(CheckFitsMachine({"cpu", "linux", "x86_64", "INVALIDVECISA", "{}"}, hw));
  struct Case {
    package::AotiMetadata md;
    std::string needle;
  } cases[] = {
      {{"cpu", "linux", "x86_64", "AVX512", "{}"}, "package was compiled for AVX512, this CPU has AVX2 only"},
      {{"cpu", "linux", "x86_64", "AVX512 AVX512_VNNI", "{}"}, "lacks avx512f avx512dq avx512vl avx512bw"},
      {{"cpu", "darwin", "arm64", "NEON", "{}"}, "compiled for darwin, this machine runs linux"},
      {{"cpu", "linux", "aarch64", "ASIMD", "{}"}, "compiled for aarch64 CPUs, this machine is x86_64"},
  };
  for (const auto& c : cases) {
    Status s = CheckFitsMachine(c.md, hw);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << c.md.cpu_isa;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
  }
  hw.cpu_features.insert(hw.cpu_features.end(), {"avx512f", "avx512dq", "avx512vl", "avx512bw"});
  hw.vector_isa = "avx512";
  EXPECT_OK(CheckFitsMachine({"cpu", "linux", "x86_64", "AVX512", "{}"}, hw));
  EXPECT_FALSE(CheckFitsMachine({"cpu", "linux", "x86_64", "AVX512 AVX512_VNNI", "{}"}, hw).ok());
}

TEST(AotiBuild, InputsAreReadFromTheGeneratedChecks) {
  // The shape of AOTInductor's generated input checks (torch 2.13).
  const char* cpp = R"(
    inputs_info_[0].name = "arg2_1";
    inputs_info_[1].name = "arg3_1";
    outputs_info_[0].name = "output0";
AOTI_NOINLINE static void check_input_0(
    AtenTensorHandle* input_handles
) {
    int32_t arg2_1_expected_dtype = aoti_torch_dtype_float32();
    auto arg2_1_size = arg2_1.sizes();
    if (arg2_1_size[0] < 2) {
    if (arg2_1_size[0] > 64) {
    if (4 != arg2_1_size[1]) {
    auto arg2_1_stride = arg2_1.strides();
    if (4 != arg2_1_stride[0]) {
}
AOTI_NOINLINE static void check_input_1(
    AtenTensorHandle* input_handles
) {
    int32_t arg3_1_expected_dtype = aoti_torch_dtype_int64();
}
)";
  auto d = DeriveInputsFromSource(cpp);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->inputs.size(), 2u);
  EXPECT_EQ(d->inputs[0].name, "arg2_1");
  EXPECT_EQ(d->inputs[0].dtype, model::DType::kFloat32);
  EXPECT_EQ(d->inputs[0].shape, (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(d->min_shapes[0], (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(d->inputs[1].dtype, model::DType::kInt64);
  EXPECT_TRUE(d->inputs[1].shape.empty());  // a scalar: no dims checked
  EXPECT_EQ(d->output_names, std::vector<std::string>{"output0"});
  EXPECT_EQ(DeriveInputsFromSource("int main() {}").status().code(), StatusCode::kInvalidArgument);
}

// A compiled package is copied out whole, with the inputs and outputs its
// extra/aotid.json declares; the package was exported on this machine by
// the test_models fixture, so it fits it.
TEST(AotiBuild, CompiledPackageIsCopiedOutWithItsDeclaredSpec) {
  TempDir out;
  PackageBuildRequest req;
  req.artifact_path = TestData("mlp_so.pt2");
  req.kind = PackageKind::kAotiCompiled;
  req.device = "cpu";
  req.out_dir = out.path();
  std::ostringstream log;
  auto built = BuildFromAotiPackage(req, platform::ProbeHardware(), log);
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log.str();
  EXPECT_TRUE(built->outputs_declared);
  ASSERT_EQ(built->spec.inputs.size(), 1u);
  EXPECT_EQ(built->spec.inputs[0].name, "x");
  EXPECT_EQ(built->metadata.device_key, "cpu");
  EXPECT_NE(built->author_metadata.find("aotid test"), std::string::npos) << built->author_metadata;
  auto size = fs::ReadFile(out / "model.so");
  ASSERT_TRUE(size.ok());
  EXPECT_GT(size->size(), 1000u);
}

TEST(AotiBuild, AnExportedProgramOrAnotherDeviceIsRefusedBeforeAnythingIsWritten) {
  TempDir out;
  PackageBuildRequest req;
  req.artifact_path = TestData("mlp_so.pt2");
  req.kind = PackageKind::kExportedProgram;
  req.device = "cpu";
  req.out_dir = out.path();
  std::ostringstream log;
  auto wrong_kind = BuildFromAotiPackage(req, platform::ProbeHardware(), log);
  EXPECT_EQ(wrong_kind.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_kind.status().message().find("exported_program"), std::string::npos);
  req.kind = PackageKind::kAotiCompiled;
  req.artifact_path = TestData("cuda_so.pt2");
  auto wrong_device = BuildFromAotiPackage(req, platform::ProbeHardware(), log);
  EXPECT_EQ(wrong_device.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong_device.status().message().find("compiled for device 'cuda', not 'cpu'"), std::string::npos)
      << wrong_device.status().message();
  EXPECT_FALSE(fs::Exists(out / "model.so"));
}

// torch writes a CUDA model's Triton kernels as .cubin files beside its
// .so, and the model opens them by name from the folder its runner is
// given: the build's own, where they must be.
TEST(AotiBuild, ACudaPackagesKernelFilesAreKeptBesideModelSo) {
  TempDir out;
  PackageBuildRequest req;
  req.artifact_path = TestData("cuda_so.pt2");
  req.kind = PackageKind::kAotiCompiled;
  req.device = "cuda";
  req.out_dir = out.path();
  std::ostringstream log;
  auto built = BuildFromAotiPackage(req, platform::ProbeHardware(), log);
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log.str();
  auto archive = package::Archive::Open(req.artifact_path);
  ASSERT_TRUE(archive.ok());
  int kernels = 0;
  for (const auto& name : archive->names()) {
    std::string base = name.substr(name.rfind('/') + 1);
    if (!base.ends_with(".cubin")) continue;
    ++kernels;
    EXPECT_EQ(fs::ReadFile(out / base).value_or("(missing)"), archive->Read(name).value_or("")) << base;
  }
  EXPECT_EQ(kernels, 1);
  EXPECT_TRUE(fs::Exists(out / "model.so"));
  EXPECT_NE(log.str().find("kept 1 kernel file beside model.so"), std::string::npos) << log.str();
}

TEST(AotiBuild, APackageForADeviceThisMachineLacksIsRefusedWithTheReason) {
  package::AotiMetadata md;
  md.device_key = "cuda";
  platform::HardwareInfo hw = Avx2Machine();
  hw.cuda_missing = "no NVIDIA driver";
  Status s = CheckPackageDevice(md, hw);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("package was built for cuda; this machine has none ("), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("no NVIDIA driver"), std::string::npos) << s.message();
  hw.cuda_missing.clear();
  EXPECT_OK(CheckPackageDevice(md, hw));
  md.device_key = "cpu";
  EXPECT_OK(CheckPackageDevice(md, Avx2Machine()));
}

}  // namespace
}  // namespace aotid::compile
