# Sourced by the bench/*.sh scripts after `set -euo pipefail`: takes
# BUILD_DIR and PYTHON from the script's arguments, makes a scratch folder
# ($work, removed on exit with any daemon still running), and exports the
# test models into $work/models.
BUILD="$1"
PY="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AOTID="$BUILD/aotid"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
if [[ -z ${AOTID_BENCH_NO_TEST_MODELS:-} ]]; then
  PYTHONPATH="$ROOT/python" "$PY" -W ignore "$ROOT/tests/models/make_test_models.py" --out "$work/models" >/dev/null
fi

now_ms() { date +%s%3N; }
port_of() { grep -o 'serving on http://[^ ]*' "$1" | head -1 | sed 's/.*://'; }
