// End to end: continuous batching. A tiny Llama exported with a cache of
// 4 sequences (float32 and int8 weights), compiled and served by the real
// daemon; several clients at once over loopback. Each answer must be the
// one its request gets alone, and the float32 model's greedy answers the
// eager model's.
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

const char* const kModels[] = {"tiny_llm_slots", "tiny_llm_slots_int8"};

class SlotsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    store_ = dir_->path() + "/store";
    config_ = dir_->path() + "/aotid.toml";
    ASSERT_OK(fs::WriteFileAtomic(config_, "[server]\nthreads = 8\n[build]\njobs = 1\n"));
    for (const char* m : kModels) {
      std::string out;
      ASSERT_EQ(RunAotid({"--config", config_, "--store", store_, "add", TestData(std::string(m) + ".pt2"),
                          "--name", m},
                         &out),
                0)
          << out;
    }
    cases_ = new json(json::parse(fs::ReadFile(TestData("cases.json")).value())["tiny_llm"]);
    auto d = DaemonProcess::Start({"--config", config_, "--store", store_, "--listen", "127.0.0.1:0"},
                                  dir_->path() + "/daemon.log");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = d->release();
    for (const char* m : kModels) ASSERT_TRUE(WaitReady(daemon_->port(), m)) << daemon_->Log();
  }
  static void TearDownTestSuite() {
    delete daemon_;
    delete cases_;
    delete dir_;
  }
  void SetUp() override { ASSERT_NE(daemon_, nullptr); }
  static int port() { return daemon_->port(); }

  // Prompt i's token ids: the fixture's three, then others of them.
  static std::vector<int32_t> Prompt(size_t i) {
    const json& p = (*cases_)["prompts"];
    auto ids = p[i % p.size()]["ids"].get<std::vector<int32_t>>();
    for (size_t k = 0; k < i / p.size(); ++k) ids.insert(ids.begin(), ids.back());  // another prompt
    return ids;
  }

  // A whole answer's token ids (and its summary in *summary).
  static std::vector<int32_t> Generate(const std::string& model, const json& body, json* summary = nullptr) {
    Reply r = Post(port(), "/v2/models/" + model + "/generate", body.dump());
    EXPECT_EQ(r.status, 200) << r.body.dump();
    if (summary) *summary = r.body;
    return r.body.value("token_ids", std::vector<int32_t>{});
  }

  // A streamed answer's token ids, from its last event.
  static std::vector<int32_t> Stream(const std::string& model, const json& body) {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v2/models/" + model + "/generate_stream", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    size_t last = r->body.rfind("data: ", r->body.size() - 3);
    if (last == std::string::npos) return {};
    json j = json::parse(r->body.substr(last + 6), nullptr, false);
    return j.is_object() ? j.value("token_ids", std::vector<int32_t>{}) : std::vector<int32_t>{};
  }

  static json Body(const std::vector<int32_t>& ids, int max_tokens, json params = json::object()) {
    params["max_tokens"] = max_tokens;
    params["return_token_ids"] = true;
    if (!params.contains("temperature")) params["temperature"] = 0;
    return {{"input_ids", ids}, {"parameters", params}};
  }

  // A counter or gauge of /metrics for `model`.
  static double Metric(const std::string& name, const std::string& model) {
    httplib::Client c("127.0.0.1", port());
    auto r = c.Get("/metrics");
    if (!r) return -1;
    std::string key = name + "{model=\"" + model + "\",version=\"1\"} ";
    size_t at = r->body.find(key);
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + key.size()));
  }

  static TempDir* dir_;
  static std::string store_, config_;
  static DaemonProcess* daemon_;
  static json* cases_;
};
TempDir* SlotsTest::dir_ = nullptr;
std::string SlotsTest::store_, SlotsTest::config_;
DaemonProcess* SlotsTest::daemon_ = nullptr;
json* SlotsTest::cases_ = nullptr;

// Runs `n` requests at once, each on its own connection and thread.
template <class F>
std::vector<std::vector<int32_t>> AtOnce(size_t n, F answer) {
  std::vector<std::vector<int32_t>> got(n);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < n; ++i) clients.emplace_back([&, i] { got[i] = answer(i); });
  for (auto& c : clients) c.join();
  return got;
}

