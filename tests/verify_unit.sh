#!/usr/bin/env bash
# Checks the systemd units with systemd-analyze, pointing them at the aotid
# binary just built: `verify` on each, and `security --offline=yes` on the
# service, whose exposure must stay at most 2.0.
set -euo pipefail
unit_dir="$1"
binary="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
for unit in aotid.service aotid.socket; do
  sed "s|/usr/local/bin/aotid|$binary|g" "$unit_dir/$unit" > "$dir/$unit"
done
out="$(cd "$dir" && systemd-analyze verify aotid.service aotid.socket 2>&1)" || { echo "$out"; exit 1; }
# verify exits 0 on some warnings; any line about our units is a failure.
if grep -q "aotid\.\(service\|socket\)" <<<"$out"; then echo "$out"; exit 1; fi
echo "systemd/aotid.service and aotid.socket verified"
sec="$(cd "$dir" && systemd-analyze security --offline=yes aotid.service 2>&1)" || true
level="$(sed -n 's/.*Overall exposure level for aotid.service: \([0-9.]*\).*/\1/p' <<<"$sec")"
if [[ -z "$level" ]]; then echo "$sec"; echo "no exposure level in the output"; exit 1; fi
echo "systemd-analyze security: exposure $level"
awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }' || { echo "$sec"; echo "exposure $level is above 2.0"; exit 1; }
