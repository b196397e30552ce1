// The API over real loopback sockets, in process, with an empty registry:
// what any client can send before a model is involved.
#include "serving/http_api.h"

#include <nlohmann/json.hpp>
#include <thread>

#include "base/counter.h"
#include "base/fs.h"
#include "base/log.h"
#include "package/aoti_metadata.h"
#include "raw_http.h"
#include "serving/minilm_embed_json.h"
#include "test_util.h"

namespace aotid::serving {
namespace {

using aotid::testing::ConnectTcp;
using aotid::testing::Exchange;

class HttpApiTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }
  void Start(HttpOptions o, HttpApi::ModelControl control = nullptr) {
    o.server.port = 0;
    o.server.threads = 2;
    api_ = std::make_unique<HttpApi>(&registry_, &metrics_, o);
    if (control) api_->OnRepositoryCommand(std::move(control));
    ASSERT_OK(api_->Bind());
    serving_ = std::thread([this] { api_->Serve(); });
  }
  void TearDown() override { Stop(); }
  void Stop() {
    if (!api_) return;
    api_->Stop();
    serving_.join();
    api_.reset();
  }
  // One request on a fresh connection; the raw reply.
  std::string Send(const std::string& request) {
    int fd = ConnectTcp(api_->port());
    EXPECT_GE(fd, 0);
    std::string reply = Exchange(fd, request);
    ::close(fd);
    return reply;
  }
  static int StatusOf(const std::string& reply) {
    return reply.size() > 12 ? std::stoi(reply.substr(9, 3)) : 0;
  }
  static nlohmann::json BodyOf(const std::string& reply) {
    size_t head = reply.find("\r\n\r\n");
    return nlohmann::json::parse(head == std::string::npos ? "" : reply.substr(head + 4), nullptr, false);
  }

  ModelRegistry registry_;
  Metrics metrics_;
  std::unique_ptr<HttpApi> api_;
  std::thread serving_;
};

