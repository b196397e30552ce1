#include "runner/channel.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>

namespace aotid::runner {
namespace {

using model::DType;
using model::HostTensor;

HostTensor Make(std::string name, DType dtype, std::vector<int64_t> shape, uint8_t fill) {
  HostTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.assign(static_cast<size_t>(t.num_elements()) * model::DTypeSize(dtype), std::byte{fill});
  return t;
}

TEST(RunnerChannel, TensorsCrossASlotIntact) {
  auto slot = Slot::Create("test", 1 << 20);
  ASSERT_TRUE(slot.ok()) << slot.status().ToString();
  std::vector<HostTensor> in = {Make("ids", DType::kInt64, {2, 5}, 7), Make("mask", DType::kBool, {2, 5}, 1),
                                Make("scalar", DType::kFloat32, {}, 3),
                                Make("empty", DType::kFloat16, {0, 4}, 0)};
  auto written = WriteTensors(*slot, in);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  auto out = ReadTensors(*slot, *written, 8);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].name, in[i].name);
    EXPECT_EQ((*out)[i].dtype, in[i].dtype);
    EXPECT_EQ((*out)[i].shape, in[i].shape);
    EXPECT_EQ((*out)[i].data, in[i].data);
  }
  // More tensors than the reader allows are refused.
  auto fewer = ReadTensors(*slot, *written, 3);
  EXPECT_FALSE(fewer.ok());
  EXPECT_NE(fewer.status().message().find("at most 3"), std::string::npos) << fewer.status().message();
}

TEST(RunnerChannel, TensorsThatDoNotFitAreRefusedBeforeAnythingIsWritten) {
  auto slot = Slot::Create("test", 4096);
  ASSERT_TRUE(slot.ok());
  std::memset(slot->base() + sizeof(SlotHeader), 0xAB, 64);
  auto written = WriteTensors(*slot, {Make("big", DType::kFloat32, {1024}, 1)});
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), StatusCode::kLimitExceeded);  // not retried: it cannot fit later either
  EXPECT_NE(written.status().message().find("4096"), std::string::npos) << written.status().message();
  EXPECT_EQ(static_cast<unsigned char>(slot->base()[sizeof(SlotHeader)]), 0xAB);
}

// A runner runs a package's code, which may write anything into the slot:
// whatever it writes, reading it back never goes outside the slot (ASan
// would say) and never yields a tensor whose bytes disagree with its shape.
TEST(RunnerChannel, ScribbledMessagesAreRefusedOrConsistentNeverOutOfBounds) {
  auto slot = Slot::Create("test", 16384);
  ASSERT_TRUE(slot.ok());
  std::mt19937_64 rng(12345);
  int refused = 0;
  for (int round = 0; round < 4000; ++round) {
    auto written =
        WriteTensors(*slot, {Make("a", DType::kInt32, {3, 4}, 1), Make("bb", DType::kFloat64, {5}, 2)});
    ASSERT_TRUE(written.ok());
    uint64_t len = *written;
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < flips; ++i) {
      uint64_t at = sizeof(SlotHeader) + rng() % 512;  // the head and the tensor table
      uint64_t value = rng();
      size_t width = 1u << (rng() % 4);
      std::memcpy(slot->base() + at, &value, width);
    }
    if (rng() % 4 == 0) len = rng() % (1u << 20);
    auto read = ReadTensors(*slot, len, 4);
    if (!read.ok()) {
      ++refused;
      EXPECT_EQ(read.status().code(), StatusCode::kInternal);
      continue;
    }
    for (const auto& t : *read) {
      ASSERT_GE(t.num_elements(), 0);
      EXPECT_EQ(t.data.size(), static_cast<size_t>(t.num_elements()) * model::DTypeSize(t.dtype));
    }
  }
  EXPECT_GT(refused, 1000);  // the corruptions were seen, not merely survived
}

TEST(RunnerChannel, WaitReturnsTheOldValueWhenItsTimeRunsOut) {
  std::atomic<uint32_t> word{kRequest};
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitWhile(&word, kRequest, 1000, 20'000'000), kRequest);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(20));
  word.store(kResponse);
  EXPECT_EQ(WaitWhile(&word, kRequest, 0, 0), kResponse);
}

// The hand-off between two processes, through the futex (no spinning on
// either side, so both really sleep and are woken).
TEST(RunnerChannel, HandOffWakesAnotherProcess) {
  auto slot = Slot::Create("test", 1 << 16);
  ASSERT_TRUE(slot.ok());
  SlotHeader* h = slot->header();
  h->state.store(kIdle);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (int i = 0; i < 50; ++i) {
      if (WaitWhile(&h->state, kIdle, 0, 5'000'000'000) != kRequest) ::_exit(1);
      h->status = static_cast<uint32_t>(i);
      h->state.store(kResponse);
      Wake(&h->state);
      uint32_t next = WaitWhile(&h->state, kResponse, 0, 5'000'000'000);
      if (next != kIdle && next != kRequest) ::_exit(2);
    }
    ::_exit(0);
  }
  for (int i = 0; i < 50; ++i) {
    h->state.store(kRequest);
    Wake(&h->state);
    ASSERT_EQ(WaitWhile(&h->state, kRequest, 0, 5'000'000'000), kResponse) << "round " << i;
    EXPECT_EQ(h->status, static_cast<uint32_t>(i));
    h->state.store(kIdle);
    Wake(&h->state);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace aotid::runner
