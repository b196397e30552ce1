#include "runtime/tensor.h"

#include <nlohmann/json.hpp>

namespace aotid::runtime {
namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kBool, "BOOL", 1},     {DType::kUInt8, "UINT8", 1},   {DType::kInt8, "INT8", 1},
    {DType::kInt16, "INT16", 2},   {DType::kInt32, "INT32", 4},   {DType::kInt64, "INT64", 8},
    {DType::kFloat16, "FP16", 2},  {DType::kBFloat16, "BF16", 2}, {DType::kFloat32, "FP32", 4},
    {DType::kFloat64, "FP64", 8},
};
}  // namespace

std::string_view DTypeName(DType d) {
  for (const auto& i : kDTypes) {
    if (i.dtype == d) return i.name;
  }
  return "UNKNOWN";
}

bool ParseDType(std::string_view name, DType* out) {
  for (const auto& i : kDTypes) {
    if (name == i.name) {
      *out = i.dtype;
      return true;
    }
  }
  return false;
}

size_t DTypeSize(DType d) {
  for (const auto& i : kDTypes) {
    if (i.dtype == d) return i.size;
  }
  return 0;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  constexpr int64_t kLimit = int64_t{1} << 62;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > kLimit / d) return -1;
    n *= d;
  }
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

StatusOr<ModelSpec> ModelSpec::FromJson(std::string_view json) {
  auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Corruption("model spec is not a JSON object");
  ModelSpec spec;
  for (const char* key : {"inputs", "outputs"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return Corruption(std::string("model spec lacks '") + key + "'");
    auto& list = std::string_view(key) == "inputs" ? spec.inputs : spec.outputs;
    for (const auto& t : *it) {
      TensorSpec ts;
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
          !t.contains("datatype") || !t["datatype"].is_string() || !t.contains("shape") ||
          !t["shape"].is_array()) {
        return Corruption(std::string("model spec has a malformed entry in '") + key + "'");
      }
      ts.name = t["name"].get<std::string>();
      if (!ParseDType(t["datatype"].get<std::string>(), &ts.dtype)) {
        return Corruption("model spec names unknown datatype " + t["datatype"].get<std::string>());
      }
      for (const auto& d : t["shape"]) {
        if (!d.is_number_integer()) return Corruption("model spec has a non-integer dim");
        ts.shape.push_back(d.get<int64_t>());
      }
      list.push_back(std::move(ts));
    }
  }
  return spec;
}

std::string ModelSpec::ToJson() const {
  nlohmann::json j;
  for (const char* key : {"inputs", "outputs"}) {
    const auto& list = std::string_view(key) == "inputs" ? inputs : outputs;
    auto arr = nlohmann::json::array();
    for (const auto& t : list) {
      arr.push_back({{"name", t.name}, {"datatype", DTypeName(t.dtype)}, {"shape", t.shape}});
    }
    j[key] = std::move(arr);
  }
  return j.dump();
}

Status CheckTensorAgainstSpec(const HostTensor& t, const TensorSpec& spec) {
  const std::string who = "input '" + spec.name + "'";
  if (t.dtype != spec.dtype) {
    return InvalidArgument(who + " has datatype " + std::string(DTypeName(t.dtype)) + ", expected " +
                           std::string(DTypeName(spec.dtype)));
  }
  bool fits = t.shape.size() == spec.shape.size();
  for (size_t i = 0; fits && i < spec.shape.size(); ++i) {
    if (t.shape[i] < 0 || (spec.shape[i] >= 0 && t.shape[i] != spec.shape[i])) fits = false;
  }
  if (!fits) {
    return InvalidArgument(who + " has shape " + ShapeString(t.shape) + ", expected " +
                           ShapeString(spec.shape) + " (-1 is any size)");
  }
  int64_t n = t.num_elements();
  if (n < 0 || t.data.size() != static_cast<size_t>(n) * DTypeSize(t.dtype)) {
    return InvalidArgument(who + " has " + std::to_string(t.data.size()) + " bytes of data, shape " +
                           ShapeString(t.shape) + " needs " +
                           std::to_string(n < 0 ? -1 : n * static_cast<int64_t>(DTypeSize(t.dtype))));
  }
  return Status::OK();
}

}  // namespace aotid::runtime
