#include "serving/embeddings.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "serving/minilm_embed_json.h"

namespace aotid::serving {
namespace {

using nlohmann::json;

json SpecJson() { return aotid::testing::MinilmEmbedJson(); }

EmbedSpec Spec(const json& j = SpecJson()) {
  auto s = EmbedSpec::FromJson(j.dump());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : EmbedSpec{};
}

EmbeddingsRequest Parse(const json& body) {
  EmbeddingsError error;
  auto r = ParseEmbeddingsRequest(body.dump(), &error);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : EmbeddingsRequest{};
}

// The field a refused body is refused for, and the message.
EmbeddingsError Refused(std::string_view body) {
  EmbeddingsError error{"(not refused)", "(not refused)"};
  auto r = ParseEmbeddingsRequest(body, &error);
  EXPECT_FALSE(r.ok()) << body;
  if (!r.ok()) {
    EXPECT_EQ(r.status().message(), error.message);
  }
  return error;
}

TEST(EmbedSpec, ReadsTheSpecTheWorkerWrites) {
  EmbedSpec s = Spec();
  EXPECT_EQ(s.dim, 384);
  EXPECT_EQ(s.max_seq_len, 256);
  EXPECT_EQ(s.pooling, "mean");
  EXPECT_TRUE(s.normalize);
  EXPECT_FALSE(s.truncatable_dims);
  EXPECT_EQ(s.pad_id, 0);
  EXPECT_EQ(s.ids_input, "input_ids");
  EXPECT_EQ(s.mask_input, "attention_mask");
  EXPECT_EQ(s.output, "embedding");
  ASSERT_NE(s.tokenizer, nullptr);
  EXPECT_EQ(s.tokenizer->kind(), text::Tokenizer::Kind::kWordPiece);
}

TEST(EmbedSpec, RefusesWhatItCannotServeNamingTheField) {
  auto refused = [](const std::string& key, const json& value) {
    json j = SpecJson();
    if (value.is_null()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    auto s = EmbedSpec::FromJson(j.dump());
    EXPECT_FALSE(s.ok()) << key;
    return s.ok() ? std::string() : s.status().message();
  };
  EXPECT_NE(refused("kind", "causal_lm").find("sentence_embedding"), std::string::npos);
  EXPECT_NE(refused("dim", nullptr).find("\"dim\""), std::string::npos);
  EXPECT_NE(refused("dim", 0).find("\"dim\" is 0"), std::string::npos);
  EXPECT_NE(refused("pooling", "max").find("\"pooling\" is \"max\""), std::string::npos);
  EXPECT_NE(refused("max_seq_len", 2).find("max_seq_len"), std::string::npos);
  EXPECT_NE(refused("normalize", "yes").find("\"normalize\""), std::string::npos);
  EXPECT_NE(refused("tokenizer", nullptr).find("no tokenizer"), std::string::npos);
  EXPECT_NE(refused("special_tokens", json{{"pad", 40000}}).find("\"pad\" is 40000"), std::string::npos);
  // A language model's tokenizer (byte-level BPE) is not one for an encoder.
  auto bpe = fs::ReadFile(std::string(AOTID_SOURCE_DIR) + "/tests/text/smollm2_tokenizer.json");
  ASSERT_TRUE(bpe.ok());
  EXPECT_NE(refused("tokenizer", json::parse(*bpe)).find("not WordPiece"), std::string::npos);
  EXPECT_FALSE(EmbedSpec::FromJson("[1]").ok());
  EXPECT_FALSE(EmbedSpec::FromJson("not json").ok());
  // A value of another type than the reader expects is refused, not thrown.
  json j = SpecJson();
  j["special_tokens"] = {{"pad", "zero"}};
  EXPECT_FALSE(EmbedSpec::FromJson(j.dump()).ok());
}

// The compiled model MiniLM's package builds into: ids and mask INT64
// [batch, seq] (seq up to 512), embedding FLOAT32 [batch, 384].
model::ModelSpec MiniLMModel() {
  model::ModelSpec m;
  for (const char* name : {"input_ids", "attention_mask"}) {
    m.inputs.push_back({name,
                        model::DType::kInt64,
                        {-1, -1},
                        {model::DimRange{"batch", 1, 256}, model::DimRange{"seq", 1, 512}}});
  }
  m.outputs.push_back({"embedding", model::DType::kFloat32, {-1, 384}});
  return m;
}

TEST(EmbedSpec, ChecksTheCompiledModelFitsIt) {
  EmbedSpec spec = Spec();
  EXPECT_TRUE(CheckEmbedModel(spec, MiniLMModel()).ok());
  auto refused = [&](const model::ModelSpec& m) {
    Status s = CheckEmbedModel(spec, m);
    EXPECT_FALSE(s.ok());
    return s.message();
  };
  model::ModelSpec m = MiniLMModel();
  m.outputs[0].shape = {-1, 768};
  EXPECT_NE(refused(m).find("\"embedding\" must be FP32 [batch, 384]; it is FP32 [-1, 768]"),
            std::string::npos)
      << refused(m);
  m = MiniLMModel();
  m.inputs[1].name = "token_type_ids";
  EXPECT_NE(refused(m).find("no input \"attention_mask\""), std::string::npos);
  m = MiniLMModel();
  m.inputs[0].dtype = model::DType::kInt32;
  EXPECT_NE(refused(m).find("\"input_ids\" must be INT64 [batch, seq]"), std::string::npos);
  m = MiniLMModel();
  m.inputs[0].shape = {-1, 128};
  EXPECT_NE(refused(m).find("fixed seq of 128"), std::string::npos);
  m = MiniLMModel();
  m.inputs[1].dims[1]->max = 128;
  EXPECT_NE(refused(m).find("takes up to 128 tokens, fewer than max_seq_len 256"), std::string::npos);
  m = MiniLMModel();
  m.inputs.pop_back();
  EXPECT_NE(refused(m).find("takes 1 inputs"), std::string::npos);
}

TEST(EmbeddingsRequest, ReadsEveryFormOfInput) {
  EmbeddingsRequest one = Parse({{"model", "minilm"}, {"input", "Hello world"}});
  EXPECT_EQ(one.model, "minilm");
  EXPECT_EQ(one.texts, std::vector<std::string>{"Hello world"});
  EXPECT_TRUE(one.token_ids.empty());
  EXPECT_FALSE(one.base64);
  EXPECT_FALSE(one.dimensions.has_value());

  EmbeddingsRequest list = Parse({{"model", "minilm:2"}, {"input", {"a", "b", "c"}}});
  EXPECT_EQ(list.texts, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(list.size(), 3u);

  EmbeddingsRequest ids = Parse({{"model", "m"}, {"input", {7592, 2088}}});
  ASSERT_EQ(ids.token_ids.size(), 1u);
  EXPECT_EQ(ids.token_ids[0], (std::vector<int64_t>{7592, 2088}));
  EXPECT_TRUE(ids.texts.empty());

  EmbeddingsRequest lists = Parse({{"model", "m"}, {"input", {{7592}, {2088, 2088}}}});
  ASSERT_EQ(lists.token_ids.size(), 2u);
  EXPECT_EQ(lists.token_ids[1], (std::vector<int64_t>{2088, 2088}));

  EmbeddingsRequest all = Parse({{"model", "m"},
                                 {"input", "x"},
                                 {"encoding_format", "base64"},
                                 {"dimensions", 64},
                                 {"user", "someone"}});
  EXPECT_TRUE(all.base64);
  EXPECT_EQ(all.dimensions, 64);
  EXPECT_EQ(all.user, "someone");
  EXPECT_FALSE(Parse({{"model", "m"}, {"input", "x"}, {"encoding_format", "float"}}).base64);
  EXPECT_FALSE(Parse({{"model", "m"}, {"input", "x"}, {"dimensions", nullptr}}).dimensions.has_value());
}

TEST(EmbeddingsRequest, RefusesNamingTheField) {
  EXPECT_EQ(Refused("{").param, "");
  EXPECT_EQ(Refused("[1, 2]").param, "");
  EXPECT_EQ(Refused(R"({"input": "x"})").param, "model");
  EXPECT_EQ(Refused(R"({"model": 3, "input": "x"})").param, "model");
  EXPECT_EQ(Refused(R"({"model": "m"})").param, "input");
  EXPECT_EQ(Refused(R"({"model": "m", "input": "x", "model": "n"})").message,
            R"(the request body has the key "model" twice in one object)");
  EXPECT_EQ(Refused(R"({"model": "m", "input": 5})").param, "input");
  EXPECT_EQ(Refused(R"({"model": "m", "input": ""})").message, "\"input\" is an empty string");
  EXPECT_EQ(Refused(R"({"model": "m", "input": ["a", ""]})").message, "\"input\"[1] is an empty string");
  EXPECT_EQ(Refused(R"({"model": "m", "input": []})").message, "\"input\" is an empty list");
  EXPECT_EQ(Refused(R"({"model": "m", "input": ["a", 1]})").message,
            "\"input\"[1] is not a string, as the items before it are");
  EXPECT_EQ(Refused(R"({"model": "m", "input": [1, 2.5]})").param, "input");
  EXPECT_EQ(Refused(R"({"model": "m", "input": [1, "a"]})").param, "input");
  EXPECT_EQ(Refused(R"({"model": "m", "input": [1, 18446744073709551615]})").param, "input");
  EXPECT_EQ(Refused(R"({"model": "m", "input": [[1], 2]})").message,
            "\"input\"[1] is not a list of token ids");
  EXPECT_EQ(Refused(R"({"model": "m", "input": [[1], []]})").message,
            "\"input\"[1] is an empty list of tokens");
  EXPECT_EQ(Refused(R"({"model": "m", "input": [{"a": 1}]})").param, "input");
  EXPECT_EQ(Refused("{\"model\": \"m\", \"input\": \"\xff\"}").param, "");  // not UTF-8: not JSON either
  EXPECT_EQ(Refused(R"({"model": "m", "input": "x", "encoding_format": "int8"})").param, "encoding_format");
  EXPECT_EQ(Refused(R"({"model": "m", "input": "x", "encoding_format": 1})").param, "encoding_format");
  EXPECT_EQ(Refused(R"({"model": "m", "input": "x", "dimensions": 0})").param, "dimensions");
  EXPECT_EQ(Refused(R"({"model": "m", "input": "x", "dimensions": "64"})").param, "dimensions");
  EXPECT_EQ(Refused(R"({"model": "m", "input": "x", "user": 7})").param, "user");
  json many = {{"model", "m"}, {"input", std::vector<std::string>(kMaxEmbeddingInputs + 1, "a")}};
  EXPECT_EQ(Refused(many.dump()).message, "\"input\" holds 2049 inputs; at most 2048");
  // One text's token ids may be more than 2048: they are cut to the model's length.
  json long_ids = {{"model", "m"}, {"input", std::vector<int>(kMaxEmbeddingInputs + 1, 5)}};
  EXPECT_EQ(Parse(long_ids).token_ids[0].size(), kMaxEmbeddingInputs + 1);
  // What /v1/embeddings does not know is refused, never ignored.
  for (const char* key : {"n", "stream", "dimension", "extra_body"}) {
    EXPECT_EQ(Refused(json{{"model", "m"}, {"input", "x"}, {key, 1}}.dump()).param, key);
  }
}

TEST(EmbeddingsTokenize, TextAndIdsBetweenTheSpecialTokens) {
  EmbedSpec spec = Spec();
  EmbeddingsError error;
  auto rows = TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", {"Hello world", "HELLO, World!"}}}),
                                      spec, &error);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 2u);
  // The reference tokenizer's ids for these texts (lower-cased, punctuation split).
  EXPECT_EQ((*rows)[0], (std::vector<int32_t>{101, 7592, 2088, 102}));
  EXPECT_EQ((*rows)[1], (std::vector<int32_t>{101, 7592, 1010, 2088, 999, 102}));

  auto ids =
      TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", {{7592, 2088}, {2088}}}}), spec, &error);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ((*ids)[0], (std::vector<int32_t>{101, 7592, 2088, 102}));
  EXPECT_EQ((*ids)[1], (std::vector<int32_t>{101, 2088, 102}));
}

TEST(EmbeddingsTokenize, CutsToMaxSeqLenKeepingTheSpecialTokens) {
  EmbedSpec spec = Spec();
  std::string text;
  for (int i = 0; i < 400; ++i) text += "hello ";
  EmbeddingsError error;
  auto rows = TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", text}}), spec, &error);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  const auto& r = (*rows)[0];
  ASSERT_EQ(r.size(), 256u);
  EXPECT_EQ(r.front(), 101);
  EXPECT_EQ(r[254], 7592);
  EXPECT_EQ(r.back(), 102);
  auto ids = TokenizeEmbeddingInputs(
      Parse({{"model", "m"}, {"input", json::array({std::vector<int32_t>(300, 7592)})}}), spec, &error);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0].size(), 256u);
  EXPECT_EQ((*ids)[0].back(), 102);
}

