#!/usr/bin/env bash
# Cached start against its floor (docs/BENCHMARKS.md, "Cached start"): exec
# of `aotid serve` to a model's /ready, on a store whose builds are cached
# (threads already chosen), for one model at a time and for all of them
# together; next to exec to libtorch loaded in a process that does nothing
# else (bench/dlopen_floor.cc). Median and min of the runs, interleaved.
#   ./dev bench start     (calls: bench/start.sh BUILD_DIR PYTHON)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RUNS="${AOTID_BENCH_RESTARTS:-7}"
models=(mlp conv block)
for m in "${models[@]}"; do
  "$AOTID" --store "$work/$m" add "$work/models/$m.pt2" --name "$m" >/dev/null
  "$AOTID" --store "$work/all" add "$work/models/$m.pt2" --name "$m" >/dev/null
done

ns() { date +%s%N; }
# exec to every named model ready, in ms; the daemon is stopped after.
start_ms() {  # store model...
  local store="$1"; shift
  local t0 log="$work/serve.log" port="" m
  t0=$(ns)
  "$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 20000); do
    [[ -z $port ]] && port=$(port_of "$log" || true)
    if [[ -n $port ]]; then
      local all=1
      for m in "$@"; do
        [[ $(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port/v2/models/$m/ready") == 200 ]] || { all=0; break; }
      done
      ((all)) && break
    fi
    sleep 0.002
  done
  echo $((($(ns) - t0) / 1000000))
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
}
floor_ms() {  # exec to libtorch loaded (the program prints when), not to its exit
  local t0 loaded
  t0=$(ns)
  loaded=$("$BUILD/bench/aotid_dlopen_floor")
  echo $(((loaded - t0) / 1000000))
}

# First starts build the models and choose their threads: not timed.
for m in "${models[@]}"; do start_ms "$work/$m" "$m" >/dev/null; done
start_ms "$work/all" "${models[@]}" >/dev/null

declare -A times
for _ in $(seq 1 "$RUNS"); do
  times[floor]+="$(floor_ms) "
  for m in "${models[@]}"; do times[$m]+="$(start_ms "$work/$m" "$m") "; done
  times[all]+="$(start_ms "$work/all" "${models[@]}") "
done
stats() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {printf "%d %d", a[int((NR+1)/2)], a[1]}'; }
read -r floor_med floor_min <<<"$(stats "${times[floor]}")"
printf '%-34s %10s %8s %10s\n' "exec to" "median ms" "min ms" "÷ floor"
printf '%-34s %10s %8s %10s\n' "libtorch loaded (the floor)" "$floor_med" "$floor_min" "1.00"
for k in "${models[@]}" all; do
  read -r med min <<<"$(stats "${times[$k]}")"
  label="$k ready"
  [[ $k == all ]] && label="${models[*]} ready (one store)"
  printf '%-34s %10s %8s %10s\n' "$label" "$med" "$min" "$(awk -v a="$med" -v b="$floor_med" 'BEGIN {printf "%.2f", a / b}')"
done
echo "$RUNS runs each, interleaved; $(nproc) cores"
