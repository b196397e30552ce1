// The JSON reader under the infer request decoder. The fuzz target
// (tests/fuzz/decode_infer_request_fuzzer.cc) also compares it with
// nlohmann::json on every input it makes up.
#include "http/json_tape.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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
