// The JSON reader under the infer request decoder. The fuzz target
// (tests/fuzz/decode_infer_request_fuzzer.cc) also compares it with
// nlohmann::json on every input it makes up.
#include "http/json_tape.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace aotid::http::json_tape {
namespace {

TEST(JsonTape, AcceptsWhatRfc8259AcceptsAndNothingElse) {
  for (const char* ok :
       {"0", "-0", "1.5e-3", "-12E+4", "true", "null", "\"\"", "[]", "{}", " [1, [2, [3]]] ",
        R"({"a":{"b":[true,false,null]},"c":"\u00e9\ud83d\ude00\n"})", "\"caf\xc3\xa9 \xf0\x9f\x98\x80\""}) {
    Tape t;
    EXPECT_TRUE(t.Parse(ok, 32)) << ok;
  }
  for (const char* bad : {"",
                          " ",
                          "01",
                          "1.",
                          ".5",
                          "-",
                          "1e",
                          "+1",
                          "[1,]",
                          "[,1]",
                          "{\"a\"}",
                          "{\"a\":1,}",
                          "{a:1}",
                          "[1 2]",
                          "tru",
                          "nul",
                          "\"abc",
                          "\"a\tb\"",
                          "\"\\x\"",
                          "\"\\u12\"",
                          "\"\\udc00\"",
                          "\"\\ud800\"",
                          "\"\\ud800\\u0041\"",
                          "\"\xc3\"",
                          "\"\xc0\xaf\"",
                          "\"\xed\xa0\x80\"",
                          "\"\xf4\x90\x80\x80\"",
                          "[1]]",
                          "{} {}",
                          "[1]x",
                          "NaN",
                          "Infinity"}) {
    Tape t;
    EXPECT_FALSE(t.Parse(bad, 32)) << bad;
  }
}

TEST(JsonTape, WalksChildrenAndFindsMembers) {
  Tape t;
  ASSERT_TRUE(t.Parse(R"({"inputs":[{"name":"x","data":[[1,2],[3]]}],"id":"a","id":"b","e\u0078":7})", 32));
  ASSERT_EQ(t.kind(0), Kind::kObject);
  uint32_t inputs = t.Member(0, "inputs");
  ASSERT_NE(inputs, Tape::kNone);
  ASSERT_EQ(t.kind(inputs), Kind::kArray);
  int entries = 0;
  for (uint32_t e = inputs + 1; e < t.end(inputs); e = t.end(e)) ++entries;
  EXPECT_EQ(entries, 1);
  uint32_t data = t.Member(inputs + 1, "data");
  std::vector<std::string> leaves;
  for (uint32_t row = data + 1; row < t.end(data); row = t.end(row)) {
    for (uint32_t v = row + 1; v < t.end(row); v = t.end(v)) leaves.emplace_back(t.text(v));
  }
  EXPECT_EQ(leaves, (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(t.String(t.Member(0, "id")), "b");  // the last of a repeated key, as other readers do
  EXPECT_EQ(t.text(t.Member(0, "ex")), "7");    // keys compare after escapes
  EXPECT_EQ(t.Member(0, "missing"), Tape::kNone);
  EXPECT_EQ(t.Member(inputs, "name"), Tape::kNone);  // not an object
  EXPECT_EQ(t.Member(Tape::kNone, "name"), Tape::kNone);
}

TEST(JsonTape, StringsResolveEscapesToUtf8) {
  Tape t;
  ASSERT_TRUE(t.Parse(R"("a\"b\\c\/d\b\f\n\r\t \u0041\u00e9\u20ac\ud83d\ude00")", 4));
  EXPECT_EQ(t.String(0), "a\"b\\c/d\b\f\n\r\t A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
}

TEST(JsonTape, NumbersConvertOnlyWhenTheyFit) {
  Tape t;
  ASSERT_TRUE(
      t.Parse("[9223372036854775807, -9223372036854775808, 18446744073709551615, 18446744073709551616, "
              "2.0, 1e400, -1e400, 1e-400, 0.1]",
              4));
  std::vector<uint32_t> v;
  for (uint32_t c = 1; c < t.end(0); c = t.end(c)) v.push_back(c);
  int64_t i;
  uint64_t u;
  EXPECT_TRUE(t.AsInt64(v[0], &i));
  EXPECT_EQ(i, std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(t.AsInt64(v[1], &i));
  EXPECT_EQ(i, std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(t.AsInt64(v[2], &i));
  EXPECT_TRUE(t.AsUInt64(v[2], &u));
  EXPECT_EQ(u, std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(t.AsUInt64(v[3], &u));
  EXPECT_FALSE(t.AsInt64(v[4], &i));  // 2.0 is not an integer token
  EXPECT_FALSE(t.AsUInt64(v[1], &u));
  EXPECT_EQ(t.AsDouble(v[4]), 2.0);
  EXPECT_TRUE(std::isinf(t.AsDouble(v[5])) && t.AsDouble(v[5]) > 0);
  EXPECT_TRUE(std::isinf(t.AsDouble(v[6])) && t.AsDouble(v[6]) < 0);
  EXPECT_EQ(t.AsDouble(v[7]), 0.0);
  EXPECT_EQ(t.AsDouble(v[8]), 0.1);
  EXPECT_EQ(t.AsDouble(v[3]), 18446744073709551616.0);
}

// An array of kPackAt numbers or more is one node: counted, its values
// the nearest doubles (as from_chars reads them, also past Clinger's fast
// path), its numbers as text through NextNumber. Shorter arrays, and
// arrays that hold anything else, keep a node per element; a bad number
// in a long array still fails the document.
TEST(JsonTape, LongArraysOfNumbersArePackedWithTheirValues) {
  std::vector<std::string> numbers = {"0",
                                      "-0",
                                      "1",
                                      "-1.5",
                                      "0.1",
                                      "3.14159",
                                      "1e22",
                                      "1e23",
                                      "1E-22",
                                      "2.5e-323",
                                      "1e400",
                                      "-1e400",
                                      "1e-400",
                                      "0.30000000000000004",
                                      "123456789012345678901234567890",
                                      "9007199254740993",
                                      "7"};
  std::string text = "[";
  for (size_t i = 0; i < numbers.size(); ++i) text += (i ? (i % 2 ? " ,\n" : ",") : "") + numbers[i];
  text += " ]";
  Tape t;
  ASSERT_TRUE(t.Parse(text, 8));
  ASSERT_TRUE(t.packed(0));
  EXPECT_EQ(t.count(0), numbers.size());
  EXPECT_EQ(t.end(0), 1u);
  size_t pos = 0;
  std::string_view number;
  for (size_t i = 0; i < numbers.size(); ++i) {
    double want = std::strtod(numbers[i].c_str(), nullptr);
    EXPECT_EQ(t.values(0)[i], want) << numbers[i];
    EXPECT_EQ(std::signbit(t.values(0)[i]), std::signbit(want)) << numbers[i];
    ASSERT_TRUE(Tape::NextNumber(t.text(0), &pos, &number));
    EXPECT_EQ(number, numbers[i]);
  }
  EXPECT_FALSE(Tape::NextNumber(t.text(0), &pos, &number));

  std::string fifteen = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]";
  ASSERT_TRUE(t.Parse(fifteen, 8));
  EXPECT_FALSE(t.packed(0));
  EXPECT_EQ(t.end(0), 16u);
  std::string mixed = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,\"x\",[17]]";
  ASSERT_TRUE(t.Parse(mixed, 8));
  EXPECT_FALSE(t.packed(0));
  EXPECT_EQ(t.kind(17), Kind::kString);
  EXPECT_EQ(t.kind(18), Kind::kArray);
  std::string nested = "[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],[1,2]]";
  ASSERT_TRUE(t.Parse(nested, 8));
  EXPECT_FALSE(t.packed(0));
  EXPECT_TRUE(t.packed(1));
  EXPECT_EQ(t.end(1), 2u);
  EXPECT_FALSE(t.packed(2));
  for (const char* bad : {"01", "1.", ".5", "-", "1e", "1e+", "+1", "0x1", "1..2", "--1", "NaN"}) {
    std::string doc = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16," + std::string(bad) + "]";
    EXPECT_FALSE(t.Parse(doc, 8)) << bad;
    doc = "[" + std::string(bad) + ",1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]";
    EXPECT_FALSE(t.Parse(doc, 8)) << bad;
  }
  EXPECT_FALSE(t.Parse("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,]", 8));
  EXPECT_FALSE(t.Parse("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", 8));
}

// Digits are read eight bytes at a time where eight can be read: runs of
// every length from 1 to 24, in the integer part, the fraction and both,
// with and without a sign and an exponent, give the nearest double, each
// also as the last number of the document (where fewer than eight bytes
// are left to read).
TEST(JsonTape, NumbersReadEightDigitsAtATimeGiveTheNearestDouble) {
  std::mt19937_64 rng(7);
  auto digits = [&](int n, bool lead) {
    std::string d;
    for (int i = 0; i < n; ++i) d += static_cast<char>('0' + (i == 0 && lead ? 1 + rng() % 9 : rng() % 10));
    return d;
  };
  std::vector<std::string> numbers;
  for (int whole = 0; whole <= 24; ++whole) {
    for (int fraction = 0; fraction <= 24; fraction += whole == 0 ? 1 : 5) {
      if (whole == 0 && fraction == 0) continue;
      std::string n = rng() % 2 ? "-" : "";
      n += whole == 0 ? "0" : digits(whole, true);
      if (fraction > 0) n += "." + digits(fraction, false);
      if (rng() % 4 == 0) n += (rng() % 2 ? "e-" : "E+") + std::to_string(rng() % 30);
      numbers.push_back(n);
    }
  }
  for (size_t last = 0; last < numbers.size(); ++last) {
    // Sixteen small numbers first so that the array is packed, then this one.
    std::string text = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16";
    for (size_t i = 0; i <= last; i += std::max<size_t>(1, last / 8)) text += "," + numbers[i];
    text += "," + numbers[last] + "]";
    Tape t;
    ASSERT_TRUE(t.Parse(text, 8)) << text;
    ASSERT_TRUE(t.packed(0));
    size_t pos = 0;
    std::string_view number;
    for (uint32_t i = 0; i < t.count(0); ++i) {
      ASSERT_TRUE(Tape::NextNumber(t.text(0), &pos, &number));
      std::string s(number);
      double want = std::strtod(s.c_str(), nullptr);
      ASSERT_EQ(t.values(0)[i], want) << s;
      ASSERT_EQ(std::signbit(t.values(0)[i]), std::signbit(want)) << s;
    }
  }
  // A leading zero stands alone wherever the run is read from.
  for (const char* bad : {"00", "012345678", "-0123456789012", "00.5"}) {
    EXPECT_FALSE(
        Tape().Parse("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16," + std::string(bad) + ",1,2,3,4,5,6,7,8]", 8))
        << bad;
  }
}

TEST(JsonTape, NestingPastTheLimitIsRefusedAndSaysSo) {
  Tape t;
  EXPECT_TRUE(t.Parse("[[[1]]]", 3));
  EXPECT_FALSE(t.Parse("[[[[1]]]]", 3));
  EXPECT_TRUE(t.too_deep());
  EXPECT_FALSE(t.Parse("[[[1]", 3));
  EXPECT_FALSE(t.too_deep());
  std::string deep(100000, '[');
  EXPECT_FALSE(t.Parse(deep, 32));  // no recursion past the limit
  EXPECT_TRUE(t.too_deep());
}

}  // namespace
}  // namespace aotid::http::json_tape
