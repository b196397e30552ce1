"""What the compile worker records in spec.json beyond the shape: per input,
each dynamic dim's symbol and range ("dims") and, for an integer input that
indexes a table, the values it may hold ("values"). Checked on the test
models (the fixture's testdata) and on small programs made here for the
cases they lack.

    python spec_ranges_test.py TESTDATA_DIR
"""

import os
import sys
import unittest

import torch

from aotid_worker.compile import input_contract, load_program, model_spec

TESTDATA = ""


def spec_of(name: str, package_model: str = "model") -> dict:
    ep, names, _, _ = load_program(os.path.join(TESTDATA, name), package_model)
    return model_spec(ep, names)


def spec_of_program(module, example, dynamic_shapes=None) -> dict:
    ep = torch.export.export(module.eval(), example, dynamic_shapes=dynamic_shapes, strict=False)
    return model_spec(ep, {})


class Encoder(torch.nn.Module):
    """Token and position embeddings, masked: input_ids and attention_mask
    share the batch and sequence dims."""

    def __init__(self):
        super().__init__()
        self.tokens = torch.nn.Embedding(100, 4)
        self.positions = torch.nn.Embedding(512, 4)

    def forward(self, input_ids, attention_mask):
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
        h = self.tokens(input_ids.reshape(input_ids.shape[0], -1)) + self.positions(pos)
        return h * attention_mask.unsqueeze(-1)


class Lookups(torch.nn.Module):
    """Integer inputs reaching tables in other ways."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(30, 4))
        self.small = torch.nn.Embedding(10, 4)
        self.big = torch.nn.Embedding(1000, 4)

    def forward(self, rows, both, first, count):
        picked = self.table[rows.flatten()]  # advanced indexing takes negatives too
        narrow = self.big(both) + self.small(both.t().t())  # the narrower table decides
        part = self.small(first[:, 0])  # only a slice reaches the table
        return picked, narrow, part, count * 2  # count reaches no table


class RecordedRanges(unittest.TestCase):
    def test_embed_ids_hold_table_rows(self):
        ids = spec_of("embed.pt2")["inputs"][0]
        self.assertEqual(ids["name"], "ids")
        self.assertEqual(ids["values"], {"min": 0, "max": 49})  # nn.Embedding(50, 6)
        self.assertNotIn("dims", ids)  # no dynamic dim

    def test_dynamic_batch_from_one(self):
        x = spec_of("mlp.pt2")["inputs"][0]
        self.assertEqual(x["shape"], [-1, 8])
        self.assertEqual(len(x["dims"]), 2)
        self.assertEqual(x["dims"][0]["min"], 1)
        self.assertEqual(x["dims"][0]["max"], 65536)
        self.assertTrue(x["dims"][0]["symbol"])
        self.assertIsNone(x["dims"][1])
        self.assertNotIn("values", x)  # FP32

    def test_inputs_of_one_batch_share_its_symbol(self):
        x, idx = spec_of("two_io.pt2")["inputs"]
        self.assertEqual(x["dims"][0]["symbol"], idx["dims"][0]["symbol"])
        self.assertNotIn("values", idx)  # used in arithmetic, indexes nothing

    def test_multi_model_package(self):
        tokens = spec_of("multi.pt2", "encoder")["inputs"][0]
        self.assertEqual(tokens["dims"][0]["min"], 1)
        self.assertEqual([d is None for d in tokens["dims"]], [False, True, True])
        features = spec_of("multi.pt2", "head")["inputs"][0]
        self.assertNotIn("dims", features)

    def test_static_models_record_nothing(self):
        for t in spec_of("alltypes.pt2")["inputs"]:
            self.assertEqual(set(t), {"name", "datatype", "shape"}, t)

    def test_sequence_dim_and_shared_symbols(self):
        batch = torch.export.Dim("batch", min=1, max=64)
        seq = torch.export.Dim("seq", min=2, max=256)  # a traced minimum of 2 is recorded as 1
        example = (torch.zeros(2, 8, dtype=torch.int64), torch.ones(2, 8))
        ids, mask = spec_of_program(Encoder(), example,
                                    ({0: batch, 1: seq}, {0: batch, 1: seq}))["inputs"]
        self.assertEqual(ids["dims"][0]["min"], 1)
        self.assertEqual(ids["dims"][0]["max"], 64)
        self.assertEqual(ids["dims"][1]["min"], 1)
        self.assertEqual(ids["dims"][1]["max"], 256)
        self.assertEqual(ids["dims"], mask["dims"])
        self.assertNotEqual(ids["dims"][0]["symbol"], ids["dims"][1]["symbol"])
        self.assertEqual(ids["values"], {"min": 0, "max": 99})
        self.assertNotIn("values", mask)

    def test_unbounded_dim_has_no_max(self):
        n = torch.export.Dim("n")
        t = spec_of_program(torch.nn.Embedding(7, 2), (torch.zeros(3, dtype=torch.int64),), ({0: n},))["inputs"][0]
        self.assertEqual(t["dims"][0]["min"], 0)  # as torch traced it
        self.assertNotIn("max", t["dims"][0])
        self.assertEqual(t["values"], {"min": 0, "max": 6})

    def test_index_ops(self):
        example = (torch.zeros(3, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int64),
                   torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
        rows, both, first, count = spec_of_program(Lookups(), example)["inputs"]
        self.assertEqual(rows["values"], {"min": -30, "max": 29})
        self.assertEqual(both["values"], {"min": 0, "max": 9})
        self.assertNotIn("values", first)
        self.assertNotIn("values", count)

    def test_failed_analysis_records_nothing(self):
        class Broken:
            name = "x"
            meta = {}  # no traced value: the analysis cannot run
            users = {}

        self.assertEqual(input_contract(None, Broken()), {})


if __name__ == "__main__":
    TESTDATA = sys.argv.pop(1)
    unittest.main()
