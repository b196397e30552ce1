#include "serving/openai.h"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "base/fs.h"
#include "base/json.h"
#include "storage/model_store.h"

namespace aotid::serving {
namespace {

using json = nlohmann::json;
constexpr char kJson[] = "application/json";

// Request text (a prompt, a stop string) may not be UTF-8: it becomes
// U+FFFD in the answer instead of an exception.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string ErrorType(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "invalid_request_error";  // as OpenAI types an unknown model
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

// What a request refuses: the parameter and why.
struct Bad {
  std::string param, message;
};

// The parameters both endpoints take, read into `r`. nullopt when `key`
// is not one of them; a Bad for a value aotid cannot honour.
std::optional<std::optional<Bad>> CommonParameter(const std::string& key, const json& v, OpenAiRequest* r) {
  using Result = std::optional<std::optional<Bad>>;
  auto bad = [&](const std::string& why) -> Result { return std::optional<Bad>(Bad{key, key + " " + why}); };
  const Result ok = std::optional<Bad>();
  auto number_in = [&](double lo, double hi, double* out) -> Result {
    if (!v.is_number() || v.get<double>() < lo || v.get<double>() > hi) {
      return bad("must be a number from " + json(lo).dump() + " to " + json(hi).dump());
    }
    *out = v.get<double>();
    return ok;
  };
  text::SamplingParams& s = r->generate.sampling;
  if (key == "temperature") return number_in(0, 2, &s.temperature);
  if (key == "top_p") {
    Result res = number_in(0, 1, &s.top_p);
    if (res && !*res && s.top_p == 0) {
      s.top_p = 1;  // nothing but the likeliest token
      s.top_k = 1;
    }
    return res;
  }
  if (key == "min_p") return number_in(0, 1, &s.min_p);
  if (key == "presence_penalty") return number_in(-2, 2, &s.presence_penalty);
  if (key == "frequency_penalty") return number_in(-2, 2, &s.frequency_penalty);
  if (key == "top_k") {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > (1u << 24))
      return bad("must be an integer from 0 (every token) to 16777216");
    s.top_k = static_cast<int>(v.get<uint64_t>());
    return ok;
  }
  if (key == "seed") {
    if (!v.is_number_integer()) return bad("must be an integer");
    s.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
    return ok;
  }
  if (key == "max_tokens" || key == "max_completion_tokens") {
    if (v.is_null()) return ok;
    if (!v.is_number_unsigned() || v.get<uint64_t>() < 1 || v.get<uint64_t>() > (1u << 31))
      return bad("must be an integer from 1 to 2147483648 (the model's context bounds it too)");
    // Both given: one limit, said twice, or a mistake that no choice between
    // them would make right.
    if (r->max_tokens_given && r->generate.max_tokens != v.get<int64_t>())
      return bad("differs from the other of max_tokens and max_completion_tokens; give one");
    r->generate.max_tokens = v.get<int64_t>();
    r->max_tokens_given = true;
    return ok;
  }
  if (key == "stop") {
    std::vector<std::string> stops;
    if (v.is_string()) {
      stops.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const auto& e : v) {
        if (!e.is_string()) return bad("must be a string or a list of strings");
        stops.push_back(e.get<std::string>());
      }
    } else {
      return bad("must be a string or a list of strings");
    }
    if (stops.size() > 16) return bad("holds more than 16 strings");
    for (const auto& e : stops) {
      if (e.empty() || e.size() > 1000 || !text::ValidUtf8(e))
        return bad("must be UTF-8 strings of 1 to 1000 bytes");
    }
    r->generate.stop = std::move(stops);
    return ok;
  }
  if (key == "stream") {
    if (!v.is_boolean()) return bad("must be true or false");
    r->stream = v.get<bool>();
    return ok;
  }
  if (key == "stream_options") {
    if (!v.is_object()) return bad("must be an object");
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it.value().is_null()) continue;
      if (it.key() == "include_usage" || it.key() == "include_obfuscation") {
        if (!it.value().is_boolean()) {
          return std::optional<Bad>(
              Bad{"stream_options", "stream_options." + it.key() + " must be true or false"});
        }
        // include_obfuscation: padding against length side channels; aotid's
        // answers carry none.
        if (it.key() == "include_usage") r->include_usage = it.value().get<bool>();
      } else {
        return std::optional<Bad>(
            Bad{"stream_options", "stream_options." + it.key() + " is not supported (include_usage is)"});
      }
    }
    return ok;
  }
  if (key == "ignore_eos") {  // vLLM's extension: run to max_tokens past the end token
    if (!v.is_boolean()) return bad("must be true or false");
    r->generate.ignore_eos = v.get<bool>();
    return ok;
  }
  if (key == "n" || key == "best_of") {
    if (!v.is_number_integer() || v.get<int64_t>() != 1)
      return bad("must be 1: aotid makes one answer a request");
    return ok;
  }
  if (key == "logit_bias") {
    if (!v.is_object() || !v.empty()) return bad("is not supported");
    return ok;
  }
  // Said to the server, with no effect on the answer; still of the type
  // OpenAI's API takes, so that a mistake is not silently carried.
  if (key == "user" || key == "service_tier" || key == "prompt_cache_key" || key == "safety_identifier") {
    if (!v.is_string() && !v.is_null()) return bad("must be a string");
    return ok;
  }
  if (key == "store") {
    if (!v.is_boolean() && !v.is_null()) return bad("must be true or false");
    return ok;
  }
  if (key == "metadata") {
    if (v.is_null()) return ok;
    if (!v.is_object() || v.size() > 16) return bad("must be an object of at most 16 strings");
    for (const auto& [k, s] : v.items()) {
      if (!s.is_string()) return bad("must be an object of at most 16 strings (" + k + " is not a string)");
    }
    return ok;
  }
  return std::nullopt;
}

