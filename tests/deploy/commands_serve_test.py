"""The containers of deploy/ run as their manifests write them, without a
cluster: each container's arguments, read from the YAML, run with this
build's aotid in a container made as the kubelet makes one (Container: a
read-only root, the manifest's volumes at their own mount paths, the
image's user 65532 without capabilities), driven as the kubelet and
clients would drive it. The one change is the port (a free one on
loopback). Needs root, unshare and setpriv.

edge: the DaemonSet's init container gives the node's hostPath folder to
   uid 65532; aotid then runs with the ConfigMap's aotid.toml as written,
   its [[sync]] registry moved to Debian's docker-registry on loopback,
   holding mlp pushed with `aotid push` to the tag the ConfigMap follows.
   The probes as the kubelet sends them (its Host header): live at once,
   ready once the synced model is built; answers through KServe's Python
   client (InferenceRESTClient, v2) and Triton's equal eager PyTorch's (the
   fixture's cases.json). The token of the Secret guards the repository
   routes and no other; a Host that is not loopback is refused; SIGTERM
   ends it within the grace period; the node's next pod on the same
   hostPath builds nothing.
kserve: the ClusterServingRuntime's arguments, {{.Name}} filled as KServe
   fills it, /mnt/models a read-only mount holding mlp.pt2 as the storage
   initializer leaves it, the store the image's store.path on the
   runtime's emptyDir: ready only once the model is built (503 before),
   then the same answers through both clients, the same again over gRPC
   on the port the runtime names h2c (KServe's gRPC client), and the same
   drain.

    commands_serve_test.py SOURCE_DIR AOTID TESTDATA edge|kserve...
"""
import asyncio
import http.client
import json
import os
import re
import secrets
import shlex
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
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

ROOT, AOTID, TESTDATA = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
PARTS = sys.argv[4:] or ["edge", "kserve"]
DEPLOY = os.path.join(ROOT, "deploy")
MODEL = "mlp"
CASES = json.load(open(os.path.join(TESTDATA, "cases.json")))[MODEL]
# The image's config (deploy/image/), which the runtime relies on.
IMAGE_STORE = "/var/lib/aotid"
IMAGE_UID = 65532
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


