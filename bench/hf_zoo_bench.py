"""The Hugging Face zoo's pass rate at each stage, and latency against eager.

    PYTHONPATH=python:tests/exporter:tests/llm python bench/hf_zoo_bench.py build/aotid [NAME ...]

Each model of tests/exporter/hf_zoo.py's MODELS (and the extra families
below) is saved as a folder and goes through the stages in turn:

  export   ``aotid-export hf FOLDER --task T`` writes a package
  build    the daemon builds it and serves it (one daemon for all)
  equal    its HTTP answers equal eager's, every output by name, on the
           example and on a second size (a generate package: its greedy
           tokens are eager's)

Then an encoder (bert) and a vision model (vit) are timed over HTTP at 1
and 2 threads (``aotid set NAME threads=N``), median of 200 requests on one
kept-alive connection, against eager PyTorch at the same threads in process;
and, when gpt2-vocab is among the names, a decoder's [1, 128, vocab] logits
whole and at the last position (parameters.last_position), binary, median
of 50, against eager's forward.
"""

import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import transformers as T

import hf_zoo
from harness import Served

AOTID = sys.argv[1]

# Families beyond the test's, tiny in the same way.
EXTRA = {
    "distilbert": ("feature-extraction", lambda: T.DistilBertConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)),
    "roberta": ("text-classification", lambda: T.RobertaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=80, pad_token_id=1, num_labels=2)),
    "mistral": ("text-generation", lambda: T.MistralConfig(
        vocab_size=hf_zoo.BPE_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, head_dim=8, sliding_window=None,
        pad_token_id=0, bos_token_id=0, eos_token_id=2)),
    "phi3": ("text-generation", lambda: T.Phi3Config(
        vocab_size=hf_zoo.BPE_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=0,
        eos_token_id=2)),
    "convnext": ("image-classification", lambda: T.ConvNextConfig(
        hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32, num_labels=3)),
    "resnet": ("image-classification", lambda: T.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=3)),
    # GPT-2 with its real vocabulary (50,257) and a tiny body: the logits
    # of 128 positions are 25.7 MB, the answer the last position saves.
    "gpt2-vocab": ("text-generation", lambda: T.GPT2Config(
        vocab_size=50257, n_positions=256, n_embd=32, n_layer=2, n_head=2)),
    "whisper": ("feature-extraction", lambda: T.WhisperConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=50,
        max_target_positions=32, pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2)),
}
ALL = {**hf_zoo.MODELS, **EXTRA}
G = torch.Generator().manual_seed(3)


def save(name, folder):
    if name in hf_zoo.MODELS:
        return hf_zoo.save(name, folder)
    from aotid_export.hf import TASKS

    task, config = EXTRA[name]
    torch.manual_seed(len(name))
    model = getattr(T, TASKS[task]).from_config(config()).eval()
    model.save_pretrained(folder)
    if task == "text-generation":
        hf_zoo.bpe_tokenizer().save_pretrained(folder)
    return model


def requests_for(model, example):
    """The example, and a second size: batch 2 and, where it is dynamic, a
    shorter sequence."""
    second = {}
    for k, t in example.items():
        if not isinstance(t, torch.Tensor):
            continue
        shape = [2] + list(t.shape[1:])
        if k in ("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids") and t.dim() == 2:
            shape[1] = max(2, t.shape[1] - 5)
        if k == "input_values":
            shape[1] = 4321
        if t.dtype == torch.int64 and k != "attention_mask" and k != "token_type_ids":
            second[k] = torch.randint(3, int(model.config.vocab_size), shape, generator=G)
        elif t.dtype == torch.int64:
            second[k] = torch.zeros(shape, dtype=torch.int64) + (1 if k == "attention_mask" else 0)
        else:
            second[k] = torch.randn(shape, generator=G)
    # Within the ranges the command declares: the second size shares seq.
    if "decoder_input_ids" in second:
        second["decoder_input_ids"] = second["decoder_input_ids"][:, :3]
    return [{k: v for k, v in example.items() if isinstance(v, torch.Tensor)}, second]


def main():
    from aotid_export.hf import example_inputs
    from hf_zoo_test import served_equals_eager

    names = sys.argv[2:] or list(ALL)
    work = tempfile.mkdtemp(prefix="aotid-hfbench-")
    stage = {n: {} for n in names}
    eager, pt2 = {}, {}
    for name in names:
        folder = os.path.join(work, name)
        eager[name] = save(name, folder)
        out = os.path.join(work, name + ".pt2")
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-W", "ignore", "-m", "aotid_export", "hf", folder, "--task",
                            ALL[name][0], "-o", out], capture_output=True, text=True)
        stage[name]["export"] = r.returncode == 0
        stage[name]["export_s"] = round(time.monotonic() - t0, 1)
        if r.returncode:
            stage[name]["why"] = r.stderr.strip().splitlines()[-1]
        else:
            pt2[name] = out
        print(name, stage[name], flush=True)
    t0 = time.monotonic()
    with Served(AOTID, pt2, work, ready_within_s=3600) as port:
        print(f"all {len(pt2)} built and ready in {time.monotonic() - t0:.0f} s", flush=True)
        for name in pt2:
            stage[name]["build"] = True
            model = eager[name]
            try:
                if ALL[name][0] == "text-generation" and getattr(model.config, "model_type", "") != "gpt2":
                    from hf_zoo_test import generate_equals_eager

                    generate_equals_eager(port, work, model, name)
                else:
                    if hasattr(model.config, "use_cache"):
                        model.config.use_cache = False
                    example, _, _ = example_inputs(model, None, os.path.join(work, name))

                    def call(**kw):
                        if "use_cache" in hf._params(model):
                            kw["use_cache"] = False
                        return model(**kw)

                    for inputs in requests_for(model, example):
                        served_equals_eager(port, name, call, inputs)
                stage[name]["equal"] = True
            except AssertionError as e:
                stage[name]["equal"] = False
                stage[name]["why"] = str(e)[:300]
            print(name, stage[name], flush=True)
        latency(port, work, eager, [n for n in ("bert", "vit") if n in pt2])
        if "gpt2-vocab" in pt2:
            decoder_latency(port, work, eager["gpt2-vocab"], "gpt2-vocab")
    n = len(names)
    for s in ("export", "build", "equal"):
        print(f"{s}: {sum(bool(v.get(s)) for v in stage.values())}/{n}")
    print(json.dumps(stage))
    shutil.rmtree(work, ignore_errors=True)


