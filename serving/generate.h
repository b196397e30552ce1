// Text generation for language models: the token loop next to the model
// (POST /v2/models/NAME/generate and /generate_stream).
//
// A generate model is stateful: its key/value cache lives inside the
// compiled model, in slots of one sequence each. Its generator schedules
// the sequences on those slots (continuous batching); requests beyond them
// wait in order (a client that leaves while it waits gives its place up),
// and /infer on such a model waits its turn the same way. That is the
// model's spec (text::GenerateSpec), not luck: versions with more than one
// runner are refused at load.
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
#include "http/server.h"
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
  // Whether the prompt may go on from what a slot holds (a prefix of an
  // earlier sequence's): the same tokens either way, computed or not.
  bool cache_prompt = true;
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
  // Of the prompt's tokens, those its slot already held (a prefix of an
  // earlier sequence's): not computed again.
  int64_t cached_tokens = 0;
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

// One sequence of a Generator: a request's answer as it is made. Shared
// by the scheduler, which makes it, and the request, which reads it.
// Dropping the request's handle ends the sequence (its reader is gone):
// keep it alive in what WhenStarted and WhenDone call.
class Sequence {
 public:
  // What the scheduler made for the reader, in order.
  struct Event {
    bool is_text = true;
    std::string text;            // is_text
    text::TokenLogprob logprob;  // otherwise
  };
  ~Sequence();

  // Reads the sequence on this thread until it ends, as Generator::Run
  // says. At most one reader.
  StatusOr<GenerateResult> Follow(const std::function<bool(std::string_view text)>& on_text,
                                  const std::function<bool()>& cancelled, Status* error,
                                  const std::function<void(const text::TokenLogprob&)>& on_logprob);
  // Calls `fn` once, when the sequence has something to read (its first
  // token) or has ended: on the scheduler's thread, or on this one when it
  // already has. A request whose answer waits its turn holds no thread.
  void WhenStarted(std::function<void()> fn);
  // Calls `fn` once, when the sequence has ended, likewise.
  void WhenDone(std::function<void()> fn);
  // Ends it as "cancelled" (the client left): its slot goes to the next.
  void Cancel();
  // Why it ended without making a token (it failed, its client left while
  // it waited, the model went away); OK while it runs and once it made one.
  Status Failure() const;

