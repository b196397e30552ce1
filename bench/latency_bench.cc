// One infer over HTTP (keep-alive, loopback) against the same call made
// in-process on the same build, measured side by side in one run.
//
//   aotid_latency_bench --store DIR --model NAME --port PORT --request FILE [--iterations N]
//
// FILE is an infer request body (JSON). The in-process side loads the cached
// build of the model's latest version for this machine, as the daemon does.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/fs.h"
#include "daemon/tensor_codec.h"
#include "runtime/build_cache.h"
#include "runtime/hardware.h"
#include "runtime/loaded_model.h"
#include "storage/model_store.h"

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

int Die(const std::string& msg) {
  std::fprintf(stderr, "aotid_latency_bench: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string store_dir, model, request_file;
  int port = 0, iterations = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--store") store_dir = v;
    else if (k == "--model") model = v;
    else if (k == "--port") port = std::stoi(v);
    else if (k == "--request") request_file = v;
    else if (k == "--iterations") iterations = std::stoi(v);
    else return Die("unknown flag " + k);
  }
  if (store_dir.empty() || model.empty() || port == 0 || request_file.empty()) {
    return Die("usage: --store DIR --model NAME --port PORT --request FILE [--iterations N]");
  }
  auto body = aotid::fs::ReadFile(request_file);
  if (!body.ok()) return Die(body.status().message());

  auto store = aotid::storage::ModelStore::Open(store_dir, false);
  if (!store.ok()) return Die(store.status().message());
  auto versions = (*store)->ListVersions();
  const aotid::storage::ModelVersion* mv = nullptr;
  for (const auto& v : *versions) {
    if (v.model == model) mv = &v;
  }
  if (mv == nullptr) return Die("no model " + model);
  aotid::runtime::BuildCache cache(store_dir + "/cache");
  std::string fp = aotid::runtime::Fingerprint(aotid::runtime::ProbeHardware());
  auto entry = cache.Lookup({mv->artifact, mv->package_model, "cpu", fp});
  if (!entry.ok()) return Die(entry.status().message());
  aotid::runtime::LoadOptions opts;
  opts.package_model = mv->package_model;
  auto loaded = aotid::runtime::LoadAotiPackage(*entry, opts);
  if (!loaded.ok()) return Die(loaded.status().message());
  auto req = aotid::daemon::DecodeInferRequest(*body, (*loaded)->spec());
  if (!req.ok()) return Die(req.status().message());

  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  std::string path = "/v2/models/" + model + "/infer";
  std::vector<double> http_us, inproc_us;
  // Interleaved, so both sides see the same machine noise.
  for (int i = 0; i < iterations + 50; ++i) {
    auto t0 = Clock::now();
    auto r = client.Post(path.c_str(), *body, "application/json");
    auto t1 = Clock::now();
    if (!r || r->status != 200) return Die("HTTP infer failed");
    auto out = (*loaded)->Infer(req->inputs);
    auto t2 = Clock::now();
    if (!out.ok()) return Die(out.status().message());
    if (i < 50) continue;  // warm-up
    http_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    inproc_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  double hp50 = Percentile(http_us, 0.5), hp99 = Percentile(http_us, 0.99);
  double ip50 = Percentile(inproc_us, 0.5), ip99 = Percentile(inproc_us, 0.99);
  std::printf("model=%s iterations=%d http_p50_us=%.1f http_p99_us=%.1f inproc_p50_us=%.1f inproc_p99_us=%.1f "
              "overhead_p50_us=%.1f\n",
              model.c_str(), iterations, hp50, hp99, ip50, ip99, hp50 - ip50);
  return 0;
}
