#include "control/model_loader.h"

#include <deque>
#include <optional>

#include "base/crash_point.h"
#include "base/fs.h"
#include "base/log.h"
#include "storage/model_store.h"

namespace aotid::control {

// Outlives the loader while runner models hold it; posts after Close are
// dropped.
struct ThreadPoolLoader::Inbox {
  Mutex mu;
  bool closed GUARDED_BY(mu) = false;
  std::deque<std::function<void()>> work GUARDED_BY(mu);
  uv_async_t* async GUARDED_BY(mu) = nullptr;

  void Post(std::function<void()> fn) {
    MutexLock lock(&mu);
    if (closed) return;
    work.push_back(std::move(fn));
    uv_async_send(async);
  }
  void RunPosted() {
    std::deque<std::function<void()>> now;
    {
      MutexLock lock(&mu);
      now.swap(work);
    }
    for (auto& fn : now) fn();
  }
};

namespace {

struct LoadWork {
  uv_work_t req{};
  const compile::BuildCache* cache = nullptr;
  RunnerPlace place;
  std::shared_ptr<ThreadPoolLoader::Inbox> inbox;
  LoadRequest request;
  std::function<void(LoadResult)> done;
  LoadResult result;
};

}  // namespace

ThreadPoolLoader::ThreadPoolLoader(uv_loop_t* loop, const compile::BuildCache* cache, RunnerPlace place)
    : loop_(loop), cache_(cache), place_(std::move(place)), inbox_(std::make_shared<Inbox>()) {
  auto* async = new uv_async_t;
  async->data = inbox_.get();
  uv_async_init(loop_, async, [](uv_async_t* h) { static_cast<Inbox*>(h->data)->RunPosted(); });
  MutexLock lock(&inbox_->mu);
  inbox_->async = async;
}

ThreadPoolLoader::~ThreadPoolLoader() { Close(); }

void ThreadPoolLoader::Close() {
  MutexLock lock(&inbox_->mu);
  if (inbox_->closed) return;
  inbox_->closed = true;
  inbox_->work.clear();
  uv_close(reinterpret_cast<uv_handle_t*>(inbox_->async),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_async_t*>(h); });
  inbox_->async = nullptr;
}

