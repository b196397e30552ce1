// How the process's allocator treats memory that is freed and asked for
// again at once: what serving does, run after run.
#pragma once

#include <cstddef>

namespace aotid {

// Keeps freed memory in the process, up to `keep_bytes` of it, instead of
// handing it back to the kernel at once. A model run allocates its
// activations and frees them at the end (ResNet-18 at batch 1: ~25 MB);
// glibc's defaults return such blocks to the kernel on free (those over its
// mmap threshold, and the top of a heap past its trim threshold), so every
// run faulted the same pages in again and the kernel zeroed each one:
// ~6,300 page faults a run, a quarter of ResNet-18's run time on this
// machine (docs/BENCHMARKS.md). Blocks up to 32 MiB (glibc's largest
// threshold) now come from the heap and stay there for the next run; larger
// ones are still mapped and unmapped. The price: the process stays at the
// high-water mark of what it used: up to keep_bytes free at the top of its
// main heap, and each thread's heap (64 MiB at most each) at its peak.
// Call it before threads start. A no-op where the C library is not glibc,
// and where GLIBC_TUNABLES sets malloc.mmap_threshold or
// malloc.trim_threshold: the operator's choice stands.
//
// `largest_kept_block` lowers the 32 MiB: larger blocks are mapped and
// given back on free. A process whose large blocks come from clients (the
// daemon's request bodies) sets it low, since each thread's heap keeps what
// it once held: four 16 MiB bodies refused by the daemon once left 200 MB
// behind, growing as other workers met them.
void KeepFreedMemory(size_t keep_bytes, size_t largest_kept_block = size_t{32} << 20);

}  // namespace aotid
