#include "text/wordpiece.h"

#include <algorithm>
#include <iterator>

namespace aotid::text {
namespace {

struct Range {
  char32_t lo, hi;
};
struct ClassRange {
  char32_t lo, hi;
  uint8_t ccc;
};
struct Mapping {
  char32_t from;
  uint8_t n;
  char32_t to[4];
};

#include "text/bert_unicode_tables.inc"

template <size_t N>
bool In(const Range (&table)[N], char32_t c) {
  auto it = std::upper_bound(std::begin(table), std::end(table), c,
                             [](char32_t v, const Range& r) { return v < r.lo; });
  return it != std::begin(table) && c <= std::prev(it)->hi;
}

template <size_t N>
const Mapping* Find(const Mapping (&table)[N], char32_t c) {
  auto it = std::lower_bound(std::begin(table), std::end(table), c,
                             [](const Mapping& m, char32_t v) { return m.from < v; });
  return it != std::end(table) && it->from == c ? it : nullptr;
}

uint8_t CombiningClass(char32_t c) {
  auto it = std::upper_bound(std::begin(kCombiningClass), std::end(kCombiningClass), c,
                             [](char32_t v, const ClassRange& r) { return v < r.lo; });
  return it != std::begin(kCombiningClass) && c <= std::prev(it)->hi ? std::prev(it)->ccc : 0;
}

// The code point at s[*i] (valid UTF-8), advancing *i past it.
char32_t Next(std::string_view s, size_t* i) {
  auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[*i + k])); };
  char32_t lead = b(0);
  if (lead < 0x80) {
    *i += 1;
    return lead;
  }
  if (lead < 0xE0) {
    char32_t c = ((lead & 0x1F) << 6) | (b(1) & 0x3F);
    *i += 2;
    return c;
  }
  if (lead < 0xF0) {
    char32_t c = ((lead & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    *i += 3;
    return c;
  }
  char32_t c = ((lead & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  *i += 4;
  return c;
}

void Append(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// NFD: each character's full canonical decomposition (Hangul syllables by
// Unicode's rule), then each run of marks put in order of their combining
// classes (a stable sort: marks of one class keep their order).
std::u32string Decompose(const std::u32string& in) {
  std::u32string out;
  out.reserve(in.size());
  for (char32_t c : in) {
    if (c >= 0xAC00 && c <= 0xD7A3) {
      char32_t s = c - 0xAC00;
      out.push_back(0x1100 + s / 588);
      out.push_back(0x1161 + (s % 588) / 28);
      if (s % 28 != 0) out.push_back(0x11A7 + s % 28);
    } else if (const Mapping* m = Find(kDecompose, c)) {
      out.append(m->to, m->n);
    } else {
      out.push_back(c);
    }
  }
  for (size_t i = 0; i < out.size();) {
    size_t j = i;
    while (j < out.size() && CombiningClass(out[j]) != 0) ++j;
    if (j - i > 1) {
      std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(i),
                       out.begin() + static_cast<std::ptrdiff_t>(j),
                       [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    }
    i = j == i ? i + 1 : j;
  }
  return out;
}

// Whether a text may be cut just before `c` so that normalizing and
// pre-tokenizing each side gives what doing the whole would. Normalizing
// goes character by character but for the marks that NFD puts in order,
// which `c` stops (combining class 0, no decomposition); then `c` must
// come out as one character that the pre-tokenizer splits at, or as an
// ideograph that CJK spacing puts spaces around, so that no word spans it.
bool CutsBefore(char32_t c, const BertNormalizer* n) {
  if (CombiningClass(c) != 0 || Find(kDecompose, c) != nullptr || (c >= 0xAC00 && c <= 0xD7A3)) return false;
  if (n != nullptr) {
    if (n->clean_text && In(kCleanDrop, c)) return false;
    if (n->clean_text && In(kCleanSpace, c)) c = U' ';
    if (n->handle_chinese_chars && In(kChinese, c)) return true;
    if (n->strip_accents && In(kNonspacingMark, c)) return false;
    if (const Mapping* m = n->lowercase ? Find(kLower, c) : nullptr) {
      if (m->n != 1) return false;
      c = m->to[0];
    }
  }
  return In(kSplitSpace, c) || In(kPunctuation, c);
}

// The first place at or after `from` where `text` may be cut (CutsBefore),
// or its end.
size_t NextCut(std::string_view text, size_t from, const BertNormalizer* n) {
  size_t i = from;
  while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
  while (i < text.size()) {
    size_t at = i;
    if (CutsBefore(Next(text, &i), n)) return at;
  }
  return text.size();
}

}  // namespace

size_t BertEncode(std::string_view text, const BertNormalizer* normalizer, bool pre_tokenize,
                  const std::function<void(std::string_view word, std::vector<int32_t>* out)>& encode,
                  size_t limit, std::vector<int32_t>* out, size_t stretch_bytes) {
  const size_t size = text.size();
  size_t stretch = std::max<size_t>(stretch_bytes, 1);
  while (!text.empty() && out->size() < limit) {
    // Never at 0 (`stretch` is at least 1), so each turn goes on.
    const size_t cut =
        pre_tokenize && stretch < text.size() ? NextCut(text, stretch, normalizer) : text.size();
    const std::string normalized =
        normalizer ? normalizer->Normalize(text.substr(0, cut)) : std::string(text.substr(0, cut));
    if (pre_tokenize) {
      for (std::string_view w : BertPreTokenize(normalized)) {
        if (out->size() >= limit) break;
        encode(w, out);
      }
    } else if (!normalized.empty()) {
      encode(normalized, out);
    }
    text.remove_prefix(cut);
    if (stretch < text.size()) stretch *= 2;
  }
  if (out->size() > limit) out->resize(limit);
  return size - text.size();
}

std::string BertNormalizer::Normalize(std::string_view text) const {
  std::u32string cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) cps.push_back(Next(text, &i));
  std::u32string step;
  if (clean_text) {
    for (char32_t c : cps) {
      if (In(kCleanDrop, c)) continue;
      step.push_back(In(kCleanSpace, c) ? U' ' : c);
    }
    cps.swap(step);
    step.clear();
  }
  if (handle_chinese_chars) {
    for (char32_t c : cps) {
      if (In(kChinese, c)) {
        step += U' ';
        step += c;
        step += U' ';
      } else {
        step.push_back(c);
      }
    }
    cps.swap(step);
    step.clear();
  }
  if (strip_accents) {
    for (char32_t c : Decompose(cps)) {
      if (!In(kNonspacingMark, c)) step.push_back(c);
    }
    cps.swap(step);
    step.clear();
  }
  if (lowercase) {
    for (char32_t c : cps) {
      if (const Mapping* m = Find(kLower, c)) {
        step.append(m->to, m->n);
      } else {
        step.push_back(c);
      }
    }
    cps.swap(step);
  }
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) Append(c, &out);
  return out;
}

std::vector<std::string_view> BertPreTokenize(std::string_view text) {
  std::vector<std::string_view> words;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    size_t at = i;
    char32_t c = Next(text, &i);
    bool space = In(kSplitSpace, c);
    if (!space && !In(kPunctuation, c)) continue;
    if (at > start) words.push_back(text.substr(start, at - start));
    if (!space) words.push_back(text.substr(at, i - at));
    start = i;
  }
  if (start < text.size()) words.push_back(text.substr(start));
  return words;
}

void WordPieceEncode(std::string_view word, const std::function<int32_t(const std::string&)>& find,
                     std::string_view prefix, size_t max_chars, size_t longest_token, int32_t unk,
                     std::vector<int32_t>* out) {
  // Where each character starts, and the end; counted no further than
  // shows the word too long (a word may be megabytes).
  std::vector<size_t> bounds;
  for (size_t i = 0; i < word.size() && bounds.size() <= max_chars;) {
    bounds.push_back(i);
    Next(word, &i);
  }
  if (bounds.size() > max_chars) {
    out->push_back(unk);
    return;
  }
  bounds.push_back(word.size());
  const size_t before = out->size();
  std::string piece;
  for (size_t start = 0; start + 1 < bounds.size();) {
    int32_t id = -1;
    // No longer than the longest token: what is longer matches none.
    const size_t budget =
        bounds[start] + longest_token - (start > 0 ? std::min(prefix.size(), longest_token) : 0);
    size_t end =
        static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), budget) - bounds.begin()) - 1;
    for (; end > start; --end) {
      piece.assign(start > 0 ? prefix : std::string_view());
      piece.append(word.substr(bounds[start], bounds[end] - bounds[start]));
      id = find(piece);
      if (id >= 0) break;
    }
    if (id < 0) {
      out->resize(before);
      out->push_back(unk);
      return;
    }
    out->push_back(id);
    start = end;
  }
}

std::string WordPieceDecode(const std::vector<std::string_view>& tokens, std::string_view prefix,
                            bool cleanup) {
  static constexpr std::pair<std::string_view, std::string_view> kCleanups[] = {
      {" .", "."},   {" ?", "?"},           {" !", "!"},   {" ,", ","},     {" ' ", "'"},    {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
  };
  std::string out, t;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string_view token = tokens[i];
    if (i > 0 && token.substr(0, prefix.size()) == prefix) {
      t.assign(token.substr(prefix.size()));
    } else {
      t.assign(i > 0 ? " " : "");
      t.append(token);
    }
    if (cleanup) {
      for (const auto& [from, to] : kCleanups) {
        for (size_t at = t.find(from); at != std::string::npos; at = t.find(from, at + to.size())) {
          t.replace(at, from.size(), to);
        }
      }
    }
    out += t;
  }
  return out;
}

}  // namespace aotid::text
