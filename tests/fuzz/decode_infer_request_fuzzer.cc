// libFuzzer target for the request decoder, the code that reads untrusted
// bytes first. Built with clang's -fsanitize=fuzzer,address,undefined
// (tests/fuzz/CMakeLists.txt) and run by tests/fuzz/run.sh.
//
// Input: a body, or "B" + two length bytes (little endian: the
// Inference-Header-Content-Length) + a body for the binary tensor extension. Whatever
// decodes is encoded again as the outputs of a response, both ways.
//
// The JSON reader under the decoder (http/json_tape.h) is also checked
// against nlohmann::json on every input: both accept the same documents,
// and what they read is the same document (inputs with a NUL byte aside:
// see below).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "http/json_tape.h"
#include "serving/tensor_codec.h"

namespace {

using aotid::model::DType;

const aotid::model::ModelSpec& Spec() {
  static const auto* spec = [] {
    auto* s = new aotid::model::ModelSpec;
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

// The tape's value `i` as nlohmann::json, to compare whole documents.
nlohmann::json FromTape(const aotid::http::json_tape::Tape& t, uint32_t i) {
  using aotid::http::json_tape::Kind;
  using aotid::http::json_tape::Tape;
  switch (t.kind(i)) {
    case Kind::kNull: return nullptr;
    case Kind::kFalse: return false;
    case Kind::kTrue: return true;
    case Kind::kString: return t.String(i);
    case Kind::kNumber: {
      int64_t v;
      uint64_t u;
      if (t.AsInt64(i, &v)) return v;
      if (t.AsUInt64(i, &u)) return u;
      return t.AsDouble(i);
    }
    case Kind::kArray: {
      auto a = nlohmann::json::array();
      if (t.packed(i)) {  // numbers only: from their text, and their values agree with it
        std::string_view number;
        size_t pos = 0;
        for (uint32_t k = 0; Tape::NextNumber(t.text(i), &pos, &number); ++k) {
          double value = Tape::ToDouble(number);
          if (k >= t.count(i) || std::memcmp(&value, &t.values(i)[k], sizeof value) != 0) __builtin_trap();
          int64_t v;
          uint64_t u;
          if (Tape::ToInt64(number, &v)) {
            a.push_back(v);
          } else if (Tape::ToUInt64(number, &u)) {
            a.push_back(u);
          } else {
            a.push_back(value);
          }
        }
        if (a.size() != t.count(i)) __builtin_trap();
        return a;
      }
      for (uint32_t c = i + 1; c < t.end(i); c = t.end(c)) a.push_back(FromTape(t, c));
      return a;
    }
    case Kind::kObject: {
      auto o = nlohmann::json::object();
      for (uint32_t k = i + 1; k < t.end(i); k = t.end(k + 1)) o[t.String(k)] = FromTape(t, k + 1);
      return o;
    }
  }
  return nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  {
    aotid::http::json_tape::Tape tape;
    bool ours = tape.Parse(body, 16);
    // nlohmann::json takes a NUL byte for the end of the input (so it accepts
    // "0<NUL>junk"); the tape refuses it, as RFC 8259 does. Compared without.
    if (aotid::serving::JsonDepth(body, 16) <= 16 && body.find('\0') == std::string_view::npos) {
      auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
      bool theirs = !j.is_discarded();
      if (ours && !theirs) {
        // A number past double's range ("1e400") is an error to nlohmann;
        // the tape reads it as infinity, as a float past FP32's range is.
        try {
          (void)nlohmann::json::parse(body);
        } catch (const nlohmann::json::out_of_range&) {
          theirs = true;
        } catch (const nlohmann::json::exception&) {
        }
      }
      if (ours != theirs) __builtin_trap();
      if (ours && !j.is_discarded() && FromTape(tape, 0) != j) __builtin_trap();
    }
  }
  std::optional<size_t> json_length;
  if (body.size() >= 3 && body[0] == 'B') {
    json_length = static_cast<uint8_t>(body[1]) | (static_cast<size_t>(static_cast<uint8_t>(body[2])) << 8);
    body.remove_prefix(3);
  }
  aotid::serving::DecodeLimits limits;
  limits.max_depth = 16;
  limits.max_elements = 1 << 16;
  auto req = aotid::serving::DecodeInferRequest(body, Spec(), limits, json_length);
  if (req.ok()) {
    auto as_json = aotid::serving::EncodeInferResponse("m", 1, req->id, req->inputs, req->output_names);
    auto as_asked = aotid::serving::EncodeInferResponse("m", 1, *req, req->inputs);
    if (as_json.empty() || as_asked.body.size() < as_asked.json_length) __builtin_trap();
  }
  return 0;
}
