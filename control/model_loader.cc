#include "control/model_loader.h"

#include "runtime/thread_choice.h"

namespace aotid::control {
namespace {

struct LoadWork {
  uv_work_t req{};
  const runtime::BuildCache* cache = nullptr;
  LoadRequest request;
  std::function<void(LoadResult)> done;
  LoadResult result;
};

}  // namespace

void ThreadPoolLoader::Load(LoadRequest request, std::function<void(LoadResult)> done) {
  auto* w = new LoadWork;
  w->req.data = w;
  w->request = std::move(request);
  w->cache = cache_;
  w->done = std::move(done);
  int rc = uv_queue_work(
      loop_, &w->req,
      [](uv_work_t* req) {  // a pool thread: touches only its own LoadWork
        auto* work = static_cast<LoadWork*>(req->data);
        const LoadRequest& r = work->request;
        work->result.threads = r.options.threads;
        // Not fatal when it cannot be written: the load is what matters.
        (void)work->cache->BeginLoad(r.entry);
        auto loaded = runtime::LoadCompiledModel(r.entry, r.options);
        if (!loaded.ok()) {
          work->cache->EndLoad(r.entry);
          work->result.model = loaded.status();
          return;
        }
        std::shared_ptr<runtime::LoadedModel> model = std::move(loaded).value();
        if (r.choose_threads_at_batch > 0 && r.options.threads > 1) {
          runtime::ThreadChoice choice =
              runtime::ChooseThreads(*model, r.options.threads, r.choose_threads_at_batch);
          work->result.threads = choice.threads;
          work->result.threads_note = choice.note;
        }
        work->cache->EndLoad(r.entry);  // after the timing runs too: they run its kernels
        work->result.model = std::move(model);
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
