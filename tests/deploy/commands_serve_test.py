"""The containers of deploy/ run as their manifests write them, without a
cluster: each container's arguments, read from the YAML, run with this
build's aotid, its paths moved into a temporary folder and its port to a
free one on loopback, and driven as the kubelet and clients would drive
it.

edge: the DaemonSet's arguments and the ConfigMap's aotid.toml as it is
   (paths under the pod's mounts moved, the [[sync]] registry host moved to
   Debian's docker-registry on loopback, holding mlp pushed with `aotid
   push` to the tag the ConfigMap follows). The probes' requests as the
   kubelet sends them (its Host header): live at once, then ready once the
   synced model is built; answers through KServe's Python client
   (InferenceRESTClient, v2) and Triton's equal eager PyTorch's (the
   fixture's cases.json). The token of the Secret guards the repository
   routes and no other; a Host that is not loopback is refused; SIGTERM
   ends it within the grace period; a second pod on the node's store
   serves again from the cached build.
kserve: the ClusterServingRuntime's arguments, {{.Name}} replaced as KServe
   replaces it, /mnt/models a read-only folder holding mlp.pt2, the store
   the image's store.path: ready only once the model is built, then the
   same answers through both clients, and the same drain.

    commands_serve_test.py SOURCE_DIR AOTID TESTDATA edge|kserve...
"""
import asyncio
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib

import numpy as np
import tritonclient.http as triton
import yaml
from kserve import InferenceRESTClient, RESTConfig

ROOT, AOTID, TESTDATA = sys.argv[1], sys.argv[2], sys.argv[3]
PARTS = sys.argv[4:] or ["edge", "kserve"]
DEPLOY = os.path.join(ROOT, "deploy")
MODEL = "mlp"
CASES = json.load(open(os.path.join(TESTDATA, "cases.json")))[MODEL]
# The image's config (deploy/image/), which the runtime relies on.
IMAGE_STORE = "/var/lib/aotid"
# How long a start may take here before the test gives up (the manifests'
# startup budget is 31 min, for real models on real nodes).
START_WAIT_S = 300


def load(rel):
    with open(os.path.join(DEPLOY, rel)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind):
    [d] = [d for d in docs if d["kind"] == kind]
    return d


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, host=None, headers=None, method="GET", body=None):
    """One request as the kubelet's HTTP probe or a client sends it: Host is
    the address asked, unless `host` says otherwise."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        h = {"Host": host or f"127.0.0.1:{port}", **(headers or {})}
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    except OSError as e:
        return None, str(e)
    finally:
        c.close()


def close(got, want):
    return len(got) == len(want) and all(abs(g - w) <= 1e-5 + 1e-5 * abs(w) for g, w in zip(got, want))


def log_tail(path, n=4000):
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def start(argv, env, log_path):
    return subprocess.Popen(argv, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_probes(proc, port, container, log_path, probe_host=None):
    """The kubelet's order: the startup probe until it passes (liveness is
    not asked before; here it is, to see that a building daemon is live),
    then readiness. Returns (seconds to ready, the ready probe's answers
    before it passed)."""
    paths = {p: container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe", "startupProbe")}
    t0 = time.time()
    live_at, before = None, []
    while time.time() - t0 < START_WAIT_S:
        assert proc.poll() is None, f"aotid exited {proc.returncode}:\n{log_tail(log_path)}"
        if live_at is None:
            status, _ = get(port, paths["livenessProbe"], host=probe_host)
            if status == 200:
                live_at = time.time() - t0
        status, body = get(port, paths["startupProbe"], host=probe_host)
        if status == 200:
            assert live_at is not None, "ready before live"
            status, body = get(port, paths["readinessProbe"], host=probe_host)
            assert status == 200, (status, body)
            return time.time() - t0, live_at, before
        if status is not None:
            before.append((status, body))
        time.sleep(0.2)
    raise AssertionError(f"not ready within {START_WAIT_S} s:\n{log_tail(log_path)}")


def infer_both(port):
    """Every mlp case through KServe's client and Triton's; each answer
    equal to eager PyTorch's."""
    base = f"http://127.0.0.1:{port}"

    async def with_kserve():
        client = InferenceRESTClient(RESTConfig(protocol="v2", retries=1, timeout=60))
        try:
            assert await client.is_server_live(base) and await client.is_server_ready(base)
            assert await client.is_model_ready(base, MODEL)
            outs = []
            for case in CASES:
                res = await client.infer(base, {"inputs": case["inputs"]}, model_name=MODEL)
                assert res.model_name == MODEL, res.model_name
                outs.append([(o.name, list(o.shape), o.datatype, o.as_numpy()) for o in res.outputs])
            return outs
        finally:
            await client.close()

    for case, outs in zip(CASES, asyncio.run(with_kserve())):
        [(name, shape, datatype, data)] = outs
        want = case["outputs"][0]
        assert (name, shape, datatype) == (want["name"], want["shape"], want["datatype"]), (outs, want)
        assert close(data.ravel().tolist(), want["data"]), (data, want)

    client = triton.InferenceServerClient(url=f"127.0.0.1:{port}")
    try:
        assert client.is_model_ready(MODEL)
        for case in CASES:
            inputs = []
            for t in case["inputs"]:
                i = triton.InferInput(t["name"], t["shape"], t["datatype"])
                i.set_data_from_numpy(np.asarray(t["data"], dtype=np.float32).reshape(t["shape"]), binary_data=True)
                inputs.append(i)
            res = client.infer(MODEL, inputs)
            want = case["outputs"][0]
            got = res.as_numpy(want["name"])
            assert list(got.shape) == want["shape"] and close(got.ravel().tolist(), want["data"]), (got, want)
    finally:
        client.close()
    return len(CASES)


