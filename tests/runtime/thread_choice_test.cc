// Choosing threads per run at load, against a model whose run time depends
// on its thread setting the way a tiny model's or a heavy one's does. The
// runs advance a clock of the test's own, so the outcome does not depend
// on how busy the machine is.
#include "runtime/thread_choice.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace aotid::runtime {
namespace {

class TimedModel final : public LoadedModel {
 public:
  // Each run takes `us_at[threads]` microseconds of Clock(); fails when `fail`.
  TimedModel(std::vector<int> us_at, bool settable = true, bool fail = false)
      : us_at_(std::move(us_at)), settable_(settable), fail_(fail) {
    spec_.inputs.push_back({"x", DType::kFloat32, {-1, 4}});
    spec_.inputs.push_back({"ids", DType::kInt64, {3, -1}});
    spec_.outputs.push_back({"y", DType::kFloat32, {-1, 4}});
  }
  const ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  bool SetThreads(int threads) override {
    if (!settable_) return false;
    threads_ = threads;
    return true;
  }
  StatusOr<std::vector<HostTensor>> Infer(const std::vector<HostTensor>& inputs, const RunContext&) override {
    ++runs;
    shapes.clear();
    for (const auto& t : inputs) {
      shapes.push_back(t.shape);
      if (t.data.size() != static_cast<size_t>(t.num_elements()) * DTypeSize(t.dtype)) return Internal("bad data");
    }
    now_s += us_at_.at(threads_) * 1e-6;
    if (fail_) return InvalidArgument("input 'x' is not what the model wants");
    return std::vector<HostTensor>{};
  }

  std::function<double()> Clock() {
    return [this] { return now_s; };
  }

  int threads_ = 0;
  int runs = 0;
  double now_s = 1000;
  std::vector<std::vector<int64_t>> shapes;

 private:
  ModelSpec spec_;
  std::string device_ = "cpu";
  std::vector<int> us_at_;
  bool settable_, fail_;
};

TEST(ThreadChoice, ASmallModelGetsOneThreadAndAHeavyOneKeepsThemAll) {
  TimedModel small({0, 200, 3000});  // one thread fast, two slow
  ThreadChoice c = ChooseThreads(small, 2, 1, small.Clock());
  EXPECT_EQ(c.threads, 1) << c.note;
  EXPECT_EQ(small.threads_, 1);  // left set to the choice
  EXPECT_NE(c.note.find("1 of 2"), std::string::npos) << c.note;
  EXPECT_EQ(small.runs, 2 + 2 * 25);  // two warm-ups, then 25 of each (0.3 s of runs not reached)
  // Zero inputs: dynamic first dim = the batch asked for, other dynamic dims 2.
  ASSERT_EQ(small.shapes.size(), 2u);
  EXPECT_EQ(small.shapes[0], (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(small.shapes[1], (std::vector<int64_t>{3, 2}));

  TimedModel heavy({0, 3000, 0, 0, 300});  // four threads much faster
  c = ChooseThreads(heavy, 4, 16, heavy.Clock());
  EXPECT_EQ(c.threads, 4) << c.note;
  EXPECT_EQ(heavy.threads_, 4);
  EXPECT_EQ(heavy.shapes[0], (std::vector<int64_t>{16, 4}));

  TimedModel longer({0, 25000, 0, 0, 10000});  // 35 ms a pair of runs: 9 pairs pass 0.3 s
  c = ChooseThreads(longer, 4, 1, longer.Clock());
  EXPECT_EQ(c.threads, 4) << c.note;
  EXPECT_EQ(longer.runs, 2 + 2 * 9);
}

TEST(ThreadChoice, UntimedCasesKeepTheMost) {
  TimedModel fixed({0, 10, 10}, /*settable=*/false);
  ThreadChoice c = ChooseThreads(fixed, 2, 1, fixed.Clock());
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(fixed.runs, 0);

  TimedModel failing({0, 10, 10}, true, /*fail=*/true);
  c = ChooseThreads(failing, 2, 1, failing.Clock());
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(failing.threads_, 2);
  EXPECT_NE(c.note.find("sample run failed"), std::string::npos) << c.note;

  TimedModel slow({0, 10, 60000});  // 60 ms a run with two threads: not worth timing
  c = ChooseThreads(slow, 2, 1, slow.Clock());
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(slow.runs, 2);  // a slow first run is judged by a second: it may only have been cold
  EXPECT_NE(c.note.find("a run takes"), std::string::npos) << c.note;

  TimedModel one({0, 10});
  EXPECT_EQ(ChooseThreads(one, 1, 1, one.Clock()).threads, 1);
  EXPECT_EQ(one.runs, 0);
}

}  // namespace
}  // namespace aotid::runtime
