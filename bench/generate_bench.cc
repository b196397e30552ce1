// The in-process limit of generate: the daemon's own token loop
// (serving::Generator) on the cached build of a language model, loaded in
// this process with no runner and no HTTP, at a stated thread count. What
// generate_stream adds over it is the runner hand-off and HTTP.
//
//   aotid_generate_bench STORE MODEL THREADS TOKENS REPEATS PROMPT_IDS...
// prints, per repeat: prefill ms, first token ms, decode tokens/s, and the
// greedy token ids (so a caller can check they are the eager model's).
#include <cstdio>
#include <string>
#include <vector>

#include "base/fs.h"
#include "base/memory.h"
#include "bench/cached_model.h"
#include "runtime/torch_plugin.h"
#include "serving/generate.h"

int main(int argc, char** argv) {
  aotid::KeepFreedMemory(
      size_t{256}
      << 20);  // the in-process model keeps its freed activations, as a runner does (base/memory.h)
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s STORE MODEL THREADS TOKENS REPEATS PROMPT_IDS...\n", argv[0]);
    return 2;
  }
  if (auto p = aotid::runtime::LoadTorchPlugin(); !p.ok()) {
    std::fprintf(stderr, "%s\n", p.status().ToString().c_str());
    return 1;
  }
  auto found = aotid::bench::FindCachedBuild(argv[1], argv[2]);
  if (!found.ok() || found->entry.generate_path.empty()) {
    std::fprintf(stderr, "%s: %s\n", argv[2],
                 found.ok() ? "its build has no generate spec" : found.status().ToString().c_str());
    return 1;
  }
  found->options.threads = std::stoi(argv[3]);
  auto model = aotid::runtime::LoadCompiledModel(found->entry, found->options);
  auto text = aotid::fs::ReadFile(found->entry.generate_path);
  auto spec = text.ok() ? aotid::text::GenerateSpec::FromJson(*text) : text.status();
  if (!model.ok() || !spec.ok()) {
    std::fprintf(stderr, "%s\n", (!model.ok() ? model.status() : spec.status()).ToString().c_str());
    return 1;
  }
  std::shared_ptr<aotid::model::LoadedModel> loaded = std::move(model).value();
  auto gen = aotid::serving::Generator::Create(std::move(spec).value(), loaded->spec());
  if (!gen.ok()) {
    std::fprintf(stderr, "%s\n", gen.status().ToString().c_str());
    return 1;
  }
  aotid::serving::GenerateRequest req;
  req.has_ids = true;
  for (int i = 6; i < argc; ++i) req.ids.push_back(std::stoi(argv[i]));
  req.max_tokens = std::stoi(argv[4]);
  req.sampling.temperature = 0;
  req.ignore_eos = true;     // the same number of tokens every time
  req.cache_prompt = false;  // each run computes its prompt
  auto prompt = (*gen)->Prompt(req);
  if (!prompt.ok()) {
    std::fprintf(stderr, "%s\n", prompt.status().ToString().c_str());
    return 1;
  }
  std::printf("%-8s %10s %14s %12s %s\n", "threads", "prefill_ms", "first_token_ms", "decode_tok_s", "ids");
  for (int r = 0; r < std::stoi(argv[5]); ++r) {
    auto g = (*gen)->Run(loaded, req, *prompt, nullptr, nullptr);
    if (!g.ok()) {
      std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
      return 1;
    }
    std::string ids;
    for (int32_t id : g->ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    std::printf("%-8d %10.1f %14.1f %12.2f %s\n", found->options.threads, g->prefill_ms, g->first_token_ms,
                g->DecodeRate(), ids.c_str());
  }
  return 0;
}
