"""The docs' examples that need only aotid and the models a reader makes,
run as written: the demo's curl lines after `./dev run`, and the author's
and the device's side of "Using it" (export from the command line, add,
serve, ls, infer), each command in a shell whose PATH has the build's aotid
and this venv's python, as `./dev env` gives, in a folder laid out as the
checkout is (build/, .venv/, python/, examples/, scripts/); and
docs/SYNC.md's [[sync]] table, read by aotid as a configuration.

    examples_test.py AOTID

Each block's daemon has a store and a port of the test's own through
$AOTID_CONFIG, and the curl lines' localhost:8765 becomes that port; the
rest is the test's: it waits for a model to be ready before its curl (the
README says the first start builds it), and it makes what the README leaves
to the reader (mypkg/models.py, the ./my-bert folder, request.json). Every
command exits 0 and the answers are eager PyTorch's.
tests/docs/example_claims.py lists the blocks this test runs.
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import doc_examples
import example_claims

ROOT = doc_examples.ROOT
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
from aotid_export.demo import make_model as make_demo  # noqa: E402

AOTID = os.path.abspath(sys.argv[1])
TEST = "docs.ExamplesRunAsWritten"
DEMO_INPUT = [1.0, 2.0, 3.0, 4.0]  # the README's infer request

# What the README's "Using it" leaves to the reader: a package of models.
MYPKG = '''
import torch


def make_model():  # x [batch, 8] -> scores [batch, 3]
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()


class Encoder(torch.nn.Module):  # token ids and their mask -> the mean of their embeddings
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 4)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).float()
        return (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)


def make_encoder():
    return Encoder().eval()
'''


class Checkout:
    """A folder laid out as the checkout is, for one block's commands, with
    a store and a port of its own."""

    def __init__(self, tmp, name):
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        for part in ("examples", "python", "scripts"):
            os.symlink(os.path.join(ROOT, part), os.path.join(self.dir, part))
        os.symlink(os.path.dirname(AOTID), os.path.join(self.dir, "build"))
        os.symlink(sys.prefix, os.path.join(self.dir, ".venv"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = os.path.join(tmp, f"{name}.toml")
        with open(config, "w") as f:
            f.write(f'[store]\npath = "{os.path.join(tmp, name + "-store")}"\n'
                    f'[server]\nlisten = "127.0.0.1:{self.port}"\n')
        self.env = {**os.environ, "AOTID_CONFIG": config, "PYTHONPATH": os.path.join(ROOT, "python"),
                    "PATH": os.pathsep.join([os.path.dirname(AOTID), os.path.dirname(sys.executable),
                                             os.environ.get("PATH", "")])}
        self.log_path = os.path.join(tmp, f"{name}-daemon.log")
        self.daemon = None

    def command(self, command):
        """The command's text, its curl asking this checkout's daemon."""
        text = command.text.replace("localhost:8765", f"localhost:{self.port}")
        assert "curl" not in text or text != command.text, f"{command}: a curl that does not ask localhost:8765"
        return text

    def run(self, command):
        text = self.command(command)
        print("$", text, flush=True)
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=self.dir, env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}"
        return done.stdout

    def serve(self, text):
        """Starts the daemon with a command of the docs' (it serves until stopped)."""
        print("$", text, "&", flush=True)
        log = open(self.log_path, "w")
        self.daemon = subprocess.Popen(["bash", "-euo", "pipefail", "-c", "exec " + text], cwd=self.dir,
                                       env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, model, within_s=600):
        deadline = time.monotonic() + within_s
        while True:
            assert self.daemon.poll() is None, f"the daemon exited:\n{self.log()}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/models/{model}/ready", timeout=5)
                return
            except Exception:
                assert time.monotonic() < deadline, f"{model} did not get ready:\n{self.log()}"
                time.sleep(0.5)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.terminate()
            self.daemon.wait(timeout=60)


def close(got, want, what):
    torch.testing.assert_close(torch.tensor(got["data"]).reshape(want.shape), want, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"{what}: {m}")


