#!/usr/bin/env bash
# Build benchmarks (docs/BENCHMARKS.md, "Builds"):
#  - first build per model on a cold store (the compile worker's inductor
#    cache empty), from the `build_ready` events;
#  - cached start: daemon start to every model ready, and per model the time
#    from start to its `loaded` event, over several restarts;
#  - warm load in aotid (model.so in place) against
#    torch._inductor.aoti_load_package in Python on the same package;
#  - latency of one in-process run of the compiled model against the eager
#    exported program, same input, same thread count.
#   ./dev bench builds     (calls: bench/builds.sh BUILD_DIR PYTHON)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RESTARTS="${AOTID_BENCH_RESTARTS:-5}"
store="$work/store"
models=(mlp conv block two_io mlp_so mlp_src)
for m in "${models[@]}"; do "$AOTID" --store "$store" add "$work/models/$m.pt2" --name "$m" >/dev/null; done

wait_ready() {  # log
  for _ in $(seq 1 9000); do grep -q "startup complete" "$1" && return 0; sleep 0.1; done
  echo "timed out waiting for the daemon to be ready" >&2; cat "$1" >&2; return 1
}

echo "== first build (cold store, one build at a time, $(nproc) cores)"
"$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/cold.log" 2>&1 &
wait_ready "$work/cold.log"
kill -TERM $! && wait $! || true
"$AOTID" --store "$store" events --json -n 1000 >"$work/events.json"
"$PY" - "$work/events.json" <<'PYEOF'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    model, msg = e["model"], e["message"]
    if e["kind"] == "build_ready":
        print(f"  {model:8} {int(msg.split()[2]) / 1000:6.1f} s")
    if e["kind"] in ("build_failed", "load_failed"):
        print(f"  {model:8} FAILED: {msg[:200]}")
PYEOF

echo "== cached start ($RESTARTS restarts): start -> every model ready, and start -> each model loaded"
for i in $(seq 1 "$RESTARTS"); do
  t0=$(now_ms)
  "$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/warm$i.log" 2>&1 &
  pid=$!
  wait_ready "$work/warm$i.log"
  echo "total $(( $(now_ms) - t0 ))" >>"$work/warm.txt"
  "$PY" - "$work/warm$i.log" "$t0" >>"$work/warm.txt" <<'PYEOF'
import datetime, re, sys
t0 = int(sys.argv[2])
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) info serving (\S+?):\d+ on", line)
    if m:
        at = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
        print(m.group(2), int(at.timestamp() * 1000) - t0)
PYEOF
  kill -TERM $pid && wait $pid || true
done
"$PY" - "$work/warm.txt" <<'PYEOF'
import collections, statistics, sys
by = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, v = line.split()
    by[k].append(int(v))
for k, v in sorted(by.items()):
    print(f"  {k:8} median {statistics.median(v):6.0f} ms  (min {min(v)}, max {max(v)})")
PYEOF

threads="$(nproc)"
echo "== in-process, $threads threads: aotid load from cache, and one run"
"$BUILD/bench/aotid_model_bench" "$store" "$work/models/cases.json" mlp conv block two_io mlp_so=mlp mlp_src=mlp
echo "== Python on the same packages and inputs, torch.set_num_threads($threads)"
"$PY" "$ROOT/bench/python_ref.py" "$work/models" "$threads" mlp conv block two_io mlp_so=mlp
