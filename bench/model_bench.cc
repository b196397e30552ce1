// In-process figures for cached builds: how long aotid takes to load a
// build from the cache (median of repeated loads of model.so in place, the
// torch plugin already loaded; and with the manifest check before it) and
// the median latency of one run on a recorded input, with the thread count
// the daemon would use for one runner.
//
//   aotid_model_bench STORE CASES_JSON MODEL[=CASES_KEY]...
// prints one line per model: name, load median ms, infer median us, threads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/fs.h"
#include "base/memory.h"
#include "bench/cached_model.h"
#include "platform/hardware.h"
#include "runtime/torch_plugin.h"
#include "serving/tensor_codec.h"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  aotid::KeepFreedMemory(
      size_t{256}
      << 20);  // the in-process model keeps its freed activations, as a runner does (base/memory.h)
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s STORE CASES_JSON MODEL[=CASES_KEY]...\n", argv[0]);
    return 2;
  }
  std::string store = argv[1];
  auto cases_text = aotid::fs::ReadFile(argv[2]);
  if (!cases_text.ok()) return 1;
  auto cases = nlohmann::json::parse(*cases_text);
  if (auto p = aotid::runtime::LoadTorchPlugin(); !p.ok()) {  // libtorch's start-up is not a model load
    std::fprintf(stderr, "%s\n", p.status().ToString().c_str());
    return 1;
  }
  std::printf("%-10s %15s %16s %16s %8s\n", "model", "first_load_ms", "reload_ms_p50", "infer_us_p50",
              "threads");
  for (int i = 3; i < argc; ++i) {
    std::string arg = argv[i];
    std::string model = arg.substr(0, arg.find('='));
    std::string key = arg.find('=') == std::string::npos ? model : arg.substr(arg.find('=') + 1);
    auto found = aotid::bench::FindCachedBuild(store, model);
    if (!found.ok()) {
      std::fprintf(stderr, "%s: %s\n", model.c_str(), found.status().ToString().c_str());
      return 1;
    }
    // The first load in this process: manifest check, dlopen of model.so in
    // place, model container and constants. Later loads of the same file
    // reuse the mapping and only build the container.
    auto t_first = std::chrono::steady_clock::now();
    aotid::compile::BuildCache first_cache(found->cache_root);
    std::string manifest = *aotid::fs::ReadFile(found->entry.dir + "/manifest.json");
    auto mkey = nlohmann::json::parse(manifest);
    auto first_entry = first_cache.Lookup(
        {mkey["artifact"], mkey["package_model"], mkey["device"], mkey["fingerprint"], mkey["options"]});
    auto first = aotid::runtime::LoadCompiledModel(*first_entry, found->options);
    double first_ms = Since(t_first) / 1000;
    if (!first.ok()) return 1;
    std::vector<double> loads;
    for (int k = 0; k < 10; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      auto m = aotid::runtime::LoadCompiledModel(found->entry, found->options);
      loads.push_back(Since(t0) / 1000);
      if (!m.ok()) {
        std::fprintf(stderr, "%s: %s\n", model.c_str(), m.status().ToString().c_str());
        return 1;
      }
    }
    auto loaded = aotid::bench::LoadCachedModel(store, model);
    nlohmann::json body{{"inputs", cases[key][0]["inputs"]}};
    auto req = aotid::serving::DecodeInferRequest(body.dump(), (*loaded)->spec());
    if (!req.ok()) {
      std::fprintf(stderr, "%s: %s\n", model.c_str(), req.status().ToString().c_str());
      return 1;
    }
    std::vector<double> runs;
    for (int k = 0; k < 320; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      auto out = (*loaded)->Infer(req->inputs, {});
      if (k >= 20) runs.push_back(Since(t0));  // after warm-up
      if (!out.ok()) return 1;
    }
    std::printf("%-10s %15.2f %16.2f %16.1f %8d\n", model.c_str(), first_ms, Median(loads), Median(runs),
                found->options.threads);
  }
  return 0;
}
