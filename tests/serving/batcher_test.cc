#include "serving/batcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "base/counter.h"
#include "base/fake_clock.h"
#include "base/mutex.h"
#include "test_util.h"

namespace aotid::serving {
namespace {

using model::DType;
using model::HostTensor;
using model::LoadedModel;
using model::ModelSpec;
using model::RunContext;

// y = 2x + 1 elementwise over whatever batch it gets; counts its calls
// (a test can wait for one) and the largest batch. `break_rows` makes it
// return one row too few; Hold() keeps runs from finishing until Release()
// (so that requests queue behind one); with a clock, each run moves it by
// `run_ms` (a run that takes that long, to the batcher).
class FakeModel : public LoadedModel {
 public:
  explicit FakeModel(aotid::testing::FakeClock* clock = nullptr) : clock_(clock) {
    spec_.inputs.push_back({"x", DType::kFloat32, {-1, -1}});
    spec_.outputs.push_back({"y", DType::kFloat32, {-1, -1}});
  }
  const ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<HostTensor>> Infer(const std::vector<HostTensor>& in, const RunContext&) override {
    calls.Add();
    {
      MutexLock lock(&mu_);
      // A held run ends when released, or after 10 s (the test has failed).
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (held_ && released_.WaitUntil(&mu_, until)) {
      }
    }
    if (clock_ && run_ms > 0) clock_->Advance(run_ms);
    max_rows = std::max<int64_t>(max_rows, in[0].shape[0]);
    HostTensor y = in[0];
    y.name = "y";
    std::vector<float> v(y.data.size() / 4);
    std::memcpy(v.data(), y.data.data(), y.data.size());
    for (float& f : v) f = 2 * f + 1;
    std::memcpy(y.data.data(), v.data(), y.data.size());
    if (break_rows) {
      y.shape[0] -= 1;
      y.data.resize(y.data.size() - static_cast<size_t>(y.shape[1]) * 4);
    }
    return std::vector<HostTensor>{y};
  }
  void Hold() {
    MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    MutexLock lock(&mu_);
    held_ = false;
    released_.SignalAll();
  }
  aotid::testing::Counter calls;  // runs started, held or not
  std::atomic<int64_t> max_rows{0};
  bool break_rows = false;
  int run_ms = 0;

