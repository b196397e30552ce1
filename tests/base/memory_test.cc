// KeepFreedMemory: a block that is freed and asked for again is not
// faulted in (and zeroed by the kernel) a second time.
#include "base/memory.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

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
#endif

}  // namespace
}  // namespace aotid