TEST(EmbeddingsTokenize, RefusesIdsOutsideTheVocabularyAndDimensionsItCannotGive) {
  EmbedSpec spec = Spec();
  EmbeddingsError error;
  auto bad = TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", {{1, 2}, {30522}}}}), spec, &error);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(error.param, "input");
  EXPECT_EQ(error.message,
            "\"input\"[1]: token id 30522 is out of range: the vocabulary has 30522 tokens (ids 0 to 30521)");
  auto negative = TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", {-1}}}), spec, &error);
  EXPECT_FALSE(negative.ok());
  // Past int32 too: the id and what it is out of, not that it is not an id.
  auto huge = TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", {1, 4294967296}}}), spec, &error);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(error.param, "input");
  EXPECT_EQ(error.message,
            "\"input\"[0]: token id 4294967296 is out of range: the vocabulary has 30522 tokens (ids 0 to "
            "30521)");

  auto more =
      TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", "x"}, {"dimensions", 385}}), spec, &error);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(error.param, "dimensions");
  auto fewer =
      TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", "x"}, {"dimensions", 64}}), spec, &error);
  ASSERT_FALSE(fewer.ok());
  EXPECT_EQ(error.param, "dimensions");
  EXPECT_NE(error.message.find("cannot be shortened"), std::string::npos);
  EXPECT_TRUE(
      TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", "x"}, {"dimensions", 384}}), spec, &error)
          .ok());
  json j = SpecJson();
  j["truncatable_dims"] = true;
  EXPECT_TRUE(
      TokenizeEmbeddingInputs(Parse({{"model", "m"}, {"input", "x"}, {"dimensions", 64}}), Spec(j), &error)
          .ok());
}

