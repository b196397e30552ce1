#include "runner/runner_model.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "base/fd.h"
#include "base/fs.h"
#include "base/log.h"
#include "runner/runner_main.h"

#ifdef __linux__
#include <sys/syscall.h>
#endif

extern char** environ;

namespace aotid::runner {
namespace {

// How long a run's caller spins for the answer before it sleeps: a small
// model answers within it, and the caller then never pays a wake-up. Kept
// short: on few cores the spin competes with the runner it waits for.
constexpr int64_t kCallerSpinNs = 20'000;
constexpr size_t kErrTailBytes = 8192;
// Runner output lines logged per crash window, so a runner that prints a
// backtrace in a loop cannot flood the daemon's log.
constexpr int kMaxLoggedLines = 200;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The name of a signal a runner is likely to die of; nullptr for others.
// POSIX has no call for it (glibc's sigabbrev_np is glibc's alone), and the
// numbers differ between Linux and macOS, so the table names the macros.
const char* SignalName(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return nullptr;
  }
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = SignalName(sig);
    const char* desc = sig != SIGKILL ? ::strsignal(sig) : nullptr;
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "") +
           (desc ? std::string(", ") + desc : "");
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended (wait status " + std::to_string(status) + ")";
}

// A file descriptor moved out of the way of 0..N, close-on-exec.
int High(int fd) {
  int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 64);
  ::close(fd);
  return high;
}

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

// A random key per model for the inputs' fingerprints.
uint64_t RandomKey() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd() ^ 0x9E3779B97F4A7C15ull;
}

uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// A keyed 64-bit hash of `n` bytes, mixed in with `h`: four lanes of
// multiply-rotate over 8-byte words (several GB/s, so a run pays nothing
// noticeable for it), folded and finished with a 64-bit avalanche.
uint64_t HashBytes(uint64_t h, const uint8_t* p, size_t n) {
  constexpr uint64_t kM1 = 0x9E3779B97F4A7C15ull, kM2 = 0xC2B2AE3D27D4EB4Full;
  uint64_t lane[4] = {h ^ kM1, h ^ kM2, Rotl(h, 17) ^ kM1, Rotl(h, 41) ^ kM2};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = Rotl(lane[k] ^ (w * kM2), 31) * kM1;
    }
  }
  uint64_t acc = h ^ (n * kM1);
  for (uint64_t l : lane) acc = Rotl(acc ^ l, 27) * kM2;
  for (; i < n; ++i) acc = Rotl(acc ^ p[i], 11) * kM1;
  acc ^= acc >> 33;
  acc *= 0xFF51AFD7ED558CCDull;
  acc ^= acc >> 33;
  acc *= 0xC4CEB9FE1A85EC53ull;
  acc ^= acc >> 33;
  return acc;
}

}  // namespace

RunnerModel::RunnerModel(const model::CacheEntry& entry, RunnerOptions options)
    : spec_(entry.spec), entry_dir_(entry.dir), options_(std::move(options)), hash_key_(RandomKey()) {}

uint64_t RunnerModel::Fingerprint(const std::vector<model::HostTensor>& inputs) const {
  uint64_t h = hash_key_;
  for (const model::HostTensor& t : inputs) {
    uint64_t head[2] = {static_cast<uint64_t>(t.dtype), t.shape.size()};
    h = HashBytes(h, reinterpret_cast<const uint8_t*>(head), sizeof head);
    h = HashBytes(h, reinterpret_cast<const uint8_t*>(t.shape.data()), t.shape.size() * sizeof(int64_t));
    h = HashBytes(h, reinterpret_cast<const uint8_t*>(t.data.data()), t.data.size());
  }
  return h == 0 ? 1 : h;  // 0 marks an idle slot
}

void RunnerModel::SuspectLocked(uint64_t fingerprint, const std::string& cause) {
  auto [it, fresh] = suspects_.try_emplace(fingerprint);
  if (fresh) {
    suspect_order_.push_back(fingerprint);
    if (suspect_order_.size() > kMaxSuspects) {
      suspects_.erase(suspect_order_.front());
      suspect_order_.pop_front();
    }
  }
  ++it->second.crashes;
  it->second.cause = cause;
}

