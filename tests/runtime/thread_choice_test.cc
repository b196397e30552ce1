// Choosing threads per run at load, against a model whose run time depends
// on its thread setting the way a tiny model's or a heavy one's does. The
// runs advance a clock of the test's own, and the machine's load is a
// meter of the test's own, so the outcome does not depend on how busy the
// machine really is.
#include "runtime/thread_choice.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

namespace aotid::runtime {
namespace {

class TimedModel final : public model::LoadedModel {
 public:
  // Each run takes `us_at[threads]` microseconds of Clock(); fails when `fail`.
  TimedModel(std::vector<int> us_at, bool settable = true, bool fail = false)
      : us_at_(std::move(us_at)), settable_(settable), fail_(fail) {
    spec_.inputs.push_back({"x", model::DType::kFloat32, {-1, 4}});
    spec_.inputs.push_back({"ids", model::DType::kInt64, {3, -1}});
    spec_.outputs.push_back({"y", model::DType::kFloat32, {-1, 4}});
  }
  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  bool SetThreads(int threads) override {
    if (!settable_) return false;
    threads_ = threads;
    return true;
  }
  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>& inputs,
                                                 const model::RunContext&) override {
    ++runs;
    shapes.clear();
    for (const auto& t : inputs) {
      shapes.push_back(t.shape);
      if (t.data.size() != static_cast<size_t>(t.num_elements()) * model::DTypeSize(t.dtype))
        return Internal("bad data");
    }
    now_s += us_at_.at(threads_) * 1e-6;
    if (fail_) return InvalidArgument("input 'x' is not what the model wants");
    return std::vector<model::HostTensor>{};
  }

  std::function<double()> Clock() {
    return [this] { return now_s; };
  }
  ChooseOptions Options() {
    ChooseOptions o;
    o.now = Clock();
    o.cpu_now = Clock();  // an unloaded machine: a run's CPU time is its wall time
    return o;
  }

  int threads_ = 0;
  int runs = 0;
  double now_s = 1000;
  std::vector<std::vector<int64_t>> shapes;

