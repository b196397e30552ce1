#include "serving/http_api.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/json.h"
#include "base/log.h"
#include "http/host.h"
#include "http/json_tape.h"
#include "serving/oip.h"
#include "serving/openai.h"
#include "serving/tensor_codec.h"

namespace aotid::serving {
namespace {

using json = nlohmann::json;
constexpr char kJson[] = "application/json";
// The binary tensor extension: the JSON part's length, the rest is tensor bytes.
constexpr char kHeaderLength[] = "Inference-Header-Content-Length";

// JSON text of a reply. Strings in it may quote request bytes that are not
// UTF-8 (a header, a path); those become U+FFFD instead of an exception.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string ErrorBody(std::string_view message) { return Dump(json{{"error", message}}); }

namespace {

void SendError(http::Response& res, int status, const std::string& message) {
  res.status = status;
  res.Set(ErrorBody(message), kJson);
}

void SendStatus(http::Response& res, const Status& s) {
  if (s.code() == StatusCode::kResourceExhausted)
    res.SetHeader("Retry-After", "1");  // a full queue drains fast
  SendError(res, HttpStatusFor(s), s.message());
}

// What the exported program was traced for at each dynamic dim of `t`, as
// the metadata route's extension: [{"dim": 0, "name": "batch", "min": 1,
// "max": 64, "typical": 2}, ...]. "name" is the dim's symbol (dims sharing
// one must agree across inputs); "max" is absent when unbounded, "typical"
// when none was recorded. Dims with nothing recorded are left out.
json DynamicDims(const model::TensorSpec& t) {
  json dims = json::array();
  for (size_t i = 0; i < t.dims.size(); ++i) {
    if (!t.dims[i]) continue;
    const model::DimRange& r = *t.dims[i];
    json d{{"dim", i}};
    if (!r.symbol.empty()) d["name"] = r.symbol;
    d["min"] = r.min;
    if (r.max != std::numeric_limits<int64_t>::max()) d["max"] = r.max;
    if (r.typical > 0) d["typical"] = r.typical;
    dims.push_back(std::move(d));
  }
  return dims;
}

// Inputs or outputs as OIP lists them (dynamic dims -1), plus
// parameters.dynamic_dims where their ranges are known.
json TensorList(const std::vector<model::TensorSpec>& specs) {
  json arr = json::array();
  for (const auto& t : specs) {
    json e{{"name", t.name}, {"datatype", model::DTypeName(t.dtype)}, {"shape", t.shape}};
    if (json dims = DynamicDims(t); !dims.empty()) e["parameters"] = {{"dynamic_dims", std::move(dims)}};
    arr.push_back(std::move(e));
  }
  return arr;
}

// Finds the model a request names, honouring an optional version segment.
StatusOr<std::shared_ptr<const ServedModel>> Resolve(const ModelRegistry* registry,
                                                     const http::Request& req) {
  return ResolveModel(registry, req.params[0], req.params.size() > 1 ? req.params[1] : "");
}

// The body types a POST may carry: JSON, binary tensors, none, and the
// form type curl's -d sets by default (its body is JSON all the same). Not
// text/plain or multipart/form-data, which a foreign page can send without
// a preflight.
bool AcceptedBodyType(std::string type) {
  type = type.substr(0, type.find(';'));
  type.erase(type.find_last_not_of(" \t") + 1);
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
  return type.empty() || type == "application/json" || type == "application/octet-stream" ||
         type == "application/x-www-form-urlencoded";
}

// A body sent as it is: no Content-Encoding, or "identity" (in any case).
bool UnencodedBody(std::string enc) {
  enc.erase(0, enc.find_first_not_of(" \t") == std::string::npos ? enc.size() : enc.find_first_not_of(" \t"));
  enc.erase(enc.find_last_not_of(" \t") + 1);
  std::transform(enc.begin(), enc.end(), enc.begin(), [](unsigned char c) { return std::tolower(c); });
  return enc.empty() || enc == "identity";
}

bool OriginAllowed(const std::vector<std::string>& allowed, const std::string& origin) {
  for (const auto& o : allowed) {
    if (o == "*" || o == origin) return true;
  }
  return false;
}

}  // namespace

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAlreadyExists: return 409;
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kCancelled: return 499;  // client closed the request, as nginx counts it
    case StatusCode::kResourceExhausted: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    case StatusCode::kLimitExceeded: return 413;  // a retry gets the same answer: no Retry-After
    default: return 500;
  }
}