TEST(EmbeddingsPad, PadsOnTheRightWithTheMask) {
  PaddedBatch b = PadBatch({{101, 5, 6, 102}, {101, 102}, {101, 7, 102}}, 0);
  EXPECT_EQ(b.rows, 3);
  EXPECT_EQ(b.seq, 4);
  EXPECT_EQ(b.tokens, 9);
  EXPECT_EQ(b.input_ids, (std::vector<int64_t>{101, 5, 6, 102, 101, 102, 0, 0, 101, 7, 102, 0}));
  EXPECT_EQ(b.attention_mask, (std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0}));
  PaddedBatch padded_with = PadBatch({{1}, {1, 2}}, 9);
  EXPECT_EQ(padded_with.input_ids, (std::vector<int64_t>{1, 9, 1, 2}));
}

TEST(EmbeddingsAnswer, FloatsInOrderWithUsage) {
  EmbedSpec spec = Spec();
  const std::vector<float> v = {0.1f, -0.2f, 1e-7f, 0.3333333f, 2.0f, -0.f};
  EmbeddingsRequest r = Parse({{"model", "minilm"}, {"input", {"a", "b"}}});
  auto text = EmbeddingsResponseJson(v.data(), 2, 3, r, spec, "minilm", 7);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  json j = json::parse(*text);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "minilm");
  EXPECT_EQ(j["usage"], (json{{"prompt_tokens", 7}, {"total_tokens", 7}}));
  ASSERT_EQ(j["data"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["data"][i]["object"], "embedding");
    EXPECT_EQ(j["data"][i]["index"], i);
    ASSERT_EQ(j["data"][i]["embedding"].size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      // Each float written so that it reads back as the same float.
      EXPECT_EQ(j["data"][i]["embedding"][k].get<float>(), v[i * 3 + k]) << i << "," << k;
    }
  }
}

