#!/usr/bin/env bash
# Runs a fuzz target (built by tests/fuzz/build.sh) for a bounded time from
# its seed corpus. Fails on any crash, leak or sanitizer report.
#   tests/fuzz/run.sh FUZZER CORPUS_DIR DICT [SECONDS]
# SECONDS defaults to AOTID_FUZZ_SECONDS, else 60.
set -euo pipefail
bin="$1"
corpus_dir="$2"
dict="$3"
seconds="${4:-${AOTID_FUZZ_SECONDS:-60}}"
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp "$corpus_dir"/* "$corpus/"
cd "$(dirname "$bin")"  # crash-* files land here
"$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 -timeout=10 -print_final_stats=1 \
  -dict="$dict" "$corpus" 2>&1 | tail -25
echo "fuzz: $(basename "$bin"), no crash in ${seconds}s"
