#include "runtime/tensor.h"

#include "base/fs.h"
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

}  // namespace
}  // namespace aotid::runtime
