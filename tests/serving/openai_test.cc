#include "serving/openai.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/json.h"

namespace aotid::serving {
namespace {

using json = nlohmann::json;

// SmolLM2's tokenizer with a ChatML template, a 32-token context.
const text::GenerateSpec& Spec() {
  static const text::GenerateSpec* spec = [] {
    auto tok = json::parse(
        fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/smollm2_tokenizer.json").value());
    json chat = {{"user", {{"prefix", "<|im_start|>user\n"}, {"suffix", "<|im_end|>\n"}}},
                 {"system", {{"prefix", "<|im_start|>system\n"}, {"suffix", "<|im_end|>\n"}}},
                 {"assistant", {{"prefix", "<|im_start|>assistant\n"}, {"suffix", "<|im_end|>\n"}}},
                 {"generation_prompt", "<|im_start|>assistant\n"}};
    json g = {{"kind", "causal_lm"},  {"max_seq_len", 32}, {"max_prefill", 32},
              {"eos_token_ids", {2}}, {"tokenizer", tok},  {"chat", chat}};
    return new text::GenerateSpec(text::GenerateSpec::FromJson(g.dump()).value());
  }();
  return *spec;
}

OpenAiRequest Chat(const json& body) {
  OpenAiRequest r;
  OpenAiError err;
  EXPECT_TRUE(ParseOpenAiRequest(body.dump(), OpenAiEndpoint::kChat, &r, &err)) << err.message;
  return r;
}

// The parameter a refused body is refused for (its message must name it too).
std::string RefusedParam(OpenAiEndpoint endpoint, const json& body) {
  OpenAiRequest r;
  OpenAiError err;
  if (ParseOpenAiRequest(body.dump(), endpoint, &r, &err)) return "(accepted)";
  EXPECT_EQ(err.status, 400);
  EXPECT_NE(err.message.find(err.param.substr(0, err.param.find('['))), std::string::npos) << err.message;
  return err.param;
}

json Hi() { return json::array({{{"role", "user"}, {"content", "hi"}}}); }

TEST(OpenAiRequest, ChatReadsItsParametersIntoTheGenerateRequest) {
  OpenAiRequest r = Chat({{"model", "tiny:2"},
                          {"messages", Hi()},
                          {"max_completion_tokens", 7},
                          {"temperature", 0.5},
                          {"top_p", 0.8},
                          {"seed", 42},
                          {"stop", "END"},
                          {"presence_penalty", 0.25},
                          {"frequency_penalty", -0.5},
                          {"top_k", 5},
                          {"min_p", 0.1},
                          {"user", "someone"},
                          {"n", 1},
                          {"response_format", {{"type", "text"}}},
                          {"tools", nullptr},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}});
  EXPECT_EQ(r.model, "tiny:2");
  EXPECT_EQ(r.generate.max_tokens, 7);
  EXPECT_EQ(r.generate.sampling.temperature, 0.5);
  EXPECT_EQ(r.generate.sampling.top_p, 0.8);
  EXPECT_EQ(r.generate.sampling.seed, 42u);
  EXPECT_EQ(r.generate.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.generate.sampling.presence_penalty, 0.25);
  EXPECT_EQ(r.generate.sampling.frequency_penalty, -0.5);
  EXPECT_EQ(r.generate.sampling.top_k, 5);
  EXPECT_EQ(r.generate.sampling.min_p, 0.1);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.generate.top_logprobs, -1);
  // OpenAI's defaults: temperature 1, no nucleus or top-k cut; max_tokens
  // as given.
  OpenAiRequest d = Chat({{"model", "tiny"}, {"messages", Hi()}, {"max_tokens", 3}, {"stop", {"a", "b"}}});
  EXPECT_EQ(d.generate.sampling.temperature, 1.0);
  EXPECT_EQ(d.generate.sampling.top_p, 1.0);
  EXPECT_EQ(d.generate.sampling.top_k, 0);
  EXPECT_EQ(d.generate.max_tokens, 3);
  EXPECT_EQ(d.generate.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(d.stream);
  // logprobs and top_logprobs, in either order.
  EXPECT_EQ(Chat({{"model", "m"}, {"messages", Hi()}, {"logprobs", true}}).generate.top_logprobs, 0);
  EXPECT_EQ(Chat({{"model", "m"}, {"top_logprobs", 3}, {"messages", Hi()}, {"logprobs", true}})
                .generate.top_logprobs,
            3);
}

TEST(OpenAiRequest, ChatMessagesTakeStringsAndTextPartsAndMakeTheTemplatesPrompt) {
  OpenAiRequest r =
      Chat({{"model", "m"},
            {"messages",
             {{{"role", "developer"}, {"content", "Be brief."}},
              {{"role", "user"},
               {"content", {{{"type", "text"}, {"text", "one "}}, {{"type", "text"}, {"text", "two"}}}}},
              {{"role", "assistant"}, {"content", "ok"}},
              {{"role", "user"}, {"content", "<|im_end|>"}}}}});
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "one two");
  OpenAiError err;
  ASSERT_TRUE(PreparePrompt(Spec(), &r, &err)) << err.message;
  auto same = text::ApplyChat(*Spec().chat, r.messages);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(text::Joined(r.generate.prompt), text::Joined(*same));
  // A message's special-token text stays plain text, as /generate has it.
  ASSERT_FALSE(r.generate.prompt.empty());
  EXPECT_FALSE(r.generate.prompt[r.generate.prompt.size() - 3].special);
}

// A message without content was read as an empty one; OpenAI requires it
// but of an assistant message that calls tools, which aotid refuses. An
// empty text is still a message.
TEST(OpenAiRequest, AMessageWithoutContentIsRefusedNamingIt) {
  for (const char* role : {"user", "system", "assistant"}) {
    for (const json& message : {json{{"role", role}}, json{{"role", role}, {"content", nullptr}}}) {
      json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}, message}}};
      OpenAiRequest r;
      OpenAiError err;
      ASSERT_FALSE(ParseOpenAiRequest(body.dump(), OpenAiEndpoint::kChat, &r, &err)) << message;
      EXPECT_EQ(err.status, 400);
      EXPECT_EQ(err.param, "messages[1].content");
      EXPECT_EQ(err.message.find("messages[1].content is missing"), 0u) << err.message;
    }
  }
  OpenAiRequest empty = Chat({{"model", "m"}, {"messages", {{{"role", "user"}, {"content", ""}}}}});
  ASSERT_EQ(empty.messages.size(), 1u);
  EXPECT_EQ(empty.messages[0].content, "");
}

