"""Model store sync through OCI registries, end to end.

1. The real registry (Debian's docker-registry) on a loopback port: a model
   with its settings is pushed from one store and synced into an empty one
   (a second device), served there by the real daemon, and its answers
   equal eager PyTorch's (the reference outputs in cases.json). A second
   sync changes nothing; a second push uploads nothing.
2. A registry of the test's own on loopback, for what the real one will
   not do: it cuts the package's download midway, and the next sync asks
   for the rest with a Range request and finishes; then, one at a time, it
   lies (a digest that is a path, bytes that do not match their digest, a
   package larger than the limit, another artifact type), fails (500) or
   hangs. Each is refused with an error naming the problem, and the store
   is left as it was.
3. The real registry behind htpasswd basic auth: no credentials and wrong
   ones are refused, saying so; right ones push and sync. Then behind TLS
   with a certificate of its own: refused until SSL_CERT_FILE trusts it.
4. Interop both ways with the oras Python SDK.
5. A daemon following a tag with [[sync]]: a version pushed after it
   started is served without a restart; moving the tag switches it over
   with no failed request in between; `aotid sync status` tells.

    oci_sync_test.py AOTID TESTDATA
"""
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

AOTID, TESTDATA = sys.argv[1], sys.argv[2]


# 300,000 arrays, one inside the other.
NESTING_BOMB = "[" * 300_000 + "]" * 300_000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(store, *args, ok=True, timeout=300):
    p = subprocess.run([AOTID, "--store", store, *args], capture_output=True, text=True, timeout=timeout)
    if ok and p.returncode != 0:
        raise AssertionError(f"aotid {' '.join(args)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p


def call(port, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def store_files(store):
    """Every file of a store but its database (which a failed sync may open)."""
    out = []
    for root, _, files in os.walk(store):
        out += [os.path.relpath(os.path.join(root, f), store) for f in files if not f.startswith("aotid.db")]
    return sorted(out)


def real_registry(work, htpasswd=None, tls=None):
    port = free_port()
    config = os.path.join(work, f"registry-{port}.yml")
    with open(config, "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {work}/registry-{port}\n"
                f"http:\n  addr: 127.0.0.1:{port}\n")
        if tls:
            f.write(f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n")
        if htpasswd:
            f.write(f"auth:\n  htpasswd:\n    realm: aotid-test\n    path: {htpasswd}\n")
    proc = subprocess.Popen(["docker-registry", "serve", config], stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(work, "registry.log"), "w"))
    for _ in range(100):
        try:
            if tls:
                import ssl
                urllib.request.urlopen(f"https://127.0.0.1:{port}/v2/", timeout=2,
                                       context=ssl.create_default_context(cafile=tls[0]))
            else:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
            return proc, port
        except urllib.error.HTTPError:  # it answers: 401 behind auth
            return proc, port
        except OSError:
            assert proc.poll() is None, open(os.path.join(work, "registry.log")).read()
            time.sleep(0.1)
    raise AssertionError("the registry did not start")


def basic_auth(work):
    """A registry behind htpasswd: right credentials (a Docker config file)
    push and sync; wrong or none are refused, saying which."""
    import base64
    import crypt  # bcrypt through libxcrypt, which the registry's htpasswd wants

    htpasswd = os.path.join(work, "htpasswd")
    with open(htpasswd, "w") as f:
        f.write("alice:" + crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH)) + "\n")
    proc, port = real_registry(work, htpasswd)
    try:
        def creds(password):
            path = os.path.join(work, f"docker-{password}.json")
            auth = base64.b64encode(f"alice:{password}".encode()).decode()
            with open(path, "w") as f:
                json.dump({"auths": {f"127.0.0.1:{port}": {"auth": auth}}}, f)
            return path

        a, b = os.path.join(work, "auth-a"), os.path.join(work, "auth-b")
        run(a, "add", os.path.join(TESTDATA, "mlp.pt2"), "--name", "mlp")
        target = f"oci://127.0.0.1:{port}/private/mlp:1"
        p = run(a, "push", "mlp", target, ok=False)
        assert p.returncode != 0 and "asks for a user name and password" in p.stderr, p.stderr
        p = run(a, "push", "mlp", target, "--credentials", creds("wrong"), ok=False)
        assert p.returncode != 0 and "refused the credentials of user 'alice'" in p.stderr, p.stderr
        run(a, "push", "mlp", target, "--credentials", creds("s3cret"))
        p = run(b, "sync", target, "--credentials", creds("wrong"), ok=False)
        assert p.returncode != 0 and "refused the credentials of user 'alice'" in p.stderr, p.stderr
        assert json.loads(run(b, "ls", "--json").stdout) == []
        # The default file: $DOCKER_CONFIG/config.json.
        docker = os.path.join(work, "docker")
        os.makedirs(docker)
        shutil.copy(creds("s3cret"), os.path.join(docker, "config.json"))
        p = subprocess.run([AOTID, "--store", b, "sync", target], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, DOCKER_CONFIG=docker))
        assert p.returncode == 0 and "as mlp:1" in p.stdout, p.stdout + p.stderr
        print("basic auth: none and wrong credentials refused, saying so; right ones push and sync")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def tls_registry(work):
    """A registry that speaks only TLS, with a certificate of its own for
    127.0.0.1: aotid uses TLS where the registry speaks it, even on
    loopback; it refuses a certificate this machine does not trust, and
    takes it once the CA file (SSL_CERT_FILE) trusts it."""
    cert, key = os.path.join(work, "registry.crt"), os.path.join(work, "registry.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=aotid test registry", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=120)
    proc, port = real_registry(work, tls=(cert, key))
    try:
        a, b = os.path.join(work, "tls-a"), os.path.join(work, "tls-b")
        run(a, "add", os.path.join(TESTDATA, "mlp.pt2"), "--name", "mlp")
        target = f"oci://127.0.0.1:{port}/secure/mlp:1"
        p = run(a, "push", "mlp", target, ok=False)
        assert p.returncode != 0 and "not trusted by this machine's CA store" in p.stderr, p.stderr
        trusted = dict(os.environ, SSL_CERT_FILE=cert)
        p = subprocess.run([AOTID, "--store", a, "push", "mlp", target], capture_output=True, text=True,
                           timeout=120, env=trusted)
        assert p.returncode == 0, p.stdout + p.stderr
        p = subprocess.run([AOTID, "--store", b, "sync", target], capture_output=True, text=True, timeout=120,
                           env=trusted)
        assert p.returncode == 0 and "as mlp:1" in p.stdout, p.stdout + p.stderr
        assert [v["name"] for v in json.loads(run(b, "ls", "--json").stdout)] == ["mlp"]
        print("TLS: an untrusted certificate refused, saying so; trusted through SSL_CERT_FILE, push and sync")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def start_daemon(store, log_path, *extra):
    daemon = subprocess.Popen([AOTID, *extra, "--store", store, "serve", "--listen", "127.0.0.1:0"],
                              stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        m = re.search(r"serving on http://[^\s]*:(\d+)", open(log_path).read())
        if m:
            return daemon, int(m.group(1))
        assert daemon.poll() is None, open(log_path).read()
        time.sleep(0.1)
    raise AssertionError("the daemon did not start:\n" + open(log_path).read())


def wait_for(what, check, log_path, seconds=600):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {seconds} s:\n" + open(log_path).read()[-4000:])


def close(got, want):
    return len(got) == len(want) and all(abs(g - w) <= 1e-5 + 1e-5 * abs(w) for g, w in zip(got, want))


def daemon_follows_tag(work):
    """A device's daemon follows oci://.../fleet/mlp:stable on its own timer:
    a version pushed after it started is served without a restart, and
    moving the tag to another version switches it over with every request
    in between answered."""
    proc, port = real_registry(work)
    try:
        publisher, device = os.path.join(work, "publisher"), os.path.join(work, "device")
        target = f"oci://127.0.0.1:{port}/fleet/mlp:stable"
        config = os.path.join(work, "device.toml")
        with open(config, "w") as f:
            f.write(f'[[sync]]\nsource = "{target}"\ninterval_s = 1\n')
        log_path = os.path.join(work, "device.log")
        daemon, dport = start_daemon(device, log_path, "--config", config)
        try:
            time.sleep(1.5)  # it has tried, and found nothing under the tag yet
            # What the running daemon follows, whatever config this command reads.
            p = subprocess.run([AOTID, "--store", device, "sync", "status", "--json"],
                               capture_output=True, text=True, timeout=60)
            status = json.loads(p.stdout)
            assert status[0]["synced"] and not status[0]["ok"] and "manifest unknown" in status[0]["message"], status

            run(publisher, "add", os.path.join(TESTDATA, "mlp.pt2"), "--name", "mlp")
            run(publisher, "push", "mlp:1", target)
            wait_for("mlp:1 served", lambda: call(dport, "/v2/models/mlp/ready")[0] == 200, log_path)
            cases = json.load(open(os.path.join(TESTDATA, "cases.json")))
            case = cases["mlp"][0]
            status, out = call(dport, "/v2/models/mlp/infer", {"inputs": case["inputs"]})
            assert status == 200 and close(out["outputs"][0]["data"], case["outputs"][0]["data"]), out

            failures, answered, stop = [], [0], threading.Event()

            def client():
                while not stop.is_set():
                    status, out = call(dport, "/v2/models/mlp/infer", {"inputs": case["inputs"]})
                    if status != 200:
                        failures.append((status, out))
                    answered[0] += 1
                    time.sleep(0.01)

            t = threading.Thread(target=client)
            t.start()
            try:
                run(publisher, "add", os.path.join(TESTDATA, "mlp2.pt2"), "--name", "mlp")
                run(publisher, "push", "mlp:2", target)  # the tag moves
                want2 = cases["mlp2"][0]

                def switched():
                    status, out = call(dport, "/v2/models/mlp/infer", {"inputs": want2["inputs"]})
                    return status == 200 and out.get("model_version") == "2" and close(
                        out["outputs"][0]["data"], want2["outputs"][0]["data"])
                wait_for("the tag's new version served", switched, log_path)
            finally:
                stop.set()
                t.join(timeout=120)
            assert not failures, failures[:3]
            p = subprocess.run([AOTID, "--config", config, "--store", device, "sync", "status"],
                               capture_output=True, text=True, timeout=60)
            assert "up to date: mlp:2" in p.stdout, p.stdout
            with urllib.request.urlopen(f"http://127.0.0.1:{dport}/metrics", timeout=60) as r:
                metrics = r.read().decode()
            label = f'source="{target}"'

            def sample(name, extra=""):
                m = re.search(re.escape(f"{name}{{{label}{extra}}} ") + r"(\d+)\n", metrics)
                assert m, f"{name}{{{label}{extra}}} not in /metrics:\n{metrics[-3000:]}"
                return int(m.group(1))
            assert sample("aotid_sync_runs_total", ',result="ok"') >= 2  # mlp:1, then mlp:2
            assert sample("aotid_sync_runs_total", ',result="failed"') >= 1  # the tag before the first push
            assert sample("aotid_sync_failures_in_a_row") == 0
            assert abs(sample("aotid_sync_last_success_timestamp_seconds") - time.time()) < 600
            print(f"the device followed {target}: served mlp:1 when pushed, switched to mlp:2 when the tag moved; "
                  f"{answered[0]} requests meanwhile, none failed")
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def oras_interop(work):
    """Both ways with the oras Python SDK: an artifact oras pushes in the
    documented form (config and package media types) is synced with its
    settings; one aotid pushes is pulled by oras as the original bytes."""
    import oras.provider

    proc, port = real_registry(work)
    try:
        mlp = os.path.join(TESTDATA, "mlp.pt2")
        sha = hashlib.sha256(open(mlp, "rb").read()).hexdigest()
        config = os.path.join(work, "oras-config.json")
        with open(config, "w") as f:
            json.dump({"name": "via-oras", "settings": {"max_batch_size": "2"}}, f)
        registry = oras.provider.Registry(hostname=f"127.0.0.1:{port}", insecure=True)
        res = registry.push(target=f"127.0.0.1:{port}/byoras/mlp:v1",
                            files=[f"{mlp}:application/vnd.aotid.package.v1.pt2"],
                            manifest_config=f"{config}:application/vnd.aotid.model.config.v1+json",
                            disable_path_validation=True, quiet=True)
        assert res.status_code == 201, res.text
        store = os.path.join(work, "oras-device")
        out = run(store, "sync", f"oci://127.0.0.1:{port}/byoras/mlp:v1", "--name", "via-oras").stdout
        assert "as via-oras:1" in out, out
        shown = json.loads(run(store, "show", "via-oras", "--json").stdout)["versions"][0]
        assert shown["artifact"] == sha and shown["settings"]["max_batch_size"] == 2, shown

        publisher = os.path.join(work, "oras-publisher")
        run(publisher, "add", mlp, "--name", "mlp")
        run(publisher, "push", "mlp", f"oci://127.0.0.1:{port}/fromaotid/mlp:v1")
        outdir = os.path.join(work, "oras-out")
        files = registry.pull(target=f"127.0.0.1:{port}/fromaotid/mlp:v1", outdir=outdir)
        assert [os.path.basename(f) for f in files] == ["mlp-1.pt2"], files
        assert hashlib.sha256(open(files[0], "rb").read()).hexdigest() == sha
        print("oras: its push synced with its settings; aotid's push pulled as the original .pt2 bytes")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def push_sync_serve(work):
    proc, port = real_registry(work)
    try:
        a, b = os.path.join(work, "device-a"), os.path.join(work, "device-b")
        run(a, "add", os.path.join(TESTDATA, "mlp.pt2"), "--name", "mlp", "--max-batch-size", "4")
        target = f"oci://127.0.0.1:{port}/models/mlp:stable"
        out = run(a, "push", "mlp", target).stdout
        assert re.search(r"pushed mlp:1 to .*models/mlp:stable \(sha256:[0-9a-f]{64}; .* uploaded\)", out), out
        out = run(a, "push", "mlp", target).stdout
        assert "the registry had its package already" in out, out

        out = run(b, "sync", target).stdout
        assert f"synced {target} as mlp:1" in out, out
        assert "up to date: mlp:1" in run(b, "sync", target).stdout
        ls = json.loads(run(b, "ls", "--json").stdout)
        assert [(v["name"], v["version"]) for v in ls] == [("mlp", 1)], ls
        shown = json.loads(run(b, "show", "mlp", "--json").stdout)
        assert shown["versions"][0]["settings"]["max_batch_size"] == 4, shown  # the pushed settings came along
        sha = hashlib.sha256(open(os.path.join(TESTDATA, "mlp.pt2"), "rb").read()).hexdigest()
        assert shown["versions"][0]["artifact"] == sha, shown
        events = run(b, "events").stdout
        assert "synced" in events and target in events, events

        # On a terminal, a bar redrawn in place; otherwise plain lines.
        import pty
        leader, follower = pty.openpty()
        proc_tty = subprocess.Popen([AOTID, "--store", os.path.join(work, "device-tty"), "sync", target],
                                    stdout=subprocess.DEVNULL, stderr=follower)
        os.close(follower)
        shown = b""
        while True:  # ends when the child closes the terminal (EIO)
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        os.close(leader)
        p = proc_tty
        p.wait(timeout=120)
        assert p.returncode == 0 and b"\r" in shown and b"[####################] " in shown, shown
        assert "[#" not in run(os.path.join(work, "device-plain"), "sync", target).stderr

        # Every tag of the repository: the one there is, already here.
        assert "up to date: mlp:1" in run(b, "sync", f"oci://127.0.0.1:{port}/models/mlp").stdout
        # What is not there exits 3 (not found), one tag or every tag.
        for missing in (f"oci://127.0.0.1:{port}/models/mlp:nothere", f"oci://127.0.0.1:{port}/models/nothere:1",
                        f"oci://127.0.0.1:{port}/models/nothere"):
            p = run(b, "sync", missing, ok=False)
            assert p.returncode == 3, (missing, p.returncode, p.stderr)

        log_path = os.path.join(work, "daemon.log")
        daemon = subprocess.Popen([AOTID, "--store", b, "serve", "--listen", "127.0.0.1:0"],
                                  stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
        try:
            dport, deadline = None, time.time() + 600
            while time.time() < deadline:
                if dport is None:
                    m = re.search(r"serving on http://[^\s]*:(\d+)", open(log_path).read())
                    dport = int(m.group(1)) if m else None
                elif call(dport, "/v2/models/mlp/ready")[0] == 200:
                    break
                assert daemon.poll() is None, open(log_path).read()
                time.sleep(0.2)
            else:
                raise AssertionError("not ready within 600 s:\n" + open(log_path).read())
            cases = json.load(open(os.path.join(TESTDATA, "cases.json")))["mlp"]
            for case in cases:
                status, out = call(dport, "/v2/models/mlp/infer", {"inputs": case["inputs"]})
                assert status == 200, out
                want = case["outputs"][0]["data"]
                got = out["outputs"][0]["data"]
                assert len(got) == len(want) and all(abs(g - w) <= 1e-5 + 1e-5 * abs(w) for g, w in zip(got, want)), \
                    (got, want)
            print(f"pushed, synced to a second store, served there: {len(cases)} cases equal eager")
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class FakeRegistry:
    """A registry that serves one crafted manifest, and says what it was asked."""

    def __init__(self, blob: bytes):
        self.blob = blob
        self.layer_digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        self.config = json.dumps({"name": "mlp", "version": 7, "package_model": "", "settings": {}}).encode()
        self.config_digest = "sha256:" + hashlib.sha256(self.config).hexdigest()
        self.cut_after = None  # bytes of the layer sent before the connection is cut, once
        self.ignore_range = False  # answer a Range request with the whole blob (200)
        self.error_message = "the disk is on fire"
        self.layer_bytes = blob
        self.manifest_status = 200
        self.hang = False
        self.ranges = []
        self.manifest = self.make_manifest()
        self.manifest_raw = None  # bytes sent instead of `manifest`, when set
        self.tags = ["v7"]  # what /tags/list answers
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send(self, status, body=b"", ctype="application/json", extra=()):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if fake.hang:
                    time.sleep(30)
                    return
                if "/tags/list" in self.path:
                    return self.send(200, json.dumps({"name": "models/mlp", "tags": fake.tags}).encode())
                if "/manifests/" in self.path:
                    if fake.manifest_status != 200:
                        return self.send(fake.manifest_status,
                                         json.dumps({"errors": [{"message": fake.error_message}]}).encode())
                    body = fake.manifest_raw if fake.manifest_raw is not None else json.dumps(fake.manifest).encode()
                    return self.send(200, body, "application/vnd.oci.image.manifest.v1+json")
                if self.path.endswith(fake.config_digest):
                    return self.send(200, fake.config, "application/octet-stream")
                if "/blobs/" in self.path:
                    data, status, extra = fake.layer_bytes, 200, []
                    rng = self.headers.get("Range")
                    fake.ranges.append(rng)
                    if rng and not fake.ignore_range:
                        start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                        data, status = data[start:], 206
                        extra = [("Content-Range", f"bytes {start}-{len(fake.layer_bytes) - 1}/{len(fake.layer_bytes)}")]
                    if fake.cut_after is not None:
                        cut, fake.cut_after = fake.cut_after, None
                        self.send_response(status)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data[:cut])
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    return self.send(status, data, "application/octet-stream", extra)
                self.send(404, b'{"errors":[{"message":"unknown"}]}')

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set_config(self, config):
        self.set_config_bytes(json.dumps(config).encode())

    def set_config_bytes(self, config):
        self.config = config
        self.config_digest = "sha256:" + hashlib.sha256(self.config).hexdigest()
        self.manifest = self.make_manifest()

    def make_manifest(self, **changes):
        m = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
             "artifactType": "application/vnd.aotid.model.v1",
             "config": {"mediaType": "application/vnd.aotid.model.config.v1+json", "digest": self.config_digest,
                        "size": len(self.config)},
             "layers": [{"mediaType": "application/vnd.aotid.package.v1.pt2", "digest": self.layer_digest,
                         "size": len(self.blob)}]}
        m.update(changes)
        return m

    def close(self):
        self.server.shutdown()


