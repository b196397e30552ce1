#include "daemon/serve.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <thread>
#include <vector>

#include "base/fs.h"
#include "base/log.h"
#include "base/memory.h"
#include "base/mutex.h"
#include "control/model_commands.h"
#include "control/reconciler.h"
#include "control/residency.h"
#include "control/store_watch.h"
#include "daemon/daemon_lock.h"
#include "daemon/model_dir.h"
#include "daemon/service_manager.h"
#include "http/host.h"
#include "platform/device_probe.h"
#include "platform/hardware.h"
#include "platform/memory_probe.h"
#include "platform/torch_version.h"
#include "serving/grpc_api.h"
#include "serving/http_api.h"

namespace aotid::daemon {
namespace {

// Repository loads and unloads, handed from HTTP and gRPC workers to the
// control loop (control::ModelCommands), which answers each when it has
// acted.
struct RepositoryCommands {
  uv_async_t async{};
  control::ModelCommands* commands = nullptr;
  struct Command {
    std::string name;
    bool enable = false;
    std::function<void(Status)> done;
  };
  Mutex mu;
  std::vector<Command> queued GUARDED_BY(mu);
  bool stopped GUARDED_BY(mu) = false;

  void Post(Command c) EXCLUDES(mu) {
    bool queued_it = false;
    {
      MutexLock lock(&mu);
      if (!stopped) {
        queued.push_back(std::move(c));
        queued_it = true;
      }
    }
    if (!queued_it) return c.done(Unavailable("the daemon is stopping"));
    uv_async_send(&async);
  }
  // On the loop thread, at shutdown, before the async handle closes: every
  // command gets its answer (gRPC's shutdown waits for every call's end),
  // those queued and those still waiting for the registry, and any posted
  // later is answered at once.
  void Stop() EXCLUDES(mu) {
    std::vector<Command> left;
    {
      MutexLock lock(&mu);
      stopped = true;
      left.swap(queued);
    }
    for (auto& c : left) c.done(Unavailable("the daemon is stopping"));
    commands->Stop();
  }
  static void Run(uv_async_t* handle) {
    auto* self = static_cast<RepositoryCommands*>(handle->data);
    std::vector<Command> now;
    {
      MutexLock lock(&self->mu);
      now.swap(self->queued);
    }
    for (auto& c : now) self->commands->SetEnabled(c.name, c.enable, std::move(c.done));
  }
};

// The daemon's own events (no model): start, stop, and a start after a
// daemon that never said it stopped. A store that cannot take them (a full
// disk) costs a log line, not the start.
void RecordDaemonEvent(storage::ModelStore* store, const std::string& kind, const std::string& message) {
  if (Status s = store->AppendEvent("", 0, kind, message); !s.ok()) {
    LOG_WARNING << "cannot record " << kind << " in the store: " << s.message();
  }
}

void RecordRecovery(storage::ModelStore* store) {
  auto recent = store->RecentEvents(500);
  if (!recent.ok()) return;
  for (auto it = recent->rbegin(); it != recent->rend(); ++it) {
    if (!it->model.empty() || !it->kind.starts_with("daemon_")) continue;
    if (it->kind == "daemon_started") {
      std::string was = it->message.substr(0, it->message.find(" serving on"));
      LOG_WARNING << "the daemon before this one, " << was << ", ended without stopping";
      RecordDaemonEvent(store, "daemon_recovered",
                        "the daemon before this one, " + was +
                            ", ended without stopping: killed, crashed or the machine went down; builds it "
                            "had in flight are made again");
    }
    return;  // the newest daemon event decides
  }
}

// What a socket handed over is, in the terms of server.listen: a unix
// socket's path, or a TCP address and port.
Status DescribeSocket(int fd, http::ServerOptions* server) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return ErrnoError("getsockname of the socket handed over", errno);
  }
  char text[INET6_ADDRSTRLEN] = {};
  switch (addr.ss_family) {
    case AF_UNIX: {
      const auto* un = reinterpret_cast<const sockaddr_un*>(&addr);
      server->unix_path = un->sun_path[0] ? std::string(un->sun_path) : std::string("@abstract");
      return Status::OK();
    }
    case AF_INET: {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
      server->host = text;
      server->port = ntohs(in->sin_port);
      return Status::OK();
    }
    case AF_INET6: {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
      ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
      server->host = text;
      server->port = ntohs(in6->sin6_port);
      return Status::OK();
    }
  }
  return InvalidArgument("the socket handed over is neither a unix nor a TCP socket");
}

