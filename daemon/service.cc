#include "daemon/service.h"

#include <fcntl.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "base/fs.h"
#include "daemon/api_client.h"
#include "platform/install_layout.h"
#include "runtime/torch_plugin.h"

extern char** environ;

namespace aotid::daemon {
namespace {

constexpr char kUnit[] = "aotid.service";
constexpr char kSocket[] = "aotid.socket";
constexpr char kLabel[] = "dev.aotid";
constexpr char kTemplateBinary[] = "/usr/local/bin/aotid";

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// `name` as the shell would run it: a path, or found on PATH.
std::string Which(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return name;
}

bool Under(const std::string& path, const std::string& dir) {
  return path == dir || path.compare(0, dir.size() + 1, dir + "/") == 0;
}

// Why the system service, running as a user of its own, with /home, /root
// and /tmp out of its sight, could not read `path`; "" when it can.
std::string WhyUnreachable(const std::string& path, const std::vector<ServiceHost::Hidden>& hidden_trees) {
  std::string real = fs::RealPath(path);
  for (const auto& [tree, why] : hidden_trees) {
    if (Under(real, tree)) return real + " lies under " + tree + ", which " + why;
  }
  struct stat st;
  if (::stat(real.c_str(), &st) != 0) return real + " does not exist";
  if ((st.st_mode & S_IROTH) == 0)
    return real + " cannot be read by other users (the service runs as its own)";
  for (std::string dir = real; dir.size() > 1;) {
    dir = dir.substr(0, std::max<size_t>(1, dir.rfind('/')));
    if (::stat(dir.c_str(), &st) == 0 && (st.st_mode & S_IXOTH) == 0) {
      return dir + " cannot be entered by other users (the service runs as its own)";
    }
  }
  return "";
}

// A path as one word of a unit file's command line: % and $ escaped (unit
// specifiers and variables), quoted when it holds a space or a quote.
std::string SystemdWord(const std::string& path) {
  std::string out;
  bool quote = false;
  for (char c : path) {
    if (c == '%') {
      out += "%%";
    } else if (c == '$') {
      out += "$$";
    } else if (c == '"' || c == '\\') {
      out += std::string("\\") + c;
      quote = true;
    } else {
      out += c;
    }
    if (c == ' ' || c == '\t' || c == '\'') quote = true;
  }
  return quote ? "\"" + out + "\"" : out;
}

std::string XmlText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Quote(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    bool plain = !a.empty() && a.find_first_of(" \t'\"$\\") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? a : "'" + Replace(a, "'", "'\\''") + "'");
  }
  return out;
}

