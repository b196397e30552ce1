// The daemon's side of runner processes, against tests/runner/fake_runner.cc:
// the real RunnerModel, real processes, real shared memory and signals;
// only the model inside is a stand-in.
#include "runner/runner_model.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "base/fs.h"
#include "base/mutex.h"

namespace aotid::runner {
namespace {

using model::DType;
using model::HostTensor;

HostTensor Ids(std::vector<int64_t> values) {
  HostTensor t;
  t.name = "ids";
  t.dtype = DType::kInt64;
  t.shape = {1, static_cast<int64_t>(values.size())};
  t.data.resize(values.size() * 8);
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

std::vector<int64_t> Values(const HostTensor& t) {
  std::vector<int64_t> v(t.data.size() / 8);
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

class RunnerModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = fs::MakeTempDir(::testing::TempDir(), "runner-test-");
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
    entry_.dir = dir_ + "/entry";
    entry_.so_path = entry_.dir + "/model.so";
    entry_.spec.inputs = {{"ids", DType::kInt64, {1, -1}}};
    entry_.spec.outputs = {{"out", DType::kInt64, {1, -1}}};
  }
  void TearDown() override {
    ::unsetenv("FAKE_RUNNER_START");
    ::unsetenv("FAKE_RUNNER_HANGS");
    (void)fs::RemoveAll(dir_);
  }

  RunnerOptions Options(int slots = 1) {
    RunnerOptions o;
    o.self_exe = AOTID_FAKE_RUNNER;
    o.label = "fake:1";
    o.load.num_runners = slots;
    o.scratch_root = dir_;
    o.on_event = [this](const RunnerEvent& e) {
      MutexLock lock(&mu_);
      events_.push_back(e);
      event_.SignalAll();
    };
    return o;
  }
  std::vector<RunnerEvent> Events() {
    MutexLock lock(&mu_);
    return events_;
  }
  // Until `n` events have come; false after 10 s.
  bool AwaitEvents(size_t n) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    MutexLock lock(&mu_);
    while (events_.size() < n) {
      if (!event_.WaitUntil(&mu_, deadline)) return events_.size() >= n;
    }
    return true;
  }

  std::string dir_;
  model::CacheEntry entry_;
  Mutex mu_;
  CondVar event_;
  std::vector<RunnerEvent> events_ GUARDED_BY(mu_);
};

// Reads `n` bytes from `fd` (a FIFO the fake runner writes to as a run
// starts to hang), waiting up to 10 s in all; false if they did not come.
bool ReadBytes(int fd, int n) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (n > 0) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[8];
    ssize_t got = ::read(fd, buf, std::min<size_t>(sizeof buf, static_cast<size_t>(n)));
    if (got > 0) n -= static_cast<int>(got);
    if (got == 0) return false;  // not a hang-up we expect: every writer stays
  }
  return true;
}

TEST_F(RunnerModelTest, RunsFromManyThreadsEachGetTheirOwnAnswer) {
  auto m = RunnerModel::Start(entry_, Options(/*slots=*/2));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_GT((*m)->pid(), 0);
  std::vector<std::thread> clients;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 200; ++i) {
        std::vector<int64_t> v = {c, i, c * 1000 + i};
        auto out = (*m)->Infer({Ids(v)}, {});
        if (!out.ok() || out->size() != 1 || Values((*out)[0]) != v || (*out)[0].name != "out") ++wrong;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ((*m)->restarts(), 0);
}

TEST_F(RunnerModelTest, CrashAnswersWithItsCauseAndTheRunnerIsBackForTheNextRun) {
  auto m = RunnerModel::Start(entry_, Options());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  pid_t first = (*m)->pid();
  auto crashed = (*m)->Infer({Ids({-1, 5})}, {});
  ASSERT_FALSE(crashed.ok());
  EXPECT_EQ(crashed.status().code(), StatusCode::kInternal);
  EXPECT_NE(crashed.status().message().find("SIGABRT"), std::string::npos) << crashed.status().message();
  EXPECT_NE(crashed.status().message().find("fake kernel: index out of bounds: 0 <= tmp0 < 50"),
            std::string::npos)
      << crashed.status().message();
  auto next = (*m)->Infer({Ids({4, 5})}, {});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(Values((*next)[0]), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ((*m)->restarts(), 1);
  EXPECT_NE((*m)->pid(), first);
  auto events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, RunnerEvent::Kind::kCrashed);
  EXPECT_NE(events[0].message.find("index out of bounds"), std::string::npos) << events[0].message;
  // The crashed runner is gone, not left as a zombie or an orphan.
  EXPECT_EQ(::kill(first, 0), -1);
}

TEST_F(RunnerModelTest, AnExitIsNamedByItsStatus) {
  auto m = RunnerModel::Start(entry_, Options());
  ASSERT_TRUE(m.ok());
  auto r = (*m)->Infer({Ids({-3})}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("exited with status 3"), std::string::npos) << r.status().message();
  // What it printed while starting is not taken for the cause.
  EXPECT_EQ(r.status().message().find("ready with"), std::string::npos) << r.status().message();
}

