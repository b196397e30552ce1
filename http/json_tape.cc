#include "http/json_tape.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "base/json.h"

namespace aotid::http::json_tape {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Four hex digits at s[i..i+4); -1 when they are not.
int Hex4(std::string_view s, size_t i) {
  if (i + 4 > s.size()) return -1;
  int v = 0;
  for (size_t k = 0; k < 4; ++k) {
    int d = HexDigit(s[i + k]);
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// The length of the well-formed UTF-8 sequence at s[i] (a byte >= 0x80),
// or 0 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
size_t Utf8Length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return byte(k) >= lo && byte(k) <= hi;
  };
  unsigned c = byte(i);
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c == 0xE0) return cont(i + 1, 0xA0) && cont(i + 2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(i + 1) && cont(i + 2) ? 3 : 0;
  if (c == 0xED) return cont(i + 1, 0x80, 0x9F) && cont(i + 2) ? 3 : 0;
  if (c == 0xF0) return cont(i + 1, 0x90) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c == 0xF4) return cont(i + 1, 0x80, 0x8F) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  return 0;
}

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNull: return "null";
    case Kind::kFalse:
    case Kind::kTrue: return "boolean";
    case Kind::kNumber: return "number";
    case Kind::kString: return "string";
    case Kind::kArray: return "array";
    case Kind::kObject: return "object";
  }
  return "value";
}

bool Tape::Parse(std::string_view text, int max_depth) {
  src_ = text;
  pos_ = 0;
  max_depth_ = max_depth;
  too_deep_ = false;
  nodes_.clear();
  numbers_.clear();
  // About one value per four bytes of a tensor's data; grown past that.
  nodes_.reserve(std::min<size_t>(text.size() / 4 + 8, size_t{1} << 16));
  if (!Value(0)) return false;
  SkipSpace();
  return pos_ == src_.size();
}

std::string Tape::ErrorPlace(std::string_view text) const { return JsonPlace(text, pos_); }

void Tape::SkipSpace() {
  while (pos_ < src_.size()) {
    char c = src_[pos_];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
    ++pos_;
  }
}

bool Tape::StringToken(std::string_view* out, bool* escaped) {
  // At the opening quote.
  size_t start = ++pos_;
  *escaped = false;
  while (pos_ < src_.size()) {
    auto c = static_cast<unsigned char>(src_[pos_]);
    if (c == '"') {
      *out = src_.substr(start, pos_ - start);
      ++pos_;
      return true;
    }
    if (c < 0x20) return false;
    if (c == '\\') {
      *escaped = true;
      if (pos_ + 1 >= src_.size()) return false;
      char e = src_[pos_ + 1];
      if (e == 'u') {
        int cp = Hex4(src_, pos_ + 2);
        if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return false;  // a low surrogate alone
        pos_ += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate: its low half must follow
          if (pos_ + 1 >= src_.size() || src_[pos_] != '\\' || src_[pos_ + 1] != 'u') return false;
          int low = Hex4(src_, pos_ + 2);
          if (low < 0xDC00 || low > 0xDFFF) return false;
          pos_ += 6;
        }
        continue;
      }
      if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't')
        return false;
      pos_ += 2;
      continue;
    }
    if (c >= 0x80) {
      size_t n = Utf8Length(src_, pos_);
      if (n == 0) return false;
      pos_ += n;
      continue;
    }
    ++pos_;
  }
  return false;
}

bool Tape::NumberToken(std::string_view* out) {
  const char* const begin = src_.data() + pos_;
  const char* const stop = src_.data() + src_.size();
  const char* p = begin;
  auto digits = [&] {
    const char* from = p;
    while (p < stop && static_cast<unsigned>(*p - '0') < 10u) ++p;
    return p > from;
  };
  if (p < stop && *p == '-') ++p;
  if (p < stop && *p == '0') {
    ++p;
  } else if (!digits()) {
    return false;
  }
  if (p < stop && *p == '.') {
    ++p;
    if (!digits()) return false;
  }
  if (p < stop && (*p == 'e' || *p == 'E')) {
    ++p;
    if (p < stop && (*p == '+' || *p == '-')) ++p;
    if (!digits()) return false;
  }
  *out = std::string_view(begin, static_cast<size_t>(p - begin));
  pos_ += static_cast<size_t>(p - begin);
  return true;
}

