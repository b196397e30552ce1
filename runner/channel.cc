#include "runner/channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

namespace aotid::runner {
namespace {

// A tensor as a message describes it; its name and bytes lie elsewhere in
// the slot, at offsets from the slot's start.
constexpr uint32_t kMaxRank = 16;
struct TensorDesc {
  uint32_t dtype;
  uint32_t rank;
  int64_t dims[kMaxRank];
  uint64_t name_offset;
  uint64_t name_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
};
struct MessageHead {
  uint32_t count;
  uint32_t reserved;
};
constexpr uint64_t kAlign = 64;
constexpr uint64_t kMaxName = 1024;

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

Slot::~Slot() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

Slot::Slot(Slot&& other) noexcept { *this = std::move(other); }

Slot& Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) ::munmap(base_, size_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    base_ = other.base_;
    size_ = other.size_;
    other.fd_ = -1;
    other.base_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

StatusOr<Slot> Slot::Create(const std::string& name, uint64_t bytes) {
#ifdef __linux__
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
#else
  // No memfd: an unlinked file in the temporary directory serves the same.
  std::string path =
      (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + std::string("/aotid-slot-XXXXXX");
  int fd = ::mkstemp(path.data());
  if (fd >= 0) {
    ::unlink(path.c_str());
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
#endif
  if (fd < 0) return IOError("cannot create the shared memory for " + name + ": " + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    return IOError("cannot size the shared memory for " + name + ": " + std::strerror(err));
  }
  auto slot = Map(fd);
  if (slot.ok()) slot->header()->capacity = bytes;
  return slot;
}

StatusOr<Slot> Slot::Map(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(SlotHeader))) {
    ::close(fd);
    return InvalidArgument("fd " + std::to_string(fd) + " is not a slot");
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return IOError(std::string("cannot map a slot: ") + std::strerror(err));
  }
  Slot slot;
  slot.fd_ = fd;
  slot.base_ = static_cast<std::byte*>(p);
  slot.size_ = static_cast<uint64_t>(st.st_size);
  return slot;
}

void Slot::Trim(uint64_t used) {
  if (used <= kSlotKeepBytes || base_ == nullptr) return;
#ifdef __linux__
  ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(kSlotKeepBytes),
              static_cast<off_t>(std::min(used, size_) - kSlotKeepBytes));
#endif
}

StatusOr<uint64_t> WriteTensors(const Slot& slot, const std::vector<model::HostTensor>& tensors) {
  const uint64_t start = sizeof(SlotHeader);
  uint64_t table = start + sizeof(MessageHead);
  uint64_t cursor = AlignUp(table + tensors.size() * sizeof(TensorDesc));
  // Sizes first, so nothing is written when the message does not fit.
  uint64_t end = cursor;
  for (const auto& t : tensors) {
    if (t.shape.size() > kMaxRank) {
      return InvalidArgument("tensor '" + t.name + "' has " + std::to_string(t.shape.size()) +
                             " dims; a run takes at most " + std::to_string(kMaxRank));
    }
    end = AlignUp(end + std::min<uint64_t>(t.name.size(), kMaxName));
    end = AlignUp(end + t.data.size());
  }
  if (end > slot.size()) {
    return LimitExceeded("the tensors of one run take " + std::to_string(end) +
                         " bytes; a runner slot holds " + std::to_string(slot.size()) +
                         " (a fixed limit: send a smaller batch)");
  }
  std::byte* base = slot.base();
  MessageHead head{static_cast<uint32_t>(tensors.size()), 0};
  std::memcpy(base + start, &head, sizeof(head));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    TensorDesc d{};
    d.dtype = static_cast<uint32_t>(t.dtype);
    d.rank = static_cast<uint32_t>(t.shape.size());
    for (size_t k = 0; k < t.shape.size(); ++k) d.dims[k] = t.shape[k];
    d.name_offset = cursor;
    d.name_bytes = std::min<uint64_t>(t.name.size(), kMaxName);
    std::memcpy(base + cursor, t.name.data(), d.name_bytes);
    cursor = AlignUp(cursor + d.name_bytes);
    d.data_offset = cursor;
    d.data_bytes = t.data.size();
    if (d.data_bytes) std::memcpy(base + cursor, t.data.data(), d.data_bytes);
    cursor = AlignUp(cursor + d.data_bytes);
    std::memcpy(base + table + i * sizeof(TensorDesc), &d, sizeof(d));
  }
  return cursor - start;
}

