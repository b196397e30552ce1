"""Compiles an exported program (.pt2 from torch.export.save) into an
AOTInductor package for this machine.

The daemon runs it as a child process with a time limit and captures its
output into the build log. It writes into --out (a fresh staging directory):

    model.so      the compiled model, weights inside, loaded by the daemon as is
    *.cubin ...   a device model's kernel files (KERNEL_SUFFIXES), which it opens by
                  name from the folder the daemon's runner names (the build's own)
    spec.json     {"inputs": [...], "outputs": [...]}: name, datatype, shape (-1 = dynamic);
                  inputs may add "dims" (per dim, null or the dynamic dim's symbol and
                  min/max) and "values" (min/max of an integer input that indexes a table);
                  and "state_inputs" when the program has some (aotid.json "state_inputs"):
                  the inputs after the client's, which the daemon makes, zeros, at load
                  and passes to every call (a language model's key/value cache)
    package.json  the package's metadata: AOTInductor's and the author's own

Progress goes to stderr as "[aotid-worker] step N/4: ..." lines, which the
daemon shows while the build runs.

Exit status: 0 built; 2 the artifact cannot be built (the message says why,
retrying will not help); anything else is a failure that may pass on retry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Exit codes of every build child, as compile/package_build.h defines them:
# 0 built, 1 failed in a way that may pass, 2 cannot be built here.
EXIT_PERMANENT = 2

_DTYPES = {
    "bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "int16": "INT16", "int32": "INT32",
    "int64": "INT64", "float16": "FP16", "bfloat16": "BF16", "float32": "FP32", "float64": "FP64",
    "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
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


# Ops that pass every element of their input through unchanged, only
# rearranged: an index that flows through them still reaches the table whole.
# (Slices, selects and casts are left out: after them some elements, or their
# values, no longer reach it.)
_PASS_THROUGH = {
    "view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten", "clone", "contiguous",
    "permute", "transpose", "t", "expand", "alias", "detach", "lift_fresh_copy",
}


def _op_name(node) -> str:
    """'embedding' for aten.embedding.default; '' for anything else."""
    target = node.target
    if node.op != "call_function" or not hasattr(target, "_schema"):
        return ""
    if getattr(target, "namespace", "") != "aten":
        return ""
    return target._schema.name.split("::")[-1]


def _table_size(table, dim: int):
    """The static size of dim `dim` of the tensor `table` feeds, else None."""
    val = table.meta.get("val") if hasattr(table, "meta") else None
    shape = getattr(val, "shape", None)
    if shape is None or not -len(shape) <= dim < len(shape):
        return None
    size = shape[dim]
    return size if isinstance(size, int) else None


def value_range(node) -> dict | None:
    """The values an integer input may hold: where every element of it
    reaches an embedding or index op whose table size is known, the range
    that op accepts (narrowest of all such uses). Those ops read out of
    bounds (the compiled kernel's bounds check aborts the process) on any
    other value. None when nothing is known."""
    lo, hi = None, None

    def narrow(a: int, b: int) -> None:
        nonlocal lo, hi
        lo = a if lo is None else max(lo, a)
        hi = b if hi is None else min(hi, b)

    seen, todo = set(), [node]
    while todo:
        cur = todo.pop()
        if cur in seen:
            continue
        seen.add(cur)
        for user in cur.users:
            op = _op_name(user)
            if op in _PASS_THROUGH and user.args and user.args[0] is cur:
                todo.append(user)
            elif op == "embedding" and len(user.args) >= 2 and user.args[1] is cur:
                size = _table_size(user.args[0], 0)
                if size is not None:
                    narrow(0, size - 1)  # no negative ids: eager raises on them too
            elif op == "index_select" and len(user.args) >= 3 and user.args[2] is cur:
                size = _table_size(user.args[0], user.args[1])
                if size is not None:
                    narrow(0, size - 1)
            elif op == "index" and len(user.args) >= 2 and isinstance(user.args[1], (list, tuple)):
                for dim, idx in enumerate(user.args[1]):
                    size = _table_size(user.args[0], dim) if idx is cur else None
                    if size is not None:
                        narrow(-size, size - 1)  # advanced indexing counts negatives from the end
    if lo is None or lo > hi:
        return None
    return {"min": lo, "max": hi}


def dim_ranges(ep, val, declared=None) -> list | None:
    """Per dim of an input, None for a static dim, else the symbol it was
    traced as (inputs whose dims share a symbol must agree on its size) and
    the sizes it was traced for (range_constraints). None when no dim is
    dynamic, or one is an expression rather than a plain symbol. `declared`
    is the exporter's record of the dims (aotid.json "input_dims"): their
    declared minimum and a typical size."""
    import sympy

    dims, dynamic = [], False
    for i, d in enumerate(val.shape):
        if isinstance(d, int):
            dims.append(None)
            continue
        expr = d.node.expr
        if not isinstance(expr, sympy.Symbol) or expr not in ep.range_constraints:
            return None
        vr = ep.range_constraints[expr]
        if not vr.lower.is_Integer:
            return None
        entry = {"symbol": str(expr), "min": int(vr.lower)}
        said = declared[i] if isinstance(declared, list) and i < len(declared) else None
        said = said if isinstance(said, dict) else {}
        # torch.export specializes sizes 0 and 1, so a dynamic dim declared
        # from 1 (or with no minimum) is traced with a minimum of 2, yet the
        # kernels compiled for it run size 1 correctly (a batch of one row is
        # the common case). A traced minimum of 2 is served from 1 unless
        # the exporter recorded a declared minimum of 2.
        if entry["min"] == 2 and said.get("min") != 2:
            entry["min"] = 1
        if vr.upper.is_Integer:  # else unbounded (int_oo): no max recorded
            entry["max"] = int(vr.upper)
        typical = said.get("typical")
        if isinstance(typical, int) and entry["min"] <= typical <= entry.get("max", typical):
            entry["typical"] = typical
        if isinstance(said.get("name"), str) and said["name"]:
            entry["name"] = said["name"]
        dims.append(entry)
        dynamic = True
    return dims if dynamic else None


def name_symbols(inputs: list) -> None:
    """Shows each traced symbol (s0, s1) by the name the exporter declared
    for it (batch, seq), where every dim of the symbol has one declared name
    and no two symbols share it; else the traced symbols stay."""
    names: dict = {}
    for spec in inputs:
        for d in spec.get("dims") or []:
            if d is not None:
                names.setdefault(d["symbol"], set()).add(d.pop("name", None))
    chosen = {sym: next(iter(n)) for sym, n in names.items() if len(n) == 1 and None not in n}
    if len(set(chosen.values())) != len(chosen) or len(chosen) != len(names):
        return
    for spec in inputs:
        for d in spec.get("dims") or []:
            if d is not None:
                d["symbol"] = chosen[d["symbol"]]


def input_contract(ep, node, declared=None) -> dict:
    """What a request must hold beyond the declared shape, for one input.
    Empty when the analysis fails: nothing recorded is better than a wrong
    range that would refuse valid requests."""
    extra = {}
    try:
        dims = dim_ranges(ep, node.meta["val"], declared)
        if dims is not None:
            extra["dims"] = dims
    except Exception as e:
        log(f"no dim ranges for input '{node.name}': {type(e).__name__}: {e}")
    try:
        import torch

        if not node.meta["val"].dtype.is_floating_point and node.meta["val"].dtype != torch.bool:
            values = value_range(node)
            if values is not None:
                extra["values"] = values
    except Exception as e:
        log(f"no value range for input '{node.name}': {type(e).__name__}: {e}")
    return extra


# The package formats (aotid.json "format") this worker reads: 2 adds state
# inputs. A package of a later one was written by a newer aotid_export.
FORMATS = (1, 2)


def state_specs(ep, extra: dict) -> list:
    """The program's state inputs (aotid.json "state_inputs"): its last user
    inputs, each of the fixed dtype and shape listed."""
    state = extra.get("state_inputs") or []
    if not isinstance(state, list) or not all(isinstance(s, dict) for s in state):
        raise BuildError("aotid.json \"state_inputs\" is not a list of objects")
    user_inputs = list(ep.graph_signature.user_inputs)
    if len(state) > len(user_inputs):
        raise BuildError(f"aotid.json lists {len(state)} state inputs, the program takes {len(user_inputs)} inputs")
    nodes = {n.name: n for n in ep.graph.nodes}
    out = []
    for said, graph_name in zip(state, user_inputs[len(user_inputs) - len(state):]):
        node = nodes.get(graph_name)
        spec = tensor_spec(str(said.get("name")), node.meta.get("val") if node is not None else None)
        want = {"name": said.get("name"), "datatype": _DTYPES.get(said.get("dtype")), "shape": said.get("shape")}
        if spec != want or -1 in spec["shape"]:
            raise BuildError(f"aotid.json lists state input {json.dumps(said)[:200]}; the program's input "
                             f"'{graph_name}' there is {spec['datatype']} {spec['shape']} (a state input's "
                             "shape is fixed)")
        out.append(spec)
    return out


def model_spec(ep, extra: dict) -> dict:
    nodes = {n.name: n for n in ep.graph.nodes}
    fmt = extra.get("format", 1)
    if fmt not in FORMATS:
        raise BuildError(f"the package's aotid.json is format {json.dumps(fmt)[:40]}, which this aotid does not "
                         f"read (it reads {', '.join(map(str, FORMATS))}): it was written by a newer aotid_export")
    state = state_specs(ep, extra)
    user_inputs = list(ep.graph_signature.user_inputs)
    user_inputs = user_inputs[:len(user_inputs) - len(state)]  # the client's: the state inputs come last
    in_names = extra.get("input_names") or user_inputs
    if len(in_names) != len(user_inputs):
        raise BuildError(f"aotid.json names {len(in_names)} inputs, the program takes {len(user_inputs)}")
    declared = extra.get("input_dims")
    declared = declared if isinstance(declared, list) and len(declared) == len(user_inputs) else [None] * len(
        user_inputs)
    inputs = []
    for shown, graph_name, said in zip(in_names, user_inputs, declared):
        node = nodes.get(graph_name)
        if node is None:
            raise BuildError(f"input '{graph_name}' is not a tensor placeholder")
        inputs.append({**tensor_spec(shown, node.meta.get("val")), **input_contract(ep, node, said)})
    name_symbols(inputs)

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
    return {"inputs": inputs, "outputs": outputs, **({"state_inputs": state} if state else {})}


def with_state_examples(ep, state: list):
    """The program with zeros for its state inputs' examples, which AOTInductor
    compiles with: the package may store them as one element expanded to
    the shape (no strides of a real tensor), or not at all."""
    import torch

    if ep.example_inputs is None:
        raise BuildError("the program has no example inputs, which AOTInductor compiles with")
    args, kwargs = ep.example_inputs
    if len(args) < len(state):
        raise BuildError(f"the program's example has {len(args)} inputs, fewer than its {len(state)} state inputs")
    dtypes = {v: k for k, v in _DTYPES.items()}
    zeros = tuple(torch.zeros(s["shape"], dtype=getattr(torch, dtypes[s["datatype"]])) for s in state)
    ep.example_inputs = (tuple(args[:len(args) - len(state)]) + zeros, kwargs)
    return ep


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


# The options a package may ask for: they choose among kernels, and a
# build with them computes nothing the model's own runs do not. The rest are
# for the machine's owner (`aotid set`), never for a file that may come from
# a registry: cpp.cxx names the compiler to run; freezing folds what depends
# on weights alone into the build at build time, at any size (a few bytes of
# package could write gigabytes into the cache); max_autotune_gemm and
# max_autotune_pointwise would keep autotuning on under an owner's
# max_autotune=false.
PACKAGE_OPTIONS = {
    "max_autotune": bool,
    "max_autotune_gemm_backends": str,
    "coordinate_descent_tuning": bool,
    "epilogue_fusion": bool,
}
GEMM_BACKENDS = ("ATEN", "CPP", "TRITON", "CUTLASS", "CK", "CKTILE")


def inductor_configs(text: str, package: dict | None = None) -> dict:
    """The version's inductor options (``text``, JSON), over those its
    package asks for (aotid.json "inductor_options"), over aotid's defaults."""
    # Kernels read the OpenMP thread count at run time, so the daemon picks
    # threads per runner when it loads the model, not the build machine.
    opts = {"cpp.dynamic_threads": True}
    if package is not None:
        opts.update(package_options(package))
    opts.update(checked_options(json.loads(text) if text else {}, ""))
    return opts


def package_options(package) -> dict:
    """The options a package asks for, checked and in torch's spelling."""
    if not isinstance(package, dict):
        raise BuildError("aotid.json \"inductor_options\" is not an object")
    out = {}
    for name, value in package.items():
        kind = PACKAGE_OPTIONS.get(name)
        if kind is None:
            raise BuildError(f"the package asks for inductor option {str(name)[:80]!r}, which a package may not "
                             f"set (only {', '.join(sorted(PACKAGE_OPTIONS))}): export it again without it; "
                             f"the machine's owner sets such options with aotid set NAME inductor.KEY=VALUE")
        if kind is bool and not isinstance(value, bool):
            raise BuildError(f"the package's inductor option {name!r} takes true or false, not "
                             f"{json.dumps(value)[:80]}")
        if kind is str:
            names = [b.strip().upper() for b in value.split(",")] if isinstance(value, str) and len(value) < 100 else []
            if not names or any(b not in GEMM_BACKENDS for b in names):
                raise BuildError(f"the package's inductor option {name!r} is {json.dumps(value)[:80]}, not a "
                                 f"comma-separated list of {', '.join(GEMM_BACKENDS)}")
            value = ",".join(dict.fromkeys(names))
        out[name] = value
    return checked_options(out, " (the package's)")


def checked_options(user: dict, whose: str) -> dict:
    """``user`` when this torch has every option, each of its default's type."""
    import torch._inductor.config as config

    for name, value in user.items():
        obj = config
        for part in name.split(".")[:-1]:
            obj = getattr(obj, part, None)
        leaf = name.split(".")[-1]
        if obj is None or not hasattr(obj, leaf):
            raise BuildError(f"unknown inductor option {str(name)[:80]!r}{whose} (torch {torch_version()})")
        # A value of another type than the option's default is a slip
        # (max_autotune=notabool): said now, not found in a slow build.
        default = getattr(obj, leaf)
        wanted = (bool,) if isinstance(default, bool) else (int,) if isinstance(default, int) else \
            (int, float) if isinstance(default, float) else (str,) if isinstance(default, str) else None
        if wanted is not None and (not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted)):
            kind = ("an " if wanted[-1] is int else "a ") + wanted[-1].__name__
            raise BuildError(f"inductor option {name!r}{whose} takes {kind} (its default is {default!r}), "
                             f"not {str(value)[:80]!r}")
    return user


