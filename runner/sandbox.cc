#include "runner/sandbox.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#ifdef __linux__
#include <link.h>
#include <linux/landlock.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#endif

namespace aotid::runner {

std::string SandboxReport::Describe() const {
  std::string s = landlock_abi > 0 ? "landlock (ABI " + std::to_string(landlock_abi) + ")" : "no landlock";
  s += seccomp ? ", seccomp" : ", no seccomp";
  return s;
}

std::string SandboxSupport::Describe() const {
  std::string s = landlock_abi > 0 ? "landlock ABI " + std::to_string(landlock_abi)
                                   : "no landlock (runners can read every file this user can)";
  s += seccomp ? ", seccomp" : ", no seccomp (runners can open sockets and start processes)";
  return s;
}

SandboxSupport ProbeSandbox() {
  SandboxSupport s;
#ifdef __linux__
  long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  s.landlock_abi = abi > 0 ? static_cast<int>(abi) : 0;
  s.seccomp = ::prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0;
#endif
  return s;
}

Status EnterLimits(const SandboxOptions& options, int parent_pid) {
  auto limit = [](int resource, rlim_t value, const char* what) -> Status {
    struct rlimit rl {
      value, value
    };
    if (::setrlimit(resource, &rl) != 0) {
      return Internal(std::string("cannot set the runner's ") + what + " limit: " + std::strerror(errno));
    }
    return Status::OK();
  };
  if (options.memory_limit_bytes > 0) {
    RETURN_IF_ERROR(limit(RLIMIT_DATA, static_cast<rlim_t>(options.memory_limit_bytes), "memory"));
  }
  RETURN_IF_ERROR(limit(RLIMIT_CORE, 0, "core file"));
  RETURN_IF_ERROR(limit(RLIMIT_FSIZE, rlim_t{1} << 30, "file size"));
#ifdef __linux__
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return Internal(std::string("cannot drop new privileges: ") + std::strerror(errno));
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
#endif
  // The parent may have died before the death signal was asked for.
  if (parent_pid > 0 && ::getppid() != parent_pid)
    return FailedPrecondition("the daemon that started this runner is gone");
  return Status::OK();
}

GpuPaths FindGpuPaths(const std::string& dev_dir, const std::vector<std::string>& library_dirs) {
  namespace stdfs = std::filesystem;
  std::set<std::string> devices, dirs;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dev_dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.starts_with("nvidia") || name == "dri") devices.insert(e.path().string());
  }
  auto add_if_dir = [&](const stdfs::path& p) {
    std::error_code dir_ec;
    if (stdfs::is_directory(p, dir_ec)) dirs.insert(p.lexically_normal().string());
  };
  for (const std::string& dir : library_dirs) {
    stdfs::path p = stdfs::path(dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // a trailing slash
    stdfs::path site;
    if (p.filename() == "lib" && p.parent_path().filename() == "torch") {
      site = p.parent_path().parent_path();  // SITE/torch/lib
      add_if_dir(p.parent_path());
    } else {
      // SITE/nvidia/PACKAGE/lib (or deeper), SITE a site-packages (or
      // Debian's dist-packages) folder: a library of an NVIDIA package.
      for (stdfs::path up = p; up.has_relative_path(); up = up.parent_path()) {
        if (up.filename() == "nvidia" && up != p &&
            up.parent_path().filename().string().ends_with("-packages")) {
          site = up.parent_path();
          break;
        }
      }
    }
    if (!site.empty()) add_if_dir(site / "nvidia");
  }
  return {{devices.begin(), devices.end()}, {dirs.begin(), dirs.end()}};
}

#ifdef __linux__
namespace {

// Landlock's ABI beyond what Debian 12's header spells.
constexpr uint64_t kFsRefer = 1ULL << 13;     // ABI 2
constexpr uint64_t kFsTruncate = 1ULL << 14;  // ABI 3
constexpr uint64_t kNetBindTcp = 1ULL << 0;   // ABI 4
constexpr uint64_t kNetConnectTcp = 1ULL << 1;
constexpr uint64_t kScopeAbstractUnix = 1ULL << 0;  // ABI 6
constexpr uint64_t kScopeSignal = 1ULL << 1;
struct RulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};
struct PathBeneath {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

constexpr uint64_t kFsFileRights =
    LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE;
constexpr uint64_t kFsRead =
    LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;

// Directories of every shared library loaded so far (libtorch's, the
// plugin's): lazily loaded parts of them must still be found.
std::set<std::string> LoadedLibraryDirs() {
  std::set<std::string> dirs;
  ::dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        std::string name = info->dlpi_name ? info->dlpi_name : "";
        if (auto slash = name.rfind('/'); name.starts_with('/') && slash != std::string::npos && slash > 0) {
          static_cast<std::set<std::string>*>(data)->insert(name.substr(0, slash));
        }
        return 0;
      },
      &dirs);
  return dirs;
}

