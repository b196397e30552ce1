#include "model/tensor.h"

#include <cstring>
#include <limits>

#include "base/fs.h"
#include "platform/hardware.h"
#include "test_util.h"

namespace aotid::model {
namespace {

HostTensor Tensor(DType d, std::vector<int64_t> shape, std::string name = "x") {
  HostTensor t;
  t.name = std::move(name);
  t.dtype = d;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(t.num_elements()) * DTypeSize(d));
  return t;
}

// An integer tensor holding `values`, each stored as datatype `d`.
HostTensor Tensor(DType d, std::vector<int64_t> shape, std::string name, const std::vector<int64_t>& values) {
  HostTensor t = Tensor(d, std::move(shape), std::move(name));
  const size_t size = DTypeSize(d);
  for (size_t i = 0; i < values.size() && (i + 1) * size <= t.data.size(); ++i) {
    // Little endian: the low bytes of the int64 are the value as the narrower type.
    std::memcpy(t.data.data() + i * size, &values[i], size);
  }
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

// spec.json as the compile worker wrote it before dim and value ranges: it
// loads, and checks the shape alone.
TEST(ModelSpec, OldSpecWithoutRangesLoads) {
  auto spec = ModelSpec::FromJson(R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[-1,5]}],
                                      "outputs":[{"name":"y","datatype":"FP32","shape":[-1,6]}]})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->inputs[0].dims.empty());
  EXPECT_FALSE(spec->inputs[0].values);
  EXPECT_OK(CheckTensorAgainstSpec(Tensor(DType::kInt64, {100000, 5}, "ids"), spec->inputs[0]));
  EXPECT_EQ(spec->ToJson().find("dims"), std::string::npos);
}

// State inputs (a language model's cache) are kept apart from the client's
// inputs; a spec without them writes none, and one of no fixed shape is
// refused (the loader could not make it).
TEST(ModelSpec, StateInputsRoundTripApartFromInputs) {
  ModelSpec spec;
  spec.inputs.push_back({"tokens", DType::kInt64, {1, -1}});
  spec.outputs.push_back({"logits", DType::kFloat32, {1, 8}});
  EXPECT_EQ(spec.ToJson().find("state_inputs"), std::string::npos);
  spec.state_inputs.push_back({"k_cache_0", DType::kBFloat16, {4, 2, 96, 16}});
  auto back = ModelSpec::FromJson(spec.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->inputs.size(), 1u);
  ASSERT_EQ(back->state_inputs.size(), 1u);
  EXPECT_EQ(back->state_inputs[0].name, "k_cache_0");
  EXPECT_EQ(back->state_inputs[0].dtype, DType::kBFloat16);
  EXPECT_EQ(back->state_inputs[0].shape, (std::vector<int64_t>{4, 2, 96, 16}));
  auto dynamic = ModelSpec::FromJson(R"({"inputs":[],"outputs":[],
      "state_inputs":[{"name":"k","datatype":"FP32","shape":[-1,4]}]})");
  EXPECT_EQ(dynamic.status().code(), StatusCode::kCorruption);
}

TEST(ModelSpec, RangesParseAndRoundTrip) {
  auto spec = ModelSpec::FromJson(R"({"inputs":[
      {"name":"ids","datatype":"INT64","shape":[-1,-1,3],
       "dims":[{"symbol":"s0","min":1,"max":64},{"symbol":"s1","min":2},null],
       "values":{"min":0,"max":49}}],
      "outputs":[{"name":"y","datatype":"FP32","shape":[-1]}]})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  for (const ModelSpec& s : {*spec, *ModelSpec::FromJson(spec->ToJson())}) {
    const TensorSpec& ids = s.inputs[0];
    ASSERT_EQ(ids.dims.size(), 3u);
    ASSERT_TRUE(ids.dims[0] && ids.dims[1]);
    EXPECT_EQ(ids.dims[0]->symbol, "s0");
    EXPECT_EQ(ids.dims[0]->min, 1);
    EXPECT_EQ(ids.dims[0]->max, 64);
    EXPECT_EQ(ids.dims[1]->symbol, "s1");
    EXPECT_EQ(ids.dims[1]->max, std::numeric_limits<int64_t>::max());  // none recorded: unbounded
    EXPECT_FALSE(ids.dims[2]);
    ASSERT_TRUE(ids.values);
    EXPECT_EQ(ids.values->min, 0);
    EXPECT_EQ(ids.values->max, 49);
    EXPECT_TRUE(s.outputs[0].dims.empty());
  }
}

