#!/usr/bin/env bash
# Sync benchmarks (docs/BENCHMARKS.md, "Sync"), against Debian's
# docker-registry on loopback, with a ~200 MB exported model:
#  1. `aotid sync` of the model into an empty store against `curl` fetching
#     the same blob from the same registry, side by side, median of 3 each;
#  2. a sync killed (kill -9) once half the package is down, then run again:
#     the bytes the second run fetches and its time, against a full sync.
#   ./dev bench sync     (calls: bench/sync.sh BUILD_DIR PYTHON)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# A model of ~200 MB of weights: one 7072 x 7072 float32 matrix.
PYTHONPATH="$ROOT/python" "$PY" -W ignore - "$work/big.pt2" <<'EOF'
import sys, torch
from aotid_export import export
torch.manual_seed(0)
export(torch.nn.Linear(7072, 7072, bias=False), [torch.randn(2, 7072)], sys.argv[1], input_names=["x"],
       dynamic_batch=True)
EOF
size=$(stat -c %s "$work/big.pt2")

port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/registry.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$port
EOF
docker-registry serve "$work/registry.yml" >/dev/null 2>&1 &
for _ in $(seq 1 100); do curl -sf "127.0.0.1:$port/v2/" >/dev/null && break; sleep 0.1; done

"$AOTID" --store "$work/a" add "$work/big.pt2" --name big >/dev/null
"$AOTID" --store "$work/a" push big "oci://127.0.0.1:$port/bench/big:1" >/dev/null 2>&1
digest="sha256:$(sha256sum "$work/big.pt2" | cut -c1-64)"

echo "== sync of a $((size / 1000000)) MB package over loopback, against curl of the same blob (median of 3)"
sync_ms=(); curl_ms=()
for i in 1 2 3; do
  rm -rf "$work/b"
  t0=$(now_ms)
  "$AOTID" --store "$work/b" sync "oci://127.0.0.1:$port/bench/big:1" >/dev/null 2>&1
  sync_ms+=($(($(now_ms) - t0)))
  t0=$(now_ms)
  curl -sf -o "$work/curl.bin" "127.0.0.1:$port/v2/bench/big/blobs/$digest"
  curl_ms+=($(($(now_ms) - t0)))
  rm -f "$work/curl.bin"
done
s=$(printf '%s\n' "${sync_ms[@]}" | median)
c=$(printf '%s\n' "${curl_ms[@]}" | median)
awk -v s="$s" -v c="$c" -v b="$size" 'BEGIN {
  printf "aotid sync  %6.0f ms  %6.0f MB/s (download, sha256 check, move into the store, fsync, record)\n", s, b / s / 1000
  printf "curl        %6.0f ms  %6.0f MB/s (download to a file)\n", c, b / c / 1000
  printf "ratio       %6.2f\n", s / c }'

echo "== a sync killed at half the package, then run again"
rm -rf "$work/c"
"$AOTID" --store "$work/c" sync "oci://127.0.0.1:$port/bench/big:1" >/dev/null 2>&1 &
pid=$!
partial="$work/c/downloads/${digest#sha256:}.partial"
for _ in $(seq 1 2000); do
  [[ -f "$partial" ]] && (($(stat -c %s "$partial") >= size / 2)) && break
  sleep 0.005
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
had=$(stat -c %s "$partial")
t0=$(now_ms)
out=$("$AOTID" --store "$work/c" sync "oci://127.0.0.1:$port/bench/big:1" 2>/dev/null)
resume=$(($(now_ms) - t0))
echo "killed with $((had / 1000000)) of $((size / 1000000)) MB down; the next sync: $resume ms ($out)"
echo "against a full sync: $s ms"
