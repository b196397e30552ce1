"""Compiles an exported program (.pt2 from torch.export.save) into an
AOTInductor package for this machine.

The daemon runs it as a child process with a time limit and captures its
output into the build log. It writes into --out (a fresh staging directory):

    model.pt2   the AOTInductor package
    spec.json   {"inputs": [...], "outputs": [...]}: name, datatype, shape (-1 = dynamic)

Exit status: 0 built; 2 the artifact cannot be built (the message says why,
retrying will not help); anything else is a failure that may pass on retry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

EXIT_PERMANENT = 2

_DTYPES = {
    "bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "int16": "INT16", "int32": "INT32",
    "int64": "INT64", "float16": "FP16", "bfloat16": "BF16", "float32": "FP32", "float64": "FP64",
}


class BuildError(Exception):
    """The artifact cannot be built as it is."""


def log(msg: str) -> None:
    print(f"[aotid-worker] {msg}", file=sys.stderr, flush=True)


def tensor_spec(name: str, val) -> dict:
    import torch

    if not isinstance(val, torch.Tensor):
        raise BuildError(f"'{name}' is a {type(val).__name__}, not a tensor; aotid serves tensors only")
    dtype = str(val.dtype).removeprefix("torch.")
    if dtype not in _DTYPES:
        raise BuildError(f"'{name}' has dtype {dtype}, which aotid cannot serve")
    # Concrete dims are plain ints; symbolic (dynamic) ones are SymInts.
    shape = [d if isinstance(d, int) else -1 for d in val.shape]
    return {"name": name, "datatype": _DTYPES[dtype], "shape": shape}


def model_spec(ep, extra: dict) -> dict:
    nodes = {n.name: n for n in ep.graph.nodes}
    user_inputs = list(ep.graph_signature.user_inputs)
    in_names = extra.get("input_names") or user_inputs
    if len(in_names) != len(user_inputs):
        raise BuildError(f"aotid.json names {len(in_names)} inputs, the program takes {len(user_inputs)}")
    inputs = []
    for shown, graph_name in zip(in_names, user_inputs):
        node = nodes.get(graph_name)
        if node is None:
            raise BuildError(f"input '{graph_name}' is not a tensor placeholder")
        inputs.append(tensor_spec(shown, node.meta.get("val")))

    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    out_vals = out_node.args[0]
    # Outputs are the user outputs at the end of the flat output list.
    n_user = len(ep.graph_signature.user_outputs)
    out_vals = list(out_vals)[-n_user:] if n_user else []
    out_names = extra.get("output_names") or [f"output{i}" for i in range(n_user)]
    if len(out_names) != n_user:
        raise BuildError(f"aotid.json names {len(out_names)} outputs, the program returns {n_user}")
    outputs = []
    for shown, arg in zip(out_names, out_vals):
        val = arg.meta.get("val") if hasattr(arg, "meta") else arg
        outputs.append(tensor_spec(shown, val))
    return {"inputs": inputs, "outputs": outputs}


def build(args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    import torch

    if args.expect_torch and torch.__version__ != args.expect_torch:
        raise BuildError(f"the worker's torch is {torch.__version__} but aotid links torch "
                         f"{args.expect_torch}; point build.python at a Python with torch=={args.expect_torch}")
    log(f"torch {torch.__version__} loaded in {time.monotonic() - t0:.1f}s")

    extra_files = {"aotid.json": ""}
    try:
        ep = torch.export.load(args.artifact, extra_files=extra_files)
    except Exception as e:  # a damaged or foreign archive
        raise BuildError(f"cannot load exported program: {e}") from e
    extra = json.loads(extra_files["aotid.json"]) if extra_files["aotid.json"] else {}
    spec = model_spec(ep, extra)
    log(f"exported program loaded: {len(spec['inputs'])} inputs, {len(spec['outputs'])} outputs")

    if args.device != "cpu":
        from torch.export.passes import move_to_device_pass
        ep = move_to_device_pass(ep, args.device)

    t1 = time.monotonic()
    out_pkg = os.path.join(args.out, "model.pt2")
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(ep, package_path=out_pkg)
    log(f"compiled for {args.device} in {time.monotonic() - t1:.1f}s")

    with open(os.path.join(args.out, "spec.json"), "w") as f:
        json.dump(spec, f)
        f.flush()
        os.fsync(f.fileno())


def die_with_parent() -> None:
    """A build must not outlive the daemon that started it (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() == 1:  # the parent is already gone
            sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    p = argparse.ArgumentParser(prog="python -m aotid_worker.compile")
    p.add_argument("--artifact", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
    p.add_argument("--expect-torch", default="")
    args = p.parse_args(argv)
    try:
        build(args)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_PERMANENT
    return 0


if __name__ == "__main__":
    sys.exit(main())
