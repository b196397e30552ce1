// The gRPC listener against clients that break the rules, over loopback
// with HTTP/2 written by hand (e2e/h2_raw.h): frames cut short, lengths
// past every limit, more streams than allowed, ping floods, a client that
// never reads, more connections from one address than the cap. After each
// case a well-formed ModelInfer (gRPC's own client) must still answer as
// eager PyTorch did, and the daemon must be alive. The model is
// mlp_so.pt2, a compiled package: no build runs.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/h2_raw.h"
#include "rpc/oip.grpc.pb.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

using json = nlohmann::json;
namespace h2 = testing::h2;

constexpr std::string_view kInferPath = "/inference.GRPCInferenceService/ModelInfer";
constexpr int64_t kMaxBody = 1 << 20;  // server.max_body_bytes of the suite's daemon

// A daemon serving mlp_so.pt2 as "m" over HTTP and gRPC, with `config`.
struct GrpcDaemon {
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  int grpc_port = 0;
};

std::unique_ptr<GrpcDaemon> StartDaemon(const std::string& config, std::string* error,
                                        const RunOptions& opts = {}) {
  auto g = std::make_unique<GrpcDaemon>();
  std::string store = g->dir / "store", out;
  if (RunAotid({"--store", store, "add", TestData("mlp_so.pt2"), "--name", "m"}, &out) != 0) {
    *error = "aotid add: " + out;
    return nullptr;
  }
  std::string config_path = g->dir / "aotid.toml";
  if (!fs::WriteFileAtomic(config_path, config).ok()) {
    *error = "cannot write the config";
    return nullptr;
  }
  auto d = DaemonProcess::Start(
      {"--config", config_path, "--store", store, "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"},
      g->dir / "daemon.log", opts);
  if (!d.ok()) {
    *error = d.status().ToString();
    return nullptr;
  }
  g->daemon = std::move(*d);
  static const std::regex kGrpc(R"(gRPC serving on 127\.0\.0\.1:(\d+)\n)");
  for (int i = 0; i < 600 && g->grpc_port == 0; ++i) {  // bounded: 30 s
    std::smatch m;
    std::string log = g->daemon->Log();
    if (std::regex_search(log, m, kGrpc)) {
      g->grpc_port = std::stoi(m[1]);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (g->grpc_port == 0) {
    *error = "no 'gRPC serving on' line:\n" + g->daemon->Log();
    return nullptr;
  }
  // The model ready, asked over gRPC (bounded: 60 s).
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(g->grpc_port), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    inference::ModelReadyRequest req;
    req.set_name("m");
    inference::ModelReadyResponse res;
    if (stub->ModelReady(&ctx, req, &res).ok() && res.ready()) return g;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  *error = "model m not ready over gRPC:\n" + g->daemon->Log();
  return nullptr;
}

const json& MlpCase() {
  static const json* kase =
      new json(json::parse(*fs::ReadFile(TestData("cases.json")))["mlp"][1]);  // x [3, 8] -> y [3, 4]
  return *kase;
}

// The case's request, or `rows` rows of it repeated.
inference::ModelInferRequest InferRequest(int64_t rows = 0) {
  const json& in = MlpCase()["inputs"][0];
  inference::ModelInferRequest req;
  req.set_model_name("m");
  auto* t = req.add_inputs();
  t->set_name("x");
  t->set_datatype("FP32");
  std::string raw;
  for (const auto& v : in["data"]) {
    float f = v.get<float>();
    raw.append(reinterpret_cast<const char*>(&f), sizeof f);
  }
  int64_t n = in["shape"][0].get<int64_t>();
  if (rows > 0) {
    std::string one = raw;
    raw.clear();
    for (int64_t r = 0; r < rows; ++r) raw.append(one.substr(static_cast<size_t>(r % n) * 32, 32));
    n = rows;
  }
  t->add_shape(n);
  t->add_shape(8);
  req.add_raw_input_contents(raw);
  return req;
}

std::string Serialized(const inference::ModelInferRequest& req) {
  std::string s;
  req.SerializeToString(&s);
  return s;
}

// A good ModelInfer answers as eager PyTorch did, and the daemon is alive.
void ExpectServed(GrpcDaemon& g, const std::string& after) {
  ASSERT_TRUE(g.daemon->Alive()) << "the daemon died after " << after << ":\n" << g.daemon->Log();
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(g.grpc_port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.set_wait_for_ready(true);  // a connection counted out a moment late is retried, within the deadline
  inference::ModelInferResponse res;
  grpc::Status s = stub->ModelInfer(&ctx, InferRequest(), &res);
  ASSERT_TRUE(s.ok()) << "after " << after << ": " << s.error_code() << " " << s.error_message();
  const json& want = MlpCase()["outputs"][0];
  ASSERT_EQ(res.outputs_size(), 1);
  EXPECT_EQ(res.outputs(0).name(), "y");
  EXPECT_EQ(res.outputs(0).datatype(), "FP32");
  ASSERT_EQ(res.outputs(0).shape_size(), 2);
  EXPECT_EQ(res.outputs(0).shape(0), want["shape"][0].get<int64_t>());
  EXPECT_EQ(res.outputs(0).shape(1), want["shape"][1].get<int64_t>());
  ASSERT_EQ(res.raw_output_contents_size(), 1);
  const std::string& raw = res.raw_output_contents(0);
  ASSERT_EQ(raw.size(), want["data"].size() * sizeof(float));
  for (size_t k = 0; k < want["data"].size(); ++k) {
    float got;
    std::memcpy(&got, raw.data() + k * sizeof got, sizeof got);
    double w = want["data"][k].get<double>();
    EXPECT_NEAR(got, w, 1e-5 + 1e-5 * std::fabs(w)) << "y[" << k << "] after " << after;
  }
  ASSERT_TRUE(g.daemon->Alive()) << g.daemon->Log();
}

// The daemon's resident memory, in bytes.
int64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// What one stream was answered: its trailers' grpc-status (-1: none), or
// the RST_STREAM code.
struct StreamEnd {
  int grpc_status = -1;
  std::string grpc_message;
  std::optional<uint32_t> reset;
};

// Reads frames until `stream` ends (trailers or RST_STREAM), the
// connection closes, or `timeout_ms`.
std::optional<StreamEnd> ReadStreamEnd(h2::Conn& c, h2::HpackDecoder& hpack, uint32_t stream, int timeout_ms,
                                       std::vector<h2::Frame>* others = nullptr) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  StreamEnd end;
  std::string block;
  for (;;) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    std::optional<h2::Frame> f = c.Read(static_cast<int>(left.count()));
    if (!f) return std::nullopt;
    if (f->type == h2::kHeaders || f->type == 9 /* CONTINUATION */) {
      // Every block is decoded, whichever stream: the table is the connection's.
      block += f->payload;
      if (!(f->flags & h2::kEndHeaders)) continue;
      std::vector<std::pair<std::string, std::string>> fields;
      EXPECT_TRUE(hpack.Decode(block, &fields));
      block.clear();
      if (f->stream == stream) {
        for (const auto& [k, v] : fields) {
          if (k == "grpc-status") end.grpc_status = std::atoi(v.c_str());
          if (k == "grpc-message") end.grpc_message = v;
        }
        if (f->flags & h2::kEndStream) return end;
      }
    } else if (f->type == h2::kRstStream && f->stream == stream) {
      end.reset = f->ErrorCode();
      return end;
    } else if (others) {
      others->push_back(std::move(*f));
    }
  }
}

// Reads frames until `want` streams have ended, the connection closes,
// or `timeout_ms`; the ends by stream. True when it closed.
bool ReadEnds(h2::Conn& c, h2::HpackDecoder& hpack, size_t want, int timeout_ms,
              std::map<uint32_t, StreamEnd>* ends) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::map<uint32_t, std::string> blocks;
  while (ends->size() < want) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    std::optional<h2::Frame> f = c.Read(static_cast<int>(left.count()));
    if (!f) {
      if (c.closed()) return true;
      continue;
    }
    if (f->type == h2::kHeaders || f->type == 9 /* CONTINUATION */) {
      blocks[f->stream] += f->payload;
      if (!(f->flags & h2::kEndHeaders)) continue;
      std::vector<std::pair<std::string, std::string>> fields;
      EXPECT_TRUE(hpack.Decode(blocks[f->stream], &fields));
      blocks.erase(f->stream);
      if (!(f->flags & h2::kEndStream)) continue;
      StreamEnd& end = (*ends)[f->stream];
      for (const auto& [k, v] : fields) {
        if (k == "grpc-status") end.grpc_status = std::atoi(v.c_str());
        if (k == "grpc-message") end.grpc_message = v;
      }
    } else if (f->type == h2::kRstStream) {
      (*ends)[f->stream].reset = f->ErrorCode();
    }
  }
  return c.closed();
}