TEST_F(RunnerModelTest, ErrorsOfTheRunItselfPassThroughWithoutARestart) {
  auto m = RunnerModel::Start(entry_, Options());
  ASSERT_TRUE(m.ok());
  auto r = (*m)->Infer({Ids({-4})}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "fake: bad input");
  EXPECT_EQ((*m)->restarts(), 0);
  EXPECT_TRUE(Events().empty());
}

TEST_F(RunnerModelTest, RunPastItsDeadlineAnswersDeadlineExceededAndTheRunnerIsReplaced) {
  RunnerOptions o = Options();
  o.run_timeout_ms = 300;
  auto m = RunnerModel::Start(entry_, o);
  ASSERT_TRUE(m.ok());
  pid_t hung = (*m)->pid();
  auto r = (*m)->Infer({Ids({-2})}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("300 ms"), std::string::npos) << r.status().message();
  auto next = (*m)->Infer({Ids({8})}, {});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_NE((*m)->pid(), hung);
  auto events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].message.find("time limit"), std::string::npos) << events[0].message;
}

// kill -9 while runs are in flight: each of them fails naming the signal;
// the run after succeeds.
TEST_F(RunnerModelTest, KilledRunnerFailsTheRunsItHeld) {
  std::string hangs = dir_ + "/hangs";
  ASSERT_EQ(::mkfifo(hangs.c_str(), 0600), 0);
  int hung = ::open(hangs.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(hung, 0);
  ::setenv("FAKE_RUNNER_HANGS", hangs.c_str(), 1);
  auto m = RunnerModel::Start(entry_, Options(/*slots=*/2));
  ASSERT_TRUE(m.ok());
  std::vector<StatusOr<std::vector<HostTensor>>> results(2, Internal("not run"));
  std::vector<std::thread> held;
  for (int i = 0; i < 2; ++i) held.emplace_back([&, i] { results[i] = (*m)->Infer({Ids({-2})}, {}); });
  bool both_hang = ReadBytes(hung, 2);  // both are hanging in the runner
  ::close(hung);
  EXPECT_TRUE(both_hang) << "the runner did not get both runs";
  ASSERT_EQ(::kill((*m)->pid(), SIGKILL), 0);
  for (auto& t : held) t.join();
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInternal);
    EXPECT_NE(r.status().message().find("signal 9"), std::string::npos) << r.status().message();
  }
  auto next = (*m)->Infer({Ids({1, 2, 3})}, {});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
}

TEST_F(RunnerModelTest, RepeatedCrashesStopTheRestartsAndSayWhy) {
  RunnerOptions o = Options();
  o.max_crashes = 2;
  auto m = RunnerModel::Start(entry_, o);
  ASSERT_TRUE(m.ok());
  // Three inputs that crash it, each once (one repeated is refused: below).
  for (int i = 0; i < 3; ++i) EXPECT_FALSE((*m)->Infer({Ids({-1, i})}, {}).ok());
  auto after = (*m)->Infer({Ids({1})}, {});
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(after.status().message().find("not restarted"), std::string::npos) << after.status().message();
  EXPECT_NE(after.status().message().find("index out of bounds"), std::string::npos)
      << after.status().message();
  // The last event follows the state it reports; wait for it (bounded).
  EXPECT_TRUE(AwaitEvents(3));
  auto events = Events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, RunnerEvent::Kind::kCrashed);
  EXPECT_EQ(events[1].kind, RunnerEvent::Kind::kCrashed);
  EXPECT_EQ(events[2].kind, RunnerEvent::Kind::kFailed);
  EXPECT_EQ((*m)->pid(), 0);
}

// One client repeating an input that crashes the kernel every time: the
// input is refused after its second crash, unsent, and the version stays up
// for everyone else however often the client tries.
TEST_F(RunnerModelTest, AnInputThatCrashesTheRunnerTwiceIsRefusedAndTheVersionStaysUp) {
  RunnerOptions o = Options();
  o.max_crashes = 3;
  auto m = RunnerModel::Start(entry_, o);
  ASSERT_TRUE(m.ok());
  for (int i = 0; i < RunnerModel::kCrashesToRefuse; ++i) {
    auto crashed = (*m)->Infer({Ids({-1, 7})}, {});
    ASSERT_FALSE(crashed.ok());
    EXPECT_EQ(crashed.status().code(), StatusCode::kInternal) << crashed.status().message();
  }
  for (int i = 0; i < 10; ++i) {
    auto refused = (*m)->Infer({Ids({-1, 7})}, {});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().message();
    EXPECT_NE(refused.status().message().find("refused without running"), std::string::npos)
        << refused.status().message();
    EXPECT_NE(refused.status().message().find("index out of bounds"), std::string::npos)
        << refused.status().message();
  }
  // Other inputs still run, and an input differing in a single element (or
  // in shape alone) is not taken for the refused one.
  auto other = (*m)->Infer({Ids({4, 7})}, {});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(Values((*other)[0]), (std::vector<int64_t>{4, 7}));
  auto differs = (*m)->Infer({Ids({-1, 8})}, {});
  ASSERT_FALSE(differs.ok());
  EXPECT_EQ(differs.status().code(), StatusCode::kInternal) << differs.status().message();
  // Three crashes in all: the ten refusals sent nothing.
  ASSERT_TRUE(AwaitEvents(3));
  auto events = Events();
  EXPECT_EQ(events.size(), 3u);
  for (const RunnerEvent& e : events) EXPECT_EQ(e.kind, RunnerEvent::Kind::kCrashed) << e.message;
  auto after = (*m)->Infer({Ids({5})}, {});
  ASSERT_TRUE(after.ok()) << after.status().ToString();
}

