"""Command line: python -m aotid_export MODULE:FACTORY --input NAME=DTYPE[SHAPE] ... -o OUT.pt2
              python -m aotid_export hf FOLDER --task TASK -o OUT.pt2   (a Hugging Face folder; aotid_export.hf)

FACTORY is a callable in an importable module that returns an nn.Module
(for example ``mypkg.models:make_model``). Each ``--input`` declares one
example input, e.g. ``--input x=float32[1,4] --input ids=int64[1,16]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys

import torch

from . import FORMATS, ExportError, _export, _out_folder_problem

_INPUT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([a-z0-9]+)\[([^\]]*)\]$")
# A dynamic dim: NAME:MIN..MAX (NAME alone: 1..65536). The same NAME in
# several inputs is one dim: their sizes must be equal.
_DIM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::([0-9]+)\.\.([0-9]+))?$")


def _example(spec: str, dims: dict) -> tuple[str, torch.Tensor, dict]:
    """The input's name, an example tensor, and its dynamic dims ({index: Dim})."""
    m = _INPUT.match(spec)
    if not m:
        raise SystemExit(f"--input {spec!r}: expected NAME=DTYPE[D0,D1,...], e.g. x=float32[1,4] or "
                         "ids=int64[batch:1..64,seq:1..512]")
    name, dtype_name, body = m.groups()
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"--input {spec!r}: unknown dtype {dtype_name!r}")
    shape, dynamic = [], {}
    for i, d in enumerate(x.strip() for x in body.split(",") if x.strip()):
        if d.isdigit():
            shape.append(int(d))
            continue
        dm = _DIM.match(d)
        if not dm:
            raise SystemExit(f"--input {spec!r}: dim {i} is {d!r}; expected a size, or NAME:MIN..MAX")
        dim_name, lo, hi = dm.group(1), int(dm.group(2) or 1), int(dm.group(3) or 65536)
        if lo > hi:
            raise SystemExit(f"--input {spec!r}: dim {dim_name!r} has min {lo} above max {hi}")
        if lo == hi:
            raise SystemExit(f"--input {spec!r}: dim {dim_name!r} is {lo}..{hi}, one size: "
                             f"write {lo} for a fixed dim")
        if dim_name in dims and (dims[dim_name].min, dims[dim_name].max) != (lo, hi):
            raise SystemExit(f"--input {spec!r}: dim {dim_name!r} is {lo}..{hi} here but "
                             f"{dims[dim_name].min}..{dims[dim_name].max} in an earlier input")
        dims.setdefault(dim_name, torch.export.Dim(dim_name, min=lo, max=hi))
        dynamic[i] = dims[dim_name]
        # torch.export specializes a size of 1: trace at 2 where the range allows.
        shape.append(min(hi, max(lo, 2)))
    if dtype.is_floating_point:
        t = torch.randn(shape).to(dtype)
    elif dtype == torch.bool:
        t = torch.zeros(shape, dtype=torch.bool)
    else:
        t = torch.zeros(shape, dtype=dtype)
    return name, t, dynamic


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hf"]:
        from .hf import main as hf_main

        return hf_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m aotid_export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("factory", help="MODULE:CALLABLE returning an nn.Module")
    p.add_argument("--input", action="append", default=[], required=True, metavar="NAME=DTYPE[SHAPE]",
                   help="an example input; a dim may be NAME:MIN..MAX (dynamic, and equal wherever NAME "
                        "appears), e.g. ids=int64[batch:1..64,seq:1..512]")
    p.add_argument("--output-name", action="append", default=None, metavar="NAME")
    p.add_argument("--dynamic-batch", action="store_true", help="make dim 0 of every input dynamic")
    p.add_argument("--metadata", default="{}", help="JSON object stored with the model")
    p.add_argument("--format", choices=FORMATS, default="exported_program",
                   help="exported_program (portable, compiled by aotid on each machine), aoti (compiled here "
                        "for this machine), aoti_source (C++ that aotid compiles without Python)")
    p.add_argument("-o", "--out", required=True)
    args = p.parse_args(argv)
    problem = _out_folder_problem(args.out)
    if problem:
        raise SystemExit(problem)

    module_name, _, attr = args.factory.partition(":")
    if not attr:
        raise SystemExit(f"{args.factory!r}: expected MODULE:CALLABLE")
    factory = getattr(importlib.import_module(module_name), attr)
    model = factory()
    dims: dict = {}
    names, inputs, dynamic = zip(*(_example(s, dims) for s in args.input))
    if dims and args.dynamic_batch:
        raise SystemExit("--dynamic-batch and named dims (NAME:MIN..MAX) do not mix: name dim 0 too")
    # The example sizes are made up here (2, within each range): none is
    # recorded as typical of requests.
    try:
        _export(model, inputs, args.out, input_names=names, output_names=args.output_name,
                dynamic_batch=args.dynamic_batch, metadata=json.loads(args.metadata), format=args.format,
                inductor_configs=None, dynamic_shapes=[d or None for d in dynamic] if dims else None,
                record_typical=False)
    except ExportError as e:  # the worker could not load it: said, no traceback
        raise SystemExit(str(e)) from None
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
