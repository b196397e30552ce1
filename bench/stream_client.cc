// A generate_stream client for bench/generate.sh: the client's view of a
// stream, stamped in C++ as each event arrives (a Python client stamping on
// the same two cores as the model took a share of them at one thread).
//
//   aotid_stream_client PORT MODEL TOKENS REPEATS PROMPT_IDS...
// prints one line for the repeat that decoded fastest: time to the first
// token event (ms), decode tokens/s between the first and the last token
// event, the token ids, and the daemon's own decode tokens/s (its final
// event's timings).
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

struct Run {
  double first_ms = 0, tokens_per_s = 0, daemon_tokens_per_s = 0;
  std::vector<int64_t> ids;
};

bool StreamOnce(httplib::Client& client, const std::string& model, const json& body, Run* out,
                std::string* error) {
  std::vector<Clock::time_point> stamps;
  json last;
  std::string pending;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v2/models/" + model + "/generate_stream";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    auto now = Clock::now();
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      if (pending.compare(0, 6, "data: ") != 0) continue;
      json event = json::parse(pending.substr(6, end - 6), nullptr, false);
      if (event.is_discarded()) continue;
      if (event.contains("finish_reason")) {
        last = std::move(event);
      } else {
        stamps.push_back(now);
      }
    }
    return true;
  };
  auto start = Clock::now();
  auto res = client.send(req);
  if (!res || res->status != 200) {
    *error = res ? "status " + std::to_string(res->status) : httplib::to_string(res.error());
    return false;
  }
  if (stamps.size() < 2 || !last.contains("token_ids")) {
    *error = "the stream had " + std::to_string(stamps.size()) + " token events and no final one with ids";
    return false;
  }
  double decode_s = std::chrono::duration<double>(stamps.back() - stamps.front()).count();
  out->first_ms = std::chrono::duration<double, std::milli>(stamps.front() - start).count();
  out->ids = last["token_ids"].get<std::vector<int64_t>>();
  out->tokens_per_s = static_cast<double>(last["usage"]["completion_tokens"].get<int64_t>() - 1) / decode_s;
  out->daemon_tokens_per_s = last["timings"]["decode_tokens_per_s"].get<double>();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s PORT MODEL TOKENS REPEATS PROMPT_IDS...\n", argv[0]);
    return 2;
  }
  std::string model = argv[2];
  int tokens = std::stoi(argv[3]), repeats = std::stoi(argv[4]);
  std::vector<int64_t> prompt;
  for (int i = 5; i < argc; ++i) prompt.push_back(std::stoll(argv[i]));
  json body = {
      {"input_ids", prompt},
      {"parameters",
       {{"temperature", 0}, {"max_tokens", tokens}, {"ignore_eos", true}, {"return_token_ids", true}}}};
  httplib::Client client("127.0.0.1", std::stoi(argv[1]));
  client.set_read_timeout(300, 0);
  Run best;
  for (int r = 0; r < repeats; ++r) {
    Run run;
    std::string error;
    if (!StreamOnce(client, model, body, &run, &error)) {
      std::fprintf(stderr, "%s: %s\n", model.c_str(), error.c_str());
      return 1;
    }
    if (run.tokens_per_s > best.tokens_per_s) best = std::move(run);
  }
  std::string ids;
  for (int64_t id : best.ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  std::printf("%.1f %.2f %s %.2f\n", best.first_ms, best.tokens_per_s, ids.c_str(), best.daemon_tokens_per_s);
  return 0;
}
