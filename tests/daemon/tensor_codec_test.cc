#include "daemon/tensor_codec.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace aotid::daemon {
namespace {

using runtime::DType;
using runtime::HostTensor;
using runtime::ModelSpec;

ModelSpec TwoInputSpec() {
  ModelSpec s;
  s.inputs.push_back({"x", DType::kFloat32, {-1, 2}});
  s.inputs.push_back({"ids", DType::kInt64, {3}});
  s.outputs.push_back({"y", DType::kFloat32, {-1}});
  s.outputs.push_back({"z", DType::kInt64, {-1}});
  return s;
}

template <typename T>
std::vector<T> Values(const HostTensor& t) {
  std::vector<T> v(t.data.size() / sizeof(T));
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

TEST(TensorCodec, DecodesFlatAndNestedDataInSpecOrder) {
  auto r = DecodeInferRequest(R"({"id":"r1","inputs":[
      {"name":"ids","datatype":"INT64","shape":[3],"data":[1,-2,9007199254740993]},
      {"name":"x","datatype":"FP32","shape":[2,2],"data":[[0.5,1],[2,-3.25]]}]})",
                              TwoInputSpec());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id, "r1");
  ASSERT_EQ(r->inputs.size(), 2u);
  EXPECT_EQ(r->inputs[0].name, "x");
  EXPECT_EQ(Values<float>(r->inputs[0]), (std::vector<float>{0.5f, 1.f, 2.f, -3.25f}));
  EXPECT_EQ(Values<int64_t>(r->inputs[1]), (std::vector<int64_t>{1, -2, 9007199254740993LL}));
}

TEST(TensorCodec, ErrorsNameTheInputAndTheExpectation) {
  struct Case {
    const char* body;
    const char* needle;
  } cases[] = {
      {"not json", "not valid JSON"},
      {"[]", "must be a JSON object"},
      {R"({"inputs":[]})", "missing input 'x' (FP32 [-1, 2])"},
      {R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1],"data":[1]}]})", "unknown input 'q'"},
      {R"({"inputs":[{"name":"x","datatype":"INT64","shape":[1,2],"data":[1,2]}]})",
       "input 'x' has datatype INT64, expected FP32"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]},
          {"name":"ids","datatype":"INT64","shape":[3],"data":[1,2,3]}]})", "input 'x' has shape [1, 3], expected [-1, 2]"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3]}]})",
       "input 'x': 'data' has 3 elements, shape [2, 2] needs 4"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2,3]}]})", "more elements than"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,"a"]}]})", "element 1 is string"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]},
          {"name":"ids","datatype":"INT64","shape":[3],"data":[1,2.5,3]}]})", "input 'ids': element 1 is number, expected an integer"},
      {R"({"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":["a"]}]})", "BYTES is not supported"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1000000,1000000,1000000],"data":[]}]})",
       "has more than"},
  };
  for (const auto& c : cases) {
    auto r = DecodeInferRequest(c.body, TwoInputSpec());
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << "body: " << c.body << "\nmessage: " << r.status().message();
  }
}

TEST(TensorCodec, DeepNestingIsRefusedBeforeParsing) {
  std::string body = R"({"inputs":)" + std::string(10000, '[') + std::string(10000, ']') + "}";
  auto r = DecodeInferRequest(body, TwoInputSpec());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested deeper than"), std::string::npos);
  EXPECT_EQ(JsonDepth(R"({"a":"[[[[[["})", 100), 1);  // brackets inside strings do not count
}

TEST(TensorCodec, IntegerRangesAreChecked) {
  ModelSpec s;
  s.inputs.push_back({"b", DType::kUInt8, {2}});
  auto r = DecodeInferRequest(R"({"inputs":[{"name":"b","datatype":"UINT8","shape":[2],"data":[1,256]}]})", s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("out of range for UINT8"), std::string::npos) << r.status().message();
}

TEST(TensorCodec, EncodeRoundTripsValuesAndFiltersOutputs) {
  HostTensor y;
  y.name = "y";
  y.dtype = DType::kFloat32;
  y.shape = {3};
  std::vector<float> yv = {0.1f, -1e-30f, 3.4028235e38f};
  y.data.resize(12);
  std::memcpy(y.data.data(), yv.data(), 12);
  HostTensor z;
  z.name = "z";
  z.dtype = DType::kInt64;
  z.shape = {1};
  int64_t zv = -9007199254740993LL;
  z.data.resize(8);
  std::memcpy(z.data.data(), &zv, 8);

  auto j = nlohmann::json::parse(EncodeInferResponse("m", 2, "req-7", {y, z}));
  EXPECT_EQ(j["model_name"], "m");
  EXPECT_EQ(j["model_version"], "2");
  EXPECT_EQ(j["id"], "req-7");
  ASSERT_EQ(j["outputs"].size(), 2u);
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json::array({3}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(j["outputs"][0]["data"][i].get<float>(), yv[i]);  // exact round trip
  EXPECT_EQ(j["outputs"][1]["data"][0].get<int64_t>(), zv);

  auto only_z = nlohmann::json::parse(EncodeInferResponse("m", 2, "", {y, z}, {"z"}));
  ASSERT_EQ(only_z["outputs"].size(), 1u);
  EXPECT_EQ(only_z["outputs"][0]["name"], "z");
  EXPECT_FALSE(only_z.contains("id"));
}

TEST(TensorCodec, HalfAndBFloat16ConversionsRoundTripAndRound) {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;
  }
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);                      // overflow to +inf
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0009766f)), 1.0009766f);  // 1 + 2^-10 is representable
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.5f)), 1.5f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.00390625f)), 1.0f);  // halfway rounds to even
}

}  // namespace
}  // namespace aotid::daemon
