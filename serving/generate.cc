#include "serving/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/json.h"
#include "base/log.h"

namespace aotid::serving {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

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
  } else if (key == "cache_prompt") {
    RETURN_IF_ERROR(need(v.is_boolean(), "true or false"));
    r->cache_prompt = v.get<bool>();
  } else if (key == "stream") {
    // Triton's clients send it; the route already says which it is.
  } else {
    return InvalidArgument("unknown parameter \"" + key +
                           "\" (known: max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, "
                           "return_token_ids, cache_prompt)");
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
  j["max_sequences"] = spec.max_sequences;
  if (spec.cache_bytes_per_sequence > 0) j["cache_bytes_per_sequence"] = spec.cache_bytes_per_sequence;
  return j;
}

StatusOr<GenerateRequest> ParseGenerateRequest(std::string_view body, const text::GenerateSpec& spec) {
  // The same nesting bound as /infer's tape: a body of '[' is refused at
  // its 33rd byte, not built into a DOM of millions of nodes.
  ASSIGN_OR_RETURN(json j, ParseJson(body, "the request body", RequestJsonLimits(body.size())));
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

namespace {

// ---- the token loop of one answer ----

// What becomes of each token a sequence's model makes: sampling, the end
// token, text as it becomes whole, stop strings, logprobs held with their
// text. The scheduler's thread alone uses it.
class TokenLoop {
 public:
  TokenLoop(const text::GenerateSpec& spec, const GenerateRequest& req, int64_t budget)
      : spec_(spec), req_(req), budget_(budget), sampler_(req.sampling), stops_(req.stop) {
    r_.seed = sampler_.seed();
  }

  // Takes the logits of the sequence's last token and chooses the next;
  // appends what the reader gets to *out. False once the answer has ended
  // (result().finish_reason says why); else last() is fed to the model next.
  bool Next(const float* logits, int32_t vocab, std::vector<Sequence::Event>* out) {
    int32_t next = sampler_.Next(logits, vocab);
    r_.ids.push_back(next);
    if (!req_.ignore_eos &&
        std::find(spec_.eos_ids.begin(), spec_.eos_ids.end(), next) != spec_.eos_ids.end()) {
      r_.ids.pop_back();  // the end-of-text token is not part of the answer
      r_.finish_reason = "stop";
      return false;
    }
    sampler_.Accept(next);
    last_ = next;
    // A special token (<|im_start|>, ...) counts but shows no text.
    const text::Tokenizer& tok = *spec_.tokenizer;
    const std::string bytes = tok.IsSpecial(next) ? std::string() : tok.Bytes(next);
    if (req_.top_logprobs >= 0) {
      // Its text starts after the bytes of a character still unfinished.
      held_.Add(text::Logprobs(logits, vocab, next, req_.top_logprobs), fed_ + utf8_.held(), bytes.size());
    }
    std::string whole = utf8_.Push(bytes);
    fed_ += whole.size();
    Emit(stops_.Push(whole, &stopped_), out);
    if (stopped_) {
      r_.finish_reason = "stop";
      return false;
    }
    if (static_cast<int64_t>(r_.ids.size()) >= budget_) {
      r_.finish_reason = "length";
      return false;
    }
    return true;
  }

  // Ends the answer for `reason` where Next did not ("cancelled",
  // "error"); then, unless cancelled, what was held back goes out: a
  // character cut off at the end, and text that may have started a stop
  // string that cannot complete now.
  void End(const std::string& reason, std::vector<Sequence::Event>* out) {
    if (!reason.empty()) r_.finish_reason = reason;
    if (r_.finish_reason == "cancelled" || stopped_) return;
    std::string tail = stops_.Push(utf8_.Flush(), &stopped_);
    if (stopped_) {
      r_.finish_reason = "stop";
    } else {
      tail += stops_.Flush();
    }
    Emit(tail, out);
    if (!stopped_) {
      held_.ReleaseAll([&](text::TokenLogprob&& lp) { Report(std::move(lp), out); });
    }
  }

  int32_t last() const { return last_; }
  GenerateResult& result() { return r_; }

 private:
  void Report(text::TokenLogprob&& lp, std::vector<Sequence::Event>* out) {
    r_.logprobs.push_back(lp);
    out->push_back({false, {}, std::move(lp)});
  }
  // The logprobs of the tokens `piece` shows go first, then its text.
  void Emit(const std::string& piece, std::vector<Sequence::Event>* out) {
    held_.Release(r_.text.size() + piece.size(),
                  [&](text::TokenLogprob&& lp) { Report(std::move(lp), out); });
    if (piece.empty()) return;
    r_.text += piece;
    out->push_back({true, piece, {}});
  }

  const text::GenerateSpec& spec_;
  const GenerateRequest& req_;
  const int64_t budget_;
  text::Sampler sampler_;
  text::Utf8Stream utf8_;
  text::StopMatcher stops_;
  HeldLogprobs held_;
  size_t fed_ = 0;  // bytes of text given to the stop matcher
  bool stopped_ = false;
  int32_t last_ = -1;
  GenerateResult r_;
};

}  // namespace

// ---- sequences ----

struct Sequence::State {
  // Set before the scheduler has it; read-only after.
  GenerateRequest req;
  std::vector<int32_t> prompt;
  std::function<bool()> gone;
  std::shared_ptr<model::LoadedModel> model;
  // Keeps the model resident from the sequence's start to its end: its
  // cache is in the model between its calls (LoadedModel::KeepResident).
  std::shared_ptr<void> keep;
  std::weak_ptr<Generator::Scheduler> scheduler;
  Clock::time_point queued;
  // An /infer run of the model instead of a sequence (RunAlone).
  bool alone = false;
  std::vector<model::HostTensor> alone_inputs;
  model::RunContext alone_ctx;
  model::LoadedModel::Done alone_done;

  std::atomic<bool> cancel{false};  // its reader or its client left

  // The scheduler's thread alone.
  std::unique_ptr<TokenLoop> loop;
  int slot = -1;
  int64_t prefilled = 0;  // the prompt's tokens in the slot's cache
  int64_t position = 0;   // where the next fed token goes
  bool decoding = false;  // has a token to feed (TokenLoop::last)
  Clock::time_point admitted, prefill_start, first_token, gone_asked;

  // Shared with the reader.
  Mutex mu;
  CondVar changed;
  std::vector<Event> events GUARDED_BY(mu);
  bool started GUARDED_BY(mu) = false;
  bool done GUARDED_BY(mu) = false;
  Status error GUARDED_BY(mu);       // why it never made a token
  Status late_error GUARDED_BY(mu);  // why it ended early after some
  GenerateResult result GUARDED_BY(mu);
  std::function<void()> when_started GUARDED_BY(mu);
  std::function<void()> when_done GUARDED_BY(mu);

  // Hands `events` to the reader; with `end`, the sequence's end too.
  void Publish(std::vector<Event>* events, bool end, GenerateResult* r = nullptr, Status err = Status::OK(),
               Status late = Status::OK()) EXCLUDES(mu) {
    std::function<void()> on_started, on_done;
    {
      MutexLock lock(&mu);
      for (auto& e : *events) this->events.push_back(std::move(e));
      events->clear();
      if (!this->events.empty() || end) {
        started = true;
        on_started = std::move(when_started);
        when_started = nullptr;
      }
      if (end) {
        done = true;
        if (r) result = std::move(*r);
        error = std::move(err);
        late_error = std::move(late);
        on_done = std::move(when_done);
        when_done = nullptr;
      }
      changed.SignalAll();
    }
    if (on_started) on_started();
    if (on_done) on_done();
  }
};

// The scheduler of one generator's sequences: one thread that makes every
// call of the model. What the scheduler's thread alone touches is not
// guarded; what requests touch is, by mu_.
class Generator::Scheduler : public std::enable_shared_from_this<Generator::Scheduler> {
 public:
  struct Config {
    text::GenerateSpec spec;
    Inputs inputs;
    size_t logits_index;
    int64_t vocab;
    int64_t max_prefill;
    int slots;
    std::string label;  // the version, in the log
  };
  explicit Scheduler(Config c) : c_(std::move(c)), slots_(static_cast<size_t>(c_.slots)) {
    chunk_tokens_ = std::min<int64_t>(kMinChunk, c_.max_prefill);
  }

  void StartThread() {
    thread_ = std::thread([self = shared_from_this()] { self->Loop(); });
  }
  // Ends the thread once what it has is done (ended as unavailable).
  void Stop() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      wake_.SignalAll();
    }
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // its last sequence's reply held the generator: it ends by itself
    } else {
      thread_.join();
    }
  }

  int Bound() const { return kMaxWaitingPerSlot * c_.slots; }

  Status Busy(int waiting) const {
    return Unavailable("the model is busy: its " + std::to_string(c_.slots) + " sequence slot" +
                       (c_.slots == 1 ? " is" : "s are") + " in use and " + std::to_string(waiting) +
                       " requests already wait for one; try again shortly");
  }

  Status Enqueue(std::shared_ptr<Sequence::State> s) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (stop_) return Unavailable("the model is being unloaded");
    const int waiting = static_cast<int>(queue_.size());
    if (waiting >= Bound()) return Busy(waiting);
    queue_.push_back(std::move(s));
    waiting_changed_.SignalAll();
    wake_.SignalAll();
    return Status::OK();
  }

  // Takes `s` out of the queue and ends it, when it still waits there
  // (at once, even while the model is busy with a long call); else the
  // scheduler ends it at its next step.
  void Withdraw(const std::shared_ptr<Sequence::State>& s) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      auto it = std::find(queue_.begin(), queue_.end(), s);
      if (it == queue_.end()) {
        wake_.SignalAll();
        return;
      }
      queue_.erase(it);
      waiting_changed_.SignalAll();
    }
    Refuse(s, Cancelled(model::kClientGone));
  }

  int Waiting() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return static_cast<int>(queue_.size());
  }

  bool AwaitWaiting(int n) EXCLUDES(mu_) {
    auto deadline = Clock::now() + std::chrono::seconds(10);
    MutexLock lock(&mu_);
    while (static_cast<int>(queue_.size()) != n) {
      if (!waiting_changed_.WaitUntil(&mu_, deadline)) return static_cast<int>(queue_.size()) == n;
    }
    return true;
  }

  GenerateStats Stats() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    GenerateStats s = stats_;
    s.slots = c_.slots;
    s.waiting = static_cast<int>(queue_.size());
    return s;
  }

 private:
  // The fewest prompt tokens one chunk takes while others decode (see Chunk).
  static constexpr int64_t kMinChunk = 32;
  // The fewest rows of a prompt's call, where the prompt has them: a CPU
  // matrix product of fewer rows takes another kernel, which rounds
  // otherwise.
  static constexpr int64_t kMinRows = 4;
  struct Slot {
    std::vector<int32_t> tokens;  // what its cache holds, from position 0
    bool busy = false;
    uint64_t used = 0;  // when its last sequence ended: the least recent is taken first
  };
  using SeqPtr = std::shared_ptr<Sequence::State>;

  void Loop() {
    while (true) {
      std::vector<SeqPtr> waiting;
      {
        MutexLock lock(&mu_);
        while (!stop_ && queue_.empty() && active_.empty()) wake_.Wait(&mu_);
        if (stop_) break;
        waiting.assign(queue_.begin(), queue_.end());
      }
      AskWhoLeft(waiting);
      DropLeavers();
      Admit();
      if (active_.empty()) continue;
      DecodeStep();
      PrefillChunk();
      MaybeLog();
    }
    // Stopping: nothing more runs.
    std::deque<SeqPtr> queued;
    {
      MutexLock lock(&mu_);
      queued.swap(queue_);
    }
    for (auto& s : std::vector<SeqPtr>(active_)) End(s, "cancelled");
    for (auto& s : queued) Refuse(s, Unavailable("the model is being unloaded"));
  }

  // Asks the clients of waiting requests (every 20 ms each) and of the
  // sequences in slots (every step) whether they are still there; the
  // question may be a syscall, asked without the lock.
  void AskWhoLeft(const std::vector<SeqPtr>& waiting) {
    const auto now = Clock::now();
    for (const auto& s : waiting) {
      if (s->cancel || now - s->gone_asked < std::chrono::milliseconds(20)) continue;
      s->gone_asked = now;
      if (s->gone && s->gone()) s->cancel = true;
    }
    for (const auto& s : active_) {
      if (!s->cancel && s->gone && s->gone()) s->cancel = true;
    }
  }

  void DropLeavers() {
    std::vector<SeqPtr> left;
    {
      MutexLock lock(&mu_);
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->cancel) {
          left.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      if (!left.empty()) waiting_changed_.SignalAll();
    }
    for (auto& s : left) Refuse(s, Cancelled(model::kClientGone));
    for (size_t i = 0; i < active_.size();) {
      if (active_[i]->cancel) {
        End(active_[i], "cancelled");  // takes it out of active_
      } else {
        ++i;
      }
    }
  }

  // Gives free slots to the waiting requests in order. An /infer run at
  // the head waits for the slots to empty and runs alone.
  void Admit() {
    while (true) {
      SeqPtr s;
      {
        MutexLock lock(&mu_);
        if (queue_.empty()) return;
        if (queue_.front()->alone) {
          if (!active_.empty()) return;
        } else if (std::none_of(slots_.begin(), slots_.end(), [](const Slot& x) { return !x.busy; })) {
          return;
        }
        s = std::move(queue_.front());
        queue_.pop_front();
        waiting_changed_.SignalAll();
      }
      if (s->alone) {
        RunAloneNow(s);
        continue;
      }
      Place(s);
    }
  }

  // A free slot for `s`: the one holding the longest start of its prompt,
  // else the one left longest ago.
  void Place(const SeqPtr& s) {
    // A runner started anew holds none of what the slots held.
    if (const int64_t epoch = s->model->state_epoch(); epoch != epoch_) {
      Forget();
      epoch_ = epoch;
    }
    size_t best = slots_.size();
    size_t best_common = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].busy) continue;
      const auto& held = slots_[i].tokens;
      size_t n = s->req.cache_prompt ? std::min(held.size(), s->prompt.size()) : 0;
      size_t common = static_cast<size_t>(
          std::mismatch(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(n), s->prompt.begin())
              .first -
          held.begin());
      if (best == slots_.size() || common > best_common ||
          (common == best_common && slots_[i].used < slots_[best].used)) {
        best = i;
        best_common = common;
      }
    }
    Slot& slot = slots_[best];
    slot.busy = true;
    // At least the prompt's last kMinRows tokens are computed: the last
    // one's logits choose the first token, and a call of fewer rows would
    // round otherwise than the calls that computed the prompt cold (a CPU
    // matrix product of under 4 rows takes another kernel), and a reused
    // prompt must answer what a cold one answers.
    const auto reused = static_cast<int64_t>(
        std::min<size_t>(best_common, s->prompt.size() > kMinRows ? s->prompt.size() - kMinRows : 0));
    slot.tokens.resize(static_cast<size_t>(reused));
    s->slot = static_cast<int>(best);
    s->prefilled = reused;
    s->loop->result().cached_tokens = reused;
    s->admitted = Clock::now();
    s->loop->result().queue_ms = Ms(s->queued, s->admitted);
    active_.push_back(s);
    MutexLock lock(&mu_);
    stats_.active = static_cast<int>(active_.size());
    stats_.reused_tokens += static_cast<uint64_t>(reused);
  }

  void RunAloneNow(const SeqPtr& s) {
    auto out = s->model->Infer(s->alone_inputs, s->alone_ctx);
    Forget();  // it wrote the cache where it liked
    auto done = std::move(s->alone_done);
    done(std::move(out));
  }

  // One call of the model: `rows` rows of `width` tokens each.
  StatusOr<const float*> Call(model::LoadedModel& model, const std::vector<int32_t>& tokens,
                              const std::vector<int64_t>& positions, const std::vector<int64_t>& slots,
                              int64_t rows, int64_t width) {
    const Inputs& in = c_.inputs;
    std::vector<model::HostTensor> inputs(in.slotted ? 3 : 2);
    auto fill = [](model::HostTensor& t, const std::string& name, std::vector<int64_t> shape,
                   const auto& values) {
      t.name = name;
      t.dtype = model::DType::kInt64;
      t.shape = std::move(shape);
      t.data.resize(values.size() * sizeof(int64_t));
      auto* out = reinterpret_cast<int64_t*>(t.data.data());
      for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<int64_t>(values[i]);
    };
    fill(inputs[in.tokens], c_.spec.tokens_input, {rows, width}, tokens);
    if (in.slotted) {
      fill(inputs[in.positions], c_.spec.positions_input, {rows, width}, positions);
      fill(inputs[in.slots], c_.spec.slots_input, {rows}, slots);
    } else {
      fill(inputs[in.positions], c_.spec.positions_input, {width}, positions);
    }
    auto out = model.Infer(inputs, model::RunContext{});
    if (!out.ok()) {
      Forget();  // a call that failed may have taken the runner, and its cache, with it
      return out.status();
    }
    const model::HostTensor& l = (*out)[c_.logits_index];
    const size_t want = static_cast<size_t>(rows * c_.vocab) * sizeof(float);
    if (l.data.size() != want) {
      return Internal("the model returned " + std::to_string(l.data.size()) + " bytes of logits, not " +
                      std::to_string(want));
    }
    logits_.resize(static_cast<size_t>(rows * c_.vocab));
    std::memcpy(logits_.data(), l.data.data(), want);
    return logits_.data();
  }

  // No slot's contents can be reused any more.
  void Forget() {
    for (Slot& slot : slots_) slot.tokens.clear();
  }

  // Every sequence with a token to feed, one row each, in one call.
  void DecodeStep() {
    std::vector<SeqPtr> rows;
    for (const auto& s : active_) {
      if (s->decoding) rows.push_back(s);
    }
    if (rows.empty()) return;
    std::vector<int32_t> tokens;
    std::vector<int64_t> positions, slots;
    for (const auto& s : rows) {
      tokens.push_back(s->loop->last());
      positions.push_back(s->position);
      slots.push_back(s->slot);
    }
    // Always the same number of rows, padded with copies of the first
    // (they write what it writes, where it writes it): a CPU matrix
    // product's rounding depends on its row count (fewer than 4 rows take
    // another kernel), and a sequence's tokens must not depend on how many
    // others run beside it.
    const auto b = static_cast<int64_t>(rows.size());
    const int64_t call_rows = c_.inputs.slotted ? std::max<int64_t>(b, c_.slots) : b;
    for (int64_t i = b; i < call_rows; ++i) {
      tokens.push_back(tokens[0]);
      positions.push_back(positions[0]);
      slots.push_back(slots[0]);
    }
    const auto t0 = Clock::now();
    auto logits = Call(*rows[0]->model, tokens, positions, slots, call_rows, 1);
    const double ms = Ms(t0, Clock::now());
    if (!logits.ok()) {
      for (auto& s : rows) End(s, "error", logits.status());
      return;
    }
    step_ms_ = step_ms_ == 0 ? ms : 0.8 * step_ms_ + 0.2 * ms;
    {
      MutexLock lock(&mu_);
      ++stats_.decode_steps;
      stats_.decode_tokens += static_cast<uint64_t>(b);
      stats_.decode_seconds += ms / 1000;
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      const SeqPtr& s = rows[i];
      slots_[static_cast<size_t>(s->slot)].tokens.push_back(tokens[i]);
      ++s->position;
      ++s->loop->result().decode_steps;
      Token(s, *logits + static_cast<int64_t>(i) * c_.vocab);
    }
  }

  // How many prompt tokens one call takes. Alone, a prompt goes in as
  // few calls as the model allows. While others decode, a chunk costs
  // about one decode step: the others wait at most that long for their
  // next token. Both costs are measured as they run (a chunk's time per
  // token, a step's time); at least kMinChunk tokens, since a chunk's
  // fixed cost (reading every weight once, as a step does) is paid per
  // call and much smaller chunks would make a long prompt's first token
  // many times slower.
  int64_t Chunk(bool others_decode) const {
    if (!others_decode) return c_.max_prefill;
    return chunk_tokens_;
  }

  void PrefillChunk() {
    SeqPtr s;
    bool others = false;
    for (const auto& x : active_) {
      if (x->decoding) {
        others = true;
      } else if (!s && x->prefilled < static_cast<int64_t>(x->prompt.size())) {
        s = x;
      }
    }
    if (!s) return;
    const auto total = static_cast<int64_t>(s->prompt.size());
    int64_t n = std::min(Chunk(others), total - s->prefilled);
    // The last chunk keeps kMinRows tokens (see Place).
    if (const int64_t rest = total - s->prefilled - n; rest > 0 && rest < kMinRows && n > kMinRows) {
      n -= kMinRows - rest;
    }
    if (s->prefill_start == Clock::time_point()) s->prefill_start = Clock::now();
    std::vector<int32_t> tokens(s->prompt.begin() + s->prefilled, s->prompt.begin() + s->prefilled + n);
    std::vector<int64_t> positions(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = s->prefilled + i;
    const auto t0 = Clock::now();
    auto logits = Call(*s->model, tokens, positions, {s->slot}, 1, n);
    const double ms = Ms(t0, Clock::now());
    if (!logits.ok()) {
      End(s, "error", logits.status());
      return;
    }
    if (n >= kMinChunk) {
      const double per_token = ms / static_cast<double>(n);
      per_token_ms_ = per_token_ms_ == 0 ? per_token : 0.8 * per_token_ms_ + 0.2 * per_token;
      if (step_ms_ > 0) {
        chunk_tokens_ = std::clamp<int64_t>(static_cast<int64_t>(step_ms_ / per_token_ms_), kMinChunk,
                                            std::max<int64_t>(kMinChunk, c_.max_prefill));
        chunk_tokens_ = std::min(chunk_tokens_, c_.max_prefill);
      }
    }
    {
      MutexLock lock(&mu_);
      ++stats_.prefill_calls;
      stats_.prefill_tokens += static_cast<uint64_t>(n);
      stats_.prefill_seconds += ms / 1000;
    }
    auto& held = slots_[static_cast<size_t>(s->slot)].tokens;
    held.insert(held.end(), tokens.begin(), tokens.end());
    s->prefilled += n;
    if (s->prefilled < total) return;
    s->loop->result().prefill_ms = Ms(s->prefill_start, Clock::now());
    s->position = total;
    Token(s, *logits);
  }

  // The logits of `s`'s last token: its next token, and what it shows.
  void Token(const SeqPtr& s, const float* logits) {
    std::vector<Sequence::Event> events;
    const bool more = s->loop->Next(logits, static_cast<int32_t>(c_.vocab), &events);
    GenerateResult& r = s->loop->result();
    if (r.ids.size() == 1 && s->first_token == Clock::time_point()) {
      s->first_token = Clock::now();
      r.first_token_ms = Ms(s->prefill_start, s->first_token);
    }
    if (!more) {
      if (!events.empty()) s->Publish(&events, false);
      End(s, "");
      return;
    }
    s->decoding = true;
    if (!events.empty()) s->Publish(&events, false);
  }

  // Ends `s` (in a slot) for `reason` ("" where its token loop ended it),
  // frees its slot and tells its reader.
  // Takes `s` by value: it may be an element of active_, which this erases.
  void End(SeqPtr s, const std::string& reason, const Status& error = Status::OK()) {
    std::vector<Sequence::Event> events;
    s->loop->End(reason, &events);
    GenerateResult& r = s->loop->result();
    if (s->first_token != Clock::time_point()) r.decode_ms = Ms(s->first_token, Clock::now());
    Slot& slot = slots_[static_cast<size_t>(s->slot)];
    slot.busy = false;
    slot.used = ++clock_;
    active_.erase(std::find(active_.begin(), active_.end(), s));
    {
      MutexLock lock(&mu_);
      stats_.active = static_cast<int>(active_.size());
    }
    const bool none = r.ids.empty() && r.text.empty();
    s->keep.reset();
    GenerateResult result = std::move(r);
    // A failure before any text is the request's error; after some, the
    // answer so far ends with it.
    if (!error.ok() && none) {
      s->Publish(&events, true, &result, error);
    } else {
      s->Publish(&events, true, &result, Status::OK(), error);
    }
  }

  // Ends a request that never had a slot.
  void Refuse(const SeqPtr& s, const Status& why) {
    if (s->alone) {
      auto done = std::move(s->alone_done);
      if (done) done(why);
      return;
    }
    std::vector<Sequence::Event> none;
    GenerateResult r;
    r.prompt_tokens = static_cast<int64_t>(s->prompt.size());
    s->keep.reset();
    s->Publish(&none, true, &r, why);
  }

  // Every 10 s of work, what was done, in the daemon's log.
  void MaybeLog() {
    const auto now = Clock::now();
    if (logged_at_ == Clock::time_point()) {
      logged_at_ = now;
      logged_ = Stats();
      return;
    }
    if (now - logged_at_ < std::chrono::seconds(10)) return;
    GenerateStats s = Stats();
    const double steps = static_cast<double>(s.decode_steps - logged_.decode_steps);
    const double decoded = static_cast<double>(s.decode_tokens - logged_.decode_tokens);
    const double prefilled = static_cast<double>(s.prefill_tokens - logged_.prefill_tokens);
    const double decode_s = s.decode_seconds - logged_.decode_seconds;
    const double prefill_s = s.prefill_seconds - logged_.prefill_seconds;
    char line[320];
    std::snprintf(line, sizeof line,
                  "%d of %d sequence slots active, %d waiting; %.2f tokens a step; prefill %.0f tokens/s, "
                  "decode %.0f tokens/s; %llu prompt tokens reused",
                  s.active, s.slots, s.waiting, steps > 0 ? decoded / steps : 0.0,
                  prefill_s > 0 ? prefilled / prefill_s : 0.0, decode_s > 0 ? decoded / decode_s : 0.0,
                  static_cast<unsigned long long>(s.reused_tokens - logged_.reused_tokens));
    LOG_INFO << (c_.label.empty() ? std::string("generate") : c_.label) << ": " << line;
    logged_at_ = now;
    logged_ = s;
  }

  static double Ms(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double, std::milli>(to - from).count();
  }

  const Config c_;
  std::thread thread_;

  Mutex mu_;
  CondVar wake_;
  CondVar waiting_changed_;
  std::deque<SeqPtr> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  GenerateStats stats_ GUARDED_BY(mu_);

  // The scheduler's thread alone.
  std::vector<Slot> slots_;
  std::vector<SeqPtr> active_;  // in slots, in the order they came
  uint64_t clock_ = 0;
  int64_t epoch_ = 0;  // the model's state_epoch() the slots' contents are of
  std::vector<float> logits_;
  double step_ms_ = 0;       // a decode step, lately
  double per_token_ms_ = 0;  // a prompt token in a chunk, lately
  int64_t chunk_tokens_;
  Clock::time_point logged_at_;
  GenerateStats logged_;
};

