#!/usr/bin/env bash
# `./dev lint`: five checks of the C++ files (.cc, .h). By default on the
# files changed since this branch left main (commits, uncommitted changes
# and new files; AOTID_LINT_BASE names another base), with --all on every
# file. Fails when a check finds something.
#
#   format         clang-format (.clang-format). Changed files: only the
#                  changed lines (git clang-format), so touching a file that
#                  predates the check does not mean reformatting all of it;
#                  new files whole. --all: every file whole, where the files
#                  in scripts/format-baseline.txt, unformatted when the check
#                  came, are listed but do not fail.
#   tidy           clang-tidy (.clang-tidy) on the changed .cc files and the
#                  .cc beside each changed .h; --all: every file the build
#                  compiles.
#   thread-safety  clang's -Wthread-safety (base/thread_annotations.h) on
#                  every file the build compiles that includes the
#                  annotations, changed or not, with the build's flags.
#   macos          the macOS build, checked here (scripts/macos_check.sh):
#                  the changed .cc files and the .cc beside each changed .h
#                  compiled for macOS, the plugin linked against the macOS
#                  torch when one of its files changed; the shell scripts
#                  macOS runs against bash 3.2. --all: every .cc file.
#   layers         every include points down the layers scripts/layers.py
#                  writes down (never up or sideways), and the README's
#                  diagram of them is current; always every file.
#
#   scripts/lint.sh ROOT BUILD_DIR [--all] [--only format|tidy|thread-safety|macos|layers]
# tidy and thread-safety need a build (compile_commands.json and ninja's
# record of includes); `./dev lint` makes it.
set -euo pipefail
root="$1"
build="$2"
shift 2
all=0
steps=(format tidy thread-safety macos layers)
usage() { echo "usage: ./dev lint [--all] [--only format|tidy|thread-safety|macos|layers]" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --all) all=1 ;;
    --only)
      [[ "${2:-}" =~ ^(format|tidy|thread-safety|macos|layers)$ ]] || usage
      steps=("$2")
      shift
      ;;
    *) usage ;;
  esac
  shift
done
cd "$root"
jobs="${AOTID_JOBS:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)}"

# Reads stdin's lines into the array named $1: mapfile -t, which macOS's
# /bin/bash (3.2) lacks.
lines_into() {
  local _line
  eval "$1=()"
  while IFS= read -r _line; do eval "$1+=(\"\$_line\")"; done
}

python="$root/.venv/bin/python"
[[ -x "$python" ]] || python=python3

if ((all)); then
  lines_into files < <(git ls-files -- '*.cc' '*.h')
else
  base_ref="${AOTID_LINT_BASE:-main}"
  base="$(git merge-base HEAD "$base_ref" 2>/dev/null)" ||
    { echo "lint: no common commit with '$base_ref'; set AOTID_LINT_BASE to the branch to compare with" >&2; exit 2; }
  lines_into files < <({
    git diff --name-only --diff-filter=d "$base" -- '*.cc' '*.h'
    git ls-files --others --exclude-standard -- '*.cc' '*.h'
  } | sort -u)
  echo "lint: ${#files[@]} changed C++ files since $(git rev-parse --short "$base") ($base_ref)"
fi

failed=()

