#include "serving/generate.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/json.h"

namespace aotid::serving {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

model::HostTensor Int64Tensor(const std::string& name, std::vector<int64_t> shape, const int32_t* ids,
                              size_t n, int64_t first_position) {
  model::HostTensor t;
  t.name = name;
  t.dtype = model::DType::kInt64;
  t.shape = std::move(shape);
  t.data.resize(n * sizeof(int64_t));
  auto* out = reinterpret_cast<int64_t*>(t.data.data());
  for (size_t i = 0; i < n; ++i) out[i] = ids ? ids[i] : first_position + static_cast<int64_t>(i);
  return t;
}

// Answer tokens' logprobs, each held until its token's text is shown. The
// text that may start a stop string is held back (text::StopMatcher), and
// the stop string that ends an answer is cut from it: its tokens are cut
// with it, logprobs and all. Places count bytes of the text as generated
// (the stop matcher's input), so the shown text is a prefix of it.
class HeldLogprobs {
 public:
  // The logprob of a token whose text takes `bytes` bytes from `start`.
  void Add(text::TokenLogprob lp, size_t start, size_t bytes) {
    held_.push_back({std::move(lp), start, bytes});
  }
  // Hands on, in order, those of the tokens the first `shown` bytes show:
  // those whose text starts before it, and those without text (a special
  // token) at it.
  void Release(size_t shown, const std::function<void(text::TokenLogprob&&)>& out) {
    size_t n = 0;
    while (n < held_.size() && (held_[n].start < shown || (held_[n].bytes == 0 && held_[n].start == shown))) {
      out(std::move(held_[n].lp));
      ++n;
    }
    held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(n));
  }
  void ReleaseAll(const std::function<void(text::TokenLogprob&&)>& out) {
    Release(std::numeric_limits<size_t>::max(), out);
  }

 private:
  struct Held {
    text::TokenLogprob lp;
    size_t start, bytes;
  };
  std::vector<Held> held_;
};

// The parameters a request may set, and where each lands.
Status SetParameter(const std::string& key, const json& v, GenerateRequest* r) {
  auto need = [&](bool ok, const char* what) {
    return ok ? Status::OK() : InvalidArgument("parameter \"" + key + "\" must be " + what);
  };
  if (key == "max_tokens") {
    // JSON reads a non-negative integer as unsigned, a negative one as signed.
    RETURN_IF_ERROR(need(v.is_number_unsigned() && v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= (1u << 31),
                         "an integer from 1 to 2147483648 (the model's context bounds it too)"));
    r->max_tokens = v.get<int64_t>();
  } else if (key == "temperature") {
    RETURN_IF_ERROR(
        need(v.is_number() && v.get<double>() >= 0 && v.get<double>() <= 100, "a number in 0..100"));
    r->sampling.temperature = v.get<double>();
  } else if (key == "top_p") {
    RETURN_IF_ERROR(need(v.is_number() && v.get<double>() > 0 && v.get<double>() <= 1, "a number in (0, 1]"));
    r->sampling.top_p = v.get<double>();
  } else if (key == "top_k") {
    RETURN_IF_ERROR(need(v.is_number_unsigned() && v.get<uint64_t>() <= (1u << 24),
                         "an integer from 0 (every token) to 16777216"));
    r->sampling.top_k = static_cast<int>(v.get<int64_t>());
  } else if (key == "seed") {
    RETURN_IF_ERROR(need(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
                         "an integer of at least 0"));
    r->sampling.seed = v.get<uint64_t>();
  } else if (key == "stop") {
    std::vector<std::string> stops;
    if (v.is_string()) {
      stops.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const auto& s : v) {
        RETURN_IF_ERROR(need(s.is_string(), "a string or a list of strings"));
        stops.push_back(s.get<std::string>());
      }
    } else {
      return InvalidArgument("parameter \"stop\" must be a string or a list of strings");
    }
    RETURN_IF_ERROR(need(stops.size() <= 16, "at most 16 strings"));
    for (const auto& s : stops) {
      RETURN_IF_ERROR(need(s.size() <= 1000 && text::ValidUtf8(s), "UTF-8 strings of at most 1000 bytes"));
    }
    r->stop = std::move(stops);
  } else if (key == "ignore_eos") {
    RETURN_IF_ERROR(need(v.is_boolean(), "true or false"));
    r->ignore_eos = v.get<bool>();
  } else if (key == "return_token_ids") {
    RETURN_IF_ERROR(need(v.is_boolean(), "true or false"));
    r->return_token_ids = v.get<bool>();
  } else if (key == "stream") {
    // Triton's clients send it; the route already says which it is.
  } else {
    return InvalidArgument("unknown parameter \"" + key +
                           "\" (known: max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, "
                           "return_token_ids)");
  }
  return Status::OK();
}

}  // namespace