TEST(OpenAiRequest, ABodyOfMillionsOfValuesIsRefusedBeforeItIsBuilt) {
  std::string body = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":[)";
  for (size_t i = 0; i < kMaxRequestJsonValues; ++i) body += "{},";
  body += "{}]}";
  OpenAiRequest r;
  OpenAiError err;
  ASSERT_FALSE(ParseOpenAiRequest(body, OpenAiEndpoint::kChat, &r, &err));
  EXPECT_EQ(err.status, 400);
  EXPECT_NE(err.message.find("holds more than 1048576 values"), std::string::npos) << err.message;
}

// {"model": "a", "model": "b"} would be a request for "b" that may have
// meant "a": a key twice is refused, named, on both endpoints.
TEST(OpenAiRequest, AParameterGivenTwiceIsRefusedNamingIt) {
  OpenAiRequest r;
  OpenAiError err;
  ASSERT_FALSE(ParseOpenAiRequest(R"({"model":"a","messages":[{"role":"user","content":"hi"}],"model":"b"})",
                                  OpenAiEndpoint::kChat, &r, &err));
  EXPECT_EQ(err.status, 400);
  EXPECT_EQ(err.message, R"(the request body has the key "model" twice in one object)");
  ASSERT_FALSE(
      ParseOpenAiRequest(R"({"model":"a","messages":[{"role":"user","content":"hi","role":"system"}]})",
                         OpenAiEndpoint::kChat, &r, &err));
  EXPECT_NE(err.message.find(R"("role" twice)"), std::string::npos) << err.message;
  ASSERT_FALSE(ParseOpenAiRequest(R"({"model":"a","prompt":"x","max_tokens":1,"max_tokens":9})",
                                  OpenAiEndpoint::kCompletions, &r, &err));
  EXPECT_NE(err.message.find(R"("max_tokens" twice)"), std::string::npos) << err.message;
}

