"""The zoo: transformers models as their authors have them, exported without
a wrapper, built and served by the real daemon, equal to eager PyTorch.

Tiny configs with random weights (hidden 32, 2 layers; tests/exporter/hf_zoo.py):

* from a module, with ``aotid_export.export`` and keyword examples: an
  encoder (BERT), an encoder-decoder (T5) and an audio model (wav2vec2);
* from a folder written by ``save_pretrained``, with ``aotid-export hf``:
  BERT for fill-mask, a decoder (GPT-2, its forward pass), a vision model
  (ViT) and a Llama whose folder becomes a generate package with its
  byte-level BPE tokenizer (and again with a cache of three sequence
  slots, ``--max-sequences 3``, whose program decodes two sequences in one
  call as transformers gives each alone).

All are added to one store and served by one daemon. Each infer model's
outputs, named from its ModelOutput fields, equal eager's on the example
and on a second size; the Llama's prompt tokens are the folder tokenizer's
and its greedy tokens the eager model's. Folders the command cannot take
as asked (a Qwen2 generate package, a dim the model has not, no
transformers) are refused with the reason.

    hf_zoo_test.py AOTID [NAME ...]   (NAME: serve only these)
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request

import torch
from torch.export import Dim

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "llm")]

import hf_zoo  # noqa: E402
from harness import Served  # noqa: E402

import aotid_export  # noqa: E402
from aotid_export import hf, llm  # noqa: E402
from aotid_export.outputs import named_outputs  # noqa: E402

AOTID = sys.argv[1]
ONLY = set(sys.argv[2:])  # serve only these (all when none are named)
G = torch.Generator().manual_seed(7)


def ids(vocab, b, s):
    return torch.randint(3, vocab, (b, s), generator=G)


def mask(b, s):
    m = torch.ones(b, s, dtype=torch.int64)
    if s > 2:
        m[-1, -2:] = 0  # the last row padded: masking is part of what is compared
    return m


def text_inputs(vocab, b, s, token_types=False):
    x = {"input_ids": ids(vocab, b, s), "attention_mask": mask(b, s)}
    if token_types:
        x["token_type_ids"] = torch.zeros(b, s, dtype=torch.int64)
    return x


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        return json.load(r)


DATATYPES = {torch.int64: "INT64", torch.float32: "FP32"}


def without_cache(model):
    """``model`` called as it was exported: no cache where forward has one."""
    import inspect

    off = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    return lambda **kw: model(**kw, **off)


def served_equals_eager(port, name, model, inputs):
    """One request with ``inputs``; every output equal to eager's, by name."""
    with torch.no_grad():
        want = named_outputs(model(**inputs))
    status, out = post(port, f"/v2/models/{name}/infer", {"inputs": [
        {"name": k, "datatype": DATATYPES[t.dtype], "shape": list(t.shape), "data": t.flatten().tolist()}
        for k, t in inputs.items()]})
    assert status == 200, (name, {k: list(t.shape) for k, t in inputs.items()}, out)
    got = {o["name"]: o for o in out["outputs"]}
    assert sorted(got) == sorted(n for n, _ in want), (name, sorted(got), [n for n, _ in want])
    worst = 0.0
    for n, w in want:
        g = torch.tensor(got[n]["data"], dtype=w.dtype).reshape(got[n]["shape"])
        assert list(g.shape) == list(w.shape), (name, n, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}.{n}: {m}")
        worst = max(worst, float(((g - w).abs() / w.abs().clamp(min=1e-3)).max()))
    return worst