HttpApi::HttpApi(const ModelRegistry* registry, Metrics* metrics, HttpOptions options)
    : registry_(registry), metrics_(metrics), options_(std::move(options)), router_(ErrorBody) {
  access_ = std::make_shared<const HttpOptions>(options_);
  Routes();
}

std::shared_ptr<const HttpOptions> HttpApi::Access() const {
  MutexLock lock(&access_mu_);
  return access_;
}

void HttpApi::UpdateAccess(const HttpOptions& fresh) {
  auto next = std::make_shared<HttpOptions>(options_);
  next->token = fresh.token;
  next->token_for_all = fresh.token_for_all;
  next->allowed_hosts = fresh.allowed_hosts;
  next->cors_origins = fresh.cors_origins;
  MutexLock lock(&access_mu_);
  access_ = std::move(next);
}

HttpApi::~HttpApi() = default;

void HttpApi::Handle(http::Request& req, http::Response& res) const {
  std::shared_ptr<const HttpOptions> access = Access();  // one request, one policy
  if (Admit(req, res, *access)) router_.Dispatch(req, res);
  // Refusals are the client's business, but an operator chasing one turns
  // on log.level = "debug" and sees each with its reason.
  if (res.status >= 400) {
    LOG_DEBUG << "answered " << res.status << " to " << req.method << " " << req.path.substr(0, 200) << ": "
              << res.body.substr(0, 300);
  }
  // A preflight (OPTIONS) has its CORS headers from Admit already: twice
  // would make a browser refuse it.
  if (!access->cors_origins.empty() && req.method != "OPTIONS") {
    std::string origin = req.Get("Origin");
    if (!origin.empty() && OriginAllowed(access->cors_origins, origin)) {
      res.SetHeader("Access-Control-Allow-Origin", origin);
      res.SetHeader("Vary", "Origin");
    }
  }
}

// Before any route: the Host check, CORS preflights and the bearer token.
// False when it has answered the request itself.
bool HttpApi::Admit(const http::Request& req, http::Response& res, const HttpOptions& opts) const {
  {
    if (opts.check_host && req.Has("Host")) {
      std::string host = http::HostWithoutPort(req.Get("Host"));
      bool ok = http::IsLoopbackHost(host) || std::find(opts.allowed_hosts.begin(), opts.allowed_hosts.end(),
                                                        host) != opts.allowed_hosts.end();
      if (!ok) {
        SendError(res, 403,
                  "Host '" + req.Get("Host").substr(0, 200) +
                      "' is not allowed: aotid listens on loopback and answers only "
                      "requests addressed to a loopback name (add the name to server.allowed_hosts to "
                      "allow it)");
        return false;
      }
    }
    std::string origin = req.Get("Origin");
    if (req.method == "OPTIONS") {  // CORS preflight
      if (origin.empty() || !OriginAllowed(opts.cors_origins, origin)) {
        SendError(res, 403,
                  origin.empty() ? "OPTIONS is only answered as a CORS preflight"
                                 : "origin '" + origin + "' is not in server.cors_origins");
        return false;
      }
      res.status = 204;
      res.SetHeader("Access-Control-Allow-Origin", origin);
      res.SetHeader("Vary", "Origin");
      res.SetHeader("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.SetHeader("Access-Control-Allow-Headers",
                    "Content-Type, Authorization, Inference-Header-Content-Length");
      res.SetHeader("Access-Control-Max-Age", "600");
      return false;
    }
    // Browsers send Origin with every cross-site request, also the "simple"
    // ones that need no preflight (a text/plain POST a foreign page can make
    // to localhost). Nothing of aotid's own is a page, so only the origins
    // configured are served; tools like curl send no Origin.
    if (!origin.empty() && !OriginAllowed(opts.cors_origins, origin)) {
      SendError(res, 403,
                "origin '" + origin + "' is not in server.cors_origins: cross-site requests are refused");
      return false;
    }
    if (req.method == "POST" && !AcceptedBodyType(req.Get("Content-Type"))) {
      SendError(res, 415,
                "Content-Type '" + req.Get("Content-Type") +
                    "' is not accepted: send application/json, or application/octet-stream with the "
                    "binary tensor extension");
      return false;
    }
    // A compressed body would be read as its compressed bytes: "not valid
    // JSON" at best. Say what is wrong instead.
    if (!UnencodedBody(req.Get("Content-Encoding"))) {
      SendError(res, 415,
                "Content-Encoding '" + req.Get("Content-Encoding").substr(0, 100) +
                    "' is not accepted: send the body uncompressed");
      return false;
    }
    bool needs_token = opts.token_for_all || req.path.rfind("/v2/repository/", 0) == 0;
    switch (CheckToken(opts.token, needs_token, req.Find("Authorization"))) {
      case TokenCheck::kOk: break;
      case TokenCheck::kMissing:
        res.SetHeader("WWW-Authenticate", "Bearer");
        SendError(res, 401,
                  "this aotid needs a bearer token: send 'Authorization: Bearer <token>' "
                  "(the token is in the file server.token_file names)");
        return false;
      case TokenCheck::kWrong: SendError(res, 403, "wrong bearer token"); return false;
    }
  }
  return true;
}

