"""The client side of bench/residency.sh (docs/BENCHMARKS.md, "Residency").

    residency_client.py first PORT N NAME:KIND ...
        For each model, N rounds of: the request to NAME_cold (keep_alive 0:
        its runner starts and loads for it), then the same request to
        NAME_warm (keep_alive always: resident). Before each cold request it
        waits until /v2/resident says NAME_cold is not resident. KIND:
        mlp, resnet or generate (a few greedy tokens). Prints a table.

    residency_client.py one PORT NAME KIND
        One request.

    residency_client.py cycle PORT DAEMON_PID SECONDS CLIENTS CSV NAME ...
        CLIENTS threads, each on its own connection, send ResNet requests
        for NAME ... in turn (client i starts at the i-th) for SECONDS; a
        sampler reads /v2/resident and the PSS of the daemon's children
        (/proc/PID/smaps_rollup) every 100 ms into CSV. Prints requests/s,
        latency percentiles and the sampler's count.

    residency_client.py plot CSV OUT.svg
        Draws CSV's runner PSS, stacked per model, with the budget as a line,
        as an SVG (the venv has no plotting library).
"""

import csv
import http.client
import json
import os
import random
import statistics
import struct
import sys
import threading
import time

GENERATE_TOKENS = 4


def pct(values, p):
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def request_for(kind):
    """(path suffix, body, headers) of one request of KIND."""
    if kind == "mlp":
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                       "data": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]}]})
        return "/infer", body.encode(), {"Content-Type": "application/json"}
    if kind == "resnet":
        rng = random.Random(1)
        values = [rng.uniform(-1, 1) for _ in range(3 * 224 * 224)]
        head = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, 224, 224],
                                       "parameters": {"binary_data_size": 4 * len(values)}}]}).encode()
        return "/infer", head + struct.pack("<%df" % len(values), *values), {
            "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
    if kind == "generate":
        body = json.dumps({"messages": [{"role": "user", "content": "Why is the sky blue?"}],
                           "parameters": {"max_tokens": GENERATE_TOKENS, "temperature": 0, "ignore_eos": True}})
        return "/generate", body.encode(), {"Content-Type": "application/json"}
    raise SystemExit(f"unknown kind {kind}")


def call(conn, name, req):
    path, body, headers = req
    conn.request("POST", f"/v2/models/{name}{path}", body, headers)
    r = conn.getresponse()
    data = r.read()
    return r.status, data


def resident(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/v2/resident")
    r = c.getresponse()
    j = json.loads(r.read())
    c.close()
    return j


def state_of(report, name):
    for m in report["models"]:
        if m["name"] == name:
            return m["state"]
    return None


def first(port, n, specs):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    print("| model | request | cold (keep_alive 0): median ms | p90 ms | warm (resident): median ms | p90 ms | cold / warm |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for spec in specs:
        name, kind = spec.split(":")
        req = request_for(kind)
        cold, warm = [], []
        for _ in range(n):
            for _ in range(600):  # until its last runner is gone
                if state_of(resident(port), name + "_cold") == "not resident":
                    break
                time.sleep(0.02)
            else:
                raise SystemExit(f"{name}_cold stays resident: {resident(port)}")
            for side, out in (("_cold", cold), ("_warm", warm)):
                t = time.perf_counter()
                status, data = call(conn, name + side, req)
                out.append((time.perf_counter() - t) * 1000)
                if status != 200:
                    raise SystemExit(f"{name}{side}: HTTP {status}: {data[:300]!r}")
        what = {"mlp": "infer [1,8]", "resnet": "infer [1,3,224,224], binary",
                "generate": f"generate, {GENERATE_TOKENS} greedy tokens"}[kind]
        print(f"| {name} | {what} | {statistics.median(cold):.1f} | {pct(cold, 90):.1f} | "
              f"{statistics.median(warm):.1f} | {pct(warm, 90):.1f} | "
              f"{statistics.median(cold) / statistics.median(warm):.1f}× |", flush=True)


def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            label = args[args.index(b"--label") + 1].decode() if b"--label" in args else "?"
            with open(f"/proc/{p}/smaps_rollup") as f:
                pss = next(int(l.split()[1]) for l in f if l.startswith("Pss:")) * 1024
            out.append((label, pss))
        except (OSError, ValueError, StopIteration, IndexError):
            pass  # gone meanwhile
    return out


def cycle(port, daemon_pid, seconds, clients, csv_path, names):
    req = request_for("resnet")
    lat, errors = [], []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    t0 = time.monotonic()

    def client(i):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        k = i
        while time.monotonic() < stop:
            name = names[k % len(names)]
            k += 1
            t = time.perf_counter()
            try:
                status, data = call(conn, name, req)
            except OSError as e:
                status, data = 0, str(e).encode()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            ms = (time.perf_counter() - t) * 1000
            with lock:
                (lat if status == 200 else errors).append(ms if status == 200 else (status, data[:200]))

    rows = []

    def sampler():
        while time.monotonic() < stop + 0.5:
            t = time.monotonic() - t0
            try:
                rep = resident(port)
            except OSError:
                rep = None
            pss = children(daemon_pid)
            if rep:
                row = {"t_s": round(t, 3), "budget_bytes": rep["budget_bytes"], "used_bytes": rep["used_bytes"]}
                for n in names:
                    row[n + "_pss"] = sum(b for label, b in pss if label.split(":")[0].split(" ")[0] == n)
                    m = next((m for m in rep["models"] if m["name"] == n), {})
                    row[n + "_state"] = m.get("state", "")
                    row[n + "_bytes"] = m.get("bytes", 0)
                rows.append(row)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t0 - t)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    s = threading.Thread(target=sampler)
    s.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    s.join()
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"requests {len(lat)} ok, {len(errors)} failed, in {elapsed:.1f} s: {len(lat) / elapsed:.2f} requests/s")
    if lat:
        print(f"latency ms p50 {pct(lat, 50):.1f} p90 {pct(lat, 90):.1f} p99 {pct(lat, 99):.1f} max {max(lat):.1f}")
    if rows:
        sums = [sum(r[n + "_pss"] for n in names) for r in rows]
        over = sum(1 for r, v in zip(rows, sums) if v > r["budget_bytes"])
        print(f"samples {len(rows)}; runner PSS sum over the budget in {over} of them; max runner PSS sum "
              f"{max(sums) / 2**20:.0f} MiB; max used_bytes {max(r['used_bytes'] for r in rows) / 2**20:.0f} MiB; "
              f"budget {rows[0]['budget_bytes'] / 2**20:.0f} MiB")
    for e in errors[:5]:
        print("  failed:", e)


def plot(csv_path, out):
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    names = [k[:-4] for k in rows[0] if k.endswith("_pss")]
    mib = 2**20
    t = [float(r["t_s"]) for r in rows]
    budget = float(rows[0]["budget_bytes"]) / mib
    stacks, acc = [], [0.0] * len(rows)
    for n in names:
        top = [a + float(r[n + "_pss"]) / mib for a, r in zip(acc, rows)]
        stacks.append((n, list(acc), top))
        acc = top
    used = [float(r["used_bytes"]) / mib for r in rows]
    ymax = max(max(acc), budget, max(used)) * 1.1
    W, H, L, R, T, B = 900, 420, 70, 170, 30, 50
    pw, ph = W - L - R, H - T - B
    x = lambda v: L + pw * (v - t[0]) / max(t[-1] - t[0], 1e-9)
    y = lambda v: T + ph * (1 - v / ymax)
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2"]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    step = 10 ** len(str(int(ymax / 5))) // 10 or 1
    while ymax / step > 8:
        step *= 2
    v = 0
    while v <= ymax:
        svg.append(f'<line x1="{L}" x2="{L + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
        v += step
    ts = 0
    tstep = 10 if t[-1] - t[0] > 30 else 5
    while ts <= t[-1]:
        svg.append(f'<text x="{x(ts):.1f}" y="{T + ph + 16}" text-anchor="middle">{ts}</text>')
        ts += tstep
    for i, (n, lo, hi) in enumerate(stacks):
        pts = [f"{x(a):.1f},{y(b):.1f}" for a, b in zip(t, hi)] + \
              [f"{x(a):.1f},{y(b):.1f}" for a, b in reversed(list(zip(t, lo)))]
        c = colors[i % len(colors)]
        svg.append(f'<polygon points="{" ".join(pts)}" fill="{c}" fill-opacity="0.85" stroke="none"/>')
        svg.append(f'<rect x="{L + pw + 12}" y="{T + 10 + 20 * i}" width="14" height="12" fill="{c}"/>')
        svg.append(f'<text x="{L + pw + 32}" y="{T + 21 + 20 * i}">{n} runner PSS</text>')
    k = len(stacks)
    line = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(t, used))
    svg.append(f'<polyline points="{line}" fill="none" stroke="black" stroke-width="1" stroke-dasharray="3,2"/>')
    svg.append(f'<line x1="{L + pw + 12}" x2="{L + pw + 26}" y1="{T + 16 + 20 * k}" y2="{T + 16 + 20 * k}" '
               f'stroke="black" stroke-dasharray="3,2"/>')
    svg.append(f'<text x="{L + pw + 32}" y="{T + 21 + 20 * k}">counted (used_bytes)</text>')
    svg.append(f'<line x1="{L}" x2="{L + pw}" y1="{y(budget):.1f}" y2="{y(budget):.1f}" stroke="#c00" stroke-width="2"/>')
    svg.append(f'<text x="{L + pw + 12}" y="{y(budget) + 4:.1f}" fill="#c00">budget {budget:.0f} MiB</text>')
    svg.append(f'<line x1="{L}" x2="{L}" y1="{T}" y2="{T + ph}" stroke="black"/>')
    svg.append(f'<line x1="{L}" x2="{L + pw}" y1="{T + ph}" y2="{T + ph}" stroke="black"/>')
    svg.append(f'<text x="{L + pw / 2}" y="{H - 10}" text-anchor="middle">seconds</text>')
    svg.append(f'<text x="16" y="{T + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {T + ph / 2})">MiB</text>')
    svg.append(f'<text x="{L}" y="18">Runner memory (PSS, sampled every 100 ms) of three ResNet-18 versions '
               f'in a budget for two</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


def main():
    cmd = sys.argv[1]
    if cmd == "first":
        first(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
    elif cmd == "one":
        status, data = call(http.client.HTTPConnection("127.0.0.1", int(sys.argv[2]), timeout=120), sys.argv[3],
                            request_for(sys.argv[4]))
        if status != 200:
            raise SystemExit(f"{sys.argv[3]}: HTTP {status}: {data[:300]!r}")
    elif cmd == "cycle":
        cycle(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7:])
    elif cmd == "plot":
        plot(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
