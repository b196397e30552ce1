"""Command line: python -m aotid_export MODULE:FACTORY --input NAME=DTYPE[SHAPE] ... -o OUT.pt2

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

from . import FORMATS, export

_INPUT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([a-z0-9]+)\[([0-9, ]*)\]$")


def _example(spec: str) -> tuple[str, torch.Tensor]:
    m = _INPUT.match(spec)
    if not m:
        raise SystemExit(f"--input {spec!r}: expected NAME=DTYPE[D0,D1,...], e.g. x=float32[1,4]")
    name, dtype_name, dims = m.groups()
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"--input {spec!r}: unknown dtype {dtype_name!r}")
    shape = [int(d) for d in dims.replace(" ", "").split(",") if d]
    if dtype.is_floating_point:
        t = torch.randn(shape).to(dtype)
    elif dtype == torch.bool:
        t = torch.zeros(shape, dtype=torch.bool)
    else:
        t = torch.zeros(shape, dtype=dtype)
    return name, t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aotid_export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("factory", help="MODULE:CALLABLE returning an nn.Module")
    p.add_argument("--input", action="append", default=[], required=True, metavar="NAME=DTYPE[SHAPE]")
    p.add_argument("--output-name", action="append", default=None, metavar="NAME")
    p.add_argument("--dynamic-batch", action="store_true", help="make dim 0 of every input dynamic")
    p.add_argument("--metadata", default="{}", help="JSON object stored with the model")
    p.add_argument("--format", choices=FORMATS, default="exported_program",
                   help="exported_program (portable, compiled by aotid on each machine), aoti (compiled here "
                        "for this machine), aoti_source (C++ that aotid compiles without Python)")
    p.add_argument("-o", "--out", required=True)
    args = p.parse_args(argv)

    module_name, _, attr = args.factory.partition(":")
    if not attr:
        raise SystemExit(f"{args.factory!r}: expected MODULE:CALLABLE")
    factory = getattr(importlib.import_module(module_name), attr)
    model = factory()
    names, inputs = zip(*(_example(s) for s in args.input))
    export(model, inputs, args.out, input_names=names, output_names=args.output_name,
           dynamic_batch=args.dynamic_batch, metadata=json.loads(args.metadata), format=args.format)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
