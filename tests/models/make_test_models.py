"""Exports the models the tests serve, with eager PyTorch outputs to compare
against. Run once per test run (a ctest fixture); writes into --out:

    mlp.pt2       FP32 input 'x' [-1, 8] (dynamic batch) -> 'y' [-1, 4]
    mlp2.pt2      the same network with other weights: a new version of mlp
    embed.pt2     INT64 input 'ids' [2, 5] -> 'pooled' [2, 6]
    alltypes.pt2  one [2, 3] input and output of each of the 10 datatypes
    cases.json    inputs and eager outputs per model
    mlp.state.pt, embed.state.pt  their weights, for tests that run them
                  eagerly (the Mlp and Embed classes here)
    not_a_model.pt2   text, not a zip
    broken_program.pt2  mlp.pt2 with its program replaced by garbage: passes
                        the package check, fails its build
    empty.pt2         a zip archive with no model inside
    .made             what was made from what (see up_to_date)

The model zoo (exported programs, each with eager outputs in cases.json):
    conv.pt2      conv net, FP32 'image' [-1, 3, 16, 16] -> 'logits' [-1, 10]
    block.pt2     transformer block (attention, layer norm), FP32 'tokens' [-1, 12, 32]
    two_io.pt2    FP32 'x' [-1, 6] and INT64 'idx' [-1] -> 'scaled' FP32, 'counts' INT64
    multi.pt2     two models in one package: 'encoder' and 'head'
    tiny_llm.pt2  a random-weight Llama with SmolLM2's tokenizer and a chat
                  template, for generate (cases "tiny_llm": greedy tokens)
    tiny_llm_int8.pt2  the same with int8 weights
    tiny_llm_slots.pt2, tiny_llm_slots_int8.pt2  both with a cache of 4
                  sequences (continuous batching)
The AOTInductor kinds, all of mlp (cases "mlp"):
    mlp_so.pt2       compiled package with aotid's extra/aotid.json
    mlp_so_raw.pt2   the same without it: aotid reads the inputs from the C++
    mlp_src.pt2      source package (aot_inductor.package_cpp_only)
    broken_src.pt2   mlp_src.pt2 with C++ that does not compile
    foreign_so.pt2   mlp_so.pt2 whose metadata names another CPU architecture
    cuda_so.pt2      mlp_so.pt2 whose metadata names the cuda device, with a
                     .cubin kernel file beside its .so as a CUDA package has
    fake_device_so.pt2  the same for the tests' fake device key "aotidfake"
"""

import argparse
import glob
import hashlib
import json
import os
import platform
import sys
import zipfile

import torch

import aotid_export


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 6)

    def forward(self, ids):
        return self.emb(ids).mean(dim=1) * 2.0


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, image):
        h = torch.relu(self.c2(torch.relu(self.c1(image))))
        return self.fc(h.mean(dim=(2, 3)))


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention and an MLP, each with a residual."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.GELU(), torch.nn.Linear(64, d))

    def forward(self, tokens):
        h = self.ln1(tokens)
        tokens = tokens + self.attn(h, h, h, need_weights=False)[0]
        return tokens + self.mlp(self.ln2(tokens))


class TwoIO(torch.nn.Module):
    """Two inputs of different datatypes, two outputs."""

    def forward(self, x, idx):
        return x * (idx.unsqueeze(1).to(torch.float32) + 1.0), (x > 0).sum(dim=1) + idx


class AllTypes(torch.nn.Module):
    """One input and one output of every datatype the protocol has numbers for."""

    def forward(self, b, u8, i8, i16, i32, i64, f16, bf16, f32, f64):
        return (torch.logical_not(b), u8 + 1, i8 - 1, i16 * 2, i32 + 7, i64 * 3,
                f16 * 2 + 0.5, bf16 * 2 + 0.5, f32 * 2 + 0.5, f64 * 2 + 0.5)


