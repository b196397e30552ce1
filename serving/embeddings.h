// What OpenAI's embeddings route (/v1/embeddings) stands on, without the
// route: an embedding model's spec (the build's embed.json), the request
// body read, texts tokenized and padded into one batch, and the answer
// written.
//
// An embedding model (aotid_export.embed) is
//   embedding[B, dim] float32 = model(input_ids[B, T] int64, attention_mask[B, T] int64)
// with its pooling and normalisation inside: the server only tokenizes,
// pads and writes rows back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "model/tensor.h"
#include "text/tokenizer.h"

namespace aotid::serving {

// The build's embed.json: the package's "embed" section with the
// tokenizer.json under "tokenizer".
struct EmbedSpec {
  std::string ids_input = "input_ids";
  std::string mask_input = "attention_mask";
  std::string output = "embedding";
  int64_t dim = 0;
  std::string pooling;  // "mean", "cls" or "last_token": done in the graph, said in metadata
  bool normalize = true;
  int64_t max_seq_len = 0;        // a text's tokens, [CLS] and [SEP] included, are cut there
  bool truncatable_dims = false;  // requests may ask for fewer `dimensions` (Matryoshka models)
  int32_t pad_id = 0;
  std::shared_ptr<const text::Tokenizer> tokenizer;  // WordPiece

  // Errors name the field.
  static StatusOr<EmbedSpec> FromJson(std::string_view json);
};

// Whether the compiled model is the one the spec describes: its two inputs
// INT64 [batch, seq] with seq dynamic up to max_seq_len at least (a batch
// is padded to its longest row), its output FP32 [batch, dim]. Checked
// when the model loads, so a mismatch fails the load, not each request.
Status CheckEmbedModel(const EmbedSpec& spec, const model::ModelSpec& model);

// What an embedding model makes, as its metadata shows it: {"dimensions":
// a vector's size, "pooling", "normalized": unit length, "max_tokens": a
// text's tokens are cut there, "truncatable": requests may ask for fewer
// dimensions}.
nlohmann::json DescribeEmbed(const EmbedSpec& spec);

// An OpenAI embeddings request body. `input` is one text, a list of texts,
// one list of token ids or a list of them; token ids are a text's tokens,
// without the special tokens the model's tokenizer puts around them.
struct EmbeddingsRequest {
  std::string model;
  std::vector<std::string> texts;               // input as text (one or a list)
  std::vector<std::vector<int64_t>> token_ids;  // input as token ids, unchecked
  bool base64 = false;                          // encoding_format "base64"
  std::optional<int64_t> dimensions;
  std::string user;  // accepted, unused

  size_t size() const { return texts.empty() ? token_ids.size() : texts.size(); }
};

// The most inputs one request may hold (OpenAI's own limit).
inline constexpr size_t kMaxEmbeddingInputs = 2048;

// A request's problem: the message and the body field it is about
// ("input", "encoding_format", "dimensions", "model", "user"; "" for the
// body as a whole), as OpenAI's error shape names it in "param".
struct EmbeddingsError {
  std::string message;
  std::string param;
};

// Reads the body. An unknown field is refused naming it, as OpenAI's server
// refuses it; so is a known one of the wrong type or value.
StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(std::string_view body, EmbeddingsError* error);

// Each input's ids as the model takes them: text tokenized with the
// model's tokenizer (special tokens in a text are read as such, as the
// reference tokenizer reads them), token ids checked against the
// vocabulary, both cut to leave room for the special tokens within
// max_seq_len and then put between them ([CLS] ... [SEP]). Checks
// `dimensions` against the model. Errors name the field.
StatusOr<std::vector<std::vector<int32_t>>> TokenizeEmbeddingInputs(const EmbeddingsRequest& request,
                                                                    const EmbedSpec& spec,
                                                                    EmbeddingsError* error);

// Rows padded on the right to the longest, with the attention mask 1 over
// each row's own tokens and 0 over its padding: row-major [rows, seq].
struct PaddedBatch {
  int64_t rows = 0;
  int64_t seq = 0;
  std::vector<int64_t> input_ids;
  std::vector<int64_t> attention_mask;
  int64_t tokens = 0;  // the rows' own tokens, all together (usage.prompt_tokens)
};
PaddedBatch PadBatch(const std::vector<std::vector<int32_t>>& rows, int32_t pad_id);

// The answer: {"object": "list", "data": [{"object": "embedding", "index":
// i, "embedding": [...] or "base64"}], "model", "usage": {"prompt_tokens",
// "total_tokens"}}, one row per input in order. `vectors` is [rows, dim]
// row-major; with `dimensions` below dim each row keeps its first
// `dimensions` values, scaled back to unit length when the model
// normalizes. base64 is of the floats' little-endian bytes. Internal when
// a value is not finite (JSON has no NaN).
StatusOr<std::string> EmbeddingsResponseJson(const float* vectors, int64_t rows, int64_t dim,
                                             const EmbeddingsRequest& request, const EmbedSpec& spec,
                                             std::string_view model_name, int64_t prompt_tokens);

// Standard base64 (RFC 4648, with padding).
std::string Base64(std::string_view bytes);

}  // namespace aotid::serving
