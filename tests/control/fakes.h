// Fakes for what the control plane drives: time (FakeLoop), builds
// (FakeBuilds) and loads (FakeLoader). Each does nothing until the test says,
// so a test walks the reconciler through a case step by step, in
// milliseconds. The store and the build cache stay real.
#pragma once

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/fs.h"
#include "compile/builder.h"
#include "control/loop.h"
#include "control/model_loader.h"

namespace aotid::control::testing {

// A clock that moves only when told; RunAfter callbacks run in Advance().
class FakeLoop final : public Loop {
 public:
  int64_t NowMs() const override { return now_ms_; }
  void RunAfter(int64_t delay_ms, std::function<void()> fn) override {
    timers_.push_back({now_ms_ + std::max<int64_t>(0, delay_ms), seq_++, std::move(fn)});
  }
  void Post(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(posted_mu_);
    posted_.push_back(std::move(fn));
  }
  std::function<void(std::function<void()>)> Poster() override {
    return [this](std::function<void()> fn) { Post(std::move(fn)); };
  }
  // Runs what was posted (and what that posts), as the loop would next.
  void RunPosted() {
    for (;;) {
      std::function<void()> fn;
      {
        std::lock_guard<std::mutex> lock(posted_mu_);
        if (posted_.empty()) return;
        fn = std::move(posted_.front());
        posted_.pop_front();
      }
      fn();
    }
  }
  // Moves the clock by `ms`, running what was posted and every callback
  // that falls due, in order of due time (callbacks they add run too when
  // due).
  void Advance(int64_t ms) {
    RunPosted();
    int64_t until = now_ms_ + ms;
    for (;;) {
      RunPosted();
      auto next = std::min_element(timers_.begin(), timers_.end(), [](const Timer& a, const Timer& b) {
        return a.due != b.due ? a.due < b.due : a.seq < b.seq;
      });
      if (next == timers_.end() || next->due > until) break;
      now_ms_ = std::max(now_ms_, next->due);
      auto fn = std::move(next->fn);
      timers_.erase(next);
      fn();
    }
    RunPosted();
    now_ms_ = until;
  }
  size_t pending() const { return timers_.size(); }

 private:
  struct Timer {
    int64_t due;
    uint64_t seq;
    std::function<void()> fn;
  };
  int64_t now_ms_ = 1'000'000;
  uint64_t seq_ = 0;
  std::vector<Timer> timers_;
  std::mutex posted_mu_;
  std::deque<std::function<void()>> posted_;
};

// A model that answers nothing; what a served version holds in these tests.
class InertModel final : public model::LoadedModel {
 public:
  InertModel(model::ModelSpec spec, std::string device, std::string dir)
      : spec_(std::move(spec)), device_(std::move(device)), dir_(std::move(dir)) {}
  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>&,
                                                 const model::RunContext&) override {
    return Unavailable("inert test model");
  }
  const std::string& dir() const { return dir_; }

 private:
  model::ModelSpec spec_;
  std::string device_;
  std::string dir_;
};

// Builds that start and finish when the test says. A successful build
// writes a real cache entry (a model.so of a few bytes, the spec given).
class FakeBuilds final : public compile::BuildRunner {
 public:
  explicit FakeBuilds(const compile::BuildCache* cache) : cache_(cache) {}