TEST(ModelSpec, MalformedRangesAreCorruption) {
  for (const char* entry : {
           R"("dims":[{"min":1}])",               // one entry for two dims
           R"("dims":{"min":1})",                 // not an array
           R"("dims":[{"min":"1"},null])",        // not an integer
           R"("dims":[{"min":5,"max":2},null])",  // empty range
           R"("dims":[{"symbol":7},null])",       // symbol not a string
           R"("values":[0,49])",                  // not an object
           R"("values":{"min":0,"max":1.5})",     // not an integer
       }) {
    std::string json = std::string(R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[-1,5],)") + entry +
                       R"(}],"outputs":[]})";
    auto spec = ModelSpec::FromJson(json);
    EXPECT_EQ(spec.status().code(), StatusCode::kCorruption) << json;
    EXPECT_NE(spec.status().message().find("'ids'"), std::string::npos) << spec.status().message();
  }
}

TEST(Tensor, DynamicDimOutsideItsRangeIsRefusedWithTheRange) {
  TensorSpec spec{"ids", DType::kInt64, {-1, -1}};
  spec.dims = {DimRange{"s0", 1, 8}, DimRange{"s1", 2, 256}};
  EXPECT_OK(CheckTensorAgainstSpec(Tensor(DType::kInt64, {1, 256}, "ids"), spec));
  EXPECT_OK(CheckTensorAgainstSpec(Tensor(DType::kInt64, {8, 2}, "ids"), spec));
  Status too_long = CheckTensorAgainstSpec(Tensor(DType::kInt64, {1, 600}, "ids"), spec);
  EXPECT_EQ(too_long.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(too_long.message(), "input 'ids' has shape [1, 600]: dim 1 is 600, valid range [2, 256]");
  Status too_short = CheckTensorAgainstSpec(Tensor(DType::kInt64, {1, 1}, "ids"), spec);
  EXPECT_EQ(too_short.message(), "input 'ids' has shape [1, 1]: dim 1 is 1, valid range [2, 256]");
  Status batch = CheckTensorAgainstSpec(Tensor(DType::kInt64, {9, 3}, "ids"), spec);
  EXPECT_EQ(batch.message(), "input 'ids' has shape [9, 3]: dim 0 is 9, valid range [1, 8]");

  spec.dims[1]->max = std::numeric_limits<int64_t>::max();
  EXPECT_OK(CheckTensorAgainstSpec(Tensor(DType::kInt64, {1, 100000}, "ids"), spec));
  EXPECT_EQ(CheckTensorAgainstSpec(Tensor(DType::kInt64, {1, 1}, "ids"), spec).message(),
            "input 'ids' has shape [1, 1]: dim 1 is 1, valid range at least 2");
}

TEST(Tensor, IntegerValueOutsideItsRangeIsRefusedWithTheRange) {
  TensorSpec spec{"ids", DType::kInt64, {2, 3}};
  spec.values = ValueRange{0, 49};
  EXPECT_OK(CheckTensorAgainstSpec(Tensor(DType::kInt64, {2, 3}, "ids", {0, 1, 2, 47, 48, 49}), spec));
  Status big =
      CheckTensorAgainstSpec(Tensor(DType::kInt64, {2, 3}, "ids", {0, 1, 2, 3, 4, 1000000000}), spec);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(big.message(), "input 'ids' holds 1000000000 (element 5), valid range [0, 50)");
  Status negative = CheckTensorAgainstSpec(Tensor(DType::kInt64, {2, 3}, "ids", {-5, 1, 2, 3, 4, 5}), spec);
  EXPECT_EQ(negative.message(), "input 'ids' holds -5 (element 0), valid range [0, 50)");
  Status edge = CheckTensorAgainstSpec(Tensor(DType::kInt64, {2, 3}, "ids", {0, 1, 2, 3, 50, 5}), spec);
  EXPECT_EQ(edge.message(), "input 'ids' holds 50 (element 4), valid range [0, 50)");

  // Every integer datatype is read as itself.
  spec.values = ValueRange{-3, 2};
  for (DType d : {DType::kInt8, DType::kInt16, DType::kInt32}) {
    spec.dtype = d;
    EXPECT_OK(CheckTensorAgainstSpec(Tensor(d, {2, 3}, "ids", {-3, -2, -1, 0, 1, 2}), spec));
    EXPECT_EQ(CheckTensorAgainstSpec(Tensor(d, {2, 3}, "ids", {-3, -2, -4, 0, 1, 2}), spec).message(),
              "input 'ids' holds -4 (element 2), valid range [-3, 3)");
  }
  spec.dtype = DType::kUInt8;
  EXPECT_EQ(
      CheckTensorAgainstSpec(Tensor(DType::kUInt8, {2, 3}, "ids", {0, 1, 2, 200, 1, 2}), spec).message(),
      "input 'ids' holds 200 (element 3), valid range [-3, 3)");
  // A range up to the largest int64 has no end to show.
  spec.dtype = DType::kInt64;
  spec.values = ValueRange{0, std::numeric_limits<int64_t>::max()};
  EXPECT_EQ(CheckTensorAgainstSpec(Tensor(DType::kInt64, {2, 3}, "ids", {0, 1, -1, 3, 4, 5}), spec).message(),
            "input 'ids' holds -1 (element 2), valid range at least 0");
}

TEST(Tensor, DimsSharingASymbolMustAgreeAcrossInputs) {
  ModelSpec spec;
  spec.inputs.push_back({"input_ids", DType::kInt64, {-1, -1}});
  spec.inputs.back().dims = {DimRange{"s0", 1, 64}, DimRange{"s1", 1, 512}};
  spec.inputs.push_back({"attention_mask", DType::kInt64, {-1, -1}});
  spec.inputs.back().dims = {DimRange{"s0", 1, 64}, DimRange{"s1", 1, 512}};
  spec.inputs.push_back({"scale", DType::kFloat32, {-1}});  // a dynamic dim of its own
  spec.inputs.back().dims = {DimRange{"s2", 1, 64}};
  auto inputs = [](int64_t b0, int64_t s0, int64_t b1, int64_t s1) {
    return std::vector<HostTensor>{Tensor(DType::kInt64, {b0, s0}, "input_ids"),
                                   Tensor(DType::kInt64, {b1, s1}, "attention_mask"),
                                   Tensor(DType::kFloat32, {5}, "scale")};
  };
  EXPECT_OK(CheckSharedDims(inputs(2, 128, 2, 128), spec));
  Status batch = CheckSharedDims(inputs(2, 128, 1, 128), spec);
  EXPECT_EQ(batch.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.message(),
            "input 'attention_mask' dim 0 is 1 but input 'input_ids' dim 0 is 2; the model takes them as one "
            "size (s0)");
  EXPECT_EQ(
      CheckSharedDims(inputs(2, 128, 2, 127), spec).message(),
      "input 'attention_mask' dim 1 is 127 but input 'input_ids' dim 1 is 128; the model takes them as one "
      "size (s1)");

  // Two dims of one input may share a symbol too (a square matrix).
  ModelSpec square;
  square.inputs.push_back({"m", DType::kFloat32, {-1, -1}});
  square.inputs.back().dims = {DimRange{"s0", 1, 64}, DimRange{"s0", 1, 64}};
  EXPECT_OK(CheckSharedDims({Tensor(DType::kFloat32, {3, 3}, "m")}, square));
  EXPECT_EQ(CheckSharedDims({Tensor(DType::kFloat32, {3, 4}, "m")}, square).message(),
            "input 'm' dim 1 is 4 but input 'm' dim 0 is 3; the model takes them as one size (s0)");

  // Without symbols (an old spec) nothing is compared.
  for (auto& in : spec.inputs) in.dims.clear();
  EXPECT_OK(CheckSharedDims(inputs(2, 128, 1, 7), spec));
}

TEST(Hardware, FingerprintNamesMachineAndChangesWithTorch) {
  platform::HardwareInfo hw = platform::ProbeHardware();
  EXPECT_FALSE(hw.os.empty());
  EXPECT_FALSE(hw.arch.empty());
  EXPECT_GT(hw.cores, 0);
  std::string fp = platform::Fingerprint(hw);
  EXPECT_EQ(fp.rfind(hw.os + "-" + hw.arch + "-" + hw.vector_isa + "-torch", 0), 0u) << fp;
  platform::HardwareInfo other = hw;
  other.torch_version = "0.0.1";
  EXPECT_NE(platform::Fingerprint(other), fp);
}

}  // namespace
}  // namespace aotid::model