// One line for the service manager's status (`systemctl status`): how many
// served versions are ready, and what the first that is not is doing.
std::string StatusLine(const serving::ModelRegistry& registry) {
  auto all = registry.All();
  int total = 0, ready = 0, failed = 0;
  std::string busy;
  for (const auto& [name, versions] : *all) {
    for (const auto& [version, m] : versions) {
      ++total;
      if (m->state == serving::ServeState::kReady) {
        ++ready;
      } else if (m->state == serving::ServeState::kFailed) {
        ++failed;
      } else if (busy.empty()) {
        std::string what = m->message.substr(0, m->message.find('\n'));
        while (!what.empty() && what.back() == ' ') what.pop_back();
        busy = std::string(serving::ServeStateName(m->state)) + " " + name + ":" + std::to_string(version) +
               (what.empty() ? "" : " (" + what.substr(0, 80) + ")");
      }
    }
  }
  std::string line = std::to_string(ready) + "/" + std::to_string(total) + " models ready";
  if (failed > 0) line += ", " + std::to_string(failed) + " failed";
  if (!busy.empty()) line += ", " + busy;
  return line;
}

// Keeps the service manager informed while serving: STATUS= when it
// changes, and WATCHDOG=1 at half the interval it asked for (the loop
// thread pings, so a loop that hangs is restarted).
struct ServiceStatus {
  uv_timer_t timer{};
  ServiceManager* manager = nullptr;
  const serving::ModelRegistry* registry = nullptr;
  std::string last;
  // Single-model mode: the model, and what stops the daemon once its
  // version has failed for good (no retry left), so that the orchestrator
  // sees a failed container rather than one that is never ready.
  std::string single_model;
  std::function<void(const std::string&)> single_model_failed;

  static void Tick(uv_timer_t* t) {
    auto* self = static_cast<ServiceStatus*>(t->data);
    std::string line = StatusLine(*self->registry);
    std::string message;
    if (line != self->last) message = "STATUS=" + line + "\n";
    if (self->manager->watchdog_ping_ms() > 0) message += "WATCHDOG=1\n";
    if (!message.empty()) self->manager->Notify(message);
    self->last = line;
    if (!self->single_model.empty() && self->single_model_failed) {
      for (const auto& e : *self->registry->GetCatalog()) {
        if (e.name != self->single_model || !e.enabled || !e.wanted) continue;
        auto sm = self->registry->Find(e.name, e.version);
        if (sm && sm->state == serving::ServeState::kFailed) {
          self->single_model_failed(e.name + ":" + std::to_string(e.version) + " failed: " + sm->message);
          return;
        }
      }
    }
  }
};

StatusOr<std::string> ReadToken(const std::string& path);

// The reconciler's limits from the config (at start and at each reload).
void SetLimits(const Config& config, const platform::HardwareInfo& hw, control::ReconcilerOptions* o) {
  o->max_queued_requests = config.max_queued_requests;
  o->retry_initial_ms = config.build_retry_initial_s * 1000;
  o->max_attempts = config.build_max_attempts;
  o->run_timeout_ms = int64_t{config.run_timeout_s} * 1000;
  o->memory_limit_bytes = config.memory_limit_mb > 0 ? static_cast<uint64_t>(config.memory_limit_mb) << 20
                                                     : static_cast<uint64_t>(hw.memory_bytes) / 4 * 3;
  o->runner_max_crashes = config.runner_max_crashes;
  o->runner_crash_window_ms = int64_t{config.runner_crash_window_s} * 1000;
}

// Residency's options from the config: the budget (a share of the memory
// this process may use unless set), the default keep_alive, the wait.
// In single-model mode nothing else shares the memory, so the default
// budget is most of it.
constexpr int kSingleModelBudgetPercent = 90;

control::ResidencyOptions ResidencyFrom(const Config& config, bool single_model) {
  control::ResidencyOptions o;
  if (config.memory_budget_mb > 0) {
    o.budget_bytes = static_cast<uint64_t>(config.memory_budget_mb) << 20;
    o.budget_source = "residency.memory_budget_mb";
  } else {
    platform::UsableMemory usable = platform::ReadUsableMemory();
    const int percent = single_model ? kSingleModelBudgetPercent : kDefaultBudgetPercent;
    o.budget_bytes = usable.bytes / 100 * percent;
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f", static_cast<double>(usable.bytes) / (1 << 30));
    o.budget_source = std::to_string(percent) + "% of " + gib + " GiB, the " + usable.source;
  }
  o.keep_alive_ms =
      config.keep_alive_s == storage::kKeepAliveAlways ? -1 : int64_t{config.keep_alive_s} * 1000;
  o.load_wait_ms = int64_t{config.load_wait_s} * 1000;
  o.unload_on_pressure = config.unload_on_pressure;
  return o;
}

