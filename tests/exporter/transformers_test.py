"""A transformers model exported as its author has it, without a wrapper:
keyword inputs, a ModelOutput answer, a batch-1 example with dynamic dims.
The package loads in the compile worker's way and answers as eager at
other sizes, its outputs named by the ModelOutput's fields.

    transformers_test.py
"""
import json
import os
import tempfile
import zipfile

import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

import aotid_export
from aotid_worker.compile import load_program, model_spec


def main():
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                        vocab_size=99)
    model = BertModel(config).eval()
    ids = torch.randint(0, 99, (1, 7))
    mask = torch.ones(1, 7, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=1, max=64)
    path = os.path.join(tempfile.mkdtemp(), "bert.pt2")
    aotid_export.export(model, {"input_ids": ids, "attention_mask": mask, "output_hidden_states": True}, path,
                        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})

    with zipfile.ZipFile(path) as z:
        extra = json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/aotid.json"))))
    layers = config.num_hidden_layers + 1
    want_names = ["last_hidden_state", "pooler_output"] + [f"hidden_states.{i}" for i in range(layers)]
    assert extra["input_names"] == ["input_ids", "attention_mask"], extra
    assert extra["output_names"] == want_names, extra["output_names"]
    # The example's own sizes are the typical ones, not the 2 it was traced at.
    typical = [[d["typical"] for d in dims] for dims in extra["input_dims"]]
    assert typical == [[1, 7], [1, 7]], extra["input_dims"]

    ep, names, _, _ = load_program(path, "model")
    spec = model_spec(ep, names)
    assert [o["name"] for o in spec["outputs"]] == want_names, spec["outputs"]
    assert [i["dims"][0]["min"] for i in spec["inputs"]] == [1, 1], spec["inputs"]
    program = ep.module()
    for b, s in [(1, 7), (3, 11)]:
        ids2 = torch.randint(0, 99, (b, s))
        mask2 = torch.ones(b, s, dtype=torch.int64)
        mask2[0, s // 2:] = 0
        want = model(input_ids=ids2, attention_mask=mask2, output_hidden_states=True)
        got = program(ids2, mask2)
        want = [want.last_hidden_state, want.pooler_output, *want.hidden_states]
        assert len(got) == len(want)
        for name, a, e in zip(want_names, got, want):
            err = (a - e).abs().max().item()
            assert a.shape == e.shape and err < 1e-5, (name, a.shape, e.shape, err)
    print("BertModel without a wrapper: names from its ModelOutput, equal to eager at batch 1 and 3")

    # GPT-2 given (ids, mask) by position: the mask reaches past_key_values
    # and fails deep in the model; refused in the example's terms.
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                                      bos_token_id=0, eos_token_id=0)).eval()
    ids = torch.randint(0, 64, (1, 8))
    try:
        aotid_export.export(gpt2, (ids, torch.ones(1, 8, dtype=torch.int64)), path)
        raise AssertionError("GPT-2 exported with its mask as the cache")
    except aotid_export.ExportError as e:
        assert "example input 1 went to GPT2LMHeadModel.forward's parameter 'past_key_values'" in str(e), e
        assert "give the example as a dict of keyword inputs" in str(e), e
    print("GPT-2 given (ids, mask) by position: refused, naming past_key_values")


if __name__ == "__main__":
    main()
