#include "serving/batcher.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "base/crash_point.h"

namespace aotid::serving {

using model::HostTensor;
using model::ModelSpec;
using model::ShapeString;
using model::TensorSpec;

namespace {

// Same dims apart from the first (and the second, where it is padded),
// for every input.
bool Joinable(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b, bool padded) {
  if (a.size() != b.size()) return false;
  const size_t from = padded ? 2 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].shape.size() != b[i].shape.size() || a[i].shape.size() < from) return false;
    if (!std::equal(a[i].shape.begin() + from, a[i].shape.end(), b[i].shape.begin() + from)) return false;
  }
  return true;
}

// One input of every request in `batch`, joined along dim 0: the bytes
// follow one another, row-major. With `pad`, each row is first widened
// along dim 1 to the longest in the batch with that value (INT64).
template <typename Batch>
StatusOr<HostTensor> JoinInput(const Batch& batch, size_t i, int64_t rows, const int64_t* pad) {
  const HostTensor& first = (*batch[0]->inputs)[i];
  HostTensor joined;
  joined.name = first.name;
  joined.dtype = first.dtype;
  joined.shape = first.shape;
  joined.shape[0] = rows;
  if (pad == nullptr) {
    size_t bytes = 0;
    for (const auto* p : batch) bytes += (*p->inputs)[i].data.size();
    joined.data.resize(bytes);
    size_t at = 0;
    for (const auto* p : batch) {
      const auto& d = (*p->inputs)[i].data;
      if (!d.empty()) std::memcpy(joined.data.data() + at, d.data(), d.size());
      at += d.size();
    }
    return joined;
  }
  if (first.dtype != model::DType::kInt64) {
    return Internal("input '" + first.name + "' is padded, but is not INT64");
  }
  int64_t longest = 0;
  for (const auto* p : batch) longest = std::max(longest, (*p->inputs)[i].shape[1]);
  joined.shape[1] = longest;
  // One row's elements past dim 1 (1 for [rows, seq]).
  int64_t inner = 1;
  for (size_t d = 2; d < first.shape.size(); ++d) inner *= first.shape[d];
  std::vector<int64_t> out(static_cast<size_t>(rows * longest * inner), *pad);
  size_t at = 0;
  for (const auto* p : batch) {
    const HostTensor& t = (*p->inputs)[i];
    const auto row = static_cast<size_t>(t.shape[1] * inner);
    const auto* src = reinterpret_cast<const int64_t*>(t.data.data());
    for (int64_t r = 0; r < t.shape[0]; ++r) {
      std::copy_n(src + static_cast<size_t>(r) * row, row, out.begin() + static_cast<std::ptrdiff_t>(at));
      at += static_cast<size_t>(longest * inner);
    }
  }
  joined.data.resize(out.size() * sizeof(int64_t));
  std::memcpy(joined.data.data(), out.data(), joined.data.size());
  return joined;
}

}  // namespace

Status CanBatch(const ModelSpec& spec) {
  auto check = [](const TensorSpec& t, const char* kind) -> Status {
    if (t.shape.empty() || t.shape[0] != -1) {
      return FailedPrecondition(std::string(kind) + " '" + t.name + "' has shape " + ShapeString(t.shape) +
                                ": batching needs a dynamic first dim (export with a dynamic batch)");
    }
    return Status::OK();
  };
  if (spec.inputs.empty()) return FailedPrecondition("a model without inputs cannot be batched");
  for (const auto& t : spec.inputs) RETURN_IF_ERROR(check(t, "input"));
  for (const auto& t : spec.outputs) RETURN_IF_ERROR(check(t, "output"));
  return Status::OK();
}

BatchingModel::BatchingModel(std::shared_ptr<LoadedModel> inner, BatchOptions options,
                             std::function<void(const BatchReport&)> on_batch, const Clock* clock)
    : inner_(std::move(inner)), options_(options), on_batch_(std::move(on_batch)), clock_(clock) {
  options_.workers = std::max(1, options_.workers);
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { Work(); });
}

BatchingModel::~BatchingModel() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  arrived_.SignalAll();
  for (auto& t : workers_) t.join();
}

std::unique_ptr<model::Announcement> BatchingModel::Announce() {
  MutexLock lock(&mu_);
  ++incoming_;
  return std::make_unique<Incoming>(this);
}

void BatchingModel::Unannounce() {
  {
    MutexLock lock(&mu_);
    --incoming_;
  }
  arrived_.SignalAll();  // a worker waiting for it waits no more
}