 private:
  aotid::testing::FakeClock* clock_;
  Mutex mu_;
  CondVar released_;
  bool held_ GUARDED_BY(mu_) = false;
  ModelSpec spec_;
  std::string device_ = "cpu";
};

// How many requests wait in a batcher's queue, as it says each time one
// joins it (BatchingModel::TEST_SetOnQueued).
class QueueWatch {
 public:
  explicit QueueWatch(BatchingModel& model) {
    model.TEST_SetOnQueued([this](int n) { queued.Set(n); });
  }
  aotid::testing::Counter queued;
};

HostTensor Rows(const std::vector<float>& values, int64_t cols) {
  HostTensor t;
  t.name = "x";
  t.shape = {static_cast<int64_t>(values.size()) / cols, cols};
  t.data.resize(values.size() * 4);
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

std::vector<float> Floats(const HostTensor& t) {
  std::vector<float> v(t.data.size() / 4);
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

// max_batch_size 1 is a queue: while the model's one run is held (a runner
// that hangs), further requests are queued and their callers return at
// once, holding nothing; each then runs alone, never joined.
TEST(Batcher, AQueueOfOneHoldsNoCallerAndJoinsNothing) {
  auto fake = std::make_shared<FakeModel>();
  fake->Hold();
  BatchOptions opts;
  opts.max_batch_size = 1;
  opts.workers = 1;
  BatchingModel queue(fake, opts);
  Mutex mu;
  std::vector<std::vector<float>> answers;
  aotid::testing::Counter answered;
  auto answer = [&](StatusOr<std::vector<HostTensor>> out) {
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    MutexLock lock(&mu);
    answers.push_back(Floats((*out)[0]));
    answered.Add();
  };
  // The first runs on its caller's thread (nothing to wait for) and holds.
  std::thread first([&] { ASSERT_OK(queue.Submit({Rows({1, 2}, 1)}, {}, answer)); });
  ASSERT_TRUE(fake->calls.Await(1));
  // These return while the run is held: queued, not run, not waited for.
  ASSERT_OK(queue.Submit({Rows({3, 4}, 1)}, {}, answer));
  ASSERT_OK(queue.Submit({Rows({5, 6}, 1)}, {}, answer));
  EXPECT_EQ(fake->calls.Get(), 1);
  EXPECT_EQ(answered.Get(), 0);
  fake->Release();
  first.join();
  ASSERT_TRUE(answered.Await(3));
  MutexLock lock(&mu);
  EXPECT_EQ(fake->calls.Get(), 3);      // one run each
  EXPECT_EQ(fake->max_rows.load(), 2);  // never joined
  std::sort(answers.begin(), answers.end());
  EXPECT_EQ(answers, (std::vector<std::vector<float>>{{3, 5}, {7, 9}, {11, 13}}));
}

// 32 callers queue behind a run that holds; once it ends, they are joined
// into full batches of 8, and each caller gets its own row back.
TEST(Batcher, ConcurrentCallersEachGetExactlyTheirRows) {
  auto fake = std::make_shared<FakeModel>();
  std::atomic<int> batches{0}, joined{0};
  BatchOptions opts;
  opts.max_batch_size = 8;
  opts.max_delay_us = 20000;
  BatchingModel model(fake, opts, [&](const BatchReport& r) {
    batches++;
    if (r.requests > 1) joined++;
    EXPECT_LE(r.rows, 8);
  });
  QueueWatch watch(model);
  fake->Hold();  // the first run holds while the others queue
  std::thread blocker([&] { EXPECT_TRUE(model.Infer({Rows({0, 0, 0}, 3)}, {}).ok()); });
  ASSERT_TRUE(fake->calls.Await(1));
  std::vector<std::thread> clients;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 32; ++c) {
    clients.emplace_back([&, c] {
      std::vector<float> mine = {float(c), float(c) + 0.5f, -float(c)};  // one row of 3, distinct per client
      auto out = model.Infer({Rows(mine, 3)}, {});
      if (!out.ok() || (*out)[0].shape != std::vector<int64_t>{1, 3}) {
        wrong++;
        return;
      }
      std::vector<float> want = {2 * mine[0] + 1, 2 * mine[1] + 1, 2 * mine[2] + 1};
      if (Floats((*out)[0]) != want) wrong++;
    });
  }
  EXPECT_TRUE(watch.queued.Await(32));
  fake->Release();
  for (auto& t : clients) t.join();
  blocker.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(joined, 4) << "the 32 queued requests were not joined into 4 batches";
  EXPECT_EQ(fake->calls.Get(), 1 + 4);
  EXPECT_EQ(fake->max_rows, 8);
}

// Submitted requests hold no thread while they wait: 64 of them from 8
// threads, each answered through its callback with exactly its rows, in
// batches that join them.
TEST(Batcher, SubmittedRequestsAreAnsweredWithTheirOwnRows) {
  auto fake = std::make_shared<FakeModel>();
  BatchOptions opts;
  opts.max_batch_size = 16;
  std::atomic<int> joined{0};
  BatchingModel model(fake, opts, [&](const BatchReport& r) { joined += r.requests > 1; });
  // A run that holds keeps the batch worker busy, so the others queue.
  fake->Hold();
  std::thread blocker([&] { EXPECT_TRUE(model.Infer({Rows({0, 0}, 2)}, {}).ok()); });
  ASSERT_TRUE(fake->calls.Await(1));
  Mutex mu;
  CondVar all_done;
  int answered = 0, wrong = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 8; ++k) {
        float c = static_cast<float>(t * 8 + k);
        std::vector<float> mine = {c, -c};
        Status s = model.Submit({Rows(mine, 2)}, {}, [&, mine](StatusOr<std::vector<HostTensor>> out) {
          bool right = out.ok() && Floats((*out)[0]) == std::vector<float>{2 * mine[0] + 1, 2 * mine[1] + 1};
          MutexLock lock(&mu);
          wrong += !right;
          if (++answered == 64) all_done.SignalAll();
        });
        EXPECT_OK(s);
      }
    });
  }
  for (auto& t : threads) t.join();  // all submitted while the first run holds
  EXPECT_EQ(fake->calls.Get(), 1);
  fake->Release();
  blocker.join();
  {
    MutexLock lock(&mu);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (answered < 64 && std::chrono::steady_clock::now() < until) all_done.WaitUntil(&mu, until);
    EXPECT_EQ(answered, 64);
    EXPECT_EQ(wrong, 0);
  }
  EXPECT_EQ(joined.load(), 4);  // 64 queued rows, in full batches of 16
  EXPECT_EQ(fake->max_rows.load(), 16);
  EXPECT_EQ(fake->calls.Get(), 1 + 4);
}

