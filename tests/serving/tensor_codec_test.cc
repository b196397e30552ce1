#include "serving/tensor_codec.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace aotid::serving {
namespace {

using model::DType;
using model::HostTensor;
using model::ModelSpec;

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

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

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

// A tensor's data as a long flat array (read packed) decodes to what each
// number's nearest double gives in the tensor's type, for every float type
// and for integers, nested or flat; and the errors name the element.
TEST(TensorCodec, LongArraysDecodeExactlyInEveryType) {
  std::vector<std::string> numbers;
  for (int i = 0; i < 40; ++i) {
    numbers.push_back(std::to_string(i * 37 - 700) + "." + std::to_string(i * 7919 % 1000));
  }
  // Edges every float type holds (numbers too large for one are refused:
  // FloatsTooLargeForTheirTypeAreRefused).
  for (const char* n : {"1e-45", "-0", "0.1", "1e-7", "65504", "-65504", "6e-8", "2.5e-323"})
    numbers.push_back(n);
  numbers.resize(48);
  std::string data;
  for (size_t i = 0; i < numbers.size(); ++i) data += (i ? "," : "") + numbers[i];
  for (auto [dtype, name] : {std::pair{DType::kFloat32, "FP32"},
                             {DType::kFloat64, "FP64"},
                             {DType::kFloat16, "FP16"},
                             {DType::kBFloat16, "BF16"}}) {
    ModelSpec spec;
    spec.inputs.push_back({"x", dtype, {-1, 16}});
    for (std::string body :
         {R"({"inputs":[{"name":"x","datatype":")" + std::string(name) + R"(","shape":[3,16],"data":[)" +
              data + "]}]}",
          R"({"inputs":[{"name":"x","datatype":")" + std::string(name) + R"(","shape":[3,16],"data":[[)" +
              data.substr(0, data.find(numbers[16]) - 1) + "],[" + data.substr(data.find(numbers[16])) +
              "]]}]}"}) {
      auto r = DecodeInferRequest(body, spec);
      ASSERT_TRUE(r.ok()) << name << " " << r.status().ToString();
      const HostTensor& t = r->inputs[0];
      for (size_t i = 0; i < numbers.size(); ++i) {
        double d = std::strtod(numbers[i].c_str(), nullptr);
        float f = static_cast<float>(d);
        switch (dtype) {
          case DType::kFloat32: EXPECT_EQ(std::memcmp(&Values<float>(t)[i], &f, 4), 0) << numbers[i]; break;
          case DType::kFloat64: EXPECT_EQ(std::memcmp(&Values<double>(t)[i], &d, 8), 0) << numbers[i]; break;
          case DType::kFloat16: EXPECT_EQ(Values<uint16_t>(t)[i], FloatToHalf(f)) << numbers[i]; break;
          default: EXPECT_EQ(Values<uint16_t>(t)[i], FloatToBFloat16(f)) << numbers[i]; break;
        }
      }
    }
  }
  ModelSpec ints;
  ints.inputs.push_back({"ids", DType::kInt64, {20}});
  std::string ids =
      "1,-2,9007199254740993,9223372036854775807,-9223372036854775808,5,6,7,8,9,10,11,12,13,14,15,16,17,18,";
  auto r = DecodeInferRequest(
      R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[20],"data":[)" + ids + "19]}]}", ints);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto v = Values<int64_t>(r->inputs[0]);
  EXPECT_EQ(v[2], 9007199254740993LL);
  EXPECT_EQ(v[3], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(v[4], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(v[19], 19);
  for (auto [last, message] : {std::pair{"19.0", "element 19 is number, expected an integer"},
                               {"9223372036854775808", "element 19 is out of range"}}) {
    r = DecodeInferRequest(
        R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[20],"data":[)" + ids + last + "]}]}", ints);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().ToString();
  }
  ModelSpec flags;
  flags.inputs.push_back({"b", DType::kBool, {16}});
  r = DecodeInferRequest(
      R"({"inputs":[{"name":"b","datatype":"BOOL","shape":[16],"data":[1,0,1,0,1,0,1,0,1,0,1,0,1,0,1,0]}]})",
      flags);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("element 0 is number, expected true or false"), std::string::npos)
      << r.status().ToString();
  // More numbers than the shape holds.
  r = DecodeInferRequest(
      R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[20],"data":[)" + ids + "19,20]}]}", ints);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more elements than its shape holds"), std::string::npos);
  // Arrays of 16 numbers or more where entries or dims belong read as any
  // array does: a 17-dim shape, and numbers for 'inputs' or 'outputs'.
  ModelSpec deep;
  deep.inputs.push_back({"x", DType::kFloat32, std::vector<int64_t>(16, 1)});
  deep.inputs[0].shape.push_back(2);
  const std::string ones = "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1";
  const std::string x = R"({"name":"x","datatype":"FP32","shape":[)" + ones + R"(,2],"data":[0.5,2]})";
  r = DecodeInferRequest(R"({"inputs":[)" + x + "]}", deep);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->inputs[0].shape.size(), 17u);
  EXPECT_EQ(r->inputs[0].shape.back(), 2);
  EXPECT_EQ(Values<float>(r->inputs[0]), (std::vector<float>{0.5f, 2.f}));
  std::string bad_dim = x;
  bad_dim.replace(bad_dim.find(",2]"), 3, ",2.5]");
  r = DecodeInferRequest(R"({"inputs":[)" + bad_dim + "]}", deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'shape' must hold non-negative integers"), std::string::npos)
      << r.status().ToString();
  r = DecodeInferRequest(R"({"inputs":[)" + ones + "]}", deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("every entry of 'inputs' needs a string 'name'"), std::string::npos)
      << r.status().ToString();
  r = DecodeInferRequest(R"({"outputs":[)" + ones + R"(],"inputs":[)" + x + "]}", deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("every entry of 'outputs' needs a string 'name'"), std::string::npos)
      << r.status().ToString();
}

