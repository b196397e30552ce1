// POST /v1/embeddings over real loopback sockets, in process: an encoder
// whose vector is a function of the tokens under its mask, behind the
// dynamic batcher with padding, as the daemon serves an embedding model.
// What the real encoder computes is tests/exporter/embed_minilm_test.py's
// and tests/e2e's.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/counter.h"
#include "base/fs.h"
#include "base/mutex.h"
#include "raw_http.h"
#include "serving/batcher.h"
#include "serving/http_api.h"
#include "serving/minilm_embed_json.h"
#include "test_util.h"

namespace aotid::serving {
namespace {

using aotid::testing::ConnectTcp;
using aotid::testing::Exchange;
using model::DType;
using model::HostTensor;
using nlohmann::json;

constexpr int64_t kDim = 4;

// all-MiniLM-L6-v2's tokenizer, 4-float vectors, texts cut at 16 tokens.
std::shared_ptr<const EmbedSpec> Spec() {
  json j = aotid::testing::MinilmEmbedJson();
  j["dim"] = kDim;
  j["normalize"] = false;
  j["max_seq_len"] = 16;
  j["truncatable_dims"] = true;
  auto spec = EmbedSpec::FromJson(j.dump());
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return std::make_shared<const EmbedSpec>(spec.ok() ? std::move(spec).value() : EmbedSpec{});
}

// A row's vector, from its tokens: [their count, their sum, the first,
// the last]. Padding (ids under a 0 mask) must not change it.
std::vector<float> Expected(const std::vector<int32_t>& ids) {
  float sum = 0;
  for (int32_t id : ids) sum += static_cast<float>(id);
  return {static_cast<float>(ids.size()), sum, static_cast<float>(ids.front()),
          static_cast<float>(ids.back())};
}

// The encoder: Expected() of each row's masked tokens. Records the largest
// number of rows a run got, and can be held until the test opens it.
class Encoder : public model::LoadedModel {
 public:
  Encoder() {
    spec_.inputs.push_back({"input_ids", DType::kInt64, {-1, -1}});
    spec_.inputs.push_back({"attention_mask", DType::kInt64, {-1, -1}});
    spec_.outputs.push_back({"embedding", DType::kFloat32, {-1, kDim}});
  }
  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<HostTensor>> Infer(const std::vector<HostTensor>& in,
                                          const model::RunContext&) override {
    calls.Add();
    std::shared_future<void> gate = Gate();
    if (gate.valid()) gate.wait_for(std::chrono::seconds(10));  // 10 s: the test has failed
    if (fail) return Internal("the encoder broke");
    const int64_t rows = in[0].shape[0], seq = in[0].shape[1];
    max_rows = std::max<int64_t>(max_rows, rows);
    const auto* ids = reinterpret_cast<const int64_t*>(in[0].data.data());
    const auto* mask = reinterpret_cast<const int64_t*>(in[1].data.data());
    std::vector<float> v;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t> mine;
      for (int64_t t = 0; t < seq; ++t) {
        if (mask[r * seq + t]) mine.push_back(static_cast<int32_t>(ids[r * seq + t]));
      }
      auto e = Expected(mine);
      v.insert(v.end(), e.begin(), e.end());
    }
    HostTensor out{"embedding", DType::kFloat32, {rows, kDim}, {}};
    out.data.resize(v.size() * sizeof(float));
    std::memcpy(out.data.data(), v.data(), out.data.size());
    return std::vector<HostTensor>{out};
  }
  // Runs wait until `gate` is made ready. Set under a lock: the request
  // that reads it reaches the server by a socket, which gives a race
  // detector no order.
  void SetGate(std::shared_future<void> gate) {
    MutexLock lock(&mu_);
    gate_ = std::move(gate);
  }
  aotid::testing::Counter calls;
  std::atomic<int64_t> max_rows{0};
  std::atomic<bool> fail{false};

