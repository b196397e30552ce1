// Text generation for language models: the token loop next to the model
// (POST /v2/models/NAME/generate and /generate_stream).
//
// A generate model is stateful: its key/value cache lives inside the
// compiled model, shared by whatever runs it. So a version serves one
// sequence at a time; the others wait their turn in order (a client that
// leaves while it waits gives its turn up), and /infer on such a model waits
// the same way. That is the model's spec (text::GenerateSpec), not luck:
// versions with more than one runner are refused at load.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/mutex.h"
#include "base/status.h"
#include "model/loaded_model.h"
#include "text/generation.h"

namespace aotid::serving {

struct GenerateRequest {
  std::vector<text::PromptPart> prompt;  // what is tokenized (text_input, or the chat prompt)
  std::vector<int32_t> ids;              // input_ids given instead of text
  bool has_ids = false;
  int64_t max_tokens = 256;  // at most, and never past the model's context
  text::SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool return_token_ids = false;
  // Each answer token's log-probability and this many likeliest
  // alternatives' (GenerateResult::logprobs); -1: none.
  int top_logprobs = -1;
  std::string id;  // echoed in the answer
};

// Reads a generate request: {"text_input": "..."}, {"messages": [{"role",
// "content"}, ...]} (the model's chat template applied) or {"input_ids":
// [...]}, with "parameters": {"max_tokens", "temperature", "top_p",
// "top_k", "seed", "stop", "ignore_eos", "return_token_ids"} (also accepted
// beside the input, as Triton's generate extension allows). InvalidArgument
// naming the field for anything else.
StatusOr<GenerateRequest> ParseGenerateRequest(std::string_view body, const text::GenerateSpec& spec);

// What a language model generates with, as its metadata shows it:
// {"context_length": prompt and answer together, "max_prefill": the most
// prompt tokens one call takes, "end_tokens": [{"id", "text"}, ...] (any
// ends an answer), "begin_token": {"id", "text"} (only where every prompt
// starts with one), "chat_template": whether it takes "messages"}.
nlohmann::json DescribeGenerate(const text::GenerateSpec& spec);

struct GenerateResult {
  std::string text;
  std::vector<int32_t> ids;
  // When the request asked (top_logprobs >= 0): one per id, but for the
  // tokens of the stop string that ended the answer, cut with its text.
  std::vector<text::TokenLogprob> logprobs;
  int64_t prompt_tokens = 0;
  std::string finish_reason;  // "stop" (end of text or a stop string), "length", "cancelled"
  uint64_t seed = 0;
  double queue_ms = 0;  // waiting for the model
  double prefill_ms = 0;
  double first_token_ms = 0;  // from the start of the prefill to the first token's text
  double decode_ms = 0;       // from the first token to the end of the answer
  // The model calls in decode_ms: one per token after the first, and one
  // more when the answer ends on the model's end token (made, not shown).
  int64_t decode_steps = 0;
  // Decode tokens per second: decode_steps over decode_ms; 0 without any.
  double DecodeRate() const {
    return decode_steps > 0 && decode_ms > 0 ? 1000.0 * decode_steps / decode_ms : 0;
  }
};

// One served version's generator: its spec and its turn-taking.
class Generator {
 public:
  // Checks the compiled model fits the spec: the two int64 inputs, the
  // float32 logits. Errors say what differs.
  static StatusOr<std::shared_ptr<Generator>> Create(text::GenerateSpec spec, const model::ModelSpec& model);

  const text::GenerateSpec& spec() const { return spec_; }

  // The prompt's tokens: the text tokenized (after the begin token, where
  // the model has one) or the ids given. InvalidArgument when it is empty,
  // not UTF-8, or leaves no room in the model's context.
  StatusOr<std::vector<int32_t>> Prompt(const GenerateRequest& req) const;

  // Runs one sequence from `prompt` (Prompt()) on `model`. `on_text` gets the text as it becomes
  // whole (never a stop string, never half a character); false from it
  // stops the sequence (the client left). `cancelled` is asked while the
  // sequence waits its turn and between tokens. A failure before any text
  // is an error; after some, the result says "cancelled" or carries the
  // error in `error`. `on_logprob`, when set and the request asks for
  // logprobs, gets each answer token's before its text goes to `on_text`:
  // a token whose text is held back (it may start a stop string) waits
  // with it, and the tokens of the stop string that ends the answer get
  // none.
  StatusOr<GenerateResult> Run(
      model::LoadedModel& model, const GenerateRequest& req, const std::vector<int32_t>& prompt,
      const std::function<bool(std::string_view text)>& on_text, const std::function<bool()>& cancelled,
      Status* error = nullptr,
      const std::function<void(const text::TokenLogprob&)>& on_logprob = nullptr) const;

  // The most requests that wait for a version's turn: past it a request
  // gets 503 at once rather than hold an HTTP worker too (a waiting or
  // generating request holds one).
  static constexpr int kMaxWaiting = 4;

  // Holds the model for one run outside a sequence (/infer): Cancelled when
  // `cancelled` turned true while waiting, Unavailable when kMaxWaiting
  // already wait. Release() gives the turn on.
  Status Acquire(const std::function<bool()>& cancelled) const { return gate_.Enter(cancelled); }
  void Release() const { gate_.Leave(); }
  // Unavailable when kMaxWaiting requests wait already: a stream asks
  // before it answers 200 (a request can still find the queue full after,
  // and is told so in the stream).
  Status Admit() const;
  // Requests waiting for the turn now.
  int waiting() const { return gate_.Waiting(); }
  // Test hook: until exactly `n` requests wait for the turn (a thread has
  // taken its ticket); false after 10 s.
  bool TEST_AwaitWaiting(int n) const { return gate_.AwaitWaiting(n); }

 private:
  Generator(text::GenerateSpec spec, size_t tokens_index, size_t logits_index, int64_t vocab,
            int64_t max_prefill);

  // First come, first served; a waiter that gives up is skipped.
  class Gate {
   public:
    Status Enter(const std::function<bool()>& cancelled) EXCLUDES(mu_);
    void Leave() EXCLUDES(mu_);
    int Waiting() EXCLUDES(mu_);
    bool AwaitWaiting(int n) EXCLUDES(mu_);

   private:
    int WaitingLocked() REQUIRES(mu_);
    void AdvanceLocked() REQUIRES(mu_);
    Mutex mu_;
    CondVar cv_;
    CondVar waiting_changed_;               // for AwaitWaiting alone
    uint64_t next_ GUARDED_BY(mu_) = 0;     // the next ticket given out
    uint64_t serving_ GUARDED_BY(mu_) = 0;  // the ticket whose turn it is
    bool busy_ GUARDED_BY(mu_) = false;
    std::vector<uint64_t> abandoned_ GUARDED_BY(mu_);
  };

  text::GenerateSpec spec_;
  size_t tokens_index_;  // which of the model's two inputs takes the tokens
  size_t logits_index_;
  int64_t vocab_;  // the logits' last dim
  int64_t max_prefill_;
  mutable Gate gate_;
};

}  // namespace aotid::serving