// Waits for the answer to a PING: every frame sent before it has been read.
void Sync(h2::Conn& c) {
  ASSERT_TRUE(c.Send(h2::MakeFrame(h2::kPing, 0, 0, "syncsync")));
  for (int i = 0; i < 64; ++i) {
    auto f = c.Read(5000);
    ASSERT_TRUE(f) << "no answer to a PING";
    if (f->type == h2::kPing && (f->flags & h2::kAck) && f->payload == "syncsync") return;
  }
  FAIL() << "no answer to a PING in 64 frames";
}

class GrpcHostile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    daemon_ = StartDaemon("[server]\nmax_body_bytes = " + std::to_string(kMaxBody) + "\n", &error).release();
    if (!daemon_) start_error_ = new std::string(error);
  }
  static void TearDownTestSuite() {
    if (daemon_) EXPECT_EQ(daemon_->daemon->Stop(), 0) << daemon_->daemon->Log();
    delete daemon_;
    daemon_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(daemon_, nullptr) << (start_error_ ? *start_error_ : ""); }
  int port() const { return daemon_->grpc_port; }
  GrpcDaemon& daemon() { return *daemon_; }

  static GrpcDaemon* daemon_;
  static std::string* start_error_;
};
GrpcDaemon* GrpcHostile::daemon_ = nullptr;
std::string* GrpcHostile::start_error_ = nullptr;

