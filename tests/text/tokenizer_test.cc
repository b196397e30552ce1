#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/fs.h"

namespace aotid::text {
namespace {

std::string Fixture(const std::string& name) {
  auto text = fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/" + name);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

const Tokenizer& SmolLM2() {
  static std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromJson(Fixture("smollm2_tokenizer.json"));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return *tok;
}

// The reference tokenizer's ids for 3,000 strings (tests/text/make_tokenizer_fixture.py):
// words, contractions, digits, whitespace runs, accents, scripts, emoji, code and
// special tokens inside text.
TEST(Tokenizer, EncodesAsTheReferenceTokenizerDoes) {
  auto cases = nlohmann::json::parse(Fixture("tokenizer_cases.json"));
  ASSERT_GE(cases["cases"].size(), 3000u);
  int wrong = 0;
  for (const auto& c : cases["cases"]) {
    const std::string text = c["text"];
    auto ids = SmolLM2().Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    auto want = c["ids"].get<std::vector<int32_t>>();
    if (*ids != want && ++wrong <= 10) {
      ADD_FAILURE() << "\"" << text << "\": " << testing::PrintToString(*ids) << " but the reference gives "
                    << testing::PrintToString(want);
    }
    EXPECT_EQ(SmolLM2().Decode(want), text);
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Tokenizer, SplitsSpecialTokensOutOfTextAndDecodesThemAsText) {
  const Tokenizer& t = SmolLM2();
  int32_t start = t.Find("<|im_start|>"), end = t.Find("<|im_end|>");
  ASSERT_GE(start, 0);
  ASSERT_TRUE(t.IsSpecial(start));
  auto ids = t.Encode("<|im_start|>user\nhi<|im_end|>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), start);
  EXPECT_EQ(ids->back(), end);
  EXPECT_EQ(t.Decode(*ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_FALSE(t.IsSpecial(t.Find("user")));
  // Read as plain text when asked: no special token comes out.
  auto plain = t.Encode("<|im_start|>user", /*special=*/false);
  ASSERT_TRUE(plain.ok());
  for (int32_t id : *plain) EXPECT_FALSE(t.IsSpecial(id)) << id;
  EXPECT_EQ(t.Decode(*plain), "<|im_start|>user");
}

TEST(Tokenizer, RefusesTextThatIsNotUtf8) {
  for (std::string bad : {std::string("caf\xC3"), std::string("\xC0\xAF"), std::string("\xED\xA0\x80"),
                          std::string("\xF4\x90\x80\x80"), std::string("ok\xFFok")}) {
    auto ids = SmolLM2().Encode(bad);
    ASSERT_FALSE(ids.ok());
    EXPECT_NE(ids.status().message().find("UTF-8"), std::string::npos);
  }
}

TEST(Tokenizer, EncodesLongRunsWithoutBlowingUp) {
  // One piece of 200,000 letters: the merges run in O(n log n).
  std::string s(200000, 'a');
  auto ids = SmolLM2().Encode(s);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(SmolLM2().Decode(*ids), s);
  EXPECT_LT(ids->size(), s.size() / 2);
}

TEST(Tokenizer, NamesWhatIsWrongInADescription) {
  auto err = [](const std::string& j) {
    auto t = Tokenizer::FromJson(j);
    EXPECT_FALSE(t.ok()) << j;
    return t.ok() ? std::string() : t.status().message();
  };
  EXPECT_NE(err("[]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(err(R"({"type":"unigram"})").find("byte_level_bpe"), std::string::npos);
  EXPECT_NE(
      err(R"({"type":"byte_level_bpe","tokens":["a"],"merges":[]})").find("not a byte-level vocabulary"),
      std::string::npos);
  // A full byte alphabet, then faults in the merges and patterns.
  auto full = nlohmann::json::parse(Fixture("smollm2_tokenizer.json"));
  auto with = [&](const char* key, nlohmann::json v) {
    auto j = full;
    j[key] = std::move(v);
    return err(j.dump());
  };
  EXPECT_NE(with("merges", {"a"}).find("merge 0"), std::string::npos);
  EXPECT_NE(with("merges", {"zzzq yyyq"}).find("names a token"), std::string::npos);
  EXPECT_NE(with("pre_tokenizer", {"(unclosed"}).find("does not compile"), std::string::npos);
  EXPECT_NE(with("special", {-1}).find("outside the vocabulary"), std::string::npos);
}

TEST(Utf8Stream, HoldsAHalfCharacterUntilItIsWhole) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("a\xF0\x9F"), "a");
  EXPECT_EQ(s.Push("\x99"), "");
  EXPECT_EQ(s.Push("\x82!"), "\xF0\x9F\x99\x82!");
  EXPECT_EQ(s.Push("\xFF"), "\xEF\xBF\xBD");  // never valid: replaced at once
  EXPECT_EQ(s.Push("\xE2\x82"
                   "A"),
            "\xEF\xBF\xBD"
            "A");  // one U+FFFD for a cut-off character, as Python decodes it
  EXPECT_EQ(s.Push("\xE2\x82"), "");
  EXPECT_EQ(s.Flush(), "\xEF\xBF\xBD");  // cut off at the end
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8, ValidatesAsTheStandardSays) {
  EXPECT_TRUE(ValidUtf8(""));
  EXPECT_TRUE(ValidUtf8("h\xC3\xA9llo \xF0\x9F\x99\x82"));
  EXPECT_FALSE(ValidUtf8("\xE0\x80\x80"));  // overlong
  EXPECT_FALSE(ValidUtf8("\x80"));
}

}  // namespace
}  // namespace aotid::text
