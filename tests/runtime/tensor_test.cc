#include "runtime/tensor.h"

#include "base/fs.h"
#include "runtime/aoti_package.h"
#include "runtime/hardware.h"
#include "test_util.h"

namespace aotid::runtime {
namespace {


HostTensor Tensor(DType d, std::vector<int64_t> shape) {
  HostTensor t;
  t.name = "x";
  t.dtype = d;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(t.num_elements()) * DTypeSize(d));
  return t;
}

TEST(Tensor, DTypeNamesRoundTrip) {
  for (DType d : {DType::kBool, DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                  DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    DType back;
    ASSERT_TRUE(ParseDType(DTypeName(d), &back));
    EXPECT_EQ(back, d);
  }
  DType unused;
  EXPECT_FALSE(ParseDType("BYTES", &unused));
}

TEST(Tensor, NumElementsDetectsOverflow) {
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({1 << 30, 1 << 30, 1 << 30}), -1);
  EXPECT_EQ(NumElements({-1, 4}), -1);
}

TEST(Tensor, CheckAgainstSpecNamesInputAndExpectation) {
  TensorSpec spec{"x", DType::kFloat32, {-1, 4}};
  EXPECT_OK(CheckTensorAgainstSpec(Tensor(DType::kFloat32, {7, 4}), spec));
  Status wrong_dim = CheckTensorAgainstSpec(Tensor(DType::kFloat32, {7, 5}), spec);
  EXPECT_EQ(wrong_dim.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_dim.message().find("input 'x' has shape [7, 5], expected [-1, 4]"), std::string::npos);
  Status wrong_type = CheckTensorAgainstSpec(Tensor(DType::kInt64, {7, 4}), spec);
  EXPECT_NE(wrong_type.message().find("datatype INT64, expected FP32"), std::string::npos);
}

TEST(ModelSpec, JsonRoundTripAndCorruptionDetected) {
  ModelSpec spec;
  spec.inputs.push_back({"ids", DType::kInt64, {2, -1}});
  spec.outputs.push_back({"y", DType::kFloat16, {2}});
  auto back = ModelSpec::FromJson(spec.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->inputs[0].name, "ids");
  EXPECT_EQ(back->inputs[0].shape, (std::vector<int64_t>{2, -1}));
  EXPECT_EQ(back->outputs[0].dtype, DType::kFloat16);
  EXPECT_EQ(ModelSpec::FromJson("{\"inputs\": 3}").status().code(), StatusCode::kCorruption);
}

TEST(Hardware, FingerprintNamesMachineAndChangesWithTorch) {
  HardwareInfo hw = ProbeHardware();
  EXPECT_FALSE(hw.os.empty());
  EXPECT_FALSE(hw.arch.empty());
  EXPECT_GT(hw.cores, 0);
  std::string fp = Fingerprint(hw);
  EXPECT_EQ(fp.rfind(hw.os + "-" + hw.arch + "-" + hw.vector_isa + "-torch", 0), 0u) << fp;
  HardwareInfo other = hw;
  other.torch_version = "0.0.1";
  EXPECT_NE(Fingerprint(other), fp);
}

HardwareInfo Avx2Machine() {
  HardwareInfo hw;
  hw.os = "linux";
  hw.arch = "x86_64";
  hw.vector_isa = "avx2";
  hw.cpu_features = {"avx", "avx2", "fma", "f16c"};
  return hw;
}

TEST(AotiPackage, MetadataIsCheckedAgainstThisMachine) {
  HardwareInfo hw = Avx2Machine();
  EXPECT_OK(CheckFitsMachine({"cpu", "linux", "x86_64", "AVX2", "{}"}, hw));
  EXPECT_OK(CheckFitsMachine({"cpu", "linux", "x86_64", "INVALIDVECISA", "{}"}, hw));
  struct Case {
    AotiMetadata md;
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

TEST(AotiPackage, InputsAreReadFromTheGeneratedChecks) {
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
  EXPECT_EQ(d->inputs[0].dtype, DType::kFloat32);
  EXPECT_EQ(d->inputs[0].shape, (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(d->min_shapes[0], (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(d->inputs[1].dtype, DType::kInt64);
  EXPECT_TRUE(d->inputs[1].shape.empty());  // a scalar: no dims checked
  EXPECT_EQ(d->output_names, std::vector<std::string>{"output0"});
  EXPECT_EQ(DeriveInputsFromSource("int main() {}").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace aotid::runtime