namespace {

// What the route handlers share: the served models, the metrics, the
// daemon's stop flag and the control plane's repository commands.
struct RouteContext {
  const ModelRegistry* registry;
  Metrics* metrics;
  std::shared_ptr<std::atomic<bool>> stopping;
  std::shared_ptr<HttpApi::ModelControl> control;
};

// The model a request names, ready to run: or the answer saying why not
// (404, or 503 with Retry-After for one on its way; a failed version is
// not retried by waiting). Null when `res` has been answered.
std::shared_ptr<const ServedModel> ReadyModel(const ModelRegistry* reg, const http::Request& req,
                                              http::Response& res) {
  auto m = Resolve(reg, req);
  if (!m.ok()) {
    SendStatus(res, m.status());
    return nullptr;
  }
  const ServedModel& sm = **m;
  if (sm.state != ServeState::kReady || !sm.model) {
    if (sm.state != ServeState::kFailed) res.SetHeader("Retry-After", "5");
    SendStatus(res, NotReady(sm));
    return nullptr;
  }
  return *m;
}

// ---- health and metadata ----

void Live(const http::Request&, http::Response& res) { res.Set(R"({"live":true})", kJson); }

// Ready (oip.h's CheckServerReady): the answer names what it waits for
// (the first 20).
void ServerReady(const ModelRegistry* reg, bool needs_resident, http::Response& res) {
  ServerReadiness r = CheckServerReady(reg, needs_resident);
  res.status = r.ready ? 200 : 503;
  json body{{"ready", r.ready}};
  if (!r.reason.empty()) body["reason"] = r.reason;
  if (r.not_ready > 0) {
    json waiting = json::array();
    for (const auto& w : r.waiting) {
      json item{{"name", w.name}, {"version", std::to_string(w.version)}, {"state", w.state}};
      if (!w.residency.empty()) item["residency"] = w.residency;
      if (!w.reason.empty()) item["reason"] = w.reason;
      waiting.push_back(std::move(item));
    }
    body["not_ready"] = std::move(waiting);
    body["not_ready_count"] = r.not_ready;
  }
  res.Set(Dump(body), kJson);
}

void ServerMetadata(const http::Request&, http::Response& res) {
  // The binary tensor extension (Triton's name for it) and the model
  // repository routes.
  res.Set(Dump(json{{"name", kServerName}, {"version", AOTID_VERSION}, {"extensions", ServerExtensions()}}),
          kJson);
}

// A served version's residency, where residency is managed: "resident"
// (its runner is loaded now) and "residency" (resident, loading, waiting
// for memory, draining, not resident). A version that is ready but not
// resident loads on its next request.
void AddResidency(const ModelRegistry* reg, const ServedModel& sm, json* j) {
  auto report = reg->GetResidency();
  if (!report || sm.state != ServeState::kReady) return;
  for (const auto& v : report->versions) {
    if (v.name != sm.name || v.version != sm.version) continue;
    (*j)["resident"] = v.state == "resident" || v.state == "draining";
    (*j)["residency"] = v.state;
    if (!v.fits) {
      (*j)["fits"] = false;
      (*j)["fit_error"] = v.why_not;
    }
  }
}

void ModelMetadata(const ModelRegistry* reg, const http::Request& req, http::Response& res) {
  auto m = Resolve(reg, req);
  if (!m.ok()) return SendStatus(res, m.status());
  const ServedModel& sm = **m;
  json versions = json::array();
  auto served = reg->All();
  if (auto it = served->find(sm.name); it != served->end()) {
    for (const auto& [n, unused] : it->second) versions.push_back(std::to_string(n));
  }
  json j{{"name", sm.name},          {"version", std::to_string(sm.version)}, {"versions", versions},
         {"platform", "aotid_aoti"}, {"state", ServeStateName(sm.state)},     {"device", sm.device}};
  if (sm.model) {
    j["inputs"] = TensorList(sm.model->spec().inputs);
    j["outputs"] = TensorList(sm.model->spec().outputs);
  } else {
    j["inputs"] = json::array();
    j["outputs"] = json::array();
  }
  if (sm.state == ServeState::kFailed) j["error"] = sm.message;
  if (!sm.device_note.empty()) j["device_note"] = sm.device_note;
  // What it is for, once it is loaded (the generate or embed spec comes
  // with the build), and the kind of its weights where the package says.
  if (sm.model) j["task"] = std::string(TaskWords(sm.generator ? "generate" : sm.embed ? "embed" : ""));
  if (sm.generator) {
    j["generates"] = DescribeGenerate(sm.generator->spec());
    j["generates"]["max_sequences"] = sm.generator->slots();  // as served: a setting may lower it
  }
  if (sm.embed) j["embeds"] = DescribeEmbed(*sm.embed);
  if (!sm.weights.empty()) j["weights"] = sm.weights;
  AddResidency(reg, sm, &j);
  if (!sm.package_json.empty()) {
    json p = ParseJsonOrDiscarded(sm.package_json);
    if (p.is_object()) {
      j["parameters"] = {{"package_kind", p.value("kind", "")},
                         {"aoti", p.value("aoti", json::object())},
                         {"author", p.value("author", json::object())}};
    }
  }
  res.Set(Dump(j), kJson);
}

void ModelReady(const ModelRegistry* reg, const http::Request& req, http::Response& res) {
  auto m = Resolve(reg, req);
  if (!m.ok()) return SendStatus(res, m.status());
  Status answers = AnswersNow(reg, **m);
  json j{{"name", (*m)->name}, {"ready", answers.ok()}, {"state", ServeStateName((*m)->state)}};
  if (!answers.ok()) j["error"] = answers.message();
  AddResidency(reg, **m, &j);
  j.erase("fit_error");
  res.status = answers.ok() ? 200 : 503;
  res.Set(Dump(j), kJson);
}

json ResidentJson(const ResidentVersionReport& v) {
  return json{{"name", v.name},
              {"version", std::to_string(v.version)},
              {"state", v.state},
              {"runners", v.runners},
              {"bytes", v.bytes},
              {"size_bytes", v.size_bytes},
              {"size_measured", v.size_measured},
              {"idle_ms", v.idle_ms},
              {"unload_in_ms", v.unload_in_ms},
              {"in_flight", v.in_flight},
              {"keep_alive", v.keep_alive},
              {"fits", v.fits},
              {"loads", v.loads},
              {"unloads", v.unloads}};
}

// GET /v2/resident: what `aotid ps` shows: the budget, what holds it, and
// every served version's residency.
void Resident(const ModelRegistry* reg, http::Response& res) {
  auto report = reg->GetResidency();
  if (!report) return SendStatus(res, NotFound("this server does not manage residency"));
  json models = json::array();
  for (const auto& v : report->versions) models.push_back(ResidentJson(v));
  json j{{"budget_bytes", report->budget_bytes}, {"budget_source", report->budget_source},
         {"used_bytes", report->used_bytes},     {"measured_bytes", report->measured_bytes},
         {"pressure", report->pressure},         {"models", std::move(models)}};
  res.Set(Dump(j), kJson);
}

// The families of the language models' schedulers, read from them now.
void AppendGenerateStats(const ModelRegistry* reg, std::string* out) {
  std::vector<std::pair<std::string, GenerateStats>> all;
  for (const auto& [name, versions] : *reg->All()) {
    for (const auto& [v, sm] : versions) {
      if (sm->state == ServeState::kReady && sm->generator) {
        all.emplace_back("model=\"" + MetricLabelValue(name) + "\",version=\"" + std::to_string(v) + "\"",
                         sm->generator->Stats());
      }
    }
  }
  if (all.empty()) return;
  struct Family {
    const char* name;
    const char* type;
    const char* help;
    std::function<std::string(const GenerateStats&)> value;
  };
  auto n = [](auto v) { return std::to_string(v); };
  auto seconds = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6f", v);
    return std::string(b);
  };
  const Family families[] = {
      {"aotid_generate_sequence_slots", "gauge", "Sequences a language model decodes at once.",
       [&](const GenerateStats& s) { return n(s.slots); }},
      {"aotid_generate_sequences_active", "gauge", "Sequences in a slot now.",
       [&](const GenerateStats& s) { return n(s.active); }},
      {"aotid_generate_sequences_waiting", "gauge", "Requests waiting for a slot now.",
       [&](const GenerateStats& s) { return n(s.waiting); }},
      {"aotid_generate_decode_steps_total", "counter",
       "Decode steps (one call of the model for every sequence in a slot); decode tokens over steps is "
       "the tokens a step makes.",
       [&](const GenerateStats& s) { return n(s.decode_steps); }},
      {"aotid_generate_decode_tokens_total", "counter", "Tokens made by decode steps.",
       [&](const GenerateStats& s) { return n(s.decode_tokens); }},
      {"aotid_generate_decode_seconds_total", "counter",
       "Time in decode steps; tokens over it is decode tokens/s.",
       [&](const GenerateStats& s) { return seconds(s.decode_seconds); }},
      {"aotid_generate_prefill_tokens_total", "counter", "Prompt tokens computed (reused ones are not).",
       [&](const GenerateStats& s) { return n(s.prefill_tokens); }},
      {"aotid_generate_prefill_seconds_total", "counter",
       "Time computing prompts; tokens over it is prefill tokens/s.",
       [&](const GenerateStats& s) { return seconds(s.prefill_seconds); }},
      {"aotid_generate_prompt_tokens_reused_total", "counter",
       "Prompt tokens a slot already held (a prefix of an earlier sequence's), not computed again.",
       [&](const GenerateStats& s) { return n(s.reused_tokens); }},
  };
  for (const Family& f : families) {
    AppendMetricHeader(out, f.name, f.type, f.help);
    for (const auto& [labels, stats] : all)
      *out += std::string(f.name) + "{" + labels + "} " + f.value(stats) + "\n";
  }
}