TEST(TensorCodec, ErrorsNameTheInputAndTheExpectation) {
  struct Case {
    const char* body;
    const char* needle;
  } cases[] = {
      {"not json", "not valid JSON"},
      {"", "the request body is empty"},
      {" \r\n", "the request body is empty"},
      {"[]", "must be a JSON object"},
      {R"({"inputs":[]})", "missing input 'x' (FP32 [-1, 2])"},
      {R"({"inputs":[{"name":"q","datatype":"FP32","shape":[1],"data":[1]}]})", "unknown input 'q'"},
      {R"({"inputs":[{"name":"x","datatype":"INT64","shape":[1,2],"data":[1,2]}]})",
       "input 'x' has datatype INT64, expected FP32"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]},
          {"name":"ids","datatype":"INT64","shape":[3],"data":[1,2,3]}]})",
       "input 'x' has shape [1, 3], expected [-1, 2]"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3]}]})",
       "input 'x': 'data' has 3 elements, shape [2, 2] needs 4"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2,3]}]})", "more elements than"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,"a"]}]})", "element 1 is string"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]},
          {"name":"ids","datatype":"INT64","shape":[3],"data":[1,2.5,3]}]})",
       "input 'ids': element 1 is number, expected an integer"},
      {R"({"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":["a"]}]})", "BYTES is not supported"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1000000,1000000,1000000],"data":[]}]})",
       "has more than"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[500000,2],"data":[1,2]}]})",
       "input 'x': 'data' is 5 bytes of JSON, too short for the 1000000 elements shape [500000, 2] needs"},
      {"{\"inputs\":[]} x", "not valid JSON at byte 14 (near '{\"inputs\":[]} x')"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2,]}]})",
       "not valid JSON at byte 67 (near ',2],\"data\":[1,2,]}]}')"},
      {"{\"inputs\":[{\"name\":\"x\"\n\t\"datatype\"",
       "not valid JSON at byte 24 (near '\":[{\"name\":\"x\"??\"datatype\"')"},
  };
  for (const auto& c : cases) {
    auto r = DecodeInferRequest(c.body, TwoInputSpec());
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << "body: " << c.body << "\nmessage: " << r.status().message();
  }
}

TEST(TensorCodec, BytesAfterTheDocumentAreRefusedEvenANul) {
  std::string body = R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]}]})";
  ModelSpec one;
  one.inputs.push_back({"x", DType::kFloat32, {-1, 2}});
  ASSERT_TRUE(DecodeInferRequest(body, one).ok());
  auto r = DecodeInferRequest(body + std::string(1, '\0') + "junk", one);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos) << r.status().message();
}

