"""The exporter loads what it wrote as aotid's compile worker will, in a
Python without the author's libraries, and refuses at export what the
worker could not load, naming it; what it flattens itself loads.

    self_check_test.py
"""
import os
import tempfile

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

import aotid_export
from aotid_worker.compile import load_program
from worker_absent_types import Pair, twice


class ReturnsPair(torch.nn.Module):
    def forward(self, x):
        return Pair(x + 1, x * 3)


class ReturnsModelOutput(torch.nn.Module):
    def forward(self, x):
        return BaseModelOutputWithPooling(last_hidden_state=x * 2, pooler_output=x.mean(0))


class CallsAnOperator(torch.nn.Module):
    def forward(self, x):
        return twice(x) + 1


def refused(path, text):
    try:
        aotid_export.check_package(path)
    except aotid_export.ExportError as e:
        assert text in str(e), str(e)
        return str(e)
    raise AssertionError(f"{path} passed the check")


def main():
    work = tempfile.mkdtemp()
    x = torch.randn(3, 4)
    # The checking Python finds torch and what it needs, not the author's
    # libraries (nor the exporter itself).
    allowed, _ = aotid_export._worker_modules()
    assert {"torch", "numpy", "sympy", "aotid_worker"} <= set(allowed), allowed
    assert not {"transformers", "tokenizers", "aotid_export", "worker_absent_types"} & set(allowed), allowed
    # Saved by torch.export alone, a pytree type from the author's library
    # (here and in transformers) is what the worker cannot load: named.
    for model, name in [(ReturnsPair(), "worker_absent_types.Pair"),
                        (ReturnsModelOutput(), "transformers.modeling_outputs.BaseModelOutputWithPooling")]:
        path = os.path.join(work, "raw.pt2")
        torch.export.save(torch.export.export(model, (x,)), path)
        said = refused(path, f"the pytree type {name} is not registered there")
        print("refused:", said)
        # The exporter flattens it: the program loads, named by its fields.
        path = os.path.join(work, "flat.pt2")
        aotid_export.export(model, (x,), path)
        ep, names, _, _ = load_program(path, "model")
        want = model(x)
        want = [want.scores, want.hidden] if isinstance(want, Pair) else [want.last_hidden_state,
                                                                          want.pooler_output]
        assert names["output_names"] == (["scores", "hidden"] if isinstance(model, ReturnsPair) else
                                         ["last_hidden_state", "pooler_output"]), names
        for a, b in zip(ep.module()(x), want):
            assert torch.equal(a, b)
    # An operator the worker does not have: refused at export, nothing left.
    path = os.path.join(work, "op.pt2")
    try:
        aotid_export.export(CallsAnOperator(), (x,), path)
    except aotid_export.ExportError as e:
        assert "the operator torch.ops.aotid_test.twice.default is not registered there" in str(e), str(e)
        print("refused:", e)
    else:
        raise AssertionError("a program calling aotid_test::twice was exported")
    assert not os.path.exists(path), "the refused package was left behind"
    print("ok")


if __name__ == "__main__":
    main()
