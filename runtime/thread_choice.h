// Threads per run for a model whose `threads` setting is auto (0).
//
// More OpenMP threads help a model whose kernels have work to split, and
// hurt a small one: each parallel region wakes the team, and the team
// spins after it, competing with the HTTP workers for the same cores. So at
// load, aotid times the model both ways on a sample input (zeros, the
// request's usual batch) and keeps the faster, preferring one thread when
// the two are close.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/loaded_model.h"

namespace aotid::runtime {

struct ThreadChoice {
  int threads = 1;
  std::string note;  // how it was chosen, for the log ("1 of 2: 7.1 vs 25.3 µs a run")
};

// Times `model` with 1 and with `most` threads (interleaved, at most about
// 300 ms in all) on zero inputs whose dynamic dims are `batch` (the first)
// and 2 (the others), sets the faster and returns it. A model whose run
// takes over 50 ms keeps `most` untimed; one that cannot take the sample
// (its run fails) keeps `most` too. `now` (seconds) is the clock the runs
// are timed with; the steady clock unless a test gives its own.
ThreadChoice ChooseThreads(LoadedModel& model, int most, int64_t batch,
                           const std::function<double()>& now = nullptr);

}  // namespace aotid::runtime
