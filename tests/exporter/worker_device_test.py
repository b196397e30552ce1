"""The compile worker's side of device builds.

- A compiled package's kernel files (a CUDA model's .cubin files, which the
  model opens by name from the folder its runner is given) are kept beside
  model.so.

    worker_device_test.py TESTDATA
"""
import os
import sys
import tempfile
import zipfile

from aotid_worker import compile as worker


def main():
    testdata = sys.argv[1]

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
    print("ok")


if __name__ == "__main__":
    main()
