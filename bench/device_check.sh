#!/usr/bin/env bash
# The GPU check, in one command (docs/BENCHMARKS.md, "GPU"): builds aotid
# and its torch plugin against the torch it finds, exports two test models
# (mlp and block, tests/models/make_test_models.py's networks), adds them
# with --device cuda and no fallback to the CPU, serves them, compares each
# answer with eager PyTorch on the GPU, and prints the first request's and
# the median latency against eager and torch.compile on the GPU.
#
#   bench/device_check.sh [--device cuda|cpu] [--python PYTHON] [--build-dir DIR]
#
# --device cpu runs the same steps on the CPU: a dry run of the check's own
# logic on a machine without a GPU. With cuda (the default) and no GPU that
# torch can use, it stops at once with the reason and exit status 1.
# PYTHON (default: $AOTID_PYTHON, else python3) must import torch; nothing
# is installed and nothing is fetched, so it runs on a machine without a
# network. The build needs CMake, a C++20 compiler and aotid's libraries
# (README.md, "Build"); it goes into DIR (default: build-device/ in the
# checkout) and is reused when run again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
device=cuda
py="${AOTID_PYTHON:-python3}"
build="$ROOT/build-device"
while (($#)); do
  case "$1" in
    --device) device="${2:-}"; shift 2 ;;
    --python) py="${2:-}"; shift 2 ;;
    --build-dir) build="${2:-}"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "device_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "device_check: error: $*" >&2; exit 1; }
step() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }
helper="$ROOT/bench/device_check.py"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

step "torch and the $device device"
command -v "$py" >/dev/null || die "no Python '$py' (set --python or AOTID_PYTHON)"
"$py" "$helper" probe "$device" || exit 1
if [[ $device == cuda ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi

step "building aotid against this torch in $build"
command -v cmake >/dev/null || die "no cmake on PATH: the build needs CMake 3.25+ and a C++20 compiler"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
py_path="$(command -v "$py")"
if [[ ! -f $build/CMakeCache.txt ]]; then
  mkdir -p "$build"
  if ! cmake -S "$ROOT" -B "$build" ${generator[@]+"${generator[@]}"} -DCMAKE_BUILD_TYPE=Release \
    -DAOTID_PYTHON="$py_path" -DAOTID_BUILD_TESTS=OFF -DAOTID_BUILD_BENCH=OFF >"$build/configure.log" 2>&1; then
    grep -E "Could NOT find|not found|Error" "$build/configure.log" | head -20 >&2 || true
    die "CMake could not configure aotid here (log: $build/configure.log): it needs the libraries README.md lists"
  fi
elif ! grep -qxF "AOTID_PYTHON:FILEPATH=$py_path" "$build/CMakeCache.txt"; then
  die "$build was configured for another Python than $py_path: pass another --build-dir"
fi
cmake --build "$build" -j "$(nproc)" --target aotid aotid_torch >"$build/device_check_build.log" 2>&1 ||
  { tail -30 "$build/device_check_build.log" >&2; die "the build failed (log: $build/device_check_build.log)"; }
aotid="$build/aotid"

work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
step "exporting mlp and block; eager and torch.compile on $device"
"$py" -W ignore "$helper" export "$device" "$work/models" || die "exporting the test models failed"

step "adding them with --device $device --no-fallback-cpu and serving"
store="$work/store"
for m in mlp block; do
  "$aotid" --store "$store" add "$work/models/$m.pt2" --name "$m" --device "$device" --no-fallback-cpu >/dev/null ||
    die "aotid add $m failed"
done
printf '[build]\npython = "%s"\nworker_dir = "%s"\n' "$py_path" "$ROOT/python" >"$work/aotid.toml"
"$aotid" --config "$work/aotid.toml" --store "$store" serve --listen 127.0.0.1:0 >"$work/serve.log" 2>&1 &
port=""
for _ in $(seq 1 300); do
  port="$(grep -o 'serving on http://[^ ]*' "$work/serve.log" | head -1 | sed 's/.*://' || true)"
  [[ -n $port ]] && break
  sleep 0.1
done
[[ -n $port ]] || { cat "$work/serve.log" >&2; die "the daemon did not start"; }
"$py" "$helper" ready "$port" mlp block || {
  "$aotid" --store "$store" events -n 20 >&2 || true
  tail -40 "$work/serve.log" >&2
  die "the models did not become ready on $device"
}
"$aotid" --store "$store" show mlp | grep -i -E "device|note" || true

step "comparing with eager on $device; latency"
"$py" "$helper" serve "$device" "$work/models" "$port" || exit 1
echo "device_check: passed on $device in ${SECONDS}s"