TEST(TensorCodec, DeepNestingIsRefusedBeforeParsing) {
  std::string body = R"({"inputs":)" + std::string(10000, '[') + std::string(10000, ']') + "}";
  auto r = DecodeInferRequest(body, TwoInputSpec());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested deeper than"), std::string::npos);
  EXPECT_EQ(JsonDepth(R"({"a":"[[[[[["})", 100), 1);  // brackets inside strings do not count
}

// JSON has no infinities: a number too large for a float tensor's type is
// refused with its element and text, not served as inf. The largest finite
// values pass.
TEST(TensorCodec, FloatsTooLargeForTheirTypeAreRefused) {
  struct Case {
    const char* datatype;
    DType dtype;
    const char* fits;
    const char* too_large;
  } cases[] = {{"FP32", DType::kFloat32, "3.4028234e38", "3.5e38"},
               {"FP64", DType::kFloat64, "1.7976931348623157e308", "1e309"},
               {"FP16", DType::kFloat16, "65504", "65520"},
               {"BF16", DType::kBFloat16, "3.38e38", "3.4e38"}};
  for (const auto& c : cases) {
    ModelSpec s;
    s.inputs.push_back({"x", c.dtype, {-1}});
    for (int n : {2, 40}) {  // a short array, and one long enough to be read packed
      std::string data;
      for (int i = 0; i < n - 1; ++i) data += std::string(i % 2 ? "-" : "") + c.fits + ",";
      auto body = [&](const std::string& last) {
        return std::string(R"({"inputs":[{"name":"x","datatype":")") + c.datatype + R"(","shape":[)" +
               std::to_string(n) + R"(],"data":[)" + data + last + "]}]}";
      };
      auto ok = DecodeInferRequest(body("-1"), s);
      EXPECT_TRUE(ok.ok()) << c.datatype << " " << n << ": " << ok.status().ToString();
      for (std::string last : {std::string(c.too_large), "-" + std::string(c.too_large)}) {
        auto r = DecodeInferRequest(body(last), s);
        ASSERT_FALSE(r.ok()) << c.datatype << " " << last;
        std::string want = "input 'x': element " + std::to_string(n - 1) + " (" + last +
                           ") is out of range for " + c.datatype;
        EXPECT_NE(r.status().message().find(want), std::string::npos)
            << "want: " << want << "\nmessage: " << r.status().message();
      }
    }
  }
}

TEST(TensorCodec, IntegerRangesAreChecked) {
  ModelSpec s;
  s.inputs.push_back({"b", DType::kUInt8, {2}});
  auto r =
      DecodeInferRequest(R"({"inputs":[{"name":"b","datatype":"UINT8","shape":[2],"data":[1,256]}]})", s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("out of range for UINT8"), std::string::npos) << r.status().message();
}

// INT32 token ids (what several tokenizers emit) for an INT64 input, and
// every other lossless pair, JSON and binary: widened to the input's
// datatype with every value kept, extremes included.
TEST(TensorCodec, NarrowerIntegersAreWidenedToTheInputsDatatype) {
  ModelSpec s;
  s.inputs.push_back({"ids", DType::kInt64, {3}});
  auto r = DecodeInferRequest(
      R"({"inputs":[{"name":"ids","datatype":"INT32","shape":[3],"data":[-2147483648,7,2147483647]}]})", s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->inputs[0].dtype, DType::kInt64);
  EXPECT_EQ(Values<int64_t>(r->inputs[0]), (std::vector<int64_t>{-2147483648LL, 7, 2147483647LL}));

  int32_t ids[3] = {-5, 0, 1 << 30};
  std::string header =
      R"({"inputs":[{"name":"ids","datatype":"INT32","shape":[3],"parameters":{"binary_data_size":12}}]})";
  r = DecodeInferRequest(header + Bytes(ids, sizeof ids), s, {}, header.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->inputs[0].dtype, DType::kInt64);
  EXPECT_EQ(Values<int64_t>(r->inputs[0]), (std::vector<int64_t>{-5, 0, 1 << 30}));

  // Unsigned bytes stay positive in a signed input; signed bytes keep their sign.
  ModelSpec s16;
  s16.inputs.push_back({"v", DType::kInt16, {2}});
  uint8_t u8[2] = {255, 1};
  header = R"({"inputs":[{"name":"v","datatype":"UINT8","shape":[2],"parameters":{"binary_data_size":2}}]})";
  r = DecodeInferRequest(header + Bytes(u8, sizeof u8), s16, {}, header.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Values<int16_t>(r->inputs[0]), (std::vector<int16_t>{255, 1}));
  r = DecodeInferRequest(R"({"inputs":[{"name":"v","datatype":"INT8","shape":[2],"data":[-128,127]}]})", s16);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Values<int16_t>(r->inputs[0]), (std::vector<int16_t>{-128, 127}));

  // The values a request says it holds are checked against what it says:
  // an INT32 request's element past INT32 is refused, not widened.
  r = DecodeInferRequest(
      R"({"inputs":[{"name":"ids","datatype":"INT32","shape":[3],"data":[1,2,2147483648]}]})", s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("out of range for INT32"), std::string::npos) << r.status().message();

  // The input's own value range applies after widening.
  s.inputs[0].values = model::ValueRange{0, 49};
  r = DecodeInferRequest(R"({"inputs":[{"name":"ids","datatype":"INT32","shape":[3],"data":[1,2,50]}]})", s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ids"), std::string::npos) << r.status().message();
}

TEST(TensorCodec, AnUnknownOutputIsRefusedListingTheModelsOutputs) {
  auto r = DecodeInferRequest(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]},
      {"name":"ids","datatype":"INT64","shape":[3],"data":[1,2,3]}],"outputs":[{"name":"y"},{"name":"logits"}]})",
                              TwoInputSpec());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "unknown output 'logits'; the model's outputs are 'y', 'z'");
}

TEST(TensorCodec, IntegersAreNeverNarrowedNorTurnedIntoFloats) {
  struct Case {
    DType input;
    const char* sent;
    const char* needle;
  } cases[] = {
      {DType::kInt32, "INT64", "input 'v' has datatype INT64, expected INT32 (narrower integers are widened"},
      {DType::kInt8, "UINT8", "input 'v' has datatype UINT8, expected INT8 (narrower"},
      {DType::kUInt8, "INT8", "input 'v' has datatype INT8, expected UINT8 (narrower"},
      {DType::kInt64, "BOOL", "input 'v' has datatype BOOL, expected INT64"},
      {DType::kFloat32, "INT32", "input 'v' has datatype INT32, expected FP32"},
      {DType::kInt64, "FP32", "input 'v' has datatype FP32, expected INT64"},
  };
  for (const auto& c : cases) {
    ModelSpec s;
    s.inputs.push_back({"v", c.input, {1}});
    auto r = DecodeInferRequest(
        std::string(R"({"inputs":[{"name":"v","datatype":")") + c.sent + R"(","shape":[1],"data":[1]}]})", s);
    ASSERT_FALSE(r.ok()) << c.sent;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
  for (auto [from, to] : {std::pair{DType::kInt64, DType::kInt32},
                          {DType::kInt32, DType::kInt16},
                          {DType::kUInt8, DType::kInt8},
                          {DType::kInt8, DType::kUInt8},
                          {DType::kBool, DType::kInt64},
                          {DType::kInt32, DType::kInt32}}) {
    EXPECT_FALSE(WidensTo(from, to)) << model::DTypeName(from) << " -> " << model::DTypeName(to);
  }
}

// What the exported program was traced for (spec.json's "dims" and
// "values"), checked on JSON and binary inputs alike, before anything runs.
TEST(TensorCodec, TracedRangesAndSharedDimsAreChecked) {
  ModelSpec s;
  s.inputs.push_back({"input_ids", DType::kInt64, {-1, -1}});
  s.inputs.back().dims = {model::DimRange{"s0", 1, 64}, model::DimRange{"s1", 1, 4}};
  s.inputs.back().values = model::ValueRange{0, 49};
  s.inputs.push_back({"attention_mask", DType::kFloat32, {-1, -1}});
  s.inputs.back().dims = {model::DimRange{"s0", 1, 64}, model::DimRange{"s1", 1, 4}};
  s.outputs.push_back({"y", DType::kFloat32, {-1}});
  auto request = [](const std::string& ids_shape, const std::string& ids, const std::string& mask_shape,
                    const std::string& mask) {
    return R"({"inputs":[{"name":"input_ids","datatype":"INT64","shape":)" + ids_shape + R"(,"data":)" + ids +
           R"(},{"name":"attention_mask","datatype":"FP32","shape":)" + mask_shape + R"(,"data":)" + mask +
           "}]}";
  };
  EXPECT_OK(DecodeInferRequest(request("[2,2]", "[0,1,48,49]", "[2,2]", "[1,1,1,0]"), s).status());
  struct Case {
    std::string body, message;
  } cases[] = {
      {request("[1,5]", "[1,2,3,4,5]", "[1,5]", "[1,1,1,1,1]"),
       "input 'input_ids' has shape [1, 5]: dim 1 is 5, valid range [1, 4]"},
      {request("[2,2]", "[1,2,3,4]", "[1,2]", "[1,1]"),
       "input 'attention_mask' dim 0 is 1 but input 'input_ids' dim 0 is 2; the model takes them as one size "
       "(s0)"},
      {request("[1,2]", "[1,1000000000]", "[1,2]", "[1,1]"),
       "input 'input_ids' holds 1000000000 (element 1), valid range [0, 50)"},
      {request("[1,2]", "[-5,1]", "[1,2]", "[1,1]"),
       "input 'input_ids' holds -5 (element 0), valid range [0, 50)"},
  };
  for (const auto& c : cases) {
    auto r = DecodeInferRequest(c.body, s);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), c.message);
  }

  std::string header = R"({"inputs":[
      {"name":"input_ids","datatype":"INT64","shape":[1,2],"parameters":{"binary_data_size":16}},
      {"name":"attention_mask","datatype":"FP32","shape":[1,2],"data":[1,1]}]})";
  int64_t ids[2] = {3, 50};
  auto r = DecodeInferRequest(header + std::string(reinterpret_cast<const char*>(ids), sizeof ids), s, {},
                              header.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "input 'input_ids' holds 50 (element 1), valid range [0, 50)");
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
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);                         // overflow to +inf
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0009766f)), 1.0009766f);  // 1 + 2^-10 is representable
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.5f)), 1.5f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.00390625f)), 1.0f);  // halfway rounds to even
}

