#include "daemon/cli.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "base/fs.h"
#include "base/json.h"
#include "base/log.h"
#include "base/shell.h"
#include "compile/aoti_build.h"
#include "compile/build_cache.h"
#include "compile/cache_policy.h"
#include "compile/package_build.h"
#include "control/store_watch.h"
#include "daemon/api_client.h"
#include "daemon/config.h"
#include "daemon/daemon_lock.h"
#include "daemon/doctor.h"
#include "daemon/serve.h"
#include "daemon/service.h"
#include "package/aoti_metadata.h"
#include "package/package.h"
#include "platform/confined_command.h"
#include "platform/device_probe.h"
#include "platform/hardware.h"
#include "platform/install_layout.h"
#include "runner/runner_main.h"
#include "runner/sandbox.h"
#include "runtime/torch_plugin.h"
#include "serving/embeddings.h"
#include "serving/generate.h"
#include "serving/model_registry.h"
#include "storage/model_store.h"
#include "sync/model_sync.h"
#include "sync/registry.h"

namespace aotid::daemon {
namespace {

using json = nlohmann::json;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return 0;
    case StatusCode::kNotFound: return 3;
    case StatusCode::kAlreadyExists: return 4;
    case StatusCode::kInvalidArgument: return 5;
    default: return kExitFailure;
  }
}

int Fail(const std::string& command, const Status& s) {
  std::cerr << "aotid " << command << ": " << s.message() << "\n";
  return ExitCodeFor(s);
}

// A bad config file or flag: reported like any failure, exit code 2.
int FailUsage(const std::string& command, const Status& s) {
  Fail(command, s);
  return kExitUsage;
}

struct GlobalFlags {
  std::string config;
  std::string store;
  std::string cache_dir;
};

StatusOr<Config> Resolve(const GlobalFlags& g) {
  ASSIGN_OR_RETURN(Config c, LoadConfig(g.config));
  // From the root: the builds' workers and compilers run in folders of
  // their own, where a relative store would name another place.
  if (!g.store.empty()) c.store_path = fs::Absolute(g.store);
  if (!g.cache_dir.empty()) c.cache_dir = fs::Absolute(fs::ExpandHome(g.cache_dir));
  return c;
}

std::string HumanSize(int64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// 2026-12-02T16:06:04.123Z
std::string Timestamp(int64_t ms) { return storage::FormatTimestamp(ms); }

std::string Ref(const std::string& name, int64_t version) {
  return version > 0 ? name + ":" + std::to_string(version) : name;
}

// Stores are opened for reading without being created: a typo in --store
// must not leave an empty store behind.
StatusOr<std::unique_ptr<storage::ModelStore>> OpenExisting(const Config& cfg) {
  auto store = storage::ModelStore::Open(cfg.store_path, /*create=*/false);
  if (!store.ok() && store.status().code() == StatusCode::kNotFound) {
    return NotFound("no aotid store at " + cfg.store_path + " (add a model first, or check --store)");
  }
  return store;
}

// `show --json`: every setting under its key, typed as the table says.
json SettingsJson(const storage::VersionSettings& s) {
  json out = json::object();
  for (const auto& f : storage::VersionSettingFields()) {
    json& value = out[std::string(f.key)];
    switch (f.type) {
      case storage::SettingType::kChoice: value = s.*f.text; break;
      case storage::SettingType::kBool: value = s.*f.flag; break;
      case storage::SettingType::kInt: value = s.*f.number; break;
      case storage::SettingType::kDuration: value = f.Text(s); break;  // "5m", "always", "default"
      case storage::SettingType::kOptions:
        value = (s.*f.text).empty() ? json::object() : ParseJsonOrDiscarded(s.*f.text);
        break;
    }
  }
  return out;
}

// A build the store says is queued or running while no daemon runs on the
// store: it was interrupted (a killed daemon), and the next `aotid serve`
// builds it again. Shown so, not as a build that is still going.
constexpr char kInterrupted[] = "interrupted";
bool Interrupted(const storage::BuildRecord& b, bool daemon_running) {
  return !daemon_running &&
         (b.state == storage::BuildState::kQueued || b.state == storage::BuildState::kBuilding);
}

// The build's log: a finished build's in its cache entry, a failed one's
// beside it; "" when there is none (yet).
std::string BuildLogPath(const compile::BuildCache& cache, const storage::BuildRecord& b) {
  compile::BuildKey key{b.artifact, b.package_model, b.device, b.fingerprint, b.options};
  std::string path = b.state == storage::BuildState::kReady    ? cache.EntryDir(key) + "/build.log"
                     : b.state == storage::BuildState::kFailed ? cache.FailedLogPath(key)
                                                               : "";
  return !path.empty() && fs::Exists(path) ? path : "";
}

// The inputs and outputs of the build that serves a version here, from its
// spec.json ({} when there is none yet).
json Interface(const compile::BuildCache& cache, const std::vector<storage::BuildRecord>& builds,
               const storage::ModelVersion& v, const std::string& fp);

// A tensor's shape as `show` prints it: fixed dims as numbers, dynamic
// ones as SYMBOL:MIN..MAX (one symbol in two places is one size).
std::string ShapeText(const json& t) {
  std::string out = "[";
  const json& shape = t.value("shape", json::array());
  const json& dims = t.value("dims", json::array());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    const json& d = i < dims.size() ? dims[i] : json();
    if (shape[i].is_number_integer() && shape[i].get<int64_t>() >= 0) {
      out += std::to_string(shape[i].get<int64_t>());
    } else if (d.is_object()) {
      // No max recorded: unbounded ("seq:1..").
      out += d.value("symbol", std::string("?")) + ":" + std::to_string(d.value("min", int64_t{0})) + ".." +
             (d.contains("max") ? std::to_string(d.value("max", int64_t{0})) : std::string());
    } else {
      out += "-1";
    }
  }
  return out + "]";
}

json BuildJson(const storage::BuildRecord& b, bool daemon_running, const compile::BuildCache& cache) {
  bool interrupted = Interrupted(b, daemon_running);
  // Auto threads as timed on this machine and recorded with the build, one
  // record per timing key (machine, most threads, batch).
  json threads = json::array();
  if (b.state == storage::BuildState::kReady) {
    for (const auto& r : cache.ListThreads(
             cache.EntryDir({b.artifact, b.package_model, b.device, b.fingerprint, b.options}))) {
      threads.push_back({{"key", r.key},
                         {"threads", r.threads},
                         {"note", r.note},
                         {"timed_at", Timestamp(r.at_ms)},
                         {"settled", r.settled}});
    }
  }
  return {{"log", BuildLogPath(cache, b)},
          {"threads", threads},
          {"fingerprint", b.fingerprint},
          {"device", b.device},
          {"inductor_options", b.options.empty() ? json::object() : ParseJsonOrDiscarded(b.options)},
          {"state", interrupted ? std::string(kInterrupted) : std::string(storage::BuildStateName(b.state))},
          {"progress", interrupted ? std::string() : b.progress},
          {"attempts", b.attempts},
          {"error",
           interrupted ? "no daemon runs on this store; the next `aotid serve` builds it again" : b.error},
          {"started_at", Timestamp(b.started_at_ms)},
          {"finished_at", Timestamp(b.finished_at_ms)}};
}

// The build that serves a version on this machine, as far as the store
// tells: a ready one first (a CPU fallback beside a failed device build),
// then one in progress, then the latest that failed or was cancelled.
std::optional<storage::BuildRecord> BuildHere(const std::vector<storage::BuildRecord>& builds,
                                              const storage::ModelVersion& v, const std::string& fp) {
  std::optional<storage::BuildRecord> best;
  auto rank = [](storage::BuildState s) {
    return s == storage::BuildState::kReady                                            ? 3
           : s == storage::BuildState::kFailed || s == storage::BuildState::kCancelled ? 1
                                                                                       : 2;
  };
  for (const auto& b : builds) {
    if (b.fingerprint != fp || b.package_model != v.package_model ||
        b.options != v.settings.inductor_options) {
      continue;
    }
    // Without fallback, only a build for the device asked for serves it.
    if (!v.settings.fallback_cpu && v.settings.device != "auto" && b.device != v.settings.device) continue;
    if (!best || rank(b.state) > rank(best->state) ||
        (rank(b.state) == rank(best->state) && b.started_at_ms > best->started_at_ms)) {
      best = b;
    }
  }
  return best;
}

json Interface(const compile::BuildCache& cache, const std::vector<storage::BuildRecord>& builds,
               const storage::ModelVersion& v, const std::string& fp) {
  auto b = BuildHere(builds, v, fp);
  if (!b || b->state != storage::BuildState::kReady) return json::object();
  compile::BuildKey key{b->artifact, b->package_model, b->device, b->fingerprint, b->options};
  auto text = fs::ReadFile(cache.EntryDir(key) + "/spec.json");
  json spec = text.ok() ? ParseJsonOrDiscarded(*text) : json();
  return spec.is_object() ? spec : json::object();
}

json EventJson(const storage::Event& e) {
  return {{"id", e.id},           {"at", Timestamp(e.at_ms)}, {"model", e.model},
          {"version", e.version}, {"kind", e.kind},           {"message", e.message}};
}

void PrintEvent(const storage::Event& e, bool as_json) {
  if (as_json) {
    std::cout << EventJson(e).dump() << "\n";
  } else {
    std::printf("%s  %-16s %-15s %s\n", Timestamp(e.at_ms).c_str(), Ref(e.model, e.version).c_str(),
                e.kind.c_str(), e.message.c_str());
  }
  std::fflush(stdout);
}

// A package's metadata for `show`: the author's (from the blob), and
// AOTInductor's: from the blob for a compiled package, from this machine's
// build for an exported program (none before it is built).
json PackageMetadata(storage::ModelStore& store, const std::string& cache_dir, const storage::ModelVersion& v,
                     const std::vector<storage::BuildRecord>& builds, const std::string& fp) {
  json out{{"author", json::object()}, {"aoti", json::object()}, {"inductor_options", json::object()}};
  std::string blob = store.BlobPath(v.artifact);
  if (auto record = package::ReadPackageRecord(blob); record.ok()) {
    out["author"] = ParseJsonOrDiscarded(record->author_metadata);
    out["inductor_options"] = ParseJsonOrDiscarded(record->package_options);
  }
  if (v.kind != package::PackageKind::kExportedProgram) {
    if (auto md = package::ReadAotiMetadata(blob, v.package_model); md.ok())
      out["aoti"] = ParseJsonOrDiscarded(md->json);
    return out;
  }
  auto b = BuildHere(builds, v, fp);
  if (!b || b->state != storage::BuildState::kReady) return out;
  compile::BuildCache cache(cache_dir);
  auto entry = cache.Lookup({v.artifact, v.package_model, b->device, fp, b->options});
  if (entry.ok()) {
    json p = ParseJsonOrDiscarded(entry->package_json);
    if (p.is_object() && p.contains("aoti")) out["aoti"] = p["aoti"];
  }
  return out;
}