DATATYPES = {torch.bool: "BOOL", torch.uint8: "UINT8", torch.int8: "INT8", torch.int16: "INT16",
             torch.int32: "INT32", torch.int64: "INT64", torch.float16: "FP16", torch.bfloat16: "BF16",
             torch.float32: "FP32", torch.float64: "FP64"}


def tensor_json(name, t):
    return {"name": name, "datatype": DATATYPES[t.dtype], "shape": list(t.shape), "data": t.flatten().tolist()}


def eager_cases(model, inputs_list, in_names, out_names):
    out = []
    for inputs in inputs_list:
        with torch.no_grad():
            res = model(*inputs)
        res = res if isinstance(res, tuple) else (res,)
        out.append({"inputs": [tensor_json(n, t) for n, t in zip(in_names, inputs)],
                    "outputs": [tensor_json(n, t) for n, t in zip(out_names, res)]})
    return out


def write_zoo(out, cases):
    torch.manual_seed(7)
    conv = Conv().eval()
    aotid_export.export(conv, (torch.randn(2, 3, 16, 16),), os.path.join(out, "conv.pt2"),
                        input_names=["image"], output_names=["logits"], dynamic_batch=True)
    cases["conv"] = eager_cases(conv, [(torch.randn(b, 3, 16, 16),) for b in (1, 7)], ["image"], ["logits"])

    block = Block().eval()
    aotid_export.export(block, (torch.randn(2, 12, 32),), os.path.join(out, "block.pt2"),
                        input_names=["tokens"], output_names=["hidden"], dynamic_batch=True)
    cases["block"] = eager_cases(block, [(torch.randn(b, 12, 32),) for b in (1, 7)], ["tokens"], ["hidden"])

    two = TwoIO().eval()
    aotid_export.export(two, (torch.randn(2, 6), torch.tensor([1, 2])), os.path.join(out, "two_io.pt2"),
                        input_names=["x", "idx"], output_names=["scaled", "counts"], dynamic_batch=True)
    cases["two_io"] = eager_cases(two, [(torch.randn(b, 6), torch.randint(0, 9, (b,))) for b in (1, 7)],
                                  ["x", "idx"], ["scaled", "counts"])

    head = torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.Softmax(dim=1)).eval()
    aotid_export.export_many({"encoder": (block, (torch.randn(2, 12, 32),),
                                          {"input_names": ["tokens"], "output_names": ["hidden"],
                                           "dynamic_batch": True}),
                              "head": (head, (torch.randn(2, 6),), {"input_names": ["features"],
                                                                   "output_names": ["probs"]})},
                             os.path.join(out, "multi.pt2"), metadata={"suite": "multi-model test"})
    cases["multi_encoder"] = cases["block"]
    cases["multi_head"] = eager_cases(head, [(torch.randn(2, 6),)], ["features"], ["probs"])


def rewrite_zip(src_path, dst_path, change, beside_so=None):
    """Copies an archive, passing each (name, bytes) through `change` (None
    drops it), and adds the files `beside_so` (name -> bytes) to the folder of
    its compiled model."""
    with zipfile.ZipFile(src_path) as src, zipfile.ZipFile(dst_path, "w") as dst:
        for item in src.infolist():
            data = change(item.filename, src.read(item.filename))
            if data is not None:
                dst.writestr(item, data)
            if beside_so and item.filename.endswith(".so"):
                for name, extra in beside_so.items():
                    dst.writestr(item.filename.rsplit("/", 1)[0] + "/" + name, extra)


# A kernel file as torch writes one per Triton kernel of a CUDA model (its
# default keeps them out of the .so): the model opens it by name from the
# folder its runner is given. Not a real kernel: nothing here runs CUDA.
KERNEL_FILE = {"triton_poi_fused_addmm_tanh_0.cubin": b"\x7fELF a stand-in for a CUDA kernel\n"}


