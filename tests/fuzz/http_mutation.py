"""A mutation fuzzer over a running daemon: real requests, mangled.

Starts `aotid serve` on a fresh store serving one compiled model, sends
--count requests made by mutating valid ones (bytes flipped, inserted,
deleted, duplicated, headers spliced from other requests, non-UTF-8 bytes,
huge numbers, deep JSON), each on its own connection, and checks that:
  - every answer that comes back is a well-formed HTTP/1.1 status line;
  - no answer is a 500 (a mangled request is the client's error) and none
    is lost because the daemon went away;
  - the daemon stays alive and live (checked every 250 requests);
  - afterwards the model still answers a valid request exactly as before;
  - the daemon stops cleanly (exit status 0) on SIGTERM.
Bounded by --count and a per-request read timeout; the seed makes a run
repeatable (a failure prints the seed and the request).

usage: http_mutation.py AOTID TESTDATA [--count N] [--seed S]
"""

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def start_daemon(aotid, store, log_path):
    log = open(log_path, "wb")
    proc = subprocess.Popen([aotid, "--store", store, "serve", "--listen", "127.0.0.1:0"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        text = open(log_path, "rb").read().decode("utf-8", "replace")
        m = re.search(r"serving on http://127\.0\.0\.1:(\d+)", text)
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit("the daemon did not start:\n" + open(log_path, "rb").read().decode("utf-8", "replace"))


def http(port, method, path, body=None, timeout=10):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def seeds(port):
    host = f"127.0.0.1:{port}"
    infer = json.dumps({"id": "a", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8],
                                               "data": [0.5] * 16}]}).encode()
    nested = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                     "data": [[1, 2, 3, 4, 5, 6, 7, 8]]}],
                         "outputs": [{"name": "y"}]}).encode()
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                     "parameters": {"binary_data_size": 32}}]}).encode()
    binary = header + bytes(32)
    chunked_body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(infer), infer)

    def req(method, path, body=b"", extra=b""):
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, path, host.encode())
        if body:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        return head + extra + b"\r\n" + body

    return [
        req(b"GET", b"/v2"),
        req(b"GET", b"/v2/models/m"),
        req(b"GET", b"/v2/models/m/versions/1/ready"),
        req(b"GET", b"/metrics"),
        req(b"HEAD", b"/v2/health/live"),
        req(b"POST", b"/v2/models/m/infer", infer),
        req(b"POST", b"/v2/models/m/versions/1/infer", nested),
        req(b"POST", b"/v2/models/m/infer", binary,
            b"Inference-Header-Content-Length: %d\r\n" % len(header)),
        req(b"POST", b"/v2/repository/index", b'{"ready": true}'),
        req(b"POST", b"/v2/repository/models/none/unload", b"{}"),
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n%s" % (host.encode(), chunked_body),
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: %s\r\nExpect: 100-continue\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (host.encode(), len(infer), infer),
    ]


INTERESTING = [b"\xff", b"\x00", b"\r\n", b"\n", b":", b" ", b"\t", b"-1", b"18446744073709551616", b"1e300",
               b"[", b"{", b"\"", b"\\u0000", b"\xc3\x28", b"%00", b"%ff", b"/../", b"chunked", b"0\r\n\r\n",
               b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n", b"Origin: https://evil.example\r\n",
               b"Content-Type: text/plain\r\n", b"Authorization: bearer x\r\n", b"Expect: 100-continue\r\n",
               b"INT64", b"BOOL", b"FP16", b"\"shape\":[1000000000,8]", b"\"data\":[]", b"[" * 64]


