#!/usr/bin/env bash
# The exporter's command line, as `./dev run` uses it: a batch-1 example with
# --dynamic-batch must export, and aotid must accept the result.
set -euo pipefail
python="$1"
aotid="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$python" -W ignore -m aotid_export aotid_export.demo:make_model \
  --input 'features=float32[1,4]' --output-name probabilities --dynamic-batch -o "$dir/demo.pt2"
"$aotid" --store "$dir/store" add "$dir/demo.pt2" --name demo
"$aotid" --store "$dir/store" ls | grep -q '^demo  *1 '
# A bad --input is a clear usage error, not a traceback.
if "$python" -m aotid_export aotid_export.demo:make_model --input 'features=float32' -o "$dir/x.pt2" 2>"$dir/err"; then
  echo "bad --input was accepted"; exit 1
fi
grep -q "expected NAME=DTYPE" "$dir/err"
echo "exporter ok"