// A text part of a message's content (`at` names it), its text added to
// *text.
std::optional<Bad> ReadTextPart(const json& part, const std::string& at, std::string* text) {
  if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
    return Bad{at, at + " must be {\"type\": \"text\", \"text\": ...}"};
  if (part["type"] != "text") {
    return Bad{at, at + " is of type '" + part["type"].get<std::string>() +
                       "': aotid's language models read text only"};
  }
  if (!part.contains("text") || !part["text"].is_string())
    return Bad{at, at + " must have \"text\" as a string"};
  for (auto f = part.begin(); f != part.end(); ++f) {
    if (f.key() != "type" && f.key() != "text")
      return Bad{at + "." + f.key(), at + "." + f.key() + " is not supported"};
  }
  *text += part["text"].get<std::string>();
  return std::nullopt;
}

// A message's content (`at` names the message): a string, or a list of
// text parts joined; null leaves *content unset.
std::optional<Bad> ReadContent(const json& c, const std::string& at, std::optional<std::string>* content) {
  if (c.is_string()) {
    *content = c.get<std::string>();
  } else if (c.is_array()) {
    content->emplace();
    for (size_t j = 0; j < c.size(); ++j) {
      if (auto b = ReadTextPart(c[j], at + ".content[" + std::to_string(j) + "]", &**content)) return b;
    }
  } else if (!c.is_null()) {
    return Bad{at + ".content", at + ".content must be a string or a list of text parts"};
  }
  return std::nullopt;
}

// The role of message `m` (`at` names it), as the chat template names it.
std::optional<Bad> ReadRole(const json& m, const std::string& at, std::string* role) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
    return Bad{at, at + " must be an object with a \"role\""};
  *role = m["role"].get<std::string>();
  if (*role == "developer") *role = "system";  // OpenAI's newer name for the system message
  if (*role != "system" && *role != "user" && *role != "assistant") {
    return Bad{at + ".role", at + ".role '" + *role +
                                 "' is not supported: aotid takes system, developer, user and assistant "
                                 "messages (tools are not supported)"};
  }
  return std::nullopt;
}

// messages[i], added to r->messages.
std::optional<Bad> ReadMessage(const json& m, size_t i, OpenAiRequest* r) {
  const std::string at = "messages[" + std::to_string(i) + "]";
  std::string role;
  if (auto b = ReadRole(m, at, &role)) return b;
  std::optional<std::string> content;
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string& k = it.key();
    if (k == "role") continue;
    if (k == "content") {
      if (auto b = ReadContent(it.value(), at, &content)) return b;
    } else if (!it.value().is_null()) {
      return Bad{at + "." + k, at + "." + k + " is not supported" +
                                   (k == "tool_calls" || k == "function_call" ? ": aotid does not call tools"
                                                                              : std::string())};
    }
  }
  // OpenAI lets an assistant message go without content only when it
  // calls tools, which aotid refuses above: every message has content.
  if (!content) {
    return Bad{at + ".content", at + ".content is missing: each message needs its text (\"\" for none)"};
  }
  r->messages.push_back({role, std::move(*content)});
  return std::nullopt;
}

