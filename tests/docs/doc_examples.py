"""The examples of the README and the docs, as a reader would copy them.

Every fenced block of README.md, docs/*.md and examples/*/README.md, with
its language. A ``sh`` block is split into whole commands: a command starts
at a line whose program (after any VAR=value) is one the docs run
(``PROGRAMS``), and goes on over the lines a backslash, an open quote or a
here-document carry on; comments are left out, and the lines after a
command that start none are the output the docs show for it. A ``python``
block is one command, whole, and so is a ``toml`` block, a configuration
for aotid to read. ``text`` and ``json`` blocks (diagrams, layouts, what a
file or a route holds) hold no commands.

tests/docs/example_claims.py says which test runs each block.
"""

import glob
import hashlib
import os
import re
import shlex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The programs the docs' shell examples run, by the last part of their path
# (`build/aotid`, `~/.local/aotid/bin/pip` and `./dev` count).
PROGRAMS = {"aotid", "aotid-export", "cat", "curl", "dev", "docker", "k3s", "kubectl", "mkdir", "oras", "pip", "podman",
            "python", "python3", "setpriv", "skopeo", "sudo", "umoci"}
SHELL, PYTHON, CONFIG, DATA = ("sh",), ("python",), ("toml",), ("text", "json")
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*=")
HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_]+)['\"]?")


class Command:
    def __init__(self, text, line):
        self.text, self.line, self.output = text, line, []

    def shown_output(self):
        """The output the docs show after this command, as one string."""
        return "\n".join(self.output)

    def __repr__(self):
        return f"Command(line {self.line}: {self.text!r})"


class Block:
    def __init__(self, path, line, lang, text):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.commands, self.strays = [], []  # strays: lines of a sh block no command accounts for
        if lang in SHELL:
            self._split_shell()
        elif lang in PYTHON + CONFIG:
            self.commands = [Command(text, line + 1)]

    def where(self):
        return f"{self.path}:{self.line}"

    def digest(self):
        """8 hex digits that change when a command of the block does (its
        comments and shown output aside)."""
        text = "\n\0".join(c.text for c in self.commands)
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def __repr__(self):
        return f"Block({self.where()} {self.lang})"

    def _split_shell(self):
        pending, start, heredoc = None, 0, None
        for n, line in enumerate(self.text.splitlines(), self.line + 1):
            if pending is not None:
                pending += "\n" + line
                # A here-document's body runs to its delimiter; other lines
                # go on while a backslash or an open quote carries them.
                if (line.strip() == heredoc) if heredoc else _complete(pending):
                    self.commands.append(Command(pending, start))
                    pending = heredoc = None
            elif not line.strip() or line.lstrip().startswith("#"):
                continue
            elif starts_command(line):
                heredoc = _open_heredoc(line)
                if heredoc is None and _complete(line):
                    self.commands.append(Command(line, n))
                else:
                    pending, start = line, n
            elif self.commands:
                self.commands[-1].output.append(line)
            else:
                self.strays.append(f"{self.path}:{n}: {line}")
        if pending is not None:
            self.strays.append(f"{self.path}:{start}: a command that never ends: {pending}")


def starts_command(line):
    """Whether a shell line starts a command of a program in PROGRAMS."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()  # the line opens a quote the next line closes
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    return bool(words) and os.path.basename(words[0]) in PROGRAMS


def _open_heredoc(line):
    """The delimiter of the here-document a command's first line opens."""
    m = HEREDOC.search(line)
    return m.group(1) if m else None


def _complete(text):
    """Whether a command's text ends here: no backslash carries it on and no
    quote is left open."""
    if text.endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
        return True
    except ValueError:
        return False


def doc_files(root=ROOT):
    """README.md, docs/*.md and examples/*/README.md, relative to root."""
    paths = ["README.md"] + sorted(glob.glob("docs/*.md", root_dir=root))
    return paths + sorted(glob.glob("examples/*/README.md", root_dir=root))


def blocks(path, root=ROOT):
    """The fenced blocks of one doc, in order."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        text = f.read()
    return [Block(path, text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2))
            for m in FENCE.finditer(text)]


def all_blocks(root=ROOT):
    return [b for path in doc_files(root) for b in blocks(path, root)]


def find(path, marker, root=ROOT):
    """The one block of `path` whose text holds `marker`."""
    found = [b for b in blocks(path, root) if marker in b.text]
    assert len(found) == 1, f"{path}: {len(found)} blocks hold {marker!r}, not one"
    return found[0]


def shape(value):
    """A JSON value's shape: its keys, nested, and what its lists hold
    (their first element), without the values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None
