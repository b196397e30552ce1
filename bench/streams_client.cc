// Several streams at once for bench/generate.sh ("Several streams"): K
// threads, each with its own connection, send their prompt together and
// stamp every token event as it arrives, against aotid's generate_stream or
// llama.cpp's llama-server (/completion, streamed).
//
//   aotid_streams_client aotid|llama PORT MODEL TOKENS REPEATS K PROMPTS_FILE
// PROMPTS_FILE holds one prompt a line (its token ids, by spaces); stream i
// sends line i. For the repeat with the highest total rate it prints
//   total_tokens_per_s median_first_ms rate_1,...,rate_K
// (total: every stream's tokens over the time from the first request sent
// to the last token; rate_i: stream i's tokens/s between its first and last
// token; first: from a stream's request to its first token), then one line
// a stream with its token ids. A refused stream ends it with status 1 and
// the server's error on stderr.
//
//   aotid_streams_client aotid|llama PORT MODEL TOKENS REPEATS 1 PROMPTS_FILE cold|warm
// One stream at a time, for prompt reuse (docs/BENCHMARKS.md, "A reused
// system prompt"): the file's last line is sent first, then repeat r sends
// line r modulo the others, so that no request repeats the one before it
// and only what the lines share (a system prompt) can be reused. `warm`
// asks the server to reuse a slot's cache (cache_prompt), `cold` not. It
// prints
//   median_first_ms median_reused_tokens
// (reused: the server's count, aotid's usage.cached_tokens, llama-server's
// tokens_evaluated less its timings.prompt_n).
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <latch>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

struct Stream {
  Clock::time_point sent;
  std::vector<Clock::time_point> stamps;  // one a token
  std::vector<int64_t> ids;
  int64_t reused = -1;  // prompt tokens the server took from a cache, where it says
  std::string error;    // empty when the stream ran to its end
};

// How many tokens an event brings, their ids appended to `ids`. llama-server
// holds back a token that ends inside a UTF-8 character and sends it with
// the next event, which names only its own id: such a token counts where
// it arrives, its id -1. aotid sends one event a token and all the ids with
// its final event.
size_t TokensOf(bool llama, const json& event, Stream* s, std::vector<int64_t>* ids) {
  if (llama) {
    // The prompt's tokens, less those it computed.
    if (event.value("stop", false) && event.contains("tokens_evaluated") && event.contains("timings")) {
      s->reused =
          event.value("tokens_evaluated", int64_t{0}) - event["timings"].value("prompt_n", int64_t{0});
    }
    auto predicted = static_cast<size_t>(event.value("tokens_predicted", int64_t{0}));
    if (predicted <= ids->size()) return 0;
    size_t n = predicted - ids->size();
    std::vector<int64_t> named = event.value("tokens", std::vector<int64_t>{});
    ids->resize(predicted - std::min(n, named.size()), -1);
    ids->insert(ids->end(), named.end() - static_cast<ptrdiff_t>(std::min(n, named.size())), named.end());
    return n;
  }
  if (event.contains("finish_reason")) {
    s->ids = event.value("token_ids", std::vector<int64_t>{});
    if (event.contains("usage")) s->reused = event["usage"].value("cached_tokens", int64_t{-1});
    return 0;
  }
  return 1;
}

// The error a refused request's body names, or the body itself.
std::string ErrorOf(int status, const std::string& body) {
  json j = json::parse(body, nullptr, false);
  std::string what = body;
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    what = e.is_string() ? e.get<std::string>() : e.is_object() ? e.value("message", e.dump()) : e.dump();
  }
  return "status " + std::to_string(status) + ": " + what;
}

void Run(bool llama, int port, const std::string& path, const json& body, std::latch* go, Stream* s) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(600, 0);
  std::string pending, raw;
  std::vector<int64_t> ids;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    auto now = Clock::now();
    raw.append(data, n);
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      if (pending.compare(0, 6, "data: ") != 0) continue;
      json event = json::parse(pending.substr(6, end - 6), nullptr, false);
      if (event.is_discarded()) continue;
      s->stamps.insert(s->stamps.end(), TokensOf(llama, event, s, &ids), now);
    }
    return true;
  };
  go->arrive_and_wait();
  s->sent = Clock::now();
  auto res = client.send(req);
  if (!res) {
    s->error = httplib::to_string(res.error());
  } else if (res->status != 200) {
    s->error = ErrorOf(res->status, raw.empty() ? res->body : raw);
  } else if (s->stamps.size() < 2) {
    s->error = "the stream had " + std::to_string(s->stamps.size()) + " token events";
  } else if (llama) {
    s->ids = std::move(ids);
  }
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

struct Result {
  double total_per_s = 0, median_first_ms = 0;
  std::vector<double> rates;
  std::vector<std::vector<int64_t>> ids;
};