TEST(OpenAiRequest, WhatAotidDoesNotDoIsRefusedNamingTheParameter) {
  auto chat = [](json extra) {
    json b = {{"model", "m"}, {"messages", Hi()}};
    b.update(extra);
    return RefusedParam(OpenAiEndpoint::kChat, b);
  };
  EXPECT_EQ(chat({{"n", 2}}), "n");
  // Accepted without effect, but only of OpenAI's types.
  EXPECT_EQ(chat({{"user", json::array({0, 0})}}), "user");
  EXPECT_EQ(chat({{"metadata", 5}}), "metadata");
  EXPECT_EQ(chat({{"metadata", {{"k", 1}}}}), "metadata");
  EXPECT_EQ(chat({{"store", "yes"}}), "store");
  EXPECT_EQ(chat({{"max_tokens", 4}, {"max_completion_tokens", 3}}), "max_tokens");
  EXPECT_EQ(chat({{"stop", json::array({""})}}), "stop");
  EXPECT_EQ(chat({{"stream", true}, {"stream_options", {{"include_usage", "yes"}}}}), "stream_options");
  EXPECT_EQ(
      RefusedParam(OpenAiEndpoint::kChat,
                   {{"model", "m"},
                    {"messages",
                     {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}, {"extra", 1}}}}}}}}),
      "messages[0].content[0].extra");
  EXPECT_EQ(chat({{"service_tier", 3}}), "service_tier");
  EXPECT_EQ(chat({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}), "tools");
  EXPECT_EQ(chat({{"functions", {{{"name", "f"}}}}}), "functions");
  EXPECT_EQ(chat({{"tool_choice", "auto"}}), "tool_choice");
  EXPECT_EQ(chat({{"response_format", {{"type", "json_object"}}}}), "response_format");
  EXPECT_EQ(chat({{"logit_bias", {{"50256", -100}}}}), "logit_bias");
  EXPECT_EQ(chat({{"reasoning_effort", "low"}}), "reasoning_effort");
  EXPECT_EQ(chat({{"temperature", 3}}), "temperature");
  EXPECT_EQ(chat({{"presence_penalty", -2.5}}), "presence_penalty");
  EXPECT_EQ(chat({{"top_logprobs", 2}}), "top_logprobs");  // without logprobs
  EXPECT_EQ(chat({{"top_logprobs", 21}, {"logprobs", true}}), "top_logprobs");
  EXPECT_EQ(chat({{"stream_options", {{"include_usage", true}}}}), "stream_options");  // not streamed
  EXPECT_EQ(chat({{"max_tokens", 0}}), "max_tokens");
  EXPECT_EQ(chat({{"messages", json::array()}}), "messages");
  EXPECT_EQ(chat({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}), "messages[0].role");
  EXPECT_EQ(chat({{"messages",
                   {{{"role", "user"},
                     {"content",
                      {{{"type", "text"}, {"text", "what is this?"}},
                       {{"type", "image_url"}, {"image_url", {{"url", "data:,"}}}}}}}}}}),
            "messages[0].content[1]");
  EXPECT_EQ(
      chat({{"messages", {{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({1})}}}}}),
      "messages[0].tool_calls");
  EXPECT_EQ(RefusedParam(OpenAiEndpoint::kChat, {{"messages", Hi()}}), "model");
  EXPECT_EQ(RefusedParam(OpenAiEndpoint::kChat, {{"model", "m"}}), "messages");

  auto complete = [](json extra) {
    json b = {{"model", "m"}, {"prompt", "Hello"}};
    b.update(extra);
    return RefusedParam(OpenAiEndpoint::kCompletions, b);
  };
  EXPECT_EQ(complete({{"echo", true}}), "echo");
  EXPECT_EQ(complete({{"suffix", "end"}}), "suffix");
  EXPECT_EQ(complete({{"best_of", 3}}), "best_of");
  EXPECT_EQ(complete({{"prompt", {"one", "two"}}}), "prompt");
  EXPECT_EQ(complete({{"messages", Hi()}}), "messages");
  EXPECT_EQ(complete({{"echo", false}, {"n", 1}}), "(accepted)");
}

