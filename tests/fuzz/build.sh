#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz/CMakeLists.txt) in a clang
# configuration of this source tree with -DAOTID_FUZZ=ON: the libraries
# they link are compiled from their own folders' source lists, with
# libFuzzer's coverage, ASan and UBSan. Configures the first time only.
#   tests/fuzz/build.sh SOURCE_DIR OUT_DIR PYTHON [COMPILER_LAUNCHER]
# ctest: fuzz.Build, the fixture of fuzz.DecodeInferRequest, fuzz.HttpRequest, fuzz.Text, fuzz.Json
# and fuzz.GrpcInfer.
set -euo pipefail
src="$1"
out="$2"
python="$3"
launcher="${4:-}"
clang="${CLANGXX:-clang++}"
command -v "$clang" >/dev/null || { echo "fuzz: $clang not found (./dev installs clang)" >&2; exit 1; }
if [[ ! -f "$out/build.ninja" ]]; then
  cmake -S "$src" -B "$out" -G Ninja -DCMAKE_CXX_COMPILER="$clang" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" -DAOTID_PYTHON="$python" \
    -DAOTID_FUZZ=ON -DAOTID_BUILD_TESTS=OFF -DAOTID_BUILD_BENCH=OFF >/dev/null
fi
cmake --build "$out" --target decode_infer_request_fuzzer http_request_fuzzer text_fuzzer json_fuzzer \
  grpc_infer_fuzzer