json DescribeGenerate(const text::GenerateSpec& spec) {
  // A token's text as the tokenizer reads it back (a special token's own).
  auto token = [&](int32_t id) {
    json t{{"id", id}};
    if (spec.tokenizer) t["text"] = spec.tokenizer->Decode({id});
    return t;
  };
  json ends = json::array();
  for (int32_t id : spec.eos_ids) ends.push_back(token(id));
  json j{{"context_length", spec.max_seq_len},
         {"max_prefill", spec.max_prefill},
         {"end_tokens", std::move(ends)},
         {"chat_template", spec.chat.has_value()}};
  if (spec.bos_id >= 0) j["begin_token"] = token(spec.bos_id);
  return j;
}

StatusOr<GenerateRequest> ParseGenerateRequest(std::string_view body, const text::GenerateSpec& spec) {
  // The same nesting bound as /infer's tape: a body of '[' is refused at
  // its 33rd byte, not built into a DOM of millions of nodes.
  ASSIGN_OR_RETURN(
      json j, ParseJson(body, "the request body",
                        {.max_depth = 32, .max_bytes = body.size(), .max_values = kMaxRequestJsonValues}));
  if (!j.is_object()) return InvalidArgument("the request body is not a JSON object");
  GenerateRequest r;
  int inputs = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "text_input") {
      if (!v.is_string()) return InvalidArgument("\"text_input\" must be a string");
      r.prompt = {{v.get<std::string>()}};
      ++inputs;
    } else if (key == "messages") {
      if (!spec.chat) return InvalidArgument("this model has no chat template: send \"text_input\"");
      if (!v.is_array()) return InvalidArgument("\"messages\" must be a list of {\"role\", \"content\"}");
      std::vector<text::ChatMessage> messages;
      for (const auto& m : v) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
            !m["content"].is_string()) {
          return InvalidArgument("each of \"messages\" must be {\"role\": string, \"content\": string}");
        }
        messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      }
      ASSIGN_OR_RETURN(r.prompt, text::ApplyChat(*spec.chat, messages));
      ++inputs;
    } else if (key == "input_ids") {
      if (!v.is_array()) return InvalidArgument("\"input_ids\" must be a list of token ids");
      for (const auto& id : v) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= spec.tokenizer->vocab_size()) {
          return InvalidArgument("\"input_ids\" holds a value that is not a token id (0.." +
                                 std::to_string(spec.tokenizer->vocab_size() - 1) + ")");
        }
        r.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
      r.has_ids = true;
      ++inputs;
    } else if (key == "parameters") {
      if (!v.is_object()) return InvalidArgument("\"parameters\" must be an object");
      for (auto p = v.begin(); p != v.end(); ++p) RETURN_IF_ERROR(SetParameter(p.key(), p.value(), &r));
    } else if (key == "id") {
      if (!v.is_string()) return InvalidArgument("\"id\" must be a string");
      r.id = v.get<std::string>();  // echoed in the answer, as /infer does
    } else if (key == "model_name" || key == "model_version") {
      // Sent back by some clients; the route says which model it is.
    } else {
      RETURN_IF_ERROR(SetParameter(key, v, &r).WithContext("the request"));
    }
  }
  if (inputs != 1) {
    return InvalidArgument(
        inputs == 0 ? "the request has no input: send \"text_input\", \"messages\" or \"input_ids\""
                    : "send one of \"text_input\", \"messages\" and \"input_ids\", not several");
  }
  return r;
}

Status Generator::Admit() const {
  int n = gate_.Waiting();
  if (n < kMaxWaiting) return Status::OK();
  return Unavailable("the model is busy: a language model runs one sequence at a time, and " +
                     std::to_string(n) + " requests already wait for it; try again shortly");
}

int Generator::Gate::Waiting() {
  MutexLock lock(&mu_);
  return WaitingLocked();
}

int Generator::Gate::WaitingLocked() {
  return static_cast<int>(next_ - serving_ - (busy_ ? 1 : 0) - abandoned_.size());
}