 private:
  std::shared_future<void> Gate() {
    MutexLock lock(&mu_);
    return gate_;
  }
  Mutex mu_;
  std::shared_future<void> gate_ GUARDED_BY(mu_);
  model::ModelSpec spec_;
  std::string device_ = "cpu";
};

class EmbeddingsRouteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    encoder_ = std::make_shared<Encoder>();
    BatchOptions opts;
    opts.max_batch_size = 16;
    opts.pad = {0, 0};
    batcher_ = std::make_shared<BatchingModel>(encoder_, opts);
    ServedModel m{"enc", 1, ServeState::kReady};
    m.model = batcher_;
    m.embed = spec_;
    m.created_at_ms = 1700000000000;
    registry_.Put(m);
    HttpOptions o;
    o.server.port = 0;
    o.server.threads = 4;
    api_ = std::make_unique<HttpApi>(&registry_, &metrics_, o);
    ASSERT_OK(api_->Bind());
    serving_ = std::thread([this] { api_->Serve(); });
  }
  void TearDown() override {
    api_->Stop();
    serving_.join();
  }
  struct Reply {
    int status = 0;
    std::string head;
    json body;
  };
  Reply Post(const std::string& path, const json& body) {
    std::string b = body.dump();
    int fd = ConnectTcp(api_->port());
    EXPECT_GE(fd, 0);
    std::string raw =
        Exchange(fd,
                 "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                     "Content-Length: " + std::to_string(b.size()) + "\r\nConnection: close\r\n\r\n" + b,
                 20000);
    ::close(fd);
    Reply r;
    if (raw.size() > 12) r.status = std::stoi(raw.substr(9, 3));
    size_t head = raw.find("\r\n\r\n");
    r.head = raw.substr(0, head);
    r.body = json::parse(head == std::string::npos ? "" : raw.substr(head + 4), nullptr, false);
    return r;
  }
  Reply Get(const std::string& path) {
    int fd = ConnectTcp(api_->port());
    std::string raw =
        Exchange(fd, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    ::close(fd);
    Reply r;
    if (raw.size() > 12) r.status = std::stoi(raw.substr(9, 3));
    size_t head = raw.find("\r\n\r\n");
    r.body = json::parse(head == std::string::npos ? "" : raw.substr(head + 4), nullptr, false);
    return r;
  }
  // A text's ids as the route gives them to the model.
  std::vector<int32_t> Ids(const std::string& text) {
    EmbeddingsRequest r;
    r.texts = {text};
    EmbeddingsError err;
    auto ids = TokenizeEmbeddingInputs(r, *spec_, &err);
    EXPECT_TRUE(ids.ok()) << err.message;
    return ids.ok() ? (*ids)[0] : std::vector<int32_t>{};
  }
  static std::vector<float> Vector(const json& item) { return item["embedding"].get<std::vector<float>>(); }

  std::shared_ptr<const EmbedSpec> spec_ = Spec();
  std::shared_ptr<Encoder> encoder_;
  std::shared_ptr<BatchingModel> batcher_;
  ModelRegistry registry_;
  Metrics metrics_;
  std::unique_ptr<HttpApi> api_;
  std::thread serving_;
};

// 70 texts of many lengths (chunks of the version's 16 rows, sorted by
// length): each answer row is its own text's, in the request's order,
// and usage counts every token the model read.
TEST_F(EmbeddingsRouteTest, AListComesBackInOrderEachRowItsOwnText) {
  std::vector<std::string> texts;
  for (int i = 0; i < 70; ++i) {
    std::string t = "text " + std::to_string(i);
    for (int w = 0; w < (i * 7) % 13; ++w) t += " word" + std::to_string(w);
    texts.push_back(t);
  }
  Reply r = Post("/v1/embeddings", {{"model", "enc"}, {"input", texts}});
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["object"], "list");
  EXPECT_EQ(r.body["model"], "enc");
  ASSERT_EQ(r.body["data"].size(), texts.size());
  int64_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& item = r.body["data"][i];
    EXPECT_EQ(item["index"], i);
    EXPECT_EQ(item["object"], "embedding");
    std::vector<int32_t> ids = Ids(texts[i]);
    tokens += static_cast<int64_t>(ids.size());
    EXPECT_EQ(Vector(item), Expected(ids)) << texts[i];
  }
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], tokens);
  EXPECT_EQ(r.body["usage"]["total_tokens"], tokens);
  EXPECT_EQ(encoder_->calls.Get(), 5);  // 70 rows: 4 chunks of 16, and 6
  EXPECT_EQ(encoder_->max_rows.load(), 16);
}

