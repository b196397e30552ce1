#include "e2e/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <thread>

#include "base/fs.h"

extern char** environ;

namespace aotid::testing {
namespace {

StatusOr<pid_t> Spawn(const std::vector<std::string>& args, const std::string& out_path) {
  std::vector<std::string> full = {AOTID_BINARY};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return ErrnoError("spawn aotid", rc);
  return pid;
}

int DecodeWait(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

int RunAotid(const std::vector<std::string>& args, std::string* output) {
  char templ[] = "/tmp/aotid-run-XXXXXX";
  int fd = ::mkstemp(templ);
  ::close(fd);
  auto pid = Spawn(args, templ);
  if (!pid.ok()) return -1;
  int status = 0;
  ::waitpid(*pid, &status, 0);
  if (output != nullptr) *output = fs::ReadFile(templ).value();
  ::unlink(templ);
  return DecodeWait(status);
}

StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::vector<std::string>& args,
                                                              const std::string& log_path) {
  std::vector<std::string> full = {"serve"};
  full.insert(full.end(), args.begin(), args.end());
  ASSIGN_OR_RETURN(pid_t pid, Spawn(full, log_path));
  std::unique_ptr<DaemonProcess> d(new DaemonProcess);
  d->pid_ = pid;
  d->log_path_ = log_path;
  static const std::regex kServing(R"(serving on http://[^\s]*:(\d+)\n)");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch m;
    std::string log = d->Log();
    if (std::regex_search(log, m, kServing)) {
      d->port_ = std::stoi(m[1]);
      return d;
    }
    if (!d->Alive()) return Internal("aotid serve exited early:\n" + log);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Internal("aotid serve did not report its port within 60s:\n" + d->Log());
}

DaemonProcess::~DaemonProcess() { Stop(5); }

std::string DaemonProcess::Log() const {
  auto t = fs::ReadFile(log_path_);
  return t.ok() ? *t : "";
}

bool DaemonProcess::Alive() {
  if (exit_code_ >= 0) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ = DecodeWait(status);
    return false;
  }
  return true;
}

int DaemonProcess::Stop(int grace_s) {
  if (!Alive()) return exit_code_;
  ::kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!Alive()) return exit_code_;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  exit_code_ = DecodeWait(status);
  return exit_code_;
}

}  // namespace aotid::testing