void RenderMetrics(const ModelRegistry* reg, Metrics* metrics, http::Response& res) {
  int loaded = 0;
  for (const auto& [name, versions] : *reg->All()) {
    for (const auto& [v, sm] : versions) loaded += sm->state == ServeState::kReady;
  }
  metrics->SetModelsLoaded(loaded);
  metrics->SetResidency(reg->GetResidency());
  std::string text = metrics->Render();
  AppendGenerateStats(reg, &text);
  res.Set(std::move(text), "text/plain; version=0.0.4");
}

// ---- infer ----

// Answers an inference's outcome as the request asked: JSON, or the
// binary tensor extension.
void AnswerInfer(const InferOutcome& o, http::Response& res) {
  if (!o.status.ok()) {
    if (o.retry_later) res.SetHeader("Retry-After", "5");
    return SendStatus(res, o.status);
  }
  res.status = 200;
  EncodedResponse encoded = EncodeInferResponse(o.model->name, o.model->version, *o.request, o.outputs);
  if (encoded.has_binary) {
    res.SetHeader(kHeaderLength, std::to_string(encoded.json_length));
    res.Set(std::move(encoded.body), "application/octet-stream");
  } else {
    res.Set(std::move(encoded.body), kJson);
  }
}

// POST /v2/models/NAME[/versions/V]/infer, through the one inference path
// (oip.h). The worker does not wait for the run: its end answers, on a
// server worker.
void Infer(const RouteContext& ctx, const http::Request& req, http::Response& res) {
  const http::Request* r = &req;
  InferDecode decode = [r](const model::ModelSpec& spec) -> StatusOr<InferRequest> {
    std::optional<size_t> json_length;
    if (r->Has(kHeaderLength)) {
      std::string v = r->Get(kHeaderLength);
      size_t n = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (v.empty() || ec != std::errc() || p != v.data() + v.size())
        return InvalidArgument(std::string(kHeaderLength) + " must be a byte count, got '" + v + "'");
      json_length = n;
    }
    return DecodeInferRequest(r->body, spec, {}, json_length);
  };
  int fd = req.connection_fd;
  std::function<bool()> gone;
  if (fd >= 0) gone = [fd] { return http::ClientGone(fd); };
  http::Reply reply = res.Defer();
  RunInfer(ctx.registry, ctx.metrics, req.params[0], req.params.size() > 1 ? req.params[1] : "", decode,
           std::move(gone), [reply](InferOutcome outcome) {
             auto o = std::make_shared<InferOutcome>(std::move(outcome));
             reply([o](http::Response& res) {
               AnswerInfer(*o, res);
               if (o->record) o->record->Answered(res.status);
             });
           });
}

