"""Exports the models the tests serve, with eager PyTorch outputs to compare
against. Run once per test run (a ctest fixture); writes into --out:

    mlp.pt2       FP32 input 'x' [-1, 8] (dynamic batch) -> 'y' [-1, 4]
    mlp2.pt2      the same network with other weights: a new version of mlp
    embed.pt2     INT64 input 'ids' [2, 5] -> 'pooled' [2, 6]
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


def tensor_json(name, t):
    dt = {torch.float32: "FP32", torch.int64: "INT64"}[t.dtype]
    return {"name": name, "datatype": dt, "shape": list(t.shape), "data": t.flatten().tolist()}


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
