// The HTTP/1.1 request parser, body framing and router, without sockets.
// The same server over real connections is tested end to end in
// e2e/security_test.cc.
#include "http/server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/counter.h"
#include "base/fake_clock.h"
#include "base/mutex.h"
#include "raw_http.h"
#include "test_util.h"

namespace aotid::http {
namespace {

std::string ErrorBody(std::string_view m) { return "{\"error\":\"" + std::string(m) + "\"}"; }

HeadResult Parse(const std::string& text, Request* req, Limits limits = {}) {
  return ParseHead(text, limits, req);
}

TEST(HttpParse, ReadsTheRequestLineHeadersAndWhereTheHeadEnds) {
  std::string head =
      "POST /v2/models/m%2Dx/infer?trace=1 HTTP/1.1\r\nHost: 127.0.0.1:8765\r\n"
      "content-length:  12 \r\nX-Empty:\r\n\r\n";
  std::string text = head + "{\"inputs\":1}GET / HTTP/1.1\r\n";  // a body, then a pipelined request
  Request req;
  HeadResult r = Parse(text, &req);
  ASSERT_EQ(r.state, HeadResult::kDone) << r.error;
  EXPECT_EQ(r.consumed, head.size());
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.target, "/v2/models/m%2Dx/infer?trace=1");
  EXPECT_EQ(req.path, "/v2/models/m%2Dx/infer");
  EXPECT_EQ(req.query, "trace=1");
  EXPECT_EQ(req.minor_version, 1);
  EXPECT_EQ(req.Get("Content-Length"), "12");  // any case, value trimmed
  EXPECT_EQ(req.Get("HOST"), "127.0.0.1:8765");
  EXPECT_TRUE(req.Has("x-empty"));
  EXPECT_EQ(req.Get("x-empty"), "");
  EXPECT_FALSE(req.Has("Content-Type"));
  BodyFraming f = FramingOf(req);
  EXPECT_EQ(f.kind, BodyFraming::kLength);
  EXPECT_EQ(f.length, 12u);
}

TEST(HttpParse, EveryPrefixOfAHeadIsIncompleteAndBareLineFeedsAreAccepted) {
  std::string head = "GET /v2/health/live HTTP/1.0\nUser-Agent: t\n\n";
  for (size_t n = 0; n < head.size(); ++n) {
    Request req;
    EXPECT_EQ(Parse(head.substr(0, n), &req).state, HeadResult::kIncomplete) << n;
  }
  Request req;
  HeadResult r = Parse(head, &req);
  ASSERT_EQ(r.state, HeadResult::kDone) << r.error;  // HTTP/1.0 needs no Host
  EXPECT_EQ(r.consumed, head.size());
  EXPECT_EQ(req.minor_version, 0);
  EXPECT_EQ(FramingOf(req).kind, BodyFraming::kNone);
}

TEST(HttpParse, MalformedAndOversizedHeadsAreRefusedWithTheirStatus) {
  struct Case {
    std::string text;
    int status;
    std::string needle;
  } cases[] = {
      {"GET / HTTP/1.1\r\n\r\n", 400, "without a Host"},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "more than one Host"},
      {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505, "not supported"},
      {"GET / HTTQ/1.1\r\nHost: a\r\n\r\n", 400, "bad HTTP version"},
      {"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400, "malformed request line"},
      {"G@T / HTTP/1.1\r\nHost: a\r\n\r\n", 400, "bad method"},
      {"GET http://evil/ HTTP/1.1\r\nHost: a\r\n\r\n", 400, "must be a path"},
      {"GET /a\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 400, "control character"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n  folded\r\n\r\n", 400, "folded"},
      {"GET / HTTP/1.1\r\nHost: a\r\nBad Name: 1\r\n\r\n", 400, "malformed header line"},
      {"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400, "malformed header line"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x7f\r\n\r\n", 400, "control character"},
      {"GET /" + std::string(300, 'a') + " HTTP/1.1\r\nHost: a\r\n\r\n", 414,
       "request line is longer than 256"},
      {"GET /" + std::string(300, 'a'), 414, "request line is longer than 256"},  // refused before its end
      {"GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(300, 'a') + "\r\n\r\n", 431, "larger than 256"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(300, 'a'), 431, "larger than 256"},
  };
  Limits small;
  small.max_header_bytes = 256;
  for (const auto& c : cases) {
    Request req;
    HeadResult r = Parse(c.text, &req, small);
    ASSERT_EQ(r.state, HeadResult::kError) << c.text.substr(0, 60);
    EXPECT_EQ(r.status, c.status) << c.text.substr(0, 60) << ": " << r.error;
    EXPECT_NE(r.error.find(c.needle), std::string::npos) << r.error;
  }
  std::string many = "GET / HTTP/1.1\r\nHost: a\r\n";
  for (int i = 0; i < 5; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  Limits few;
  few.max_headers = 5;
  Request req;
  HeadResult r = Parse(many + "\r\n", &req, few);
  EXPECT_EQ(r.state, HeadResult::kError);
  EXPECT_EQ(r.status, 431);
  EXPECT_NE(r.error.find("more than 5 request headers"), std::string::npos) << r.error;
}

TEST(HttpParse, BodyFramingRefusesSmugglingShapesAndOtherCodings) {
  struct Case {
    std::vector<Header> headers;
    BodyFraming::Kind kind;
    int status;
  } cases[] = {
      {{{"Content-Length", "0"}}, BodyFraming::kNone, 0},
      {{{"Content-Length", "5"}, {"content-length", "5"}}, BodyFraming::kLength, 0},
      {{{"Transfer-Encoding", " Chunked"}}, BodyFraming::kChunked, 0},
      {{{"Content-Length", "5"}, {"Content-Length", "6"}}, BodyFraming::kError, 400},
      {{{"Content-Length", "5"}, {"Transfer-Encoding", "chunked"}}, BodyFraming::kError, 400},
      {{{"Transfer-Encoding", "gzip, chunked"}}, BodyFraming::kError, 501},
      {{{"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}}, BodyFraming::kError, 501},
      {{{"Content-Length", "-1"}}, BodyFraming::kError, 400},
      {{{"Content-Length", "+5"}}, BodyFraming::kError, 400},
      {{{"Content-Length", "5x"}}, BodyFraming::kError, 400},
      {{{"Content-Length", ""}}, BodyFraming::kError, 400},
      {{{"Content-Length", "99999999999999999999"}}, BodyFraming::kError, 400},
  };
  for (const auto& c : cases) {
    Request req;
    req.headers = c.headers;
    BodyFraming f = FramingOf(req);
    EXPECT_EQ(f.kind, c.kind) << c.headers[0].value << " " << f.error;
    EXPECT_EQ(f.status, c.status) << f.error;
    if (f.kind == BodyFraming::kError) EXPECT_FALSE(f.error.empty());
  }
}

TEST(HttpChunked, DecodesWholeAndResumesAcrossAnySplit) {
  std::string wire =
      "4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\nNEXT";
  std::string want = "Wikipedia in\r\n\r\nchunks.";
  std::string body;
  ChunkedResult r = DecodeChunked(wire, 1 << 20, &body);
  ASSERT_EQ(r.state, ChunkedResult::kDone) << r.error;
  EXPECT_EQ(body, want);
  EXPECT_EQ(wire.substr(r.consumed), "NEXT");
  // Bytes arriving one at a time, as the server feeds them.
  body.clear();
  std::string pending;
  size_t fed = 0;
  bool done = false;
  while (!done && fed < wire.size()) {
    pending += wire[fed++];
    ChunkedResult step = DecodeChunked(pending, 1 << 20, &body);
    ASSERT_NE(step.state, ChunkedResult::kError) << step.error;
    pending.erase(0, step.consumed);
    done = step.state == ChunkedResult::kDone;
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(body, want);
  EXPECT_EQ(wire.substr(fed), "NEXT");
}

TEST(HttpChunked, BadSizesAndBodiesOverTheLimitAreRefused) {
  struct Case {
    std::string wire;
    int status;
    std::string needle;
  } cases[] = {
      {"zz\r\nab\r\n0\r\n\r\n", 400, "bad chunk size"},
      {"\r\n", 400, "bad chunk size"},
      {"-1\r\n", 400, "bad chunk size"},
      {"2\r\nabc\r\n0\r\n\r\n", 400, "not followed by CRLF"},
      {"fffffffffffffff\r\n", 413, "exceeds the limit of 100 bytes"},
      {"40\r\n" + std::string(64, 'a') + "\r\n40\r\n", 413, "exceeds the limit of 100 bytes"},
      {std::string(5000, '1'), 400, "line too long"},
  };
  for (const auto& c : cases) {
    std::string body;
    ChunkedResult r = DecodeChunked(c.wire, 100, &body);
    ASSERT_EQ(r.state, ChunkedResult::kError) << c.wire.substr(0, 30);
    EXPECT_EQ(r.status, c.status) << r.error;
    EXPECT_NE(r.error.find(c.needle), std::string::npos) << r.error;
  }
}

TEST(HttpPath, PercentDecodingIsStrict) {
  std::string out;
  EXPECT_TRUE(PercentDecode("a%20b%2fc", &out));
  EXPECT_EQ(out, "a b/c");
  for (const char* bad : {"%", "%2", "a%zz", "%g0", "%+1"}) EXPECT_FALSE(PercentDecode(bad, &out)) << bad;
}

TEST(HttpRouter, MatchesSegmentsAndSays404Or405WithAllow) {
  Router router(ErrorBody);
  std::string seen;
  router.Add("GET", "/v2/models/*", [&](const Request& r, Response& res) {
    seen = "meta " + r.params.at(0);
    res.Set("m", "text/plain");
  });
  router.Add("POST", "/v2/models/*/versions/*/infer", [&](const Request& r, Response& res) {
    seen = "infer " + r.params.at(0) + " " + r.params.at(1);
    res.Set("i", "text/plain");
  });
  router.Add("POST", "/v2/models/*", [&](const Request&, Response& res) { res.status = 202; });

  auto call = [&](std::string method, std::string path) {
    Request req;
    req.method = std::move(method);
    req.path = std::move(path);
    Response res;
    seen.clear();
    router.Dispatch(req, res);
    return res;
  };
  Response r = call("GET", "/v2/models/a%2Db");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(seen, "meta a-b");
  r = call("HEAD", "/v2/models/x");
  EXPECT_EQ(seen, "meta x");
  r = call("POST", "/v2/models/m/versions/3/infer");
  EXPECT_EQ(seen, "infer m 3");
  EXPECT_EQ(call("POST", "/v2/models/m").status, 202);

  r = call("DELETE", "/v2/models/m");
  EXPECT_EQ(r.status, 405);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].name, "Allow");
  EXPECT_EQ(r.headers[0].value, "GET, POST, HEAD");
  EXPECT_NE(r.body.find("method DELETE is not allowed on /v2/models/m"), std::string::npos) << r.body;
  r = call("GET", "/v2/models/m/versions/3/infer");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers.at(0).value, "POST");

  for (const char* path : {"/v2/models", "/v2/models/m/", "/v2/models/m/versions/3", "/", ""}) {
    r = call("GET", path);
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_NE(r.body.find("no route for GET"), std::string::npos) << r.body;
  }
  r = call("GET", "/v2/models/a%zz");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("malformed percent-escape"), std::string::npos) << r.body;
  EXPECT_TRUE(seen.empty());
}

// Clients that trickle their requests (slowloris) hold no worker: 8x as
// many as there are workers, some in their heads and some in their bodies,
// and a fresh client that comes after them is answered while they trickle,
// not after their 30 s.
// What the server tests answer with: {} to every request, errors as text.
void AnswerEmpty(Request&, Response& res) { res.Set("{}", "application/json"); }
std::string PlainError(std::string_view message) { return std::string(message); }

TEST(HttpServer, TricklingClientsDoNotHoldTheWorkers) {
  ServerOptions o;
  o.port = 0;  // a free port: tests run side by side
  o.threads = 2;
  o.request_timeout_s = 30;
  Server server(o, AnswerEmpty, PlainError);
  ASSERT_OK(server.Bind());
  std::thread serving([&] { server.Serve(); });
  // Heads, bodies of a stated length and chunked bodies, each trickled, and
  // clients that expect a 100 and then send nothing.
  std::vector<int> slow;
  std::vector<std::string> drip;
  for (int i = 0; i < 8 * o.threads; ++i) {
    int fd = aotid::testing::ConnectTcp(server.port());
    ASSERT_GE(fd, 0);
    const char* starts[] = {
        "GET /slow HTTP/1.1\r\nHost: a\r\n", "POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n",
        "POST /slow HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST /slow HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"};
    std::string start = starts[i % 4];
    ASSERT_GT(::send(fd, start.data(), start.size(), MSG_NOSIGNAL), 0);
    slow.push_back(fd);
    drip.push_back(i % 4 == 2 ? "1\r\nx\r\n" : i % 4 == 3 ? "" : "x");
  }
  // The fresh client asks behind them (the workers meet the slow clients
  // first: the queue is first come, first served). The slow ones send a
  // drip each time the fresh one has waited 20 ms more for its answer, for
  // 5 s at most.
  int fd = aotid::testing::ConnectTcp(server.port());
  ASSERT_GE(fd, 0);
  const std::string fresh = "GET /fresh HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
  ASSERT_GT(::send(fd, fresh.data(), fresh.size(), MSG_NOSIGNAL), 0);
  std::string reply;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (reply.find("\r\n\r\n{}") == std::string::npos && std::chrono::steady_clock::now() < until) {
    for (size_t k = 0; k < slow.size(); ++k)
      (void)::send(slow[k], drip[k].data(), drip[k].size(), MSG_NOSIGNAL);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  // Before, the workers stayed with the trickling clients until their 30 s
  // request timeout (chunked ones until this test's change), and the fresh
  // client got nothing.
  EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 200") << reply;
  for (int f : slow) ::close(f);
  server.Stop();
  serving.join();
}

// 200 clients trickling chunked bodies are all cut at their deadline at
// the same moment (the test moves the server's clock past it). Their 408s
// come from the poller: a fresh client is answered at once, at the cut-off
// as before it. (Each was once handed to a worker that drained it for up to
// a second: /v2/health/live then waited 25-36 s behind them.)
TEST(HttpServer, TricklersCutAtTheirDeadlineHoldNoWorker) {
  ServerOptions o;
  o.port = 0;
  o.threads = 2;
  o.request_timeout_s = 1;
  aotid::testing::FakeClock clock;
  Server server(o, AnswerEmpty, PlainError, &clock);
  ASSERT_OK(server.Bind());
  std::thread serving([&] { server.Serve(); });
  std::vector<int> slow;
  const std::string head = "POST /slow HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n";
  for (int i = 0; i < 200; ++i) {
    int fd = aotid::testing::ConnectTcp(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_GT(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), 0);
    slow.push_back(fd);
  }
  // A fresh client's whole exchange, within 5 s (the cut clients once held
  // the workers for 100 s).
  auto fresh = [&] {
    int fd = aotid::testing::ConnectTcp(server.port());
    std::string reply =
        aotid::testing::Exchange(fd, "GET /fresh HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 5000);
    ::close(fd);
    return reply;
  };
  // Before the cut-off: answered behind the 200 (first come, first served),
  // so every one of them has been read and has its deadline.
  std::string before = fresh();
  EXPECT_EQ(before.substr(0, 12), "HTTP/1.1 200") << before;
  clock.Advance(1000);  // the deadline of all 200
  for (int i = 0; i < 3; ++i) {
    std::string at = fresh();
    EXPECT_EQ(at.substr(0, 12), "HTTP/1.1 200") << i << ": " << at;
  }
  // Each trickler got its 408, not a reset.
  int refused = 0;
  for (int fd : slow) {
    std::string r = aotid::testing::Exchange(fd, "", 5000);
    if (r.starts_with("HTTP/1.1 408")) ++refused;
    ::close(fd);
  }
  EXPECT_EQ(refused, 200);
  server.Stop();
  serving.join();
}

// A burst of connections that send nothing waits with the poller: a fresh
// client behind 400 of them is answered at once. (Each was once handed to
// a worker that waited its 5 ms slice for bytes: 2 workers took about a
// second to reach the fresh client.)
TEST(HttpServer, ABurstOfSilentConnectionsHoldsNoWorker) {
  ServerOptions o;
  o.port = 0;
  o.threads = 2;
  Server server(o, AnswerEmpty, PlainError);
  std::atomic<int> taken{0};
  server.TEST_SetOnWorkerTakes([&] { taken.fetch_add(1); });
  ASSERT_OK(server.Bind());
  std::thread serving([&] { server.Serve(); });
  std::vector<int> silent;
  for (int i = 0; i < 400; ++i) {
    int fd = aotid::testing::ConnectTcp(server.port());
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  int fd = aotid::testing::ConnectTcp(server.port());
  std::string reply =
      aotid::testing::Exchange(fd, "GET /fresh HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 10000);
  ::close(fd);
  EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 200") << reply;
  // The listen queue is first in, first out: every silent connection was
  // accepted before the fresh one, and none of them went to a worker.
  EXPECT_EQ(taken.load(), 1);
  // The silent ones are still served once they speak.
  std::string late = aotid::testing::Exchange(silent[0], "GET /late HTTP/1.1\r\nHost: a\r\n\r\n", 5000);
  EXPECT_EQ(late.substr(0, 12), "HTTP/1.1 200") << late;
  EXPECT_EQ(taken.load(), 2);
  for (int f : silent) ::close(f);
  server.Stop();
  serving.join();
}

// A client that asks for a large answer and does not read it holds no
// worker: with one worker, another client is answered meanwhile (before,
// the worker sat in send() for as long as the client took). The slow client
// still gets the whole answer once it reads, and its connection serves on;
// one that reads nothing for write_timeout_s is closed (before, it was
// waited for as long as it read a little in each write_timeout_s).
TEST(HttpServer, ClientsThatDoNotReadTheirAnswersHoldNoWorker) {
  // Far past what the sockets buffer: the slow clients' receive buffers are
  // kept small (the kernel would grow them to 32 MB on loopback).
  const std::string big(32 << 20, 'x');
  constexpr int kSmallBuffer = 64 << 10;
  auto handler = [&](Request& req, Response& res) {
    if (req.path == "/big") {
      res.Set(big, "text/plain");
    } else {
      res.Set("{\"path\":\"" + req.path + "\"}", "application/json");
    }
  };
  // Reads one whole answer (head and Content-Length body) from fd, waiting
  // up to timeout_ms between bytes; what came, if the answer did not.
  auto read_answer = [](int fd, int timeout_ms) {
    std::string got;
    std::vector<char> buf(1 << 20);
    for (;;) {
      size_t head = got.find("\r\n\r\n");
      if (head != std::string::npos) {
        size_t cl = got.find("Content-Length: ");
        if (cl != std::string::npos && got.size() >= head + 4 + std::stoul(got.substr(cl + 16))) break;
      }
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) break;
      ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      got.append(buf.data(), static_cast<size_t>(n));
    }
    return got;
  };
  // A client with a small receive buffer that asks for /big (-1 if it could not).
  auto ask_big = [&](int port) {
    int fd = aotid::testing::ConnectTcp(port, nullptr, kSmallBuffer);
    std::string ask = "GET /big HTTP/1.1\r\nHost: a\r\n\r\n";
    if (fd >= 0 && ::send(fd, ask.data(), ask.size(), MSG_NOSIGNAL) <= 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  // Another client's whole exchange for /fresh.
  auto fresh = [](int port, int timeout_ms) {
    int fd = aotid::testing::ConnectTcp(port);
    std::string reply = aotid::testing::Exchange(
        fd, "GET /fresh HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", timeout_ms);
    ::close(fd);
    return reply;
  };
  {
    ServerOptions o;
    o.port = 0;
    o.threads = 1;
    o.write_timeout_s = 30;
    Server server(o, handler, PlainError);
    aotid::testing::Counter idle;  // times the worker found nothing to do
    server.TEST_SetBeforeWorkerWaits([&] { idle.Add(); });
    ASSERT_OK(server.Bind());
    std::thread serving([&] { server.Serve(); });
    ASSERT_TRUE(idle.AwaitAtLeast(1));
    int slow = ask_big(server.port());
    ASSERT_GE(slow, 0);
    // The worker filled the socket, left the rest to the poller, and is free.
    ASSERT_TRUE(idle.AwaitAtLeast(2));
    std::string reply = fresh(server.port(), 10000);
    EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 200") << reply.substr(0, 200);
    EXPECT_NE(reply.find("{\"path\":\"/fresh\"}"), std::string::npos) << reply.substr(0, 200);
    // Bounds, not speeds: generous for sanitizer builds on a busy machine.
    std::string answer = read_answer(slow, 30000);
    size_t head = answer.find("\r\n\r\n");
    ASSERT_NE(head, std::string::npos) << answer.substr(0, 200);
    EXPECT_EQ(answer.substr(0, 12), "HTTP/1.1 200");
    EXPECT_TRUE(answer.compare(head + 4, std::string::npos, big) == 0)
        << "the body came " << answer.size() - head - 4 << " bytes long, or changed";
    reply = aotid::testing::Exchange(slow, "GET /after HTTP/1.1\r\nHost: a\r\n\r\n", 30000);
    EXPECT_NE(reply.find("{\"path\":\"/after\"}"), std::string::npos) << reply.substr(0, 200);
    ::close(slow);
    server.Stop();
    serving.join();
  }
  {
    ServerOptions o;
    o.port = 0;
    o.threads = 1;
    o.write_timeout_s = 1;
    Server server(o, handler, PlainError);
    ASSERT_OK(server.Bind());
    std::thread serving([&] { server.Serve(); });
    int never = ask_big(server.port());
    ASSERT_GE(never, 0);
    // Real time, not a test's clock: the timeout runs from the last byte
    // the socket took, and the kernel takes a few more after the worker
    // leaves the answer to the poller (its send buffer grows), so a moved
    // clock could not say when the client's silence began.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past write_timeout_s, unread
    std::string got = read_answer(never, 2000);
    EXPECT_LT(got.size(), big.size()) << "a client that did not read within write_timeout_s got it all";
    ::close(never);
    std::string reply = fresh(server.port(), 5000);
    EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 200") << reply.substr(0, 200);
    server.Stop();
    serving.join();
  }
}

// An HTTP/1.0 client that asks to keep its connection gets
// "Connection: keep-alive" (without it, it would close after each answer
// or wait for the server to) and the connection serves its next request;
// one that does not ask is answered and closed.
TEST(HttpServer, Http10KeepAliveIsSaidInTheAnswer) {
  ServerOptions o;
  o.port = 0;
  o.threads = 1;
  Server server(o, AnswerEmpty, PlainError);
  ASSERT_OK(server.Bind());
  std::thread serving([&] { server.Serve(); });
  int fd = aotid::testing::ConnectTcp(server.port());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 2; ++i) {
    std::string reply = aotid::testing::Exchange(fd, "GET /a HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    EXPECT_EQ(reply.substr(0, 12), "HTTP/1.1 200") << i << ": " << reply;
    EXPECT_NE(reply.find("\r\nConnection: keep-alive\r\n"), std::string::npos) << reply;
    EXPECT_NE(reply.find("\r\n\r\n{}"), std::string::npos) << reply;
  }
  ::close(fd);
  fd = aotid::testing::ConnectTcp(server.port());
  std::string reply = aotid::testing::Exchange(fd, "GET /a HTTP/1.0\r\n\r\n");
  EXPECT_NE(reply.find("\r\nConnection: close\r\n"), std::string::npos) << reply;
  EXPECT_EQ(reply.find("keep-alive"), std::string::npos) << reply;
  ::close(fd);
  server.Stop();
  serving.join();
}

// One client address holds at most max_connections_per_address open
// connections: the next gets 503 naming its address and the setting, at
// once; another address is served meanwhile, and a closed connection frees
// its place.
TEST(HttpServer, OneAddressCannotHoldMoreThanItsConnections) {
  ServerOptions o;
  o.port = 0;  // a free port: tests run side by side
  o.threads = 2;
  o.max_connections_per_address = 4;
  Server server(o, AnswerEmpty, PlainError);
  ASSERT_OK(server.Bind());
  std::thread serving([&] { server.Serve(); });
  const std::string get = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
  std::vector<int> held;
  for (int i = 0; i < o.max_connections_per_address; ++i) {
    int fd = aotid::testing::ConnectTcp(server.port(), "127.0.0.2");
    ASSERT_GE(fd, 0);
    // Each is served (so each is counted before the next is accepted).
    EXPECT_EQ(aotid::testing::Exchange(fd, get).substr(0, 12), "HTTP/1.1 200");
    held.push_back(fd);
  }
  int over = aotid::testing::ConnectTcp(server.port(), "127.0.0.2");
  ASSERT_GE(over, 0);
  std::string refused = aotid::testing::Exchange(over, get);
  ::close(over);
  EXPECT_EQ(refused.substr(0, 12), "HTTP/1.1 503") << refused;
  EXPECT_NE(refused.find("too many connections from 127.0.0.2 (server.max_connections_per_address is 4)"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("Connection: close"), std::string::npos) << refused;

  int other = aotid::testing::ConnectTcp(server.port(), "127.0.0.3");
  ASSERT_GE(other, 0);
  EXPECT_EQ(aotid::testing::Exchange(other, get).substr(0, 12), "HTTP/1.1 200");
  ::close(other);

  ::close(held.back());
  held.pop_back();
  // The server sees the close when it next reads that connection; within
  // a bounded number of tries a new connection takes the freed place.
  // (Each try is a round trip, answered at once: 10 s of them at most.)
  std::string again;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       std::chrono::steady_clock::now() < until;) {
    int fd = aotid::testing::ConnectTcp(server.port(), "127.0.0.2");
    ASSERT_GE(fd, 0);
    again = aotid::testing::Exchange(fd, get);
    ::close(fd);
    if (again.substr(0, 12) == "HTTP/1.1 200") break;
  }
  EXPECT_EQ(again.substr(0, 12), "HTTP/1.1 200") << again;
  for (int fd : held) ::close(fd);
  server.Stop();
  serving.join();
}

// Stop() while a request runs: requests the client had already sent on the
// same connection (pipelined) are answered too, and the last reply closes.
TEST(HttpServer, StopAnswersPipelinedRequestsThatArrived) {
  ServerOptions o;
  o.port = 0;  // a free port: tests run side by side
  o.threads = 1;
  aotid::testing::Counter running, released;
  Server server(
      o,
      [&](Request& req, Response& res) {
        if (req.path == "/slow") {
          running.Add();
          EXPECT_TRUE(released.Await(1));  // until the test has called Stop()
        }
        res.Set("{\"path\":\"" + req.path + "\"}", "application/json");
      },
      PlainError);
  ASSERT_OK(server.Bind());
  std::thread serving([&] { server.Serve(); });
  int fd = aotid::testing::ConnectTcp(server.port());
  ASSERT_GE(fd, 0);
  std::string both = "GET /slow HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n";
  ASSERT_EQ(::send(fd, both.data(), both.size(), MSG_NOSIGNAL), static_cast<ssize_t>(both.size()));
  ASSERT_TRUE(running.Await(1));
  server.Stop();
  released.Add();
  // Everything until the server closes: Exchange stops at the first whole
  // reply, so read on while bytes come.
  std::string replies;
  for (int i = 0; i < 50; ++i) {
    std::string more = aotid::testing::Exchange(fd, "", 200);
    replies += more;
    if (replies.find("/next") != std::string::npos) break;
  }
  ::close(fd);
  serving.join();
  EXPECT_NE(replies.find("{\"path\":\"/slow\"}"), std::string::npos) << replies;
  EXPECT_NE(replies.find("{\"path\":\"/next\"}"), std::string::npos) << replies;
  EXPECT_NE(replies.find("Connection: close"), std::string::npos) << replies;
}

// Deferred answers (Response::Defer) hold no worker: one worker takes ten
// requests that wait for their Reply and still answers a fresh one; each
// client then gets its own answer, in whatever order they come, with the
// headers set before the handler returned, on a connection that serves on.
// A Reply made inside the handler, and one dropped without a call (500),
// are answered too.
TEST(HttpServer, DeferredAnswersHoldNoWorkerAndEachReachesItsClient) {
  ServerOptions o;
  o.port = 0;  // a free port: tests run side by side
  o.threads = 1;
  Mutex mu;
  std::vector<std::pair<std::string, Reply>> waiting;
  aotid::testing::Counter handled;
  Server server(
      o,
      [&](Request& req, Response& res) {
        if (req.path == "/now") return res.Set("{\"now\":1}", "application/json");
        res.SetHeader("X-Kept", "yes");
        Reply reply = res.Defer();
        if (req.path == "/dropped") return;
        auto answer = [q = req.query](Response& r) { r.Set("{\"id\":\"" + q + "\"}", "application/json"); };
        if (req.path == "/inline") return reply(answer);
        MutexLock lock(&mu);
        waiting.emplace_back(req.query, reply);
        handled.Add();
      },
      PlainError);
  ASSERT_OK(server.Bind());
  std::thread serving([&] { server.Serve(); });
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) {
    int fd = aotid::testing::ConnectTcp(server.port());
    ASSERT_GE(fd, 0);
    std::string get = "GET /wait?" + std::to_string(i) + " HTTP/1.1\r\nHost: a\r\n\r\n";
    ASSERT_GT(::send(fd, get.data(), get.size(), MSG_NOSIGNAL), 0);
    fds.push_back(fd);
  }
  EXPECT_TRUE(handled.Await(10));  // all ten handled, none answered
  int fresh = aotid::testing::ConnectTcp(server.port());
  std::string now = aotid::testing::Exchange(fresh, "GET /now HTTP/1.1\r\nHost: a\r\n\r\n", 5000);
  EXPECT_NE(now.find("{\"now\":1}"), std::string::npos) << now;
  for (const char* path : {"/inline?x", "/dropped?y"}) {
    std::string r =
        aotid::testing::Exchange(fresh, std::string("GET ") + path + " HTTP/1.1\r\nHost: a\r\n\r\n", 5000);
    if (path[1] == 'i') {
      EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 200") << r;
      EXPECT_NE(r.find("{\"id\":\"x\"}"), std::string::npos) << r;
    } else {
      EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 500") << r;
      EXPECT_NE(r.find("dropped without an answer"), std::string::npos) << r;
    }
  }
  ::close(fresh);
  {
    MutexLock lock(&mu);
    ASSERT_EQ(waiting.size(), fds.size());
    // Answered from another thread, last first.
    std::thread replier([&] {
      for (auto it = waiting.rbegin(); it != waiting.rend(); ++it) {
        it->second([q = it->first](Response& r) { r.Set("{\"id\":\"" + q + "\"}", "application/json"); });
        it->second([](Response& r) { r.Set("{\"id\":\"twice\"}", "application/json"); });  // ignored
      }
    });
    replier.join();
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    std::string r = aotid::testing::Exchange(fds[i], "", 5000);
    EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 200") << r;
    EXPECT_NE(r.find("{\"id\":\"" + std::to_string(i) + "\"}"), std::string::npos) << r;
    EXPECT_NE(r.find("X-Kept: yes"), std::string::npos) << r;
    EXPECT_EQ(r.find("twice"), std::string::npos) << r;
    // The connection serves on.
    r = aotid::testing::Exchange(fds[i], "GET /now HTTP/1.1\r\nHost: a\r\n\r\n", 5000);
    EXPECT_NE(r.find("{\"now\":1}"), std::string::npos) << r;
    ::close(fds[i]);
  }
  server.Stop();
  serving.join();
}

// Stop() waits for a deferred answer (within drain_timeout_s) and sends it
// with Connection: close; a Reply after the server is gone does nothing.
TEST(HttpServer, StopWaitsForDeferredAnswers) {
  ServerOptions o;
  o.port = 0;  // a free port: tests run side by side
  o.threads = 1;
  Mutex mu;
  std::vector<Reply> waiting;
  aotid::testing::Counter handled;
  Server server(
      o,
      [&](Request&, Response& res) {
        MutexLock lock(&mu);
        waiting.push_back(res.Defer());
        handled.Add();
      },
      PlainError);
  ASSERT_OK(server.Bind());
  std::thread serving([&] { server.Serve(); });
  int fd = aotid::testing::ConnectTcp(server.port());
  std::string get = "GET /a HTTP/1.1\r\nHost: a\r\n\r\n";
  ASSERT_GT(::send(fd, get.data(), get.size(), MSG_NOSIGNAL), 0);
  ASSERT_TRUE(handled.Await(1));
  server.Stop();
  // The drain is under way once the server stops listening: new
  // connections are refused (each try is one connect; 10 s of them at most).
  bool refused = false;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       !refused && std::chrono::steady_clock::now() < until;) {
    int probe = aotid::testing::ConnectTcp(server.port());
    refused = probe < 0;
    if (probe >= 0) ::close(probe);
  }
  EXPECT_TRUE(refused) << "the server still listens after Stop()";
  Reply reply;
  {
    MutexLock lock(&mu);
    ASSERT_EQ(waiting.size(), 1u);
    reply = waiting[0];
  }
  reply([](Response& r) { r.Set("{\"late\":1}", "application/json"); });
  std::string r = aotid::testing::Exchange(fd, "", 5000);
  serving.join();
  ::close(fd);
  EXPECT_NE(r.find("{\"late\":1}"), std::string::npos) << r;
  EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
}

// A worker that has found the queue empty and is about to wait when the
// server stops must still be woken: the flag and the signal were once set
// outside the lock it checks under, so the wake was lost, the worker slept
// forever, and Serve() never returned.
TEST(HttpServer, StopWakesAWorkerBetweenItsCheckAndItsWait) {
  ServerOptions o;
  o.port = 0;
  o.threads = 1;
  auto server = std::make_unique<Server>(
      o, [](Request&, Response& res) { res.Set("ok", "text/plain"); }, PlainError);
  ASSERT_OK(server->Bind());
  Server* s = server.get();
  std::atomic<bool> armed{false}, in_window{false};
  aotid::testing::Counter reached_window;
  // The worker, woken once the drain is done, stays between its check and
  // its wait until it is told to end (the lost wake) or, when telling it
  // takes the lock it holds, as it must, for two seconds at most.
  server->TEST_SetBeforeWorkerWaits([&] {
    if (!armed.load() || in_window.exchange(true)) return;
    reached_window.Add();
    // The server does not signal the flag: a bounded poll of it.
    for (int i = 0; i < 200 && !s->TEST_stopping(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  // The poller, before it tells the workers to end, wakes the worker into
  // that window (a second Stop signals the workers) and waits till it is there.
  server->TEST_SetBeforeStoppingWorkers([&] {
    armed.store(true);
    s->Stop();
    EXPECT_TRUE(reached_window.Await(1));
  });
  auto serve = std::async(std::launch::async, [s] { s->Serve(); });
  server->Stop();
  if (serve.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "Serve() did not return 20 s after Stop(): a worker missed its wake";
    // The worker sleeps for good; leave it the server rather than hang here.
    (void)server.release();
    std::quick_exit(1);
  }
  EXPECT_TRUE(in_window.load()) << "the worker never reached the window the test is about";
}

// A second server on the same unix socket (another store's daemon) is
// refused while the first lives, and its exit removes nothing of the first's.
TEST(HttpServer, UnixSocketIsNeverTakenOverOrRemovedByAnotherServer) {
  aotid::testing::TempDir dir;
  ServerOptions o;
  o.unix_path = dir / "aotid.sock";
  o.threads = 1;
  Server first(o, AnswerEmpty, PlainError);
  ASSERT_OK(first.Bind());
  {
    Server second(o, AnswerEmpty, PlainError);
    Status s = second.Bind();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("another process serves on it"), std::string::npos) << s.message();
  }
  struct stat st;
  ASSERT_EQ(::lstat(o.unix_path.c_str(), &st), 0) << "the second server removed the first one's socket";
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
}

TEST(HttpServer, StaleUnixSocketOfAnEarlierRunIsReplaced) {
  aotid::testing::TempDir dir;
  ServerOptions o;
  o.unix_path = dir / "aotid.sock";
  o.threads = 1;
  {
    // A socket file nobody listens on, as a killed daemon leaves it.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, o.unix_path.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ::close(fd);
  }
  Server server(o, AnswerEmpty, PlainError);
  EXPECT_OK(server.Bind());
}

}  // namespace
}  // namespace aotid::http