Result Measure(const std::vector<Stream>& streams) {
  Result r;
  Clock::time_point begin = streams[0].sent, end = streams[0].stamps.back();
  size_t tokens = 0;
  std::vector<double> firsts;
  for (const Stream& s : streams) {
    begin = std::min(begin, s.sent);
    end = std::max(end, s.stamps.back());
    tokens += s.stamps.size();
    firsts.push_back(Seconds(s.stamps.front() - s.sent) * 1000);
    r.rates.push_back(static_cast<double>(s.stamps.size() - 1) / Seconds(s.stamps.back() - s.stamps.front()));
    r.ids.push_back(s.ids);
  }
  r.total_per_s = static_cast<double>(tokens) / Seconds(end - begin);
  r.median_first_ms = Median(std::move(firsts));
  return r;
}

std::vector<std::vector<int64_t>> ReadPrompts(const char* path) {
  std::vector<std::vector<int64_t>> prompts;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<int64_t> ids;
    for (int64_t id; words >> id;) ids.push_back(id);
    if (!ids.empty()) prompts.push_back(std::move(ids));
  }
  return prompts;
}

// Greedy (llama-server: top_k 1), one event a token with its id. Without
// `reuse` the prompt is evaluated anew each repeat, on both servers.
json BodyFor(bool llama, const std::vector<int64_t>& prompt, int tokens, bool reuse = false) {
  if (llama) {
    return {{"prompt", prompt}, {"n_predict", tokens}, {"stream", true},        {"temperature", 0},
            {"top_k", 1},       {"ignore_eos", true},  {"cache_prompt", reuse}, {"return_tokens", true}};
  }
  return {{"input_ids", prompt},
          {"parameters",
           {{"temperature", 0},
            {"max_tokens", tokens},
            {"ignore_eos", true},
            {"return_token_ids", true},
            {"cache_prompt", reuse}}}};
}

// The reuse mode (see the top): one stream at a time.
int Reuse(bool llama, int port, const std::string& path, const std::vector<std::vector<int64_t>>& prompts,
          int tokens, int repeats, bool warm) {
  if (prompts.size() < 2) {
    std::fprintf(stderr, "reuse needs at least 2 prompts, not %zu\n", prompts.size());
    return 2;
  }
  std::vector<double> firsts, reused;
  for (int r = -1; r < repeats; ++r) {
    const auto& prompt = r < 0 ? prompts.back() : prompts[static_cast<size_t>(r) % (prompts.size() - 1)];
    std::latch go(1);
    Stream s;
    Run(llama, port, path, BodyFor(llama, prompt, tokens, warm), &go, &s);
    if (!s.error.empty()) {
      std::fprintf(stderr, "%s\n", s.error.c_str());
      return 1;
    }
    if (r < 0) continue;  // it fills a slot
    firsts.push_back(Seconds(s.stamps.front() - s.sent) * 1000);
    reused.push_back(static_cast<double>(s.reused));
  }
  std::printf("%.1f %.0f\n", Median(firsts), Median(reused));
  return 0;
}

std::string Joined(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 9 ? argv[8] : "";
  if ((argc != 8 && argc != 9) || (std::string(argv[1]) != "aotid" && std::string(argv[1]) != "llama") ||
      (argc == 9 && ((mode != "cold" && mode != "warm") || std::string(argv[6]) != "1"))) {
    std::fprintf(stderr,
                 "usage: %s aotid|llama PORT MODEL TOKENS REPEATS K PROMPTS_FILE\n"
                 "       %s aotid|llama PORT MODEL TOKENS REPEATS 1 PROMPTS_FILE cold|warm\n",
                 argv[0], argv[0]);
    return 2;
  }
  const bool llama = std::string(argv[1]) == "llama";
  const int port = std::stoi(argv[2]), tokens = std::stoi(argv[4]), repeats = std::stoi(argv[5]);
  const int k = std::stoi(argv[6]);
  const std::string model = argv[3];
  const auto prompts = ReadPrompts(argv[7]);
  if (k < 1 || static_cast<size_t>(k) > prompts.size()) {
    std::fprintf(stderr, "%s holds %zu prompts, not the %d streams asked\n", argv[7], prompts.size(), k);
    return 2;
  }
  const std::string path = llama ? "/completion" : "/v2/models/" + model + "/generate_stream";
  if (!mode.empty()) return Reuse(llama, port, path, prompts, tokens, repeats, mode == "warm");
  Result best;
  for (int r = 0; r < repeats; ++r) {
    std::vector<Stream> streams(k);
    std::latch go(k);
    std::vector<std::thread> threads;
    for (int i = 0; i < k; ++i) {
      threads.emplace_back(Run, llama, port, path, BodyFor(llama, prompts[i], tokens), &go, &streams[i]);
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < k; ++i) {
      if (!streams[i].error.empty()) {
        std::fprintf(stderr, "%s\n", streams[i].error.c_str());
        return 1;
      }
    }
    Result run = Measure(streams);
    if (run.total_per_s > best.total_per_s) best = std::move(run);
  }
  std::printf("%.2f %.1f ", best.total_per_s, best.median_first_ms);
  for (size_t i = 0; i < best.rates.size(); ++i) std::printf("%s%.1f", i ? "," : "", best.rates[i]);
  std::printf("\n");
  for (const auto& ids : best.ids) std::printf("%s\n", Joined(ids).c_str());
  return 0;
}