// What a version is for, for `show`, from its package in the store (built
// or not, the package says it; a build's generate.json or embed.json is the
// same section with the same tokenizer): {"task"} in `ls`'s words, and
// "generates" or "embeds" as GET /v2/models/NAME has them, "weights" where
// the package lists them. {} when the blob cannot be read.
json Purpose(storage::ModelStore& store, const storage::ModelVersion& v) {
  auto archive = package::Archive::Open(store.BlobPath(v.artifact));
  if (!archive.ok()) return json::object();
  auto record = package::ReadExportRecord(*archive, v.package_model);
  json out{{"task", std::string(serving::TaskWords(record.ok() ? record->task : ""))}};
  if (std::string weights = package::WeightsKind(*archive, v.package_model); !weights.empty())
    out["weights"] = weights;
  if (!record.ok() || record->task.empty()) return out;
  auto text = package::ReadTaskSpec(*archive, v.package_model);
  Status why = text.status();
  if (text.ok() && record->task == "generate") {
    auto spec = text::GenerateSpec::FromJson(*text);
    if (spec.ok()) out["generates"] = serving::DescribeGenerate(*spec);
    why = spec.status();
  } else if (text.ok()) {
    auto spec = serving::EmbedSpec::FromJson(*text);
    if (spec.ok()) out["embeds"] = serving::DescribeEmbed(*spec);
    why = spec.status();
  }
  if (!why.ok()) out["task_error"] = why.message();  // the build fails the same way
  return out;
}

// `show`'s lines for Purpose().
void PrintPurpose(const json& p) {
  if (p.contains("task")) std::printf("  task            %s\n", p["task"].get<std::string>().c_str());
  if (p.contains("task_error"))
    std::printf("  task error      %s\n", p["task_error"].get<std::string>().c_str());
  auto token = [](const json& t) {
    return std::to_string(t["id"].get<int64_t>()) + (t.contains("text") ? " " + t["text"].dump() : "");
  };
  if (const json& g = p.value("generates", json()); g.is_object()) {
    std::printf("  context         %lld tokens, prompt and answer (a call takes up to %lld)\n",
                static_cast<long long>(g["context_length"].get<int64_t>()),
                static_cast<long long>(g["max_prefill"].get<int64_t>()));
    std::string ends;
    for (const auto& t : g["end_tokens"]) ends += (ends.empty() ? "" : ", ") + token(t);
    std::printf("  end tokens      %s\n", ends.empty() ? "none" : ends.c_str());
    if (g.contains("begin_token")) std::printf("  begin token     %s\n", token(g["begin_token"]).c_str());
    std::printf("  chat template   %s\n", g["chat_template"].get<bool>() ? "yes (takes messages)" : "none");
    const int64_t n = g.value("max_sequences", int64_t{1});
    std::string cache;
    if (const int64_t per = g.value("cache_bytes_per_sequence", int64_t{0}); per > 0) {
      char b[96];
      std::snprintf(b, sizeof b, "; its cache %.1f MB a sequence, %.1f MB in all", per / 1e6,
                    static_cast<double>(per) * static_cast<double>(n) / 1e6);
      cache = b;
    }
    std::printf("  sequences       %lld at once%s\n", static_cast<long long>(n), cache.c_str());
  }
  if (const json& e = p.value("embeds", json()); e.is_object()) {
    std::printf("  embeddings      %lld dimensions%s, %s pooling%s, texts cut at %lld tokens\n",
                static_cast<long long>(e["dimensions"].get<int64_t>()),
                e["truncatable"].get<bool>() ? " (fewer on request)" : "",
                e["pooling"].get<std::string>().c_str(), e["normalized"].get<bool>() ? ", unit length" : "",
                static_cast<long long>(e["max_tokens"].get<int64_t>()));
  }
  if (p.contains("weights")) std::printf("  weights         %s\n", p["weights"].get<std::string>().c_str());
}

// `--inductor`: an options setting's flag is its prefix without the dot.
std::string_view OptionsFlag(const storage::SettingField& f) {
  return f.prefix.substr(0, f.prefix.size() - 1);
}

// `aotid add`'s flag for one setting, its default shown: --num-runners N,
// --fallback-cpu and --no-fallback-cpu, and for options a repeatable
// --inductor KEY=VALUE collected into *assignments.
void AddSettingFlag(CLI::App* add, const storage::SettingField& f, storage::VersionSettings* s,
                    std::vector<std::string>* assignments) {
  std::string name(f.key);
  std::replace(name.begin(), name.end(), '_', '-');
  std::string help(f.help);
  switch (f.type) {
    case storage::SettingType::kChoice: {
      std::string choices;  // "auto, cpu, mps or cuda"
      for (size_t i = 0; i < f.choices.size(); ++i) {
        choices += (i == 0 ? "" : i + 1 == f.choices.size() ? " or " : ", ") + std::string(f.choices[i]);
      }
      add->add_option("--" + name, s->*f.text, help + ": " + choices)->capture_default_str();
      break;
    }
    case storage::SettingType::kBool: {
      // Two flags of their own: CLI11's "--x,!--no-x" prints "{false}"
      // beside them, which reads as the default.
      bool on = s->*f.flag;
      add->add_flag_callback(
          "--" + name, [s, field = f.flag] { s->*field = true; },
          help + (on ? " (default: on)" : " (default: off)"));
      add->add_flag_callback(
          "--no-" + name, [s, field = f.flag] { s->*field = false; }, "Turn --" + name + " off");
      break;
    }
    case storage::SettingType::kInt:
      add->add_option("--" + name, s->*f.number, help)->capture_default_str();
      break;
    case storage::SettingType::kDuration:
      // Taken as `aotid set` takes it: 5m, always, default.
      add->add_option_function<std::string>(
             "--" + name,
             [s, key = f.key, name](const std::string& text) {
               Status st = storage::ApplySetting(s, key, text);
               if (!st.ok()) throw CLI::ValidationError("--" + name, st.message());
             },
             help)
          ->type_name("DURATION")
          ->default_str(f.Text(*s));
      break;
    case storage::SettingType::kOptions:
      add->add_option("--" + std::string(OptionsFlag(f)), *assignments, help + "; KEY=VALUE, repeatable");
      break;
  }
}

// Inductor options are checked against the torch that will build them,
// before they are stored: an unknown option, or a value of the wrong type,
// is refused now instead of failing a build minutes later. When that Python
// cannot be run here, the build checks them.
Status CheckInductorOptions(const Config& config, const std::string& options_json) {
  if (options_json.empty() || options_json == "{}") return Status::OK();
  // Its stderr into what RunShell reads (RunShell drops the group's own).
  std::string cmd = "{ PYTHONPATH=" + ShellQuote(config.worker_dir) + " " + ShellQuote(config.python) +
                    " -m aotid_worker.compile --check-options " + ShellQuote(options_json) + " 2>&1; }";
  auto [rc, out] = RunShell(cmd);
  // torch may print warnings first: the reason is the line after "error: ".
  if (size_t at = out.rfind("error: "); rc == 2 && at != std::string::npos) {
    std::string why = out.substr(at + 7);
    return InvalidArgument(why.substr(0, why.find('\n')));
  }
  if (rc != 0) {
    std::cerr << "warning: the inductor options were not checked (" << config.python
              << " could not check them); the build will\n";
  }
  return Status::OK();
}

int CmdAdd(const GlobalFlags& g, const storage::AddRequest& req) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("add", cfg.status());
  // Check everything about the request before the store is created or opened.
  auto plan = storage::ModelStore::CheckAddRequest(req);
  if (!plan.ok()) return Fail("add", plan.status());
  if (Status s = CheckInductorOptions(*cfg, req.settings.inductor_options); !s.ok()) return Fail("add", s);
  auto store = storage::ModelStore::Open(cfg->store_path, /*create=*/true);
  if (!store.ok()) return Fail("add", store.status());
  auto added = (*store)->Add(req);
  if (!added.ok()) return Fail("add", added.status());
  std::cout << "added " << added->model << ":" << added->version << " ("
            << package::PackageKindName(added->kind) << ", sha256:" << added->artifact.substr(0, 12) << ", "
            << HumanSize(added->size) << ") to " << cfg->store_path << "\n";
  // The same file again is a new version, but say so: it is often a slip.
  if (auto versions = (*store)->ListVersions(); versions.ok()) {
    std::string same;
    for (const auto& v : *versions) {
      if (v.artifact == added->artifact && !(v.model == added->model && v.version == added->version)) {
        same += (same.empty() ? "" : ", ") + v.model + ":" + std::to_string(v.version);
      }
    }
    if (!same.empty()) std::cout << "note: the same file as " << same << " (stored once)\n";
  }
  if (plan->kind != package::PackageKind::kExportedProgram) {
    // The store may feed other machines, so the package is kept; say now
    // whether this one can run it.
    auto md = package::ReadAotiMetadata(req.file, plan->package_model);
    platform::HardwareInfo hw = platform::ProbeHardware(cfg->cxx);
    Status fits = md.ok() ? Status::OK() : md.status();
    if (fits.ok() && md->device_key != "cpu") {
      (void)platform::ProbeDevices(
          platform::DeviceProbeForCache(cfg->CachePath(), cfg->python, cfg->worker_dir), &hw);
    }
    if (fits.ok()) fits = compile::CheckPackageDevice(*md, hw);
    if (fits.ok()) fits = compile::CheckFitsMachine(*md, hw);
    if (!fits.ok()) std::cout << "warning: this machine cannot serve it: " << fits.message() << "\n";
  }
  return 0;
}

