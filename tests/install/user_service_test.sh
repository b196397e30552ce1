#!/usr/bin/env bash
# The user service for real: a systemd user manager, started in a private
# mount namespace (this machine's init is not systemd: the namespace gets a
# cgroup2 hierarchy and /run/systemd/system, which is all the manager asks
# for), and `aotid service install --user` into it. Then:
#   the service starts (Type=notify: systemd waits for READY=1) and
#   `aotid service status --user` says it runs and is ready;
#   a model in its store answers as eager PyTorch does;
#   `systemctl --user reload` reloads it (a changed key is named in its log);
#   `systemctl --user stop` stops it with success (exit 0 at SIGTERM);
#   `aotid service uninstall --user` removes the unit and leaves the store.
#
#   user_service_test.sh AOTID STORE PORT PYTHON
# STORE holds a model "demo" (the demo classifier); PYTHON has torch and
# aotid_export.
set -euo pipefail
aotid="$1"
store="$2"
port="$3"
python="$4"
say() { printf '[user service] %s\n' "$*"; }
[[ -x /lib/systemd/systemd ]] || { echo "FAIL: systemd is not installed (Debian: apt install systemd)"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export work aotid store port python
unshare --mount --propagation private bash -euo pipefail -c '
  say() { printf "[user service] %s\n" "$*"; }
  fail() { echo "FAIL: $*"; tail -20 "$work/manager.log" "$work/aotid.log" 2>/dev/null; exit 1; }
  mount -t cgroup2 none /sys/fs/cgroup
  mkdir -p /run/systemd && mount -t tmpfs none /run/systemd && mkdir /run/systemd/system
  export XDG_RUNTIME_DIR="$work/runtime" HOME="$work/home"
  mkdir -m 0700 "$XDG_RUNTIME_DIR" && mkdir "$HOME"
  export AOTID_HOME="$store" AOTID_CONFIG="$work/aotid.toml"
  # Its own log file: this manager has no journal to send it to.
  printf "[server]\nlisten = \"127.0.0.1:%s\"\n[log]\nfile = \"%s\"\n" "$port" "$work/aotid.log" > "$AOTID_CONFIG"
  /lib/systemd/systemd --user > "$work/manager.log" 2>&1 &
  manager=$!
  # On any way out, the service (daemon and runners) goes with its manager:
  # a failed check must not leave them running.
  trap "timeout 10 systemctl --user kill -s KILL aotid.service >/dev/null 2>&1 || true; kill -9 $manager 2>/dev/null || true" EXIT
  for i in $(seq 100); do [[ -S "$XDG_RUNTIME_DIR/systemd/private" ]] && break; sleep 0.1; done
  [[ -S "$XDG_RUNTIME_DIR/systemd/private" ]] || fail "the user manager did not start"
  # The service gets the store and config through the manager, as a user
  # would set them (systemctl --user set-environment, or the unit).
  systemctl --user set-environment AOTID_HOME="$AOTID_HOME" AOTID_CONFIG="$AOTID_CONFIG"

  "$aotid" service install --user > "$work/install.txt" 2>&1 || { cat "$work/install.txt"; fail "service install --user"; }
  cat "$work/install.txt"
  grep -q "^+ systemctl --user restart aotid.service" "$work/install.txt" || fail "install did not start it"
  [[ "$(systemctl --user show -p ActiveState --value aotid.service)" == active ]] || fail "not active after install"
  for i in $(seq 600); do "$aotid" service status --user > "$work/status.txt" 2>&1 && break; sleep 0.2; done
  cat "$work/status.txt"
  grep -q "^service: running" "$work/status.txt" || fail "status does not say it runs"
  grep -q "^  ready: yes" "$work/status.txt" || fail "status does not say it is ready"

  "$python" - <<PY || fail "the service answered wrong"
import json, urllib.request, torch
from aotid_export.demo import make_model
x = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 4], "data": x.flatten().tolist()}]}
req = urllib.request.Request("http://127.0.0.1:$port/v2/models/demo/infer", data=json.dumps(body).encode())
got = json.load(urllib.request.urlopen(req, timeout=60))
torch.testing.assert_close(torch.tensor(got["outputs"][0]["data"]).reshape(2, 3), make_model().eval()(x), rtol=1e-4, atol=1e-5)
print("[user service] the service answers as eager PyTorch does")
PY

  printf "[server]\nlisten = \"127.0.0.1:%s\"\n[log]\nfile = \"%s\"\nlevel = \"debug\"\n" "$port" "$work/aotid.log" > "$AOTID_CONFIG"
  systemctl --user reload aotid.service || fail "reload"
  # ExecReload only signals: the unit is "reloading" (RELOADING=1) until the
  # daemon has re-read its config and says READY=1 again.
  state=""
  for _ in $(seq 1 300); do
    state="$(systemctl --user show -p ActiveState --value aotid.service)"
    [[ $state == reloading ]] || break
    sleep 0.1
  done
  [[ $state == active ]] || fail "not active after reload ($state)"
  pid="$(systemctl --user show -p MainPID --value aotid.service)"
  systemctl --user stop aotid.service || fail "stop"
  [[ "$(systemctl --user show -p Result --value aotid.service)" == success ]] ||
    fail "stop result: $(systemctl --user show -p Result --value aotid.service)"
  ! kill -0 "$pid" 2>/dev/null || fail "pid $pid still runs"
  grep -q "reloaded $AOTID_CONFIG: applied log.level" "$work/aotid.log" ||
    fail "the reload is not in the service log"

  "$aotid" service uninstall --user > "$work/uninstall.txt" 2>&1 || { cat "$work/uninstall.txt"; fail "uninstall"; }
  grep -q "the store stays in $AOTID_HOME" "$work/uninstall.txt" || { cat "$work/uninstall.txt"; fail "uninstall names no store"; }
  [[ ! -e "$HOME/.config/systemd/user/aotid.service" ]] || fail "the unit file stays"
  [[ -e "$AOTID_HOME/aotid.db" ]] || fail "the store is gone"
  systemctl --user exit || true
  say "installed, started, ready, answered, reloaded, stopped and uninstalled under a real systemd user manager"
'
