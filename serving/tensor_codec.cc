#include "serving/tensor_codec.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>

#include "http/json_tape.h"

namespace aotid::serving {
namespace {

using model::DType;
using model::HostTensor;
using model::TensorSpec;
using json = nlohmann::json;
using http::json_tape::Kind;
using http::json_tape::KindName;
using http::json_tape::Tape;

template <typename T>
void Put(std::vector<std::byte>& out, size_t index, T v) {
  std::memcpy(out.data() + index * sizeof(T), &v, sizeof(T));
}

template <typename T>
T Get(const std::vector<std::byte>& in, size_t index) {
  T v;
  std::memcpy(&v, in.data() + index * sizeof(T), sizeof(T));
  return v;
}

// JSON has no infinities: a float element that is one came from a number
// too large for the tensor's type. The first such of elements [from, from
// + n) of `out`, or n past the last.
size_t FirstInfinity(DType dtype, const std::vector<std::byte>& out, size_t from, size_t n) {
  for (size_t k = from; k < from + n; ++k) {
    switch (dtype) {
      case DType::kFloat32:
        if (std::isinf(Get<float>(out, k))) return k;
        break;
      case DType::kFloat64:
        if (std::isinf(Get<double>(out, k))) return k;
        break;
      case DType::kFloat16:
        if ((Get<uint16_t>(out, k) & 0x7fff) == 0x7c00) return k;
        break;
      case DType::kBFloat16:
        if ((Get<uint16_t>(out, k) & 0x7fff) == 0x7f80) return k;
        break;
      default: return from + n;
    }
  }
  return from + n;
}

Status TooLarge(const std::string& who, size_t i, std::string_view text, DType dtype) {
  return InvalidArgument(who + ": element " + std::to_string(i) + " (" + std::string(text.substr(0, 40)) +
                         ") is out of range for " + std::string(model::DTypeName(dtype)));
}

// Stores the number whose text is `t` as element `i` of a tensor of `dtype`.
Status PutNumber(std::string_view t, DType dtype, size_t i, std::vector<std::byte>& out,
                 const std::string& who) {
  auto integer = [&](int64_t lo, int64_t hi) -> StatusOr<int64_t> {
    int64_t x;
    uint64_t u;
    if (!Tape::ToInt64(t, &x)) {
      if (Tape::ToUInt64(t, &u))
        return InvalidArgument(who + ": element " + std::to_string(i) + " is out of range");
      return InvalidArgument(who + ": element " + std::to_string(i) + " is number, expected an integer");
    }
    if (x < lo || x > hi) {
      return InvalidArgument(who + ": element " + std::to_string(i) + " (" + std::to_string(x) +
                             ") is out of range for " + std::string(model::DTypeName(dtype)));
    }
    return x;
  };
  switch (dtype) {
    case DType::kBool:
      return InvalidArgument(who + ": element " + std::to_string(i) + " is number, expected true or false");
    case DType::kUInt8: {
      ASSIGN_OR_RETURN(int64_t x, integer(0, 255));
      Put<uint8_t>(out, i, x);
      return Status::OK();
    }
    case DType::kInt8: {
      ASSIGN_OR_RETURN(int64_t x, integer(-128, 127));
      Put<int8_t>(out, i, x);
      return Status::OK();
    }
    case DType::kInt16: {
      ASSIGN_OR_RETURN(int64_t x, integer(-32768, 32767));
      Put<int16_t>(out, i, x);
      return Status::OK();
    }
    case DType::kInt32: {
      ASSIGN_OR_RETURN(int64_t x,
                       integer(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
      Put<int32_t>(out, i, static_cast<int32_t>(x));
      return Status::OK();
    }
    case DType::kInt64: {
      ASSIGN_OR_RETURN(int64_t x,
                       integer(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
      Put<int64_t>(out, i, x);
      return Status::OK();
    }
    case DType::kUInt16: {
      ASSIGN_OR_RETURN(int64_t x, integer(0, std::numeric_limits<uint16_t>::max()));
      Put<uint16_t>(out, i, static_cast<uint16_t>(x));
      return Status::OK();
    }
    case DType::kUInt32: {
      ASSIGN_OR_RETURN(int64_t x, integer(0, std::numeric_limits<uint32_t>::max()));
      Put<uint32_t>(out, i, static_cast<uint32_t>(x));
      return Status::OK();
    }
    case DType::kUInt64: {
      // Past INT64's range: read as unsigned.
      uint64_t u;
      int64_t x;
      if (Tape::ToUInt64(t, &u)) {
        Put<uint64_t>(out, i, u);
        return Status::OK();
      }
      if (Tape::ToInt64(t, &x))  // negative
        return InvalidArgument(who + ": element " + std::to_string(i) + " (" + std::to_string(x) +
                               ") is out of range for UINT64");
      if (Tape::IsIntegerText(t))
        return InvalidArgument(who + ": element " + std::to_string(i) + " is out of range");
      return InvalidArgument(who + ": element " + std::to_string(i) + " is number, expected an integer");
    }
    default: break;
  }
  double d = Tape::ToDouble(t);
  switch (dtype) {
    case DType::kFloat16: Put<uint16_t>(out, i, FloatToHalf(static_cast<float>(d))); break;
    case DType::kBFloat16: Put<uint16_t>(out, i, FloatToBFloat16(static_cast<float>(d))); break;
    case DType::kFloat32: Put<float>(out, i, static_cast<float>(d)); break;
    case DType::kFloat64: Put<double>(out, i, d); break;
    default: return Internal("unhandled datatype");
  }
  if (FirstInfinity(dtype, out, i, 1) == i) return TooLarge(who, i, t, dtype);
  return Status::OK();
}

// Stores value `v` of the tape (a number or a boolean) as element `i`.
Status PutScalar(const Tape& tape, uint32_t v, DType dtype, size_t i, std::vector<std::byte>& out,
                 const std::string& who) {
  if (tape.kind(v) == Kind::kNumber) return PutNumber(tape.text(v), dtype, i, out, who);
  if (dtype == DType::kBool && tape.is_bool(v)) {
    Put<uint8_t>(out, i, tape.kind(v) == Kind::kTrue ? 1 : 0);
    return Status::OK();
  }
  const char* want = dtype == DType::kBool ? "true or false"
                     : dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
                             dtype == DType::kFloat64
                         ? "a number"
                         : "an integer";
  return InvalidArgument(who + ": element " + std::to_string(i) + " is " + KindName(tape.kind(v)) +
                         ", expected " + want);
}

// Walks nested arrays depth-first, storing scalars in order.
Status Flatten(const Tape& tape, uint32_t node, DType dtype, size_t expected, size_t* count,
               std::vector<std::byte>& out, const std::string& who) {
  if (tape.kind(node) == Kind::kArray && tape.packed(node)) {
    if (*count + tape.count(node) > expected) {
      return InvalidArgument(who + ": 'data' has more elements than its shape holds (" +
                             std::to_string(expected) + ")");
    }
    std::string_view text = tape.text(node), number;
    size_t pos = 0;
    // Floats from the values the tape read; integers (and booleans, which
    // numbers are not) from their text, which says whether each is one.
    const double* v = tape.values(node);
    const uint32_t n = tape.count(node);
    switch (dtype) {
      case DType::kFloat32:
        for (uint32_t k = 0; k < n; ++k) Put<float>(out, *count + k, static_cast<float>(v[k]));
        break;
      case DType::kFloat64:
        for (uint32_t k = 0; k < n; ++k) Put<double>(out, *count + k, v[k]);
        break;
      case DType::kFloat16:
        for (uint32_t k = 0; k < n; ++k)
          Put<uint16_t>(out, *count + k, FloatToHalf(static_cast<float>(v[k])));
        break;
      case DType::kBFloat16:
        for (uint32_t k = 0; k < n; ++k)
          Put<uint16_t>(out, *count + k, FloatToBFloat16(static_cast<float>(v[k])));
        break;
      default:
        while (Tape::NextNumber(text, &pos, &number))
          RETURN_IF_ERROR(PutNumber(number, dtype, (*count)++, out, who));
        return Status::OK();
    }
    if (size_t bad = FirstInfinity(dtype, out, *count, n); bad < *count + n) {
      size_t k = *count;  // the number's text, for the message
      while (Tape::NextNumber(text, &pos, &number) && k++ < bad) {
      }
      return TooLarge(who, bad, number, dtype);
    }
    *count += n;
    return Status::OK();
  }
  if (tape.kind(node) == Kind::kArray) {
    for (uint32_t c = node + 1; c < tape.end(node); c = tape.end(c)) {
      RETURN_IF_ERROR(Flatten(tape, c, dtype, expected, count, out, who));
    }
    return Status::OK();
  }
  if (*count >= expected) {
    return InvalidArgument(who + ": 'data' has more elements than its shape holds (" +
                           std::to_string(expected) + ")");
  }
  RETURN_IF_ERROR(PutScalar(tape, node, dtype, *count, out, who));
  ++*count;
  return Status::OK();
}

// An integer element of `dtype` at `index`, as int64.
int64_t IntegerAt(const std::vector<std::byte>& in, DType dtype, size_t index) {
  switch (dtype) {
    case DType::kUInt8: return Get<uint8_t>(in, index);
    case DType::kInt8: return Get<int8_t>(in, index);
    case DType::kInt16: return Get<int16_t>(in, index);
    case DType::kInt32: return Get<int32_t>(in, index);
    default: return Get<int64_t>(in, index);
  }
}

// `t`, of a narrower integer datatype, as `to` (WidensTo): each element
// converted, none changed in value.
void Widen(HostTensor& t, DType to) {
  size_t n = static_cast<size_t>(std::max<int64_t>(0, t.num_elements()));
  std::vector<std::byte> wide(n * model::DTypeSize(to));
  for (size_t i = 0; i < n; ++i) {
    int64_t v = IntegerAt(t.data, t.dtype, i);
    switch (to) {
      case DType::kInt16: Put<int16_t>(wide, i, static_cast<int16_t>(v)); break;
      case DType::kInt32: Put<int32_t>(wide, i, static_cast<int32_t>(v)); break;
      default: Put<int64_t>(wide, i, v); break;
    }
  }
  t.data = std::move(wide);
  t.dtype = to;
}

// Why a tensor sent as `sent` is refused by an input of `want`.
Status DatatypeMismatch(const std::string& who, DType sent, DType want) {
  std::string msg = who + " has datatype " + std::string(model::DTypeName(sent)) + ", expected " +
                    std::string(model::DTypeName(want));
  if (IsWideningInteger(want) && IsWideningInteger(sent) && !WidensTo(sent, want)) {
    msg += " (narrower integers are widened, wider ones never narrowed: values could be lost)";
  }
  return InvalidArgument(msg);
}

// What every front end checks of an input before its elements: a
// datatype the input takes (or widens to it) and a bounded element count.
Status CheckDeclared(const std::string& who, const TensorSpec& spec, const HostTensor& h,
                     const DecodeLimits& limits) {
  // A narrower integer (INT32 token ids for an INT64 input) is read as
  // sent and widened below; anything else must be the input's datatype.
  if (h.dtype != spec.dtype && !WidensTo(h.dtype, spec.dtype))
    return DatatypeMismatch(who, h.dtype, spec.dtype);
  int64_t n = h.num_elements();
  if (n < 0 || n > limits.max_elements) {
    return InvalidArgument(who + ": shape " + model::ShapeString(h.shape) + " has more than " +
                           std::to_string(limits.max_elements) + " elements");
  }
  return Status::OK();
}

// `h` (its datatype and shape checked) filled from `bytes`, its elements
// little endian (BOOL one byte each), widened to the input's datatype and
// checked against the input's contract. `size_name` names where the byte
// count came from, for the error when it does not fit the shape.
Status FillFromBytes(const std::string& who, const TensorSpec& spec, std::string_view size_name,
                     std::string_view bytes, HostTensor& h) {
  size_t want = static_cast<size_t>(h.num_elements()) * model::DTypeSize(h.dtype);
  if (bytes.size() != want) {
    return InvalidArgument(who + ": " + std::string(size_name) + " is " + std::to_string(bytes.size()) +
                           " bytes, shape " + model::ShapeString(h.shape) + " of " +
                           std::string(model::DTypeName(h.dtype)) + " needs " + std::to_string(want));
  }
  h.data.resize(want);
  if (want) std::memcpy(h.data.data(), bytes.data(), want);
  if (h.dtype == DType::kBool) {
    for (size_t i = 0; i < want; ++i) {
      if (static_cast<uint8_t>(h.data[i]) > 1) {
        return InvalidArgument(who + ": BOOL element " + std::to_string(i) + " is byte " +
                               std::to_string(static_cast<int>(h.data[i])) + ", expected 0 or 1");
      }
    }
  }
  if (h.dtype != spec.dtype) Widen(h, spec.dtype);
  return model::CheckTensorAgainstSpec(h, spec);
}

// The datatype a request names, parsed; BYTES named as unsupported.
Status ParseDatatype(const std::string& who, const std::string& datatype, DType* dtype) {
  if (model::ParseDType(datatype, dtype)) return Status::OK();
  if (datatype == "BYTES") return InvalidArgument(who + ": datatype BYTES is not supported");
  return InvalidArgument(who + ": unknown datatype '" + datatype + "'");
}

static_assert(std::endian::native == std::endian::little,
              "binary tensor data is little endian; a big-endian host needs byte swapping here");

StatusOr<HostTensor> DecodeTensor(const Tape& tape, uint32_t t, const TensorSpec& spec,
                                  const DecodeLimits& limits, std::optional<std::string_view> binary) {
  const std::string who = "input '" + spec.name + "'";
  HostTensor h;
  h.name = spec.name;
  uint32_t dt = tape.Member(t, "datatype");
  if (dt == Tape::kNone || tape.kind(dt) != Kind::kString)
    return InvalidArgument(who + ": missing 'datatype'");
  RETURN_IF_ERROR(ParseDatatype(who, tape.String(dt), &h.dtype));
  uint32_t shape = tape.Member(t, "shape");
  if (shape == Tape::kNone || tape.kind(shape) != Kind::kArray)
    return InvalidArgument(who + ": missing 'shape' array");
  auto add_dim = [&](std::string_view number) {
    int64_t dim;
    if (!Tape::ToInt64(number, &dim) || dim < 0) return false;
    h.shape.push_back(dim);
    return true;
  };
  if (tape.packed(shape)) {  // 16 dims or more, read from their text
    std::string_view number;
    for (size_t pos = 0; Tape::NextNumber(tape.text(shape), &pos, &number);) {
      if (!add_dim(number)) return InvalidArgument(who + ": 'shape' must hold non-negative integers");
    }
  }
  for (uint32_t d = shape + 1; d < tape.end(shape); d = tape.end(d)) {
    if (tape.kind(d) != Kind::kNumber || !add_dim(tape.text(d)))
      return InvalidArgument(who + ": 'shape' must hold non-negative integers");
  }
  RETURN_IF_ERROR(CheckDeclared(who, spec, h, limits));
  int64_t n = h.num_elements();
  uint32_t data = tape.Member(t, "data");
  if (binary) {
    if (data != Tape::kNone)
      return InvalidArgument(who + ": has both 'data' and parameters.binary_data_size");
    RETURN_IF_ERROR(FillFromBytes(who, spec, "binary_data_size", *binary, h));
    return h;
  }
  if (data == Tape::kNone) return InvalidArgument(who + ": missing 'data'");
  // A bare scalar stands for a tensor of one element; anything larger needs
  // an array.
  if (tape.kind(data) != Kind::kArray && n != 1) {
    return InvalidArgument(who + ": 'data' must be an array");
  }
  // Each element takes at least two bytes of JSON ("1,"): a large shape
  // whose 'data' is too short to hold it is refused before the allocation.
  size_t bytes = static_cast<size_t>(n) * model::DTypeSize(h.dtype);
  if (bytes > (1u << 20) && static_cast<uint64_t>(n) > tape.text(data).size() / 2 + 1) {
    return InvalidArgument(who + ": 'data' is " + std::to_string(tape.text(data).size()) +
                           " bytes of JSON, too short for the " + std::to_string(n) + " elements shape " +
                           model::ShapeString(h.shape) + " needs");
  }
  h.data.resize(bytes);
  size_t count = 0;
  RETURN_IF_ERROR(Flatten(tape, data, h.dtype, static_cast<size_t>(n), &count, h.data, who));
  if (count != static_cast<size_t>(n)) {
    return InvalidArgument(who + ": 'data' has " + std::to_string(count) + " elements, shape " +
                           model::ShapeString(h.shape) + " needs " + std::to_string(n));
  }
  if (h.dtype != spec.dtype) Widen(h, spec.dtype);
  RETURN_IF_ERROR(model::CheckTensorAgainstSpec(h, spec));
  return h;
}

void AppendNumber(std::string& out, double v) {
  if (!std::isfinite(v)) {  // JSON has no NaN or infinity
    out += "null";
    return;
  }
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void AppendFloat(std::string& out, float v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest form that round-trips
  out.append(buf, r.ptr);
}

template <typename T>
void AppendInt(std::string& out, T v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void AppendData(std::string& out, const HostTensor& t) {
  size_t n = static_cast<size_t>(std::max<int64_t>(0, t.num_elements()));
  out += '[';
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ',';
    switch (t.dtype) {
      case DType::kBool: out += Get<uint8_t>(t.data, i) ? "true" : "false"; break;
      case DType::kUInt8: AppendInt(out, Get<uint8_t>(t.data, i)); break;
      case DType::kInt8: AppendInt(out, Get<int8_t>(t.data, i)); break;
      case DType::kInt16: AppendInt(out, Get<int16_t>(t.data, i)); break;
      case DType::kInt32: AppendInt(out, Get<int32_t>(t.data, i)); break;
      case DType::kInt64: AppendInt(out, Get<int64_t>(t.data, i)); break;
      case DType::kFloat16: AppendFloat(out, HalfToFloat(Get<uint16_t>(t.data, i))); break;
      case DType::kBFloat16: AppendFloat(out, BFloat16ToFloat(Get<uint16_t>(t.data, i))); break;
      case DType::kFloat32: AppendFloat(out, Get<float>(t.data, i)); break;
      case DType::kFloat64: AppendNumber(out, Get<double>(t.data, i)); break;
      case DType::kUInt16: AppendInt(out, Get<uint16_t>(t.data, i)); break;
      case DType::kUInt32: AppendInt(out, Get<uint32_t>(t.data, i)); break;
      case DType::kUInt64: AppendInt(out, Get<uint64_t>(t.data, i)); break;
    }
  }
  out += ']';
}

}  // namespace

bool IsWideningInteger(DType d) {
  return d == DType::kUInt8 || d == DType::kInt8 || d == DType::kInt16 || d == DType::kInt32 ||
         d == DType::kInt64;
}

bool WidensTo(DType from, DType to) {
  // Every target is signed and strictly wider: it holds every value of
  // `from`, unsigned bytes included.
  bool signed_target = to == DType::kInt16 || to == DType::kInt32 || to == DType::kInt64;
  return IsWideningInteger(from) && signed_target && model::DTypeSize(to) > model::DTypeSize(from);
}

int JsonDepth(std::string_view body, int stop) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth && (max_depth = depth) > stop) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

namespace {

// parameters.NAME of a tensor entry, or Tape::kNone.
uint32_t Param(const Tape& tape, uint32_t entry, std::string_view name) {
  uint32_t p = tape.Member(entry, "parameters");
  return p == Tape::kNone ? Tape::kNone : tape.Member(p, name);
}

// The keys of object `obj` not in `known`, quoted and joined ("'a', 'b'");
// empty when all are known or `obj` is not an object.
std::string UnknownKeys(const Tape& tape, uint32_t obj, std::initializer_list<std::string_view> known) {
  std::string unknown;
  if (obj == Tape::kNone || tape.kind(obj) != Kind::kObject) return unknown;
  for (uint32_t k = obj + 1; k < tape.end(obj); k = tape.end(tape.end(k))) {
    std::string key = tape.String(k);
    if (std::find(known.begin(), known.end(), key) == known.end() &&
        unknown.find("'" + key + "'") == std::string::npos)
      unknown += (unknown.empty() ? "'" : ", '") + key + "'";
  }
  return unknown;
}

// The string 'name' of an entry of 'inputs' or 'outputs'.
bool EntryName(const Tape& tape, uint32_t entry, std::string* name) {
  uint32_t n = tape.Member(entry, "name");
  if (n == Tape::kNone || tape.kind(n) != Kind::kString) return false;
  *name = tape.String(n);
  return true;
}

}  // namespace

// Where input `name` is in the spec; an unknown name, or one already
// `seen`, is refused naming it.
StatusOr<size_t> InputIndex(const model::ModelSpec& spec, const std::string& name, std::vector<bool>& seen) {
  size_t k = 0;
  while (k < spec.inputs.size() && spec.inputs[k].name != name) ++k;
  if (k == spec.inputs.size()) {
    std::string known;
    for (const auto& s : spec.inputs) known += (known.empty() ? "'" : ", '") + s.name + "'";
    return InvalidArgument("unknown input '" + name + "'; the model takes " + known);
  }
  if (seen[k]) return InvalidArgument("input '" + name + "' appears twice");
  seen[k] = true;
  return k;
}

Status MissingInput(const TensorSpec& spec) {
  return InvalidArgument("missing input '" + spec.name + "' (" + std::string(model::DTypeName(spec.dtype)) +
                         " " + model::ShapeString(spec.shape) + ")");
}

// An output the request asks for, with its choices: a name the model has,
// listed once, last_position only where dim 1 is a sequence.
Status AddOutput(const model::ModelSpec& spec, std::string name, bool last_position,
                 std::optional<bool> binary, InferRequest* req) {
  const TensorSpec* out = nullptr;
  for (const auto& s : spec.outputs) out = s.name == name ? &s : out;
  if (!out) {
    std::string have;
    for (const auto& s : spec.outputs) have += (have.empty() ? "'" : ", '") + s.name + "'";
    return InvalidArgument("unknown output '" + name + "'; the model's outputs are " + have);
  }
  // One answer per name: a second entry would be answered once, its
  // parameters silently merged with the first's.
  if (std::find(req->output_names.begin(), req->output_names.end(), name) != req->output_names.end())
    return InvalidArgument("output '" + name + "' is listed twice in 'outputs'; list each output once");
  // Dim 1 is a sequence only in [batch, positions, ...]: on a [batch,
  // features] output it would cut a feature.
  if (last_position) {
    if (out->shape.size() < 3) {
      return InvalidArgument("output '" + name +
                             "': last_position takes the last index of dim 1 of a [batch, positions, "
                             "...] output, and '" +
                             name + "' has shape " + model::ShapeString(out->shape));
    }
    req->last_position.push_back(name);
  }
  if (binary) req->output_binary.emplace_back(name, *binary);
  req->output_names.push_back(std::move(name));
  return Status::OK();
}

StatusOr<InferRequest> DecodeInferRequest(std::string_view body, const model::ModelSpec& spec,
                                          const DecodeLimits& limits, std::optional<size_t> json_length) {
  std::string_view binary;
  if (json_length) {
    if (*json_length > body.size()) {
      return InvalidArgument("Inference-Header-Content-Length is " + std::to_string(*json_length) +
                             " but the body has only " + std::to_string(body.size()) + " bytes");
    }
    binary = body.substr(*json_length);
    body = body.substr(0, *json_length);
  }
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return InvalidArgument("the request body is empty: send a JSON object with \"inputs\"");
  }
  Tape tape;
  if (!tape.Parse(body, limits.max_depth)) {
    if (tape.too_deep()) {
      return InvalidArgument("request JSON is nested deeper than " + std::to_string(limits.max_depth) +
                             " levels");
    }
    if (!json_length && body.find("binary_data_size") != std::string_view::npos) {
      return InvalidArgument(
          "request body is not valid JSON (binary tensor data needs the "
          "Inference-Header-Content-Length header)");
    }
    return InvalidArgument("request body is not valid JSON " + tape.ErrorPlace(body));
  }
  constexpr uint32_t kRoot = 0;
  if (tape.kind(kRoot) != Kind::kObject) return InvalidArgument("request body must be a JSON object");
  InferRequest req;
  if (uint32_t id = tape.Member(kRoot, "id"); id != Tape::kNone) {
    if (tape.kind(id) != Kind::kString) return InvalidArgument("'id' must be a string");
    req.id = tape.String(id);
  }
  uint32_t inputs = tape.Member(kRoot, "inputs");
  if (inputs == Tape::kNone || tape.kind(inputs) != Kind::kArray) {
    return InvalidArgument("request has no 'inputs' array");
  }
  std::vector<uint32_t> by_spec(spec.inputs.size(), Tape::kNone);
  std::vector<bool> seen(spec.inputs.size(), false);
  std::vector<std::optional<std::string_view>> chunk(spec.inputs.size());
  size_t offset = 0;  // into `binary`, taken by inputs in the order listed
  // A packed array holds numbers only: none of them is an entry.
  if (tape.packed(inputs)) return InvalidArgument("every entry of 'inputs' needs a string 'name'");
  for (uint32_t t = inputs + 1; t < tape.end(inputs); t = tape.end(t)) {
    std::string name;
    if (!EntryName(tape, t, &name)) return InvalidArgument("every entry of 'inputs' needs a string 'name'");
    ASSIGN_OR_RETURN(size_t k, InputIndex(spec, name, seen));
    by_spec[k] = t;
    if (uint32_t size = Param(tape, t, "binary_data_size"); size != Tape::kNone) {
      uint64_t n;
      if (!tape.AsUInt64(size, &n)) {
        return InvalidArgument("input '" + name + "': binary_data_size must be a non-negative integer");
      }
      if (!json_length) {
        return InvalidArgument("input '" + name +
                               "' has binary_data_size but the request has no "
                               "Inference-Header-Content-Length header");
      }
      if (n > binary.size() - offset) {
        return InvalidArgument("input '" + name + "': binary_data_size " + std::to_string(n) +
                               " runs past the end "
                               "of the body (" +
                               std::to_string(binary.size() - offset) + " bytes left)");
      }
      chunk[k] = binary.substr(offset, n);
      offset += n;
    }
  }
  if (offset != binary.size()) {
    return InvalidArgument(
        std::to_string(binary.size() - offset) +
        " bytes of binary data follow the JSON header that no input's binary_data_size claims");
  }
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    if (by_spec[k] == Tape::kNone) return MissingInput(spec.inputs[k]);
    ASSIGN_OR_RETURN(HostTensor h, DecodeTensor(tape, by_spec[k], spec.inputs[k], limits, chunk[k]));
    req.inputs.push_back(std::move(h));
  }
  RETURN_IF_ERROR(model::CheckSharedDims(req.inputs, spec));
  if (uint32_t outs = tape.Member(kRoot, "outputs"); outs != Tape::kNone) {
    if (tape.kind(outs) != Kind::kArray) return InvalidArgument("'outputs' must be an array");
    if (tape.packed(outs)) return InvalidArgument("every entry of 'outputs' needs a string 'name'");
    for (uint32_t o = outs + 1; o < tape.end(outs); o = tape.end(o)) {
      std::string name;
      if (!EntryName(tape, o, &name))
        return InvalidArgument("every entry of 'outputs' needs a string 'name'");
      if (uint32_t p = tape.Member(o, "parameters"); p != Tape::kNone) {
        if (tape.kind(p) != Kind::kObject)
          return InvalidArgument("output '" + name + "': parameters must be an object");
        if (std::string unknown = UnknownKeys(tape, p, {"binary_data", "last_position"}); !unknown.empty())
          return InvalidArgument("output '" + name + "': unknown parameter " + unknown +
                                 "; an output's parameters are binary_data and last_position");
      }
      bool last_position = false;
      if (uint32_t last = Param(tape, o, "last_position"); last != Tape::kNone) {
        if (!tape.is_bool(last))
          return InvalidArgument("output '" + name + "': last_position must be true or false");
        last_position = tape.kind(last) == Kind::kTrue;
      }
      std::optional<bool> binary;
      if (uint32_t b = Param(tape, o, "binary_data"); b != Tape::kNone) {
        if (!tape.is_bool(b))
          return InvalidArgument("output '" + name + "': binary_data must be true or false");
        binary = tape.kind(b) == Kind::kTrue;
      }
      RETURN_IF_ERROR(AddOutput(spec, std::move(name), last_position, binary, &req));
    }
  }
  // An output's own parameters given for the whole request would be
  // ignored: refused, with where they go. (Other request parameters, OIP's
  // and clients' own, pass.)
  for (std::string_view own : {"binary_data", "last_position"}) {
    if (tape.Member(tape.Member(kRoot, "parameters"), own) != Tape::kNone)
      return InvalidArgument(
          "parameters." + std::string(own) +
          " is a parameter of an output, not of the request: give it in the entry of "
          "'outputs' it is for, e.g. {\"outputs\": [{\"name\": \"...\", \"parameters\": {\"" +
          std::string(own) + "\": true}}]}");
  }
  if (uint32_t b = tape.Member(tape.Member(kRoot, "parameters"), "binary_data_output"); b != Tape::kNone) {
    if (!tape.is_bool(b)) return InvalidArgument("parameters.binary_data_output must be true or false");
    req.binary_outputs = tape.kind(b) == Kind::kTrue;
  }
  return req;
}

StatusOr<InferRequest> DecodeWireRequest(const WireRequest& wire, const model::ModelSpec& spec,
                                         const DecodeLimits& limits) {
  InferRequest req;
  req.id = wire.id;
  std::vector<const WireInput*> by_spec(spec.inputs.size(), nullptr);
  std::vector<bool> seen(spec.inputs.size(), false);
  for (const WireInput& in : wire.inputs) {
    ASSIGN_OR_RETURN(size_t k, InputIndex(spec, in.name, seen));
    by_spec[k] = &in;
  }
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    if (!by_spec[k]) return MissingInput(spec.inputs[k]);
    const WireInput& in = *by_spec[k];
    const std::string who = "input '" + in.name + "'";
    HostTensor h;
    h.name = in.name;
    RETURN_IF_ERROR(ParseDatatype(who, in.datatype, &h.dtype));
    for (int64_t d : in.shape) {
      if (d < 0) return InvalidArgument(who + ": 'shape' must hold non-negative integers");
    }
    h.shape = in.shape;
    RETURN_IF_ERROR(CheckDeclared(who, spec.inputs[k], h, limits));
    RETURN_IF_ERROR(FillFromBytes(who, spec.inputs[k], in.size_name, in.bytes, h));
    req.inputs.push_back(std::move(h));
  }
  RETURN_IF_ERROR(model::CheckSharedDims(req.inputs, spec));
  for (const WireOutput& out : wire.outputs) {
    RETURN_IF_ERROR(AddOutput(spec, out.name, out.last_position, std::nullopt, &req));
  }
  return req;
}

namespace {

// `t` with dim 1 cut to its last index, kept as a dim of 1 (of none when
// dim 1 is empty). A tensor of rank below 2 is left as it is.
HostTensor LastPosition(const HostTensor& t) {
  HostTensor out;
  out.name = t.name;
  out.dtype = t.dtype;
  out.shape = t.shape;
  if (t.shape.size() < 2) return t;
  const size_t rows = static_cast<size_t>(t.shape[0]), positions = static_cast<size_t>(t.shape[1]);
  size_t inner = model::DTypeSize(t.dtype);
  for (size_t i = 2; i < t.shape.size(); ++i) inner *= static_cast<size_t>(t.shape[i]);
  if (t.data.size() != rows * positions * inner) return t;  // not as its shape says: left whole
  out.shape[1] = positions == 0 ? 0 : 1;
  if (positions == 0) return out;
  out.data.resize(rows * inner);
  for (size_t b = 0; b < rows; ++b)
    std::memcpy(out.data.data() + b * inner, t.data.data() + (b * positions + positions - 1) * inner, inner);
  return out;
}

EncodedResponse Encode(std::string_view model_name, int64_t version, std::string_view id,
                       const std::vector<const HostTensor*>& outputs, const std::vector<std::string>& wanted,
                       bool binary_default, const std::vector<std::pair<std::string, bool>>& binary_choice) {
  EncodedResponse r;
  std::string& out = r.body;
  std::vector<const HostTensor*> binary;
  size_t bytes = 0;
  for (const HostTensor* t : outputs) bytes += t->data.size();
  out.reserve(128 + bytes * 3);
  out += "{\"model_name\":";
  out += json(std::string(model_name)).dump();
  out += ",\"model_version\":\"" + std::to_string(version) + "\"";
  if (!id.empty()) {
    out += ",\"id\":";
    out += json(std::string(id)).dump();
  }
  out += ",\"outputs\":[";
  bool first = true;
  for (const HostTensor* tp : outputs) {
    const HostTensor& t = *tp;
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), t.name) == wanted.end()) continue;
    bool as_binary = binary_default;
    for (const auto& [name, choice] : binary_choice) {
      if (name == t.name) as_binary = choice;
    }
    if (!first) out += ',';
    first = false;
    out += "{\"name\":";
    out += json(t.name).dump();
    out += ",\"datatype\":\"";
    out += model::DTypeName(t.dtype);
    out += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) out += ',';
      AppendInt(out, t.shape[i]);
    }
    if (as_binary) {
      out += "],\"parameters\":{\"binary_data_size\":";
      AppendInt(out, t.data.size());
      out += "}}";
      binary.push_back(&t);
      continue;
    }
    out += "],\"data\":";
    AppendData(out, t);
    out += '}';
  }
  out += "]}";
  if (!binary.empty()) {
    r.has_binary = true;
    r.json_length = out.size();
    for (const HostTensor* t : binary)
      out.append(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  }
  return r;
}

}  // namespace

