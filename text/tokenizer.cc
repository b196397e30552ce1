#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <unordered_map>

#include "base/json.h"
#include "text/wordpiece.h"

namespace aotid::text {
namespace {

// How many bytes the UTF-8 sequence starting with `lead` has; 0 for a byte
// that cannot start one.
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether byte `i` (1-based within the sequence) may follow `lead`. The
// second byte's range is narrower for a few leads: that is what rules out
// overlong forms, surrogates and code points past U+10FFFF.
bool ValidContinuation(unsigned char lead, int i, unsigned char b) {
  if (i == 1) {
    if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
    if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
    if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
    if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  }
  return b >= 0x80 && b <= 0xBF;
}

// The length of the valid sequence at s[0..]: > 0 when whole, 0 when it is
// invalid, -1 when it is a valid start cut off by the end of `s`.
int ValidSequenceAt(std::string_view s) {
  auto lead = static_cast<unsigned char>(s[0]);
  int n = SequenceLength(lead);
  if (n == 0) return 0;
  for (int i = 1; i < n; ++i) {
    if (static_cast<size_t>(i) >= s.size()) return -1;
    if (!ValidContinuation(lead, i, static_cast<unsigned char>(s[i]))) return 0;
  }
  return n;
}

// How many bytes of an ill-formed sequence at s[0..] one U+FFFD stands for:
// its lead and the continuation bytes that were still valid (the "maximal
// subpart", as Unicode and Python's decoder count it).
size_t MaximalSubpart(std::string_view s) {
  auto lead = static_cast<unsigned char>(s[0]);
  int n = SequenceLength(lead);
  size_t k = 1;
  while (static_cast<int>(k) < n && k < s.size() &&
         ValidContinuation(lead, static_cast<int>(k), static_cast<unsigned char>(s[k])))
    ++k;
  return k;
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

void AppendCodePoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Byte-level BPE spells each byte as one printable character: the bytes
// that are printable Latin-1 as themselves, the others (controls, space,
// and a few) as U+0100 onwards, in byte order.
std::vector<std::string> ByteSymbols() {
  std::vector<std::string> sym(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    AppendCodePoint(printable ? b : next++, &sym[b]);
  }
  return sym;
}

// Bytes of the character at s[i] (1 at the end).
size_t Utf8Step(std::string_view s, size_t i) {
  size_t step = 1;
  while (i + step < s.size() && (static_cast<unsigned char>(s[i + step]) & 0xC0) == 0x80) ++step;
  return step;
}

struct Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { pcre2_code_free(code); }
};

}  // namespace

bool ValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int n = ValidSequenceAt(s.substr(i));
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

std::string Utf8Stream::Push(std::string_view bytes) {
  held_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < held_.size()) {
    int n = ValidSequenceAt(std::string_view(held_).substr(i));
    if (n < 0) break;  // wait for the rest of the character
    if (n == 0) {
      out += kReplacement;
      i += MaximalSubpart(std::string_view(held_).substr(i));
      continue;
    }
    out.append(held_, i, static_cast<size_t>(n));
    i += static_cast<size_t>(n);
  }
  held_.erase(0, i);
  return out;
}

std::string Utf8Stream::Flush() {
  std::string out = Push("");
  if (!held_.empty()) out += kReplacement;
  held_.clear();
  return out;
}

struct Tokenizer::Impl {
  std::vector<std::string> text;   // by id, as the vocabulary spells it
  std::vector<std::string> bytes;  // by id, what it decodes to
  std::vector<bool> special;
  std::unordered_map<std::string, int32_t> by_text;
  int32_t byte_token[256] = {};
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  std::vector<std::pair<std::string, int32_t>> specials;  // longest first
  std::vector<std::unique_ptr<Pattern>> patterns;

  // A WordPiece tokenizer (read from a Hugging Face tokenizer.json) has
  // these in place of the byte-level fields above.
  bool wordpiece = false;
  std::optional<BertNormalizer> normalizer;
  bool bert_pre_tokenizer = false;
  std::string prefix;  // continuing_subword_prefix
  size_t max_chars = 0;
  size_t longest_token = 0;  // bytes, prefix included
  int32_t unk = -1;
  std::vector<int32_t> before, after;  // what the post-processor puts around a sequence
  bool wordpiece_decoder = false;
  std::string decoder_prefix;
  bool cleanup = false;

