"""How aotid names a model's outputs: one rule, shared by the exporter (which
records the names in the package) and by anything that compares a served
model with eager PyTorch (which names eager's outputs the same way).

    named_outputs(model(**example))  ->  [("last_hidden_state", t), ("pooler_output", t)]

The output is flattened as torch.export flattens it (any registered pytree:
tuples, lists, dicts, namedtuples, transformers' ModelOutput ...), in the
same order, and each tensor is named by where it sits:

* a dict's key, a namedtuple's or ModelOutput's field: its name;
* nested containers join with ".": ``encoder.last_hidden_state``,
  ``hidden_states.0`` (a tuple inside a ModelOutput counts from 0);
* an entry of a top-level tuple or list is ``output{i}``:
  ``(t, {"a": u})`` gives ``output0`` and ``output1.a``;
* a tensor alone, or tuples and lists of tensors alone, keep the names
  aotid has always given: ``output0``, ``output1`` ... by flat position;
* ``None`` is dropped (a ModelOutput's unset fields, a dict's None value).

Any other leaf (an int, a string) is a TypeError naming where it is: aotid
serves tensors only.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["named_outputs", "output_names"]


def _node_type(obj: Any):
    # torch.export flattens every namedtuple class as `namedtuple`.
    t = type(obj)
    if isinstance(obj, tuple) and hasattr(t, "_fields"):
        return namedtuple
    return t


def _key_text(key: Any) -> str:
    """One step of a key path as text: a key, a field, or an index."""
    if isinstance(key, pytree.MappingKey):
        return str(key.key)
    if isinstance(key, pytree.GetAttrKey):
        return key.name
    if isinstance(key, pytree.SequenceKey):
        return str(key.idx)
    return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))


def _children(obj: Any, node_type) -> list[tuple[Any, Any, bool]]:
    """(child, its name as text or index, whether that name is positional)."""
    node = pytree.SUPPORTED_NODES[node_type]
    if node.flatten_with_keys_fn is not None:
        pairs, _ = node.flatten_with_keys_fn(obj)
        return [(child, _key_text(k), isinstance(k, pytree.SequenceKey)) for k, child in pairs]
    children, context = node.flatten_fn(obj)
    # A type registered without keys: a context that lists one string per
    # child names them (the usual dict-like registration), else positions.
    if isinstance(context, (list, tuple)) and len(context) == len(children) and all(
            isinstance(c, str) for c in context):
        return [(child, c, False) for child, c in zip(children, context)]
    return [(child, str(i), True) for i, child in enumerate(children)]


def _walk(obj: Any, path: list[tuple[str, bool]], out: list) -> None:
    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return
    node_type = _node_type(obj)
    if node_type not in pytree.SUPPORTED_NODES:
        where = ".".join(p for p, _ in path) or "the output"
        hint = " (a cache: give use_cache=False in a dict example)" if "Cache" in type(obj).__name__ else ""
        raise TypeError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which is neither a "
                        f"tensor nor a container torch.export can flatten; aotid serves tensor outputs only{hint}")
    for child, name, positional in _children(obj, node_type):
        _walk(child, path + [(name, positional)], out)


def _name(path: list[tuple[str, bool]]) -> str:
    parts = [p for p, _ in path]
    if path[0][1]:
        parts[0] = f"output{parts[0]}"
    return ".".join(parts)


def named_outputs(obj: Any) -> list[tuple[str, torch.Tensor]]:
    """``obj`` (what a model returned) flattened into ``(name, tensor)``
    pairs, in the order torch.export lists the outputs (module docstring)."""
    found: list = []
    _walk(obj, [], found)
    for path, t in found:
        if not path:  # a tensor alone
            return [("output0", t)]
    if all(positional for path, _ in found for _, positional in path):
        return [(f"output{i}", t) for i, (_, t) in enumerate(found)]
    named = [(_name(path), t) for path, t in found]
    seen: dict[str, int] = {}
    for name, _ in named:
        seen[name] = seen.get(name, 0) + 1
    twice = sorted(n for n, k in seen.items() if k > 1)
    if twice:
        raise ValueError(f"two outputs would both be named {twice[0]!r} (keys that print alike); "
                         "give output_names")
    return named


def output_names(obj: Any) -> list[str]:
    """The names alone (``named_outputs``)."""
    return [name for name, _ in named_outputs(obj)]
