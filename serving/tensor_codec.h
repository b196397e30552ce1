// Open Inference Protocol JSON tensors <-> HostTensor.
//
// Decoding is strict: every input the model declares appears exactly once,
// with its datatype, a shape that fits, and exactly as many elements as the
// shape says (flat or nested "data"); a narrower integer datatype than the
// input's is widened to it (WidensTo). Where the spec records what an exported
// program was traced for, dynamic dims are within their ranges, dims that
// share a symbol agree across inputs, and integer inputs hold values within
// theirs. Errors name the input and what was expected. Nothing here touches
// torch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/tensor.h"

namespace aotid::serving {

struct DecodeLimits {
  int max_depth = 32;                // JSON nesting
  int64_t max_elements = 1LL << 28;  // per input
};

struct InferRequest {
  std::string id;                         // echoed when non-empty
  std::vector<model::HostTensor> inputs;  // in the order of spec.inputs
  std::vector<std::string> output_names;  // empty means all
  // Binary tensor extension, outputs: the request-wide default
  // (parameters.binary_data_output) and per-output choices
  // (outputs[].parameters.binary_data), which win.
  bool binary_outputs = false;
  std::vector<std::pair<std::string, bool>> output_binary;
  // outputs[].parameters.last_position: these outputs (rank 3 or more)
  // answer with dim 1 cut to its last index, kept as a dim of 1 (a
  // language model's logits [B, S, V] as [B, 1, V]).
  std::vector<std::string> last_position;
};

// Decodes a request body. With the binary tensor extension, `json_length`
// is the Inference-Header-Content-Length header: the first json_length bytes
// are the JSON, and the binary data of the inputs that carry
// parameters.binary_data_size follows, in the order they are listed.
StatusOr<InferRequest> DecodeInferRequest(std::string_view body, const model::ModelSpec& spec,
                                          const DecodeLimits& limits = {},
                                          std::optional<size_t> json_length = std::nullopt);

// A request read from a wire form other than JSON (gRPC's
// ModelInferRequest): each input's elements already as little-endian bytes
// of the datatype it names (BOOL one byte each).
struct WireInput {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::string_view bytes;  // must outlive the decode
  // Where the bytes came from, for the error when their count does not
  // fit the shape ("raw_input_contents[0]").
  std::string size_name;
};
struct WireOutput {
  std::string name;
  bool last_position = false;
};
struct WireRequest {
  std::string id;
  std::vector<WireInput> inputs;
  std::vector<WireOutput> outputs;  // empty means all
};

// Decodes it with DecodeInferRequest's checks and errors: every input
// once, a datatype it takes, a shape that fits, as many bytes as the shape
// says, the contract's ranges and shared dims; outputs the model has,
// each once.
StatusOr<InferRequest> DecodeWireRequest(const WireRequest& wire, const model::ModelSpec& spec,
                                         const DecodeLimits& limits = {});

// Encodes a response as JSON alone; `outputs` are filtered by `wanted` (all
// when empty).
std::string EncodeInferResponse(std::string_view model_name, int64_t version, std::string_view id,
                                const std::vector<model::HostTensor>& outputs,
                                const std::vector<std::string>& wanted = {});

// Encodes the response `req` asked for: outputs filtered by its
// output_names, those it asked for at their last position cut to it, and
// those it wants in binary appended after the JSON (little endian, BOOL one
// byte each) with parameters.binary_data_size in their JSON entries.
// json_length is the size of the JSON part, for the
// Inference-Header-Content-Length header, when there is binary data.
struct EncodedResponse {
  std::string body;
  bool has_binary = false;
  size_t json_length = 0;
};
EncodedResponse EncodeInferResponse(std::string_view model_name, int64_t version, const InferRequest& req,
                                    const std::vector<model::HostTensor>& outputs);

// The outputs `req` asks for (all when it names none), in the model's
// order, those it asked for at their last position cut to it: what a
// front end without the JSON encoding (gRPC) answers.
std::vector<model::HostTensor> AnsweredOutputs(const InferRequest& req,
                                               std::vector<model::HostTensor> outputs);

// Integer inputs sent narrower than the model takes them (INT32 token ids
// for an INT64 input) are widened where no value can change: UINT8, INT8,
// INT16 and INT32 to any wider signed integer. Nothing is ever narrowed; a
// request that would need it is refused naming the input and both
// datatypes.
bool IsWideningInteger(model::DType d);  // UINT8, INT8, INT16, INT32, INT64
bool WidensTo(model::DType from, model::DType to);

// Deepest nesting of '[' and '{' outside strings; stops counting past `stop`.
int JsonDepth(std::string_view body, int stop);

// IEEE half and bfloat16 conversions, round to nearest even.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t b);

}  // namespace aotid::serving