std::optional<Bad> ChatParameter(const std::string& key, const json& v, OpenAiRequest* r) {
  auto bad = [&](const std::string& why) { return std::optional<Bad>(Bad{key, key + " " + why}); };
  if (key == "messages") {
    if (!v.is_array() || v.empty()) return bad("must be a non-empty list of {\"role\", \"content\"}");
    for (size_t i = 0; i < v.size(); ++i) {
      if (auto b = ReadMessage(v[i], i, r)) return b;
    }
    return std::nullopt;
  }
  // Read together once every parameter is (ParseOpenAiRequest).
  if (key == "logprobs") return v.is_boolean() ? std::nullopt : bad("must be true or false");
  if (key == "top_logprobs") {
    return v.is_number_unsigned() && v.get<uint64_t>() <= 20 ? std::nullopt
                                                             : bad("must be an integer from 0 to 20");
  }
  if (key == "tools" || key == "functions") {
    if (v.is_array() && v.empty()) return std::nullopt;
    return bad("is not supported: aotid does not call tools");
  }
  if (key == "tool_choice" || key == "function_call") {
    if (v == "none") return std::nullopt;
    return bad("is not supported: aotid does not call tools");
  }
  if (key == "parallel_tool_calls") return std::nullopt;  // no tools, so nothing to run in parallel
  if (key == "response_format") {
    if (v.is_object() && v.size() == 1 && v.contains("type") && v["type"] == "text") return std::nullopt;
    return bad("is not supported: aotid answers plain text ({\"type\": \"text\"})");
  }
  if (key == "modalities") {
    if (v == json::array({"text"})) return std::nullopt;
    return bad("is not supported: aotid answers text only");
  }
  return bad("is not a parameter aotid takes");
}

std::optional<Bad> CompletionParameter(const std::string& key, const json& v, OpenAiRequest* r) {
  auto bad = [&](const std::string& why) { return std::optional<Bad>(Bad{key, key + " " + why}); };
  if (key == "prompt") {
    const json* p = &v;
    if (v.is_array() && v.size() == 1 && (v[0].is_string() || v[0].is_array())) p = &v[0];
    if (p->is_string()) {
      r->prompt = p->get<std::string>();
      return std::nullopt;
    }
    if (p->is_array() && !p->empty()) {
      for (const auto& id : *p) {
        if (!id.is_number_integer())
          return bad("must be a string, or one list of token ids (one prompt a request)");
        // Past int64, where no vocabulary reaches; the rest is checked
        // against the model's (PreparePrompt).
        if (id.is_number_unsigned() && id.get<uint64_t>() > uint64_t{INT64_MAX})
          return Bad{
              key, key + ": token id " + id.dump() + " is out of range: no vocabulary has that many tokens"};
        r->prompt_ids.push_back(id.get<int64_t>());
      }
      r->has_prompt_ids = true;
      return std::nullopt;
    }
    return bad("must be a string, or one list of token ids (one prompt a request)");
  }
  if (key == "logprobs") {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > 20) return bad("must be an integer from 0 to 20");
    r->generate.top_logprobs = static_cast<int>(v.get<uint64_t>());
    return std::nullopt;
  }
  if (key == "echo") {
    if (v == false) return std::nullopt;
    return bad("is not supported: the answer holds the completion only");
  }
  if (key == "suffix") {
    if (v == "") return std::nullopt;
    return bad("is not supported: aotid's models continue a prompt, they do not fill in");
  }
  return bad("is not a parameter aotid takes");
}

OpenAiError BadRequest(const Bad& b) { return OpenAiError{400, b.message, b.param, ""}; }

}  // namespace

std::string OpenAiErrorBody(const OpenAiError& e) {
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return Dump(json{{"error",
                    {{"message", e.message},
                     {"type", ErrorType(e.status)},
                     {"param", or_null(e.param)},
                     {"code", or_null(e.code)}}}});
}

void ToOpenAiError(http::Response& res) {
  if (res.status < 400) return;
  json j = ParseJsonOrDiscarded(res.body);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_string()) return;
  std::string code = res.status == 401 ? "invalid_api_key" : "";
  res.Set(OpenAiErrorBody({res.status, j["error"].get<std::string>(), "", code}), kJson);
}

