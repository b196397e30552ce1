#!/usr/bin/env bash
# The container image, end to end, with no container engine:
#   deploy/image/build.sh builds it (an OCI layout, prints its size);
#   skopeo pushes it to Debian's docker-registry on a loopback port and
#   pulls it back into another layout, the same layers by digest;
#   the pulled image's config says: a non-root user, aotid's entrypoint,
#   AOTID_CONFIG, port 8080, the state volume, SIGTERM;
#   umoci unpacks it, and its entrypoint runs in the unpacked root filesystem
#   in private namespaces (bwrap), as the image's user with no other uid
#   mapped, its tini as pid 1, with a model folder mounted read-only at /mnt/models
#   and a writable /var/lib/aotid, as KServe mounts them: it builds the
#   exported program with the image's g++ and torch, answers as eager
#   PyTorch does on the same inputs (the same .pt2 loaded with
#   torch.export.load), and exits 0 soon after SIGTERM;
#   a second start on the same /var/lib/aotid (the build kept) is ready
#   sooner. Both times to ready, and the build's, are printed.
#
#   image_test.sh CHECKOUT DEV_PYTHON TESTDATA
set -euo pipefail
src="$(cd "$1" && pwd)"
dev_python="$2"
testdata="$3"
say() { printf '[image-test] %s\n' "$*"; }
fail() { printf '[image-test] FAIL: %s\n' "$*"; exit 1; }

# Root: the image's layers keep their owners (the state directory is
# uid 65532's), and the serve runs as that uid. Not skipped: a skip would
# read as a pass.
[[ $(id -u) -eq 0 ]] || fail "this test needs root (build.sh writes layers with their owners; the serve runs as uid 65532)"
for tool in skopeo umoci bwrap docker-registry mmdebstrap curl setpriv; do
  command -v "$tool" >/dev/null || fail "$tool is missing (./dev installs it: APT_PACKAGES)"
done

