#include "text/wordpiece.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "text/tokenizer.h"

namespace aotid::text {
namespace {

std::string Fixture(const std::string& name) {
  auto text = fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/" + name);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

const nlohmann::json& Cases() {
  static const nlohmann::json cases = nlohmann::json::parse(Fixture("wordpiece_cases.json"));
  return cases;
}

const Tokenizer& MiniLM() {
  static std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromJson(Fixture("minilm_tokenizer.json"));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return *tok;
}

// Compares the ids `tok` gives each case's text for the model with the
// reference's; reports the first few that differ.
void ExpectIdsAsReference(const Tokenizer& tok, const nlohmann::json& cases) {
  int wrong = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    auto ids = tok.EncodeForModel(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    auto want = c["ids"].get<std::vector<int32_t>>();
    if (*ids != want && ++wrong <= 10) {
      ADD_FAILURE() << testing::PrintToString(text) << ": " << testing::PrintToString(*ids)
                    << " but the reference gives " << testing::PrintToString(want);
    }
  }
  EXPECT_EQ(wrong, 0);
}

// all-MiniLM-L6-v2's tokenizer.json against the reference tokenizer on
// 3,000 strings (tests/text/make_wordpiece_fixture.py): mixed case,
// accents and combining marks, CJK, Hangul, emoji, controls and odd
// spaces, punctuation, words over 100 characters, pieces the vocabulary
// lacks, special tokens inside text, and random code points of every
// block the character tables cover.
TEST(WordPiece, EncodesAsTheReferenceTokenizerDoes) {
  ASSERT_EQ(MiniLM().kind(), Tokenizer::Kind::kWordPiece);
  const auto& cases = Cases()["cases"];
  ASSERT_GE(cases.size(), 3000u);
  ExpectIdsAsReference(MiniLM(), cases);
}

TEST(WordPiece, DecodesAsTheReferenceTokenizerDoes) {
  int decoded = 0;
  for (const auto& c : Cases()["cases"]) {
    if (!c.contains("decoded")) continue;
    ++decoded;
    EXPECT_EQ(MiniLM().Decode(c["ids"].get<std::vector<int32_t>>()), c["decoded"].get<std::string>())
        << c["text"];
  }
  EXPECT_GE(decoded, 1000);
}

// The same vocabulary with other normalizer settings, the reference's ids
// for each: accents kept while lower-casing, a cased model (strip_accents
// not given follows lowercase), and accents stripped with cleaning and CJK
// spacing off.
TEST(WordPiece, FollowsTheNormalizerSettings) {
  for (const auto& v : Cases()["variants"]) {
    auto spec = nlohmann::json::parse(Fixture("minilm_tokenizer.json"));
    spec["normalizer"] = v["normalizer"];
    auto tok = Tokenizer::FromJson(spec.dump());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    SCOPED_TRACE(v["normalizer"].dump());
    ExpectIdsAsReference(**tok, v["cases"]);
  }
}

// Each normalizer step on its own against the reference's: none of them
// can be left out, or done when it is off, without a case failing here.
TEST(WordPiece, EachNormalizerStepAsTheReference) {
  ASSERT_EQ(Cases()["steps"].size(), 4u);
  for (const auto& s : Cases()["steps"]) {
    const std::string step = s["step"];
    BertNormalizer n{.clean_text = step == "clean_text",
                     .handle_chinese_chars = step == "handle_chinese_chars",
                     .strip_accents = step == "strip_accents",
                     .lowercase = step == "lowercase"};
    int changed = 0, wrong = 0;
    for (const auto& c : s["cases"]) {
      const std::string text = c[0], want = c[1];
      if (want != text) ++changed;
      std::string got = n.Normalize(text);
      if (got != want && ++wrong <= 5) {
        ADD_FAILURE() << step << " of " << testing::PrintToString(text) << ": " << testing::PrintToString(got)
                      << " but the reference gives " << testing::PrintToString(want);
      }
    }
    EXPECT_EQ(wrong, 0) << step;
    EXPECT_GE(changed, 20) << step << ": too few cases that the step changes";
  }
}

TEST(WordPiece, StepsByExample) {
  BertNormalizer all;
  EXPECT_EQ(all.Normalize("Héllo\tWörld\x01!"), "hello world!");
  EXPECT_EQ(all.Normalize("ab中文"), "ab 中  文 ");
  // İ: stripped to I, then lower-cased; lower-cased alone, it is i and a combining dot.
  EXPECT_EQ(all.Normalize("\xC4\xB0"), "i");
  EXPECT_EQ(BertNormalizer({.clean_text = false, .handle_chinese_chars = false, .strip_accents = false})
                .Normalize("\xC4\xB0"),
            "i\xCC\x87");
  EXPECT_EQ(all.Normalize("한"), "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");  // Hangul decomposes to jamo
  auto words = BertPreTokenize("don't  stop\u00a0now!?");
  EXPECT_EQ(words, (std::vector<std::string_view>{"don", "'", "t", "stop", "now", "!", "?"}));
  const Tokenizer& t = MiniLM();
  auto ids = t.EncodeForModel("Unaffable [SEP] x");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), t.Find("[CLS]"));
  EXPECT_EQ(ids->back(), t.Find("[SEP]"));
  EXPECT_EQ(t.Decode(*ids), "[CLS] unaffable [SEP] x [SEP]");
  // A word over max_input_chars_per_word (100) is one [UNK].
  auto long_word = t.Encode(std::string(101, 'a'));
  ASSERT_TRUE(long_word.ok());
  EXPECT_EQ(*long_word, std::vector<int32_t>{t.Find("[UNK]")});
  auto plain = t.Encode("[SEP]", /*special=*/false);
  ASSERT_TRUE(plain.ok());
  for (int32_t id : *plain) EXPECT_FALSE(t.IsSpecial(id));
  EXPECT_EQ(t.Bytes(t.Find("##ing")), "ing");
}

TEST(WordPiece, EncodesLongWordsWithoutBlowingUp) {
  // One word of 200,000 letters, where the tokenizer.json allows words of a
  // million: the search for each piece is bounded by the longest token.
  auto spec = nlohmann::json::parse(Fixture("minilm_tokenizer.json"));
  spec["model"]["max_input_chars_per_word"] = 1000000;
  auto tok = Tokenizer::FromJson(spec.dump());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::string word(200000, 'a');
  auto ids = (*tok)->Encode(word);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*tok)->Decode(*ids), word);
}