bool ParseOpenAiRequest(std::string_view body, OpenAiEndpoint endpoint, OpenAiRequest* out,
                        OpenAiError* err) {
  auto j = ParseJson(body, "the request body", RequestJsonLimits(body.size()));
  if (!j.ok()) {
    *err = {400, j.status().message(), "", ""};
    return false;
  }
  if (!j->is_object()) {
    *err = {400, "the request body is not a JSON object", "", ""};
    return false;
  }
  OpenAiRequest r;
  r.endpoint = endpoint;
  // OpenAI's defaults, not /generate's.
  r.generate.sampling.temperature = 1;
  r.generate.sampling.top_p = 1;
  r.generate.sampling.top_k = 0;
  r.generate.max_tokens = endpoint == OpenAiEndpoint::kChat ? (int64_t{1} << 31) : 16;
  const bool chat = endpoint == OpenAiEndpoint::kChat;
  bool has_input = false;
  for (auto it = j->begin(); it != j->end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "model") {
      if (!v.is_string() || v.get<std::string>().empty()) {
        *err = BadRequest({"model", "model must be the name of a served model"});
        return false;
      }
      r.model = v.get<std::string>();
      continue;
    }
    if (v.is_null()) continue;  // OpenAI reads null as not given
    if (auto common = CommonParameter(key, v, &r)) {
      if (*common) {
        *err = BadRequest(**common);
        return false;
      }
      continue;
    }
    std::optional<Bad> b = chat ? ChatParameter(key, v, &r) : CompletionParameter(key, v, &r);
    if (b) {
      *err = BadRequest(*b);
      return false;
    }
    has_input |= key == (chat ? "messages" : "prompt");
  }
  if (chat) {
    const json& lp = j->value("logprobs", json());
    const json& top = j->value("top_logprobs", json());
    if (lp == true) r.generate.top_logprobs = top.is_null() ? 0 : top.get<int>();
    if (lp != true && !top.is_null()) {
      *err = BadRequest({"top_logprobs", "top_logprobs needs logprobs: true"});
      return false;
    }
  }
  if (r.model.empty()) {
    *err = BadRequest({"model", "model is missing: name a served model (GET /v1/models lists them)"});
    return false;
  }
  if (!has_input) {
    *err =
        chat ? BadRequest({"messages", "messages is missing"}) : BadRequest({"prompt", "prompt is missing"});
    return false;
  }
  if (r.include_usage && !r.stream) {
    *err = BadRequest({"stream_options", "stream_options is only allowed with stream: true"});
    return false;
  }
  *out = std::move(r);
  return true;
}

bool PreparePrompt(const text::GenerateSpec& spec, OpenAiRequest* r, OpenAiError* err) {
  if (r->endpoint == OpenAiEndpoint::kChat) {
    if (!spec.chat) {
      *err = BadRequest(
          {"messages", "model '" + r->model + "' has no chat template: use /v1/completions with a prompt"});
      return false;
    }
    auto prompt = text::ApplyChat(*spec.chat, r->messages);
    if (!prompt.ok()) {
      *err = BadRequest({"messages", prompt.status().message()});
      return false;
    }
    r->generate.prompt = std::move(prompt).value();
    return true;
  }
  if (r->has_prompt_ids) {
    const int64_t vocab = spec.tokenizer->vocab_size();
    r->generate.ids.clear();
    for (int64_t id : r->prompt_ids) {
      if (id < 0 || id >= vocab) {
        *err = BadRequest({"prompt", "prompt: token id " + std::to_string(id) +
                                         " is out of range: the vocabulary has " + std::to_string(vocab) +
                                         " tokens (ids 0 to " + std::to_string(vocab - 1) + ")"});
        return false;
      }
      r->generate.ids.push_back(static_cast<int32_t>(id));
    }
    r->generate.has_ids = true;
  } else {
    r->generate.prompt = {{r->prompt}};  // as /generate's text_input
  }
  return true;
}

AnswerMeta NewAnswerMeta(const OpenAiRequest& r, const ServedModel& sm) {
  static constexpr char kHex[] = "0123456789abcdef";
  thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                   std::random_device{}()};
  AnswerMeta m;
  m.id = r.endpoint == OpenAiEndpoint::kChat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) m.id += kHex[rng() & 15];
  m.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  m.model = r.model;
  if (!sm.build_key.empty()) m.system_fingerprint = "fp_" + fs::Sha256Hex(sm.build_key).substr(0, 12);
  return m;
}

