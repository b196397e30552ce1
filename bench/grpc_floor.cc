// gRPC's own floor on this machine: ServerLive, a call with no model and
// no tensor, answered by bare grpc++ servers in this process (the callback
// API, as serving/grpc_api.cc has it, the synchronous API, and the
// completion-queue API with one thread of its own), next to the
// daemon's ServerLive, interleaved call by call from one client thread (a
// synchronous stub, one channel per server); with H, the daemon's
// GET /v2/health/live over HTTP too (one keep-alive connection).
//
//   aotid_grpc_floor --grpc-port G [--http-port H] [--rounds N] [--pause-us P]
//
// With P, each call comes after P µs with nothing sent: a client with
// think time between its calls.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/raw_http.h"
#include "rpc/oip.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

class CallbackLive final : public inference::GRPCInferenceService::CallbackService {
  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* res) override {
    res->set_live(true);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

class SyncLive final : public inference::GRPCInferenceService::Service {
  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*,
                          inference::ServerLiveResponse* res) override {
    res->set_live(true);
    return grpc::Status::OK;
  }
};

// The completion-queue API: one thread of the server's own takes each
// call from its queue and answers it there.
class AsyncLive {
 public:
  AsyncLive() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    cq_ = b.AddCompletionQueue();
    server_ = b.BuildAndStart();
    thread_ = std::thread([this] { Loop(); });
  }
  ~AsyncLive() {
    server_->Shutdown();
    cq_->Shutdown();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  struct Call {
    grpc::ServerContext ctx;
    inference::ServerLiveRequest req;
    grpc::ServerAsyncResponseWriter<inference::ServerLiveResponse> writer{&ctx};
    bool answered = false;
  };
  void Ask() {
    auto* c = new Call;
    service_.RequestServerLive(&c->ctx, &c->req, &c->writer, cq_.get(), cq_.get(), c);
  }
  void Loop() {
    Ask();
    void* tag;
    bool ok;
    while (cq_->Next(&tag, &ok)) {
      auto* c = static_cast<Call*>(tag);
      if (!ok || c->answered) {
        delete c;
        continue;
      }
      Ask();
      inference::ServerLiveResponse res;
      res.set_live(true);
      c->answered = true;
      c->writer.Finish(res, grpc::Status::OK, c);
    }
  }
  inference::GRPCInferenceService::AsyncService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::unique_ptr<grpc::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

std::unique_ptr<grpc::Server> Start(grpc::Service* service, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  b.RegisterService(service);
  return b.BuildAndStart();
}

std::unique_ptr<inference::GRPCInferenceService::Stub> Stub(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args));
}

}  // namespace

int main(int argc, char** argv) {
  int daemon_port = 0, http_port = 0, rounds = 2000, pause_us = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--grpc-port") {
      daemon_port = std::stoi(v);
    } else if (k == "--rounds") {
      rounds = std::stoi(v);
    } else if (k == "--http-port") {
      http_port = std::stoi(v);
    } else if (k == "--pause-us") {
      pause_us = std::stoi(v);
    } else {
      std::fprintf(stderr, "aotid_grpc_floor: unknown flag %s\n", k.c_str());
      return 1;
    }
  }
  if (daemon_port == 0) {
    std::fprintf(stderr,
                 "usage: aotid_grpc_floor --grpc-port G [--http-port H] [--rounds N] [--pause-us P]\n");
    return 1;
  }
  CallbackLive callback;
  SyncLive sync;
  int callback_port = 0, sync_port = 0;
  auto callback_server = Start(&callback, &callback_port);
  auto sync_server = Start(&sync, &sync_port);
  if (!callback_server || !sync_server) {
    std::fprintf(stderr, "aotid_grpc_floor: a server would not start\n");
    return 1;
  }
  AsyncLive async;
  const char* names[] = {"daemon", "bare_callback", "bare_sync", "bare_async"};
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs;
  for (int port : {daemon_port, callback_port, sync_port, async.port()}) stubs.push_back(Stub(port));
  std::vector<std::vector<double>> us(stubs.size());
  std::vector<double> http_us;
  std::unique_ptr<aotid::bench::RawHttp> http;
  const std::string live = aotid::bench::RawHttp::Request("GET", "/v2/health/live", "");
  if (http_port > 0) http = std::make_unique<aotid::bench::RawHttp>(http_port);
  for (int i = 0; i < rounds + 50; ++i) {
    if (http) {
      if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      auto t0 = Clock::now();
      if (http->RoundTrip(live) != 200) {
        std::fprintf(stderr, "aotid_grpc_floor: GET /v2/health/live failed\n");
        return 1;
      }
      if (i >= 50) http_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    for (size_t s = 0; s < stubs.size(); ++s) {
      grpc::ClientContext ctx;
      inference::ServerLiveRequest req;
      inference::ServerLiveResponse res;
      if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      auto t0 = Clock::now();
      grpc::Status st = stubs[s]->ServerLive(&ctx, req, &res);
      auto t1 = Clock::now();
      if (!st.ok() || !res.live()) {
        std::fprintf(stderr, "aotid_grpc_floor: %s: %s\n", names[s], st.error_message().c_str());
        return 1;
      }
      if (i >= 50) us[s].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
  for (size_t s = 0; s < stubs.size(); ++s) {
    std::printf("server_live %s pause_us=%d p50_us=%.1f p99_us=%.1f\n", names[s], pause_us,
                Percentile(us[s], 0.5), Percentile(us[s], 0.99));
  }
  if (http) {
    std::printf("http_live daemon pause_us=%d p50_us=%.1f p99_us=%.1f\n", pause_us, Percentile(http_us, 0.5),
                Percentile(http_us, 0.99));
  }
  callback_server->Shutdown();
  sync_server->Shutdown();
  return 0;
}
