"""The Kubernetes manifests of deploy/, checked without a cluster.

1. Every Kubernetes resource (the edge DaemonSet and what it needs) passes
   `kubernetes-validate --strict` against the API schemas of the oldest and
   the newest Kubernetes this supports: an unknown or misplaced key fails.
2. KServe's resources, which those schemas do not know, are built into the
   KServe SDK's own models (V1alpha1ClusterServingRuntime,
   V1beta1InferenceService, and the Kubernetes models they hold), key by
   key: a key that no model has is an error here, where the SDK would drop
   it without a word, and a required field missing is the SDK's error.
3. What the deployment relies on: the runtime's container, arguments,
   port, probes (a startup budget that covers aotid's own build timeout),
   security context and store volume; the InferenceService naming it; the
   DaemonSet's hostPath store, loopback listening that its probes reach,
   token and registry Secrets where its aotid.toml looks for them, a rolling
   update that drains; each kustomization listing what it should.
4. The checker itself: a manifest with a misspelt key, or without a field
   this test requires, is refused.

    validate_manifests.py SOURCE_DIR   (run by tests/deploy/in_venv.sh)
"""
import copy
import glob
import os
import re
import subprocess
import sys
import tomllib

import kserve
import kubernetes.client
import yaml

ROOT = sys.argv[1]
DEPLOY = os.path.join(ROOT, "deploy")
KUBE_VERSIONS = ["1.30.0", "1.37.0"]
KSERVE_KINDS = {("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
                ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService"}
KUSTOMIZE = ("kustomize.config.k8s.io/v1beta1", "Kustomization")
# The image's config (deploy/image/): where its aotid keeps the store.
IMAGE_STORE = "/var/lib/aotid"
IMAGE_UID = 65532

with open(os.path.join(ROOT, "configs", "aotid.toml"), "rb") as f:
    DEFAULTS = tomllib.load(f)
BUILD_TIMEOUT_S = DEFAULTS["build"]["timeout_s"]
DRAIN_S = DEFAULTS["server"]["drain_timeout_s"]


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def manifests():
    """Every YAML file under deploy/ but the image's folder (another's), with
    its documents."""
    out = {}
    for path in sorted(glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True)):
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(os.path.join("deploy", "image") + os.sep):
            continue
        out[rel] = load(path)
    return out


# -- 2. KServe's resources against the SDK's models -------------------------

def model_class(name):
    cls = getattr(kserve, name, None) or getattr(kubernetes.client, name, None)
    if cls is None or not hasattr(cls, "openapi_types"):
        raise AssertionError(f"no model {name} in kserve or kubernetes.client")
    return cls


PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def build(value, type_name, where, errors):
    """The SDK's object for `value` (YAML, camelCase keys) as `type_name`
    ('V1Container', 'list[V1Volume]', 'dict(str, str)', 'str', ...), with
    an error in `errors` for each key or value no model accepts."""
    if value is None:
        return None
    m = re.fullmatch(r"[Ll]ist\[(.+)\]", type_name)
    if m:
        if not isinstance(value, list):
            errors.append(f"{where}: a list expected, got {type(value).__name__}")
            return None
        return [build(v, m.group(1), f"{where}[{i}]", errors) for i, v in enumerate(value)]
    m = re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name)
    if m:
        if not isinstance(value, dict):
            errors.append(f"{where}: a map expected, got {type(value).__name__}")
            return None
        inner = m.group(1) or m.group(2)
        return {k: build(v, inner, f"{where}.{k}", errors) for k, v in value.items()}
    if type_name in ("object", "ResourceQuantity"):  # int-or-string, quantities, free-form
        return value
    if type_name in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[type_name]) and not (type_name != "bool" and isinstance(value, bool))
        if not ok:
            errors.append(f"{where}: {type_name} expected, got {value!r}")
        return value
    cls = model_class(type_name)
    if not isinstance(value, dict):
        errors.append(f"{where}: a {type_name} (a map) expected, got {value!r}")
        return None
    by_key = {key: attr for attr, key in cls.attribute_map.items()}
    kwargs = {}
    for key, v in value.items():
        if key not in by_key:
            errors.append(f"{where}.{key}: unknown to {type_name} (it has {sorted(by_key)})")
            continue
        attr = by_key[key]
        kwargs[attr] = build(v, cls.openapi_types[attr], f"{where}.{key}", errors)
    try:
        return cls(**kwargs)
    except ValueError as e:  # a required field missing, or a value out of its enum
        errors.append(f"{where}: {type_name}: {e}")
        return None


