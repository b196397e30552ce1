// The real Builder running real child processes: a small shell script
// stands in for the compile worker, so each case (success, progress, a
// permanent failure, a crash, a time-out, cancellation, a leftover
// grandchild) takes milliseconds to a second instead of a compile.
#include "compile/builder.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "base/fs.h"
#include "compile/package_build.h"
#include "platform/confined_command.h"
#include "test_util.h"

namespace aotid::compile {
namespace {

using testing::TempDir;

// What the stand-in worker does is chosen by AOTID_FAKE_BUILD; it gets the
// worker's command line, and writes its outputs into --out.
constexpr char kWorker[] = R"(#!/bin/sh
out=""
while [ $# -gt 0 ]; do
  [ "$1" = "--out" ] && out="$2"
  shift
done
echo "[aotid-worker] step 1/2: loading torch"
case "$AOTID_FAKE_BUILD" in
  wait)
    i=0
    while [ ! -e "$AOTID_FAKE_GO" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done ;;
  permanent) echo "W1205 inductor noise"; echo "error: unknown inductor option 'nope'"; echo "[aotid-worker] cleaning up"; exit 2 ;;
  full) echo "OSError: [Errno 28] No space left on device: '/store/cache/.staging/x/model.so'"; exit 2 ;;
  crash) echo "about to crash"; kill -SEGV $$ ;;
  hang) sleep 30 ;;
  grandchild) sleep 30 & echo $! > "$AOTID_FAKE_GO" ;;
esac
echo "[aotid-worker] step 2/2: writing the build"
printf 'compiled' > "$out/model.so"
printf '{"inputs":[{"name":"x","datatype":"FP32","shape":[-1,4]}],"outputs":[]}' > "$out/spec.json"
printf '{}' > "$out/package.json"
)";

class BuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    uv_loop_init(&loop_);
    std::string worker = dir_ / "worker.sh";
    ASSERT_OK(fs::WriteFileAtomic(worker, kWorker));
    ::chmod(worker.c_str(), 0755);
    BuilderOptions o;
    o.python = worker;
    o.worker_dir = dir_.path();
    o.timeout_s = 30;
    options_ = o;
    artifact_ = dir_ / "model.pt2";
    ASSERT_OK(fs::WriteFileAtomic(artifact_, "an exported program"));
  }
  void TearDown() override {
    ::unsetenv("AOTID_FAKE_BUILD");
    ::unsetenv("AOTID_FAKE_GO");
    builder_.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);  // closes what the builder left
    uv_loop_close(&loop_);
  }
  Builder& Make(int timeout_s = 30) {
    options_.timeout_s = timeout_s;
    builder_ = std::make_unique<Builder>(&loop_, &cache_, options_);
    return *builder_;
  }
  BuildJob Job(std::string options = "") {
    BuildJob j;
    j.key = BuildKey{std::string(64, 'b'), "model", "cpu", "fp", std::move(options)};
    j.artifact_path = artifact_;
    j.on_start = [this] { ++started_; };
    j.on_done = [this](const BuildResult& r) { results_.push_back(r); };
    return j;
  }
  // Runs the loop until `done` or 10 s pass: each turn waits for the
  // loop's next event (a build's output or exit, or the deadline).
  bool RunUntil(const std::function<bool()>& done) { return RunUntilFor(done, 10'000); }
  bool RunUntilFor(const std::function<bool()>& done, uint64_t ms) {
    struct Deadline {
      uv_timer_t timer;
      bool passed = false, closed = false;
    } deadline;
    deadline.timer.data = &deadline;
    uv_timer_init(&loop_, &deadline.timer);
    uv_timer_start(
        &deadline.timer, [](uv_timer_t* t) { static_cast<Deadline*>(t->data)->passed = true; }, ms, 0);
    while (!done() && !deadline.passed) uv_run(&loop_, UV_RUN_ONCE);
    uv_close(reinterpret_cast<uv_handle_t*>(&deadline.timer),
             [](uv_handle_t* h) { static_cast<Deadline*>(h->data)->closed = true; });
    while (!deadline.closed) uv_run(&loop_, UV_RUN_NOWAIT);  // a closing handle's turn does not wait
    return done();
  }

  TempDir dir_;
  uv_loop_t loop_{};
  BuildCache cache_{dir_ / "cache"};
  BuilderOptions options_;
  std::string artifact_;
  std::unique_ptr<Builder> builder_;
  int started_ = 0;
  std::vector<BuildResult> results_;
};

TEST_F(BuilderTest, SuccessfulBuildLandsInTheCacheWithItsLog) {
  Builder& b = Make();
  b.Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  EXPECT_EQ(started_, 1);
  ASSERT_TRUE(results_[0].status.ok()) << results_[0].status.ToString();
  EXPECT_EQ(results_[0].entry.spec.inputs[0].name, "x");
  auto log = fs::ReadFile(results_[0].entry.dir + "/build.log");
  ASSERT_TRUE(log.ok());
  EXPECT_NE(log->find("step 2/2: writing the build"), std::string::npos) << *log;
  EXPECT_TRUE(cache_.Lookup(Job().key).ok());
  EXPECT_EQ(b.running(), 0);
}

// With its own binary known, the Builder starts the compile worker through
// `aotid internal-confine`, allowed to write its staging folder alone; here a
// script stands in for aotid and runs the worker as the real one would
// after entering the sandbox.
TEST_F(BuilderTest, CompileWorkerStartsThroughTheSandbox) {
  std::string seen = dir_ / "confine-args";
  std::string confine = dir_ / "confine.sh";
  ASSERT_OK(
      fs::WriteFileAtomic(confine, "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + seen +
                                       "\nwhile [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n"));
  ::chmod(confine.c_str(), 0755);
  options_.self_exe = confine;
  Builder& b = Make();
  b.Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  ASSERT_TRUE(results_[0].status.ok()) << results_[0].status.ToString();
  auto args = fs::ReadFile(seen);
  ASSERT_TRUE(args.ok());
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = args->find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(args->substr(at, nl - at));
  auto parsed = platform::ParseConfineArgs(std::vector<std::string>(lines.begin() + 1, lines.end()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << *args;
  EXPECT_EQ(lines[0], platform::kConfineCommand);
  ASSERT_EQ(parsed->write_paths.size(), 1u) << *args;
  EXPECT_NE(parsed->write_paths[0].find(cache_.root() + "/.staging/"), std::string::npos) << *args;
  EXPECT_NE(std::find(parsed->read_paths.begin(), parsed->read_paths.end(), artifact_),
            parsed->read_paths.end())
      << *args;
  EXPECT_NE(std::find(parsed->read_paths.begin(), parsed->read_paths.end(), options_.worker_dir),
            parsed->read_paths.end())
      << *args;
  EXPECT_FALSE(parsed->gpu);
  ASSERT_GE(parsed->command.size(), 3u);
  EXPECT_EQ(parsed->command[0], options_.python);
  EXPECT_EQ(parsed->command[2], "aotid_worker.compile");
}

TEST_F(BuilderTest, ProgressIsTheLastStepTheChildPrinted) {
  ::setenv("AOTID_FAKE_BUILD", "wait", 1);
  std::string go = dir_ / "go";
  ::setenv("AOTID_FAKE_GO", go.c_str(), 1);
  Builder& b = Make();
  b.Submit(Job());
  ASSERT_TRUE(RunUntil([&] {
    return b.Progress(Job().key).find("step 1/2: loading torch") != std::string::npos;
  })) << b.Progress(Job().key);
  EXPECT_NE(b.Progress(Job().key).find(" s)"), std::string::npos);  // with the time it has taken
  ASSERT_OK(fs::WriteFileAtomic(go, ""));
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  EXPECT_TRUE(results_[0].status.ok()) << results_[0].status.ToString();
  EXPECT_EQ(b.Progress(Job().key), "");  // not running any more
}

TEST_F(BuilderTest, ExitCodeTwoIsAPermanentFailureWithTheLogTail) {
  ::setenv("AOTID_FAKE_BUILD", "permanent", 1);
  Make().Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  EXPECT_FALSE(results_[0].status.ok());
  EXPECT_TRUE(results_[0].permanent);
  // The worker's reason first, then the log's end without its progress
  // lines (the log keeps those).
  EXPECT_EQ(results_[0].status.message(),
            "build exited with status 2:\nerror: unknown inductor option 'nope'\nW1205 inductor noise");
  EXPECT_EQ(cache_.Lookup(Job().key).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(cache_.List().empty());  // nothing half-written
}

TEST_F(BuilderTest, FullDiskIsAFailureThatMayPassNotACompileError) {
  ::setenv("AOTID_FAKE_BUILD", "full", 1);
  Make().Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  EXPECT_FALSE(results_[0].permanent);  // the compile error exit code notwithstanding
  EXPECT_NE(results_[0].status.message().find("ran out of disk space"), std::string::npos)
      << results_[0].status.message();
}

TEST_F(BuilderTest, CrashedChildMayPassOnRetry) {
  ::setenv("AOTID_FAKE_BUILD", "crash", 1);
  Make().Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  EXPECT_FALSE(results_[0].permanent);
  EXPECT_NE(results_[0].status.message().find("killed by signal 11"), std::string::npos)
      << results_[0].status.message();
}

TEST_F(BuilderTest, BuildPastItsTimeLimitIsKilled) {
  ::setenv("AOTID_FAKE_BUILD", "hang", 1);
  Make(/*timeout_s=*/1).Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  EXPECT_NE(results_[0].status.message().find("timed out after 1s"), std::string::npos)
      << results_[0].status.message();
  EXPECT_FALSE(results_[0].permanent);
}

TEST_F(BuilderTest, CancelStopsRunningAndQueuedBuilds) {
  ::setenv("AOTID_FAKE_BUILD", "hang", 1);
  Builder& b = Make();  // one job at a time: the second waits in the queue
  b.Submit(Job());
  b.Submit(Job(R"({"freezing":true})"));
  ASSERT_TRUE(RunUntil([&] { return started_ == 1; }));
  EXPECT_EQ(b.queued(), 1u);
  EXPECT_TRUE(b.Cancel(Job(R"({"freezing":true})").key));  // queued: answered at once
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_TRUE(results_[0].cancelled);
  EXPECT_TRUE(b.Cancel(Job().key));  // running: killed, answered when it exits
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 2; }));
  EXPECT_TRUE(results_[1].cancelled);
  EXPECT_FALSE(b.Cancel(Job().key));  // nothing left to cancel
  EXPECT_EQ(started_, 1);
}

// The daemon's stop ends every build as cancelled, not failed: a stop says
// nothing of the artifact, and must not read as a failed attempt.
TEST_F(BuilderTest, ShutdownCancelsRunningAndQueuedBuilds) {
  ::setenv("AOTID_FAKE_BUILD", "hang", 1);
  Builder& b = Make();  // one job at a time: the second waits in the queue
  b.Submit(Job());
  b.Submit(Job(R"({"freezing":true})"));
  ASSERT_TRUE(RunUntil([&] { return started_ == 1; }));
  b.Shutdown();
  ASSERT_EQ(results_.size(), 1u);  // the queued one, at once
  EXPECT_TRUE(results_[0].cancelled);
  EXPECT_EQ(results_[0].status.code(), StatusCode::kCancelled);
  EXPECT_NE(results_[0].status.message().find("before it started: the daemon is stopping"), std::string::npos)
      << results_[0].status.message();
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 2; }));  // the running one, once killed
  EXPECT_TRUE(results_[1].cancelled);
  EXPECT_EQ(results_[1].status.code(), StatusCode::kCancelled);
  EXPECT_NE(results_[1].status.message().find("the daemon is stopping"), std::string::npos)
      << results_[1].status.message();
  EXPECT_FALSE(fs::Exists(cache_.FailedLogPath(Job().key)));  // no failure's log kept
  EXPECT_EQ(started_, 1);
}

