// Notices commits to the store from any process: a file watch on the store
// directory wakes it at once (SQLite writes the -wal file on every commit),
// a one-second tick is the backstop where file events are missing (some
// network and container file systems), and PRAGMA data_version on the
// watcher's own connection says whether anything was committed since the
// last look, so a wake-up without a commit costs one cheap query.
//
// A file event can arrive a moment before the commit it belongs to is
// visible: SQLite writes the -wal frames (which is what wakes us) and only
// then publishes the commit in the -shm index, through shared memory, which
// makes no file event. So a wake-up that finds nothing looks again after 1,
// 5 and 25 ms.
//
// Runs on the loop thread; time comes from the Loop, so tests drive it with
// a clock of their own.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>

#include "control/loop.h"
#include "storage/model_store.h"

namespace aotid::control {

class StoreWatch {
 public:
  // `on_change` runs on the loop thread after each commit seen (several
  // commits may be reported once). `store` and `loop` must outlive it.
  StoreWatch(storage::ModelStore* store, Loop* loop, std::function<void()> on_change)
      : store_(store), loop_(loop), on_change_(std::move(on_change)) {}
  ~StoreWatch() { Stop(); }
  StoreWatch(const StoreWatch&) = delete;
  StoreWatch& operator=(const StoreWatch&) = delete;

  // Starts the backstop tick, and the file watch on the store directory
  // when `file_events` is given (the daemon's libuv loop; tests call Wake()).
  void Start(uv_loop_t* file_events);
  // A file event: look now, and again shortly if nothing is visible yet.
  void Wake();
  // Stops looking; closes the file watch. Pending wake-ups do nothing.
  void Stop();
  // Looks now; true when a commit was seen.
  bool Check();

  static constexpr int64_t kTickMs = 1000;

 private:
  void Tick();
  void Settle(uint64_t generation, int step);

  storage::ModelStore* store_;
  Loop* loop_;
  std::function<void()> on_change_;
  uv_fs_event_t* dir_event_ = nullptr;  // owned; freed by its close callback
  int64_t seen_version_ = -1;
  uint64_t wake_generation_ = 0;  // a newer Wake() ends an older one's looks
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(false);
};

}  // namespace aotid::control
