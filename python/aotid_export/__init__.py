"""Turn a PyTorch module into the .pt2 that aotid serves.

aotid prefers *exported programs* (``torch.export.save``): they are portable,
and aotid compiles them with AOTInductor for whatever hardware it runs on.

    import torch, aotid_export
    aotid_export.export(model, (torch.randn(1, 4),), "mlp.pt2",
                        input_names=["features"], output_names=["scores"],
                        dynamic_batch=True, metadata={"author": "me"})

Names and metadata travel inside the archive (``extra/aotid.json``); aotid
uses the names in its HTTP API.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import torch

__all__ = ["export", "AOTID_EXTRA_FILE"]

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


def export(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    path: str,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_batch: bool = False,
    metadata: Mapping[str, Any] | None = None,
) -> torch.export.ExportedProgram:
    """Exports ``model`` called on ``example_inputs`` to ``path``.

    Every input must be a tensor and the model must return a tensor or a
    tuple/list of tensors. With ``dynamic_batch``, dim 0 of every input is
    dynamic (1 to 65536), so the served model takes any batch size.
    """
    example_inputs = tuple(example_inputs)
    for i, t in enumerate(example_inputs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"example input {i} is a {type(t).__name__}; aotid serves tensor inputs only")
    names = _input_names(model, len(example_inputs), input_names)
    dynamic_shapes = None
    if dynamic_batch:
        # torch.export specializes a dim of size 1, so trace a batch of 2.
        example_inputs = tuple(
            torch.cat([t, t]) if t.dim() > 0 and t.shape[0] == 1 else t for t in example_inputs)
        batch = torch.export.Dim("batch", min=1, max=MAX_DYNAMIC_BATCH)
        dynamic_shapes = tuple({0: batch} if t.dim() > 0 else None for t in example_inputs)
    model = model.eval()
    with torch.no_grad():
        ep = torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    n_out = len(ep.graph_signature.user_outputs)
    if output_names is not None and len(output_names) != n_out:
        raise ValueError(f"output_names has {len(output_names)} names; the model returns {n_out} outputs")
    extra = {
        "format": 1,
        "input_names": names,
        "output_names": list(output_names) if output_names is not None else None,
        "metadata": dict(metadata or {}),
    }
    torch.export.save(ep, path, extra_files={AOTID_EXTRA_FILE: json.dumps(extra)})
    return ep
