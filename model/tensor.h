// Tensors as the serving path sees them, without torch: a datatype, a shape
// and row-major bytes on the host. The runtime turns these into torch tensors
// without copying; the HTTP layer turns them into Open Inference Protocol JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace aotid::model {

// The unsigned types past UINT8 come last: the runner channel sends a
// DType as its number, and kUInt64 is the highest.
enum class DType {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kUInt16,
  kUInt32,
  kUInt64
};

// Open Inference Protocol names: "BOOL", "UINT8", ..., "FP16", "BF16", "FP32", "FP64".
std::string_view DTypeName(DType d);
bool ParseDType(std::string_view name, DType* out);
size_t DTypeSize(DType d);

// Product of the dims; -1 on overflow past 2^62 or a negative dim.
int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);  // "[-1, 4]"

// What the exported program was traced for at one dynamic dim: the sizes it
// takes, and its symbol, which dims of other inputs (or of the same one) may
// share, and then they must be equal (input_ids and attention_mask share the
// batch and the sequence length). Bounds are inclusive.
struct DimRange {
  std::string symbol;  // empty: shares with nothing
  int64_t min = 0;
  int64_t max = std::numeric_limits<int64_t>::max();  // the largest int64: unbounded
  // A size requests usually have: the exporter's example for the dim
  // (0: none recorded). Load-time timing runs the model at it.
  int64_t typical = 0;
};

// The values an integer input may hold, inclusive: a token id that indexes
// an embedding table of 50 rows is 0 to 49. The compiled kernels read out of
// bounds, or abort, on any other.
struct ValueRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
};

// Declared input or output: dims of -1 are dynamic. An input of an exported
// program may also carry what the program was traced for (spec.json's
// optional "dims" and "values"); a spec without them checks the shape alone.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  // Empty, or one per dim: nullopt for a fixed dim or one nothing is known of.
  std::vector<std::optional<DimRange>> dims = {};
  std::optional<ValueRange> values = std::nullopt;
};

struct HostTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;  // NumElements(shape) * DTypeSize(dtype) bytes

  int64_t num_elements() const { return NumElements(shape); }
};

// A compiled model's interface, written by the compile worker next to the
// build (spec.json) and read back when the build is loaded.
struct ModelSpec {
  std::vector<TensorSpec> inputs;  // what a client sends
  std::vector<TensorSpec> outputs;
  // Inputs no client sends: the loaded model makes them, zeros of a fixed
  // shape, when it loads, and passes the same tensors after `inputs` to
  // every run, which writes them in place (a language model's key/value
  // cache). spec.json's optional "state_inputs".
  std::vector<TensorSpec> state_inputs;

  static StatusOr<ModelSpec> FromJson(std::string_view json);
  std::string ToJson() const;
};

// Checks that `t` fits `spec`: datatype, rank, every fixed dim, every
// dynamic dim within its range, that the data size matches the shape, and
// that an integer input's values are within their range (one pass over the
// data, only where a range is recorded). The message names the input and
// what was expected.
Status CheckTensorAgainstSpec(const HostTensor& t, const TensorSpec& spec);

// Checks what no single input shows: that dims sharing a symbol have the same
// size across `inputs` (in the order of spec.inputs, each already checked
// against its spec). The message names both inputs and dims.
Status CheckSharedDims(const std::vector<HostTensor>& inputs, const ModelSpec& spec);

}  // namespace aotid::model