// Binary tensor extension: JSON header, then each binary input's bytes in
// the order the inputs are listed (not the model's order).
TEST(TensorCodecBinary, InputsMixJsonAndBinaryInListedOrder) {
  std::string header = R"({"inputs":[
      {"name":"ids","datatype":"INT64","shape":[3],"parameters":{"binary_data_size":24}},
      {"name":"x","datatype":"FP32","shape":[2,2],"parameters":{"binary_data_size":16}}],
    "outputs":[{"name":"y","parameters":{"binary_data":true}},{"name":"z"}]})";
  int64_t ids[3] = {7, -1, 1LL << 40};
  float x[4] = {0.5f, -2.f, 3.25f, 1e-20f};
  std::string body = header + Bytes(ids, sizeof ids) + Bytes(x, sizeof x);
  auto r = DecodeInferRequest(body, TwoInputSpec(), {}, header.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Values<float>(r->inputs[0]), std::vector<float>(x, x + 4));
  EXPECT_EQ(r->inputs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Values<int64_t>(r->inputs[1]), std::vector<int64_t>(ids, ids + 3));
  EXPECT_FALSE(r->binary_outputs);
  EXPECT_EQ(r->output_binary, (std::vector<std::pair<std::string, bool>>{{"y", true}}));

  // A JSON input next to a binary one, and the request-wide output default.
  std::string h2 = R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]},
      {"name":"ids","datatype":"INT64","shape":[3],"parameters":{"binary_data_size":24}}],
    "parameters":{"binary_data_output":true}})";
  auto r2 = DecodeInferRequest(h2 + Bytes(ids, sizeof ids), TwoInputSpec(), {}, h2.size());
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(Values<float>(r2->inputs[0]), (std::vector<float>{1, 2}));
  EXPECT_TRUE(r2->binary_outputs);
}

