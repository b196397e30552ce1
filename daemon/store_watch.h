// Notices commits to the store from any process, on a libuv loop: a file
// watch on the store directory wakes it at once (SQLite writes the -wal file
// on every commit), a one-second timer is the backstop where file events are
// missing (some network and container file systems), and PRAGMA data_version
// on the watcher's own connection says whether anything was committed since
// the last look, so a wake-up without a commit costs one cheap query.
#pragma once

#include <uv.h>

#include <functional>
#include <string>

#include "storage/model_store.h"

namespace aotid::daemon {

class StoreWatch {
 public:
  // `on_change` runs on the loop thread after each commit seen (several
  // commits may be reported once).
  StoreWatch(storage::ModelStore* store, std::function<void()> on_change)
      : store_(store), on_change_(std::move(on_change)) {}
  void Start(uv_loop_t* loop);
  // Closes the handles; the loop can then finish.
  void Stop();
  // Looks now; what the file event and the timer call.
  void Check();

 private:
  storage::ModelStore* store_;
  std::function<void()> on_change_;
  uv_fs_event_t dir_event_{};
  uv_timer_t tick_{};
  int64_t seen_version_ = -1;
  bool started_ = false;
};

}  // namespace aotid::daemon
