#include "compile/builder.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#include "base/child_env.h"
#include "base/fs.h"
#include "base/log.h"
#include "compile/package_build.h"
#include "platform/confined_command.h"

namespace aotid::compile {
namespace {

// Inductor's cache, inside a build's staging folder.
constexpr const char* kInductorScratch = ".inductor";
// The compile worker's TMPDIR, inside it too: the one other place it writes.
constexpr const char* kWorkerTmp = ".inductor/tmp";

// Where `program` (a path, or a name looked up on PATH) is, when it can be
// executed; "" when not.
std::string FindExecutable(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  for (size_t at = 0; at <= dirs.size();) {
    size_t end = std::min(dirs.find(':', at), dirs.size());
    std::string dir(dirs.substr(at, end - at));
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    at = end + 1;
  }
  return "";
}

// The installation a Python runs from: two levels above its executable
// (a venv's root, /usr, a conda prefix), and the same for the executable a
// venv's link points to (the interpreter's own standard library).
std::vector<std::string> PythonInstallDirs(const std::string& python) {
  std::vector<std::string> dirs;
  auto up_two = [&](const std::string& exe) {
    std::string d = exe.substr(0, exe.rfind('/'));
    d = d.substr(0, d.rfind('/'));
    if (!d.empty() && std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  };
  std::string found = FindExecutable(python);
  if (found.empty()) return dirs;
  std::error_code ec;
  found = std::filesystem::absolute(found, ec).string();
  if (ec) return dirs;
  up_two(found);
  std::string real = std::filesystem::canonical(found, ec).string();
  if (!ec) up_two(real);
  return dirs;
}

// Kills a build child and what it started (it leads its own process group).
void KillGroup(uv_process_t* process) {
  if (process->pid > 0) ::kill(-process->pid, SIGKILL);
  uv_process_kill(process, SIGKILL);
}

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The last `max_lines` lines of a log, for error messages.
// The end of a failed build's log for its error: the worker's reason (its
// last "error: " line) first when it gave one, then the last lines of the
// log without the worker's progress lines ("[aotid-worker] step ..."),
// which the whole log keeps.
std::string LogTail(const std::string& path, size_t max_lines = 15) {
  auto text = fs::ReadFile(path);
  if (!text.ok()) return "";
  std::string s = std::move(text).value();
  if (s.size() > 16384) s = s.substr(s.size() - 16384);
  std::vector<std::string_view> lines;
  std::string_view reason;
  for (size_t at = 0; at < s.size();) {
    size_t end = s.find('\n', at);
    std::string_view line = std::string_view(s).substr(at, end == std::string::npos ? end : end - at);
    at = end == std::string::npos ? s.size() : end + 1;
    if (line.starts_with("[aotid-worker] ")) continue;
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
    if (line.empty()) continue;
    if (line.starts_with("error: ")) reason = line;
    lines.push_back(line);
  }
  if (lines.size() > max_lines) lines.erase(lines.begin(), lines.end() - static_cast<ptrdiff_t>(max_lines));
  std::string out;
  if (!reason.empty() && (lines.empty() || lines.front() != reason)) {
    out += reason;
    out += '\n';
  }
  for (std::string_view line : lines) {
    if (line == reason && !out.empty()) continue;  // said first
    out += line;
    out += '\n';
  }
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace

int KillLeftoverBuilds(const std::string& dir) {
  int killed = 0;
#ifdef __linux__
  std::error_code ec;
  std::string prefix = dir + "/";
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == ::getpid()) continue;
    auto cmdline = fs::ReadFile("/proc/" + name + "/cmdline");
    std::error_code cwd_ec;
    std::string cwd = std::filesystem::read_symlink("/proc/" + name + "/cwd", cwd_ec).string();
    bool uses = (cmdline.ok() && cmdline->find(prefix) != std::string::npos) || cwd == dir ||
                cwd.rfind(prefix, 0) == 0;
    if (uses && ::kill(pid, SIGKILL) == 0) ++killed;
  }
#endif
  return killed;
}

// One build child. Its stdout and stderr share one pipe that the loop
// reads: every byte goes to build.log, and "[aotid-...] step N/M: what"
// lines become the build's progress.
struct Builder::Running {
  Builder* owner;
  BuildJob job;
  std::string staging;
  uv_process_t process{};
  uv_timer_t timer{};
  uv_pipe_t output{};
  int output_fd = -1;  // our end of the pipe
  int log_fd = -1;
  std::string partial_line{};
  std::string step{};  // the last step reported, "step 2/4: ..."
  int open_handles = 0;
  bool timed_out = false;
  bool cancelled = false;
  bool stopped = false;  // cancelled by Shutdown()
  int64_t started_ms = 0;
  int key_lock_fd = -1;  // BuildCache::LockBuild's, held until the build ends
  std::string replaces;  // the entry in place when it started (BuildCache::EntryIdentity)