StatusOr<std::unique_ptr<RunnerModel>> RunnerModel::Start(const model::CacheEntry& entry,
                                                          RunnerOptions options) {
  if (options.self_exe.empty())
    return FailedPrecondition("no aotid binary to run " + options.label + "'s runner with");
  int slots = std::clamp(options.load.num_runners, 1, 64);
  std::unique_ptr<RunnerModel> m(new RunnerModel(entry, std::move(options)));
  for (int i = 0; i < slots; ++i) {
    ASSIGN_OR_RETURN(Slot slot, Slot::Create("aotid-slot " + m->options_.label));
    m->slots_.push_back(std::move(slot));
  }
  RETURN_IF_ERROR(fd::Pipe(m->stop_fd_));
  ASSIGN_OR_RETURN(m->proc_, m->Spawn(m->options_.load.threads, m->options_.choose_threads_at_batch));
  m->threads_ = m->proc_.threads;
  m->threads_note_ = m->proc_.threads_note;
  m->threads_settled_ = m->proc_.threads_settled;
  {
    MutexLock lock(&m->mu_);
    for (int i = slots - 1; i >= 0; --i) m->free_.push_back(i);
    m->running_.assign(static_cast<size_t>(slots), 0);
    m->up_ = true;
  }
  m->supervisor_ = std::thread([p = m.get()] { p->Supervise(); });
  return m;
}

RunnerModel::~RunnerModel() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.SignalAll();
  if (stop_fd_[1] >= 0) (void)!::write(stop_fd_[1], "x", 1);
  if (supervisor_.joinable()) supervisor_.join();
  if (proc_.pid > 0) {
    ::kill(proc_.pid, SIGKILL);
    int status = 0;
    Reap(&proc_, &status);
  }
  CloseFd(&stop_fd_[0]);
  CloseFd(&stop_fd_[1]);
}

