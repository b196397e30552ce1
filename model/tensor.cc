#include "model/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "base/json.h"

namespace aotid::model {
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
    {DType::kFloat64, "FP64", 8},  {DType::kUInt16, "UINT16", 2}, {DType::kUInt32, "UINT32", 4},
    {DType::kUInt64, "UINT64", 8},
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

namespace {

// An optional integer member of `j`; false when present but not an integer.
bool OptionalInt(const nlohmann::json& j, const char* key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end()) return true;
  if (!it->is_number_integer()) return false;
  *out = it->get<int64_t>();
  return true;
}

// The optional "dims" and "values" of a spec entry (specs written before
// them have neither, and check the shape alone).
Status ParseContract(const nlohmann::json& t, TensorSpec* ts) {
  const std::string who = "model spec entry '" + ts->name + "'";
  if (auto it = t.find("dims"); it != t.end()) {
    if (!it->is_array() || it->size() != ts->shape.size()) {
      return Corruption(who + " has 'dims' that do not match its shape");
    }
    for (const auto& d : *it) {
      if (d.is_null()) {
        ts->dims.emplace_back();
        continue;
      }
      DimRange r;
      if (!d.is_object() || !OptionalInt(d, "min", &r.min) || !OptionalInt(d, "max", &r.max) ||
          !OptionalInt(d, "typical", &r.typical) || r.min > r.max) {
        return Corruption(who + " has a malformed dim range");
      }
      if (auto sym = d.find("symbol"); sym != d.end()) {
        if (!sym->is_string()) return Corruption(who + " has a malformed dim symbol");
        r.symbol = sym->get<std::string>();
      }
      ts->dims.emplace_back(std::move(r));
    }
  }
  if (auto it = t.find("values"); it != t.end()) {
    ValueRange r;
    if (!it->is_object() || !OptionalInt(*it, "min", &r.min) || !OptionalInt(*it, "max", &r.max) ||
        r.min > r.max) {
      return Corruption(who + " has a malformed value range");
    }
    ts->values = r;
  }
  return Status::OK();
}

// "[2, 256]"; "at least 2" without an upper bound.
std::string DimRangeString(const DimRange& r) {
  if (r.max == std::numeric_limits<int64_t>::max()) return "at least " + std::to_string(r.min);
  return "[" + std::to_string(r.min) + ", " + std::to_string(r.max) + "]";
}

// Half open where it can be, "[0, 50)", as a table of 50 rows is said.
std::string ValueRangeString(const ValueRange& r) {
  std::string lo = r.min == std::numeric_limits<int64_t>::min() ? "" : std::to_string(r.min);
  if (r.max == std::numeric_limits<int64_t>::max()) return lo.empty() ? "any" : "at least " + lo;
  if (lo.empty()) return "at most " + std::to_string(r.max);
  return "[" + lo + ", " + std::to_string(r.max + 1) + ")";
}

template <typename T>
Status CheckValues(const HostTensor& t, const ValueRange& r, const std::string& who) {
  const size_t n = t.data.size() / sizeof(T);
  const std::byte* p = t.data.data();
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    // A UINT64 past INT64's range is past any range recorded.
    bool past = false;
    if constexpr (std::is_same_v<T, uint64_t>)
      past = v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (past || static_cast<int64_t>(v) < r.min || static_cast<int64_t>(v) > r.max) {
      return InvalidArgument(who + " holds " + std::to_string(v) + " (element " + std::to_string(i) +
                             "), valid range " + ValueRangeString(r));
    }
  }
  return Status::OK();
}

}  // namespace

StatusOr<ModelSpec> ModelSpec::FromJson(std::string_view json) {
  auto j = ParseJsonOrDiscarded(json);
  if (j.is_discarded() || !j.is_object()) return Corruption("model spec is not a JSON object");
  ModelSpec spec;
  for (const char* key : {"inputs", "outputs", "state_inputs"}) {
    auto it = j.find(key);
    bool optional = std::string_view(key) == "state_inputs";
    if (optional && it == j.end()) continue;
    if (it == j.end() || !it->is_array()) return Corruption(std::string("model spec lacks '") + key + "'");
    auto& list = std::string_view(key) == "inputs"    ? spec.inputs
                 : std::string_view(key) == "outputs" ? spec.outputs
                                                      : spec.state_inputs;
    for (const auto& t : *it) {
      TensorSpec ts;
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("datatype") ||
          !t["datatype"].is_string() || !t.contains("shape") || !t["shape"].is_array()) {
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
      RETURN_IF_ERROR(ParseContract(t, &ts));
      if (optional && NumElements(ts.shape) < 0)
        return Corruption("model spec has a state input of no fixed shape");
      list.push_back(std::move(ts));
    }
  }
  return spec;
}