def start_dev_run(tmp):
    """`./dev run` once it has built: scripts/run-default.sh adds the demo
    to the empty store and serves it."""
    demo = Checkout(tmp, "dev-run")
    demo.serve(f"scripts/run-default.sh {AOTID} {sys.executable}")
    return demo


def check_demo(demo):
    block = example_claims.block(TEST, "README.md", "curl -s localhost:8765/v2/models/demo/infer")
    metadata, infer = block.commands
    demo.wait_ready("demo")
    got = json.loads(demo.run(metadata))
    assert got.get("name") == "demo" and [i["name"] for i in got.get("inputs", [])] == ["features"], got
    got = json.loads(demo.run(infer))
    want = make_demo().eval()(torch.tensor([DEMO_INPUT]))
    assert [o["name"] for o in got.get("outputs", [])] == ["probabilities"], got
    close(got["outputs"][0], want.detach(), "the demo's answer")
    print("ok: the README's demo curl lines, after ./dev run, answer as eager PyTorch does", flush=True)


def using_it(tmp, daemons):
    """The README's "Using it" block, author's side and device's side."""
    block = example_claims.block(TEST, "README.md", "mypkg.models:make_model")
    here = Checkout(tmp, "using-it")
    daemons.append(here)
    os.makedirs(os.path.join(here.dir, "mypkg"))
    open(os.path.join(here.dir, "mypkg", "__init__.py"), "w").close()
    with open(os.path.join(here.dir, "mypkg", "models.py"), "w") as f:
        f.write(MYPKG)
    import transformers  # the reader's Hugging Face folder: a tiny BERT, random weights
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64)).save_pretrained(os.path.join(here.dir, "my-bert"))
    sys.path.insert(0, here.dir)
    from mypkg.models import make_model
    x = torch.randn(2, 8)
    with open(os.path.join(here.dir, "request.json"), "w") as f:
        json.dump({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": x.flatten().tolist()}]}, f)

    for command in block.commands:
        words = command.text.split()
        if words[:2] == ["build/aotid", "serve"]:
            here.serve(command.text)
            continue
        if words[0] == "curl":
            here.wait_ready("mymodel")
        out = here.run(command)
        if words[:2] == ["build/aotid", "ls"]:
            assert any(line.split()[:2] == ["mymodel", "1"] for line in out.splitlines()), out
        if words[0] == "curl":
            got = json.loads(out)
            assert [o["name"] for o in got.get("outputs", [])] == ["scores"], got
            close(got["outputs"][0], make_model()(x).detach(), "mymodel's answer")
    for pt2 in ("model.pt2", "encoder.pt2", "bert.pt2"):
        assert os.path.getsize(os.path.join(here.dir, pt2)) > 0, pt2
    print("ok: the README's \"Using it\" as written: three exports, add, serve, ls, and an answer equal "
          "to eager PyTorch's", flush=True)


def config_example(tmp):
    """docs/SYNC.md's [[sync]] table, in a configuration of its own: aotid
    reads it (a wrong key or value is an error naming it) and lists its
    source with the interval it sets."""
    block = example_claims.block(TEST, "docs/SYNC.md", "[[sync]]")
    config = os.path.join(tmp, "sync.toml")
    with open(config, "w") as f:
        f.write(f'[store]\npath = "{os.path.join(tmp, "sync-store")}"\n' + block.text)
    print(f"$ aotid --config {config} sync status  # with {block.where()}", flush=True)
    done = subprocess.run([AOTID, "--config", config, "sync", "status"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert done.returncode == 0, done.stdout
    source = re.search(r'^source = "([^"]+)"', block.text, re.M).group(1)
    interval = re.search(r"^interval_s = (\d+)", block.text, re.M).group(1)
    assert f"{source} (every {interval} s)" in done.stdout, done.stdout
    print(f"ok: {block.where()}'s [[sync]] table is a configuration aotid reads", flush=True)


def main():
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        config_example(tmp)
        daemons = []
        try:
            daemons.append(start_dev_run(tmp))  # its export and build overlap the exports below
            using_it(tmp, daemons)
            check_demo(daemons[0])
        finally:
            for d in daemons:
                d.stop()


if __name__ == "__main__":
    main()
