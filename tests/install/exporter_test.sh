#!/usr/bin/env bash
# The exporter alone, as a model author installs it: `pip install ./python`
# into a fresh venv (no C++ build, no checkout on PYTHONPATH), then its
# command exports the demo model from another folder, and aotid accepts the
# file. The installed package is the checkout's own code.
#
#   exporter_test.sh CHECKOUT DEV_PYTHON AOTID
set -euo pipefail
src="$(cd "$1" && pwd)"
dev_python="$2"
aotid="$(realpath "$3")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
base="$("$dev_python" -c 'import sys; print(sys._base_executable)')"
"$base" -m venv "$work/venv"
# From a copy: a build in place would leave build/ and *.egg-info in the checkout.
cp -r "$src/python" "$work/src"
rm -rf "$work/src/__pycache__" "$work/src"/*/__pycache__
"$work/venv/bin/pip" install -q "$work/src" > "$work/pip.log" 2>&1 || { cat "$work/pip.log"; exit 1; }
mkdir "$work/cwd" && cd "$work/cwd"
env -u PYTHONPATH "$work/venv/bin/aotid-export" aotid_export.demo:make_model --input 'features=float32[1,4]' \
  --output-name probabilities --dynamic-batch -o demo.pt2 2> export.log || { cat export.log; exit 1; }
if grep -q "Failed to initialize NumPy" export.log; then cat export.log; echo "FAIL: numpy missing"; exit 1; fi
where="$(env -u PYTHONPATH "$work/venv/bin/python" -c 'import aotid_export, aotid_worker; print(aotid_export.__file__, aotid_worker.__file__)')"
[[ "$where" == "$work/venv/lib/"*"site-packages/aotid_export/__init__.py $work/venv/lib/"*"site-packages/aotid_worker/__init__.py" ]] ||
  { echo "FAIL: imported from $where"; exit 1; }
"$aotid" --store "$work/store" add demo.pt2 --name demo
"$aotid" --store "$work/store" ls | grep -q '^demo  *1 '
echo "the exporter installs alone and its command exports"