TEST(TensorCodecBinary, MalformedBinaryBodiesAreRefusedWithReason) {
  int64_t ids[3] = {1, 2, 3};
  std::string ok_ids =
      R"({"name":"ids","datatype":"INT64","shape":[3],"parameters":{"binary_data_size":24}})";
  std::string x_json = R"({"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]})";
  auto with = [&](const std::string& ids_entry) {
    return R"({"inputs":[)" + x_json + "," + ids_entry + "]}";
  };
  constexpr int64_t kHeader = -1;  // Inference-Header-Content-Length = the JSON's size
  constexpr int64_t kNone = -2;    // no such header
  struct Case {
    std::string header, tail;
    int64_t length;
    std::string needle;
  } cases[] = {
      {with(ok_ids), Bytes(ids, 24), kNone,
       "binary tensor data needs the Inference-Header-Content-Length header"},
      {with(ok_ids), "", kNone,
       "has binary_data_size but the request has no Inference-Header-Content-Length"},
      {with(ok_ids), Bytes(ids, 24), 3, "not valid JSON"},
      {with(ok_ids), Bytes(ids, 24), 100000, "but the body has only"},
      {with(ok_ids), Bytes(ids, 16), kHeader, "runs past the end of the body (16 bytes left)"},
      {with(ok_ids), Bytes(ids, 24) + "xx", kHeader, "2 bytes of binary data follow the JSON header"},
      {with(R"({"name":"ids","datatype":"INT64","shape":[3],"parameters":{"binary_data_size":16}})"),
       Bytes(ids, 16), kHeader, "binary_data_size is 16 bytes, shape [3] of INT64 needs 24"},
      {with(R"({"name":"ids","datatype":"INT64","shape":[3],"parameters":{"binary_data_size":-3}})"), "",
       kHeader, "binary_data_size must be a non-negative integer"},
      {with(
           R"({"name":"ids","datatype":"INT64","shape":[3],"data":[1,2,3],"parameters":{"binary_data_size":24}})"),
       Bytes(ids, 24), kHeader, "has both 'data' and parameters.binary_data_size"},
  };
  for (const auto& c : cases) {
    std::optional<size_t> length;
    if (c.length == kHeader) length = c.header.size();
    if (c.length >= 0) length = static_cast<size_t>(c.length);
    auto r = DecodeInferRequest(c.header + c.tail, TwoInputSpec(), {}, length);
    ASSERT_FALSE(r.ok()) << c.needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.needle << " <- " << r.status().message();
  }
  ModelSpec flags;
  flags.inputs.push_back({"f", DType::kBool, {2}});
  std::string h =
      R"({"inputs":[{"name":"f","datatype":"BOOL","shape":[2],"parameters":{"binary_data_size":2}}]})";
  auto bad_bool = DecodeInferRequest(h + std::string("\x01\x02", 2), flags, {}, h.size());
  EXPECT_NE(bad_bool.status().message().find("BOOL element 1 is byte 2, expected 0 or 1"), std::string::npos)
      << bad_bool.status().message();
  auto good_bool = DecodeInferRequest(h + std::string("\x01\x00", 2), flags, {}, h.size());
  ASSERT_TRUE(good_bool.ok()) << good_bool.status().ToString();
  EXPECT_EQ(Values<uint8_t>(good_bool->inputs[0]), (std::vector<uint8_t>{1, 0}));
}