Status BatchingModel::Enqueue(Pending* p) {
  if (stopping_) return Unavailable("the model is being unloaded");
  if (static_cast<int>(queue_.size()) >= options_.max_queued) {
    return ResourceExhausted("the model's queue is full (" + std::to_string(queue_.size()) +
                             " requests waiting); retry shortly");
  }
  queue_.push_back(p);
  queued_rows_ += p->rows;
  arrived_.SignalAll();
  if (TEST_on_queued_) TEST_on_queued_(static_cast<int>(queue_.size()));
  return Status::OK();
}

void BatchingModel::TEST_SetOnQueued(std::function<void(int)> hook) {
  MutexLock lock(&mu_);
  TEST_on_queued_ = std::move(hook);
}

// A request's rows: dim 0 of its first input; 1 in a queue that joins
// nothing (its inputs need no batch dim).
StatusOr<int64_t> BatchingModel::RowsOf(const std::vector<HostTensor>& inputs) const {
  if (options_.max_batch_size <= 1) return int64_t{1};
  if (inputs.empty() || inputs[0].shape.empty()) return InvalidArgument("batched model got no batch dim");
  return inputs[0].shape[0];
}

StatusOr<std::vector<HostTensor>> BatchingModel::Infer(const std::vector<HostTensor>& inputs,
                                                       const model::RunContext& ctx) {
  Pending p;
  ASSIGN_OR_RETURN(p.rows, RowsOf(inputs));
  p.inputs = &inputs;
  p.enqueued_us = clock_->NowUs();
  p.ctx = &ctx;
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(Enqueue(&p));
  while (!p.done) finished_.Wait(&mu_);
  return std::move(p.result);
}

Status BatchingModel::Submit(std::vector<HostTensor> inputs, model::RunContext ctx, Done done,
                             std::unique_ptr<model::Announcement> announced) {
  // Only this model's own word counts; another's is taken back as it goes.
  auto* incoming = dynamic_cast<Incoming*>(announced.get());
  auto p = std::make_unique<Pending>();
  ASSIGN_OR_RETURN(p->rows, RowsOf(inputs));
  p->own_inputs = std::move(inputs);
  p->own_ctx = std::move(ctx);
  p->inputs = &p->own_inputs;
  p->ctx = &p->own_ctx;
  p->enqueued_us = clock_->NowUs();
  p->answer = std::move(done);
  MutexLock lock(&mu_);
  if (incoming && incoming->m_ == this) {  // it has come: one fewer to wait for
    incoming->m_ = nullptr;
    --incoming_;
  }
  // Nothing to join it with, none on its way, and a run free: it runs here,
  // at once, without the two hand-offs a batch worker costs (what batching
  // would otherwise add to a lone client's request).
  if (!stopping_ && queue_.empty() && incoming_ == 0 && running_ < options_.workers) {
    std::vector<Pending*> batch{p.get()};
    RunCounted(batch);
    if (!queue_.empty()) arrived_.Signal();
    lock.Unlock();
    p->answer(std::move(p->result));
    return Status::OK();
  }
  RETURN_IF_ERROR(Enqueue(p.get()));
  p.release();  // the worker that finishes it deletes it
  return Status::OK();
}

void BatchingModel::Finish(Pending* p, std::vector<Pending*>& answers) {
  if (p->answer) {
    answers.push_back(p);
  } else {
    p->done = true;
  }
}

void BatchingModel::Answer(std::vector<Pending*>& answers) {
  for (Pending* p : answers) {
    std::unique_ptr<Pending> owned(p);
    owned->answer(std::move(owned->result));
  }
  answers.clear();
}