def resume_and_refuse(work):
    blob = open(os.path.join(TESTDATA, "mlp.pt2"), "rb").read()
    fake = FakeRegistry(blob)
    ref = f"oci://127.0.0.1:{fake.port}/models/mlp:v7"
    try:
        store = os.path.join(work, "device-c")
        half = len(blob) // 2
        fake.cut_after = half
        p = run(store, "sync", ref, ok=False)
        assert p.returncode != 0 and "the next sync continues from there" in p.stderr, p.stderr
        assert json.loads(run(store, "ls", "--json").stdout) == [], "a broken download added a version"
        p = run(store, "sync", ref)
        assert fake.ranges[-1] == f"bytes={half}-", fake.ranges  # the rest, not the whole
        assert "continuing from" in p.stdout and "as mlp:1" in p.stdout, p.stdout
        assert not os.listdir(os.path.join(store, "downloads")), "the partial file stayed"
        sha = fake.layer_digest[7:]
        assert os.path.exists(os.path.join(store, "blobs", "sha256", sha))
        print(f"a download cut at {half} of {len(blob)} bytes was resumed with Range and verified")

        # A registry that ignores Range sends the whole again: the partial
        # file starts over rather than growing past the blob.
        store = os.path.join(work, "device-e")
        fake.cut_after, fake.ignore_range = half, True
        assert run(store, "sync", ref, ok=False).returncode != 0
        p = run(store, "sync", ref)
        fake.ignore_range = False
        assert fake.ranges[-1] == f"bytes={half}-" and "as mlp:1" in p.stdout, (fake.ranges, p.stdout)
        assert "continuing from" not in p.stdout, p.stdout  # it was all fetched again
        assert not os.listdir(os.path.join(store, "downloads"))
        print("a registry that ignored the Range request: the whole blob taken again, and verified")

        # A whole download left by a sync killed before it recorded it is
        # verified and taken without asking the registry again.
        store = os.path.join(work, "device-f")
        run(store, "add", os.path.join(TESTDATA, "embed.pt2"), "--name", "embed")
        os.makedirs(os.path.join(store, "downloads"), exist_ok=True)
        shutil.copy(os.path.join(TESTDATA, "mlp.pt2"), os.path.join(store, "downloads", sha + ".partial"))
        asked = len(fake.ranges)
        p = run(store, "sync", ref)
        assert len(fake.ranges) == asked and "as mlp:1" in p.stdout, (fake.ranges, p.stdout)
        assert not os.listdir(os.path.join(store, "downloads"))
        # A whole leftover that is corrupt (a crash's torn write): fetched
        # again at once, in the same sync.
        store = os.path.join(work, "device-f2")
        os.makedirs(os.path.join(store, "downloads"))
        with open(os.path.join(store, "downloads", sha + ".partial"), "wb") as f:
            f.write(bytes(reversed(blob)))
        p = run(store, "sync", ref)
        assert fake.ranges[-1] is None and "as mlp:1" in p.stdout, (fake.ranges, p.stdout)

        # The config is the registry's word: it names no local model (the
        # repository does, or --name) and its inductor options, which reach
        # the compiler's command line, are not applied.
        fake.set_config({"name": "embed", "version": 7, "package_model": "",
                         "settings": {"inductor_options": json.dumps({"cpp.cxx": "touch /tmp/owned; g++"}),
                                      "max_batch_size": "3"}})
        store = os.path.join(work, "device-g")
        run(store, "add", os.path.join(TESTDATA, "embed.pt2"), "--name", "embed")
        p = run(store, "sync", ref)
        assert "as mlp:1" in p.stdout and "inductor options are not applied" in p.stderr, (p.stdout, p.stderr)
        names = sorted((v["name"], v["version"]) for v in json.loads(run(store, "ls", "--json").stdout))
        assert names == [("embed", 1), ("mlp", 1)], names
        shown = json.loads(run(store, "show", "mlp", "--json").stdout)["versions"][0]["settings"]
        assert shown["max_batch_size"] == 3 and shown["inductor_options"] in ("", "{}", {}), shown
        p = run(store, "sync", ref, "--name", "../x", ok=False)
        assert p.returncode != 0 and "../x" in p.stderr, p.stderr
        fake.set_config({"name": "mlp", "version": 7, "package_model": "", "settings": {}})
        print("the config named another local model and carried inductor options: neither taken")

        def refused(why, setup, timeout=None, source=ref):
            fresh = os.path.join(work, "device-d")
            shutil.rmtree(fresh, ignore_errors=True)
            run(fresh, "add", os.path.join(TESTDATA, "embed.pt2"), "--name", "embed")
            before = store_files(fresh), run(fresh, "ls", "--json").stdout
            setup()
            args = ["sync", source] + (["--timeout", str(timeout)] if timeout else [])
            started = time.time()
            p = run(fresh, *args, ok=False, timeout=120)
            assert p.returncode != 0 and why in p.stderr, (why, p.stdout, p.stderr)
            assert (store_files(fresh), run(fresh, "ls", "--json").stdout) == before, f"{why}: the store changed"
            assert not os.path.exists("/etc/passwd.partial")
            print(f"refused in {time.time() - started:.1f} s: {p.stderr.strip()}")
            fake.set_config({"name": "mlp", "version": 7, "package_model": "", "settings": {}})
            fake.manifest, fake.layer_bytes, fake.manifest_status, fake.hang = fake.make_manifest(), blob, 200, False
            fake.manifest_raw = None
            fake.tags = ["v7"]
            fake.error_message = "the disk is on fire"
            return p.stderr

        def bad_config_digest():
            fake.manifest["config"]["digest"] = "sha256:../../../../etc/passwd"

        def bad_layer_digest():
            fake.manifest["layers"][0]["digest"] = "sha256:../../etc/passwd"

        def lying_bytes():
            fake.layer_bytes = bytes(reversed(blob))

        def huge():
            fake.manifest["layers"][0]["size"] = 1 << 40

        def config_size_lies():
            fake.manifest["config"]["size"] = 5

        def other_type():
            fake.manifest["artifactType"] = "application/vnd.example.other"

        def server_error():
            fake.manifest_status = 500

        def hangs():
            fake.hang = True

        refused("config digest 'sha256:../../../../etc/passwd' is not sha256:<64 hex digits>", bad_config_digest)
        refused("layer's digest 'sha256:../../etc/passwd' is not sha256:<64 hex digits>", bad_layer_digest)
        refused("does not match its digest", lying_bytes)
        refused("over the limit", huge)
        refused("bytes, not the 5 its manifest says", config_size_lies)
        refused("artifact type is 'application/vnd.example.other', not an aotid model", other_type)
        refused("HTTP 500: the disk is on fire", server_error)
        refused("no answer in time", hangs, timeout=2)

        # A registry's words reach the terminal and the logs: they cannot
        # forge a line of aotid's own or send control sequences.
        def forging():
            fake.manifest_status = 500
            fake.error_message = "oops\nsynced oci://evil as mlp:9\x1b[2J"
        err = refused("HTTP 500: oops", forging)
        assert "\nsynced oci://evil" not in err and "\x1b" not in err, repr(err)

        # Documents nested 300,000 deep, where the manifest's config and the
        # config's settings belong: refused by their depth before they are
        # built (once a SIGSEGV: the DOM's copy recursed once a level).
        def nested_manifest():
            fake.manifest_raw = json.dumps(fake.manifest).replace(
                json.dumps(fake.manifest["config"]), NESTING_BOMB).encode()

        def nested_settings():
            fake.set_config_bytes(('{"name": "mlp", "version": 7, "package_model": "", "settings": ' +
                                   NESTING_BOMB + '}').encode())

        refused("the manifest nests deeper than 32 levels at byte", nested_manifest)
        refused("the config nests deeper than 32 levels at byte", nested_settings)

        # A repository of 100,000 tags, synced whole: refused at once (it
        # kept a sync walking one tag after another for minutes).
        def many_tags():
            fake.tags = [f"t{i}" for i in range(100_000)]
        refused("names 100000 tags, more than the 1000", many_tags,
                source=f"oci://127.0.0.1:{fake.port}/models/mlp")
    finally:
        fake.close()