// SIGHUP: the configuration read again; what can change live is applied.
struct Reload {
  uv_signal_t sighup{};
  bool single_model = false;
  std::function<StatusOr<Config>()> load;
  Config current;
  std::string current_token;
  platform::HardwareInfo hw;
  ServiceManager* manager = nullptr;
  storage::ModelStore* store = nullptr;
  serving::HttpApi* http = nullptr;
  serving::GrpcApi* grpc = nullptr;
  compile::Builder* builder = nullptr;
  control::Reconciler* reconciler = nullptr;
  control::Residency* residency = nullptr;
  sync::Syncer* syncer = nullptr;

  static void OnSignal(uv_signal_t* handle, int) {
    auto* self = static_cast<Reload*>(handle->data);
    self->Run();
  }
  void Run() {
    if (!load) return;
    // MONOTONIC_USEC: systemd's notify-reload wants the moment the reload began.
    struct timespec now {};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    manager->Notify(
        "RELOADING=1\nMONOTONIC_USEC=" + std::to_string(int64_t{now.tv_sec} * 1000000 + now.tv_nsec / 1000) +
        "\nSTATUS=reloading the configuration\n");
    auto fresh = load();
    // The token file is read again at every reload (a new token in the
    // same file is the usual rotation); one that cannot be read refuses
    // the reload as a broken file would.
    std::string token;
    if (fresh.ok() && !fresh->token_file.empty()) {
      auto t = ReadToken(fresh->token_file);
      if (t.ok()) {
        token = *t;
      } else {
        fresh = t.status();
      }
    }
    if (!fresh.ok()) {
      LOG_ERROR << "reload refused, the running configuration is kept: " << fresh.status().message();
      manager->Notify("READY=1\nSTATUS=reload refused: " + fresh.status().message().substr(0, 200) + "\n");
      return;
    }
    std::vector<std::string> changed = ChangedKeys(current, *fresh);
    auto has = [&changed](std::string_view prefix) {
      return std::any_of(changed.begin(), changed.end(),
                         [prefix](const std::string& k) { return k.rfind(prefix, 0) == 0; });
    };
    std::vector<std::string> applied, from_now, later;
    if (fresh->log_level != current.log_level) {
      log::Level level;
      if (log::ParseLevel(fresh->log_level, &level)) log::SetLevel(level);
    }
    // The log file is opened again at every reload, changed or not: one
    // that logrotate (or a person) moved away is made anew at its path.
    if (has("log.file") || has("log.max_size_mb") || has("log.keep") || !fresh->log_file.empty()) {
      if (fresh->log_file.empty()) {
        log::ResetToStderr();
      } else if (Status s =
                     log::SetFile(fresh->log_file, int64_t{fresh->log_max_size_mb} << 20, fresh->log_keep);
                 !s.ok()) {
        LOG_ERROR << "reload: " << s.message() << " (log.file); keeping the log where it was";
        fresh->log_file = current.log_file;
        fresh->log_max_size_mb = current.log_max_size_mb;
        fresh->log_keep = current.log_keep;
      }
    }
    bool token_changed = token != current_token;
    if (http != nullptr && (token_changed || has("server.token_scope") || has("server.allowed_hosts") ||
                            has("server.cors_origins"))) {
      serving::HttpOptions access = fresh->api;
      access.token = token;
      http->UpdateAccess(access);
      if (grpc != nullptr) grpc->UpdateAccess(token, fresh->api.token_for_all);
      if (token_changed && !has("server.token_file")) applied.push_back("the token in " + fresh->token_file);
      current_token = token;
    }
    if (builder != nullptr && (has("build.jobs") || has("build.timeout_s"))) {
      builder->SetLimits(fresh->build_jobs, fresh->build_timeout_s);
    }
    if (syncer != nullptr && has("sync")) {
      if (single_model) {
        LOG_WARNING << "reload: [[sync]] is not followed with --model-dir; the change is ignored";
      } else {
        syncer->SetSources(fresh->sync);
      }
    }
    if (reconciler != nullptr) {
      control::ReconcilerOptions limits;
      SetLimits(*fresh, hw, &limits);
      reconciler->SetLimits(limits);
    }
    if (residency != nullptr && has("residency.")) residency->SetOptions(ResidencyFrom(*fresh, single_model));
    // What each changed key became.
    for (const auto& key : ChangedKeys(current, *fresh)) {
      switch (ReloadRuleOf(key)) {
        case ReloadRule::kLive: applied.push_back(key); break;
        case ReloadRule::kNextLoad: from_now.push_back(key); break;
        case ReloadRule::kRestart: later.push_back(key); break;
      }
    }
    std::string said = applied.empty() ? "nothing to apply" : "applied " + Join(applied);
    if (!from_now.empty()) said += "; " + Join(from_now) + " apply to model versions loaded from now on";
    if (!later.empty()) said += "; waiting for the next start: " + Join(later);
    LOG_INFO << "reloaded " << fresh->source << ": " << said;
    if (store) RecordDaemonEvent(store, "daemon_reloaded", "reloaded " + fresh->source + ": " + said);
    // Kept as applied: a key that waits for a restart is named again at
    // the next reload.
    Config next = *fresh;
    KeepRunningValues(current, later, &next);
    current = next;
    manager->Notify("READY=1\nSTATUS=reloaded\n");
  }
  static std::string Join(const std::vector<std::string>& parts) {
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
    return out;
  }
};

