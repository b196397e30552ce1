"""A language model of several sequence slots, built by aotid's compile
worker with AOTInductor: the model.so the daemon would load, run on the
schedule of llm_slots_test.py (chunked prefills into slots, decode steps of
1 to 4 rows, a slot reused), gives the eager module's tokens and logits.
The build's spec records the batch and sequence dims and the values the
slots and positions may take (what /infer checks before the model runs).

    llm_slots_compiled_test.py
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch

import llm_slots_test as slots_test
from aotid_export import llm


class Compiled:
    """The build's model.so called as the daemon calls it: the state inputs
    its spec lists made once, zeros, and passed after the client's inputs
    to every call, which writes them in place."""

    def __init__(self, so, state):
        self.runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
        assert all(s["datatype"] == "FP32" for s in state), state
        self.state = [torch.zeros(s["shape"]) for s in state]

    def __call__(self, tokens, input_pos, slots):
        return self.runner.run([tokens, input_pos, slots, *self.state])[0]


def main():
    torch.manual_seed(7)
    torch.set_num_threads(2)
    model = llm.Llama(slots_test.CONFIG).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.set_max_sequences(slots_test.SLOTS)
    ps = slots_test.prompts()
    tokens, rows, _ = slots_test.slotted(copy.deepcopy(model), ps)
    with tempfile.TemporaryDirectory() as tmp:
        pkg, out = os.path.join(tmp, "lm.pt2"), os.path.join(tmp, "build")
        os.mkdir(out)
        # AOTInductor's default options: the build in seconds, not minutes.
        slots_test.export(model, pkg, max_sequences=slots_test.SLOTS)
        r = subprocess.run([sys.executable, "-m", "aotid_worker.compile", "--artifact", pkg, "--out", out],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        with open(os.path.join(out, "spec.json")) as f:
            spec = json.load(f)
        inputs = {i["name"]: i for i in spec["inputs"]}
        assert list(inputs) == ["tokens", "input_pos", "slots"], list(inputs)
        with open(os.path.join(out, "generate.json")) as f:
            assert json.load(f)["slots_input"] == "slots"
        c = slots_test.CONFIG
        assert inputs["slots"]["values"] == {"min": 0, "max": slots_test.SLOTS - 1}, inputs["slots"]
        assert inputs["input_pos"]["values"] == {"min": 0, "max": c.max_seq_len - 1}, inputs["input_pos"]
        dims = [(d["symbol"], d["min"], d["max"]) for d in inputs["tokens"]["dims"]]
        assert dims == [("batch", 1, slots_test.SLOTS), ("seq", 1, c.max_seq_len)], dims
        compiled = Compiled(os.path.join(out, "model.so"), spec["state_inputs"])
        got_tokens, got_rows, _ = slots_test.slotted(compiled, ps)
        # The calls wrote the caller's tensors: no copy of the cache.
        assert all(bool(t.any()) for t in compiled.state), "a state input was not written in place"
    assert got_tokens == tokens, f"compiled {got_tokens}, eager {tokens}"
    gap = slots_test.worst(got_rows, rows)
    assert gap < 1e-4, f"the compiled logits are {gap} off eager's"
    print(f"ok: the compiled model's tokens are eager's in every slot, logits within {gap:.1e}")


if __name__ == "__main__":
    main()
