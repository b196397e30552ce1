// The generator's scheduler (continuous batching) against a model whose
// answers it cannot fake: SlotModel's next token is a function of all its
// sequence's slot holds, so a row fed the wrong slot, position or token, a
// prefix reused that the slot does not hold, or a step that skipped a
// sequence changes the tokens. Each sequence's answer must equal the one
// it gets alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/fs.h"
#include "serving/generate.h"

namespace aotid::serving {
namespace {

constexpr int kVocab = 49152;  // SmolLM2's tokenizer
constexpr int64_t kContext = 128;

text::GenerateSpec Spec(int slots, int64_t max_prefill) {
  auto tok = nlohmann::json::parse(
      fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/smollm2_tokenizer.json").value());
  nlohmann::json g = {{"kind", "causal_lm"},  {"max_seq_len", kContext}, {"max_prefill", max_prefill},
                      {"eos_token_ids", {2}}, {"tokenizer", tok},        {"max_sequences", slots}};
  if (slots > 1) g["slots_input"] = "slots";
  return text::GenerateSpec::FromJson(g.dump()).value();
}

// The compiled model's inputs and outputs: tokens[B, T], input_pos[B, T],
// slots[B] -> logits[B, vocab]; or, for one slot, tokens[1, T],
// input_pos[T] -> logits[1, vocab].
model::ModelSpec IoOf(int slots, int64_t max_prefill) {
  model::ModelSpec io;
  model::DimRange seq{"seq", 1, max_prefill};
  if (slots == 1) {
    io.inputs = {{"tokens", model::DType::kInt64, {1, -1}, {std::nullopt, seq}},
                 {"input_pos", model::DType::kInt64, {-1}, {seq}}};
    io.outputs = {{"logits", model::DType::kFloat32, {1, kVocab}}};
    return io;
  }
  model::DimRange batch{"batch", 1, slots};
  io.inputs = {{"tokens", model::DType::kInt64, {-1, -1}, {batch, seq}},
               {"input_pos", model::DType::kInt64, {-1, -1}, {batch, seq}},
               {"slots", model::DType::kInt64, {-1}, {batch}}};
  io.outputs = {{"logits", model::DType::kFloat32, {-1, kVocab}}};
  return io;
}

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

// Logits from a sequence's history: a few hundred tokens with values that
// depend on every token of it (so that sampling has choices to make), the
// rest far below. Tokens 100..611: plain text in SmolLM2's tokenizer, never
// the end token.
void LogitsOf(const std::vector<int32_t>& history, float* out) {
  uint64_t h = 1469598103934665603ULL;
  for (int32_t t : history) h = Mix(h, static_cast<uint64_t>(t));
  std::fill(out, out + kVocab, -30.0f);
  for (int j = 0; j < 512; ++j) {
    out[100 + j] = static_cast<float>(Mix(h, static_cast<uint64_t>(j)) % 1000) / 100.0f;
  }
}

// What the scheduler may not fake: a model with a cache of `slots`
// sequences whose logits are LogitsOf what the row's slot holds at
// positions 0..p, p the row's last position.
class SlotModel final : public model::LoadedModel {
 public:
  struct Call {
    int64_t rows, width;
    std::vector<int64_t> slots;
  };
  SlotModel(int slots, int64_t max_prefill)
      : io_(IoOf(slots, max_prefill)),
        cache_(static_cast<size_t>(slots), std::vector<int32_t>(kContext, -1)) {}
  const model::ModelSpec& spec() const override { return io_; }
  const std::string& device() const override { return device_; }

  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>& in,
                                                 const model::RunContext&) override {
    ++entered_;
    {
      std::unique_lock<std::mutex> lock(mu_);
      paused_cv_.wait(lock, [&] { return !paused_; });
    }
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    const bool slotted = in.size() == 3;
    auto i64 = [](const model::HostTensor& t) { return reinterpret_cast<const int64_t*>(t.data.data()); };
    const int64_t rows = in[0].shape[0], width = in[0].shape[1];
    const int64_t* tokens = i64(in[0]);
    const int64_t* pos = i64(in[1]);
    std::vector<float> logits(static_cast<size_t>(rows) * kVocab);
    Call call{rows, width, {}};
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t slot = slotted ? i64(in[2])[b] : 0;
      call.slots.push_back(slot);
      auto& held = cache_.at(static_cast<size_t>(slot));
      int64_t last = -1;
      for (int64_t t = 0; t < width; ++t) {
        const int64_t p = pos[slotted ? b * width + t : t];
        if (p < 0 || p >= kContext) return InvalidArgument("position out of range");
        held[static_cast<size_t>(p)] = static_cast<int32_t>(tokens[b * width + t]);
        last = p;
      }
      std::vector<int32_t> seen(held.begin(), held.begin() + last + 1);
      if (std::count(seen.begin(), seen.end(), -1) > 0) return InvalidArgument("a position never written");
      LogitsOf(seen, logits.data() + b * kVocab);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back(call);
    }
    model::HostTensor t{"logits", model::DType::kFloat32, {rows, kVocab}, {}};
    t.data.resize(logits.size() * sizeof(float));
    std::memcpy(t.data.data(), logits.data(), t.data.size());
    return std::vector<model::HostTensor>{std::move(t)};
  }

