#include "runtime/thread_choice.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

namespace aotid::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Larger sizes than this are not "typical" of anything: a range open to a
// million tokens is timed at sqrt(min * 4096), not at sqrt(min * 1e6).
constexpr int64_t kTypicalCap = 4096;

int64_t Middle(const model::DimRange& r) {
  double lo = static_cast<double>(std::max<int64_t>(r.min, 1));
  double hi = static_cast<double>(std::max<int64_t>(std::min(r.max, kTypicalCap), 1));
  return static_cast<int64_t>(std::llround(std::sqrt(lo * std::max(lo, hi))));
}

template <typename T>
void Fill(std::vector<std::byte>& data, int64_t value) {
  T v = static_cast<T>(value);
  for (size_t off = 0; off + sizeof(T) <= data.size(); off += sizeof(T))
    std::memcpy(&data[off], &v, sizeof(T));
}

void FillWith(model::HostTensor& t, int64_t value) {
  switch (t.dtype) {
    case model::DType::kUInt8: return Fill<uint8_t>(t.data, value);
    case model::DType::kInt8: return Fill<int8_t>(t.data, value);
    case model::DType::kInt16: return Fill<int16_t>(t.data, value);
    case model::DType::kInt32: return Fill<int32_t>(t.data, value);
    case model::DType::kInt64: return Fill<int64_t>(t.data, value);
    case model::DType::kUInt16: return Fill<uint16_t>(t.data, value);
    case model::DType::kUInt32: return Fill<uint32_t>(t.data, value);
    case model::DType::kUInt64: return Fill<uint64_t>(t.data, value);
    default: return;
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string Us(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", seconds * 1e6);
  return buf;
}

std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Percent(double share) { return std::to_string(static_cast<int>(std::lround(share * 100))) + "%"; }

// /proc/stat's first line (all CPUs, in clock ticks) against this
// process's own CPU time.
class ProcStatMeter final : public BusyMeter {
 public:
  explicit ProcStatMeter(int fd) : fd_(fd) {}
  ~ProcStatMeter() override { ::close(fd_); }

  void Start() override { start_ = Read(); }

  std::optional<double> OthersShare() override {
    std::optional<Reading> end = Read();
    if (!start_ || !end || end->total <= start_->total) return std::nullopt;
    double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
    double all = (end->total - start_->total) / ticks;
    double busy = (end->busy - start_->busy) / ticks;
    double others = busy - (end->own_cpu_s - start_->own_cpu_s);
    return std::clamp(others / all, 0.0, 1.0);
  }

 private:
  struct Reading {
    double busy = 0, total = 0;  // clock ticks, all CPUs
    double own_cpu_s = 0;
  };

  std::optional<Reading> Read() const {
    char buf[512];
    ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    if (n <= 0) return std::nullopt;
    buf[n] = '\0';
    // cpu  user nice system idle iowait irq softirq steal ...
    unsigned long long v[8] = {};
    if (std::sscanf(buf, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                    &v[5], &v[6], &v[7]) < 4) {
      return std::nullopt;
    }
    Reading r;
    r.busy = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
    r.total = r.busy + static_cast<double>(v[3] + v[4]);
    timespec ts{};
    if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return std::nullopt;
    r.own_cpu_s = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
    return r;
  }

  int fd_;
  std::optional<Reading> start_;
};

// One timing, on a machine that may or may not be quiet.
// The calling thread's CPU time, in seconds.
double ThreadCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// A model this heavy (CPU time of a run on one thread) keeps the most
// threads: its kernels have work to split.
constexpr double kHeavyCpuSeconds = 0.05;
// One this light runs on one thread while the machine is too busy to time
// it: spinning up threads for microseconds of work costs more than it gives
// (13 times the requests per second for a small MLP, measured).
constexpr double kLightCpuSeconds = 0.001;

struct Timing {
  ThreadChoice choice;
  double cpu_one = -1;  // CPU seconds of a run on one thread; -1 unknown
};

Timing TimeOnce(model::LoadedModel& model, int most, const std::vector<model::HostTensor>& inputs,
                const std::function<double()>& clock, const std::function<double()>& cpu_clock,
                const std::string& at) {
  Timing t;
  ThreadChoice& choice = t.choice;
  choice = {most, "", false};
  auto timed = [&](int threads) -> double {
    model.SetThreads(threads);
    double t0 = clock();
    bool ok = model.Infer(inputs, {}).ok();
    double s = clock() - t0;
    return ok ? s : -1;
  };
  double first = timed(most);  // also the warm-up
  if (first < 0) {
    model.SetThreads(most);
    choice.note = "kept " + std::to_string(most) + ": the sample run at " + at + " failed";
    return t;
  }
  // The first run pays one-time costs (pages faulted in, threads started,
  // caches cold) that took 73 ms for a model whose runs take under 1 ms.
  // How heavy a run is, is then told by the CPU time of one-thread runs
  // (the least of two): other processes stretch the wall time of a run,
  // not the CPU time it needs.
  for (int i = 0; i < 2; ++i) {
    model.SetThreads(1);
    double c0 = cpu_clock();
    if (!model.Infer(inputs, {}).ok()) break;
    double c = cpu_clock() - c0;
    t.cpu_one = t.cpu_one < 0 ? c : std::min(t.cpu_one, c);
  }
  if (t.cpu_one > kHeavyCpuSeconds) {
    model.SetThreads(most);
    choice.note = "kept " + std::to_string(most) + ": a run at " + at + " takes " +
                  std::to_string(std::lround(t.cpu_one * 1e3)) + " ms of CPU on one thread";
    choice.settled = true;
    return t;
  }
  std::vector<double> one, many;
  const double start = clock();
  // At least 0.1 s, so that the machine's load over the timing is measured
  // in more than a few clock ticks; at most 0.3 s.
  for (;;) {
    double elapsed = clock() - start;
    if (one.size() >= 3 && ((one.size() >= 25 && elapsed >= 0.1) || elapsed >= 0.3)) break;
    double a = timed(1), b = timed(most);
    if (a < 0 || b < 0) break;
    one.push_back(a);
    many.push_back(b);
  }
  if (one.empty()) {
    model.SetThreads(most);
    choice.note = "kept " + std::to_string(most) + ": the sample run at " + at + " failed";
    return t;
  }
  double m1 = Median(one), mn = Median(many);
  choice.threads = m1 <= mn * 1.15 ? 1 : most;
  model.SetThreads(choice.threads);
  choice.note = std::to_string(choice.threads) + " of " + std::to_string(most) + ": " + Us(m1) + " vs " +
                Us(mn) + " µs a run at " + at;
  choice.settled = true;
  return t;
}

}  // namespace

std::unique_ptr<BusyMeter> OpenSystemBusyMeter() {
  int fd = ::open("/proc/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  return std::make_unique<ProcStatMeter>(fd);
}

std::vector<model::HostTensor> SampleInputs(const model::ModelSpec& spec, int64_t batch) {
  std::map<std::string, int64_t> sizes;  // by symbol: shared dims agree
  std::vector<model::HostTensor> inputs;
  for (const model::TensorSpec& s : spec.inputs) {
    model::HostTensor t;
    t.name = s.name;
    t.dtype = s.dtype;
    for (size_t d = 0; d < s.shape.size(); ++d) {
      if (s.shape[d] >= 0) {
        t.shape.push_back(s.shape[d]);
        continue;
      }
      const std::optional<model::DimRange>* r = d < s.dims.size() ? &s.dims[d] : nullptr;
      if (r && *r && !(*r)->symbol.empty()) {
        if (auto it = sizes.find((*r)->symbol); it != sizes.end()) {
          t.shape.push_back(it->second);
          continue;
        }
      }
      int64_t size = d == 0 ? batch : 2;
      if (r && *r) {
        if (d != 0) size = (*r)->typical > 0 ? (*r)->typical : Middle(**r);
        size = std::clamp(size, std::max<int64_t>((*r)->min, 1), std::max<int64_t>((*r)->max, 1));
        if (!(*r)->symbol.empty()) sizes[(*r)->symbol] = size;
      }
      t.shape.push_back(size);
    }
    t.data.assign(static_cast<size_t>(std::max<int64_t>(0, t.num_elements())) * model::DTypeSize(t.dtype),
                  std::byte{0});
    if (s.values && s.values->min > 0) FillWith(t, s.values->min);
    inputs.push_back(std::move(t));
  }
  return inputs;
}

ThreadChoice ChooseThreads(model::LoadedModel& model, int most, int64_t batch, const ChooseOptions& options) {
  ThreadChoice choice{std::max(1, most), "", false};
  if (most <= 1 || !model.SetThreads(most)) return choice;
  std::vector<model::HostTensor> inputs = SampleInputs(model.spec(), std::max<int64_t>(1, batch));
  std::string at = inputs.empty() ? "no inputs" : Shape(inputs[0].shape);
  auto clock = [&] {
    return options.now ? options.now()
                       : std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  };
  auto cpu_clock = [&] { return options.cpu_now ? options.cpu_now() : ThreadCpuSeconds(); };
  std::optional<double> share;
  double cpu_one = -1;
  for (int attempt = 1;; ++attempt) {
    if (options.meter) options.meter->Start();
    Timing t = TimeOnce(model, most, inputs, clock, cpu_clock, at);
    choice = t.choice;
    cpu_one = t.cpu_one;
    if (!choice.settled || !options.meter) return choice;
    share = options.meter->OthersShare();
    if (!share) {
      choice.note += " (the machine's load could not be read)";
      return choice;
    }
    if (*share <= options.busy_share) return choice;
    if (attempt >= options.attempts) break;
    // Runners loading together would time each other in lockstep: the
    // pause differs between processes.
    double pause = 0.2 * attempt + 0.01 * static_cast<double>(::getpid() % 16);
    if (options.pause) {
      options.pause(pause);
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    }
  }
  choice.settled = false;
  // Too busy to compare the two: a light model takes one thread, the
  // safer guess (threads for microseconds of work cost the most).
  if (cpu_one >= 0 && cpu_one < kLightCpuSeconds && choice.threads != 1) {
    choice.threads = 1;
    model.SetThreads(1);
    choice.note = "1 of " + std::to_string(most) + ": a run at " + at + " takes " + Us(cpu_one) +
                  " µs of CPU on one thread";
  }
  choice.note += " (the machine was busy: other processes used " + Percent(*share) +
                 " of its CPUs; timed again at the next load)";
  return choice;
}

}  // namespace aotid::runtime