struct Shutdown {
  uv_signal_t sigterm{}, sigint{};
  Reload* reload = nullptr;
  RepositoryCommands* repository = nullptr;
  ServiceStatus* status = nullptr;
  control::UvLoop* timers = nullptr;
  control::StoreWatch* watch = nullptr;
  serving::HttpApi* http = nullptr;
  serving::GrpcApi* grpc = nullptr;
  compile::Builder* builder = nullptr;
  control::Reconciler* reconciler = nullptr;
  control::Residency* residency = nullptr;
  control::ThreadPoolLoader* loader = nullptr;
  bool started = false;
  int exit_code = 0;  // what Serve returns once the loop ends
};

// Stops taking work, lets what is in flight finish, and ends the loop.
void BeginShutdown(Shutdown* s) {
  if (s->started) return;
  s->started = true;
  s->status->manager->Notify("STOPPING=1\nSTATUS=stopping: finishing the requests in flight\n");
  uv_close(reinterpret_cast<uv_handle_t*>(&s->status->timer), nullptr);
  s->reconciler->Stop();
  s->residency->Stop();
  s->watch->Stop();
  s->builder->Shutdown();
  s->repository->Stop();  // before the timers its waiting commands poll on close
  s->timers->Close();
  s->loader->Close();
  s->http->Stop();
  if (s->grpc) s->grpc->Stop();
  uv_close(reinterpret_cast<uv_handle_t*>(&s->repository->async), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&s->reload->sighup), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&s->sigterm), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&s->sigint), nullptr);
}

void OnSignal(uv_signal_t* handle, int signum) {
  auto* s = static_cast<Shutdown*>(handle->data);
  if (s->started) return;
  LOG_INFO << "received " << (signum == SIGTERM ? "SIGTERM" : "SIGINT") << "; shutting down";
  BeginShutdown(s);
}

// This executable, which runs builds of AOTInductor packages
// (`aotid internal-build`).
std::string SelfExe() {
  std::string path = fs::ExecutablePath();
  return path.empty() ? std::string("aotid") : path;
}