work="$(mktemp -d /tmp/aotid-image-test.XXXXXX)"
chmod 0755 "$work"
registry_pid=""
serve_pid=""
cleanup() {
  [[ -n $serve_pid ]] && kill -9 "$serve_pid" 2>/dev/null || true
  [[ -n $registry_pid ]] && kill "$registry_pid" 2>/dev/null && wait "$registry_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { "$dev_python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
since() { "$dev_python" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

# 1. The image.
t=$(now)
"$src/deploy/image/build.sh" --python "$dev_python" --out "$work/oci" --tag test 2>&1 | tee "$work/build.log"
build_s=$(since "$t")
grep -q '^\[image\] size: [0-9]* bytes compressed' "$work/build.log" || fail "build.sh printed no size"

# 2. Pushed to a registry and pulled back.
rport=$(free_port)
cat > "$work/registry.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$rport
EOF
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for i in $(seq 100); do
  curl -sf "http://127.0.0.1:$rport/v2/" >/dev/null && break
  kill -0 "$registry_pid" 2>/dev/null || { cat "$work/registry.log"; fail "the registry exited"; }
  [[ $i -eq 100 ]] && fail "the registry did not answer within 10 s"
  sleep 0.1
done
skopeo copy -q --dest-tls-verify=false "oci:$work/oci:test" "docker://127.0.0.1:$rport/aotid:test"
skopeo copy -q --src-tls-verify=false "docker://127.0.0.1:$rport/aotid:test" "oci:$work/pulled:test"
kill "$registry_pid"; wait "$registry_pid" 2>/dev/null || true; registry_pid=""
say "pushed to and pulled from docker-registry on 127.0.0.1:$rport"

# 3. The pulled image: its layers are the built ones, its config is as
#    documented; umoci unpacks it (as root: owners kept).
"$dev_python" - "$work/oci" "$work/pulled" <<'PY'
import json, os, sys
def image(layout):
    blob = lambda d: os.path.join(layout, "blobs", *d["digest"].split(":"))
    index = json.load(open(os.path.join(layout, "index.json")))
    [desc] = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == "test"]
    manifest = json.load(open(blob(desc)))
    return manifest, json.load(open(blob(manifest["config"])))
built, built_config = image(sys.argv[1])
pulled, config = image(sys.argv[2])
assert [l["digest"] for l in pulled["layers"]] == [l["digest"] for l in built["layers"]], (built, pulled)
assert len(pulled["layers"]) == 3, pulled["layers"]
assert config["rootfs"]["diff_ids"] == built_config["rootfs"]["diff_ids"]
c = config["config"]
assert c["User"] == "65532:65532", c
assert c["Entrypoint"] == ["/usr/bin/tini", "--", "/opt/aotid/bin/aotid"] and c["Cmd"] == ["serve"], c
assert "AOTID_CONFIG=/etc/aotid/aotid.toml" in c["Env"], c["Env"]
assert list(c["ExposedPorts"]) == ["8080/tcp"], c
assert list(c["Volumes"]) == ["/var/lib/aotid"], c
assert c["StopSignal"] == "SIGTERM", c
assert config["os"] == "linux" and config["architecture"] == "amd64", config
print("[image-test] pulled: the same 3 layers; user 65532, entrypoint, env, port, volume, SIGTERM")
PY
umoci unpack --image "$work/pulled:test" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"
chmod 0755 "$work/bundle"
[[ $(stat -c %u:%g "$rootfs/var/lib/aotid") == 65532:65532 ]] || fail "/var/lib/aotid is not uid 65532's"
grep -qx 'listen = "0.0.0.0:8080"' "$rootfs/etc/aotid/aotid.toml" || fail "the config does not listen on 0.0.0.0:8080"
grep -qx 'path = "/var/lib/aotid"' "$rootfs/etc/aotid/aotid.toml" || fail "the config's store is not /var/lib/aotid"
# What a runtime runs: the runtime config umoci made from the image's.
mapfile -t process < <("$dev_python" - "$work/bundle/config.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["process"]
assert (p["user"]["uid"], p["user"]["gid"]) == (65532, 65532), p["user"]
print(p["cwd"]); print(" ".join(p["env"])); print(" ".join(p["args"]))
PY
)
cwd="${process[0]}"
read -r -a image_env <<<"${process[1]}"
read -r -a image_args <<<"${process[2]}"
[[ ${image_args[*]} == "/usr/bin/tini -- /opt/aotid/bin/aotid serve" ]] || fail "the image runs ${image_args[*]}"

# 4. Its entrypoint in the unpacked root filesystem, as a pod runs it.
mkdir -p "$work/models" "$work/state"
cp "$testdata/mlp.pt2" "$work/models/"
chown 65532:65532 "$work/state"
port=$(free_port)
# As uid 65532 outside too: the sandbox's user namespace maps that uid alone.
in_image() { # runs a command of the image's, in the image
  setpriv --reuid=65532 --regid=65532 --clear-groups -- \
    bwrap --unshare-user --uid 65532 --gid 65532 --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup-try \
      --ro-bind "$rootfs" / --ro-bind "$work/models" /mnt/models --bind "$work/state" /var/lib/aotid \
      --proc /proc --dev /dev --tmpfs /tmp --die-with-parent --as-pid-1 --chdir "$cwd" --clearenv \
      "${env_args[@]}" "$@"
}
env_args=(--setenv HOME /var/lib/aotid)
for e in "${image_env[@]}"; do env_args+=(--setenv "${e%%=*}" "${e#*=}"); done
# Single-model mode, as KServe starts a model server: no `aotid add`.
serve_args=("${image_args[@]}" --model-dir /mnt/models --model-name demo --listen "127.0.0.1:$port")

descendant() { # PID NAME: the first process called NAME below PID, breadth first
  local queue=("$1") p c
  while ((${#queue[@]})); do
    p="${queue[0]}"
    queue=("${queue[@]:1}")
    for c in $(pgrep -P "$p" || true); do
      [[ $(cat "/proc/$c/comm" 2>/dev/null) == "$2" ]] && { echo "$c"; return; }
      queue+=("$c")
    done
  done
}

start_and_answer() { # LABEL TITLE: starts the serve, waits for readiness, checks an answer, stops it
  local label="$1" title="$2" t ready_s
  t=$(now)
  in_image "${serve_args[@]}" >"$work/serve-$label.log" 2>&1 &
  serve_pid=$!
  for i in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
    kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve-$label.log"; fail "$label: aotid exited before it was ready"; }
    if grep -q ' build of .* failed' "$work/serve-$label.log"; then
      cat "$work/serve-$label.log"; find "$work/state/cache" -name '*.failed.log' -exec tail -40 {} \;
      fail "$label: the model's build failed in the image"
    fi
    [[ $i -eq 600 ]] && { cat "$work/serve-$label.log"; fail "$label: not ready within 300 s"; }
    sleep 0.5
  done
  curl -sf "http://127.0.0.1:$port/v2/models/demo/ready" >/dev/null || fail "$label: the model demo is not ready"
  ready_s=$(since "$t")
  # The daemon is uid 65532 on this machine too.
  local aotid_pid
  aotid_pid=$(descendant "$serve_pid" aotid)
  [[ -n $aotid_pid ]] || fail "$label: no aotid process under bwrap"
  # tini is pid 1 in the container, aotid its child.
  [[ $(awk '/^NSpid:/ {print $NF}' "/proc/$aotid_pid/status") != 1 ]] || fail "$label: aotid is pid 1, not tini"
  [[ $(awk '/^Uid:/ {print $2}' "/proc/$aotid_pid/status") == 65532 ]] || fail "$label: aotid is not uid 65532"
  "$dev_python" -W ignore - "$port" "$work/models/mlp.pt2" <<'PY' || { cat "$work/serve-$label.log"; exit 1; }
import json, sys, urllib.request, torch
port, pt2 = sys.argv[1:]
x = torch.randn(3, 8, generator=torch.Generator().manual_seed(11))
body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 8], "data": x.flatten().tolist()}]}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/demo/infer", data=json.dumps(body).encode())
with urllib.request.urlopen(req, timeout=60) as r:
    out = json.load(r)["outputs"][0]
assert out["shape"] == [3, 4], out
want = torch.export.load(pt2).module()(x)
torch.testing.assert_close(torch.tensor(out["data"]).reshape(3, 4), want, rtol=1e-4, atol=1e-5)
PY
  kill -TERM "$aotid_pid"
  local rc=0
  for i in $(seq 150); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$serve_pid" 2>/dev/null && { cat "$work/serve-$label.log"; fail "$label: still running 30 s after SIGTERM"; }
  wait "$serve_pid" || rc=$?
  serve_pid=""
  [[ $rc -eq 0 ]] || { cat "$work/serve-$label.log"; fail "$label: exited $rc after SIGTERM"; }
  say "$title: ready in $ready_s s, answers as eager PyTorch, exits 0 on SIGTERM"
  eval "${label}_s=$ready_s"
}
start_and_answer first "first start (the model is built)"
[[ -n $(find "$work/state" -user 65532 -newer "$work/models/mlp.pt2" -print -quit) ]] ||
  fail "nothing was written to /var/lib/aotid as uid 65532"
start_and_answer restart "restart on the same /var/lib/aotid"
say "timings: image build $build_s s; first start (build of the model) $first_s s; restart with /var/lib/aotid kept $restart_s s"
# The build was kept: the first start built the model, the restart loaded
# it (the times above are printed, not judged: docs/IMAGE.md has them).
grep -q 'build started' "$work/serve-first.log" || { cat "$work/serve-first.log"; fail "the first start built nothing"; }
! grep -q 'build started' "$work/serve-restart.log" ||
  { cat "$work/serve-restart.log"; fail "the restart built the model again: the build was not kept"; }
grep -q "as demo:1, the store's already" "$work/serve-restart.log" ||
  { cat "$work/serve-restart.log"; fail "the restart did not find the model in the store"; }
say "ok"