// ---- generate ----

// What is recorded of a generate request that did not run (its client left
// while it waited, the model was busy, its first step failed).
GenerateResult NotRun(const std::vector<int32_t>& prompt) {
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  return r;
}

// The last (or only) JSON of a generate answer: why it ended, usage and
// timings.
json GenerateSummary(const ServedModel& sm, const GenerateResult& g, const GenerateRequest& p,
                     const std::vector<int32_t>& prompt) {
  json j{{"model_name", sm.name}, {"model_version", std::to_string(sm.version)}};
  j["finish_reason"] = g.finish_reason;
  j["seed"] = g.seed;
  j["usage"] = {{"prompt_tokens", g.prompt_tokens},
                {"completion_tokens", g.ids.size()},
                {"cached_tokens", g.cached_tokens}};
  j["timings"] = {{"queue_ms", g.queue_ms},
                  {"prefill_ms", g.prefill_ms},
                  {"first_token_ms", g.first_token_ms},
                  {"decode_ms", g.decode_ms},
                  {"decode_tokens_per_s", g.DecodeRate()}};
  if (!p.id.empty()) j["id"] = p.id;
  if (p.return_token_ids) {
    j["token_ids"] = g.ids;
    j["prompt_token_ids"] = prompt;
  }
  return j;
}