// Every case's text, one after the other: every kind of character next
// to every other.
std::string AllCaseTexts() {
  std::string all;
  for (const auto& c : Cases()["cases"]) all += c["text"].get<std::string>();
  return all;
}

// The words BertEncode hands on for `text`, a stretch of `stretch` bytes
// at first; *went gets how much of the text it went through.
std::vector<std::string> Words(std::string_view text, const BertNormalizer* n, size_t stretch,
                               size_t limit = SIZE_MAX, size_t* went = nullptr) {
  std::vector<std::string> words;
  std::vector<int32_t> ids;
  auto encode = [&](std::string_view w, std::vector<int32_t>* out) {
    words.emplace_back(w);
    out->push_back(0);
  };
  size_t through = BertEncode(text, n, /*pre_tokenize=*/true, encode, limit, &ids, stretch);
  if (went != nullptr) *went = through;
  return words;
}

// Cut into stretches of any length, text normalizes and splits into the
// words it does whole: cuts fall only where no word spans them and no
// normalizing step looks across, whatever the normalizer's settings.
TEST(WordPiece, ATextDoneAStretchAtATimeGivesTheWordsOfTheWhole) {
  const std::vector<BertNormalizer> normalizers = {
      {},
      {.clean_text = true, .handle_chinese_chars = false, .strip_accents = false, .lowercase = false},
      {.clean_text = false, .handle_chinese_chars = true, .strip_accents = false, .lowercase = false},
      {.clean_text = false, .handle_chinese_chars = false, .strip_accents = true, .lowercase = false},
      {.clean_text = false, .handle_chinese_chars = false, .strip_accents = false, .lowercase = true},
  };
  const std::string all = AllCaseTexts();
  for (const BertNormalizer* n : {static_cast<const BertNormalizer*>(nullptr), &normalizers[0],
                                  &normalizers[1], &normalizers[2], &normalizers[3], &normalizers[4]}) {
    const auto whole = Words(all, n, SIZE_MAX);
    ASSERT_GT(whole.size(), 5000u);
    for (size_t stretch : {1, 2, 3, 5, 8, 13, 100, 1000}) {
      SCOPED_TRACE(testing::Message()
                   << "normalizer " << (n ? n - normalizers.data() : -1) << ", stretch " << stretch);
      EXPECT_EQ(Words(all, n, stretch), whole);
    }
  }
}