// A good call, whole: the bytes the other cases cut or bend.
std::string WholeCall() {
  return std::string(h2::kPreface) + h2::Settings({}) + h2::CallHeaders(1, kInferPath) +
         h2::MakeFrame(h2::kData, h2::kEndStream, 1, h2::GrpcMessage(Serialized(InferRequest())));
}

TEST_F(GrpcHostile, TheRawCallItselfIsAnswered) {
  // The hand-written call the other cases bend is a good one: answered OK.
  h2::Conn c(port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(h2::Handshake(c));
  ASSERT_TRUE(
      c.Send(h2::CallHeaders(1, kInferPath) +
             h2::MakeFrame(h2::kData, h2::kEndStream, 1, h2::GrpcMessage(Serialized(InferRequest())))));
  h2::HpackDecoder hpack;
  auto end = ReadStreamEnd(c, hpack, 1, 30000);
  ASSERT_TRUE(end);
  EXPECT_FALSE(end->reset);
  EXPECT_EQ(end->grpc_status, 0) << end->grpc_message;
}

TEST_F(GrpcHostile, TruncatedFramesThenHangUp) {
  const std::string whole = WholeCall();
  // Every cut in the preface, SETTINGS and HEADERS, then every 7th byte
  // of the DATA frame, each closed plainly or with a reset.
  std::vector<size_t> cuts;
  const size_t data_at = whole.size() - 9 - 5 - Serialized(InferRequest()).size();
  for (size_t n = 1; n < data_at + 16; ++n) cuts.push_back(n);
  for (size_t n = data_at + 16; n < whole.size(); n += 7) cuts.push_back(n);
  for (size_t i = 0; i < cuts.size(); ++i) {
    h2::Conn c(port());
    ASSERT_TRUE(c.connected()) << "cut at " << cuts[i];
    c.Send(std::string_view(whole).substr(0, cuts[i]));
    c.Close(/*reset=*/i % 2 == 1);
  }
  ExpectServed(daemon(), std::to_string(cuts.size()) + " calls cut short");
}

TEST_F(GrpcHostile, FrameHeaderDeclaringAHugeLengthClosesTheConnection) {
  // HEADERS, DATA and an unknown frame type, each declaring 16 MiB - 1 (the
  // server allows 16 KiB frames): the connection is closed at once, not
  // held open waiting for the bytes.
  for (uint8_t type : {uint8_t{h2::kHeaders}, uint8_t{h2::kData}, uint8_t{0xfa}}) {
    h2::Conn c(port());
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(h2::Handshake(c));
    std::string before = type == h2::kData ? h2::CallHeaders(1, kInferPath) : "";
    ASSERT_TRUE(c.Send(before + h2::MakeFrame(type, h2::kEndHeaders, 1, std::string(100, 'x'), 0xffffff)));
    std::vector<h2::Frame> frames;
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(c.ReadToClose(10000, &frames)) << "frame type " << int(type) << ": still open after 10 s";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    // Nothing the server sent claims the call succeeded. (gRPC 1.51 ends
    // the calls open on it and closes, without a GOAWAY.)
    h2::HpackDecoder hpack;
    for (const auto& f : frames) {
      if (f.type != h2::kHeaders) continue;
      std::vector<std::pair<std::string, std::string>> fields;
      ASSERT_TRUE(hpack.Decode(f.payload, &fields));
      for (const auto& [k, v] : fields)
        EXPECT_FALSE(k == "grpc-status" && v == "0") << "frame type " << int(type);
    }
  }
  ExpectServed(daemon(), "frames declaring 16 MiB");
}

// What became of a stream a client pushed data on.
struct Pushed {
  int64_t sent = 0;  // bytes of DATA sent on the stream
  std::optional<StreamEnd> end;
  bool closed = false;
  int64_t peak_rss = 0;  // the daemon's, sampled every 8 MiB
};

// Sends up to `total` bytes of DATA on `stream` as fast as the server's
// flow-control windows allow (answering its PINGs), until the stream is
// ended, the connection closes, or `timeout_s`.
Pushed PushData(h2::Conn& c, h2::HpackDecoder& hpack, uint32_t stream, int64_t total, int64_t stream_window,
                pid_t daemon, int timeout_s) {
  Pushed p;
  int64_t conn_window = 65535;
  const std::string chunk(16384, '\0');
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::string block;
  auto take = [&](int timeout_ms) {
    while (auto f = c.Read(timeout_ms)) {
      timeout_ms = 0;
      if (f->type == h2::kWindowUpdate && f->payload.size() == 4) {
        int64_t inc = (static_cast<int64_t>(static_cast<uint8_t>(f->payload[0]) & 0x7f) << 24) |
                      static_cast<uint8_t>(f->payload[1]) << 16 | static_cast<uint8_t>(f->payload[2]) << 8 |
                      static_cast<uint8_t>(f->payload[3]);
        (f->stream == 0 ? conn_window : stream_window) += f->stream == 0 || f->stream == stream ? inc : 0;
      } else if (f->type == h2::kPing && !(f->flags & h2::kAck)) {
        c.Send(h2::MakeFrame(h2::kPing, h2::kAck, 0, f->payload));
      } else if (f->type == h2::kRstStream && f->stream == stream) {
        if (!p.end) p.end = StreamEnd{};
        p.end->reset = f->ErrorCode();
      } else if (f->type == h2::kHeaders) {
        std::vector<std::pair<std::string, std::string>> fields;
        EXPECT_TRUE(hpack.Decode(f->payload, &fields));
        if (f->stream == stream && (f->flags & h2::kEndStream)) {
          if (!p.end) p.end = StreamEnd{};
          for (const auto& [k, v] : fields) {
            if (k == "grpc-status") p.end->grpc_status = std::atoi(v.c_str());
            if (k == "grpc-message") p.end->grpc_message = v;
          }
        }
      }
    }
    p.closed = c.closed();
  };
  while (p.sent < total && !p.end && !p.closed && std::chrono::steady_clock::now() < deadline) {
    int64_t room = std::min({conn_window, stream_window, int64_t{16384}, total - p.sent});
    if (room <= 0) {
      take(100);
      continue;
    }
    if (!c.Send(h2::MakeFrame(h2::kData, 0, stream, std::string_view(chunk).substr(0, room)), 2000)) {
      take(100);
      p.closed = true;
      break;
    }
    if ((p.sent + room) / (8 << 20) != p.sent / (8 << 20))
      p.peak_rss = std::max(p.peak_rss, RssBytes(daemon));
    p.sent += room;
    conn_window -= room;
    stream_window -= room;
    take(0);
  }
  take(500);
  p.peak_rss = std::max(p.peak_rss, RssBytes(daemon));
  return p;
}

TEST_F(GrpcHostile, MessagePrefixDeclaringFourGiBCannotFillMemory) {
  // A call whose message prefix declares 4 GiB (server.max_body_bytes is
  // 1 MiB) and whose client then sends as fast as the windows allow.
  // gRPC checks a message's size only once all of it has come, so the
  // bytes are buffered as they arrive: what bounds them is the transport's
  // memory budget (rpc::ServerOptions::max_buffered_bytes, 64 MiB here).
  // Past it the call, or its connection, is cut.
  const int64_t rss0 = RssBytes(daemon().daemon->pid());
  h2::Conn c(port());
  ASSERT_TRUE(c.connected());
  auto settings = h2::Handshake(c);
  ASSERT_TRUE(settings);
  const int64_t window = settings->Setting(h2::kSettingsInitialWindowSize).value_or(65535);
  ASSERT_TRUE(c.Send(h2::CallHeaders(1, kInferPath) +
                     h2::MakeFrame(h2::kData, 0, 1, h2::GrpcMessage("", 0xffffffffu))));
  h2::HpackDecoder hpack;
  Pushed p = PushData(c, hpack, 1, int64_t{512} << 20, window - 5, daemon().daemon->pid(), 60);
  std::cout << "pushed " << (p.sent >> 20) << " MiB of a message declaring 4 GiB; daemon RSS " << (rss0 >> 20)
            << " MiB before, at most " << (p.peak_rss >> 20) << " MiB; "
            << (p.end      ? "stream ended"
                : p.closed ? "connection closed"
                           : "still open")
            << "\n";
  EXPECT_TRUE(p.end || p.closed) << "the server took " << (p.sent >> 20)
                                 << " MiB of a message declaring 4 GiB without cutting it";
  // Cut, not answered: gRPC resets it (ENHANCE_YOUR_CALM) and ends it CANCELLED.
  if (p.end) EXPECT_NE(p.end->grpc_status, 0) << p.end->grpc_message;
  EXPECT_LT(p.sent, int64_t{160} << 20);
  EXPECT_LT(p.peak_rss - rss0, int64_t{192} << 20);
  c.Close();
  ExpectServed(daemon(), "a message prefix of 4 GiB");
}

TEST_F(GrpcHostile, MessageOfMaxBodyBytesPlusOneIsResourceExhausted) {
  // Declared one byte over server.max_body_bytes and sent whole: refused
  // once it has come, and the connection stays usable.
  h2::Conn c(port());
  ASSERT_TRUE(c.connected());
  auto settings = h2::Handshake(c);
  ASSERT_TRUE(settings);
  const int64_t window = settings->Setting(h2::kSettingsInitialWindowSize).value_or(65535);
  ASSERT_TRUE(
      c.Send(h2::CallHeaders(1, kInferPath) +
             h2::MakeFrame(h2::kData, 0, 1, h2::GrpcMessage("", static_cast<uint32_t>(kMaxBody + 1)))));
  h2::HpackDecoder hpack;
  Pushed p = PushData(c, hpack, 1, kMaxBody + 1, window - 5, daemon().daemon->pid(), 30);
  if (!p.end) {
    auto end = ReadStreamEnd(c, hpack, 1, 10000);
    ASSERT_TRUE(end) << "no answer to a message of max_body_bytes + 1";
    p.end = end;
  }
  EXPECT_EQ(p.end->grpc_status, grpc::StatusCode::RESOURCE_EXHAUSTED) << p.end->grpc_message;
  ASSERT_TRUE(
      c.Send(h2::CallHeaders(3, kInferPath) +
             h2::MakeFrame(h2::kData, h2::kEndStream, 3, h2::GrpcMessage(Serialized(InferRequest())))));
  auto end = ReadStreamEnd(c, hpack, 3, 30000);
  ASSERT_TRUE(end);
  EXPECT_EQ(end->grpc_status, 0) << end->grpc_message;
  ExpectServed(daemon(), "a message of max_body_bytes + 1");
}

TEST_F(GrpcHostile, MessageOverMaxBodyBytesIsResourceExhausted) {
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port()), grpc::InsecureChannelCredentials()));
  // Rows of 32 bytes: just over the limit, and a message that fits.
  inference::ModelInferRequest big = InferRequest(kMaxBody / 32 + 1);
  ASSERT_GT(static_cast<int64_t>(big.ByteSizeLong()), kMaxBody);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  inference::ModelInferResponse res;
  grpc::Status s = stub->ModelInfer(&ctx, big, &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();

  inference::ModelInferRequest fits = InferRequest(kMaxBody / 32 - 64);
  ASSERT_LT(static_cast<int64_t>(fits.ByteSizeLong()), kMaxBody);
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  s = stub->ModelInfer(&ctx2, fits, &res);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_EQ(res.outputs(0).shape(0), kMaxBody / 32 - 64);
  ExpectServed(daemon(), "a message over max_body_bytes");
}

