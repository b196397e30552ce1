// The gRPC API against the HTTP API, on one daemon, side by side: C client
// threads, each with its own gRPC channel (its own connection) and its own
// keep-alive HTTP connection, call
//   grpc         ModelInfer with the tensors in raw_input_contents
//   http_binary  POST .../infer with the binary tensor extension, outputs
//                asked back binary
//   http_json    POST .../infer in JSON
//   inproc       the same cached build loaded in this process, called directly
//   grpc_live    ServerLive (gRPC with no model and no tensor)
//   http_live    GET /v2/health/live (HTTP with no model and no tensor)
// in blocks: every round, each side in turn gets all C threads for K calls
// each (a barrier before and after), the order of the sides turning by one
// every round, so that the machine's noise falls on all of them alike.
// With C = 1 and K = 1 the sides alternate call by call, and each round
// trip is also compared with the in-process call of its round ("paired").
//
//   aotid_grpc_bench --store DIR --model NAME --http-port P --grpc-port G
//                    [--concurrency C] [--rounds R] [--block K] [--warmup W] [--only SIDE]
//
// --only runs that side alone (to trace or profile one front end); its
// line is printed, and no ratios.
//
// The request is one row of uniform [-1, 1) values rounded to 4 decimals
// (FP32) or small integers (INT64), the same values in every form; the
// first gRPC and binary HTTP answers are checked against the in-process run.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/memory.h"
#include "bench/cached_model.h"
#include "bench/raw_http.h"
// clang-format off
// grpc++ after aotid's headers: absl's thread annotations (a system header)
// then take the macro names over quietly, instead of aotid's redefining them.
#include <grpcpp/grpcpp.h>
#include "rpc/oip.grpc.pb.h"
// clang-format on