class Container:
    """A container as the kubelet makes it, on this machine: a mount
    namespace whose root is this machine's file system under an overlay
    (the image's files written into it, then made read-only:
    readOnlyRootFilesystem), the manifest's volumes bound at their own
    mount paths, and the command run as the security context's user with no
    capabilities but those it adds, and no new privileges. The network is
    this machine's (hostNetwork; the KServe pod's own network is loopback
    here too). Needs root, as the kubelet does."""

    def __init__(self, work, name, mounts, image_files, uid, gid, groups=(), caps=()):
        self.root = os.path.join(work, f"{name}-root")
        self.upper, self.scratch = os.path.join(work, f"{name}-upper"), os.path.join(work, f"{name}-ovl-work")
        for d in (self.root, self.upper, self.scratch):
            os.makedirs(d)
        self.mounts, self.image_files = mounts, image_files
        self.uid, self.gid, self.groups, self.caps = uid, gid, groups, caps

    def start(self, argv, env, log_path):
        q = shlex.quote
        r = q(self.root)
        lines = ["set -e",
                 f"mount -t overlay overlay -o lowerdir=/,upperdir={q(self.upper)},workdir={q(self.scratch)} {r}",
                 # The checkout's venv lies beneath /root, which only root may
                 # enter; the image's lies in /opt. Opened in the overlay only.
                 f"chmod 0755 {r}/root"]
        for path, text in self.image_files.items():
            lines += [f"mkdir -p {q(self.root + os.path.dirname(path))}",
                      f"printf %s {q(text)} >> {q(self.root + path)}"]
        for mount_path, (local, read_only) in self.mounts.items():
            lines += [f"mkdir -p {q(self.root + mount_path)}", f"mount --bind {q(local)} {q(self.root + mount_path)}"]
            if read_only:
                lines.append(f"mount -o remount,bind,ro {q(self.root + mount_path)}")
        lines += [f"mount --rbind /{d} {r}/{d}" for d in ("dev", "proc", "sys")]
        lines.append(f"mount -o remount,bind,ro {r}")
        caps = "".join(f",+{c.lower()}" for c in self.caps)
        groups = ",".join(str(g) for g in self.groups) or str(self.gid)
        user = [f"--reuid={self.uid}", f"--regid={self.gid}", f"--groups={groups}"]
        inner = ["setpriv", *user, f"--bounding-set=-all{caps}", f"--inh-caps=-all{caps}", "--no-new-privs",
                 "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
        lines.append(f"exec chroot {r} " + " ".join(q(a) for a in inner))
        return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)],
                                stdout=open(log_path, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def check_confined(proc, uid, writable):
    """aotid runs as the container would run it: as `uid`, no capabilities,
    no new privileges, its root read-only and exactly `writable` (the
    manifest's writable mounts) writable beneath it."""
    status = dict(line.split(":", 1) for line in open(f"/proc/{proc.pid}/status").read().splitlines())
    assert status["Uid"].split()[0] == str(uid) and status["CapEff"].strip() == "0" * 16, status
    assert status["NoNewPrivs"].strip() == "1", status
    rw, root_ro = set(), False
    for line in open(f"/proc/{proc.pid}/mountinfo").read().splitlines():
        fields = line.split()
        point, options = fields[4], fields[5].split(",")
        if point == "/":
            root_ro = "ro" in options
        elif "rw" in options and not point.startswith(("/dev", "/proc", "/sys")):
            rw.add(point)
    assert root_ro and rw == set(writable), (root_ro, sorted(rw), sorted(writable))
    return sorted(rw)


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

    assert_each_case_answered(asyncio.run(with_kserve()))

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


def assert_each_case_answered(answers):
    """Each case's one output, as KServe's client read it, equal to eager
    PyTorch's: its name, shape, datatype and values."""
    for case, outs in zip(CASES, answers, strict=True):
        [(name, shape, datatype, data)] = outs
        want = case["outputs"][0]
        assert (name, shape, datatype) == (want["name"], want["shape"], want["datatype"]), (outs, want)
        assert close(data.ravel().tolist(), want["data"]), (data, want)


def infer_grpc(port):
    """Every mlp case through KServe's gRPC client (what KServe's h2c port
    carries), the tensors as raw bytes; each answer equal to eager
    PyTorch's."""

    async def with_kserve():
        client = InferenceGRPCClient(f"127.0.0.1:{port}", timeout=60)
        try:
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready(MODEL)
            outs = []
            for case in CASES:
                inputs = []
                for t in case["inputs"]:
                    i = InferInput(t["name"], t["shape"], t["datatype"])
                    i.set_data_from_numpy(np.asarray(t["data"], dtype=np.float32).reshape(t["shape"]),
                                          binary_data=True)
                    inputs.append(i)
                res = await client.infer(InferRequest(model_name=MODEL, infer_inputs=inputs))
                assert res.model_name == MODEL, res.model_name
                outs.append([(o.name, list(o.shape), o.datatype, o.as_numpy()) for o in res.outputs])
            return outs
        finally:
            await client.close()

    assert_each_case_answered(asyncio.run(with_kserve()))
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


def image_files(listen):
    """What the image (deploy/image/) holds that the manifests rely on: its
    user, and its config (store.path, listen), which AOTID_CONFIG names."""
    return {"/etc/passwd": f"aotid:x:{IMAGE_UID}:{IMAGE_UID}:aotid:{IMAGE_STORE}:/usr/sbin/nologin\n",
            "/etc/group": f"aotid:x:{IMAGE_UID}:\n",
            "/etc/aotid/aotid.toml": f'[store]\npath = "{IMAGE_STORE}"\n[server]\nlisten = "{listen}"\n'}


def image_env(c):
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "AOTID_CONFIG": "/etc/aotid/aotid.toml", "LANG": "C.UTF-8",
           "HOME": IMAGE_STORE}
    for e in c.get("env", []):
        env[e["name"]] = e["value"]
    return env


def volume_folder(work, pod, name, volume, secret_docs, token):
    """A volume's folder as the kubelet makes it: a hostPath the kubelet
    creates (root's, 0755), an emptyDir (0777), a ConfigMap's keys (0644),
    a Secret's keys (defaultMode, given to the pod's fsGroup, which adds
    the group's read)."""
    local = os.path.join(work, pod, "volumes", name)
    os.makedirs(local)
    fs_group = None
    if "emptyDir" in volume:
        os.chmod(local, 0o777)
    elif "configMap" in volume:
        [cm] = [d for d in load("edge/configmap.yaml") if d["metadata"]["name"] == volume["configMap"]["name"]]
        for key, text in cm["data"].items():
            with open(os.path.join(local, key), "w") as f:
                f.write(text)
    elif "secret" in volume:
        data = dict(secret_docs[volume["secret"]["secretName"]]["stringData"])
        if "token" in data:
            data["token"] = token
        fs_group = IMAGE_UID
        for key, value in data.items():
            path = os.path.join(local, key)
            with open(path, "w") as f:
                f.write(value)
            os.chown(path, 0, fs_group)
            os.chmod(path, volume["secret"]["defaultMode"] | 0o040)
    elif "hostPath" in volume:
        assert volume["hostPath"]["type"] == "DirectoryOrCreate"
        os.chmod(local, 0o755)
    else:
        raise AssertionError(f"a volume this test cannot make: {volume}")
    return local