  static StatusOr<std::unique_ptr<Impl>> WordPieceFromHf(const nlohmann::json& j);

  void WordPiece(std::string_view s, size_t limit, std::vector<int32_t>* out) const {
    auto find = [this](const std::string& t) {
      auto it = by_text.find(t);
      return it == by_text.end() ? -1 : it->second;
    };
    auto encode = [&](std::string_view w, std::vector<int32_t>* ids) {
      WordPieceEncode(w, find, prefix, max_chars, longest_token, unk, ids);
    };
    BertEncode(s, normalizer ? &*normalizer : nullptr, bert_pre_tokenizer, encode, limit, out);
  }

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Merges one piece's bytes by rank; appends the ids to *out.
  void Bpe(std::string_view piece, std::vector<int32_t>* out) const {
    struct Sym {
      int32_t id;
      int prev, next;
    };
    // A byte the vocabulary has no token for is dropped, as the reference
    // tokenizer drops it (SmolLM2 has none for a few control bytes).
    std::vector<Sym> syms;
    syms.reserve(piece.size());
    for (char ch : piece) {
      int32_t id = byte_token[static_cast<unsigned char>(ch)];
      if (id >= 0) syms.push_back({id, static_cast<int>(syms.size()) - 1, static_cast<int>(syms.size()) + 1});
    }
    const int n = static_cast<int>(syms.size());
    if (n == 0) return;
    syms.back().next = -1;
    struct Cand {
      int32_t rank;
      int left;
      int32_t left_id, right_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> queue;
    auto consider = [&](int left) {
      if (left < 0) return;
      int right = syms[static_cast<size_t>(left)].next;
      if (right < 0) return;
      int32_t a = syms[static_cast<size_t>(left)].id, b = syms[static_cast<size_t>(right)].id;
      auto it = merges.find(PairKey(a, b));
      if (it != merges.end()) queue.push({it->second.first, left, a, b});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    std::vector<bool> dead(syms.size(), false);
    while (!queue.empty()) {
      Cand c = queue.top();
      queue.pop();
      Sym& l = syms[static_cast<size_t>(c.left)];
      // Stale: either side merged since this pair was queued.
      if (dead[static_cast<size_t>(c.left)] || l.id != c.left_id || l.next < 0) continue;
      Sym& r = syms[static_cast<size_t>(l.next)];
      if (r.id != c.right_id) continue;
      l.id = merges.at(PairKey(c.left_id, c.right_id)).second;
      dead[static_cast<size_t>(l.next)] = true;
      l.next = r.next;
      if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = c.left;
      consider(l.prev);
      consider(c.left);
    }
    for (int i = 0; i >= 0 && i < n; i = syms[static_cast<size_t>(i)].next)
      out->push_back(syms[static_cast<size_t>(i)].id);
  }

  // Splits `s` by each pattern in turn, then merges each piece, until
  // *out holds `limit` ids.
  Status EncodeOrdinary(std::string_view s, size_t limit, std::vector<int32_t>* out) const {
    if (wordpiece) {
      WordPiece(s, limit, out);
      return Status::OK();
    }
    std::vector<std::string_view> pieces{s}, next;
    pcre2_match_data* md = nullptr;
    for (const auto& p : patterns) {
      if (md == nullptr) md = pcre2_match_data_create(4, nullptr);
      next.clear();
      for (std::string_view piece : pieces) {
        size_t at = 0;    // where the next search starts
        size_t kept = 0;  // the end of what is already a piece
        uint32_t options = PCRE2_NO_UTF_CHECK;
        while (at <= piece.size() && kept < piece.size()) {
          int rc = pcre2_match(p->code, reinterpret_cast<PCRE2_SPTR>(piece.data()), piece.size(), at, options,
                               md, nullptr);
          if (rc == PCRE2_ERROR_NOMATCH && options != PCRE2_NO_UTF_CHECK) {
            // No non-empty match right here: move on by one character.
            options = PCRE2_NO_UTF_CHECK;
            at += Utf8Step(piece, at);
            continue;
          }
          if (rc == PCRE2_ERROR_NOMATCH) break;
          if (rc < 0) {
            pcre2_match_data_free(md);
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return InvalidArgument("the tokenizer's pattern could not split the text: " +
                                   std::string(reinterpret_cast<char*>(msg)));
          }
          PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
          size_t begin = ov[0], end = ov[1];
          if (end == begin) {
            at = begin;
            // An empty match is no piece: look again here for a non-empty
            // one, then move on by one character (the text stays unsent).
            if (options == PCRE2_NO_UTF_CHECK) {
              options = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
              continue;
            }
            options = PCRE2_NO_UTF_CHECK;
            at += Utf8Step(piece, at);
            continue;
          }
          options = PCRE2_NO_UTF_CHECK;
          if (begin > kept) next.push_back(piece.substr(kept, begin - kept));
          next.push_back(piece.substr(begin, end - begin));
          at = kept = end;
        }
        if (kept < piece.size()) next.push_back(piece.substr(kept));
      }
      pieces.swap(next);
    }
    pcre2_match_data_free(md);
    for (std::string_view piece : pieces) {
      if (out->size() >= limit) break;
      Bpe(piece, out);
    }
    if (out->size() > limit) out->resize(limit);
    return Status::OK();
  }
};

namespace {

// A tokenizer.json's field that may be null or missing.
const nlohmann::json& Field(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// A boolean field of `part` (the tokenizer.json's "normalizer" and so on),
// `fallback` where it is missing.
StatusOr<bool> Flag(const nlohmann::json& part, const char* name, const char* key, bool fallback) {
  const auto& v = Field(part, key);
  if (v.is_null()) return fallback;
  if (!v.is_boolean())
    return InvalidArgument(std::string("the tokenizer.json's ") + name + "." + key + " is not true or false");
  return v.get<bool>();
}

std::string TypeOf(const nlohmann::json& part) {
  const auto& t = Field(part, "type");
  return t.is_string() ? t.get<std::string>() : t.dump();
}

}  // namespace

// Hugging Face's tokenizer.json, where the model is WordPiece: what a BERT
// tokenizer has is read, and anything else is refused by name rather than
// passed over, since a step left out would give the model other ids.
// "truncation" and "padding" are not read: how long a batch is, and what
// it is padded with, is the server's to decide.
StatusOr<std::unique_ptr<Tokenizer::Impl>> Tokenizer::Impl::WordPieceFromHf(const nlohmann::json& j) {
  const auto& model = j["model"];
  if (!model.is_object()) return InvalidArgument("the tokenizer.json's \"model\" is not an object");
  if (TypeOf(model) != "WordPiece") {
    return InvalidArgument("the tokenizer.json's model is " + TypeOf(model) +
                           ": aotid reads WordPiece from a tokenizer.json (and byte-level BPE from the "
                           "exporter's description)");
  }
  auto impl = std::make_unique<Impl>();
  impl->wordpiece = true;
  const auto& vocab = Field(model, "vocab");
  if (!vocab.is_object() || vocab.empty() || vocab.size() > (1u << 24)) {
    return InvalidArgument("the tokenizer.json's model.vocab is not an object of 1 to 16M tokens");
  }
  impl->text.resize(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= static_cast<int64_t>(vocab.size()) || seen[id.get<size_t>()]) {
      return InvalidArgument("the tokenizer.json's model.vocab gives \"" + token +
                             "\" an id that is not one of 0 to " + std::to_string(vocab.size() - 1) +
                             " once each");
    }
    seen[id.get<size_t>()] = true;
    impl->text[id.get<size_t>()] = token;
    impl->by_text.emplace(token, id.get<int32_t>());
  }
  const auto& unk = Field(model, "unk_token");
  if (!unk.is_string() || !impl->by_text.contains(unk.get<std::string>())) {
    return InvalidArgument("the tokenizer.json's model.unk_token is not a token of its vocabulary");
  }
  impl->unk = impl->by_text.at(unk.get<std::string>());
  const auto& prefix = Field(model, "continuing_subword_prefix");
  if (!prefix.is_null() && !prefix.is_string()) {
    return InvalidArgument("the tokenizer.json's model.continuing_subword_prefix is not a string");
  }
  impl->prefix = prefix.is_string() ? prefix.get<std::string>() : "##";
  const auto& max_chars = Field(model, "max_input_chars_per_word");
  if (!max_chars.is_null() && (!max_chars.is_number_unsigned() || max_chars.get<uint64_t>() == 0)) {
    return InvalidArgument("the tokenizer.json's model.max_input_chars_per_word is not a positive number");
  }
  impl->max_chars = max_chars.is_null() ? 100 : max_chars.get<size_t>();
  for (const std::string& t : impl->text) impl->longest_token = std::max(impl->longest_token, t.size());

  impl->special.assign(impl->text.size(), false);
  const auto& added = Field(j, "added_tokens");
  if (!added.is_null() && !added.is_array())
    return InvalidArgument("the tokenizer.json's added_tokens is not a list");
  for (const auto& a : added.is_array() ? added : nlohmann::json::array()) {
    const auto& content = Field(a, "content");
    const auto& id = Field(a, "id");
    if (!content.is_string() || content.get<std::string>().empty() || !id.is_number_integer()) {
      return InvalidArgument("an added token of the tokenizer.json has no \"content\" or \"id\"");
    }
    const std::string text = content.get<std::string>();
    auto it = impl->by_text.find(text);
    if (it == impl->by_text.end() || it->second != id.get<int64_t>()) {
      return InvalidArgument("the tokenizer.json's added token \"" + text +
                             "\" is not the vocabulary's token of that id; aotid reads added tokens "
                             "that are in the vocabulary");
    }
    for (const char* key : {"single_word", "lstrip", "rstrip", "normalized"}) {
      ASSIGN_OR_RETURN(bool on, Flag(a, "added token", key, false));
      if (on) {
        return InvalidArgument("the tokenizer.json's added token \"" + text + "\" has " + key +
                               " set, which aotid does not implement");
      }
    }
    ASSIGN_OR_RETURN(bool special, Flag(a, "added token", "special", false));
    if (!special) {
      return InvalidArgument("the tokenizer.json's added token \"" + text +
                             "\" is not special: aotid implements special added tokens only");
    }
    impl->special[static_cast<size_t>(it->second)] = true;
    impl->specials.emplace_back(text, it->second);
  }
  std::stable_sort(impl->specials.begin(), impl->specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  impl->bytes.resize(impl->text.size());
  for (size_t i = 0; i < impl->text.size(); ++i) {
    const std::string& t = impl->text[i];
    bool continues = !impl->special[i] && !impl->prefix.empty() && t.starts_with(impl->prefix);
    impl->bytes[i] = continues ? t.substr(impl->prefix.size()) : t;
  }

  const auto& norm = Field(j, "normalizer");
  if (!norm.is_null()) {
    if (TypeOf(norm) != "BertNormalizer") {
      return InvalidArgument("the tokenizer.json's normalizer is " + TypeOf(norm) +
                             ", which aotid does not implement (it implements BertNormalizer)");
    }
    BertNormalizer n;
    ASSIGN_OR_RETURN(n.clean_text, Flag(norm, "normalizer", "clean_text", true));
    ASSIGN_OR_RETURN(n.handle_chinese_chars, Flag(norm, "normalizer", "handle_chinese_chars", true));
    ASSIGN_OR_RETURN(n.lowercase, Flag(norm, "normalizer", "lowercase", true));
    // Not given, accents go as lower case goes (BERT's uncased models).
    ASSIGN_OR_RETURN(n.strip_accents, Flag(norm, "normalizer", "strip_accents", n.lowercase));
    impl->normalizer = n;
  }
  const auto& pre = Field(j, "pre_tokenizer");
  if (!pre.is_null()) {
    if (TypeOf(pre) != "BertPreTokenizer") {
      return InvalidArgument("the tokenizer.json's pre_tokenizer is " + TypeOf(pre) +
                             ", which aotid does not implement (it implements BertPreTokenizer)");
    }
    impl->bert_pre_tokenizer = true;
  }
  const auto& post = Field(j, "post_processor");
  auto special_id = [&](const nlohmann::json& v, const std::string& what) -> StatusOr<int32_t> {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() >= static_cast<int64_t>(impl->text.size())) {
      return InvalidArgument("the tokenizer.json's post_processor gives " + what +
                             " an id outside the vocabulary");
    }
    return v.get<int32_t>();
  };
  if (TypeOf(post) == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const auto& pair = Field(post, key);
      if (!pair.is_array() || pair.size() != 2) {
        return InvalidArgument(std::string("the tokenizer.json's post_processor.") + key +
                               " is not [token, id]");
      }
      ASSIGN_OR_RETURN(int32_t id, special_id(pair[1], key));
      (std::string_view(key) == "cls" ? impl->before : impl->after).push_back(id);
    }
  } else if (TypeOf(post) == "TemplateProcessing") {
    const auto& single = Field(post, "single");
    const auto& tokens = Field(post, "special_tokens");
    if (!single.is_array() || !tokens.is_object()) {
      return InvalidArgument(
          "the tokenizer.json's post_processor has no \"single\" template or \"special_tokens\"");
    }
    int sequences = 0;
    for (const auto& piece : single) {
      if (piece.contains("Sequence")) {
        if (Field(piece["Sequence"], "id") != "A") {
          return InvalidArgument("the tokenizer.json's single template names a sequence other than A");
        }
        ++sequences;
        continue;
      }
      const auto& name = Field(Field(piece, "SpecialToken"), "id");
      if (!name.is_string() || !tokens.contains(name.get<std::string>())) {
        return InvalidArgument(
            "the tokenizer.json's single template has a piece that is not a sequence or a "
            "special token it defines: " +
            piece.dump());
      }
      const auto& ids = Field(tokens[name.get<std::string>()], "ids");
      if (!ids.is_array()) {
        return InvalidArgument("the tokenizer.json's special token " + name.dump() + " has no \"ids\"");
      }
      for (const auto& id : ids) {
        ASSIGN_OR_RETURN(int32_t v, special_id(id, name.get<std::string>()));
        (sequences == 0 ? impl->before : impl->after).push_back(v);
      }
    }
    if (sequences != 1) {
      return InvalidArgument("the tokenizer.json's single template has " + std::to_string(sequences) +
                             " sequences, not 1");
    }
  } else if (!post.is_null()) {
    return InvalidArgument("the tokenizer.json's post_processor is " + TypeOf(post) +
                           ", which aotid does not implement (it implements TemplateProcessing and "
                           "BertProcessing)");
  }
  const auto& dec = Field(j, "decoder");
  if (TypeOf(dec) == "WordPiece") {
    const auto& p = Field(dec, "prefix");
    if (!p.is_null() && !p.is_string())
      return InvalidArgument("the tokenizer.json's decoder.prefix is not a string");
    impl->wordpiece_decoder = true;
    impl->decoder_prefix = p.is_string() ? p.get<std::string>() : "##";
    ASSIGN_OR_RETURN(impl->cleanup, Flag(dec, "decoder", "cleanup", true));
  } else if (!dec.is_null()) {
    return InvalidArgument("the tokenizer.json's decoder is " + TypeOf(dec) +
                           ", which aotid does not implement (it implements WordPiece)");
  }
  return impl;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view description) {
  return ReadJsonSafely<std::unique_ptr<Tokenizer>>(
      "the tokenizer", [&]() -> StatusOr<std::unique_ptr<Tokenizer>> {
        auto j = ParseJsonOrDiscarded(description);
        if (j.is_discarded() || !j.is_object()) return InvalidArgument("the tokenizer is not a JSON object");
        if (j.contains("model")) {
          ASSIGN_OR_RETURN(auto impl, Impl::WordPieceFromHf(j));
          return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
        }
        if (j.value("type", "") != "byte_level_bpe") {
          return InvalidArgument(
              "the tokenizer's type is not \"byte_level_bpe\", and it is not a tokenizer.json with a "
              "\"model\": aotid reads those two");
        }
        auto impl = std::make_unique<Impl>();
        const auto& tokens = j["tokens"];
        if (!tokens.is_array() || tokens.empty() || tokens.size() > (1u << 24)) {
          return InvalidArgument("the tokenizer's \"tokens\" is not a list of 1 to 16M strings");
        }
        std::vector<std::string> symbols = ByteSymbols();
        std::unordered_map<std::string, int> symbol_byte;
        for (int b = 0; b < 256; ++b) symbol_byte[symbols[static_cast<size_t>(b)]] = b;
        for (size_t i = 0; i < tokens.size(); ++i) {
          if (!tokens[i].is_string())
            return InvalidArgument("tokenizer token " + std::to_string(i) + " is not a string");
          std::string t = tokens[i].get<std::string>();
          impl->by_text.emplace(t, static_cast<int32_t>(i));
          impl->text.push_back(std::move(t));
        }
        impl->special.assign(tokens.size(), false);
        if (j.contains("special")) {
          if (!j["special"].is_array())
            return InvalidArgument("the tokenizer's \"special\" is not a list of ids");
          for (const auto& s : j["special"]) {
            if (!s.is_number_integer() || s.get<int64_t>() < 0 ||
                s.get<int64_t>() >= static_cast<int64_t>(tokens.size())) {
              return InvalidArgument("the tokenizer's \"special\" has an id outside the vocabulary");
            }
            auto id = static_cast<int32_t>(s.get<int64_t>());
            if (impl->text[static_cast<size_t>(id)].empty()) {
              return InvalidArgument("the tokenizer's special token " + std::to_string(id) + " is empty");
            }
            impl->special[static_cast<size_t>(id)] = true;
            impl->specials.emplace_back(impl->text[static_cast<size_t>(id)], id);
          }
        }
        std::stable_sort(impl->specials.begin(), impl->specials.end(),
                         [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
        // What each token decodes to: its characters mapped back to bytes.
        impl->bytes.resize(tokens.size());
        for (size_t i = 0; i < tokens.size(); ++i) {
          const std::string& t = impl->text[i];
          if (impl->special[i]) {
            impl->bytes[i] = t;
            continue;
          }
          std::string out;
          for (size_t k = 0; k < t.size();) {
            int n = ValidSequenceAt(std::string_view(t).substr(k));
            auto it = n > 0 ? symbol_byte.find(t.substr(k, static_cast<size_t>(n))) : symbol_byte.end();
            if (it == symbol_byte.end()) {
              // Not a byte-level spelling (an added token written as plain
              // text): it decodes to itself.
              out = t;
              break;
            }
            out.push_back(static_cast<char>(it->second));
            k += static_cast<size_t>(n);
          }
          impl->bytes[i] = std::move(out);
        }
        int byte_tokens = 0;
        for (int b = 0; b < 256; ++b) {
          auto it = impl->by_text.find(symbols[static_cast<size_t>(b)]);
          impl->byte_token[b] = it == impl->by_text.end() ? -1 : it->second;
          if (it != impl->by_text.end()) ++byte_tokens;
        }
        // Letters at least: a vocabulary without byte-level spellings is not one.
        if (byte_tokens < 128) {
          return InvalidArgument("the tokenizer's vocabulary spells only " + std::to_string(byte_tokens) +
                                 " of the 256 bytes: it is not a byte-level vocabulary");
        }
        const auto& merges = j["merges"];
        if (!merges.is_array()) return InvalidArgument("the tokenizer's \"merges\" is not a list");
        for (size_t r = 0; r < merges.size(); ++r) {
          if (!merges[r].is_string())
            return InvalidArgument("tokenizer merge " + std::to_string(r) + " is not a string");
          const std::string m = merges[r].get<std::string>();
          size_t sp = m.find(' ');
          if (sp == std::string::npos || sp == 0 || sp + 1 >= m.size() ||
              m.find(' ', sp + 1) != std::string::npos) {
            return InvalidArgument("tokenizer merge " + std::to_string(r) +
                                   " is not two tokens with a space between");
          }
          std::string a = m.substr(0, sp), b = m.substr(sp + 1);
          auto ia = impl->by_text.find(a), ib = impl->by_text.find(b), im = impl->by_text.find(a + b);
          if (ia == impl->by_text.end() || ib == impl->by_text.end() || im == impl->by_text.end()) {
            return InvalidArgument("tokenizer merge " + std::to_string(r) + " (\"" + m +
                                   "\") names a token the vocabulary does not have");
          }
          impl->merges.emplace(Impl::PairKey(ia->second, ib->second),
                               std::make_pair(static_cast<int32_t>(r), im->second));
        }
        const auto& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json::array();
        if (!pre.is_array())
          return InvalidArgument("the tokenizer's \"pre_tokenizer\" is not a list of patterns");
        for (const auto& p : pre) {
          if (!p.is_string()) return InvalidArgument("a tokenizer pattern is not a string");
          std::string pat = p.get<std::string>();
          int err = 0;
          PCRE2_SIZE off = 0;
          auto pattern = std::make_unique<Pattern>();
          pattern->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                                        PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
          if (pattern->code == nullptr) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(err, msg, sizeof msg);
            return InvalidArgument("tokenizer pattern \"" + pat + "\" does not compile at " +
                                   std::to_string(off) + ": " + reinterpret_cast<char*>(msg));
          }
          (void)pcre2_jit_compile(pattern->code, PCRE2_JIT_COMPLETE);  // interpreted where JIT is missing
          impl->patterns.push_back(std::move(pattern));
        }
        return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
      });
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool special) const {
  if (special) return Encode(text, std::vector<std::pair<size_t, size_t>>{});
  return Encode(text, std::vector<std::pair<size_t, size_t>>{{0, text.size()}});
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                 const std::vector<std::pair<size_t, size_t>>& plain) const {
  return Encode(text, plain, SIZE_MAX);
}

StatusOr<std::vector<int32_t>> Tokenizer::EncodeFirst(std::string_view text, size_t limit) const {
  return Encode(text, {}, limit);
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                 const std::vector<std::pair<size_t, size_t>>& plain,
                                                 size_t limit) const {
  if (!ValidUtf8(text)) return InvalidArgument("the text is not valid UTF-8");
  std::vector<int32_t> out;
  auto in_plain = [&](size_t begin, size_t end) {
    for (const auto& [b, e] : plain) {
      if (begin < e && b < end) return true;
    }
    return false;
  };
  // Where special token i next occurs at or after `from`, outside the plain ranges.
  auto find = [&](size_t i, size_t from) {
    const std::string& t = impl_->specials[i].first;
    size_t pos = text.find(t, from);
    while (pos != std::string_view::npos && in_plain(pos, pos + t.size())) pos = text.find(t, pos + 1);
    return pos;
  };
  // The next place each special token occurs, found again only once passed.
  const auto& specials = impl_->specials;
  std::vector<size_t> next(specials.size(), 0);
  std::vector<bool> fresh(specials.size(), false);
  size_t at = 0;
  while (at <= text.size() && out.size() < limit) {
    size_t best = std::string_view::npos;
    size_t which = 0;
    for (size_t i = 0; i < specials.size(); ++i) {
      if (!fresh[i] || next[i] < at) {
        next[i] = find(i, at);
        fresh[i] = true;
      }
      if (next[i] < best) {  // longest first, so a tie keeps the longer
        best = next[i];
        which = i;
      }
    }
    std::string_view plain =
        text.substr(at, best == std::string_view::npos ? std::string_view::npos : best - at);
    if (!plain.empty()) RETURN_IF_ERROR(impl_->EncodeOrdinary(plain, limit, &out));
    if (best == std::string_view::npos || out.size() >= limit) break;
    out.push_back(specials[which].second);
    at = best + specials[which].first.size();
  }
  return out;
}

const std::string& Tokenizer::Bytes(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && static_cast<size_t>(id) < impl_->bytes.size() ? impl_->bytes[static_cast<size_t>(id)]
                                                                  : kNone;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  if (impl_->wordpiece) {
    std::vector<std::string_view> tokens;
    for (int32_t id : ids) {
      if (id >= 0 && id < vocab_size()) tokens.push_back(impl_->text[static_cast<size_t>(id)]);
    }
    if (impl_->wordpiece_decoder) return WordPieceDecode(tokens, impl_->decoder_prefix, impl_->cleanup);
    std::string out;  // no decoder: the tokens with spaces between
    for (size_t i = 0; i < tokens.size(); ++i) (out += i > 0 ? " " : "") += tokens[i];
    return out;
  }
  std::string raw;
  for (int32_t id : ids) raw += Bytes(id);
  Utf8Stream s;
  return s.Push(raw) + s.Flush();
}

StatusOr<std::vector<int32_t>> Tokenizer::EncodeForModel(std::string_view text) const {
  ASSIGN_OR_RETURN(auto ids, Encode(text));
  return WithSpecialTokens(std::move(ids));
}

std::vector<int32_t> Tokenizer::WithSpecialTokens(std::vector<int32_t> ids) const {
  if (impl_->before.empty() && impl_->after.empty()) return ids;
  std::vector<int32_t> out = impl_->before;
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), impl_->after.begin(), impl_->after.end());
  return out;
}

Tokenizer::Kind Tokenizer::kind() const { return impl_->wordpiece ? Kind::kWordPiece : Kind::kByteLevelBpe; }

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->text.size()); }

size_t Tokenizer::max_token_bytes() const {
  size_t most = 1;
  for (const std::string& b : impl_->bytes) most = std::max(most, b.size());
  return most;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() &&
         impl_->special[static_cast<size_t>(id)];
}

int32_t Tokenizer::Find(std::string_view token) const {
  auto it = impl_->by_text.find(std::string(token));
  return it == impl_->by_text.end() ? -1 : it->second;
}

}  // namespace aotid::text