 private:
  model::ModelSpec spec_;
  std::string device_ = "cpu";
  std::vector<int> us_at_;
  bool settable_, fail_;
};

TEST(ThreadChoice, ASmallModelGetsOneThreadAndAHeavyOneKeepsThemAll) {
  TimedModel small({0, 200, 3000});  // one thread fast, two slow
  ThreadChoice c = ChooseThreads(small, 2, 1, small.Options());
  EXPECT_EQ(c.threads, 1) << c.note;
  EXPECT_EQ(small.threads_, 1);  // left set to the choice
  EXPECT_NE(c.note.find("1 of 2"), std::string::npos) << c.note;
  // A warm-up, two one-thread runs for the CPU a run takes, then pairs for
  // at least 0.1 s: 32 pairs of 3.2 ms.
  EXPECT_EQ(small.runs, 3 + 2 * 32);
  EXPECT_TRUE(c.settled);  // unguarded: no meter
  // Zero inputs: dynamic first dim = the batch asked for, another dynamic
  // dim with no range recorded 2.
  ASSERT_EQ(small.shapes.size(), 2u);
  EXPECT_EQ(small.shapes[0], (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(small.shapes[1], (std::vector<int64_t>{3, 2}));

  TimedModel heavy({0, 3000, 0, 0, 300});  // four threads much faster
  c = ChooseThreads(heavy, 4, 16, heavy.Options());
  EXPECT_EQ(c.threads, 4) << c.note;
  EXPECT_EQ(heavy.threads_, 4);
  EXPECT_EQ(heavy.shapes[0], (std::vector<int64_t>{16, 4}));

  TimedModel longer({0, 25000, 0, 0, 10000});  // 35 ms a pair of runs: 9 pairs pass 0.3 s
  c = ChooseThreads(longer, 4, 1, longer.Options());
  EXPECT_EQ(c.threads, 4) << c.note;
  EXPECT_EQ(longer.runs, 3 + 2 * 9);
}

TEST(ThreadChoice, UntimedCasesKeepTheMost) {
  TimedModel fixed({0, 10, 10}, /*settable=*/false);
  ThreadChoice c = ChooseThreads(fixed, 2, 1, fixed.Options());
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(fixed.runs, 0);

  TimedModel failing({0, 10, 10}, true, /*fail=*/true);
  c = ChooseThreads(failing, 2, 1, failing.Options());
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(failing.threads_, 2);
  EXPECT_NE(c.note.find("sample run at [1, 4] failed"), std::string::npos) << c.note;
  EXPECT_FALSE(c.settled);  // nothing learned: not worth recording

  TimedModel slow({0, 60000, 30000});  // 60 ms of CPU a run on one thread: work to split
  c = ChooseThreads(slow, 2, 1, slow.Options());
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(slow.runs, 3);  // the warm-up and two one-thread runs
  EXPECT_NE(c.note.find("a run at [1, 4] takes 60 ms of CPU on one thread"), std::string::npos) << c.note;
  EXPECT_TRUE(c.settled);

  // A busy machine stretches wall time, not CPU time: a light model whose
  // runs take long on the wall clock is still timed.
  TimedModel stretched({0, 200, 3000});
  ChooseOptions o = stretched.Options();
  o.now = [&stretched] { return stretched.now_s * 500; };  // every run looks 500 times slower
  c = ChooseThreads(stretched, 2, 1, o);
  EXPECT_EQ(c.threads, 1) << c.note;
  EXPECT_EQ(c.note.find("kept"), std::string::npos) << c.note;

  TimedModel one({0, 10});
  EXPECT_EQ(ChooseThreads(one, 1, 1, one.Options()).threads, 1);
  EXPECT_EQ(one.runs, 0);
}

// A meter that reports the shares it is given, one per timing.
class ScriptedMeter final : public BusyMeter {
 public:
  explicit ScriptedMeter(std::vector<std::optional<double>> shares) : shares_(std::move(shares)) {}
  void Start() override { ++starts; }
  std::optional<double> OthersShare() override { return shares_.at(reads++); }
  int starts = 0;
  size_t reads = 0;

 private:
  std::vector<std::optional<double>> shares_;
};

TEST(ThreadChoice, ATimingTakenWhileOthersKeepTheCpusBusyIsRedoneAndNotSettled) {
  TimedModel small({0, 200, 3000});
  ScriptedMeter meter({0.8, 0.6, 0.9});
  std::vector<double> pauses;
  ChooseOptions o = small.Options();
  o.meter = &meter;
  o.pause = [&](double s) { pauses.push_back(s); };
  ThreadChoice c = ChooseThreads(small, 2, 1, o);
  EXPECT_EQ(meter.starts, 3);  // three attempts, each measured
  EXPECT_EQ(pauses.size(), 2u);
  EXPECT_FALSE(c.settled);
  EXPECT_EQ(c.threads, 1);  // still the best guess it has, for now
  EXPECT_NE(c.note.find("other processes used 90% of its CPUs"), std::string::npos) << c.note;

  // Busy throughout, and the timing (made under load) says two threads: a
  // light model takes one anyway, the lower-risk guess; a heavier one keeps
  // what its timing said.
  TimedModel light({0, 300, 100});  // 0.3 ms of CPU a run
  ScriptedMeter busy({0.9, 0.9, 0.9});
  o = light.Options();
  o.meter = &busy;
  o.pause = [](double) {};
  c = ChooseThreads(light, 2, 1, o);
  EXPECT_EQ(c.threads, 1) << c.note;
  EXPECT_EQ(light.threads_, 1);
  EXPECT_NE(c.note.find("takes 300.0 µs of CPU on one thread"), std::string::npos) << c.note;
  EXPECT_FALSE(c.settled);
  TimedModel heavier({0, 5000, 1000});  // 5 ms of CPU a run
  ScriptedMeter busy_too({0.9, 0.9, 0.9});
  o = heavier.Options();
  o.meter = &busy_too;
  o.pause = [](double) {};
  c = ChooseThreads(heavier, 2, 1, o);
  EXPECT_EQ(c.threads, 2) << c.note;
  EXPECT_FALSE(c.settled);

  // Busy once, then quiet: the second timing stands.
  TimedModel again({0, 200, 3000});
  ScriptedMeter calmer({0.8, 0.1});
  o = again.Options();
  o.meter = &calmer;
  o.pause = [](double) {};
  c = ChooseThreads(again, 2, 1, o);
  EXPECT_EQ(calmer.starts, 2);
  EXPECT_TRUE(c.settled) << c.note;
  EXPECT_EQ(c.note.find("busy"), std::string::npos) << c.note;

  // A load that cannot be read: settled, and said.
  TimedModel blind({0, 200, 3000});
  ScriptedMeter unknown({std::nullopt});
  o = blind.Options();
  o.meter = &unknown;
  c = ChooseThreads(blind, 2, 1, o);
  EXPECT_TRUE(c.settled);
  EXPECT_NE(c.note.find("could not be read"), std::string::npos) << c.note;
}

#ifdef __linux__
TEST(ThreadChoice, TheMeterOfThisMachineReadsAShare) {
  std::unique_ptr<BusyMeter> meter = OpenSystemBusyMeter();
  ASSERT_NE(meter, nullptr) << "no /proc/stat";
  meter->Start();
  // Spin this process for 50 ms: its own time is not counted as others'.
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  volatile uint64_t x = 0;
  while (std::chrono::steady_clock::now() < end) x = x + 1;
  std::optional<double> share = meter->OthersShare();
  ASSERT_TRUE(share.has_value());
  EXPECT_GE(*share, 0.0);
  EXPECT_LE(*share, 1.0);
}
#endif  // __linux__

TEST(ThreadChoice, SampleInputsTakeTypicalSizesAndKeepSharedDimsEqual) {
  model::ModelSpec spec;
  spec.inputs.push_back({"ids", model::DType::kInt64, {-1, -1}});
  spec.inputs.back().dims = {model::DimRange{"batch", 1, 64}, model::DimRange{"seq", 1, 512, 8}};
  spec.inputs.back().values = model::ValueRange{3, 49};
  spec.inputs.push_back({"mask", model::DType::kFloat32, {-1, -1}});
  spec.inputs.back().dims = {model::DimRange{"batch", 1, 64}, model::DimRange{"seq", 1, 512, 8}};
  spec.inputs.push_back({"extra", model::DType::kFloat32, {-1, 2, -1}});
  // No typical recorded: the geometric middle, 16 of 1..256; the max is
  // capped at 4096 (4..1e9 gives 128); below its minimum, a batch is raised.
  spec.inputs.back().dims = {model::DimRange{"b2", 4, 1'000'000'000}, std::nullopt,
                             model::DimRange{"w", 1, 256}};
  std::vector<model::HostTensor> in = SampleInputs(spec, 2);
  ASSERT_EQ(in.size(), 3u);
  EXPECT_EQ(in[0].shape, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(in[1].shape, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(in[2].shape, (std::vector<int64_t>{4, 2, 16}));
  int64_t first = 0;
  std::memcpy(&first, in[0].data.data(), sizeof first);
  EXPECT_EQ(first, 3);  // token ids from their smallest allowed value
  EXPECT_EQ(in[1].data.size(), 2u * 8 * sizeof(float));

  // The middle of a range with no typical, and a shared symbol met first
  // at dim 1 keeps its size where it is dim 0 elsewhere.
  model::ModelSpec wide;
  wide.inputs.push_back({"a", model::DType::kFloat32, {3, -1}});
  wide.inputs.back().dims = {std::nullopt, model::DimRange{"n", 4, 1'000'000}};
  wide.inputs.push_back({"b", model::DType::kFloat32, {-1}});
  wide.inputs.back().dims = {model::DimRange{"n", 4, 1'000'000}};
  in = SampleInputs(wide, 1);
  EXPECT_EQ(in[0].shape, (std::vector<int64_t>{3, 128}));
  EXPECT_EQ(in[1].shape, (std::vector<int64_t>{128}));
}

}  // namespace
}  // namespace aotid::runtime
