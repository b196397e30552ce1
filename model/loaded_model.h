// A compiled model loaded for serving. The only interface the serving path
// uses; it hides torch entirely.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/tensor.h"

namespace aotid::model {

// What travels with one run besides its tensors.
struct RunContext {
  // True once nobody waits for the result (the request's client hung up).
  // A model that queues runs (the batcher) asks it before a queued run
  // starts. Empty: always wanted. Must be cheap and safe from any thread.
  std::function<bool()> cancelled;
};

// The message of a run dropped because its client went away.
inline constexpr char kClientGone[] = "the client closed the connection before its request ran";

// Said by Announce: a run for this model is on its way (its request is
// still being read). Dropping it takes the word back.
class Announcement {
 public:
  virtual ~Announcement() = default;
};

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

  // What a submitted run's caller gets: the outputs, or why there are none.
  using Done = std::function<void(StatusOr<std::vector<HostTensor>>)>;
  // Runs `inputs` as Infer does, without making the caller wait for it:
  // `done` runs once, on the calling thread before Submit returns or later
  // on a thread of the model's. An error returned here (a full queue, a
  // model being unloaded) means `done` never runs. `announced`, from this
  // model's Announce, says the request it promised has come. The default
  // runs Infer on the calling thread.
  virtual Status Submit(std::vector<HostTensor> inputs, RunContext ctx, Done done,
                        std::unique_ptr<Announcement> announced = nullptr) {
    (void)announced;
    done(Infer(inputs, ctx));
    return Status::OK();
  }
  // Says a request is being read that will be submitted (or dropped): a
  // model that joins requests into batches may wait for it. nullptr where
  // the model does not wait for anything.
  virtual std::unique_ptr<Announcement> Announce() { return nullptr; }
  // Changes when what the model's runs left in it (a language model's
  // key/value cache) is lost: its runner process was started anew. A
  // caller that counts on that state asks before it does.
  virtual int64_t state_epoch() const { return 0; }
  // Keeps the model ready to run, as a request in flight would, until the
  // handle is dropped: a language model's sequence holds it from its start
  // to its end, since its cache lives in the model between its calls.
  // nullptr where the model is always there (it is not unloaded when idle).
  virtual std::shared_ptr<void> KeepResident() { return nullptr; }
  // The most rows of dim 0 one run joins from several requests; 1 where
  // requests run alone.
  virtual int64_t max_batch_rows() const { return 1; }

  // OpenMP threads each run uses from now on; false where the model has no
  // such setting. Used at load, before the model serves.
  virtual bool SetThreads(int threads) {
    (void)threads;
    return false;
  }
};

}  // namespace aotid::model