namespace {

json Head(const OpenAiRequest& r, const AnswerMeta& meta, const char* object) {
  return json{{"id", meta.id},
              {"object", object},
              {"created", meta.created},
              {"model", meta.model},
              {"system_fingerprint",
               meta.system_fingerprint.empty() ? json(nullptr) : json(meta.system_fingerprint)}};
}

json Usage(const GenerateResult& g) {
  const auto completion = static_cast<int64_t>(g.ids.size());
  return json{{"prompt_tokens", g.prompt_tokens},
              {"completion_tokens", completion},
              {"total_tokens", g.prompt_tokens + completion},
              {"prompt_tokens_details", {{"cached_tokens", g.cached_tokens}}}};
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(c);
  return b;
}

// Chat's logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
json ChatLogprobs(const std::vector<text::TokenLogprob>& lps, const text::Tokenizer& tok) {
  json content = json::array();
  for (const auto& t : lps) {
    json top = json::array();
    for (const auto& [id, lp] : t.top) {
      top.push_back({{"token", tok.Bytes(id)}, {"logprob", lp}, {"bytes", Bytes(tok.Bytes(id))}});
    }
    content.push_back({{"token", tok.Bytes(t.id)},
                       {"logprob", t.logprob},
                       {"bytes", Bytes(tok.Bytes(t.id))},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}, {"refusal", nullptr}};
}

// The characters `bytes` adds to a UTF-8 text: its bytes that are not
// continuation bytes. A token that ends mid-character counts that character;
// the next, which finishes it, counts none: offsets index the decoded text
// as its characters, as OpenAI's text_offset does.
size_t Utf8Chars(std::string_view bytes) {
  size_t n = 0;
  for (char c : bytes) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// Completions' (legacy) logprobs: parallel lists, `offset` the first token's
// place in the answer's text, in characters.
json CompletionLogprobs(const std::vector<text::TokenLogprob>& lps, const text::Tokenizer& tok,
                        size_t offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const auto& t : lps) {
    tokens.push_back(tok.Bytes(t.id));
    token_logprobs.push_back(t.logprob);
    json alternatives = json::object();
    for (const auto& [id, lp] : t.top) alternatives[tok.Bytes(id)] = lp;
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += Utf8Chars(tok.Bytes(t.id));
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top)},
              {"text_offset", std::move(offsets)}};
}

json FinishReason(const std::string& f) { return f.empty() ? json(nullptr) : json(f); }

}  // namespace

std::string CompletionBody(const OpenAiRequest& r, const AnswerMeta& meta, const GenerateResult& g,
                           const text::Tokenizer& tok) {
  const bool logprobs = r.generate.top_logprobs >= 0;
  json choice{{"index", 0}, {"finish_reason", g.finish_reason}};
  json j;
  if (r.endpoint == OpenAiEndpoint::kChat) {
    j = Head(r, meta, "chat.completion");
    choice["message"] = {{"role", "assistant"}, {"content", g.text}, {"refusal", nullptr}};
    choice["logprobs"] = logprobs ? ChatLogprobs(g.logprobs, tok) : json(nullptr);
  } else {
    j = Head(r, meta, "text_completion");
    choice["text"] = g.text;
    choice["logprobs"] = logprobs ? CompletionLogprobs(g.logprobs, tok, 0) : json(nullptr);
  }
  j["choices"] = json::array({std::move(choice)});
  j["usage"] = Usage(g);
  return Dump(j);
}

std::string StreamChunk(const OpenAiRequest& r, const AnswerMeta& meta, std::string_view text, bool role,
                        const std::vector<text::TokenLogprob>& logprobs, const std::string& finish_reason,
                        const text::Tokenizer& tok, size_t text_offset) {
  const bool want_logprobs = r.generate.top_logprobs >= 0;
  json choice{{"index", 0}};
  json j;
  if (r.endpoint == OpenAiEndpoint::kChat) {
    j = Head(r, meta, "chat.completion.chunk");
    if (role) {
      choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    } else if (!text.empty() || finish_reason.empty()) {
      choice["delta"] = {{"content", text}};
    } else {
      choice["delta"] = json::object();
    }
    choice["logprobs"] = want_logprobs && !role ? ChatLogprobs(logprobs, tok) : json(nullptr);
  } else {
    j = Head(r, meta, "text_completion");
    choice["text"] = text;
    choice["logprobs"] = want_logprobs ? CompletionLogprobs(logprobs, tok, text_offset) : json(nullptr);
  }
  choice["finish_reason"] = FinishReason(finish_reason);
  j["choices"] = json::array({std::move(choice)});
  if (r.include_usage) j["usage"] = nullptr;
  return Dump(j);
}

