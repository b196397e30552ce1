// Threads per run for a model whose `threads` setting is auto (0).
//
// More OpenMP threads help a model whose kernels have work to split, and
// hurt a small one: each parallel region wakes the team, and the team
// spins after it, competing with the HTTP workers for the same cores. So
// aotid times the model both ways on a sample input and keeps the faster,
// preferring one thread when the two are close.
//
// A timing is only as good as the quiet it was taken in: a compile, another
// runner timing itself, or a browser on the same cores makes every run
// slow and the choice random. So the timing watches the machine (a
// BusyMeter), repeats when other processes took a real share of the CPUs,
// and says whether its result is settled. A settled choice is recorded
// with the build (control/model_loader.h) and reused at later loads
// instead of timing again.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/loaded_model.h"

namespace aotid::runtime {

// How much of the machine other processes use.
class BusyMeter {
 public:
  virtual ~BusyMeter() = default;
  // Starts an interval.
  virtual void Start() = 0;
  // The share (0 to 1) of all the CPUs' time since Start that went to other
  // processes; nullopt when it cannot be told.
  virtual std::optional<double> OthersShare() = 0;
};

// Linux: reads /proc/stat (the machine's busy time) and this process's CPU
// time. The file is opened here, so a meter made before a sandbox closes
// /proc keeps working inside it. Null where there is no /proc/stat.
std::unique_ptr<BusyMeter> OpenSystemBusyMeter();

struct ThreadChoice {
  int threads = 1;
  // How it was chosen, for the log: "1 of 2: 7.1 vs 25.3 µs a run at [1, 23]".
  std::string note;
  // Timed on a quiet machine (or one whose load cannot be read): worth
  // recording. False when nothing was timed, or other processes kept the
  // CPUs busy through every attempt.
  bool settled = false;
};

// The zero inputs a model is timed on: dynamic dim 0 is `batch`, any other
// dynamic dim its recorded typical size, else the geometric middle of its
// range (sqrt(min * max), max capped at 4096), each within its range and
// one size per shared symbol. Integer inputs hold their smallest allowed
// value.
std::vector<model::HostTensor> SampleInputs(const model::ModelSpec& spec, int64_t batch);

struct ChooseOptions {
  std::function<double()> now;        // seconds; the steady clock when empty
  std::function<double()> cpu_now;    // the calling thread's CPU seconds; its real clock when empty
  BusyMeter* meter = nullptr;         // null: unguarded (each timing counts as settled)
  std::function<void(double)> pause;  // between attempts; sleeps when empty
  double busy_share = 0.25;           // others' share of the CPUs above which a timing is redone
  int attempts = 3;                   // timings at most, while the machine is busy
};

// Times `model` with 1 and with `most` threads, interleaved on
// SampleInputs(batch), for at least 0.1 s and at most about 0.3 s, sets the
// faster and returns it. A model whose run takes over 50 ms of CPU on one
// thread keeps `most` (its kernels have work to split); one that cannot
// take the sample (its run fails) keeps `most` too, unsettled. When the
// machine stays busy through every attempt, a model whose run takes under
// 1 ms of CPU gets one thread, unsettled.
ThreadChoice ChooseThreads(model::LoadedModel& model, int most, int64_t batch,
                           const ChooseOptions& options = {});

}  // namespace aotid::runtime