TEST_F(GrpcHostile, StreamsBeyondTheCapAreRefused) {
  {
    // 128 calls at once are let in: opened together, then each sends its
    // message, and all are answered.
    h2::Conn c(port());
    ASSERT_TRUE(c.connected());
    auto settings = h2::Handshake(c);
    ASSERT_TRUE(settings);
    EXPECT_EQ(settings->Setting(h2::kSettingsMaxConcurrentStreams), 128u);
    Sync(c);  // the server has our ACK of its SETTINGS: the cap applies
    std::string opens, messages;
    const std::string body = h2::GrpcMessage(Serialized(InferRequest()));
    for (uint32_t i = 0; i < 128; ++i) {
      opens += h2::CallHeaders(1 + 2 * i, kInferPath);
      messages += h2::MakeFrame(h2::kData, h2::kEndStream, 1 + 2 * i, body);
    }
    ASSERT_TRUE(c.Send(opens));
    Sync(c);
    ASSERT_TRUE(c.Send(messages));
    h2::HpackDecoder hpack;
    std::map<uint32_t, StreamEnd> ends;
    ReadEnds(c, hpack, 128, 60000, &ends);
    ASSERT_EQ(ends.size(), 128u);
    for (const auto& [id, end] : ends) {
      EXPECT_FALSE(end.reset) << "stream " << id;
      EXPECT_EQ(end.grpc_status, 0) << "stream " << id << ": " << end.grpc_message;
    }
  }
  {
    // 200 at once, none sending its message: the 129th (stream 257) is
    // refused. gRPC 1.51 takes it for an error of the whole connection
    // (RFC 9113 would refuse that stream alone): the calls open on it end
    // UNAVAILABLE and it closes. Either way no call past the 128th is let
    // in, and none of them succeeds.
    h2::Conn c(port());
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(h2::Handshake(c));
    Sync(c);
    std::string opens;
    for (uint32_t i = 0; i < 200; ++i) opens += h2::CallHeaders(1 + 2 * i, kInferPath);
    c.Send(opens);
    h2::HpackDecoder hpack;
    std::map<uint32_t, StreamEnd> ends;
    bool closed = ReadEnds(c, hpack, 200, 10000, &ends);
    size_t refused_past_cap = 0;
    for (const auto& [id, end] : ends) {
      EXPECT_NE(end.grpc_status, 0) << "stream " << id << " succeeded with no message";
      if (id > 255) {
        EXPECT_TRUE(end.reset) << "stream " << id << " (past the 128th) was let in: " << end.grpc_status;
        ++refused_past_cap;
      }
    }
    EXPECT_TRUE(closed || refused_past_cap == 72) << ends.size() << " streams ended, " << refused_past_cap
                                                  << " of them past the 128th; the connection is open";
  }
  ExpectServed(daemon(), "200 streams at once on one connection");
}