std::string UsageChunk(const OpenAiRequest& r, const AnswerMeta& meta, const GenerateResult& g) {
  json j = Head(r, meta, r.endpoint == OpenAiEndpoint::kChat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = Usage(g);
  return Dump(j);
}

namespace {

json ModelEntry(const ServedModel& sm, const std::string& id) {
  return json{{"id", id}, {"object", "model"}, {"created", sm.created_at_ms / 1000}, {"owned_by", "aotid"}};
}

// Whether /v1 lists the version: ready, and generating or embedding text.
bool Listed(const std::shared_ptr<const ServedModel>& sm) {
  return sm && sm->state == ServeState::kReady && sm->model && (sm->generator || sm->embed);
}

}  // namespace

std::string ModelList(const ModelRegistry& reg) {
  json data = json::array();
  for (const auto& [name, versions] : *reg.All()) {
    auto preferred = reg.Find(name);
    if (Listed(preferred)) data.push_back(ModelEntry(*preferred, name));
    for (const auto& [v, sm] : versions) {
      if (Listed(sm)) data.push_back(ModelEntry(*sm, name + ":" + std::to_string(v)));
    }
  }
  return Dump(json{{"object", "list"}, {"data", std::move(data)}});
}

namespace {

struct OpenAiContext {
  const ModelRegistry* registry;
  Metrics* metrics;
  std::shared_ptr<std::atomic<bool>> stopping;
};

void Send(http::Response& res, const OpenAiError& e) {
  res.status = e.status;
  res.Set(OpenAiErrorBody(e), kJson);
}

// A "model" that is no model's reference at all ("minilm:01", "a/b"): not
// served here, as OpenAI's clients expect of a model they cannot use
// (404, which they raise as NotFoundError), saying what is wrong with it.
OpenAiError BadModelRef(const Status& s) {
  return {404, "no model is served as " + s.message(), "model", "model_not_found"};
}

// Whether the served version `ref` names is not ready (queued, building,
// loading or failed), with the error: 503, and Retry-After set on `res`
// for one that will be.
bool NotReady(const ServedModel& sm, const std::string& ref, http::Response& res, OpenAiError* err) {
  if (sm.state == ServeState::kReady && sm.model) return false;
  const bool failed = sm.state == ServeState::kFailed;
  if (!failed) res.SetHeader("Retry-After", "5");
  const std::string state =
      failed ? "failed: " + sm.message : std::string(ServeStateName(sm.state)) + "; try again shortly";
  *err = {503, "model '" + ref + "' is " + state, "model", ""};
  return true;
}

// The served version `ref` names, ready to generate; else the error, with
// Retry-After set on `res` for one that will be.
std::shared_ptr<const ServedModel> ReadyGenerator(const ModelRegistry* reg, const std::string& ref,
                                                  http::Response& res, OpenAiError* err) {
  std::shared_ptr<const ServedModel> sm = ReadyModel(reg, ref, res, err);
  if (sm && !sm->generator) {
    *err = {400,
            "model '" + ref + "' does not generate text" +
                (sm->embed ? ": it embeds text, through /v1/embeddings"
                           : ": it serves tensors through /v2/models/" + sm->name + "/infer"),
            "model", ""};
    return nullptr;
  }
  return sm;
}

}  // namespace

std::shared_ptr<const ServedModel> ReadyModel(const ModelRegistry* reg, const std::string& ref,
                                              http::Response& res, OpenAiError* err) {
  std::string name;
  std::optional<int64_t> version;
  if (Status s = storage::ParseModelRef(ref, &name, &version); !s.ok()) {
    *err = BadModelRef(s);
    return nullptr;
  }
  std::shared_ptr<const ServedModel> sm = version ? reg->Find(name, *version) : reg->Find(name);
  if (!sm) {
    *err = {404, "the model '" + ref + "' is not served here (GET /v1/models lists those that are)", "model",
            "model_not_found"};
    return nullptr;
  }
  if (NotReady(*sm, ref, res, err)) return nullptr;
  return sm;
}

OpenAiError OpenAiErrorFor(const Status& s) {
  int status = s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kResourceExhausted ? 503
               : s.code() == StatusCode::kCancelled                                               ? 499
               : s.code() == StatusCode::kInvalidArgument                                         ? 400
                                                                                                  : 500;
  return {status, s.message(), "", ""};
}

void RecordGenerate(Metrics* metrics, const ServedModel& sm, const GenerateResult& g, const Status& error) {
  std::string how = error.ok()                                 ? g.finish_reason
                    : error.code() == StatusCode::kCancelled   ? "cancelled"
                    : error.code() == StatusCode::kUnavailable ? "busy"
                                                               : "error";
  metrics->RecordGenerate(sm.name, sm.version, how, g.prompt_tokens, static_cast<int64_t>(g.ids.size()),
                          g.first_token_ms / 1000.0);
}

namespace {

// A completion request its model has room for: what answering it takes.
struct Admitted {
  OpenAiRequest r;
  std::shared_ptr<const ServedModel> sm;
  std::vector<int32_t> prompt;
  AnswerMeta meta;
  std::function<bool()> gone;  // the client left, or the daemon stops
  Metrics* metrics = nullptr;
  std::shared_ptr<Sequence> seq;  // its place with the model
};

// Reads the request and checks it against its model, up to a place in
// the model's queue. False once `res` holds the refusal.
bool PrepareRun(const OpenAiContext& ctx, OpenAiEndpoint endpoint, const http::Request& req,
                http::Response& res, Admitted* run) {
  auto refuse = [&](const OpenAiError& e) {
    Send(res, e);
    return false;
  };
  OpenAiRequest& r = run->r;
  OpenAiError err;
  if (!ParseOpenAiRequest(req.body, endpoint, &r, &err)) return refuse(err);
  run->sm = ReadyGenerator(ctx.registry, r.model, res, &err);
  if (!run->sm) return refuse(err);
  const Generator& gen = *run->sm->generator;
  if (!PreparePrompt(gen.spec(), &r, &err)) return refuse(err);
  auto prompt = gen.Prompt(r.generate);
  if (!prompt.ok()) {
    return refuse(
        {400, prompt.status().message(), endpoint == OpenAiEndpoint::kChat ? "messages" : "prompt", ""});
  }
  run->prompt = std::move(prompt).value();
  int fd = req.connection_fd;
  run->gone = [fd, stopping = ctx.stopping] { return stopping->load() || (fd >= 0 && http::ClientGone(fd)); };
  auto seq = gen.Start(run->sm->model, r.generate, run->prompt, run->gone);
  if (!seq.ok()) {
    if (seq.status().code() == StatusCode::kUnavailable) res.SetHeader("Retry-After", "1");
    return refuse(OpenAiErrorFor(seq.status()));
  }
  run->seq = std::move(seq).value();
  run->meta = NewAnswerMeta(r, *run->sm);
  run->metrics = ctx.metrics;
  return true;
}

// Counts a sequence that failed before it made an answer.
void RecordFailed(const Admitted& run, const Status& error) {
  GenerateResult none;
  none.prompt_tokens = static_cast<int64_t>(run.prompt.size());
  RecordGenerate(run.metrics, *run.sm, none, error);
}

// Whether the sequence failed before it made a token: then `res` holds
// the error, streamed or not.
bool Failed(const Admitted& run, http::Response& res) {
  Status why = run.seq->Failure();
  if (why.ok()) return false;
  RecordFailed(run, why);
  // Busy, or waiting for memory (a load that did not fit the budget).
  if (why.code() == StatusCode::kUnavailable || why.code() == StatusCode::kResourceExhausted)
    res.SetHeader("Retry-After", "1");
  Send(res, OpenAiErrorFor(why));
  return true;
}

// The whole answer, in `res`, once the sequence has ended.
void AnswerWhole(const Admitted& run, http::Response& res) {
  if (Failed(run, res)) return;
  const Generator& gen = *run.sm->generator;
  Status error;
  auto g = run.seq->Follow(nullptr, nullptr, &error, nullptr);
  if (!g.ok()) {
    RecordFailed(run, g.status());
    if (g.status().code() == StatusCode::kUnavailable) res.SetHeader("Retry-After", "1");
    return Send(res, OpenAiErrorFor(g.status()));
  }
  RecordGenerate(run.metrics, *run.sm, *g, error);
  if (!error.ok()) return Send(res, OpenAiErrorFor(error));
  res.status = 200;
  res.Set(CompletionBody(run.r, run.meta, *g, *gen.spec().tokenizer), kJson);
}

// The answer as Server-Sent Events through `write`: a chunk for each piece
// of text with the logprobs of its tokens, the finish, the usage, [DONE].
void StreamAnswer(const Admitted& run, const std::function<bool(std::string_view)>& write) {
  const OpenAiRequest& r = run.r;
  const text::Tokenizer& tok = *run.sm->generator->spec().tokenizer;
  auto event = [&](const std::string& data) { return write("data: " + data + "\n\n"); };
  const bool chat = r.endpoint == OpenAiEndpoint::kChat;
  std::vector<text::TokenLogprob> pending;  // the tokens since the last chunk
  size_t offset = 0;                        // of the pending tokens' text in the answer
  auto flush = [&](std::string_view piece, const std::string& finish_reason) {
    bool ok = event(StreamChunk(r, run.meta, piece, false, pending, finish_reason, tok, offset));
    for (const auto& t : pending) offset += Utf8Chars(tok.Bytes(t.id));
    pending.clear();
    return ok;
  };
  if (chat && !event(StreamChunk(r, run.meta, "", /*role=*/true, {}, "", tok))) return;
  auto on_text = [&](std::string_view piece) { return flush(piece, ""); };
  auto on_logprob = [&](const text::TokenLogprob& t) { pending.push_back(t); };
  Status error;
  auto g = run.seq->Follow(on_text, run.gone, &error, on_logprob);
  if (!g.ok()) error = g.status();
  if (g.ok()) {
    RecordGenerate(run.metrics, *run.sm, *g, error);
  } else {
    RecordFailed(run, error);
  }
  if (!error.ok()) {
    event(OpenAiErrorBody(OpenAiErrorFor(error)));
    return;
  }
  if (g->finish_reason == "cancelled") return;  // its client is gone
  if (!flush("", g->finish_reason)) return;
  if (r.include_usage && !event(UsageChunk(r, run.meta, *g))) return;
  write("data: [DONE]\n\n");
}

void Complete(const OpenAiContext& ctx, OpenAiEndpoint endpoint, const http::Request& req,
              http::Response& res) {
  Admitted run;
  if (!PrepareRun(ctx, endpoint, req, res, &run)) return;
  auto seq = run.seq;
  const bool stream = run.r.stream;
  auto shared = std::make_shared<const Admitted>(std::move(run));
  if (!stream) {
    AnswerWhenReady(seq, false, res, [shared](http::Response& res) { AnswerWhole(*shared, res); });
    return;
  }
  AnswerWhenReady(seq, true, res, [shared](http::Response& res) {
    if (Failed(*shared, res)) return;
    res.status = 200;
    res.content_type = "text/event-stream";
    res.SetHeader("Cache-Control", "no-cache");
    res.stream = [shared](const std::function<bool(std::string_view)>& write) {
      StreamAnswer(*shared, write);
    };
  });
}

void GetModel(const ModelRegistry* reg, const http::Request& req, http::Response& res) {
  const std::string& ref = req.params[0];
  std::string name;
  std::optional<int64_t> version;
  if (Status s = storage::ParseModelRef(ref, &name, &version); !s.ok()) return Send(res, BadModelRef(s));
  OpenAiError err;
  std::shared_ptr<const ServedModel> sm = version ? reg->Find(name, *version) : reg->Find(name);
  // One on its way is there, not yet ready: a client waits for it.
  if (sm && NotReady(*sm, ref, res, &err)) return Send(res, err);
  if (!Listed(sm)) {
    return Send(res, {404, "the model '" + ref + "' is not served here (GET /v1/models lists those that are)",
                      "model", "model_not_found"});
  }
  res.Set(Dump(ModelEntry(*sm, ref)), kJson);
}

}  // namespace

void AddOpenAiRoutes(http::Router& router, const ModelRegistry* registry, Metrics* metrics,
                     std::shared_ptr<std::atomic<bool>> stopping) {
  const OpenAiContext ctx{registry, metrics, std::move(stopping)};
  router.Add("GET", "/v1/models",
             [registry](const http::Request&, http::Response& res) { res.Set(ModelList(*registry), kJson); });
  router.Add("GET", "/v1/models/*",
             [registry](const http::Request& req, http::Response& res) { GetModel(registry, req, res); });
  router.Add("POST", "/v1/chat/completions", [ctx](const http::Request& req, http::Response& res) {
    Complete(ctx, OpenAiEndpoint::kChat, req, res);
  });
  router.Add("POST", "/v1/completions", [ctx](const http::Request& req, http::Response& res) {
    Complete(ctx, OpenAiEndpoint::kCompletions, req, res);
  });
  AddEmbeddingsRoute(router, registry, metrics);
}

}  // namespace aotid::serving