// The bearer token: the file's contents without surrounding whitespace.
StatusOr<std::string> ReadToken(const std::string& path) {
  auto text = fs::ReadFile(path);
  if (!text.ok()) return text.status().WithContext("server.token_file");
  std::string t = *text;
  const char* ws = " \t\r\n";
  t.erase(0, t.find_first_not_of(ws));
  t.erase(t.find_last_not_of(ws) + 1);
  if (t.empty()) return InvalidArgument("server.token_file " + path + " is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    LOG_WARNING << "server.token_file " << path << " can be read by other users (mode " << std::oct
                << (st.st_mode & 0777) << std::dec << "); chmod 600 it";
  }
  return t;
}

// The [[sync]] sources on /metrics: how each sync went, and when the last
// one that worked ended (an alert: time() - that > a few intervals).
void AppendSyncMetrics(const std::vector<sync::SourceStatus>& sources, std::string* out) {
  if (sources.empty()) return;
  auto label = [](const sync::SourceStatus& s) {
    return "source=\"" + serving::MetricLabelValue(s.source) + "\"";
  };
  serving::AppendMetricHeader(out, "aotid_sync_runs_total", "counter",
                              "Syncs of each [[sync]] source since the daemon started, by result.");
  for (const auto& s : sources) {
    *out += "aotid_sync_runs_total{" + label(s) + ",result=\"ok\"} " + std::to_string(s.runs_ok) + "\n";
    *out +=
        "aotid_sync_runs_total{" + label(s) + ",result=\"failed\"} " + std::to_string(s.runs_failed) + "\n";
  }
  serving::AppendMetricHeader(out, "aotid_sync_failures_in_a_row", "gauge",
                              "Failed syncs of each source since its last good one.");
  for (const auto& s : sources) {
    *out += "aotid_sync_failures_in_a_row{" + label(s) + "} " + std::to_string(s.failures) + "\n";
  }
  serving::AppendMetricHeader(out, "aotid_sync_last_success_timestamp_seconds", "gauge",
                              "When each source's last good sync ended (Unix time; 0: none yet).");
  for (const auto& s : sources) {
    *out += "aotid_sync_last_success_timestamp_seconds{" + label(s) + "} " +
            std::to_string(s.last_ok_at_ms / 1000) + "\n";
  }
}

}  // namespace