bool Generator::Gate::AwaitWaiting(int n) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  MutexLock lock(&mu_);
  while (WaitingLocked() != n) {
    if (!waiting_changed_.WaitUntil(&mu_, deadline)) return WaitingLocked() == n;
  }
  return true;
}

Status Generator::Gate::Enter(const std::function<bool()>& cancelled) {
  MutexLock lock(&mu_);
  const uint64_t waiting = next_ - serving_ - (busy_ ? 1 : 0) - abandoned_.size();
  if (waiting >= static_cast<uint64_t>(kMaxWaiting)) {
    return Unavailable("the model is busy: a language model runs one sequence at a time, and " +
                       std::to_string(waiting) + " requests already wait for it; try again shortly");
  }
  const uint64_t ticket = next_++;
  waiting_changed_.SignalAll();
  while (busy_ || serving_ != ticket) {
    cv_.WaitUntil(&mu_, Clock::now() + std::chrono::milliseconds(50));
    if (!(busy_ || serving_ != ticket) || !cancelled) continue;
    // Asked without the lock: it may make a syscall (is the client's
    // socket closed?), and the turn's owner must not wait on that.
    lock.Unlock();
    const bool gone = cancelled();
    lock.Lock();
    if (gone && (busy_ || serving_ != ticket)) {
      abandoned_.push_back(ticket);
      AdvanceLocked();
      return Cancelled(model::kClientGone);
    }
  }
  busy_ = true;
  waiting_changed_.SignalAll();
  return Status::OK();
}

void Generator::Gate::Leave() {
  MutexLock lock(&mu_);
  busy_ = false;
  ++serving_;
  AdvanceLocked();
}

void Generator::Gate::AdvanceLocked() {
  if (!busy_) {
    for (auto it = std::find(abandoned_.begin(), abandoned_.end(), serving_); it != abandoned_.end();
         it = std::find(abandoned_.begin(), abandoned_.end(), serving_)) {
      abandoned_.erase(it);
      ++serving_;
    }
  }
  cv_.SignalAll();
  waiting_changed_.SignalAll();
}

Generator::Generator(text::GenerateSpec spec, size_t tokens_index, size_t logits_index, int64_t vocab,
                     int64_t max_prefill)
    : spec_(std::move(spec)),
      tokens_index_(tokens_index),
      logits_index_(logits_index),
      vocab_(vocab),
      max_prefill_(max_prefill) {}

StatusOr<std::shared_ptr<Generator>> Generator::Create(text::GenerateSpec spec,
                                                       const model::ModelSpec& model) {
  auto find = [](const std::vector<model::TensorSpec>& v, const std::string& name) -> std::optional<size_t> {
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i].name == name) return i;
    }
    return std::nullopt;
  };
  const std::string what = "the model's generate spec does not fit the compiled model: ";
  if (model.inputs.size() != 2) {
    return InvalidArgument(what + "it takes " + std::to_string(model.inputs.size()) +
                           " inputs, a causal language model takes tokens and positions");
  }
  auto tok = find(model.inputs, spec.tokens_input);
  auto pos = find(model.inputs, spec.positions_input);
  auto logits = find(model.outputs, spec.logits_output);
  if (!tok || !pos || *tok == *pos) {
    return InvalidArgument(what + "its inputs are not \"" + spec.tokens_input + "\" and \"" +
                           spec.positions_input + "\"");
  }
  const model::TensorSpec& t = model.inputs[*tok];
  const model::TensorSpec& p = model.inputs[*pos];
  if (t.dtype != model::DType::kInt64 || t.shape.size() != 2 || t.shape[0] != 1 ||
      p.dtype != model::DType::kInt64 || p.shape.size() != 1) {
    return InvalidArgument(what + "tokens must be INT64 [1, seq] and positions INT64 [seq]; they are " +
                           std::string(DTypeName(t.dtype)) + " " + model::ShapeString(t.shape) + " and " +
                           std::string(DTypeName(p.dtype)) + " " + model::ShapeString(p.shape));
  }
  if (!logits) return InvalidArgument(what + "it has no output \"" + spec.logits_output + "\"");
  const model::TensorSpec& l = model.outputs[*logits];
  if (l.dtype != model::DType::kFloat32 || l.shape.size() != 2 || l.shape[0] != 1 || l.shape[1] <= 0) {
    return InvalidArgument(what + "logits must be FP32 [1, vocab]; they are " +
                           std::string(DTypeName(l.dtype)) + " " + model::ShapeString(l.shape));
  }
  int64_t max_prefill = spec.max_prefill;
  if (t.shape[1] > 0) {
    max_prefill = std::min(max_prefill, t.shape[1]);  // a fixed sequence length: calls of exactly that
  } else if (t.dims.size() == 2 && t.dims[1]) {
    max_prefill = std::min(max_prefill, t.dims[1]->max);
  }
  if (t.dims.size() == 2 && t.dims[1] && t.dims[1]->min > 1) {
    return InvalidArgument(what + "its sequence dim starts at " + std::to_string(t.dims[1]->min) +
                           ": decoding needs one token a call");
  }
  if (max_prefill < 1) return InvalidArgument(what + "it takes no tokens in one call");
  if (t.shape[1] > 1) {
    return InvalidArgument(what + "its sequence dim is fixed at " + std::to_string(t.shape[1]) +
                           ": decoding needs one token a call");
  }
  // A token the tokenizer makes must be a row of the model's embedding: a
  // larger tokenizer would send ids the model indexes out of bounds.
  if (spec.tokenizer && spec.tokenizer->vocab_size() > l.shape[1]) {
    return InvalidArgument(what + "its tokenizer has " + std::to_string(spec.tokenizer->vocab_size()) +
                           " tokens, its logits only " + std::to_string(l.shape[1]));
  }
  return std::shared_ptr<Generator>(new Generator(std::move(spec), *tok, *logits, l.shape[1], max_prefill));
}

