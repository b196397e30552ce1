// `aotid service install|uninstall|status`: aotid as a service of the
// machine's service manager, systemd on Linux and launchd on macOS, for
// this user (--user) or for the machine (--system).
//
// The files written are the ones in systemd/ and launchd/ (compiled in),
// with this installation's real paths put in. An install is first made into
// a plan, the directories, files and commands it takes, which --dry-run
// prints and which is otherwise carried out step by step, each step printed.
// A plan is refused when the service could not run what it names: under
// systemd's ProtectHome, PrivateTmp and DynamicUser, the system service
// reads nothing under /home, /root or /tmp, nor what other users may not
// read.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "daemon/config.h"

namespace aotid::daemon {

enum class ServiceScope { kUser, kSystem };
enum class ServicePlatform { kSystemd, kLaunchd };

// What an install depends on; Detect() fills it for this process.
struct ServiceHost {
  ServicePlatform platform = ServicePlatform::kSystemd;
  std::string executable;  // this aotid, absolute
  std::string home;        // $HOME
  std::string user;        // the user the LaunchDaemon runs as
  unsigned uid = 0;
  // Everything the service reads besides the executable: the torch plugin,
  // the compile worker, the Python (resolved) and torch.
  std::vector<std::string> reads;
  // What the system unit hides from the service, and by which setting.
  struct Hidden {
    std::string tree;
    std::string why;
  };
  std::vector<Hidden> hidden_trees = {{"/home", "systemd's ProtectHome= hides"},
                                      {"/root", "systemd's ProtectHome= hides"},
                                      {"/run/user", "systemd's ProtectHome= hides"},
                                      {"/tmp", "the service's PrivateTmp= replaces"},
                                      {"/var/tmp", "the service's PrivateTmp= replaces"},
                                      {"/dev/shm", "the service's PrivateDevices= replaces"}};

  static ServiceHost Detect(const Config& config);
};

struct ServicePlan {
  struct File {
    std::string path;
    std::string contents;
    unsigned mode = 0644;
    bool keep_existing = false;  // a config the user may have changed
  };
  struct Dir {
    std::string path;
    std::string owner;  // a user name; "" leaves it as made
  };
  std::vector<Dir> dirs;
  std::vector<File> files;
  std::vector<std::string> removes;  // after commands_may_fail
  std::vector<std::vector<std::string>> commands;
  std::vector<std::vector<std::string>> commands_may_fail;  // before `commands`: stopping what may not run
  std::vector<std::string> notes;                           // printed at the end
};

// The template files compiled in, by their path in the source tree
// ("systemd/aotid.service"); "" for an unknown one.
const std::string& ServiceTemplate(const std::string& name);

StatusOr<ServicePlan> PlanServiceInstall(const ServiceHost& host, ServiceScope scope);
ServicePlan PlanServiceUninstall(const ServiceHost& host, ServiceScope scope, const std::string& store);

// Whether the service manager the plan needs runs here (systemd as the
// machine's init, or the user's systemd manager; launchctl): checked before
// anything is written.
Status ServiceManagerRuns(const ServiceHost& host, ServiceScope scope);

// --dry-run: the plan as text (each file between "--- PATH" and "--- end").
std::string DescribePlan(const ServicePlan& plan);
// Carries the plan out, printing each step; stops at the first that fails.
Status ApplyPlan(const ServicePlan& plan);

// `aotid service status`: the service manager's view, then the API's
// readiness at the configured address. 0 when ready, 1 when not, 3 when the
// service is not running.
int ServiceStatus(const ServiceHost& host, ServiceScope scope, const Config& config);

}  // namespace aotid::daemon
