"""aotid_export.outputs.named_outputs: what a model returns, flattened in
torch.export's order and named by its keys and fields.

    output_names_test.py
"""
from collections import OrderedDict, namedtuple

import torch
import torch.utils._pytree as pytree
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqModelOutput

from aotid_export.outputs import named_outputs, output_names

Pair = namedtuple("Pair", ["logits", "hidden"])


def check(obj, want):
    got = named_outputs(obj)
    assert [n for n, _ in got] == want, (got, want)
    # The order is torch.export's: the pytree leaves, None dropped.
    leaves = [x for x in pytree.tree_leaves(obj) if x is not None]
    assert len(leaves) == len(got) and all(a is b for a, (_, b) in zip(leaves, got)), (leaves, got)


def refused(obj, error, text):
    try:
        named_outputs(obj)
    except error as e:
        assert text in str(e), str(e)
        return
    raise AssertionError(f"{obj!r} was named")


def main():
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))
    # Today's names where nothing names the outputs.
    check(a, ["output0"])
    check((a, b), ["output0", "output1"])
    check([a, (b, c)], ["output0", "output1", "output2"])
    # Keys and fields name them.
    check({"scores": a, "labels": b}, ["scores", "labels"])
    check(OrderedDict(z=a, y=b), ["z", "y"])
    check(Pair(a, b), ["logits", "hidden"])
    # Nested ones join with ".", a tuple inside counts from 0, and a top-level
    # tuple's entries are output{i}.
    check({"encoder": {"last": a, "states": (b, c)}, "logits": d},
          ["encoder.last", "encoder.states.0", "encoder.states.1", "logits"])
    check((a, {"x": b}), ["output0", "output1.x"])
    check(Pair(a, [b, c]), ["logits", "hidden.0", "hidden.1"])
    # None is dropped, wherever it is.
    check({"a": a, "gone": None, "b": (None, b)}, ["a", "b.1"])
    check((a, None, b), ["output0", "output1"])
    # transformers' ModelOutput: unset fields are gone, nested ones joined.
    check(BaseModelOutput(last_hidden_state=a, hidden_states=(b, c)),
          ["last_hidden_state", "hidden_states.0", "hidden_states.1"])
    check(Seq2SeqModelOutput(last_hidden_state=a, encoder_last_hidden_state=b), ["last_hidden_state",
                                                                                  "encoder_last_hidden_state"])
    check({"decoder": BaseModelOutput(last_hidden_state=a), "encoder": BaseModelOutput(last_hidden_state=b)},
          ["decoder.last_hidden_state", "encoder.last_hidden_state"])
    assert output_names({"p": a, "q": b}) == ["p", "q"]
    # What aotid cannot serve is named where it is.
    refused({"logits": a, "count": 3}, TypeError, "count is a builtins.int")
    refused({"x": {"y": "text"}}, TypeError, "x.y is a builtins.str")
    refused({1: a, "1": b}, ValueError, "'1'")
    print("ok")


if __name__ == "__main__":
    main()