namespace {

// Eight bytes of text as one word, the first byte lowest.
uint64_t Load8(const char* p) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  if constexpr (std::endian::native == std::endian::big) x = __builtin_bswap64(x);
  return x;
}

// How many of the eight bytes in `x` (first byte lowest) are ASCII digits
// before the first that is not. A byte is a digit when its high nibble is
// 3 and stays 3 after adding 6 (0x30..0x39). The add's carry out of a byte
// of 0xFA or more reaches only bytes after that byte, which is no digit.
int LeadingDigits(uint64_t x) {
  constexpr uint64_t kHigh = 0xF0F0F0F0F0F0F0F0u, kThrees = 0x3030303030303030u;
  uint64_t not_digit = ((x & kHigh) ^ kThrees) | (((x + 0x0606060606060606u) & kHigh) ^ kThrees);
  return not_digit == 0 ? 8 : std::countr_zero(not_digit) / 8;
}

// The value of the first `n` (1..8) digits of `x`: they are moved to the
// top of the word, the bytes below become leading zeros, and pairs, then
// fours, then the eight are combined by multiplying in place.
uint64_t DigitsValue(uint64_t x, int n) {
  // Digits are at least '0', so the subtraction borrows only above them.
  uint64_t v = (x - 0x3030303030303030u) << (8 * (8 - n));
  v = v * 10 + (v >> 8);  // each even byte: two digits' value
  v = (((v & 0x000000FF000000FFu) * (100 + (1000000ull << 32))) +
       (((v >> 16) & 0x000000FF000000FFu) * (1 + (10000ull << 32)))) >>
      32;
  return v;
}

// Reads a run of digits at `p` into `mantissa` (which may wrap: the caller
// counts the digits and does not trust it past 19), eight at a time where
// eight bytes can be read. Returns how many digits it read.
int ScanDigits(const char*& p, const char* stop, uint64_t& mantissa) {
  static constexpr uint64_t kScale[] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
  int count = 0;
  while (stop - p >= 8) {
    uint64_t x = Load8(p);
    int n = LeadingDigits(x);
    if (n == 0) return count;
    mantissa = mantissa * kScale[n] + DigitsValue(x, n);
    p += n;
    count += n;
    if (n < 8) return count;
  }
  for (; p < stop && static_cast<unsigned>(*p - '0') < 10u; ++p, ++count) {
    mantissa = mantissa * 10 + static_cast<unsigned>(*p - '0');
  }
  return count;
}

// Reads a JSON number at `p` and its value: false when the grammar is not
// JSON's. The common case exactly (Clinger): at most 19 significant digits
// that fit in 53 bits, times a power of ten a double holds exactly
// (1e0..1e22): one rounding, so the nearest double, as from_chars gives.
bool ScanNumber(const char*& p, const char* stop, double* value) {
  static constexpr double kPow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                      1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  const char* const begin = p;
  bool negative = p < stop && *p == '-';
  p += negative;
  uint64_t mantissa = 0;
  int digits = 0, exp10 = 0;
  // One path for "0" and "123" (the sign and a leading zero are as likely
  // as not in tensors, a branch on them would be mispredicted half the
  // time); JSON allows a leading zero only alone.
  const char* const integer = p;
  digits = ScanDigits(p, stop, mantissa);
  if (digits == 0 || (digits > 1 && *integer == '0')) {
    if (digits == 0) return false;
    p = integer + 1;  // "0" then more digits: the number is the "0"
    digits = 1;
    mantissa = 0;
  }
  if (p < stop && *p == '.') {
    ++p;
    int fraction = ScanDigits(p, stop, mantissa);
    if (fraction == 0) return false;
    digits += fraction;
    exp10 = -fraction;
  }
  if (p < stop && (*p == 'e' || *p == 'E')) {
    ++p;
    bool minus = p < stop && *p == '-';
    p += (p < stop && (*p == '-' || *p == '+'));
    const char* from = p;
    int e = 0;
    for (; p < stop && static_cast<unsigned>(*p - '0') < 10u; ++p) {
      if (e < 100000) e = e * 10 + (*p - '0');
    }
    if (p == from) return false;
    exp10 += minus ? -e : e;
  }
  if (digits <= 19 && mantissa <= (uint64_t{1} << 53) && exp10 >= -22 && exp10 <= 22) {
    double d = static_cast<double>(mantissa);
    d = exp10 < 0 ? d / kPow10[-exp10] : d * kPow10[exp10];
    *value = negative ? -d : d;
    return true;
  }
  auto [end, ec] = std::from_chars(begin, p, *value);
  // Out of double's range: strtod says what it rounds to (inf or 0).
  if (ec != std::errc()) *value = std::strtod(std::string(begin, p).c_str(), nullptr);
  return true;
}

}  // namespace