TEST(OpenAiRequest, CompletionPromptIsTextOrTokenIdsAndDefaultsToSixteenTokens) {
  OpenAiRequest r;
  OpenAiError err;
  ASSERT_TRUE(ParseOpenAiRequest(R"({"model":"m","prompt":"Hello","logprobs":2})",
                                 OpenAiEndpoint::kCompletions, &r, &err));
  EXPECT_EQ(r.generate.max_tokens, 16);
  EXPECT_EQ(r.generate.top_logprobs, 2);
  ASSERT_TRUE(PreparePrompt(Spec(), &r, &err));
  ASSERT_EQ(r.generate.prompt.size(), 1u);
  EXPECT_EQ(r.generate.prompt[0].text, "Hello");
  EXPECT_FALSE(r.generate.has_ids);

  ASSERT_TRUE(
      ParseOpenAiRequest(R"({"model":"m","prompt":[[19556, 30]]})", OpenAiEndpoint::kCompletions, &r, &err));
  ASSERT_TRUE(PreparePrompt(Spec(), &r, &err));
  EXPECT_TRUE(r.generate.has_ids);
  EXPECT_EQ(r.generate.ids, (std::vector<int32_t>{19556, 30}));
  ASSERT_TRUE(
      ParseOpenAiRequest(R"({"model":"m","prompt":[49152]})", OpenAiEndpoint::kCompletions, &r, &err));
  EXPECT_FALSE(PreparePrompt(Spec(), &r, &err));
  EXPECT_EQ(err.param, "prompt");
  EXPECT_NE(err.message.find("49152"), std::string::npos);
}

// An id past int32 (or below 0) was refused as if the prompt were not a
// list of ids; it is one, with an id the vocabulary does not have.
TEST(OpenAiRequest, APromptTokenIdOutOfRangeIsNamedWithTheVocabularysSize) {
  for (const char* id : {"4294967296", "-1", "49152"}) {
    OpenAiRequest r;
    OpenAiError err;
    ASSERT_TRUE(ParseOpenAiRequest(std::string(R"({"model":"m","prompt":[1, )") + id + "]}",
                                   OpenAiEndpoint::kCompletions, &r, &err))
        << err.message;
    ASSERT_FALSE(PreparePrompt(Spec(), &r, &err));
    EXPECT_EQ(err.status, 400);
    EXPECT_EQ(err.param, "prompt");
    EXPECT_EQ(err.message, std::string("prompt: token id ") + id +
                               " is out of range: the vocabulary has 49152 tokens (ids 0 to 49151)");
  }
  EXPECT_EQ(RefusedParam(OpenAiEndpoint::kCompletions,
                         json::parse(R"({"model":"m","prompt":[18446744073709551615]})")),
            "prompt");
}

AnswerMeta Meta() { return AnswerMeta{"chatcmpl-x", 1700000000, "tiny", "fp_0123456789ab"}; }

GenerateResult Result() {
  GenerateResult g;
  g.text = "Hello!";
  g.ids = {19556, 17};
  g.prompt_tokens = 5;
  g.finish_reason = "length";
  return g;
}

TEST(OpenAiAnswer, ChatCompletionCarriesTheMessageUsageAndFingerprint) {
  OpenAiRequest r = Chat({{"model", "tiny"}, {"messages", Hi()}});
  json j = json::parse(CompletionBody(r, Meta(), Result(), *Spec().tokenizer));
  EXPECT_EQ(j["id"], "chatcmpl-x");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["system_fingerprint"], "fp_0123456789ab");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello!");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 5},
                              {"completion_tokens", 2},
                              {"total_tokens", 7},
                              {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
}

