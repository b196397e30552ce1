#!/usr/bin/env bash
# The torch versions aotid supports besides the pinned one, checked once by
# hand, never in CI (each is a CUDA wheel of about 500 MB; docs/BUILDS.md,
# "torch versions"):
#
#   scripts/torch_wheel_check.sh [VERSION...]      (default: 2.11.0 2.13.0)
#
# For each VERSION: downloads PyPI's Linux x86_64 wheel of torch==VERSION
# once (a CUDA build) into ~/.cache/aotid-dev/wheels and unpacks it beside;
# configures aotid against it with the CUDA toolkit out of sight (where run
# as root, /usr/local/cuda* and /usr/local/bin are hidden in a private mount
# namespace; otherwise nvcc is dropped from PATH and CUDACXX pointed
# nowhere), builds the torch plugin, and shows what it links and that every
# symbol it takes from torch is there; then checks the compile worker's and
# the exporter's calls against that torch's Python sources
# (scripts/torch_api_check.py). Exit status 1 when any step fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${AOTID_DEV_CACHE:-$HOME/.cache/aotid-dev}"
PY="$ROOT/.venv/bin/python"  # ./dev's venv: runs CMake's and the check's Python
[[ -x $PY ]] || { echo "run ./dev build first (it makes $PY)" >&2; exit 1; }
versions=("$@")
((${#versions[@]})) || versions=(2.11.0 2.13.0)
failed=0

# Runs "$@" with no CUDA toolkit in sight.
without_toolkit() {
  if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null; then
    unshare --mount --propagation private bash -c '
      for d in /usr/local/cuda* /usr/local/bin; do [[ -d $d && ! -L $d ]] && mount -t tmpfs none "$d"; done
      unset CUDACXX CUDA_HOME CUDA_PATH; "$@"' bash "$@"
  else
    local path="" dir
    IFS=: read -r -a dirs <<<"$PATH"
    for dir in "${dirs[@]}"; do [[ -x $dir/nvcc ]] || path="$path${path:+:}$dir"; done
    env -u CUDA_HOME -u CUDA_PATH PATH="$path" CUDACXX=/nonexistent/nvcc "$@"
  fi
}

for v in "${versions[@]}"; do
  echo "== torch $v"
  wheels="$CACHE/wheels"
  mkdir -p "$wheels"
  wheel="$(ls "$wheels"/torch-"$v"-cp311-*manylinux*x86_64.whl 2>/dev/null | head -1 || true)"
  if [[ -z $wheel ]]; then
    # --isolated: a pip.conf's find-links may hold a CPU build of the same version.
    "$PY" -m pip download --isolated --index-url https://pypi.org/simple --no-deps --only-binary=:all: \
      --platform manylinux_2_28_x86_64 --python-version 3.11 "torch==$v" -d "$wheels" >/dev/null
    wheel="$(ls "$wheels"/torch-"$v"-cp311-*manylinux*x86_64.whl | head -1)"
  fi
  unpacked="$CACHE/torch-wheels/$v"
  if [[ ! -f $unpacked/.complete ]]; then
    rm -rf "$unpacked" && mkdir -p "$unpacked"
    "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$unpacked"
    touch "$unpacked/.complete"
  fi
  torch_dir="$unpacked/torch"
  echo "   $(grep '^__version__' "$torch_dir/version.py")"

  build="$CACHE/torch-wheels/build-$v"
  rm -rf "$build"
  if ! without_toolkit sh -c 'command -v nvcc >/dev/null && echo "nvcc still in sight: $(command -v nvcc)" && exit 1
      cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_COMPILER=/nonexistent/nvcc \
        -DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" -DAOTID_BUILD_TESTS=OFF \
        -DAOTID_BUILD_BENCH=OFF -DAOTID_PYTHON="$3" -DAOTID_TORCH_DIR="$4" >"$2.configure.log" 2>&1 &&
      cmake --build "$2" --target aotid_torch >"$2.build.log" 2>&1' sh "$ROOT" "$build" "$PY" "$torch_dir"; then
    echo "   FAILED: configure or build without the CUDA toolkit (logs: $build.configure.log, $build.build.log)"
    tail -20 "$build.configure.log" "$build.build.log" 2>/dev/null | sed 's/^/     /'
    failed=1
    continue
  fi
  plugin="$build/libaotid_torch.so"
  echo "   configured and built without the CUDA toolkit: $plugin"
  echo "   links: $(readelf -d "$plugin" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  # Every symbol the plugin takes from elsewhere must be defined by one of
  # the libraries it names (the link's --no-undefined says so too).
  defined="$(mktemp)"
  for lib in $(readelf -d "$plugin" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
    file="$torch_dir/lib/$lib"
    [[ -e $file ]] || file="$(ldconfig -p | awk -v n="$lib" '$1 == n {print $NF; exit}')"
    nm -D --defined-only "$file" | awk '{print $NF}' | sed 's/@.*//'
  done | sort -u >"$defined"
  missing="$(nm -D --undefined-only "$plugin" | awk '{print $NF}' | sed 's/@.*//' | sort -u |
    grep -v -E '^(__gmon_start__|_ITM_.*|__cxa_finalize)$' | comm -23 - "$defined" || true)"
  rm -f "$defined"
  if [[ -n $missing ]]; then
    echo "   FAILED: symbols no linked library defines:"; sed 's/^/     /' <<<"$missing"
    failed=1
  else
    echo "   $(nm -D --undefined-only "$plugin" | wc -l) undefined symbols, each defined by a linked library"
  fi
  "$PY" "$ROOT/scripts/torch_api_check.py" "$torch_dir" | sed 's/^/   /' || failed=1
done
exit "$failed"
