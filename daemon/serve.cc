#include "daemon/serve.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <uv.h>

#include <csignal>
#include <thread>

#include "base/fs.h"
#include "base/log.h"
#include "daemon/http_api.h"
#include "daemon/reconciler.h"
#include "runtime/hardware.h"
#include "runtime/torch_version.h"

namespace aotid::daemon {
namespace {

// One daemon per store: a second would race the first on builds.
StatusOr<int> LockStore(const std::string& dir) {
  std::string path = dir + "/daemon.lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open " + path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return FailedPrecondition("another aotid serve is already using the store " + dir);
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) {
    ssize_t unused = ::write(fd, pid.data(), pid.size());
    (void)unused;
  }
  return fd;
}

// Notices commits to the store from any process: a file watch on the store
// directory wakes it at once, a one-second timer is the backstop, and PRAGMA
// data_version says whether anything was committed since the last look.
struct StoreWatch {
  uv_fs_event_t dir_event{};
  uv_timer_t tick{};
  storage::ModelStore* store = nullptr;
  Reconciler* reconciler = nullptr;
  int64_t seen_version = -1;

  void Start(uv_loop_t* loop, const std::string& dir) {
    auto v = store->DataVersion();
    seen_version = v.ok() ? *v : -1;
    uv_timer_init(loop, &tick);
    tick.data = this;
    uv_timer_start(&tick, [](uv_timer_t* t) { static_cast<StoreWatch*>(t->data)->Check(); }, 1000, 1000);
    uv_fs_event_init(loop, &dir_event);
    dir_event.data = this;
    int rc = uv_fs_event_start(&dir_event, [](uv_fs_event_t* h, const char* file, int, int) {
      std::string_view f = file ? file : "";
      if (f.empty() || f.rfind("aotid.db", 0) == 0) static_cast<StoreWatch*>(h->data)->Check();
    }, dir.c_str(), 0);
    if (rc != 0) LOG_WARNING << "cannot watch " << dir << " (" << uv_strerror(rc) << "); checking every second";
  }
  void Check() {
    auto v = store->DataVersion();
    if (!v.ok()) {
      LOG_WARNING << "store check: " << v.status().message();
      return;
    }
    if (*v == seen_version) return;
    seen_version = *v;
    LOG_DEBUG << "store changed; reconciling";
    if (Status s = reconciler->Reconcile(); !s.ok()) LOG_ERROR << "reconcile: " << s.message();
  }
  void Stop() {
    uv_timer_stop(&tick);
    uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&dir_event), nullptr);
  }
};

struct Shutdown {
  uv_signal_t sigterm{}, sigint{};
  StoreWatch* watch = nullptr;
  HttpApi* http = nullptr;
  runtime::Builder* builder = nullptr;
  Reconciler* reconciler = nullptr;
  bool started = false;
};

void OnSignal(uv_signal_t* handle, int signum) {
  auto* s = static_cast<Shutdown*>(handle->data);
  if (s->started) return;
  s->started = true;
  LOG_INFO << "received " << (signum == SIGTERM ? "SIGTERM" : "SIGINT") << "; shutting down";
  s->reconciler->Stop();
  s->watch->Stop();
  s->builder->Shutdown();
  s->http->Stop();
  uv_close(reinterpret_cast<uv_handle_t*>(&s->sigterm), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&s->sigint), nullptr);
}

}  // namespace

int Serve(const Config& config) {
  log::Level level;
  if (log::ParseLevel(config.log_level, &level)) log::SetLevel(level);
  std::signal(SIGPIPE, SIG_IGN);

  auto fail = [](const Status& s) {
    LOG_ERROR << "aotid serve: " << s.message();
    return 1;
  };
  auto store = storage::ModelStore::Open(config.store_path, /*create=*/true);
  if (!store.ok()) return fail(store.status());
  auto lock = LockStore(config.store_path);
  if (!lock.ok()) return fail(lock.status());

  runtime::HardwareInfo hw = runtime::ProbeHardware(config.cxx);
  std::string fingerprint = runtime::Fingerprint(hw);
  LOG_INFO << "aotid " << AOTID_VERSION << " store " << config.store_path << " config " << config.source;
  LOG_INFO << "hardware " << fingerprint << " (" << hw.cpu_model << ", " << hw.cores << " cores)";

  runtime::BuildCache cache(config.store_path + "/cache");
  if (Status s = cache.ClearStaging(); !s.ok()) return fail(s);

  uv_loop_t loop;
  uv_loop_init(&loop);
  runtime::BuilderOptions bopts;
  bopts.python = config.python;
  bopts.worker_dir = config.worker_dir;
  bopts.torch_version = runtime::kTorchVersion;
  bopts.scratch_dir = config.store_path + "/cache/.inductor";
  bopts.jobs = config.build_jobs;
  bopts.timeout_s = config.build_timeout_s;
  runtime::Builder builder(&loop, &cache, bopts);
  ModelRegistry registry;
  Reconciler reconciler(&loop, store->get(), &cache, &builder, &registry, fingerprint);

  HttpOptions hopts;
  if (Status s = ParseListen(config.listen, &hopts.host, &hopts.port); !s.ok()) return fail(s);
  hopts.threads = config.threads;
  hopts.max_body_bytes = config.max_body_bytes;
  HttpApi http(&registry, hopts);
  if (Status s = http.Bind(); !s.ok()) return fail(s);

  StoreWatch watch;
  watch.store = store->get();
  watch.reconciler = &reconciler;
  Shutdown shutdown;
  shutdown.watch = &watch;
  shutdown.http = &http;
  shutdown.builder = &builder;
  shutdown.reconciler = &reconciler;
  uv_signal_init(&loop, &shutdown.sigterm);
  uv_signal_init(&loop, &shutdown.sigint);
  shutdown.sigterm.data = shutdown.sigint.data = &shutdown;
  uv_signal_start(&shutdown.sigterm, OnSignal, SIGTERM);
  uv_signal_start(&shutdown.sigint, OnSignal, SIGINT);

  // The first reconcile publishes every model's state before HTTP answers
  // anything, so an early request gets 503 "building", never 404.
  watch.Start(&loop, config.store_path);
  if (Status s = reconciler.Reconcile(); !s.ok()) LOG_ERROR << "reconcile: " << s.message();
  std::string shown_host = hopts.host.find(':') != std::string::npos ? "[" + hopts.host + "]" : hopts.host;
  LOG_INFO << "serving on http://" << shown_host << ":" << http.port();
  std::thread http_thread([&http] { http.Serve(); });

  uv_run(&loop, UV_RUN_DEFAULT);
  http_thread.join();
  uv_loop_close(&loop);
  LOG_INFO << "stopped";
  ::close(*lock);
  return 0;
}

}  // namespace aotid::daemon