TEST(OpenAiAnswer, LogprobsNameEachTokenWithItsBytesAndAlternatives) {
  const text::Tokenizer& tok = *Spec().tokenizer;
  GenerateResult g = Result();
  g.logprobs = {{19556, -0.5, {{19556, -0.5}, {17, -1.5}}}, {17, -0.25, {{17, -0.25}, {19556, -2.0}}}};
  OpenAiRequest r = Chat({{"model", "tiny"}, {"messages", Hi()}, {"logprobs", true}, {"top_logprobs", 2}});
  json c = json::parse(CompletionBody(r, Meta(), g, tok))["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]["token"], tok.Bytes(19556));
  EXPECT_EQ(c[0]["logprob"], -0.5);
  EXPECT_EQ(c[0]["bytes"].size(), tok.Bytes(19556).size());
  EXPECT_EQ(c[0]["bytes"][0], static_cast<unsigned char>(tok.Bytes(19556)[0]));
  ASSERT_EQ(c[1]["top_logprobs"].size(), 2u);
  EXPECT_EQ(c[1]["top_logprobs"][1]["token"], tok.Bytes(19556));
  EXPECT_EQ(c[1]["top_logprobs"][1]["logprob"], -2.0);

  OpenAiRequest cr;
  OpenAiError err;
  ASSERT_TRUE(ParseOpenAiRequest(R"({"model":"tiny","prompt":"x","logprobs":1})",
                                 OpenAiEndpoint::kCompletions, &cr, &err));
  json l = json::parse(CompletionBody(cr, Meta(), g, tok))["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json({tok.Bytes(19556), tok.Bytes(17)}));
  EXPECT_EQ(l["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(l["text_offset"], json({0, tok.Bytes(19556).size()}));
  EXPECT_EQ(l["top_logprobs"][0][tok.Bytes(17)], -1.5);

  // text_offset counts characters, as the decoded text is indexed, not bytes.
  auto ids = tok.Encode("Le café est très bon. Le thé", false);
  ASSERT_TRUE(ids.ok());
  g.logprobs.clear();
  for (int32_t id : *ids) g.logprobs.push_back({id, -0.1, {}});
  json offsets = json::parse(CompletionBody(cr, Meta(), g, tok))["choices"][0]["logprobs"]["text_offset"];
  ASSERT_EQ(offsets.size(), ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    std::string before = tok.Decode(std::vector<int32_t>(ids->begin(), ids->begin() + static_cast<long>(i)));
    size_t chars = 0;
    for (unsigned char c : before) chars += (c & 0xC0) != 0x80;
    EXPECT_EQ(offsets[i], chars) << "token " << i << " after '" << before << "'";
  }
}

TEST(OpenAiAnswer, StreamChunksGoRoleThenContentThenFinishThenUsage) {
  const text::Tokenizer& tok = *Spec().tokenizer;
  OpenAiRequest r = Chat({{"model", "tiny"},
                          {"messages", Hi()},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}});
  json role = json::parse(StreamChunk(r, Meta(), "", true, {}, "", tok));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["id"], "chatcmpl-x");
  EXPECT_EQ(role["system_fingerprint"], "fp_0123456789ab");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  ASSERT_TRUE(role.contains("usage"));
  EXPECT_TRUE(role["usage"].is_null());
  json text = json::parse(StreamChunk(r, Meta(), "Hel", false, {}, "", tok));
  EXPECT_EQ(text["choices"][0]["delta"], json({{"content", "Hel"}}));
  EXPECT_TRUE(text["usage"].is_null());
  json last = json::parse(StreamChunk(r, Meta(), "", false, {}, "stop", tok));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  json usage = json::parse(UsageChunk(r, Meta(), Result()));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  // Without include_usage no chunk has "usage".
  OpenAiRequest plain = Chat({{"model", "tiny"}, {"messages", Hi()}, {"stream", true}});
  EXPECT_FALSE(json::parse(StreamChunk(plain, Meta(), "a", false, {}, "", tok)).contains("usage"));

  OpenAiRequest cr;
  OpenAiError err;
  ASSERT_TRUE(ParseOpenAiRequest(R"({"model":"tiny","prompt":"x","stream":true})",
                                 OpenAiEndpoint::kCompletions, &cr, &err));
  json c = json::parse(StreamChunk(cr, Meta(), "lo", false, {}, "length", tok));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "lo");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiError, HasOpenAisShapeAndAotidsOwnErrorsAreRewrittenToIt) {
  json e = json::parse(OpenAiErrorBody({404, "no such model", "model", "model_not_found"}));
  EXPECT_EQ(e, json({{"error",
                      {{"message", "no such model"},
                       {"type", "invalid_request_error"},
                       {"param", "model"},
                       {"code", "model_not_found"}}}}));
  EXPECT_TRUE(json::parse(OpenAiErrorBody({400, "bad", "", ""}))["error"]["param"].is_null());
  http::Response res;
  res.status = 401;
  res.Set(R"({"error":"this aotid needs a bearer token"})", "application/json");
  ToOpenAiError(res);
  json r = json::parse(res.body);
  EXPECT_EQ(r["error"]["message"], "this aotid needs a bearer token");
  EXPECT_EQ(r["error"]["type"], "authentication_error");
  EXPECT_EQ(r["error"]["code"], "invalid_api_key");
}

// GET on `path` through the /v1 routes alone, over `reg`.
http::Response Get(const ModelRegistry& reg, const std::string& path) {
  http::Router router([](std::string_view m) { return json{{"error", m}}.dump(); });
  Metrics metrics;
  AddOpenAiRoutes(router, &reg, &metrics, std::make_shared<std::atomic<bool>>(false));
  http::Request req;
  req.method = "GET";
  req.target = req.path = path;
  http::Response res;
  router.Dispatch(req, res);
  return res;
}

bool HasRetryAfter(const http::Response& res) {
  return std::any_of(res.headers.begin(), res.headers.end(),
                     [](const http::Header& h) { return h.name == "Retry-After"; });
}

// A model on its way is there but not ready: 503 with when to ask again, as
// the completion routes answer (it was 404, as if it were not served). One
// that failed says why, without Retry-After: asking again will not help.
TEST(OpenAiRoutes, AModelOnItsWayIsUnavailableNotUnknown) {
  ModelRegistry reg;
  for (ServeState state : {ServeState::kQueued, ServeState::kBuilding, ServeState::kLoading}) {
    reg.Put(ServedModel{"demo", 1, state});
    for (const std::string ref : {"demo", "demo:1"}) {
      http::Response res = Get(reg, "/v1/models/" + ref);
      EXPECT_EQ(res.status, 503) << ref << " " << res.body;
      EXPECT_TRUE(HasRetryAfter(res)) << ref;
      json e = json::parse(res.body)["error"];
      EXPECT_EQ(e["message"],
                "model '" + ref + "' is " + std::string(ServeStateName(state)) + "; try again shortly");
      EXPECT_EQ(e["param"], "model");
      EXPECT_EQ(e["type"], "server_error");
    }
  }
  ServedModel failed{"demo", 1, ServeState::kFailed};
  failed.message = "the build ran out of memory";
  reg.Put(failed);
  http::Response res = Get(reg, "/v1/models/demo");
  EXPECT_EQ(res.status, 503) << res.body;
  EXPECT_FALSE(HasRetryAfter(res));
  EXPECT_EQ(json::parse(res.body)["error"]["message"], "model 'demo' is failed: the build ran out of memory");
  // One not served at all is still unknown.
  res = Get(reg, "/v1/models/other");
  EXPECT_EQ(res.status, 404) << res.body;
  EXPECT_EQ(json::parse(res.body)["error"]["code"], "model_not_found");
  EXPECT_EQ(Get(reg, "/v1/models/demo:2").status, 404);
}

}  // namespace
}  // namespace aotid::serving