StatusOr<std::vector<int32_t>> Generator::Prompt(const GenerateRequest& req) const {
  const text::Tokenizer& tok = *spec_.tokenizer;
  std::vector<int32_t> prompt;
  if (req.has_ids) {
    prompt = req.ids;  // as they are: the caller tokenized
  } else {
    if (spec_.bos_id >= 0) prompt.push_back(spec_.bos_id);
    // One text, so that tokens merge across the parts as they would in
    // the reference; special tokens are read only outside the contents.
    std::string joined;
    std::vector<std::pair<size_t, size_t>> plain;
    for (const text::PromptPart& part : req.prompt) {
      if (!part.special) plain.emplace_back(joined.size(), joined.size() + part.text.size());
      joined += part.text;
    }
    // Every token stands for at least one byte, the longest for a few
    // dozen: text this long cannot fit, and is not tokenized to find out.
    const uint64_t most =
        static_cast<uint64_t>(spec_.max_seq_len) * static_cast<uint64_t>(tok.max_token_bytes());
    if (joined.size() > most) {
      return InvalidArgument("the prompt is " + std::to_string(joined.size()) +
                             " bytes, more than the model's context of " + std::to_string(spec_.max_seq_len) +
                             " tokens can hold");
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(joined, plain));
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  if (prompt.empty()) return InvalidArgument("the prompt is empty: there is nothing to continue");
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt >= spec_.max_seq_len) {
    return InvalidArgument("the prompt is " + std::to_string(n_prompt) +
                           " tokens; the model's context holds " + std::to_string(spec_.max_seq_len) +
                           ", prompt and answer together");
  }
  return prompt;
}

