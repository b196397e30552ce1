// Every numeric datatype of the protocol through a real compiled model that
// takes and returns each one (tests/models/make_test_models.py: AllTypes),
// as JSON and as binary tensors, against eager PyTorch; and integers sent
// narrower than an input takes them. Its own daemon and store, shared by
// the suite: one more build, about 15 s.
#include <httplib.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
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
    case DType::kUInt16: put(v.get<uint16_t>()); break;
    case DType::kUInt32: put(v.get<uint32_t>()); break;
    case DType::kUInt64: put(v.get<uint64_t>()); break;
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
    case DType::kUInt16: return get(uint16_t{});
    case DType::kUInt32: return get(uint32_t{});
    case DType::kUInt64: return static_cast<double>(get(uint64_t{}));
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

// One daemon for the suite: one build of alltypes.pt2.
class AllDatatypes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    std::string store = *dir_ / "store", out;
    ASSERT_EQ(RunAotid({"--store", store, "add", TestData("alltypes.pt2"), "--name", "alltypes"}, &out), 0)
        << out;
    auto d = DaemonProcess::Start({"--store", store, "--listen", "127.0.0.1:0"}, *dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = d->release();
    httplib::Client c("127.0.0.1", daemon_->port());
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
    ASSERT_TRUE(ready) << last << daemon_->Log();
  }
  static void TearDownTestSuite() {
    if (daemon_) EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
    delete daemon_;
    delete dir_;
  }
  void SetUp() override {
    ASSERT_NE(daemon_, nullptr);
    c_ = std::make_unique<httplib::Client>("127.0.0.1", daemon_->port());
    c_->set_read_timeout(60, 0);
  }

  static TempDir* dir_;
  static DaemonProcess* daemon_;
  std::unique_ptr<httplib::Client> c_;
};
TempDir* AllDatatypes::dir_ = nullptr;
DaemonProcess* AllDatatypes::daemon_ = nullptr;

TEST_F(AllDatatypes, RoundTripThroughAModelThatUsesEach) {
  httplib::Client& c = *c_;
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
}

// Integer inputs sent narrower than the model's datatype (INT32 token ids
// for an INT64 input) are widened, as JSON and as binary tensors, and
// answer as eager PyTorch does with the wide values; a wider one is
// refused, never narrowed.
TEST_F(AllDatatypes, NarrowerIntegersAreWidenedAndWiderOnesRefused) {
  httplib::Client& c = *c_;
  json kase = json::parse(*fs::ReadFile(TestData("cases.json")))["alltypes"][0];
  // AllTypes: o_i16 = i16 * 2, o_i32 = i32 + 7, o_i64 = i64 * 3; each sent
  // narrower, with the extremes of the narrower type.
  struct Narrow {
    std::string input, datatype;
    std::vector<int64_t> values;
    std::function<int64_t(int64_t)> eager;
  } narrow[] = {
      {"i16", "UINT8", {0, 255, 1, 7, 128, 254}, [](int64_t x) { return x * 2; }},
      {"i32", "INT16", {-32768, 0, 32767, 1, -1, 99}, [](int64_t x) { return x + 7; }},
      {"i64", "INT32", {-2147483648LL, 0, 2147483647LL, 1, -1, 5}, [](int64_t x) { return x * 3; }},
  };
  for (bool binary : {false, true}) {
    json header{{"inputs", json::array()}};
    std::string tail;
    for (const auto& in : kase["inputs"]) {
      json entry = in;
      for (const auto& n : narrow) {
        if (in["name"] != n.input) continue;
        entry["datatype"] = n.datatype;
        entry["data"] = n.values;
        if (binary) {
          DType dt;
          ASSERT_TRUE(model::ParseDType(n.datatype, &dt));
          size_t before = tail.size();
          for (int64_t v : n.values) AppendBytes(&tail, dt, v);
          entry.erase("data");
          entry["parameters"] = {{"binary_data_size", tail.size() - before}};
        }
      }
      header["inputs"].push_back(entry);
    }
    std::string head = header.dump();
    httplib::Headers h;
    if (binary) h.emplace("Inference-Header-Content-Length", std::to_string(head.size()));
    auto r = c.Post("/v2/models/alltypes/infer", h, head + tail,
                    binary ? "application/octet-stream" : "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json outs = json::parse(r->body)["outputs"];
    for (const auto& n : narrow) {
      const json* got = nullptr;
      for (const auto& o : outs) got = o["name"] == "o_" + n.input ? &o : got;
      ASSERT_NE(got, nullptr) << n.input;
      // The output keeps the model's datatype: the input was widened to it.
      for (const auto& w : kase["outputs"]) {
        if (w["name"] == (*got)["name"]) EXPECT_EQ((*got)["datatype"], w["datatype"]);
      }
      for (size_t k = 0; k < n.values.size(); ++k)
        EXPECT_EQ((*got)["data"][k].get<int64_t>(), n.eager(n.values[k])) << n.input << "[" << k << "]";
    }
  }

  json wide = json{{"inputs", kase["inputs"]}};
  for (auto& in : wide["inputs"]) {
    if (in["name"] == "i32") in["datatype"] = "INT64";
  }
  auto r = c.Post("/v2/models/alltypes/infer", wide.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("input 'i32' has datatype INT64, expected INT32 (narrower integers are widened"),
            std::string::npos)
      << r->body;
}

}  // namespace
}  // namespace aotid::testing
