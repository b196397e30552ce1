"""The Python side of ./dev bench builds, on the same packages and inputs:

  eager   median latency of the exported program run eagerly (its module)
  aoti    torch._inductor.aoti_load_package: the first load, the median of
          later ones (each extracts the package into a new temporary folder
          and loads the .so from there), and the median latency of the
          loaded package

with torch.set_num_threads(THREADS), as aotid runs one runner.
usage: python_ref.py MODELS_DIR THREADS MODEL[=CASES_KEY]...
"""

import json
import os
import statistics
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")
DTYPES = {"BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16,
          "INT32": torch.int32, "INT64": torch.int64, "FP16": torch.float16, "BF16": torch.bfloat16,
          "FP32": torch.float32, "FP64": torch.float64}


def tensors(case):
    return [torch.tensor(t["data"], dtype=DTYPES[t["datatype"]]).reshape(t["shape"]) for t in case["inputs"]]


def median_us(fn, n=300, warm=20):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main():
    models_dir, threads = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(threads)
    cases = json.load(open(os.path.join(models_dir, "cases.json")))
    print(f"{'model':10} {'eager_us_p50':>14} {'aoti_first_load_ms':>19} {'aoti_load_ms_p50':>17} {'aoti_us_p50':>12}")
    for arg in sys.argv[3:]:
        model, _, key = arg.partition("=")
        key = key or model
        inputs = tensors(cases[key][0])
        pt2 = os.path.join(models_dir, model + ".pt2")
        first_ms, load_ms, aoti_us = float("nan"), float("nan"), float("nan")
        with torch.no_grad():
            try:
                module = torch.export.load(pt2).module()
                eager_us = median_us(lambda: module(*inputs))
            except Exception:  # an AOTInductor package: no program to run eagerly
                eager_us = float("nan")
            if "_so" in model:
                t0 = time.perf_counter()
                torch._inductor.aoti_load_package(pt2)
                first_ms = (time.perf_counter() - t0) * 1e3
                loads = []
                for _ in range(10):
                    t0 = time.perf_counter()
                    runner = torch._inductor.aoti_load_package(pt2)
                    loads.append((time.perf_counter() - t0) * 1e3)
                load_ms = statistics.median(loads)
                aoti_us = median_us(lambda: runner(*inputs))
        print(f"{model:10} {eager_us:14.1f} {first_ms:19.2f} {load_ms:17.2f} {aoti_us:12.1f}", flush=True)


if __name__ == "__main__":
    main()
