#!/usr/bin/env bash
# Runs a script of the deploy tests with the Python of their own venv:
#   in_venv.sh BASE_PYTHON SCRIPT [ARGS...]
# The venv lives under ~/.cache/aotid-dev, named by the Python version and a
# hash of tests/deploy/requirements.txt, and is made once (about 3 minutes:
# kserve brings its server's packages too); the dev venv stays as it is.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
base="$1"
shift
ver="$("$base" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
key="$(sha256sum < "$here/requirements.txt" | cut -c1-12)"
cache="${AOTID_DEV_CACHE:-$HOME/.cache/aotid-dev}"
venv="$cache/deploy-venv-$ver-$key"
mkdir -p "$cache"
if [[ ! -f "$venv/.complete" ]]; then
  # Two tests may start at once: one makes the venv, the other waits.
  exec 9>"$venv.lock"
  flock 9
  if [[ ! -f "$venv/.complete" ]]; then
    rm -rf "$venv"
    echo "making $venv (once)" >&2
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt" \
      > "$venv.log" 2>&1 || { cat "$venv.log" >&2; exit 1; }
    touch "$venv/.complete"
  fi
  flock -u 9
fi
exec "$venv/bin/python" "$@"
