#!/usr/bin/env bash
# Memory and disk of a model with 268 MB of weights (docs/BENCHMARKS.md,
# "Footprint"): Linear(4096, 8192) and Linear(8192, 4096), float32, no bias.
# Built and served twice, with the default build and with AOTInductor's
# weights mapped from the compiled library
# (inductor.aot_inductor.force_mmap_weights=true); for each, the runner's
# resident memory (anonymous and file-backed, after one request), the
# store's bytes on disk (blob, build, anything else), and whether the answer
# equals eager PyTorch's.
#   ./dev bench footprint     (calls: bench/footprint.sh BUILD_DIR PYTHON)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PYTHONPATH="$ROOT/python" "$PY" -W ignore - "$work/big.pt2" "$work/request.json" "$work/want.json" <<'EOF'
import json, sys, torch
from aotid_export import export
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4096, 8192, bias=False), torch.nn.ReLU(),
                            torch.nn.Linear(8192, 4096, bias=False)).eval()
x = torch.randn(1, 4096)
export(model, [x], sys.argv[1], input_names=["x"], dynamic_batch=True)
json.dump({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4096], "data": x.flatten().tolist()}]},
          open(sys.argv[2], "w"))
with torch.no_grad():
    json.dump(model(x).flatten().tolist(), open(sys.argv[3], "w"))
EOF
weights=$((2 * 4096 * 8192 * 4))

kib() { awk -v k="$1" '/^'"$1"':/ {print $2}' "/proc/$2/status"; }
mb() { awk -v b="$1" 'BEGIN {printf "%.0f", b / 1e6}'; }

printf '%-8s %9s %9s %9s %9s %9s %9s %s\n' build "rss MB" anon file blob build other "answer"
for mode in default mmap; do
  store="$work/store-$mode"
  "$AOTID" --store "$store" add "$work/big.pt2" --name big >/dev/null
  if [[ $mode == mmap ]]; then
    "$AOTID" --store "$store" set big inductor.aot_inductor.force_mmap_weights=true >/dev/null
  fi
  "$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/$mode.log" 2>&1 &
  daemon=$!
  port=""
  for _ in $(seq 1 1200); do  # the build: a few minutes on 2 cores
    [[ -z $port ]] && port=$(port_of "$work/$mode.log" || true)
    [[ -n $port ]] && curl -sf "127.0.0.1:$port/v2/models/big/ready" >/dev/null && break
    kill -0 "$daemon" || { cat "$work/$mode.log"; exit 1; }
    sleep 0.5
  done
  curl -sf "127.0.0.1:$port/v2/models/big/infer" -d @"$work/request.json" >"$work/got-$mode.json"
  answer=$("$PY" - "$work/got-$mode.json" "$work/want.json" <<'EOF'
import json, sys
got = json.load(open(sys.argv[1]))["outputs"][0]["data"]
want = json.load(open(sys.argv[2]))
bad = sum(abs(g - w) > 1e-4 + 1e-4 * abs(w) for g, w in zip(got, want))
print("equals eager" if len(got) == len(want) and bad == 0 else f"DIFFERS ({bad} values)")
EOF
)
  runner=$(pgrep -f "internal-runner.*--entry $store/" | head -1)
  anon=$(kib RssAnon "$runner")
  file=$(kib RssFile "$runner")
  blob=$(du -sb "$store/blobs" | cut -f1)
  build=$(du -sb "$store/cache" | cut -f1)
  total=$(du -sb "$store" | cut -f1)
  printf '%-8s %9s %9s %9s %9s %9s %9s %s\n' "$mode" "$(((anon + file) / 1000))" "$((anon / 1000))" \
    "$((file / 1000))" "$(mb "$blob")" "$(mb "$build")" "$(mb $((total - blob - build)))" "$answer"
  kill "$daemon"
  wait "$daemon" 2>/dev/null || true
done
echo "weights: $(mb $weights) MB; rss of the runner process; disk in MB (du) of blobs/, cache/ and the rest of the store"
