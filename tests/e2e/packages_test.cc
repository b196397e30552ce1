// Builds for this machine, end to end: the model zoo, the three package
// kinds, multi-model packages, device fallback, and a cache that survives a
// daemon killed mid-build. Real packages, the real binary, real HTTP; every
// answer is compared with eager PyTorch.
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "base/fs.h"
#include "e2e/daemon_process.h"
#include "e2e/http_util.h"
#include "storage/model_store.h"
#include "test_util.h"

namespace aotid::testing {
namespace {

// `aotid ARGS` must succeed.
void Aotid(const std::vector<std::string>& args) {
  std::string out;
  ASSERT_EQ(RunAotid(args, &out), 0) << out;
}

std::string Error(int port, const std::string& model) { return Get(port, "/v2/models/" + model).body.value("error", ""); }

// Cache entries (complete or not) of one artifact: <cache>/<sha>/<entry>/.
std::vector<std::string> Entries(const std::string& store, const std::string& package) {
  std::vector<std::string> out;
  std::string dir = store + "/cache/" + *fs::Sha256File(package);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_directory()) out.push_back(e.path().string());  // not a failed build's log
  }
  return out;
}

// Pids of the processes whose command line contains `needle`.

// The zoo and the exported-program paths, in one daemon that compiles each
// model once: a conv net, a transformer block, two inputs of different
// datatypes with two outputs, dynamic batch served at 1 and 7, two models
// of one package under their own names, and a version asking for a device
// this machine lacks, with and without fallback.
TEST(Packages, ModelZooMultiModelAndDeviceFallback) {
  TempDir dir;
  std::string store = dir / "store";
  for (const char* m : {"conv", "block", "two_io"}) Aotid({"--store", store, "add", TestData(std::string(m) + ".pt2"), "--name", m});
  std::string out;
  EXPECT_EQ(RunAotid({"--store", store, "add", TestData("multi.pt2"), "--name", "encoder"}, &out), 5) << out;
  EXPECT_NE(out.find("holds 2 models (encoder, head); choose one with --package-model"), std::string::npos) << out;
  Aotid({"--store", store, "add", TestData("multi.pt2"), "--name", "encoder", "--package-model", "encoder"});
  Aotid({"--store", store, "add", TestData("multi.pt2"), "--name", "head", "--package-model", "head"});
  Aotid({"--store", store, "add", TestData("mlp.pt2"), "--name", "on_cuda", "--device", "cuda"});
  Aotid({"--store", store, "add", TestData("mlp.pt2"), "--name", "only_cuda", "--device", "cuda", "--no-fallback-cpu"});

  auto d = DaemonProcess::Start({"--store", store, "--listen", "127.0.0.1:0"}, dir / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  int port = (*d)->port();
  for (const char* m : {"conv", "block", "two_io", "encoder", "head", "on_cuda"}) {
    ASSERT_TRUE(WaitReady(port, m)) << m << ": " << Error(port, m) << "\n" << (*d)->Log();
  }
  ExpectCasesMatchEager(port, "conv");    // batch 1 and 7 of one dynamic-batch build
  ExpectCasesMatchEager(port, "block");
  ExpectCasesMatchEager(port, "two_io");  // FP32 and INT64 in, FP32 and INT64 out
  ExpectCasesMatchEager(port, "encoder", "multi_encoder");
  ExpectCasesMatchEager(port, "head", "multi_head");
  Reply two = Get(port, "/v2/models/two_io");
  // Both inputs share the dynamic batch the exporter declared (traced at 2).
  const std::string batch = R"({"dynamic_dims":[{"dim":0,"name":"batch","min":1,"max":65536,"typical":2}]})";
  EXPECT_EQ(two.body["inputs"],
            json::parse(R"([{"name":"x","datatype":"FP32","shape":[-1,6],"parameters":)" + batch +
                        R"(},{"name":"idx","datatype":"INT64","shape":[-1],"parameters":)" + batch + "}]"));
  EXPECT_EQ(Get(port, "/v2/models/head").body["parameters"]["author"]["suite"], "multi-model test");

  // Fallback on: served on the CPU, the reason where people look.
  ExpectCasesMatchEager(port, "on_cuda", "mlp");
  Reply fb = Get(port, "/v2/models/on_cuda");
  EXPECT_EQ(fb.body["device"], "cpu");
  EXPECT_NE(fb.body.value("device_note", "").find("device 'cuda' is not available here"), std::string::npos)
      << fb.body.dump();
  EXPECT_EQ(CountEvents(store, "device_fallback", "device 'cuda' is not available here"), 1);
  ASSERT_EQ(RunAotid({"--store", store, "show", "on_cuda"}, &out), 0) << out;
  EXPECT_NE(out.find("device_fallback"), std::string::npos) << out;
  // Fallback off: failed with the reason, the rest unaffected.
  EXPECT_FALSE(WaitReady(port, "only_cuda", 30));
  EXPECT_NE(Error(port, "only_cuda").find("device 'cuda' is not available here"), std::string::npos);
  EXPECT_NE(Error(port, "only_cuda").find("fallback_cpu is off"), std::string::npos);
  ASSERT_EQ(RunAotid({"--store", store, "ls"}, &out), 0) << out;
  auto row = LsRow(out, "only_cuda");
  EXPECT_EQ(row["SERVING"], "no") << out;
  EXPECT_EQ(row["BUILD"], "failed") << out;
  EXPECT_EQ(row["DEVICE"], "cuda") << out;
  ExpectCasesMatchEager(port, "conv");
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();
}

// AOTInductor packages with no Python anywhere near the daemon: a compiled
// .so loaded as is (with and without aotid's interface file), a source
// package compiled with the local compiler, and three that must be refused
// with the reason while the others serve.
TEST(Packages, AotiPackagesBuildWithoutPython) {
  TempDir dir;
  std::string store = dir / "store", config = dir / "aotid.toml";
  ASSERT_OK(fs::WriteFileAtomic(config, "[build]\npython = \"/nonexistent/python3\"\n"));
  std::vector<std::pair<std::string, std::string>> models = {
      {"so", "mlp_so.pt2"},      {"so_raw", "mlp_so_raw.pt2"}, {"src", "mlp_src.pt2"},
      {"broken", "broken_src.pt2"}, {"foreign", "foreign_so.pt2"}, {"cuda", "cuda_so.pt2"}};
  for (const auto& [name, file] : models) Aotid({"--config", config, "--store", store, "add", TestData(file), "--name", name});
  RunOptions no_python;
  no_python.env = {"PATH=/usr/bin:/bin", "PYTHONPATH=/nonexistent"};
  auto d = DaemonProcess::Start({"--config", config, "--store", store, "--listen", "127.0.0.1:0"}, dir / "daemon.log",
                                no_python);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  int port = (*d)->port();
  for (const char* m : {"so", "so_raw", "src"}) {
    ASSERT_TRUE(WaitReady(port, m)) << m << ": " << Error(port, m) << "\n" << (*d)->Log();
  }
  ExpectCasesMatchEager(port, "so", "mlp");
  ExpectCasesMatchEager(port, "src", "mlp");
  // Without extra/aotid.json the inputs come from the generated C++ and the
  // outputs from a first run: graph names, but the same numbers.
  Reply raw = Get(port, "/v2/models/so_raw");
  ASSERT_EQ(raw.body["inputs"].size(), 1u) << raw.body.dump();
  EXPECT_EQ(raw.body["inputs"][0]["datatype"], "FP32");
  EXPECT_EQ(raw.body["inputs"][0]["shape"], json::parse("[-1, 8]"));
  EXPECT_EQ(raw.body["outputs"][0]["datatype"], "FP32");
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  json req = {{"inputs", cases["mlp"][1]["inputs"]}};
  req["inputs"][0]["name"] = raw.body["inputs"][0]["name"];
  Reply r = Post(port, "/v2/models/so_raw/infer", req.dump());
  ASSERT_EQ(r.status, 200) << r.body.dump();
  json want = cases["mlp"][1]["outputs"];
  want[0]["name"] = r.body["outputs"][0]["name"];
  EXPECT_TRUE(OutputsMatch(r.body["outputs"], want)) << r.body.dump();
  EXPECT_EQ(Get(port, "/v2/models/so").body["parameters"]["aoti"]["AOTI_DEVICE_KEY"], "cpu");
  EXPECT_EQ(Get(port, "/v2/models/so").body["parameters"]["author"]["kind"], "so");
  std::string shown;
  ASSERT_EQ(RunAotid({"--config", config, "--store", store, "show", "so"}, &shown), 0) << shown;
  EXPECT_NE(shown.find(R"(author meta     {"kind":"so","purpose":"aotid test"})"), std::string::npos) << shown;
  EXPECT_NE(shown.find(R"("AOTI_DEVICE_KEY":"cpu")"), std::string::npos) << shown;

  // Refused, each with its reason; the daemon and the others keep serving.
  EXPECT_FALSE(WaitReady(port, "broken", 300));
  EXPECT_NE(Error(port, "broken").find("this package is broken on purpose"), std::string::npos)
      << Error(port, "broken");
  EXPECT_FALSE(WaitReady(port, "foreign", 60));
  EXPECT_NE(Error(port, "foreign").find("package was compiled for "), std::string::npos) << Error(port, "foreign");
  EXPECT_NE(Error(port, "foreign").find("CPUs, this machine is"), std::string::npos) << Error(port, "foreign");
  EXPECT_FALSE(WaitReady(port, "cuda", 60));
  EXPECT_NE(Error(port, "cuda").find("package was built for cuda; this machine has none"), std::string::npos)
      << Error(port, "cuda");
  std::string out;
  ASSERT_EQ(RunAotid({"--config", config, "--store", store, "show", "broken"}, &out), 0) << out;
  EXPECT_NE(out.find("this package is broken on purpose"), std::string::npos) << out;
  EXPECT_TRUE(Entries(store, TestData("broken_src.pt2")).empty());
  // show gives the failed build's whole log, and a built one's.
  std::smatch log;
  ASSERT_TRUE(std::regex_search(out, log, std::regex("build log       (\\S+)"))) << out;
  EXPECT_NE(fs::ReadFile(log[1]).value_or("").find("this package is broken on purpose"), std::string::npos)
      << log[1];
  ASSERT_EQ(RunAotid({"--config", config, "--store", store, "show", "src"}, &out), 0) << out;
  ASSERT_TRUE(std::regex_search(out, log, std::regex("build log       (\\S+)"))) << out;
  EXPECT_EQ(std::string(log[1]), Entries(store, TestData("mlp_src.pt2")).at(0) + "/build.log");
  ExpectCasesMatchEager(port, "src", "mlp");
  // Built by aotid itself: the entries' logs are the internal build's.
  for (const char* file : {"mlp_so.pt2", "mlp_src.pt2"}) {
    auto entries = Entries(store, TestData(file));
    ASSERT_EQ(entries.size(), 1u) << file;
    std::string log = fs::ReadFile(entries[0] + "/build.log").value_or("");
    EXPECT_NE(log.find("[aotid-build] step 3/3: writing the build"), std::string::npos) << log;
  }
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();
}

// Fills the .text section of a shared object with `byte`, keeping its size.
bool OverwriteText(const std::string& so, char byte) {
  std::string cmd = "readelf -SW '" + so + "' | awk '$2 == \".text\" {print $5, $6}'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  unsigned long offset = 0, size = 0;
  int n = std::fscanf(p, "%lx %lx", &offset, &size);
  ::pclose(p);
  if (n != 2 || size == 0) return false;
  FILE* f = std::fopen(so.c_str(), "r+b");
  if (f == nullptr) return false;
  std::fseek(f, static_cast<long>(offset), SEEK_SET);
  std::string fill(size, byte);
  bool ok = std::fwrite(fill.data(), 1, fill.size(), f) == fill.size();
  std::fclose(f);
  return ok;
}

// kill -9 of the daemon mid-build leaves no cache entry, and the next start
// builds again and serves; a build killed under a live daemon is retried;
// an entry with a truncated model.so is rebuilt, not loaded.
TEST(Packages, CacheSurvivesKillsAndTruncation) {
  TempDir dir;
  std::string store = dir / "store", config = dir / "aotid.toml";
  ASSERT_OK(fs::WriteFileAtomic(config, "[build]\nretry_initial_s = 1\n"));
  Aotid({"--config", config, "--store", store, "add", TestData("mlp2.pt2"), "--name", "m"});
  std::vector<std::string> args = {"--config", config, "--store", store, "--listen", "127.0.0.1:0"};
  {
    auto d = DaemonProcess::Start(args, dir / "daemon1.log");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_TRUE(WaitFor([&] { return !Pids(store + "/cache/.staging").empty(); }, 60)) << (*d)->Log();
    // Well into the build: Inductor writes its files (in the scratch
    // directory the daemon made empty for it).
    ASSERT_TRUE(WaitFor(
        [&] {
          // .staging/<the daemon's own>/<the build>/
          std::error_code ec;
          for (const auto& owner : std::filesystem::directory_iterator(store + "/cache/.staging", ec)) {
            std::error_code inner;
            for (const auto& e : std::filesystem::directory_iterator(owner.path(), inner)) {
              if (!std::filesystem::is_empty(e.path() / ".inductor/tmp", inner) && !inner) return true;
            }
          }
          return false;
        },
        60))
        << (*d)->Log();
    EXPECT_EQ((*d)->Kill(), 137);
  }
  // The worker dies with its daemon; nothing half-built is in the cache.
  EXPECT_TRUE(WaitFor([&] { return Pids(store + "/cache/.staging").empty(); }, 30));
  EXPECT_TRUE(Entries(store, TestData("mlp2.pt2")).empty());

  auto d = DaemonProcess::Start(args, dir / "daemon2.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  int port = (*d)->port();
  // This store's compile worker (not another test's, on the same machine).
  const std::string worker = "aotid_worker.compile --artifact " + store + "/";
  // Kill the worker this time: a failure that may pass, so it is retried.
  ASSERT_TRUE(WaitFor([&] { return !Pids(worker).empty(); }, 60)) << (*d)->Log();
  for (pid_t p : Pids(worker)) ::kill(p, SIGKILL);
  ASSERT_TRUE(WaitReady(port, "m")) << Error(port, "m") << "\n" << (*d)->Log();
  ExpectCasesMatchEager(port, "m", "mlp2");
  EXPECT_EQ(CountEvents(store, "build_retry", "killed by signal 9"), 1);
  std::string out;
  ASSERT_EQ(RunAotid({"--store", store, "show", "m"}, &out), 0) << out;
  EXPECT_NE(out.find("attempt 2"), std::string::npos) << out;
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();

  auto entries = Entries(store, TestData("mlp2.pt2"));
  ASSERT_EQ(entries.size(), 1u);
  std::string so = entries[0] + "/model.so";
  ASSERT_EQ(::truncate(so.c_str(), 4096), 0);
  d = DaemonProcess::Start(args, dir / "daemon3.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(WaitReady((*d)->port(), "m")) << (*d)->Log();
  ExpectCasesMatchEager((*d)->port(), "m", "mlp2");
  EXPECT_EQ(CountEvents(store, "cache_invalid", "model.so is 4096 bytes"), 1);
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();

  // The model's code overwritten in place with breakpoints, its size kept:
  // loading it kills its runner (once it killed the daemon, at every
  // start); the daemon finds the digest wrong and rebuilds it at once.
  entries = Entries(store, TestData("mlp2.pt2"));
  ASSERT_EQ(entries.size(), 1u);
  ASSERT_TRUE(OverwriteText(entries[0] + "/model.so", '\xcc'));
  d = DaemonProcess::Start(args, dir / "daemon4.log");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(WaitReady((*d)->port(), "m")) << (*d)->Log();
  ExpectCasesMatchEager((*d)->port(), "m", "mlp2");
  EXPECT_TRUE((*d)->Alive());
  EXPECT_EQ(CountEvents(store, "cache_invalid", "does not match the digest"), 1);

  // A version removed while it builds: the build is cancelled, and leaves
  // nothing behind.
  Aotid({"--store", store, "add", TestData("mlp.pt2"), "--name", "gone"});
  ASSERT_TRUE(WaitFor([&] { return !Pids(worker).empty(); }, 60)) << (*d)->Log();
  Aotid({"--store", store, "rm", "gone"});
  EXPECT_TRUE(WaitFor([&] { return Pids(worker).empty(); }, 30)) << (*d)->Log();
  EXPECT_TRUE(WaitFor([&] { return (*d)->Log().find("cancelling the build of") != std::string::npos; }, 5));
  EXPECT_TRUE(Entries(store, TestData("mlp.pt2")).empty());
  EXPECT_EQ(Get((*d)->port(), "/v2/models/gone").status, 404);
  ExpectCasesMatchEager((*d)->port(), "m", "mlp2");
  EXPECT_EQ((*d)->Stop(), 0) << (*d)->Log();

  // `aotid cache`: the entry, who uses it, and pruning it once nothing does.
  ASSERT_EQ(RunAotid({"--store", store, "cache", "ls"}, &out), 0) << out;
  EXPECT_NE(out.find("ok         m:1"), std::string::npos) << out;
  ASSERT_EQ(RunAotid({"--store", store, "cache", "prune"}, &out), 0) << out;
  EXPECT_NE(out.find("removed 0 cache entries"), std::string::npos) << out;
  Aotid({"--store", store, "rm", "m"});
  ASSERT_EQ(RunAotid({"--store", store, "cache", "prune", "--dry-run"}, &out), 0) << out;
  EXPECT_NE(out.find("no stored version uses it"), std::string::npos) << out;
  EXPECT_EQ(Entries(store, TestData("mlp2.pt2")).size(), 1u);
  ASSERT_EQ(RunAotid({"--store", store, "cache", "prune"}, &out), 0) << out;
  EXPECT_NE(out.find("removed 1 cache entries"), std::string::npos) << out;
  EXPECT_TRUE(Entries(store, TestData("mlp2.pt2")).empty());
}

}  // namespace
}  // namespace aotid::testing
