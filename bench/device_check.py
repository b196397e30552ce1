"""The Python side of bench/device_check.sh, on the device under check.

    device_check.py probe DEVICE
        torch's version and whether it can use DEVICE here; exit 1 with the
        reason when it cannot
    device_check.py export DEVICE OUT
        exports the test models mlp and block (tests/models/make_test_models.py's
        networks) into OUT/NAME.pt2, with inputs and their eager outputs on
        DEVICE in OUT/cases.json, and the eager and torch.compile latencies
        on DEVICE in OUT/reference.json
    device_check.py ready PORT NAME...
        waits until the daemon on PORT has each model ready (or failed)
    device_check.py serve DEVICE OUT PORT
        asks the daemon on PORT for each model's outputs, compares them with
        eager's, times the first request and the median of the later ones,
        and prints the table against eager and torch.compile
Exits non-zero on any mismatch or failure, saying which.
"""

import json
import os
import statistics
import sys
import time
import urllib.request

RUNS = 200
# Each model: the network's class in make_test_models.py, its input's shape
# (batch first), its names, and the tolerance against eager on the device
# (AOTInductor's fused kernels round differently; TF32 is off for both).
MODELS = {
    "mlp": ("Mlp", (4, 8), "x", "y", 1e-4),
    "block": ("Block", (4, 12, 32), "tokens", "hidden", 1e-3),
}


def fail(msg):
    print(f"device_check: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def probe(device):
    import torch

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    if device == "cuda":
        if not torch.cuda.is_available():
            fail(f"torch {torch.__version__} sees no CUDA GPU here (torch.cuda.is_available() is False: "
                 f"{'a CPU build of torch' if torch.version.cuda is None else 'no NVIDIA driver or device'}); "
                 "this check needs one. `bench/device_check.sh --device cpu` runs its logic on the CPU")
        p = torch.cuda.get_device_properties(0)
        print(f"GPU: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory >> 20} MiB")
    elif device != "cpu":
        fail(f"device {device!r}: this check knows cuda and cpu")


def sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_us(fn, device, runs=RUNS):
    """(first call's time, median of `runs` later calls), in microseconds."""
    t0 = time.perf_counter()
    fn()
    sync(device)
    first = (time.perf_counter() - t0) * 1e6
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e6)
    return first, statistics.median(times)


def export(device, out):
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models"))
    import aotid_export
    import make_test_models

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(out, exist_ok=True)
    cases, reference = {}, {}
    for name, (cls, shape, in_name, out_name, _) in MODELS.items():
        torch.manual_seed(1234)
        model = getattr(make_test_models, cls)().eval()
        aotid_export.export(model, (torch.randn(2, *shape[1:]),), os.path.join(out, f"{name}.pt2"),
                            input_names=[in_name], output_names=[out_name], dynamic_batch=True)
        x = torch.randn(*shape)
        on_device = model.to(device)
        xd = x.to(device)
        with torch.no_grad():
            y = on_device(xd).cpu()
            eager_first, eager_p50 = time_us(lambda: on_device(xd), device)
            t0 = time.perf_counter()
            compiled = torch.compile(on_device)
            compiled(xd)
            sync(device)
            compile_s = time.perf_counter() - t0
            _, compiled_p50 = time_us(lambda: compiled(xd), device)
        cases[name] = {"inputs": [{"name": in_name, "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.flatten().tolist()}],
                       "outputs": [{"name": out_name, "shape": list(y.shape), "data": y.flatten().tolist()}]}
        reference[name] = {"eager_first_us": eager_first, "eager_p50_us": eager_p50,
                           "compile_first_s": compile_s, "compiled_p50_us": compiled_p50}
        print(f"exported {name}: eager on {device} {eager_p50:.0f} us p50, torch.compile {compiled_p50:.0f} us "
              f"p50 ({compile_s:.1f} s to compile)", flush=True)
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f)


def infer(port, name, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{name}/infer", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        fail(f"{name}: HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}")


def ready(port, names, limit_s=480):
    """Waits until each model is ready, printing when; exits 1 when one fails or time runs out."""
    start = time.monotonic()
    for name in names:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{name}/ready", timeout=10) as r:
                    state = json.loads(r.read())
            except urllib.error.HTTPError as e:
                state = json.loads(e.read() or b"{}")
            except (urllib.error.URLError, ValueError):
                state = {}
            if state.get("ready"):
                print(f"{name} ready {time.monotonic() - start:.0f} s after the wait began (its build included)",
                      flush=True)
                break
            if state.get("state") == "failed":
                fail(f"{name} failed: {json.dumps(state)[:2000]}")
            if time.monotonic() - start > limit_s:
                fail(f"{name} not ready after {limit_s} s: {json.dumps(state)[:500]}")
            time.sleep(0.2)


def serve(device, out, port):
    with open(os.path.join(out, "cases.json")) as f:
        cases = json.load(f)
    with open(os.path.join(out, "reference.json")) as f:
        reference = json.load(f)
    rows, bad = [], []
    for name, case in cases.items():
        body = json.dumps({"inputs": case["inputs"]}).encode()
        t0 = time.perf_counter()
        got = infer(port, name, body)
        first_us = (time.perf_counter() - t0) * 1e6
        want = case["outputs"][0]
        out0 = got["outputs"][0]
        worst = max((abs(a - b) for a, b in zip(out0["data"], want["data"])), default=0.0)
        tol = MODELS[name][4]
        if out0["shape"] != want["shape"] or len(out0["data"]) != len(want["data"]) or worst > tol:
            bad.append(f"{name}: aotid's output differs from eager on {device} (shape {out0['shape']} vs "
                       f"{want['shape']}, largest difference {worst:.3g}, tolerance {tol})")
        times = []
        for _ in range(RUNS):
            t0 = time.perf_counter()
            infer(port, name, body)
            times.append((time.perf_counter() - t0) * 1e6)
        ref = reference[name]
        rows.append((name, first_us, statistics.median(times), ref["eager_p50_us"], ref["compiled_p50_us"], worst))
    print(f"\n{'model':8} {'aotid first us':>15} {'aotid p50 us':>13} {'eager p50 us':>13} "
          f"{'compile p50 us':>15} {'max |diff|':>11}   ({device}; aotid over HTTP on loopback, "
          "eager and torch.compile in-process)")
    for name, first, p50, eager, compiled, worst in rows:
        print(f"{name:8} {first:15.0f} {p50:13.0f} {eager:13.0f} {compiled:15.0f} {worst:11.2e}")
    if bad:
        fail("; ".join(bad))
    print(f"every output matches eager on {device}")


def main(argv):
    if len(argv) >= 1 and argv[0] == "probe" and len(argv) == 2:
        probe(argv[1])
    elif len(argv) == 3 and argv[0] == "export":
        export(argv[1], argv[2])
    elif len(argv) >= 3 and argv[0] == "ready":
        ready(int(argv[1]), argv[2:])
    elif len(argv) == 4 and argv[0] == "serve":
        serve(argv[1], argv[2], int(argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
