#!/usr/bin/env bash
# Builds the request-decoder fuzz target with clang (libFuzzer, AddressSanitizer,
# UBSan) and runs it for a bounded time from the seed corpus. Fails on any
# crash, leak or sanitizer report.
#   tests/fuzz/run.sh SOURCE_DIR OUT_DIR [SECONDS]   (ctest: fuzz.DecodeInferRequest)
set -euo pipefail
src="$1"
out="$2"
seconds="${3:-${AOTID_FUZZ_SECONDS:-60}}"
clang="${CLANGXX:-clang++}"
command -v "$clang" >/dev/null || { echo "fuzz: $clang not found (./dev installs clang)" >&2; exit 1; }
mkdir -p "$out"
bin="$out/decode_infer_request_fuzzer"
"$clang" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$src" -o "$bin" \
  "$src/tests/fuzz/decode_infer_request_fuzzer.cc" "$src/daemon/tensor_codec.cc" \
  "$src/runtime/tensor.cc" "$src/base/status.cc"
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp "$src"/tests/fuzz/corpus/* "$corpus/"
cd "$out"  # crash-* files land here
"$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 -timeout=10 -print_final_stats=1 \
  -dict="$src/tests/fuzz/oip.dict" "$corpus" 2>&1 | tail -25
echo "fuzz: no crash in ${seconds}s"
