"""scripts/bash32_check.py reports what macOS's bash 3.2 refuses, and only that.

    python tests/scripts/bash32_check_test.py SOURCE_DIR
"""
import os
import subprocess
import sys
import tempfile

check = os.path.join(sys.argv[1], "scripts", "bash32_check.py")

REFUSED = {
    "empty array under set -u": 'set -u\nopts=()\ncmake "${opts[@]}"\n',
    "array filled by a loop": 'set -eu\nfor f in a; do xs+=("$f"); done\nxs=()\necho "${xs[*]}"\n',
    "array from \"$@\"": 'set -u\nargs=("$@")\nprintf "%s" "${args[@]}"\n',
    "mapfile": "mapfile -t lines < f\n",
    "associative array": "declare -A seen\n",
    "case modification": 'echo "${name^^}"\n',
    "append both streams": "make &>> log\n",
}
ACCEPTED = {
    "the idiom": 'set -u\nopts=()\ncmake ${opts[@]+"${opts[@]}"}\n',
    "a literal list": 'set -u\nsteps=(format tidy)\nfor s in "${steps[@]}"; do :; done\n',
    "no set -u": 'opts=()\ncmake "${opts[@]}"\n',
    "a count": 'set -u\nxs=()\necho "${#xs[@]}"\n',
    "a comment": "# mapfile is bash 4\n",
    "an acknowledged line": "mapfile -t x < f  # bash32: ok (runs on Linux only)\n",
}


def run(text):
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([sys.executable, check, f.name], capture_output=True, text=True)
        return r.returncode, r.stdout
    finally:
        os.unlink(f.name)


failures = []
for name, text in REFUSED.items():
    rc, out = run(text)
    if rc != 1 or ".sh:" not in out:
        failures.append(f"not reported: {name}\n{out}")
for name, text in ACCEPTED.items():
    rc, out = run(text)
    if rc != 0:
        failures.append(f"reported, wrongly: {name}\n{out}")
for f in failures:
    print(f)
print(f"{len(REFUSED) + len(ACCEPTED) - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