// A run in flight when the runner was killed by another hand (or died of a
// neighbour's input) is a suspect for that one crash only: it runs again.
TEST_F(RunnerModelTest, OneCrashRefusesNoInput) {
  std::string hangs = dir_ + "/hangs";
  ASSERT_EQ(::mkfifo(hangs.c_str(), 0600), 0);
  int hung = ::open(hangs.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(hung, 0);
  // A writer of the test's own, so the FIFO has one between the runners.
  int writer = ::open(hangs.c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(writer, 0);
  ::setenv("FAKE_RUNNER_HANGS", hangs.c_str(), 1);
  auto m = RunnerModel::Start(entry_, Options());
  ASSERT_TRUE(m.ok());
  StatusOr<std::vector<HostTensor>> held = Internal("not run");
  std::thread t([&] { held = (*m)->Infer({Ids({-2, 1})}, {}); });
  bool hanging = ReadBytes(hung, 1);
  EXPECT_TRUE(hanging);
  ASSERT_GT((*m)->pid(), 0);
  ASSERT_EQ(::kill((*m)->pid(), SIGKILL), 0);
  t.join();
  ASSERT_FALSE(held.ok());
  EXPECT_EQ(held.status().code(), StatusCode::kInternal) << held.status().message();
  // Sent again, it runs (and hangs again, so the runner is killed again).
  std::thread again([&] { held = (*m)->Infer({Ids({-2, 1})}, {}); });
  hanging = ReadBytes(hung, 1);
  ::close(hung);
  ::close(writer);
  EXPECT_TRUE(hanging) << "the input was not sent again after one crash";
  if (!hanging) {  // refused: the thread has its answer already
    again.join();
    FAIL() << held.status().ToString();
  }
  ASSERT_GT((*m)->pid(), 0);
  ASSERT_EQ(::kill((*m)->pid(), SIGKILL), 0);
  again.join();
  EXPECT_EQ(held.status().code(), StatusCode::kInternal) << held.status().message();
}

TEST_F(RunnerModelTest, ARunnerThatCannotLoadSaysWhy) {
  ::setenv("FAKE_RUNNER_START", "fail", 1);
  auto failed = RunnerModel::Start(entry_, Options());
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(failed.status().message(), "fake: cannot load this");

  ::setenv("FAKE_RUNNER_START", "die", 1);
  auto died = RunnerModel::Start(entry_, Options());
  ASSERT_FALSE(died.ok());
  EXPECT_NE(died.status().message().find("exited with status 7"), std::string::npos)
      << died.status().message();
  EXPECT_NE(died.status().message().find("dying before its reply"), std::string::npos)
      << died.status().message();
  EXPECT_EQ(died.status().message().find("may allocate"), std::string::npos) << died.status().message();

  // One that runs out of memory at start names its limit and where it is set.
  ::setenv("FAKE_RUNNER_START", "oom", 1);
  RunnerOptions small = Options();
  small.memory_limit_bytes = uint64_t{24} << 20;
  auto oom = RunnerModel::Start(entry_, small);
  ASSERT_FALSE(oom.ok());
  EXPECT_NE(oom.status().message().find("std::bad_alloc"), std::string::npos) << oom.status().message();
  EXPECT_NE(
      oom.status().message().find("the runner may allocate at most 24 MiB: the version's memory_limit_mb "
                                  "setting, or runner.memory_limit_mb"),
      std::string::npos)
      << oom.status().message();
}

TEST_F(RunnerModelTest, UnloadingStopsTheRunnerAndRemovesItsScratch) {
  pid_t pid = 0;
  {
    auto m = RunnerModel::Start(entry_, Options());
    ASSERT_TRUE(m.ok());
    pid = (*m)->pid();
    ASSERT_EQ(::kill(pid, 0), 0);
  }
  EXPECT_EQ(::kill(pid, 0), -1);  // reaped, not a zombie
  std::error_code ec;
  int left = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
    left += e.path().filename().string().starts_with("runner-");
  EXPECT_EQ(left, 0);
}

TEST_F(RunnerModelTest, ARunWhoseClientLeftIsNotSent) {
  auto m = RunnerModel::Start(entry_, Options());
  ASSERT_TRUE(m.ok());
  model::RunContext ctx;
  ctx.cancelled = [] { return true; };
  auto r = (*m)->Infer({Ids({-1})}, ctx);  // would crash the runner if it ran
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_EQ((*m)->restarts(), 0);
}

}  // namespace
}  // namespace aotid::runner
