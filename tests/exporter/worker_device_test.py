"""The compile worker's side of device builds.

- A device this torch cannot use, or a program that cannot be moved to it,
  fails the build for good (exit 2, "cannot be built here") with the reason:
  the daemon then builds for the CPU where fallback_cpu allows, instead of
  retrying a build that can never pass (exit 1 would be retried).
- A compiled package's kernel files (a CUDA model's .cubin files, which the
  model opens by name from the folder its runner is given) are kept beside
  model.so.

    worker_device_test.py TESTDATA
"""
import os
import subprocess
import sys
import tempfile
import zipfile

import torch

from aotid_worker import compile as worker


def unusable_device():
    """A device this torch cannot use here, with the worker's reason."""
    for device in ("cuda", "mps"):
        why = worker.device_unusable(device)
        if why:
            return device, why
    return None, ""


def main():
    testdata = sys.argv[1]
    mlp = os.path.join(testdata, "mlp.pt2")

    # As the daemon runs it: a child process, judged by its exit code.
    device, why = unusable_device()
    assert device is not None, "this machine can use both cuda and mps?"
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([sys.executable, "-m", "aotid_worker.compile", "--artifact", mlp, "--out", out,
                            "--device", device], capture_output=True, text=True, timeout=600)
        assert r.returncode == worker.EXIT_PERMANENT, (r.returncode, r.stderr[-3000:])
        assert f"error: cannot build for {device}: {why}" in r.stderr, r.stderr[-3000:]
        assert not os.path.exists(os.path.join(out, "model.so"))

    # A device the probe calls usable but the program cannot be moved to
    # (here: this torch lacks it): the same, with torch's own words.
    usable = worker.device_unusable
    worker.device_unusable = lambda d: ""
    try:
        with tempfile.TemporaryDirectory() as out:
            code = worker.main(["--artifact", mlp, "--out", out, "--device", device])
    finally:
        worker.device_unusable = usable
    assert code == worker.EXIT_PERMANENT, code

    # Kernel files beside model.so, by their own names, byte for byte.
    cuda_so = os.path.join(testdata, "cuda_so.pt2")
    with zipfile.ZipFile(cuda_so) as z:
        kernels = {n.rsplit("/", 1)[1]: z.read(n) for n in z.namelist() if n.endswith(".cubin")}
    assert len(kernels) == 1, kernels
    with tempfile.TemporaryDirectory() as out:
        meta = worker.extract_build(cuda_so, out, "model")
        assert meta.get("AOTI_DEVICE_KEY") == "cuda", meta
        for name, data in kernels.items():
            with open(os.path.join(out, name), "rb") as f:
                assert f.read() == data, name
        assert sorted(os.listdir(out)) == sorted(["model.so", *kernels]), os.listdir(out)
    for name in ("k.cubin", "k.fatbin", "k.hsaco", "k.spv"):
        assert worker.is_kernel_file(name), name
    for name in ("model.so", ".cubin", "a/k.cubin", "k.cubin.o", "k_metadata.json"):
        assert not worker.is_kernel_file(name), name
    print(f"ok ({device}: {why}; torch {torch.__version__})")


if __name__ == "__main__":
    main()
