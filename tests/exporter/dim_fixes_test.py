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


class Halves(torch.nn.Module):
    """x is twice as long as y: torch.export suggests `a = 2*b` and writes
    b's fix as `Dim('b', max=50)`, a minimum of 0."""

    def forward(self, x, y):
        return x[:, : y.shape[1] * 2] + torch.cat([y, y], 1)


class Sixths(torch.nn.Module):
    """x twice y, and x in threes: the first fix (a = 2*b) is not enough."""

    def forward(self, x, y):
        return x[:, : y.shape[1] * 2] + torch.cat([y, y], 1) + x.reshape(x.shape[0], -1, 3).sum().reshape(1, 1)


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

    # A fix narrows what was declared, never widens it (b stays from 1),
    # and a dim replaced by an expression keeps its declared name.
    path = os.path.join(work, "halves.pt2")
    said = io.StringIO()
    D = torch.export.Dim
    with contextlib.redirect_stderr(said):
        aotid_export.export(Halves(), (torch.randn(2, 8), torch.randn(2, 4)), path,
                            dynamic_shapes=({1: D("a", min=1, max=100)}, {1: D("b", min=1, max=100)}))
    assert "min 1 → 0" not in said.getvalue() and "b: max 100 → 50" in said.getvalue(), said.getvalue()
    assert dims(path) == [[None, {"name": "a", "min": 2, "max": 100, "typical": 8}],
                          [None, {"name": "b", "min": 1, "max": 50, "typical": 4}]], dims(path)
    program = load_program(path, "model")[0].module()
    for n in (1, 37):
        x, y = torch.randn(2, 2 * n), torch.randn(2, n)
        assert torch.allclose(program(x, y), Halves()(x, y)), n
    print("a fix never widens a declared range, nor names an expression:", dims(path))

    # Still failing after the fix: the exporter's own error, not torch's.
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            aotid_export.export(Sixths(), (torch.randn(2, 12), torch.randn(2, 6)), os.path.join(work, "six.pt2"),
                                dynamic_shapes=({1: D("a", min=1, max=100)}, {1: D("b", min=1, max=100)}))
        raise AssertionError("Sixths exported")
    except aotid_export.ExportError as e:
        assert "suggested fixes" in str(e) and "a: now 2*b" in str(e) and "still fails" in str(e), e
        print("still failing after the fix:", str(e).splitlines()[0])
    print("ok")


if __name__ == "__main__":
    main()
