// A mutex, its scoped lock and a condition variable that clang's
// thread-safety analysis understands (base/thread_annotations.h). Each is a
// thin layer over the std type of the same job and costs nothing more.
//
//   Mutex mu_;
//   int pending_ GUARDED_BY(mu_) = 0;
//   CondVar changed_;
//
//   void Add() {
//     MutexLock lock(&mu_);
//     ++pending_;
//     changed_.SignalAll();
//   }
//   void AwaitNone() {
//     MutexLock lock(&mu_);
//     while (pending_ != 0) changed_.Wait(&mu_);
//   }
//
// Wait in a loop on the condition rather than with a predicate lambda: the
// analysis checks a lambda as a function of its own and does not know that
// the mutex is held inside it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace aotid {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction. Unlock() and Lock() let
// it go for a while in between (around a slow call made without the lock).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* mu_;
  bool held_ = true;
};

// A condition variable for Mutex. Waits may wake spuriously: wait in a loop.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Lets go of *mu until signalled, then holds it again.
  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's lock owns it
  }
  // The same, waking at `deadline` at the latest. False when it has passed.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    bool signalled = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return signalled;
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace aotid
