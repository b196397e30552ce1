"""The launchd plists parse as property lists and hold what launchd needs
to keep aotid running and its log out of /tmp."""
import plistlib
import sys

path = sys.argv[1]
with open(path, "rb") as f:
    plist = plistlib.load(f)
problems = []
for key, kind in {"Label": str, "ProgramArguments": list, "RunAtLoad": bool, "KeepAlive": dict,
                  "ProcessType": str, "StandardErrorPath": str, "ExitTimeOut": int}.items():
    if not isinstance(plist.get(key), kind):
        problems.append(f"{key} missing or not a {kind.__name__}")
args = plist.get("ProgramArguments", [])
if args[:2] != ["/usr/local/bin/aotid", "serve"]:
    problems.append(f"ProgramArguments should start aotid serve: {args}")
if "--log-file" not in args or "/tmp/" in " ".join(args) or "/tmp/" in plist.get("StandardErrorPath", ""):
    problems.append("the log should be aotid's own rotating file, not under /tmp")
if plist.get("KeepAlive", {}).get("SuccessfulExit") is not False:
    problems.append("KeepAlive should restart aotid when it does not exit cleanly")
if problems:
    print(f"{path}:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"{path}: parses, with {', '.join(sorted(plist))}")
