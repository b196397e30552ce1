// Load and unload as the repository routes ask for them, carried out by the
// control plane on its loop (the way a lifecycle owner takes asynchronous
// loads), never on an HTTP worker.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "control/loop.h"
#include "serving/model_registry.h"

namespace aotid::control {

class Reconciler;

struct ModelCommandOptions {
  std::string store_dir;  // written through a connection of its own, as any other writer's
  // How long a command waits for the served models to show its result
  // before it answers with the state they are in; a load whose versions
  // are loading (their builds cached) waits up to load_wait_ms, which
  // ends before the 60 s many clients and proxies wait for an answer.
  int64_t wait_ms = 5000;
  int64_t load_wait_ms = 50000;
  int64_t poll_ms = 20;  // how often it looks meanwhile
};

class ModelCommands {
 public:
  // All three must outlive it. Runs on `loop`'s thread.
  ModelCommands(ModelCommandOptions options, Reconciler* reconciler, const serving::ModelRegistry* registry,
                Loop* loop);
  ~ModelCommands();
  ModelCommands(const ModelCommands&) = delete;
  ModelCommands& operator=(const ModelCommands&) = delete;

  // On the loop thread: enables (load) or disables (unload) every version
  // of `name` in the store and reconciles at once; a load also tries its
  // failed versions again. `done` runs once, on the loop thread: with the
  // store's error (NotFound for a model it does not have); for a load,
  // once each version is ready (OK) or has failed (Unavailable, naming the
  // version and why); for an unload once the model is gone; or after
  // wait_ms (load_wait_ms while only loads are left), with OK for whatever
  // state it is in then (a failure still an error). Commands pending at
  // Stop() are answered Unavailable then, as are those given after it.
  void SetEnabled(const std::string& name, bool enable, std::function<void(Status)> done);
  // On the loop thread, before the loop stops running timers: answers
  // every command still waiting, so that no caller waits for an answer
  // that would never come (gRPC's shutdown waits for every call's end).
  void Stop();

 private:
  struct Pending;
  void Check(const std::shared_ptr<Pending>& p);
  void Answer(const std::shared_ptr<Pending>& p, Status s);

  ModelCommandOptions options_;
  Reconciler* reconciler_;
  const serving::ModelRegistry* registry_;
  Loop* loop_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  bool stopped_ = false;
  std::vector<std::shared_ptr<Pending>> pending_;  // waiting for the registry to show them
};

}  // namespace aotid::control
