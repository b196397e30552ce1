// libFuzzer target for the request decoder, the code that reads untrusted
// bytes first. Built with clang's -fsanitize=fuzzer,address,undefined by
// tests/fuzz/run.sh.
//
// Input: a body, or "B" + two length bytes (little endian: the
// Inference-Header-Content-Length) + a body for the binary tensor extension. Whatever
// decodes is encoded again as the outputs of a response, both ways.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "daemon/tensor_codec.h"

namespace {

using aotid::runtime::DType;

const aotid::runtime::ModelSpec& Spec() {
  static const auto* spec = [] {
    auto* s = new aotid::runtime::ModelSpec;
    s->inputs.push_back({"x", DType::kFloat32, {-1, 2}});
    s->inputs.push_back({"ids", DType::kInt64, {3}});
    s->inputs.push_back({"flags", DType::kBool, {-1}});
    s->inputs.push_back({"h", DType::kFloat16, {2, -1}});
    s->outputs.push_back({"x", DType::kFloat32, {-1, 2}});
    s->outputs.push_back({"ids", DType::kInt64, {3}});
    s->outputs.push_back({"flags", DType::kBool, {-1}});
    s->outputs.push_back({"h", DType::kFloat16, {2, -1}});
    return s;
  }();
  return *spec;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  std::optional<size_t> json_length;
  if (body.size() >= 3 && body[0] == 'B') {
    json_length = static_cast<uint8_t>(body[1]) | (static_cast<size_t>(static_cast<uint8_t>(body[2])) << 8);
    body.remove_prefix(3);
  }
  aotid::daemon::DecodeLimits limits;
  limits.max_depth = 16;
  limits.max_elements = 1 << 16;
  auto req = aotid::daemon::DecodeInferRequest(body, Spec(), limits, json_length);
  if (req.ok()) {
    auto as_json = aotid::daemon::EncodeInferResponse("m", 1, req->id, req->inputs, req->output_names);
    auto as_asked = aotid::daemon::EncodeInferResponse("m", 1, *req, req->inputs);
    if (as_json.empty() || as_asked.body.size() < as_asked.json_length) __builtin_trap();
  }
  return 0;
}