// A request with nothing to join and none on its way runs at once on the
// thread that submits it: answered before Submit returns.
TEST(Batcher, ALoneSubmittedRequestRunsOnItsCallersThread) {
  auto fake = std::make_shared<FakeModel>();
  BatchOptions opts;
  opts.max_batch_size = 8;
  opts.max_delay_us = 1'000'000;
  BatchingModel model(fake, opts);
  std::thread::id ran_on;
  std::vector<float> got;
  ASSERT_OK(model.Submit({Rows({1, 2}, 2)}, {}, [&](StatusOr<std::vector<HostTensor>> out) {
    ran_on = std::this_thread::get_id();
    if (out.ok()) got = Floats((*out)[0]);
  }));
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(got, (std::vector<float>{3, 5}));
}

// The batcher waits for more rows only while one is on its way: a lone
// request does not wait out a long max_delay_us; an announced one is
// waited for and joins the batch; and the wait never outlasts a run of the
// model (here 0.4 s, on a clock the test moves), however long
// max_delay_us is.
TEST(Batcher, WaitsOnlyForRequestsOnTheirWay) {
  aotid::testing::FakeClock clock;
  auto fake = std::make_shared<FakeModel>(&clock);
  fake->run_ms = 400;
  BatchOptions opts;
  opts.max_batch_size = 8;
  opts.max_delay_us = 60'000'000;
  std::vector<int> rows;
  Mutex mu;
  BatchingModel model(
      fake, opts,
      [&](const BatchReport& r) {
        MutexLock lock(&mu);
        if (r.rows) rows.push_back(r.rows);
      },
      &clock);
  aotid::testing::Counter answered;
  auto count = [&](StatusOr<std::vector<HostTensor>> out) { answered.Add(out.ok()); };
  // Alone: it runs without the clock moving (it waits for nothing).
  std::thread lone([&] { count(model.Infer({Rows({1, 2}, 2)}, {})); });
  bool lone_ran = answered.Await(1);
  if (!lone_ran) clock.Advance(60'000);  // free it
  lone.join();
  ASSERT_TRUE(lone_ran) << "a lone request waited for others";

  auto on_its_way = model.Announce();
  ASSERT_OK(model.Submit({Rows({3, 4}, 2)}, {}, count));
  ASSERT_TRUE(clock.AwaitWaiters(1)) << "the batcher did not wait for the announced request";
  EXPECT_EQ(answered.Get(), 1);
  ASSERT_OK(model.Submit({Rows({5, 6}, 2)}, {}, count, std::move(on_its_way)));
  EXPECT_TRUE(answered.Await(3));
  {
    MutexLock lock(&mu);
    EXPECT_EQ(rows, (std::vector<int>{1, 2})) << "the announced request did not join the waiting one";
  }

  // One that never comes is waited for a run's time: 0.4 s, not 60 s.
  auto never = model.Announce();
  ASSERT_OK(model.Submit({Rows({7, 8}, 2)}, {}, count));
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Advance(400);
  EXPECT_TRUE(answered.Await(4)) << "the wait outlasted a run of the model";
  MutexLock lock(&mu);
  EXPECT_EQ(rows, (std::vector<int>{1, 2, 1}));
}

TEST(Batcher, FullQueueIsRefusedAtOnceAndTheRestComplete) {
  auto fake = std::make_shared<FakeModel>();
  BatchOptions opts;
  opts.max_batch_size = 64;
  opts.max_queued = 2;
  BatchingModel model(fake, opts);
  QueueWatch watch(model);
  // A run that does not end yet keeps the worker busy, so requests queue.
  fake->Hold();
  std::thread blocker([&] { EXPECT_TRUE(model.Infer({Rows({0, 0}, 2)}, {}).ok()); });
  ASSERT_TRUE(fake->calls.Await(1));
  std::atomic<int> ok{0}, other{0};
  aotid::testing::Counter full;
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&] {
      auto out = model.Infer({Rows({1, 2}, 2)}, {});
      if (out.ok()) {
        ok++;
      } else if (out.status().code() == StatusCode::kResourceExhausted &&
                 out.status().message().find("queue is full") != std::string::npos) {
        full.Add();
      } else {
        other++;
      }
    });
  }
  // Two queue, four are refused at once (they return while the run holds).
  EXPECT_TRUE(full.Await(4));
  EXPECT_TRUE(watch.queued.Await(2));
  EXPECT_EQ(ok, 0);
  fake->Release();
  for (auto& t : clients) t.join();
  blocker.join();
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(full.Get(), 4);
  EXPECT_EQ(other, 0);
  EXPECT_TRUE(model.Infer({Rows({1, 2}, 2)}, {}).ok());  // and it recovers
}

