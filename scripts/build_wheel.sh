#!/usr/bin/env bash
# Builds aotid's wheel from a checkout as `pip install .` would, without
# build isolation (PYTHON's venv has the build backend and torch), in the
# checkout's build-wheel/ folder, and prints the wheel's path.
#
#   scripts/build_wheel.sh CHECKOUT PYTHON OUT_DIR
#
# With ccache, the objects of an earlier build are reused; when
# AOTID_WHEEL_CXX and AOTID_WHEEL_BUILD_TYPE name ./dev build's compiler and
# build type (as tests/CMakeLists.txt passes them), every object it has
# compiled is a hit. pip's default is Release; the code is the same. pip's
# output goes to OUT_DIR/wheel.log, printed when the build fails.
set -euo pipefail
src="$1" python="$2" out="$3"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$src" CCACHE_NOHASHDIR=1
  [[ -n ${AOTID_WHEEL_CXX:-} ]] && launcher+=(-C "cmake.define.CMAKE_CXX_COMPILER=$AOTID_WHEEL_CXX")
  [[ -n ${AOTID_WHEEL_BUILD_TYPE:-} ]] && launcher+=(-C "cmake.build-type=$AOTID_WHEEL_BUILD_TYPE")
fi
mkdir -p "$out"
"$python" -m pip wheel -q --no-build-isolation --no-deps -w "$out" \
  -C build-dir="$src/build-wheel" "${launcher[@]}" "$src" >"$out/wheel.log" 2>&1 ||
  { cat "$out/wheel.log" >&2; exit 1; }
ls "$out"/aotid-*.whl