TEST(EmbeddingsAnswer, Base64OfLittleEndianFloat32) {
  EXPECT_EQ(Base64(""), "");
  EXPECT_EQ(Base64("f"), "Zg==");
  EXPECT_EQ(Base64("fo"), "Zm8=");
  EXPECT_EQ(Base64("foo"), "Zm9v");
  EXPECT_EQ(Base64("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64(std::string("\xff\xfe\x00", 3)), "//4A");

  EmbedSpec spec = Spec();
  const std::vector<float> v = {1.0f, -2.5f};
  EmbeddingsRequest r = Parse({{"model", "m"}, {"input", "a"}, {"encoding_format", "base64"}});
  auto text = EmbeddingsResponseJson(v.data(), 1, 2, r, spec, "m", 3);
  ASSERT_TRUE(text.ok());
  // 1.0f is 00 00 80 3f, -2.5f is 00 00 20 c0, little-endian.
  EXPECT_EQ(json::parse(*text)["data"][0]["embedding"], "AACAPwAAIMA=");
}

TEST(EmbeddingsAnswer, FewerDimensionsAreMadeUnitLengthAgain) {
  json j = SpecJson();
  j["truncatable_dims"] = true;
  EmbedSpec spec = Spec(j);
  const std::vector<float> v = {0.6f * 0.5f, 0.8f * 0.5f, std::sqrt(0.75f)};
  EmbeddingsRequest r = Parse({{"model", "m"}, {"input", "a"}, {"dimensions", 2}});
  auto text = EmbeddingsResponseJson(v.data(), 1, 3, r, spec, "m", 3);
  ASSERT_TRUE(text.ok());
  auto e = json::parse(*text)["data"][0]["embedding"];
  ASSERT_EQ(e.size(), 2u);
  EXPECT_NEAR(e[0].get<double>(), 0.6, 1e-6);
  EXPECT_NEAR(e[1].get<double>(), 0.8, 1e-6);
  // Not normalized by the model: the first values as they are.
  j["normalize"] = false;
  auto plain = EmbeddingsResponseJson(v.data(), 1, 3, r, Spec(j), "m", 3);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(json::parse(*plain)["data"][0]["embedding"][0].get<float>(), v[0]);
}

TEST(EmbeddingsAnswer, NonFiniteValueIsAnErrorNotBadJson) {
  EmbedSpec spec = Spec();
  const std::vector<float> v = {0.5f, std::nanf("")};
  auto text = EmbeddingsResponseJson(v.data(), 1, 2, Parse({{"model", "m"}, {"input", "a"}}), spec, "m", 1);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("not finite"), std::string::npos);
}

}  // namespace
}  // namespace aotid::serving
