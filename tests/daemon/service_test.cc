#include "daemon/service.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "test_util.h"

namespace aotid::daemon {
namespace {

ServiceHost Host(ServicePlatform platform) {
  ServiceHost h;
  h.platform = platform;
  h.executable = "/usr/bin/true";  // readable by every user, outside the hidden trees
  h.home = "/home/ada";
  h.user = "ada";
  h.uid = 1000;
  return h;
}

const ServicePlan::File* FindFile(const ServicePlan& plan, const std::string& path) {
  for (const auto& f : plan.files) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

TEST(ServiceInstall, SystemServiceRefusesAnInstallItCannotRead) {
  for (const char* hidden : {"/home/ada/venv/bin/python3", "/tmp/venv/lib/aotid/libaotid_torch.so",
                             "/root/.pyenv/versions/3.11.7/bin/python3.11"}) {
    ServiceHost h = Host(ServicePlatform::kSystemd);
    h.reads = {"/usr/bin", hidden};
    auto plan = PlanServiceInstall(h, ServiceScope::kSystem);
    ASSERT_FALSE(plan.ok()) << hidden;
    EXPECT_NE(plan.status().message().find(hidden), std::string::npos) << plan.status().message();
  }
  // A file other users may not read is refused too. (It is made in a
  // temporary folder, itself under /tmp: that check is left out here.)
  aotid::testing::TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  std::string closed = dir / "closed";
  ASSERT_TRUE(fs::WriteFileAtomic(closed, "x").ok());
  ::chmod(closed.c_str(), 0600);
  ServiceHost h = Host(ServicePlatform::kSystemd);
  h.hidden_trees.clear();
  h.executable = closed;
  auto plan = PlanServiceInstall(h, ServiceScope::kSystem);
  ::unlink(closed.c_str());
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find(closed + " cannot be read by other users"), std::string::npos)
      << plan.status().message();
}

TEST(ServiceInstall, UserAndSystemUnitsRunThisExecutable) {
  ServiceHost h = Host(ServicePlatform::kSystemd);
  h.reads = {"/usr/bin"};
  auto user = PlanServiceInstall(h, ServiceScope::kUser);
  ASSERT_TRUE(user.ok()) << user.status().message();
  const auto* unit = FindFile(*user, "/home/ada/.config/systemd/user/aotid.service");
  ASSERT_NE(unit, nullptr);
  EXPECT_NE(unit->contents.find("\nExecStart=/usr/bin/true serve\n"), std::string::npos);
  EXPECT_EQ(unit->contents.find("/usr/local/bin/aotid"), std::string::npos);
  EXPECT_EQ(user->commands.back(),
            (std::vector<std::string>{"systemctl", "--user", "restart", "aotid.service"}));

  auto system = PlanServiceInstall(h, ServiceScope::kSystem);
  ASSERT_TRUE(system.ok()) << system.status().message();
  unit = FindFile(*system, "/etc/systemd/system/aotid.service");
  ASSERT_NE(unit, nullptr);
  EXPECT_NE(unit->contents.find("\nExecStart=/usr/bin/true --config /etc/aotid/aotid.toml"),
            std::string::npos);
  EXPECT_NE(unit->contents.find("\nDynamicUser=yes\n"), std::string::npos);
  const auto* config = FindFile(*system, "/etc/aotid/aotid.toml");
  ASSERT_NE(config, nullptr);
  EXPECT_TRUE(config->keep_existing);  // a config the admin changed is never overwritten
}

// An install path with a space, %, $ or & is one word of ExecStart (unit
// quoting and escapes) and well-formed XML in a plist.
TEST(ServiceInstall, OddInstallPathsAreQuoted) {
  ServiceHost h = Host(ServicePlatform::kSystemd);
  h.executable = "/opt/my venv/100%/$x/aotid";
  auto plan = PlanServiceInstall(h, ServiceScope::kUser);
  ASSERT_TRUE(plan.ok());
  const auto* unit = FindFile(*plan, "/home/ada/.config/systemd/user/aotid.service");
  ASSERT_NE(unit, nullptr);
  EXPECT_NE(unit->contents.find("\nExecStart=\"/opt/my venv/100%%/$$x/aotid\" serve\n"), std::string::npos)
      << unit->contents;
  EXPECT_NE(plan->notes[0].find("'/opt/my venv/100%/$x/aotid' add"), std::string::npos) << plan->notes[0];

  h = Host(ServicePlatform::kLaunchd);
  h.executable = "/Applications/R&D <tools>/aotid";
  plan = PlanServiceInstall(h, ServiceScope::kUser);
  ASSERT_TRUE(plan.ok());
  const auto* plist = FindFile(*plan, "/home/ada/Library/LaunchAgents/dev.aotid.plist");
  ASSERT_NE(plist, nullptr);
  EXPECT_NE(plist->contents.find("<string>/Applications/R&amp;D &lt;tools&gt;/aotid</string>"),
            std::string::npos);
  EXPECT_NE(plist->contents.find("<string>/home/ada/Library/Logs/aotid/aotid.log</string>"),
            std::string::npos);
}

TEST(ServiceInstall, LaunchDaemonNeverRunsAsRoot) {
  ServiceHost h = Host(ServicePlatform::kLaunchd);
  h.user = "root";
  h.uid = 0;
  auto plan = PlanServiceInstall(h, ServiceScope::kSystem);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("never as root"), std::string::npos);

  h.user = "ada";
  plan = PlanServiceInstall(h, ServiceScope::kSystem);
  ASSERT_TRUE(plan.ok());
  const auto* plist = FindFile(*plan, "/Library/LaunchDaemons/dev.aotid.plist");
  ASSERT_NE(plist, nullptr);
  EXPECT_NE(plist->contents.find("<key>UserName</key>\n  <string>ada</string>"), std::string::npos);
  EXPECT_EQ(plan->commands.back(), (std::vector<std::string>{"launchctl", "bootstrap", "system",
                                                             "/Library/LaunchDaemons/dev.aotid.plist"}));
}

TEST(ServiceInstall, UninstallLeavesTheStoreAndSaysWhere) {
  ServicePlan plan =
      PlanServiceUninstall(Host(ServicePlatform::kSystemd), ServiceScope::kUser, "/srv/models");
  EXPECT_EQ(plan.removes, (std::vector<std::string>{"/home/ada/.config/systemd/user/aotid.service",
                                                    "/home/ada/.config/systemd/user/aotid.socket"}));
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(plan.notes[0].find("/srv/models"), std::string::npos);
  for (const auto& r : plan.removes) EXPECT_EQ(r.find("/srv/models"), std::string::npos);
}

}  // namespace
}  // namespace aotid::daemon