def refusals(work):
    """What the command cannot do as asked, refused with the reason."""
    qwen = os.path.join(work, "qwen2")
    import transformers as T

    T.Qwen2ForCausalLM(T.Qwen2Config(vocab_size=hf_zoo.BPE_VOCAB, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                     max_position_embeddings=64)).save_pretrained(qwen)
    hf_zoo.bpe_tokenizer().save_pretrained(qwen)
    cases = [(["hf", qwen, "--task", "text-generation", "-o", os.path.join(work, "q.pt2")],
              "qwen2: no generate package: its attention projections have biases"),
             (["hf", os.path.join(work, "vit"), "--task", "image-classification", "--dynamic", "batch,seq",
               "-o", os.path.join(work, "v.pt2")], "inputs have the dims batch, not seq"),
             (["hf", work, "--task", "fill-mask", "-o", os.path.join(work, "x.pt2")], "no config.json"),
             (["hf", os.path.join(work, "vit"), "--task", "image-classification", "--max-sequences", "2",
               "-o", os.path.join(work, "v.pt2")], "--max-sequences is for generate packages"),
             (["hf", os.path.join(work, "gpt2"), "--task", "text-generation", "--max-sequences", "2",
               "-o", os.path.join(work, "g.pt2")], "gpt2 is exported as its forward pass, which has no cache"),
             (["hf", os.path.join(work, "llama"), "--task", "text-generation", "--max-sequences", "0",
               "-o", os.path.join(work, "l.pt2")], "a generate package holds at least 1 sequence")]
    saved = sys.modules.get("transformers")
    for argv, why in cases + [(["hf", os.path.join(work, "vit"), "--task", "image-classification", "-o",
                                os.path.join(work, "v.pt2")], "pip install 'aotid-export[hf]'")]:
        if why.startswith("pip"):
            sys.modules["transformers"] = None  # import transformers raises ImportError
        try:
            from aotid_export.__main__ import main
            main(argv)
            raise AssertionError(f"{argv} was not refused")
        except SystemExit as e:
            assert why in str(e), (argv, str(e))
            print(f"refused: {e}")
        finally:
            sys.modules["transformers"] = saved
        assert not os.path.exists(argv[-1]), argv


def main():
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix="aotid-hfzoo-")
    try:
        zoo(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def zoo(work):
    t0 = time.monotonic()
    pt2 = {}
    eager = {}
    # From modules, keyword examples, no wrapper.
    batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=1, max=64)
    bert = eager["bert"] = hf_zoo.make("bert")
    pt2["bert"] = os.path.join(work, "bert.pt2")
    aotid_export.export(bert, text_inputs(64, 1, 16, token_types=True), pt2["bert"], dynamic_shapes={
        "input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}, "token_type_ids": {0: batch, 1: seq}})
    t5 = eager["t5"] = hf_zoo.make("t5")
    pt2["t5"] = os.path.join(work, "t5.pt2")
    dec = Dim("decoder_seq", min=1, max=32)
    aotid_export.export(t5, {**text_inputs(64, 1, 16), "decoder_input_ids": ids(64, 1, 4), "use_cache": False},
                        pt2["t5"], dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq},
                                                   "decoder_input_ids": {0: batch, 1: dec}})
    w2v = eager["wav2vec2"] = hf_zoo.make("wav2vec2")
    pt2["wav2vec2"] = os.path.join(work, "wav2vec2.pt2")
    # 720 samples: the fewest that give the default feature encoder two frames.
    aotid_export.export(w2v, {"input_values": torch.randn(1, 16000, generator=G)}, pt2["wav2vec2"],
                        dynamic_shapes={"input_values": {0: batch, 1: Dim("samples", min=720, max=48000)}})
    # From folders, with the command.
    from aotid_export.__main__ import main as cli

    # What each says it did, and what it left out and why.
    said = {"bert-mlm": "tokenizer not packed: aotid runs WordPiece for embedding packages only",
            "gpt2": "this package is the forward pass alone: logits for every position",
            "vit": "inputs pixel_values [1, 3, 32, 32]; dynamic: batch",
            "llama": "as a generate package: context 64, byte-level BPE tokenizer of 320 tokens"}
    for name in ("bert-mlm", "gpt2", "vit", "llama"):
        folder = os.path.join(work, name)
        eager[name] = hf_zoo.save(name, folder)
        pt2[name] = os.path.join(work, name + ".pt2")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert cli(["hf", folder, "--task", hf_zoo.MODELS[name][0], "-o", pt2[name]]) == 0
        assert said[name] in err.getvalue(), (name, err.getvalue())
        print(err.getvalue().strip())
    slots_equal_eager(work, eager["llama"])
    t_export = time.monotonic() - t0
    refusals(work)

    # Each request: the example's size, then a second one.
    sizes = {
        "bert": [text_inputs(64, 1, 16, True), text_inputs(64, 2, 7, True)],
        "t5": [{**text_inputs(64, 1, 16), "decoder_input_ids": ids(64, 1, 4)},
               {**text_inputs(64, 2, 9), "decoder_input_ids": ids(64, 2, 3)}],
        "gpt2": [text_inputs(hf_zoo.BPE_VOCAB, 1, 16), text_inputs(hf_zoo.BPE_VOCAB, 2, 11)],
        "vit": [{"pixel_values": torch.randn(1, 3, 32, 32, generator=G)},
                {"pixel_values": torch.randn(3, 3, 32, 32, generator=G)}],
        "wav2vec2": [{"input_values": torch.randn(1, 16000, generator=G)},
                     {"input_values": torch.randn(2, 1234, generator=G)}],
    }
    # bert-mlm is not served: its export already loaded it as the compile
    # worker does, and bert covers its layers (a build is ~1.5 min here).
    served = {k: v for k, v in pt2.items() if k != "bert-mlm" and (not ONLY or k in ONLY)}
    t1 = time.monotonic()
    with Served(AOTID, served, work, ready_within_s=1500) as port:
        t_ready = time.monotonic() - t1
        for name, cases in sizes.items():
            if name not in served:
                continue
            meta = get(port, f"/v2/models/{name}")
            for inputs in cases:
                worst = served_equals_eager(port, name, without_cache(eager[name]), inputs)
                shapes = ", ".join(f"{n} {list(t.shape)}" for n, t in inputs.items())
                print(f"{name}: {shapes}: equal to eager (worst relative error {worst:.1e}); "
                      f"outputs {[o['name'] for o in meta['outputs']]}")
        if "llama" in served:
            generate_equals_eager(port, work, eager["llama"])
    t_all = time.monotonic() - t0
    print(f"zoo: {len(pt2)} packages exported, {len(served)} served; export {t_export:.0f} s, build until all ready {t_ready:.0f} s, "
          f"total {t_all:.0f} s")


