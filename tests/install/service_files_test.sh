#!/usr/bin/env bash
# What `aotid service install --dry-run` writes, with this installation's
# paths, for each scope and service manager:
#   the system unit and socket pass `systemd-analyze verify` and the
#   offline security check (exposure at most 2.0), and run this binary;
#   the user unit and socket pass `systemd-analyze --user verify`;
#   the launchd agent and daemon plists parse with the keys launchd needs;
#   a dry run changes nothing; uninstall says the store stays.
#
#   service_files_test.sh AOTID TESTS_DIR PYTHON
set -euo pipefail
aotid="$1"
tests="$2"
python="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Each "--- PATH" ... "--- end" block of a dry run into DIR/basename(PATH).
extract() {
  mkdir -p "$1"
  awk -v d="$1" '/^--- end$/ { f = ""; next } /^--- / { f = $2; sub(/.*\//, "", f); f = d "/" f; next }
                 f { print > f }'
}
state() { ls -la /etc/systemd/system/aotid.* /etc/aotid "$HOME/.config/systemd/user/aotid.service" 2>&1 || true; }
before="$(state)"

if ! "$aotid" service install --dry-run --system > "$dir/system.txt" 2>&1; then
  # An install the system service cannot read is refused, naming why.
  case "$aotid" in
    /tmp/* | /home/* | /root/*)
      grep -q "the system service could not run this installation" "$dir/system.txt" || { cat "$dir/system.txt"; fail "refused without the reason"; }
      echo "an install under ${aotid%%/aotid*} is refused for the system service"
      exit_after_system=1 ;;
    *) cat "$dir/system.txt"; fail "service install --dry-run --system" ;;
  esac
fi
if [[ -z "${exit_after_system:-}" ]]; then
extract "$dir/system" < "$dir/system.txt"
grep -qx "ExecStart=$aotid --config /etc/aotid/aotid.toml --store /var/lib/aotid serve" "$dir/system/aotid.service" ||
  fail "the system unit does not run $aotid: $(grep ExecStart "$dir/system/aotid.service")"
grep -q "^would write /etc/aotid/aotid.toml (mode 0644, unless it exists)" "$dir/system.txt" ||
  fail "the system service's config is not written"
grep -q "^would run systemctl enable aotid.service" "$dir/system.txt" || fail "the system service is not enabled"
"$tests/verify_unit.sh" "$dir/system" "$aotid"
fi

"$aotid" service install --dry-run --user > "$dir/user.txt"
extract "$dir/user" < "$dir/user.txt"
grep -qx "ExecStart=$aotid serve" "$dir/user/aotid.service" || fail "the user unit does not run $aotid"
grep -q "^would run systemctl --user enable aotid.service" "$dir/user.txt" || fail "the user service is not enabled"
mkdir -p "$dir/runtime"
out="$(cd "$dir/user" && XDG_RUNTIME_DIR="$dir/runtime" systemd-analyze --user verify ./aotid.service ./aotid.socket 2>&1)" ||
  { echo "$out"; fail "systemd-analyze --user verify"; }
if grep -q "aotid\.\(service\|socket\)" <<<"$out"; then echo "$out"; fail "systemd-analyze --user verify"; fi
echo "the user unit and socket verify"

"$aotid" service install --dry-run --user --platform launchd | extract "$dir/agent"
SUDO_USER=nobody "$aotid" service install --dry-run --system --platform launchd | extract "$dir/daemon"
"$python" "$tests/launchd_plist_test.py" --binary "$aotid" "$dir/agent/dev.aotid.plist" "$dir/daemon/dev.aotid.plist"
grep -q "<string>$HOME/Library/Logs/aotid/aotid.log</string>" "$dir/agent/dev.aotid.plist" ||
  fail "the agent does not log to the user's log folder"
grep -q "<string>nobody</string>" "$dir/daemon/dev.aotid.plist" || fail "the launch daemon does not run as the user"

"$aotid" service uninstall --dry-run --user | grep -q "the store stays in" || fail "uninstall does not say where the store is"
[[ "$before" == "$(state)" ]] || fail "a dry run changed the service files"
echo "service files ok"
