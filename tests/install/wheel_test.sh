#!/usr/bin/env bash
# The install a user does, end to end: build the wheel from this checkout,
# install it into a fresh venv in a temporary folder, then, with the
# checkout, its build folders and the developer venv hidden (a private mount
# namespace lays empty folders over them) and as an unprivileged user when
# the test runs as root:
#   aotid doctor passes every check; an empty store directory made for the
#   service (as systemd's StateDirectory= does) passes it too;
#   the exporter, imported from the install, exports the demo model;
#   aotid add, then aotid serve, from another working directory, build
#   that program and a package of C++ source with the installed torch;
#   answers over HTTP equal eager PyTorch on the same inputs;
# and `aotid service install --dry-run` writes units and plists with the
# install's paths that pass their checks (service_files_test.sh), and the
# user service installs, serves and stops under a real systemd user manager
# (user_service_test.sh).
#
#   wheel_test.sh CHECKOUT DEV_PYTHON TESTDATA
set -euo pipefail
src="$(cd "$1" && pwd)"
dev_python="$2"
testdata="$3"
say() { printf '[wheel] %s\n' "$*"; }

# Under /opt as root: where a system service can read an install (the
# service files test below asks for one).
parent=/tmp
if [[ $(id -u) -eq 0 ]]; then parent=/opt; fi
work="$(mktemp -d "$parent/aotid-wheel-test.XXXXXX")"
chmod 0755 "$work"
pid_file="$work/cwd/serve.pid"
cleanup() {
  if [[ -s "$pid_file" ]]; then kill -9 "$(cat "$pid_file")" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The wheel, built as `pip install .` would, without build isolation (the
#    dev venv has the build backend and torch; a user's pip fetches them).
say "building the wheel"
wheel="$("$src/scripts/build_wheel.sh" "$src" "$dev_python" "$work/dist")"
say "built $(basename "$wheel")"

# 2. A fresh venv, from a Python the unprivileged user can run.
run_as=()
if [[ $(id -u) -eq 0 ]]; then run_as=(setpriv --reuid=65534 --regid=65534 --clear-groups --); fi
base="$("$dev_python" -c 'import sys; print(sys._base_executable)')"
# Root's own Python (pyenv's under /root, say) may be closed to others.
if [[ ${#run_as[@]} -gt 0 && -x /usr/bin/python3 ]]; then base=/usr/bin/python3; fi
"$base" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel" >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; exit 1; }
say "installed into $work/venv with $("$work/venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
cp "$testdata/mlp_src.pt2" "$testdata/cases.json" "$work/"
mkdir -p "$work/home" "$work/cwd" "$work/state"
[[ ${#run_as[@]} -eq 0 ]] || chown 65534:65534 "$work/home" "$work/cwd" "$work/state"

# 3. The rest sees neither the checkout nor the dev venv.
dev_cache="$(dirname "$(realpath "$("$dev_python" -c 'import sys; print(sys.prefix)')")")"
port="$("$dev_python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export work port src dev_cache pid_file
export run_as_text="${run_as[*]}"
unshare --mount --propagation private bash -euo pipefail -c '
  mount -t tmpfs -o size=1m,mode=0755 none "$src"
  mount -t tmpfs -o size=1m,mode=0755 none "$dev_cache"
  exec $run_as_text env -i PATH="$work/venv/bin:/usr/bin:/bin" HOME="$work/home" LANG=C.UTF-8 \
    work="$work" port="$port" pid_file="$pid_file" bash -euo pipefail -c "
  cd \"\$work/cwd\"
  say() { printf \"[wheel] %s\n\" \"\$*\"; }
  say \"as \$(id -un), aotid is \$(command -v aotid)\"
  aotid doctor > doctor.txt || { cat doctor.txt; exit 1; }
  cat doctor.txt
  grep -q \"^OK    python .*\$work/venv/bin/python3\" doctor.txt
  grep -q \"^OK    compile worker .*\$work/venv/lib/aotid/python/aotid_worker/compile.py\" doctor.txt
  grep -q \"^OK    torch runtime .*\$work/venv/lib/aotid/libaotid_torch.so\" doctor.txt
  aotid --store \"\$work/state\" doctor | grep -q \"^OK    store .*(empty\"
  python -W ignore -m aotid_export aotid_export.demo:make_model --input features=float32[1,4] \
    --output-name probabilities --dynamic-batch -o demo.pt2
  aotid --store \"\$work/state\" add demo.pt2 --name demo
  aotid --store \"\$work/state\" add \"\$work/mlp_src.pt2\" --name mlp
  aotid --store \"\$work/state\" serve --listen 127.0.0.1:\$port > serve.log 2>&1 &
  echo \$! > \"\$pid_file\"
  python - <<PY || { cat serve.log; exit 1; }
import json, time, urllib.request, torch
from aotid_export.demo import make_model
base = \"http://127.0.0.1:\$port\"
def call(path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)
deadline = time.time() + 600
while True:
    try:
        if all(call(f\"/v2/models/{m}/ready\")[\"ready\"] for m in (\"demo\", \"mlp\")):
            break
    except Exception:
        pass
    if time.time() > deadline:
        raise SystemExit(\"the models were not ready within 600 s\")
    time.sleep(1)
x = torch.randn(3, 4, generator=torch.Generator().manual_seed(7))
got = call(\"/v2/models/demo/infer\", {\"inputs\": [{\"name\": \"features\", \"datatype\": \"FP32\", \"shape\": [3, 4], \"data\": x.flatten().tolist()}]})
want = make_model().eval()(x)
torch.testing.assert_close(torch.tensor(got[\"outputs\"][0][\"data\"]).reshape(3, 3), want, rtol=1e-4, atol=1e-5)
case = json.load(open(\"\$work/cases.json\"))[\"mlp\"][0]
got = call(\"/v2/models/mlp/infer\", {\"inputs\": case[\"inputs\"]})
torch.testing.assert_close(torch.tensor(got[\"outputs\"][0][\"data\"]), torch.tensor(case[\"outputs\"][0][\"data\"]), rtol=1e-4, atol=1e-5)
print(\"[wheel] demo and mlp (C++ source) answer as eager PyTorch does\")
PY
  kill \$(cat \"\$pid_file\")
  for i in \$(seq 100); do kill -0 \$(cat \"\$pid_file\") 2>/dev/null || break; sleep 0.1; done
"
'
# 4. The service files this install writes (as root: the system's too).
"$(dirname "$0")/service_files_test.sh" "$work/venv/bin/aotid" "$(dirname "$0")/.." "$dev_python"

# 5. The user service for real, from this install, on the store above
#    (its models are built already), under a systemd user manager.
if [[ $(id -u) -eq 0 ]]; then
  "$(dirname "$0")/user_service_test.sh" "$work/venv/bin/aotid" "$work/state" "$port" "$work/venv/bin/python"
else
  echo "[wheel] FAIL: the user service under a real systemd needs root here (to start the user manager in a mount namespace)"
  exit 1
fi
say "ok"
