"""Named dynamic dims through the exporter's command line, served.

A model of two inputs that share a batch and a sequence dim (token ids and
a mask) is exported with --input 'ids=int64[batch:1..8,seq:1..16]' and the
same dims on 'mask', added to a fresh store and served by the real daemon.
Answers at several sizes equal eager PyTorch; sizes outside the ranges, and
inputs whose shared dims differ, are refused with 400 and the reason. The
dims are shown by their declared names.

The same model exported through the Python API with a sequence declared
from 2 keeps that minimum (torch.export traces every dynamic dim from 2,
and a traced 2 is otherwise served from 1), and records the example's
sizes as typical ones, which load-time timing runs at.

    dynamic_dims_test.py AOTID
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import torch

AOTID = sys.argv[1]


class Pooler(torch.nn.Module):
    """Mean of the token embeddings the mask keeps: [batch, seq] -> [batch, 4]."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.emb = torch.nn.Embedding(32, 4)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(32, 4, generator=g))

    def forward(self, ids, mask):
        e = self.emb(ids) * mask.unsqueeze(-1)
        return e.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)


def make_model():
    return Pooler()


def call(port, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def declared_dims_kept(work):
    import zipfile

    from aotid_export import export
    from aotid_worker.compile import model_spec

    pt2 = os.path.join(work, "declared.pt2")
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=16)
    ep = export(make_model(), (torch.zeros(3, 5, dtype=torch.int64), torch.ones(3, 5)), pt2,
                input_names=["ids", "mask"], dynamic_shapes={"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}})
    with zipfile.ZipFile(pt2) as z:
        extra = json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/aotid.json"))))
    spec = model_spec(ep, extra)
    want = [{"symbol": "batch", "min": 1, "max": 8, "typical": 3}, {"symbol": "seq", "min": 2, "max": 16, "typical": 5}]
    assert [i["dims"] for i in spec["inputs"]] == [want, want], spec["inputs"]
    print("declared dims: names, a minimum of 2 and the typical sizes kept")


def main():
    work = tempfile.mkdtemp()
    declared_dims_kept(work)
    pt2 = os.path.join(work, "pooler.pt2")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)) + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-W", "ignore", "-m", "aotid_export", "dynamic_dims_test:make_model",
                    "--input", "ids=int64[batch:1..8,seq:1..16]", "--input", "mask=float32[batch:1..8,seq:1..16]",
                    "--output-name", "pooled", "-o", pt2], check=True, env=env)
    # A dim named twice with two ranges is a clear usage error.
    bad = subprocess.run([sys.executable, "-m", "aotid_export", "dynamic_dims_test:make_model",
                          "--input", "ids=int64[batch:1..8,seq:1..16]", "--input", "mask=float32[batch:1..4,seq:1..16]",
                          "-o", os.path.join(work, "x.pt2")], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "dim 'batch' is 1..4 here but 1..8 in an earlier input" in bad.stderr, bad.stderr

    store = os.path.join(work, "store")
    subprocess.run([AOTID, "--store", store, "add", pt2, "--name", "pooler"], check=True, stdout=subprocess.DEVNULL)
    log_path = os.path.join(work, "daemon.log")
    proc = subprocess.Popen([AOTID, "--store", store, "serve", "--listen", "127.0.0.1:0"],
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    try:
        port, deadline = None, time.time() + 600
        while time.time() < deadline:
            if port is None:
                m = re.search(r"serving on http://[^\s]*:(\d+)", open(log_path).read())
                port = int(m.group(1)) if m else None
            elif call(port, "/v2/models/pooler/ready")[0] == 200:
                break
            assert proc.poll() is None, open(log_path).read()
            time.sleep(0.2)
        else:
            raise SystemExit("not ready within 600 s:\n" + open(log_path).read())

        # show gives each input's dims with their ranges; the shared ones by one name.
        shown = subprocess.run([AOTID, "--store", store, "show", "pooler"], check=True, capture_output=True,
                               text=True).stdout
        assert re.search(r"input +ids INT64 \[batch:1\.\.8, seq:1\.\.16\]", shown), shown
        assert re.search(r"input +mask FP32 \[batch:1\.\.8, seq:1\.\.16\]", shown), shown
        assert re.search(r"output +pooled FP32 \[", shown), shown
        status, meta = call(port, "/v2/models/pooler")
        assert status == 200, meta
        assert [i["shape"] for i in meta["inputs"]] == [[-1, -1], [-1, -1]], meta

        model = make_model().eval()
        g = torch.Generator().manual_seed(5)
        for batch, seq in [(1, 1), (3, 7), (8, 16)]:
            ids = torch.randint(0, 32, (batch, seq), generator=g)
            mask = (torch.rand(batch, seq, generator=g) > 0.3).float()
            status, out = call(port, "/v2/models/pooler/infer", {"inputs": [
                {"name": "ids", "datatype": "INT64", "shape": [batch, seq], "data": ids.flatten().tolist()},
                {"name": "mask", "datatype": "FP32", "shape": [batch, seq], "data": mask.flatten().tolist()}]})
            assert status == 200, (batch, seq, out)
            got = torch.tensor(out["outputs"][0]["data"], dtype=torch.float32).reshape(batch, 4)
            torch.testing.assert_close(got, model(ids, mask), rtol=1e-5, atol=1e-6)
            print(f"batch {batch}, seq {seq}: equal to eager")

        def refused(ids_shape, mask_shape, why):
            n, k = ids_shape[0] * ids_shape[1], mask_shape[0] * mask_shape[1]
            status, out = call(port, "/v2/models/pooler/infer", {"inputs": [
                {"name": "ids", "datatype": "INT64", "shape": ids_shape, "data": [0] * n},
                {"name": "mask", "datatype": "FP32", "shape": mask_shape, "data": [1.0] * k}]})
            assert status == 400 and why in out.get("error", ""), (ids_shape, mask_shape, status, out)
            print(f"{ids_shape} with {mask_shape}: 400, {out['error']}")

        refused([1, 17], [1, 17], "dim 1 is 17, valid range [1, 16]")  # seq past 16
        refused([9, 4], [9, 4], "dim 0 is 9, valid range [1, 8]")      # batch past 8
        refused([2, 5], [2, 6], "the model takes them as one size")  # the shared seq differs
        assert proc.poll() is None, "the daemon died"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    print("named dynamic dims: exported, served in range, refused outside it")


if __name__ == "__main__":
    main()
