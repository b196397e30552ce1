// What a WordPiece tokenizer (the BERT kind, which sentence encoders such
// as MiniLM use) does to text before and after its vocabulary, as Hugging
// Face's tokenizer.json describes it and its `tokenizers` package does it:
// BertNormalizer, BertPreTokenizer, the WordPiece model and its decoder.
// Tokenizer::FromJson (text/tokenizer.h) puts them together; they are
// here on their own so that each step can be tested on its own.
//
// The character classes and mappings are the reference tokenizer's own,
// read from it code point by code point (text/bert_unicode_tables.inc,
// scripts/make_bert_unicode_tables.py): its Unicode data is of several
// versions, none of them the current one, so no library's tables would
// give the same pieces.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace aotid::text {

// BertNormalizer's steps, applied in this order to valid UTF-8 text.
struct BertNormalizer {
  // Removes control and format characters, U+0000 and U+FFFD; turns every
  // whitespace character into a space.
  bool clean_text = true;
  // Puts a space on both sides of each CJK ideograph, so that each is a
  // word of its own.
  bool handle_chinese_chars = true;
  // Decomposes (NFD) and removes the nonspacing marks: "é" becomes "e".
  bool strip_accents = true;
  // Maps each character to its lower case (which may be longer).
  bool lowercase = true;

  std::string Normalize(std::string_view text) const;
};

// BertPreTokenizer: splits valid UTF-8 text into words at whitespace
// (dropped) and around each punctuation character (a word of its own).
// The pieces point into `text`.
std::vector<std::string_view> BertPreTokenize(std::string_view text);

// BertNormalizer (`normalizer`, none when null), then BertPreTokenizer
// (when `pre_tokenize`; else the normalized text is one word), then
// `encode` on each word, which appends the word's ids to *out; stops once
// *out holds `limit` ids, and cuts it there. The ids are the first of what
// doing the whole text would give, but a long text is done a stretch at a
// time (the first of about `stretch_bytes`, each next one twice as long),
// each cut just before a character at which both sides normalize and
// split as they would together: the work stops soon after `limit`, not at
// the text's end. Text with no such character in it is done whole.
// Returns how many bytes of `text` it went through.
size_t BertEncode(std::string_view text, const BertNormalizer* normalizer, bool pre_tokenize,
                  const std::function<void(std::string_view word, std::vector<int32_t>* out)>& encode,
                  size_t limit, std::vector<int32_t>* out, size_t stretch_bytes = 4096);

// The WordPiece model on one word: longest match first from the start,
// then from where that match ends with `prefix` ("##") before it; a word
// with a part no token matches, or longer than `max_chars` characters, is
// `unk` alone. `find` gives a token's id, or -1; no token is longer than
// `longest_token` bytes (which bounds the search in a long word).
void WordPieceEncode(std::string_view word, const std::function<int32_t(const std::string&)>& find,
                     std::string_view prefix, size_t max_chars, size_t longest_token, int32_t unk,
                     std::vector<int32_t>* out);

// The WordPiece decoder: tokens joined by spaces, except that one starting
// with `prefix` joins the one before it without the prefix; with
// `cleanup`, the space before punctuation and English contractions goes
// (" ." -> ".", " 's" -> "'s").
std::string WordPieceDecode(const std::vector<std::string_view>& tokens, std::string_view prefix,
                            bool cleanup);

}  // namespace aotid::text
