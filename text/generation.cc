#include "text/generation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/json.h"

namespace aotid::text {

using nlohmann::json;

std::string Joined(const std::vector<PromptPart>& parts) {
  std::string out;
  for (const PromptPart& p : parts) out += p.text;
  return out;
}

StatusOr<std::vector<PromptPart>> ApplyChat(const ChatTemplate& chat,
                                            const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return InvalidArgument("\"messages\" is empty: a chat needs at least one message");
  std::vector<PromptPart> out;
  if (messages.front().role != "system") out.push_back({chat.default_preamble});
  for (const ChatMessage& m : messages) {
    auto it = chat.roles.find(m.role);
    if (it == chat.roles.end()) {
      std::string known;
      for (const auto& [name, unused] : chat.roles) known += (known.empty() ? "" : ", ") + name;
      return InvalidArgument("a message's role is \"" + m.role + "\"; the model's chat template has " +
                             known);
    }
    out.push_back({it->second.prefix});
    out.push_back({m.content, false});
    out.push_back({it->second.suffix});
  }
  out.push_back({chat.generation_prompt});
  return out;
}

namespace {

StatusOr<std::string> StringField(const json& j, const char* name, std::string fallback) {
  if (!j.contains(name)) return fallback;
  if (!j[name].is_string())
    return InvalidArgument(std::string("generate.json \"") + name + "\" is not a string");
  return j[name].get<std::string>();
}

StatusOr<int64_t> IntField(const json& j, const char* name, int64_t lo, int64_t hi) {
  if (!j.contains(name) || !j[name].is_number_integer()) {
    return InvalidArgument(std::string("generate.json has no integer \"") + name + "\"");
  }
  int64_t v = j[name].get<int64_t>();
  if (v < lo || v > hi) {
    return InvalidArgument(std::string("generate.json \"") + name + "\" is " + std::to_string(v) +
                           ", outside " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return v;
}

}  // namespace

StatusOr<GenerateSpec> GenerateSpec::FromJson(std::string_view text) {
  return ReadJsonSafely<GenerateSpec>("generate.json", [&]() -> StatusOr<GenerateSpec> {
    json j = ParseJsonOrDiscarded(text);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument("generate.json is not a JSON object");
    if (j.value("kind", "") != "causal_lm") {
      return InvalidArgument("generate.json's kind is not \"causal_lm\", the one aotid runs");
    }
    GenerateSpec g;
    ASSIGN_OR_RETURN(g.tokens_input, StringField(j, "tokens_input", g.tokens_input));
    ASSIGN_OR_RETURN(g.positions_input, StringField(j, "positions_input", g.positions_input));
    ASSIGN_OR_RETURN(g.logits_output, StringField(j, "logits_output", g.logits_output));
    ASSIGN_OR_RETURN(g.max_seq_len, IntField(j, "max_seq_len", 2, int64_t{1} << 24));
    ASSIGN_OR_RETURN(g.max_prefill, IntField(j, "max_prefill", 1, g.max_seq_len));
    ASSIGN_OR_RETURN(g.slots_input, StringField(j, "slots_input", ""));
    if (j.contains("max_sequences")) {
      ASSIGN_OR_RETURN(g.max_sequences, IntField(j, "max_sequences", 1, 4096));
    }
    if (g.max_sequences > 1 && g.slots_input.empty()) {
      return InvalidArgument("generate.json holds " + std::to_string(g.max_sequences) +
                             " sequences but names no \"slots_input\"");
    }
    if (j.contains("cache_bytes_per_sequence")) {
      ASSIGN_OR_RETURN(g.cache_bytes_per_sequence,
                       IntField(j, "cache_bytes_per_sequence", 0, std::numeric_limits<int64_t>::max()));
    }
    if (!j.contains("tokenizer") || !j["tokenizer"].is_object()) {
      return InvalidArgument("generate.json has no tokenizer");
    }
    auto tok = Tokenizer::FromJson(j["tokenizer"].dump());
    if (!tok.ok()) return tok.status();
    // A language model's tokenizer is byte-level BPE: WordPiece lower-cases
    // and drops what it has no piece for, so its text would not come back.
    if ((*tok)->kind() != Tokenizer::Kind::kByteLevelBpe) {
      return InvalidArgument(
          "generate.json's tokenizer is WordPiece (a sentence encoder's); a generating model needs a "
          "byte-level "
          "BPE tokenizer");
    }
    g.tokenizer = std::shared_ptr<const Tokenizer>(std::move(tok).value());
    const int64_t vocab = g.tokenizer->vocab_size();
    if (!j.contains("eos_token_ids") || !j["eos_token_ids"].is_array()) {
      return InvalidArgument("generate.json has no \"eos_token_ids\" list");
    }
    for (const auto& e : j["eos_token_ids"]) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab) {
        return InvalidArgument("generate.json \"eos_token_ids\" has an id outside the vocabulary");
      }
      g.eos_ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    if (j.contains("bos_token_id")) {
      ASSIGN_OR_RETURN(int64_t bos, IntField(j, "bos_token_id", 0, vocab - 1));
      g.bos_id = static_cast<int32_t>(bos);
    }
    if (j.contains("chat")) {
      const json& c = j["chat"];
      if (!c.is_object()) return InvalidArgument("generate.json \"chat\" is not an object");
      ChatTemplate chat;
      for (const char* role : {"system", "user", "assistant"}) {
        if (!c.contains(role)) continue;
        const json& r = c[role];
        if (!r.is_object())
          return InvalidArgument(std::string("generate.json chat role \"") + role + "\" is not an object");
        ChatTemplate::Role piece;
        ASSIGN_OR_RETURN(piece.prefix, StringField(r, "prefix", ""));
        ASSIGN_OR_RETURN(piece.suffix, StringField(r, "suffix", ""));
        chat.roles[role] = std::move(piece);
      }
      if (!chat.roles.contains("user"))
        return InvalidArgument("generate.json's chat template has no user role");
      ASSIGN_OR_RETURN(chat.generation_prompt, StringField(c, "generation_prompt", ""));
      ASSIGN_OR_RETURN(chat.default_preamble, StringField(c, "default_preamble", ""));
      g.chat = std::move(chat);
    }
    return g;
  });
}

Sampler::Sampler(const SamplingParams& params) : p_(params) {
  seed_ = params.seed ? *params.seed
                      : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  rng_.seed(seed_);
}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::Accept(int32_t id) {
  if (p_.presence_penalty != 0 || p_.frequency_penalty != 0) ++counts_[id];
}

const float* Sampler::Penalized(const float* logits, int32_t vocab) {
  if (counts_.empty()) return logits;
  penalized_.assign(logits, logits + vocab);
  for (const auto& [id, n] : counts_) {
    if (id < 0 || id >= vocab) continue;
    penalized_[static_cast<size_t>(id)] -=
        static_cast<float>(n * p_.frequency_penalty + (n > 0 ? p_.presence_penalty : 0.0));
  }
  return penalized_.data();
}

int32_t Sampler::Next(const float* raw, int32_t vocab) {
  const float* logits = Penalized(raw, vocab);
  if (p_.greedy()) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }
  auto& c = scratch_;
  c.resize(static_cast<size_t>(vocab));
  // In double, so that a small temperature cannot overflow; NaN counts as
  // the least likely, so the order stays a strict one.
  for (int32_t i = 0; i < vocab; ++i) {
    double v = static_cast<double>(logits[i]) / p_.temperature;
    c[static_cast<size_t>(i)] = {std::isnan(v) ? -std::numeric_limits<float>::infinity()
                                               : static_cast<float>(std::clamp(v, -3.0e38, 3.0e38)),
                                 i};
  }
  // Highest first; equal logits by id, so the order never depends on the sort.
  auto higher = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = c.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < c.size()) keep = static_cast<size_t>(p_.top_k);
  std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(keep), c.end(), higher);
  c.resize(keep);
  std::vector<double> probs(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(static_cast<double>(c[i].first - c[0].first));
    total += probs[i];
  }
  if (!(total > 0) || !std::isfinite(total)) return c[0].second;  // NaN or inf logits: the highest
  if (p_.min_p > 0) {
    // probs[0] is the likeliest's (exp 0 = 1): keep those of at least min_p.
    size_t n = 1;
    while (n < keep && probs[n] >= p_.min_p) ++n;
    if (n < keep) {
      keep = n;
      total = 0;
      for (size_t i = 0; i < keep; ++i) total += probs[i];
    }
  }
  if (p_.top_p < 1.0) {
    // The fewest tokens whose probability reaches top_p, at least one.
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += probs[n++] / total;
      if (cum >= p_.top_p) break;
    }
    keep = n;
    total = 0;
    for (size_t i = 0; i < keep; ++i) total += probs[i];
  }
  double u = Uniform() * total;
  for (size_t i = 0; i < keep; ++i) {
    u -= probs[i];
    if (u < 0) return c[i].second;
  }
  return c[keep - 1].second;
}

TokenLogprob Logprobs(const float* logits, int32_t vocab, int32_t id, int top) {
  TokenLogprob t;
  t.id = id;
  if (vocab <= 0) return t;
  double most = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < vocab; ++i) most = std::max(most, static_cast<double>(logits[i]));
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - most);
  const double log_z = most + std::log(sum);
  auto lp = [&](int32_t i) { return static_cast<double>(logits[i]) - log_z; };
  if (id >= 0 && id < vocab) t.logprob = lp(id);
  const size_t n = static_cast<size_t>(std::clamp(top, 0, vocab));
  if (n == 0) return t;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
      [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  for (size_t i = 0; i < n; ++i) t.top.emplace_back(order[i], lp(order[i]));
  return t;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::Push(std::string_view text, bool* stopped) {
  held_.append(text);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    *stopped = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold the longest tail that a stop string starts with.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > hold; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace aotid::text
