"""Turn a PyTorch module into the .pt2 that aotid serves.

aotid prefers *exported programs* (``torch.export.save``): they are portable,
and aotid compiles them with AOTInductor for whatever hardware it runs on.

    import torch, aotid_export
    aotid_export.export(model, (torch.randn(1, 4),), "mlp.pt2",
                        input_names=["features"], output_names=["scores"],
                        dynamic_batch=True, metadata={"author": "me"})

Names and metadata travel inside the archive (``extra/aotid.json``); aotid
uses the names in its HTTP API.

``format`` picks the package kind:

* ``"exported_program"`` (default): portable; aotid compiles it for each
  machine, with per-model inductor options.
* ``"aoti"``: compiled here with AOTInductor into a ``.so`` for *this*
  machine's OS, CPU architecture and vector ISA; aotid loads it as is on a
  machine that matches and refuses it, with the reason, on one that does not.
* ``"aoti_source"``: AOTInductor's C++ (``aot_inductor.package_cpp_only``);
  aotid compiles it with the local C++ compiler, no Python needed.

For the two AOTInductor kinds the archive also records every input's and
output's datatype and shape, which a compiled model does not carry.

``export_many`` writes several models into one exported-program package;
``aotid add --package-model NAME`` picks one.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import torch

__all__ = ["export", "export_many", "AOTID_EXTRA_FILE", "FORMATS"]

FORMATS = ("exported_program", "aoti", "aoti_source")

AOTID_EXTRA_FILE = "aotid.json"
MAX_DYNAMIC_BATCH = 1 << 16


def _input_names(model: torch.nn.Module, n: int, given: Sequence[str] | None) -> list[str]:
    if given is not None:
        if len(given) != n:
            raise ValueError(f"input_names has {len(given)} names for {n} example inputs")
        return list(given)
    import inspect

    params = [
        p.name
        for p in inspect.signature(model.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return params[:n] if len(params) >= n else [f"input{i}" for i in range(n)]


def _declared_dims(example_inputs, dynamic_shapes, record_typical):
    """Per input, per dim: None, or the dynamic dim as declared (its name, its
    range, and the example's size as a typical one). The compile worker
    prefers these to what tracing recorded: torch.export raises a declared
    minimum of 0 or 1 to 2, and names dims s0, s1, ..."""
    out = []
    for t, spec in zip(example_inputs, dynamic_shapes):
        dims = [None] * t.dim()
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec or ())
        for i, d in items:
            name, lo, hi = getattr(d, "__name__", None), getattr(d, "min", None), getattr(d, "max", None)
            if not isinstance(i, int) or not 0 <= i < t.dim() or not isinstance(name, str):
                continue  # Dim.AUTO and the like: nothing declared to record
            entry = {"name": name}
            if isinstance(lo, int):
                entry["min"] = lo
            if isinstance(hi, int) and hi < 2**62:
                entry["max"] = hi
            if record_typical:
                entry["typical"] = int(t.shape[i])
            dims[i] = entry
        out.append(dims if any(dims) else None)
    return out if any(out) else None


def _export_program(model, example_inputs, input_names, output_names, dynamic_batch, dynamic_shapes=None,
                    record_typical=True):
    """The exported program and the names aotid will show."""
    example_inputs = tuple(example_inputs)
    for i, t in enumerate(example_inputs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"example input {i} is a {type(t).__name__}; aotid serves tensor inputs only")
    names = _input_names(model, len(example_inputs), input_names)
    if dynamic_shapes is not None and dynamic_batch:
        raise ValueError("give dynamic_batch or dynamic_shapes, not both (dynamic_shapes can say dim 0 too)")
    if dynamic_shapes is not None:
        # torch.export's own form: per input (in order, or by input name) a
        # {dim: torch.export.Dim} mapping; one Dim object shared between
        # inputs makes those dims equal, and its min/max are the range aotid
        # serves.
        if isinstance(dynamic_shapes, Mapping):
            unknown = set(dynamic_shapes) - set(names)
            if unknown:
                raise ValueError(f"dynamic_shapes names {sorted(unknown)}, the inputs are {names}")
            dynamic_shapes = tuple(dynamic_shapes.get(n) for n in names)
        elif len(dynamic_shapes) != len(example_inputs):
            raise ValueError(f"dynamic_shapes has {len(dynamic_shapes)} entries for {len(example_inputs)} inputs")
        else:
            dynamic_shapes = tuple(dynamic_shapes)
    elif dynamic_batch:
        # torch.export specializes a dim of size 1, so trace a batch of 2.
        example_inputs = tuple(
            torch.cat([t, t]) if t.dim() > 0 and t.shape[0] == 1 else t for t in example_inputs)
        batch = torch.export.Dim("batch", min=1, max=MAX_DYNAMIC_BATCH)
        dynamic_shapes = tuple({0: batch} if t.dim() > 0 else None for t in example_inputs)
        record_typical = False  # the batch was doubled to trace it
    model = model.eval()
    with torch.no_grad():
        ep = torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    n_out = len(ep.graph_signature.user_outputs)
    if output_names is not None and len(output_names) != n_out:
        raise ValueError(f"output_names has {len(output_names)} names; the model returns {n_out} outputs")
    described = {"input_names": names, "output_names": list(output_names) if output_names is not None else None}
    declared = _declared_dims(example_inputs, dynamic_shapes, record_typical) if dynamic_shapes else None
    if declared:
        described["input_dims"] = declared
    return ep, described


def export(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    path: str,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_batch: bool = False,
    metadata: Mapping[str, Any] | None = None,
    format: str = "exported_program",
    inductor_configs: Mapping[str, Any] | None = None,
    dynamic_shapes: Sequence[Any] | Mapping[str, Any] | None = None,
) -> torch.export.ExportedProgram:
    """Exports ``model`` called on ``example_inputs`` to ``path``.

    Every input must be a tensor and the model must return a tensor or a
    tuple/list of tensors. With ``dynamic_batch``, dim 0 of every input is
    dynamic (1 to 65536), so the served model takes any batch size.
    ``dynamic_shapes`` says more, in torch.export's own form: per input, by
    position or by input name, ``{dim: torch.export.Dim(name, min=, max=)}``.
    One Dim shared by several inputs makes those dims equal (a batch, a
    sequence length), and its range is what aotid serves and refuses
    outside of. Example sizes of 1 are specialized by torch.export: trace a
    dynamic dim at 2 or more.
    ``inductor_configs`` are AOTInductor's options: the two AOTInductor
    formats are compiled with them here; an exported program carries them,
    and aotid builds it with them on each machine (a version's own
    ``inductor.*`` settings, ``aotid set``, take precedence). A package may
    carry only options that choose kernels (docs/BUILDS.md); others raise
    ValueError for an exported program.
    """
    return _export(model, example_inputs, path, input_names=input_names, output_names=output_names,
                   dynamic_batch=dynamic_batch, metadata=metadata, format=format, inductor_configs=inductor_configs,
                   dynamic_shapes=dynamic_shapes)


def _export(model, example_inputs, path, *, input_names, output_names, dynamic_batch, metadata, format,
            inductor_configs, dynamic_shapes, record_typical=True):
    """``export``; ``record_typical`` False when the example sizes were made
    up (the command line's) and say nothing of what requests will hold."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    ep, names = _export_program(model, example_inputs, input_names, output_names, dynamic_batch, dynamic_shapes,
                                record_typical)
    extra = {"format": 1, **names, "metadata": dict(metadata or {})}
    if format == "exported_program":
        if inductor_configs:
            extra["inductor_options"] = _package_options(inductor_configs)
        torch.export.save(ep, path, extra_files={AOTID_EXTRA_FILE: json.dumps(extra)})
        return ep
    _compile_aoti(ep, names, extra, path, format == "aoti_source", dict(inductor_configs or {}))
    return ep


def _package_options(configs: Mapping[str, Any]) -> dict:
    """``configs`` as aotid's compile worker reads them from a package (a
    package may ask only for options that choose kernels), else ValueError."""
    from aotid_worker.compile import BuildError, package_options

    if not isinstance(configs, Mapping):
        raise ValueError(f"inductor_configs is a mapping of option names to values, not {type(configs).__name__}")
    try:
        return package_options(dict(configs))
    except BuildError as e:
        raise ValueError(str(e)) from None


def export_many(
    models: Mapping[str, tuple[torch.nn.Module, Sequence[torch.Tensor], Mapping[str, Any]]],
    path: str,
    *,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Writes several models into one exported-program package.

    ``models`` maps each package model name to ``(module, example_inputs,
    options)``, where options are ``export``'s keyword arguments
    ``input_names``, ``output_names`` and ``dynamic_batch``.
    """
    from torch.export.pt2_archive._package import package_pt2

    programs, per_model = {}, {}
    for name, (model, example_inputs, options) in models.items():
        programs[name], per_model[name] = _export_program(
            model, example_inputs, options.get("input_names"), options.get("output_names"),
            options.get("dynamic_batch", False))
    extra = {"format": 1, "models": per_model, "metadata": dict(metadata or {})}
    package_pt2(path, exported_programs=programs, extra_files={AOTID_EXTRA_FILE: json.dumps(extra)})


def _compile_aoti(ep, names, extra, path, source_only, configs):
    """Compiles with AOTInductor and records the interface beside the code."""
    import os
    import tempfile
    import zipfile

    from aotid_worker.compile import model_spec

    spec = model_spec(ep, names)
    configs.setdefault("cpp.dynamic_threads", True)  # aotid sets threads per model when it loads it
    if source_only:
        configs["aot_inductor.package_cpp_only"] = True
    with tempfile.TemporaryDirectory() as tmp:
        built = os.path.join(tmp, "model.pt2")
        with torch.no_grad():
            torch._inductor.aoti_compile_and_package(ep, package_path=built, inductor_configs=configs)
        with zipfile.ZipFile(built) as src:
            root = src.namelist()[0].split("/")[0]
            with zipfile.ZipFile(path, "w") as dst:
                for item in src.infolist():
                    dst.writestr(item, src.read(item.filename))
                dst.writestr(f"{root}/extra/{AOTID_EXTRA_FILE}",
                             json.dumps({**extra, "models": {"model": spec}}))