StatusOr<std::vector<model::HostTensor>> ReadTensors(const Slot& slot, uint64_t payload_bytes,
                                                     size_t max_tensors) {
  const uint64_t start = sizeof(SlotHeader);
  const uint64_t size = slot.size();
  auto bad = [](const std::string& what) { return Internal("malformed runner message: " + what); };
  if (payload_bytes > size - start || payload_bytes < sizeof(MessageHead))
    return bad("its length is out of range");
  const uint64_t end = start + payload_bytes;
  const std::byte* base = slot.base();
  MessageHead head;
  std::memcpy(&head, base + start, sizeof(head));
  if (head.count > max_tensors) {
    return bad(std::to_string(head.count) + " tensors where at most " + std::to_string(max_tensors) + " fit");
  }
  const uint64_t table = start + sizeof(MessageHead);
  if (table + uint64_t{head.count} * sizeof(TensorDesc) > end) return bad("its tensor table is cut short");
  auto within = [&](uint64_t off, uint64_t len) { return off >= start && off <= end && len <= end - off; };
  std::vector<model::HostTensor> out(head.count);
  for (uint32_t i = 0; i < head.count; ++i) {
    TensorDesc d;
    std::memcpy(&d, base + table + i * sizeof(TensorDesc), sizeof(d));
    auto& t = out[i];
    if (d.dtype > static_cast<uint32_t>(model::DType::kUInt64)) return bad("unknown datatype");
    if (d.rank > kMaxRank) return bad("rank out of range");
    t.dtype = static_cast<model::DType>(d.dtype);
    t.shape.assign(d.dims, d.dims + d.rank);
    int64_t n = model::NumElements(t.shape);
    if (n < 0) return bad("a negative or overflowing shape");
    if (static_cast<uint64_t>(n) > size / model::DTypeSize(t.dtype) ||
        static_cast<uint64_t>(n) * model::DTypeSize(t.dtype) != d.data_bytes) {
      return bad("tensor " + std::to_string(i) + "'s bytes do not match its shape");
    }
    if (d.name_bytes > kMaxName || !within(d.name_offset, d.name_bytes)) return bad("a name out of bounds");
    if (!within(d.data_offset, d.data_bytes)) return bad("tensor data out of bounds");
    t.name.assign(reinterpret_cast<const char*>(base + d.name_offset), d.name_bytes);
    t.data.resize(d.data_bytes);
    if (d.data_bytes) std::memcpy(t.data.data(), base + d.data_offset, d.data_bytes);
  }
  return out;
}

uint64_t WriteText(const Slot& slot, const std::string& text) {
  const uint64_t start = sizeof(SlotHeader);
  uint64_t n = std::min<uint64_t>(text.size(), std::min<uint64_t>(slot.size() - start, 64 * 1024));
  std::memcpy(slot.base() + start, text.data(), n);
  return n;
}

std::string ReadText(const Slot& slot, uint64_t payload_bytes) {
  const uint64_t start = sizeof(SlotHeader);
  uint64_t n = std::min<uint64_t>(payload_bytes, std::min<uint64_t>(slot.size() - start, 64 * 1024));
  return std::string(reinterpret_cast<const char*>(slot.base() + start), n);
}

uint32_t WaitWhile(std::atomic<uint32_t>* word, uint32_t from, int64_t spin_ns, int64_t timeout_ns) {
  uint32_t v = word->load(std::memory_order_acquire);
  if (v != from) return v;
  const int64_t t0 = MonotonicNs();
  // Spin: check the clock every 64 pauses (a pause is tens of ns).
  while (MonotonicNs() - t0 < spin_ns) {
    for (int i = 0; i < 64; ++i) {
      CpuRelax();
      v = word->load(std::memory_order_acquire);
      if (v != from) return v;
    }
  }
  for (;;) {
    int64_t left = -1;
    if (timeout_ns >= 0) {
      left = timeout_ns - (MonotonicNs() - t0);
      if (left <= 0) return from;
    }
#ifdef __linux__
    struct timespec ts;
    struct timespec* tsp = nullptr;
    if (left >= 0) {
      ts.tv_sec = static_cast<time_t>(left / 1000000000);
      ts.tv_nsec = static_cast<long>(left % 1000000000);
      tsp = &ts;
    }
    // Not FUTEX_PRIVATE: the word is shared between processes.
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, from, tsp, nullptr, 0);
#else
    std::this_thread::sleep_for(
        std::chrono::microseconds(left >= 0 ? std::min<int64_t>(left / 1000 + 1, 200) : 200));
#endif
    v = word->load(std::memory_order_acquire);
    if (v != from) return v;
  }
}

int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Wake(std::atomic<uint32_t>* word) {
#ifdef __linux__
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

}  // namespace aotid::runner