// A child that leaves a process behind holding its output pipe still
// finishes when the child exits.
TEST_F(BuilderTest, LeftoverGrandchildDoesNotHoldTheBuildOpen) {
  ::setenv("AOTID_FAKE_BUILD", "grandchild", 1);
  std::string pid_file = dir_ / "grandchild.pid";
  ::setenv("AOTID_FAKE_GO", pid_file.c_str(), 1);
  Make().Submit(Job());
  bool finished = RunUntil([&] { return !results_.empty(); });
  if (auto pid = fs::ReadFile(pid_file); pid.ok() && !pid->empty()) ::kill(std::stoi(*pid), SIGKILL);
  ASSERT_TRUE(finished);
  EXPECT_TRUE(results_[0].status.ok()) << results_[0].status.ToString();
}

// A compiler started by the build child of a daemon that was killed
// outlives both; the next daemon finds it by its paths and ends it.
TEST(LeftoverBuilds, ProcessesWorkingInStagingAreKilled) {
  TempDir d;
  std::string staging = d / ".staging";
  ASSERT_OK(fs::MakeDirs(staging + "/abc"));
  // A shell named `arg0` that waits for ever, once it says (on a pipe)
  // that it runs: its command line is then the one the search reads. It
  // waits in `read` on a pipe nobody writes, a builtin: a shell that ran
  // commands would fork copies of itself, with its command line, that the
  // search would find too.
  std::vector<int> held;  // the write ends of the shells' stdin
  auto spawn = [&held](const std::string& arg0) {
    int up[2], in[2];
    if (::pipe(up) != 0 || ::pipe(in) != 0) return pid_t{-1};
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(up[1], 1);
      ::dup2(in[0], 0);
      ::execl("/bin/sh", "sh", "-c", "echo up; read never", arg0.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(up[1]);
    ::close(in[0]);
    held.push_back(in[1]);
    pollfd p{up[0], POLLIN, 0};
    char c;
    bool said = ::poll(&p, 1, 10'000) > 0 && ::read(up[0], &c, 1) == 1;
    ::close(up[0]);
    EXPECT_TRUE(said) << arg0 << " did not start";
    return pid;
  };
  pid_t child = spawn(staging + "/abc/compile");
  pid_t bystander = spawn(d / "elsewhere");
  ASSERT_GT(child, 0);
  ASSERT_GT(bystander, 0);
  EXPECT_EQ(KillLeftoverBuilds(staging), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(::waitpid(bystander, &status, WNOHANG), 0);  // not using the staging dir: left alone
  ::kill(bystander, SIGKILL);
  ::waitpid(bystander, &status, 0);
  for (int fd : held) ::close(fd);
}

TEST(PackageBuild, CommandLineIsReadBackAsWritten) {
  PackageBuildArgs a;
  a.artifact = "/store/blobs/ab";
  a.out = "/store/cache/.staging/x";
  a.kind = "aoti_source";
  a.device = "cuda";
  a.package_model = "head";
  a.cxx = "clang++";
  std::vector<std::string> argv = PackageBuildArgv("/usr/bin/aotid", a);
  ASSERT_GE(argv.size(), 2u);
  EXPECT_EQ(argv[1], kPackageBuildCommand);
  auto back = ParsePackageBuildArgs(std::vector<std::string>(argv.begin() + 2, argv.end()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->artifact, a.artifact);
  EXPECT_EQ(back->out, a.out);
  EXPECT_EQ(back->kind, a.kind);
  EXPECT_EQ(back->device, a.device);
  EXPECT_EQ(back->package_model, a.package_model);
  EXPECT_EQ(back->cxx, a.cxx);
}

TEST(PackageBuild, BadCommandLinesNameTheProblem) {
  auto unknown = ParsePackageBuildArgs({"--artifact", "a", "--out", "o", "--kind", "k", "--evil", "x"});
  EXPECT_NE(unknown.status().message().find("unknown argument '--evil'"), std::string::npos);
  auto missing = ParsePackageBuildArgs({"--artifact", "a", "--kind", "k"});
  EXPECT_NE(missing.status().message().find("--out is required"), std::string::npos);
  auto twice = ParsePackageBuildArgs({"--out", "a", "--out", "b"});
  EXPECT_NE(twice.status().message().find("--out given twice"), std::string::npos);
  auto dangling = ParsePackageBuildArgs({"--artifact"});
  EXPECT_NE(dangling.status().message().find("needs a value"), std::string::npos);
}

TEST(ConfinedCommand, CommandLineIsReadBackAsWritten) {
  platform::ConfineArgs a;
  a.read_paths = {"/venv", "/store/blobs/ab"};
  a.write_paths = {"/store/cache/.staging/x"};
  a.gpu = true;
  a.command = {"/venv/bin/python", "-m", "aotid_worker.compile", "--read", "--"};
  std::vector<std::string> argv = platform::ConfineArgv("/usr/bin/aotid", a);
  ASSERT_GE(argv.size(), 2u);
  EXPECT_EQ(argv[1], platform::kConfineCommand);
  auto back = platform::ParseConfineArgs(std::vector<std::string>(argv.begin() + 2, argv.end()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->read_paths, a.read_paths);
  EXPECT_EQ(back->write_paths, a.write_paths);
  EXPECT_TRUE(back->gpu);
  EXPECT_EQ(back->command, a.command);  // its own flags are not the sandbox's
}

TEST(ConfinedCommand, BadCommandLinesNameTheProblem) {
  auto unknown = platform::ParseConfineArgs({"--evil", "x", "--", "python"});
  EXPECT_NE(unknown.status().message().find("unknown argument '--evil'"), std::string::npos);
  auto dangling = platform::ParseConfineArgs({"--write", "--", "python"});
  EXPECT_NE(dangling.status().message().find("--write needs a path"), std::string::npos);
  auto none = platform::ParseConfineArgs({"--write", "/x", "--"});
  EXPECT_NE(none.status().message().find("no command after --"), std::string::npos);
  EXPECT_FALSE(platform::ParseConfineArgs({"--write", "/x"}).ok());
}

// Daemons sharing a cache: a key another holds the lock of (it is
// building it; a descriptor of this process stands for the other daemon,
// flock being the open file's) is waited for, not built twice; its entry,
// once committed, is this build's result.
TEST_F(BuilderTest, AKeyAnotherDaemonBuildsIsWaitedForAndItsEntryTaken) {
  auto held = cache_.LockBuild(Job().key);
  ASSERT_TRUE(held.ok() && *held >= 0) << held.status().ToString();
  Builder& b = Make();
  b.set_wait_poll_ms(20);
  b.Submit(Job());
  EXPECT_EQ(b.waiting(), 1u);
  EXPECT_EQ(b.running(), 0);
  EXPECT_NE(b.Progress(Job().key).find("waiting for another daemon's build"), std::string::npos)
      << b.Progress(Job().key);
  // Still waiting a while later: the other is building.
  EXPECT_FALSE(RunUntilFor([&] { return !results_.empty(); }, 200));
  EXPECT_EQ(started_, 0);

  BuildCache other(dir_ / "cache");
  auto staging = other.NewStaging(Job().key);
  ASSERT_TRUE(staging.ok());
  ASSERT_OK(fs::WriteFileAtomic(*staging + "/model.so", "theirs"));
  ASSERT_OK(fs::WriteFileAtomic(
      *staging + "/spec.json", R"({"inputs":[{"name":"y","datatype":"FP32","shape":[-1,4]}],"outputs":[]})"));
  ASSERT_OK(fs::WriteFileAtomic(*staging + "/package.json", "{}"));
  ASSERT_TRUE(other.Commit(*staging, Job().key).ok());
  ::close(*held);
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  EXPECT_EQ(started_, 0);  // nothing compiled here
  ASSERT_TRUE(results_[0].status.ok()) << results_[0].status.ToString();
  EXPECT_TRUE(results_[0].built_elsewhere);
  EXPECT_EQ(results_[0].entry.spec.inputs[0].name, "y");
  EXPECT_EQ(fs::ReadFile(results_[0].entry.so_path).value_or(""), "theirs");
  EXPECT_EQ(b.waiting(), 0u);
}

// The other daemon's build ends without an entry (it failed, or the daemon
// died): the waiting one builds it.
TEST_F(BuilderTest, AWaitingBuildBuildsWhenTheOtherEndsWithoutAnEntry) {
  auto held = cache_.LockBuild(Job().key);
  ASSERT_TRUE(held.ok() && *held >= 0);
  Builder& b = Make();
  b.set_wait_poll_ms(20);
  b.Submit(Job());
  EXPECT_EQ(b.waiting(), 1u);
  ::close(*held);
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  EXPECT_EQ(started_, 1);
  ASSERT_TRUE(results_[0].status.ok()) << results_[0].status.ToString();
  EXPECT_FALSE(results_[0].built_elsewhere);
  EXPECT_EQ(fs::ReadFile(results_[0].entry.so_path).value_or(""), "compiled");
  // Its lock was let go with the build.
  auto again = cache_.LockBuild(Job().key);
  ASSERT_TRUE(again.ok());
  EXPECT_GE(*again, 0);
  if (*again >= 0) ::close(*again);
}

// A sound entry found when the build starts (another daemon made it since
// this one was asked for) is taken; one damaged in place, whose sizes are
// right but whose digest is not, is what the build replaces: taking it
// had the daemon load, fail, and "rebuild" it again at once, for ever.
TEST_F(BuilderTest, AnEntryFoundAtStartIsTakenOnlyWhenItsDigestIsSound) {
  Builder& b = Make();
  b.Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  ASSERT_TRUE(results_[0].status.ok());
  EXPECT_FALSE(results_[0].built_elsewhere);
  b.Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 2; }));
  EXPECT_TRUE(results_[1].built_elsewhere);
  EXPECT_EQ(started_, 1);

  // Asked for again (its load failed, for a reason its files do not
  // show): built, not taken a second time, and the build replaces it.
  const std::string taken = BuildCache::EntryIdentity(results_[1].entry.dir);
  b.Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 3; }));
  ASSERT_TRUE(results_[2].status.ok()) << results_[2].status.ToString();
  EXPECT_FALSE(results_[2].built_elsewhere);
  EXPECT_EQ(started_, 2);
  EXPECT_NE(BuildCache::EntryIdentity(results_[2].entry.dir), taken);
  results_.pop_back();
  started_ = 1;

  ASSERT_OK(fs::WriteFileAtomic(results_[0].entry.so_path, "COMPILED"));  // same size
  ASSERT_TRUE(cache_.Lookup(Job().key).ok());                             // the sizes cannot tell
  b.Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 3; }));
  ASSERT_TRUE(results_[2].status.ok()) << results_[2].status.ToString();
  EXPECT_FALSE(results_[2].built_elsewhere);
  EXPECT_EQ(started_, 2);
  EXPECT_EQ(fs::ReadFile(results_[2].entry.so_path).value_or(""), "compiled");
  // A new entry of the key, found at a later start, is another: taken.
  b.Submit(Job());
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 4; }));
  EXPECT_TRUE(results_[3].built_elsewhere);
}

