// OpenAI's /v1 API for language models, over the generate path
// (serving/generate.h): /v1/models, /v1/chat/completions and
// /v1/completions, whole or streamed. A request is read into a
// GenerateRequest and run by the same Generator::Run as /generate, so the
// same request gives the same tokens on both.
//
// What aotid does not do (n > 1, tools, response formats, images, logit
// bias, an unknown field) is refused with 400 naming the parameter, never
// ignored. Errors on /v1 take OpenAI's shape, {"error": {"message", "type",
// "param", "code"}}, which its clients raise as typed exceptions.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/server.h"
#include "serving/generate.h"
#include "serving/metrics.h"
#include "serving/model_registry.h"
#include "text/generation.h"

namespace aotid::serving {

// An error as OpenAI's clients read it.
struct OpenAiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault; "" for none (null)
  std::string code;   // "model_not_found", ...; "" for none (null)
};
// {"error": {"message", "type", "param", "code"}}; the type follows the
// status ("invalid_request_error", "authentication_error", "server_error"...).
std::string OpenAiErrorBody(const OpenAiError& e);

// A /v1 route's answer of `status` with aotid's own error body
// ({"error": "message"}, as the checks before any route and the HTTP
// server write it) in OpenAI's shape instead. Other bodies are left as
// they are.
void ToOpenAiError(http::Response& res);

enum class OpenAiEndpoint { kChat, kCompletions };

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kChat;
  std::string model;  // as the request names it: "name" or "name:version"
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
  std::vector<text::ChatMessage> messages;  // chat
  std::string prompt;                       // completions: the text, or...
  std::vector<int64_t> prompt_ids;          // ... token ids (has_prompt_ids), unchecked
  bool has_prompt_ids = false;
  bool max_tokens_given = false;  // max_tokens or max_completion_tokens
  // The sampling, length, stop strings and logprobs asked for; the prompt
  // is set by PreparePrompt once the model is known.
  GenerateRequest generate;
};

// Reads a /v1/chat/completions or /v1/completions body. False with `err`
// (400, naming the parameter) for a malformed body, a value out of range,
// and anything aotid does not do. Sampling defaults are OpenAI's
// (temperature 1, top_p 1, no top_k); `max_tokens` defaults to the rest of
// the model's context for chat and to 16 for completions.
bool ParseOpenAiRequest(std::string_view body, OpenAiEndpoint endpoint, OpenAiRequest* out, OpenAiError* err);

// Sets out->generate's prompt from the messages (the model's chat
// template) or the completion prompt. False with `err` (400) when the
// model has no chat template, a role it lacks, or a token id outside its
// vocabulary.
bool PreparePrompt(const text::GenerateSpec& spec, OpenAiRequest* r, OpenAiError* err);

// What every answer and chunk of one request carries.
struct AnswerMeta {
  std::string id;                  // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;             // Unix seconds
  std::string model;               // as the request named it
  std::string system_fingerprint;  // "" for none (null)
};
// A fresh id with the endpoint's prefix, the time now, and the version's
// build as the fingerprint ("fp_" and 12 hex digits of its key's sha256).
AnswerMeta NewAnswerMeta(const OpenAiRequest& r, const ServedModel& sm);

// The whole answer (not streamed).
std::string CompletionBody(const OpenAiRequest& r, const AnswerMeta& meta, const GenerateResult& g,
                           const text::Tokenizer& tok);

// One streamed chunk's JSON (without "data: "): `text` as the delta (chat:
// {"role": "assistant"} instead when `role`), with `logprobs` for the
// tokens it covers and `finish_reason` when not empty. `text_offset`:
// where those tokens' text starts in the answer (completions' logprobs).
std::string StreamChunk(const OpenAiRequest& r, const AnswerMeta& meta, std::string_view text, bool role,
                        const std::vector<text::TokenLogprob>& logprobs, const std::string& finish_reason,
                        const text::Tokenizer& tok, size_t text_offset = 0);
// The chunk stream_options.include_usage adds before [DONE]: no choices, the usage.
std::string UsageChunk(const OpenAiRequest& r, const AnswerMeta& meta, const GenerateResult& g);

// The served version `ref` ("name" or "name:version") names, ready to
// run; else null with `err` (400 in OpenAI's shape for a `ref` that is
// no model's name or version, "minilm:01" say; 404 for an unknown model;
// 503 for one not ready, with Retry-After set on `res` for one on its way).
std::shared_ptr<const ServedModel> ReadyModel(const ModelRegistry* reg, const std::string& ref,
                                              http::Response& res, OpenAiError* err);

// The error a failed run answers with: 503 for a busy or stopping model,
// 499 when its client left, 400 for a bad request, else 500.
OpenAiError OpenAiErrorFor(const Status& s);

// GET /v1/models: the language and embedding models served and ready.
std::string ModelList(const ModelRegistry& reg);

// Counts one sequence of /generate or /v1 in `metrics`: its outcome (the
// finish reason, or cancelled, busy, error), its tokens and time to the first.
void RecordGenerate(Metrics* metrics, const ServedModel& sm, const GenerateResult& g, const Status& error);

// POST /v1/embeddings (serving/openai_embeddings.cc).
void AddEmbeddingsRoute(http::Router& router, const ModelRegistry* registry, Metrics* metrics);

// Adds GET /v1/models, GET /v1/models/*, POST /v1/chat/completions,
// POST /v1/completions and POST /v1/embeddings to `router`. `metrics` records each generation as
// /generate's do; `stopping` ends sequences when the daemon stops.
void AddOpenAiRoutes(http::Router& router, const ModelRegistry* registry, Metrics* metrics,
                     std::shared_ptr<std::atomic<bool>> stopping);

}  // namespace aotid::serving