def start_following(work, name, fake, extra=""):
    """A daemon on a fresh store whose [[sync]] follows `fake`'s mlp:v7;
    its store, log and process."""
    store, config = os.path.join(work, f"device-{name}"), os.path.join(work, f"{name}.toml")
    with open(config, "w") as f:
        f.write(f'[[sync]]\nsource = "oci://127.0.0.1:{fake.port}/models/mlp:v7"\n{extra}')
    log_path = os.path.join(work, f"{name}.log")
    daemon, port = start_daemon(store, log_path, "--config", config)
    return store, log_path, daemon, port


def daemon_stops_during_a_silent_sync(work):
    """A daemon stopped while its [[sync]] waits on a registry that sends
    nothing ends at once (not at the sync's 60 s timeout), and the sync it
    cut short is no failure of the registry's."""
    fake = FakeRegistry(open(os.path.join(TESTDATA, "mlp.pt2"), "rb").read())
    fake.hang = True
    try:
        store, log_path, daemon, _ = start_following(work, "stop", fake, "timeout_s = 60\n")
        time.sleep(1.5)  # the sync waits on the silent registry
        started = time.time()
        daemon.terminate()
        daemon.wait(timeout=50)
        took = time.time() - started
        assert took < 20, f"the daemon took {took:.1f} s to stop:\n" + open(log_path).read()[-3000:]
        events = run(store, "events").stdout
        assert "daemon_stopped" in events and "sync_failed" not in events, events
        print(f"stopped in {took:.1f} s while its sync waited on a silent registry (timeout 60 s)")
    finally:
        fake.close()


