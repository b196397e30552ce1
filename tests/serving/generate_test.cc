#include "serving/generate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/fs.h"

namespace aotid::serving {
namespace {

// A generate spec of a 32-token context with SmolLM2's tokenizer.
text::GenerateSpec Spec() {
  auto tok = nlohmann::json::parse(
      fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/smollm2_tokenizer.json").value());
  nlohmann::json g = {{"kind", "causal_lm"},
                      {"max_seq_len", 32},
                      {"max_prefill", 32},
                      {"eos_token_ids", {2}},
                      {"tokenizer", tok}};
  return text::GenerateSpec::FromJson(g.dump()).value();
}

// The compiled model that spec runs.
model::ModelSpec ModelOf() {
  model::ModelSpec model;
  model::TensorSpec tokens{
      "tokens", model::DType::kInt64, {1, -1}, {std::nullopt, model::DimRange{"s", 1, 32}}};
  model::TensorSpec pos{"input_pos", model::DType::kInt64, {-1}, {model::DimRange{"s", 1, 32}}};
  model.inputs = {tokens, pos};
  model.outputs = {{"logits", model::DType::kFloat32, {1, 49152}}};
  return model;
}

std::shared_ptr<Generator> MakeGenerator() {
  StatusOr<text::GenerateSpec> spec = Spec();
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto gen = Generator::Create(std::move(spec).value(), ModelOf());
  EXPECT_TRUE(gen.ok()) << gen.status().ToString();
  return gen.ok() ? *gen : nullptr;
}

// A language model that says what it is told: each call's logits make the
// next token of `answer` the likeliest, then the end token.
class ScriptedModel final : public model::LoadedModel {
 public:
  explicit ScriptedModel(std::vector<int32_t> answer) : spec_(ModelOf()), answer_(std::move(answer)) {}
  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>&,
                                                 const model::RunContext&) override {
    std::vector<float> logits(49152, 0.0f);
    logits[calls_ < answer_.size() ? static_cast<size_t>(answer_[calls_]) : 2] = 10;  // 2: the end
    ++calls_;
    model::HostTensor t{"logits", model::DType::kFloat32, {1, 49152}, {}};
    t.data.resize(logits.size() * sizeof(float));
    std::memcpy(t.data.data(), logits.data(), t.data.size());
    return std::vector<model::HostTensor>{std::move(t)};
  }

 private:
  model::ModelSpec spec_;
  std::string device_ = "cpu";
  std::vector<int32_t> answer_;
  size_t calls_ = 0;
};

// The stop string that ends an answer is cut from its text, and its tokens
// from its logprobs, whole and streamed: a client must not see a token that
// is not in the text. A token whose text is partly shown keeps its logprob,
// and text held back that turns out not to be a stop string brings its
// tokens' logprobs with it, each before its text.
TEST(Generator, TheTokensOfTheStopStringThatEndsAnAnswerHaveNoLogprobs) {
  auto gen = MakeGenerator();
  ASSERT_NE(gen, nullptr);
  const text::Tokenizer& tok = *gen->spec().tokenizer;
  std::vector<int32_t> answer = tok.Encode("The cat sat on the mat").value();
  std::vector<std::string> pieces;
  for (int32_t id : answer) pieces.push_back(tok.Bytes(id));
  ASSERT_EQ(pieces, (std::vector<std::string>{"The", " cat", " sat", " on", " the", " mat"}));
  struct Case {
    std::vector<std::string> stop;
    std::string text;
    size_t tokens;  // those of `answer` with a logprob
  } cases[] = {
      {{"at on"}, "The cat s", 3},                     // " sat" shows its "s"; " on" is in the stop string
      {{" on the"}, "The cat sat", 3},                 // the stop string's tokens, whole
      {{" on the rug"}, "The cat sat on the mat", 6},  // held back, then shown
  };
  for (const Case& c : cases) {
    GenerateRequest req;
    req.sampling.temperature = 0;
    req.top_logprobs = 1;
    req.stop = c.stop;
    auto model = std::make_shared<ScriptedModel>(answer);
    std::vector<int32_t> streamed;
    std::string events;  // "t" for a token's logprob, the text as it comes
    auto g = gen->Run(
        model, req, {1},
        [&](std::string_view piece) {
          events += "[" + std::string(piece) + "]";
          return true;
        },
        nullptr, nullptr,
        [&](const text::TokenLogprob& t) {
          streamed.push_back(t.id);
          events += "t";
        });
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->text, c.text) << c.stop[0];
    EXPECT_EQ(g->finish_reason, "stop");
    const std::vector<int32_t> shown(answer.begin(), answer.begin() + static_cast<std::ptrdiff_t>(c.tokens));
    std::vector<int32_t> whole;
    for (const auto& t : g->logprobs) whole.push_back(t.id);
    EXPECT_EQ(whole, shown) << c.stop[0];
    EXPECT_EQ(streamed, shown) << c.stop[0];
    // Each token's logprob comes before the text that shows it.
    if (c.tokens == 6) EXPECT_EQ(events, "t[The]t[ cat]t[ sat]ttt[ on the mat]") << events;
  }
}

TEST(Generator, RefusesAModelThatDoesNotFitTheSpec) {
  model::ModelSpec model;
  model.inputs = {{"tokens", model::DType::kInt64, {1, -1}, {std::nullopt, model::DimRange{"s", 2, 32}}},
                  {"input_pos", model::DType::kInt64, {-1}}};
  model.outputs = {{"logits", model::DType::kFloat32, {1, 49152}}};
  auto gen = Generator::Create(Spec(), model);
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.status().message().find("one token a call"), std::string::npos);
  model.inputs[0].dims.clear();
  model.outputs[0].dtype = model::DType::kFloat16;
  gen = Generator::Create(Spec(), model);
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.status().message().find("FP32"), std::string::npos);
  // A tokenizer larger than the model's vocabulary: its ids would index the
  // embedding out of bounds (the runner aborted on them).
  model.outputs[0] = {"logits", model::DType::kFloat32, {1, 1000}};
  gen = Generator::Create(Spec(), model);
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.status().message().find("its tokenizer has 49152 tokens, its logits only 1000"),
            std::string::npos)
      << gen.status().message();
  model.outputs[0] = {"logits", model::DType::kFloat32, {1, 49152}};
  EXPECT_TRUE(Generator::Create(Spec(), model).ok());
}

