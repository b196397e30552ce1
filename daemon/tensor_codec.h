// Open Inference Protocol JSON tensors <-> HostTensor.
//
// Decoding is strict: every input the model declares appears exactly once,
// with its datatype, a shape that fits, and exactly as many elements as the
// shape says (flat or nested "data"). Errors name the input and what was
// expected. Nothing here touches torch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "runtime/tensor.h"

namespace aotid::daemon {

struct DecodeLimits {
  int max_depth = 32;                 // JSON nesting
  int64_t max_elements = 1LL << 28;   // per input
};

struct InferRequest {
  std::string id;  // echoed when non-empty
  std::vector<runtime::HostTensor> inputs;   // in the order of spec.inputs
  std::vector<std::string> output_names;     // empty means all
};

StatusOr<InferRequest> DecodeInferRequest(std::string_view body, const runtime::ModelSpec& spec,
                                          const DecodeLimits& limits = {});

// Encodes a response; `outputs` are filtered by `wanted` (all when empty).
std::string EncodeInferResponse(std::string_view model_name, int64_t version, std::string_view id,
                                const std::vector<runtime::HostTensor>& outputs,
                                const std::vector<std::string>& wanted = {});

// Deepest nesting of '[' and '{' outside strings; stops counting past `stop`.
int JsonDepth(std::string_view body, int stop);

// IEEE half and bfloat16 conversions, round to nearest even.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t b);

}  // namespace aotid::daemon