// Text generation (Triton's generate extension): the whole answer at once,
// or Server-Sent Events as it is made (`stream`).
void Generate(const RouteContext& ctx, bool stream, const http::Request& req, http::Response& res) {
  std::shared_ptr<const ServedModel> sm = ReadyModel(ctx.registry, req, res);
  if (!sm) return;
  if (!sm->generator) {
    return SendError(res, 400,
                     "model '" + sm->name +
                         "' has no generate spec: it serves tensors through /infer (a "
                         "language model exported with aotid_export.llm generates text)");
  }
  auto parsed = ParseGenerateRequest(req.body, sm->generator->spec());
  if (!parsed.ok()) return SendStatus(res, parsed.status());
  auto prompt = sm->generator->Prompt(*parsed);
  if (!prompt.ok()) return SendStatus(res, prompt.status());
  int fd = req.connection_fd;
  std::function<bool()> gone = [fd, stopping = ctx.stopping] {
    return stopping->load() || (fd >= 0 && http::ClientGone(fd));
  };
  auto seq = sm->generator->Start(sm->model, *parsed, *prompt, gone);
  if (!seq.ok()) {
    if (seq.status().code() == StatusCode::kUnavailable) res.SetHeader("Retry-After", "1");
    return SendStatus(res, seq.status());
  }
  Metrics* metrics = ctx.metrics;
  // Whether the sequence failed before it made a token: then the answer
  // is that error, streamed or not.
  auto failed = [sm, metrics, prompt = *prompt](const Sequence& s, http::Response& res) {
    Status why = s.Failure();
    if (why.ok()) return false;
    RecordGenerate(metrics, *sm, NotRun(prompt), why);
    if (why.code() == StatusCode::kUnavailable) res.SetHeader("Retry-After", "1");
    SendStatus(res, why);
    return true;
  };
  if (!stream) {
    AnswerWhenReady(*seq, false, res,
                    [seq = *seq, sm, metrics, failed, parsed = std::move(parsed).value(),
                     prompt = std::move(prompt).value()](http::Response& res) {
                      if (failed(*seq, res)) return;
                      Status error;
                      auto g = seq->Follow(nullptr, nullptr, &error, nullptr);
                      if (!g.ok()) {
                        RecordGenerate(metrics, *sm, NotRun(prompt), g.status());
                        return SendStatus(res, g.status());
                      }
                      RecordGenerate(metrics, *sm, *g, error);
                      if (!error.ok()) return SendStatus(res, error);
                      json j = GenerateSummary(*sm, *g, parsed, prompt);
                      j["text_output"] = g->text;
                      res.status = 200;
                      res.Set(Dump(j), kJson);
                    });
    return;
  }
  AnswerWhenReady(*seq, true, res,
                  [seq = *seq, sm, metrics, failed, gone, parsed = std::move(parsed).value(),
                   prompt = std::move(prompt).value()](http::Response& res) {
                    if (failed(*seq, res)) return;
                    res.status = 200;
                    res.content_type = "text/event-stream";
                    res.SetHeader("Cache-Control", "no-cache");
                    res.stream = [seq, sm, metrics, parsed, prompt,
                                  gone](const std::function<bool(std::string_view)>& write) {
                      auto event = [&](const json& j) { return write("data: " + Dump(j) + "\n\n"); };
                      auto on_text = [&](std::string_view piece) {
                        return event(json{{"model_name", sm->name},
                                          {"model_version", std::to_string(sm->version)},
                                          {"text_output", piece}});
                      };
                      Status error;
                      auto g = seq->Follow(on_text, gone, &error, nullptr);
                      if (!g.ok()) error = g.status();
                      RecordGenerate(metrics, *sm, g.ok() ? *g : NotRun(prompt), error);
                      if (!error.ok()) {
                        event(json{{"error", error.message()}});
                        return;
                      }
                      json last = GenerateSummary(*sm, *g, parsed, prompt);
                      last["text_output"] = "";
                      event(last);
                    };
                  });
}

