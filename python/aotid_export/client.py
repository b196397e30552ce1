"""A small client for a running aotid: binary tensors in, named numpy arrays
out, and ``verify``, which checks a served model against eager PyTorch.

    from aotid_export.client import Client, verify

    c = Client("http://127.0.0.1:8765")
    out = c.infer("bert", {"input_ids": ids, "attention_mask": mask})
    out["last_hidden_state"]            # numpy array
    c.infer("gpt2", {...}, outputs=["logits"])  # only the outputs named

    verify(model, "bert", {"input_ids": ids, "attention_mask": mask},
           url="http://127.0.0.1:8765")

Requests use the binary tensor extension both ways (Triton's, which aotid
speaks): a JSON header whose inputs carry ``parameters.binary_data_size``,
then each input's bytes, little endian, with the header's length in
``Inference-Header-Content-Length``; the answer comes back the same way.
Inputs may be numpy arrays or torch tensors of any numeric dtype; integers
narrower than the model's input are widened by the daemon (INT32 token ids
for an INT64 input). BF16 tensors (torch only) are sent as BF16, and BF16
outputs come back as float32, numpy having no bfloat16.

Only the standard library, numpy and (for torch tensors and ``verify``)
torch.
"""

from __future__ import annotations

import json
import math
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

__all__ = ["Client", "ServerError", "VerifyError", "VerifyResult", "OutputError", "verify"]

_NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
}
_DATATYPE = {np.dtype(t): name for name, t in _NUMPY.items()}

_HEADER_LENGTH = "Inference-Header-Content-Length"