// What the daemon on this store serves, by "name:version": its state in
// the repository index ("READY", "LOADING", "UNAVAILABLE"). Empty when no
// daemon runs or it does not answer.
std::map<std::string, std::string> ServedStates(const Config& config) {
  std::map<std::string, std::string> out;
  auto d = FindDaemon(config.store_path);
  if (!d || d->address.empty()) return out;
  http::ServerOptions where;
  std::string address = d->address;
  if (address.rfind("http://", 0) == 0) address = address.substr(7);
  if (!SetListen(address, &where).ok()) return out;
  HttpAnswer a =
      ApiCall(where, "POST", "/v2/repository/index", ReadTokenQuietly(config.token_file), 3000, "{}");
  json index = a.status == 200 ? ParseJsonOrDiscarded(a.body) : json();
  if (!index.is_array()) return out;
  for (const auto& e : index) {
    if (e.is_object() && e.contains("name") && e.contains("version") && e.contains("state")) {
      out[e["name"].get<std::string>() + ":" + e["version"].get<std::string>()] =
          e["state"].get<std::string>();
    }
  }
  return out;
}

// "212 MiB", "1.4 GiB": memory as `ps` shows it.
std::string HumanBytes(uint64_t bytes) {
  char out[32];
  if (bytes >= (uint64_t{10} << 30)) {
    std::snprintf(out, sizeof out, "%.0f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(out, sizeof out, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  } else {
    std::snprintf(out, sizeof out, "%llu MiB", static_cast<unsigned long long>((bytes + (1 << 19)) >> 20));
  }
  return out;
}

// "45s", "4m48s", "2h3m": a span as `ps` shows it.
std::string HumanSpan(int64_t ms) {
  int64_t s = (ms + 500) / 1000;
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m" + (s % 60 ? std::to_string(s % 60) + "s" : "");
  return std::to_string(s / 3600) + "h" + (s % 3600 / 60 ? std::to_string(s % 3600 / 60) + "m" : "");
}

// `aotid ps`: what the daemon on this store holds in memory now, from
// GET /v2/resident.
int CmdPs(const GlobalFlags& g, bool all, bool as_json) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("ps", cfg.status());
  auto d = FindDaemon(cfg->store_path);
  if (!d || d->address.empty())
    return Fail("ps", Unavailable("no daemon serves the store at " + cfg->store_path + " (aotid serve)"));
  http::ServerOptions where;
  std::string address = d->address;
  if (address.rfind("http://", 0) == 0) address = address.substr(7);
  if (Status s = SetListen(address, &where); !s.ok()) return Fail("ps", s);
  HttpAnswer a = ApiCall(where, "GET", "/v2/resident", ReadTokenQuietly(cfg->token_file), 3000);
  if (a.status != 200) {
    std::string why = a.status == 0 ? a.error : "HTTP " + std::to_string(a.status) + ": " + a.body;
    return Fail("ps", Unavailable("the daemon at " + d->address + " did not answer: " + why));
  }
  json r = ParseJsonOrDiscarded(a.body);
  if (!r.is_object() || !r.contains("models") || !r["models"].is_array())
    return Fail("ps", Internal("the daemon's answer is not a residency report: " + a.body.substr(0, 200)));
  if (as_json) {
    std::cout << r.dump(2) << "\n";
    return 0;
  }
  const uint64_t budget = r.value("budget_bytes", uint64_t{0});
  // What versions count for against the budget (their learned sizes:
  // what admits a load), and what their runners measure now.
  std::cout << "memory: " << HumanBytes(r.value("used_bytes", uint64_t{0})) << " counted";
  if (budget > 0)
    std::cout << " of a budget of " << HumanBytes(budget) << " (" << r.value("budget_source", "") << ")";
  std::cout << ", " << HumanBytes(r.value("measured_bytes", uint64_t{0})) << " measured now; pressure "
            << r.value("pressure", "unknown") << "\n";
  std::printf("%-28s %-18s %-7s %-8s %-8s %-10s %-9s %s\n", "NAME", "STATE", "RUNNERS", "MEMORY", "SIZE",
              "LAST USED", "UNLOAD IN", "IN FLIGHT");
  int shown = 0;
  for (const auto& m : r["models"]) {
    if (!m.is_object()) continue;
    const std::string state = m.value("state", "");
    if (!all && state == "not resident") continue;
    ++shown;
    const int64_t idle = m.value("idle_ms", int64_t{-1});
    const int64_t unload_in = m.value("unload_in_ms", int64_t{-1});
    const std::string keep = m.value("keep_alive", "");
    std::string last = idle >= 0 ? HumanSpan(idle) + " ago" : m.value("in_flight", 0) > 0 ? "now" : "never";
    std::string when = unload_in >= 0                            ? HumanSpan(unload_in)
                       : state == "resident" && keep == "always" ? "never"
                                                                 : "-";
    const uint64_t bytes = m.value("bytes", uint64_t{0});
    const uint64_t size = m.value("size_bytes", uint64_t{0});
    std::printf("%-28s %-18s %-7d %-8s %-8s %-10s %-9s %d\n",
                (m.value("name", "") + ":" + m.value("version", "")).c_str(), state.c_str(),
                m.value("runners", 0), bytes ? HumanBytes(bytes).c_str() : "-",
                (HumanBytes(size) + (m.value("size_measured", false) ? "" : "?")).c_str(), last.c_str(),
                when.c_str(), m.value("in_flight", 0));
  }
  if (shown == 0)
    std::cout << (all ? "no model versions are served\n"
                      : "nothing is resident (aotid ps --all lists every version)\n");
  return 0;
}

int CmdLs(const GlobalFlags& g, bool as_json) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("ls", cfg.status());
  auto store = storage::ModelStore::Open(cfg->store_path, /*create=*/false);
  if (!store.ok()) {
    if (store.status().code() == StatusCode::kNotFound) {
      if (as_json) {
        std::cout << "[]\n";
      } else {
        std::cout << "no models (no store at " << cfg->store_path << ")\n";
      }
      return 0;
    }
    return Fail("ls", store.status());
  }
  bool daemon_running = FindDaemon(cfg->store_path).has_value();
  auto models = (*store)->ListModels();
  if (!models.ok()) return Fail("ls", models.status());
  std::string fp = platform::Fingerprint(platform::ProbeHardware(cfg->cxx));
  // Served and built are told apart: a version whose newest build failed
  // may still answer with the build it had.
  std::map<std::string, std::string> served =
      daemon_running ? ServedStates(*cfg) : std::map<std::string, std::string>{};
  json out = json::array();
  if (!as_json) {
    std::printf("%-24s %-8s %-15s %-9s %-8s %-9s %-7s %-10s %s\n", "NAME", "VERSION", "TASK", "POLICY",
                "SERVING", "BUILD", "DEVICE", "SIZE", "ARTIFACT");
  }
  for (const auto& m : *models) {
    std::set<int64_t> want = storage::WantedVersions(m);
    for (const auto& v : m.versions) {
      auto builds = (*store)->ListBuilds(v.artifact);
      if (!builds.ok()) return Fail("ls", builds.status());
      auto b = BuildHere(*builds, v, fp);
      std::string state = "none", device = v.settings.device, progress;
      if (b) {
        state = std::string(storage::BuildStateName(b->state));
        device = b->device;
        progress = b->state == storage::BuildState::kBuilding ? b->progress : "";
        if (Interrupted(*b, daemon_running)) {
          state = kInterrupted;
          progress.clear();
        }
      }
      bool wanted = want.count(v.version) > 0;
      std::string policy = !m.enabled ? "off" : wanted ? "serve" : "-";
      // From the package's record: the directory and one small entry of
      // the blob, no tokenizer read ("?" when the blob is gone).
      auto record = package::ReadPackageRecord((*store)->BlobPath(v.artifact), v.package_model);
      std::string task = record.ok() ? std::string(serving::TaskWords(record->task)) : "?";
      auto it = served.find(v.model + ":" + std::to_string(v.version));
      // "-" when no daemon answers: nothing here can say.
      std::string serving = served.empty() ? "-" : it != served.end() && it->second == "READY" ? "yes" : "no";
      if (as_json) {
        out.push_back({{"name", v.model},
                       {"version", v.version},
                       {"served_by_policy", wanted},
                       {"version_policy", storage::FormatVersionPolicy(m.policy)},
                       {"enabled", m.enabled},
                       {"task", record.ok() ? json(task) : json(nullptr)},
                       {"serving", served.empty() ? json(nullptr) : json(serving == "yes")},
                       {"build", state},
                       {"build_progress", progress},
                       {"device", device},
                       {"size", v.size},
                       {"artifact", v.artifact}});
        continue;
      }
      std::printf("%-24s %-8lld %-15s %-9s %-8s %-9s %-7s %-10s sha256:%s%s\n", v.model.c_str(),
                  static_cast<long long>(v.version), task.c_str(), policy.c_str(), serving.c_str(),
                  state.c_str(), device.c_str(), HumanSize(v.size).c_str(), v.artifact.substr(0, 12).c_str(),
                  progress.empty() ? "" : ("  " + progress).c_str());
    }
  }
  if (as_json) std::cout << out.dump(2) << "\n";
  return 0;
}

