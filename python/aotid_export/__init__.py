"""Turn a PyTorch module into the .pt2 that aotid serves.

aotid prefers *exported programs* (``torch.export.save``): they are portable,
and aotid compiles them with AOTInductor for whatever hardware it runs on.

    import torch, aotid_export
    aotid_export.export(model, (torch.randn(1, 4),), "mlp.pt2",
                        input_names=["features"], output_names=["scores"],
                        dynamic_batch=True, metadata={"author": "me"})

Names and metadata travel inside the archive (``extra/aotid.json``); aotid
uses the names in its HTTP API.

A model called with keywords (a transformers model) takes a dict example,
no wrapper needed; inputs are named by the keys, outputs by the keys and
fields of what it returns (``aotid_export.outputs``)::

    aotid_export.export(bert, {"input_ids": ids, "attention_mask": mask}, "bert.pt2",
                        dynamic_shapes={"input_ids": {0: batch, 1: seq},
                                        "attention_mask": {0: batch, 1: seq}})
    # outputs: last_hidden_state, pooler_output

Each exported program written is loaded back as aotid's compile worker will,
in a Python without the author's libraries (``check_package``); what the
worker could not load is refused here, with ``ExportError``.

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

import contextlib
import inspect
import json
import keyword
import os
import re
import subprocess
import sys
import warnings
from typing import Any, Mapping, Sequence

import torch

from .outputs import named_outputs

__all__ = ["export", "export_many", "check_package", "named_outputs", "ExportError", "AOTID_EXTRA_FILE", "FORMATS"]

FORMATS = ("exported_program", "aoti", "aoti_source")

AOTID_EXTRA_FILE = "aotid.json"
MAX_DYNAMIC_BATCH = 1 << 16


class ExportError(ValueError):
    """Refused at export: a package that would fail where aotid builds it, or
    a model that cannot be exported as given (said in the example's terms)."""


# Parameters a positional example rarely means to fill: a cache, labels,
# embeddings given instead of ids, and flags (transformers' spelling).
_UNLIKELY_POSITIONAL = re.compile(r"past|cache|labels?$|head_mask|embeds|^output_|^return_|^use_")


def _forward_parameters(model) -> list:
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # a builtin or C forward: nothing to read
        return []


def _input_names(model: torch.nn.Module, n: int, given: Sequence[str] | None) -> list[str]:
    if given is not None:
        if len(given) != n:
            raise ValueError(f"input_names has {len(given)} names for {n} example inputs")
        return list(given)
    params = [p.name for p in _forward_parameters(model) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return params[:n] if len(params) >= n else [f"input{i}" for i in range(n)]


def _unlikely_positional(model, n: int):
    """Where a positional example of ``n`` inputs lands on a parameter it is
    rarely meant for (GPT-2's forward(input_ids, past_key_values,
    attention_mask) called with (ids, mask) gives the mask as the cache):
    the example's index, the parameter, and forward's first parameter; else
    None."""
    params = [p for p in _forward_parameters(model) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for i, p in enumerate(params[:n]):
        if p.default is not p.empty and _UNLIKELY_POSITIONAL.search(p.name):
            return i, p.name, params[0].name if params else "input_ids"
    return None


def _warn_unlikely_positional(model, n: int) -> None:
    found = _unlikely_positional(model, n)
    if found is not None:
        i, name, first = found
        warnings.warn(
            f"example input {i} goes to {type(model).__name__}.forward's parameter '{name}', by position; "
            f"if it is meant for another parameter, give the example as a dict of keyword inputs, "
            f"e.g. {{'{first}': ..., 'attention_mask': ...}}", stacklevel=6)


class _Inputs:
    """The example as aotid serves it: named tensors, in order, and how each
    reaches forward (the first ``n_positional`` by position, the rest by
    their names), plus keyword constants the program is traced with."""

    def __init__(self, names, tensors, n_positional, constants, to_kwargs=(), parameters=()):
        self.names, self.tensors, self.n_positional, self.constants = names, tensors, n_positional, constants
        # Keys forward does not name (they went to its **kwargs), and the
        # names it does: a key there the graph never reads is a misspelling.
        self.to_kwargs, self.parameters = list(to_kwargs), list(parameters)

    def call(self, forward, tensors):
        n = self.n_positional
        return forward(*tensors[:n], **dict(zip(self.names[n:], tensors[n:])), **self.constants)


def _inputs(model, example_inputs, input_names) -> _Inputs:
    if not isinstance(example_inputs, Mapping):
        tensors = tuple(example_inputs)
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"example input {i} is a {type(t).__name__}; aotid serves tensor inputs only")
        _warn_unlikely_positional(model, len(tensors))
        return _Inputs(_input_names(model, len(tensors), input_names), tensors, len(tensors), {})
    if input_names is not None:
        raise ValueError("input_names goes with a tuple example; a dict example names its inputs by its keys")
    params = _forward_parameters(model)
    by_name = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params)
    where = f"{type(model).__name__}.forward"
    names, tensors, constants = [], [], {}
    for key, value in example_inputs.items():
        if not isinstance(key, str):
            raise TypeError(f"example keys are forward's parameter names; {key!r} is a {type(key).__name__}")
        if key not in by_name and not takes_any:
            raise TypeError(f"example input '{key}' is not a parameter of {where} (it takes "
                            f"{', '.join(by_name) or 'no keyword parameters'})")
        if isinstance(value, torch.Tensor):
            names.append(key)
            tensors.append(value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            constants[key] = value  # traced with it, not an input: use_cache=False and the like
        else:
            raise TypeError(f"example input '{key}' is a {type(value).__name__}; aotid serves tensor inputs "
                            "only (a bool, int, float, str or None is traced as a constant)")
    for p in params:
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names \
                and p.name not in constants:
            raise TypeError(f"{where} needs '{p.name}' (it has no default): give it in the example")
        if p.default is p.empty and p.kind == p.POSITIONAL_ONLY:
            raise TypeError(f"{where} takes '{p.name}' by position only: give the example as a tuple")
    if not tensors:
        raise ValueError("the example has no tensor inputs")
    named = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return _Inputs(names, tuple(tensors), 0, constants, [k for k in names if k not in by_name], named)


def _refuse_unread_extras(ep, inputs: _Inputs, where: str) -> None:
    """An example key that went to forward's **kwargs and that the program
    never reads is refused: served, it would be demanded and ignored (a
    misspelled ``atention_mask``). Named parameters left unused stay."""
    if not inputs.to_kwargs:
        return
    import difflib

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for name, spec in zip(inputs.names, ep.graph_signature.user_inputs):
        node = placeholders.get(spec) if isinstance(spec, str) else None
        if name not in inputs.to_kwargs or node is None or node.users:
            continue
        close = difflib.get_close_matches(name, inputs.parameters, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise TypeError(f"example input '{name}' is not a parameter of {where} (it went to its **kwargs) and "
                        f"the exported model never reads it{hint} (forward's parameters: "
                        f"{', '.join(inputs.parameters) or 'none'})")


def _out_folder_problem(path: str) -> str | None:
    """Why ``path`` cannot be written, as far as its folder says (the
    command lines ask before the work, not after), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"-o {path}: the folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"-o {path}: the folder {folder} is not writable"
    if os.path.isdir(path):
        return f"-o {path}: a folder; give the path of the .pt2 file to write"
    return None


def _refuse_past_positions(model, names, specs) -> None:
    """A transformers model's position table is as long as its config says
    (``max_position_embeddings``, ``n_positions``): a dynamic sequence dim
    (dim 1 of ``input_ids``, and every dim sharing its Dim) declared longer
    would export, then fail every request past the table. Refused."""
    config = getattr(model, "config", None)
    if config is None or specs is None or "input_ids" not in names:
        return
    field = next((f for f in ("max_position_embeddings", "n_positions")
                  if isinstance(getattr(config, f, None), int)), None)
    if field is None:
        return
    most = getattr(config, field)
    from .hf import _OFFSET_POSITIONS

    if getattr(config, "model_type", "") in _OFFSET_POSITIONS:
        most -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    seq = dict(_dim_items(specs[names.index("input_ids")])).get(1)
    hi = _bound(getattr(seq, "max", None)) if _is_root_dim(seq) else None
    if hi is not None and hi > most:
        raise ValueError(f"dynamic dim '{seq.__name__}' (dim 1 of input_ids) has max {hi}, but "
                         f"{type(model).__name__} has {most} positions (config.{field}): requests past {most} "
                         f"tokens would fail; declare max={most} or less")


def _dim_items(spec):
    if isinstance(spec, Mapping):
        return list(spec.items())
    if isinstance(spec, (list, tuple)):
        return list(enumerate(spec))
    return []


def _is_root_dim(d) -> bool:
    from torch.export.dynamic_shapes import _DerivedDim

    return isinstance(d, torch.export.Dim) and not isinstance(d, _DerivedDim) and isinstance(
        getattr(d, "__name__", None), str)


def _bound(v) -> int | None:
    return int(v) if isinstance(v, int) and abs(v) < 2**62 else None


def _traced_sizes(tensors, specs):
    """The example with every size-1 dynamic dim repeated to 2: torch.export
    specializes a size of 1 (the command line traces at 2 too)."""
    from torch.export.dynamic_shapes import _DerivedDim

    derived = {d.root.__name__ for s in specs for _, d in _dim_items(s) if isinstance(d, _DerivedDim)}
    out = []
    for t, spec in zip(tensors, specs):
        for i, d in _dim_items(spec):
            if not (_is_root_dim(d) and d.__name__ not in derived and isinstance(i, int) and 0 <= i < t.dim()):
                continue
            hi = _bound(d.max)
            if t.shape[i] == 1 and (hi is None or hi >= 2):
                t = torch.cat([t, t], dim=i)
        out.append(t)
    return tuple(out)


def _fixes_made(old_specs, new_specs) -> list[str]:
    """What torch.export's suggested fixes changed, one line per dim:
    ``samples: min 400 → 720``."""
    said, lines = set(), []
    for old, new in zip(old_specs, new_specs):
        new_items = dict(_dim_items(new))
        for i, d in _dim_items(old):
            name = getattr(d, "__name__", None)
            if not isinstance(name, str) or name in said:
                continue
            n = new_items.get(i)
            if isinstance(n, int):
                lines.append(f"{name}: dynamic → fixed at {n}")
            elif getattr(n, "__name__", name) != name:
                lines.append(f"{name}: now {n.__name__}")
            else:
                changed = [f"{k} {_bound(getattr(d, k))} → {_bound(getattr(n, k))}" for k in ("min", "max")
                           if _bound(getattr(d, k)) != _bound(getattr(n, k))]
                if not changed:
                    continue
                lines.append(f"{name}: {', '.join(changed)}")
            said.add(name)
    return lines


def _suggested_fixes(error: Exception) -> str | None:
    text = getattr(error, "msg", None)
    text = text if isinstance(text, str) else str(error)
    if "Suggested fixes:" not in text:
        return None
    # The fixes alone: torch's own parser stops at nothing.
    head, _, rest = text.partition("Suggested fixes:")
    fixes = []
    for line in rest.strip("\n").splitlines():
        if not line.strip():
            break
        fixes.append(line)
    return head + "Suggested fixes:\n" + "\n".join(fixes) if fixes else None


def _flat_forward(model, inputs: _Inputs, seen: list):
    """A forward taking the inputs by position, in order, that returns the
    model's output flattened to a tensor or a tuple of tensors (so the
    program's outputs are plain whatever the model returns), noting their
    names in ``seen``."""
    original = model.forward

    def forward(*tensors):
        out = inputs.call(original, tensors)
        named = named_outputs(out)
        if not named:  # a program with no outputs: torch.export's own error says nothing of why
            raise ValueError("the model returns no tensors (all its outputs are None)" if out is not None and (
                not isinstance(out, (tuple, list, dict)) or len(out)) else
                f"the model returns no tensors ({out!r})")
        seen[:] = [n for n, _ in named]
        if isinstance(out, torch.Tensor):
            return out
        return tuple(t for _, t in named)

    # torch.export names the placeholders, and matches dynamic_shapes, by
    # this signature.
    params, used = [], set()
    for i, name in enumerate(inputs.names):
        ok = name.isidentifier() and not keyword.iskeyword(name) and name not in used
        params.append(inspect.Parameter(name if ok else f"input{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD))
        used.add(params[-1].name)
    forward.__signature__ = inspect.Signature(params)
    return forward


@contextlib.contextmanager
def _forward_replaced(model, forward):
    had = "forward" in vars(model)
    before = vars(model).get("forward")
    model.forward = forward
    try:
        yield
    finally:
        if had:
            model.forward = before
        else:
            del model.forward


def _within_declared(declared, refined):
    """``refined`` (torch.export's suggested fixes applied to ``declared``)
    kept within the ranges the author declared: a suggestion may narrow a
    dim, never widen it (torch writes ``Dim('b', max=50)`` for a dim
    declared from 1, which reads as a minimum of 0). Derived dims
    (``a = 2*b + 1``) narrow their root so that they stay within the range
    declared for the dim they replace. ExportError when nothing is left."""
    from sympy import Integer
    from torch.export.dynamic_shapes import _DerivedDim

    limits: dict = {}  # root name -> [min, max, the dims that bound it]

    def limit(root, fn, lo, hi, why):
        cur = limits.setdefault(root.__name__, [_bound(root.min), _bound(root.max), []])
        b = int(fn(Integer(0)))
        a = int(fn(Integer(1))) - b  # fn is a*x + b, a > 0
        if lo is not None:
            r = -((b - lo) // a)  # the least r with a*r + b >= lo
            cur[0] = r if cur[0] is None else max(cur[0], r)
        if hi is not None:
            r = (hi - b) // a
            cur[1] = r if cur[1] is None else min(cur[1], r)
        cur[2].append(why)

    for old, new in zip(declared, refined):
        new_items = dict(_dim_items(new))
        for i, d in _dim_items(old):
            n = new_items.get(i)
            if not _is_root_dim(d) or n is None or isinstance(n, int):
                continue
            why = f"{d.__name__} ({_bound(d.min)} to {_bound(d.max)})"
            if isinstance(n, _DerivedDim) and _is_root_dim(n.root):
                limit(n.root, n.fn, _bound(d.min), _bound(d.max), why)
            elif _is_root_dim(n):
                limit(n, lambda x: x, _bound(d.min), _bound(d.max), why)
    roots = {}
    for name, (lo, hi, whys) in limits.items():
        if lo is not None and hi is not None and lo > hi:
            raise ExportError(f"torch.export's suggested fixes to the dynamic dims leave no size for '{name}' within "
                              f"the declared range of {', '.join(whys)}: the model cannot take those sizes; declare "
                              "a range it can")
        roots[name] = torch.export.Dim(name, min=lo, max=hi)

    def kept(d):
        if isinstance(d, _DerivedDim) and _is_root_dim(d.root) and d.root.__name__ in roots:
            return _DerivedDim(d.__name__, roots[d.root.__name__], d.fn)
        if _is_root_dim(d) and d.__name__ in roots:
            return roots[d.__name__]
        return d

    out = []
    for spec in refined:
        if isinstance(spec, Mapping):
            out.append({i: kept(d) for i, d in spec.items()})
        elif isinstance(spec, (list, tuple)):
            out.append(type(spec)(kept(d) for d in spec))
        else:
            out.append(spec)
    return tuple(out)


def _trace(model, tensors, specs):
    """torch.export's program, and the specs it was traced with: when it
    suggests fixes to them, they are applied once (never widening a declared
    range) and said; if the program still fails, ExportError says so."""
    try:
        return torch.export.export(model, tensors, dynamic_shapes=specs, strict=False), specs
    except Exception as e:
        fixes = _suggested_fixes(e) if specs is not None else None
        if fixes is None:
            raise
        try:
            refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(fixes, specs)
        except Exception:
            raise e from None
        refined = _within_declared(specs, refined)
        made = _fixes_made(specs, refined)
        print("aotid_export: torch.export suggested fixes to the dynamic dims; exporting again with them:\n  "
              + "\n  ".join(made or ["(no dim changed)"]), file=sys.stderr)
    try:
        return torch.export.export(model, tensors, dynamic_shapes=refined, strict=False), refined
    except Exception as again:
        text = getattr(again, "msg", None)
        text = (text if isinstance(text, str) else str(again)).strip()
        head = text.split("Suggested fixes:")[0].strip()
        if len(head) > 1500:
            head = head[:1500] + " ..."
        raise ExportError(
            "torch.export suggested fixes to the dynamic dims (" + ("; ".join(made) or "none") + "); exported "
            "again with them, the model still fails, so the dims need another declaration: change dynamic_shapes "
            f"so that the model takes every size in each range.\ntorch.export said: {head}") from None


def _declared_dims(example_inputs, dynamic_shapes, record_typical, given=None):
    """Per input, per dim: None, or the dynamic dim as declared (its name, its
    range, and the example's size as a typical one). The compile worker
    prefers these to what tracing recorded: torch.export raises a declared
    minimum of 0 or 1 to 2, and names dims s0, s1, ... A derived dim
    (``2*b``) is no name: it is recorded under the name the author gave that
    dim in ``given`` (the specs before suggested fixes), else unnamed."""
    out = []
    given = given if given is not None else dynamic_shapes
    for t, spec, said in zip(example_inputs, dynamic_shapes, given):
        said = dict(_dim_items(said))
        dims = [None] * t.dim()
        for i, d in _dim_items(spec):
            name, lo, hi = getattr(d, "__name__", None), getattr(d, "min", None), getattr(d, "max", None)
            if not isinstance(i, int) or not 0 <= i < t.dim() or not isinstance(name, str):
                continue  # Dim.AUTO and the like: nothing declared to record
            if not _is_root_dim(d):
                name = said[i].__name__ if _is_root_dim(said.get(i)) else None
            entry = {"name": name} if name else {}
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
    inputs = _inputs(model, example_inputs, input_names)
    names, tensors = inputs.names, inputs.tensors
    if dynamic_shapes is not None and dynamic_batch:
        raise ValueError("give dynamic_batch or dynamic_shapes, not both (dynamic_shapes can say dim 0 too)")
    specs = None
    if dynamic_shapes is not None:
        # torch.export's own form: per input (in order, or by input name) a
        # {dim: torch.export.Dim} mapping; one Dim object shared between
        # inputs makes those dims equal, and its min/max are the range aotid
        # serves.
        if isinstance(dynamic_shapes, Mapping):
            unknown = set(dynamic_shapes) - set(names)
            constant = sorted(unknown & set(inputs.constants))
            if constant:
                said = ", ".join(f"'{k}' (= {inputs.constants[k]!r})" for k in constant)
                raise ValueError(
                    f"dynamic_shapes names {said}, which the example gives as a constant: a constant is traced "
                    f"into the program, not served as an input, so it has no dims; leave it out of dynamic_shapes "
                    f"(its tensor inputs are {', '.join(names)})")
            if unknown:
                raise ValueError(f"dynamic_shapes names {sorted(unknown)}, the inputs are {names}")
            specs = tuple(dynamic_shapes.get(n) for n in names)
        elif len(dynamic_shapes) != len(tensors):
            also = (f"; the example's constants ({', '.join(inputs.constants)}) are traced into the program, not "
                    "inputs, and take no entry: give dynamic_shapes as a dict by input name"
                    if inputs.constants and len(dynamic_shapes) == len(tensors) + len(inputs.constants) else "")
            raise ValueError(f"dynamic_shapes has {len(dynamic_shapes)} entries for {len(tensors)} inputs "
                             f"({', '.join(names)}){also}")
        else:
            specs = tuple(dynamic_shapes)
    elif dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=MAX_DYNAMIC_BATCH)
        specs = tuple({0: batch} if t.dim() > 0 else None for t in tensors)
    if specs is not None and not any(specs):
        specs = None
    _refuse_past_positions(model, names, specs)
    traced = _traced_sizes(tensors, specs) if specs is not None else tensors
    model = model.eval()
    seen: list[str] = []
    found = _unlikely_positional(model, inputs.n_positional) if inputs.n_positional else None
    order = ", ".join(p.name for p in _forward_parameters(model)[:found[0] + 2]) if found else ""
    with torch.no_grad(), _forward_replaced(model, _flat_forward(model, inputs, seen)):
        given = specs
        try:
            ep, specs = _trace(model, traced, specs)
        except Exception as e:
            # A tensor given by position to a cache or the like fails deep in
            # the model (GPT-2: 'FakeTensor' object has no attribute
            # 'get_seq_length'): said in the example's terms.
            if found is None or isinstance(e, ExportError):
                raise
            i, name, first = found
            raise ExportError(
                f"example input {i} went to {type(model).__name__}.forward's parameter '{name}' by position (its "
                f"parameters, in order: {order}, ...), "
                f"and the export failed there ({type(e).__name__}: {str(e).strip().splitlines()[0][:300]}); give "
                f"the example as a dict of keyword inputs, e.g. {{'{first}': ids, 'attention_mask': mask}}, so that "
                "each tensor reaches the parameter it is for") from e
    _refuse_unread_extras(ep, inputs, f"{type(model).__name__}.forward")
    n_out = len(ep.graph_signature.user_outputs)
    if output_names is not None and len(output_names) != n_out:
        raise ValueError(f"output_names has {len(output_names)} names; the model returns {n_out} outputs")
    described = {"input_names": names, "output_names": list(output_names) if output_names is not None else seen}
    # The typical sizes are the example's own, not the ones traced.
    declared = _declared_dims(tensors, specs, record_typical, given) if specs else None
    if declared:
        described["input_dims"] = declared
    return ep, described


def export(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor] | Mapping[str, Any],
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

    ``example_inputs`` is a tuple of tensors, given to ``forward`` by
    position and named by its parameters (or ``input_names``; ``input{i}``
    for a ``forward(*args)``), or a dict of keyword inputs named by its keys
    (``{"input_ids": ids, "attention_mask": mask}``): parameters it leaves
    out keep their defaults, and a bool, int, float, str or None value is
    traced as a constant rather than served as an input. A tuple example
    that lands on a parameter such as ``past_key_values`` is warned of.

    What the model returns may be a tensor or any pytree of them (tuples,
    lists, dicts, namedtuples, transformers' ModelOutput): the program
    returns it flattened to plain tensors, named by ``named_outputs`` (keys
    and fields, nested ones joined with ".", None dropped; a tensor or a
    tuple of tensors gives output0, output1, ...) unless ``output_names``
    names them.

    With ``dynamic_batch``, dim 0 of every input is dynamic (1 to 65536),
    so the served model takes any batch size. ``dynamic_shapes`` says more,
    in torch.export's own form: per input, by position or by input name,
    ``{dim: torch.export.Dim(name, min=, max=)}``. One Dim shared by several
    inputs makes those dims equal (a batch, a sequence length), and its
    range is what aotid serves and refuses outside of. A dynamic dim of
    size 1 in the example is traced at 2 (torch.export would fix it at 1);
    the example's own sizes are recorded as the typical ones. When
    torch.export suggests fixes to the dims (a larger minimum), they are
    applied once and printed to stderr.

    An exported program is then loaded as aotid's compile worker will
    (``check_package``); if it cannot be, the file is removed and
    ``ExportError`` says why.
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
        _checked(path, ["model"])
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
    ``input_names``, ``output_names``, ``dynamic_batch`` and
    ``dynamic_shapes``; examples, outputs and the load check are as
    ``export``'s.
    """
    from torch.export.pt2_archive._package import package_pt2

    programs, per_model = {}, {}
    for name, (model, example_inputs, options) in models.items():
        programs[name], per_model[name] = _export_program(
            model, example_inputs, options.get("input_names"), options.get("output_names"),
            options.get("dynamic_batch", False), options.get("dynamic_shapes"))
    extra = {"format": 1, "models": per_model, "metadata": dict(metadata or {})}
    package_pt2(path, exported_programs=programs, extra_files={AOTID_EXTRA_FILE: json.dumps(extra)})
    _checked(path, list(programs))


# Run by check_package in a bare interpreter (python -I -S): the compile
# worker's own load of the package, where no module but the standard
# library, torch and its requirements, numpy and aotid_worker can be
# imported, as in a worker that has only those.
_CHECK_SCRIPT = r"""
import json, sys
from importlib.machinery import PathFinder
allowed, paths, package, models = json.loads(sys.argv[1])
allowed, stdlib = set(allowed), list(sys.path)

class WorkerPathFinder:
    # Finds what the worker would have and nothing else: importlib's own
    # path finder, limited to those modules (and the standard library's).
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in allowed or top in sys.stdlib_module_names:
            return PathFinder.find_spec(name, path, target)
        if "." not in name:
            return PathFinder.find_spec(name, stdlib, target)
        return None

    def invalidate_caches(self):
        PathFinder.invalidate_caches()

sys.meta_path[:] = [f for f in sys.meta_path if f is not PathFinder] + [WorkerPathFinder()]
sys.path.extend(paths)
try:
    from aotid_worker.compile import load_package, model_spec
    for m in models:
        ep, names = load_package(package, m)[:2]
        model_spec(ep, names)
except BaseException as e:
    sys.stderr.write(str(e).strip() or type(e).__name__)
    sys.exit(2)
"""


def _worker_modules() -> tuple[list[str], list[str]]:
    """The top-level modules a compile worker has (the standard library
    aside): torch's and numpy's distributions and what they require, and
    aotid_worker; and the folders they are found in."""
    from importlib import metadata

    def norm(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    dists, todo = {}, ["torch", "numpy"]
    while todo:
        name = norm(todo.pop())
        if name in dists:
            continue
        try:
            dists[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            dists[name] = None
            continue
        for req in dists[name].requires or []:
            spec, _, marker = req.partition(";")
            if "extra" in marker:
                continue
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
            if m:
                todo.append(m.group(1))
    allowed = {"aotid_worker"}
    for module, owners in metadata.packages_distributions().items():
        if any(norm(o) in dists for o in owners):
            allowed.add(module)
    import aotid_worker

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(aotid_worker.__file__)))]
    for d in dists.values():
        if d is not None:
            where = os.path.abspath(str(d.locate_file("")))
            if where not in paths:
                paths.append(where)
    return sorted(allowed), paths


def check_package(path: str, package_models: Sequence[str] | None = None) -> None:
    """Loads the exported-program package at ``path`` as aotid's compile
    worker will, in a separate Python that has only what the worker has
    (torch, numpy and the standard library; none of the author's
    libraries), and raises ExportError with the reason if it cannot: a
    pytree type from another library (transformers' ModelOutput, say), an
    operator registered by one, names that do not match the program.
    ``export`` and ``export_many`` call it on what they write (a few
    seconds: about twice an ``import torch``, most of it torch's own
    imports). ``package_models``: the models to load
    (default: every one the archive holds)."""
    if package_models is None:
        import zipfile

        with zipfile.ZipFile(path) as z:
            found = {m.group(1) for m in (re.match(r"^[^/]+/models/([^/]+)\.json$", n) for n in z.namelist()) if m}
        package_models = sorted(found) or ["model"]
    allowed, paths = _worker_modules()
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _CHECK_SCRIPT,
         json.dumps([allowed, paths, os.path.abspath(path), list(package_models)])],
        env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode == 0:
        return
    said = proc.stderr.strip()
    why = said.splitlines()[-1].strip().rstrip(".") if said else f"exit status {proc.returncode}"
    pytree_type = re.search(r"Deserializing (\S+) in pytree is not registered", said)
    op = re.search(r"failed to resolve (\S+) to an operator", said)
    if pytree_type:
        why = (f"the pytree type {pytree_type.group(1)} is not registered there (its library is not in the "
               "worker, which has torch and numpy only): return tensors, or tuples, lists or dicts of them, "
               "or export with aotid_export.export, which flattens what the model returns")
    elif op:
        why = (f"the operator {op.group(1)} is not registered there (the library that defines it is not in the "
               "worker, which has torch and numpy only)")
    elif len(why) > 1000:
        why = why[:1000] + " ..."
    raise ExportError(f"aotid's compile worker could not load {path}: {why}")


def _checked(path: str, package_models: Sequence[str]) -> None:
    """check_package; a package that fails it is removed, so it cannot be added."""
    try:
        check_package(path, package_models)
    except ExportError:
        os.unlink(path)
        raise


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