  ~Running() { ReleaseKey(); }
  void ReleaseKey() {
    if (key_lock_fd >= 0) ::close(key_lock_fd);
    key_lock_fd = -1;
  }

  // Appends child output to the log and picks out step lines.
  void Take(const char* data, size_t n) {
    for (size_t done = 0; done < n;) {
      ssize_t w = ::write(log_fd, data + done, n - done);
      if (w <= 0) break;  // a full disk: the build's own outcome says more
      done += static_cast<size_t>(w);
    }
    partial_line.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = partial_line.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(partial_line.data() + start, nl - start);
      if (size_t pos = line.find("] step "); pos != std::string_view::npos && line.front() == '[') {
        step = std::string(line.substr(pos + 2));
        // Each step in the daemon's log too, with the time so far: a build
        // of a real model takes minutes.
        LOG_INFO << "build " << job.key.artifact.substr(0, 12) << " " << job.key.package_model << " for "
                 << job.key.device << ": " << step.substr(0, 200) << " (" << (SteadyMs() - started_ms) / 1000
                 << " s"
                 << (job.estimate_ms > 0
                         ? " of about " + std::to_string((job.estimate_ms + 999) / 1000) + " s"
                         : std::string())
                 << ")";
      }
    }
    partial_line.erase(0, start);
    if (partial_line.size() > 4096) partial_line.clear();  // no newline in sight: not a step line
  }
};

Builder::Builder(uv_loop_t* loop, const BuildCache* cache, BuilderOptions options)
    : loop_(loop), cache_(cache), options_(std::move(options)) {
  options_.jobs = std::max(1, options_.jobs);
}

Builder::~Builder() { Shutdown(); }

void Builder::Submit(BuildJob job) {
  if (shut_down_) return;
  queue_.push_back(std::move(job));
  StartNext();
}

void Builder::StartNext() {
  while (!shut_down_ && running_ < options_.jobs && !queue_.empty()) {
    BuildJob job = std::move(queue_.front());
    queue_.pop_front();
    Start(std::move(job));
  }
}

void Builder::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // What the stop ends is cancelled, not failed: it says nothing of the
  // artifact, and is not a failed attempt.
  for (Running* r : live_) {
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&r->process))) {
      r->cancelled = true;
      r->stopped = true;
      KillGroup(&r->process);
    }
  }
  std::deque<BuildJob> queued = std::move(queue_);
  queue_.clear();
  for (Waiting& w : waiting_) queued.push_back(std::move(w.job));
  waiting_.clear();
  if (wait_timer_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(wait_timer_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    wait_timer_ = nullptr;
  }
  for (BuildJob& job : queued) {
    BuildResult res;
    res.status = Cancelled("build cancelled before it started: the daemon is stopping");
    res.cancelled = true;
    if (job.on_done) job.on_done(res);
  }
}