StatusOr<GenerateResult> Generator::Run(
    model::LoadedModel& model, const GenerateRequest& req, const std::vector<int32_t>& prompt,
    const std::function<bool(std::string_view)>& on_text, const std::function<bool()>& cancelled,
    Status* error, const std::function<void(const text::TokenLogprob&)>& on_logprob) const {
  const text::Tokenizer& tok = *spec_.tokenizer;
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt == 0 || n_prompt >= spec_.max_seq_len)
    return InvalidArgument("the prompt does not fit the model");
  const int64_t budget = std::min(req.max_tokens, spec_.max_seq_len - n_prompt);

  GenerateResult r;
  r.prompt_tokens = n_prompt;
  auto queued = Clock::now();
  RETURN_IF_ERROR(gate_.Enter(cancelled));
  struct Turn {
    const Gate& gate;
    ~Turn() { const_cast<Gate&>(gate).Leave(); }
  } turn{gate_};
  r.queue_ms = MsSince(queued);
  // Its client may have left while it waited: then nothing runs.
  if (cancelled && cancelled()) return Cancelled(model::kClientGone);

  const size_t pos_index = 1 - tokens_index_;
  const std::string& tokens_name = spec_.tokens_input;
  const std::string& pos_name = spec_.positions_input;
  model::RunContext ctx;  // the turn is ours: nothing to drop while queued
  std::vector<float> logits(static_cast<size_t>(vocab_));
  auto step = [&](const int32_t* ids, size_t n, int64_t first_pos) -> Status {
    std::vector<model::HostTensor> in(2);
    in[tokens_index_] = Int64Tensor(tokens_name, {1, static_cast<int64_t>(n)}, ids, n, 0);
    in[pos_index] = Int64Tensor(pos_name, {static_cast<int64_t>(n)}, nullptr, n, first_pos);
    auto out = model.Infer(in, ctx);
    if (!out.ok()) return out.status();
    const model::HostTensor& l = (*out)[logits_index_];
    if (l.data.size() != logits.size() * sizeof(float)) {
      return Internal("the model returned " + std::to_string(l.data.size()) + " bytes of logits, not " +
                      std::to_string(logits.size() * sizeof(float)));
    }
    std::memcpy(logits.data(), l.data.data(), l.data.size());
    return Status::OK();
  };

  auto start = Clock::now();
  for (int64_t at = 0; at < n_prompt; at += max_prefill_) {
    size_t n = static_cast<size_t>(std::min(max_prefill_, n_prompt - at));
    if (at > 0 && cancelled && cancelled()) return Cancelled(model::kClientGone);
    RETURN_IF_ERROR(step(prompt.data() + at, n, at));
  }
  r.prefill_ms = MsSince(start);

  text::Sampler sampler(req.sampling);
  r.seed = sampler.seed();
  text::Utf8Stream utf8;
  text::StopMatcher stops(req.stop);
  Clock::time_point first_token;
  bool stopped = false;
  HeldLogprobs held;
  size_t fed = 0;  // bytes of text given to the stop matcher
  auto report = [&](text::TokenLogprob&& lp) {
    r.logprobs.push_back(std::move(lp));
    if (on_logprob) on_logprob(r.logprobs.back());
  };
  // The logprobs of the tokens `piece` shows go first, then its text.
  auto emit = [&](const std::string& piece) {
    held.Release(r.text.size() + piece.size(), report);
    if (piece.empty()) return true;
    r.text += piece;
    return on_text ? on_text(piece) : true;
  };
  int64_t pos = n_prompt;
  while (true) {
    int32_t next = sampler.Next(logits.data(), static_cast<int32_t>(vocab_));
    if (r.ids.empty()) first_token = Clock::now();
    r.ids.push_back(next);
    bool eos =
        !req.ignore_eos && std::find(spec_.eos_ids.begin(), spec_.eos_ids.end(), next) != spec_.eos_ids.end();
    if (eos) {
      r.ids.pop_back();  // the end-of-text token is not part of the answer
      r.finish_reason = "stop";
      break;
    }
    sampler.Accept(next);
    // A special token (<|im_start|>, ...) counts but shows no text.
    const std::string bytes = tok.IsSpecial(next) ? std::string() : tok.Bytes(next);
    if (req.top_logprobs >= 0) {
      // Its text starts after the bytes of a character still unfinished.
      held.Add(text::Logprobs(logits.data(), static_cast<int32_t>(vocab_), next, req.top_logprobs),
               fed + utf8.held(), bytes.size());
    }
    std::string whole = utf8.Push(bytes);
    fed += whole.size();
    std::string piece = stops.Push(whole, &stopped);
    if (r.ids.size() == 1) r.first_token_ms = MsSince(start);
    bool wanted = emit(piece) && !(cancelled && cancelled());
    if (stopped) {
      r.finish_reason = "stop";
      break;
    }
    if (!wanted) {
      r.finish_reason = "cancelled";
      break;
    }
    if (static_cast<int64_t>(r.ids.size()) >= budget) {
      r.finish_reason = "length";
      break;
    }
    Status s = step(&next, 1, pos++);
    ++r.decode_steps;
    if (!s.ok()) {
      if (error) *error = s;
      r.finish_reason = "error";
      break;
    }
  }
  if (r.finish_reason != "cancelled" && !stopped) {
    // A character cut off at the end, and text held back for a stop
    // string that may still complete with it.
    std::string tail = stops.Push(utf8.Flush(), &stopped);
    if (stopped) {
      r.finish_reason = "stop";
    } else {
      tail += stops.Flush();
    }
    emit(tail);
    if (!stopped) held.ReleaseAll(report);  // all of the text is out
  }
  if (!r.ids.empty())
    r.decode_ms = std::chrono::duration<double, std::milli>(Clock::now() - first_token).count();
  if (r.finish_reason == "error" && r.text.empty() && error) return *error;
  return r;
}

}  // namespace aotid::serving
