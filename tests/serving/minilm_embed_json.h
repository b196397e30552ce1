// all-MiniLM-L6-v2's embed.json, as the compile worker writes it (the
// package's embed section with the tokenizer.json inside), for the tests of
// the embeddings code; a test changes the fields it is about.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "base/fs.h"

namespace aotid::testing {

inline nlohmann::json MinilmEmbedJson() {
  auto tok = fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/minilm_tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return {{"kind", "sentence_embedding"},
          {"input_ids", "input_ids"},
          {"attention_mask", "attention_mask"},
          {"output", "embedding"},
          {"dim", 384},
          {"pooling", "mean"},
          {"normalize", true},
          {"max_seq_len", 256},
          {"truncatable_dims", false},
          {"special_tokens", {{"cls", 101}, {"sep", 102}, {"pad", 0}, {"unk", 100}}},
          {"tokenizer", nlohmann::json::parse(tok.ok() ? *tok : "{}")}};
}

}  // namespace aotid::testing
