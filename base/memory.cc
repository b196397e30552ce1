#include "base/memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <climits>

namespace aotid {

void KeepFreedMemory(size_t keep_bytes) {
#if defined(__GLIBC__)
  constexpr int kLargestMmapThreshold = 32 << 20;  // glibc refuses more on 64-bit
  // Setting either turns off glibc's own moving thresholds, so both are set.
  ::mallopt(M_MMAP_THRESHOLD, kLargestMmapThreshold);
  ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(std::min<size_t>(keep_bytes, INT_MAX)));
#else
  (void)keep_bytes;
#endif
}

}  // namespace aotid