TEST(Batcher, DifferentInnerShapesAreNeverJoined) {
  auto fake = std::make_shared<FakeModel>();
  BatchOptions opts;
  opts.max_batch_size = 8;
  opts.max_delay_us = 50000;
  BatchingModel model(fake, opts);
  std::vector<std::thread> clients;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      int64_t cols = c % 2 ? 2 : 3;
      std::vector<float> mine(static_cast<size_t>(cols), float(c));
      auto out = model.Infer({Rows(mine, cols)}, {});
      if (!out.ok() || (*out)[0].shape != std::vector<int64_t>{1, cols} || Floats((*out)[0])[0] != 2 * c + 1)
        wrong++;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(wrong, 0);  // joining rows of 2 and 3 columns would garble them
}

TEST(Batcher, OutputWithTheWrongRowCountFailsEveryCallerWithTheReason) {
  auto fake = std::make_shared<FakeModel>();
  fake->break_rows = true;
  BatchOptions opts;
  opts.max_batch_size = 4;
  opts.max_delay_us = 50000;
  BatchingModel model(fake, opts);
  QueueWatch watch(model);
  // A run of one that holds (a batch of one is not split: it passes
  // through) while the four callers queue behind it, to be joined.
  fake->Hold();
  std::thread blocker([&] { (void)model.Infer({Rows({0, 0}, 2)}, {}); });
  ASSERT_TRUE(fake->calls.Await(1));
  std::vector<std::thread> clients;
  std::atomic<int> reasoned{0};
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&] {
      auto out = model.Infer({Rows({1, 2}, 2)}, {});
      if (!out.ok() && out.status().message().find("returned output 'y' with shape") != std::string::npos) {
        reasoned++;
      }
    });
  }
  EXPECT_TRUE(watch.queued.Await(4));
  fake->Release();
  for (auto& t : clients) t.join();
  blocker.join();
  EXPECT_EQ(fake->calls.Get(), 2);  // the four in one batch
  EXPECT_EQ(reasoned, 4);
}

// A request whose client left while it waited in the queue is answered
// as Cancelled and never runs; the others in the batch do.
TEST(Batcher, RequestsOfClientsThatLeftAreDroppedBeforeTheyRun) {
  auto fake = std::make_shared<FakeModel>();
  BatchOptions opts;
  opts.max_batch_size = 8;
  std::atomic<int> dropped{0};
  BatchingModel model(fake, opts, [&](const BatchReport& r) { dropped += r.dropped; });
  QueueWatch watch(model);
  fake->Hold();  // both queue behind a run that holds
  std::thread blocker([&] { EXPECT_TRUE(model.Infer({Rows({0, 0}, 2)}, {}).ok()); });
  ASSERT_TRUE(fake->calls.Await(1));
  std::atomic<bool> gone_client_connected{true};
  StatusOr<std::vector<HostTensor>> gone = Internal("not run"), kept = Internal("not run");
  std::thread a([&] {
    RunContext ctx;
    ctx.cancelled = [&] { return !gone_client_connected.load(); };
    gone = model.Infer({Rows({1, 2}, 2)}, ctx);
  });
  std::thread b([&] { kept = model.Infer({Rows({3, 4}, 2)}, {}); });
  ASSERT_TRUE(watch.queued.Await(2));
  gone_client_connected = false;  // the first client hangs up while queued
  fake->Release();
  a.join();
  b.join();
  blocker.join();
  EXPECT_EQ(gone.status().code(), StatusCode::kCancelled);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(fake->calls.Get(), 2);      // the one that held, and the kept one
  EXPECT_EQ(fake->max_rows.load(), 1);  // only the kept row ran
  EXPECT_EQ(dropped.load(), 1);
}

// A model of token ids and their mask, [rows, seq] INT64 each: per row,
// the sum of its ids under the mask, the sum of all the ids it got, and
// the length it got (FP32 [rows, 3]). Counts the runs that joined rows.
class TokensModel : public LoadedModel {
 public:
  TokensModel() {
    spec_.inputs.push_back({"ids", DType::kInt64, {-1, -1}});
    spec_.inputs.push_back({"mask", DType::kInt64, {-1, -1}});
    spec_.outputs.push_back({"y", DType::kFloat32, {-1, 3}});
  }
  const ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<HostTensor>> Infer(const std::vector<HostTensor>& in, const RunContext&) override {
    calls.Add();
    gate.wait_for(std::chrono::seconds(10));  // opened by the test (10 s: it has failed)
    const int64_t rows = in[0].shape[0], seq = in[0].shape[1];
    if (in[1].shape != in[0].shape) return InvalidArgument("ids and mask differ in shape");
    if (rows > 1) joined_runs++;
    const auto* ids = reinterpret_cast<const int64_t*>(in[0].data.data());
    const auto* mask = reinterpret_cast<const int64_t*>(in[1].data.data());
    HostTensor y{"y", DType::kFloat32, {rows, 3}, {}};
    std::vector<float> v;
    for (int64_t r = 0; r < rows; ++r) {
      float masked = 0, all = 0;
      for (int64_t t = 0; t < seq; ++t) {
        masked += static_cast<float>(ids[r * seq + t] * mask[r * seq + t]);
        all += static_cast<float>(ids[r * seq + t]);
      }
      v.insert(v.end(), {masked, all, static_cast<float>(seq)});
    }
    y.data.resize(v.size() * 4);
    std::memcpy(y.data.data(), v.data(), y.data.size());
    return std::vector<HostTensor>{y};
  }
  aotid::testing::Counter calls;
  std::atomic<int> joined_runs{0};
  std::shared_future<void> gate;