int CmdShow(const GlobalFlags& g, const std::string& ref, bool as_json, int n_events) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("show", cfg.status());
  std::string name;
  std::optional<int64_t> version;
  if (Status s = storage::ParseModelRef(ref, &name, &version); !s.ok()) return Fail("show", s);
  auto store = OpenExisting(*cfg);
  if (!store.ok()) return Fail("show", store.status());
  auto model = (*store)->GetModel(name);
  if (!model.ok()) return Fail("show", model.status());
  std::vector<const storage::ModelVersion*> shown;
  std::string all_versions;
  for (const auto& v : model->versions) {
    all_versions += (all_versions.empty() ? "" : ", ") + std::to_string(v.version);
    if (!version || v.version == *version) shown.push_back(&v);
  }
  if (version && shown.empty()) {
    return Fail("show", NotFound("model '" + name + "' has no version " + std::to_string(*version) +
                                 " (versions: " + all_versions + ")"));
  }
  std::string fp = platform::Fingerprint(platform::ProbeHardware(cfg->cxx));
  auto events = (*store)->RecentEvents(n_events, name);
  if (!events.ok()) return Fail("show", events.status());

  bool daemon_running = FindDaemon(cfg->store_path).has_value();
  compile::BuildCache cache(cfg->CachePath());
  std::set<int64_t> want = storage::WantedVersions(*model);
  json j{{"name", name},
         {"version_policy", storage::FormatVersionPolicy(model->policy)},
         {"enabled", model->enabled},
         {"created_at", Timestamp(model->created_at_ms)},
         {"versions", json::array()},
         {"events", json::array()}};
  for (const auto* v : shown) {
    auto builds = (*store)->ListBuilds(v->artifact);
    if (!builds.ok()) return Fail("show", builds.status());
    json here = json::array(), elsewhere = json::array();
    for (const auto& b : *builds) {
      if (b.package_model != v->package_model) continue;
      (b.fingerprint == fp ? here : elsewhere).push_back(BuildJson(b, daemon_running, cache));
    }
    j["versions"].push_back({{"version", v->version},
                             {"served_by_policy", want.count(v->version) > 0},
                             {"artifact", v->artifact},
                             {"kind", package::PackageKindName(v->kind)},
                             {"package_model", v->package_model},
                             {"size", v->size},
                             {"blob_present", fs::Exists((*store)->BlobPath(v->artifact))},
                             {"created_at", Timestamp(v->created_at_ms)},
                             {"settings", SettingsJson(v->settings)},
                             {"builds", here},
                             {"builds_elsewhere", elsewhere},
                             {"interface", Interface(cache, *builds, *v, fp)},
                             {"package_metadata", PackageMetadata(**store, cache.root(), *v, *builds, fp)},
                             {"purpose", Purpose(**store, *v)}});
  }
  for (const auto& e : *events) {
    if (!version || e.version == *version || e.version == 0) j["events"].push_back(EventJson(e));
  }
  if (as_json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::printf("%s\n  version policy  %s\n  enabled         %s\n  versions        %s\n  created         %s\n",
              name.c_str(), storage::FormatVersionPolicy(model->policy).c_str(),
              model->enabled ? "true" : "false (served by no daemon; 'aotid set NAME enabled=true')",
              all_versions.c_str(), Timestamp(model->created_at_ms).c_str());
  std::printf("  this machine    %s\n", fp.c_str());
  for (size_t i = 0; i < shown.size(); ++i) {
    const json& v = j["versions"][i];
    std::printf("\n%s:%lld%s\n", name.c_str(), static_cast<long long>(v["version"].get<int64_t>()),
                v["served_by_policy"].get<bool>() ? "  (served by the version policy)" : "");
    std::printf("  artifact        sha256:%s (%s, %s)%s\n", v["artifact"].get<std::string>().c_str(),
                v["kind"].get<std::string>().c_str(), HumanSize(v["size"].get<int64_t>()).c_str(),
                v["blob_present"].get<bool>() ? "" : "  MISSING from blobs/");
    std::printf("  package model   %s\n  added           %s\n", v["package_model"].get<std::string>().c_str(),
                v["created_at"].get<std::string>().c_str());
    PrintPurpose(v["purpose"]);
    std::printf("  settings        %s\n", storage::DisplayText(shown[i]->settings).c_str());
    if (v["builds"].empty()) {
      std::printf("  build here      none yet (built when the daemon first serves it)\n");
    }
    for (const auto& b : v["builds"]) {
      std::string options = b["inductor_options"].empty() ? "" : " with " + b["inductor_options"].dump();
      std::printf(
          "  build here      %s on %s%s, started %s, finished %s%s\n", b["state"].get<std::string>().c_str(),
          b["device"].get<std::string>().c_str(), options.c_str(), b["started_at"].get<std::string>().c_str(),
          b["finished_at"].get<std::string>().c_str(),
          b["attempts"].get<int>() > 1 ? (", attempt " + std::to_string(b["attempts"].get<int>())).c_str()
                                       : "");
      if (!b["progress"].get<std::string>().empty() && b["state"] == "building") {
        std::printf("  build progress  %s\n", b["progress"].get<std::string>().c_str());
      }
      if (!b["error"].get<std::string>().empty()) {
        std::printf("  build error     %s\n", b["error"].get<std::string>().c_str());
      }
      if (!b["log"].get<std::string>().empty()) {
        std::printf("  build log       %s\n", b["log"].get<std::string>().c_str());
      }
      // The record of this version's batch (versions sharing a build may
      // batch differently), when its threads are auto.
      const storage::VersionSettings& set = shown[i]->settings;
      std::string batch = "; batch " + std::to_string(set.max_batch_size > 1 ? set.max_batch_size : 1);
      for (const auto& t : b["threads"]) {
        if (set.threads != 0 || !t["key"].get<std::string>().ends_with(batch)) continue;
        std::printf("  auto threads    %d per run, timed %s: %s%s\n", t["threads"].get<int>(),
                    t["timed_at"].get<std::string>().c_str(), t["note"].get<std::string>().c_str(),
                    t["settled"].get<bool>() ? "" : " [not settled]");
      }
    }
    for (const auto& o : v["builds_elsewhere"]) {
      std::printf("  built elsewhere %s: %s\n", o["fingerprint"].get<std::string>().c_str(),
                  o["state"].get<std::string>().c_str());
    }
    for (const char* side : {"inputs", "outputs"}) {
      for (const auto& t : v["interface"].value(side, json::array())) {
        std::printf("  %-15s %s %s %s\n", side == std::string("inputs") ? "input" : "output",
                    t.value("name", std::string("?")).c_str(), t.value("datatype", std::string("?")).c_str(),
                    ShapeText(t).c_str());
      }
    }
    const json& pm = v["package_metadata"];
    if (!pm["author"].empty()) std::printf("  author meta     %s\n", pm["author"].dump().c_str());
    if (!pm["aoti"].empty()) std::printf("  aoti meta       %s\n", pm["aoti"].dump().c_str());
    if (!pm["inductor_options"].empty()) {
      std::printf("  package asks    %s (under the owner's inductor.* settings)\n",
                  pm["inductor_options"].dump().c_str());
    }
  }
  if (!j["events"].empty()) {
    std::printf("\nrecent events\n");
    for (const auto& e : j["events"]) {
      std::printf("  %s  %-16s %-15s %s\n", e["at"].get<std::string>().c_str(),
                  Ref(name, e["version"].get<int64_t>()).c_str(), e["kind"].get<std::string>().c_str(),
                  e["message"].get<std::string>().c_str());
    }
  }
  return 0;
}

int CmdSet(const GlobalFlags& g, const std::string& ref, const std::vector<std::string>& assignments) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("set", cfg.status());
  std::string name;
  std::optional<int64_t> version;
  if (Status s = storage::ParseModelRef(ref, &name, &version); !s.ok()) return Fail("set", s);
  std::vector<std::pair<std::string, std::string>> kv;
  for (const auto& a : assignments) {
    size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Fail("set", InvalidArgument("'" + a + "' is not KEY=VALUE"));
    }
    kv.emplace_back(a.substr(0, eq), a.substr(eq + 1));
  }
  // The inductor options named here, alone, through the store's own parser.
  storage::VersionSettings named;
  named.inductor_options = "";
  for (const auto& [key, value] : kv) {
    if (key.rfind("inductor.", 0) == 0 && storage::ApplySetting(&named, key, value).ok()) continue;
  }
  if (Status s = CheckInductorOptions(*cfg, named.inductor_options); !s.ok()) return Fail("set", s);
  auto store = OpenExisting(*cfg);
  if (!store.ok()) return Fail("set", store.status());
  auto changes = (*store)->Set(name, version, kv);
  if (!changes.ok()) return Fail("set", changes.status());
  // Setting threads, even to what it was, asks for a new timing of auto
  // threads: the choice recorded with each build goes, and the daemon, told
  // by the event, loads the version again and times it.
  int forgotten = 0;
  if (std::any_of(kv.begin(), kv.end(), [](const auto& p) { return p.first == "threads"; })) {
    auto versions = (*store)->ListVersions();
    if (!versions.ok()) return Fail("set", versions.status());
    compile::BuildCache cache(cfg->CachePath());
    std::vector<compile::CacheListing> entries = cache.List();
    for (const auto& v : *versions) {
      if (v.model != name || (version && v.version != *version)) continue;
      // The version's builds: <cache>/<artifact>/<package model>.<device>...
      const std::string prefix = cache.root() + "/" + v.artifact + "/" + v.package_model + ".";
      for (const auto& e : entries) {
        if (e.dir.starts_with(prefix) && cache.ForgetThreads(e.dir)) ++forgotten;
      }
    }
    if (forgotten > 0) {
      (void)(*store)->AppendEvent(
          name, version.value_or(0), "threads_retime",
          "the recorded thread timing was removed by 'aotid set'; auto threads are timed "
          "again at the next load");
    }
  }
  if (changes->empty() && forgotten == 0)
    std::cout << "nothing changed: " << ref << " already has those settings\n";
  for (const auto& c : *changes) std::cout << "set " << c << "\n";
  if (forgotten > 0) {
    std::cout << "removed the recorded thread timing of " << forgotten << " build"
              << (forgotten == 1 ? "" : "s") << ": a daemon serving " << ref
              << " with threads=auto loads it again and times it\n";
  }
  return 0;
}

int CmdRm(const GlobalFlags& g, const std::vector<std::string>& refs) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("rm", cfg.status());
  // All or nothing: every reference is checked before anything is removed.
  std::vector<storage::ModelStore::ModelRef> parsed;
  for (const auto& ref : refs) {
    auto& [name, version] = parsed.emplace_back();
    if (Status s = storage::ParseModelRef(ref, &name, &version); !s.ok()) return Fail("rm", s);
  }
  auto store = OpenExisting(*cfg);
  if (!store.ok()) return Fail("rm", store.status());
  auto removed = (*store)->Remove(parsed);
  if (!removed.ok()) return Fail("rm", removed.status());
  for (size_t i = 0; i < parsed.size(); ++i) {
    const auto& [name, version] = parsed[i];
    size_t n = (*removed)[i].size();
    if (version) {
      std::cout << "removed " << name << ":" << *version << "\n";
    } else {
      std::cout << "removed " << name << " (" << n << " version" << (n == 1 ? "" : "s") << ")\n";
    }
  }
  std::cout << "blobs and builds stay until 'aotid gc'\n";
  return 0;
}