namespace {

using aotid::bench::RawHttp;
using aotid::model::DType;
using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

int Die(const std::string& msg) {
  std::fprintf(stderr, "aotid_grpc_bench: %s\n", msg.c_str());
  return 1;
}

enum Side { kGrpc, kHttpBinary, kHttpJson, kInproc, kGrpcLive, kHttpLive, kSides };
constexpr const char* kSideName[kSides] = {"grpc",   "http_binary", "http_json",
                                           "inproc", "grpc_live",   "http_live"};

// One request in every form, with the same values.
struct Requests {
  std::vector<aotid::model::HostTensor> inputs;  // in-process
  inference::ModelInferRequest grpc;
  std::string json, binary;  // HTTP bodies
  size_t binary_header = 0;  // the JSON part of `binary`
};

std::string ShapeJson(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

aotid::StatusOr<Requests> MakeRequests(const std::string& model, const aotid::model::ModelSpec& spec) {
  Requests r;
  r.grpc.set_model_name(model);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::string json_inputs, binary_inputs, binary_data;
  for (const auto& in : spec.inputs) {
    aotid::model::HostTensor t;
    t.name = in.name;
    t.dtype = in.dtype;
    for (int64_t d : in.shape) t.shape.push_back(d < 0 ? 1 : d);  // one row
    const int64_t n = t.num_elements();
    std::string data = "[";
    if (in.dtype == DType::kFloat32) {
      std::vector<float> v(static_cast<size_t>(n));
      char num[32];
      for (int64_t i = 0; i < n; ++i) {
        std::snprintf(num, sizeof num, "%.4f", uniform(rng));
        v[static_cast<size_t>(i)] = std::strtof(num, nullptr);
        data += (i ? "," : "") + std::string(num);
      }
      t.data.resize(v.size() * sizeof(float));
      std::memcpy(t.data.data(), v.data(), t.data.size());
    } else if (in.dtype == DType::kInt64) {
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        v[static_cast<size_t>(i)] = static_cast<int64_t>(rng() % 10);
        data += (i ? "," : "") + std::to_string(v[static_cast<size_t>(i)]);
      }
      t.data.resize(v.size() * sizeof(int64_t));
      std::memcpy(t.data.data(), v.data(), t.data.size());
    } else {
      return aotid::InvalidArgument("input '" + in.name + "': only FP32 and INT64 inputs are made here");
    }
    data += "]";
    const std::string dtype(aotid::model::DTypeName(t.dtype));
    const std::string head =
        "{\"name\":\"" + t.name + "\",\"datatype\":\"" + dtype + "\",\"shape\":" + ShapeJson(t.shape);
    json_inputs += (json_inputs.empty() ? "" : ",") + head + ",\"data\":" + data + "}";
    binary_inputs += (binary_inputs.empty() ? "" : ",") + head +
                     ",\"parameters\":{\"binary_data_size\":" + std::to_string(t.data.size()) + "}}";
    binary_data.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    auto* g = r.grpc.add_inputs();
    g->set_name(t.name);
    g->set_datatype(dtype);
    for (int64_t d : t.shape) g->add_shape(d);
    r.grpc.add_raw_input_contents(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    r.inputs.push_back(std::move(t));
  }
  std::string outputs;
  for (const auto& out : spec.outputs) {
    outputs += (outputs.empty() ? "" : ",") + std::string("{\"name\":\"") + out.name +
               "\",\"parameters\":{\"binary_data\":true}}";
  }
  r.json = "{\"inputs\":[" + json_inputs + "]}";
  std::string header = "{\"inputs\":[" + binary_inputs + "],\"outputs\":[" + outputs + "]}";
  r.binary_header = header.size();
  r.binary = header + binary_data;
  return r;
}

// Whether `got` holds the same numbers as `want` (FP32 to a relative 1e-4,
// other types exactly): the daemon ran the same build.
bool SameOutputs(const std::vector<aotid::model::HostTensor>& want, std::string_view got) {
  size_t at = 0;
  for (const auto& t : want) {
    if (got.size() - at < t.data.size()) return false;
    if (t.dtype == DType::kFloat32) {
      for (size_t i = 0; i < t.data.size(); i += 4) {
        float a, b;
        std::memcpy(&a, t.data.data() + i, 4);
        std::memcpy(&b, got.data() + at + i, 4);
        if (std::fabs(a - b) > 1e-4f * (1 + std::fabs(a))) return false;
      }
    } else if (std::memcmp(t.data.data(), got.data() + at, t.data.size()) != 0) {
      return false;
    }
    at += t.data.size();
  }
  return at == got.size();
}

std::shared_ptr<grpc::Channel> OwnChannel(int port) {
  grpc::ChannelArguments args;
  // A channel of its own, not one shared with the other threads' channels
  // to the same address: one TCP connection per client thread.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(),
                                   args);
}

}  // namespace

