#include "serving/embeddings.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/json.h"

namespace aotid::serving {

using nlohmann::json;

namespace {

Status SpecError(const std::string& what) { return InvalidArgument("embed.json " + what); }

StatusOr<int64_t> SpecInt(const json& j, const char* name, int64_t lo, int64_t hi) {
  if (!j.contains(name) || !j[name].is_number_integer()) {
    return SpecError(std::string("has no integer \"") + name + "\"");
  }
  int64_t v = j[name].get<int64_t>();
  if (v < lo || v > hi) {
    return SpecError(std::string("\"") + name + "\" is " + std::to_string(v) + ", outside " +
                     std::to_string(lo) + ".." + std::to_string(hi));
  }
  return v;
}

StatusOr<std::string> SpecString(const json& j, const char* name, std::string fallback) {
  if (!j.contains(name)) return fallback;
  if (!j[name].is_string()) return SpecError(std::string("\"") + name + "\" is not a string");
  return j[name].get<std::string>();
}

StatusOr<bool> SpecBool(const json& j, const char* name, bool fallback) {
  if (!j.contains(name)) return fallback;
  if (!j[name].is_boolean()) return SpecError(std::string("\"") + name + "\" is not true or false");
  return j[name].get<bool>();
}

template <typename T>
StatusOr<T> Refuse(EmbeddingsError* error, std::string param, std::string message) {
  if (error != nullptr) *error = {message, std::move(param)};
  return InvalidArgument(std::move(message));
}

// A token id list: every element an integer that fits int64. The range
// check comes with the model (TokenizeEmbeddingInputs), whose vocabulary
// says what an id out of it is out of.
bool ReadIds(const json& list, std::vector<int64_t>* out) {
  constexpr auto kMost = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  out->reserve(list.size());
  for (const json& v : list) {
    if (!v.is_number_integer()) return false;
    if (v.is_number_unsigned() && v.get<uint64_t>() > kMost) return false;
    out->push_back(v.get<int64_t>());
  }
  return true;
}

// The shortest text that reads back as the same float.
void AppendFloat(std::string* out, float v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out->append(buf, ec == std::errc() ? end : buf);
}

}  // namespace

StatusOr<EmbedSpec> EmbedSpec::FromJson(std::string_view text) {
  return ReadJsonSafely<EmbedSpec>("embed.json", [&]() -> StatusOr<EmbedSpec> {
    json j = ParseJsonOrDiscarded(text);
    if (j.is_discarded() || !j.is_object()) return SpecError("is not a JSON object");
    if (j.value("kind", "") != "sentence_embedding") {
      return SpecError("kind is not \"sentence_embedding\", the one aotid runs");
    }
    EmbedSpec s;
    ASSIGN_OR_RETURN(s.ids_input, SpecString(j, "input_ids", s.ids_input));
    ASSIGN_OR_RETURN(s.mask_input, SpecString(j, "attention_mask", s.mask_input));
    ASSIGN_OR_RETURN(s.output, SpecString(j, "output", s.output));
    ASSIGN_OR_RETURN(s.dim, SpecInt(j, "dim", 1, int64_t{1} << 20));
    ASSIGN_OR_RETURN(s.max_seq_len, SpecInt(j, "max_seq_len", 3, int64_t{1} << 24));
    ASSIGN_OR_RETURN(s.pooling, SpecString(j, "pooling", ""));
    if (s.pooling != "mean" && s.pooling != "cls" && s.pooling != "last_token") {
      return SpecError("\"pooling\" is \"" + s.pooling + "\", not mean, cls or last_token");
    }
    ASSIGN_OR_RETURN(s.normalize, SpecBool(j, "normalize", true));
    ASSIGN_OR_RETURN(s.truncatable_dims, SpecBool(j, "truncatable_dims", false));
    if (!j.contains("tokenizer") || !j["tokenizer"].is_object()) return SpecError("has no tokenizer");
    auto tok = text::Tokenizer::FromJson(j["tokenizer"].dump());
    if (!tok.ok()) return tok.status().WithContext("embed.json tokenizer");
    if ((*tok)->kind() != text::Tokenizer::Kind::kWordPiece) {
      return SpecError("tokenizer is not WordPiece, the kind aotid runs for embedding models");
    }
    s.tokenizer = std::shared_ptr<const text::Tokenizer>(std::move(tok).value());
    const int64_t vocab = s.tokenizer->vocab_size();
    if (j.contains("special_tokens")) {
      const json& sp = j["special_tokens"];
      if (!sp.is_object()) return SpecError("\"special_tokens\" is not an object");
      if (sp.contains("pad")) {
        ASSIGN_OR_RETURN(int64_t pad, SpecInt(sp, "pad", 0, vocab - 1));
        s.pad_id = static_cast<int32_t>(pad);
      }
    }
    if (s.tokenizer->WithSpecialTokens({}).size() + 1 > static_cast<size_t>(s.max_seq_len)) {
      return SpecError("\"max_seq_len\" leaves no room for a token between the special tokens");
    }
    return s;
  });
}

json DescribeEmbed(const EmbedSpec& spec) {
  return {{"dimensions", spec.dim},
          {"pooling", spec.pooling},
          {"normalized", spec.normalize},
          {"max_tokens", spec.max_seq_len},
          {"truncatable", spec.truncatable_dims}};
}

Status CheckEmbedModel(const EmbedSpec& spec, const model::ModelSpec& model) {
  const std::string what = "the model's embed spec does not fit the compiled model: ";
  auto find = [](const std::vector<model::TensorSpec>& v,
                 const std::string& name) -> const model::TensorSpec* {
    for (const auto& t : v) {
      if (t.name == name) return &t;
    }
    return nullptr;
  };
  if (model.inputs.size() != 2) {
    return InvalidArgument(what + "it takes " + std::to_string(model.inputs.size()) +
                           " inputs, an embedding model takes input_ids and attention_mask");
  }
  for (const std::string* name : {&spec.ids_input, &spec.mask_input}) {
    const model::TensorSpec* t = find(model.inputs, *name);
    if (t == nullptr) return InvalidArgument(what + "it has no input \"" + *name + "\"");
    if (t->dtype != model::DType::kInt64 || t->shape.size() != 2) {
      return InvalidArgument(what + "\"" + *name + "\" must be INT64 [batch, seq]; it is " +
                             std::string(model::DTypeName(t->dtype)) + " " + model::ShapeString(t->shape));
    }
    if (t->shape[1] != -1) {
      return InvalidArgument(what + "\"" + *name + "\" has a fixed seq of " + std::to_string(t->shape[1]) +
                             "; a batch is padded to its longest text, so seq must be dynamic");
    }
    if (t->dims.size() == 2 && t->dims[1] && t->dims[1]->max < spec.max_seq_len) {
      return InvalidArgument(what + "\"" + *name + "\" takes up to " + std::to_string(t->dims[1]->max) +
                             " tokens, fewer than max_seq_len " + std::to_string(spec.max_seq_len));
    }
  }
  const model::TensorSpec* out = find(model.outputs, spec.output);
  if (out == nullptr) return InvalidArgument(what + "it has no output \"" + spec.output + "\"");
  if (out->dtype != model::DType::kFloat32 || out->shape.size() != 2 || out->shape[1] != spec.dim) {
    return InvalidArgument(what + "\"" + spec.output + "\" must be FP32 [batch, " + std::to_string(spec.dim) +
                           "]; it is " + std::string(model::DTypeName(out->dtype)) + " " +
                           model::ShapeString(out->shape));
  }
  return Status::OK();
}

StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(std::string_view body, EmbeddingsError* error) {
  using R = EmbeddingsRequest;
  auto parsed = ParseJson(body, "the request body", RequestJsonLimits(body.size()));
  if (!parsed.ok()) return Refuse<R>(error, "", parsed.status().message());
  return ReadJsonSafely<R>("the request body", [&]() -> StatusOr<R> {
    const json& j = *parsed;
    if (!j.is_object()) return Refuse<R>(error, "", "the request body is not a JSON object");
    // A parameter aotid does not know is refused, never ignored (as the
    // chat routes do): a misspelt "dimension" would otherwise go unseen.
    for (const auto& [key, value] : j.items()) {
      if (key != "model" && key != "input" && key != "encoding_format" && key != "dimensions" &&
          key != "user") {
        return Refuse<R>(error, key,
                         "\"" + key +
                             "\" is not a parameter of /v1/embeddings (model, input, encoding_format, "
                             "dimensions, user)");
      }
    }
    R r;
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty()) {
      return Refuse<R>(error, "model", "\"model\" must be a served model's name (a non-empty string)");
    }
    r.model = j["model"].get<std::string>();
    if (!j.contains("input")) return Refuse<R>(error, "input", "\"input\" is missing: give a text or a list");
    const json& in = j["input"];
    constexpr char kShape[] =
        "\"input\" must be a string, a list of strings, a list of token ids or a list of such lists";
    if (in.is_string()) {
      r.texts.push_back(in.get<std::string>());
    } else if (in.is_array()) {
      if (in.empty()) return Refuse<R>(error, "input", "\"input\" is an empty list");
      if (in.size() > kMaxEmbeddingInputs && !in[0].is_number()) {
        return Refuse<R>(error, "input",
                         "\"input\" holds " + std::to_string(in.size()) + " inputs; at most " +
                             std::to_string(kMaxEmbeddingInputs));
      }
      if (in[0].is_string()) {
        for (size_t i = 0; i < in.size(); ++i) {
          if (!in[i].is_string()) {
            return Refuse<R>(
                error, "input",
                "\"input\"[" + std::to_string(i) + "] is not a string, as the items before it are");
          }
          r.texts.push_back(in[i].get<std::string>());
        }
      } else if (in[0].is_number()) {
        r.token_ids.emplace_back();
        if (!ReadIds(in, &r.token_ids.back())) {
          return Refuse<R>(error, "input", "\"input\" is a list of token ids with an item that is not one");
        }
      } else if (in[0].is_array()) {
        for (size_t i = 0; i < in.size(); ++i) {
          r.token_ids.emplace_back();
          if (!in[i].is_array() || !ReadIds(in[i], &r.token_ids.back())) {
            return Refuse<R>(error, "input",
                             "\"input\"[" + std::to_string(i) + "] is not a list of token ids");
          }
          if (r.token_ids.back().empty()) {
            return Refuse<R>(error, "input",
                             "\"input\"[" + std::to_string(i) + "] is an empty list of tokens");
          }
        }
      } else {
        return Refuse<R>(error, "input", kShape);
      }
    } else {
      return Refuse<R>(error, "input", kShape);
    }
    for (size_t i = 0; i < r.texts.size(); ++i) {
      if (r.texts[i].empty()) {
        return Refuse<R>(error, "input",
                         r.texts.size() == 1 && in.is_string()
                             ? std::string("\"input\" is an empty string")
                             : "\"input\"[" + std::to_string(i) + "] is an empty string");
      }
      if (!text::ValidUtf8(r.texts[i])) {
        return Refuse<R>(error, "input", "\"input\" holds text that is not valid UTF-8");
      }
    }
    if (j.contains("encoding_format") && !j["encoding_format"].is_null()) {
      const json& f = j["encoding_format"];
      const std::string v = f.is_string() ? f.get<std::string>() : "";
      if (v != "float" && v != "base64") {
        return Refuse<R>(error, "encoding_format",
                         "\"encoding_format\" must be \"float\" or \"base64\", not " + f.dump());
      }
      r.base64 = v == "base64";
    }
    if (j.contains("dimensions") && !j["dimensions"].is_null()) {
      const json& d = j["dimensions"];
      if (!d.is_number_integer() || d.get<int64_t>() < 1) {
        return Refuse<R>(error, "dimensions",
                         "\"dimensions\" must be an integer of at least 1, not " + d.dump());
      }
      r.dimensions = d.get<int64_t>();
    }
    if (j.contains("user") && !j["user"].is_null()) {
      if (!j["user"].is_string()) return Refuse<R>(error, "user", "\"user\" must be a string");
      r.user = j["user"].get<std::string>();
    }
    return r;
  });
}