// Token id lists are the text's tokens without the special ones; a long
// text is cut to the model's 16 tokens, [CLS] and [SEP] kept.
TEST_F(EmbeddingsRouteTest, TokenIdsAndLongTextsAsTheModelTakesThem) {
  std::vector<int32_t> hello = Ids("hello world");
  std::vector<int32_t> inner(hello.begin() + 1, hello.end() - 1);
  Reply r = Post("/v1/embeddings", {{"model", "enc:1"}, {"input", {inner}}});
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(Vector(r.body["data"][0]), Expected(hello));
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "word ";
  Reply cut = Post("/v1/embeddings", {{"model", "enc"}, {"input", long_text}});
  ASSERT_EQ(cut.status, 200) << cut.body.dump();
  std::vector<float> v = Vector(cut.body["data"][0]);
  EXPECT_EQ(v[0], 16);   // tokens
  EXPECT_EQ(v[2], 101);  // [CLS] first
  EXPECT_EQ(v[3], 102);  // [SEP] last
  EXPECT_EQ(cut.body["usage"]["prompt_tokens"], 16);
}

// base64 holds the same floats, little-endian; `dimensions` keeps the
// first values of a model that can be cut.
TEST_F(EmbeddingsRouteTest, Base64AndFewerDimensions) {
  Reply r = Post("/v1/embeddings", {{"model", "enc"}, {"input", "hi there"}, {"encoding_format", "base64"}});
  ASSERT_EQ(r.status, 200) << r.body.dump();
  std::vector<float> want = Expected(Ids("hi there"));
  std::string bytes(reinterpret_cast<const char*>(want.data()), want.size() * sizeof(float));
  EXPECT_EQ(r.body["data"][0]["embedding"], Base64(bytes));
  Reply cut = Post("/v1/embeddings", {{"model", "enc"}, {"input", "hi there"}, {"dimensions", 2}});
  ASSERT_EQ(cut.status, 200) << cut.body.dump();
  EXPECT_EQ(Vector(cut.body["data"][0]), std::vector<float>(want.begin(), want.begin() + 2));
}

// Requests in flight at once share runs: while the encoder holds its
// first run, 8 clients' texts of different lengths queue, then run
// together, padded, each client answered with its own vectors.
TEST_F(EmbeddingsRouteTest, ConcurrentRequestsAreBatchedWithPadding) {
  std::promise<void> open;
  encoder_->SetGate(open.get_future().share());
  aotid::testing::Counter queued;
  batcher_->TEST_SetOnQueued([&](int n) { queued.Set(n); });
  std::thread first([&] {
    EXPECT_EQ(Post("/v1/embeddings", {{"model", "enc"}, {"input", "first"}}).status, 200);
  });
  ASSERT_TRUE(encoder_->calls.Await(1));
  constexpr int kClients = 8;
  std::vector<std::thread> clients;
  std::atomic<int> wrong{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::vector<std::string> mine;
      for (int k = 0; k <= c % 3; ++k) mine.push_back("client " + std::to_string(c) + std::string(c, '!'));
      Reply r = Post("/v1/embeddings", {{"model", "enc"}, {"input", mine}});
      bool right = r.status == 200 && r.body["data"].size() == mine.size();
      for (size_t k = 0; right && k < mine.size(); ++k)
        right = Vector(r.body["data"][k]) == Expected(Ids(mine[k]));
      if (!right) wrong++;
    });
  }
  ASSERT_TRUE(queued.Await(kClients));
  open.set_value();
  first.join();
  for (auto& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(encoder_->calls.Get(), 2);  // the first, then all 8 in one run
  EXPECT_EQ(encoder_->max_rows.load(), 1 + 2 + 3 + 1 + 2 + 3 + 1 + 2);
}