int main(int argc, char** argv) {
  aotid::KeepFreedMemory(size_t{256} << 20);  // as a runner does (base/memory.h)
  std::string store_dir, model, only;
  int http_port = 0, grpc_port = 0, concurrency = 1, rounds = 2000, block = 1, warmup = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    // clang-format off
    if (k == "--store") store_dir = v;
    else if (k == "--model") model = v;
    else if (k == "--http-port") http_port = std::stoi(v);
    else if (k == "--grpc-port") grpc_port = std::stoi(v);
    else if (k == "--concurrency") concurrency = std::stoi(v);
    else if (k == "--rounds") rounds = std::stoi(v);
    else if (k == "--block") block = std::stoi(v);
    else if (k == "--warmup") warmup = std::stoi(v);
    else if (k == "--only") only = v;
    else return Die("unknown flag " + k);
    // clang-format on
  }
  if (store_dir.empty() || model.empty() || http_port == 0 || grpc_port == 0 || concurrency < 1 ||
      block < 1) {
    return Die(
        "usage: --store DIR --model NAME --http-port P --grpc-port G [--concurrency C] [--rounds R] "
        "[--block K] [--warmup W] [--only SIDE]");
  }
  int only_side = -1;
  for (int s = 0; s < kSides; ++s) {
    if (only == kSideName[s]) only_side = s;
  }
  if (!only.empty() && only_side < 0) return Die("--only: no side named " + only);
  auto loaded_or = aotid::bench::LoadCachedModel(store_dir, model);
  if (!loaded_or.ok()) return Die(loaded_or.status().message());
  std::shared_ptr<aotid::model::LoadedModel> loaded = std::move(loaded_or).value();
  auto reqs_or = MakeRequests(model, loaded->spec());
  if (!reqs_or.ok()) return Die(reqs_or.status().message());
  const Requests& reqs = *reqs_or;
  const std::string path = "/v2/models/" + model + "/infer";
  const std::string http_binary = RawHttp::Request("POST", path, reqs.binary, reqs.binary_header),
                    http_json = RawHttp::Request("POST", path, reqs.json),
                    http_live = RawHttp::Request("GET", "/v2/health/live", "");

  // The answers agree with the in-process run.
  auto want = loaded->Infer(reqs.inputs, {});
  if (!want.ok()) return Die(want.status().message());
  {
    auto stub = inference::GRPCInferenceService::NewStub(OwnChannel(grpc_port));
    grpc::ClientContext ctx;
    inference::ModelInferResponse res;
    grpc::Status s = stub->ModelInfer(&ctx, reqs.grpc, &res);
    if (!s.ok()) return Die("gRPC ModelInfer: " + s.error_message());
    std::string raw;
    for (const auto& c : res.raw_output_contents()) raw += c;
    if (!SameOutputs(*want, raw)) return Die("gRPC's answer differs from the in-process run");
    RawHttp http(http_port);
    if (http.RoundTrip(http_binary) != 200) return Die("binary HTTP infer failed: " + http.reply());
    if (!SameOutputs(*want, std::string_view(http.reply()).substr(http.reply().size() - raw.size())))
      return Die("binary HTTP's answer differs from the in-process run");
    if (http.RoundTrip(http_json) != 200) return Die("JSON HTTP infer failed: " + http.reply());
  }

  // What the gRPC client pays before its bytes leave: the request
  // serialized (the tensor copied into the message's bytes).
  std::vector<double> serialize_us;
  {
    std::string buf;
    for (int i = 0; i < 200; ++i) {
      auto t0 = Clock::now();
      buf.clear();
      reqs.grpc.SerializeToString(&buf);
      serialize_us.push_back(Us(Clock::now() - t0));
    }
  }

  const int total_rounds = warmup + rounds;
  std::vector<Clock::time_point> marks;  // a block's start and end, in turn
  marks.reserve(static_cast<size_t>(total_rounds) * kSides * 2);
  auto mark = [&marks]() noexcept { marks.push_back(Clock::now()); };
  std::barrier sync(concurrency, mark);
  // us[thread][side]: each call's round trip, after warm-up, in order.
  std::vector<std::vector<std::vector<double>>> us(static_cast<size_t>(concurrency),
                                                   std::vector<std::vector<double>>(kSides));
  std::vector<std::string> failures(static_cast<size_t>(concurrency));
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      auto stub = inference::GRPCInferenceService::NewStub(OwnChannel(grpc_port));
      RawHttp http(http_port);
      auto& mine = us[static_cast<size_t>(t)];
      std::string& failed = failures[static_cast<size_t>(t)];
      auto call = [&](int side) -> bool {
        switch (side) {
          case kGrpc: {
            grpc::ClientContext ctx;
            inference::ModelInferResponse res;
            return stub->ModelInfer(&ctx, reqs.grpc, &res).ok() &&
                   res.raw_output_contents_size() == static_cast<int>(want->size());
          }
          case kHttpBinary: return http.RoundTrip(http_binary) == 200;
          case kHttpJson: return http.RoundTrip(http_json) == 200;
          case kInproc: return loaded->Infer(reqs.inputs, {}).ok();
          case kGrpcLive: {
            grpc::ClientContext ctx;
            inference::ServerLiveRequest req;
            inference::ServerLiveResponse res;
            return stub->ServerLive(&ctx, req, &res).ok() && res.live();
          }
          case kHttpLive: return http.RoundTrip(http_live) == 200;
        }
        return false;
      };
      for (int r = 0; r < total_rounds; ++r) {
        for (int j = 0; j < kSides; ++j) {
          const int side = (j + r) % kSides;
          if (only_side >= 0 && side != only_side) continue;
          sync.arrive_and_wait();
          for (int k = 0; k < block; ++k) {
            auto t0 = Clock::now();
            bool ok = failed.empty() && call(side);
            auto t1 = Clock::now();
            if (!ok && failed.empty()) failed = std::string(kSideName[side]) + " failed";
            if (r >= warmup) mine[static_cast<size_t>(side)].push_back(Us(t1 - t0));
          }
          sync.arrive_and_wait();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) {
    if (!f.empty()) return Die(f);
  }
  if (only_side >= 0) {
    std::vector<double> v;
    for (const auto& mine : us) v.insert(v.end(), mine[only_side].begin(), mine[only_side].end());
    std::printf("model=%s concurrency=%d side=%s calls=%zu p50_us=%.1f p99_us=%.1f\n", model.c_str(),
                concurrency, only.c_str(), v.size(), Percentile(v, 0.5), Percentile(v, 0.99));
    return 0;
  }

  // Per side: every call's latency, and calls per second over its blocks.
  std::vector<double> all[kSides], wall_s(kSides, 0);
  for (int r = warmup; r < total_rounds; ++r) {
    for (int j = 0; j < kSides; ++j) {
      const size_t b = static_cast<size_t>(r) * kSides + static_cast<size_t>(j);
      wall_s[static_cast<size_t>((j + r) % kSides)] +=
          std::chrono::duration<double>(marks[2 * b + 1] - marks[2 * b]).count();
    }
  }
  for (const auto& mine : us) {
    for (int s = 0; s < kSides; ++s) all[s].insert(all[s].end(), mine[s].begin(), mine[s].end());
  }
  double p50[kSides], p99[kSides], rps[kSides];
  std::printf(
      "model=%s concurrency=%d rounds=%d block=%d calls_per_side=%zu grpc_request_bytes=%zu "
      "http_binary_body_bytes=%zu http_json_body_bytes=%zu grpc_serialize_p50_us=%.1f\n",
      model.c_str(), concurrency, rounds, block, all[0].size(), reqs.grpc.ByteSizeLong(), reqs.binary.size(),
      reqs.json.size(), Percentile(serialize_us, 0.5));
  for (int s = 0; s < kSides; ++s) {
    p50[s] = Percentile(all[s], 0.5);
    p99[s] = Percentile(all[s], 0.99);
    rps[s] = static_cast<double>(all[s].size()) / wall_s[static_cast<size_t>(s)];
    std::printf("model=%s concurrency=%d side=%s p50_us=%.1f p99_us=%.1f mean_us=%.1f per_s=%.0f\n",
                model.c_str(), concurrency, kSideName[s], p50[s], p99[s], Mean(all[s]), rps[s]);
  }
  std::printf(
      "model=%s concurrency=%d grpc_over_http_binary_p50=%.2f grpc_over_http_binary_p99=%.2f "
      "grpc_over_http_binary_per_s=%.2f overhead_p50_us grpc=%.1f http_binary=%.1f http_json=%.1f",
      model.c_str(), concurrency, p50[kGrpc] / p50[kHttpBinary], p99[kGrpc] / p99[kHttpBinary],
      rps[kGrpc] / rps[kHttpBinary], p50[kGrpc] - p50[kInproc], p50[kHttpBinary] - p50[kInproc],
      p50[kHttpJson] - p50[kInproc]);
  if (concurrency == 1 && block == 1) {
    // Each round trip less the in-process call of its own round.
    auto paired = [&](int side) {
      std::vector<double> d;
      for (size_t i = 0; i < all[side].size(); ++i) d.push_back(all[side][i] - all[kInproc][i]);
      return Percentile(std::move(d), 0.5);
    };
    std::printf(" paired_overhead_p50_us grpc=%.1f http_binary=%.1f http_json=%.1f", paired(kGrpc),
                paired(kHttpBinary), paired(kHttpJson));
  }
  std::printf("\n");
  return 0;
}
