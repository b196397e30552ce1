#!/usr/bin/env bash
# Checks systemd/aotid.service with systemd-analyze, pointing it at the
# aotid binary just built.
set -euo pipefail
unit_src="$1"
binary="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
sed "s|/usr/local/bin/aotid|$binary|g" "$unit_src" > "$dir/aotid.service"
out="$(systemd-analyze verify "$dir/aotid.service" 2>&1)" || { echo "$out"; exit 1; }
# verify exits 0 on some warnings; any line about our unit is a failure.
if grep -q "aotid.service" <<<"$out"; then echo "$out"; exit 1; fi
echo "systemd/aotid.service verified"
