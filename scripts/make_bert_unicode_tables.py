"""Writes text/bert_unicode_tables.inc, the character classes and mappings
the WordPiece tokenizer's BERT normalizer and pre-tokenizer use, by asking
the reference tokenizer (the `tokenizers` package) about every code point:

    .venv/bin/python scripts/make_bert_unicode_tables.py text/bert_unicode_tables.inc

(./dev's venv has `tokenizers`, with transformers.) Run it again, and
tests/text/make_wordpiece_fixture.py, when that package's version moves.

The reference's tables come from several Unicode versions (its general
categories are older than its case mappings), so they are read from it,
one step at a time, rather than from Unicode's own files. Decompositions
and canonical combining classes (which order the marks within one) come
from Python's unicodedata, limited to what the reference has; the script
checks that the two agree on what accent stripping leaves of every code
point and on the order it leaves marks in.
"""

import sys
import unicodedata

import tokenizers
from tokenizers import normalizers, pre_tokenizers

HANGUL = range(0xAC00, 0xD7A4)


def bert(**on):
    flags = dict(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    flags.update(on)
    return normalizers.BertNormalizer(**flags)


def ranges(cps):
    out = []
    for cp in sorted(cps):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def valued_ranges(d):
    out = []
    for cp in sorted(d):
        if out and out[-1][1] == cp - 1 and out[-1][2] == d[cp]:
            out[-1][1] = cp
        else:
            out.append([cp, cp, d[cp]])
    return out


def reference_combining_classes(strip, stripped):
    """The canonical combining classes the reference orders marks by.

    A class never changes once Unicode gives it, but the reference's
    tables are older than Python's: a mark they do not have yet is a
    starter (class 0) to them. Which marks they have shows in how they
    order two marks that stripping keeps, with the mark in question
    between them.
    """
    python = {cp: unicodedata.combining(chr(cp)) for cp in range(0x110000) if unicodedata.combining(chr(cp))}
    kept = [cp for cp in sorted(python) if stripped.get(cp) == chr(cp)]
    pair = next((p, q) for p in kept for q in kept
                if python[p] > python[q] and strip.normalize_str("a" + chr(p) + chr(q)) == "a" + chr(q) + chr(p))
    p, q = (chr(x) for x in pair)
    ccc = {}
    for cp, c in python.items():
        out = strip.normalize_str("a" + p + chr(cp) + q)
        if out.index(q) < out.index(p):
            ccc[cp] = c
    # Check: every two kept marks come out in the order these classes give.
    for x in kept:
        for y in kept:
            want = "a" + chr(x) + chr(y)
            if ccc.get(x, 0) > ccc.get(y, 0) > 0:
                want = "a" + chr(y) + chr(x)
            assert strip.normalize_str("a" + chr(x) + chr(y)) == want, (hex(x), hex(y))
    return ccc


def main():
    clean, cjk = bert(clean_text=True), bert(handle_chinese_chars=True)
    strip, lower = bert(strip_accents=True), bert(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    drop, space, chinese, split_space, punct = set(), set(), set(), set(), set()
    stripped, lowered = {}, {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        r = clean.normalize_str(c)
        if r == "":
            drop.add(cp)
        elif r == " " and c != " ":
            space.add(cp)
        else:
            assert r == c, hex(cp)
        if cp == 0x20:
            space.add(cp)
        r = cjk.normalize_str(c)
        if r != c:
            assert r == " " + c + " ", hex(cp)
            chinese.add(cp)
        stripped[cp] = strip.normalize_str(c)
        r = lower.normalize_str(c)
        if r != c:
            lowered[cp] = r
        pieces = [p for p, _ in pre.pre_tokenize_str("a" + c + "a")]
        if pieces == ["a", "a"]:
            split_space.add(cp)
        elif pieces == ["a", c, "a"]:
            punct.add(cp)
        else:
            assert pieces == ["a" + c + "a"], (hex(cp), pieces)
    # What the reference removes as a nonspacing mark: a code point that
    # stripping removes whole and that does not decompose.
    marks = {cp for cp, r in stripped.items() if r == "" and unicodedata.normalize("NFD", chr(cp)) == chr(cp)}
    decompose = {}
    for cp, r in stripped.items():
        if cp in HANGUL:
            continue
        nfd = unicodedata.normalize("NFD", chr(cp))
        if nfd != chr(cp) and r == chr(cp):
            nfd = r  # new to Unicode since the reference's tables: not decomposed there
        assert "".join(x for x in nfd if ord(x) not in marks) == r, (hex(cp), r, nfd)
        if nfd != chr(cp):
            assert len(nfd) <= 4
            decompose[cp] = [ord(x) for x in nfd]
    for cp in HANGUL:  # decomposed by rule, as the C++ does
        s = cp - 0xAC00
        want = [0x1100 + s // 588, 0x1161 + (s % 588) // 28] + ([0x11A7 + s % 28] if s % 28 else [])
        assert [ord(x) for x in stripped[cp]] == want, hex(cp)
    assert all(len(v) <= 3 for v in lowered.values())
    ccc = reference_combining_classes(strip, stripped)

    def range_table(name, what, rs):
        lines = [f"// {what}", f"constexpr Range {name}[] = {{"]
        row = ""
        for lo, hi in rs:
            item = f"{{0x{lo:X}, 0x{hi:X}}}, "
            if len(row) + len(item) > 100:
                lines.append("    " + row.rstrip())
                row = ""
            row += item
        lines.append("    " + row.rstrip())
        lines.append("};")
        return "\n".join(lines)

    def map_table(name, what, d):
        lines = [f"// {what}", f"constexpr Mapping {name}[] = {{"]
        row = ""
        for cp in sorted(d):
            to = d[cp] + [0] * (4 - len(d[cp]))
            item = f"{{0x{cp:X}, {len(d[cp])}, {{{', '.join(f'0x{x:X}' for x in to)}}}}}, "
            if len(row) + len(item) > 100:
                lines.append("    " + row.rstrip())
                row = ""
            row += item
        lines.append("    " + row.rstrip())
        lines.append("};")
        return "\n".join(lines)

    cccs = ["// Canonical combining classes other than 0, of the marks the reference has.",
            "constexpr ClassRange kCombiningClass[] = {"]
    row = ""
    for lo, hi, v in valued_ranges(ccc):
        item = f"{{0x{lo:X}, 0x{hi:X}, {v}}}, "
        if len(row) + len(item) > 100:
            cccs.append("    " + row.rstrip())
            row = ""
        row += item
    cccs += ["    " + row.rstrip(), "};"]

    parts = [
        "// Generated by scripts/make_bert_unicode_tables.py from the `tokenizers` package " + tokenizers.__version__
        + ": do not edit.",
        "// Included by text/wordpiece.cc, which defines Range, ClassRange and Mapping.",
        range_table("kCleanDrop", "Removed by clean_text (controls and formats, U+0000, U+FFFD).", ranges(drop)),
        range_table("kCleanSpace", "Turned into U+0020 by clean_text.", ranges(space)),
        range_table("kChinese", "Spaced out by handle_chinese_chars.", ranges(chinese)),
        range_table("kNonspacingMark", "Removed by strip_accents after decomposition.", ranges(marks)),
        map_table("kDecompose", "Canonical decompositions (NFD), but for Hangul syllables' (by rule).",
                  {k: v for k, v in decompose.items()}),
        map_table("kLower", "Lower-case mappings (lowercase).", {k: [ord(x) for x in v] for k, v in lowered.items()}),
        range_table("kSplitSpace", "Whitespace to the pre-tokenizer: split on and dropped.", ranges(split_space)),
        range_table("kPunctuation", "Punctuation to the pre-tokenizer: a piece of its own.", ranges(punct)),
        "\n".join(cccs),
    ]
    with open(sys.argv[1], "w") as f:
        f.write("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
