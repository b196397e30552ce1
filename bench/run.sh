#!/usr/bin/env bash
# The first-path benchmarks (docs/BENCHMARKS.md): first-start build time per
# test model, cached start-to-ready time, HTTP vs in-process latency, and
# what runner processes cost (latency side by side, resident memory, crash
# to serving again).
#   ./dev bench        (calls: bench/run.sh BUILD_DIR PYTHON)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
store="$work/store"
for m in mlp embed; do "$AOTID" --store "$store" add "$work/models/$m.pt2" --name "$m" >/dev/null; done

wait_ready() {  # log model -> ms from start to ready
  local log="$1" m="$2" start="$3" port
  for _ in $(seq 1 600); do port="$(port_of "$log")"; [[ -n "$port" ]] && break; sleep 0.01; done
  [[ -n "$port" ]] || { echo "no port in $log" >&2; return 1; }
  local body
  for _ in $(seq 1 60000); do
    body="$(curl -s "127.0.0.1:$port/v2/models/$m/ready" || true)"
    case "$body" in
      *'"ready":true'*) echo $(($(now_ms) - start)); return ;;
      *'"state":"failed"'*) echo "$m failed: $body" >&2; cat "$log" >&2; return 1 ;;
    esac
    sleep 0.01
  done
  echo "timeout"; return 1
}

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
pss_kb() { awk '/^Pss:/ {print $2}' "/proc/$1/smaps_rollup"; }  # shared pages split among their users

# Resident memory of an idle daemon with an empty store.
"$AOTID" --store "$work/empty" serve --listen 127.0.0.1:0 >"$work/empty.log" 2>&1 &
empty_pid=$!
for _ in $(seq 1 600); do grep -q "startup complete" "$work/empty.log" && break; sleep 0.01; done
sleep 1
idle_kb="$(rss_kb "$empty_pid")"
kill -TERM "$empty_pid"; wait "$empty_pid" || true

start="$(now_ms)"
"$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/cold.log" 2>&1 &
cold_pid=$!
cold_mlp="$(wait_ready "$work/cold.log" mlp "$start")"
cold_embed="$(wait_ready "$work/cold.log" embed "$start")"
kill -TERM "$cold_pid"; wait "$cold_pid" || true
builds="$(sqlite3 "$store/aotid.db" "SELECT model || ' ' || message FROM events WHERE kind = 'build_ready' ORDER BY id")"

start="$(now_ms)"
"$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/warm.log" 2>&1 &
warm_pid=$!
warm_mlp="$(wait_ready "$work/warm.log" mlp "$start")"
warm_embed="$(wait_ready "$work/warm.log" embed "$start")"
port="$(port_of "$work/warm.log")"

echo '{"inputs":[{"name":"x","datatype":"FP32","shape":[1,8],"data":[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8]}]}' >"$work/mlp.json"
echo '{"inputs":[{"name":"ids","datatype":"INT64","shape":[2,5],"data":[1,2,3,4,5,6,7,8,9,10]}]}' >"$work/embed.json"

echo "== first start (cold: compile) — process start to model ready, ms: mlp=$cold_mlp embed=$cold_embed"
echo "   build times (from the store's event log; builds run one at a time):"
sed 's/^/     /' <<<"$builds"
echo "== cached start — process start to model ready, ms: mlp=$warm_mlp embed=$warm_embed"
sleep 1
daemon_kb="$(rss_kb "$warm_pid")"
runners=""
for r in $(pgrep -P "$warm_pid"); do
  label="$(tr '\0' '\n' <"/proc/$r/cmdline" | grep -A1 -x -- --label | tail -1)"
  runners+=" $label $(($(rss_kb "$r") / 1024)) MiB (Pss $(($(pss_kb "$r") / 1024)) MiB);"
done
echo "== resident memory: daemon idle, empty store $((idle_kb / 1024)) MiB; daemon serving mlp + embed" \
     "$((daemon_kb / 1024)) MiB; its runner processes:$runners"
echo "== latency, one request at a time, keep-alive, loopback; then the same model served by this benchmark" \
     "in process and in a runner, and kill -9 of the runner until it serves again:"
for m in mlp embed; do
  # Its stderr holds the runners' logs (and the kills'): shown only when it fails.
  "$BUILD/bench/aotid_latency_bench" --store "$store" --model "$m" --port "$port" --request "$work/$m.json" \
    --iterations 2000 --crashes 10 --aotid "$AOTID" 2>"$work/latency-$m.log" || { cat "$work/latency-$m.log" >&2; exit 1; }
done
kill -TERM "$warm_pid"; wait "$warm_pid" || true