// What each stored version needs from the cache (compile/cache_policy.h).
StatusOr<std::vector<compile::CacheUser>> CacheUsers(storage::ModelStore& store) {
  ASSIGN_OR_RETURN(auto versions, store.ListVersions());
  std::vector<compile::CacheUser> users;
  for (const auto& v : versions) {
    users.push_back({v.artifact, v.package_model, v.model + ":" + std::to_string(v.version)});
  }
  return users;
}

// Removes (or with `dry_run` only names) the entries the policy removes,
// one line each: "removed <what><sha>/<entry> (1.2 MB): why".
Status PruneCache(const std::vector<compile::CacheVerdict>& verdicts, const std::string& cache_dir,
                  bool dry_run, const char* what, int* removed, int64_t* freed) {
  for (const auto& v : verdicts) {
    if (!v.remove) continue;
    std::cout << (dry_run ? "would remove " : "removed ") << what << v.entry.dir.substr(cache_dir.size() + 1)
              << " (" << HumanSize(v.entry.bytes) << "): " << v.why << "\n";
    if (!dry_run) RETURN_IF_ERROR(compile::RemoveCacheEntry(v));
    *freed += v.entry.bytes;
    ++*removed;
  }
  return Status::OK();
}

// A transfer's progress: a bar redrawn in place on a terminal, a line each
// 10% otherwise.
sync::Progress ProgressPrinter(const std::string& what) {
  bool tty = ::isatty(STDERR_FILENO);
  auto start = std::chrono::steady_clock::now();
  auto last = std::make_shared<int64_t>(-1);
  return [=](int64_t done, int64_t total) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double rate = s > 0 ? static_cast<double>(done) / s : 0;
    int pct = total > 0 ? static_cast<int>(std::clamp<int64_t>(done * 100 / total, 0, 100)) : 100;
    if (!tty && pct / 10 == *last && done != total) return;
    if (tty && done != total && pct == *last) return;
    *last = tty ? pct : pct / 10;
    std::string eta = rate > 0 && total > done
                          ? ", " + std::to_string(static_cast<int64_t>((total - done) / rate)) + " s left"
                          : "";
    std::string bar;  // on a terminal: [#########...........]
    if (tty) bar = " [" + std::string(pct / 5, '#') + std::string(20 - pct / 5, '.') + "]";
    std::fprintf(stderr, "%s%s%s %s / %s (%d%%), %s/s%s%s", tty ? "\r" : "", what.c_str(), bar.c_str(),
                 HumanSize(done).c_str(), HumanSize(total).c_str(), pct,
                 HumanSize(static_cast<int64_t>(rate)).c_str(), eta.c_str(), tty ? "\x1b[K" : "\n");
    if (tty && done == total) std::fprintf(stderr, "\n");
  };
}

int CmdPush(const GlobalFlags& g, const std::string& model_ref, const std::string& target, bool insecure,
            const std::string& credentials, int timeout_s) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("push", cfg.status());
  std::string name;
  std::optional<int64_t> version;
  if (Status s = storage::ParseModelRef(model_ref, &name, &version); !s.ok()) return Fail("push", s);
  auto ref = sync::ParseOciRef(target, insecure);
  if (!ref.ok()) return FailUsage("push", ref.status());
  auto creds = sync::ReadCredentials(credentials, *ref);
  if (!creds.ok()) return Fail("push", creds.status());
  auto store = OpenExisting(*cfg);
  if (!store.ok()) return Fail("push", store.status());
  sync::PushOptions o;
  o.creds = *creds;
  o.limits.timeout_s = timeout_s;
  o.progress = ProgressPrinter("pushing " + model_ref);
  auto r = sync::Push(**store, name, version, *ref, o);
  if (!r.ok()) return Fail("push", r.status());
  std::cout << "pushed " << r->model << ":" << r->version << " to " << r->ref << " (" << r->manifest << "; "
            << (r->added ? HumanSize(r->bytes) + " uploaded" : "the registry had its package already")
            << ")\n";
  return 0;
}

int CmdSync(const GlobalFlags& g, const std::string& source, bool insecure, const std::string& credentials,
            const std::string& as_name, int timeout_s) {
  sync::RegistryLimits limits;
  limits.timeout_s = timeout_s;
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("sync", cfg.status());
  if (!source.starts_with("oci://")) {  // a folder of .pt2 files
    // Checked before the store is made: a mistyped folder creates nothing.
    if (!fs::IsDirectory(source))
      return Fail("sync",
                  NotFound("'" + sync::Printable(source) + "' is not a folder, nor an oci:// reference"));
    auto store = storage::ModelStore::Open(cfg->store_path, /*create=*/true);
    if (!store.ok()) return Fail("sync", store.status());
    auto results = sync::PullDir(**store, source, as_name);
    if (!results.ok()) return Fail("sync", results.status());
    int failed = 0;
    for (const auto& r : *results) {
      if (!r.error.ok()) {  // the others go on
        std::cerr << "aotid sync: " << r.error.message() << "\n";
        (void)(*store)->AppendEvent(r.model, 0, "sync_failed", r.error.message());
        ++failed;
        continue;
      }
      if (r.added) {
        for (const auto& n : r.notes) std::cerr << "aotid sync: note: " << r.ref << ": " << n << "\n";
      }
      if (r.added) {
        std::cout << "synced " << r.ref << " as " << r.model << ":" << r.version << "\n";
      } else {
        std::cout << r.ref << " is up to date: " << r.model << ":" << r.version << "\n";
      }
    }
    if (results->empty()) std::cout << source << " has no .pt2 files\n";
    return failed == 0 ? 0 : kExitFailure;
  }
  auto ref = sync::ParseOciRef(source, insecure);
  if (!ref.ok()) return FailUsage("sync", ref.status());
  auto creds = sync::ReadCredentials(credentials, *ref);
  if (!creds.ok()) return Fail("sync", creds.status());
  auto store = storage::ModelStore::Open(cfg->store_path, /*create=*/true);
  if (!store.ok()) return Fail("sync", store.status());
  std::vector<std::string> tags;
  if (ref->tag.empty()) {
    if (!as_name.empty())
      return FailUsage("sync", InvalidArgument("--name needs one tag to sync, not every tag"));
    sync::Registry registry(*ref, *creds, limits);
    auto listed = registry.ListTags();
    if (!listed.ok()) return Fail("sync", listed.status());
    tags = *listed;
    if (tags.empty()) std::cout << ref->ToString() << " has no tags\n";
  } else {
    tags.push_back(ref->tag);
  }
  int failed = 0;
  Status last_failure;
  for (const auto& tag : tags) {
    sync::OciRef one = *ref;
    one.tag = tag;
    sync::PullOptions o;
    o.any_version = ref->tag.empty();
    o.creds = *creds;
    o.limits = limits;
    o.name = as_name;
    o.progress = ProgressPrinter("syncing " + one.ToString());
    auto r = sync::Pull(**store, one, o);
    if (!r.ok()) {
      std::cerr << "aotid sync: " << r.status().message() << "\n";
      (void)(*store)->AppendEvent("", 0, "sync_failed", one.ToString() + ": " + r.status().message());
      ++failed;
      last_failure = r.status();
      continue;
    }
    if (r->added) {
      for (const auto& n : r->notes) std::cerr << "aotid sync: note: " << r->ref << ": " << n << "\n";
      std::cout << "synced " << r->ref << " as " << r->model << ":" << r->version << " ("
                << HumanSize(r->bytes) << " downloaded"
                << (r->resumed_from > 0 ? ", continuing from " + HumanSize(r->resumed_from) : std::string())
                << ")\n";
    } else {
      std::cout << r->ref << " is up to date: " << r->model << ":" << r->version << "\n";
    }
  }
  // One tag: the exit code says why, as for any command (3: not found);
  // several: some failed.
  if (failed == 0) return 0;
  return tags.size() == 1 ? ExitCodeFor(last_failure) : kExitFailure;
}

// `aotid sync status`: the sources of the config, with what the daemon
// wrote of each into <store>/sync-status.json.
int CmdSyncStatus(const GlobalFlags& g, bool as_json) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("sync status", cfg.status());
  std::vector<sync::SourceStatus> written = sync::ReadSyncStatus(cfg->store_path + "/sync-status.json");
  bool running = FindDaemon(cfg->store_path).has_value();
  // A running daemon's sources are the ones it wrote (its config as it
  // loaded it); without one, this config's, with what was last written.
  std::vector<sync::SyncSource> sources;
  if (running) {
    for (const auto& w : written)
      sources.push_back({.source = w.source, .interval_s = w.interval_s, .keep = w.keep});
  } else {
    sources = cfg->sync;
  }
  json out = json::array();
  for (const auto& s : sources) {
    json e = {{"source", s.source}, {"interval_s", s.interval_s}, {"keep", s.keep}, {"synced", false}};
    for (const auto& w : written) {
      if (w.source != s.source || w.last_at_ms == 0) continue;
      e["synced"] = true;
      e["last_at"] = Timestamp(w.last_at_ms);
      e["ok"] = w.ok;
      e["message"] = w.message;
      e["failures_in_a_row"] = w.failures;
      e["last_ok_at"] = Timestamp(w.last_ok_at_ms);
      e["next_at"] = Timestamp(w.next_at_ms);
    }
    out.push_back(e);
  }
  if (as_json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (sources.empty()) {
    std::cout << (running ? "the daemon on " + cfg->store_path + " follows no [[sync]] sources"
                          : "no [[sync]] sources in " + cfg->source)
              << "; 'aotid sync SOURCE' syncs by hand\n";
    return 0;
  }
  if (!running) std::cout << "no daemon runs on " << cfg->store_path << ": nothing syncs on a timer now\n";
  for (const auto& e : out) {
    std::cout << sync::Printable(e["source"].get<std::string>()) << " (every " << e["interval_s"].get<int>()
              << " s)\n";
    if (!e["synced"].get<bool>()) {
      std::cout << "  not synced yet\n";
      continue;
    }
    std::cout << "  last     " << e["last_at"].get<std::string>() << ": "
              << (e["ok"].get<bool>()
                      ? ""
                      : "FAILED (" + std::to_string(e["failures_in_a_row"].get<int>()) + " in a row): ")
              << sync::Printable(e["message"].get<std::string>()) << "\n";
    if (!e["ok"].get<bool>()) std::cout << "  last ok  " << e["last_ok_at"].get<std::string>() << "\n";
    if (running) std::cout << "  next     " << e["next_at"].get<std::string>() << "\n";
  }
  return 0;
}

