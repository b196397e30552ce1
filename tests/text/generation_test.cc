#include "text/generation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "base/fs.h"

namespace aotid::text {
namespace {

ChatTemplate ChatMl() {
  ChatTemplate c;
  for (const char* r : {"system", "user", "assistant"})
    c.roles[r] = {std::string("<s>") + r + "\n", "</s>\n"};
  c.generation_prompt = "<s>assistant\n";
  c.default_preamble = "<s>system\nBe brief.</s>\n";
  return c;
}

TEST(Chat, AddsTheDefaultSystemPromptOnlyWhenThereIsNone) {
  auto p = ApplyChat(ChatMl(), {{"user", "hi"}});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Joined(*p), "<s>system\nBe brief.</s>\n<s>user\nhi</s>\n<s>assistant\n");
  // The content's text is plain, the template's is not.
  ASSERT_EQ(p->size(), 5u);
  EXPECT_FALSE((*p)[2].special);
  EXPECT_TRUE((*p)[1].special);
  p = ApplyChat(ChatMl(), {{"system", "Be long."}, {"user", "hi"}, {"assistant", "yes"}, {"user", "and?"}});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(
      Joined(*p),
      "<s>system\nBe long.</s>\n<s>user\nhi</s>\n<s>assistant\nyes</s>\n<s>user\nand?</s>\n<s>assistant\n");
}

TEST(Chat, RefusesAnUnknownRoleAndNoMessages) {
  auto p = ApplyChat(ChatMl(), {{"tool", "x"}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("\"tool\""), std::string::npos);
  EXPECT_FALSE(ApplyChat(ChatMl(), {}).ok());
}

std::vector<float> Logits() {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>((i * 7919) % 1000) / 100.0f;
  return l;
}

TEST(Sampler, GreedyTakesTheFirstHighest) {
  std::vector<float> l = {1, 5, 2, 5, 0};
  Sampler s({.temperature = 0});
  EXPECT_EQ(s.Next(l.data(), 5), 1);
  Sampler k1({.temperature = 1.0, .top_k = 1});
  EXPECT_EQ(k1.Next(l.data(), 5), 1);
}

TEST(Sampler, ASeedRepeatsItsDrawsAndAnotherSeedDiffers) {
  auto l = Logits();
  auto draw = [&](uint64_t seed) {
    Sampler s({.temperature = 1.5, .top_k = 0, .top_p = 1.0, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.Next(l.data(), 1000));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, TopKAndTopPKeepOnlyTheMostLikely) {
  auto l = Logits();
  std::vector<int32_t> order(1000);
  for (int32_t i = 0; i < 1000; ++i) order[static_cast<size_t>(i)] = i;
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)]; });
  std::set<int32_t> top5(order.begin(), order.begin() + 5);
  Sampler k({.temperature = 5.0, .top_k = 5, .top_p = 1.0, .seed = 1});
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(k.Next(l.data(), 1000));
  EXPECT_EQ(seen, top5);  // all five drawn at a high temperature, nothing else
  // A nucleus so small that only the top token is in it.
  Sampler p({.temperature = 1.0, .top_k = 0, .top_p = 1e-9, .seed = 1});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(p.Next(l.data(), 1000), order[0]);
}

TEST(Sampler, PenaltiesLowerTheGeneratedTokensAsOpenAiDefinesThem) {
  std::vector<float> l = {5.0f, 4.5f, 0.0f};
  // Frequency: less count * penalty, so a repeated token falls behind.
  Sampler freq({.temperature = 0, .frequency_penalty = 0.3});
  EXPECT_EQ(freq.Next(l.data(), 3), 0);
  freq.Accept(0);
  EXPECT_EQ(freq.Next(l.data(), 3), 0);  // 4.7 > 4.5
  freq.Accept(0);
  EXPECT_EQ(freq.Next(l.data(), 3), 1);  // 4.4 < 4.5
  // Presence: once, however often the token came.
  Sampler presence({.temperature = 0, .presence_penalty = 0.3});
  presence.Accept(0);
  presence.Accept(0);
  presence.Accept(0);
  EXPECT_EQ(presence.Next(l.data(), 3), 0);  // 4.7
  Sampler more({.temperature = 0, .presence_penalty = 0.6});
  more.Accept(0);
  EXPECT_EQ(more.Next(l.data(), 3), 1);  // 4.4
  // A negative penalty favours what was said.
  Sampler favour({.temperature = 0, .frequency_penalty = -1.0});
  favour.Accept(2);
  favour.Accept(2);
  favour.Accept(2);
  favour.Accept(2);
  favour.Accept(2);
  favour.Accept(2);
  EXPECT_EQ(favour.Next(l.data(), 3), 2);  // 6 > 5
  // No penalty: what was generated changes nothing.
  Sampler none({.temperature = 0});
  none.Accept(0);
  EXPECT_EQ(none.Next(l.data(), 3), 0);
}