  void Pause(bool paused) {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = paused;
    paused_cv_.notify_all();
  }
  void set_delay_ms(int ms) { delay_ms_ = ms; }
  // A new runner: the cache is as the build made it (never written).
  void Restart() {
    for (auto& held : cache_) std::fill(held.begin(), held.end(), -1);
    ++epoch_;
  }
  int64_t state_epoch() const override { return epoch_; }
  int entered() const { return entered_; }
  std::vector<Call> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  model::ModelSpec io_;
  std::string device_ = "cpu";
  std::vector<std::vector<int32_t>> cache_;  // the scheduler's thread alone calls Infer
  std::mutex mu_;
  std::condition_variable paused_cv_;
  bool paused_ = false;
  std::atomic<int> delay_ms_{0};
  std::atomic<int> entered_{0};
  std::atomic<int64_t> epoch_{0};
  std::vector<Call> calls_;
};

// The greedy answer of `prompt`, computed here with no cache at all.
std::vector<int32_t> Greedy(std::vector<int32_t> history, int n) {
  std::vector<int32_t> out;
  std::vector<float> logits(kVocab);
  for (int i = 0; i < n; ++i) {
    LogitsOf(history, logits.data());
    auto next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    history.push_back(next);
  }
  return out;
}

std::vector<int32_t> PromptOf(int seed, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(100 + static_cast<int32_t>(Mix(seed, i) % 500));
  return p;
}

GenerateRequest Request(const std::vector<int32_t>& prompt, int max_tokens, double temperature = 0,
                        std::optional<uint64_t> seed = std::nullopt) {
  GenerateRequest r;
  r.has_ids = true;
  r.ids = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.ignore_eos = true;
  return r;
}

struct Fixture {
  Fixture(int slots, int64_t max_prefill = 64) : model(std::make_shared<SlotModel>(slots, max_prefill)) {
    auto g = Generator::Create(Spec(slots, max_prefill), model->spec());
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    gen = *g;
  }
  StatusOr<GenerateResult> Run(const GenerateRequest& r,
                               const std::function<bool(std::string_view)>& on_text = nullptr,
                               const std::function<bool()>& gone = nullptr) {
    return gen->Run(model, r, r.ids, on_text, gone);
  }
  std::shared_ptr<SlotModel> model;
  std::shared_ptr<Generator> gen;
};

// Until `n` requests are in a slot or waiting for one; false after 10 s.
::testing::AssertionResult AllIn(Fixture& f, int n) {
  GenerateStats s;
  for (int i = 0; i < 1000; ++i) {
    s = f.gen->Stats();
    if (s.active + s.waiting == n) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ::testing::AssertionFailure() << s.active << " active and " << s.waiting << " waiting, not " << n;
}

int64_t MostRows(const std::vector<SlotModel::Call>& calls) {
  int64_t most = 0;
  for (const auto& c : calls) most = std::max(most, c.rows);
  return most;
}

// Four sequences at once on four slots, greedy: each answer is its own
// alone, and the steps ran all four in one call.
TEST(Scheduler, ConcurrentSequencesEachGetTheAnswerTheyGetAlone) {
  Fixture f(4);
  f.model->Pause(true);  // the first prefill waits: the others join it
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(PromptOf(i, 5 + 7 * i));
  std::vector<GenerateResult> results(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      auto g = f.Run(Request(prompts[i], 24));
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      results[i] = *g;
    });
  }
  ASSERT_TRUE(AllIn(f, 4));
  f.model->Pause(false);
  for (auto& c : clients) c.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(results[i].ids, Greedy(prompts[i], 24)) << "sequence " << i;
    EXPECT_EQ(results[i].finish_reason, "length");
    EXPECT_EQ(results[i].cached_tokens, 0);
  }
  EXPECT_EQ(MostRows(f.model->calls()), 4);
  GenerateStats s = f.gen->Stats();
  EXPECT_EQ(s.slots, 4);
  EXPECT_EQ(s.active, 0);
  EXPECT_EQ(s.decode_tokens, 4u * 23);  // every token after each first came from a step
  EXPECT_LT(s.decode_steps, s.decode_tokens);
}