def mutate(rng, data, others):
    data = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(8)
        at = rng.randrange(len(data) + 1)
        if op == 0 and data:  # flip a byte
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert random bytes
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and data:  # delete a range
            data[at:at + rng.randint(1, 16)] = b""
        elif op == 3 and data:  # duplicate a range
            end = min(len(data), at + rng.randint(1, 64))
            data[end:end] = data[at:end]
        elif op == 4:  # an interesting token
            data[at:at] = rng.choice(INTERESTING)
        elif op == 5:  # a header line from another request
            lines = rng.choice(others).split(b"\r\n")
            data[at:at] = rng.choice(lines) + b"\r\n"
        elif op == 6 and data:  # truncate
            del data[rng.randrange(len(data)):]
        elif op == 7:  # a deep or huge body
            data += rng.choice([b"[" * rng.randint(100, 100000), b"9" * rng.randint(20, 400)])
    return bytes(data)


def send(port, data, timeout):
    """The status code answered, 0 for none (closed or timed out)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(timeout)
    got = b""
    try:
        s.sendall(data)
        while b"\r\n" not in got and len(got) < 4096:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, ConnectionResetError, BrokenPipeError):
        pass
    finally:
        s.close()
    if not got:
        return 0, got
    line = got.split(b"\r\n", 1)[0]
    m = re.fullmatch(rb"HTTP/1\.[01] (\d{3}) [ -~]*", line)
    if not m:
        raise AssertionError(f"malformed status line {line!r}")
    return int(m.group(1)), got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("aotid")
    ap.add_argument("testdata")
    ap.add_argument("--count", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("AOTID_FUZZ_SEED", "1")))
    ap.add_argument("--timeout", type=float, default=0.1)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="aotid-mutation-") as tmp:
        store = os.path.join(tmp, "store")
        subprocess.run([args.aotid, "--store", store, "add", os.path.join(args.testdata, "mlp_so.pt2"),
                        "--name", "m"], check=True, capture_output=True)
        log_path = os.path.join(tmp, "daemon.log")
        proc, port = start_daemon(args.aotid, store, log_path)
        try:
            deadline = time.time() + 300
            while http(port, "GET", "/v2/models/m/ready")[0] != 200:
                if time.time() > deadline or proc.poll() is not None:
                    raise SystemExit("the model did not become ready")
                time.sleep(0.2)
            good = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                           "data": [0.25] * 8}]}).encode()
            status, before = http(port, "POST", "/v2/models/m/infer", good)
            assert status == 200, before

            base = seeds(port)
            counts = {}
            t0 = time.time()
            for i in range(args.count):
                data = mutate(rng, rng.choice(base), base)
                try:
                    status, reply = send(port, data, args.timeout)
                except AssertionError as e:
                    raise SystemExit(f"request {i} (seed {args.seed}): {e}\nsent: {data[:400]!r}")
                counts[status] = counts.get(status, 0) + 1
                if status == 500:
                    raise SystemExit(f"request {i} (seed {args.seed}) got 500:\n{reply[:600]!r}\n"
                                     f"sent: {data[:400]!r}")
                if proc.poll() is not None:
                    raise SystemExit(f"the daemon died (status {proc.returncode}) after request {i} "
                                     f"(seed {args.seed}); sent: {data[:400]!r}")
                if i % 250 == 249:
                    live = http(port, "GET", "/v2/health/live")[0]
                    if live != 200:
                        raise SystemExit(f"not live after request {i}: {live}")
            elapsed = time.time() - t0

            status, after = http(port, "POST", "/v2/models/m/infer", good)
            assert status == 200, after
            assert json.loads(after)["outputs"] == json.loads(before)["outputs"], (before, after)
            print(f"{args.count} mutated requests in {elapsed:.1f} s (seed {args.seed}); answers by status: "
                  + ", ".join(f"{k or 'none'}: {v}" for k, v in sorted(counts.items())))
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    raise SystemExit("the daemon did not stop on SIGTERM")
        if proc.returncode != 0:
            sys.stdout.write(open(log_path, "rb").read().decode("utf-8", "replace")[-4000:])
            raise SystemExit(f"the daemon exited with status {proc.returncode}")


if __name__ == "__main__":
    main()