def stop(proc, grace_s, log_path):
    """SIGTERM as the kubelet sends it; aotid must be gone, with status 0,
    before the kubelet's SIGKILL would come."""
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        rc = proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {grace_s} s after SIGTERM:\n{log_tail(log_path)}")
    assert rc == 0, f"exited {rc} after SIGTERM:\n{log_tail(log_path)}"
    return time.time() - t0


def remap(path, mounts):
    """A path of the container as the test's folder holds it: beneath the
    mount whose mountPath holds it."""
    for mount_path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
        if path == mount_path or path.startswith(mount_path + "/"):
            return local + path[len(mount_path):]
    raise AssertionError(f"{path} lies under no mount of the container: {sorted(mounts)}")


def real_registry(work):
    port = free_port()
    config = os.path.join(work, "registry.yml")
    with open(config, "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {work}/registry\n"
                f"http:\n  addr: 127.0.0.1:{port}\n")
    log_path = os.path.join(work, "registry.log")
    proc = subprocess.Popen(["docker-registry", "serve", config], stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "w"), start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        if get(port, "/v2/")[0] == 200:
            return proc, port
        assert proc.poll() is None, log_tail(log_path)
        time.sleep(0.1)
    raise AssertionError("the registry did not start:\n" + log_tail(log_path))


