"""aotid_export.export with a dict of keyword inputs, and what a model
returns named by its keys and fields: the package's names, and the program
the compile worker loads (its load_program) against eager.

    dict_examples_test.py
"""
import json
import os
import tempfile
import warnings
import zipfile
from collections import namedtuple

import torch

import aotid_export
from aotid_worker.compile import load_program, model_spec

Scores = namedtuple("Scores", ["logits", "probs"])


class Tagger(torch.nn.Module):
    """forward as transformers writes it: keywords, optional ones, a flag."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, scale: float = 1.0,
                return_hidden: bool = False):
        h = self.embed(input_ids) * scale
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1).to(h.dtype)
        if token_type_ids is not None:
            h = h + token_type_ids.unsqueeze(-1).to(h.dtype)
        logits = self.head(h)
        return {"encoder": {"hidden": h if return_hidden else None, "pooled": h.mean(1)},
                "scores": Scores(logits, logits.softmax(-1)), "extra": None}


class Varargs(torch.nn.Module):
    """A wrapper as users write one: forward(*args)."""

    def forward(self, *args):
        ids, mask = args
        return (ids.float() * mask).sum(-1, keepdim=True), mask * 2


class Unsigned(torch.nn.Module):
    """Takes and returns torch's wide unsigned integers."""

    def forward(self, u16, u32, u64):
        return {"wide": u16.to(torch.int64) + u32.to(torch.int64), "u64": u64, "u32": u32}


class Gpt2Like(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, attention_mask=None):
        return input_ids.float() + (0 if past_key_values is None else past_key_values.float())


def package_names(path):
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/aotid.json"))))


def close(a, b):
    assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a.shape, b.shape, (a - b).abs().max())


def refused(error, text, *args, **kwargs):
    try:
        aotid_export.export(*args, **kwargs)
    except error as e:
        assert text in str(e), str(e)
        return
    raise AssertionError(f"exported; expected {error.__name__} with {text!r}")