  void Submit(compile::BuildJob job) override {
    submitted.push_back(job.key);
    estimates.push_back(job.estimate_ms);
    jobs_.push_back({std::move(job), false});
  }
  bool Cancel(const compile::BuildKey& key) override {
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (it->job.key != key) continue;
      cancelled.push_back(key);
      compile::BuildJob job = std::move(it->job);
      const bool later = it->started && cancel_started_later;
      jobs_.erase(it);
      if (later) {
        cancelling_.push_back(std::move(job));
      } else {
        EndCancelled(job);
      }
      return true;
    }
    return false;
  }
  // With cancel_started_later, the started builds Cancel() was asked for
  // end now, as a real build's killed process is reaped later.
  void FinishCancels() {
    auto jobs = std::move(cancelling_);
    cancelling_.clear();
    for (auto& job : jobs) EndCancelled(job);
  }
  std::string Progress(const compile::BuildKey& key) const override {
    for (const auto& j : jobs_) {
      if (j.job.key == key && j.started) return progress;
    }
    return "";
  }

  size_t live() const { return jobs_.size(); }
  const compile::BuildKey& key(size_t i) const { return jobs_.at(i).job.key; }
  // Starts the oldest job not yet started.
  void StartNext() {
    for (auto& j : jobs_) {
      if (j.started) continue;
      j.started = true;
      if (j.job.on_start) j.job.on_start();
      return;
    }
  }
  // Ends the oldest job: with a real cache entry for `spec`, or failed.
  void Succeed(const model::ModelSpec& spec) {
    Job j = Take();
    compile::BuildResult r;
    auto staging = cache_->NewStaging(j.job.key);
    Status s = staging.status();
    if (s.ok()) s = fs::WriteFileAtomic(*staging + "/model.so", "not really a shared object");
    if (s.ok()) s = fs::WriteFileAtomic(*staging + "/spec.json", spec.ToJson());
    if (s.ok()) s = fs::WriteFileAtomic(*staging + "/package.json", R"({"kind":"exported_program"})");
    if (s.ok()) {
      auto entry = cache_->Commit(*staging, j.job.key);
      s = entry.status();
      if (entry.ok()) r.entry = *entry;
    }
    r.status = s;
    r.duration_ms = 1234;
    j.job.on_done(r);
  }
  void Fail(const std::string& why, bool permanent) {
    Job j = Take();
    compile::BuildResult r;
    r.status = Internal(why);
    r.permanent = permanent;
    j.job.on_done(r);
  }

  bool cancel_started_later = false;  // a started build's Cancel ends it at FinishCancels()
  std::vector<compile::BuildKey> submitted;
  std::vector<int64_t> estimates;  // each submitted job's estimate_ms
  std::vector<compile::BuildKey> cancelled;
  std::string progress = "step 2/4: compiling (3 s)";

 private:
  struct Job {
    compile::BuildJob job;
    bool started;
  };
  Job Take() {
    Job j = std::move(jobs_.front());
    jobs_.pop_front();
    if (!j.started && j.job.on_start) j.job.on_start();
    return j;
  }
  static void EndCancelled(compile::BuildJob& job) {
    compile::BuildResult r;
    r.status = Unavailable("build cancelled");
    r.cancelled = true;
    job.on_done(r);
  }
  const compile::BuildCache* cache_;
  std::deque<Job> jobs_;
  std::vector<compile::BuildJob> cancelling_;
};

// Loads that finish when the test says: with an InertModel, or an error.
class FakeLoader final : public ModelLoader {
 public:
  void Load(LoadRequest request, std::function<void(LoadResult)> done) override {
    requests.push_back(request);
    pending_.push_back({std::move(request), std::move(done)});
  }
  size_t pending() const { return pending_.size(); }
  // Finishes the oldest load.
  void Succeed() {
    auto [req, done] = Take();
    LoadResult r;
    if (req.prepare_only) {
      r.model = std::shared_ptr<model::LoadedModel>();
      r.embed = embed;
      done(std::move(r));
      return;
    }
    r.model = std::shared_ptr<model::LoadedModel>(
        std::make_shared<InertModel>(req.entry.spec, req.options.device, req.entry.dir));
    const int pid = ++pids;
    r.runner_pid = [pid] { return pid; };
    r.threads = req.options.threads;
    r.embed = embed;
    if (record_threads && req.choose_threads_at_batch > 0) {
      // As the real loader does after a settled timing: the choice goes
      // into the build's entry.
      compile::BuildCache entry_owner(req.entry.dir);
      r.threads_recorded =
          entry_owner.RecordThreads(req.entry.dir, {req.threads_key, 1, "1 of 2: timed by the test", 1}).ok();
    }
    done(std::move(r));
  }
  void Fail(const std::string& why, StatusCode code = StatusCode::kInternal) {
    auto [req, done] = Take();
    LoadResult r;
    r.model = Status(code, why);
    done(std::move(r));
  }
  // Finishes every load, successfully, including those they lead to.
  void SucceedAll() {
    while (!pending_.empty()) Succeed();
  }

  std::vector<LoadRequest> requests;
  std::shared_ptr<const serving::EmbedSpec> embed;  // given with each model loaded: an embedding model
  bool record_threads = false;  // record auto threads with the build, as a settled timing does
  int pids = 4000;              // the last runner pid given out

 private:
  std::pair<LoadRequest, std::function<void(LoadResult)>> Take() {
    auto p = std::move(pending_.front());
    pending_.pop_front();
    return p;
  }
  std::deque<std::pair<LoadRequest, std::function<void(LoadResult)>>> pending_;
};

}  // namespace aotid::control::testing