TEST(TensorCodecBinary, OutputsGoBinaryWhenAskedAndJsonOtherwise) {
  HostTensor y;
  y.name = "y";
  y.shape = {2};
  float yv[2] = {1.5f, -0.25f};
  y.data.resize(8);
  std::memcpy(y.data.data(), yv, 8);
  HostTensor z;
  z.name = "z";
  z.dtype = DType::kInt64;
  z.shape = {1};
  int64_t zv = 42;
  z.data.resize(8);
  std::memcpy(z.data.data(), &zv, 8);

  InferRequest req;
  req.binary_outputs = true;
  req.output_binary = {{"z", false}};  // the per-output choice wins
  EncodedResponse r = EncodeInferResponse("m", 1, req, {y, z});
  ASSERT_TRUE(r.has_binary);
  auto j = nlohmann::json::parse(r.body.substr(0, r.json_length));
  EXPECT_EQ(j["outputs"][0]["parameters"]["binary_data_size"], 8);
  EXPECT_FALSE(j["outputs"][0].contains("data"));
  EXPECT_EQ(j["outputs"][1]["data"][0], 42);
  ASSERT_EQ(r.body.size(), r.json_length + 8);
  EXPECT_EQ(r.body.substr(r.json_length), Bytes(yv, 8));

  InferRequest plain;
  EncodedResponse p = EncodeInferResponse("m", 1, plain, {y, z});
  EXPECT_FALSE(p.has_binary);
  EXPECT_EQ(p.body, EncodeInferResponse("m", 1, "", {y, z}));
}

