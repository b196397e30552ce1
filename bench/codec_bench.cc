// How fast aotid reads and writes tensors as JSON: a request of one FP32
// tensor shaped like an image batch of one (3x224x224, 150,528 numbers)
// decoded by DecodeInferRequest, and the same numbers encoded as a
// response, in MB/s of JSON text. Numbers are written two ways clients
// write them: rounded to 4 decimals (-0.1234), and the shortest text that
// round-trips a float32 (what a float32 array's tolist() gives, ~11 bytes).
// Median of the repeats; the tape (validation) alone is shown too. Where
// simdjson is installed, the same text read by it (its DOM parser, every
// number of the data array as a double): what a SIMD parser does with this
// text on this machine.
//
//   aotid_codec_bench [REPEATS]
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "base/memory.h"
#if AOTID_BENCH_SIMDJSON
#include <simdjson.h>
#endif

#include "http/json_tape.h"
#include "serving/tensor_codec.h"

namespace {

using aotid::model::DType;
using aotid::model::HostTensor;
using aotid::model::ModelSpec;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string Request(const std::vector<float>& values, bool rounded) {
  std::string body = R"({"inputs":[{"name":"image","datatype":"FP32","shape":[1,3,224,224],"data":[)";
  char buf[32];
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) body += ',';
    if (rounded) {
      body.append(buf, static_cast<size_t>(std::snprintf(buf, sizeof buf, "%.4f", values[i])));
    } else {
      auto r = std::to_chars(buf, buf + sizeof buf, values[i]);
      body.append(buf, r.ptr);
    }
  }
  body += "]}]}";
  return body;
}

}  // namespace

int main(int argc, char** argv) {
  aotid::KeepFreedMemory(
      size_t{64} << 20);  // freed request buffers are kept, as the daemon keeps them (base/memory.h)
  int repeats = argc > 1 ? std::atoi(argv[1]) : 21;
  ModelSpec spec;
  spec.inputs.push_back({"image", DType::kFloat32, {-1, 3, 224, 224}});
  spec.outputs.push_back({"image", DType::kFloat32, {-1, 3, 224, 224}});
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> values(3 * 224 * 224);
  for (float& v : values) v = dist(rng);

  std::printf("%-28s %10s %12s %12s %12s %15s\n", "numbers as", "JSON MB", "tape MB/s", "decode MB/s",
              "encode MB/s", "simdjson MB/s");
  for (bool rounded : {true, false}) {
    std::string body = Request(values, rounded);
    std::vector<double> tape_s, decode_s, encode_s, simdjson_s;
#if AOTID_BENCH_SIMDJSON
    simdjson::dom::parser parser;
    simdjson::padded_string padded(body);
#endif
    size_t encoded_bytes = 0;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = Clock::now();
      aotid::http::json_tape::Tape tape;
      if (!tape.Parse(body, 64)) {
        std::fprintf(stderr, "the request is not valid JSON\n");
        return 1;
      }
      tape_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      t0 = Clock::now();
      auto req = aotid::serving::DecodeInferRequest(body, spec);
      decode_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      if (!req.ok()) {
        std::fprintf(stderr, "decode failed: %s\n", req.status().ToString().c_str());
        return 1;
      }
      t0 = Clock::now();
      std::string out = aotid::serving::EncodeInferResponse("m", 1, "", req->inputs);
      encode_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      encoded_bytes = out.size();
#if AOTID_BENCH_SIMDJSON
      t0 = Clock::now();
      simdjson::dom::element doc;
      double sum = 0;
      size_t count = 0;
      if (parser.parse(padded).get(doc) != simdjson::SUCCESS) {
        std::fprintf(stderr, "simdjson refused the request\n");
        return 1;
      }
      for (simdjson::dom::element v : doc["inputs"].at(0)["data"].get_array()) {
        sum += v.get_double().value_unsafe();
        ++count;
      }
      simdjson_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      if (count != values.size() || sum != sum) {
        std::fprintf(stderr, "simdjson read %zu numbers\n", count);
        return 1;
      }
#endif
    }
    double mb = static_cast<double>(body.size()) / 1e6;
    std::printf("%-28s %10.2f %12.0f %12.0f %12.0f %15s\n", rounded ? "4 decimals" : "shortest float32 text",
                mb, mb / Median(tape_s), mb / Median(decode_s),
                static_cast<double>(encoded_bytes) / 1e6 / Median(encode_s),
                simdjson_s.empty() ? "-" : std::to_string(static_cast<int>(mb / Median(simdjson_s))).c_str());
  }
#if AOTID_BENCH_SIMDJSON
#define AOTID_STR2(x) #x
#define AOTID_STR(x) AOTID_STR2(x)
  std::printf("simdjson %s, its %s kernels (%s)\n", AOTID_STR(SIMDJSON_VERSION),
              simdjson::get_active_implementation()->name().c_str(),
              simdjson::get_active_implementation()->description().c_str());
#endif
  return 0;
}
