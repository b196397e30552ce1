#!/usr/bin/env bash
# Runs aotid on its embedded default: the default store (see `aotid --help`),
# with a demo model exported and added when the store has none, serving on
# 127.0.0.1:8765 unless --listen says otherwise. Called by `./dev run`.
set -euo pipefail
AOTID="$1"
PYTHON="$2"
shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The store is aotid's own default, or what --store / --config say.
global=()
listen="127.0.0.1:8765"
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --store | --config) global+=("${args[$i]}" "${args[$((i + 1))]}") ;;
    --listen) listen="${args[$((i + 1))]}" ;;
  esac
done

if ! "$AOTID" ${global[@]+"${global[@]}"} ls 2>/dev/null | grep -q '^demo '; then
  demo_file="$(mktemp -d)/demo.pt2"
  echo "[dev] exporting the demo model to $demo_file" >&2
  PYTHONPATH="$ROOT/python" "$PYTHON" -W ignore -m aotid_export aotid_export.demo:make_model \
    --input 'features=float32[1,4]' --output-name probabilities --dynamic-batch \
    --metadata '{"description": "aotid demo: 4 features -> 3 class probabilities"}' -o "$demo_file"
  "$AOTID" ${global[@]+"${global[@]}"} add "$demo_file" --name demo
  rm -rf "$(dirname "$demo_file")"
fi

cat >&2 <<MSG
[dev] the demo model compiles on first start (about 30 s), then loads from the cache. Try:
  curl -s $listen/v2/models/demo
  curl -s $listen/v2/models/demo/infer -d '{"inputs":[{"name":"features","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
MSG
exec "$AOTID" serve "$@"