void ThreadPoolLoader::Load(LoadRequest request, std::function<void(LoadResult)> done) {
  auto* w = new LoadWork;
  w->req.data = w;
  w->request = std::move(request);
  w->cache = cache_;
  w->place = place_;
  w->inbox = inbox_;
  w->done = std::move(done);
  int rc = uv_queue_work(
      loop_, &w->req,
      [](uv_work_t* req) {         // a pool thread: touches only its own LoadWork
        PausePoint("model_load");  // tests: a load that takes a while
        auto* work = static_cast<LoadWork*>(req->data);
        const LoadRequest& r = work->request;
        runner::RunnerOptions ro;
        ro.self_exe = work->place.self_exe;
        ro.scratch_root = work->place.scratch_root;
        ro.label = r.label.empty() ? r.entry.dir : r.label;
        const std::string ro_label = ro.label;
        ro.load = r.options;
        ro.choose_threads_at_batch = r.options.threads > 1 ? r.choose_threads_at_batch : 0;
        // A settled choice recorded for this machine, setting and batch is
        // used as it is; one made for another, or on a busy machine, is
        // timed again.
        compile::RecordedThreads recorded;
        bool from_record = false;
        if (ro.choose_threads_at_batch > 0) {
          if (auto rec = work->cache->ReadThreads(r.entry.dir, r.threads_key);
              rec && rec->settled && rec->threads <= r.options.threads) {
            recorded = *rec;
            from_record = true;
            ro.load.threads = recorded.threads;
            ro.choose_threads_at_batch = 0;
          }
        }
        const bool timing = ro.choose_threads_at_batch > 0;
        ro.run_timeout_ms = r.run_timeout_ms;
        ro.memory_limit_bytes = r.memory_limit_bytes;
        ro.max_crashes = r.max_crashes;
        ro.crash_window_ms = r.crash_window_ms;
        if (r.on_runner_event) {
          ro.on_event = [inbox = work->inbox, fn = r.on_runner_event](const runner::RunnerEvent& e) {
            inbox->Post([fn, e] { fn(e); });
          };
        }
        // A language model's generate spec and tokenizer, read before the
        // runner starts: a spec that does not fit fails the load at once.
        if (!r.entry.generate_path.empty()) {
          auto text = fs::ReadFile(r.entry.generate_path);
          auto spec =
              text.ok() ? text::GenerateSpec::FromJson(*text) : StatusOr<text::GenerateSpec>(text.status());
          auto gen = spec.ok() ? serving::Generator::Create(std::move(spec).value(), r.entry.spec,
                                                            r.max_sequences, r.label)
                               : StatusOr<std::shared_ptr<serving::Generator>>(spec.status());
          if (!gen.ok()) {
            work->result.model = gen.status().WithContext(r.entry.generate_path);
            return;
          }
          work->result.generator = std::move(gen).value();
        }
        // An embedding model's spec and tokenizer, likewise.
        if (!r.entry.embed_path.empty()) {
          auto text = fs::ReadFile(r.entry.embed_path);
          auto spec =
              text.ok() ? serving::EmbedSpec::FromJson(*text) : StatusOr<serving::EmbedSpec>(text.status());
          Status fits = spec.ok() ? serving::CheckEmbedModel(*spec, r.entry.spec) : spec.status();
          if (!fits.ok()) {
            work->result.model = fits.WithContext(r.entry.embed_path);
            return;
          }
          work->result.embed = std::make_shared<const serving::EmbedSpec>(std::move(spec).value());
        }
        if (r.prepare_only) {
          work->result.model = std::shared_ptr<model::LoadedModel>();
          return;
        }
        // Loads that time their threads take turns: runners timing side by
        // side on the same cores would measure each other (and find the
        // machine busy). Loads that do not time run freely.
        static Mutex timing_turn;
        std::optional<MutexLock> turn;
        if (timing) turn.emplace(&timing_turn);
        // Not fatal when it cannot be written: the load is what matters.
        (void)work->cache->BeginLoad(r.entry);
        auto started = runner::RunnerModel::Start(r.entry, std::move(ro));
        work->cache->EndLoad(r.entry);  // the runner loaded it and timed its threads, or failed to
        if (!started.ok()) {
          // A build damaged in place loads into a crash: say so, so that it
          // is rebuilt rather than failed.
          Status digest = work->cache->VerifyDigest(r.entry);
          work->result.model = digest.code() == StatusCode::kCorruption ? digest : started.status();
          return;
        }
        work->result.threads = (*started)->threads();
        work->result.threads_note = (*started)->threads_note();
        if (from_record) {
          work->result.threads_note =
              "timed " + storage::FormatTimestamp(recorded.at_ms) + ": " + recorded.note;
          work->result.threads_recorded = true;
        } else if (timing) {
          // Recorded settled or not: a settled one is reused; an unsettled
          // one only stands until the next load, or until `aotid set NAME
          // threads=...` removes it to have the version timed now.
          compile::RecordedThreads now{r.threads_key, (*started)->threads(), (*started)->threads_note(),
                                       storage::NowMs(), (*started)->threads_settled()};
          Status written = work->cache->RecordThreads(r.entry.dir, now);
          if (!written.ok())
            LOG_WARNING << ro_label << ": the thread choice is not recorded: " << written.message();
          work->result.threads_recorded = written.ok();
        }
        std::shared_ptr<runner::RunnerModel> runner = std::move(started).value();
        work->result.runner_pid = [weak = std::weak_ptr<runner::RunnerModel>(runner)] {
          auto r = weak.lock();
          return r ? static_cast<int>(r->pid()) : 0;
        };
        work->result.model = std::shared_ptr<model::LoadedModel>(std::move(runner));
      },
      [](uv_work_t* req, int status) {  // the loop thread
        std::unique_ptr<LoadWork> work(static_cast<LoadWork*>(req->data));
        if (status != 0) work->result.model = Unavailable("load cancelled");
        work->done(std::move(work->result));
      });
  if (rc != 0) {
    std::unique_ptr<LoadWork> work(w);
    work->result.model = Internal(std::string("cannot queue the load: ") + uv_strerror(rc));
    work->done(std::move(work->result));
  }
}

}  // namespace aotid::control