Status AddPathRule(int ruleset, const std::string& path, uint64_t access, uint64_t handled) {
  int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return Status::OK();  // absent here: nothing to allow
  struct stat st;
  if (::fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) access &= kFsFileRights | kFsTruncate;
  PathBeneath rule{access & handled, fd};
  long rc = ::syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Internal("landlock cannot allow " + path + ": " + std::strerror(err));
  return Status::OK();
}

// Beneath /etc, only what the dynamic loader and glibc's time code read:
// the rest of /etc holds the machine's secrets (the system service's config
// and token file among them), and Landlock cannot take back a file beneath
// a directory it allows, so these are allowed one by one.
constexpr const char* kEtcFiles[] = {"/etc/ld.so.cache",  "/etc/ld.so.preload", "/etc/ld.so.conf",
                                     "/etc/ld.so.conf.d", "/etc/localtime",     "/etc/timezone"};
// What a compiler and Python read there besides: the alternatives' links
// (/usr/bin/c++), and the user database (Python's getpass and pwd when the
// environment names no user).
constexpr const char* kEtcFilesForProcesses[] = {"/etc/alternatives", "/etc/passwd", "/etc/group",
                                                 "/etc/nsswitch.conf"};
// Beneath /proc, the process's own directory (allowed separately) and what
// glibc, OpenMP and torch read of the machine; never another process's.
constexpr const char* kProcFiles[] = {"/proc/cpuinfo", "/proc/meminfo", "/proc/stat",
                                      "/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/random"};
constexpr const char* kProcFilesForGpus[] = {"/proc/driver/nvidia", "/proc/devices"};

// 0 when the kernel has no Landlock (or it is turned off).
StatusOr<int> LandlockSelf(const SandboxOptions& options) {
  long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) return 0;
  RulesetAttr attr{};
  attr.handled_access_fs = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1;  // every ABI 1 right
  if (abi >= 2) attr.handled_access_fs |= kFsRefer;
  if (abi >= 3) attr.handled_access_fs |= kFsTruncate;
  size_t attr_size = sizeof(uint64_t);
  if (abi >= 4) {
    attr.handled_access_net = kNetBindTcp | kNetConnectTcp;
    attr_size = 2 * sizeof(uint64_t);
  }
  if (abi >= 6) {
    attr.scoped = kScopeAbstractUnix | kScopeSignal;
    attr_size = sizeof(RulesetAttr);
  }
  int ruleset = static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0));
  if (ruleset < 0) return Internal(std::string("landlock: cannot create a ruleset: ") + std::strerror(errno));
  const uint64_t handled = attr.handled_access_fs;
  Status s;
  for (const char* dir : {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sys"}) {
    if (s.ok()) s = AddPathRule(ruleset, dir, kFsRead, handled);
  }
  for (const char* file : kEtcFiles) {
    if (s.ok()) s = AddPathRule(ruleset, file, kFsRead, handled);
  }
  if (options.processes) {
    for (const char* file : kEtcFilesForProcesses) {
      if (s.ok()) s = AddPathRule(ruleset, file, kFsRead, handled);
    }
    // Debian's Python reads its sitecustomize.py from /etc/pythonX.Y.
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/etc", ec)) {
      if (s.ok() && e.path().filename().string().starts_with("python")) {
        s = AddPathRule(ruleset, e.path().string(), kFsRead, handled);
      }
    }
  }
  // /proc/self is resolved here, once: the rule is for this process's own
  // directory, /proc/PID, which is what the link names for each of its
  // threads later too (/proc/thread-self is PID/task/TID, beneath it). A
  // process it starts has another PID: that one's /proc/self is closed to
  // it, as every other process's directory is.
  if (s.ok()) s = AddPathRule(ruleset, "/proc/self", kFsRead, handled);
  for (const char* file : kProcFiles) {
    if (s.ok()) s = AddPathRule(ruleset, file, kFsRead, handled);
  }
  if (options.gpu) {
    for (const char* file : kProcFilesForGpus) {
      if (s.ok()) s = AddPathRule(ruleset, file, kFsRead, handled);
    }
  }
  std::set<std::string> loaded = LoadedLibraryDirs();
  for (const std::string& dir : loaded) {
    if (s.ok()) s = AddPathRule(ruleset, dir, kFsRead, handled);
  }
  GpuPaths gpu_paths;
  if (options.gpu) gpu_paths = FindGpuPaths("/dev", {loaded.begin(), loaded.end()});
  for (const std::string& dir : gpu_paths.library_dirs) {
    if (s.ok()) s = AddPathRule(ruleset, dir, kFsRead, handled);
  }
  for (const std::string& path : options.read_paths) {
    if (s.ok()) s = AddPathRule(ruleset, path, kFsRead, handled);
  }
  for (const char* dev : {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}) {
    if (s.ok()) s = AddPathRule(ruleset, dev, kFsFileRights, handled);
  }
  for (const std::string& dev : gpu_paths.devices) {
    if (s.ok()) s = AddPathRule(ruleset, dev, kFsFileRights | LANDLOCK_ACCESS_FS_READ_DIR, handled);
  }
  for (const std::string& path : options.write_paths) {
    if (s.ok()) s = AddPathRule(ruleset, path, handled, handled);
  }
  // Without CAP_SYS_ADMIN the kernel takes a ruleset only from a process
  // that can gain no privileges (a daemon run by a user in a shell, not by
  // systemd with NoNewPrivileges=yes). Its children inherit this too.
  if (s.ok() && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    s = Internal(std::string("landlock: cannot set no_new_privs: ") + std::strerror(errno));
  }
  if (s.ok() && ::syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
    s = Internal(std::string("landlock: cannot restrict the runner: ") + std::strerror(errno));
  }
  ::close(ruleset);
  if (!s.ok()) return s;
  return static_cast<int>(abi);
}

