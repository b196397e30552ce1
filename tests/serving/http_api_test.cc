// The API over real loopback sockets, in process, with an empty registry:
// what any client can send before a model is involved.
#include "serving/http_api.h"

#include <nlohmann/json.hpp>
#include <thread>

#include "raw_http.h"
#include "test_util.h"

namespace aotid::serving {
namespace {

using aotid::testing::ConnectTcp;
using aotid::testing::Exchange;

class HttpApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpOptions o;
    o.port = 0;
    o.threads = 2;
    api_ = std::make_unique<HttpApi>(&registry_, &metrics_, o);
    ASSERT_OK(api_->Bind());
    serving_ = std::thread([this] { api_->Serve(); });
  }
  void TearDown() override {
    api_->Stop();
    serving_.join();
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

std::string PostIndex(const std::string& body) {
  return "POST /v2/repository/index HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
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

TEST(ErrorBody, InvalidUtf8BecomesReplacementCharacters) {
  auto body = nlohmann::json::parse(ErrorBody("bad \xff\xfe byte"), nullptr, false);
  ASSERT_TRUE(body.is_object());
  EXPECT_EQ(body["error"], "bad \xEF\xBF\xBD\xEF\xBF\xBD byte");
}

}  // namespace
}  // namespace aotid::serving
