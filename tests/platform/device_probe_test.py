"""The compile worker's device probe (aotid_worker.probe) on machines this
one is not: a Mac too old for MPS, a hosted Mac whose GPU cannot allocate,
a CUDA torch without a driver or without kernels for the GPU. torch is a
stand-in here; the real probe runs against the real torch in
tests/XXdevice_probe_test.cc.

    device_probe_test.py
"""
import contextlib
import json
import platform
import sys
import types
from unittest import mock

from aotid_worker import probe

failures = []


def check(what, got, want):
    if want not in got:
        failures.append(f"{what}: {got!r} does not contain {want!r}")


class FakeTensor:
    def __init__(self, value):
        self.value = value

    def __mul__(self, k):
        return FakeTensor([v * k for v in self.value])

    def sum(self):
        return FakeTensor(sum(self.value))

    def item(self):
        return float(self.value)


def fake_torch(*, mps_built=True, mps_available=True, cuda=None, cuda_available=False, cuda_init_error="",
               fails_on=None):
    """A torch whose devices answer as told; `fails_on` maps a device to the
    error its first tensor raises."""
    fails_on = fails_on or {}

    def arange(n, dtype=None, device="cpu"):
        if device in fails_on:
            raise RuntimeError(fails_on[device])
        return FakeTensor(list(range(n)))

    def init():
        if cuda_init_error:
            raise RuntimeError(cuda_init_error)

    return types.SimpleNamespace(
        __version__="2.13.0",
        float32="float32",
        arange=arange,
        version=types.SimpleNamespace(cuda=cuda, hip=None),
        backends=types.SimpleNamespace(mps=types.SimpleNamespace(
            is_built=lambda: mps_built, is_available=lambda: mps_available, get_name=lambda: "Apple M1 (Virtual)")),
        cuda=types.SimpleNamespace(
            is_available=lambda: cuda_available, init=init, get_device_capability=lambda i: (8, 9),
            get_device_name=lambda i: "NVIDIA L4", device_count=lambda: 1),
    )


@contextlib.contextmanager
def mac(release, machine="arm64"):
    with mock.patch.object(sys, "platform", "darwin"), \
            mock.patch.object(platform, "mac_ver", return_value=(release, ("", "", ""), machine)), \
            mock.patch.object(platform, "machine", return_value=machine):
        yield


# MPS
with mac("13.6"):
    check("macOS 13", probe.probe_mps(fake_torch(mps_available=False)).get("reason", ""), "macOS 13.6 (MPS needs 14)")
with mac("14.5"):
    got = probe.probe_mps(fake_torch(fails_on={
        "mps": "MPS backend out of memory (MPS allocated: 0 bytes, other allocations: 0 bytes, max allowed: "
               "7.93 GB). Tried to allocate 256 bytes on private pool."}))
    if got["usable"]:
        failures.append("a Mac whose first MPS tensor fails counts MPS as usable")
    check("hosted Mac", got.get("reason", ""), "a first tensor on mps failed: MPS backend out of memory")
    got = probe.probe_mps(fake_torch())
    if not got["usable"] or got["name"] != "Apple M1 (Virtual)":
        failures.append(f"a working MPS is not usable: {got}")
    check("torch without MPS", probe.probe_mps(fake_torch(mps_built=False)).get("reason", ""), "was built without MPS")
    check("MPS not available on 14", probe.probe_mps(fake_torch(mps_available=False)).get("reason", ""),
          "is_available() is False on macOS 14.5")
with mac("14.5", machine="x86_64"):
    check("Intel Mac", probe.probe_mps(fake_torch()).get("reason", ""), "not Apple Silicon (x86_64)")
with mock.patch.object(sys, "platform", "linux"):
    check("Linux", probe.probe_mps(fake_torch()).get("reason", ""), "this machine is not a Mac")

# CUDA
check("CPU torch", probe.probe_cuda(fake_torch(cuda=None)).get("reason", ""), "this torch (2.13.0) is a CPU build")
got = probe.probe_cuda(fake_torch(cuda="12.8", cuda_init_error="Found no NVIDIA driver on your system. Please "
                                  "check that you have an NVIDIA GPU and installed a driver\nmore text"))
check("no driver", got.get("reason", ""), "Found no NVIDIA driver on your system.")
check("no driver", got.get("reason", ""), "this torch was built for CUDA 12.8")
if "more text" in got.get("reason", ""):
    failures.append(f"the reason is more than the error's first line: {got['reason']!r}")
got = probe.probe_cuda(fake_torch(cuda="12.8", cuda_available=True, fails_on={
    "cuda:0": "CUDA error: no kernel image is available for execution on the device"}))
if got["usable"]:
    failures.append("a GPU without kernels in this torch counts as usable")
check("no kernels", got.get("reason", ""), "no kernel image is available")
check("no kernels", got.get("reason", ""), "(compute capability 8.9)")
got = probe.probe_cuda(fake_torch(cuda="12.8", cuda_available=True))
if not got["usable"] or got["capability"] != "8.9" or got["name"] != "NVIDIA L4":
    failures.append(f"a working GPU is not usable: {got}")
check("CUDA note", got["note"], "CUDA 12.8")

# One device's probe failing does not hide the other's answer.
broken = fake_torch(cuda=None)
broken.backends.mps.is_built = lambda: 1 / 0
with mac("14.5"), mock.patch.dict(sys.modules, {"torch": broken}):
    answer = probe.probe()
check("a probe that raises", answer["mps"].get("reason", ""), "probing mps failed: division by zero")
check("the other device", answer["cuda"].get("reason", ""), "CPU build")
json.dumps(answer)  # what main prints

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("ok")