TEST_F(GrpcHostile, PingFloodIsToldToCalmDown) {
  h2::Conn c(port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(h2::Handshake(c));
  std::string flood;
  for (uint64_t i = 0; i < 1000; ++i) {
    std::string data(reinterpret_cast<const char*>(&i), 8);
    flood += h2::MakeFrame(h2::kPing, 0, 0, data);
  }
  c.Send(flood, 2000);  // the server may stop reading part way
  std::vector<h2::Frame> frames;
  ASSERT_TRUE(c.ReadToClose(10000, &frames)) << "a connection flooding pings was not closed in 10 s";
  const h2::Frame* goaway = nullptr;
  for (const auto& f : frames) {
    if (f.type == h2::kGoaway) goaway = &f;
  }
  ASSERT_NE(goaway, nullptr) << "closed without a GOAWAY";
  EXPECT_EQ(goaway->ErrorCode(), h2::kEnhanceYourCalm);
  EXPECT_EQ(goaway->GoawayDebug(), "too_many_pings");
  ExpectServed(daemon(), "a ping flood");
}

TEST_F(GrpcHostile, ClientThatNeverReadsHoldsBoundedMemory) {
  // Two clients each open 100 calls of 4096 rows (128 KiB in, 64 KiB
  // answered), send all but the last byte of each message while they read
  // the server's window updates, then send the last bytes and never read
  // again: 6.4 MiB of answers each that cannot go. A third client is
  // served meanwhile, and the daemon's memory stays within a bound.
  constexpr int kStreams = 100;
  constexpr int kRows = 4096;
  const std::string msg = h2::GrpcMessage(Serialized(InferRequest(kRows)));
  const int64_t rss0 = RssBytes(daemon().daemon->pid());
  ASSERT_GT(rss0, 0);
  std::vector<std::unique_ptr<h2::Conn>> stalled;
  for (int client = 0; client < 2; ++client) {
    auto c = std::make_unique<h2::Conn>(port(), /*rcvbuf=*/4096);
    ASSERT_TRUE(c->connected());
    auto settings = h2::Handshake(*c, h2::Settings({{h2::kSettingsInitialWindowSize, 0x7fffffff}}) +
                                          h2::WindowUpdate(0, 0x7fffffff - 65535));
    ASSERT_TRUE(settings);
    // Send windows as the server grants them (RFC 9113 6.9).
    int64_t conn_window = 65535;
    const int64_t initial = settings->Setting(h2::kSettingsInitialWindowSize).value_or(65535);
    std::map<uint32_t, int64_t> windows;
    auto take = [&](int timeout_ms) {
      while (auto f = c->Read(timeout_ms)) {
        timeout_ms = 0;
        if (f->type == h2::kWindowUpdate && f->payload.size() == 4) {
          int64_t inc = static_cast<uint8_t>(f->payload[0]) << 24 |
                        static_cast<uint8_t>(f->payload[1]) << 16 | static_cast<uint8_t>(f->payload[2]) << 8 |
                        static_cast<uint8_t>(f->payload[3]);
          (f->stream == 0 ? conn_window : windows[f->stream]) += inc;
        }
        ASSERT_NE(f->type, h2::kGoaway) << "GOAWAY " << f->ErrorCode() << " " << f->GoawayDebug();
        ASSERT_NE(f->type, h2::kRstStream) << "stream " << f->stream << " reset " << f->ErrorCode();
      }
    };
    for (int i = 0; i < kStreams; ++i) {
      const uint32_t id = 1 + 2 * static_cast<uint32_t>(i);
      windows[id] = initial;
      ASSERT_TRUE(c->Send(h2::CallHeaders(id, kInferPath)));
      size_t sent = 0;
      const size_t all_but_one = msg.size() - 1;
      for (int spins = 0; sent < all_but_one && spins < 2000; ++spins) {
        int64_t room =
            std::min({conn_window, windows[id], int64_t{16384}, static_cast<int64_t>(all_but_one - sent)});
        if (room <= 0) {
          take(50);
          continue;
        }
        ASSERT_TRUE(c->Send(h2::MakeFrame(h2::kData, 0, id, std::string_view(msg).substr(sent, room))));
        sent += static_cast<size_t>(room);
        conn_window -= room;
        windows[id] -= room;
        take(0);
      }
      ASSERT_EQ(sent, all_but_one) << "stream " << id << ": the server granted no window in time";
    }
    take(100);
    ASSERT_GE(conn_window, kStreams) << "no window left for the last bytes";
    // The last byte of every message: the answers start, and nothing more
    // is read on this connection.
    std::string last;
    for (int i = 0; i < kStreams; ++i)
      last += h2::MakeFrame(h2::kData, h2::kEndStream, 1 + 2 * static_cast<uint32_t>(i),
                            msg.substr(msg.size() - 1));
    ASSERT_TRUE(c->Send(last));
    stalled.push_back(std::move(c));
  }
  // Others are served while the answers wait.
  for (int i = 0; i < 5; ++i) ExpectServed(daemon(), "clients that never read");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const int64_t rss1 = RssBytes(daemon().daemon->pid());
  // 2 x 100 answers of 64 KiB are 12.5 MiB, their requests 25 MiB: the
  // bound leaves room for the runtime's arenas, not for more clients'
  // worth of held data.
  EXPECT_LT(rss1 - rss0, int64_t{256} << 20) << "RSS grew from " << rss0 << " to " << rss1;
  std::cout << "daemon RSS " << (rss0 >> 20) << " MiB before, " << (rss1 >> 20)
            << " MiB with 2 stalled clients\n";
  stalled.clear();
  ExpectServed(daemon(), "clients that never read, closed");
}

// server.max_connections_per_address of 4: a fifth connection is closed at
// once; after two close, two more are let in (the listener's sweep counts
// the closed ones out), and then a fifth is closed again.
TEST(GrpcConnectionCap, FifthConnectionIsClosedUntilOthersClose) {
  std::string error;
  auto g = StartDaemon("[server]\nmax_connections_per_address = 4\n", &error);
  ASSERT_NE(g, nullptr) << error;
  // StartDaemon's own channel is gone once the sweep runs: wait until 4 are let in.
  std::vector<std::unique_ptr<h2::Conn>> open;
  auto admitted = [&](h2::Conn& c) { return h2::Handshake(c).has_value(); };
  for (int tries = 0; tries < 50 && open.size() < 4; ++tries) {
    auto c = std::make_unique<h2::Conn>(g->grpc_port);
    ASSERT_TRUE(c->connected());
    if (admitted(*c)) {
      open.push_back(std::move(c));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  ASSERT_EQ(open.size(), 4u) << g->daemon->Log();
  auto refused = [&](const std::string& when) {
    h2::Conn fifth(g->grpc_port);
    ASSERT_TRUE(fifth.connected());  // the kernel accepts; the listener closes it
    fifth.Send(std::string(h2::kPreface) + h2::Settings({}));
    std::vector<h2::Frame> frames;
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(fifth.ReadToClose(5000, &frames)) << when << ": a fifth connection is still open after 5 s";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << when;
    EXPECT_TRUE(frames.empty()) << when << ": the fifth connection was answered";
  };
  refused("4 open");
  // The four still work.
  for (auto& c : open) {
    ASSERT_TRUE(c->Send(h2::MakeFrame(h2::kPing, 0, 0, "12345678")));
    bool acked = false;
    for (int i = 0; i < 8 && !acked; ++i) {
      auto f = c->Read(5000);
      ASSERT_TRUE(f);
      acked = f->type == h2::kPing && (f->flags & h2::kAck);
    }
    EXPECT_TRUE(acked);
  }
  open[0]->Close();
  open[1]->Close(/*reset=*/true);
  open.erase(open.begin(), open.begin() + 2);
  // Counted out by the sweep (once a second, and at each accept) once gRPC
  // has closed them: bounded at 10 s.
  int readmitted = 0;
  for (int tries = 0; tries < 50 && readmitted < 2; ++tries) {
    auto c = std::make_unique<h2::Conn>(g->grpc_port);
    ASSERT_TRUE(c->connected());
    if (admitted(*c)) {
      open.push_back(std::move(c));
      ++readmitted;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  EXPECT_EQ(readmitted, 2) << "closed connections were not counted out";
  refused("4 open again");
  open.clear();
  ExpectServed(*g, "the connection cap");
  EXPECT_EQ(g->daemon->Stop(), 0) << g->daemon->Log();
}

// A repository load still waiting for its model when SIGTERM comes (each
// load here takes 5 s, a pause point) is answered UNAVAILABLE, and the
// daemon then exits 0: gRPC's shutdown waits for every call's end, and a
// load left unanswered held it for good.
TEST(GrpcStop, ALoadWaitingAtSigtermIsAnsweredAndTheDaemonExits) {
  std::string error;
  RunOptions opts;
  opts.env = {"AOTID_TEST_PAUSE_AT=model_load=5000"};
  auto g = StartDaemon("", &error, opts);
  ASSERT_NE(g, nullptr) << error;
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(g->grpc_port), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    inference::RepositoryModelUnloadRequest req;
    req.set_model_name("m");
    inference::RepositoryModelUnloadResponse res;
    grpc::Status s = stub->RepositoryModelUnload(&ctx, req, &res);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  grpc::Status load;
  std::atomic<bool> answered{false};
  std::thread loader([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    inference::RepositoryModelLoadRequest req;
    req.set_model_name("m");
    inference::RepositoryModelLoadResponse res;
    load = stub->RepositoryModelLoad(&ctx, req, &res);
    answered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the load waits on its model
  EXPECT_FALSE(answered.load());
  EXPECT_EQ(g->daemon->Stop(/*grace_s=*/40), 0) << g->daemon->Log();
  loader.join();
  EXPECT_EQ(load.error_code(), grpc::StatusCode::UNAVAILABLE) << load.error_message();
  EXPECT_NE(load.error_message().find("the daemon is stopping"), std::string::npos) << load.error_message();
}

}  // namespace
}  // namespace aotid::testing