// Four greedy streams with different prompts at once, on each model: each
// equals its prompt served alone (and, in float32, the eager model's
// tokens), and the decode steps ran several sequences in one call.
TEST_F(SlotsTest, FourStreamsAtOnceEachEqualTheirAnswerAlone) {
  EXPECT_EQ(Get(port(), "/v2/models/tiny_llm_slots").body["generates"]["max_sequences"], 4);
  for (const char* model : kModels) {
    SCOPED_TRACE(model);
    std::vector<std::vector<int32_t>> alone;
    for (size_t i = 0; i < 4; ++i)
      alone.push_back(Generate(model, Body(Prompt(i), 40, {{"ignore_eos", true}})));
    const double steps = Metric("aotid_generate_decode_steps_total", model);
    const double tokens = Metric("aotid_generate_decode_tokens_total", model);
    auto together = AtOnce(4, [&](size_t i) {
      return Stream(model, Body(Prompt(i), 40, {{"ignore_eos", true}}));
    });
    EXPECT_EQ(together, alone);
    const double step_tokens = (Metric("aotid_generate_decode_tokens_total", model) - tokens) /
                               (Metric("aotid_generate_decode_steps_total", model) - steps);
    EXPECT_GT(step_tokens, 1.5) << "the sequences were not decoded together";
    if (std::string(model) == "tiny_llm_slots") {
      for (size_t i = 0; i < 3; ++i) {
        auto eager = (*cases_)["prompts"][i]["greedy"].get<std::vector<int32_t>>();
        std::vector<int32_t> head(alone[i].begin(),
                                  alone[i].begin() + static_cast<std::ptrdiff_t>(eager.size()));
        EXPECT_EQ(head, eager) << "prompt " << i;
      }
    }
  }
}

// Sampled streams with seeds: the same draws at once as alone.
TEST_F(SlotsTest, SeededSamplesAtOnceEqualThemAlone) {
  for (const char* model : kModels) {
    SCOPED_TRACE(model);
    auto body = [](size_t i) {
      return Body(Prompt(i), 30,
                  {{"temperature", 0.9}, {"top_k", 0}, {"seed", 11 + i}, {"ignore_eos", true}});
    };
    std::vector<std::vector<int32_t>> alone;
    for (size_t i = 0; i < 4; ++i) alone.push_back(Generate(model, body(i)));
    EXPECT_NE(alone[0], Generate(model, Body(Prompt(0), 30, {{"ignore_eos", true}})));  // not greedy
    EXPECT_EQ(AtOnce(4, [&](size_t i) { return Stream(model, body(i)); }), alone);
  }
}

// Six requests for four slots: the two beyond wait for a slot (holding no
// HTTP worker) and then get their answers; and while they all run, the
// daemon answers other requests.
TEST_F(SlotsTest, RequestsBeyondTheSlotsWaitAndComplete) {
  const char* model = "tiny_llm_slots";
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < 6; ++i)
    alone.push_back(Generate(model, Body(Prompt(i), 50, {{"ignore_eos", true}})));
  std::atomic<bool> healthy{true};
  auto got = AtOnce(7, [&](size_t i) -> std::vector<int32_t> {
    if (i == 6) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      healthy = Get(port(), "/v2/health/ready").status == 200;
      return {};
    }
    return i % 2 ? Stream(model, Body(Prompt(i), 50, {{"ignore_eos", true}}))
                 : Generate(model, Body(Prompt(i), 50, {{"ignore_eos", true}}));
  });
  got.pop_back();
  EXPECT_EQ(got, alone);
  EXPECT_TRUE(healthy);
}

// A client that hangs up mid-stream frees its slot: a waiting request
// takes it, and the other streams go on with their own answers.
TEST_F(SlotsTest, AClientThatHangsUpFreesItsSlotForTheNext) {
  const char* model = "tiny_llm_slots";
  std::vector<std::vector<int32_t>> alone;
  // The one that waits is short: with the slot of the one that hangs up
  // it ends before the others; waiting for one of theirs, after them.
  auto tokens = [](size_t i) { return i == 4 ? 8 : 80; };
  for (size_t i = 0; i < 5; ++i) {
    alone.push_back(Generate(model, Body(Prompt(i), tokens(i), {{"ignore_eos", true}})));
  }
  EXPECT_EQ(Metric("aotid_generate_sequences_active", model), 0);
  std::atomic<int> ended{0};
  std::vector<int> order(5, -1);
  auto got = AtOnce(5, [&](size_t i) -> std::vector<int32_t> {
    if (i != 0) {
      if (i == 4) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the one that waits
      auto ids = Stream(model, Body(Prompt(i), tokens(i), {{"ignore_eos", true}}));
      order[i] = ended++;
      return ids;
    }
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    std::string body = Body(Prompt(0), 90, {{"ignore_eos", true}}).dump();
    std::string req = "POST /v2/models/" + std::string(model) +
                      "/generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body;
    EXPECT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string seen;
    char buf[4096];
    while (seen.find("data: ") == std::string::npos) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      seen.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return {};
  });
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(got[i], alone[i]) << "stream " << i;
  EXPECT_EQ(order[4], 0) << "the waiting request did not get the slot its client left";
  EXPECT_TRUE(WaitFor([&] { return Metric("aotid_generate_sequences_active", model) == 0; }, 30))
      << daemon_->Log();
}