def write_aoti_kinds(out, mlp):
    import platform

    example = (torch.randn(2, 8),)
    so = os.path.join(out, "mlp_so.pt2")
    aotid_export.export(mlp, example, so, input_names=["x"], output_names=["y"], dynamic_batch=True,
                        format="aoti", metadata={"purpose": "aotid test", "kind": "so"})
    src = os.path.join(out, "mlp_src.pt2")
    aotid_export.export(mlp, example, src, input_names=["x"], output_names=["y"], dynamic_batch=True,
                        format="aoti_source")
    rewrite_zip(so, os.path.join(out, "mlp_so_raw.pt2"),
                lambda name, data: None if name.endswith("/extra/aotid.json") else data)
    rewrite_zip(src, os.path.join(out, "broken_src.pt2"),
                lambda name, data: b"#error this package is broken on purpose\n" + data
                if name.endswith("wrapper.cpp") else data)

    def set_meta(key, value):
        def change(name, data):
            if name.endswith("_metadata.json"):
                meta = json.loads(data)
                meta[key] = value
                return json.dumps(meta).encode()
            return data
        return change

    other_arch = "aarch64" if platform.machine() == "x86_64" else "x86_64"
    rewrite_zip(so, os.path.join(out, "foreign_so.pt2"), set_meta("AOTI_MACHINE", other_arch))
    rewrite_zip(so, os.path.join(out, "cuda_so.pt2"), set_meta("AOTI_DEVICE_KEY", "cuda"), KERNEL_FILE)
    # The CPU model under the device key of the tests' fake device
    # (tests/runtime/fake_device_test.cc), with a kernel file as cuda_so.pt2.
    rewrite_zip(so, os.path.join(out, "fake_device_so.pt2"), set_meta("AOTI_DEVICE_KEY", "aotidfake"),
                KERNEL_FILE)


# A ChatML template, the kind SmolLM2 ships, with a default system prompt.
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_tiny_llm(out, cases):
    """tiny_llm.pt2: a random-weight Llama of SmolLM2's architecture (its
    tokenizer, grouped-query attention, rotary embeddings, a cache as state inputs),
    small enough to build in seconds, with the eager greedy tokens for a few
    prompts. Its end-of-text token is chosen as one the first prompt's greedy
    answer reaches at its 6th token, so that ending on it is tested too."""
    from aotid_export import llm

    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "text", "smollm2_tokenizer.json")) as f:
        tok = json.load(f)
    with open(os.path.join(here, "..", "text", "tokenizer_cases.json")) as f:
        ids_of = {c["text"]: c["ids"] for c in json.load(f)["cases"]}
    torch.manual_seed(7)
    cfg = llm.LlamaConfig(vocab_size=len(tok["tokens"]), dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                          hidden_dim=128, max_seq_len=96, rope_theta=10000.0)
    model = llm.Llama(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)  # large weights: the greedy choice is never a near tie
    prompts = ["The quick brown fox jumps over the lazy dog.", "Hello", "🇫🇷“smart”café\t\t x"]  # in the fixture
    first = llm.greedy(model, ids_of[prompts[0]], 12)
    eos = next(t for i, t in enumerate(first) if i >= 5 and t not in first[:i])
    rows = []
    for text in prompts:
        model.reset()
        rows.append({"text": text, "ids": ids_of[text], "greedy": llm.greedy(model, ids_of[text], 20, [eos])})
    # A chat prompt's ids come from aotid's own tokenizer in the test; the
    # rendered text is given for the eager side.
    cases["tiny_llm"] = {"eos": eos, "max_seq_len": cfg.max_seq_len, "prompts": rows}
    llm.export_causal_lm(model, os.path.join(out, "tiny_llm.pt2"), tokenizer=tok, eos_token_ids=[eos],
                         chat_template=CHATML, metadata={"purpose": "aotid generate test"})

    # The same model with a cache of 4 sequences (continuous batching): each
    # sequence's greedy tokens are the rows above.
    llm.export_causal_lm(model, os.path.join(out, "tiny_llm_slots.pt2"), tokenizer=tok, eos_token_ids=[eos],
                         chat_template=CHATML, metadata={"purpose": "aotid generate test"}, max_sequences=4)

    # The same model with int8 weights (aotid_export.llm.quantize_int8); the
    # test compares what its build generates with its own exported program.
    # Its cache is inside the program, zeros in the package, as packages
    # were before state inputs: aotid serves those still.
    llm.quantize_int8(model)
    llm.export_causal_lm(model, os.path.join(out, "tiny_llm_int8.pt2"), tokenizer=tok, eos_token_ids=[eos],
                         metadata={"purpose": "aotid generate test", "weights": "int8"}, max_sequences=1,
                         _cache_as_buffers=True)
    llm.export_causal_lm(model, os.path.join(out, "tiny_llm_slots_int8.pt2"), tokenizer=tok,
                         eos_token_ids=[eos], metadata={"purpose": "aotid generate test", "weights": "int8"},
                         max_sequences=4)


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
MADE = ".made"