// A build holds its key's lock while it runs, so another daemon waits.
TEST_F(BuilderTest, ARunningBuildHoldsItsKeysLock) {
  std::string go = dir_ / "go";
  ::setenv("AOTID_FAKE_BUILD", "wait", 1);
  ::setenv("AOTID_FAKE_GO", go.c_str(), 1);
  Builder& b = Make();
  b.Submit(Job());
  ASSERT_EQ(b.running(), 1);
  auto held = cache_.LockBuild(Job().key);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, -1);
  ASSERT_OK(fs::WriteFileAtomic(go, ""));
  ASSERT_TRUE(RunUntil([&] { return !results_.empty(); }));
  ASSERT_TRUE(results_[0].status.ok()) << results_[0].status.ToString();
}

// A waiting build is cancelled like a queued one, and a stop ends it.
TEST_F(BuilderTest, AWaitingBuildIsCancelledAndStoppedLikeAQueuedOne) {
  auto held = cache_.LockBuild(Job().key);
  ASSERT_TRUE(held.ok() && *held >= 0);
  Builder& b = Make();
  b.Submit(Job());
  EXPECT_TRUE(b.Cancel(Job().key));
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_TRUE(results_[0].cancelled);
  b.Submit(Job());
  EXPECT_EQ(b.waiting(), 1u);
  b.Shutdown();
  ASSERT_EQ(results_.size(), 2u);
  EXPECT_TRUE(results_[1].cancelled);
  EXPECT_EQ(started_, 0);
  ::close(*held);
}

}  // namespace
}  // namespace aotid::compile