def latency(port, work, eager, names):
    from aotid_export.hf import example_inputs

    for name in names:
        model = eager[name]
        example, _, _ = example_inputs(model, None, os.path.join(work, name))
        example = {k: v for k, v in example.items() if isinstance(v, torch.Tensor)}
        body = json.dumps({"inputs": [{"name": k, "datatype": "INT64" if t.dtype == torch.int64 else "FP32",
                                       "shape": list(t.shape), "data": t.flatten().tolist()}
                                      for k, t in example.items()]})
        for threads in (1, 2):
            set_threads(work, name, threads)
            conn = http.client.HTTPConnection("127.0.0.1", port)
            samples = []
            for i in range(220):
                t0 = time.perf_counter()
                conn.request("POST", f"/v2/models/{name}/infer", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                assert r.status == 200
                if i >= 20:
                    samples.append(time.perf_counter() - t0)
            conn.close()
            torch.set_num_threads(threads)
            ref = []
            with torch.no_grad():
                for i in range(220):
                    t0 = time.perf_counter()
                    model(**example)
                    if i >= 20:
                        ref.append(time.perf_counter() - t0)
            a, b = statistics.median(samples) * 1e6, statistics.median(ref) * 1e6
            print(f"latency {name} {list(example.values())[0].shape}, {threads} thread(s): aotid over HTTP "
                  f"{a:.0f} µs, eager in process {b:.0f} µs ({b / a:.2f}x)", flush=True)


def set_threads(work, name, threads):
    """`aotid set NAME threads=N`, then waits for the reload to serve it."""
    subprocess.run([AOTID, "--store", os.path.join(work, "store"), "set", name, f"threads={threads}"], check=True,
                   stdout=subprocess.DEVNULL)
    log = os.path.join(work, "daemon.log")
    want = f"serving {name}:1 on cpu"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = [ln for ln in open(log) if want in ln]
        if lines and f"x {threads} thread" in lines[-1]:
            return
        time.sleep(0.2)


def decoder_latency(port, work, model, name, seq=128):
    """A decoder's logits for `seq` positions over HTTP (binary output): the
    whole [1, seq, vocab] answer, then only the last position
    (parameters.last_position), against eager's forward at the same
    threads. Median of 50 after 5."""
    ids = torch.randint(3, int(model.config.vocab_size), (1, seq), generator=G)
    mask = torch.ones(1, seq, dtype=torch.int64)
    inputs = [{"name": k, "datatype": "INT64", "shape": [1, seq], "data": t.flatten().tolist()}
              for k, t in (("input_ids", ids), ("attention_mask", mask))]
    bodies = {
        "all positions": {"inputs": inputs, "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]},
        "last position": {"inputs": inputs, "outputs": [
            {"name": "logits", "parameters": {"binary_data": True, "last_position": True}}]},
    }
    for threads in (1, 2):
        set_threads(work, name, threads)
        figures = {}
        for what, body in bodies.items():
            data = json.dumps(body)
            conn = http.client.HTTPConnection("127.0.0.1", port)
            samples, size = [], 0
            for i in range(55):
                t0 = time.perf_counter()
                conn.request("POST", f"/v2/models/{name}/infer", data, {"Content-Type": "application/json"})
                r = conn.getresponse()
                size = len(r.read())
                assert r.status == 200
                if i >= 5:
                    samples.append(time.perf_counter() - t0)
            conn.close()
            figures[what] = (statistics.median(samples) * 1e6, size)
        torch.set_num_threads(threads)
        ref = []
        with torch.no_grad():
            for i in range(55):
                t0 = time.perf_counter()
                model(input_ids=ids, attention_mask=mask, use_cache=False)
                if i >= 5:
                    ref.append(time.perf_counter() - t0)
        e = statistics.median(ref) * 1e6
        for what, (us, size) in figures.items():
            print(f"latency {name} [1, {seq}] logits, {what}, {threads} thread(s): aotid over HTTP {us:.0f} µs "
                  f"({size / 1e6:.2f} MB answer), eager in process {e:.0f} µs ({e / us:.2f}x)", flush=True)


if __name__ == "__main__":
    from aotid_export import hf

    main()
