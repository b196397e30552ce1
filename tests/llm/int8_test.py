"""A language model with int8 weights (aotid_export.llm.quantize_int8),
built and served by aotid: each greedy token it generates is the greedy
choice of its own exported program run eagerly on the same sequence, up to
the bfloat16 rounding the int8 products make (the compiled and the eager
logits round apart in their last bits, so a near tie may go either way).
Its package holds the weights at about a quarter of float32's bytes.

    int8_test.py AOTID TESTDATA
"""

import json
import os
import sys
import tempfile

import torch

from harness import Served, greedy_gaps, post

# Two bfloat16 steps of the largest logit: what the two sides' rounding can
# put between them. A token the eager model does not rank first by far more
# (a wrong weight, a stale cache) is a failure.
NEAR = 2.0 ** -6
TOKENS = 20


def main(aotid, testdata):
    f32, i8 = os.path.join(testdata, "tiny_llm.pt2"), os.path.join(testdata, "tiny_llm_int8.pt2")
    programs = {path: torch.export.load(path) for path in (f32, i8)}
    held = {path: sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in ep.state_dict.values()}.values())
            for path, ep in programs.items()}  # a tied tensor once
    ratio = held[i8] / held[f32]
    assert ratio < 0.3, f"the int8 model holds {ratio:.2f}x the float32 one's bytes"
    # ... and its package is smaller by that much (the tokenizer is the rest of both).
    saved = os.path.getsize(f32) - os.path.getsize(i8)
    assert saved > 0.7 * held[f32], (saved, held)
    matrices = {str(t.dtype) for t in programs[i8].state_dict.values() if t.dim() == 2 and t.numel() > 4096}
    assert matrices == {"torch.int8"}, matrices
    eager = programs[i8].module()
    with open(os.path.join(testdata, "cases.json")) as f:
        prompts = json.load(f)["tiny_llm"]["prompts"]
    with tempfile.TemporaryDirectory() as tmp, Served(aotid, {"tiny_llm_int8": i8}, tmp) as port:
        exact = 0
        for p in prompts:
            got = post(port, "/v2/models/tiny_llm_int8/generate",
                       {"input_ids": p["ids"], "parameters": {"temperature": 0, "max_tokens": TOKENS,
                                                              "ignore_eos": True, "return_token_ids": True}})
            tokens = got["token_ids"]
            assert len(tokens) == TOKENS and got["finish_reason"] == "length", got
            gaps = greedy_gaps(eager, p["ids"], tokens)
            worst = max(range(TOKENS), key=lambda i: gaps[i])
            assert gaps[worst] <= NEAR, (f"{p['text']!r}: token {worst} ({tokens[worst]}) is {gaps[worst]:.4f} "
                                         f"below eager's greedy choice; tokens {tokens}")
            exact += sum(g == 0 for g in gaps)
        # Ties in rounding are rare: nearly every token is eager's own choice.
        total = TOKENS * len(prompts)
        assert exact >= 0.9 * total, f"only {exact} of {total} tokens are eager's greedy choice"
    print(f"ok: weights {ratio:.2f}x float32's bytes; {exact} of {total} greedy tokens are eager's choice, "
          f"the rest within {NEAR:.4f}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(sys.argv[1], sys.argv[2])
