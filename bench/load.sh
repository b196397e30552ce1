#!/usr/bin/env bash
# Serving benchmarks under load (docs/BENCHMARKS.md, "Serving under load"):
#  - overhead at concurrency 1 (HTTP minus in-process) next to a bare TCP
#    echo of the same bytes over loopback, interleaved in one run;
#  - how fast a large tensor's JSON is decoded and encoded (MB/s);
#  - throughput at concurrency 1, 16 and 64 for the test MLP and a small conv
#    net, without and with dynamic batching, each against the in-process
#    runner's throughput at the same concurrency, in the same run;
#  - resident memory: the daemon idle with no model, with the models loaded,
#    and a Python process that loads the same compiled conv net;
#  - a large tensor: ResNet-18 (bench/models.py) with its 602 KB image sent
#    through the binary tensor extension and as JSON, against the same
#    build called in-process (C++, same threads) and an echo of the bytes.
#   ./dev bench load     (calls: bench/load.sh BUILD_DIR PYTHON)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
SECONDS_PER_RUN="${AOTID_BENCH_SECONDS:-5}"
PYTHONPATH="$ROOT/python" "$PY" -W ignore "$ROOT/bench/models.py" "$work/models" --resnet >/dev/null
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
wait_log() {  # log pattern
  for _ in $(seq 1 6000); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; return 1
}

# Resident memory of an idle daemon with an empty store.
"$AOTID" --store "$work/empty" serve --listen 127.0.0.1:0 >"$work/empty.log" 2>&1 &
pid=$!
wait_log "$work/empty.log" "startup complete"
sleep 1
idle_kb="$(rss_kb $pid)"
kill -TERM $pid; wait $pid || true

store="$work/store"
# The default config (8 HTTP workers): a request waiting for its batch holds
# no worker, so batches gather rows from any number of clients.
: >"$work/aotid.toml"
"$AOTID" --store "$store" add "$work/models/mlp.pt2" --name mlp >/dev/null
"$AOTID" --store "$store" add "$work/models/conv.pt2" --name conv >/dev/null
"$AOTID" --config "$work/aotid.toml" --store "$store" serve --listen 127.0.0.1:0 >"$work/serve.log" 2>&1 &
pid=$!
wait_log "$work/serve.log" "startup complete"
port="$(port_of "$work/serve.log")"
sleep 1
loaded_kb="$(rss_kb $pid)"

conv_sha="$(sha256sum "$work/models/conv.pt2" | cut -c1-64)"
conv_so="$(ls "$store"/cache/"$conv_sha"/*/model.so | head -1)"
py_kb="$("$PY" -W ignore - "$conv_so" <<'PYEOF'
import sys, torch
runner = torch._C._aoti.AOTIModelContainerRunnerCpu(sys.argv[1], 1)  # the very build the daemon loaded
runner.run([torch.randn(1, 3, 32, 32)])
print([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS")][0])
PYEOF
)"

echo '{"inputs":[{"name":"x","datatype":"FP32","shape":[1,8],"data":[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8]}]}' >"$work/mlp.json"
"$PY" -c "
import json, random
random.seed(1)
print(json.dumps({'inputs': [{'name': 'image', 'datatype': 'FP32', 'shape': [1, 3, 32, 32],
                              'data': [round(random.uniform(-1, 1), 4) for _ in range(3072)]}]}))" >"$work/conv.json"

echo "== resident memory: daemon idle, no model $((idle_kb / 1024)) MiB; daemon with mlp + conv loaded" \
     "$((loaded_kb / 1024)) MiB; Python process with the same compiled conv net $((py_kb / 1024)) MiB"
echo "== JSON: a 3x224x224 FP32 tensor decoded and encoded (median of 21):"
"$BUILD/bench/aotid_codec_bench" 21 | sed 's/^/   /'
echo "== concurrency 1 (keep-alive, loopback), with a bare TCP echo of the same bytes:"
for m in mlp conv; do
  "$BUILD/bench/aotid_latency_bench" --store "$store" --model "$m" --port "$port" --request "$work/$m.json" \
    --iterations 2000
done

throughput() {
  for c in 1 16 64; do
    for m in mlp conv; do
      "$BUILD/bench/aotid_throughput_bench" --store "$store" --model "$m" --port "$port" \
        --request "$work/$m.json" --concurrency "$c" --seconds "$SECONDS_PER_RUN"
    done
  done
}
echo "== throughput, no batching (${SECONDS_PER_RUN} s per side):"
throughput
loads="$(sqlite3 "$store/aotid.db" "SELECT COUNT(*) FROM events WHERE kind = 'loaded'")"
"$AOTID" --store "$store" set mlp max_batch_size=64 max_batch_delay_us=1000 >/dev/null
"$AOTID" --store "$store" set conv max_batch_size=32 max_batch_delay_us=2000 >/dev/null
for _ in $(seq 1 300); do
  n="$(sqlite3 "$store/aotid.db" "SELECT COUNT(*) FROM events WHERE kind = 'loaded'")"
  [[ "$n" -ge $((loads + 2)) ]] && break
  sleep 0.1
done
echo "== throughput, dynamic batching (mlp up to 64 rows / 1 ms, conv up to 32 rows / 2 ms):"
throughput
curl -s "127.0.0.1:$port/metrics" | grep -E '^aotid_batch_rows_(sum|count)' | sed 's/^/   /'
kill -TERM $pid; wait $pid || true

# A large tensor: ResNet-18 on one 3x224x224 image, binary and JSON. The
# model's run drifts by more than the overhead, so each round trip is also
# compared with the in-process call made next to it ("paired").
store="$work/resnet-store"
"$AOTID" --store "$store" add "$work/models/resnet18.pt2" --name resnet18 >/dev/null
"$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/resnet.log" 2>&1 &
pid=$!
wait_log "$work/resnet.log" "startup complete"
port="$(port_of "$work/resnet.log")"
header_length="$("$PY" - "$work" <<'PYEOF'
import json, random, struct, sys
random.seed(1)
values = [round(random.uniform(-1, 1), 4) for _ in range(3 * 224 * 224)]
tensor = {"name": "image", "datatype": "FP32", "shape": [1, 3, 224, 224]}
head = json.dumps({"inputs": [dict(tensor, parameters={"binary_data_size": 4 * len(values)})]}).encode()
open(sys.argv[1] + "/resnet18.bin", "wb").write(head + struct.pack("<%df" % len(values), *values))
open(sys.argv[1] + "/resnet18.json", "w").write(json.dumps({"inputs": [dict(tensor, data=values)]}))
print(len(head))
PYEOF
)"
echo "== ResNet-18, one 3x224x224 image (bench/models.py), binary then JSON, against the in-process call:"
"$BUILD/bench/aotid_latency_bench" --store "$store" --model resnet18 --port "$port" --request "$work/resnet18.bin" \
  --header-length "$header_length" --iterations 200 --crashes 0 --handoff-rounds 0
"$BUILD/bench/aotid_latency_bench" --store "$store" --model resnet18 --port "$port" --request "$work/resnet18.json" \
  --iterations 100 --crashes 0 --handoff-rounds 0
kill -TERM $pid; wait $pid || true