// Sampled with seeds: the same draws together as alone, one after another.
TEST(Scheduler, SeededSamplesTogetherEqualThemAlone) {
  std::vector<std::vector<int32_t>> alone;
  {
    Fixture f(4);
    for (int i = 0; i < 4; ++i) {
      auto g = f.Run(Request(PromptOf(10 + i, 9), 20, 1.0, 100 + i));
      ASSERT_TRUE(g.ok());
      alone.push_back(g->ids);
    }
    // A step of one sequence is a call of 4 rows all the same: a CPU
    // matrix product rounds by its row count, so every step has the same.
    for (const auto& c : f.model->calls()) {
      if (c.width != 1) continue;
      EXPECT_EQ(c.rows, 4);
      EXPECT_EQ(std::count(c.slots.begin(), c.slots.end(), c.slots[0]), 4);
    }
  }
  EXPECT_NE(alone[0], Greedy(PromptOf(10, 9), 20));  // sampling chose other tokens than greedy
  Fixture f(4);
  f.model->Pause(true);
  std::vector<std::vector<int32_t>> together(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      auto g = f.Run(Request(PromptOf(10 + i, 9), 20, 1.0, 100 + i));
      ASSERT_TRUE(g.ok());
      together[i] = g->ids;
    });
  }
  ASSERT_TRUE(AllIn(f, 4));
  f.model->Pause(false);
  for (auto& c : clients) c.join();
  EXPECT_EQ(together, alone);
}

// A request beyond the slots waits for one and then gets its own answer;
// past the waiting bound a request is refused at once, saying why.
TEST(Scheduler, ARequestBeyondTheSlotsWaitsItsTurnAndPastTheBoundIsBusy) {
  Fixture f(2);
  f.model->Pause(true);
  const int bound = 2 * Generator::kMaxWaitingPerSlot;
  std::vector<std::thread> clients;
  std::vector<std::vector<int32_t>> ids(1 + bound);
  for (int i = 0; i < 1 + bound; ++i) {
    clients.emplace_back([&, i] {
      auto g = f.Run(Request(PromptOf(20 + i, 6), 8));
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      ids[i] = g->ids;
    });
    ASSERT_TRUE(AllIn(f, i + 1));
    // The first one's prompt holds the model: the rest wait, in order.
    for (int k = 0; i == 0 && k < 1000 && f.model->entered() == 0; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_EQ(f.gen->waiting(), bound);
  auto busy = f.gen->Start(f.model, Request(PromptOf(99, 6), 8), PromptOf(99, 6), nullptr);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(busy.status().message().find("its 2 sequence slots are in use and 8 requests already wait"),
            std::string::npos)
      << busy.status().message();
  EXPECT_EQ(f.gen->Admit().code(), StatusCode::kUnavailable);
  f.model->Pause(false);
  for (auto& c : clients) c.join();
  for (int i = 0; i < 1 + bound; ++i) EXPECT_EQ(ids[i], Greedy(PromptOf(20 + i, 6), 8)) << i;
  EXPECT_TRUE(f.gen->Admit().ok());
}

// A client that leaves mid-answer frees its slot at once: the request
// waiting for one gets it while the other sequence goes on, undisturbed.
TEST(Scheduler, AClientThatLeavesFreesItsSlotAndTheOthersGoOn) {
  Fixture f(2);
  f.model->set_delay_ms(1);
  f.model->Pause(true);  // all three are in before any token
  std::atomic<bool> b_done{false}, c_done_first{false};
  std::thread b([&] {
    auto g = f.Run(Request(PromptOf(31, 6), 80));
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->ids, Greedy(PromptOf(31, 6), 80));
    b_done = true;
  });
  int pieces = 0;
  std::thread a([&] {
    auto g = f.Run(Request(PromptOf(30, 6), 80), [&](std::string_view) { return ++pieces < 3; });
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->finish_reason, "cancelled");
    EXPECT_LT(g->ids.size(), 80u);
  });
  ASSERT_TRUE(AllIn(f, 2));
  std::thread c([&] {
    auto g = f.Run(Request(PromptOf(32, 6), 6));
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->ids, Greedy(PromptOf(32, 6), 6));
    c_done_first = !b_done;
  });
  ASSERT_TRUE(AllIn(f, 3));
  f.model->Pause(false);
  a.join();
  c.join();
  b.join();
  EXPECT_TRUE(c_done_first) << "the waiting request got no slot until the other sequence ended";
  // A waiting request whose client leaves is dropped without running.
  f.model->Pause(true);
  std::thread d([&] { (void)f.Run(Request(PromptOf(33, 6), 4)); });
  std::thread e([&] { (void)f.Run(Request(PromptOf(34, 6), 4)); });
  ASSERT_TRUE(AllIn(f, 2));
  std::atomic<bool> leave{false};
  Status left;
  std::thread g([&] {
    auto r = f.Run(Request(PromptOf(35, 6), 4), nullptr, [&] { return leave.load(); });
    left = r.status();
  });
  ASSERT_TRUE(AllIn(f, 3));  // it waits: behind the one in its prefill, or behind both
  leave = true;
  g.join();
  EXPECT_EQ(left.code(), StatusCode::kCancelled);
  f.model->Pause(false);
  d.join();
  e.join();
}