class ServerError(RuntimeError):
    """The daemon answered with an error: ``status`` (HTTP) and its ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def _as_wire(name: str, value: Any) -> tuple[str, list[int], bytes]:
    """(datatype, shape, little-endian bytes) of an array or tensor."""
    if not isinstance(value, np.ndarray):
        try:
            import torch
        except ImportError:  # numpy alone: anything array-like
            torch = None
        if torch is not None and isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            if t.dtype == torch.bfloat16:
                return "BF16", list(t.shape), t.view(torch.int16).numpy().astype("<i2").tobytes()
            value = t.numpy()
        else:
            value = np.asarray(value)
    datatype = _DATATYPE.get(value.dtype.newbyteorder("="))
    if datatype is None:
        raise TypeError(f"input {name!r}: dtype {value.dtype} has no protocol datatype "
                        f"(aotid takes {', '.join(_NUMPY)} and BF16)")
    a = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    return datatype, list(a.shape), a.tobytes()


def _from_wire(entry: dict, raw: Optional[bytes]) -> np.ndarray:
    datatype, shape = entry["datatype"], entry["shape"]
    if datatype == "BF16":
        if raw is None:
            return np.asarray(entry["data"], dtype=np.float32).reshape(shape)
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    if datatype not in _NUMPY:
        raise ServerError(200, f"output {entry.get('name')!r} has datatype {datatype}, which this client "
                               "does not read")
    dtype = np.dtype(_NUMPY[datatype]).newbyteorder("<")
    if raw is None:
        return np.asarray(entry["data"], dtype=dtype).reshape(shape)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=True)


class Client:
    """Talks to one aotid at ``url`` ("http://127.0.0.1:8765"), with an
    optional bearer ``token``. Each call is one HTTP request; errors raise
    ServerError with the daemon's reason."""

    def __init__(self, url: str = "http://127.0.0.1:8765", token: Optional[str] = None,
                 timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Optional[bytes] = None,
              headers: Optional[dict] = None) -> tuple[dict, bytes]:
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return dict(r.headers.items()), r.read()
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            try:
                message = json.loads(text).get("error", text)
            except (ValueError, AttributeError):
                message = text
            raise ServerError(e.code, message) from None

    @staticmethod
    def _model_path(model: str, version: Optional[int]) -> str:
        path = "/v2/models/" + urllib.request.quote(model, safe="")
        return path + (f"/versions/{int(version)}" if version is not None else "")

    def metadata(self, model: str, version: Optional[int] = None) -> dict:
        """The model's metadata: inputs and outputs (name, datatype, shape
        with -1 for dynamic dims, and ``parameters.dynamic_dims`` with each
        dynamic dim's name and range), state and device."""
        _, body = self._call("GET", self._model_path(model, version))
        return json.loads(body)

    def infer(self, model: str, inputs: Mapping[str, Any], outputs: Optional[Sequence[str]] = None,
              version: Optional[int] = None, last_position: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """Runs ``model`` on ``inputs`` (name -> numpy array or torch tensor)
        and returns its outputs by name, in the model's order: all of them,
        or the ``outputs`` named (the daemon refuses an unknown name, listing
        the model's). Outputs in ``last_position`` come back with dim 1 cut
        to its last index (logits [B, S, V] as [B, 1, V])."""
        header: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": True}}
        blobs = []
        for name, value in inputs.items():
            datatype, shape, raw = _as_wire(name, value)
            header["inputs"].append({"name": name, "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(raw)}})
            blobs.append(raw)
        if outputs is not None or last_position:
            names = list(outputs) if outputs is not None else [
                m["name"] for m in self.metadata(model, version).get("outputs", [])]
            header["outputs"] = [{"name": n, "parameters": {"binary_data": True,
                                                            **({"last_position": True} if n in last_position
                                                               else {})}} for n in names]
        head = json.dumps(header, separators=(",", ":")).encode()
        headers, body = self._call(
            "POST", self._model_path(model, version) + "/infer", head + b"".join(blobs),
            {"Content-Type": "application/octet-stream", _HEADER_LENGTH: str(len(head))})
        length = next((v for k, v in headers.items() if k.lower() == _HEADER_LENGTH.lower()), None)
        json_length = int(length) if length is not None else len(body)
        reply = json.loads(body[:json_length])
        result: dict[str, np.ndarray] = {}
        at = json_length
        for entry in reply.get("outputs", []):
            size = entry.get("parameters", {}).get("binary_data_size")
            raw = None
            if size is not None:
                raw = body[at:at + size]
                if len(raw) != size:
                    raise ServerError(200, f"output {entry['name']!r}: the answer ends before its "
                                           f"{size} bytes")
                at += size
            result[entry["name"]] = _from_wire(entry, raw)
        return result


# ---- verify ----

@dataclass
class OutputError:
    """How far one served output is from eager's: the worst absolute
    difference, and the worst relative one (the absolute difference over
    the largest magnitude of eager's output, so elements near zero do not
    swamp it)."""
    name: str
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


@dataclass
class VerifyCase:
    """One request: the shapes sent, and each output's error."""
    shapes: dict
    outputs: list = field(default_factory=list)


@dataclass
class VerifyResult:
    model: str
    cases: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for c in self.cases for o in c.outputs)

    def worst(self) -> dict[str, OutputError]:
        """Per output name, the worst error over every case."""
        out: dict[str, OutputError] = {}
        for c in self.cases:
            for o in c.outputs:
                w = out.get(o.name)
                if w is None or (w.ok and not o.ok) or (w.ok == o.ok and o.max_abs > w.max_abs):
                    out[o.name] = o
        return out


class VerifyError(AssertionError):
    """A served output differs from eager's beyond the tolerance (or is
    missing, or has another shape); ``result`` holds every comparison."""

    def __init__(self, message: str, result: VerifyResult):
        super().__init__(message)
        self.result = result


def _compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> OutputError:
    if tuple(got.shape) != tuple(want.shape):
        return OutputError(name, math.inf, math.inf, False,
                           f"shape {list(got.shape)}, eager has {list(want.shape)}")
    if want.size == 0:
        return OutputError(name, 0.0, 0.0, True)
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    diff = np.abs(g - w)
    both_nan = np.isnan(g) & np.isnan(w)
    diff = np.where(both_nan, 0.0, diff)
    max_abs = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))
    scale = float(np.max(np.abs(np.where(np.isfinite(w), w, 0.0))))
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    exact = want.dtype.kind in "biu"
    ok = bool(np.all(diff == 0)) if exact else bool(np.all(diff <= atol + rtol * np.abs(w)))
    return OutputError(name, max_abs, max_rel, ok)


def _grown(example: dict, inputs_meta: list) -> Optional[dict]:
    """The example at a second size: each named dynamic dim one larger
    (within its range; else one smaller), dims sharing a name together. The
    new positions repeat the last one along that dim, so values stay valid
    (token ids, masks). None when no dim is dynamic."""
    import torch

    sizes: dict[str, int] = {}
    changes: list[tuple[str, int, str]] = []
    for m in inputs_meta:
        for d in m.get("parameters", {}).get("dynamic_dims", []):
            if m["name"] not in example:
                continue
            key = d.get("name") or f"{m['name']}:{d['dim']}"
            now = example[m["name"]].shape[d["dim"]]
            if key not in sizes:
                hi = d.get("max", sys.maxsize)
                sizes[key] = now + 1 if now + 1 <= hi else now - 1
                if sizes[key] < d.get("min", 0):
                    sizes[key] = now  # the range is one size: nothing else to try
            changes.append((m["name"], d["dim"], key))
    if not changes or all(example[n].shape[dim] == sizes[k] for n, dim, k in changes):
        return None
    out = dict(example)
    for n, dim, key in changes:
        t = out[n]
        want = sizes[key]
        have = t.shape[dim]
        if want > have:
            last = t.narrow(dim, have - 1, 1)
            t = torch.cat([t] + [last] * (want - have), dim=dim)
        elif want < have:
            t = t.narrow(dim, 0, want)
        out[n] = t
    return out