def check_options(argv: list[str] | None = None) -> int:
    """`python -m aotid_worker.compile --check-options JSON`: 0 when this
    torch accepts them, else the reason and 2 (aotid set and add ask)."""
    try:
        inductor_configs(argv[0] if argv else "")
    except (BuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def torch_version() -> str:
    import torch

    return torch.__version__


# Kernel files a compiled model opens by name at run time from the folder its
# runner is given, as compile/build_cache.h's IsKernelFile says: CUDA's
# .cubin and .fatbin (torch writes one per Triton kernel unless
# aot_inductor.embed_kernel_binary), ROCm's .hsaco, XPU's .spv.
KERNEL_SUFFIXES = (".cubin", ".fatbin", ".hsaco", ".spv")


def is_kernel_file(name: str) -> bool:
    return (not name.startswith(".") and "/" not in name
            and any(name.endswith(s) and len(name) > len(s) for s in KERNEL_SUFFIXES))


def copy_out(z, name: str, path: str) -> None:
    with z.open(name) as src, open(path, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())


def extract_build(pkg: str, out: str, package_model: str) -> dict:
    """Takes the compiled .so, its kernel files and AOTInductor's metadata
    out of the package."""
    import zipfile

    meta = {}
    folder = f"/data/aotinductor/{package_model}/"
    with zipfile.ZipFile(pkg) as z:
        # Files directly in the model's folder, by their names there.
        files = {n.rsplit("/", 1)[1]: n for n in z.namelist() if folder in n and "/" not in n.split(folder, 1)[1]}
        sos = [n for base, n in files.items() if base.endswith(".so")]
        if len(sos) != 1:
            raise BuildError(f"the compiled package holds {len(sos)} .so files for '{package_model}', expected 1")
        copy_out(z, sos[0], os.path.join(out, "model.so"))
        kernels = [base for base in files if is_kernel_file(base)]
        for base in kernels:
            copy_out(z, files[base], os.path.join(out, base))
        if kernels:
            log(f"kept {len(kernels)} kernel file{'s' if len(kernels) > 1 else ''} beside model.so")
        for base, n in files.items():
            if base.endswith("wrapper_metadata.json"):
                meta = json.loads(z.read(n))
    return meta


def load_package(path: str, package_model: str):
    """The program of `package_model` and what the build writes beside it:
    ``(ep, names, author metadata, generate spec or None, embed spec or None)``."""
    from torch.export.pt2_archive._package import load_pt2

    try:
        # Opened here: given a path, torch warns about any name not ending
        # in .pt2, and blobs are named by their digest alone.
        with open(path, "rb") as f:
            contents = load_pt2(f)
    except Exception as e:  # a damaged or foreign archive
        raise BuildError(f"cannot load exported program: {e}") from e
    programs = contents.exported_programs
    if package_model not in programs:
        raise BuildError(f"the package has no model '{package_model}' (it has: {', '.join(sorted(programs))})")
    extra_text = contents.extra_files.get("aotid.json", "")
    if isinstance(extra_text, bytes):
        extra_text = extra_text.decode()
    extra = json.loads(extra_text) if extra_text else {}
    # A multi-model package names each model's inputs and outputs under "models".
    per_model = extra.get("models", {}).get(package_model, {})
    names = {**extra, **per_model}
    generate = generate_section(names.get("generate"), contents.extra_files, names)
    embed = embed_section(names.get("embed"), contents.extra_files, names)
    return programs[package_model], names, extra.get("metadata", {}), generate, embed


def load_program(path: str, package_model: str):
    """``load_package`` without the embed spec: ``(ep, names, author, generate)``."""
    return load_package(path, package_model)[:4]


def _section_with_tokenizer(kind, section, extra_files, names, inputs, output):
    """The package's ``kind`` section ("generate", "embed") with the tokenizer
    file it names read in, its ``inputs`` keys naming inputs of the model and
    its ``output`` key one of its outputs; None for a model without one."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise BuildError(f"aotid.json \"{kind}\" is not an object")
    ref = section.get("tokenizer")
    text = extra_files.get(ref) if isinstance(ref, str) else None
    if text is None:
        raise BuildError(f"aotid.json \"{kind}\" names the tokenizer file {ref!r}, which the package lacks")
    if isinstance(text, bytes):
        text = text.decode()
    try:
        tokenizer = json.loads(text)
    except ValueError as e:
        raise BuildError(f"the package's tokenizer file {ref} is not JSON: {e}") from e
    for key in inputs:
        if section.get(key) not in (names.get("input_names") or []):
            raise BuildError(f"aotid.json \"{kind}\" {key} {section.get(key)!r} is not one of the inputs")
    if section.get(output) not in (names.get("output_names") or []):
        raise BuildError(f"aotid.json \"{kind}\" {output} {section.get(output)!r} is not an output")
    return {**section, "tokenizer": tokenizer}


def generate_section(generate, extra_files, names):
    """A language model's generate spec with its tokenizer inside (the
    build's generate.json), or None for a model that has none."""
    # A model of several sequence slots takes the rows' slots too.
    slotted = isinstance(generate, dict) and ("slots_input" in generate or generate.get("max_sequences", 1) != 1)
    return _section_with_tokenizer("generate", generate, extra_files, names,
                                   ("tokens_input", "positions_input") + (("slots_input",) if slotted else ()),
                                   "logits_output")


def embed_section(embed, extra_files, names):
    """A sentence encoder's embed spec with its tokenizer.json inside (the
    build's embed.json), or None for a model that has none."""
    return _section_with_tokenizer("embed", embed, extra_files, names, ("input_ids", "attention_mask"), "output")


def device_unusable(device: str) -> str:
    """Why this torch cannot use `device` here, or "" when it can."""
    import torch

    if device == "cuda":
        if not torch.backends.cuda.is_built():
            return f"this torch ({torch.__version__}) is built without CUDA"
        if not torch.cuda.is_available():
            return "torch finds no usable CUDA device (torch.cuda.is_available() is False)"
    elif device == "mps":
        if not torch.backends.mps.is_built():
            return f"this torch ({torch.__version__}) is built without MPS"
        if not torch.backends.mps.is_available():
            return "torch finds no usable MPS device (torch.backends.mps.is_available() is False)"
    return ""


def move_to_device(ep, device: str):
    """The program retargeted to `device`. A device this torch cannot use is
    the machine's, not a passing failure: the build fails for good (exit 2),
    so the daemon builds for the CPU instead where fallback_cpu allows."""
    why = device_unusable(device)
    if why:
        raise BuildError(f"cannot build for {device}: {why}")
    try:
        from torch.export.passes import move_to_device_pass

        return move_to_device_pass(ep, device)
    except Exception as e:
        raise BuildError(f"cannot move the program to {device}: {type(e).__name__}: {str(e)[-2000:]}") from e


def build(args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    log("step 1/4: loading torch")
    import torch

    if args.expect_torch and torch.__version__ != args.expect_torch:
        raise BuildError(f"the worker's torch is {torch.__version__} but aotid links torch "
                         f"{args.expect_torch}; point build.python at a Python with torch=={args.expect_torch}")
    log(f"torch {torch.__version__} loaded in {time.monotonic() - t0:.1f}s")

    log("step 2/4: loading the exported program")
    ep, names, author, generate, embed = load_package(args.artifact, args.package_model)
    spec = model_spec(ep, names)
    log(f"exported program loaded: {len(spec['inputs'])} inputs, {len(spec['outputs'])} outputs")
    configs = inductor_configs(args.inductor_options, names.get("inductor_options"))

    if spec.get("state_inputs"):
        ep = with_state_examples(ep, spec["state_inputs"])
    if args.device != "cpu":
        ep = move_to_device(ep, args.device)

    log(f"step 3/4: compiling for {args.device} with AOTInductor ({json.dumps(configs, sort_keys=True)})")
    t1 = time.monotonic()
    out_pkg = os.path.join(args.out, "compiled.pt2")
    try:
        with torch.no_grad():
            torch._inductor.aoti_compile_and_package(ep, package_path=out_pkg, inductor_configs=configs)
    except Exception as e:
        # A lowering or C++ compile error is in the model: a retry would fail the same way.
        raise BuildError(f"AOTInductor could not compile the model for {args.device}: "
                         f"{type(e).__name__}: {str(e)[-2000:]}") from e
    log(f"compiled for {args.device} in {time.monotonic() - t1:.1f}s")

    log("step 4/4: writing the build")
    aoti = extract_build(out_pkg, args.out, "model")
    os.unlink(out_pkg)
    write_json(os.path.join(args.out, "spec.json"), spec)
    if generate is not None:
        write_json(os.path.join(args.out, "generate.json"), generate)
    if embed is not None:
        write_json(os.path.join(args.out, "embed.json"), embed)
    write_json(os.path.join(args.out, "package.json"),
               {"kind": "exported_program", "package_model": args.package_model, "aoti": aoti,
                "author": author, "inductor_options": configs})


def die_with_parent() -> None:
    """A build must not outlive the daemon that started it (Linux only).

    The daemon may itself be pid 1 (a container's entrypoint), so a parent
    of 1 proves nothing: the parent is compared with the one seen before the
    signal was asked for. Started through the sandbox, the worker also keeps
    the signal its wrapper asked for before exec'ing it."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        parent = os.getppid()
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the parent went in between
            sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--check-options"]:
        return check_options(argv[1:])
    die_with_parent()
    p = argparse.ArgumentParser(prog="python -m aotid_worker.compile")
    p.add_argument("--artifact", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
    p.add_argument("--package-model", default="model")
    p.add_argument("--inductor-options", default="", help="JSON object of inductor config overrides")
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