// ---- the model repository extension ----

// What the store holds, and whether each model is served.
void Index(const ModelRegistry* reg, const http::Request& req, http::Response& res) {
  bool only_ready = false;
  if (!req.body.empty()) {
    // The bounded tape, not a DOM: a body of 16 MiB of '[' is refused at
    // depth 32 instead of costing a node per bracket.
    http::json_tape::Tape body;
    if (!body.Parse(req.body, /*max_depth=*/32) || body.kind(0) != http::json_tape::Kind::kObject) {
      return SendError(res, 400,
                       body.too_deep() ? "repository index body nests deeper than 32 levels"
                                       : "repository index body must be a JSON object");
    }
    if (uint32_t ready = body.Member(0, "ready"); ready != http::json_tape::Tape::kNone) {
      if (!body.is_bool(ready)) return SendError(res, 400, "'ready' must be true or false");
      only_ready = body.kind(ready) == http::json_tape::Kind::kTrue;
    }
  }
  json out = json::array();
  for (const RepositoryEntry& e : serving::RepositoryIndex(reg, only_ready)) {
    json item{{"name", e.name}, {"version", std::to_string(e.version)}, {"state", e.state}};
    if (!e.reason.empty()) item["reason"] = e.reason;
    out.push_back(std::move(item));
  }
  res.Set(Dump(out), kJson);
}

// Load and unload: commands to the control plane, which writes the store
// (so they outlast a restart) and completes the deferred answer once it has
// acted. No worker waits for it.
void SetEnabled(const RouteContext& ctx, bool enable, const http::Request& req, http::Response& res) {
  std::string name = req.params[0];
  if (Status s = storage::ValidateModelName(name); !s.ok()) return SendStatus(res, s);
  if (!*ctx.control) return SendStatus(res, Unavailable("models cannot be loaded or unloaded here"));
  // Triton's body, when one is sent: {"parameters": {...}}. An unload's
  // (unload_dependents) ask nothing of a store without dependents.
  if (!req.body.empty()) {
    const std::string what = enable ? "load" : "unload";
    http::json_tape::Tape body;
    if (!body.Parse(req.body, /*max_depth=*/32) || body.kind(0) != http::json_tape::Kind::kObject)
      return SendError(res, 400, what + " body must be a JSON object, or none");
    if (uint32_t params = body.Member(0, "parameters"); params != http::json_tape::Tape::kNone) {
      if (body.kind(params) != http::json_tape::Kind::kObject)
        return SendError(res, 400, "'parameters' of a " + what + " must be an object");
      if (enable && body.end(params) != params + 1)  // the first member's name
        return SendStatus(res, LoadParameterRefused(body.String(params + 1)));
    }
  }
  http::Reply reply = res.Defer();
  (*ctx.control)(name, enable, [reg = ctx.registry, reply, name, enable](Status s) {
    reply([reg, name, enable, s](http::Response& res) {
      if (!s.ok()) return SendStatus(res, s);
      auto sm = reg->Find(name);
      json j{{"name", name}, {"enabled", enable}};
      j["state"] = sm ? std::string(ServeStateName(sm->state)) : "unloaded";
      res.Set(Dump(j), kJson);
    });
  });
}

}  // namespace

