// KeepFreedMemory: a block that is freed and asked for again is not
// faulted in (and zeroed by the kernel) a second time.
#include "base/memory.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// The sanitizers bring their own allocator (mallopt is theirs, a no-op),
// so what is tested here is glibc's, in a build without them.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define AOTID_OWN_ALLOCATOR 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define AOTID_OWN_ALLOCATOR 1
#endif

namespace aotid {
namespace {

#if defined(__GLIBC__) && !defined(AOTID_OWN_ALLOCATOR)
long MinorFaults() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// A model's activations, as a run allocates them: 8 MiB written, freed at
// the end of the run, and the same again on the next run.
long FaultsOfSecondRun() {
  constexpr size_t kBytes = size_t{8} << 20;
  for (int run = 0;; ++run) {
    long before = MinorFaults();
    auto* block = static_cast<char*>(std::malloc(kBytes));
    std::memset(block, run + 1, kBytes);
    asm volatile("" : : "r"(block) : "memory");  // the writes happen
    std::free(block);
    if (run == 1) return MinorFaults() - before;
  }
}

TEST(KeepFreedMemory, ABlockFreedAndAskedForAgainIsNotFaultedInAgain) {
  KeepFreedMemory(size_t{64} << 20);
  // 8 MiB is 2,048 pages: glibc's defaults map and unmap it each time, so
  // each run faults every page in again.
  EXPECT_LT(FaultsOfSecondRun(), 64);
}

// An operator's GLIBC_TUNABLES thresholds stand: KeepFreedMemory leaves
// them alone. In a child, from glibc's default thresholds (this process's
// may have been changed by the test above).
TEST(KeepFreedMemory, GlibcTunablesOfTheOperatorAreKept) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::mallopt(M_MMAP_THRESHOLD, 128 << 10);
    ::mallopt(M_TRIM_THRESHOLD, 128 << 10);
    ::setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072", 1);
    KeepFreedMemory(size_t{64} << 20);
    std::_Exit(FaultsOfSecondRun() > 1000 ? 0 : 1);  // mapped and faulted in again, as the operator chose
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "KeepFreedMemory overrode the operator's GLIBC_TUNABLES";
}
#endif

}  // namespace
}  // namespace aotid