// The calls the filter refuses, by number, for the line the SIGSYS handler
// writes. Filled before the filter is loaded; read in the handler.
struct RefusedName {
  int nr;
  char name[24];
};
RefusedName g_refused[96];
int g_refused_count = 0;

void OnSigsys(int, siginfo_t* info, void* context) {
  const char* name = "a system call";
  for (int i = 0; i < g_refused_count; ++i) {
    if (g_refused[i].nr == info->si_syscall) name = g_refused[i].name;
  }
  char line[128] = "aotid runner: the sandbox refused ";
  size_t n = std::strlen(line);
  for (const char* p = name; *p && n < sizeof(line) - 3; ++p) line[n++] = *p;
  line[n++] = '(';
  line[n++] = ')';
  line[n++] = '\n';
  (void)!::write(2, line, n);
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
#elif defined(__aarch64__)
  uc->uc_mcontext.regs[0] = static_cast<uint64_t>(-EPERM);
#else
  (void)uc;
#endif
}

Status SeccompSelf(const SandboxOptions& options, bool landlocked) {
  scmp_filter_ctx ctx = ::seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return Internal("seccomp: cannot create a filter");
  Status s;
  // A process that goes on to exec loses the SIGSYS handler that names a
  // refused call: its refusals are a plain EPERM.
  const uint32_t refuse = options.processes ? SCMP_ACT_ERRNO(EPERM) : SCMP_ACT_TRAP;
  auto rule = [&](const char* name, uint32_t action, std::initializer_list<scmp_arg_cmp> args = {}) {
    if (!s.ok()) return;
    int nr = ::seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) return;  // not a call on this architecture
    if (action == SCMP_ACT_TRAP && g_refused_count < static_cast<int>(std::size(g_refused))) {
      bool known = false;
      for (int i = 0; i < g_refused_count; ++i) known = known || g_refused[i].nr == nr;
      if (!known) {
        g_refused[g_refused_count].nr = nr;
        std::strncpy(g_refused[g_refused_count].name, name, sizeof(g_refused[0].name) - 1);
        ++g_refused_count;
      }
    }
    int rc = ::seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned>(args.size()),
                                      args.size() ? std::data(args) : nullptr);
    if (rc != 0)
      s = Internal(std::string("seccomp: cannot add a rule for ") + name + ": " + std::strerror(-rc));
  };
  const auto self = static_cast<scmp_datum_t>(::getpid());
  // Refused to every sandboxed process: the network, other processes'
  // memory, mounts and namespaces, the kernel's own machinery.
  for (const char* name : {"socket",
                           "connect",
                           "bind",
                           "listen",
                           "accept",
                           "accept4",
                           "ptrace",
                           "process_vm_readv",
                           "process_vm_writev",
                           "kcmp",
                           "mount",
                           "umount2",
                           "pivot_root",
                           "chroot",
                           "setns",
                           "unshare",
                           "move_mount",
                           "open_tree",
                           "fsopen",
                           "fsmount",
                           "fspick",
                           "mount_setattr",
                           "bpf",
                           "perf_event_open",
                           "userfaultfd",
                           "keyctl",
                           "add_key",
                           "request_key",
                           "init_module",
                           "finit_module",
                           "delete_module",
                           "kexec_load",
                           "kexec_file_load",
                           "reboot",
                           "swapon",
                           "swapoff",
                           "open_by_handle_at",
                           "name_to_handle_at",
                           "pidfd_open",
                           "pidfd_getfd",
                           "pidfd_send_signal",
                           "setsid",
                           "setpgid"}) {
    rule(name, refuse);
  }
  // io_uring does file and socket work the filter never sees.
  for (const char* name : {"io_uring_setup", "io_uring_enter", "io_uring_register"})
    rule(name, SCMP_ACT_ERRNO(ENOSYS));
  // clone3 passes its flags in memory a filter cannot read; glibc falls
  // back to clone when it is missing.
  rule("clone3", SCMP_ACT_ERRNO(ENOSYS));
  if (options.processes) {
    // A compiler and Python start processes, of their own, in no new
    // namespace, and signal them (Landlock's scope, ABI 6, keeps signals
    // inside the sandbox; without it the daemon, its process group and
    // everyone at once are refused here).
    for (uint64_t flag : {CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
                          CLONE_NEWCGROUP}) {
      rule("clone", refuse, {SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag)});
    }
    // A pid is an int: only its low 32 bits are compared. The daemon, its
    // process group, and everyone.
    const pid_t parent = ::getppid();
    for (const char* name : {"kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"}) {
      for (pid_t target : {parent, -parent, pid_t{-1}}) {
        rule(name, refuse,
             {SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu,
                      static_cast<scmp_datum_t>(static_cast<uint32_t>(target)))});
      }
    }
  } else {
    // Threads, not processes: clone without CLONE_THREAD is a fork.
    for (const char* name : {"socketpair", "execve", "execveat", "fork", "vfork", "tkill"})
      rule(name, refuse);
    rule("clone", refuse, {SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0)});
    // Signals to itself only.
    rule("kill", refuse, {SCMP_A0(SCMP_CMP_NE, self)});
    rule("tgkill", refuse, {SCMP_A0(SCMP_CMP_NE, self)});
    rule("rt_sigqueueinfo", refuse, {SCMP_A0(SCMP_CMP_NE, self)});
    rule("rt_tgsigqueueinfo", refuse, {SCMP_A0(SCMP_CMP_NE, self)});
  }
  if (!landlocked && !options.processes) {
    // No Landlock: no file is opened for writing, created, removed or
    // renamed. (A compiler must write its output: without Landlock its
    // files are not confined.)
    for (uint64_t flag : {uint64_t{O_WRONLY}, uint64_t{O_RDWR}, uint64_t{O_CREAT}, uint64_t{O_TRUNC}}) {
      rule("open", refuse, {SCMP_A1(SCMP_CMP_MASKED_EQ, flag, flag)});
      rule("openat", refuse, {SCMP_A2(SCMP_CMP_MASKED_EQ, flag, flag)});
    }
    rule("openat2", SCMP_ACT_ERRNO(ENOSYS));
    for (const char* name :
         {"creat",   "unlink",   "unlinkat", "rename", "renameat", "renameat2", "mkdir",
          "mkdirat", "rmdir",    "link",     "linkat", "symlink",  "symlinkat", "truncate",
          "chmod",   "fchmodat", "chown",    "lchown", "fchownat", "mknod",     "mknodat"}) {
      rule(name, refuse);
    }
  }
  if (s.ok()) {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigsys;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (::sigaction(SIGSYS, &sa, nullptr) != 0) s = Internal("cannot handle SIGSYS");
  }
  if (s.ok()) {
    int rc = ::seccomp_load(ctx);
    if (rc != 0) s = Internal(std::string("seccomp: cannot load the filter: ") + std::strerror(-rc));
  }
  ::seccomp_release(ctx);
  return s;
}

}  // namespace

StatusOr<int> EnterLandlock(const SandboxOptions& options) { return LandlockSelf(options); }
Status EnterSeccomp(const SandboxOptions& options, bool landlocked) {
  return SeccompSelf(options, landlocked);
}

StatusOr<SandboxReport> EnterSandbox(const SandboxOptions& options) {
  SandboxReport report;
  ASSIGN_OR_RETURN(report.landlock_abi, EnterLandlock(options));
  RETURN_IF_ERROR(EnterSeccomp(options, report.landlock_abi > 0));
  report.seccomp = true;
  return report;
}

#else

StatusOr<SandboxReport> EnterSandbox(const SandboxOptions&) { return SandboxReport{}; }
StatusOr<int> EnterLandlock(const SandboxOptions&) { return 0; }
Status EnterSeccomp(const SandboxOptions&, bool) { return Status::OK(); }

#endif

}  // namespace aotid::runner