def edge(work, procs):
    ds = one(load("edge/daemonset.yaml"), "DaemonSet")
    cm = one(load("edge/configmap.yaml"), "ConfigMap")
    secret_docs = {d["metadata"]["name"]: d for d in load("edge/secrets.example.yaml")}
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    [init] = pod["initContainers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    token = secrets.token_hex(16)
    # One node: its hostPath folder outlives the pods; the other volumes are
    # each pod's own.
    node_store = None

    config = tomllib.loads(cm["data"]["aotid.toml"])
    # The fleet's registry, its host moved to loopback, holding mlp pushed
    # where the ConfigMap's tag points.
    registry, reg_port = real_registry(work)
    procs.append(registry)
    [sync] = config["sync"]
    m = re.fullmatch(r"oci://([^/]+)/(.+)", sync["source"])
    assert m, sync["source"]
    source = f"oci://127.0.0.1:{reg_port}/{m.group(2)}"
    assert source.rsplit("/", 1)[1].split(":")[0] == MODEL, "the store names the model after the repository"
    publisher = os.path.join(work, "publisher")
    for args in (["add", os.path.join(TESTDATA, f"{MODEL}.pt2"), "--name", MODEL], ["push", MODEL, source]):
        p = subprocess.run([AOTID, "--store", publisher, *args], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr

    listen_host, listen_port = config["server"]["listen"].rsplit(":", 1)
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] == int(listen_port)
    probe_host = c["startupProbe"]["httpGet"]["host"]
    grace = pod["terminationGracePeriodSeconds"]
    sc = pod["securityContext"]
    times = []
    for run in (1, 2):  # a new node, then the same node's next pod
        name = f"edge-{run}"
        folders = {}
        for v in volumes.values():
            if "hostPath" in v and node_store:
                folders[v["name"]] = node_store
            else:
                folders[v["name"]] = volume_folder(work, name, v["name"], v, secret_docs, token)
            if "hostPath" in v:
                node_store = folders[v["name"]]
        # The one change to the pod's files: the ConfigMap's listen port is
        # a free one here (the node's 8765 may be taken), and its registry
        # is the one on loopback. Every path stays as written.
        port = free_port()
        cm_dir = folders[[m["name"] for m in c["volumeMounts"] if "configMap" in volumes[m["name"]]][0]]
        cm_file = os.path.join(cm_dir, "aotid.toml")
        text = open(cm_file).read()
        for old, new in ((f'"{config["server"]["listen"]}"', f'"{listen_host}:{port}"'),
                         (f'"{sync["source"]}"', f'"{source}"')):
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        with open(cm_file, "w") as f:
            f.write(text)

        def mounts_of(container):
            return {m["mountPath"]: (folders[m["name"]], bool(m.get("readOnly"))) for m in container["volumeMounts"]}

        # The init container, as root with CHOWN and FOWNER alone, gives the
        # node's folder to aotid's uid (the first time).
        isc = init["securityContext"]
        init_box = Container(work, f"{name}-init", mounts_of(init), image_files("0.0.0.0:8080"), isc["runAsUser"],
                             isc["runAsUser"], caps=isc["capabilities"]["add"])
        log_path = os.path.join(work, f"{name}-init.log")
        p = init_box.start(init["command"], {"PATH": "/usr/bin:/bin"}, log_path)
        assert p.wait(timeout=60) == 0, log_tail(log_path)
        st = os.stat(node_store)
        assert (st.st_uid, st.st_gid) == (IMAGE_UID, IMAGE_UID), (st.st_uid, st.st_gid)

        box = Container(work, name, mounts_of(c), image_files("0.0.0.0:8080"), c["securityContext"]["runAsUser"],
                        sc["runAsGroup"], groups=(sc["runAsGroup"], sc["fsGroup"]))
        log_path = os.path.join(work, f"{name}.log")
        proc = box.start([AOTID, *c["args"]], image_env(c), log_path)
        procs.append(proc)
        ready_s, live_s, before = wait_probes(proc, port, c, log_path, probe_host=f"{probe_host}:{port}")
        rw = check_confined(proc, IMAGE_UID, [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")])
        # Ready may come before the first sync has added the model (an
        # empty store is ready): the model's own readiness.
        t0 = time.time()
        while get(port, f"/v2/models/{MODEL}/ready")[0] != 200:
            assert time.time() - t0 < START_WAIT_S, log_tail(log_path)
            assert proc.poll() is None, log_tail(log_path)
            time.sleep(0.2)
        status, body = get(port, "/v2/health/ready", host=f"{probe_host}:{port}")
        assert status == 200, (status, body)
        model_s = ready_s + time.time() - t0
        n = infer_both(port)
        if run == 1:
            print(f"edge: aotid runs as uid {IMAGE_UID}, no capabilities, no new privileges, the root read-only, "
                  f"writable only {', '.join(rw)}")
        print(f"edge pod {run}: live after {live_s:.1f} s, startup/readiness probe 200 after {ready_s:.1f} s, "
              f"{MODEL} synced from the fleet tag and ready after {model_s:.1f} s; {n} cases through KServe's "
              f"and Triton's clients equal eager PyTorch")
        times.append(model_s)
        if run == 1:
            # The token guards the routes that change what is served, and
            # only those: the probes and clients above sent none.
            hdr = {"Content-Type": "application/json"}
            status, _ = get(port, "/v2/repository/index", method="POST", body=b"{}", headers=hdr)
            assert status == 401, status
            status, body = get(port, "/v2/repository/index", method="POST", body=b"{}",
                               headers={**hdr, "Authorization": f"Bearer {token}"})
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
    # The token file is the group's too (fsGroup), which aotid mentions, as
    # docs/KUBERNETES.md says.
    logs = [log_tail(os.path.join(work, f"edge-{run}.log"), 10**7) for run in (1, 2)]
    assert "can be read by other users (mode 440)" in logs[0], logs[0][-3000:]
    # The node's store kept the build: the second pod built nothing.
    assert "build started:" in logs[0] and "build started:" not in logs[1], logs[1][-3000:]
    assert os.path.exists(os.path.join(node_store, "aotid.db"))
    print(f"edge: the second pod on the node's store built nothing and served after {times[1]:.1f} s "
          f"(the first, which built, {times[0]:.1f} s)")


def kserve(work, procs):
    rt = one(load("kserve/cluster-serving-runtime.yaml"), "ClusterServingRuntime")
    [c] = rt["spec"]["containers"]
    volumes = {v["name"]: v for v in rt["spec"]["volumes"]}
    # What KServe's storage initializer leaves: the model under /mnt/models,
    # mounted read-only into the serving container.
    models = os.path.join(work, "kserve", "provision-location")
    os.makedirs(models)
    shutil.copy(os.path.join(TESTDATA, f"{MODEL}.pt2"), os.path.join(models, f"{MODEL}.pt2"))
    os.chmod(os.path.join(models, f"{MODEL}.pt2"), 0o644)
    mounts = {"/mnt/models": (models, True)}
    for m in c["volumeMounts"]:
        mounts[m["mountPath"]] = (volume_folder(work, "kserve", m["name"], volumes[m["name"]], {}, None),
                                  bool(m.get("readOnly")))
    # KServe fills {{.Name}}; the one change of the test's own is the ports
    # (this machine's 8080 and 9000 may be taken): REST's (http1) and
    # gRPC's (h2c), each where the arguments listen.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    want_port, want_grpc = ports["http1"], ports["h2c"]
    port, grpc_port = free_port(), free_port()
    args = [a.replace("{{.Name}}", MODEL).replace(f"0.0.0.0:{want_port}", f"127.0.0.1:{port}")
            .replace(f"0.0.0.0:{want_grpc}", f"127.0.0.1:{grpc_port}") for a in c["args"]]
    assert args.count(MODEL) == 1 and args.count(f"127.0.0.1:{port}") == 1, c["args"]
    assert args.count(f"127.0.0.1:{grpc_port}") == 1, c["args"]
    box = Container(work, "kserve", mounts, image_files(f"0.0.0.0:{want_port}"),
                    c["securityContext"]["runAsUser"], c["securityContext"]["runAsGroup"])
    log_path = os.path.join(work, "kserve.log")
    proc = box.start([AOTID, *args], image_env(c), log_path)
    procs.append(proc)
    ready_s, live_s, before = wait_probes(proc, port, c, log_path)
    rw = check_confined(proc, IMAGE_UID, [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")])
    print(f"kserve: aotid runs as uid {IMAGE_UID}, no capabilities, no new privileges, the root read-only, "
          f"writable only {', '.join(rw)}; /mnt/models read-only")
    # Not ready while it builds: the readiness probe kept traffic off.
    assert before and all(status == 503 for status, _ in before), before[:3]
    n = infer_both(port)
    print(f"kserve: live after {live_s:.1f} s; /v2/health/ready 503 x{len(before)} while {MODEL} built, 200 after "
          f"{ready_s:.1f} s; {n} cases through KServe's and Triton's clients equal eager PyTorch")
    assert f"gRPC serving on 127.0.0.1:{grpc_port}" in log_tail(log_path, 100000), log_tail(log_path)
    n = infer_grpc(grpc_port)
    print(f"kserve: h2c: {n} cases through KServe's gRPC client equal eager PyTorch")
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
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
