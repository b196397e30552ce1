#!/usr/bin/env bash
# The gRPC API against the HTTP API (docs/BENCHMARKS.md, "gRPC against
# HTTP"): one daemon serving the test MLP and ResNet-18 (bench/models.py)
# on both, and aotid_grpc_bench timing gRPC ModelInfer (raw_input_contents),
# HTTP with the binary tensor extension, HTTP JSON and the same build called
# in-process, side by side, at concurrency 1 and 16; then gRPC's own floor
# (ServerLive on bare grpc++ servers, bench/grpc_floor.cc), back to back
# and after 10 ms idle.
#   ./dev bench grpc     (calls: bench/grpc.sh BUILD_DIR PYTHON)
# AOTID_BENCH_REPEAT runs the whole set that many times on the same daemon
# (1 by default), to see how much the figures move between runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
REPEAT="${AOTID_BENCH_REPEAT:-1}"
PYTHONPATH="$ROOT/python" "$PY" -W ignore "$ROOT/bench/models.py" "$work/models" --resnet >/dev/null
store="$work/store"
"$AOTID" --store "$store" add "$work/models/mlp.pt2" --name mlp >/dev/null
"$AOTID" --store "$store" add "$work/models/resnet18.pt2" --name resnet18 >/dev/null
"$AOTID" --store "$store" serve --listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 6000); do grep -q "gRPC serving on" "$work/serve.log" && break; sleep 0.1; done
port="$(port_of "$work/serve.log")"
grpc_port="$(grep -o 'gRPC serving on [^ ]*' "$work/serve.log" | head -1 | sed 's/.*://')"
[[ -n $port && -n $grpc_port ]] || { echo "no ports in the daemon's log" >&2; cat "$work/serve.log" >&2; exit 1; }
for m in mlp resnet18; do  # the first start builds them (ResNet-18 takes minutes)
  for _ in $(seq 1 12000); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port/v2/models/$m/ready") == 200 ]] && break
    sleep 0.1
  done
done

bench() {  # model concurrency rounds block warmup
  "$BUILD/bench/aotid_grpc_bench" --store "$store" --model "$1" --http-port "$port" --grpc-port "$grpc_port" \
    --concurrency "$2" --rounds "$3" --block "$4" --warmup "$5"
}
echo "== $(nproc) cores; $(grep -o -w -m1 'avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for run in $(seq 1 "$REPEAT"); do
  echo "== run $run of $REPEAT"
  bench mlp 1 2000 1 50
  bench mlp 16 20 10 2
  bench resnet18 1 30 1 3
  bench resnet18 16 4 2 1
  "$BUILD/bench/aotid_grpc_floor" --grpc-port "$grpc_port" --http-port "$port" --rounds 2000
  "$BUILD/bench/aotid_grpc_floor" --grpc-port "$grpc_port" --http-port "$port" --rounds 200 --pause-us 10000
done
kill -TERM $pid; wait $pid || true