TEST(GenerateRequest, ReadsParametersAndNamesWhatIsWrong) {
  auto gen = MakeGenerator();
  ASSERT_NE(gen, nullptr);
  auto r = ParseGenerateRequest(
      R"({"text_input":"hi","max_tokens":5,"parameters":{"temperature":0,"stop":["a","b"],"seed":7}})",
      gen->spec());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_TRUE(r->sampling.greedy());
  EXPECT_EQ(r->stop.size(), 2u);
  EXPECT_EQ(r->sampling.seed, 7u);
  auto err = [&](const char* body) {
    auto p = ParseGenerateRequest(body, gen->spec());
    return p.ok() ? std::string() : p.status().message();
  };
  EXPECT_NE(err(R"({"text_input":"x","max_tokens":0})").find("max_tokens"), std::string::npos);
  EXPECT_NE(err(R"({"text_input":"x","max_tokens":18446744073709551615})").find("from 1 to"),
            std::string::npos);
  EXPECT_NE(err(R"({"text_input":"x","top_k":-1})").find("from 0"), std::string::npos);
  EXPECT_TRUE(ParseGenerateRequest(R"({"text_input":"x","top_k":0,"max_tokens":1})", gen->spec()).ok());
  EXPECT_NE(err(R"({"text_input":"x","input_ids":[1]})").find("not several"), std::string::npos);
  EXPECT_EQ(err(R"({"text_input":"x","parameters":{"seed":1,"seed":2}})"),
            R"(the request body has the key "seed" twice in one object)");
  EXPECT_NE(err(R"({"messages":[]})").find("no chat template"), std::string::npos);
  EXPECT_NE(err(R"({"text_input":"x","parameters":{"stop":[1]}})").find("stop"), std::string::npos);
  // Where it stopped, as /infer says it (not the parser's internals).
  EXPECT_EQ(err("{\"text_input\":\"x\""),
            "the request body is not valid JSON at byte 17 (near '\"text_input\":\"x\"'): syntax error while "
            "parsing object - unexpected end of input; expected '}'");
  EXPECT_EQ(err("{\"text_input\":\"x\",}"),
            "the request body is not valid JSON at byte 18 (near 'text_input\":\"x\",}'): syntax error while "
            "parsing object key - unexpected '}'; expected string literal");
  // 16 MiB of '[' is refused at its 33rd byte by the depth /infer allows,
  // not built into a DOM (once 1.2 GB at peak, 1.06 GB kept).
  EXPECT_EQ(
      err(std::string(16 << 20, '[').c_str()),
      "the request body nests deeper than 32 levels at byte 32 (near '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[')");
  // A prompt far longer than the context is refused before it is tokenized.
  GenerateRequest big;
  big.prompt = {{std::string(1 << 20, 'a')}};
  auto p = gen->Prompt(big);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("context"), std::string::npos);
}

}  // namespace
}  // namespace aotid::serving
