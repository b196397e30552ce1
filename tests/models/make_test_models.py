"""Exports the models the tests serve, with eager PyTorch outputs to compare
against. Run once per test run (a ctest fixture); writes into --out:

    mlp.pt2       FP32 input 'x' [-1, 8] (dynamic batch) -> 'y' [-1, 4]
    mlp2.pt2      the same network with other weights: a new version of mlp
    embed.pt2     INT64 input 'ids' [2, 5] -> 'pooled' [2, 6]
    alltypes.pt2  one [2, 3] input and output of each of the 10 datatypes
    cases.json    inputs and eager outputs per model
    not_a_model.pt2   text, not a zip
    broken_program.pt2  mlp.pt2 with its program replaced by garbage: passes
                        the package check, fails its build
    empty.pt2         a zip archive with no model inside
"""

import argparse
import json
import os
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(1234)
    cases = {}

    mlp = Mlp().eval()
    aotid_export.export(mlp, (torch.randn(2, 8),), os.path.join(args.out, "mlp.pt2"),
                        input_names=["x"], output_names=["y"], dynamic_batch=True,
                        metadata={"purpose": "aotid test"})
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
    print(f"test models written to {args.out}")


if __name__ == "__main__":
    main()
