// Dynamic batching: requests to one model version wait in a bounded queue
// until enough rows have arrived (max_batch_size) or the oldest has waited
// max_batch_delay_us, are joined along dim 0, run once, and split back, so
// each caller gets exactly its own rows.
//
// The batcher waits for more rows only while that can pay: while requests
// for the model are being read (announced, not yet queued), and never
// longer than a run of the model takes (a model faster than the delay
// loses more waiting than it gains). A lone client never waits.
//
// Only models whose every input and output has a dynamic first dim can be
// batched (CanBatch). Requests whose other dims differ are never joined,
// unless the model pads (BatchOptions::pad: token ids and their mask,
// whose lengths differ from text to text); a request with more rows than
// max_batch_size runs alone.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "model/loaded_model.h"

namespace aotid::serving {

struct BatchOptions {
  // Rows per run. 1: a queue only, for a model that is not batched: each
  // request runs alone, whatever its shape, and waits for its turn holding
  // no thread of its caller's.
  int max_batch_size = 8;
  int max_delay_us = 0;  // the most the oldest request may wait for more (see above)
  int max_queued = 256;  // requests waiting; beyond this Infer answers ResourceExhausted
  int workers = 1;       // batches run at once (the model's runner count)
  // Per input, the value that pads its dim 1 so that requests of different
  // lengths join: each row is padded on the right to the batch's longest
  // (an embedding model: its pad token id for the ids, 0 for the attention
  // mask, which keeps the padding out of the result). The inputs are
  // INT64, and no output has that dim. Empty: nothing is padded.
  std::vector<int64_t> pad;
};

// What one run looked like, for metrics.
struct BatchReport {
  int rows = 0;
  int requests = 0;
  int dropped = 0;                    // requests whose client had gone: not run
  std::vector<double> queue_seconds;  // per request: enqueue to run start
};

// Ok when `spec` can be batched; otherwise why not (names the tensor).
Status CanBatch(const model::ModelSpec& spec);

class BatchingModel final : public model::LoadedModel {
 public:
  // `clock` times the delay a batch waits, and runs (tests pass a fake).
  BatchingModel(std::shared_ptr<model::LoadedModel> inner, BatchOptions options,
                std::function<void(const BatchReport&)> on_batch = nullptr, const Clock* clock = RealClock());
  ~BatchingModel() override;

  const model::ModelSpec& spec() const override { return inner_->spec(); }
  const std::string& device() const override { return inner_->device(); }
  const BatchOptions& options() const { return options_; }
  // The model this queue is in front of.
  const std::shared_ptr<model::LoadedModel>& inner() const { return inner_; }
  int64_t max_batch_rows() const override { return options_.max_batch_size; }

  // The word that a request for this model is on its way (being read): the
  // batcher may wait for it. Held until Submit (or until the request fails).
  class Incoming final : public model::Announcement {
   public:
    explicit Incoming(BatchingModel* m) : m_(m) {}
    ~Incoming() override {
      if (m_) m_->Unannounce();
    }
    Incoming(const Incoming&) = delete;
    Incoming& operator=(const Incoming&) = delete;

   private:
    friend class BatchingModel;
    BatchingModel* m_;
  };
  std::unique_ptr<model::Announcement> Announce() override EXCLUDES(mu_);

  // Queues a request and returns: `done` runs later, once, on a batch
  // worker; or, when there is nothing to join it with and none on its way
  // and a run is free, runs it on the calling thread before returning. An
  // error here (the queue is full, the model is being unloaded) means
  // `done` never runs.
  Status Submit(std::vector<model::HostTensor> inputs, model::RunContext ctx, Done done,
                std::unique_ptr<model::Announcement> announced = nullptr) override EXCLUDES(mu_);

  // Blocks until this request's rows are computed. ResourceExhausted when
  // the queue is full (the caller should retry shortly); Cancelled when
  // ctx.cancelled() is true as a batch is formed (its client left while it
  // waited).
  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>& inputs,
                                                 const model::RunContext& ctx) override EXCLUDES(mu_);

  // Test hook, set before the first request: `hook` runs each time a
  // request joins the queue, with the number now queued, under the
  // queue's lock (so a test knows requests wait, rather than guessing).
  void TEST_SetOnQueued(std::function<void(int queued)> hook) EXCLUDES(mu_);

 private:
  struct Pending {
    const std::vector<model::HostTensor>* inputs = nullptr;
    int64_t rows = 0;
    int64_t enqueued_us = 0;                 // on clock_
    const model::RunContext* ctx = nullptr;  // the caller's, alive while it waits
    // Written by the worker that runs it: `result` before `done`, and
    // `done` under mu_, which the caller reads under mu_.
    bool done = false;
    StatusOr<std::vector<model::HostTensor>> result{Status(StatusCode::kInternal, "not run")};
    // A submitted request owns its inputs and context, and is answered
    // through `answer` (then deleted) instead of `done`.
    std::vector<model::HostTensor> own_inputs;
    model::RunContext own_ctx;
    Done answer;
  };
  StatusOr<int64_t> RowsOf(const std::vector<model::HostTensor>& inputs) const;
  // An announced request that will not come (~Incoming).
  void Unannounce() EXCLUDES(mu_);
  Status Enqueue(Pending* p) REQUIRES(mu_);
  // Marks `p` finished: wakes its caller, or collects its answer to call
  // outside the lock.
  void Finish(Pending* p, std::vector<Pending*>& answers) REQUIRES(mu_);
  static void Answer(std::vector<Pending*>& answers);
  void Work() EXCLUDES(mu_);
  // Runs a batch taken off the queue, without the lock.
  void Run(std::vector<Pending*>& batch) EXCLUDES(mu_);
  // The same from under the lock: drops it for the run, counts the run in
  // running_, and folds its time into run_us_.
  void RunCounted(std::vector<Pending*>& batch) REQUIRES(mu_);

  std::shared_ptr<model::LoadedModel> inner_;
  BatchOptions options_;
  std::function<void(const BatchReport&)> on_batch_;
  const Clock* clock_;
  Mutex mu_;
  CondVar arrived_;   // workers wait here
  CondVar finished_;  // callers wait here
  std::deque<Pending*> queue_ GUARDED_BY(mu_);
  int64_t queued_rows_ GUARDED_BY(mu_) = 0;  // rows in queue_
  int incoming_ GUARDED_BY(mu_) = 0;         // announced, not yet queued
  int running_ GUARDED_BY(mu_) = 0;          // batches being run (by workers, or inline by Submit)
  double run_us_ GUARDED_BY(mu_) = 0;        // how long a run takes: a moving average
  bool stopping_ GUARDED_BY(mu_) = false;
  std::function<void(int)> TEST_on_queued_ GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace aotid::serving