int CmdGc(const GlobalFlags& g, bool dry_run, int64_t keep_events) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("gc", cfg.status());
  auto store = OpenExisting(*cfg);
  if (!store.ok()) return Fail("gc", store.status());
  auto r = (*store)->CollectGarbage(dry_run, keep_events);
  if (!r.ok()) return Fail("gc", r.status());
  const char* verb = dry_run ? "would remove" : "removed";
  for (const auto& a : r->artifacts) std::cout << verb << " artifact sha256:" << a << "\n";
  for (const auto& a : r->orphan_blobs) std::cout << verb << " orphan blob sha256:" << a << "\n";
  for (const auto& t : r->tmp_files) std::cout << verb << " abandoned copy blobs/tmp/" << t << "\n";
  for (const auto& t : r->stale_downloads) std::cout << verb << " stale download downloads/" << t << "\n";
  // Cached builds no stored version uses, by the same rule as `cache prune`;
  // not in a cache of its own (build.cache_dir), which other stores' daemons
  // may share: what this store does not use may be theirs.
  int cache_entries = 0;
  int64_t freed = r->bytes_freed;
  if (cfg->CacheIsSeparate()) {
    std::cout << "left the build cache " << cfg->cache_dir
              << " alone: other stores may use it ('aotid cache prune' removes damaged builds and those "
                 "for another machine there)\n";
  } else {
    auto users = CacheUsers(**store);
    if (!users.ok()) return Fail("gc", users.status());
    compile::BuildCache cache(cfg->CachePath());
    auto verdicts =
        compile::JudgeCacheEntries(cache.List(), *users, /*fingerprint=*/"", compile::PruneScope::kUnused);
    Status pruned =
        PruneCache(verdicts, cache.root(), dry_run, "cached build cache/", &cache_entries, &freed);
    if (!pruned.ok()) return Fail("gc", pruned);
    std::set<std::string> used;
    for (const auto& u : *users) used.insert(u.artifact);
    if (int logs = cache.RemoveFailedLogs(used, dry_run); logs > 0) {
      std::cout << verb << " " << logs << " failed build log" << (logs == 1 ? "" : "s")
                << " of removed artifacts\n";
    }
  }
  if (r->events_trimmed) std::cout << verb << " " << r->events_trimmed << " old events\n";
  std::cout << verb << " " << r->artifacts.size() + r->orphan_blobs.size() << " blobs, " << cache_entries
            << " cache entries, " << r->tmp_files.size() + r->stale_downloads.size() << " partial copies; "
            << HumanSize(freed) << (dry_run ? " would be freed\n" : " freed\n");
  for (const auto& m : r->missing_blobs) {
    std::cerr << "aotid gc: warning: blob sha256:" << m << " is referenced but missing; remove the versions "
              << "that use it and add the file again\n";
  }
  return r->missing_blobs.empty() ? 0 : kExitFailure;
}

// `aotid cache ls|prune`: the builds on disk, what uses each, and removing
// the ones nothing here will load (damaged, built for another machine or
// torch, or for no stored version); --all removes every build.
int CmdCache(const GlobalFlags& g, bool prune, bool as_json, bool dry_run, bool all) {
  const char* cmd = prune ? "cache prune" : "cache ls";
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage(cmd, cfg.status());
  auto store = OpenExisting(*cfg);
  if (!store.ok()) return Fail(cmd, store.status());
  auto users = CacheUsers(**store);
  if (!users.ok()) return Fail(cmd, users.status());
  std::string fp = platform::Fingerprint(platform::ProbeHardware(cfg->cxx));
  compile::BuildCache cache(cfg->CachePath());
  // A cache of its own may serve other stores: a build this one does not
  // use is kept (but shown as unused) unless --all.
  auto verdicts = compile::JudgeCacheEntries(cache.List(), *users, fp,
                                             all ? compile::PruneScope::kAll : compile::PruneScope::kStale,
                                             /*others_may_use=*/cfg->CacheIsSeparate());
  if (prune) {
    int64_t freed = 0;
    int removed = 0;
    Status pruned = PruneCache(verdicts, cache.root(), dry_run, "", &removed, &freed);
    if (!pruned.ok()) return Fail(cmd, pruned);
    if (all && !dry_run) (void)fs::RemoveAll(cache.root() + "/.inductor");  // the compiler's own cache
    std::cout << (dry_run ? "would remove " : "removed ") << removed << " cache entries, " << HumanSize(freed)
              << "\n";
    return 0;
  }
  json rows = json::array();
  if (!as_json) {
    std::printf("%-14s %-10s %-6s %-10s %-10s %-16s %s\n", "ARTIFACT", "MODEL", "DEVICE", "SIZE", "STATE",
                "USED BY", "INDUCTOR OPTIONS");
  }
  for (const auto& v : verdicts) {
    const compile::CacheListing& e = v.entry;
    std::string used_by;
    for (const auto& name : v.used_by) used_by += (used_by.empty() ? "" : ",") + name;
    std::string state(compile::CacheStateName(v.state));
    if (as_json) {
      rows.push_back({{"dir", e.dir},
                      {"artifact", e.key.artifact},
                      {"package_model", e.key.package_model},
                      {"device", e.key.device},
                      {"fingerprint", e.key.fingerprint},
                      {"inductor_options", e.key.options},
                      {"bytes", e.bytes},
                      {"state", state},
                      {"problem", e.status.ok() ? "" : e.status.message()},
                      {"used_by", used_by}});
      continue;
    }
    // Builds of one artifact with two option sets are two rows: the options
    // tell them apart.
    std::printf("%-14s %-10s %-6s %-10s %-10s %-16s %s\n", e.key.artifact.substr(0, 12).c_str(),
                e.key.package_model.c_str(), e.key.device.c_str(), HumanSize(e.bytes).c_str(), state.c_str(),
                used_by.empty() ? "-" : used_by.c_str(), e.key.options.empty() ? "-" : e.key.options.c_str());
  }
  if (as_json) std::cout << rows.dump(2) << "\n";
  return 0;
}

int CmdEvents(const GlobalFlags& g, bool follow, const std::string& model, int limit, bool as_json) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("events", cfg.status());
  if (!model.empty()) {
    if (Status s = storage::ValidateModelName(model); !s.ok()) return Fail("events", s);
  }
  auto store = OpenExisting(*cfg);
  if (!store.ok()) return Fail("events", store.status());
  auto recent = (*store)->RecentEvents(limit, model);
  if (!recent.ok()) return Fail("events", recent.status());
  int64_t last = 0;
  for (const auto& e : *recent) {
    PrintEvent(e, as_json);
    last = e.id;
  }
  if (!follow) return 0;
  if (recent->empty()) {  // start after whatever exists now
    auto tail = (*store)->RecentEvents(1, "");
    if (tail.ok() && !tail->empty()) last = tail->back().id;
  }

  uv_loop_t loop;
  uv_loop_init(&loop);
  Status failure;
  control::UvLoop timers(&loop);
  control::StoreWatch watch(store->get(), &timers, [&] {
    auto events = (*store)->ListEvents(last, 10000, model);
    if (!events.ok()) {
      failure = events.status();
      watch.Stop();
      timers.Close();
      return;
    }
    for (const auto& e : *events) {
      PrintEvent(e, as_json);
      last = e.id;
    }
  });
  struct Signals {
    uv_signal_t sigint{}, sigterm{};
    control::StoreWatch* watch;
    control::UvLoop* timers;
  } signals{.watch = &watch, .timers = &timers};
  auto stop = [](uv_signal_t* h, int) {
    auto* s = static_cast<Signals*>(h->data);
    s->watch->Stop();
    s->timers->Close();
    uv_close(reinterpret_cast<uv_handle_t*>(&s->sigint), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&s->sigterm), nullptr);
  };
  for (auto [sig, handle] : {std::pair{SIGINT, &signals.sigint}, std::pair{SIGTERM, &signals.sigterm}}) {
    uv_signal_init(&loop, handle);
    handle->data = &signals;
    uv_signal_start(handle, stop, sig);
  }
  watch.Start(&loop);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  if (!failure.ok()) return Fail("events", failure);
  return 0;
}

// The build child runs a package's code: its compiler flags and C++ (a
// source package), then its model.so. So it reads only what a build needs
// and writes only its staging directory from the start (Landlock and a
// seccomp filter that lets the compiler start processes but reach no
// network: the compiler runs inside them, with its temporary files in the
// staging directory), and loads the model.so only after the runner's
// seccomp filter, as a runner does.
int RunConfinedPackageBuild(const compile::PackageBuildArgs& args) {
  runner::SandboxOptions box;
  std::string exe = fs::ExecutablePath();
  // libtorch is loaded before Landlock: the torch it found is the one the
  // compiler reads headers and libraries from.
  auto plugin = runtime::LoadTorchPlugin();
  if (!plugin.ok()) {
    std::cout << "error: " << plugin.status().message() << std::endl;
    return compile::kBuildExitMayPass;
  }
  box.read_paths = {args.artifact, platform::LoadedTorchDir(), exe.substr(0, exe.rfind('/')),
                    plugin->substr(0, plugin->rfind('/'))};
  box.write_paths = {args.out};
  box.gpu = args.device != "cpu";
  box.processes = true;  // the compiler
  std::string tmp = args.out + "/tmp";
  if (Status s = fs::MakeDirs(tmp); !s.ok()) {
    std::cout << "error: " << s.message() << std::endl;
    return compile::kBuildExitMayPass;
  }
  ::setenv("TMPDIR", tmp.c_str(), 1);
  auto landlock = runner::EnterLandlock(box);
  Status seccomp = landlock.ok() ? runner::EnterSeccomp(box, *landlock > 0) : landlock.status();
  if (!seccomp.ok()) {
    std::cout << "error: " << seccomp.message() << std::endl;
    return compile::kBuildExitMayPass;
  }
  int exit_code = compile::RunPackageBuild(args, [&]() -> Status {
    // libtorch first (its start-up is not the package's code), then the
    // runner's filter: no more processes.
    RETURN_IF_ERROR(runtime::LoadTorchPlugin().status());
    runner::SandboxOptions runner_box = box;
    runner_box.processes = false;
    return runner::EnterSeccomp(runner_box, *landlock > 0);
  });
  (void)fs::RemoveAll(tmp);
  return exit_code;
}