// Runs argv with this process's stdout and stderr; its exit status, or -1.
int Run(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  if (::posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string UnitDir(const ServiceHost& host, ServiceScope scope) {
  return scope == ServiceScope::kSystem ? "/etc/systemd/system" : host.home + "/.config/systemd/user";
}

std::vector<std::string> Systemctl(ServiceScope scope, std::vector<std::string> args) {
  std::vector<std::string> argv{"systemctl"};
  if (scope == ServiceScope::kUser) argv.push_back("--user");
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::string LaunchdDomain(const ServiceHost& host, ServiceScope scope) {
  return scope == ServiceScope::kSystem ? "system" : "gui/" + std::to_string(host.uid);
}

std::string PlistPath(const ServiceHost& host, ServiceScope scope) {
  return scope == ServiceScope::kSystem ? std::string("/Library/LaunchDaemons/") + kLabel + ".plist"
                                        : host.home + "/Library/LaunchAgents/" + kLabel + ".plist";
}

}  // namespace

Status ServiceManagerRuns(const ServiceHost& host, ServiceScope scope) {
  if (host.platform == ServicePlatform::kLaunchd) {
    return Which("launchctl") == "launchctl"
               ? FailedPrecondition("launchctl is not on this machine (not macOS?)")
               : Status::OK();
  }
  if (scope == ServiceScope::kSystem) {
    if (!fs::IsDirectory("/run/systemd/system")) {
      return FailedPrecondition(
          "systemd does not run this machine (no /run/systemd/system: a container, or another init)");
    }
    return Status::OK();
  }
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  std::string dir = runtime_dir && *runtime_dir ? runtime_dir : "/run/user/" + std::to_string(host.uid);
  if (!fs::Exists(dir + "/systemd/private") && !fs::Exists(dir + "/bus")) {
    return FailedPrecondition("no systemd user manager runs for this user (nothing at " + dir +
                              "/systemd/private): log in to a session, or as root `loginctl enable-linger " +
                              host.user + "`, or install the system service (--system)");
  }
  return Status::OK();
}

const std::string& ServiceTemplate(const std::string& name) {
  static const std::map<std::string, std::string> templates = {
#include "daemon/service_templates.inc"
  };
  static const std::string none;
  auto it = templates.find(name);
  return it == templates.end() ? none : it->second;
}

ServiceHost ServiceHost::Detect(const Config& config) {
  ServiceHost h;
#ifdef __APPLE__
  h.platform = ServicePlatform::kLaunchd;
#endif
  h.executable = fs::ExecutablePath();
  const char* home = std::getenv("HOME");
  h.uid = ::getuid();
  if (const passwd* pw = ::getpwuid(h.uid)) {
    h.user = pw->pw_name;
    if (home == nullptr || *home == '\0') home = pw->pw_dir;
  }
  h.home = home ? home : "";
  // Under sudo, a launch daemon runs as the user who asked for it.
  if (const char* sudo_user = std::getenv("SUDO_USER"); h.uid == 0 && sudo_user && *sudo_user)
    h.user = sudo_user;
  for (const auto& p : platform::PluginCandidates()) {
    if (fs::Exists(p)) {
      h.reads.push_back(p);
      break;
    }
  }
  if (!config.worker_dir.empty()) h.reads.push_back(config.worker_dir);
  h.reads.push_back(Which(config.python));
  // torch, where the plugin finds it (its start-up, once).
  if (runtime::LoadTorchPlugin().ok()) {
    if (std::string torch = platform::LoadedTorchDir(); !torch.empty()) {
      h.reads.push_back(torch);
      // The libraries the runners and builds load, each readable.
      std::error_code ec;
      for (const auto& f : std::filesystem::directory_iterator(torch + "/lib", ec)) {
        if (f.path().filename().string().find(".so") != std::string::npos)
          h.reads.push_back(f.path().string());
      }
    }
  }
  return h;
}

StatusOr<ServicePlan> PlanServiceInstall(const ServiceHost& host, ServiceScope scope) {
  if (host.executable.empty()) return FailedPrecondition("cannot tell where this aotid executable is");
  ServicePlan plan;
  const std::string exe = Quote({host.executable});  // for the lines printed
  const bool system = scope == ServiceScope::kSystem;
  if (host.platform == ServicePlatform::kSystemd) {
    if (system) {
      std::vector<std::string> unreachable;
      std::vector<std::string> paths{host.executable};
      paths.insert(paths.end(), host.reads.begin(), host.reads.end());
      for (const auto& p : paths) {
        std::string why = WhyUnreachable(p, host.hidden_trees);
        if (!why.empty() && std::find(unreachable.begin(), unreachable.end(), why) == unreachable.end()) {
          unreachable.push_back(why);
        }
      }
      if (!unreachable.empty()) {
        std::string list;
        for (const auto& u : unreachable) list += "\n  " + u;
        return FailedPrecondition(
            "the system service could not run this installation:" + list +
            "\ninstall aotid into a venv every user can read, made from a Python outside /home and /root "
            "(`sudo /usr/bin/python3 -m venv /opt/aotid`, then the README's Install steps with "
            "/opt/aotid/bin/pip), "
            "and run `sudo /opt/aotid/bin/aotid service install --system`; or install this one as your "
            "user's service: `aotid service install --user`");
      }
    }
    std::string dir = UnitDir(host, scope);
    plan.dirs.push_back({dir, ""});
    if (system) {
      plan.dirs.push_back({"/etc/aotid", ""});
      plan.files.push_back({"/etc/aotid/aotid.toml", ServiceTemplate("configs/aotid.toml"), 0644, true});
    }
    std::string unit = ServiceTemplate(system ? "systemd/aotid.service" : "systemd/aotid-user.service");
    unit = Replace(unit, std::string("ExecStart=") + kTemplateBinary,
                   "ExecStart=" + SystemdWord(host.executable));
    // The README installed beside this aotid, when there is one.
    std::string readme = fs::RealPath(host.executable.substr(0, host.executable.rfind('/')) + "/..") +
                         "/share/aotid/README.md";
    unit = Replace(unit, "Documentation=file:///usr/local/share/doc/aotid/README.md\n",
                   fs::Exists(readme) && readme.find_first_of(" %$\"\\") == std::string::npos
                       ? "Documentation=file://" + readme + "\n"
                       : "");
    plan.files.push_back({dir + "/" + kUnit, unit, 0644, false});
    plan.files.push_back({dir + "/" + kSocket, ServiceTemplate("systemd/aotid.socket"), 0644, false});
    plan.commands.push_back(Systemctl(scope, {"daemon-reload"}));
    plan.commands.push_back(Systemctl(scope, {"enable", kUnit}));
    plan.commands.push_back(Systemctl(scope, {"restart", kUnit}));
    std::string sudo = system ? "sudo " : "";
    std::string flag = system ? " --system" : " --user";
    if (system) {
      plan.notes.push_back("the store is /var/lib/aotid: systemd makes it, for the service's own user");
      plan.notes.push_back("add a model: sudo " + exe +
                           " --store /var/lib/aotid add FILE.pt2 --name NAME (the service serves it)");
      plan.notes.push_back(
          "its configuration: /etc/aotid/aotid.toml (`sudo systemctl reload aotid` rereads it)");
      plan.notes.push_back("its log: journalctl -u aotid");
    } else {
      plan.notes.push_back("add a model: " + exe + " add FILE.pt2 --name NAME (the service serves it)");
      plan.notes.push_back("its log: journalctl --user -u aotid");
      plan.notes.push_back("to keep it running when you are logged out: loginctl enable-linger " + host.user);
    }
    plan.notes.push_back("is it ready: " + sudo + exe + " service status" + flag);
    return plan;
  }

  // launchd
  std::string plist_path = PlistPath(host, scope);
  std::string plist;
  if (system) {
    if (host.user.empty() || host.user == "root") {
      return FailedPrecondition(
          "a launch daemon runs aotid as a user, never as root: run `sudo aotid service install --system` "
          "from that user's account");
    }
    plist =
        Replace(ServiceTemplate("launchd/dev.aotid.daemon.plist"), ">USER<", ">" + XmlText(host.user) + "<");
    plan.dirs.push_back({"/Library/LaunchDaemons", ""});
    plan.dirs.push_back({"/usr/local/var/aotid", host.user});
    plan.dirs.push_back({"/Library/Logs/aotid", host.user});
    plan.notes.push_back("the store is /usr/local/var/aotid; add a model: " + exe +
                         " --store /usr/local/var/aotid add FILE.pt2 --name NAME");
    plan.notes.push_back("its log: /Library/Logs/aotid/aotid.log");
  } else {
    plist = Replace(ServiceTemplate("launchd/dev.aotid.plist"), "<string>/Users/USER/",
                    "<string>" + XmlText(host.home) + "/");
    plan.dirs.push_back({host.home + "/Library/LaunchAgents", ""});
    plan.dirs.push_back({host.home + "/Library/Logs/aotid", ""});
    plan.notes.push_back("add a model: " + exe + " add FILE.pt2 --name NAME (the service serves it)");
    plan.notes.push_back("its log: " + host.home + "/Library/Logs/aotid/aotid.log");
  }
  plist = Replace(plist, std::string("<string>") + kTemplateBinary + "</string>",
                  "<string>" + XmlText(host.executable) + "</string>");
  plan.files.push_back({plist_path, plist, 0644, false});
  std::string domain = LaunchdDomain(host, scope);
  plan.commands_may_fail.push_back({"launchctl", "bootout", domain + "/" + kLabel});
  plan.commands.push_back({"launchctl", "bootstrap", domain, plist_path});
  plan.notes.push_back(std::string("is it ready: ") + (system ? "sudo " : "") + exe + " service status" +
                       (system ? " --system" : " --user"));
  return plan;
}

ServicePlan PlanServiceUninstall(const ServiceHost& host, ServiceScope scope, const std::string& store) {
  ServicePlan plan;
  const bool system = scope == ServiceScope::kSystem;
  if (host.platform == ServicePlatform::kSystemd) {
    plan.commands_may_fail.push_back(Systemctl(scope, {"disable", "--now", kUnit, kSocket}));
    std::string dir = UnitDir(host, scope);
    plan.removes = {dir + "/" + kUnit, dir + "/" + kSocket};
    plan.commands.push_back(Systemctl(scope, {"daemon-reload"}));
    plan.notes.push_back(
        system ? "the store stays in /var/lib/aotid (/var/lib/private/aotid), and "
                 "/etc/aotid/aotid.toml stays: remove them yourself if you no longer want them"
               : "the store stays in " + store + ": remove it yourself if you no longer want it");
    return plan;
  }
  plan.commands_may_fail.push_back({"launchctl", "bootout", LaunchdDomain(host, scope) + "/" + kLabel});
  plan.removes = {PlistPath(host, scope)};
  plan.notes.push_back(std::string("the store stays in ") + (system ? "/usr/local/var/aotid" : store) +
                       ": remove it yourself if you no longer want it");
  return plan;
}

std::string DescribePlan(const ServicePlan& plan) {
  std::string out;
  for (const auto& d : plan.dirs) {
    if (fs::IsDirectory(d.path) && d.owner.empty()) continue;
    out += "would create the directory " + d.path + (d.owner.empty() ? "" : ", owned by " + d.owner) + "\n";
  }
  for (const auto& f : plan.files) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", f.mode);
    out +=
        "would write " + f.path + " (mode " + mode + (f.keep_existing ? ", unless it exists" : "") + "):\n";
    out += "--- " + f.path + "\n" + f.contents + (f.contents.ends_with('\n') ? "" : "\n") + "--- end\n";
  }
  for (const auto& c : plan.commands_may_fail) out += "would run " + Quote(c) + " (failing is fine)\n";
  for (const auto& r : plan.removes) out += "would remove " + r + "\n";
  for (const auto& c : plan.commands) out += "would run " + Quote(c) + "\n";
  return out;
}

Status ApplyPlan(const ServicePlan& plan) {
  for (const auto& d : plan.dirs) {
    bool existed = fs::IsDirectory(d.path);
    RETURN_IF_ERROR(fs::MakeDirs(d.path));
    if (!d.owner.empty()) {
      const passwd* pw = ::getpwnam(d.owner.c_str());
      if (pw == nullptr) return NotFound("no user " + d.owner);
      if (::chown(d.path.c_str(), pw->pw_uid, pw->pw_gid) != 0) return ErrnoError("chown " + d.path, errno);
    }
    if (!existed) std::printf("made %s\n", d.path.c_str());
  }
  for (const auto& f : plan.files) {
    if (f.keep_existing && fs::Exists(f.path)) {
      std::printf("kept %s (it exists)\n", f.path.c_str());
      continue;
    }
    RETURN_IF_ERROR(fs::WriteFileAtomic(f.path, f.contents));
    // Its mode whatever the umask (sudo's may be 077).
    if (::chmod(f.path.c_str(), f.mode) != 0) return ErrnoError("chmod " + f.path, errno);
    std::printf("wrote %s\n", f.path.c_str());
  }
  std::fflush(stdout);
  for (const auto& c : plan.commands_may_fail) {
    std::printf("+ %s\n", Quote(c).c_str());
    std::fflush(stdout);
    (void)Run(c);
  }
  for (const auto& r : plan.removes) {
    if (::unlink(r.c_str()) == 0) {
      std::printf("removed %s\n", r.c_str());
    } else if (errno != ENOENT) {
      return ErrnoError("remove " + r, errno);
    }
  }
  for (const auto& c : plan.commands) {
    std::printf("+ %s\n", Quote(c).c_str());
    std::fflush(stdout);
    if (int rc = Run(c); rc != 0) {
      return Unavailable(Quote(c) +
                         (rc < 0 ? " could not run" : " failed with exit status " + std::to_string(rc)));
    }
  }
  return Status::OK();
}

int ServiceStatus(const ServiceHost& host, ServiceScope scope, const Config& config) {
  bool running = false;
  const bool systemd = host.platform == ServicePlatform::kSystemd;
  std::string file = systemd ? UnitDir(host, scope) + "/" + kUnit : PlistPath(host, scope);
  bool installed = fs::Exists(file);
  std::printf("service file: %s%s\n", file.c_str(), installed ? "" : " (not installed)");
  Status manager = ServiceManagerRuns(host, scope);
  if (!manager.ok()) {
    std::printf("service manager: %s\n", manager.message().c_str());
  } else if (installed) {
    std::fflush(stdout);
    if (systemd) {
      (void)Run(Systemctl(scope, {"--no-pager", "--lines=5", "status", kUnit}));
      running = Run(Systemctl(scope, {"--quiet", "is-active", kUnit})) == 0;
    } else {
      running = Run({"launchctl", "print", LaunchdDomain(host, scope) + "/" + kLabel}) == 0;
    }
    std::printf("service: %s\n", running ? "running" : "not running");
  }
  std::string token = ReadTokenQuietly(config.token_file);
  std::string where = FormatListen(config.api.server);
  HttpAnswer live = ApiCall(config.api.server, "GET", "/v2/health/live", token, 3000);
  std::printf("aotid API at %s:\n", where.c_str());
  if (live.status == 0) {
    std::printf("  not answering (%s)%s\n", live.error.c_str(),
                running ? "; the service runs: it may still be starting, or listen elsewhere" : "");
    return 3;
  }
  if (live.status == 401 || live.status == 403) {
    std::printf("  answers, but refuses this request (%d): server.token_file %s\n", live.status,
                token.empty() ? "is not set in this config" : "holds another token");
    return 1;
  }
  HttpAnswer ready = ApiCall(config.api.server, "GET", "/v2/health/ready", token, 3000);
  std::printf(
      "  live: %s\n  ready: %s\n",
      live.status == 200 ? "yes" : ("no (" + std::to_string(live.status) + ")").c_str(),
      ready.status == 200 ? "yes" : ("no: " + (ready.body.empty() ? ready.error : ready.body)).c_str());
  return ready.status == 200 ? 0 : 1;
}

}  // namespace aotid::daemon