bool Tape::PackedNumbers(uint32_t* count) {
  const size_t first = numbers_.size();
  const char* const begin = src_.data();
  const char* const stop = begin + src_.size();
  const char* p = begin + pos_;
  auto space = [&] {
    while (p < stop && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  };
  // Room for a number per 4 bytes of what is left (grown past that).
  if (numbers_.capacity() == 0) numbers_.reserve((src_.size() - pos_) / 4 + 16);
  for (;;) {
    if (p >= stop || !(*p == '-' || static_cast<unsigned>(*p - '0') < 10u)) break;
    double v;
    if (!ScanNumber(p, stop, &v)) break;
    numbers_.push_back(v);
    if (p < stop && *p == ',') {  // the common case: no space around commas
      ++p;
      space();
      continue;
    }
    space();
    if (p >= stop) break;
    if (*p == ']') {
      if (numbers_.size() - first < kPackAt) break;
      pos_ = static_cast<size_t>(p + 1 - begin);
      *count = static_cast<uint32_t>(numbers_.size() - first);
      return true;
    }
    if (*p != ',') break;
    ++p;
    space();
  }
  numbers_.resize(first);  // not a packed array: read it element by element
  return false;
}

bool Tape::Value(int depth) {
  SkipSpace();
  if (pos_ >= src_.size()) return false;
  const auto index = static_cast<uint32_t>(nodes_.size());
  char c = src_[pos_];
  auto literal = [&](std::string_view word, Kind k) {
    if (src_.substr(pos_, word.size()) != word) return false;
    nodes_.push_back({.kind = k, .end = index + 1, .text = src_.substr(pos_, word.size())});
    pos_ += word.size();
    return true;
  };
  switch (c) {
    case 't': return literal("true", Kind::kTrue);
    case 'f': return literal("false", Kind::kFalse);
    case 'n': return literal("null", Kind::kNull);
    case '"': {
      Node n{.kind = Kind::kString, .end = index + 1, .text = {}};
      if (!StringToken(&n.text, &n.escaped)) return false;
      nodes_.push_back(n);
      return true;
    }
    case '[':
    case '{': {
      if (depth + 1 > max_depth_) {
        too_deep_ = true;
        return false;
      }
      const bool object = c == '{';
      const char close = object ? '}' : ']';
      size_t open = pos_++;
      nodes_.push_back({.kind = object ? Kind::kObject : Kind::kArray, .text = {}});
      SkipSpace();
      if (uint32_t n = 0, first = static_cast<uint32_t>(numbers_.size()); !object && PackedNumbers(&n)) {
        nodes_[index].packed = true;
        nodes_[index].first = first;
        nodes_[index].count = n;
        nodes_[index].end = index + 1;
        nodes_[index].text = src_.substr(open, pos_ - open);
        return true;
      }
      if (pos_ < src_.size() && src_[pos_] == close) {
        ++pos_;
      } else {
        for (;;) {
          if (object) {
            SkipSpace();
            if (pos_ >= src_.size() || src_[pos_] != '"') return false;
            Node key{.kind = Kind::kString, .end = static_cast<uint32_t>(nodes_.size()) + 1, .text = {}};
            if (!StringToken(&key.text, &key.escaped)) return false;
            nodes_.push_back(key);
            SkipSpace();
            if (pos_ >= src_.size() || src_[pos_] != ':') return false;
            ++pos_;
          }
          if (!Value(depth + 1)) return false;
          SkipSpace();
          if (pos_ >= src_.size()) return false;
          if (src_[pos_] == ',') {
            ++pos_;
            continue;
          }
          if (src_[pos_] != close) return false;
          ++pos_;
          break;
        }
      }
      nodes_[index].end = static_cast<uint32_t>(nodes_.size());
      nodes_[index].text = src_.substr(open, pos_ - open);
      return true;
    }
    default: {
      Node n{.kind = Kind::kNumber, .end = index + 1, .text = {}};
      if (!NumberToken(&n.text)) return false;
      nodes_.push_back(n);
      return true;
    }
  }
}

std::string Tape::String(uint32_t i) const {
  const Node& n = nodes_[i];
  if (!n.escaped) return std::string(n.text);
  std::string out;
  out.reserve(n.text.size());
  std::string_view s = n.text;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '\\') {
      out.push_back(s[k]);
      continue;
    }
    char e = s[++k];
    switch (e) {
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'u': {
        auto cp = static_cast<uint32_t>(Hex4(s, k + 1));
        k += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {  // validated by Parse: a low surrogate follows
          auto low = static_cast<uint32_t>(Hex4(s, k + 3));
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          k += 6;
        }
        AppendUtf8(&out, cp);
        break;
      }
      default: out.push_back(e); break;  // " \ /
    }
  }
  return out;
}

