"""What the language-model tests share.

``Served``: a daemon serving a fresh store over loopback: packages added,
the daemon started on a free port, each model waited for (its first start
builds it), stopped on the way out.

    with Served(aotid, {"name": "x.pt2"}, tmp) as port:
        post(port, "/v2/models/name/generate", {...})

``ReadmeDaemon``: a daemon as an example's README starts it, for its
commands to run as written (see its docstring).

    with ReadmeDaemon(aotid, tmp) as readme:
        for c in commands[:3]:
            readme.run(c)
        readme.wait_ready("minilm", within_s=900)
        out = readme.run(readme.at_port(commands[3]))   # a curl to localhost:8765

``greedy_gaps``: how far each of a sequence's tokens falls short of the
eager model's greedy choice, fed the sequence itself (teacher forcing).
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


class Served:
    def __init__(self, aotid, packages, tmp, ready_within_s=900):
        self.aotid, self.packages, self.tmp, self.ready_within_s = aotid, packages, tmp, ready_within_s
        self.store = os.path.join(tmp, "store")
        self.log_path = os.path.join(tmp, "daemon.log")

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def __enter__(self):
        for name, pt2 in self.packages.items():
            subprocess.run([self.aotid, "--store", self.store, "add", pt2, "--name", name], check=True,
                           stdout=subprocess.DEVNULL)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        with open(self.log_path, "w") as log:
            self.daemon = subprocess.Popen([self.aotid, "--store", self.store, "serve", "--listen",
                                            f"127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + self.ready_within_s
            for name in self.packages:
                while True:
                    assert self.daemon.poll() is None, self.log()
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/models/{name}/ready", timeout=5)
                        break
                    except urllib.error.HTTPError as e:
                        # A load that failed stays failed: said now, not at the deadline.
                        body = e.read().decode(errors="replace")
                        assert '"failed"' not in body, f"{name} failed to load: {body}\n" + self.log()
                    except Exception:
                        pass
                    assert time.monotonic() < deadline, f"{name} did not get ready:\n" + self.log()
                    time.sleep(1)
        except BaseException:
            self.__exit__()
            raise
        return self.port

    def __exit__(self, *exc):
        self.daemon.terminate()
        self.daemon.wait(timeout=60)


class ReadmeDaemon:
    """``aotid serve`` with $AOTID_CONFIG naming a store and a free port of
    the test's own, and a shell to run a README's commands in: PATH has the
    build's aotid and this venv's python, as `./dev env` gives, and the
    working directory (``work``) has the repository's examples/. Two things
    are the test's: ``wait_ready`` waits for a model the commands added
    (its first start builds it), and ``at_port`` turns a command's
    localhost:8765 into that port. Stopped on the way out."""

    def __init__(self, aotid, tmp, log_name="daemon.log"):
        self.aotid, self.tmp = aotid, tmp
        self.log_path = os.path.join(tmp, log_name)
        self.work = os.path.join(tmp, "readme")

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def __enter__(self):
        os.makedirs(self.work)
        os.symlink(os.path.join(ROOT, "examples"), os.path.join(self.work, "examples"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = os.path.join(self.tmp, "aotid.toml")
        with open(config, "w") as f:
            f.write(f'[store]\npath = "{os.path.join(self.tmp, "store")}"\n'
                    f'[server]\nlisten = "127.0.0.1:{self.port}"\n')
        self.env = {**os.environ, "AOTID_CONFIG": config, "PYTHONPATH": os.path.join(ROOT, "python"),
                    "PATH": os.pathsep.join([os.path.dirname(os.path.abspath(self.aotid)),
                                             os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
        with open(self.log_path, "w") as log:
            self.daemon = subprocess.Popen([self.aotid, "serve"], env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc):
        self.daemon.terminate()
        self.daemon.wait(timeout=60)

    def at_port(self, command):
        """``command`` asking this daemon rather than localhost:8765."""
        moved = command.replace("localhost:8765", f"localhost:{self.port}")
        assert moved != command, f"{command!r} no longer asks localhost:8765"
        return moved

    def run(self, command):
        """Runs ``command`` (bash, -euo pipefail) in ``work``; returns what it
        printed."""
        print("$", command, flush=True)
        return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=self.work, env=self.env,
                              check=True, stdout=subprocess.PIPE, text=True).stdout

    def wait_ready(self, name, within_s):
        deadline = time.monotonic() + within_s
        while True:
            assert self.daemon.poll() is None, self.log()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/models/{name}/ready", timeout=5)
                return
            except Exception:
                assert time.monotonic() < deadline, f"{name} did not get ready:\n" + self.log()
                time.sleep(1)


def greedy_gaps(model, prompt_ids, tokens):
    """For each token of ``tokens``: (the step's largest logit minus the
    token's) over the largest logit's magnitude, with ``model`` (a stateful
    ``(tokens[1, T], input_pos[T]) -> logits[1, vocab]`` module) run on the
    prompt and then on each token in turn. 0 where the token is the eager
    greedy choice."""
    gaps = []
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt_ids)]), torch.arange(len(prompt_ids)))
        pos = len(prompt_ids)
        for t in tokens:
            row = logits[0].float()
            top = row.max()
            gaps.append(float((top - row[t]) / top.abs()))
            logits = model(torch.tensor([[t]]), torch.tensor([pos]))
            pos += 1
    return gaps
