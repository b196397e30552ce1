// Tensors as the serving path sees them, without torch: a datatype, a shape
// and row-major bytes on the host. The runtime turns these into torch tensors
// without copying; the HTTP layer turns them into Open Inference Protocol JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace aotid::runtime {

enum class DType { kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64 };

// Open Inference Protocol names: "BOOL", "UINT8", ..., "FP16", "BF16", "FP32", "FP64".
std::string_view DTypeName(DType d);
bool ParseDType(std::string_view name, DType* out);
size_t DTypeSize(DType d);

// Product of the dims; -1 on overflow past 2^62 or a negative dim.
int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);  // "[-1, 4]"

// Declared input or output: dims of -1 are dynamic.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
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
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;

  static StatusOr<ModelSpec> FromJson(std::string_view json);
  std::string ToJson() const;
};

// Checks that `t` fits `spec`: datatype, rank, every fixed dim, and that the
// data size matches the shape. The message names the input and what was
// expected.
Status CheckTensorAgainstSpec(const HostTensor& t, const TensorSpec& spec);

}  // namespace aotid::runtime