def daemon_survives_a_nesting_bomb(work):
    """A daemon whose [[sync]] source serves a manifest nested 300,000 deep
    starts, records the sync as failed with the reason, and serves."""
    fake = FakeRegistry(open(os.path.join(TESTDATA, "mlp.pt2"), "rb").read())
    fake.manifest_raw = json.dumps(fake.manifest).replace(json.dumps(fake.manifest["config"]), NESTING_BOMB).encode()
    try:
        store, log_path, daemon, port = start_following(work, "bomb", fake)
        try:
            wait_for("the failed sync recorded", lambda: "sync_failed" in run(store, "events").stdout, log_path, 120)
            assert daemon.poll() is None, open(log_path).read()[-3000:]
            assert call(port, "/v2/health/live")[0] == 200
            events = run(store, "events").stdout
            assert "nests deeper than 32 levels" in events, events
            print("a [[sync]] source with a manifest nested 300,000 deep: sync_failed, the daemon serving")
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    finally:
        fake.close()


def main():
    work = tempfile.mkdtemp()
    try:
        resume_and_refuse(work)
        basic_auth(work)
        tls_registry(work)
        push_sync_serve(work)
        oras_interop(work)
        daemon_follows_tag(work)
        daemon_stops_during_a_silent_sync(work)
        daemon_survives_a_nesting_bomb(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("oci sync: pushed, synced, served; resumed; lies and failures refused with the store unchanged")


if __name__ == "__main__":
    main()
