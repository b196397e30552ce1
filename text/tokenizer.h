// A tokenizer of one of two kinds, chosen by what it is read from.
//
// A byte-level BPE tokenizer (the GPT-2 kind, which most small language
// models use), read from the description the exporter writes into a
// package (aotid_export.llm, docs/GENERATE.md):
//
//   {"type": "byte_level_bpe",
//    "pre_tokenizer": ["\\p{N}", "'s|'t|...| ?\\p{L}+|..."],   applied in turn
//    "tokens": ["<|endoftext|>", "!", ...],                     by id
//    "merges": ["Ġ t", "i n", ...],                              by rank
//    "special": [0, 1, 2]}                                       ids
//
// Encoding: special tokens are split out of the text first (their literal
// text, leftmost and then longest); every other stretch is split by each
// pre-tokenizer pattern in turn (PCRE2, Unicode properties on; both the
// matches and the text between them become pieces); each piece's bytes
// map to their byte-level symbols and are merged by rank.
//
// A WordPiece tokenizer (the BERT kind, which sentence encoders use), read
// from a Hugging Face tokenizer.json as it is ({"model": {"type":
// "WordPiece", ...}, "normalizer": ..., ...}): special tokens are split out
// as above (the added tokens, all of which must be special), then each
// stretch goes through BertNormalizer, BertPreTokenizer and the WordPiece
// model (text/wordpiece.h). A step or setting aotid does not implement is
// refused by name, never passed over. The tokenizer.json's "truncation"
// and "padding" are not applied: they are the server's to decide per batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace aotid::text {

class Tokenizer {
 public:
  // Errors name what in the description is wrong.
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view description);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // InvalidArgument when `text` is not valid UTF-8. With `special` false,
  // special tokens' text is encoded as plain text (what a chat message's
  // content gets: its writer cannot open a turn of another role).
  // Thread-safe.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool special = true) const;
  // The same, with special tokens read as plain text only where they
  // overlap one of `plain` (byte ranges [begin, end) of `text`): a chat
  // prompt's message contents. Text on both sides of a range boundary
  // merges as one text would.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                        const std::vector<std::pair<size_t, size_t>>& plain) const;

  // The first `limit` ids of Encode(text). A WordPiece tokenizer goes no
  // further into the text than it takes to find them (it normalizes and
  // splits a long text a stretch at a time); a byte-level BPE splits all
  // of it but merges no piece past them.
  StatusOr<std::vector<int32_t>> EncodeFirst(std::string_view text, size_t limit) const;

  // Encode(text), then WithSpecialTokens: the ids a model takes for `text`.
  StatusOr<std::vector<int32_t>> EncodeForModel(std::string_view text) const;
  // The ids a model takes for one sequence of tokens: `ids` between the
  // special tokens the post-processor puts around them ([CLS] ids [SEP] for
  // BERT's); a byte-level BPE's models take `ids` as they are.
  std::vector<int32_t> WithSpecialTokens(std::vector<int32_t> ids) const;

  enum class Kind { kByteLevelBpe, kWordPiece };
  Kind kind() const;

  // The bytes a token stands for: a special token's own text, others their
  // bytes (which may be part of one UTF-8 character; a WordPiece token's
  // text without its "##"). Empty for an id outside the vocabulary.
  const std::string& Bytes(int32_t id) const;
  // Byte-level BPE: the tokens' bytes, as whole UTF-8. WordPiece: the
  // tokenizer.json's decoder (tokens joined by spaces, "##" pieces to the
  // one before). Special tokens come out as their text.
  std::string Decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const;
  // The most bytes one token stands for.
  size_t max_token_bytes() const;
  bool IsSpecial(int32_t id) const;
  // The id of a token by its text as the vocabulary spells it, or -1.
  int32_t Find(std::string_view token) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                        const std::vector<std::pair<size_t, size_t>>& plain,
                                        size_t limit) const;
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token bytes into text that is whole UTF-8: what a
// token ends in the middle of a character waits for the tokens that
// complete it. Bytes that can never complete a character come out as
// U+FFFD, as a decoder of the whole text would write them.
class Utf8Stream {
 public:
  // The text that is complete after appending `bytes`.
  std::string Push(std::string_view bytes);
  // What is still held, with any unfinished character as U+FFFD.
  std::string Flush();
  // The bytes of an unfinished character, waiting for the rest of it.
  size_t held() const { return held_.size(); }

 private:
  std::string held_;
};

// Whether `s` is valid UTF-8 (no overlong forms, surrogates or code points
// past U+10FFFF).
bool ValidUtf8(std::string_view s);

}  // namespace aotid::text