std::vector<std::string> Builder::Command(const BuildJob& job, const std::string& staging) const {
  if (job.kind == package::PackageKind::kExportedProgram) {
    std::vector<std::string> worker = {options_.python,
                                       "-m",
                                       "aotid_worker.compile",
                                       "--artifact",
                                       job.artifact_path,
                                       "--out",
                                       staging,
                                       "--device",
                                       job.key.device,
                                       "--package-model",
                                       job.key.package_model,
                                       "--inductor-options",
                                       job.key.options,
                                       "--expect-torch",
                                       options_.torch_version};
    if (options_.self_exe.empty()) return worker;
    // The worker deserializes a package that may come from a registry, and
    // runs the compiler on what it made of it: it starts in the build
    // child's sandbox, reading its Python's installation, aotid_worker/
    // and the package, writing only its staging folder.
    platform::ConfineArgs confine;
    confine.read_paths = PythonInstallDirs(options_.python);
    confine.read_paths.push_back(options_.worker_dir);
    confine.read_paths.push_back(job.artifact_path);
    confine.write_paths = {staging};
    confine.gpu = job.key.device != "cpu";
    confine.command = std::move(worker);
    return platform::ConfineArgv(options_.self_exe, confine);
  }
  PackageBuildArgs args;
  args.artifact = job.artifact_path;
  args.out = staging;
  args.kind = std::string(package::PackageKindName(job.kind));
  args.device = job.key.device;
  args.package_model = job.key.package_model;
  args.cxx = options_.cxx;
  return PackageBuildArgv(options_.self_exe, args);
}

bool Builder::Cancel(const BuildKey& key) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->key != key) continue;
    BuildJob job = std::move(*it);
    queue_.erase(it);
    BuildResult res;
    res.status = Cancelled("build cancelled before it started");
    res.cancelled = true;
    if (job.on_done) job.on_done(res);
    return true;
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->job.key != key) continue;
    BuildJob job = std::move(it->job);
    waiting_.erase(it);
    BuildResult res;
    res.status = Cancelled("build cancelled while it waited for another daemon's build");
    res.cancelled = true;
    if (job.on_done) job.on_done(res);
    return true;
  }
  for (Running* r : live_) {
    if (r->job.key != key || r->cancelled) continue;
    r->cancelled = true;
    KillGroup(&r->process);
    return true;
  }
  return false;
}

void Builder::Wait(BuildJob job) {
  LOG_INFO << "build " << job.key.artifact.substr(0, 12) << " " << job.key.package_model << " for "
           << job.key.device << " waits: another daemon sharing the build cache is building it";
  waiting_.push_back({std::move(job), SteadyMs()});
  if (wait_timer_ != nullptr) return;
  wait_timer_ = new uv_timer_t;
  uv_timer_init(loop_, wait_timer_);
  wait_timer_->data = this;
  uv_timer_start(
      wait_timer_, [](uv_timer_t* t) { static_cast<Builder*>(t->data)->LookAgain(); }, wait_poll_ms_,
      wait_poll_ms_);
}

void Builder::LookAgain() {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    BuildJob& job = it->job;
    auto held = cache_->LockBuild(job.key);
    const bool other_builds = held.ok() && *held < 0;
    if (held.ok() && *held >= 0) ::close(*held);  // Start takes it again
    const bool too_long = SteadyMs() - it->since_ms > int64_t{options_.timeout_s} * 1000;
    if (other_builds && !too_long) {
      ++it;
      continue;
    }
    if (other_builds) {
      LOG_WARNING << "build " << job.key.artifact.substr(0, 12) << " waited " << options_.timeout_s
                  << " s (build.timeout_s) for another daemon's build of it; building it here";
      no_wait_.insert(job.key.ToString());
    }
    // The other build ended: Start takes its entry, or builds when it left
    // none (it failed, or its daemon went). First in line either way.
    queue_.push_front(std::move(job));
    it = waiting_.erase(it);
  }
  if (waiting_.empty() && wait_timer_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(wait_timer_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    wait_timer_ = nullptr;
  }
  StartNext();
}

