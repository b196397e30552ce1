// The parts of sync that need no registry: references, digests, the
// daemon's timer (with a sync of the test's own) and its status file.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "base/fake_clock.h"
#include "base/fs.h"
#include "sync/model_sync.h"
#include "sync/registry.h"
#include "sync/syncer.h"
#include "test_util.h"

namespace aotid::sync {
namespace {

TEST(OciRef, ParsesHostPortRepoAndTagAndUsesTlsOffLoopback) {
  auto r = ParseOciRef("oci://registry.example.com/models/mlp:stable", false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->host, "registry.example.com");
  EXPECT_EQ(r->port, 0);
  EXPECT_EQ(r->repo, "models/mlp");
  EXPECT_EQ(r->tag, "stable");
  EXPECT_FALSE(r->plain_http);
  EXPECT_EQ(r->Origin(), "https://registry.example.com");

  r = ParseOciRef("oci://127.0.0.1:5000/a/b-c/d_e", false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->port, 5000);
  EXPECT_EQ(r->tag, "");
  EXPECT_TRUE(r->plain_http);  // loopback
  EXPECT_EQ(r->ToString(), "oci://127.0.0.1:5000/a/b-c/d_e");
  r = ParseOciRef("oci://[::1]:5000/m:v1", false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->host, "[::1]");
  EXPECT_TRUE(r->plain_http);
  EXPECT_TRUE(ParseOciRef("oci://10.0.0.5:5000/m:v1", true)->plain_http);  // --insecure
  EXPECT_TRUE(ParseOciRef("oci://127.1.2.3:5000/m:v1", false)->plain_http);
  EXPECT_TRUE(ParseOciRef("oci://localhost:5000/m:v1", false)->plain_http);
  // Names that only look like loopback are anyone's DNS: TLS, unless --insecure.
  for (const char* look_alike : {"oci://127.example.com:5000/m:v1", "oci://127.0.0.1.nip.io/m:v1",
                                 "oci://localhost.example.com/m:v1"}) {
    auto p = ParseOciRef(look_alike, false);
    ASSERT_TRUE(p.ok()) << look_alike << ": " << p.status().ToString();
    EXPECT_FALSE(p->plain_http) << look_alike;
  }

  for (const std::string& bad : std::vector<std::string>{
           "http://host/m", "oci://host", "oci:///m", "oci://host:0/m", "oci://host:99999/m",
           "oci://host/Upper", "oci://host/m:", "oci://host/m:-x", "oci://host/../m", "oci://host/m//n",
           "oci://host/m:" + std::string(129, 'a')}) {
    auto p = ParseOciRef(bad, false);
    EXPECT_FALSE(p.ok()) << bad;
    if (!p.ok()) EXPECT_NE(p.status().message().find("is not an OCI reference"), std::string::npos) << bad;
  }
  // Credentials in a reference would show in logs and `ps`: refused, and the error does not echo them.
  auto creds = ParseOciRef("oci://alice:s3cret@host/m:v1", false);
  ASSERT_FALSE(creds.ok());
  EXPECT_NE(creds.status().message().find("--credentials"), std::string::npos) << creds.status().message();
  EXPECT_EQ(creds.status().message().find("s3cret"), std::string::npos) << creds.status().message();
}

TEST(OciRef, OnlyCanonicalSha256DigestsAreValid) {
  std::string hex(64, 'a');
  EXPECT_TRUE(IsValidDigest("sha256:" + hex));
  for (const std::string& bad :
       std::vector<std::string>{"sha256:" + std::string(63, 'a'), "sha256:" + std::string(64, 'A'),
                                "sha512:" + hex, "sha256:../../etc/passwd", "sha256:" + hex + "/", hex,
                                std::string("sha256:") + std::string(60, 'a') + "../x"}) {
    EXPECT_FALSE(IsValidDigest(bad)) << bad;
  }
}

// What a hostile registry sends where aotid expects other types, or text
// meant for a terminal: refused with a message that is printable and
// short. (A string schemaVersion once aborted sync and the daemon with an
// exception from the JSON library.)
TEST(RegistryDocuments, WrongTypesAndHostileTextAreRefusedNotThrown) {
  RegistryLimits limits;
  const std::string digest = "sha256:" + std::string(64, 'a');
  for (const std::string& manifest :
       {std::string(R"({"schemaVersion":"2","config":"x","layers":{"a":1}})"),
        std::string(R"({"schemaVersion":null})"), std::string(R"({"schemaVersion":[2]})"),
        std::string(R"({"schemaVersion":2.5})"), std::string(R"({"schemaVersion":2,"config":[],"layers":7})"),
        std::string(
            R"({"schemaVersion":2,"artifactType":"application/vnd.aotid.model.v1","config":{"digest":")") +
            digest + R"(","size":-5},"layers":[]})"}) {
    auto m = ParseManifest(manifest, limits);
    ASSERT_FALSE(m.ok()) << manifest;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << manifest << ": " << m.status().ToString();
  }
  EXPECT_NE(ParseManifest(
                R"({"schemaVersion":2,"artifactType":"application/vnd.aotid.model.v1","config":{"digest":")" +
                    digest + R"(","size":-5},"layers":[]})",
                limits)
                .status()
                .message()
                .find("config size is negative"),
            std::string::npos);
  for (const std::string& config :
       {std::string(R"({"settings":{"device":"\u001b[31mFAKE\nsynced oci://evil"}})"),
        std::string(R"({"settings":{"max_batch_size":")") + std::string(900000, '9') + "\"}}",
        std::string(R"({"settings":[1,2]})"), std::string(R"({"package_model":7,"settings":{"device":3}})"),
        std::string("[") + std::string(100000, '9') + "]"}) {
    auto c = ParseRemoteConfig(config);
    ASSERT_FALSE(c.ok()) << config.substr(0, 80);
    const std::string& m = c.status().message();
    EXPECT_LE(m.size(), 400u) << m.substr(0, 400);
    EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(Artifact, ManifestNamesTheConfigAndThePackageByDigest) {
  storage::ModelVersion v;
  v.model = "mlp";
  v.version = 3;
  v.artifact = std::string(64, 'b');
  v.size = 1234;
  v.settings.max_batch_size = 8;
  std::string config = MakeConfig(v, R"({"author": "x"})");
  auto c = nlohmann::json::parse(config);
  EXPECT_EQ(c["name"], "mlp");
  EXPECT_EQ(c["settings"]["max_batch_size"], "8");
  EXPECT_EQ(c["metadata"]["author"], "x");
  auto m = nlohmann::json::parse(MakeManifest(config, v, "mlp-3.pt2"));
  EXPECT_EQ(m["artifactType"], kArtifactType);
  EXPECT_EQ(m["config"]["mediaType"], kConfigMediaType);
  EXPECT_EQ(m["config"]["digest"], "sha256:" + fs::Sha256Hex(config));
  ASSERT_EQ(m["layers"].size(), 1u);
  EXPECT_EQ(m["layers"][0]["digest"], "sha256:" + v.artifact);
  EXPECT_EQ(m["layers"][0]["size"], 1234);
  EXPECT_EQ(m["layers"][0]["mediaType"], kPackageMediaType);
}

TEST(Syncer, BackoffDoublesFromFiveSecondsUpToTheInterval) {
  EXPECT_EQ(Syncer::BackoffMs(1, 300), 5000);
  EXPECT_EQ(Syncer::BackoffMs(2, 300), 10000);
  EXPECT_EQ(Syncer::BackoffMs(4, 300), 40000);
  EXPECT_EQ(Syncer::BackoffMs(20, 300), 300000);
  EXPECT_EQ(Syncer::BackoffMs(1, 2), 2000);  // never longer than the interval
}

// Counts calls, and lets a test wait (bounded) for a count.
class Calls {
 public:
  void Add(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[key];
    cv_.notify_all();
  }
  int Get(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_[key];
  }
  bool AwaitAtLeast(const std::string& key, int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return counts_[key] >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> counts_;
};

// Each source is synced at once, then on its interval; a failure is tried
// again after the backoff. The schedule follows the steady clock: a step of
// the wall clock moves the times it reports, not when syncs run.
TEST(Syncer, SyncsEachSourceAtOnceThenOnItsTimerAndWritesItsStatus) {
  aotid::testing::TempDir dir;
  aotid::testing::FakeClock clock;
  std::string status_file = dir.path() + "/sync-status.json";
  Calls calls;
  SyncOnce once = [&](const SyncSource& s, const std::atomic<bool>&, const MayAdd&) -> StatusOr<std::string> {
    if (s.source.ends_with("a:1")) {
      calls.Add("a");
      return std::string("up to date: a:1");
    }
    calls.Add("b");
    return Unavailable("the registry is down");
  };
  {
    Syncer syncer({{"oci://127.0.0.1:1/a:1", 1}, {"oci://127.0.0.1:1/b:1", 300}}, once, status_file, &clock);
    ASSERT_TRUE(calls.AwaitAtLeast("a", 1) && calls.AwaitAtLeast("b", 1));
    ASSERT_TRUE(clock.AwaitWaiters(1));  // both done; asleep until the next is due
    auto st = syncer.Status();
    ASSERT_EQ(st.size(), 2u);
    EXPECT_TRUE(st[0].ok);
    EXPECT_EQ(st[0].message, "up to date: a:1");
    EXPECT_FALSE(st[1].ok);
    EXPECT_EQ(st[1].failures, 1);
    EXPECT_EQ(st[1].message, "the registry is down");
    EXPECT_EQ(st[1].last_at_ms, clock.WallMs());
    // A failure is tried again after ~5 s (jittered), not after 300 s.
    const int64_t b_wait = st[1].next_at_ms - st[1].last_at_ms;
    EXPECT_GE(b_wait, 4000);
    EXPECT_LE(b_wait, 6000);
    const int64_t a_wait = st[0].next_at_ms - st[0].last_at_ms;  // 1 s, jittered
    EXPECT_GE(a_wait, 800);
    EXPECT_LE(a_wait, 1200);
    // What the daemon wrote is what `aotid sync status` reads.
    auto written = ReadSyncStatus(status_file);
    ASSERT_EQ(written.size(), 2u);
    EXPECT_EQ(written[1].source, "oci://127.0.0.1:1/b:1");
    EXPECT_EQ(written[1].message, "the registry is down");
    EXPECT_EQ(written[1].next_at_ms, st[1].next_at_ms);

    // Not yet due: nothing runs.
    clock.Advance(a_wait - 1);
    ASSERT_TRUE(clock.AwaitWaiters(1));
    EXPECT_EQ(calls.Get("a"), 1);
    // The wall clock steps back an hour: a is due a millisecond from now
    // all the same, and the time reported moves with the wall clock.
    clock.StepWall(-3600 * 1000);
    EXPECT_EQ(syncer.Status()[0].next_at_ms, clock.WallMs() + 1);
    clock.Advance(1);
    ASSERT_TRUE(calls.AwaitAtLeast("a", 2));
    ASSERT_TRUE(clock.AwaitWaiters(1));
    EXPECT_EQ(calls.Get("b"), 1);
    st = syncer.Status();
    EXPECT_EQ(st[0].runs_ok, 2);
    EXPECT_EQ(st[0].runs_failed, 0);
    EXPECT_EQ(st[1].runs_ok, 0);
    EXPECT_EQ(st[1].runs_failed, 1);

    // b's retry comes once its wait is over, and backs off: ~10 s next.
    clock.Advance(b_wait - a_wait);
    ASSERT_TRUE(calls.AwaitAtLeast("b", 2));
    ASSERT_TRUE(clock.AwaitWaiters(1));
    st = syncer.Status();
    EXPECT_EQ(st[1].failures, 2);
    EXPECT_GE(st[1].next_at_ms - st[1].last_at_ms, 8000);
    EXPECT_LE(st[1].next_at_ms - st[1].last_at_ms, 12000);

    // A reload with another source: synced at once; b is gone.
    const int a_before = calls.Get("a");
    syncer.SetSources({{"oci://127.0.0.1:1/a:1", 1}});
    EXPECT_EQ(syncer.Status().size(), 1u);
    ASSERT_TRUE(calls.AwaitAtLeast("a", a_before + 1));
  }  // stops, joining the thread
  EXPECT_EQ(clock.Waiters(), 0);
}

// Two sources feeding one model would replace each other's version at
// every sync: the second is refused while the first is configured, and
// takes over once a reload removes it.
TEST(Syncer, ASecondSourceOfOneModelIsRefusedWhileTheFirstFeedsIt) {
  std::mutex mu;
  std::condition_variable synced;
  std::map<std::string, std::vector<bool>> allowed;  // source: may_add("mlp") each time
  SyncOnce once = [&](const SyncSource& s, const std::atomic<bool>&,
                      const MayAdd& may_add) -> StatusOr<std::string> {
    Status st = may_add("mlp");
    std::lock_guard<std::mutex> lock(mu);
    allowed[s.source].push_back(st.ok());
    synced.notify_all();
    if (!st.ok()) {
      EXPECT_NE(st.message().find("is synced from oci://127.0.0.1:1/a:1 too"), std::string::npos)
          << st.message();
      return st;
    }
    return std::string("added mlp");
  };
  auto count_locked = [&](const std::string& source, bool ok) {
    return std::count(allowed[source].begin(), allowed[source].end(), ok);
  };
  auto count = [&](const std::string& source, bool ok) {
    std::lock_guard<std::mutex> lock(mu);
    return count_locked(source, ok);
  };
  // Until `done` holds of what the syncs saw (bounded: 10 s).
  auto await_syncs = [&](const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu);
    return synced.wait_for(lock, std::chrono::seconds(10), done);
  };
  Syncer syncer({{"oci://127.0.0.1:1/a:1", 300}}, once, "");
  ASSERT_TRUE(await_syncs([&] { return count_locked("oci://127.0.0.1:1/a:1", true) == 1; }));
  syncer.SetSources({{"oci://127.0.0.1:1/a:1", 300}, {"/srv/models", 300}});
  ASSERT_TRUE(await_syncs([&] { return count_locked("/srv/models", false) >= 1; }));
  EXPECT_EQ(count("/srv/models", true), 0);
  auto st = syncer.Status();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_FALSE(st[1].ok);
  syncer.SetSources({{"/srv/models", 300}});  // the first goes: the folder may feed mlp now
  ASSERT_TRUE(await_syncs([&] { return count_locked("/srv/models", true) == 1; }));
}

}  // namespace
}  // namespace aotid::sync
