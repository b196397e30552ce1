// A JSON document read into a flat tape of spans over its text: a reader
// for request bodies that are mostly numbers, with nothing of models in it
// (serving/tensor_codec.cc reads infer requests with it).
//
// Why not a DOM library: a request's tensor data is thousands of numbers,
// and a DOM allocates a node for each and converts each to double whether
// or not that is the type wanted. The tape validates the whole document
// once (RFC 8259: grammar, string escapes, well-formed UTF-8), records each
// value as a kind and a span of the text, and leaves numbers as text; the
// decoder converts them straight into the tensor's type with
// std::from_chars. Decoding a request of 3,072 floats went from 821 to
// 151 µs, one of 8 floats from 4.4 to 1.4 µs (docs/BENCHMARKS.md).
//
// Layout: values in document order. A container's children follow it; an
// object's are key, value, key, value... `end(i)` is the index after value
// i's subtree, so children are walked as `for (c = i + 1; c < end(i);
// c = end(c))`.
//
// Except a packed array: an array of kPackAt or more numbers and nothing
// else (a tensor's data, flat) is one node with no children. Its numbers
// are validated like any, counted (count(i)), and read from its text with
// NextNumber(). One node for the whole array, not one per number, is what
// makes a large tensor's JSON fast to read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace aotid::http::json_tape {

enum class Kind : uint8_t { kNull, kFalse, kTrue, kNumber, kString, kArray, kObject };

// As the JSON types are called in messages: "null", "boolean", "number",
// "string", "array", "object".
const char* KindName(Kind k);

class Tape {
 public:
  // Reads `text` (the whole of it, surrounded by whitespace at most);
  // false when it is not valid JSON or nests deeper than `max_depth`.
  bool Parse(std::string_view text, int max_depth);
  // After a failed Parse: whether it failed on the nesting limit, and the
  // byte offset where reading stopped (at or just past the fault).
  bool too_deep() const { return too_deep_; }
  size_t error_offset() const { return pos_; }
  // "at byte N (near '...')": where a failed Parse of `text` stopped
  // (JsonPlace, base/json.h).
  std::string ErrorPlace(std::string_view text) const;

  static constexpr uint32_t kPackAt = 16;

  Kind kind(uint32_t i) const { return nodes_[i].kind; }
  bool packed(uint32_t i) const { return nodes_[i].packed; }
  // The elements of a packed array, and their values as the nearest
  // doubles (read as the tape was made).
  uint32_t count(uint32_t i) const { return nodes_[i].count; }
  const double* values(uint32_t i) const { return numbers_.data() + nodes_[i].first; }
  // Reads the number at *pos of a packed array's text (start at 0: the
  // '['), moving *pos past it; false at the array's end.
  static bool NextNumber(std::string_view array_text, size_t* pos, std::string_view* number);
  uint32_t end(uint32_t i) const { return nodes_[i].end; }
  // A number's text; a string's text between its quotes, escapes as sent.
  std::string_view text(uint32_t i) const { return nodes_[i].text; }
  bool is_bool(uint32_t i) const { return kind(i) == Kind::kTrue || kind(i) == Kind::kFalse; }

  // A string's value, escapes resolved.
  std::string String(uint32_t i) const;
  // The value of member `key` of object `obj` (the last, if repeated);
  // kNone when absent or `obj` is not an object.
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t Member(uint32_t obj, std::string_view key) const;

  // Numbers as JSON has them: an integer token (no fraction, no exponent)
  // that fits, or else nothing.
  bool AsInt64(uint32_t i, int64_t* out) const;
  bool AsUInt64(uint32_t i, uint64_t* out) const;
  // Whether a number is an integer token ("2", "-7"; not "2.0" or "2e0").
  bool IsIntegerToken(uint32_t i) const;
  // Any number as the nearest double.
  double AsDouble(uint32_t i) const { return ToDouble(text(i)); }

  // The same on a number's text (from text() or NextNumber()).
  static bool IsIntegerText(std::string_view t);
  static bool ToInt64(std::string_view t, int64_t* out);
  static bool ToUInt64(std::string_view t, uint64_t* out);
  static double ToDouble(std::string_view t);

 private:
  struct Node {
    Kind kind = Kind::kNull;
    bool escaped = false;  // a string with backslash escapes
    bool packed = false;
    uint32_t end = 0;
    uint32_t count = 0;  // a packed array's elements
    uint32_t first = 0;  // and where their values start in numbers_
    std::string_view text;
  };
  bool Value(int depth);
  bool StringToken(std::string_view* out, bool* escaped);
  bool NumberToken(std::string_view* out);
  // At an array's first element: reads it whole as a packed array when it
  // is kPackAt or more numbers; else leaves pos_ where it was.
  bool PackedNumbers(uint32_t* count);
  void SkipSpace();

  std::string_view src_;
  size_t pos_ = 0;
  int max_depth_ = 0;
  bool too_deep_ = false;
  std::vector<Node> nodes_;
  std::vector<double> numbers_;  // the values of packed arrays' elements
};

}  // namespace aotid::http::json_tape
