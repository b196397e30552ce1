// How the daemon and a runner process hand tensors to each other: one
// shared-memory slot per run that may be in flight at once.
//
// A slot is a memfd both processes map. Its first cache line is a header
// whose `state` word is the hand-off: the daemon writes a request after the
// header and stores kRequest, the runner runs it, writes the response over
// it and stores kResponse. Whoever waits spins briefly on the word (a
// request that follows the last one closely is picked up in well under a
// microsecond) and then sleeps on it as a futex, so an idle runner costs
// nothing. Each slot is used by one run at a time.
//
// Neither side trusts what the other wrote: every count, rank, dim, offset
// and length read from a slot is checked against the slot's size before it
// is used (a runner runs a package's code, which may write anything there),
// and values are copied out once before they are checked.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/tensor.h"

namespace aotid::runner {

enum SlotState : uint32_t {
  kIdle = 0,      // free; the runner waits for a request
  kRequest = 1,   // the daemon wrote a request
  kResponse = 2,  // the runner wrote the response
  kDead = 3,      // the daemon's supervisor: the runner is gone
};

// What a request asks the runner to do.
enum SlotCommand : uint32_t {
  kRun = 1,  // run the model on the request's tensors
};

struct SlotHeader {
  std::atomic<uint32_t> state;
  uint32_t command;
  uint32_t status;  // response: a StatusCode; 0 is ok
  // 0 when the daemon stores a request; the runner stores 1 once it has
  // taken it, so a runner's death tells the runs it was running from those
  // sent after it was already gone.
  std::atomic<uint32_t> taken;
  uint64_t payload_bytes;  // bytes after the header the message takes
  uint64_t capacity;       // the slot's size, header included; set by the daemon
  uint8_t pad[32];
};
static_assert(sizeof(SlotHeader) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == 4);

// The address space each slot takes. Pages are only used as they are
// written (a memfd is sparse), and a run that wrote more than
// kSlotKeepBytes gives the rest back when it ends.
inline constexpr uint64_t kSlotBytes = uint64_t{4} << 30;
inline constexpr uint64_t kSlotKeepBytes = uint64_t{16} << 20;

// One slot as this process maps it.
class Slot {
 public:
  Slot() = default;
  ~Slot();
  Slot(Slot&& other) noexcept;
  Slot& operator=(Slot&& other) noexcept;
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

  // The daemon: a new memfd of kSlotBytes (or `bytes`), mapped.
  static StatusOr<Slot> Create(const std::string& name, uint64_t bytes = kSlotBytes);
  // The runner: maps the memfd it was handed; takes the fd.
  static StatusOr<Slot> Map(int fd);

  int fd() const { return fd_; }
  SlotHeader* header() const { return reinterpret_cast<SlotHeader*>(base_); }
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }

  // Gives the pages past kSlotKeepBytes back to the system when `used`
  // bytes went past it.
  void Trim(uint64_t used);

 private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
};

// Writes `tensors` as the slot's message (after the header); the bytes it
// took, or ResourceExhausted when they do not fit.
StatusOr<uint64_t> WriteTensors(const Slot& slot, const std::vector<model::HostTensor>& tensors);
// Reads a message WriteTensors wrote, checking every field against the
// slot's bounds; at most `max_tensors` tensors.
StatusOr<std::vector<model::HostTensor>> ReadTensors(const Slot& slot, uint64_t payload_bytes,
                                                     size_t max_tensors);
// An error message as a response's payload, and back (bounded by the slot).
uint64_t WriteText(const Slot& slot, const std::string& text);
std::string ReadText(const Slot& slot, uint64_t payload_bytes);

// Waiting for and waking the state word.
//
// Waits until *word != `from`, spinning for about `spin_ns` first and then
// sleeping; returns the new value, or `from` when `timeout_ns` (>= 0)
// passed first. timeout_ns < 0 waits for ever.
uint32_t WaitWhile(std::atomic<uint32_t>* word, uint32_t from, int64_t spin_ns, int64_t timeout_ns);
// Wakes every process sleeping on `word`.
void Wake(std::atomic<uint32_t>* word);

// Nanoseconds on the steady clock the waits above count with.
int64_t MonotonicNs();

}  // namespace aotid::runner
