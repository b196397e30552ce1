// Every numeric datatype of the protocol through a real compiled model that
// takes and returns each one (tests/models/make_test_models.py: AllTypes),
// as JSON and as binary tensors, against eager PyTorch. Its own daemon and
// store: one more build, about 15 s.
#include <httplib.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "model/tensor.h"
#include "serving/tensor_codec.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

using json = nlohmann::json;
using model::DType;

// One element of `dtype` from a JSON value, as the protocol's bytes.
void AppendBytes(std::string* out, DType dtype, const json& v) {
  auto put = [out](auto x) { out->append(reinterpret_cast<const char*>(&x), sizeof x); };
  switch (dtype) {
    case DType::kBool: put(static_cast<uint8_t>(v.get<bool>())); break;
    case DType::kUInt8: put(v.get<uint8_t>()); break;
    case DType::kInt8: put(v.get<int8_t>()); break;
    case DType::kInt16: put(v.get<int16_t>()); break;
    case DType::kInt32: put(v.get<int32_t>()); break;
    case DType::kInt64: put(v.get<int64_t>()); break;
    case DType::kFloat16: put(serving::FloatToHalf(v.get<float>())); break;
    case DType::kBFloat16: put(serving::FloatToBFloat16(v.get<float>())); break;
    case DType::kFloat32: put(v.get<float>()); break;
    case DType::kFloat64: put(v.get<double>()); break;
  }
}

// Element i of a binary output, as a double (bools and integers exactly).
double ElementAt(const char* p, DType dtype, size_t i) {
  auto get = [&](auto zero) {
    decltype(zero) x;
    std::memcpy(&x, p + i * sizeof x, sizeof x);
    return x;
  };
  switch (dtype) {
    case DType::kBool: return get(uint8_t{});
    case DType::kUInt8: return get(uint8_t{});
    case DType::kInt8: return get(int8_t{});
    case DType::kInt16: return get(int16_t{});
    case DType::kInt32: return get(int32_t{});
    case DType::kInt64: return static_cast<double>(get(int64_t{}));
    case DType::kFloat16: return serving::HalfToFloat(get(uint16_t{}));
    case DType::kBFloat16: return serving::BFloat16ToFloat(get(uint16_t{}));
    case DType::kFloat32: return get(float{});
    case DType::kFloat64: return get(double{});
  }
  return NAN;
}

double Tolerance(DType d, double want) {
  switch (d) {
    case DType::kFloat16: return 1e-3 * std::fabs(want);
    case DType::kBFloat16: return 8e-3 * std::fabs(want);
    case DType::kFloat32: return 1e-6 * std::fabs(want);
    case DType::kFloat64: return 1e-12 * std::fabs(want);
    default: return 0;  // bools and integers: exact
  }
}

TEST(AllDatatypes, RoundTripThroughAModelThatUsesEach) {
  TempDir dir;
  std::string store = dir / "store", out;
  ASSERT_EQ(RunAotid({"--store", store, "add", TestData("alltypes.pt2"), "--name", "alltypes"}, &out), 0) << out;
  auto d = DaemonProcess::Start({"--store", store, "--listen", "127.0.0.1:0"}, dir / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  httplib::Client c("127.0.0.1", (*d)->port());
  c.set_read_timeout(60, 0);
  bool ready = false;
  std::string last = "no answer";
  WaitFor(  // bounded: 5 minutes for one cold compile
      [&] {
        auto r = c.Get("/v2/models/alltypes/ready");
        if (!r) return true;
        last = r->body;
        ready = r->status == 200;
        return ready || json::parse(r->body, nullptr, false).value("state", "") == "failed";
      },
      300);
  ASSERT_TRUE(ready) << last << (*d)->Log();

  json meta = json::parse(c.Get("/v2/models/alltypes")->body);
  ASSERT_EQ(meta["inputs"].size(), 10u);
  json kase = json::parse(*fs::ReadFile(TestData("cases.json")))["alltypes"][0];
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(meta["inputs"][i]["datatype"], kase["inputs"][i]["datatype"]);

  // JSON both ways.
  auto r = c.Post("/v2/models/alltypes/infer", json{{"inputs", kase["inputs"]}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json got = json::parse(r->body)["outputs"];
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    const json& want = kase["outputs"][i];
    DType dt;
    ASSERT_TRUE(model::ParseDType(want["datatype"].get<std::string>(), &dt));
    EXPECT_EQ(got[i]["datatype"], want["datatype"]);
    EXPECT_EQ(got[i]["shape"], want["shape"]);
    for (size_t k = 0; k < want["data"].size(); ++k) {
      if (dt == DType::kBool) {
        EXPECT_EQ(got[i]["data"][k], want["data"][k]) << want["name"] << "[" << k << "]";
      } else if (dt == DType::kInt64) {
        EXPECT_EQ(got[i]["data"][k].get<int64_t>(), want["data"][k].get<int64_t>()) << want["name"];
      } else {
        double w = want["data"][k].get<double>();
        EXPECT_NEAR(got[i]["data"][k].get<double>(), w, Tolerance(dt, w)) << want["name"] << "[" << k << "]";
      }
    }
  }

  // Binary both ways: every input as bytes, every output back as bytes.
  json header{{"inputs", json::array()}, {"parameters", {{"binary_data_output", true}}}};
  std::string tail;
  for (const auto& in : kase["inputs"]) {
    DType dt;
    ASSERT_TRUE(model::ParseDType(in["datatype"].get<std::string>(), &dt));
    size_t before = tail.size();
    for (const auto& v : in["data"]) AppendBytes(&tail, dt, v);
    header["inputs"].push_back({{"name", in["name"]}, {"datatype", in["datatype"]}, {"shape", in["shape"]},
                                {"parameters", {{"binary_data_size", tail.size() - before}}}});
  }
  std::string head = header.dump();
  auto b = c.Post("/v2/models/alltypes/infer", {{"Inference-Header-Content-Length", std::to_string(head.size())}},
                  head + tail, "application/octet-stream");
  ASSERT_TRUE(b);
  ASSERT_EQ(b->status, 200) << b->body;
  size_t json_len = std::stoul(b->get_header_value("Inference-Header-Content-Length"));
  json outs = json::parse(b->body.substr(0, json_len))["outputs"];
  size_t at = json_len;
  for (size_t i = 0; i < 10; ++i) {
    const json& want = kase["outputs"][i];
    DType dt;
    ASSERT_TRUE(model::ParseDType(want["datatype"].get<std::string>(), &dt));
    size_t n = outs[i]["parameters"]["binary_data_size"].get<size_t>();
    ASSERT_EQ(n, want["data"].size() * model::DTypeSize(dt)) << want["name"];
    ASSERT_LE(at + n, b->body.size());
    for (size_t k = 0; k < want["data"].size(); ++k) {
      double w = dt == DType::kBool ? want["data"][k].get<bool>() : want["data"][k].get<double>();
      double g = ElementAt(b->body.data() + at, dt, k);
      if (dt == DType::kInt64) {
        int64_t gi;
        std::memcpy(&gi, b->body.data() + at + k * 8, 8);
        EXPECT_EQ(gi, want["data"][k].get<int64_t>()) << want["name"];
      } else {
        EXPECT_NEAR(g, w, Tolerance(dt, w)) << want["name"] << "[" << k << "]";
      }
    }
    at += n;
  }
  EXPECT_EQ(at, b->body.size());
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();
}

}  // namespace
}  // namespace aotid::testing