// A language model's logits [B, S, V] asked for at the last position only:
// [B, 1, V], each row's last position, JSON or binary; only the outputs
// asked, and only those of rank 3 or more: dim 1 of a [batch, features]
// output is no position.
TEST(TensorCodec, AnOutputMayBeAskedForAtItsLastPositionOnly) {
  ModelSpec s;
  s.inputs.push_back({"ids", DType::kInt64, {-1, -1}});
  s.outputs.push_back({"logits", DType::kFloat32, {-1, -1, 2}});
  s.outputs.push_back({"pooled", DType::kFloat32, {-1, 4}});
  const std::string ids = R"({"name":"ids","datatype":"INT64","shape":[2,3],"data":[1,2,3,4,5,6]})";
  auto r = DecodeInferRequest(R"({"inputs":[)" + ids + R"(],"outputs":[
      {"name":"logits","parameters":{"last_position":true,"binary_data":true}}]})",
                              s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->last_position, std::vector<std::string>{"logits"});

  HostTensor logits;  // [2, 3, 2]: row b, position p, k -> 100b + 10p + k
  logits.name = "logits";
  logits.shape = {2, 3, 2};
  std::vector<float> v;
  for (int b = 0; b < 2; ++b)
    for (int p = 0; p < 3; ++p)
      for (int k = 0; k < 2; ++k) v.push_back(100.f * b + 10.f * p + k);
  logits.data.resize(v.size() * 4);
  std::memcpy(logits.data.data(), v.data(), logits.data.size());
  HostTensor pooled;
  pooled.name = "pooled";
  pooled.shape = {2, 4};
  pooled.data.resize(32);
  EncodedResponse e = EncodeInferResponse("m", 1, *r, {logits, pooled});
  ASSERT_TRUE(e.has_binary);
  auto j = nlohmann::json::parse(e.body.substr(0, e.json_length));
  ASSERT_EQ(j["outputs"].size(), 1u);  // pooled was not asked for
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json::parse("[2,1,2]"));
  float want[4] = {20, 21, 120, 121};
  EXPECT_EQ(e.body.substr(e.json_length), Bytes(want, sizeof want));

  r = DecodeInferRequest(R"({"inputs":[)" + ids +
                             R"(],"outputs":[{"name":"logits","parameters":{"last_position":true}},
      {"name":"pooled"}]})",
                         s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  j = nlohmann::json::parse(EncodeInferResponse("m", 1, *r, {logits, pooled}).body);
  EXPECT_EQ(j["outputs"][0]["data"], nlohmann::json::parse("[20,21,120,121]"));
  EXPECT_EQ(j["outputs"][1]["shape"], nlohmann::json::parse("[2,4]"));  // whole

  r = DecodeInferRequest(
      R"({"inputs":[)" + ids + R"(],"outputs":[{"name":"pooled","parameters":{"last_position":true}}]})", s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("output 'pooled': last_position takes the last index of dim 1"),
            std::string::npos)
      << r.status().message();
  r = DecodeInferRequest(
      R"({"inputs":[)" + ids + R"(],"outputs":[{"name":"logits","parameters":{"last_position":1}}]})", s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("last_position must be true or false"), std::string::npos);
}

