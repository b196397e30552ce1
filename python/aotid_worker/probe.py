"""Which devices this torch can use on this machine, and why not.

The daemon runs `python -m aotid_worker.probe` once per torch and machine
(platform/device_probe.h keeps the answer beside the build cache, keyed by the
machine's fingerprint) and decides with it what `auto` means and whether a
version asking for mps or cuda can be built and run here. It is never on the
request path.

The answer is one line on stdout, after the marker below, so that torch's
own warnings (which go to stderr, or stdout for some) cannot be mistaken for
it:

    aotid-devices: {"torch": "2.13.0+cpu",
                    "mps":  {"usable": false, "reason": "..."},
                    "cuda": {"usable": true, "name": "NVIDIA H100 80GB HBM3",
                             "capability": "9.0", "count": 1, "note": "..."}}

A device counts as usable only when a tensor was made on it and a result
read back: torch may list a device that cannot allocate (GitHub's hosted
Macs list a GPU whose first allocation fails), and a CUDA build may lack
kernels for an older GPU.

Exit status: 0 with an answer; anything else means no answer (the daemon
then uses the CPU only, and says why from this process's output).
"""

from __future__ import annotations

import json
import os
import platform
import sys

MARKER = "aotid-devices: "

# torch 2.13's MPS backend looks for an MPSGraph method that macOS 14
# introduced; on older systems is_available() is False.
MPS_MIN_MACOS = (14, 0)


def first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line[:limit]


def try_device(torch, device: str) -> str:
    """'' when a tensor made on `device` computes and comes back, else why not."""
    try:
        x = torch.arange(4, dtype=torch.float32, device=device)
        got = (x * 2).sum().item()
    except Exception as e:  # noqa: BLE001 - any failure means "not usable", with its reason
        return f"a first tensor on {device} failed: {first_line(e)}"
    if got != 12.0:
        return f"a first tensor on {device} computed {got}, not 12"
    return ""


def macos_version() -> tuple[int, ...]:
    release = platform.mac_ver()[0]
    try:
        return tuple(int(p) for p in release.split(".") if p)
    except ValueError:
        return ()


def probe_mps(torch) -> dict:
    if sys.platform != "darwin":
        return {"usable": False, "reason": "this machine is not a Mac"}
    if platform.machine() != "arm64":
        return {"usable": False, "reason": f"this Mac is not Apple Silicon ({platform.machine()})"}
    backend = getattr(torch.backends, "mps", None)
    if backend is None or not backend.is_built():
        return {"usable": False, "reason": f"this torch ({torch.__version__}) was built without MPS"}
    if not backend.is_available():
        version = macos_version()
        shown = platform.mac_ver()[0] or "unknown"
        if version and version < MPS_MIN_MACOS:
            return {"usable": False, "reason": f"macOS {shown} (MPS needs {MPS_MIN_MACOS[0]})"}
        return {"usable": False,
                "reason": f"torch.backends.mps.is_available() is False on macOS {shown} "
                          "(no Metal device that MPS can use)"}
    why = try_device(torch, "mps")
    if why:
        return {"usable": False, "reason": why}
    get_name = getattr(backend, "get_name", None)
    name = "Apple Silicon GPU"
    if get_name is not None:
        try:
            name = get_name() or name
        except Exception:  # noqa: BLE001 - a name is only for display
            pass
    return {"usable": True, "name": name, "note": f"macOS {platform.mac_ver()[0]}"}


def probe_cuda(torch) -> dict:
    cuda_version = getattr(torch.version, "cuda", None)
    if not cuda_version:
        if getattr(torch.version, "hip", None):
            return {"usable": False, "reason": f"this torch ({torch.__version__}) is a ROCm build"}
        return {"usable": False, "reason": f"this torch ({torch.__version__}) is a CPU build"}
    if not torch.cuda.is_available():
        # Initialising CUDA says why it cannot (no driver, a driver too old
        # for this torch's CUDA, no device visible).
        reason = "torch.cuda.is_available() is False"
        try:
            torch.cuda.init()
        except Exception as e:  # noqa: BLE001 - its message is the reason
            reason = first_line(e)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            reason += f" (CUDA_VISIBLE_DEVICES={visible!r})"
        return {"usable": False, "reason": f"{reason}; this torch was built for CUDA {cuda_version}"}
    major, minor = torch.cuda.get_device_capability(0)
    why = try_device(torch, "cuda:0")
    if why:
        return {"usable": False, "reason": f"{why} (compute capability {major}.{minor})"}
    notes = [f"CUDA {cuda_version}"]
    # Exported programs are compiled for CUDA with Triton; precompiled
    # packages need no compiler.
    try:
        import triton  # noqa: F401

        notes.append(f"triton {triton.__version__}")
    except Exception:  # noqa: BLE001 - any failure to import it means no Triton
        notes.append("no triton: exported programs cannot be compiled for cuda")
    return {"usable": True, "name": torch.cuda.get_device_name(0), "capability": f"{major}.{minor}",
            "count": torch.cuda.device_count(), "note": ", ".join(notes)}


def probe() -> dict:
    import torch

    answer = {"torch": torch.__version__}
    for name, fn in (("mps", probe_mps), ("cuda", probe_cuda)):
        try:
            answer[name] = fn(torch)
        except Exception as e:  # noqa: BLE001 - one device's failure must not hide the other's answer
            answer[name] = {"usable": False, "reason": f"probing {name} failed: {first_line(e)}"}
    return answer


def main() -> int:
    answer = probe()
    sys.stdout.write(MARKER + json.dumps(answer, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