 private:
  friend class Generator;
  struct State;
  explicit Sequence(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// Answers `res` later, through `answer` on a server worker, once `seq`
// can be read: a stream once it has its first token (or has ended), a
// whole answer once it has ended. A request holds no worker while it waits
// for a slot, nor, unless it streams, while it runs. `answer` holds what it
// uses (the sequence too: dropping it ends the sequence).
void AnswerWhenReady(const std::shared_ptr<Sequence>& seq, bool stream, http::Response& res,
                     http::Finish answer);

// What a generator's scheduler has done, for /metrics and the log.
struct GenerateStats {
  int slots = 0;                                 // sequences at once
  int active = 0;                                // sequences in a slot now
  int waiting = 0;                               // requests waiting for one
  uint64_t decode_steps = 0, decode_tokens = 0;  // tokens / steps: sequences per step
  double decode_seconds = 0;
  uint64_t prefill_calls = 0, prefill_tokens = 0;  // prompt tokens computed
  double prefill_seconds = 0;
  uint64_t reused_tokens = 0;  // prompt tokens a slot already held
};

// One served version's generator: its spec and the scheduler of its
// sequences. A language model's key/value cache is inside the compiled
// model, in N slots (text::GenerateSpec::max_sequences; a model of one
// sequence has one). One thread per generator calls the model: each call
// is a decode step of every sequence in a slot (one token each), or one
// chunk of a prompt, taken in turns, so that a long prompt holds the
// others up for about one step. A sequence that ends frees its slot for the
// next waiting request at once. A prompt that starts with what a free
// slot holds (the same system prompt, the conversation so far) goes on
// from there instead of computing it again.
class Generator {
 public:
  // Checks the compiled model fits the spec: tokens and positions (and
  // the slots of a model of several sequences), the float32 logits. Errors
  // say what differs. `max_sequences` above 0 serves fewer sequences at
  // once than the model holds.
  // `label` names the version in the log.
  static StatusOr<std::shared_ptr<Generator>> Create(text::GenerateSpec spec, const model::ModelSpec& model,
                                                     int64_t max_sequences = 0, std::string label = "");
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  const text::GenerateSpec& spec() const { return spec_; }
  // The sequences served at once.
  int slots() const { return slots_; }

  // The prompt's tokens: the text tokenized (after the begin token, where
  // the model has one) or the ids given. InvalidArgument when it is empty,
  // not UTF-8, or leaves no room in the model's context.
  StatusOr<std::vector<int32_t>> Prompt(const GenerateRequest& req) const;

  // Queues a sequence from `prompt` (Prompt()) on `model`, which must be
  // the compiled model this generator was made for. `gone` is asked while
  // it waits and between its tokens (its client left, the daemon stops):
  // then it ends. Unavailable when the waiting requests are at the bound.
  StatusOr<std::shared_ptr<Sequence>> Start(std::shared_ptr<model::LoadedModel> model, GenerateRequest req,
                                            std::vector<int32_t> prompt, std::function<bool()> gone) const;

  // Start, then Follow on this thread. `on_text` gets the text as it
  // becomes whole (never a stop string, never half a character); false
  // from it ends the sequence (the client left). `cancelled` is asked
  // while the sequence waits its turn and between tokens. A failure before
  // any text is an error; after some, the result says "cancelled" or
  // carries the error in `error`. `on_logprob`, when set and the request
  // asks for logprobs, gets each answer token's before its text goes to
  // `on_text`: a token whose text is held back (it may start a stop
  // string) waits with it, and the tokens of the stop string that ends the
  // answer get none.
  StatusOr<GenerateResult> Run(
      std::shared_ptr<model::LoadedModel> model, const GenerateRequest& req,
      const std::vector<int32_t>& prompt, const std::function<bool(std::string_view text)>& on_text,
      const std::function<bool()>& cancelled, Status* error = nullptr,
      const std::function<void(const text::TokenLogprob&)>& on_logprob = nullptr) const;

  // Runs `inputs` on `model` (an /infer of the model itself) in turn with
  // the sequences: once those in slots have ended, none starting
  // meanwhile, since such a call writes the cache where it likes; the
  // slots' contents are forgotten after it. `done` runs once, on the
  // scheduler's thread; an error returned here means it never runs.
  Status RunAlone(std::shared_ptr<model::LoadedModel> model, std::vector<model::HostTensor> inputs,
                  model::RunContext ctx, model::LoadedModel::Done done) const;

  // The most requests that wait for a slot, for each slot: past it a
  // request gets 503 at once.
  static constexpr int kMaxWaitingPerSlot = 4;
  // Unavailable when the waiting requests are at the bound: a stream asks
  // before it answers 200.
  Status Admit() const;
  // Requests waiting for a slot now.
  int waiting() const;
  GenerateStats Stats() const;
  // Test hook: until exactly `n` requests wait for a slot; false after 10 s.
  bool TEST_AwaitWaiting(int n) const;

  class Scheduler;  // generate.cc

 private:
  struct Inputs {
    size_t tokens, positions, slots;  // the model's input order (slots: a model of several sequences)
    bool slotted = false;
  };
  Generator(text::GenerateSpec spec, Inputs inputs, size_t logits_index, int64_t vocab, int64_t max_prefill,
            int slots, std::string label);

  text::GenerateSpec spec_;
  Inputs inputs_;
  size_t logits_index_;
  int64_t vocab_;  // the logits' last dim
  int64_t max_prefill_;
  int slots_;
  std::shared_ptr<Scheduler> scheduler_;
};

}  // namespace aotid::serving
