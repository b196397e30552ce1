#include "base/memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace aotid {

void KeepFreedMemory(size_t keep_bytes, size_t largest_kept_block) {
#if defined(__GLIBC__)
  // An operator who tuned glibc's thresholds (GLIBC_TUNABLES) keeps theirs.
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables &&
      (std::strstr(tunables, "malloc.mmap_threshold") || std::strstr(tunables, "malloc.trim_threshold")))
    return;
  constexpr int kLargestMmapThreshold = 32 << 20;  // glibc refuses more on 64-bit
  // Setting either turns off glibc's own moving thresholds, so both are set.
  ::mallopt(M_MMAP_THRESHOLD,
            static_cast<int>(std::min<size_t>(largest_kept_block, size_t{kLargestMmapThreshold})));
  ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(std::min<size_t>(keep_bytes, INT_MAX)));
#else
  (void)keep_bytes;
  (void)largest_kept_block;
#endif
}

}  // namespace aotid
