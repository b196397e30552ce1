"""Dynamic dims in the Python API: a size-1 dynamic dim in the example is
traced at 2 (as the command line does), and when torch.export suggests
fixes to the dims the exporter applies them once and says what changed.
The typical sizes recorded are the example's.

    dim_fixes_test.py
"""
import contextlib
import io
import json
import os
import tempfile
import zipfile

import torch

import aotid_export
from aotid_worker.compile import load_program


class Pool(torch.nn.Module):
    def forward(self, x):
        return x.sum(0, keepdim=True) + x


class Frames(torch.nn.Module):
    """Needs at least 12 samples: the first 10 are a preamble."""

    def forward(self, audio):
        return audio[..., 10:] * 2 + audio[..., :-10].mean(-1, keepdim=True)


def dims(path):
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/aotid.json"))))["input_dims"]


def main():
    work = tempfile.mkdtemp()
    # A batch of 1 with Dim("batch", min=1): dynamic, typical 1.
    path = os.path.join(work, "pool.pt2")
    aotid_export.export(Pool(), (torch.randn(1, 5),), path, dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    assert dims(path) == [[{"name": "batch", "min": 1, "typical": 1}, None]], dims(path)
    program = load_program(path, "model")[0].module()
    for b in (1, 4):
        x = torch.randn(b, 5)
        assert torch.allclose(program(x), Pool()(x)), b
    print("a size-1 dynamic dim traced at 2: batch 1 and 4 answer as eager")

    # min=2 is too small for the model: raised to 12, said, exported.
    path = os.path.join(work, "frames.pt2")
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        aotid_export.export(Frames(), {"audio": torch.randn(1, 50)}, path,
                            dynamic_shapes={"audio": {1: torch.export.Dim("samples", min=2, max=4000)}})
    assert "samples: min 2 → 12" in said.getvalue(), said.getvalue()
    assert dims(path) == [[None, {"name": "samples", "min": 12, "max": 4000, "typical": 50}]], dims(path)
    program = load_program(path, "model")[0].module()
    for n in (12, 333):
        x = torch.randn(1, n)
        assert torch.allclose(program(x), Frames()(x)), n
    print("suggested fixes applied once:", said.getvalue().strip().splitlines()[-1].strip())
    print("ok")


if __name__ == "__main__":
    main()