int Serve(const Config& config, std::function<StatusOr<Config>()> reload_config, const SingleModel& single) {
  log::Level level;
  if (log::ParseLevel(config.log_level, &level)) log::SetLevel(level);
  std::signal(SIGPIPE, SIG_IGN);
  // Request bodies, their decoded tensors and the replies are allocated and
  // freed per request. Blocks up to 1 MiB (a ResNet's image, a reply) are
  // kept for the next request rather than faulted in again, 4 MiB at most
  // at the top of each thread's heap (base/memory.h: the threshold is per
  // heap, and each worker has one); larger ones, a large body above all,
  // go back to the system when freed, so what a client sends, refused or
  // not, is not kept by every worker that met it.
  KeepFreedMemory(size_t{4} << 20, size_t{1} << 20);

  if (!config.log_file.empty()) {
    if (Status s = log::SetFile(config.log_file, int64_t{config.log_max_size_mb} << 20, config.log_keep);
        !s.ok()) {
      LOG_ERROR << "aotid serve: " << s.message() << " (log.file); logging to stderr";
    }
  }
  // First, before anything is started that could inherit its variables.
  ServiceManager service = ServiceManager::FromEnvironment();
  auto fail = [&service](const Status& s) {
    LOG_ERROR << "aotid serve: " << s.message();
    service.Notify("STATUS=cannot start: " + s.message().substr(0, 200) + "\n");
    return 1;
  };
  auto store = storage::ModelStore::Open(config.store_path, /*create=*/true);
  if (!store.ok()) return fail(store.status());
  auto lock = LockStore(config.store_path);
  if (!lock.ok()) return fail(lock.status());
  RecordRecovery(store->get());
  const bool single_model = !single.model_dir.empty();
  if (single_model) {
    if (!config.sync.empty()) {
      return fail(InvalidArgument("--model-dir serves that folder's model alone, but the config (" +
                                  config.source +
                                  ") has [[sync]] registries to follow: remove them, or serve without "
                                  "--model-dir"));
    }
    auto file = FindModelPackage(single.model_dir, single.model_name);
    if (!file.ok()) return fail(file.status());
    bool added = false;
    auto v = AdoptModel(store->get(), *file, single.model_name, &added);
    if (!v.ok()) return fail(v.status());
    LOG_INFO << "single-model mode: serving " << *file << " as " << v->model << ":" << v->version
             << (added ? ", added to the store" : ", the store's already");
  }

  platform::HardwareInfo hw = platform::ProbeHardware(config.cxx);
  std::string fingerprint = platform::Fingerprint(hw);
  LOG_INFO << "aotid " << AOTID_VERSION << " store " << config.store_path << " config " << config.source;
  LOG_INFO << "hardware " << fingerprint << " (" << hw.cpu_model << ", " << hw.cores << " cores)";

  const std::string cache_dir = config.CachePath();
  compile::BuildCache cache(cache_dir);
  // This daemon's staging, apart from any other daemon's sharing the cache;
  // the staging of daemons that are gone is removed, with the processes
  // their builds left (a compiler outlives a killed daemon).
  int leftovers = 0;
  if (Status s =
          cache.OpenStaging([&](const std::string& dir) { leftovers += compile::KillLeftoverBuilds(dir); });
      !s.ok()) {
    return fail(s);
  }
  if (leftovers > 0) {
    LOG_WARNING << "killed " << leftovers << " process" << (leftovers == 1 ? "" : "es")
                << " left by an earlier daemon's builds";
  }
  if (config.CacheIsSeparate()) LOG_INFO << "build cache " << cache_dir << " (its own folder, may be shared)";
  // Which accelerators torch can use here: kept beside the builds, so only
  // a first start (or one after torch or the machine changed) runs Python.
  platform::DeviceProbeReport devices =
      platform::ProbeDevices(platform::DeviceProbeForCache(cache_dir, config.python, config.worker_dir), &hw);
  std::string accelerators;
  for (const auto& a : hw.accelerators) accelerators += (accelerators.empty() ? "" : "; ") + a;
  if (devices.status.ok()) {
    LOG_INFO << "devices: " << accelerators << " (" << devices.note << ")";
  } else {
    LOG_WARNING << "devices: " << devices.note << "; builds use the CPU only";
  }
  // Where inductor kept its cache before it moved into each build's staging.
  (void)fs::RemoveAll(cache_dir + "/.inductor");

  // Each connection is a descriptor: the soft limit (often 1024) would cap
  // the connections below server.max_connections_per_address, so it is
  // raised to the hard limit, as far as 65536.
  if (struct rlimit nofile; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < 65536) {
    rlim_t want = std::min<rlim_t>(nofile.rlim_max, 65536);
    if (want > nofile.rlim_cur) {
      nofile.rlim_cur = want;
      ::setrlimit(RLIMIT_NOFILE, &nofile);
    }
  }

  // libuv sizes its thread pool (where loads run) once, at first use.
  ::setenv("UV_THREADPOOL_SIZE", std::to_string(control::ThreadPoolLoader::kThreadPoolSize).c_str(),
           /*overwrite=*/0);
  uv_loop_t loop;
  uv_loop_init(&loop);
  compile::BuilderOptions bopts;
  bopts.python = config.python;
  bopts.worker_dir = config.worker_dir;
  bopts.torch_version = platform::kTorchVersion;
  bopts.jobs = config.build_jobs;
  bopts.timeout_s = config.build_timeout_s;
  bopts.self_exe = SelfExe();
  bopts.cxx = config.cxx;
  compile::Builder builder(&loop, &cache, bopts);
  serving::ModelRegistry registry;
  serving::Metrics metrics;
  control::ReconcilerOptions ropts;
  ropts.fingerprint = fingerprint;
  ropts.hardware = hw;
  SetLimits(config, hw, &ropts);
  if (single_model) ropts.only_model = single.model_name;
  control::UvLoop timers(&loop);
  // Runners write only in their own scratch directories, beneath this
  // daemon's staging directory, which goes when the daemon does (or at the
  // next start, after a kill).
  control::ThreadPoolLoader loader(&loop, &cache, {SelfExe(), cache.staging_dir()});
  // Which versions stay loaded, within the memory budget.
  control::SystemMemoryProbe memory_probe;
  control::ResidencyHooks residency_hooks;
  residency_hooks.report = [&registry](std::shared_ptr<const serving::ResidencyReport> r) {
    registry.SetResidency(std::move(r));
  };
  residency_hooks.loaded = [&metrics](const std::string& name, int64_t version, double wait_s) {
    metrics.RecordResidentLoad(name, version, wait_s);
  };
  residency_hooks.unloaded = [&metrics](const std::string& name, int64_t version, const std::string& cause) {
    metrics.RecordUnload(name, version, cause);
  };
  control::Residency residency(&timers, &memory_probe, ResidencyFrom(config, single_model), residency_hooks);
  LOG_INFO << "memory budget for the runners: " << (residency.options().budget_bytes >> 20) << " MiB ("
           << residency.options().budget_source << "); keep_alive "
           << (single_model ? "always, the one model's (single-model mode)"
               : config.keep_alive_s == storage::kKeepAliveAlways
                   ? "always unless a version sets its own"
                   : storage::FormatKeepAlive(config.keep_alive_s) + " unless a version sets its own");
  control::ReconcilerParts parts;
  parts.loop = &timers;
  parts.store = store->get();
  parts.cache = &cache;
  parts.builds = &builder;
  parts.loader = &loader;
  parts.registry = &registry;
  parts.metrics = &metrics;
  parts.residency = &residency;
  control::Reconciler reconciler(parts, std::move(ropts));

  serving::HttpOptions hopts = config.api;
  // A socket handed over by the service manager (aotid.socket) replaces
  // server.listen; what it is decides the checks below.
  auto activated = TakeActivatedSocket();
  if (!activated.ok()) return fail(activated.status());
  if (*activated) {
    if (Status s = DescribeSocket(**activated, &hopts.server); !s.ok()) return fail(s);
    hopts.server.inherited_fd = **activated;
    LOG_INFO << "serving on the socket the service manager passed (" << FormatListen(hopts.server) << ")";
  }
  bool on_unix = !hopts.server.unix_path.empty();
  // A unix socket is out of a browser's reach, so DNS rebinding cannot
  // reach it; its file mode (0660) guards it.
  hopts.check_host = !on_unix && http::IsLoopbackHost(hopts.server.host);
  hopts.store_dir = config.store_path;
  hopts.ready_needs_resident = single_model;
  if (!config.token_file.empty()) {
    auto token = ReadToken(config.token_file);
    if (!token.ok()) return fail(token.status());
    hopts.token = *token;
  }
  if (!on_unix && !http::IsLoopbackHost(hopts.server.host)) {
    LOG_WARNING << "listening on " << hopts.server.host
                << ", which is not a loopback address: anyone who can reach "
                << "this machine can use the API" << (hopts.token.empty() ? "; set server.token_file" : "");
  }
  serving::HttpApi http(&registry, &metrics, hopts);
  if (Status s = http.Bind(); !s.ok()) return fail(s);
  // The gRPC API, when asked for: the same limits, token and calls.
  std::unique_ptr<serving::GrpcApi> grpc;
  if (!config.grpc_listen.empty()) {
    serving::GrpcOptions gopts;
    std::string host;
    int port = 0;
    if (Status s = ParseListen(config.grpc_listen, &host, &port, /*unix_ok=*/false); !s.ok()) return fail(s);
    gopts.server.host = host;
    gopts.server.port = port;
    gopts.server.max_connections_per_address = hopts.server.max_connections_per_address;
    gopts.server.max_message_bytes = hopts.server.limits.max_body_bytes;
    gopts.server.max_metadata_bytes = static_cast<int>(hopts.server.limits.max_header_bytes);
    gopts.server.drain_timeout_s = hopts.server.drain_timeout_s;
    gopts.threads = hopts.server.threads;
    gopts.token = hopts.token;
    gopts.token_for_all = hopts.token_for_all;
    gopts.ready_needs_resident = hopts.ready_needs_resident;
    if (!http::IsLoopbackHost(host)) {
      LOG_WARNING << "the gRPC API listens on " << host << ", which is not a loopback address: anyone who "
                  << "can reach this machine can use it"
                  << (gopts.token.empty() ? "; set server.token_file" : "");
    }
    grpc = std::make_unique<serving::GrpcApi>(&registry, &metrics, gopts);
    if (Status s = grpc->Bind(); !s.ok()) return fail(s);
  }
  control::ModelCommands commands({.store_dir = config.store_path}, &reconciler, &registry, &timers);
  RepositoryCommands repository;
  repository.commands = &commands;
  repository.async.data = &repository;
  uv_async_init(&loop, &repository.async, RepositoryCommands::Run);
  serving::ModelControl control = [&repository, &single, single_model](const std::string& name, bool enable,
                                                                       std::function<void(Status)> done) {
    // The folder's model is the whole of what this daemon is for: unloaded,
    // the pod would be ready for nothing; another model is not served.
    if (single_model) {
      return done(FailedPrecondition("this daemon serves " + single.model_name + " from --model-dir " +
                                     single.model_dir + " alone (single-model mode): no model is " +
                                     (enable ? "loaded" : "unloaded") + " through the repository"));
    }
    repository.Post({name, enable, std::move(done)});
  };
  http.OnRepositoryCommand(control);
  if (grpc) grpc->OnRepositoryCommand(control);

  control::StoreWatch watch(store->get(), &timers, [&reconciler] {
    LOG_DEBUG << "store changed; reconciling";
    if (Status s = reconciler.Reconcile(); !s.ok()) LOG_ERROR << "reconcile: " << s.message();
  });
  ServiceStatus status;
  status.manager = &service;
  status.registry = &registry;
  status.timer.data = &status;
  uv_timer_init(&loop, &status.timer);
  Reload reload;
  reload.load = std::move(reload_config);
  reload.current = config;
  reload.single_model = single_model;
  reload.current_token = hopts.token;
  reload.hw = hw;
  reload.http = &http;
  reload.grpc = grpc.get();
  reload.builder = &builder;
  reload.reconciler = &reconciler;
  reload.residency = &residency;
  reload.manager = &service;
  reload.store = store->get();
  reload.sighup.data = &reload;
  uv_signal_init(&loop, &reload.sighup);
  uv_signal_start(&reload.sighup, Reload::OnSignal, SIGHUP);
  Shutdown shutdown;
  shutdown.reload = &reload;
  shutdown.repository = &repository;
  shutdown.status = &status;
  shutdown.timers = &timers;
  shutdown.watch = &watch;
  shutdown.http = &http;
  shutdown.grpc = grpc.get();
  shutdown.builder = &builder;
  shutdown.reconciler = &reconciler;
  shutdown.residency = &residency;
  shutdown.loader = &loader;
  uv_signal_init(&loop, &shutdown.sigterm);
  uv_signal_init(&loop, &shutdown.sigint);
  shutdown.sigterm.data = shutdown.sigint.data = &shutdown;
  uv_signal_start(&shutdown.sigterm, OnSignal, SIGTERM);
  uv_signal_start(&shutdown.sigint, OnSignal, SIGINT);
  if (single_model) {
    status.single_model = single.model_name;
    status.single_model_failed = [&shutdown](const std::string& why) {
      if (shutdown.started) return;
      LOG_ERROR << "single-model mode: " << why
                << "; stopping (exit code 1) so that it is seen and restarted";
      shutdown.exit_code = 1;
      BeginShutdown(&shutdown);
    };
  }

  // The first reconcile publishes every model's state before HTTP answers
  // anything, so an early request gets 503 "building", never 404.
  watch.Start(&loop);
  if (Status s = reconciler.Reconcile(); !s.ok()) LOG_ERROR << "reconcile: " << s.message();
  RecordDaemonEvent(
      store->get(), "daemon_started",
      "aotid " AOTID_VERSION " (pid " + std::to_string(::getpid()) + ") serving on " + http.Address());
  LOG_INFO << "serving on " << http.Address();
  AnnounceAddress(*lock, http.Address());
  std::thread http_thread([&http] { http.Serve(); });
  std::thread grpc_thread;
  if (grpc) {
    LOG_INFO << "gRPC serving on " << grpc->Address();
    grpc_thread = std::thread([&grpc] { grpc->Serve(); });
  }
  // The socket listens already, so a client that connects now is answered:
  // ready for the service manager (models may still be building; their
  // state is in STATUS= and /v2/health/ready).
  // Registries to follow ([[sync]]): synced at once, then on their timers,
  // on a thread of their own; what they add reaches the reconciler through
  // the store watch like any other commit.
  sync::Syncer syncer(config.sync, sync::StoreSync(config.store_path),
                      config.store_path + "/sync-status.json");
  reload.syncer = &syncer;
  metrics.SetCollector([&syncer](std::string* out) { AppendSyncMetrics(syncer.Status(), out); });
  if (!config.sync.empty()) {
    LOG_INFO << "following " << config.sync.size() << " registr" << (config.sync.size() == 1 ? "y" : "ies")
             << " ([[sync]])";
  }
  status.last = StatusLine(registry);
  service.Notify("READY=1\nSTATUS=" + status.last + "\nMAINPID=" + std::to_string(::getpid()) + "\n");
  int64_t every = service.watchdog_ping_ms() > 0 ? std::min<int64_t>(1000, service.watchdog_ping_ms()) : 1000;
  uv_timer_start(&status.timer, ServiceStatus::Tick, static_cast<uint64_t>(every),
                 static_cast<uint64_t>(every));

  uv_run(&loop, UV_RUN_DEFAULT);
  http_thread.join();
  if (grpc_thread.joinable()) grpc_thread.join();
  metrics.SetCollector(nullptr);  // the syncer goes before the metrics
  uv_loop_close(&loop);
  RecordDaemonEvent(store->get(), "daemon_stopped", "stopped (pid " + std::to_string(::getpid()) + ")");
  LOG_INFO << "stopped";
  ::close(*lock);
  return shutdown.exit_code;
}

}  // namespace aotid::daemon
