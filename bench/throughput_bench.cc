// Throughput at a given concurrency: C keep-alive HTTP clients against the
// daemon for T seconds, then C threads calling the same build in-process
// (loaded with the same runner count) for T seconds, then C threads calling
// it in a runner process (runner::RunnerModel, R slots, as the daemon
// loads it) for T seconds, in one run.
//
//   aotid_throughput_bench --store DIR --model NAME --port PORT --request FILE
//                          --concurrency C [--seconds T] [--runners R] [--aotid PATH]
//
// PATH is the aotid binary the runner runs (default: ../aotid from this
// benchmark's folder).
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "base/fs.h"
#include "base/memory.h"
#include "bench/cached_model.h"
#include "serving/tensor_codec.h"

namespace {

using Clock = std::chrono::steady_clock;

int Die(const std::string& msg) {
  std::fprintf(stderr, "aotid_throughput_bench: %s\n", msg.c_str());
  return 1;
}

// Runs `call` on `threads` threads for `seconds`; returns (ok calls, failed calls).
template <typename F>
std::pair<int64_t, int64_t> Hammer(int threads, double seconds, F make_call) {
  std::atomic<int64_t> ok{0}, failed{0};
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      auto call = make_call();
      while (Clock::now() < deadline) (call() ? ok : failed)++;
    });
  }
  for (auto& t : pool) t.join();
  return {ok.load(), failed.load()};
}

}  // namespace

int main(int argc, char** argv) {
  aotid::KeepFreedMemory(
      size_t{256}
      << 20);  // the in-process model keeps its freed activations, as a runner does (base/memory.h)
  std::string store_dir, model, request_file, aotid = aotid::bench::DefaultAotid();
  int port = 0, concurrency = 1, runners = 1;
  double seconds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    // clang-format off
    if (k == "--store") store_dir = v;
    else if (k == "--model") model = v;
    else if (k == "--port") port = std::stoi(v);
    else if (k == "--request") request_file = v;
    else if (k == "--concurrency") concurrency = std::stoi(v);
    else if (k == "--seconds") seconds = std::stod(v);
    else if (k == "--runners") runners = std::stoi(v);
    else if (k == "--aotid") aotid = v;
    else return Die("unknown flag " + k);
    // clang-format on
  }
  if (store_dir.empty() || model.empty() || port == 0 || request_file.empty()) {
    return Die(
        "usage: --store DIR --model NAME --port PORT --request FILE --concurrency C [--seconds T] "
        "[--runners R] [--aotid PATH]");
  }
  auto body = aotid::fs::ReadFile(request_file);
  if (!body.ok()) return Die(body.status().message());
  std::string path = "/v2/models/" + model + "/infer";

  auto [http_ok, http_failed] = Hammer(concurrency, seconds, [&] {
    auto client = std::make_shared<httplib::Client>("127.0.0.1", port);
    client->set_keep_alive(true);
    client->set_tcp_nodelay(true);
    client->set_read_timeout(60, 0);
    return [client, &path, &body] {
      auto r = client->Post(path.c_str(), *body, "application/json");
      return r && r->status == 200;
    };
  });

  auto loaded = aotid::bench::LoadCachedModel(store_dir, model, runners);
  if (!loaded.ok()) return Die(loaded.status().message());
  auto req = aotid::serving::DecodeInferRequest(*body, (*loaded)->spec());
  if (!req.ok()) return Die(req.status().message());
  aotid::model::LoadedModel* m = loaded->get();
  auto [in_ok, in_failed] =
      Hammer(concurrency, seconds, [&] { return [m, &req] { return m->Infer(req->inputs, {}).ok(); }; });

  auto scratch = aotid::fs::MakeTempDir("/tmp", "aotid-bench-");
  if (!scratch.ok()) return Die(scratch.status().message());
  aotid::runner::RunnerOptions ropts;
  ropts.self_exe = aotid;
  ropts.scratch_root = *scratch;
  auto runner = aotid::bench::StartCachedRunner(store_dir, model, ropts, runners);
  if (!runner.ok()) {
    (void)aotid::fs::RemoveAll(*scratch);
    return Die(runner.status().message());
  }
  aotid::model::LoadedModel* r = runner->get();
  auto [runner_ok, runner_failed] =
      Hammer(concurrency, seconds, [&] { return [r, &req] { return r->Infer(req->inputs, {}).ok(); }; });
  runner->reset();  // stops the runner before its scratch goes
  (void)aotid::fs::RemoveAll(*scratch);

  int64_t rows = req->inputs[0].shape.empty() ? 1 : req->inputs[0].shape[0];
  double http_rps = http_ok / seconds, in_rps = in_ok / seconds, runner_rps = runner_ok / seconds;
  std::printf(
      "model=%s concurrency=%d seconds=%.0f rows_per_request=%lld http_rps=%.0f http_failed=%lld "
      "inproc_rps=%.0f inproc_failed=%lld http_over_inproc=%.2f runner_rps=%.0f runner_failed=%lld "
      "runner_over_inproc=%.2f\n",
      model.c_str(), concurrency, seconds, static_cast<long long>(rows), http_rps,
      static_cast<long long>(http_failed), in_rps, static_cast<long long>(in_failed), http_rps / in_rps,
      runner_rps, static_cast<long long>(runner_failed), runner_rps / in_rps);
  return 0;
}