// A long prompt that comes while another sequence decodes goes in chunks
// with the other's steps between them, and neither answer changes.
TEST(Scheduler, ALongPromptMidStreamGoesInChunksBetweenTheOthersSteps) {
  Fixture f(2, /*max_prefill=*/96);
  std::atomic<int> a_tokens{0};
  std::thread a([&] {
    auto g = f.Run(Request(PromptOf(40, 6), 40), [&](std::string_view) {
      ++a_tokens;
      return true;
    });
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->ids, Greedy(PromptOf(40, 6), 40));
  });
  f.model->set_delay_ms(1);
  for (int i = 0; i < 1000 && a_tokens < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto g = f.Run(Request(PromptOf(41, 90), 4));
  a.join();
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->ids, Greedy(PromptOf(41, 90), 4));
  // Its prefill: calls of one row and more than one token; a step of the
  // other sequence (rows of one token) between each two.
  std::vector<SlotModel::Call> calls = f.model->calls();
  std::vector<size_t> chunks;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].width > 1) chunks.push_back(i);
  }
  ASSERT_GE(chunks.size(), 3u);  // the first prompt's call, then the long one's, in chunks
  int64_t long_tokens = 0;
  for (size_t k = 1; k < chunks.size(); ++k) {
    long_tokens += calls[chunks[k]].width;
    if (k + 1 < chunks.size()) EXPECT_GT(chunks[k + 1] - chunks[k], 1u) << "no step between two chunks";
  }
  EXPECT_EQ(long_tokens, 90);
}

// A prompt that starts with what a slot holds goes on from there: the
// same tokens as computed from nothing, the reused count reported, and
// only the rest computed.
TEST(Scheduler, APromptThatStartsWithWhatASlotHoldsReusesIt) {
  Fixture f(2);
  const std::vector<int32_t> system = PromptOf(50, 40);
  auto first = f.Run(Request(system, 6));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->cached_tokens, 0);
  // The conversation so far, and more: the slot holds the prompt and the
  // answer's tokens but the last (never fed to the model).
  std::vector<int32_t> next = system;
  next.insert(next.end(), first->ids.begin(), first->ids.end());
  for (int32_t t : PromptOf(51, 5)) next.push_back(t);
  const size_t computed_before = f.model->calls().size();
  auto second = f.Run(Request(next, 6));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->ids, Greedy(next, 6));
  EXPECT_EQ(second->cached_tokens, 40 + 5);
  EXPECT_EQ(f.model->calls()[computed_before].width, static_cast<int64_t>(next.size()) - 45);
  // The same prompt again: all but its last 4 tokens (a call of fewer
  // rows would round otherwise on a CPU).
  auto again = f.Run(Request(next, 6));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ids, second->ids);
  EXPECT_EQ(again->cached_tokens, static_cast<int64_t>(next.size()) - 4);
  // A prompt that differs early reuses what is common, in the slot that
  // has the most of it; cache_prompt=false computes it all.
  std::vector<int32_t> other = system;
  other[20] = 999;
  auto diverged = f.Run(Request(other, 6));
  ASSERT_TRUE(diverged.ok());
  EXPECT_EQ(diverged->ids, Greedy(other, 6));
  EXPECT_EQ(diverged->cached_tokens, 20);
  // A runner started anew has none of it: nothing is reused (the model
  // would refuse positions never written).
  f.model->Restart();
  auto restarted = f.Run(Request(next, 6));
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  EXPECT_EQ(restarted->ids, second->ids);
  EXPECT_EQ(restarted->cached_tokens, 0);
  GenerateRequest cold = Request(next, 6);
  cold.cache_prompt = false;
  auto c = f.Run(cold);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ids, second->ids);
  EXPECT_EQ(c->cached_tokens, 0);
  EXPECT_GE(f.gen->Stats().reused_tokens, 45u + next.size() - 4 + 20);
}