// `aotid internal-confine ... -- COMMAND` (platform/confined_command.h): the
// compile worker's sandbox, entered here and kept across the exec. Files as
// the build child's (Landlock), processes allowed, no network, no
// ptrace, no namespaces (seccomp), no new privileges, death with the daemon.
int RunConfined(const platform::ConfineArgs& args) {
  runner::SandboxOptions box;
  box.read_paths = args.read_paths;
  box.write_paths = args.write_paths;
  box.gpu = args.gpu;
  box.processes = true;  // Python and the compiler
  auto fail = [](const Status& s) {
    std::cout << "error: cannot confine the build: " << s.message() << std::endl;
    return compile::kBuildExitMayPass;
  };
#ifdef __linux__
  pid_t parent = ::getppid();
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail(ErrnoError("no_new_privs", errno));
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (::getppid() != parent) return fail(FailedPrecondition("the daemon that started the build is gone"));
#endif
  auto landlock = runner::EnterLandlock(box);
  if (!landlock.ok()) return fail(landlock.status());
  if (Status s = runner::EnterSeccomp(box, *landlock > 0); !s.ok()) return fail(s);
  std::vector<char*> argv;
  for (const std::string& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  return fail(ErrnoError("run " + args.command[0], errno));
}

}  // namespace

namespace {

// Gives what root owns in the open folder `dir` (at `path`) to uid:gid, and
// the same in its subfolders, each opened from its parent's descriptor
// without following links. Closes `dir`.
void GiveFolder(int dir, const std::string& path, uid_t uid, gid_t gid, int depth,
                const std::function<void(const std::string&)>& before_entering) {
  DIR* d = ::fdopendir(dir);
  if (d == nullptr) {
    ::close(dir);
    return;
  }
  std::vector<std::string> folders;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (st.st_uid == 0) (void)::fchownat(dir, name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW);
    if (S_ISDIR(st.st_mode)) folders.push_back(name);
  }
  for (const std::string& name : folders) {
    if (depth >= 64) break;  // a store is a few levels deep
    if (before_entering) before_entering(path + "/" + name);
    int sub = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0) GiveFolder(sub, path + "/" + name, uid, gid, depth + 1, before_entering);
  }
  ::closedir(d);  // closes `dir`
}

}  // namespace

void GiveStoreToItsOwner(const std::string& store_path,
                         const std::function<void(const std::string& path)>& before_entering) {
  if (::geteuid() != 0) return;
  char resolved[PATH_MAX];
  if (::realpath(store_path.c_str(), resolved) == nullptr) return;
  int root = ::open(resolved, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root < 0) return;
  struct stat root_st;
  if (::fstat(root, &root_st) != 0 || root_st.st_uid == 0) {
    ::close(root);
    return;
  }
  GiveFolder(root, resolved, root_st.st_uid, root_st.st_gid, 0, before_entering);
}

// `aotid service install|uninstall|status` (daemon/service.h).
int CmdService(const GlobalFlags& g, const std::string& action, ServiceScope scope,
               const std::string& platform, bool dry_run) {
  const bool system = scope == ServiceScope::kSystem;
  // The system service reads /etc/aotid/aotid.toml; the user's, the usual
  // places (--config for either).
  GlobalFlags flags = g;
  if (system && flags.config.empty() && fs::Exists("/etc/aotid/aotid.toml"))
    flags.config = "/etc/aotid/aotid.toml";
  auto cfg = Resolve(flags);
  if (!cfg.ok()) return FailUsage("service " + action, cfg.status());
  ServiceHost host = ServiceHost::Detect(*cfg);
  if (platform == "systemd") host.platform = ServicePlatform::kSystemd;
  if (platform == "launchd") host.platform = ServicePlatform::kLaunchd;
  std::string what = std::string(host.platform == ServicePlatform::kSystemd ? "systemd" : "launchd") +
                     (system ? " system service" : " user service");
  if (action == "status") return ServiceStatus(host, scope, *cfg);
  StatusOr<ServicePlan> plan =
      action == "install" ? PlanServiceInstall(host, scope)
                          : StatusOr<ServicePlan>(PlanServiceUninstall(host, scope, cfg->store_path));
  if (!plan.ok()) return Fail("service " + action, plan.status());
  if (action == "uninstall" && !ServiceManagerRuns(host, scope).ok()) {
    // Nothing can be running: the files alone are removed.
    plan->commands.clear();
    plan->commands_may_fail.clear();
  }
  if (dry_run) {
    std::printf("%s of the aotid %s (dry run: nothing is changed)\n%s", action.c_str(), what.c_str(),
                DescribePlan(*plan).c_str());
    if (system && ::geteuid() != 0) std::printf("then: run it as root (sudo) to carry it out\n");
    if (Status s = ServiceManagerRuns(host, scope); !s.ok())
      std::printf("then: note: %s\n", s.message().c_str());
  } else {
    if (system && ::geteuid() != 0) {
      return Fail(
          "service " + action,
          FailedPrecondition("the system service needs root: sudo " + fs::ExecutablePath() + " service " +
                             action + " --system (or --user for this user's own service)"));
    }
    if (Status s = ServiceManagerRuns(host, scope); !s.ok() && action == "install") {
      return Fail("service install",
                  Status(s.code(), s.message() + "; nothing was written (--dry-run shows the files)"));
    }
    std::printf("%s of the aotid %s\n", action.c_str(), what.c_str());
    if (Status s = ApplyPlan(*plan); !s.ok()) {
      return Fail("service " + action,
                  Status(s.code(), s.message() + (action == "install"
                                                      ? "; the files written so far stay (`aotid service "
                                                        "uninstall" +
                                                            std::string(system ? " --system" : " --user") +
                                                            "` removes them)"
                                                      : "")));
    }
  }
  for (const auto& n : plan->notes) std::printf("%s%s\n", dry_run ? "then: " : "", n.c_str());
  return 0;
}