step_format() {
  local f bad=() known=() cleaned=()
  if ((all)); then
    local baseline="$root/scripts/format-baseline.txt"
    for f in ${files[@]+"${files[@]}"}; do
      if clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        grep -qxF "$f" "$baseline" && cleaned+=("$f")
      elif grep -qxF "$f" "$baseline"; then
        known+=("$f")
      else
        bad+=("$f")
      fi
    done
    ((${#known[@]})) && echo "format: ${#known[@]} files of scripts/format-baseline.txt still unformatted (not a failure)"
    ((${#cleaned[@]})) && echo "format: now formatted, remove from scripts/format-baseline.txt: ${cleaned[*]+${cleaned[*]}}"
    if ((${#bad[@]})); then
      echo "format: not clang-format clean (clang-format -i FILE): ${bad[*]+${bad[*]}}"
      return 1
    fi
  else
    local tracked=() untracked=() out
    for f in ${files[@]+"${files[@]}"}; do
      if git ls-files --error-unmatch -- "$f" >/dev/null 2>&1; then tracked+=("$f"); else untracked+=("$f"); fi
    done
    if ((${#tracked[@]})); then
      out="$(git clang-format --diff --extensions cc,h "$base" -- ${tracked[@]+"${tracked[@]}"})"
      if [[ -n "$out" && "$out" != *"no modified files to format"* && "$out" != *"did not modify any files"* ]]; then
        printf '%s\n' "$out"
        echo "format: changed lines above are not clang-format clean (fix: git clang-format $base)"
        return 1
      fi
    fi
    for f in ${untracked[@]+"${untracked[@]}"}; do
      clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    if ((${#bad[@]})); then
      echo "format: new files not clang-format clean (clang-format -i FILE): ${bad[*]+${bad[*]}}"
      return 1
    fi
  fi
  echo "format: ok"
}

# The project's files that compile_commands.json compiles, one per line.
compiled_files() {
  "$python" -c '
import json, os, sys
root = os.path.realpath(sys.argv[1])
seen = set()
for e in json.load(open(sys.argv[2])):
    f = os.path.relpath(os.path.realpath(os.path.join(e["directory"], e["file"])), root)
    if not f.startswith("..") and f not in seen:
        seen.add(f)
        print(f)' "$root" "$build/compile_commands.json"
}

step_tidy() {
  local tus=() f compiled
  compiled="$(compiled_files)"
  if ((all)); then
    lines_into tus <<<"$compiled"
  else
    for f in ${files[@]+"${files[@]}"}; do
      [[ "$f" == *.h ]] && f="${f%.h}.cc"
      grep -qxF "$f" <<<"$compiled" && tus+=("$f")
    done
    lines_into tus < <(printf '%s\n' ${tus[@]+"${tus[@]}"} | sort -u | sed '/^$/d')
  fi
  if ((${#tus[@]} == 0)); then
    echo "tidy: no compiled file changed"
    return 0
  fi
  echo "tidy: ${#tus[@]} files, $jobs at a time"
  local filter="^$root/(base|storage|model|platform|runtime|compile|http|serving|control|daemon|tests|bench)/"
  local log
  log="$(mktemp)"
  if ! printf '%s\0' ${tus[@]+"${tus[@]}"} |
    xargs -0 -P "$jobs" -n 1 clang-tidy -p "$build" --quiet --header-filter="$filter" >"$log" 2>&1; then
    grep -vE '^[0-9]+ warnings? (and [0-9]+ errors? )?generated|^Suppressed [0-9]+ warnings|^Use -header-filter' \
      "$log" || true
    rm -f "$log"
    echo "tidy: findings above (.clang-tidy lists the checks)"
    return 1
  fi
  rm -f "$log"
  echo "tidy: ok"
}

step_thread_safety() {
  # Every object whose recorded includes name the annotations; the first
  # dependency ninja records for an object is its source file.
  local tus=()
  lines_into tus < <(cd "$build" && ninja -t deps |
    awk '/^[^ \t]/ {first = 1; next} NF && first {src = $1; first = 0} /thread_annotations\.h$/ {print src}' |
    sort -u)
  if ((${#tus[@]} == 0)); then
    echo "thread-safety: no file includes base/thread_annotations.h (is $build built?)" >&2
    return 1
  fi
  echo "thread-safety: ${#tus[@]} files"
  # Each with the build's own command, clang++ for g++, only parsed.
  "$python" - "$build" "$jobs" ${tus[@]+"${tus[@]}"} <<'EOF' || { echo "thread-safety: findings above"; return 1; }
import concurrent.futures, json, os, shlex, subprocess, sys
build, jobs, wanted = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
wanted = {os.path.realpath(os.path.join(build, f)) for f in wanted}
commands = []
for e in json.load(open(os.path.join(build, "compile_commands.json"))):
    path = os.path.realpath(os.path.join(e["directory"], e["file"]))
    if path not in wanted:
        continue
    args, skip = [], False
    for a in shlex.split(e["command"])[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = True
        else:
            args.append(a)
    commands.append((e["directory"], path, ["clang++", *args, "-fsyntax-only", "-Wno-everything",
                                            "-Wthread-safety", "-Werror=thread-safety", path]))
def run(c):
    r = subprocess.run(c[2], cwd=c[0], capture_output=True, text=True)
    return c[1], r.returncode, r.stderr
bad = 0
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    for path, rc, err in pool.map(run, commands):
        if rc != 0:
            bad += 1
            sys.stdout.write(err)
sys.exit(1 if bad else 0)
EOF
  echo "thread-safety: ok"
}

step_macos() {
  if ((all)); then
    "$root/scripts/macos_check.sh" "$root"
    return
  fi
  local f tus=()
  for f in ${files[@]+"${files[@]}"}; do
    [[ "$f" == *.h ]] && f="${f%.h}.cc"
    [[ -f "$f" ]] && tus+=("$f")
  done
  if ((${#tus[@]} == 0)); then
    echo "macos: no C++ file changed"
    return 0
  fi
  "$root/scripts/macos_check.sh" "$root" ${tus[@]+"${tus[@]}"}
}

step_layers() {
  python3 "$root/scripts/layers.py" check "$root" || return 1
  echo "layers: ok"
}

for s in "${steps[@]}"; do
  "step_${s//-/_}" || failed+=("$s")
done
if ((${#failed[@]})); then
  echo "lint: failed: ${failed[*]+${failed[*]}}"
  exit 1
fi
echo "lint: ok"
