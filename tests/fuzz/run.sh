#!/usr/bin/env bash
# Builds a fuzz target with clang (libFuzzer, AddressSanitizer, UBSan) and
# runs it for a bounded time from its seed corpus. Fails on any crash, leak
# or sanitizer report.
#   tests/fuzz/run.sh SOURCE_DIR OUT_DIR TARGET [SECONDS]
# TARGET: decode_infer_request (ctest: fuzz.DecodeInferRequest) or
#         http_request (ctest: fuzz.HttpRequest)
set -euo pipefail
src="$1"
out="$2"
target="$3"
seconds="${4:-${AOTID_FUZZ_SECONDS:-60}}"
clang="${CLANGXX:-clang++}"
command -v "$clang" >/dev/null || { echo "fuzz: $clang not found (./dev installs clang)" >&2; exit 1; }
case "$target" in
  decode_infer_request)
    sources=("$src/serving/tensor_codec.cc" "$src/http/json_tape.cc" "$src/runtime/tensor.cc" "$src/base/status.cc")
    corpus_dir="$src/tests/fuzz/corpus" dict="$src/tests/fuzz/oip.dict" ;;
  http_request)
    sources=("$src/http/server.cc" "$src/base/status.cc" "$src/base/log.cc")
    corpus_dir="$src/tests/fuzz/http_corpus" dict="$src/tests/fuzz/http.dict" ;;
  *) echo "fuzz: unknown target '$target'" >&2; exit 2 ;;
esac
mkdir -p "$out"
bin="$out/${target}_fuzzer"
"$clang" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$src" -o "$bin" "$src/tests/fuzz/${target}_fuzzer.cc" "${sources[@]}" -lpthread
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp "$corpus_dir"/* "$corpus/"
cd "$out"  # crash-* files land here
"$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 -timeout=10 -print_final_stats=1 \
  -dict="$dict" "$corpus" 2>&1 | tail -25
echo "fuzz: $target, no crash in ${seconds}s"