TEST(Sampler, MinPDropsTokensBelowItsShareOfTheLikeliest) {
  // Relative to the likeliest: 1, e^-1 = 0.37, e^-1.5 = 0.22.
  std::vector<float> l = {0.0f, -1.0f, -1.5f};
  auto seen = [&](double min_p) {
    std::set<int32_t> got;
    Sampler s({.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = min_p, .seed = 3});
    for (int i = 0; i < 500; ++i) got.insert(s.Next(l.data(), 3));
    return got;
  };
  EXPECT_EQ(seen(0), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(seen(0.3), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(seen(0.5), (std::set<int32_t>{0}));
}

TEST(Logprobs, AreTheLogSoftmaxOfTheLogitsWithTheLikeliestFirst) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  const double z = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  TokenLogprob t = Logprobs(l.data(), 4, 2, 3);
  EXPECT_EQ(t.id, 2);
  EXPECT_NEAR(t.logprob, 2.0 - z, 1e-9);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, 1);  // equal logits by id
  EXPECT_EQ(t.top[1].first, 3);
  EXPECT_EQ(t.top[2].first, 2);
  EXPECT_NEAR(t.top[0].second, 3.0 - z, 1e-9);
  EXPECT_TRUE(Logprobs(l.data(), 4, 0, 0).top.empty());
  EXPECT_EQ(Logprobs(l.data(), 4, 0, 10).top.size(), 4u);  // no more than the vocabulary
}

TEST(StopMatcher, HoldsBackWhatMayBeAStopAndCutsAtIt) {
  StopMatcher m({"END", "\n\n"});
  bool stopped = false;
  EXPECT_EQ(m.Push("hello E", &stopped), "hello ");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.Push("N", &stopped), "");
  EXPECT_EQ(m.Push("x", &stopped), "ENx");  // not a stop after all
  EXPECT_EQ(m.Push(" more\n", &stopped), " more");
  EXPECT_EQ(m.Push("\nrest", &stopped), "");
  EXPECT_TRUE(stopped);
  StopMatcher none({});
  EXPECT_EQ(none.Push("abc", &stopped), "abc");
  StopMatcher tail({"STOP"});
  bool s2 = false;
  EXPECT_EQ(tail.Push("ab ST", &s2), "ab ");
  EXPECT_EQ(tail.Flush(), "ST");
}

TEST(GenerateSpec, ReadsTheExportersSectionAndNamesWhatIsWrong) {
  auto tok = nlohmann::json::parse(
      fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/smollm2_tokenizer.json").value());
  nlohmann::json g = {
      {"kind", "causal_lm"},
      {"max_seq_len", 64},
      {"max_prefill", 64},
      {"eos_token_ids", {2}},
      {"tokenizer", tok},
      {"chat", {{"user", {{"prefix", "U:"}, {"suffix", "\n"}}}, {"generation_prompt", "A:"}}}};
  auto spec = GenerateSpec::FromJson(g.dump());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->max_seq_len, 64);
  EXPECT_EQ(spec->eos_ids, std::vector<int32_t>{2});
  ASSERT_TRUE(spec->chat.has_value());
  EXPECT_EQ(spec->chat->generation_prompt, "A:");
  auto bad = [&](const char* key, nlohmann::json v) {
    auto j = g;
    j[key] = std::move(v);
    auto s = GenerateSpec::FromJson(j.dump());
    return s.ok() ? std::string() : s.status().message();
  };
  EXPECT_NE(bad("kind", "seq2seq").find("causal_lm"), std::string::npos);
  EXPECT_NE(bad("max_prefill", 65).find("max_prefill"), std::string::npos);
  EXPECT_NE(bad("eos_token_ids", {49152}).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(bad("tokenizer", 1).find("tokenizer"), std::string::npos);
  auto wordpiece = nlohmann::json::parse(
      fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/minilm_tokenizer.json").value());
  EXPECT_NE(bad("tokenizer", wordpiece).find("needs a byte-level BPE tokenizer"), std::string::npos)
      << bad("tokenizer", wordpiece);
  // Values of another type than the reader takes for granted are refused,
  // not thrown out of the daemon that loads the package.
  EXPECT_NE(bad("kind", 1).find("generate.json has a value of an unexpected type"), std::string::npos);
  auto typed_tokenizer = tok;
  typed_tokenizer["type"] = 5;
  EXPECT_NE(bad("tokenizer", typed_tokenizer).find("the tokenizer has a value of an unexpected type"),
            std::string::npos);
}

}  // namespace
}  // namespace aotid::text