def main():
    work = tempfile.mkdtemp()
    g = torch.Generator().manual_seed(3)
    model = Tagger().eval()
    ids = torch.randint(0, 50, (2, 6), generator=g)
    mask = (torch.rand(2, 6, generator=g) > 0.3).long()

    # Keys in another order than forward's, a constant, a parameter left out
    # (token_type_ids keeps its default), the dims by input name.
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=1, max=32)
    path = os.path.join(work, "tagger.pt2")
    aotid_export.export(model, {"attention_mask": mask, "input_ids": ids, "return_hidden": True, "scale": 0.5},
                        path, dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})
    extra = package_names(path)
    assert extra["input_names"] == ["attention_mask", "input_ids"], extra
    assert extra["output_names"] == ["encoder.hidden", "encoder.pooled", "scores.logits", "scores.probs"], extra
    assert [[d["name"] for d in dims] for dims in extra["input_dims"]] == [["batch", "seq"]] * 2, extra
    assert [d["typical"] for d in extra["input_dims"][1]] == [2, 6], extra
    ep, names, _, _ = load_program(path, "model")
    assert names["output_names"] == extra["output_names"]
    # At a size the example did not have, the program's outputs (plain
    # tensors, in the order named) are eager's.
    ids2 = torch.randint(0, 50, (3, 11), generator=g)
    mask2 = (torch.rand(3, 11, generator=g) > 0.3).long()
    want = model(input_ids=ids2, attention_mask=mask2, scale=0.5, return_hidden=True)
    got = ep.module()(mask2, ids2)
    assert isinstance(got, tuple) and len(got) == 4, type(got)
    for a, b in zip(got, [want["encoder"]["hidden"], want["encoder"]["pooled"], want["scores"].logits,
                          want["scores"].probs]):
        close(a, b)
    print("dict example: names from the keys, outputs from keys and fields, equal to eager")

    # The same with dynamic_batch; the None fields dropped from the names.
    path = os.path.join(work, "batch.pt2")
    aotid_export.export(model, {"input_ids": ids[:1]}, path, dynamic_batch=True)
    extra = package_names(path)
    assert extra["input_names"] == ["input_ids"], extra
    assert extra["output_names"] == ["encoder.pooled", "scores.logits", "scores.probs"], extra
    assert extra["input_dims"] == [[{"name": "batch", "min": 1, "max": 65536, "typical": 1}, None]], extra
    ep, _, _, _ = load_program(path, "model")
    want = model(input_ids=ids2[:, :6])
    for a, b in zip(ep.module()(ids2[:, :6]), [want["encoder"]["pooled"], want["scores"].logits, want["scores"].probs]):
        close(a, b)
    print("dict example with dynamic_batch, traced at a batch of 1")

    # A tuple example and a tensor keep today's names.
    path = os.path.join(work, "plain.pt2")
    aotid_export.export(Varargs(), (ids, mask), path, dynamic_shapes=({0: batch}, {0: batch}))
    extra = package_names(path)
    assert extra["input_names"] == ["input0", "input1"] and extra["output_names"] == ["output0", "output1"], extra
    ep, _, _, _ = load_program(path, "model")
    for a, b in zip(ep.module()(ids2[:, :6], mask2[:, :6]), Varargs()(ids2[:, :6], mask2[:, :6])):
        close(a, b)
    print("forward(*args) with dynamic_shapes for each input")

    # GPT-2's order, called by position with (ids, mask): warned.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aotid_export.export(Gpt2Like(), (ids, mask), os.path.join(work, "gpt2like.pt2"))
    said = [str(w.message) for w in caught if "past_key_values" in str(w.message)]
    assert said and "as a dict of keyword inputs" in said[0], [str(w.message) for w in caught]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aotid_export.export(Gpt2Like(), {"input_ids": ids, "attention_mask": mask}, os.path.join(work, "g2.pt2"))
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
    print("a positional example on past_key_values is warned of")

    # What cannot be: named.
    refused(TypeError, "'input_idz' is not a parameter of Tagger.forward (it takes input_ids, attention_mask",
            model, {"input_idz": ids}, os.path.join(work, "x.pt2"))
    refused(TypeError, "Tagger.forward needs 'input_ids'", model, {"attention_mask": mask},
            os.path.join(work, "x.pt2"))
    refused(ValueError, "a dict example names its inputs by its keys", model, {"input_ids": ids},
            os.path.join(work, "x.pt2"), input_names=["ids"])
    refused(ValueError, "dynamic_shapes names ['ids']", model, {"input_ids": ids}, os.path.join(work, "x.pt2"),
            dynamic_shapes={"ids": {0: batch}})
    # A constant given a None entry, by name or by place: it has no dims.
    refused(ValueError, "dynamic_shapes names 'scale' (= 2.0), which the example gives as a constant", model,
            {"input_ids": ids, "scale": 2.0}, os.path.join(work, "x.pt2"),
            dynamic_shapes={"input_ids": {0: batch}, "scale": None})
    refused(ValueError, "constants (scale) are traced into the program, not inputs, and take no entry", model,
            {"input_ids": ids, "scale": 2.0}, os.path.join(work, "x.pt2"), dynamic_shapes=({0: batch}, None))
    assert not os.path.exists(os.path.join(work, "x.pt2"))

    # uint16, uint32 and uint64 inputs and outputs: served as UINT16 to
    # UINT64, so the worker takes the package.
    path = os.path.join(work, "unsigned.pt2")
    example = {"u16": torch.tensor([[1, 65535]], dtype=torch.uint16),
               "u32": torch.tensor([[2, 4294967295]], dtype=torch.uint32),
               "u64": torch.tensor([[3, 2**64 - 1]], dtype=torch.uint64)}
    aotid_export.export(Unsigned(), example, path)
    ep, names, _, _ = load_program(path, "model")
    spec = model_spec(ep, names)
    assert [(t["name"], t["datatype"]) for t in spec["inputs"]] == [
        ("u16", "UINT16"), ("u32", "UINT32"), ("u64", "UINT64")], spec["inputs"]
    assert [(t["name"], t["datatype"]) for t in spec["outputs"]] == [
        ("wide", "INT64"), ("u64", "UINT64"), ("u32", "UINT32")], spec["outputs"]
    got = ep.module()(*example.values())
    assert got[0].tolist() == [[3, 65535 + 4294967295]] and got[1].dtype == torch.uint64, got
    print("uint16, uint32 and uint64 inputs and outputs are taken")
    print("ok")


if __name__ == "__main__":
    main()
