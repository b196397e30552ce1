// The generate spec the fuzz targets parse requests against: SmolLM2's
// tokenizer (the fixture in tests/text) with a chat template. Needs
// AOTID_SOURCE_DIR defined; aborts when the fixture cannot be read.
#pragma once

#include <cstdlib>
#include <string>

#include "base/fs.h"
#include "text/generation.h"

namespace aotid::fuzz {

inline const text::GenerateSpec& GenerateSpecForFuzzing() {
  static const auto* spec = [] {
    auto tok = fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/smollm2_tokenizer.json");
    if (!tok.ok()) std::abort();
    std::string g =
        R"({"kind":"causal_lm","max_seq_len":64,"max_prefill":64,"eos_token_ids":[2],)"
        R"("chat":{"user":{"prefix":"<|im_start|>user\n","suffix":"<|im_end|>\n"}},"tokenizer":)" +
        *tok + "}";
    auto s = text::GenerateSpec::FromJson(g);
    if (!s.ok()) std::abort();
    return new text::GenerateSpec(std::move(s).value());
  }();
  return *spec;
}

}  // namespace aotid::fuzz