void BatchingModel::Work() {
  std::vector<Pending*> answers;  // finished submitted requests, answered outside the lock
  MutexLock lock(&mu_);
  for (;;) {
    // A run starts only when one of the model's `workers` runs is free (a
    // caller's own run, Submit's, counts): started beside a held one it
    // would wait inside the model for a runner, where its batch could no
    // longer grow, and two waiting there are one too many.
    while (!stopping_ && (queue_.empty() || running_ >= options_.workers)) arrived_.Wait(&mu_);
    if (queue_.empty()) return;  // stopping, nothing left
    // Requests wait in the queue (counted against its bound) until a batch
    // is full, or the oldest has waited long enough, or nothing more is on
    // its way. Long enough: max_delay_us, and never longer than a run.
    auto wait_us = std::min<double>(options_.max_delay_us, run_us_);
    int64_t deadline_us = queue_.front()->enqueued_us + static_cast<int64_t>(wait_us);
    while (!stopping_ && !queue_.empty() && queued_rows_ < options_.max_batch_size && incoming_ > 0 &&
           clock_->NowUs() < deadline_us) {
      clock_->WaitUntilUs(&arrived_, &mu_, deadline_us);
    }
    // Requests whose client went away while they waited are not run.
    int dropped = 0;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->ctx->cancelled && (*it)->ctx->cancelled()) {
        (*it)->result = Cancelled(model::kClientGone);
        Finish(*it, answers);
        queued_rows_ -= (*it)->rows;
        it = queue_.erase(it);
        ++dropped;
      } else {
        ++it;
      }
    }
    if (dropped) {
      finished_.SignalAll();
      if (on_batch_) {
        BatchReport r;
        r.dropped = dropped;
        on_batch_(r);
      }
    }
    if (!answers.empty()) {
      lock.Unlock();
      Answer(answers);
      lock.Lock();
    }
    if (queue_.empty()) continue;
    std::vector<Pending*> batch{queue_.front()};
    queue_.pop_front();
    int64_t rows = batch[0]->rows;
    queued_rows_ -= rows;
    for (auto it = queue_.begin(); it != queue_.end() && rows < options_.max_batch_size;) {
      if (rows + (*it)->rows <= options_.max_batch_size &&
          Joinable(*batch[0]->inputs, *(*it)->inputs, !options_.pad.empty())) {
        rows += (*it)->rows;
        queued_rows_ -= (*it)->rows;
        batch.push_back(*it);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    RunCounted(batch);
    for (Pending* p : batch) Finish(p, answers);
    finished_.SignalAll();
    if (!answers.empty()) {
      lock.Unlock();
      Answer(answers);
      lock.Lock();
    }
    if (!queue_.empty()) arrived_.Signal();  // another worker may take the rest
  }
}

void BatchingModel::RunCounted(std::vector<Pending*>& batch) {
  ++running_;
  mu_.Unlock();
  int64_t start_us = clock_->NowUs();
  Run(batch);
  auto took_us = static_cast<double>(clock_->NowUs() - start_us);
  mu_.Lock();
  --running_;
  run_us_ = run_us_ == 0 ? took_us : 0.8 * run_us_ + 0.2 * took_us;
}

void BatchingModel::Run(std::vector<Pending*>& batch) {
  BatchReport report;
  report.requests = static_cast<int>(batch.size());
  int64_t start_us = clock_->NowUs();
  for (const Pending* p : batch) {
    report.rows += static_cast<int>(p->rows);
    report.queue_seconds.push_back(static_cast<double>(start_us - p->enqueued_us) / 1e6);
  }
  if (on_batch_) on_batch_(report);
  PausePoint("batch_run");
  if (batch.size() == 1) {
    batch[0]->result = inner_->Infer(*batch[0]->inputs, *batch[0]->ctx);
    return;
  }
  const auto& first = *batch[0]->inputs;
  auto fail_all = [&](const Status& s) {
    for (Pending* p : batch) p->result = s;
  };
  if (!options_.pad.empty() && options_.pad.size() != first.size()) {
    return fail_all(Internal("the batcher pads " + std::to_string(options_.pad.size()) +
                             " inputs; the model has " + std::to_string(first.size())));
  }
  std::vector<HostTensor> joined;
  for (size_t i = 0; i < first.size(); ++i) {
    auto t = JoinInput(batch, i, report.rows, options_.pad.empty() ? nullptr : &options_.pad[i]);
    if (!t.ok()) return fail_all(t.status());
    joined.push_back(std::move(t).value());
  }
  auto out = inner_->Infer(joined, {});
  if (!out.ok()) return fail_all(out.status());
  for (const auto& t : *out) {
    if (t.shape.empty() || t.shape[0] != report.rows) {
      return fail_all(Internal("batched run of " + std::to_string(report.rows) + " rows returned output '" +
                               t.name + "' with shape " + ShapeString(t.shape)));
    }
  }
  // Split each output back by rows.
  int64_t row = 0;
  for (Pending* p : batch) {
    std::vector<HostTensor> mine(out->size());
    for (size_t i = 0; i < out->size(); ++i) {
      const HostTensor& t = (*out)[i];
      size_t row_bytes = t.data.size() / static_cast<size_t>(report.rows);
      mine[i].name = t.name;
      mine[i].dtype = t.dtype;
      mine[i].shape = t.shape;
      mine[i].shape[0] = p->rows;
      mine[i].data.assign(t.data.begin() + static_cast<std::ptrdiff_t>(row * row_bytes),
                          t.data.begin() + static_cast<std::ptrdiff_t>((row + p->rows) * row_bytes));
    }
    row += p->rows;
    p->result = std::move(mine);
  }
}

}  // namespace aotid::serving
