// Dynamic batching: requests to one model version wait in a bounded queue
// until enough rows have arrived (max_batch_size) or the oldest has waited
// max_batch_delay_us, are joined along dim 0, run once, and split back, so
// each caller gets exactly its own rows.
//
// Only models whose every input and output has a dynamic first dim can be
// batched (CanBatch). Requests whose other dims differ are never joined;
// a request with more rows than max_batch_size runs alone.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "runtime/loaded_model.h"

namespace aotid::serving {

struct BatchOptions {
  int max_batch_size = 8;  // rows per run
  int max_delay_us = 0;    // how long the oldest request may wait for more
  int max_queued = 256;    // requests waiting; beyond this Infer answers ResourceExhausted
  int workers = 1;         // batches run at once (the model's runner count)
};

// What one run looked like, for metrics.
struct BatchReport {
  int rows = 0;
  int requests = 0;
  int dropped = 0;                    // requests whose client had gone: not run
  std::vector<double> queue_seconds;  // per request: enqueue to run start
};

// Ok when `spec` can be batched; otherwise why not (names the tensor).
Status CanBatch(const runtime::ModelSpec& spec);

class BatchingModel final : public runtime::LoadedModel {
 public:
  BatchingModel(std::shared_ptr<runtime::LoadedModel> inner, BatchOptions options,
                std::function<void(const BatchReport&)> on_batch = nullptr);
  ~BatchingModel() override;

  const runtime::ModelSpec& spec() const override { return inner_->spec(); }
  const std::string& device() const override { return inner_->device(); }
  const BatchOptions& options() const { return options_; }
  // Blocks until this request's rows are computed. ResourceExhausted when
  // the queue is full (the caller should retry shortly); Cancelled when
  // ctx.cancelled() is true as a batch is formed (its client left while it
  // waited).
  StatusOr<std::vector<runtime::HostTensor>> Infer(const std::vector<runtime::HostTensor>& inputs,
                                                   const runtime::RunContext& ctx) override EXCLUDES(mu_);

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    const std::vector<runtime::HostTensor>* inputs;
    int64_t rows;
    Clock::time_point enqueued;
    const runtime::RunContext* ctx;  // the caller's, alive while it waits
    // Written by the worker that runs it: `result` before `done`, and
    // `done` under mu_, which the caller reads under mu_.
    bool done = false;
    StatusOr<std::vector<runtime::HostTensor>> result{Status(StatusCode::kInternal, "not run")};
  };
  void Work() EXCLUDES(mu_);
  // Runs a batch taken off the queue, without the lock.
  void Run(std::vector<Pending*>& batch) EXCLUDES(mu_);

  std::shared_ptr<runtime::LoadedModel> inner_;
  BatchOptions options_;
  std::function<void(const BatchReport&)> on_batch_;
  Mutex mu_;
  CondVar arrived_;   // workers wait here
  CondVar finished_;  // callers wait here
  std::deque<Pending*> queue_ GUARDED_BY(mu_);
  int64_t queued_rows_ GUARDED_BY(mu_) = 0;  // rows in queue_
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace aotid::serving