std::string Builder::Progress(const BuildKey& key) const {
  for (const Waiting& w : waiting_) {
    if (w.job.key != key) continue;
    return "waiting for another daemon's build of it (" + std::to_string((SteadyMs() - w.since_ms) / 1000) +
           " s)";
  }
  for (const Running* r : live_) {
    if (r->job.key != key) continue;
    int64_t s = (SteadyMs() - r->started_ms) / 1000;
    return (r->step.empty() ? std::string("started") : r->step) + " (" + std::to_string(s) + " s" +
           (r->job.estimate_ms > 0 ? " of about " + std::to_string((r->job.estimate_ms + 999) / 1000) + " s"
                                   : "") +
           ")";
  }
  return "";
}

void Builder::Start(BuildJob job) {
  auto fail_now = [](BuildJob& j, Status s, bool permanent) {
    BuildResult res;
    res.status = std::move(s);
    res.permanent = permanent;
    if (j.on_done) j.on_done(res);
  };
  // A worker started through the sandbox is exec'd by aotid, not by
  // libuv: a Python that is not there is told here, as the spawn would.
  if (job.kind == package::PackageKind::kExportedProgram && !options_.self_exe.empty() &&
      FindExecutable(options_.python).empty()) {
    return fail_now(job,
                    FailedPrecondition("cannot start the build " + options_.python +
                                       ": no such file or directory (set build.python in the config)"),
                    true);
  }
  // One build of a key at a time among the daemons sharing the cache: when
  // another is building it, this one waits for its entry. Without the lock
  // (a file system that refuses it) it builds, as it would alone.
  int key_lock = -1;
  if (!no_wait_.erase(job.key.ToString())) {
    auto held = cache_->LockBuild(job.key);
    if (held.ok() && *held < 0) return Wait(std::move(job));
    if (held.ok()) {
      key_lock = *held;
    } else {
      LOG_WARNING << "building without the cache's lock of the key: " << held.status().message();
    }
  }
  // Built since it was asked for (by another daemon sharing the cache,
  // while this one waited, or just before): taken when sound. A damaged
  // entry of the key (even in place, which only its digest shows) is
  // what this build replaces.
  // One taken before and asked for again is not taken twice: its load
  // failed in a way its files and digest do not show, and a build is what
  // can mend it (taking it again would go round for ever).
  auto entry = cache_->LookupSound(job.key);
  // What this build replaces, whatever its state: the entry in place now.
  const std::string identity = BuildCache::EntryIdentity(cache_->EntryDir(job.key));
  auto taken = taken_.find(job.key.ToString());
  if (entry.ok() && taken != taken_.end() && taken->second == identity) entry = Corruption("taken before");
  if (entry.ok()) {
    taken_[job.key.ToString()] = identity;
    if (key_lock >= 0) ::close(key_lock);
    LOG_INFO << "build " << job.key.artifact.substr(0, 12) << " " << job.key.package_model << " for "
             << job.key.device << ": built by another daemon sharing the build cache";
    BuildResult res;
    res.entry = std::move(entry).value();
    res.built_elsewhere = true;
    if (job.on_done) job.on_done(res);
    return;
  }
  auto staging = cache_->NewStaging(job.key);
  if (!staging.ok()) {
    if (key_lock >= 0) ::close(key_lock);
    return fail_now(job, staging.status(), false);
  }

  auto* r = new Running{this, std::move(job), *staging};
  r->key_lock_fd = key_lock;
  r->replaces = identity;
  std::vector<std::string> args = Command(r->job, r->staging);
  std::string log_path = r->staging + "/build.log";
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    Status s = ErrnoError("create " + log_path, errno);
    (void)fs::RemoveAll(r->staging);
    BuildJob j = std::move(r->job);
    delete r;
    return fail_now(j, s, false);
  }

  if (Status s = fs::MakeDirs(r->staging + "/" + kWorkerTmp); !s.ok()) {
    ::close(log_fd);
    (void)fs::RemoveAll(r->staging);
    BuildJob j = std::move(r->job);
    delete r;
    return fail_now(j, s, false);
  }

  std::vector<std::string> env = ChildEnvironment({
      "PYTHONPATH=" + options_.worker_dir,
      // Inductor's own cache lives in the build's staging folder and goes
      // with it: it holds a second copy of the compiled model (as large as
      // its weights), and a rebuild here is for other options or another
      // torch, which would not hit it anyway.
      "TORCHINDUCTOR_CACHE_DIR=" + r->staging + "/" + kInductorScratch,
      // Its temporary files (Python's tempfile, the compiler's) and
      // Triton's cache go there too: the sandbox lets it write nowhere else.
      "TMPDIR=" + r->staging + "/" + kWorkerTmp,
      "TRITON_CACHE_DIR=" + r->staging + "/" + kInductorScratch + "/triton",
      "PYTHONUNBUFFERED=1",
      // Every torch.load in the worker (torch.export.load reads the
      // package's sample inputs and constants with it) takes tensors and
      // plain data only: a pickle in a package must not run code when it
      // is unpacked. Replacing, not adding: a 0 inherited from the daemon's
      // environment must not stand beside it.
      "TORCH_FORCE_WEIGHTS_ONLY_LOAD=1",
  });
  std::vector<char*> argv = NullTerminated(args), envp = NullTerminated(env);

  // The child writes both streams into one pipe; its write end is closed
  // here after the spawn, so the pipe ends when the child does.
  uv_file fds[2];
  if (int prc = uv_pipe(fds, 0, 0); prc != 0) {
    ::close(log_fd);
    Status s = Internal(std::string("cannot make a pipe for the build: ") + uv_strerror(prc));
    (void)fs::RemoveAll(r->staging);
    BuildJob j = std::move(r->job);
    delete r;
    return fail_now(j, s, false);
  }
  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_INHERIT_FD;
  stdio[1].data.fd = fds[1];
  stdio[2].flags = UV_INHERIT_FD;
  stdio[2].data.fd = fds[1];
  uv_process_options_t opts{};
  opts.file = argv[0];
  opts.args = argv.data();
  opts.env = envp.data();
  opts.stdio = stdio;
  opts.stdio_count = 3;
  // Its own process group (setsid): a kill reaches the compiler and Python
  // it runs too, not the build child alone (KillGroup).
  opts.flags = UV_PROCESS_DETACHED;
  opts.exit_cb = [](uv_process_t* p, int64_t exit_status, int term_signal) {
    auto* run = static_cast<Running*>(p->data);
    run->owner->Finish(run, exit_status, term_signal);
  };
  r->process.data = r;
  r->started_ms = SteadyMs();
  int rc = uv_spawn(loop_, &r->process, &opts);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    ::close(log_fd);
    Status s = FailedPrecondition("cannot start the build " + args[0] + ": " + uv_strerror(rc) +
                                  (args[0] == options_.python ? " (set build.python in the config)" : ""));
    (void)fs::RemoveAll(r->staging);
    BuildJob j = std::move(r->job);
    // libuv needs the handle closed even after a failed spawn; r goes with it.
    uv_close(reinterpret_cast<uv_handle_t*>(&r->process),
             [](uv_handle_t* h) { delete static_cast<Running*>(h->data); });
    return fail_now(j, s, true);
  }
  ++running_;
  live_.push_back(r);
  r->log_fd = log_fd;
  r->output_fd = fds[0];
  uv_pipe_init(loop_, &r->output, 0);
  r->output.data = r;
  uv_pipe_open(&r->output, fds[0]);
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&r->output),
      [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
        buf->base = new char[suggested];
        buf->len = suggested;
      },
      [](uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
        auto* run = static_cast<Running*>(s->data);
        if (nread > 0) run->Take(buf->base, static_cast<size_t>(nread));
        if (nread < 0) uv_read_stop(s);  // EOF (or an error): the exit callback finishes
        delete[] buf->base;
      });
  r->open_handles = 3;
  uv_timer_init(loop_, &r->timer);
  r->timer.data = r;
  uv_timer_start(
      &r->timer,
      [](uv_timer_t* t) {
        auto* run = static_cast<Running*>(t->data);
        run->timed_out = true;
        KillGroup(&run->process);
      },
      static_cast<uint64_t>(options_.timeout_s) * 1000, 0);
  LOG_INFO << "build started: " << r->job.key.artifact.substr(0, 12) << " " << r->job.key.package_model
           << " for " << r->job.key.device << " (pid " << r->process.pid << ")";
  if (r->job.on_start) r->job.on_start();
}

