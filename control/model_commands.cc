#include "control/model_commands.h"

#include <algorithm>

#include "base/log.h"
#include "control/reconciler.h"
#include "storage/model_store.h"

namespace aotid::control {

struct ModelCommands::Pending {
  std::string name;
  bool enable = false;
  bool answered = false;
  int64_t started_ms = 0;
  std::function<void(Status)> done;
};

ModelCommands::ModelCommands(ModelCommandOptions options, Reconciler* reconciler,
                             const serving::ModelRegistry* registry, Loop* loop)
    : options_(std::move(options)), reconciler_(reconciler), registry_(registry), loop_(loop) {}

ModelCommands::~ModelCommands() {
  *alive_ = false;
  Stop();
}

void ModelCommands::Stop() {
  stopped_ = true;
  auto waiting = std::move(pending_);
  pending_.clear();
  for (auto& p : waiting) Answer(p, Unavailable("the daemon is stopping"));
}

void ModelCommands::Answer(const std::shared_ptr<Pending>& p, Status s) {
  if (p->answered) return;
  p->answered = true;
  std::erase(pending_, p);
  p->done(std::move(s));
}

void ModelCommands::SetEnabled(const std::string& name, bool enable, std::function<void(Status)> done) {
  if (stopped_) return done(Unavailable("the daemon is stopping"));
  auto store = storage::ModelStore::Open(options_.store_dir, /*create=*/false);
  if (!store.ok()) return done(store.status());
  auto changed = (*store)->Set(name, std::nullopt, {{"enabled", enable ? "true" : "false"}});
  if (!changed.ok()) return done(changed.status());
  auto p = std::make_shared<Pending>();
  p->name = name;
  p->enable = enable;
  p->started_ms = loop_->NowMs();
  p->done = std::move(done);
  pending_.push_back(p);
  // Reconciled here rather than by the store watch, a moment later: the
  // first look at the registry then shows this command's effect, never
  // the state from before it (a model disabled by another writer whose
  // change the watch has not yet seen). A load also tries its failed
  // versions again (a runner that crashed too often, a load that failed),
  // as unloading and loading it would, without unloading what serves; so
  // a failure seen below is a fresh one.
  Status s = enable ? reconciler_->RetryFailed(name) : reconciler_->Reconcile();
  if (!s.ok()) LOG_ERROR << "reconcile: " << s.message();
  Check(p);
}

void ModelCommands::Check(const std::shared_ptr<Pending>& p) {
  auto snapshot = registry_->All();
  auto it = snapshot->find(p->name);
  bool shown = (it != snapshot->end()) == p->enable;
  // A load answers once each version serves, as a client that loads and
  // then infers expects, or has failed. One that must build is answered
  // at wait_ms as it stands (a build takes minutes); one left only
  // loading, from a cached build, is waited for longer.
  const serving::ServedModel* failed = nullptr;
  bool only_loads_left = false;
  if (shown && p->enable) {
    only_loads_left = true;
    for (const auto& [v, m] : it->second) {
      if (m->state == serving::ServeState::kFailed && !failed) failed = m.get();
      if (m->state != serving::ServeState::kReady && m->state != serving::ServeState::kFailed) shown = false;
      if (m->state == serving::ServeState::kQueued || m->state == serving::ServeState::kBuilding)
        only_loads_left = false;
    }
  }
  const int64_t wait = only_loads_left ? std::max(options_.wait_ms, options_.load_wait_ms) : options_.wait_ms;
  if (!shown && loop_->NowMs() < p->started_ms + wait) {
    loop_->RunAfter(options_.poll_ms, [this, p, alive = alive_] {
      if (*alive && !p->answered) Check(p);
    });
    return;
  }
  if (failed) {
    return Answer(p, Unavailable("model '" + failed->name + "' version " + std::to_string(failed->version) +
                                 " failed: " + failed->message));
  }
  Answer(p, Status::OK());
}

}  // namespace aotid::control