def to_yaml(obj):
    """The SDK object as YAML's keys and values, fields left unset (None, or
    a default empty name) left out."""
    if isinstance(obj, list):
        return [to_yaml(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_yaml(v) for k, v in obj.items()}
    if hasattr(obj, "openapi_types"):
        out = {}
        for attr, key in obj.attribute_map.items():
            v = getattr(obj, attr)
            if v is not None and v != "":
                out[key] = to_yaml(v)
        return out
    return obj


def kserve_errors(doc, where):
    model = KSERVE_KINDS[(doc.get("apiVersion"), doc.get("kind"))]
    errors = []
    obj = build(doc, model, where, errors)
    if obj is not None and not errors:
        # The SDK's own serialization gives back what was written.
        back = to_yaml(obj)
        if back != doc:
            errors.append(f"{where}: the SDK's {model} serializes to something else:\n{back}\n!=\n{doc}")
    return errors


# -- 1. Kubernetes' own resources -------------------------------------------

def kube_validate(rel, version):
    """kubernetes-validate --strict on one file; every resource of it must
    pass (a kind without a schema is only a warning there, so it counts as
    a failure here)."""
    exe = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    p = subprocess.run([exe, "--strict", "-k", version, os.path.join(ROOT, rel)], capture_output=True,
                       text=True, timeout=120)
    lines = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    bad = [line for line in lines if not line.startswith("INFO ") or " passed for resource " not in line]
    return p.returncode, lines, bad


# -- 3. What the deployment relies on ---------------------------------------

def one(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    assert len(found) == 1, f"one {kind} expected, found {len(found)}"
    return found[0]


def quantity(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    assert m, f"not a quantity: {q!r}"
    return float(m.group(1)) * units.get(m.group(2), 1)


def check_security(c, who, uid=IMAGE_UID):
    sc = c.get("securityContext", {})
    assert sc.get("runAsNonRoot") is True and sc.get("runAsUser") == uid, f"{who}: not the image's non-root uid"
    assert sc.get("readOnlyRootFilesystem") is True, f"{who}: root filesystem writable"
    assert sc.get("allowPrivilegeEscalation") is False, f"{who}: privilege escalation allowed"
    assert sc.get("capabilities", {}).get("drop") == ["ALL"] and not sc["capabilities"].get("add"), \
        f"{who}: capabilities not all dropped"


def check_resources(c, who):
    res = c.get("resources", {})
    for r in ("cpu", "memory"):
        assert r in res.get("requests", {}), f"{who}: no {r} request"
    assert "memory" in res.get("limits", {}), f"{who}: no memory limit"
    for r, lim in res["limits"].items():
        if r in res["requests"]:
            assert quantity(lim) >= quantity(res["requests"][r]), f"{who}: {r} limit below its request"


def check_probes(c, who, port, host=None):
    paths = {"livenessProbe": "/v2/health/live", "readinessProbe": "/v2/health/ready",
             "startupProbe": "/v2/health/ready"}
    for probe, path in paths.items():
        get = c.get(probe, {}).get("httpGet", {})
        assert get.get("path") == path and get.get("port") == port, f"{who}: {probe} is not GET {path} on {port}"
        assert get.get("host") == host, f"{who}: {probe} asks host {get.get('host')}, not {host}"
    s = c["startupProbe"]
    budget = s.get("initialDelaySeconds", 0) + s.get("periodSeconds", 10) * s.get("failureThreshold", 3)
    # The kubelet must not restart a build that aotid itself still allows
    # (build.timeout_s), plus a minute to start and load it.
    assert budget >= BUILD_TIMEOUT_S + 60, f"{who}: startup budget {budget} s < build.timeout_s {BUILD_TIMEOUT_S} + 60"
    return budget


def mounts_of(c):
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def check_runtime(rt):
    spec = rt["spec"]
    assert {"name": "pytorch-aoti", "version": "1", "autoSelect": True}.items() <= \
        spec["supportedModelFormats"][0].items(), spec["supportedModelFormats"]
    assert spec["protocolVersions"] == ["v2"] and spec["multiModel"] is False
    [c] = spec["containers"]
    assert c["name"] == "kserve-container", "KServe finds the serving container by this name"
    assert c["image"].startswith("registry.example.com/aotid:"), c["image"]
    assert c["args"] == ["serve", "--model-dir", "/mnt/models", "--model-name", "{{.Name}}",
                         "--listen", "0.0.0.0:8080", "--grpc-listen", "0.0.0.0:9000"], c["args"]
    assert "command" not in c, "the image's entrypoint runs aotid"
    # KServe's names: REST on http1, gRPC on h2c, each where aotid listens.
    assert c["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"},
                          {"name": "h2c", "containerPort": 9000, "protocol": "TCP"}], c["ports"]
    assert spec["annotations"] == {"prometheus.kserve.io/port": "8080", "prometheus.kserve.io/path": "/metrics"}
    check_security(c, "kserve-container")
    check_resources(c, "kserve-container")
    budget = check_probes(c, "kserve-container", 8080)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = mounts_of(c)
    for path in (IMAGE_STORE, "/tmp"):  # writable beneath a read-only root
        assert path in mounts and "emptyDir" in volumes[mounts[path]["name"]], f"no emptyDir at {path}"
        assert not mounts[path].get("readOnly"), path
    assert {"name": "TMPDIR", "value": "/tmp"} in c["env"]
    return budget


def check_isvc(isvc, rt):
    p = isvc["spec"]["predictor"]
    m = p["model"]
    assert m["modelFormat"]["name"] == rt["spec"]["supportedModelFormats"][0]["name"]
    assert m["runtime"] == rt["metadata"]["name"] and m["protocolVersion"] == "v2"
    assert re.match(r"(s3|gs|pvc|https)://", m["storageUri"]), m["storageUri"]
    assert p["terminationGracePeriodSeconds"] > DRAIN_S, "the kubelet would kill aotid while it drains"


def check_daemonset(ds, cm, docs_by_kind):
    spec = ds["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate",
                                      "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}, spec["updateStrategy"]
    pod = spec["template"]["spec"]
    [c] = pod["containers"]
    check_security(c, "aotid")
    check_resources(c, "aotid")
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == IMAGE_UID
    assert pod["serviceAccountName"] == one(docs_by_kind, "ServiceAccount")["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = mounts_of(c)
    # The config: the ConfigMap's aotid.toml, as --config names it.
    args = c["args"]
    assert args[0] == "--config" and args[2:] == ["serve"], args
    config_dir, config_file = os.path.split(args[1])
    assert volumes[mounts[config_dir]["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    toml = tomllib.loads(cm["data"][config_file])
    drain = toml["server"].get("drain_timeout_s", DRAIN_S)
    assert pod["terminationGracePeriodSeconds"] >= drain + 30, "the grace period must outlast aotid's drain"
    # The store on the node.
    store = toml["store"]["path"]
    assert volumes[mounts[store]["name"]]["hostPath"] == {"path": store, "type": "DirectoryOrCreate"}
    assert not mounts[store].get("readOnly")
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    # Loopback on the node's network, the probes reaching it there; the
    # Host check lets the kubelet's Host (127.0.0.1) through.
    host, port = toml["server"]["listen"].rsplit(":", 1)
    assert pod["hostNetwork"] is True and host == "127.0.0.1"
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert isinstance(toml["server"]["allowed_hosts"], list)
    budget = check_probes(c, "aotid", int(port), host="127.0.0.1")
    # The token guards the repository routes only, so that the probes need
    # none; its file and the registry's credentials come from the Secrets.
    assert toml["server"]["token_scope"] == "repository"
    secrets = {d["metadata"]["name"]: d for d in docs_by_kind if d["kind"] == "Secret"}

    def secret_file(path):
        d, name = os.path.split(path)
        src = volumes[mounts[d]["name"]]["secret"]
        assert mounts[d].get("readOnly") is True
        assert src["defaultMode"] == 0o400, oct(src["defaultMode"])
        secret = secrets[src["secretName"]]
        assert name in secret["stringData"], (name, secret)
        return secret

    secret_file(toml["server"]["token_file"])
    [sync] = toml["sync"]
    assert sync["source"].startswith("oci://") and ":" in sync["source"].rsplit("/", 1)[1], "a tag to follow"
    assert secret_file(sync["credentials"])["type"] == "kubernetes.io/dockerconfigjson"
    # The init container that gives the hostPath directory to aotid's uid
    # touches that directory only.
    [init] = pod["initContainers"]
    assert list(mounts_of(init)) == [store] and store in init["command"][-1]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    return budget


def check_kustomization(folder, docs, kinds_left_out):
    """A kustomization of known keys, listing every manifest of its folder
    but those left out on purpose, each of which exists."""
    k = docs[0]
    assert (k["apiVersion"], k["kind"]) == KUSTOMIZE
    assert set(k) <= {"apiVersion", "kind", "resources", "images"}, set(k)
    here = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, folder, "*.yaml")))
    want = [f for f in here if f != "kustomization.yaml" and f not in kinds_left_out]
    assert sorted(k["resources"]) == want, (k["resources"], want)
    for img in k["images"]:
        assert set(img) <= {"name", "newName", "newTag", "digest"}, img
    return [os.path.join(folder, r) for r in k["resources"]]


def checker_refuses(doc, change, what):
    bad = copy.deepcopy(doc)
    change(bad)
    errors = kserve_errors(bad, "mutated")
    assert errors and any(what in e for e in errors), (what, errors)
    return " ".join(errors[0].split())


def main():
    found = manifests()
    names = sorted(found)
    assert "deploy/kserve/cluster-serving-runtime.yaml" in names and "deploy/edge/daemonset.yaml" in names, names
    print(f"{len(names)} manifests: {', '.join(names)}")

    # 1 and 2: every document of every file.
    failures = []
    for rel, docs in found.items():
        kinds = {(d.get("apiVersion"), d.get("kind")) for d in docs}
        native = [d for d in docs if (d.get("apiVersion"), d.get("kind")) not in set(KSERVE_KINDS) | {KUSTOMIZE}]
        for i, d in enumerate(docs):
            if (d.get("apiVersion"), d.get("kind")) in KSERVE_KINDS:
                errors = kserve_errors(d, f"{rel}[{i}]")
                failures += errors
                if not errors:
                    print(f"ok: {rel}: {d['kind']} {d['metadata']['name']} is the kserve SDK's "
                          f"{KSERVE_KINDS[(d['apiVersion'], d['kind'])]}, every key known")
        if native:
            assert len(native) == len(docs), f"{rel}: Kubernetes and other resources in one file"
            for version in KUBE_VERSIONS:
                rc, lines, bad = kube_validate(rel, version)
                if rc != 0 or bad or len(lines) != len(docs):
                    failures.append(f"{rel} against Kubernetes {version} (exit {rc}):\n  " + "\n  ".join(lines))
            print(f"ok: {rel}: {', '.join(d['kind'] for d in docs)} pass kubernetes-validate --strict "
                  f"against {' and '.join(KUBE_VERSIONS)}")
        elif KUSTOMIZE in kinds:
            print(f"ok: {rel}: a kustomization (checked below)")
    assert not failures, "\n".join(failures)

    # 3: what the deployment relies on.
    rt = one(found["deploy/kserve/cluster-serving-runtime.yaml"], "ClusterServingRuntime")
    budget = check_runtime(rt)
    print(f"ok: runtime: kserve-container, v2, {{{{.Name}}}} and /mnt/models in its args, http1 on 8080, h2c (gRPC) on 9000, "
          f"Prometheus annotations, non-root read-only, startup budget {budget} s >= build.timeout_s "
          f"{BUILD_TIMEOUT_S} + 60")
    check_isvc(one(found["deploy/kserve/inferenceservice.yaml"], "InferenceService"), rt)
    print("ok: the InferenceService names the runtime and its format, v2, a storage URI")
    edge = [d for rel, docs in found.items() if rel.startswith("deploy/edge/") for d in docs]
    budget = check_daemonset(one(edge, "DaemonSet"), one(edge, "ConfigMap"), edge)
    print(f"ok: DaemonSet: hostPath store, loopback on the node's network with probes there, token and registry "
          f"Secrets where aotid.toml looks, RollingUpdate 1 at a time without surge, grace beyond the drain, "
          f"startup budget {budget} s")
    listed = check_kustomization("deploy/kserve", found["deploy/kserve/kustomization.yaml"],
                                 {"inferenceservice.yaml"})
    listed += check_kustomization("deploy/edge", found["deploy/edge/kustomization.yaml"], {"secrets.example.yaml"})
    print(f"ok: the kustomizations list {', '.join(listed)}, every one validated above")

    # 4: the checker refuses what it should.
    said = checker_refuses(rt, lambda d: d["spec"]["containers"][0].update(readinesProbe={}), "readinesProbe")
    print(f"ok: a misspelt key is refused: {said[:120]}")
    said = checker_refuses(rt, lambda d: d["spec"]["supportedModelFormats"][0].update(autoselect=True),
                           "autoselect")
    print(f"ok: a key of the wrong case is refused: {said[:120]}")
    said = checker_refuses(rt, lambda d: d["spec"]["containers"][0].pop("name"), "name")
    print(f"ok: a required field missing is refused: {said[:120]}")
    said = checker_refuses(rt, lambda d: d["spec"].update(multiModel="false"), "bool expected")
    print(f"ok: a value of the wrong type is refused: {said[:120]}")
    bad = copy.deepcopy(rt)
    bad["spec"]["containers"][0]["startupProbe"]["failureThreshold"] = 30
    try:
        check_runtime(bad)
    except AssertionError as e:
        print(f"ok: a startup budget of 5 min is refused: {e}")
    else:
        raise AssertionError("a 5 min startup budget passed")
    print("PASS")


if __name__ == "__main__":
    main()
