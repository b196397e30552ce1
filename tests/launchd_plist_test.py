"""The launchd plists parse as property lists and hold what launchd needs
to keep aotid running and its log out of /tmp.

    launchd_plist_test.py [--binary PATH] FILE.plist...

With --binary, ProgramArguments must start with that path (the plists
`aotid service install --dry-run` prints), else with /usr/local/bin/aotid
(the templates in launchd/)."""
import plistlib
import sys

args = sys.argv[1:]
binary = "/usr/local/bin/aotid"
generated = args[:1] == ["--binary"]
if generated:
    binary, args = args[1], args[2:]
failed = False
for path in args:
    with open(path, "rb") as f:
        plist = plistlib.load(f)
    problems = []
    for key, kind in {"Label": str, "ProgramArguments": list, "RunAtLoad": bool, "KeepAlive": dict,
                      "ProcessType": str, "StandardErrorPath": str, "ExitTimeOut": int}.items():
        if not isinstance(plist.get(key), kind):
            problems.append(f"{key} missing or not a {kind.__name__}")
    argv = plist.get("ProgramArguments", [])
    if argv[:1] != [binary] or "serve" not in argv:
        problems.append(f"ProgramArguments should run {binary} ... serve: {argv}")
    log_args = " ".join(argv) + " " + plist.get("StandardErrorPath", "")
    if "--log-file" not in argv or "/tmp/" in log_args or (generated and "USER" in log_args):
        problems.append("the log should be aotid's own rotating file in a real log folder, not under /tmp")
    if plist.get("KeepAlive", {}).get("SuccessfulExit") is not False:
        problems.append("KeepAlive should restart aotid when it does not exit cleanly")
    if "UserName" in plist and (plist["UserName"] in ("root", "") or (generated and plist["UserName"] == "USER")):
        problems.append("a launch daemon must not run aotid as root")
    if problems:
        print(f"{path}:\n  " + "\n  ".join(problems))
        failed = True
    else:
        print(f"{path}: parses, with {', '.join(sorted(plist))}")
sys.exit(1 if failed else 0)
