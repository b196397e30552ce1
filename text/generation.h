// What a language model's token loop needs besides the model: the model's
// generate spec (the build's generate.json), the chat prompt, sampling and
// stop strings. The loop itself is serving/generate.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "text/tokenizer.h"

namespace aotid::text {

// A chat template as pieces (the exporter renders the model's Jinja
// template on marked messages to find them, aotid_export.llm.chat_pieces):
// the prompt is the default preamble (when the talk does not open with a
// system message), each message as prefix + content + suffix of its role,
// then the generation prompt.
struct ChatTemplate {
  struct Role {
    std::string prefix, suffix;
  };
  std::map<std::string, Role> roles;  // "system", "user", "assistant"
  std::string generation_prompt;
  std::string default_preamble;
};

struct ChatMessage {
  std::string role, content;
};

// A prompt in parts: the template's own text, where special tokens are read
// as such, and messages' contents, where their text is plain (a message
// cannot open a turn of another role by writing "<|im_start|>system").
struct PromptPart {
  std::string text;
  bool special = true;  // special tokens in `text` are special tokens
};
std::string Joined(const std::vector<PromptPart>& parts);

// The prompt for `messages`. InvalidArgument for no messages or a role the
// template does not have.
StatusOr<std::vector<PromptPart>> ApplyChat(const ChatTemplate& chat,
                                            const std::vector<ChatMessage>& messages);

// A causal language model's generate spec: the model is
// (tokens[1, T] int64, positions[T] int64) -> logits[1, vocab] float32, its
// key/value cache inside it; or, with a cache of several sequences (slots),
// (tokens[B, T], positions[B, T], slots[B]) -> logits[B, vocab]: row b is T
// tokens of the sequence in slot slots[b] (docs/GENERATE.md).
struct GenerateSpec {
  std::string tokens_input = "tokens";
  std::string positions_input = "input_pos";
  std::string slots_input;               // "" for a model of one sequence
  int64_t max_sequences = 1;             // the cache's slots
  int64_t cache_bytes_per_sequence = 0;  // what one slot's cache takes; 0 when not said
  std::string logits_output = "logits";
  int64_t max_seq_len = 0;  // the cache's length: prompt and output together
  int64_t max_prefill = 0;  // the most tokens one call takes
  std::vector<int32_t> eos_ids;
  int32_t bos_id = -1;  // starts every prompt when >= 0
  std::optional<ChatTemplate> chat;
  std::shared_ptr<const Tokenizer> tokenizer;

  // Reads generate.json: the package's "generate" section with the
  // tokenizer description under "tokenizer". Errors name the field.
  static StatusOr<GenerateSpec> FromJson(std::string_view json);
};

// How tokens are chosen. temperature 0 (or top_k 1) is greedy: the first
// of the highest logits, as torch.argmax picks.
struct SamplingParams {
  double temperature = 0.8;
  int top_k = 40;      // 0: every token
  double top_p = 0.9;  // 1: no nucleus cut
  double min_p = 0;    // drops tokens under min_p times the likeliest's probability
  // OpenAI's penalties on the tokens generated so far (Sampler::Accept):
  // each token's logit less count * frequency_penalty, and less
  // presence_penalty once it has appeared. Before the temperature.
  double presence_penalty = 0;
  double frequency_penalty = 0;
  std::optional<uint64_t> seed;

  // Temperatures under 1e-4 sample the top token all but always: greedy.
  bool greedy() const { return temperature < 1e-4 || top_k == 1; }
};

// Chooses tokens from logits. The draw is reproducible for a seed: the
// generator (mt19937_64) and the way a draw becomes a number in [0, 1) are
// fixed here, not left to the standard library's distributions.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t Next(const float* logits, int32_t vocab);
  // Counts `id` as generated, for the penalties.
  void Accept(int32_t id);
  uint64_t seed() const { return seed_; }

 private:
  double Uniform();
  // `logits` less the penalties, in penalized_; `logits` itself when none apply.
  const float* Penalized(const float* logits, int32_t vocab);
  SamplingParams p_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
  std::map<int32_t, int> counts_;  // generated tokens and how often
  std::vector<float> penalized_;
};

// A token's log-probability under the model (the log-softmax of its raw
// logits, before temperature and penalties) and the `top` likeliest
// tokens' with theirs, highest first (equal ones by id).
struct TokenLogprob {
  int32_t id = 0;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;
};
TokenLogprob Logprobs(const float* logits, int32_t vocab, int32_t id, int top);

// Watches generated text for stop strings. Text that might be the start of
// one is held back until it is known not to be, so a client never sees a
// stop string or part of it.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Adds text; returns what can be sent now. Once a stop string appears,
  // *stopped is set and the text before it is the last returned.
  std::string Push(std::string_view text, bool* stopped);
  // What was held back, at the end of generation.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace aotid::text