// UINT16, UINT32 and UINT64 (torch's uint16 to uint64, which AOTInductor
// compiles as inputs and outputs): every value of the type in and out, by
// JSON and as binary data; one past it, or negative, refused.
TEST(TensorCodec, WideUnsignedIntegersRoundTrip) {
  struct Case {
    DType dtype;
    const char* name;
    const char* top;
    const char* past;
  };
  for (const Case& c : {Case{DType::kUInt16, "UINT16", "65535", "65536"},
                        Case{DType::kUInt32, "UINT32", "4294967295", "4294967296"},
                        Case{DType::kUInt64, "UINT64", "18446744073709551615", "18446744073709551616"}}) {
    ModelSpec s;
    s.inputs.push_back({"x", c.dtype, {3}});
    s.outputs.push_back({"y", c.dtype, {3}});
    const std::string head =
        R"({"inputs":[{"name":"x","datatype":")" + std::string(c.name) + R"(","shape":[3],)";
    auto r = DecodeInferRequest(head + R"("data":[0,7,)" + c.top + "]}]}", s);
    ASSERT_TRUE(r.ok()) << c.name << " " << r.status().ToString();
    HostTensor t = r->inputs[0];
    ASSERT_EQ(t.data.size(), 3 * model::DTypeSize(c.dtype)) << c.name;
    t.name = "y";
    auto j = nlohmann::json::parse(EncodeInferResponse("m", 1, "", {t}));
    EXPECT_EQ(j["outputs"][0]["datatype"], c.name);
    EXPECT_EQ(j["outputs"][0]["data"].dump(), std::string("[0,7,") + c.top + "]") << c.name;
    // The same bytes as binary data.
    std::string bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    std::string json = head + R"("parameters":{"binary_data_size":)" + std::to_string(bytes.size()) + "}}]}";
    r = DecodeInferRequest(json + bytes, s, {}, json.size());
    ASSERT_TRUE(r.ok()) << c.name << " " << r.status().ToString();
    EXPECT_EQ(r->inputs[0].data, t.data) << c.name;
    for (std::string bad : {std::string(c.past), std::string("-1")}) {
      r = DecodeInferRequest(head + R"("data":[0,7,)" + bad + "]}]}", s);
      ASSERT_FALSE(r.ok()) << c.name << " " << bad;
      EXPECT_NE(r.status().message().find("element 2"), std::string::npos) << r.status().message();
      EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status().message();
    }
  }
}

// An output parameter misspelled, or given for the whole request, and an
// output listed twice would each be answered as if not said: refused (400),
// named.
TEST(TensorCodec, UnknownOutputParametersAndRepeatedOutputsAreRefused) {
  ModelSpec s;
  s.inputs.push_back({"ids", DType::kInt64, {-1, -1}});
  s.outputs.push_back({"logits", DType::kFloat32, {-1, -1, 2}});
  s.outputs.push_back({"pooled", DType::kFloat32, {-1, 4}});
  const std::string ids = R"({"inputs":[{"name":"ids","datatype":"INT64","shape":[1,2],"data":[1,2]}])";
  auto refused = [&](const std::string& rest, const std::string& want) {
    auto r = DecodeInferRequest(ids + rest, s);
    ASSERT_FALSE(r.ok()) << rest;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  };
  refused(R"(,"outputs":[{"name":"logits","parameters":{"last_positon":true,"binary":1}}]})",
          "output 'logits': unknown parameter 'last_positon', 'binary'; an output's parameters are "
          "binary_data and "
          "last_position");
  refused(R"(,"outputs":[{"name":"logits","parameters":[true]}]})",
          "output 'logits': parameters must be an object");
  refused(R"(,"parameters":{"last_position":true}})",
          "parameters.last_position is a parameter of an output, not of the request");
  refused(R"(,"parameters":{"binary_data":true},"outputs":[{"name":"logits"}]})",
          "parameters.binary_data is a parameter of an output");
  refused(
      R"(,"outputs":[{"name":"pooled"},{"name":"logits"},{"name":"pooled","parameters":{"binary_data":true}}]})",
      "output 'pooled' is listed twice in 'outputs'");
  // What is known still passes, and request parameters of other kinds too.
  auto r = DecodeInferRequest(ids + R"(,"parameters":{"binary_data_output":true,"priority":1},
      "outputs":[{"name":"logits","parameters":{"last_position":true,"binary_data":false}},{"name":"pooled"}]})",
                              s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->output_names, (std::vector<std::string>{"logits", "pooled"}));
}

}  // namespace
}  // namespace aotid::serving
