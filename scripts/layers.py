#!/usr/bin/env python3
"""The folders of aotid's C++ code and the layers they form: the one place
the layering is written down.

Each folder is one CMake library. Its code may include headers of the
folders listed for it here, and of the folders those may include, down to
base/: an include of a folder above or beside it fails the check. Tests
(tests/), benchmarks and fuzz targets may include anything.

  scripts/layers.py check ROOT   fails on an include against the layers, or
                                 on a README diagram that is not current
  scripts/layers.py diagram      prints the diagram the README carries
"""
import os
import re
import sys

# folder: the folders directly below it that its code uses. Every folder
# with C++ code is here; a new one must be placed before it builds.
LAYERS = {
    "daemon": ["control", "sync"],
    "control": ["serving", "runner", "compile"],
    "sync": ["http", "storage"],
    "serving": ["http", "rpc", "model", "storage", "text"],
    "runner": ["runtime"],
    "compile": ["runtime", "package"],
    "runtime": ["model", "platform"],
    "storage": ["package"],
    "http": ["base"],
    "rpc": ["base"],
    "text": ["base"],
    "package": ["base"],
    "model": ["base"],
    "platform": ["base"],
    "base": [],
}

WHAT = {
    "daemon": "command line, config, serve, doctor, service glue",
    "control": "reconciler, store watch, build orchestration",
    "sync": "registries and folders that feed the store",
    "serving": "HTTP and gRPC calls, tensor codec, served versions, batching, metrics",
    "runner": "the runner process that holds a loaded model",
    "compile": "builds for this machine, their cache and its policy, the build child",
    "runtime": "loading compiled models (the torch plugin), thread timing",
    "model": "tensors, model specs, the served-model interface",
    "platform": "hardware and fingerprint, device probe, install layout, confinement, memory",
    "storage": "the SQLite store and its blobs",
    "http": "HTTP/1.1 server and parser: knows nothing of models",
    "rpc": "gRPC transport: the protocol's .proto, listener and limits",
    "text": "tokenizers and generation settings",
    "package": ".pt2 archives and their metadata",
    "base": "status, files, logging, JSON, clocks: what every layer uses",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/', re.M)
BEGIN, END = "<!-- layers: scripts/layers.py diagram -->", "<!-- /layers -->"


def below(folder):
    """Every folder `folder` may include, itself included."""
    seen, todo = {folder}, list(LAYERS[folder])
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(LAYERS[f])
    return seen


def diagram():
    width = max(len(f) for f in LAYERS) + 1
    lines = ["```text"]
    for f, deps in LAYERS.items():
        arrow = " → " + ", ".join(deps) if deps else "   (nothing)"
        lines.append(f"{f + '/':<{width}}{arrow:<36} {WHAT[f]}")
    lines.append("```")
    return "\n".join(lines)


def check(root):
    problems = []
    for folder in LAYERS:
        allowed = below(folder)
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    if target in LAYERS and target not in allowed:
                        line = text.count("\n", 0, m.start()) + 1
                        problems.append(f"{os.path.relpath(path, root)}:{line}: {folder}/ includes {target}/, "
                                        f"which is not below it (scripts/layers.py: {folder} → "
                                        f"{', '.join(LAYERS[folder]) or 'nothing'})")
    code_dirs = {d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "CMakeLists.txt"))}
    for d in sorted(code_dirs - set(LAYERS) - {"tests", "bench", "python"}):
        problems.append(f"{d}/: a folder with a CMakeLists.txt that scripts/layers.py does not place")
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < 0 or readme[start + len(BEGIN):end].strip() != diagram():
        problems.append("README.md: the layers diagram is not current; put the output of "
                        f"`scripts/layers.py diagram` between {BEGIN} and {END}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "diagram":
        print(diagram())
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