std::string ModelSpec::ToJson() const {
  nlohmann::json j;
  for (const char* key : {"inputs", "outputs", "state_inputs"}) {
    const auto& list = std::string_view(key) == "inputs"    ? inputs
                       : std::string_view(key) == "outputs" ? outputs
                                                            : state_inputs;
    if (&list == &state_inputs && list.empty()) continue;
    auto arr = nlohmann::json::array();
    for (const auto& t : list) {
      nlohmann::json e = {{"name", t.name}, {"datatype", DTypeName(t.dtype)}, {"shape", t.shape}};
      if (!t.dims.empty()) {
        auto dims = nlohmann::json::array();
        for (const auto& d : t.dims) {
          if (!d) {
            dims.push_back(nullptr);
            continue;
          }
          nlohmann::json r = {{"min", d->min}};
          if (d->max != std::numeric_limits<int64_t>::max()) r["max"] = d->max;
          if (!d->symbol.empty()) r["symbol"] = d->symbol;
          if (d->typical > 0) r["typical"] = d->typical;
          dims.push_back(std::move(r));
        }
        e["dims"] = std::move(dims);
      }
      if (t.values) e["values"] = {{"min", t.values->min}, {"max", t.values->max}};
      arr.push_back(std::move(e));
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
                           ShapeString(spec.shape) + " (-1: a dynamic dim, within its range)");
  }
  // Sizes the exported program was not traced for: past a position table,
  // say, the kernels read beyond it and answer garbage.
  for (size_t i = 0; i < spec.dims.size() && i < t.shape.size(); ++i) {
    const auto& r = spec.dims[i];
    if (r && (t.shape[i] < r->min || t.shape[i] > r->max)) {
      return InvalidArgument(who + " has shape " + ShapeString(t.shape) + ": dim " + std::to_string(i) +
                             " is " + std::to_string(t.shape[i]) + ", valid range " + DimRangeString(*r));
    }
  }
  int64_t n = t.num_elements();
  if (n < 0 || t.data.size() != static_cast<size_t>(n) * DTypeSize(t.dtype)) {
    return InvalidArgument(who + " has " + std::to_string(t.data.size()) + " bytes of data, shape " +
                           ShapeString(t.shape) + " needs " +
                           std::to_string(n < 0 ? -1 : n * static_cast<int64_t>(DTypeSize(t.dtype))));
  }
  if (spec.values) {
    switch (t.dtype) {
      case DType::kUInt8: return CheckValues<uint8_t>(t, *spec.values, who);
      case DType::kInt8: return CheckValues<int8_t>(t, *spec.values, who);
      case DType::kInt16: return CheckValues<int16_t>(t, *spec.values, who);
      case DType::kInt32: return CheckValues<int32_t>(t, *spec.values, who);
      case DType::kInt64: return CheckValues<int64_t>(t, *spec.values, who);
      case DType::kUInt16: return CheckValues<uint16_t>(t, *spec.values, who);
      case DType::kUInt32: return CheckValues<uint32_t>(t, *spec.values, who);
      case DType::kUInt64: return CheckValues<uint64_t>(t, *spec.values, who);
      default: break;  // a range is recorded for integer inputs alone
    }
  }
  return Status::OK();
}

Status CheckSharedDims(const std::vector<HostTensor>& inputs, const ModelSpec& spec) {
  // The first dim seen of each symbol; a model has a handful of dims, so a
  // plain list beats a map.
  struct Seen {
    const std::string* symbol;
    size_t input, dim;
  };
  std::vector<Seen> seen;
  for (size_t k = 0; k < spec.inputs.size() && k < inputs.size(); ++k) {
    const auto& dims = spec.inputs[k].dims;
    for (size_t i = 0; i < dims.size() && i < inputs[k].shape.size(); ++i) {
      if (!dims[i] || dims[i]->symbol.empty()) continue;
      auto first =
          std::find_if(seen.begin(), seen.end(), [&](const Seen& s) { return *s.symbol == dims[i]->symbol; });
      if (first == seen.end()) {
        seen.push_back({&dims[i]->symbol, k, i});
        continue;
      }
      int64_t want = inputs[first->input].shape[first->dim];
      if (inputs[k].shape[i] != want) {
        return InvalidArgument("input '" + spec.inputs[k].name + "' dim " + std::to_string(i) + " is " +
                               std::to_string(inputs[k].shape[i]) + " but input '" +
                               spec.inputs[first->input].name + "' dim " + std::to_string(first->dim) +
                               " is " + std::to_string(want) + "; the model takes them as one size (" +
                               dims[i]->symbol + ")");
      }
    }
  }
  return Status::OK();
}

}  // namespace aotid::model