// Every error is in OpenAI's shape, naming the parameter at fault.
TEST_F(EmbeddingsRouteTest, ErrorsInOpenAisShapeNamingTheParameter) {
  Reply unknown = Post("/v1/embeddings", {{"model", "nope"}, {"input", "x"}});
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.body["error"]["code"], "model_not_found");
  EXPECT_EQ(unknown.body["error"]["param"], "model");
  Reply no_input = Post("/v1/embeddings", {{"model", "enc"}});
  EXPECT_EQ(no_input.status, 400);
  EXPECT_EQ(no_input.body["error"]["param"], "input");
  EXPECT_EQ(no_input.body["error"]["type"], "invalid_request_error");
  Reply bad_id = Post("/v1/embeddings", {{"model", "enc"}, {"input", {{5, 99999999}}}});
  EXPECT_EQ(bad_id.status, 400);
  EXPECT_EQ(bad_id.body["error"]["param"], "input");
  Reply unknown_param = Post("/v1/embeddings", {{"model", "enc"}, {"input", "x"}, {"dimension", 2}});
  EXPECT_EQ(unknown_param.status, 400);
  EXPECT_EQ(unknown_param.body["error"]["param"], "dimension");
  Reply too_wide = Post("/v1/embeddings", {{"model", "enc"}, {"input", "x"}, {"dimensions", 5}});
  EXPECT_EQ(too_wide.status, 400);
  EXPECT_EQ(too_wide.body["error"]["param"], "dimensions");
  // The model's refusals are counted as its infer requests are.
  EXPECT_NE(
      metrics_.Render().find("aotid_inference_requests_total{model=\"enc\",version=\"1\",code=\"400\"} 2"),
      std::string::npos)
      << metrics_.Render();

  // "enc:01" is no spelling of enc:1: refused, saying why, not served as it.
  Reply zero = Post("/v1/embeddings", {{"model", "enc:01"}, {"input", "x"}});
  EXPECT_EQ(zero.status, 404);
  EXPECT_EQ(zero.body["error"]["param"], "model");
  EXPECT_EQ(zero.body["error"]["code"], "model_not_found");
  EXPECT_EQ(zero.body["error"]["message"],
            "no model is served as 'enc:01': the version after ':' has a leading zero; write enc:1");

  // A tensor model, and one still building.
  ServedModel tensors{"mlp", 1, ServeState::kReady};
  tensors.model = encoder_;
  registry_.Put(tensors);
  Reply not_text = Post("/v1/embeddings", {{"model", "mlp"}, {"input", "x"}});
  EXPECT_EQ(not_text.status, 400);
  EXPECT_NE(not_text.body["error"]["message"].get<std::string>().find("does not embed text"),
            std::string::npos);
  registry_.Put(ServedModel{"later", 1, ServeState::kBuilding});
  Reply building = Post("/v1/embeddings", {{"model", "later"}, {"input", "x"}});
  EXPECT_EQ(building.status, 503);
  EXPECT_NE(building.head.find("Retry-After"), std::string::npos);

  // A run that fails fails the request, in the same shape.
  encoder_->fail = true;
  Reply broke = Post("/v1/embeddings", {{"model", "enc"}, {"input", {"a", "b"}}});
  EXPECT_EQ(broke.status, 500);
  EXPECT_NE(broke.body["error"]["message"].get<std::string>().find("the encoder broke"), std::string::npos);
  EXPECT_EQ(broke.body["error"]["type"], "server_error");
}

// /v1/models lists the embedding model beside the language models.
TEST_F(EmbeddingsRouteTest, TheModelsListHasTheEmbeddingModel) {
  Reply r = Get("/v1/models");
  ASSERT_EQ(r.status, 200);
  std::vector<std::string> ids;
  for (const auto& m : r.body["data"]) ids.push_back(m["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"enc", "enc:1"}));
  EXPECT_EQ(r.body["data"][0]["created"], 1700000000);
  EXPECT_EQ(Get("/v1/models/enc").status, 200);
  EXPECT_EQ(Get("/v1/models/enc:1").status, 200);
  Reply zero = Get("/v1/models/enc:01");
  EXPECT_EQ(zero.status, 404);
  EXPECT_EQ(zero.body["error"]["param"], "model");
}

}  // namespace
}  // namespace aotid::serving