int RunCli(int argc, char** argv) {
  // The build child the daemon runs (compile/package_build.h); not for people.
  if (argc >= 2 && std::string_view(argv[1]) == compile::kPackageBuildCommand) {
    auto args = compile::ParsePackageBuildArgs(std::vector<std::string>(argv + 2, argv + argc));
    if (!args.ok()) {
      std::cerr << args.status().message() << "\n";
      return 2;
    }
    return RunConfinedPackageBuild(*args);
  }
  // The compile worker's sandbox (platform/confined_command.h); not for people.
  if (argc >= 2 && std::string_view(argv[1]) == platform::kConfineCommand) {
    auto args = platform::ParseConfineArgs(std::vector<std::string>(argv + 2, argv + argc));
    if (!args.ok()) {
      std::cerr << args.status().message() << "\n";
      return 2;
    }
    return RunConfined(*args);
  }
  // The runner process the daemon runs each model in (runner/runner_main.h).
  if (argc >= 2 && std::string_view(argv[1]) == runner::kRunnerCommand) {
    auto args = runner::ParseRunnerArgs(std::vector<std::string>(argv + 2, argv + argc));
    if (!args.ok()) {
      std::cerr << args.status().message() << "\n";
      return 2;
    }
    return runner::RunRunner(*args);
  }
  CLI::App app{"aotid: serves compiled PyTorch models on this machine", "aotid"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags work after the subcommand too
  app.set_version_flag("--version", std::string("aotid ") + AOTID_VERSION);
  GlobalFlags g;
  app.add_option("--config", g.config, "Config file (TOML); see configs/aotid.toml");
  app.add_option("--store", g.store, "Store directory (overrides store.path)");
  app.add_option("--cache-dir", g.cache_dir,
                 "Build cache directory, which daemons with stores of their own may share (overrides "
                 "build.cache_dir; default STORE/cache)");

  storage::AddRequest add_req;
  int64_t add_version = 0;
  auto* add = app.add_subcommand("add", "Add a model package (.pt2) to the store as a new version");
  add->add_option("file", add_req.file,
                  "The .pt2: an exported program (torch.export.save) or an AOTInductor package")
      ->required();
  add->add_option("--name", add_req.name, "Model name: letters, digits, '_', '.', '-'")->required();
  add->add_option("--version", add_version, "Version number (default: one past the latest)");
  add->add_option("--package-model", add_req.package_model, "Which model of a multi-model package");
  // A flag per version setting; options (--inductor KEY=VALUE) are applied after parsing.
  std::map<const storage::SettingField*, std::vector<std::string>> add_options;
  for (const auto& f : storage::VersionSettingFields()) {
    AddSettingFlag(add, f, &add_req.settings,
                   f.type == storage::SettingType::kOptions ? &add_options[&f] : nullptr);
  }

  bool ls_json = false;
  auto* ls = app.add_subcommand("ls", "List models, versions and their build state on this machine");
  ls->add_flag("--json", ls_json, "Print JSON");

  bool ps_json = false, ps_all = false;
  auto* ps = app.add_subcommand("ps", "List the model versions the daemon holds in memory now");
  ps->add_flag("--all", ps_all, "Every served version, also those not resident");
  ps->add_flag("--json", ps_json, "Print JSON (GET /v2/resident)");
  ps->footer(
      "SIZE is what a version counts for in the memory budget: measured at its loads (? where not yet "
      "measured: an estimate from its build). UNLOAD IN: when keep_alive unloads it if no request comes.");

  std::string show_ref;
  bool show_json = false;
  int show_events = 10;
  auto* show =
      app.add_subcommand("show", "Show a model or version: settings, artifact, builds, recent events");
  show->add_option("model", show_ref, "NAME or NAME:VERSION")->required();
  show->add_flag("--json", show_json, "Print JSON");
  show->add_option("--events", show_events, "How many recent events")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));

  std::string set_ref;
  std::vector<std::string> set_kv;
  auto* set = app.add_subcommand("set", "Change how a model or version is served");
  set->footer("Per version (on NAME alone: every version of the model):\n" + storage::SetHelp() +
              "Per model (NAME only):\n"
              "  version_policy=latest|all|pinned:VERSION  enabled=true|false\n"
              "All or nothing: one bad key or value changes nothing. A running daemon applies the change.");
  set->add_option("model", set_ref, "NAME or NAME:VERSION")->required();
  set->add_option("settings", set_kv, "KEY=VALUE ...")->required();

  std::vector<std::string> rm_refs;
  auto* rm = app.add_subcommand("rm", "Remove models or versions (the daemon unloads them)");
  rm->add_option("models", rm_refs, "NAME or NAME:VERSION ...")->required();

  bool gc_dry_run = false;
  int64_t gc_keep_events = 10000;
  auto* gc = app.add_subcommand("gc", "Remove blobs and cached builds that no version references");
  gc->add_flag("--dry-run", gc_dry_run, "Only say what would be removed");
  gc->add_option("--keep-events", gc_keep_events, "Newest events to keep")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  std::string push_ref, push_target, push_credentials;
  bool push_insecure = false;
  int push_timeout = 30, sync_timeout = 30;
  auto* push = app.add_subcommand("push", "Push a model version to an OCI registry (docs/SYNC.md)");
  push->add_option("MODEL", push_ref, "NAME or NAME:VERSION (default: the newest)")->required();
  push->add_option("TARGET", push_target, "oci://HOST[:PORT]/REPO[:TAG] (default tag: the version number)")
      ->required();
  push->add_flag("--insecure", push_insecure, "Plain HTTP to a registry that is not on loopback");
  push->add_option("--credentials", push_credentials,
                   "Docker config file with the registry's credentials (default: ~/.docker/config.json)");
  push->add_option("--timeout", push_timeout,
                   "Seconds to wait for the registry: to connect, and for each read or write")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));

  std::string sync_source, sync_credentials, sync_name;
  bool sync_insecure = false;
  auto* sync_cmd = app.add_subcommand("sync", "Add the model versions an OCI registry holds (docs/SYNC.md)");
  sync_cmd->add_option("SOURCE", sync_source,
                       "oci://HOST[:PORT]/REPO:TAG (one version), oci://HOST[:PORT]/REPO (every tag), or a "
                       "folder of .pt2 files");
  bool sync_json = false;
  auto* sync_status = sync_cmd->add_subcommand(
      "status",
      "The daemon's registries ([[sync]] in its config): when each was last synced, and how it went");
  sync_status->add_flag("--json", sync_json, "As JSON");
  sync_cmd->add_option(
      "--name", sync_name,
      "The store's name for it (default: the repository's last part, or for a folder the file's name)");
  sync_cmd->add_flag("--insecure", sync_insecure, "Plain HTTP to a registry that is not on loopback");
  sync_cmd->add_option("--credentials", sync_credentials,
                       "Docker config file with the registry's credentials (default: ~/.docker/config.json)");
  sync_cmd
      ->add_option("--timeout", sync_timeout,
                   "Seconds to wait for the registry: to connect, and for each read or write")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));

  bool ev_follow = false, ev_json = false;
  std::string ev_model;
  int ev_limit = 50;
  auto* events = app.add_subcommand("events", "Print the store's event log");
  events->add_flag("-f,--follow", ev_follow, "Keep printing new events until interrupted");
  events->add_option("--model", ev_model, "Only this model's events");
  events->add_option("-n,--limit", ev_limit, "How many recent events first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  events->add_flag("--json", ev_json, "One JSON object per line");

  auto* doctor =
      app.add_subcommand("doctor", "Describe this machine and check everything builds and serving need");

  std::string listen, grpc_listen, log_file;
  bool cache_json = false, cache_dry_run = false, cache_all = false;
  auto* cache = app.add_subcommand("cache", "List or prune the builds cached for this machine");
  cache->require_subcommand(1);
  auto* cache_ls =
      cache->add_subcommand("ls", "List cached builds: model, device, size, state, the versions using each");
  cache_ls->add_flag("--json", cache_json, "Print JSON");
  auto* cache_prune = cache->add_subcommand(
      "prune", "Remove damaged builds, builds for another machine or torch, and builds no version uses");
  cache_prune->add_flag("--dry-run", cache_dry_run, "Only say what would be removed");
  cache_prune->add_flag("--all", cache_all, "Remove every build (each is rebuilt when next needed)");

  bool svc_user = false, svc_system = false, svc_dry_run = false;
  std::string svc_platform;
  auto* service =
      app.add_subcommand("service", "Run aotid as a service of systemd (Linux) or launchd (macOS)");
  service->require_subcommand(1);
  auto* svc_install = service->add_subcommand(
      "install", "Write the service's files with this installation's paths, then enable and start it");
  auto* svc_uninstall = service->add_subcommand(
      "uninstall", "Stop and disable the service and remove its files (not the store)");
  auto* svc_status = service->add_subcommand(
      "status", "The service manager's view of the service, and whether its API is ready");
  for (auto* sub : {svc_install, svc_uninstall, svc_status}) {
    auto* u = sub->add_flag("--user", svc_user, "This user's service (the default unless run as root)");
    auto* s = sub->add_flag("--system", svc_system, "The machine's service (the default as root)");
    u->excludes(s);
    sub->add_option("--platform", svc_platform, "systemd or launchd (default: this machine's)")
        ->check(CLI::IsMember({"systemd", "launchd"}));
  }
  for (auto* sub : {svc_install, svc_uninstall}) {
    sub->add_flag("--dry-run", svc_dry_run, "Print the files and commands, change nothing");
  }

  auto* serve = app.add_subcommand("serve", "Run the daemon: build what is missing and serve the HTTP API");
  serve->add_option("--listen", listen, "HOST:PORT to listen on (overrides server.listen)");
  serve->add_option("--grpc-listen", grpc_listen,
                    "HOST:PORT for the gRPC API to listen on (overrides server.grpc_listen)");
  serve->add_option("--log-file", log_file, "Log to this file, rotated by size (overrides log.file)");
  SingleModel single;
  serve->add_option("--model-dir", single.model_dir,
                    "Serve the .pt2 in this read-only folder (or this file) alone, with no `add` "
                    "(single-model mode: KServe's /mnt/models); the store keeps its builds");
  serve->add_option("--model-name", single.model_name, "The name it is served as (with --model-dir)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }

  // Commands that write the store hand root's new files to its owner.
  // A build cache of its own (build.cache_dir) is handed to its own owner
  // alike.
  struct StoreOwner {
    std::string path, cache_path;
    ~StoreOwner() {
      if (!path.empty()) GiveStoreToItsOwner(path);
      if (!cache_path.empty()) GiveStoreToItsOwner(cache_path);
    }
  } store_owner;
  if (::geteuid() == 0 && (add->parsed() || set->parsed() || rm->parsed() || gc->parsed() ||
                           cache->parsed() || sync_cmd->parsed())) {
    if (auto cfg = Resolve(g); cfg.ok()) {
      store_owner.path = cfg->store_path;
      if (cfg->CacheIsSeparate()) store_owner.cache_path = cfg->cache_dir;
    }
  }
  if (add->parsed()) {
    if (add->count("--version")) add_req.version = add_version;
    for (const auto& [field, assignments] : add_options) {
      for (const auto& a : assignments) {
        size_t eq = a.find('=');
        std::string flag = "--" + std::string(OptionsFlag(*field));
        Status s =
            eq == std::string::npos || eq == 0
                ? InvalidArgument(flag + " '" + a + "' is not KEY=VALUE")
                : storage::ApplySetting(&add_req.settings, std::string(field->prefix) + a.substr(0, eq),
                                        a.substr(eq + 1));
        if (!s.ok()) return Fail("add", s);
      }
    }
    return CmdAdd(g, add_req);
  }
  if (ls->parsed()) return CmdLs(g, ls_json);
  if (ps->parsed()) return CmdPs(g, ps_all, ps_json);
  if (show->parsed()) return CmdShow(g, show_ref, show_json, show_events);
  if (set->parsed()) return CmdSet(g, set_ref, set_kv);
  if (rm->parsed()) return CmdRm(g, rm_refs);
  if (gc->parsed()) return CmdGc(g, gc_dry_run, gc_keep_events);
  if (push->parsed()) return CmdPush(g, push_ref, push_target, push_insecure, push_credentials, push_timeout);
  if (sync_status->parsed()) return CmdSyncStatus(g, sync_json);
  if (sync_cmd->parsed()) {
    if (sync_source.empty())
      return FailUsage("sync", InvalidArgument("give a SOURCE (oci://HOST[:PORT]/REPO[:TAG]), or 'status'"));
    return CmdSync(g, sync_source, sync_insecure, sync_credentials, sync_name, sync_timeout);
  }
  if (events->parsed()) return CmdEvents(g, ev_follow, ev_model, ev_limit, ev_json);
  if (doctor->parsed()) {
    auto cfg = Resolve(g);
    if (!cfg.ok()) return FailUsage("doctor", cfg.status());
    return RunDoctor(*cfg);
  }
  if (service->parsed()) {
    ServiceScope scope = svc_system         ? ServiceScope::kSystem
                         : svc_user         ? ServiceScope::kUser
                         : ::geteuid() == 0 ? ServiceScope::kSystem
                                            : ServiceScope::kUser;
    return CmdService(g,
                      svc_install->parsed()     ? "install"
                      : svc_uninstall->parsed() ? "uninstall"
                                                : "status",
                      scope, svc_platform, svc_dry_run);
  }
  if (cache->parsed()) return CmdCache(g, cache_prune->parsed(), cache_json, cache_dry_run, cache_all);
  if (serve->parsed()) {
    // The file and the flags, as at start and again at each SIGHUP.
    auto load = [&]() -> StatusOr<Config> {
      ASSIGN_OR_RETURN(Config cfg, Resolve(g));
      if (!listen.empty()) RETURN_IF_ERROR(SetListen(listen, &cfg.api.server));
      if (!grpc_listen.empty()) {
        RETURN_IF_ERROR(CheckGrpcListen(grpc_listen).WithContext("--grpc-listen"));
        cfg.grpc_listen = grpc_listen;
      }
      if (!log_file.empty()) cfg.log_file = log_file;
      return cfg;
    };
    auto cfg = load();
    if (!cfg.ok()) return FailUsage("serve", cfg.status());
    if (single.model_dir.empty() != single.model_name.empty()) {
      return FailUsage("serve",
                       InvalidArgument(single.model_dir.empty()
                                           ? "--model-name names the model of --model-dir: give both"
                                           : "--model-dir needs --model-name, the name to serve it as"));
    }
    return Serve(*cfg, load, single);
  }
  return kExitUsage;
}

}  // namespace aotid::daemon
