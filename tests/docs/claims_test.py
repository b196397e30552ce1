"""Every example of the docs is run by a test or excused with a reason
(tests/docs/example_claims.py), and every claim names a block that is there.

    claims_test.py

A checker that passed everything would pass here too, so it is first shown
a checkout of its own making, with an example no one claims, a claim on a
block that went, an excused block that changed and a block without a
language, and must name each; and the splitter must keep continued lines,
open quotes and here-documents with their commands.
"""

import os
import re
import sys
import tempfile

import doc_examples
import example_claims

TESTS = os.path.dirname(example_claims.HERE)


def problems(root, run, not_run, tests_dir=TESTS):
    """What is wrong with the docs under `root` and the registry (RUN,
    NOT_RUN), one line each."""
    found = []
    claims = {}  # doc -> [(piece of a block, the test that runs it or "not run")]
    for test, (source, names) in run.items():
        try:
            text = open(os.path.join(tests_dir, source), encoding="utf-8").read()
        except OSError as e:
            found.append(f"{test}: its source tests/{source}: {e.strerror}")
            text = ""
        for path, marker in names:
            if marker not in text:
                found.append(f"{test} claims {path}'s block holding {marker!r}, but tests/{source} never asks for it")
            claims.setdefault(path, []).append((marker, test))
    digests = {}
    for path, marker, digest, why in not_run:
        assert why, (path, marker)
        claims.setdefault(path, []).append((marker, "not run"))
        digests[(path, marker)] = digest
    cmake = open(os.path.join(tests_dir, "CMakeLists.txt"), encoding="utf-8").read()
    for test in run:
        if not re.search(rf"add_test\(NAME {re.escape(test)}\s", cmake):
            found.append(f"{test}: no such test in tests/CMakeLists.txt")

    taken = {}
    for path, named in claims.items():
        if not os.path.exists(os.path.join(root, path)):
            found.append(f"{path}: claimed, but there is no such doc")
            continue
        docs = doc_examples.blocks(path, root)
        for marker, who in named:
            hits = [b for b in docs if marker in b.text]
            if len(hits) != 1:
                found.append(f"{path}: {len(hits)} blocks hold {marker!r} ({who}), not one")
            elif not hits[0].commands:
                found.append(f"{hits[0].where()}: claimed ({who}) but holds no command")
            else:
                taken.setdefault(hits[0].where(), []).append(who)
                now = hits[0].digest()
                if who == "not run" and digests[(path, marker)] != now:
                    found.append(f"{hits[0].where()}: the commands of an excused block changed: run it in a test "
                                 f"(RUN), or see that the reason still holds and put its digest {now} in NOT_RUN")

    for b in doc_examples.all_blocks(root):
        if not b.lang:
            found.append(f"{b.where()}: a block without a language; say sh, python, text, json or toml")
        elif b.lang not in doc_examples.SHELL + doc_examples.PYTHON + doc_examples.CONFIG + doc_examples.DATA:
            found.append(f"{b.where()}: language {b.lang!r}; say sh, python, text, json or toml")
        found.extend(f"{s}: neither a command of {sorted(doc_examples.PROGRAMS)} nor output after one"
                     for s in b.strays)
        if b.lang in doc_examples.SHELL and not b.commands and not b.strays:
            found.append(f"{b.where()}: a sh block without a command")
        who = taken.get(b.where(), [])
        if b.commands and not who:
            found.append(f"{b.where()}: an example no test runs; run it in a test and claim it in "
                         "tests/docs/example_claims.py (RUN), or say why not (NOT_RUN)")
        elif len(who) > 1:
            found.append(f"{b.where()}: claimed more than once: {who}")
    return found


def splitter_keeps_commands_whole():
    text = ("# a comment\nFOO=1 build/aotid ls   # trailing\nNAME  VERSION\n"
            "curl -s x \\\n  -d '{\"a\":\n   1}'\n{\"out\": 1}\n"
            "cat > f <<'EOF'\nit's here\nEOF\npython -c 'print(1)\nprint(2)'\n")
    b = doc_examples.Block("X.md", 1, "sh", text)
    got = [(c.text, c.output) for c in b.commands]
    want = [("FOO=1 build/aotid ls   # trailing", ["NAME  VERSION"]),
            ("curl -s x \\\n  -d '{\"a\":\n   1}'", ['{"out": 1}']),
            ("cat > f <<'EOF'\nit's here\nEOF", []),
            ("python -c 'print(1)\nprint(2)'", [])]
    assert got == want and not b.strays, (got, b.strays)
    print(f"ok: the splitter keeps {len(want)} commands whole, their output apart")


def checker_names_what_is_wrong():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("```sh\ncurl -s localhost:8765/v2/health/ready\n```\n\n"
                    "```sh\naotid ls\nNAME VERSION\n```\n\n```\naotid rm x\n```\n\n```sh\nmake all\n```\n")
        with open(os.path.join(root, "docs", "X.md"), "w") as f:
            f.write("```python\nprint(1)\n```\n")
        run = {"docs.EveryExampleRunOrExcused": ("docs/claims_test.py", [("README.md", "aotid ls")])}
        not_run = [("README.md", "aotid ls", "0", "twice"), ("docs/X.md", "print(2)", "0", "went"),
                   ("README.md", "aotid rm x", "0", "changed")]
        got = problems(root, run, not_run)
    want = ["README.md:1: an example no test runs", "README.md:5: claimed more than once",
            "docs/X.md: 0 blocks hold 'print(2)'", "docs/X.md:1: an example no test runs",
            "README.md:10: a block without a language", "README.md:15: make all: neither a command",
            "README.md:5: the commands of an excused block changed"]
    for w in want:
        assert any(w in p for p in got), f"the checker missed {w!r}:\n" + "\n".join(got)
    print(f"ok: the checker names all {len(want)} faults of a made-up checkout")


def main():
    splitter_keeps_commands_whole()
    checker_names_what_is_wrong()
    found = problems(doc_examples.ROOT, example_claims.RUN, example_claims.NOT_RUN)
    if found:
        sys.exit("\n".join(found))
    n = sum(1 for b in doc_examples.all_blocks() if b.commands)
    print(f"ok: {n} examples, each run by a test or excused")


if __name__ == "__main__":
    main()