StatusOr<std::vector<std::vector<int32_t>>> TokenizeEmbeddingInputs(const EmbeddingsRequest& request,
                                                                    const EmbedSpec& spec,
                                                                    EmbeddingsError* error) {
  using R = std::vector<std::vector<int32_t>>;
  if (request.dimensions) {
    const int64_t d = *request.dimensions;
    if (d > spec.dim) {
      return Refuse<R>(error, "dimensions",
                       "\"dimensions\" is " + std::to_string(d) + "; the model's vectors have " +
                           std::to_string(spec.dim));
    }
    if (d != spec.dim && !spec.truncatable_dims) {
      return Refuse<R>(
          error, "dimensions",
          "\"dimensions\": this model's vectors cannot be shortened (it was not trained for it); "
          "leave it out or ask for " +
              std::to_string(spec.dim));
    }
  }
  const size_t specials = spec.tokenizer->WithSpecialTokens({}).size();
  const size_t room = static_cast<size_t>(spec.max_seq_len) - specials;
  const int32_t vocab = spec.tokenizer->vocab_size();
  R out;
  out.reserve(request.size());
  for (size_t i = 0; i < request.size(); ++i) {
    std::vector<int32_t> ids;
    if (!request.texts.empty()) {
      // Only what fits is tokenized: a text of megabytes costs no more
      // than its first `room` tokens do.
      auto enc = spec.tokenizer->EncodeFirst(request.texts[i], room);
      if (!enc.ok())
        return Refuse<R>(error, "input", "\"input\"[" + std::to_string(i) + "]: " + enc.status().message());
      ids = std::move(enc).value();
    } else {
      for (int64_t id : request.token_ids[i]) {
        if (id < 0 || id >= vocab) {
          return Refuse<R>(error, "input",
                           "\"input\"[" + std::to_string(i) + "]: token id " + std::to_string(id) +
                               " is out of range: the vocabulary has " + std::to_string(vocab) +
                               " tokens (ids 0 to " + std::to_string(vocab - 1) + ")");
        }
        ids.push_back(static_cast<int32_t>(id));
      }
    }
    if (ids.size() > room) ids.resize(room);
    out.push_back(spec.tokenizer->WithSpecialTokens(std::move(ids)));
  }
  return out;
}

