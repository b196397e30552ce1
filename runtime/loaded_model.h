// A compiled model loaded for serving. The only interface the serving path
// uses; it hides torch entirely.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/build_cache.h"
#include "runtime/tensor.h"

namespace aotid::runtime {

// What travels with one run besides its tensors.
struct RunContext {
  // True once nobody waits for the result (the request's client hung up).
  // A model that queues runs (the batcher) asks it before a queued run
  // starts. Empty: always wanted. Must be cheap and safe from any thread.
  std::function<bool()> cancelled;
};

// The message of a run dropped because its client went away.
inline constexpr char kClientGone[] = "the client closed the connection before its request ran";

class LoadedModel {
 public:
  virtual ~LoadedModel() = default;

  virtual const ModelSpec& spec() const = 0;
  virtual const std::string& device() const = 0;

  // Runs the model on `inputs`, which must already match spec().inputs in
  // order, datatype and shape (CheckTensorAgainstSpec). Thread-safe: up to
  // the model's runner count run at once, further callers wait. A failure
  // inside the model comes back as a Status, never as an exception. A run
  // that has not started when ctx.cancelled() turns true is dropped with
  // StatusCode::kCancelled.
  virtual StatusOr<std::vector<HostTensor>> Infer(const std::vector<HostTensor>& inputs,
                                                  const RunContext& ctx) = 0;

  // OpenMP threads each run uses from now on; false where the model has no
  // such setting. Used at load, before the model serves.
  virtual bool SetThreads(int threads) {
    (void)threads;
    return false;
  }
};

struct LoadOptions {
  std::string device = "cpu";  // the AOTInductor runner: cpu, cuda, mps
  int num_runners = 1;         // model instances that run at once
  int threads = 0;             // OpenMP threads per run; 0 leaves torch's default
};

// Threads per run for a version: its own setting, else the cores shared
// among its runners (at least one each), so runners x threads fits the
// machine instead of every runner spinning a thread per core.
int ThreadsPerRunner(int threads_setting, int num_runners, int cores);

// Loads a cache entry's model.so in place (no copy, no extraction) through
// the runner for its device. Errors name the file and carry torch's message
// without its backtrace.
StatusOr<std::unique_ptr<LoadedModel>> LoadCompiledModel(const CacheEntry& entry, const LoadOptions& options);

}  // namespace aotid::runtime
