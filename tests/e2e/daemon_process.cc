#include "e2e/daemon_process.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#ifdef __linux__
#include <linux/capability.h>
#include <sys/prctl.h>
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <thread>

#include "base/fs.h"

extern char** environ;

namespace aotid::testing {
namespace {

// fork + exec rather than posix_spawn: the child may have to drop
// capabilities first. Everything the child touches is prepared before fork.
StatusOr<pid_t> Spawn(const std::vector<std::string>& args, const std::string& out_path, const RunOptions& opts) {
  std::vector<std::string> full = {AOTID_BINARY};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  // opts.env replaces variables of the same name.
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view var(*e);
    bool replaced = false;
    for (const auto& o : opts.env) replaced |= o.substr(0, o.find('=') + 1) == var.substr(0, var.find('=') + 1);
    if (!replaced) env_strings.emplace_back(*e);
  }
  env_strings.insert(env_strings.end(), opts.env.begin(), opts.env.end());
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  // LISTEN_PID is the child's own pid, written after fork into this buffer.
  char listen_pid[32] = "LISTEN_PID=";
  char listen_fds[] = "LISTEN_FDS=1";
  if (opts.listen_fd >= 0) {
    envp.push_back(listen_pid);
    envp.push_back(listen_fds);
  }
  envp.push_back(nullptr);
  int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out < 0) return ErrnoError("open " + out_path, errno);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out);
    return ErrnoError("fork", errno);
  }
  if (pid == 0) {
#ifdef __linux__
    if (opts.obey_file_modes) {
      // Root ignores file modes through these capabilities; dropping them
      // from the bounding set keeps them from coming back at exec.
      for (int cap : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER}) ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    }
    if (opts.without_sys_admin) ::prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0);
#endif
    if (opts.uid >= 0 &&
        (::setgroups(0, nullptr) != 0 || ::setgid(opts.uid) != 0 || ::setuid(opts.uid) != 0)) {
      ::_exit(126);
    }
    ::dup2(out, 1);
    ::dup2(out, 2);
    if (opts.listen_fd >= 0) {
      if (opts.listen_fd == 3) {
        ::fcntl(3, F_SETFD, 0);
      } else {
        ::dup2(opts.listen_fd, 3);  // without close-on-exec
      }
      std::snprintf(listen_pid + 11, sizeof listen_pid - 11, "%d", static_cast<int>(::getpid()));
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(out);
  return pid;
}

int DecodeWait(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

int RunAotid(const std::vector<std::string>& args, std::string* output) { return RunAotid(args, {}, output); }

int RunAotid(const std::vector<std::string>& args, const RunOptions& opts, std::string* output) {
  char templ[] = "/tmp/aotid-run-XXXXXX";
  int fd = ::mkstemp(templ);
  ::close(fd);
  auto pid = Spawn(args, templ, opts);
  if (!pid.ok()) return -1;
  int code = WaitExit(*pid);
  if (output != nullptr) *output = fs::ReadFile(templ).value();
  ::unlink(templ);
  return code;
}

StatusOr<pid_t> SpawnAotid(const std::vector<std::string>& args, const std::string& out_path, const RunOptions& opts) {
  return Spawn(args, out_path, opts);
}

int WaitExit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return DecodeWait(status);
}

int WaitExitFor(pid_t pid, int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return DecodeWait(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  return WaitExit(pid);
}

StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::vector<std::string>& args,
                                                              const std::string& log_path, const RunOptions& opts) {
  std::vector<std::string> full = {"serve"};
  full.insert(full.end(), args.begin(), args.end());
  ASSIGN_OR_RETURN(pid_t pid, Spawn(full, log_path, opts));
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

int DaemonProcess::Kill() {
  if (!Alive()) return exit_code_;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  exit_code_ = DecodeWait(status);
  return exit_code_;
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

std::map<std::string, std::string> LsRow(const std::string& ls_output, const std::string& name) {
  std::vector<std::string> lines;
  for (size_t at = 0; at < ls_output.size();) {
    size_t end = ls_output.find('\n', at);
    if (end == std::string::npos) end = ls_output.size();
    lines.push_back(ls_output.substr(at, end - at));
    at = end + 1;
  }
  auto trim = [](std::string s) {
    size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  for (size_t h = 0; h < lines.size(); ++h) {
    if (lines[h].rfind("NAME ", 0) != 0) continue;
    // Column starts: where each header word begins.
    std::vector<std::pair<size_t, std::string>> columns;
    for (size_t i = 0; i < lines[h].size(); ++i) {
      if (lines[h][i] != ' ' && (i == 0 || lines[h][i - 1] == ' ')) {
        size_t end = lines[h].find(' ', i);
        columns.emplace_back(i, lines[h].substr(i, end == std::string::npos ? end : end - i));
      }
    }
    for (size_t r = h + 1; r < lines.size(); ++r) {
      const std::string& row = lines[r];
      if (trim(row.substr(0, columns.size() > 1 ? columns[1].first : row.size())) != name) continue;
      std::map<std::string, std::string> cells;
      for (size_t c = 0; c < columns.size(); ++c) {
        size_t from = columns[c].first;
        size_t to = c + 1 < columns.size() ? columns[c + 1].first : std::string::npos;
        cells[columns[c].second] =
            from < row.size() ? trim(row.substr(from, to == std::string::npos ? to : to - from)) : "";
      }
      return cells;
    }
  }
  return {};
}

}  // namespace aotid::testing