PaddedBatch PadBatch(const std::vector<std::vector<int32_t>>& rows, int32_t pad_id) {
  PaddedBatch b;
  b.rows = static_cast<int64_t>(rows.size());
  for (const auto& r : rows) {
    b.seq = std::max(b.seq, static_cast<int64_t>(r.size()));
    b.tokens += static_cast<int64_t>(r.size());
  }
  b.input_ids.assign(static_cast<size_t>(b.rows * b.seq), pad_id);
  b.attention_mask.assign(static_cast<size_t>(b.rows * b.seq), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t at = i * static_cast<size_t>(b.seq);
    std::copy(rows[i].begin(), rows[i].end(), b.input_ids.begin() + static_cast<ptrdiff_t>(at));
    std::fill_n(b.attention_mask.begin() + static_cast<ptrdiff_t>(at), rows[i].size(), 1);
  }
  return b;
}

std::string Base64(std::string_view bytes) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kDigits[(v >> s) & 63];
  }
  if (const size_t left = bytes.size() - i; left > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (left == 2) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out += kDigits[(v >> 18) & 63];
    out += kDigits[(v >> 12) & 63];
    out += left == 2 ? kDigits[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

StatusOr<std::string> EmbeddingsResponseJson(const float* vectors, int64_t rows, int64_t dim,
                                             const EmbeddingsRequest& request, const EmbedSpec& spec,
                                             std::string_view model_name, int64_t prompt_tokens) {
  const int64_t keep = request.dimensions ? std::min(*request.dimensions, dim) : dim;
  std::string out = R"({"object":"list","data":[)";
  std::vector<float> row(static_cast<size_t>(keep));
  for (int64_t i = 0; i < rows; ++i) {
    const float* v = vectors + i * dim;
    double norm = 0;
    for (int64_t k = 0; k < keep; ++k) {
      if (!std::isfinite(v[k])) {
        return Internal("the model's embedding " + std::to_string(i) + " holds a value that is not finite");
      }
      row[static_cast<size_t>(k)] = v[k];
      norm += static_cast<double>(v[k]) * v[k];
    }
    // A shortened vector of a normalizing model is made unit length again.
    if (keep < dim && spec.normalize && norm > 0) {
      const double scale = 1.0 / std::sqrt(norm);
      for (float& x : row) x = static_cast<float>(x * scale);
    }
    if (i > 0) out += ',';
    out += R"({"object":"embedding","index":)" + std::to_string(i) + R"(,"embedding":)";
    if (request.base64) {
      std::string bytes(row.size() * sizeof(float), '\0');
      std::memcpy(bytes.data(), row.data(), bytes.size());
      if constexpr (std::endian::native == std::endian::big) {
        for (size_t b = 0; b < bytes.size(); b += 4) {
          std::swap(bytes[b], bytes[b + 3]);
          std::swap(bytes[b + 1], bytes[b + 2]);
        }
      }
      out += '"' + Base64(bytes) + '"';
    } else {
      out += '[';
      for (size_t k = 0; k < row.size(); ++k) {
        if (k > 0) out += ',';
        AppendFloat(&out, row[k]);
      }
      out += ']';
    }
    out += '}';
  }
  out += R"(],"model":)" + json(std::string(model_name)).dump(-1, ' ', false, json::error_handler_t::replace);
  out += R"(,"usage":{"prompt_tokens":)" + std::to_string(prompt_tokens) + R"(,"total_tokens":)" +
         std::to_string(prompt_tokens) + "}}";
  return out;
}

}  // namespace aotid::serving