 private:
  ModelSpec spec_;
  std::string device_ = "cpu";
};

HostTensor Int64Rows(const char* name, const std::vector<std::vector<int64_t>>& rows) {
  HostTensor t{
      name, DType::kInt64, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, {}};
  for (const auto& r : rows) {
    const auto* b = reinterpret_cast<const std::byte*>(r.data());
    t.data.insert(t.data.end(), b, b + r.size() * 8);
  }
  return t;
}

// With `pad`, requests of different lengths join: each row is padded on
// the right to the batch's longest with the input's own pad value (ids 7,
// mask 0), so a masked sum is the row's own, and the model sees the pad.
// Without it, requests of different lengths never join (the test above).
TEST(Batcher, PaddedInputsJoinRequestsOfDifferentLengths) {
  auto fake = std::make_shared<TokensModel>();
  std::promise<void> open;
  fake->gate = open.get_future().share();
  BatchOptions opts;
  opts.max_batch_size = 16;
  opts.pad = {7, 0};
  BatchingModel model(fake, opts);
  QueueWatch watch(model);
  // A first request holds the one run, so the others queue behind it.
  std::thread blocker([&] {
    EXPECT_TRUE(model.Infer({Int64Rows("ids", {{1}}), Int64Rows("mask", {{1}})}, {}).ok());
  });
  ASSERT_TRUE(fake->calls.Await(1));
  constexpr int kClients = 6;
  aotid::testing::Counter answered;
  std::atomic<int> wrong{0};
  for (int c = 0; c < kClients; ++c) {
    // Client c sends 1 + c % 2 rows of length c + 1: ids 1..c+1, all unmasked.
    std::vector<int64_t> ids(static_cast<size_t>(c + 1)), mask(ids.size(), 1);
    for (size_t t = 0; t < ids.size(); ++t) ids[t] = static_cast<int64_t>(t + 1);
    std::vector<std::vector<int64_t>> id_rows(static_cast<size_t>(1 + c % 2), ids);
    std::vector<std::vector<int64_t>> mask_rows(id_rows.size(), mask);
    auto done = [&, c, rows = id_rows.size()](StatusOr<std::vector<HostTensor>> out) {
      const float own = static_cast<float>((c + 1) * (c + 2) / 2);
      const float longest = kClients;
      const float padded = own + 7 * (longest - static_cast<float>(c + 1));
      std::vector<float> want;
      for (size_t r = 0; r < rows; ++r) want.insert(want.end(), {own, padded, longest});
      if (!out.ok() || (*out)[0].shape != std::vector<int64_t>{int64_t(rows), 3} || Floats((*out)[0]) != want)
        wrong++;
      answered.Add();
    };
    EXPECT_OK(model.Submit({Int64Rows("ids", id_rows), Int64Rows("mask", mask_rows)}, {}, done));
  }
  ASSERT_TRUE(watch.queued.Await(kClients));
  open.set_value();
  blocker.join();
  ASSERT_TRUE(answered.Await(kClients));
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(fake->joined_runs.load(), 1);  // the six, 9 rows, in one run
  EXPECT_EQ(fake->calls.Get(), 2);
}

TEST(Batcher, OnlyDynamicFirstDimsCanBatch) {
  ModelSpec ok;
  ok.inputs.push_back({"x", DType::kFloat32, {-1, 8}});
  ok.outputs.push_back({"y", DType::kFloat32, {-1, 4}});
  EXPECT_OK(CanBatch(ok));
  ModelSpec fixed = ok;
  fixed.inputs.push_back({"ids", DType::kInt64, {2, 5}});
  Status s = CanBatch(fixed);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("input 'ids' has shape [2, 5]"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace aotid::serving