void HttpApi::Routes() {
  http::Router& r = router_;
  const RouteContext ctx{registry_, metrics_, stopping_, model_control_};
  const ModelRegistry* reg = registry_;
  // Each route with and without a version segment.
  auto both = [&r](const std::string& method, const std::string& suffix, const http::Handler& handler) {
    r.Add(method, "/v2/models/*" + suffix, handler);
    r.Add(method, "/v2/models/*/versions/*" + suffix, handler);
  };

  r.Add("GET", "/v2/health/live", Live);
  r.Add("GET", "/v2/health/ready",
        [reg, needs_resident = options_.ready_needs_resident](const http::Request&, http::Response& res) {
          ServerReady(reg, needs_resident, res);
        });
  r.Add("GET", "/v2", ServerMetadata);
  both("GET", "", [reg](const http::Request& req, http::Response& res) { ModelMetadata(reg, req, res); });
  both("GET", "/ready", [reg](const http::Request& req, http::Response& res) { ModelReady(reg, req, res); });
  r.Add("GET", "/v2/resident", [reg](const http::Request&, http::Response& res) { Resident(reg, res); });
  r.Add("GET", "/metrics", [reg, metrics = metrics_](const http::Request&, http::Response& res) {
    RenderMetrics(reg, metrics, res);
  });

  both("POST", "/infer", [ctx](const http::Request& req, http::Response& res) { Infer(ctx, req, res); });
  both("POST", "/generate",
       [ctx](const http::Request& req, http::Response& res) { Generate(ctx, /*stream=*/false, req, res); });
  both("POST", "/generate_stream",
       [ctx](const http::Request& req, http::Response& res) { Generate(ctx, /*stream=*/true, req, res); });

  r.Add("POST", "/v2/repository/index",
        [reg](const http::Request& req, http::Response& res) { Index(reg, req, res); });
  r.Add("POST", "/v2/repository/models/*/load",
        [ctx](const http::Request& req, http::Response& res) { SetEnabled(ctx, true, req, res); });
  r.Add("POST", "/v2/repository/models/*/unload",
        [ctx](const http::Request& req, http::Response& res) { SetEnabled(ctx, false, req, res); });

  AddOpenAiRoutes(r, reg, metrics_, stopping_);
}

Status HttpApi::Bind() {
  server_ = std::make_unique<http::Server>(
      options_.server, [this](http::Request& req, http::Response& res) { Handle(req, res); }, ErrorBody);
  // OpenAI's clients read errors in OpenAI's shape: every error on /v1/,
  // also the refusals before any route (Host, token), the router's 404 and
  // 405, and the server's own (413, 414, 431, 408).
  server_->SetErrorHook([](std::string_view path, http::Response& res) {
    if (path.starts_with("/v1/")) ToOpenAiError(res);
  });
  RETURN_IF_ERROR(server_->Bind());
  port_ = server_->port();
  return Status::OK();
}

std::string HttpApi::Address() const {
  const http::ServerOptions& so = options_.server;
  if (!so.unix_path.empty()) return "unix:" + so.unix_path;
  std::string host = so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host;
  return "http://" + host + ":" + std::to_string(port_);
}

void HttpApi::Serve() {
  if (server_) server_->Serve();
}

void HttpApi::Stop() {
  stopping_->store(true);
  if (server_) server_->Stop();
}

}  // namespace aotid::serving
