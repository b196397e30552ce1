// A stand-in for `aotid internal-runner` that speaks the same protocol
// (runner/runner_main.h) without torch, so the daemon's side of runners is
// tested in milliseconds. Its "model" returns its first input as `out`,
// unless the first element of that input (an INT64) asks for something
// else:
//   -1  abort() after printing "what():  fake kernel: index out of bounds"
//   -2  hang (sleep for ever); first, when FAKE_RUNNER_HANGS names a FIFO,
//       write one byte to it (a test reads how many runs hang)
//   -3  exit(3)
//   -4  answer InvalidArgument "fake: bad input"
// Started with FAKE_RUNNER_START=fail it replies an error instead of ready;
// with FAKE_RUNNER_START=die it exits before replying; with
// FAKE_RUNNER_START=oom it aborts as libtorch does when it cannot allocate.
// Asked to choose its threads (--choose-threads-at-batch) it "times" itself
// at once and chooses 1, settled, or unsettled with FAKE_RUNNER_TIMING=busy;
// each start appends its --threads and --choose-threads-at-batch to the
// file FAKE_RUNNER_STARTS names, when set.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "runner/channel.h"
#include "runner/runner_main.h"

using namespace aotid;
using namespace aotid::runner;

namespace {

void Reply(const std::string& line) {
  std::string text = line + "\n";
  (void)!::write(kReadyFd, text.data(), text.size());
  ::close(kReadyFd);
}

void Serve(Slot* slot) {
  SlotHeader* h = slot->header();
  for (;;) {
    uint32_t v = h->state.load(std::memory_order_acquire);
    if (v != kRequest) {
      WaitWhile(&h->state, v, 20'000, -1);
      continue;
    }
    h->taken.store(1, std::memory_order_release);
    auto inputs = ReadTensors(*slot, h->payload_bytes, 8);
    Status failure;
    uint64_t payload = 0;
    if (!inputs.ok() || inputs->empty()) {
      failure = inputs.ok() ? InvalidArgument("no inputs") : inputs.status();
    } else {
      model::HostTensor& t = (*inputs)[0];
      int64_t first = 0;
      if (t.dtype == model::DType::kInt64 && t.data.size() >= 8) std::memcpy(&first, t.data.data(), 8);
      if (first == -1) {
        std::fprintf(stderr, "terminate called after throwing an instance of 'c10::Error'\n");
        std::fprintf(stderr, "  what():  fake kernel: index out of bounds: 0 <= tmp0 < 50\n");
        std::fflush(stderr);
        std::abort();
      }
      if (first == -2) {
        if (const char* fifo = std::getenv("FAKE_RUNNER_HANGS")) {
          int fd = ::open(fifo, O_WRONLY | O_NONBLOCK);  // kept open: the reader sees no hang-up
          if (fd >= 0) (void)!::write(fd, "h", 1);
        }
        for (;;) ::pause();
      }
      if (first == -3) std::exit(3);
      if (first == -4) {
        failure = InvalidArgument("fake: bad input");
      } else {
        t.name = "out";
        auto written = WriteTensors(*slot, {t});
        if (written.ok()) payload = *written;
        failure = written.status();
      }
    }
    if (!failure.ok()) payload = WriteText(*slot, failure.message());
    h->status = static_cast<uint32_t>(failure.code());
    h->payload_bytes = payload;
    h->state.store(kResponse, std::memory_order_release);
    Wake(&h->state);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != kRunnerCommand) return 2;
  auto args = ParseRunnerArgs(std::vector<std::string>(argv + 2, argv + argc));
  if (!args.ok()) {
    std::fprintf(stderr, "%s\n", args.status().message().c_str());
    return 2;
  }
  const char* start = std::getenv("FAKE_RUNNER_START");
  if (start && std::string(start) == "oom") {
    std::fprintf(
        stderr,
        "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n");
    std::abort();
  }
  if (start && std::string(start) == "die") {
    std::fprintf(stderr, "fake runner: dying before its reply\n");
    return 7;
  }
  if (start && std::string(start) == "fail") {
    Reply("error " + std::to_string(static_cast<int>(StatusCode::kInvalidArgument)) +
          " fake: cannot load this");
    return 1;
  }
  std::vector<Slot> slots;
  for (int i = 0; i < args->slots; ++i) {
    auto slot = Slot::Map(kFirstSlotFd + i);
    if (!slot.ok()) return 3;
    slots.push_back(std::move(slot).value());
  }
  if (const char* log = std::getenv("FAKE_RUNNER_STARTS")) {
    if (FILE* f = std::fopen(log, "a")) {
      std::fprintf(f, "%d %lld\n", args->threads, static_cast<long long>(args->choose_threads_at_batch));
      std::fclose(f);
    }
  }
  std::fprintf(stderr, "fake runner %d: ready with %d slots\n", ::getpid(), args->slots);
  if (args->choose_threads_at_batch > 0 && args->threads > 1) {
    const char* timing = std::getenv("FAKE_RUNNER_TIMING");
    bool busy = timing && std::string(timing) == "busy";
    Reply(std::string("ready 1 ") + (busy ? "0" : "1") + " 1 of " + std::to_string(args->threads) +
          ": fake timing" + (busy ? " (the machine was busy)" : ""));
  } else {
    Reply("ready " + std::to_string(args->threads) + " 0 -");
  }
  std::vector<std::thread> threads;
  for (size_t i = 1; i < slots.size(); ++i) threads.emplace_back(Serve, &slots[i]);
  Serve(&slots[0]);
}
