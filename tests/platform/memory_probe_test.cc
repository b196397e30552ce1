#include "platform/memory_probe.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace aotid::platform {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

uint64_t PhysicalMemory() {
  return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// An anonymous mapping of `bytes`, unmapped when it goes.
class Mapping {
 public:
  Mapping(size_t bytes, int flags) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() { return data_; }

 private:
  size_t bytes_;
  char* data_ = nullptr;
};

uint64_t Measure(int pid) {
  StatusOr<uint64_t> bytes = ProcessMemoryBytes(pid);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.value_or(0);
}

TEST(ProcessMemoryBytesTest, GrowsByWhatThisProcessTouches) {
  uint64_t before = Measure(::getpid());
  ASSERT_GT(before, 0u);
  Mapping m(64 * kMiB, MAP_PRIVATE);
  ASSERT_NE(m.data(), nullptr);
  std::memset(m.data(), 1, 64 * kMiB);
  uint64_t after = Measure(::getpid());
  EXPECT_GE(after, before + 48 * kMiB) << "before " << before << " after " << after;
}

// A mapping two processes share is counted half in each (proportional set
// size): the two together cost one copy, not the two a resident set size
// would count.
TEST(ProcessMemoryBytesTest, PagesSharedByTwoProcessesCountHalfInEach) {
#if !defined(__linux__)
  GTEST_SKIP() << "only Linux splits shared pages among processes (PSS); macOS's footprint does not";
#elif defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "under ThreadSanitizer each page touched also touches its private shadow (four times "
                  "its size), which no other process shares";
#else
  const size_t size = 64 * kMiB;
  Mapping shared(size, MAP_SHARED);
  ASSERT_NE(shared.data(), nullptr);
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Waits for the parent to fill the mapping, reads every page of it (so
    // that they are mapped here too), says so, and waits to be let go.
    char c;
    if (::read(to_child[0], &c, 1) != 1) ::_exit(1);
    volatile char sum = 0;
    for (size_t i = 0; i < size; i += 4096) sum = static_cast<char>(sum + shared.data()[i]);
    if (::write(to_parent[1], &c, 1) != 1) ::_exit(1);
    (void)::read(to_child[0], &c, 1);
    ::_exit(0);
  }
  ::close(to_child[0]);
  ::close(to_parent[1]);
  // Should an assertion below return early, the child is not left waiting.
  struct Reap {
    pid_t pid;
    int fds[2];
    ~Reap() {
      for (int fd : fds) ::close(fd);
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } reap{child, {to_child[1], to_parent[0]}};
  uint64_t parent_before = Measure(::getpid());
  uint64_t child_before = Measure(child);
  std::memset(shared.data(), 1, size);
  char c = 'g';
  ASSERT_EQ(::write(to_child[1], &c, 1), 1);
  ASSERT_EQ(::read(to_parent[0], &c, 1), 1);
  uint64_t parent_after = Measure(::getpid());
  uint64_t child_after = Measure(child);
  ASSERT_EQ(::write(to_child[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  reap.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  int64_t parent_grew = static_cast<int64_t>(parent_after) - static_cast<int64_t>(parent_before);
  int64_t child_grew = static_cast<int64_t>(child_after) - static_cast<int64_t>(child_before);
  const int64_t half = static_cast<int64_t>(size / 2), slack = 8 * static_cast<int64_t>(kMiB);
  EXPECT_NEAR(parent_grew, half, slack) << "parent " << parent_before << " -> " << parent_after;
  EXPECT_NEAR(child_grew, half, slack) << "child " << child_before << " -> " << child_after;
  EXPECT_NEAR(parent_grew + child_grew, static_cast<int64_t>(size), slack)
      << "the two cost one copy together";
#endif
}

TEST(ProcessMemoryBytesTest, AReapedProcessIsNotFound) {
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  StatusOr<uint64_t> bytes = ProcessMemoryBytes(child);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), StatusCode::kNotFound) << bytes.status().ToString();
}

TEST(ProcessMemoryBytesTest, AZombieIsNotFound) {
#if !defined(__linux__)
  GTEST_SKIP() << "what a zombie reads as is Linux's /proc; macOS may still report its rusage";
#else
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  // Waits for it to exit without reaping it: a zombie until waitpid below.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  StatusOr<uint64_t> bytes = ProcessMemoryBytes(child);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), StatusCode::kNotFound) << bytes.status().ToString();
#endif
}

TEST(ProcessMemoryBytesTest, NoPidIsInvalid) {
  EXPECT_EQ(ProcessMemoryBytes(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ProcessMemoryBytes(-1).status().code(), StatusCode::kInvalidArgument);
}

TEST(ParsePsiTest, QuietMachine) {
  StatusOr<MemoryPressure> p = ParsePsi(
      "some avg10=0.00 avg60=0.00 avg300=0.00 total=43414\n"
      "full avg10=0.00 avg60=0.00 avg300=0.00 total=6001\n");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->known);
  EXPECT_EQ(p->level, PressureLevel::kNormal);
  EXPECT_EQ(p->some_avg10, 0.0);
  EXPECT_EQ(p->full_avg10, 0.0);
}

TEST(ParsePsiTest, LevelsAtTheThresholds) {
  auto level = [](const std::string& some, const std::string& full) {
    StatusOr<MemoryPressure> p =
        ParsePsi("some avg10=" + some + " avg60=1.50 avg300=0.20 total=123456789\nfull avg10=" + full +
                 " avg60=0.70 avg300=0.10 total=98765\n");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? p->level : PressureLevel::kNormal;
  };
  EXPECT_EQ(level("9.99", "0.00"), PressureLevel::kNormal);
  EXPECT_EQ(level("10.00", "0.00"), PressureLevel::kWarning);
  EXPECT_EQ(level("42.17", "4.99"), PressureLevel::kWarning);
  EXPECT_EQ(level("42.17", "5.00"), PressureLevel::kCritical);
  EXPECT_EQ(level("5.00", "5.00"), PressureLevel::kCritical);
  EXPECT_EQ(level("100.00", "100.00"), PressureLevel::kCritical);

  StatusOr<MemoryPressure> p = ParsePsi(
      "some avg10=12.34 avg60=1.00 avg300=0.00 total=1\nfull avg10=3.21 avg60=0.00 avg300=0.00 total=1\n");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_NEAR(p->some_avg10, 12.34, 1e-9);
  EXPECT_NEAR(p->full_avg10, 3.21, 1e-9);
  EXPECT_EQ(p->level, PressureLevel::kWarning);
}

TEST(ParsePsiTest, GarbageIsInvalid) {
  for (const char* text : {
           "",
           "hello\n",
           "full avg10=1.00 avg60=0.00 avg300=0.00 total=1\n",  // no "some"
           "some avg60=1.00 avg300=0.00 total=1\n",             // no avg10
           "some avg10=abc avg60=0.00 avg300=0.00 total=1\n",
           "some avg10=-1.00 avg60=0.00 avg300=0.00 total=1\n",
           "some avg10=101.00 avg60=0.00 avg300=0.00 total=1\n",
           "some avg10=1.2.3 avg60=0.00 avg300=0.00 total=1\n",
           "some avg10=1.00 avg60=0.00 junk total=1\n",
           "some avg10=1.00\nsome avg10=2.00\n",
           "cpu avg10=1.00\n",
       }) {
    StatusOr<MemoryPressure> p = ParsePsi(text);
    EXPECT_FALSE(p.ok()) << "'" << text << "' parsed";
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(p.status().message().find("PSI"), std::string::npos) << p.status().message();
    }
  }
}

TEST(ParseCgroupLimitTest, LimitsAndNone) {
  EXPECT_EQ(ParseCgroupLimit("max\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupLimit("1073741824\n"), uint64_t{1073741824});
  EXPECT_EQ(ParseCgroupLimit("536870912"), uint64_t{536870912});
  EXPECT_EQ(ParseCgroupLimit("9223372036854771712\n"), std::nullopt);  // v1's "unlimited", 4 KiB pages
  EXPECT_EQ(ParseCgroupLimit("9223372036854710272\n"), std::nullopt);  // ... 64 KiB pages
  EXPECT_EQ(ParseCgroupLimit(""), std::nullopt);
  EXPECT_EQ(ParseCgroupLimit("lots\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupLimit("-1\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupLimit("12 34\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupLimit("99999999999999999999999\n"), std::nullopt);
}

TEST(ReadUsableMemoryTest, AtMostPhysicalMemory) {
  UsableMemory m = ReadUsableMemory();
  EXPECT_GT(m.bytes, 0u);
  EXPECT_LE(m.bytes, PhysicalMemory());
  if (m.source == "physical memory") {
    EXPECT_EQ(m.bytes, PhysicalMemory());
  } else {
    EXPECT_EQ(m.source.rfind("cgroup limit (/sys/fs/cgroup/", 0), 0u) << m.source;
    EXPECT_LT(m.bytes, PhysicalMemory());
  }
}

TEST(ReadMemoryPressureTest, KnownWhereTheKernelSays) {
  MemoryPressure p = ReadMemoryPressure();
#if defined(__linux__)
  if (::access("/proc/pressure/memory", R_OK) == 0) {
    EXPECT_TRUE(p.known) << p.source;
    EXPECT_EQ(p.source, "/proc/pressure/memory");
    EXPECT_GE(p.some_avg10, 0.0);
    EXPECT_LE(p.some_avg10, 100.0);
  } else {
    EXPECT_FALSE(p.known);
    EXPECT_FALSE(p.source.empty());
  }
#elif defined(__APPLE__)
  EXPECT_TRUE(p.known) << p.source;
  EXPECT_EQ(p.source, "kern.memorystatus_vm_pressure_level");
#else
  EXPECT_FALSE(p.known);
  EXPECT_FALSE(p.source.empty());
#endif
}

}  // namespace
}  // namespace aotid::platform

namespace aotid::platform {
namespace {

TEST(MemoryProbe, TheOomKillCountIsReadFromVmstat) {
  EXPECT_EQ(ParseOomKills("nr_free_pages 12\npgfault 99\noom_kill 7\nnr_foo 3\n"), 7u);
  EXPECT_EQ(ParseOomKills("oom_kill 0"), 0u);
  EXPECT_EQ(ParseOomKills("nr_free_pages 12\n"), std::nullopt);
  EXPECT_EQ(ParseOomKills("oom_kill x\n"), std::nullopt);
  EXPECT_EQ(ParseOomKills("oom_kill_other 4\n"), std::nullopt);
#if defined(__linux__)
  if (::access("/proc/vmstat", R_OK) == 0) EXPECT_TRUE(ReadOomKillCount().has_value());
#endif
}

}  // namespace
}  // namespace aotid::platform