std::string EncodeInferResponse(std::string_view model_name, int64_t version, std::string_view id,
                                const std::vector<HostTensor>& outputs,
                                const std::vector<std::string>& wanted) {
  std::vector<const HostTensor*> all;
  for (const auto& t : outputs) all.push_back(&t);
  return Encode(model_name, version, id, all, wanted, false, {}).body;
}

std::vector<HostTensor> AnsweredOutputs(const InferRequest& req, std::vector<HostTensor> outputs) {
  std::vector<HostTensor> out;
  out.reserve(outputs.size());
  for (auto& t : outputs) {
    const auto& wanted = req.output_names;
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), t.name) == wanted.end()) continue;
    bool last =
        std::find(req.last_position.begin(), req.last_position.end(), t.name) != req.last_position.end();
    out.push_back(last ? LastPosition(t) : std::move(t));
  }
  return out;
}

EncodedResponse EncodeInferResponse(std::string_view model_name, int64_t version, const InferRequest& req,
                                    const std::vector<HostTensor>& outputs) {
  std::vector<HostTensor> cut;  // the outputs asked for at their last position
  cut.reserve(req.last_position.size());
  std::vector<const HostTensor*> view;
  for (const auto& t : outputs) {
    if (std::find(req.last_position.begin(), req.last_position.end(), t.name) != req.last_position.end()) {
      cut.push_back(LastPosition(t));
      view.push_back(&cut.back());
    } else {
      view.push_back(&t);
    }
  }
  return Encode(model_name, version, req.id, view, req.output_names, req.binary_outputs, req.output_binary);
}

uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));  // inf / nan
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (e <= 0) {                                                 // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(x);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float BFloat16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

}  // namespace aotid::serving
