// Notices commits to the store from any process, on a libuv loop: a file
// watch on the store directory wakes it at once (SQLite writes the -wal file
// on every commit), a one-second timer is the backstop where file events are
// missing (some network and container file systems), and PRAGMA data_version
// on the watcher's own connection says whether anything was committed since
// the last look, so a wake-up without a commit costs one cheap query.
//
// A file event can arrive a moment before the commit it belongs to is
// visible: SQLite writes the -wal frames (which is what wakes us) and only
// then publishes the commit in the -shm index, through shared memory, which
// makes no file event. So a wake-up that finds nothing looks again after 1,
// 5 and 25 ms.
#pragma once

#include <uv.h>

#include <functional>
#include <string>

#include "storage/model_store.h"

namespace aotid::control {

class StoreWatch {
 public:
  // `on_change` runs on the loop thread after each commit seen (several
  // commits may be reported once).
  StoreWatch(storage::ModelStore* store, std::function<void()> on_change)
      : store_(store), on_change_(std::move(on_change)) {}
  void Start(uv_loop_t* loop);
  // A file event: look now, and again shortly if nothing is visible yet.
  void Wake();
  // Closes the handles; the loop can then finish.
  void Stop();
  // Looks now; true when a commit was seen.
  bool Check();

 private:
  static void OnSettle(uv_timer_t* t);

  storage::ModelStore* store_;
  std::function<void()> on_change_;
  uv_fs_event_t dir_event_{};
  uv_timer_t tick_{};
  uv_timer_t settle_{};
  int settle_step_ = 0;
  int64_t seen_version_ = -1;
  bool started_ = false;
};

}  // namespace aotid::control