def slots_equal_eager(work, model):
    """The Llama folder exported with three sequence slots: two prompts
    prefilled into slots 2 and 0, then decoded together, one row each per
    call, give transformers' greedy tokens and logits for each alone."""
    import zipfile

    from aotid_export.__main__ import main as cli

    path = os.path.join(work, "llama-slots.pt2")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli(["hf", os.path.join(work, "llama"), "--task", "text-generation", "--max-sequences", "3",
                    "-o", path]) == 0
    assert "a cache for 3 sequences at once" in err.getvalue(), err.getvalue()
    with zipfile.ZipFile(path) as z:
        extra = json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/aotid.json"))))
    assert extra["generate"]["max_sequences"] == 3 and extra["generate"]["slots_input"] == "slots", extra
    program = llm.program_module(path)
    prompts, slots = [ids(hf_zoo.BPE_VOCAB, 1, 9)[0].tolist(), ids(hf_zoo.BPE_VOCAB, 1, 4)[0].tolist()], [2, 0]
    seqs, worst = [list(p) for p in prompts], 0.0
    with torch.no_grad():
        last = [program(torch.tensor([p]), torch.arange(len(p)).unsqueeze(0), torch.tensor([s]))[0]
                for p, s in zip(prompts, slots)]
        for _ in range(6):
            for i, seq in enumerate(seqs):
                want = model(input_ids=torch.tensor([seq])).logits[0, -1]
                worst = max(worst, float((last[i] - want).abs().max()))
                assert int(torch.argmax(last[i])) == int(torch.argmax(want)), (i, seq)
                seq.append(int(torch.argmax(want)))
            out = program(torch.tensor([[s[-1]] for s in seqs]), torch.tensor([[len(s) - 1] for s in seqs]),
                          torch.tensor(slots))
            last = list(out)
    assert worst < 1e-4, f"the slotted program's logits are {worst} off transformers'"
    print(f"llama --max-sequences 3: two sequences decoded together give transformers' greedy tokens "
          f"(logits within {worst:.1e})")


def generate_equals_eager(port, work, model, name="llama"):
    import transformers as T

    tok = T.AutoTokenizer.from_pretrained(os.path.join(work, name), local_files_only=True)
    text = "The capital of France is 12345, don't"
    status, out = post(port, f"/v2/models/{name}/generate", {
        "text_input": text, "parameters": {"temperature": 0, "max_tokens": 8, "ignore_eos": True,
                                           "return_token_ids": True}})
    assert status == 200, out
    prompt = tok(text)["input_ids"]
    assert out["prompt_token_ids"] == prompt, (out["prompt_token_ids"], prompt)
    seq, gaps = list(prompt), []
    with torch.no_grad():
        for t in out["token_ids"]:
            row = model(input_ids=torch.tensor([seq])).logits[0, -1]
            gaps.append(float((row.max() - row[t]) / row.max().abs()))
            seq.append(t)
    assert len(gaps) == 8 and max(gaps) <= 1e-5, (out["token_ids"], gaps)
    print(f"{name}: generate's prompt is the folder tokenizer's {len(prompt)} tokens; its 8 greedy tokens "
          f"are eager's {out['token_ids']}")


if __name__ == "__main__":
    main()
