#!/usr/bin/env bash
# OpenAI's /v1 routes (docs/BENCHMARKS.md, "OpenAI routes"), in one run:
#   - embeddings: all-MiniLM-L6-v2 (examples/minilm) served twice, with
#     max_batch_size 16 and with batching off, asked by 1 and 16 clients at
#     once, one text a request, against sentence-transformers in-process at
#     the same threads (one text an encode() call, from 1 and 16 threads,
#     and 16 texts an encode() call); embeddings/s and the median latency;
#   - chat: SmolLM2-135M-Instruct (examples/smollm2), the same greedy
#     request streamed through /v1/chat/completions and through
#     /v2/models/NAME/generate_stream, alternately: time to the first token
#     and decode tokens/s as the client sees them.
#   ./dev bench openai     (calls: bench/openai.sh BUILD_DIR PYTHON)
set -euo pipefail
export AOTID_BENCH_NO_TEST_MODELS=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

store="$work/store"
PYTHONPATH="$ROOT/python" "$PY" -W ignore "$ROOT/examples/minilm/export.py" "$work/minilm.pt2" >/dev/null
"$AOTID" --store "$store" add "$work/minilm.pt2" --name minilm --max-batch-size 16 >/dev/null
"$AOTID" --store "$store" add "$work/minilm.pt2" --name minilm_unbatched >/dev/null
rm "$work/minilm.pt2"
PYTHONPATH="$ROOT/python" "$PY" -W ignore "$ROOT/examples/smollm2/export.py" "$work/smollm2.pt2" \
  --max-seq-len 512 2>/dev/null
"$AOTID" --store "$store" add "$work/smollm2.pt2" --name smollm2 >/dev/null
rm "$work/smollm2.pt2"

"$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/daemon.log" 2>&1 &
daemon=$!
port=""
for _ in $(seq 1 3600); do
  [[ -z $port ]] && port=$(port_of "$work/daemon.log" || true)
  if [[ -n $port ]] && curl -sf "127.0.0.1:$port/v2/health/ready" >/dev/null; then break; fi
  kill -0 "$daemon" || { cat "$work/daemon.log"; exit 1; }
  sleep 0.5
done
threads=$(grep -o 'serving minilm:1 on [^(]*([^)]*' "$work/daemon.log" | grep -o 'x [0-9]* thread' | grep -o '[0-9]*' || echo 1)
echo "machine: $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); minilm runs at $threads thread(s)"
"$PY" -W ignore "$ROOT/bench/openai_client.py" "$port" "$threads"
