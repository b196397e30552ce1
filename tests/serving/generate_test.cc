#include "serving/generate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
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

std::shared_ptr<Generator> MakeGenerator() {
  StatusOr<text::GenerateSpec> spec = Spec();
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  model::ModelSpec model;
  model::TensorSpec tokens{
      "tokens", model::DType::kInt64, {1, -1}, {std::nullopt, model::DimRange{"s", 1, 32}}};
  model::TensorSpec pos{"input_pos", model::DType::kInt64, {-1}, {model::DimRange{"s", 1, 32}}};
  model.inputs = {tokens, pos};
  model.outputs = {{"logits", model::DType::kFloat32, {1, 49152}}};
  auto gen = Generator::Create(std::move(spec).value(), model);
  EXPECT_TRUE(gen.ok()) << gen.status().ToString();
  return gen.ok() ? *gen : nullptr;
}

TEST(Generator, TurnsGoInOrderAndPastTheWaitingCapTheAnswerIsBusy) {
  auto gen = MakeGenerator();
  ASSERT_NE(gen, nullptr);
  ASSERT_TRUE(gen->Acquire(nullptr).ok());
  std::vector<int> order;
  std::mutex order_mu;
  std::vector<std::thread> waiters;
  for (int i = 0; i < Generator::kMaxWaiting; ++i) {
    // One at a time, so that their tickets are in this order.
    waiters.emplace_back([&, i] {
      ASSERT_TRUE(gen->Acquire(nullptr).ok());
      {
        std::lock_guard<std::mutex> l(order_mu);
        order.push_back(i);
      }
      gen->Release();
    });
    ASSERT_TRUE(gen->TEST_AwaitWaiting(i + 1));
  }
  // The cap is reached: the next is refused at once, and a leaving waiter frees a place.
  Status busy = gen->Acquire(nullptr);
  EXPECT_EQ(busy.code(), StatusCode::kUnavailable);
  EXPECT_NE(busy.message().find("one sequence at a time"), std::string::npos);
  std::atomic<bool> leave{false};
  std::thread quitter;
  gen->Release();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(gen->waiting(), 0);
  // A waiter that gives up is skipped: the one behind it gets the turn.
  ASSERT_TRUE(gen->Acquire(nullptr).ok());
  quitter = std::thread(
      [&] { EXPECT_EQ(gen->Acquire([&] { return leave.load(); }).code(), StatusCode::kCancelled); });
  ASSERT_TRUE(gen->TEST_AwaitWaiting(1));
  std::atomic<bool> got{false};
  std::thread behind([&] {
    ASSERT_TRUE(gen->Acquire(nullptr).ok());
    got = true;
    gen->Release();
  });
  ASSERT_TRUE(gen->TEST_AwaitWaiting(2));
  leave = true;
  quitter.join();
  gen->Release();
  behind.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(gen->waiting(), 0);
}

// A waiter asks whether its client is gone without holding the turn's
// lock: the question may be a syscall, and here it even asks the gate
// itself (which would deadlock under the lock).
TEST(Generator, AWaitersCancelCheckRunsOutsideTheGatesLock) {
  auto gen = MakeGenerator();
  ASSERT_NE(gen, nullptr);
  ASSERT_TRUE(gen->Acquire(nullptr).ok());
  std::mutex mu;
  std::condition_variable asked;
  int checks = 0;
  bool leave = false;
  std::thread waiter([&] {
    Status s = gen->Acquire([&] {
      int waiting = gen->waiting();  // takes the gate's lock
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(waiting, 1);
      ++checks;
      asked.notify_all();
      return leave;
    });
    EXPECT_EQ(s.code(), StatusCode::kCancelled);
  });
  std::unique_lock<std::mutex> lock(mu);
  if (!asked.wait_for(lock, std::chrono::seconds(10), [&] { return checks >= 2; })) {
    waiter.detach();  // stuck in its own question: nothing will end it
    FAIL() << "the waiter's cancel check never returned";
  }
  leave = true;
  lock.unlock();
  waiter.join();
  gen->Release();
  EXPECT_EQ(gen->waiting(), 0);
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