// /infer on a generating model runs alone: after the sequences in slots
// end, before those that come after it; what it wrote in the cache is not
// reused.
TEST(Scheduler, AnInferOfTheModelRunsAloneInItsTurn) {
  Fixture f(2);
  f.model->set_delay_ms(1);
  const std::vector<int32_t> prompt = PromptOf(60, 8);
  auto warm = f.Run(Request(prompt, 4));
  ASSERT_TRUE(warm.ok());
  std::atomic<bool> alone_ran{false};
  std::atomic<size_t> calls_before_alone{0};
  std::thread a([&] {
    auto g = f.Run(Request(PromptOf(61, 6), 30));
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->ids, Greedy(PromptOf(61, 6), 30));
  });
  ASSERT_TRUE(AllIn(f, 1));
  std::vector<model::HostTensor> in(3);
  auto fill = [](model::HostTensor& t, const char* name, std::vector<int64_t> shape, std::vector<int64_t> v) {
    t = {name, model::DType::kInt64, std::move(shape), {}};
    t.data.resize(v.size() * 8);
    std::memcpy(t.data.data(), v.data(), t.data.size());
  };
  // It overwrites position 3 of every slot.
  fill(in[0], "tokens", {2, 1}, {7, 7});
  fill(in[1], "input_pos", {2, 1}, {3, 3});
  fill(in[2], "slots", {2}, {0, 1});
  std::mutex mu;
  std::condition_variable cv;
  ASSERT_TRUE(f.gen
                  ->RunAlone(f.model, std::move(in), {},
                             [&](StatusOr<std::vector<model::HostTensor>> out) {
                               EXPECT_TRUE(out.ok());
                               calls_before_alone = f.model->calls().size() - 1;
                               std::lock_guard<std::mutex> lock(mu);
                               alone_ran = true;
                               cv.notify_all();
                             })
                  .ok());
  auto after = f.Run(Request(prompt, 4));  // queued behind the run: it starts after it
  a.join();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return alone_ran.load(); }));
  }
  // The warm-up's 4 calls and all 30 of the running sequence's (its
  // prompt, 29 steps) came first.
  EXPECT_EQ(calls_before_alone.load(), 4u + 30u);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->ids, warm->ids);
  EXPECT_EQ(after->cached_tokens, 0);
}

// A model of one sequence (no slots): sequences in turn, in order.
TEST(Scheduler, AModelOfOneSequenceServesThemInTurn) {
  Fixture f(1);
  EXPECT_EQ(f.gen->slots(), 1);
  f.model->Pause(true);
  std::vector<std::thread> clients;
  std::vector<std::vector<int32_t>> ids(3);
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      auto g = f.Run(Request(PromptOf(70 + i, 5), 6));
      ASSERT_TRUE(g.ok());
      ids[i] = g->ids;
    });
    ASSERT_TRUE(AllIn(f, i + 1));
  }
  // A waiter's question whether its client left may take the scheduler's
  // lock (here it asks it how many wait): it is asked without holding it.
  std::atomic<int> asked{0};
  std::thread waiter([&] {
    auto g = f.Run(Request(PromptOf(73, 5), 6), nullptr, [&] {
      (void)f.gen->waiting();
      ++asked;
      return false;
    });
    EXPECT_TRUE(g.ok());
  });
  for (int i = 0; i < 1000 && asked < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(asked.load(), 2);
  f.model->Pause(false);
  for (auto& c : clients) c.join();
  waiter.join();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ids[i], Greedy(PromptOf(70 + i, 5), 6));
  EXPECT_EQ(MostRows(f.model->calls()), 1);
}

// The setting lowers the slots a model's cache holds, never raises them.
TEST(Scheduler, MaxSequencesLowersTheSlotsServed) {
  auto io = IoOf(4, 64);
  EXPECT_EQ(Generator::Create(Spec(4, 64), io).value()->slots(), 4);
  EXPECT_EQ(Generator::Create(Spec(4, 64), io, 2).value()->slots(), 2);
  EXPECT_EQ(Generator::Create(Spec(4, 64), io, 9).value()->slots(), 4);
  // A slotted spec on a model without slots, and the other way round.
  auto wrong = Generator::Create(Spec(4, 64), IoOf(1, 64));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("tokens, positions and slots"), std::string::npos)
      << wrong.status().message();
  wrong = Generator::Create(Spec(1, 64), io);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("takes tokens and positions"), std::string::npos);
}

}  // namespace
}  // namespace aotid::serving
