#include "control/model_commands.h"

#include "base/log.h"
#include "control/reconciler.h"
#include "storage/model_store.h"

namespace aotid::control {

struct ModelCommands::Pending {
  std::string name;
  bool enable = false;
  bool retried = false;  // a load of a loaded model: waits for every version to be ready
  int64_t deadline_ms = 0;
  std::function<void(Status)> done;
};

ModelCommands::ModelCommands(ModelCommandOptions options, Reconciler* reconciler,
                             const serving::ModelRegistry* registry, Loop* loop)
    : options_(std::move(options)), reconciler_(reconciler), registry_(registry), loop_(loop) {}

ModelCommands::~ModelCommands() { *alive_ = false; }

void ModelCommands::SetEnabled(const std::string& name, bool enable, std::function<void(Status)> done) {
  auto store = storage::ModelStore::Open(options_.store_dir, /*create=*/false);
  if (!store.ok()) return done(store.status());
  auto changed = (*store)->Set(name, std::nullopt, {{"enabled", enable ? "true" : "false"}});
  if (!changed.ok()) return done(changed.status());
  auto p = std::make_shared<Pending>();
  p->name = name;
  p->enable = enable;
  // Loading a model that is loaded already tries its failed versions again
  // (a runner that crashed too often, a load that failed), as unloading
  // and loading it would, without unloading what serves.
  p->retried = enable && changed->empty();
  p->deadline_ms = loop_->NowMs() + options_.wait_ms;
  p->done = std::move(done);
  if (p->retried) {
    if (Status s = reconciler_->RetryFailed(name); !s.ok()) LOG_ERROR << "reconcile: " << s.message();
  }
  // The store watch sees the commit within milliseconds and the reconciler
  // acts on it; the answer describes the result once the registry shows it.
  Check(p);
}

void ModelCommands::Check(const std::shared_ptr<Pending>& p) {
  auto snapshot = registry_->All();
  auto it = snapshot->find(p->name);
  bool shown = (it != snapshot->end()) == p->enable;
  // A load answers once each version serves, as a client that loads and
  // then infers expects, or has failed; a retry once each serves. A
  // version still queued, building or loading at the deadline is answered
  // as it stands (a build takes minutes).
  const serving::ServedModel* failed = nullptr;
  if (shown && p->enable) {
    for (const auto& [v, m] : it->second) {
      if (m->state == serving::ServeState::kFailed && !failed) failed = m.get();
      if (m->state != serving::ServeState::kReady && (p->retried || m->state != serving::ServeState::kFailed))
        shown = false;
    }
  }
  if (!shown && loop_->NowMs() < p->deadline_ms) {
    loop_->RunAfter(options_.poll_ms, [this, p, alive = alive_] {
      if (!*alive) return p->done(Unavailable("the daemon is stopping"));
      Check(p);
    });
    return;
  }
  if (failed) {
    return p->done(Unavailable("model '" + failed->name + "' version " + std::to_string(failed->version) +
                               " failed to load: " + failed->message));
  }
  p->done(Status::OK());
}

}  // namespace aotid::control