def edge(work, procs):
    ds = one(load("edge/daemonset.yaml"), "DaemonSet")
    cm = one(load("edge/configmap.yaml"), "ConfigMap")
    secrets_doc = {d["metadata"]["name"]: d for d in load("edge/secrets.example.yaml")}
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}

    # Each mount of the container is a folder here, filled as the kubelet
    # fills it: the hostPath (empty: a new node), the ConfigMap's keys, the
    # Secrets' keys (the token a fresh one, mode 0400), an emptyDir.
    mounts = {}
    token = secrets.token_hex(16)
    for m in c["volumeMounts"]:
        local = os.path.join(work, "edge-mounts", m["name"])
        os.makedirs(local)
        mounts[m["mountPath"]] = local
        v = volumes[m["name"]]
        if "secret" in v:
            data = dict(secrets_doc[v["secret"]["secretName"]]["stringData"])
            if "token" in data:
                data["token"] = token
            for key, value in data.items():
                path = os.path.join(local, key)
                with open(path, "w") as f:
                    f.write(value)
                os.chmod(path, v["secret"]["defaultMode"])
    config_text = cm["data"]["aotid.toml"]
    config = tomllib.loads(config_text)

    # The fleet's registry: mlp pushed where the ConfigMap's tag points,
    # the registry's host moved to loopback.
    registry, reg_port = real_registry(work)
    procs.append(registry)
    [sync] = config["sync"]
    m = re.fullmatch(r"oci://([^/]+)/(.+)", sync["source"])
    assert m, sync["source"]
    source = f"oci://127.0.0.1:{reg_port}/{m.group(2)}"
    publisher = os.path.join(work, "publisher")
    for args in (["add", os.path.join(TESTDATA, f"{MODEL}.pt2"), "--name", MODEL], ["push", MODEL, source]):
        p = subprocess.run([AOTID, "--store", publisher, *args], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
    assert source.rsplit("/", 1)[1].split(":")[0] == MODEL, "the store names the model after the repository"

    # The ConfigMap's aotid.toml, each path moved beneath its mount here,
    # the listen port a free one, the registry on loopback.
    listen_host, listen_port = config["server"]["listen"].rsplit(":", 1)
    port = free_port()
    text = config_text.replace(f'"{config["server"]["listen"]}"', f'"{listen_host}:{port}"')
    text = text.replace(f'"{sync["source"]}"', f'"{source}"')
    for key_path in (config["store"]["path"], config["server"]["token_file"], sync["credentials"]):
        text = text.replace(f'"{key_path}"', f'"{remap(key_path, mounts)}"')
    assert tomllib.loads(text)["server"]["listen"] == f"127.0.0.1:{port}"
    args = list(c["args"])
    config_path = remap(args[args.index("--config") + 1], mounts)
    with open(config_path, "w") as f:
        f.write(text)
    args[args.index("--config") + 1] = config_path
    env = dict(os.environ)
    env.pop("AOTID_CONFIG", None)
    for e in c.get("env", []):
        env[e["name"]] = remap(e["value"], mounts) if e["value"].startswith("/") else e["value"]
    probe_host = c["startupProbe"]["httpGet"]["host"]
    for p in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[p]["httpGet"]["port"] == int(listen_port)

    grace = pod["terminationGracePeriodSeconds"]
    times = []
    for run in (1, 2):  # a new node, then the same node's next pod
        log_path = os.path.join(work, f"edge-{run}.log")
        proc = start([AOTID, *args], env, log_path)
        procs.append(proc)
        ready_s, live_s, before = wait_probes(proc, port, c, log_path, probe_host=f"{probe_host}:{port}")
        # Ready may come before the first sync has added the model (the
        # store was empty, and empty is ready): the model's own readiness.
        t0 = time.time()
        while get(port, f"/v2/models/{MODEL}/ready")[0] != 200:
            assert time.time() - t0 < START_WAIT_S, log_tail(log_path)
            assert proc.poll() is None, log_tail(log_path)
            time.sleep(0.2)
        status, body = get(port, "/v2/health/ready", host=f"{probe_host}:{port}")
        assert status == 200, (status, body)
        model_s = ready_s + time.time() - t0
        n = infer_both(port)
        print(f"edge pod {run}: live after {live_s:.1f} s, startup/readiness probe 200 after {ready_s:.1f} s, "
              f"{MODEL} synced from the fleet tag and ready after {model_s:.1f} s; {n} cases through KServe's "
              f"and Triton's clients equal eager PyTorch")
        times.append(model_s)
        if run == 1:
            # The token guards the routes that change what is served, and
            # only those: the probes and clients above sent none.
            status, _ = get(port, "/v2/repository/index", method="POST", body=b"{}",
                            headers={"Content-Type": "application/json"})
            assert status == 401, status
            status, body = get(port, "/v2/repository/index", method="POST", body=b"{}",
                               headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
            assert status == 200 and MODEL in body, (status, body)
            status, body = get(port, "/metrics")
            assert status == 200 and re.search(r'aotid_sync_runs_total\{[^}]*result="ok"[^}]*\} [1-9]', body), body
            # A name that is not loopback (allowed_hosts is empty) is refused.
            status, body = get(port, "/v2/health/live", host=f"node.example.com:{port}")
            assert status == 403 and "allowed_hosts" in body, (status, body)
            print("edge: the repository routes need the Secret's token (401 without, 200 with), the probes, "
                  "inference and /metrics do not; a Host that is not loopback gets 403")
        took = stop(proc, grace, log_path)
        print(f"edge pod {run}: SIGTERM: exited 0 after {took:.1f} s (grace period {grace} s)")
    store = remap(config["store"]["path"], mounts)
    assert os.path.exists(os.path.join(store, "aotid.db")), os.listdir(store)
    # The node's store kept the build: the second pod built nothing.
    logs = [log_tail(os.path.join(work, f"edge-{run}.log"), 10**7) for run in (1, 2)]
    assert "build started:" in logs[0] and "build started:" not in logs[1], logs[1][-3000:]
    print(f"edge: the second pod on the node's store built nothing and served after {times[1]:.1f} s "
          f"(the first, which built, {times[0]:.1f} s)")


def kserve(work, procs):
    rt = one(load("kserve/cluster-serving-runtime.yaml"), "ClusterServingRuntime")
    [c] = rt["spec"]["containers"]
    # What KServe's storage initializer leaves: the model under /mnt/models,
    # read-only.
    models = os.path.join(work, "mnt-models")
    os.makedirs(models)
    shutil.copy(os.path.join(TESTDATA, f"{MODEL}.pt2"), os.path.join(models, f"{MODEL}.pt2"))
    os.chmod(os.path.join(models, f"{MODEL}.pt2"), 0o444)
    os.chmod(models, 0o555)
    port = free_port()
    want_port = c["ports"][0]["containerPort"]
    swaps = {"{{.Name}}": MODEL, "/mnt/models": models, f"0.0.0.0:{want_port}": f"127.0.0.1:{port}"}
    args = []
    for a in c["args"]:
        for k, v in swaps.items():
            a = a.replace(k, v)
        args.append(a)
    for k, v in swaps.items():
        assert sum(v in a for a in args) == 1, f"{k} is in the runtime's arguments once: {c['args']}"
    # The container's writable mounts here; the image's config names the
    # store (its store.path) and listens on 8080, which the args override.
    mounts = {m["mountPath"]: os.path.join(work, "kserve-mounts", m["name"]) for m in c["volumeMounts"]}
    for local in mounts.values():
        os.makedirs(local)
    image_config = os.path.join(work, "image-aotid.toml")
    with open(image_config, "w") as f:
        f.write(f'[store]\npath = "{remap(IMAGE_STORE, mounts)}"\n[server]\nlisten = "0.0.0.0:{want_port}"\n')
    env = dict(os.environ, AOTID_CONFIG=image_config)
    for e in c.get("env", []):
        env[e["name"]] = remap(e["value"], mounts) if e["value"].startswith("/") else e["value"]
    log_path = os.path.join(work, "kserve.log")
    proc = start([AOTID, *args], env, log_path)
    procs.append(proc)
    ready_s, live_s, before = wait_probes(proc, port, c, log_path)
    # Not ready while it builds: the readiness probe kept traffic off.
    assert before and all(status == 503 for status, _ in before), before[:3]
    n = infer_both(port)
    print(f"kserve: live after {live_s:.1f} s; /v2/health/ready 503 x{len(before)} while {MODEL} built, 200 after "
          f"{ready_s:.1f} s; {n} cases through KServe's and Triton's clients equal eager PyTorch")
    # The model folder is as it was: aotid wrote only to its store.
    assert sorted(os.listdir(models)) == [f"{MODEL}.pt2"]
    grace = 30  # the pod's default; inferenceservice.yaml sets 45
    took = stop(proc, grace, log_path)
    print(f"kserve: SIGTERM: exited 0 after {took:.1f} s")


def main():
    work = tempfile.mkdtemp(prefix="aotid-deploy-")
    procs = []
    try:
        for part in PARTS:
            {"edge": edge, "kserve": kserve}[part](work, procs)
        print("PASS")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        if os.path.isdir(os.path.join(work, "mnt-models")):
            os.chmod(os.path.join(work, "mnt-models"), 0o755)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