def inputs_key():
    """A digest of everything the models are made from: this script, the
    exporter and worker sources, the tokenizer files it reads, the torch and
    Python it runs on, and this machine's CPU (some packages are compiled
    for its vector ISA)."""
    h = hashlib.sha256()
    files = [os.path.abspath(__file__)] + sorted(glob.glob(os.path.join(ROOT, "python", "**", "*.py"), recursive=True))
    files += [os.path.join(ROOT, "tests", "text", n) for n in ("smollm2_tokenizer.json", "tokenizer_cases.json")]
    for f in files:
        h.update(os.path.relpath(f, ROOT).encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as fh:
            cpu = next((line for line in fh if line.startswith("flags")), "")
    h.update(f"{torch.__version__}|{sys.version}|{platform.machine()}|{cpu}".encode())
    return h.hexdigest()


def outputs_of(out):
    """Each file in `out` (but the record), with its size and mtime."""
    return {n: [st.st_size, st.st_mtime_ns] for n in sorted(os.listdir(out)) if n != MADE
            for st in [os.stat(os.path.join(out, n))]}


def up_to_date(out, key):
    """Whether `out` holds what this script made from the same inputs, not
    changed since: the record written last, after every model, names the
    inputs' digest and each file's size and mtime. The three builds CI runs
    the tests in (plain, ASan, TSan) share one folder, made once."""
    try:
        with open(os.path.join(out, MADE)) as f:
            made = json.load(f)
        return made.get("key") == key and made.get("files") == outputs_of(out)
    except (OSError, ValueError):
        return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--force", action="store_true", help="make them even when they are up to date")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    key = inputs_key()
    if not args.force and up_to_date(args.out, key):
        print(f"test models in {args.out} are up to date (their inputs have not changed)")
        return
    if os.path.exists(os.path.join(args.out, MADE)):
        os.remove(os.path.join(args.out, MADE))  # a run that fails leaves no record
    torch.manual_seed(1234)
    cases = {}

    mlp = Mlp().eval()
    aotid_export.export(mlp, (torch.randn(2, 8),), os.path.join(args.out, "mlp.pt2"),
                        input_names=["x"], output_names=["y"], dynamic_batch=True,
                        metadata={"purpose": "aotid test"})
    torch.save(mlp.state_dict(), os.path.join(args.out, "mlp.state.pt"))
    cases["mlp"] = []
    for batch in (1, 3):
        x = torch.randn(batch, 8)
        with torch.no_grad():
            y = mlp(x)
        cases["mlp"].append({"inputs": [tensor_json("x", x)], "outputs": [tensor_json("y", y)]})

    # 32 distinct single rows, for batching: each client must get its own row back.
    rows = torch.randn(32, 8)
    with torch.no_grad():
        ys = mlp(rows)
    cases["mlp_rows"] = [{"inputs": [tensor_json("x", rows[i:i + 1])], "outputs": [tensor_json("y", ys[i:i + 1])]}
                         for i in range(32)]

    torch.manual_seed(99)
    mlp2 = Mlp().eval()
    aotid_export.export(mlp2, (torch.randn(2, 8),), os.path.join(args.out, "mlp2.pt2"),
                        input_names=["x"], output_names=["y"], dynamic_batch=True)
    cases["mlp2"] = []
    for case in cases["mlp"]:  # the same inputs, so either version's answer can be checked
        x = torch.tensor(case["inputs"][0]["data"], dtype=torch.float32).reshape(case["inputs"][0]["shape"])
        with torch.no_grad():
            y = mlp2(x)
        cases["mlp2"].append({"inputs": [tensor_json("x", x)], "outputs": [tensor_json("y", y)]})

    embed = Embed().eval()
    aotid_export.export(embed, (torch.zeros(2, 5, dtype=torch.int64),), os.path.join(args.out, "embed.pt2"),
                        input_names=["ids"], output_names=["pooled"])
    torch.save(embed.state_dict(), os.path.join(args.out, "embed.state.pt"))
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        pooled = embed(ids)
    cases["embed"] = [{"inputs": [tensor_json("ids", ids)], "outputs": [tensor_json("pooled", pooled)]}]

    names = ["b", "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"]
    example = (torch.tensor([[True, False, True], [False, False, True]]),
               torch.tensor([[0, 7, 254], [128, 1, 200]], dtype=torch.uint8),
               torch.tensor([[-127, 0, 126], [5, -5, 100]], dtype=torch.int8),
               torch.tensor([[-1000, 0, 16000], [7, -7, 300]], dtype=torch.int16),
               torch.tensor([[-(2 ** 30), 0, 2 ** 30], [1, -1, 99]], dtype=torch.int32),
               torch.tensor([[-(2 ** 60), 0, 2 ** 60], [1, -1, 123456789012]], dtype=torch.int64),
               torch.tensor([[0.5, -1.25, 1000.0], [0.0, 3.0, -0.125]], dtype=torch.float16),
               torch.tensor([[0.5, -1.25, 1000.0], [0.0, 3.0, -0.125]], dtype=torch.bfloat16),
               torch.tensor([[0.5, -1.25, 1e30], [0.0, 3.0, -0.125]], dtype=torch.float32),
               torch.tensor([[0.5, -1.25, 1e300], [0.0, 3.0, -0.125]], dtype=torch.float64))
    alltypes = AllTypes().eval()
    aotid_export.export(alltypes, example, os.path.join(args.out, "alltypes.pt2"),
                        input_names=names, output_names=["o_" + n for n in names])
    with torch.no_grad():
        outs = alltypes(*example)
    cases["alltypes"] = [{"inputs": [tensor_json(n, t) for n, t in zip(names, example)],
                          "outputs": [tensor_json("o_" + n, t) for n, t in zip(names, outs)]}]

    write_zoo(args.out, cases)
    write_aoti_kinds(args.out, mlp)
    write_tiny_llm(args.out, cases)

    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump(cases, f)
    with open(os.path.join(args.out, "not_a_model.pt2"), "w") as f:
        f.write("this is not a zip archive\n")
    with zipfile.ZipFile(os.path.join(args.out, "empty.pt2"), "w") as z:
        z.writestr("archive/readme.txt", "no model here")
    with zipfile.ZipFile(os.path.join(args.out, "mlp.pt2")) as src, \
            zipfile.ZipFile(os.path.join(args.out, "broken_program.pt2"), "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("/models/model.json"):
                data = b'{"this is": "not an exported program"}'
            dst.writestr(item, data)
    with open(os.path.join(args.out, MADE), "w") as f:
        json.dump({"key": key, "files": outputs_of(args.out)}, f)
    print(f"test models written to {args.out}")


if __name__ == "__main__":
    main()