uint32_t Tape::Member(uint32_t obj, std::string_view key) const {
  if (obj >= nodes_.size() || kind(obj) != Kind::kObject) return kNone;
  uint32_t found = kNone;
  for (uint32_t k = obj + 1; k < end(obj);) {
    uint32_t v = k + 1;
    if (nodes_[k].escaped ? String(k) == key : nodes_[k].text == key) found = v;
    k = end(v);
  }
  return found;
}

bool Tape::IsIntegerToken(uint32_t i) const { return kind(i) == Kind::kNumber && IsIntegerText(text(i)); }

bool Tape::AsInt64(uint32_t i, int64_t* out) const {
  return kind(i) == Kind::kNumber && ToInt64(text(i), out);
}

bool Tape::AsUInt64(uint32_t i, uint64_t* out) const {
  return kind(i) == Kind::kNumber && ToUInt64(text(i), out);
}

bool Tape::IsIntegerText(std::string_view t) { return t.find_first_of(".eE") == std::string_view::npos; }

bool Tape::ToInt64(std::string_view t, int64_t* out) {
  if (!IsIntegerText(t)) return false;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
  return ec == std::errc() && p == t.data() + t.size();
}

bool Tape::ToUInt64(std::string_view t, uint64_t* out) {
  if (!IsIntegerText(t) || t.empty() || t.front() == '-') return false;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
  return ec == std::errc() && p == t.data() + t.size();
}

double Tape::ToDouble(std::string_view t) {
  const char* p = t.data();
  double d = 0;
  ScanNumber(p, t.data() + t.size(), &d);
  return d;
}

bool Tape::NextNumber(std::string_view a, size_t* pos, std::string_view* number) {
  // The text was validated by Parse: numbers, commas, whitespace, ']'.
  size_t i = *pos;
  if (i < a.size() && (a[i] == '[' || a[i] == ',')) ++i;
  while (i < a.size() && (a[i] == ' ' || a[i] == '\t' || a[i] == '\n' || a[i] == '\r')) ++i;
  if (i >= a.size() || a[i] == ']') return false;
  size_t start = i;
  while (i < a.size()) {
    char c = a[i];
    if (!((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E')) break;
    ++i;
  }
  *number = a.substr(start, i - start);
  while (i < a.size() && (a[i] == ' ' || a[i] == '\t' || a[i] == '\n' || a[i] == '\r')) ++i;
  *pos = i;
  return true;
}

}  // namespace aotid::http::json_tape
