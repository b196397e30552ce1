#include "daemon/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "base/log.h"
#include "daemon/config.h"
#include "daemon/serve.h"
#include "runtime/hardware.h"
#include "storage/model_store.h"

namespace aotid::daemon {
namespace {

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
};

StatusOr<Config> Resolve(const GlobalFlags& g) {
  ASSIGN_OR_RETURN(Config c, LoadConfig(g.config));
  if (!g.store.empty()) c.store_path = g.store;
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

int CmdAdd(const GlobalFlags& g, const storage::AddRequest& req) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("add", cfg.status());
  // Check everything about the request before the store is created or opened.
  if (auto info = storage::ModelStore::CheckAddRequest(req); !info.ok()) return Fail("add", info.status());
  auto store = storage::ModelStore::Open(cfg->store_path, /*create=*/true);
  if (!store.ok()) return Fail("add", store.status());
  auto added = (*store)->Add(req);
  if (!added.ok()) return Fail("add", added.status());
  std::cout << "added " << added->model << ":" << added->version << " (" << storage::PackageKindName(added->kind)
            << ", sha256:" << added->artifact.substr(0, 12) << ", " << HumanSize(added->size) << ") to "
            << cfg->store_path << "\n";
  return 0;
}

int CmdLs(const GlobalFlags& g) {
  auto cfg = Resolve(g);
  if (!cfg.ok()) return FailUsage("ls", cfg.status());
  auto store = storage::ModelStore::Open(cfg->store_path, /*create=*/false);
  if (!store.ok()) {
    if (store.status().code() == StatusCode::kNotFound) {
      std::cout << "no models (no store at " << cfg->store_path << ")\n";
      return 0;
    }
    return Fail("ls", store.status());
  }
  auto versions = (*store)->ListVersions();
  if (!versions.ok()) return Fail("ls", versions.status());
  std::string fp = runtime::Fingerprint(runtime::ProbeHardware(cfg->cxx));
  std::printf("%-24s %-8s %-9s %-7s %-10s %s\n", "NAME", "VERSION", "STATE", "DEVICE", "SIZE", "ARTIFACT");
  for (const auto& v : *versions) {
    auto b = (*store)->GetBuild(v.artifact, v.package_model, fp);
    std::string state = "queued", device = v.settings.device;
    if (b.ok() && b->has_value()) {
      state = std::string(storage::BuildStateName((*b)->state));
      device = (*b)->device;
    }
    std::printf("%-24s %-8lld %-9s %-7s %-10s sha256:%s\n", v.model.c_str(), static_cast<long long>(v.version),
                state.c_str(), device.c_str(), HumanSize(v.size).c_str(), v.artifact.substr(0, 12).c_str());
  }
  return 0;
}

}  // namespace

int RunCli(int argc, char** argv) {
  CLI::App app{"aotid: serves compiled PyTorch models on this machine", "aotid"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags work after the subcommand too
  app.set_version_flag("--version", std::string("aotid ") + AOTID_VERSION);
  GlobalFlags g;
  app.add_option("--config", g.config, "Config file (TOML); see configs/aotid.toml");
  app.add_option("--store", g.store, "Store directory (overrides store.path)");

  storage::AddRequest add_req;
  int64_t add_version = 0;
  auto* add = app.add_subcommand("add", "Add an exported program (.pt2) to the store");
  add->add_option("file", add_req.file, "The .pt2 file (torch.export.save)")->required();
  add->add_option("--name", add_req.name, "Model name")->required();
  add->add_option("--version", add_version, "Version number (default: one past the latest)");
  add->add_option("--device", add_req.settings.device, "auto, cpu, mps or cuda")->capture_default_str();
  add->add_option("--num-runners", add_req.settings.num_runners, "Concurrent model instances")
      ->capture_default_str();

  auto* ls = app.add_subcommand("ls", "List models, versions and their build state on this machine");

  std::string listen;
  auto* serve = app.add_subcommand("serve", "Run the daemon: build what is missing and serve the HTTP API");
  serve->add_option("--listen", listen, "HOST:PORT to listen on (overrides server.listen)");

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

  if (add->parsed()) {
    if (add->count("--version")) add_req.version = add_version;
    return CmdAdd(g, add_req);
  }
  if (ls->parsed()) return CmdLs(g);
  if (serve->parsed()) {
    auto cfg = Resolve(g);
    if (!cfg.ok()) return FailUsage("serve", cfg.status());
    if (!listen.empty()) {
      std::string host;
      int port;
      if (Status s = ParseListen(listen, &host, &port); !s.ok()) return FailUsage("serve", s);
      cfg->listen = listen;
    }
    return Serve(*cfg);
  }
  return kExitUsage;
}

}  // namespace aotid::daemon