// Error messages quote what the client sent; bytes that are not UTF-8 must
// not break the JSON body (they once ended the process).
TEST_F(HttpApiTest, HostileBytesInHeadersGetAClearErrorAndTheServerStaysUp) {
  const std::string cases[] = {
      "POST /v2/models/m/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: \xff\r\n\r\n",
      "GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\nX\xff: a\r\n\r\n",
      "POST /v2/models/m/infer HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: \xff\r\n\r\n",
      "POST /v2/models/m/infer HTTP/1.1\r\nHost: localhost\r\nExpect: \xff\r\nContent-Length: 2\r\n\r\n{}",
      "GET /v2/models/\xff HTTP/1.1\r\nHost: localhost\r\n\r\n",
      "GET /v2/health/live HTTP/1.1\r\nHost: \xff\r\n\r\n",
  };
  for (const auto& request : cases) {
    std::string reply = Send(request);
    int status = StatusOf(reply);
    EXPECT_TRUE((status >= 400 && status < 500) || status == 501) << status << " for " << request;
    auto body = BodyOf(reply);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << reply;
    EXPECT_FALSE(body["error"].get<std::string>().empty());
  }
  std::string live = Send("GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(StatusOf(live), 200) << live;
}

// At log.level debug each refusal is logged with its status and reason.
TEST_F(HttpApiTest, RefusalsAreLoggedAtDebugLevel) {
  aotid::testing::TempDir dir;
  ASSERT_OK(log::SetFile(dir / "log", 1 << 20, 1));
  log::Level before = log::GetLevel();
  log::SetLevel(log::Level::kDebug);
  std::string reply = Send("GET /v2/models/nope HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  log::SetLevel(log::Level::kInfo);
  Send("GET /v2/models/quiet HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  log::SetLevel(before);
  log::ResetToStderr();
  EXPECT_EQ(StatusOf(reply), 404) << reply;
  std::string text = fs::ReadFile(dir / "log").value_or("");
  EXPECT_NE(text.find("debug answered 404 to GET /v2/models/nope: {\"error\":"), std::string::npos) << text;
  EXPECT_EQ(text.find("/v2/models/quiet"), std::string::npos) << text;  // not at info
}

std::string PostIndex(const std::string& body) {
  return "POST /v2/repository/index HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A body of nothing but '[' once cost a JSON node per byte (~1 GB for
// 16 MiB, kept by the worker thread); the bounded reader stops at depth 32.
TEST_F(HttpApiTest, RepositoryIndexBodyIsReadWithTheNestingBound) {
  std::string reply = Send(PostIndex(std::string(16 << 20, '[')));
  EXPECT_EQ(StatusOf(reply), 400) << reply.substr(0, 200);
  EXPECT_EQ(BodyOf(reply)["error"], "repository index body nests deeper than 32 levels");
  EXPECT_EQ(StatusOf(Send(PostIndex(R"({"ready": "yes"})"))), 400);
  EXPECT_EQ(StatusOf(Send(PostIndex("[]"))), 400);
  std::string ok = Send(PostIndex(R"({"ready": true})"));
  EXPECT_EQ(StatusOf(ok), 200) << ok;
  EXPECT_EQ(BodyOf(ok), nlohmann::json::array());
}

std::string Post(const std::string& path, const std::string& headers, const std::string& body = "{}") {
  return "POST " + path + " HTTP/1.1\r\nHost: localhost\r\n" + headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// The "simple" request a foreign page can make without a preflight: its
// Origin is refused before any route runs (it could unload a model).
TEST_F(HttpApiTest, CrossSiteRequestsAreRefusedUnlessTheirOriginIsConfigured) {
  std::string unload = Send(
      Post("/v2/repository/models/m/unload", "Origin: https://evil.example\r\nContent-Type: text/plain\r\n"));
  EXPECT_EQ(StatusOf(unload), 403) << unload;
  EXPECT_NE(
      BodyOf(unload)["error"].get<std::string>().find("'https://evil.example' is not in server.cors_origins"),
      std::string::npos);
  EXPECT_EQ(StatusOf(Send(Post("/v2/models/m/infer", "Origin: null\r\n"))), 403);
  Stop();
  HttpOptions o;
  o.cors_origins = {"http://localhost:3000"};
  Start(o);
  std::string allowed =
      Send(Post("/v2/models/m/infer", "Origin: http://localhost:3000\r\nContent-Type: application/json\r\n"));
  EXPECT_EQ(StatusOf(allowed), 404) << allowed;  // reached the route: no model m
  EXPECT_NE(allowed.find("Access-Control-Allow-Origin: http://localhost:3000"), std::string::npos) << allowed;
  // A preflight carries each CORS header once: a browser refuses two.
  std::string preflight = Send(
      "OPTIONS /v2/models/m/infer HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:3000\r\n"
      "Access-Control-Request-Method: POST\r\n\r\n");
  EXPECT_EQ(StatusOf(preflight), 204) << preflight;
  for (const char* header : {"Access-Control-Allow-Origin: ", "Vary: "}) {
    size_t first = preflight.find(header);
    ASSERT_NE(first, std::string::npos) << header << preflight;
    EXPECT_EQ(preflight.find(header, first + 1), std::string::npos) << "twice: " << header << "\n"
                                                                    << preflight;
  }
}

// OpenAI's clients read {"error": {"message", "type", ...}}: the server's
// own refusals, made before any route runs, take that shape on /v1/ too
// (they were {"error": "message"}), and keep aotid's elsewhere.
TEST_F(HttpApiTest, TheServersOwnRefusalsTakeOpenAisShapeOnV1) {
  Stop();
  HttpOptions o;
  o.server.request_timeout_s = 1;
  Start(o);
  const std::string host = "Host: localhost\r\n";
  std::string many_headers;
  for (int i = 0; i < 101; ++i) many_headers += "X-" + std::to_string(i) + ": a\r\n";
  struct Case {
    int status;
    std::string v1, v2;  // the same refusal on a /v1/ path and on a /v2/ one
  } cases[] = {
      {413, "POST /v1/chat/completions HTTP/1.1\r\n" + host + "Content-Length: 100000000\r\n\r\n",
       "POST /v2/models/m/infer HTTP/1.1\r\n" + host + "Content-Length: 100000000\r\n\r\n"},
      {414, "GET /v1/models/" + std::string(20000, 'a') + " HTTP/1.1\r\n" + host + "\r\n",
       "GET /v2/models/" + std::string(20000, 'a') + " HTTP/1.1\r\n" + host + "\r\n"},
      {431, "GET /v1/models HTTP/1.1\r\n" + host + many_headers + "\r\n",
       "GET /v2/models/m HTTP/1.1\r\n" + host + many_headers + "\r\n"},
      {408, "GET /v1/models HTTP/1.1\r\n" + host, "GET /v2/models/m HTTP/1.1\r\n" + host},  // never ends
  };
  for (const Case& c : cases) {
    std::string v1 = Send(c.v1);
    ASSERT_EQ(StatusOf(v1), c.status) << v1.substr(0, 300);
    nlohmann::json e = BodyOf(v1);
    ASSERT_TRUE(e.contains("error") && e["error"].is_object()) << v1.substr(0, 300);
    EXPECT_FALSE(e["error"]["message"].get<std::string>().empty());
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(e["error"].contains("param") && e["error"].contains("code")) << e;
    std::string v2 = Send(c.v2);
    ASSERT_EQ(StatusOf(v2), c.status) << v2.substr(0, 300);
    EXPECT_TRUE(BodyOf(v2)["error"].is_string()) << v2.substr(0, 300);
  }
}

TEST_F(HttpApiTest, PostBodiesOfFormAndTextTypesAreRefusedWith415) {
  for (std::string type : {"text/plain", "multipart/form-data; boundary=x", "application/xml"}) {
    std::string reply = Send(Post("/v2/models/m/infer", "Content-Type: " + type + "\r\n"));
    EXPECT_EQ(StatusOf(reply), 415) << type << ": " << reply;
  }
  for (std::string type : {"application/json", "Application/JSON; charset=utf-8", "application/octet-stream",
                           "application/x-www-form-urlencoded"}) {
    EXPECT_EQ(StatusOf(Send(Post("/v2/models/m/infer", "Content-Type: " + type + "\r\n"))), 404) << type;
  }
  EXPECT_EQ(StatusOf(Send(Post("/v2/models/m/infer", ""))), 404);  // no type at all
}

// A compressed body is refused naming its encoding, not read as its bytes.
TEST_F(HttpApiTest, EncodedBodiesAreRefusedWith415NamingTheEncoding) {
  for (std::string enc : {"gzip", "br", "deflate"}) {
    std::string reply = Send(Post("/v2/models/m/infer", "Content-Encoding: " + enc + "\r\n"));
    EXPECT_EQ(StatusOf(reply), 415) << enc << ": " << reply;
    EXPECT_NE(reply.find("Content-Encoding '" + enc + "' is not accepted"), std::string::npos) << reply;
  }
  EXPECT_EQ(StatusOf(Send(Post("/v2/models/m/infer", "Content-Encoding: Identity\r\n"))), 404);
}

TEST_F(HttpApiTest, BearerSchemeIsCaseInsensitive) {
  Stop();
  HttpOptions o;
  o.token = "s3cret";
  Start(o);
  auto get = [&](const std::string& auth) {
    return StatusOf(Send("GET /v2 HTTP/1.1\r\nHost: localhost\r\n" + auth + "\r\n"));
  };
  EXPECT_EQ(get(""), 401);
  EXPECT_EQ(get("Authorization: Bearer s3cret\r\n"), 200);
  EXPECT_EQ(get("Authorization: bEaReR s3cret\r\n"), 200);
  EXPECT_EQ(get("Authorization: Bearer wrong\r\n"), 403);
  EXPECT_EQ(get("Authorization: Basic s3cret\r\n"), 403);
}

// An unloaded model is one the store has: 503 with how to load it, not 404.
TEST_F(HttpApiTest, UnloadedModelIsUnavailableWithTheWayBackNotUnknown) {
  registry_.SetCatalog({{"demo", 1, /*enabled=*/false, /*wanted=*/false, "latest"}});
  for (const char* path : {"/v2/models/demo/ready", "/v2/models/demo", "/v2/models/demo/versions/1/ready"}) {
    std::string reply = Send("GET " + std::string(path) + " HTTP/1.1\r\nHost: localhost\r\n\r\n");
    EXPECT_EQ(StatusOf(reply), 503) << path << ": " << reply;
    EXPECT_NE(reply.find("POST /v2/repository/models/demo/load"), std::string::npos) << reply;
  }
  std::string unknown = Send("GET /v2/models/nope/ready HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(StatusOf(unknown), 404) << unknown;
}

// Ready means every version that should be served answers: one building or
// failed holds it back and is named; an unloaded one or one its model's
// policy no longer serves does not.
TEST_F(HttpApiTest, ReadyOnlyWhenEveryWantedVersionIsReady) {
  auto ready = [this] {
    std::string reply = Send("GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\n\r\n");
    return std::make_pair(StatusOf(reply), BodyOf(reply));
  };
  EXPECT_EQ(ready().first, 503);  // the start-up is not done
  EXPECT_EQ(ready().second["reason"], "starting");
  registry_.SetStartupDone();
  EXPECT_EQ(ready().first, 200);  // nothing to serve

  registry_.SetCatalog({{"a", 1, true, true, "latest"},
                        {"b", 1, true, false, "latest"},  // an older version of b
                        {"b", 2, true, true, "latest"},
                        {"c", 1, /*enabled=*/false, false, "latest"}});
  ServedModel a{"a", 1, ServeState::kBuilding};
  registry_.Put(a);
  ServedModel b2{"b", 2, ServeState::kFailed};
  b2.message = "the build failed: out of memory";
  registry_.Put(b2);
  auto [status, body] = ready();
  EXPECT_EQ(status, 503);
  EXPECT_EQ(body["not_ready_count"], 2);
  EXPECT_EQ(body["not_ready"], nlohmann::json::parse(R"([{"name":"a","version":"1","state":"building"},
      {"name":"b","version":"2","state":"failed","reason":"the build failed: out of memory"}])"));

  a.state = ServeState::kReady;
  registry_.Put(a);
  b2.state = ServeState::kReady;
  registry_.Put(b2);
  EXPECT_EQ(ready().first, 200) << ready().second.dump();
  ServedModel b1{"b", 1, ServeState::kFailed};  // not wanted: does not count
  registry_.Put(b1);
  EXPECT_EQ(ready().first, 200) << ready().second.dump();
}

// Single-model mode: ready waits for the version to be loaded too, since
// an orchestrator sends it traffic the moment it says ready; residency's
// other states hold it back and are named.
TEST_F(HttpApiTest, ReadyCanAlsoWaitForEveryWantedVersionToBeLoaded) {
  Stop();
  HttpOptions o;
  o.ready_needs_resident = true;
  Start(o);
  auto ready = [this] {
    std::string reply = Send("GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\n\r\n");
    return std::make_pair(StatusOf(reply), BodyOf(reply));
  };
  registry_.SetStartupDone();
  registry_.SetCatalog({{"demo", 1, true, true, "latest"}});
  registry_.Put(ServedModel{"demo", 1, ServeState::kReady});
  auto report = std::make_shared<ResidencyReport>();
  ResidentVersionReport v;
  v.name = "demo";
  v.version = 1;
  for (const char* state : {"loading", "waiting for memory", "not resident"}) {
    v.state = state;
    report->versions = {v};
    registry_.SetResidency(std::make_shared<ResidencyReport>(*report));
    auto [status, body] = ready();
    EXPECT_EQ(status, 503) << state;
    EXPECT_EQ(body["not_ready"][0]["residency"], state) << body.dump();
    EXPECT_EQ(body["not_ready"][0]["state"], "ready") << body.dump();
  }
  v.state = "resident";
  report->versions = {v};
  registry_.SetResidency(std::make_shared<ResidencyReport>(*report));
  EXPECT_EQ(ready().first, 200) << ready().second.dump();
  // A version the report does not know yet is not loaded either.
  report->versions.clear();
  registry_.SetResidency(std::make_shared<ResidencyReport>(*report));
  EXPECT_EQ(ready().first, 503);
  // Nothing to serve (the model disabled, so not wanted) is not ready either.
  registry_.SetCatalog({{"demo", 1, /*enabled=*/false, /*wanted=*/false, "latest"}});
  EXPECT_EQ(ready().first, 503);
  EXPECT_EQ(ready().second["reason"], "no model is served");
  // Without the option, ready does not wait for the load.
  Stop();
  Start({});
  EXPECT_EQ(ready().first, 200) << ready().second.dump();
}

// GET /v2 names the extensions that work; a model on its way asks the
// client back (Retry-After), a failed one does not.
TEST_F(HttpApiTest, ServerMetadataNamesItsExtensionsAndA503SaysWhenToRetry) {
  std::string meta = Send("GET /v2 HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(BodyOf(meta)["extensions"],
            nlohmann::json::parse(R"(["binary_tensor_data","model_repository","generate"])"));

  registry_.SetCatalog({{"a", 1, true, true, "latest"}, {"b", 1, true, true, "latest"}});
  registry_.Put(ServedModel{"a", 1, ServeState::kBuilding});
  registry_.Put(ServedModel{"b", 1, ServeState::kFailed});
  const std::string infer =
      " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
      "Content-Length: 2\r\n\r\n{}";
  std::string building = Send("POST /v2/models/a/infer" + infer);
  EXPECT_EQ(StatusOf(building), 503) << building;
  EXPECT_NE(building.find("Retry-After: 5\r\n"), std::string::npos) << building;
  std::string failed = Send("POST /v2/models/b/infer" + infer);
  EXPECT_EQ(StatusOf(failed), 503) << failed;
  EXPECT_EQ(failed.find("Retry-After"), std::string::npos) << failed;
}

// A loaded model that is only its spec: what the metadata route reads.
class SpecOnlyModel final : public model::LoadedModel {
 public:
  explicit SpecOnlyModel(model::ModelSpec spec) : spec_(std::move(spec)) {}
  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>&,
                                                 const model::RunContext&) override {
    return FailedPrecondition("metadata only");
  }

 private:
  model::ModelSpec spec_;
  std::string device_ = "cpu";
};

// A test package's language model served as the loader serves it: its
// generate spec from the package, the model's inputs and outputs, the kind
// of its weights.
ServedModel LanguageModel(const std::string& name, const std::string& file) {
  ServedModel sm{name, 1, ServeState::kReady};
  auto archive = package::Archive::Open(aotid::testing::TestData(file));
  EXPECT_TRUE(archive.ok()) << archive.status().ToString();
  if (!archive.ok()) return sm;
  auto spec = text::GenerateSpec::FromJson(package::ReadTaskSpec(*archive, "model").value());
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  if (!spec.ok()) return sm;
  model::ModelSpec io;
  const int64_t ctx = spec->max_seq_len;
  io.inputs = {{"tokens", model::DType::kInt64, {1, -1}, {std::nullopt, model::DimRange{"seq", 1, ctx}}},
               {"input_pos", model::DType::kInt64, {-1}, {model::DimRange{"seq", 1, ctx}}}};
  io.outputs = {{"logits", model::DType::kFloat32, {1, spec->tokenizer->vocab_size()}}};
  auto gen = Generator::Create(std::move(spec).value(), io);
  EXPECT_TRUE(gen.ok()) << gen.status().ToString();
  sm.model = std::make_shared<SpecOnlyModel>(io);
  sm.generator = gen.ok() ? *gen : nullptr;
  sm.weights = package::WeightsKind(*archive, "model");
  return sm;
}

// GET /v2/models/NAME says what a loaded model is for beside the protocol's
// fields: a language model's context, end tokens and chat template, an
// embedding model's vectors, the kind of the weights where the package
// lists them. A model not loaded yet says nothing it cannot know.
TEST_F(HttpApiTest, ModelMetadataSaysWhatTheModelIsFor) {
  registry_.Put(LanguageModel("chat", "tiny_llm.pt2"));
  registry_.Put(LanguageModel("int8", "tiny_llm_int8.pt2"));
  auto get = [&](const std::string& path) {
    std::string reply = Send("GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n");
    EXPECT_EQ(StatusOf(reply), 200) << reply;
    return BodyOf(reply);
  };

  // As the packages' records say (their aotid.json) and their tokenizer
  // spells the end token.
  auto chat_sm = registry_.Find("chat");
  ASSERT_NE(chat_sm, nullptr);
  ASSERT_NE(chat_sm->generator, nullptr);
  const text::GenerateSpec& spec = chat_sm->generator->spec();
  auto record = nlohmann::json::parse(package::Archive::Open(aotid::testing::TestData("tiny_llm.pt2"))
                                          ->Read("tiny_llm/extra/aotid.json")
                                          .value());
  auto tokens = nlohmann::json::parse(package::Archive::Open(aotid::testing::TestData("tiny_llm.pt2"))
                                          ->Read("tiny_llm/extra/aotid_tokenizer.json")
                                          .value())["tokens"];
  const int32_t eos = record["generate"]["eos_token_ids"][0];
  // The vocabulary spells a byte-level token's space as U+0120 ("Ġ").
  std::string eos_text = tokens[eos];
  for (size_t at; (at = eos_text.find("\u0120")) != std::string::npos;) eos_text.replace(at, 2, " ");
  nlohmann::json chat = get("/v2/models/chat");
  EXPECT_EQ(chat["task"], "text generation");
  EXPECT_EQ(chat["generates"]["context_length"], record["generate"]["max_seq_len"]);
  EXPECT_EQ(chat["generates"]["max_prefill"], record["generate"]["max_prefill"]);
  EXPECT_EQ(chat["generates"]["end_tokens"],
            nlohmann::json::parse(R"([{"id": )" + std::to_string(eos) + R"(, "text": )" +
                                  nlohmann::json(eos_text).dump() + "}]"));
  EXPECT_FALSE(chat["generates"].contains("begin_token"));  // the record names none
  EXPECT_EQ(chat["generates"]["chat_template"], true);
  EXPECT_EQ(chat["weights"], "float32");
  // The protocol's fields are as they were.
  EXPECT_EQ(chat["name"], "chat");
  EXPECT_EQ(chat["versions"], nlohmann::json::array({"1"}));
  EXPECT_EQ(chat["platform"], "aotid_aoti");
  EXPECT_EQ(chat["inputs"][0]["name"], "tokens");
  EXPECT_EQ(chat["outputs"][0]["name"], "logits");

  nlohmann::json int8 = get("/v2/models/int8/versions/1");
  EXPECT_EQ(int8["task"], "text generation");
  EXPECT_EQ(int8["generates"]["chat_template"], false);
  EXPECT_EQ(int8["weights"], "int8");

  // all-MiniLM-L6-v2's spec, as the compile worker writes embed.json.
  nlohmann::json embed_json = aotid::testing::MinilmEmbedJson();
  embed_json["truncatable_dims"] = true;
  auto embed_spec = EmbedSpec::FromJson(embed_json.dump());
  ASSERT_TRUE(embed_spec.ok()) << embed_spec.status().ToString();
  ServedModel enc{"enc", 1, ServeState::kReady};
  model::ModelSpec io;
  io.inputs = {{"input_ids", model::DType::kInt64, {-1, -1}},
               {"attention_mask", model::DType::kInt64, {-1, -1}}};
  io.outputs = {{"embedding", model::DType::kFloat32, {-1, 384}}};
  enc.model = std::make_shared<SpecOnlyModel>(io);
  enc.embed = std::make_shared<const EmbedSpec>(std::move(embed_spec).value());
  registry_.Put(enc);
  nlohmann::json e = get("/v2/models/enc");
  EXPECT_EQ(e["task"], "embeddings");
  EXPECT_EQ(e["embeds"], nlohmann::json::parse(R"({"dimensions": 384, "pooling": "mean", "normalized": true,
                                                   "max_tokens": 256, "truncatable": true})"));
  EXPECT_FALSE(e.contains("generates"));
  EXPECT_FALSE(e.contains("weights"));  // no package said

  ServedModel plain{"plain", 1, ServeState::kReady};
  plain.model = std::make_shared<SpecOnlyModel>(io);
  registry_.Put(plain);
  nlohmann::json p = get("/v2/models/plain");
  EXPECT_EQ(p["task"], "tensors");
  EXPECT_FALSE(p.contains("generates") || p.contains("embeds"));

  registry_.Put(ServedModel{"later", 1, ServeState::kBuilding});
  EXPECT_FALSE(get("/v2/models/later").contains("task"));
}

// Load and unload are commands the control plane completes later: while 16
// of them wait (a model whose load keeps failing), the route's workers (2
// here) are free, and every other route answers at once. (Each once held a
// worker for up to 5 s: another model's infer waited 9.5 s behind them.)
// What `aotid ps` reads: the residency report as the control loop last
// published it, and each served version's residency in its metadata and
// ready answers; the same figures in /metrics.
TEST_F(HttpApiTest, TheResidencyReportIsServedAndEachVersionSaysWhetherItIsResident) {
  auto get = [&](const std::string& path, int status = 200) {
    std::string reply = Send("GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n");
    EXPECT_EQ(StatusOf(reply), status) << reply;
    return BodyOf(reply);
  };
  EXPECT_EQ(get("/v2/resident", 404)["error"], "this server does not manage residency");
  registry_.Put(LanguageModel("chat", "tiny_llm.pt2"));
  auto report = std::make_shared<ResidencyReport>();
  report->budget_bytes = uint64_t{600} << 20;
  report->budget_source = "residency.memory_budget_mb";
  report->used_bytes = uint64_t{210} << 20;
  report->pressure = "normal";
  ResidentVersionReport chat;
  chat.name = "chat";
  chat.version = 1;
  chat.state = "not resident";
  chat.size_bytes = uint64_t{210} << 20;
  chat.size_measured = true;
  chat.keep_alive = "5m";
  chat.loads = 3;
  chat.unloads = 3;
  report->versions.push_back(chat);
  ResidentVersionReport other = chat;
  other.name = "other";
  other.state = "resident";
  other.bytes = uint64_t{180} << 20;
  other.idle_ms = 1500;
  other.unload_in_ms = 298'500;
  report->versions.push_back(other);
  registry_.SetResidency(report);

  nlohmann::json r = get("/v2/resident");
  EXPECT_EQ(r["budget_bytes"], uint64_t{600} << 20);
  EXPECT_EQ(r["budget_source"], "residency.memory_budget_mb");
  EXPECT_EQ(r["used_bytes"], uint64_t{210} << 20);
  ASSERT_EQ(r["models"].size(), 2u);
  EXPECT_EQ(r["models"][0]["name"], "chat");
  EXPECT_EQ(r["models"][0]["version"], "1");
  EXPECT_EQ(r["models"][0]["state"], "not resident");
  EXPECT_EQ(r["models"][0]["loads"], 3);
  EXPECT_EQ(r["models"][1]["unload_in_ms"], 298'500);
  EXPECT_EQ(r["models"][1]["bytes"], uint64_t{180} << 20);

  // Ready, though not resident: it loads on its next request.
  nlohmann::json ready = get("/v2/models/chat/ready");
  EXPECT_EQ(ready["ready"], true);
  EXPECT_EQ(ready["resident"], false);
  EXPECT_EQ(ready["residency"], "not resident");
  EXPECT_EQ(get("/v2/models/chat")["resident"], false);

  // One that can never fit the budget is not ready: every request would
  // get 503.
  auto cannot = std::make_shared<ResidencyReport>(*report);
  cannot->versions[0].fits = false;
  cannot->versions[0].why_not = "chat:1 needs about 210 MB of memory and the budget of 100 MB leaves 100 MB";
  registry_.SetResidency(cannot);
  nlohmann::json not_ready = get("/v2/models/chat/ready", 503);
  EXPECT_EQ(not_ready["ready"], false);
  EXPECT_EQ(not_ready["error"], cannot->versions[0].why_not);
  registry_.SetResidency(report);

  std::string metrics = Send("GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_NE(metrics.find("aotid_model_resident_bytes{model=\"other\",version=\"1\"} " +
                         std::to_string(uint64_t{180} << 20)),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("aotid_model_resident_bytes{model=\"chat\""), std::string::npos) << "not resident";
  EXPECT_NE(metrics.find("aotid_memory_budget_bytes " + std::to_string(uint64_t{600} << 20)),
            std::string::npos);
}

TEST_F(HttpApiTest, LoadsThatTakeTimeHoldNoWorker) {
  Stop();
  Mutex mu;
  std::vector<std::pair<std::string, std::function<void(Status)>>> commands;
  aotid::testing::Counter sent;
  Start({}, [&](const std::string& name, bool enable, std::function<void(Status)> done) {
    MutexLock lock(&mu);
    commands.emplace_back(name + (enable ? ":load" : ":unload"), std::move(done));
    sent.Add();
  });
  std::vector<int> fds;
  for (int i = 0; i < 16; ++i) {
    int fd = ConnectTcp(api_->port());
    ASSERT_GE(fd, 0);
    // Each connection names its own model: the route's two workers take the
    // connections in whatever order they come, so a name says whose it is.
    std::string model = "m" + std::to_string(i);
    std::string load = Post("/v2/repository/models/" + model + (i % 2 ? "/load" : "/unload"), "");
    ASSERT_GT(::send(fd, load.data(), load.size(), MSG_NOSIGNAL), 0);
    fds.push_back(fd);
  }
  EXPECT_TRUE(sent.Await(16));
  {
    MutexLock lock(&mu);
    ASSERT_EQ(commands.size(), 16u);
  }
  std::string live = Send("GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(StatusOf(live), 200) << live;
  // Each is answered when its command completes: the model's state, or
  // the control plane's error with its status.
  {
    MutexLock lock(&mu);
    for (auto& [command, done] : commands) {
      const bool fail = command.rfind("m3:", 0) == 0;
      done(fail ? NotFound("no model 'm3' in the store") : Status::OK());
    }
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    std::string reply = Exchange(fds[i], "");
    ::close(fds[i]);
    if (i == 3) {
      EXPECT_EQ(StatusOf(reply), 404) << reply;
      continue;
    }
    EXPECT_EQ(StatusOf(reply), 200) << reply;
    EXPECT_EQ(BodyOf(reply)["name"], "m" + std::to_string(i)) << reply;
    EXPECT_EQ(BodyOf(reply)["state"], "unloaded") << reply;  // the empty registry's answer
    EXPECT_EQ(BodyOf(reply)["enabled"], i % 2 == 1) << reply;
  }
}

// Triton's load and unload bodies: an unload's parameters
// (unload_dependents) and an empty load are taken; a load that asks for a
// config or files of its own is refused naming the parameter, as is a
// body that is not a JSON object, and neither reaches the control plane.
TEST_F(HttpApiTest, ALoadWithParametersOrABodyNotAnObjectIsRefused) {
  Stop();
  Mutex mu;
  std::vector<std::string> asked;
  Start({}, [&](const std::string& name, bool enable, std::function<void(Status)> done) {
    {
      MutexLock lock(&mu);
      asked.push_back(name + (enable ? ":load" : ":unload"));
    }
    done(Status::OK());
  });
  struct Case {
    std::string route, body;
    int status;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"a/load", "", 200, ""},
      {"b/load", R"({"parameters": {}})", 200, ""},
      {"c/unload", R"({"parameters": {"unload_dependents": false}})", 200, ""},
      {"d/load", R"({"parameters": {"config": "{\"max_batch_size\": 8}"}})", 400, "'config' was given"},
      {"e/load", R"({"parameters": {"file:1/model.pt": "AAAA"}})", 400, "'file:1/model.pt' was given"},
      {"f/load", "{", 400, "load body must be a JSON object"},
      {"g/unload", "[1]", 400, "unload body must be a JSON object"},
      {"h/load", R"({"parameters": "config"})", 400, "'parameters' of a load must be an object"},
  };
  for (const Case& c : cases) {
    std::string reply = Send(Post("/v2/repository/models/" + c.route, "", c.body));
    EXPECT_EQ(StatusOf(reply), c.status) << c.route << " " << c.body << ": " << reply;
    if (!c.says.empty()) {
      EXPECT_NE(BodyOf(reply).value("error", "").find(c.says), std::string::npos) << reply;
    }
  }
  MutexLock lock(&mu);
  EXPECT_EQ(asked, (std::vector<std::string>{"a:load", "b:load", "c:unload"}));
}

TEST_F(HttpApiTest, WithoutAControlPlaneLoadsAreUnavailable) {
  std::string reply = Send(Post("/v2/repository/models/m/load", ""));
  EXPECT_EQ(StatusOf(reply), 503) << reply;
}

// A full queue drains: 503, and clients (Triton's, OpenAI's) retry it by
// themselves. A run over a fixed limit (a runner's memory, a slot) fails
// the same way every time: 413, which no client retries.
TEST(HttpStatusFor, AFullQueueIsRetryableAndAFixedLimitIsNot) {
  EXPECT_EQ(HttpStatusFor(ResourceExhausted("the model's queue is full")), 503);
  EXPECT_EQ(HttpStatusFor(LimitExceeded("the run needs more memory than the runner may use")), 413);
  EXPECT_EQ(HttpStatusFor(DeadlineExceeded("late")), 504);
}

TEST(ErrorBody, InvalidUtf8BecomesReplacementCharacters) {
  auto body = nlohmann::json::parse(ErrorBody("bad \xff\xfe byte"), nullptr, false);
  ASSERT_TRUE(body.is_object());
  EXPECT_EQ(body["error"], "bad \xEF\xBF\xBD\xEF\xBF\xBD byte");
}

}  // namespace
}  // namespace aotid::serving