// With a limit, the ids are the first of the whole text's, and a text of
// megabytes is gone through only as far as those take.
TEST(WordPiece, StopsOnceItHasTheTokensAskedFor) {
  const std::string all = AllCaseTexts();
  auto whole = MiniLM().Encode(all);
  ASSERT_TRUE(whole.ok());
  ASSERT_GT(whole->size(), 10000u);
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{254}, size_t{5000}, whole->size() - 1,
                   whole->size(), whole->size() + 1}) {
    auto first = MiniLM().EncodeFirst(all, n);
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(*first, std::vector<int32_t>(whole->begin(), whole->begin() + static_cast<ptrdiff_t>(
                                                                                std::min(n, whole->size()))))
        << n;
  }

  std::string huge;
  while (huge.size() < (8u << 20)) huge += all;
  BertNormalizer n;
  size_t went = 0;
  auto words = Words(huge, &n, 4096, 254, &went);
  auto want = Words(all, &n, SIZE_MAX);
  want.resize(254);
  EXPECT_EQ(words, want);
  EXPECT_LT(went, 64u << 10) << "of " << huge.size() << " bytes, for 254 words";
  Words(all, &n, 4096, SIZE_MAX, &went);
  EXPECT_EQ(went, all.size());
}

TEST(WordPiece, RefusesWhatItDoesNotImplementByName) {
  auto err = [](const nlohmann::json& j) {
    auto t = Tokenizer::FromJson(j.dump());
    EXPECT_FALSE(t.ok()) << j.dump().substr(0, 200);
    return t.ok() ? std::string() : t.status().message();
  };
  const auto base = nlohmann::json::parse(Fixture("minilm_tokenizer.json"));
  auto with = [&](const std::string& pointer, nlohmann::json v) {
    auto j = base;
    j[nlohmann::json::json_pointer(pointer)] = std::move(v);
    return err(j);
  };
  EXPECT_NE(with("/model/type", "Unigram").find("Unigram"), std::string::npos);
  EXPECT_NE(with("/normalizer", {{"type", "NFKC"}}).find("NFKC"), std::string::npos);
  EXPECT_NE(with("/pre_tokenizer", {{"type", "Whitespace"}}).find("Whitespace"), std::string::npos);
  EXPECT_NE(with("/post_processor", {{"type", "RobertaProcessing"}}).find("RobertaProcessing"),
            std::string::npos);
  EXPECT_NE(with("/decoder", {{"type", "ByteLevel"}}).find("ByteLevel"), std::string::npos);
  EXPECT_NE(with("/added_tokens/0/lstrip", true).find("lstrip"), std::string::npos);
  EXPECT_NE(with("/added_tokens/0/normalized", true).find("normalized"), std::string::npos);
  EXPECT_NE(with("/added_tokens/0/special", false).find("not special"), std::string::npos);
  EXPECT_NE(with("/normalizer/lowercase", "yes").find("normalizer.lowercase"), std::string::npos);
  EXPECT_NE(with("/model/unk_token", "<unk>").find("unk_token"), std::string::npos);
  EXPECT_NE(with("/model/vocab/the", 0).find("\"the\""), std::string::npos);
}

}  // namespace
}  // namespace aotid::text
