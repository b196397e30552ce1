#!/usr/bin/env python3
"""Checks shell scripts for what macOS's /bin/bash (3.2) refuses.

    scripts/bash32_check.py FILE...

bash 3.2 cannot be run here (no package of it exists in the registries this
project reaches), so this reads the scripts instead, and says what it
catches:

  - constructs bash 3.2 does not have: mapfile/readarray, associative
    arrays (declare/local/typeset -A), namerefs (-n), case modification
    (${v,,} ${v^^}), ${v@Q}-style transformations, &>> and |&, ;& and ;;&
    in case, coproc, [[ -v ]], wait -n, read -N/-i, globstar, lastpipe,
    $EPOCHSECONDS/$EPOCHREALTIME/$BASHPID, negative array subscripts
    ${a[-1]}, {a..b..step} brace steps (all bash 4.0 to 4.4, per bash's
    CHANGES file);
  - the one that bites most often: under `set -u`, bash before 4.4 stops
    with "unbound variable" on "${a[@]}" (or ${a[*]}, or a slice of it) when
    the array is empty. An expansion passes when it is written
    ${a[@]+"${a[@]}"}, or when every assignment to `a` in the file is a
    list with at least one word that cannot vanish (a literal or a quoted
    string, not "$@", "${b[@]}" or an unquoted $x) or an append (a+=(...)).
    Anything else is reported, guarded or not: the check does not follow
    control flow, so a use behind `if ((${#a[@]}))` is reported too and is
    written with the idiom.

What it does not catch: behaviour that differs without a syntax error
(word splitting, locale, `printf` formats, builtin options it does not
list) and constructs built at run time (eval). Those show on the macOS
runner, which runs ./dev with /bin/bash (.github/workflows/macos.yml).
Lines ending in `# bash32: ok (<reason>)` are skipped, with the reason
kept in the file.
"""
import re
import sys

BASH4 = [
    (r"\b(mapfile|readarray)\b", "mapfile/readarray (bash 4.0)"),
    (r"\b(declare|local|typeset)\s+(-\w*\s+)*-\w*A", "associative array (bash 4.0)"),
    (r"\b(declare|local|typeset)\s+(-\w*\s+)*-\w*n\b", "nameref (bash 4.3)"),
    (r"\$\{[#!]?\w+(\[[^]]*\])?(,,?|\^\^?)[^}]*\}", "case modification ${v,,} ${v^^} (bash 4.0)"),
    (r"\$\{\w+(\[[^]]*\])?@[QEPAaUuLK]\}", "${v@op} transformation (bash 4.4)"),
    (r"&>>", "&>> (bash 4.0)"),
    (r"\|&", "|& (bash 4.0)"),
    (r";;&|;&", "case fall-through ;& or ;;& (bash 4.0)"),
    (r"^\s*coproc\b", "coproc (bash 4.0)"),
    (r"\[\[\s+-v\s", "[[ -v ]] (bash 4.2)"),
    (r"\bwait\s+-n\b", "wait -n (bash 4.3)"),
    (r"\bread\s+(-\w+\s+)*-\w*[Ni]\b", "read -N / -i (bash 4.0/4.1)"),
    (r"\bshopt\s+-s\s+(globstar|lastpipe)\b", "globstar/lastpipe (bash 4.0/4.2)"),
    (r"\$\{?(EPOCHSECONDS|EPOCHREALTIME|BASHPID)\b", "$EPOCHSECONDS/$EPOCHREALTIME/$BASHPID (bash 4.x/5)"),
    (r"\$\{\w+\[-\d+\]\}", "negative array subscript (bash 4.3)"),
    (r"\{[^{}\s]+\.\.[^{}\s]+\.\.[^{}\s]+\}", "brace expansion with a step (bash 4.0)"),
]

EXPANSION = re.compile(r"\$\{(\w+)\[[@*]\][^}]*\}")
IDIOM = re.compile(r'\$\{(\w+)\[([@*])\]\+"?\$\{\1\[\2\]\}"?\}')
ASSIGN = re.compile(r"(?:^|[\s;&|(])(\w+)(\+?)=\(")
OTHER_FILL = re.compile(r"\b(?:read\s+(?:-\w+\s+)*-a\s*|mapfile\s+(?:-\w+\s+)*|readarray\s+(?:-\w+\s+)*)(\w+)")


def strip_comment(line):
    """The line without a trailing comment (a # at a word's start, outside quotes)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;"):
            return line[:i]
    return line


def list_body(text, start):
    """The text of a (...) list that opens at text[start] == '(' (it may span lines)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    return text[start + 1:]


def surely_nonempty(body):
    """True when the list has a word that always expands to one word."""
    for word in re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[^\s"\']+', body):
        if word.startswith("'"):
            return True
        if word.startswith('"'):
            if "[@]" not in word and "$@" not in word and "[*]" not in word:
                return True
        elif "$" not in word and "`" not in word:
            return True
    return False


def check(path):
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    problems = []
    uses_nounset = re.search(r"^\s*set\s+-[a-z]*u", text, re.M) or re.search(r"set\s+-o\s+nounset", text)
    # Arrays that may be empty: any assignment that is not surely non-empty.
    maybe_empty = set()
    code = "\n".join(strip_comment(l) for l in lines)
    for m in ASSIGN.finditer(code):
        name, append = m.group(1), m.group(2)
        if append:
            continue
        if not surely_nonempty(list_body(code, m.end() - 1)):
            maybe_empty.add(name)
    for m in OTHER_FILL.finditer(code):
        maybe_empty.add(m.group(1))
    for n, raw in enumerate(lines, 1):
        if re.search(r"#\s*bash32:\s*ok\s*\(.+\)", raw):
            continue
        line = strip_comment(raw)
        for pattern, what in BASH4:
            if re.search(pattern, line):
                problems.append(f"{path}:{n}: {what}: {raw.strip()}")
        if not uses_nounset:
            continue
        bare = IDIOM.sub("", line)
        for m in EXPANSION.finditer(bare):
            name = m.group(1)
            if name in maybe_empty or not re.search(rf"(?:^|[\s;&|(]){name}\+?=\(", code):
                problems.append(
                    f"{path}:{n}: {m.group(0)} of an array that may be empty, under set -u "
                    f'(bash < 4.4: "unbound variable"); write ${{{name}[@]+"${{{name}[@]}}"}}: {raw.strip()}')
    return problems


def main():
    problems = []
    for path in sys.argv[1:]:
        problems += check(path)
    for p in problems:
        print(p)
    if problems:
        print(f"bash 3.2: {len(problems)} construct(s) above that macOS's /bin/bash refuses")
        return 1
    print(f"bash 3.2: {len(sys.argv) - 1} scripts ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