// A long prompt that arrives while another sequence streams goes in
// between its steps and changes neither answer.
TEST_F(SlotsTest, ALongPromptArrivingMidStreamChangesNoAnswer) {
  const char* model = "tiny_llm_slots_int8";
  std::vector<int32_t> longer;
  for (int k = 0; k < 5; ++k) {
    for (int32_t t : Prompt(static_cast<size_t>(k))) longer.push_back(t);
  }
  longer.resize(std::min<size_t>(longer.size(), 80));
  auto short_alone = Generate(model, Body(Prompt(1), 60, {{"ignore_eos", true}}));
  auto long_alone = Generate(model, Body(longer, 8, {{"ignore_eos", true}}));
  auto got = AtOnce(2, [&](size_t i) {
    if (i == 0) return Stream(model, Body(Prompt(1), 60, {{"ignore_eos", true}}));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return Stream(model, Body(longer, 8, {{"ignore_eos", true}}));
  });
  EXPECT_EQ(got[0], short_alone);
  EXPECT_EQ(got[1], long_alone);
}

// The conversation so far is in a slot: the next turn reuses it, says how
// many prompt tokens it reused (/generate's usage, /v1's
// prompt_tokens_details), and answers what a cold prompt answers.
TEST_F(SlotsTest, AConversationsNextTurnReusesItsPrefix) {
  const char* model = "tiny_llm_slots";
  json first = {{"messages",
                 {{{"role", "system"}, {"content", "You answer briefly about foxes and dogs."}},
                  {{"role", "user"}, {"content", "Hello"}}}},
                {"parameters", {{"temperature", 0}, {"max_tokens", 8}, {"return_token_ids", true}}}};
  json one;
  Generate(model, first, &one);
  json next = first;
  next["messages"].push_back({{"role", "assistant"}, {"content", one["text_output"]}});
  next["messages"].push_back({{"role", "user"}, {"content", "And then?"}});
  json warm, cold;
  auto warm_ids = Generate(model, next, &warm);
  json cold_body = next;
  cold_body["parameters"]["cache_prompt"] = false;
  auto cold_ids = Generate(model, cold_body, &cold);
  EXPECT_EQ(warm_ids, cold_ids);
  EXPECT_EQ(cold["usage"]["cached_tokens"], 0);
  const int64_t reused = warm["usage"]["cached_tokens"].get<int64_t>();
  EXPECT_GT(reused, 20) << warm.dump();  // the system prompt and the first turn at least
  EXPECT_LT(reused, warm["usage"]["prompt_tokens"].get<int64_t>());
  // /v1 says it too.
  json chat = {{"model", model}, {"messages", next["messages"]}, {"max_tokens", 8}, {"temperature", 0}};
  Reply v1 = Post(port(), "/v1/chat/completions", chat.dump());
  ASSERT_EQ(v1.status, 200) << v1.body.dump();
  EXPECT_EQ(v1.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
            warm["usage"]["prompt_tokens"].get<int64_t>() - 4);
}

// /infer on a model of several sequences is one more user of it: it runs
// in turn with the sequences, and they still get their answers after it.
TEST_F(SlotsTest, InferRunsInTurnWithTheSequences) {
  const char* model = "tiny_llm_slots";
  auto alone = Generate(model, Body(Prompt(2), 30, {{"ignore_eos", true}}));
  std::atomic<int> infer_status{0};
  auto got = AtOnce(2, [&](size_t i) -> std::vector<int32_t> {
    if (i == 0) return Stream(model, Body(Prompt(2), 30, {{"ignore_eos", true}}));
    json infer = {{"inputs",
                   {{{"name", "tokens"}, {"datatype", "INT64"}, {"shape", {1, 2}}, {"data", {1, 2}}},
                    {{"name", "input_pos"}, {"datatype", "INT64"}, {"shape", {1, 2}}, {"data", {0, 1}}},
                    {{"name", "slots"}, {"datatype", "INT64"}, {"shape", {1}}, {"data", {3}}}}}};
    infer_status = Post(port(), "/v2/models/" + std::string(model) + "/infer", infer.dump()).status;
    return {};
  });
  EXPECT_EQ(infer_status, 200);
  EXPECT_EQ(got[0], alone);
  EXPECT_EQ(Generate(model, Body(Prompt(2), 30, {{"ignore_eos", true}})), alone);
}

}  // namespace
}  // namespace aotid::testing