StatusOr<std::shared_ptr<Generator>> Generator::Create(text::GenerateSpec spec, const model::ModelSpec& model,
                                                       int64_t max_sequences, std::string label) {
  auto find = [](const std::vector<model::TensorSpec>& v, const std::string& name) -> std::optional<size_t> {
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i].name == name) return i;
    }
    return std::nullopt;
  };
  const std::string what = "the model's generate spec does not fit the compiled model: ";
  const bool slotted = !spec.slots_input.empty();
  const size_t want = slotted ? 3 : 2;
  if (model.inputs.size() != want) {
    return InvalidArgument(what + "it takes " + std::to_string(model.inputs.size()) + " inputs, " +
                           (slotted ? "a causal language model of several sequences takes tokens, positions "
                                      "and slots"
                                    : "a causal language model takes tokens and positions"));
  }
  auto tok = find(model.inputs, spec.tokens_input);
  auto pos = find(model.inputs, spec.positions_input);
  auto slot = slotted ? find(model.inputs, spec.slots_input) : std::optional<size_t>(0);
  auto logits = find(model.outputs, spec.logits_output);
  if (!tok || !pos || !slot || *tok == *pos || (slotted && (*slot == *tok || *slot == *pos))) {
    return InvalidArgument(what + "its inputs are not \"" + spec.tokens_input + "\" and \"" +
                           spec.positions_input + "\"" +
                           (slotted ? " and \"" + spec.slots_input + "\"" : ""));
  }
  const model::TensorSpec& t = model.inputs[*tok];
  const model::TensorSpec& p = model.inputs[*pos];
  int64_t rows = 1;  // the most sequences one call takes
  if (!slotted) {
    if (t.dtype != model::DType::kInt64 || t.shape.size() != 2 || t.shape[0] != 1 ||
        p.dtype != model::DType::kInt64 || p.shape.size() != 1) {
      return InvalidArgument(what + "tokens must be INT64 [1, seq] and positions INT64 [seq]; they are " +
                             std::string(DTypeName(t.dtype)) + " " + model::ShapeString(t.shape) + " and " +
                             std::string(DTypeName(p.dtype)) + " " + model::ShapeString(p.shape));
    }
  } else {
    const model::TensorSpec& s = model.inputs[*slot];
    if (t.dtype != model::DType::kInt64 || t.shape.size() != 2 || p.dtype != model::DType::kInt64 ||
        p.shape.size() != 2 || s.dtype != model::DType::kInt64 || s.shape.size() != 1) {
      return InvalidArgument(what +
                             "tokens and positions must be INT64 [batch, seq] and slots INT64 [batch]; "
                             "they are " +
                             std::string(DTypeName(t.dtype)) + " " + model::ShapeString(t.shape) + ", " +
                             std::string(DTypeName(p.dtype)) + " " + model::ShapeString(p.shape) + " and " +
                             std::string(DTypeName(s.dtype)) + " " + model::ShapeString(s.shape));
    }
    if (t.shape[0] > 0) {
      rows = t.shape[0];
    } else if (t.dims.size() == 2 && t.dims[0]) {
      if (t.dims[0]->min > 1) {
        return InvalidArgument(what + "its batch dim starts at " + std::to_string(t.dims[0]->min) +
                               ": a sequence alone is one row");
      }
      rows = t.dims[0]->max;
    } else {
      rows = spec.max_sequences;
    }
    if (t.shape[0] > 1) {
      return InvalidArgument(what + "its batch dim is fixed at " + std::to_string(t.shape[0]) +
                             ": a sequence alone is one row");
    }
  }
  if (!logits) return InvalidArgument(what + "it has no output \"" + spec.logits_output + "\"");
  const model::TensorSpec& l = model.outputs[*logits];
  if (l.dtype != model::DType::kFloat32 || l.shape.size() != 2 || (!slotted && l.shape[0] != 1) ||
      l.shape[1] <= 0) {
    return InvalidArgument(what + "logits must be FP32 [" + (slotted ? "batch" : "1") +
                           ", vocab]; they are " + std::string(DTypeName(l.dtype)) + " " +
                           model::ShapeString(l.shape));
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
  // Slots past the calls' rows could never decode together with the rest.
  int64_t slots = std::min(spec.max_sequences, rows);
  if (max_sequences > 0) slots = std::min(slots, max_sequences);
  Inputs inputs{*tok, *pos, *slot, slotted};
  return std::shared_ptr<Generator>(new Generator(std::move(spec), inputs, *logits, l.shape[1], max_prefill,
                                                  static_cast<int>(slots), std::move(label)));
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

// ---- Sequence ----

Sequence::~Sequence() { Cancel(); }

void Sequence::Cancel() {
  if (state_->cancel.exchange(true)) return;
  if (auto s = state_->scheduler.lock()) s->Withdraw(state_);
}

void Sequence::WhenStarted(std::function<void()> fn) {
  {
    MutexLock lock(&state_->mu);
    if (!state_->started) {
      state_->when_started = std::move(fn);
      return;
    }
  }
  fn();
}

void Sequence::WhenDone(std::function<void()> fn) {
  {
    MutexLock lock(&state_->mu);
    if (!state_->done) {
      state_->when_done = std::move(fn);
      return;
    }
  }
  fn();
}

Status Sequence::Failure() const {
  MutexLock lock(&state_->mu);
  return state_->done ? state_->error : Status::OK();
}

void AnswerWhenReady(const std::shared_ptr<Sequence>& seq, bool stream, http::Response& res,
                     http::Finish answer) {
  http::Reply reply = res.Defer();
  auto ready = [reply, answer = std::move(answer)] { reply(answer); };
  if (stream) {
    seq->WhenStarted(std::move(ready));
  } else {
    seq->WhenDone(std::move(ready));
  }
}

StatusOr<GenerateResult> Sequence::Follow(const std::function<bool(std::string_view)>& on_text,
                                          const std::function<bool()>& cancelled, Status* error,
                                          const std::function<void(const text::TokenLogprob&)>& on_logprob) {
  State& s = *state_;
  bool reading = true;  // false once the reader wants no more
  while (true) {
    std::vector<Event> events;
    bool done = false;
    {
      MutexLock lock(&s.mu);
      if (s.events.empty() && !s.done) {
        s.changed.WaitUntil(&s.mu, Clock::now() + std::chrono::milliseconds(50));
      }
      events.swap(s.events);
      done = s.done;
    }
    for (auto& e : events) {
      if (!reading) break;
      if (!e.is_text) {
        if (on_logprob) on_logprob(e.logprob);
      } else if (on_text && !on_text(e.text)) {
        reading = false;
      }
    }
    if (done) break;
    // Asked without the lock: it may be a syscall.
    if (reading && cancelled && cancelled()) reading = false;
    if (!reading) Cancel();  // then waits for its end: its slot is free when this returns
  }
  MutexLock lock(&s.mu);
  if (!s.error.ok()) return s.error;
  GenerateResult r = s.result;
  if (!reading) r.finish_reason = "cancelled";
  if (!s.late_error.ok()) {
    if (r.text.empty() && error) return s.late_error;
    if (error) *error = s.late_error;
  }
  return r;
}

// ---- Generator ----

Generator::Generator(text::GenerateSpec spec, Inputs inputs, size_t logits_index, int64_t vocab,
                     int64_t max_prefill, int slots, std::string label)
    : spec_(std::move(spec)),
      inputs_(inputs),
      logits_index_(logits_index),
      vocab_(vocab),
      max_prefill_(max_prefill),
      slots_(slots) {
  scheduler_ = std::make_shared<Scheduler>(
      Scheduler::Config{spec_, inputs_, logits_index_, vocab_, max_prefill_, slots_, std::move(label)});
  scheduler_->StartThread();
}

Generator::~Generator() { scheduler_->Stop(); }

Status Generator::Admit() const {
  int n = scheduler_->Waiting();
  return n < scheduler_->Bound() ? Status::OK() : scheduler_->Busy(n);
}

int Generator::waiting() const { return scheduler_->Waiting(); }

GenerateStats Generator::Stats() const { return scheduler_->Stats(); }

bool Generator::TEST_AwaitWaiting(int n) const { return scheduler_->AwaitWaiting(n); }

StatusOr<std::shared_ptr<Sequence>> Generator::Start(std::shared_ptr<model::LoadedModel> model,
                                                     GenerateRequest req, std::vector<int32_t> prompt,
                                                     std::function<bool()> gone) const {
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt == 0 || n_prompt >= spec_.max_seq_len)
    return InvalidArgument("the prompt does not fit the model");
  auto s = std::make_shared<Sequence::State>();
  s->req = std::move(req);
  s->prompt = std::move(prompt);
  s->gone = std::move(gone);
  s->model = std::move(model);
  s->keep = s->model->KeepResident();
  s->scheduler = scheduler_;
  s->queued = Clock::now();
  const int64_t budget = std::min(s->req.max_tokens, spec_.max_seq_len - n_prompt);
  s->loop = std::make_unique<TokenLoop>(spec_, s->req, budget);
  s->loop->result().prompt_tokens = n_prompt;
  RETURN_IF_ERROR(scheduler_->Enqueue(s));
  return std::shared_ptr<Sequence>(new Sequence(std::move(s)));
}

StatusOr<GenerateResult> Generator::Run(
    std::shared_ptr<model::LoadedModel> model, const GenerateRequest& req, const std::vector<int32_t>& prompt,
    const std::function<bool(std::string_view)>& on_text, const std::function<bool()>& cancelled,
    Status* error, const std::function<void(const text::TokenLogprob&)>& on_logprob) const {
  // The scheduler asks `cancelled` while the request waits; the reader
  // between tokens.
  ASSIGN_OR_RETURN(auto seq, Start(std::move(model), req, prompt, cancelled));
  return seq->Follow(on_text, cancelled, error, on_logprob);
}

Status Generator::RunAlone(std::shared_ptr<model::LoadedModel> model, std::vector<model::HostTensor> inputs,
                           model::RunContext ctx, model::LoadedModel::Done done) const {
  auto s = std::make_shared<Sequence::State>();
  s->alone = true;
  s->model = std::move(model);
  s->gone = ctx.cancelled;
  s->alone_inputs = std::move(inputs);
  s->alone_ctx = std::move(ctx);
  s->alone_done = std::move(done);
  s->queued = Clock::now();
  return scheduler_->Enqueue(std::move(s));
}

}  // namespace aotid::serving