def verify(module, name: str, example, url: str = "http://127.0.0.1:8765", token: Optional[str] = None,
           version: Optional[int] = None, rtol: float = 1e-4, atol: float = 1e-5,
           client: Optional[Client] = None, quiet: bool = False) -> VerifyResult:
    """Compares the served model ``name`` with ``module`` run eagerly.

    ``example`` is a tuple of tensors (the model's inputs in order) or a dict
    of keyword inputs (by name; its bool, int, float, str and None values,
    such as ``use_cache=False``, are constants the program was traced with:
    given to the module, not sent). The module runs on it and on a second size,
    each named dynamic dim of the served model's metadata grown by one
    within its range; each size is sent to the daemon and every output
    compared by name (``aotid_export.outputs.named_outputs``; a model whose
    eager outputs are unnamed tuples is compared by position). Prints the
    worst absolute and relative error per output, returns a VerifyResult,
    and raises VerifyError when an output is missing, has another shape, or
    differs by more than ``atol + rtol * |eager|`` (integers and booleans:
    exactly)."""
    import torch

    from aotid_export.outputs import named_outputs

    c = client or Client(url, token)
    meta = c.metadata(name, version)
    served_in = [m["name"] for m in meta.get("inputs", [])]
    served_out = [m["name"] for m in meta.get("outputs", [])]
    constants: dict = {}
    if isinstance(example, Mapping):
        as_dict = True
        # A bool, int, float, str or None is a constant the exporter traced
        # the program with (use_cache=False): for the eager module only.
        constants = {k: v for k, v in example.items() if v is None or isinstance(v, (bool, int, float, str))}
        feed = {k: v for k, v in example.items() if k not in constants}
        unknown = [k for k in feed if k not in served_in]
        if unknown:
            raise ValueError(f"example input {unknown[0]!r} is not an input of {name!r}: it takes {served_in}")
    else:
        as_dict = False
        example = tuple(example) if isinstance(example, (tuple, list)) else (example,)
        if len(example) != len(served_in):
            raise ValueError(f"{name!r} takes {len(served_in)} inputs {served_in}, the example has "
                             f"{len(example)}")
        feed = dict(zip(served_in, example))
    feed = {k: torch.as_tensor(v) for k, v in feed.items()}

    result = VerifyResult(name)
    cases = [feed]
    second = _grown(feed, meta.get("inputs", []))
    if second is not None:
        cases.append(second)
    elif not quiet:
        print(f"verify {name}: no dynamic dim in its metadata: one size only")
    for inputs in cases:
        with torch.no_grad():
            eager = module(**inputs, **constants) if as_dict else module(*[inputs[k] for k in served_in])
        named = named_outputs(eager)
        got = c.infer(name, inputs, version=version)
        if all(n in got for n, _ in named):
            pairs = [(n, got[n], t) for n, t in named]
        elif len(named) == len(served_out):  # unnamed eager outputs: by position
            pairs = [(served_out[i], got.get(served_out[i]), t) for i, (_, t) in enumerate(named)]
        else:
            missing = [n for n, _ in named if n not in got]
            raise VerifyError(f"{name}: eager outputs {[n for n, _ in named]} are not what the model serves "
                              f"({served_out}); missing {missing}", result)
        case = VerifyCase({k: list(v.shape) for k, v in inputs.items()})
        for out_name, served, t in pairs:
            want = t.detach().cpu()
            if want.dtype == torch.bfloat16:
                want = want.float()
            case.outputs.append(_compare(out_name, served, want.numpy(), rtol, atol))
        result.cases.append(case)
        if not quiet:
            shapes = ", ".join(f"{k} {v}" for k, v in case.shapes.items())
            for o in case.outputs:
                print(f"verify {name} ({shapes}): {o.name}: max abs {o.max_abs:.3g}, max rel {o.max_rel:.3g}"
                      + ("" if o.ok else "  MISMATCH") + (f" ({o.note})" if o.note else ""))
    if not result.ok:
        bad = [f"{o.name} ({o.note or f'max abs {o.max_abs:.3g}, max rel {o.max_rel:.3g}'})"
               for o in result.worst().values() if not o.ok]
        raise VerifyError(f"{name}: served outputs differ from eager beyond rtol={rtol}, atol={atol}: "
                          + ", ".join(bad), result)
    return result
