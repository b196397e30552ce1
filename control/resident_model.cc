#include "control/resident_model.h"

#include <chrono>

namespace aotid::control {

// An announcement of the loaded model's, counted in flight until the
// request it promised is submitted or dropped.
class ResidentModel::Announced final : public model::Announcement {
 public:
  Announced(std::shared_ptr<ResidentModel> owner, std::unique_ptr<model::Announcement> inner)
      : owner_(std::move(owner)), inner_(std::move(inner)) {}
  ~Announced() override { owner_->Leave(); }
  std::unique_ptr<model::Announcement> Take() { return std::move(inner_); }

 private:
  std::shared_ptr<ResidentModel> owner_;
  std::unique_ptr<model::Announcement> inner_;
};

ResidentModel::ResidentModel(model::ModelSpec spec, std::string device, Hooks hooks, int64_t max_batch_rows)
    : spec_(std::move(spec)), device_(std::move(device)), hooks_(std::move(hooks)) {
  MutexLock lock(&mu_);
  max_batch_rows_ = max_batch_rows;
}

ResidentModel::~ResidentModel() = default;

std::shared_ptr<model::LoadedModel> ResidentModel::Enter(bool* ask) {
  ++in_flight_;
  if (loaded_ && !draining_) return loaded_;
  if (!loaded_ && !load_asked_) {
    load_asked_ = true;
    *ask = true;
  }
  return nullptr;
}

void ResidentModel::AdmitBlocked() {
  if (blocked_ == 0) return;
  blocked_ = 0;
  ++admissions_;
}

void ResidentModel::Ask(bool ask) {
  if (ask && hooks_.want) hooks_.want();
}

void ResidentModel::Leave() {
  bool idle = false;
  {
    MutexLock lock(&mu_);
    --in_flight_;
    idle = in_flight_ - blocked_ - static_cast<int>(waiters_.size()) == 0;
  }
  if (idle && hooks_.idle) hooks_.idle();
}

model::LoadedModel::Done ResidentModel::Leaving(Done done) {
  return [self = shared_from_this(), done = std::move(done)](StatusOr<std::vector<model::HostTensor>> out) {
    done(std::move(out));
    self->Leave();
  };
}

StatusOr<std::vector<model::HostTensor>> ResidentModel::Infer(const std::vector<model::HostTensor>& inputs,
                                                              const model::RunContext& ctx) {
  if (auto next = Next()) return next->Infer(inputs, ctx);
  std::shared_ptr<model::LoadedModel> m;
  std::shared_ptr<ResidentModel> next;
  bool ask = false;
  uint64_t seen = 0, admitted = 0;
  {
    MutexLock lock(&mu_);
    // A retired version's sequences finish on its runner.
    if (!retired_.ok() && !(keeps_ > 0 && loaded_)) return retired_;
    m = Enter(&ask);
    if (!m) ++blocked_;
    seen = outcomes_;
    admitted = admissions_;
  }
  Ask(ask);
  if (!m) {
    Status failed;
    {
      MutexLock lock(&mu_);
      while (true) {
        // Let onto the model since it began to wait (AdmitBlocked): it runs
        // there, even where a drain began before it woke.
        const bool let_in = admissions_ != admitted;
        if (next_) {
          next = next_;
        } else if (!retired_.ok()) {
          failed = retired_;
        } else if (loaded_ && (!draining_ || let_in)) {
          m = loaded_;
        } else if (outcomes_ != seen && !loaded_) {
          failed = last_failure_;
        } else if (ctx.cancelled && ctx.cancelled()) {
          failed = Cancelled(model::kClientGone);
        }
        if (m || next || !failed.ok()) {
          if (!let_in) --blocked_;
          break;
        }
        changed_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
      }
    }
    if (next) {
      Leave();
      return next->Infer(inputs, ctx);
    }
    if (!failed.ok()) {
      Leave();
      return failed;
    }
  }
  auto out = m->Infer(inputs, ctx);
  Leave();
  return out;
}

Status ResidentModel::Submit(std::vector<model::HostTensor> inputs, model::RunContext ctx, Done done,
                             std::unique_ptr<model::Announcement> announced) {
  std::shared_ptr<model::LoadedModel> m;
  std::shared_ptr<ResidentModel> next;
  bool ask = false;
  {
    MutexLock lock(&mu_);
    next = NextLocked();
    if (!next) {
      if (!retired_.ok()) return retired_;
      m = Enter(&ask);
      // Queued while the lock that counted it is held: a load, a retirement
      // or a replacement in between would empty the queue without it.
      if (!m) waiters_.push_back({std::move(inputs), std::move(ctx), Leaving(std::move(done))});
    }
  }
  if (next) return next->Submit(std::move(inputs), std::move(ctx), std::move(done));
  if (!m) {
    announced.reset();
    Ask(ask);
    return Status::OK();
  }
  std::unique_ptr<model::Announcement> inner;
  if (auto* mine = dynamic_cast<Announced*>(announced.get())) inner = mine->Take();
  announced.reset();
  Status s = m->Submit(std::move(inputs), std::move(ctx), Leaving(std::move(done)), std::move(inner));
  if (!s.ok()) Leave();  // its done never runs
  return s;
}

std::unique_ptr<model::Announcement> ResidentModel::Announce() {
  if (Next()) return nullptr;  // the request goes on, unannounced
  std::shared_ptr<model::LoadedModel> m;
  {
    MutexLock lock(&mu_);
    if (!retired_.ok() || !loaded_ || draining_) return nullptr;
    m = loaded_;
    ++in_flight_;
  }
  return std::make_unique<Announced>(shared_from_this(), m->Announce());
}

std::shared_ptr<void> ResidentModel::KeepResident() {
  if (auto next = Next()) return next->KeepResident();
  bool ask = false;
  {
    MutexLock lock(&mu_);
    if (!retired_.ok()) return nullptr;
    ++in_flight_;
    ++keeps_;
    if (!loaded_ && !load_asked_) ask = load_asked_ = true;
  }
  Ask(ask);
  return std::shared_ptr<void>(static_cast<void*>(this), [self = shared_from_this()](void*) {
    std::shared_ptr<model::LoadedModel> dropped;
    {
      MutexLock lock(&self->mu_);
      // The last sequence on a replaced or retired model's runner ended: it goes.
      if (--self->keeps_ == 0 && (self->next_ || !self->retired_.ok())) dropped = std::move(self->loaded_);
    }
    dropped.reset();
    self->Leave();
  });
}

int64_t ResidentModel::state_epoch() const {
  if (auto next = Next()) return next->state_epoch();
  MutexLock lock(&mu_);
  return (generation_ << 32) + (loaded_ ? loaded_->state_epoch() : 0);
}

int64_t ResidentModel::max_batch_rows() const {
  MutexLock lock(&mu_);
  return max_batch_rows_;
}

void ResidentModel::Flush(std::deque<Waiter> waiters, const std::shared_ptr<model::LoadedModel>& to,
                          const Status& why) {
  for (auto& w : waiters) {
    if (!to) {
      w.done(why);
    } else if (w.ctx.cancelled && w.ctx.cancelled()) {
      w.done(Cancelled(model::kClientGone));
    } else {
      Done done = w.done;
      Status s = to->Submit(std::move(w.inputs), std::move(w.ctx), std::move(done));
      if (!s.ok()) w.done(s);
    }
  }
}

void ResidentModel::Loaded(std::shared_ptr<model::LoadedModel> loaded) {
  std::deque<Waiter> waiters;
  {
    MutexLock lock(&mu_);
    load_asked_ = false;
    ++outcomes_;
    if (!retired_.ok()) return;  // dropped here: nobody will use it
    loaded_ = loaded;
    ++loads_;
    ++generation_;
    max_batch_rows_ = loaded_->max_batch_rows();
    if (!draining_) {
      waiters.swap(waiters_);
      AdmitBlocked();
    }
    changed_.SignalAll();
  }
  Flush(std::move(waiters), loaded, Status::OK());
}

void ResidentModel::LoadFailed(const Status& why) {
  std::deque<Waiter> waiters;
  {
    MutexLock lock(&mu_);
    load_asked_ = false;
    ++outcomes_;
    last_failure_ = why;
    waiters.swap(waiters_);
    changed_.SignalAll();
  }
  Flush(std::move(waiters), nullptr, why);
}

bool ResidentModel::Unload() {
  std::shared_ptr<model::LoadedModel> dropped;
  bool ask = false;
  {
    MutexLock lock(&mu_);
    const int waiting = blocked_ + static_cast<int>(waiters_.size());
    if (in_flight_ - waiting > 0) return false;
    dropped = std::move(loaded_);
    loaded_ = nullptr;
    ++generation_;
    draining_ = false;
    if (waiting > 0 && !load_asked_ && retired_.ok()) ask = load_asked_ = true;
  }
  dropped.reset();  // the runner stops here, unless a request still holds it
  Ask(ask);
  return true;
}

void ResidentModel::SetDraining(bool draining) {
  std::deque<Waiter> waiters;
  std::shared_ptr<model::LoadedModel> to;
  bool ask = false;
  {
    MutexLock lock(&mu_);
    if (draining_ == draining) return;
    draining_ = draining;
    if (!draining_ && retired_.ok()) {
      if (loaded_) {
        to = loaded_;
        waiters.swap(waiters_);
        AdmitBlocked();
      } else if ((blocked_ > 0 || !waiters_.empty()) && !load_asked_) {
        ask = load_asked_ = true;
      }
    }
    changed_.SignalAll();
  }
  Flush(std::move(waiters), to, Status::OK());
  Ask(ask);
}

void ResidentModel::Retire(const Status& why) {
  std::deque<Waiter> waiters;
  std::shared_ptr<model::LoadedModel> dropped;
  Status retired;
  {
    MutexLock lock(&mu_);
    retired = retired_ = why.ok() ? Unavailable("the version is no longer served") : why;
    waiters.swap(waiters_);
    // Kept while sequences hold it: a stream in flight ends as it would
    // have, on the runner its cache is in (new requests are refused).
    if (keeps_ == 0) dropped = std::move(loaded_);
    changed_.SignalAll();
  }
  Flush(std::move(waiters), nullptr, retired);
}

void ResidentModel::Replace(std::shared_ptr<ResidentModel> next) {
  std::deque<Waiter> waiters;
  std::shared_ptr<model::LoadedModel> dropped;
  {
    MutexLock lock(&mu_);
    next_ = next;
    waiters.swap(waiters_);
    // Kept while sequences hold it (KeepResident): their caches are there.
    if (keeps_ == 0) dropped = std::move(loaded_);
    changed_.SignalAll();
  }
  for (auto& w : waiters) {
    Done done = w.done;
    Status s = next->Submit(std::move(w.inputs), std::move(w.ctx), std::move(done));
    if (!s.ok()) w.done(s);
  }
}

std::shared_ptr<ResidentModel> ResidentModel::Next() const {
  MutexLock lock(&mu_);
  return NextLocked();
}

std::shared_ptr<ResidentModel> ResidentModel::NextLocked() const {
  // Calls go on to the runner that sequences hold (their calls among them)
  // until the last of them ends.
  if (keeps_ > 0 && loaded_) return nullptr;
  return next_;
}

ResidentModel::State ResidentModel::state() const {
  MutexLock lock(&mu_);
  State s;
  s.resident = loaded_ != nullptr;
  s.load_asked = load_asked_;
  s.draining = draining_;
  s.in_flight = in_flight_;
  s.waiting = blocked_ + static_cast<int>(waiters_.size());
  s.loads = loads_;
  return s;
}

std::shared_ptr<model::LoadedModel> ResidentModel::loaded() const {
  MutexLock lock(&mu_);
  return loaded_;
}

}  // namespace aotid::control
