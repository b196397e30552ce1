#!/usr/bin/env bash
# Store benchmarks (docs/BENCHMARKS.md, "The store"):
#  1. how soon the daemon notices a version added by another process: from
#     the moment `aotid add` returns (its commit is done) to the daemon's
#     first event for the version, and to the version serving; median of 20;
#  2. `aotid ls` (and --json, show) with 1,000 models in the store, median of 5.
#   ./dev bench store     (calls: bench/store.sh BUILD_DIR PYTHON)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
store="$work/store"
model="$work/models/mlp.pt2"

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# 1. Notice latency. One build first, so that every later version of the
# same artifact only loads from the cache.
"$AOTID" --store "$store" add "$model" --name live >/dev/null
"$AOTID" --store "$store" serve --listen 127.0.0.1:0 >"$work/serve.log" 2>&1 &
for _ in $(seq 1 3000); do
  grep -q "startup complete" "$work/serve.log" && break
  sleep 0.1
done
grep -q "startup complete" "$work/serve.log" || { echo "daemon did not become ready" >&2; cat "$work/serve.log" >&2; exit 1; }
for i in $(seq 2 21); do
  t0="$(now_ms)"
  "$AOTID" --store "$store" add "$model" --name live >/dev/null
  t1="$(now_ms)"
  for _ in $(seq 1 500); do
    n="$(sqlite3 "$store/aotid.db" "SELECT COUNT(*) FROM events WHERE model='live' AND version=$i AND kind='loaded'")"
    [[ "$n" == 1 ]] && break
    sleep 0.01
  done
  sqlite3 "$store/aotid.db" "SELECT
      (SELECT MIN(at_ms) FROM events WHERE model='live' AND version=$i AND kind!='added') - a.at_ms,
      (SELECT at_ms FROM events WHERE model='live' AND version=$i AND kind='loaded') - a.at_ms,
      (SELECT MIN(at_ms) FROM events WHERE model='live' AND version=$i AND kind!='added') - $t1,
      $t1 - $t0
    FROM events a WHERE a.model='live' AND a.version=$i AND a.kind='added'" | tr '|' ' ' >>"$work/times.txt"
done
col() { awk -v c="$1" '{print $c}' "$work/times.txt"; }
echo "== version added by another process (20 versions of a cached artifact), ms from the add's 'added' event"
echo "   (written in its transaction, just before the blob check and the commit's fsync):"
echo "   daemon starts on it: median $(col 1 | median), max $(col 1 | sort -n | tail -1)"
echo "   daemon serves it:    median $(col 2 | median), max $(col 2 | sort -n | tail -1)"
echo "   daemon starts on it, relative to 'aotid add' returning: median $(col 3 | median)"
echo "   (the add command, whole process: median $(col 4 | median) ms)"
kill -TERM %1; wait %1 || true

# 2. Listing a large store.
big="$work/big"
"$BUILD/bench/aotid_store_bench" --store "$big" --file "$model" --models 1000 | sed 's/^/== /'
time_ms() {  # command... -> median wall ms of 5 runs
  for _ in 1 2 3 4 5; do
    local t0; t0="$(now_ms)"; "$@" >/dev/null; echo $(($(now_ms) - t0))
  done | median
}
echo "== with 1,000 models (median of 5, whole process):"
echo "   aotid ls:           $(time_ms "$AOTID" --store "$big" ls) ms"
echo "   aotid ls --json:    $(time_ms "$AOTID" --store "$big" ls --json) ms"
echo "   aotid show m00500:  $(time_ms "$AOTID" --store "$big" show m00500) ms"
echo "   aotid --version:    $(time_ms "$AOTID" --version) ms (process start alone)"
echo "   lines listed: $("$AOTID" --store "$big" ls | tail -n +2 | wc -l)"