StatusOr<RunnerModel::Process> RunnerModel::Spawn(int threads, int64_t choose_threads_at_batch) {
  Process p;
  ASSIGN_OR_RETURN(p.scratch, fs::MakeTempDir(options_.scratch_root, "runner-"));
  RunnerArgs args;
  args.label = options_.label;
  args.entry_dir = entry_dir_;
  args.device = options_.load.device;
  args.slots = static_cast<int>(slots_.size());
  args.threads = threads;
  args.choose_threads_at_batch = choose_threads_at_batch;
  args.memory_limit_bytes = options_.memory_limit_bytes;
  args.scratch = p.scratch;
  args.parent_pid = ::getpid();
  std::vector<std::string> argv = RunnerArgv(options_.self_exe, args);

  int err[2], ready[2];
  RETURN_IF_ERROR(fd::Pipe(err));
  if (Status s = fd::Pipe(ready); !s.ok()) {
    ::close(err[0]);
    ::close(err[1]);
    return s;
  }
  // Every descriptor the child gets, moved above the numbers it gets them
  // at, so placing one never overwrites another.
  int devnull = High(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  err[1] = High(err[1]);
  ready[1] = High(ready[1]);
  std::vector<int> slot_fds;
  for (const Slot& s : slots_) slot_fds.push_back(::fcntl(s.fd(), F_DUPFD_CLOEXEC, 64));

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, devnull, 0);
  posix_spawn_file_actions_adddup2(&actions, err[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawn_file_actions_adddup2(&actions, ready[1], kReadyFd);
  for (size_t i = 0; i < slot_fds.size(); ++i) {
    posix_spawn_file_actions_adddup2(&actions, slot_fds[i], kFirstSlotFd + static_cast<int>(i));
  }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
  posix_spawn_file_actions_addclosefrom_np(&actions, kFirstSlotFd + static_cast<int>(slot_fds.size()));
#endif
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group: a terminal's ^C goes to the daemon, which stops
  // its runners itself.
  short spawn_flags = POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
#ifdef POSIX_SPAWN_CLOEXEC_DEFAULT
  // macOS's closefrom: only the descriptors placed above reach the runner.
  spawn_flags |= POSIX_SPAWN_CLOEXEC_DEFAULT;
#endif
  posix_spawnattr_setflags(&attr, spawn_flags);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, options_.self_exe.c_str(), &actions, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(devnull);
  ::close(err[1]);
  ::close(ready[1]);
  for (int fd : slot_fds) ::close(fd);
  if (rc != 0) {
    ::close(err[0]);
    ::close(ready[0]);
    (void)fs::RemoveAll(p.scratch);
    return Internal("cannot start the runner for " + options_.label + " (" + options_.self_exe +
                    "): " + std::strerror(rc));
  }
  p.pid = pid;
  p.err_fd = err[0];
#ifdef __linux__
  p.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
  pid_.store(pid);

  // Its reply, reading its output meanwhile (a runner that prints more
  // than a pipe holds must not stall).
  std::string reply;
  bool replied = false;
  const int64_t deadline = NowMs() + options_.start_timeout_ms;
  int ready_fd = ready[0];
  while (!replied) {
    int64_t left = deadline - NowMs();
    if (left <= 0) break;
    struct pollfd fds[3] = {{ready_fd, POLLIN, 0}, {p.err_fd, POLLIN, 0}, {stop_fd_[0], POLLIN, 0}};
    int n = ::poll(fds, p.err_fd >= 0 ? 3 : 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    if (fds[2].revents) break;  // being destroyed
    if (p.err_fd >= 0 && fds[1].revents && !DrainErr(p.err_fd)) CloseFd(&p.err_fd);
    if (fds[0].revents) {
      char buf[4096];
      ssize_t got = ::read(ready_fd, buf, sizeof(buf));
      if (got > 0) {
        reply.append(buf, static_cast<size_t>(got));
        replied = reply.find('\n') != std::string::npos;
      } else if (got == 0 || errno != EINTR) {
        break;  // closed without a reply: it died
      }
    }
  }
  ::close(ready_fd);
  if (replied && reply.starts_with("ready ")) {
    std::string rest = reply.substr(6, reply.find('\n') - 6);
    // "<threads> <settled> <note>"
    size_t space = rest.find(' ');
    p.threads = std::atoi(rest.substr(0, space).c_str());
    std::string more = space == std::string::npos ? "" : rest.substr(space + 1);
    p.threads_settled = more.starts_with("1 ");
    std::string note = more.size() > 2 ? more.substr(2) : "";
    p.threads_note = note == "-" ? "" : note;
    err_tail_.clear();  // a crash's cause is what it says from now on
    return p;
  }
  // It failed to start: say why, then make sure it is gone.
  ::kill(pid, SIGKILL);
  int status = 0;
  Reap(&p, &status);
  pid_.store(0);
  if (replied && reply.starts_with("error ")) {
    std::string rest = reply.substr(6, reply.find('\n') - 6);
    size_t space = rest.find(' ');
    int code = std::atoi(rest.substr(0, space).c_str());
    if (code <= 0 || code > static_cast<int>(StatusCode::kLast))
      code = static_cast<int>(StatusCode::kInternal);
    std::string message = space == std::string::npos ? rest : rest.substr(space + 1);
    return Status(static_cast<StatusCode>(code), message + MemoryNote(message));
  }
  std::string why = replied ? "an unreadable reply"
                    : NowMs() >= deadline
                        ? "no reply within " + std::to_string(options_.start_timeout_ms / 1000) + " s"
                        : "it " + DescribeExit(status);
  std::string last = LastError();
  std::string message =
      "the runner for " + options_.label + " did not start: " + why + (last.empty() ? "" : ": " + last);
  return Internal(message + MemoryNote(message));
}

std::string RunnerModel::MemoryNote(const std::string& failure) const {
  if (options_.memory_limit_bytes == 0) return "";
  bool memory = false;
  for (const char* sign :
       {"bad_alloc", "cannot map", "failed to map", "Cannot allocate memory", "out of memory"}) {
    memory = memory || failure.find(sign) != std::string::npos;
  }
  if (!memory) return "";
  return " (the runner may allocate at most " + std::to_string(options_.memory_limit_bytes >> 20) +
         " MiB: the version's memory_limit_mb setting, or runner.memory_limit_mb)";
}

void RunnerModel::Reap(Process* p, int* status) {
  if (p->pid > 0) {
    while (::waitpid(p->pid, status, 0) < 0 && errno == EINTR) {
    }
  }
  if (p->err_fd >= 0) {
    while (DrainErr(p->err_fd)) {
    }
  }
  CloseFd(&p->err_fd);
  CloseFd(&p->pidfd);
  if (!p->scratch.empty()) (void)fs::RemoveAll(p->scratch);
  p->scratch.clear();
  p->pid = -1;
}

bool RunnerModel::DrainErr(int fd) {
  char buf[4096];
  ssize_t got = ::read(fd, buf, sizeof(buf));
  if (got < 0 && errno == EINTR) return true;
  if (got <= 0) return false;
  err_tail_.append(buf, static_cast<size_t>(got));
  if (err_tail_.size() > 2 * kErrTailBytes) err_tail_.erase(0, err_tail_.size() - kErrTailBytes);
  err_line_.append(buf, static_cast<size_t>(got));
  size_t nl;
  while ((nl = err_line_.find('\n')) != std::string::npos) {
    std::string line = err_line_.substr(0, std::min<size_t>(nl, 300));
    err_line_.erase(0, nl + 1);
    // A backtrace's frames stay out of the log (the crash message names the error).
    if (!line.empty() && !line.starts_with("frame #") && logged_lines_ < kMaxLoggedLines) {
      ++logged_lines_;
      LOG_INFO << "runner " << options_.label << ": " << line;
    }
  }
  if (err_line_.size() > 4096) err_line_.clear();
  return true;
}

std::string RunnerModel::LastError() const {
  // torch's errors and std::terminate say "what():  <message>"; else the
  // last line that says anything.
  std::string tail =
      err_tail_.size() > kErrTailBytes ? err_tail_.substr(err_tail_.size() - kErrTailBytes) : err_tail_;
  std::string found;
  if (size_t at = tail.rfind("what():"); at != std::string::npos) {
    found = tail.substr(at + 7);
    found = found.substr(0, found.find('\n'));
  } else {
    size_t end = tail.find_last_not_of(" \t\r\n");
    if (end == std::string::npos) return "";
    size_t start = tail.rfind('\n', end);
    found = tail.substr(start == std::string::npos ? 0 : start + 1,
                        end + 1 - (start == std::string::npos ? 0 : start + 1));
  }
  size_t b = found.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  found = found.substr(b);
  if (found.size() > 500) found = found.substr(0, 500) + "...";
  // The text goes into JSON and logs: printable ASCII only.
  for (char& c : found) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return found;
}

void RunnerModel::Supervise() {
  for (;;) {
    struct pollfd fds[3] = {{stop_fd_[0], POLLIN, 0}, {proc_.pidfd, POLLIN, 0}, {proc_.err_fd, POLLIN, 0}};
    int n = ::poll(fds, 3, proc_.pidfd >= 0 ? -1 : 50);
    if (n < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    if (proc_.err_fd >= 0 && fds[2].revents && !DrainErr(proc_.err_fd)) CloseFd(&proc_.err_fd);
    bool gone = proc_.pidfd >= 0 ? fds[1].revents != 0 : false;
    int status = 0;
    if (proc_.pidfd < 0) {
      pid_t r = ::waitpid(proc_.pid, &status, WNOHANG);
      if (r == proc_.pid) {
        gone = true;
        proc_.pid = -1;  // reaped already
      }
    }
    if (!gone) continue;
    Reap(&proc_, &status);
    Died(status);
    {
      MutexLock lock(&mu_);
      if (failed_ || stopping_) return;
    }
  }
}

void RunnerModel::Died(int status) {
  pid_.store(0);
  std::string cause;
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    std::string last = LastError();
    const bool crashed = kill_cause_.empty();  // not a kill of the daemon's own
    cause = !crashed ? kill_cause_
                     : "the runner for " + options_.label + " " + DescribeExit(status) +
                           (last.empty() ? "" : ": " + last);
    kill_cause_.clear();
    down_cause_ = cause;
    up_ = false;
    ended_.emplace_back(generation_, cause);
    if (ended_.size() > 16) ended_.pop_front();
    ++generation_;
    for (size_t i = 0; i < slots_.size(); ++i) {
      // The runs the runner had taken when it died are suspects (not those
      // sent to it after it had died).
      const SlotHeader* h = slots_[i].header();
      if (crashed && running_[i] != 0 && h->state.load(std::memory_order_acquire) == kRequest &&
          h->taken.load(std::memory_order_acquire) == 1)
        SuspectLocked(running_[i], cause);
    }
    for (Slot& s : slots_) {
      s.header()->state.store(kDead, std::memory_order_release);
      Wake(&s.header()->state);
    }
  }
  changed_.SignalAll();
  err_tail_.clear();
  err_line_.clear();
  logged_lines_ = 0;
  LOG_ERROR << cause;

  int64_t now = NowMs();
  crashes_ms_.push_back(now);
  while (!crashes_ms_.empty() && crashes_ms_.front() < now - options_.crash_window_ms)
    crashes_ms_.pop_front();
  auto give_up = [&](const std::string& why) {
    {
      MutexLock lock(&mu_);
      failed_ = true;
      down_cause_ = why;
    }
    changed_.SignalAll();
    LOG_ERROR << why;
    if (options_.on_event) options_.on_event({RunnerEvent::Kind::kFailed, why});
  };
  if (static_cast<int>(crashes_ms_.size()) > options_.max_crashes) {
    give_up(options_.label + " is not restarted: its runner ended " + std::to_string(crashes_ms_.size()) +
            " times within " + std::to_string(options_.crash_window_ms / 1000) + " s; last: " + cause);
    return;
  }
  if (options_.on_event) options_.on_event({RunnerEvent::Kind::kCrashed, cause});

  // The first crash restarts at once; each one after within the window
  // waits twice as long (0.1 s, 0.2 s, ... at most 5 s).
  for (;;) {
    size_t recent = crashes_ms_.size();
    int64_t wait = recent <= 1 ? 0 : std::min<int64_t>(5000, int64_t{100} << std::min<size_t>(recent - 2, 6));
    if (!Pause(wait)) return;
    for (Slot& s : slots_) s.header()->state.store(kIdle, std::memory_order_release);
    auto next = Spawn(threads_, 0);
    if (next.ok()) {
      proc_ = *next;
      restarts_.fetch_add(1);
      {
        MutexLock lock(&mu_);
        up_ = true;
        down_cause_.clear();
      }
      changed_.SignalAll();
      LOG_INFO << "runner for " << options_.label << " restarted (pid " << proc_.pid << ")";
      return;
    }
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
    }
    // A runner that no longer starts counts as another crash.
    now = NowMs();
    crashes_ms_.push_back(now);
    while (!crashes_ms_.empty() && crashes_ms_.front() < now - options_.crash_window_ms)
      crashes_ms_.pop_front();
    if (static_cast<int>(crashes_ms_.size()) > options_.max_crashes) {
      give_up(options_.label +
              " is not restarted: its runner does not start again: " + next.status().message());
      return;
    }
    LOG_ERROR << next.status().message();
  }
}

bool RunnerModel::Pause(int64_t ms) {
  if (ms <= 0) return true;
  struct pollfd fd = {stop_fd_[0], POLLIN, 0};
  return ::poll(&fd, 1, static_cast<int>(ms)) == 0;
}

Status RunnerModel::DeadRun(uint64_t generation) {
  MutexLock lock(&mu_);
  if (failed_) return Unavailable(down_cause_);
  std::string cause = "the runner for " + options_.label + " ended";
  for (const auto& [g, why] : ended_) {
    if (g == generation) cause = why;
  }
  return Internal(cause + " (while running this request)");
}

void RunnerModel::KillForDeadline(uint64_t generation) {
  pid_t pid = 0;
  {
    MutexLock lock(&mu_);
    if (generation != generation_ || !up_) return;  // already gone or replaced
    up_ = false;                                    // no new runs until it is replaced
    kill_cause_ = "the runner for " + options_.label + " was stopped: a run passed the time limit of " +
                  std::to_string(options_.run_timeout_ms) + " ms";
    pid = pid_.load();
  }
  if (pid > 0) ::kill(pid, SIGKILL);
}

StatusOr<std::vector<model::HostTensor>> RunnerModel::Infer(const std::vector<model::HostTensor>& inputs,
                                                            const model::RunContext& ctx) {
  using Clock = std::chrono::steady_clock;
  const bool timed = options_.run_timeout_ms > 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.run_timeout_ms);
  int index = -1;
  uint64_t generation = 0;
  const uint64_t fingerprint = Fingerprint(inputs);
  {
    MutexLock lock(&mu_);
    if (auto it = suspects_.find(fingerprint);
        it != suspects_.end() && it->second.crashes >= kCrashesToRefuse) {
      return InvalidArgument("these inputs were being run each of the " + std::to_string(it->second.crashes) +
                             " times " + options_.label + "'s runner crashed (last: " + it->second.cause +
                             "); they are refused without running, so that " + options_.label +
                             " stays up for other requests");
    }
    while (!failed_ && !stopping_ && (!up_ || free_.empty())) {
      if (!timed) {
        changed_.Wait(&mu_);
      } else if (!changed_.WaitUntil(&mu_, deadline)) {
        if (!up_ && !failed_) {
          return Unavailable(options_.label + "'s runner is restarting" +
                             (down_cause_.empty() ? "" : " (" + down_cause_ + ")") + "; try again");
        }
        return DeadlineExceeded("no runner of " + options_.label + " was free within its time limit of " +
                                std::to_string(options_.run_timeout_ms) + " ms");
      }
    }
    if (failed_) return Unavailable(down_cause_);
    if (stopping_) return Unavailable(options_.label + " is unloading");
    index = free_.back();
    free_.pop_back();
    running_[static_cast<size_t>(index)] = fingerprint;
    generation = generation_;
  }
  struct Release {
    RunnerModel* m;
    int index;
    ~Release() {
      {
        MutexLock lock(&m->mu_);
        m->running_[static_cast<size_t>(index)] = 0;
        m->free_.push_back(index);
      }
      m->changed_.Signal();  // one slot frees one waiter
    }
  } release{this, index};

  if (ctx.cancelled && ctx.cancelled()) return Cancelled(model::kClientGone);
  Slot& slot = slots_[static_cast<size_t>(index)];
  SlotHeader* h = slot.header();
  ASSIGN_OR_RETURN(uint64_t written, WriteTensors(slot, inputs));
  h->command = kRun;
  h->status = 0;
  h->taken.store(0, std::memory_order_relaxed);
  h->payload_bytes = written;
  uint32_t expected = kIdle;
  if (!h->state.compare_exchange_strong(expected, kRequest, std::memory_order_acq_rel))
    return DeadRun(generation);
  Wake(&h->state);
  int64_t timeout_ns = -1;
  if (timed) {
    timeout_ns = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count());
  }
  uint32_t v = WaitWhile(&h->state, kRequest, kCallerSpinNs, timeout_ns);
  if (v == kRequest) {
    KillForDeadline(generation);
    return DeadlineExceeded("the run of " + options_.label + " passed its time limit of " +
                            std::to_string(options_.run_timeout_ms) +
                            " ms; its runner was stopped and is being replaced");
  }
  if (v != kResponse) return DeadRun(generation);
  // Copied once: the runner may still write the slot.
  const uint32_t code = h->status;
  const uint64_t payload = h->payload_bytes;
  StatusOr<std::vector<model::HostTensor>> result = Internal("unset");
  if (code != 0) {
    StatusCode c = code <= static_cast<uint32_t>(StatusCode::kLast) ? static_cast<StatusCode>(code)
                                                                    : StatusCode::kInternal;
    result = Status(c, ReadText(slot, payload));
  } else {
    size_t max_outputs = spec_.outputs.empty() ? 256 : spec_.outputs.size();
    result = ReadTensors(slot, payload, max_outputs);
  }
  slot.Trim(std::max(written, payload) + sizeof(SlotHeader));
  expected = kResponse;
  h->state.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel);
  return result;
}

}  // namespace aotid::runner