void Builder::Finish(Running* r, int64_t exit_status, int term_signal) {
  // Called once, from the exit callback; the handles are closed here.
  auto close_done = [](uv_handle_t* h) {
    auto* run = static_cast<Running*>(h->data);
    if (--run->open_handles == 0) delete run;
  };
  // What the child wrote is in the pipe by now; take the rest without
  // waiting for EOF, which a leftover grandchild could hold off.
  char buf[16384];
  for (ssize_t n; (n = ::read(r->output_fd, buf, sizeof buf)) > 0;) r->Take(buf, static_cast<size_t>(n));
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&r->output));
  ::close(r->log_fd);
  r->log_fd = -1;
  BuildResult res;
  res.duration_ms = SteadyMs() - r->started_ms;
  if (exit_status == 0 && term_signal == 0) {
    (void)fs::RemoveAll(r->staging + "/" + kInductorScratch);
    auto entry = cache_->Commit(r->staging, r->job.key, r->replaces);
    res.status = entry.status();
    if (entry.ok()) {
      res.entry = std::move(entry).value();
      ::unlink(cache_->FailedLogPath(r->job.key).c_str());
    }
  } else {
    std::string tail = LogTail(r->staging + "/build.log");
    std::string why;
    if (r->cancelled) {
      why = r->stopped ? "build cancelled: the daemon is stopping" : "build cancelled";
      res.cancelled = true;
    } else if (r->timed_out) {
      why = "build timed out after " + std::to_string(options_.timeout_s) + "s (build.timeout_s)";
    } else if (term_signal != 0) {
      why = "compile worker killed by signal " + std::to_string(term_signal);
    } else {
      why = "build exited with status " + std::to_string(exit_status);
      res.permanent = exit_status == kBuildExitPermanent;
      // A full disk fails a compile like a compile error does, but freeing
      // space fixes it: retried, and said plainly.
      if (tail.find("No space left on device") != std::string::npos) {
        res.permanent = false;
        why = "build ran out of disk space (exit status " + std::to_string(exit_status) +
              "); free some, and it may pass";
      }
    }
    // A cancelled build's log says only that it was killed.
    res.status = r->cancelled ? Cancelled(why) : Internal(tail.empty() ? why : why + ":\n" + tail);
    // The whole log outlives the staging directory (`aotid show` gives
    // its path); a cancelled build's is of no interest.
    if (!r->cancelled) {
      std::string kept = cache_->FailedLogPath(r->job.key);
      if (fs::MakeDirs(kept.substr(0, kept.rfind('/'))).ok()) {
        (void)::rename((r->staging + "/build.log").c_str(), kept.c_str());
      }
    }
    (void)fs::RemoveAll(r->staging);
  }
  // Another daemon waiting for this key finds the entry, or builds it.
  r->ReleaseKey();
  --running_;
  live_.erase(std::remove(live_.begin(), live_.end(), r), live_.end());
  BuildJob job = std::move(r->job);
  uv_timer_stop(&r->timer);
  uv_close(reinterpret_cast<uv_handle_t*>(&r->process), close_done);
  uv_close(reinterpret_cast<uv_handle_t*>(&r->timer), close_done);
  uv_close(reinterpret_cast<uv_handle_t*>(&r->output), close_done);
  if (job.on_done) job.on_done(res);
  StartNext();
}

void Builder::SetLimits(int jobs, int timeout_s) {
  options_.jobs = std::max(1, jobs);
  options_.timeout_s = timeout_s;
  StartNext();
}

}  // namespace aotid::compile
