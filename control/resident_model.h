// A served version whose runner comes and goes (issue: residency).
//
// The registry serves a ResidentModel for every version that is ready: its
// build is cached and its spec known, whether or not a runner holds it in
// memory now. Requests go through it:
//  - resident: straight to the loaded model (its queue and runner);
//  - not resident: the request waits here, holding no HTTP worker
//    (Submit), or the calling thread (Infer, a generator's own thread);
//    the first one asks the control loop for a load (`want`), later ones
//    join that load. The load's outcome answers them all: they run on the
//    model, or every one gets the reason it could not load.
// The control loop (control/residency.h) decides when to load and unload;
// this class only counts what is in flight, so that a version with a
// request in flight is never unloaded (Unload refuses), and says when the
// last one ends (`idle`).
//
// A language model's sequence spans many calls; its generator holds the
// model (KeepResident) from the sequence's start to its end, so the key/value
// cache it builds is not unloaded between two of its tokens.
//
// Thread-safe. `want` and `idle` are called without the lock held, from
// whichever thread made the change; they must only post to the loop.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "model/loaded_model.h"

namespace aotid::control {

class ResidentModel final : public model::LoadedModel, public std::enable_shared_from_this<ResidentModel> {
 public:
  struct Hooks {
    std::function<void()> want;  // a request waits and no load is asked for yet
    std::function<void()> idle;  // the last request in flight ended
  };
  // `max_batch_rows`: what the loaded model joins (its queue's), known
  // from its first load; 1 before.
  ResidentModel(model::ModelSpec spec, std::string device, Hooks hooks, int64_t max_batch_rows = 1);
  ~ResidentModel() override;
  ResidentModel(const ResidentModel&) = delete;
  ResidentModel& operator=(const ResidentModel&) = delete;

  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>& inputs,
                                                 const model::RunContext& ctx) override;
  Status Submit(std::vector<model::HostTensor> inputs, model::RunContext ctx, Done done,
                std::unique_ptr<model::Announcement> announced = nullptr) override;
  std::unique_ptr<model::Announcement> Announce() override;
  // Changes at every load and unload too: a runner loaded anew holds no
  // sequence.
  int64_t state_epoch() const override;
  int64_t max_batch_rows() const override;
  // Keeps the model resident (counted as a request in flight) until the
  // handle is dropped; asks for a load when it is not resident.
  std::shared_ptr<void> KeepResident() override;

  // ---- the control loop's side ----

  // The load asked for is done: waiting requests go to `loaded`.
  void Loaded(std::shared_ptr<model::LoadedModel> loaded);
  // The load asked for failed: every waiting request gets `why`; the next
  // request asks again.
  void LoadFailed(const Status& why);
  // Drops the loaded model when nothing is in flight; false, changing
  // nothing, when something is. Requests after it wait for a new load.
  bool Unload();
  // While draining, new requests wait as if the model were not resident
  // (the control loop unloads it once those in flight end, to make room
  // for another), without asking for a load; ending the drain sends them
  // to the model again, or asks for a load when it is gone.
  void SetDraining(bool draining);
  // The version is no longer served: waiting requests and later ones get
  // `why`; nothing more is asked of the loop.
  void Retire(const Status& why);
  // The same version is served by `next` from now on (loaded again with
  // new settings): waiting requests, and any that come through this model
  // later (a request that found it just before the swap), go to `next`;
  // but while a sequence holds this model (KeepResident), its runner stays
  // and calls run there, where the sequence's cache is.
  void Replace(std::shared_ptr<ResidentModel> next);

  struct State {
    bool resident = false;
    bool load_asked = false;  // a load was asked and has not ended
    bool draining = false;
    int in_flight = 0;  // requests and holds
    int waiting = 0;    // of those, the ones waiting for a load
    int64_t loads = 0;  // Loaded() calls
  };
  State state() const EXCLUDES(mu_);
  // The loaded model, or nullptr.
  std::shared_ptr<model::LoadedModel> loaded() const EXCLUDES(mu_);

 private:
  // A submitted request waiting for a load. (Whole here: libc++'s deque
  // takes no incomplete type.)
  struct Waiter {
    std::vector<model::HostTensor> inputs;
    model::RunContext ctx;
    Done done;  // leaves when it runs
  };
  // The model that replaced this one, or nullptr.
  std::shared_ptr<ResidentModel> Next() const EXCLUDES(mu_);
  std::shared_ptr<ResidentModel> NextLocked() const REQUIRES(mu_);
  class Announced;
  // Counts one more in flight. Where the model is not there to run it
  // (not resident, or draining), asks for a load when none is asked and
  // returns nullptr; else returns the model.
  std::shared_ptr<model::LoadedModel> Enter(bool* ask) REQUIRES(mu_);
  // The Infer calls waiting are let onto the model, now there to run them:
  // they count as in flight from here (not waiting), so it is not unloaded
  // before they wake.
  void AdmitBlocked() REQUIRES(mu_);
  // One fewer in flight; calls `idle` at zero.
  void Leave() EXCLUDES(mu_);
  void Ask(bool ask);
  // Sends the waiting requests to `to`, or answers them with `why`.
  void Flush(std::deque<Waiter> waiters, const std::shared_ptr<model::LoadedModel>& to, const Status& why);
  Done Leaving(Done done);

  const model::ModelSpec spec_;
  const std::string device_;
  const Hooks hooks_;
  mutable Mutex mu_;
  CondVar changed_;
  std::shared_ptr<model::LoadedModel> loaded_ GUARDED_BY(mu_);
  std::deque<Waiter> waiters_ GUARDED_BY(mu_);
  int in_flight_ GUARDED_BY(mu_) = 0;
  int keeps_ GUARDED_BY(mu_) = 0;            // KeepResident handles held, counted in in_flight_ too
  int blocked_ GUARDED_BY(mu_) = 0;          // Infer calls waiting
  uint64_t admissions_ GUARDED_BY(mu_) = 0;  // AdmitBlocked() calls that let some in
  bool load_asked_ GUARDED_BY(mu_) = false;
  bool draining_ GUARDED_BY(mu_) = false;
  Status retired_ GUARDED_BY(mu_);
  std::shared_ptr<ResidentModel> next_ GUARDED_BY(mu_);  // Replace()
  int64_t loads_ GUARDED_BY(mu_) = 0;
  int64_t generation_ GUARDED_BY(mu_) = 0;  // loads and unloads: what state_epoch changes with
  // Each load's outcome, for the Infer calls waiting on it: the number of
  // outcomes so far, and the last failure.
  uint64_t outcomes_ GUARDED_BY(mu_) = 0;
  Status last_failure_ GUARDED_BY(mu_);
  int64_t max_batch_rows_ GUARDED_BY(mu_) = 1;
};

}  // namespace aotid::control
