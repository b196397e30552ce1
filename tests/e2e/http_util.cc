#include "e2e/http_util.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/fs.h"
#include "base/poll.h"
#include "storage/model_store.h"
#include "test_util.h"

namespace aotid::testing {

Reply Post(int port, const std::string& path, const std::string& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post(path.c_str(), body, "application/json");
  if (!r) return {};
  return {r->status, json::parse(r->body, nullptr, false)};
}

Reply Get(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get(path.c_str());
  if (!r) return {};
  return {r->status, json::parse(r->body, nullptr, false)};
}

// Polls until the model is ready; the bound covers two cold compiles on 2 cores.
bool WaitReady(int port, const std::string& model, int timeout_s) {
  bool ready = false;
  PollUntil(
      [&] {
        Reply r = Get(port, "/v2/models/" + model + "/ready");
        ready = r.status == 200;
        return ready || (r.status == 503 && r.body.value("state", "") == "failed");
      },
      timeout_s, 200);
  return ready;
}

int CountEvents(const std::string& store_dir, const std::string& kind, const std::string& contains) {
  auto store = storage::ModelStore::Open(store_dir, false);
  if (!store.ok()) return -1;
  auto events = (*store)->ListEvents(0, 100000);
  int n = 0;
  for (const auto& e : *events) {
    if (e.kind == kind && e.message.find(contains) != std::string::npos) ++n;
  }
  return n;
}

// Every output of every recorded case matches eager PyTorch.
// `cases_of` names the exported model whose cases apply (default: `model`).
void ExpectCasesMatchEager(int port, const std::string& model, std::string cases_of) {
  if (cases_of.empty()) cases_of = model;
  json cases = json::parse(*fs::ReadFile(TestData("cases.json")));
  ASSERT_TRUE(cases.contains(cases_of));
  for (const auto& c : cases[cases_of]) {
    json req{{"id", "case"}, {"inputs", c["inputs"]}};
    Reply r = Post(port, "/v2/models/" + model + "/infer", req.dump());
    ASSERT_EQ(r.status, 200) << r.body.dump();
    EXPECT_EQ(r.body["model_name"], model);
    EXPECT_EQ(r.body["id"], "case");
    ASSERT_EQ(r.body["outputs"].size(), c["outputs"].size());
    for (size_t i = 0; i < c["outputs"].size(); ++i) {
      const json& want = c["outputs"][i];
      const json& got = r.body["outputs"][i];
      EXPECT_EQ(got["name"], want["name"]);
      EXPECT_EQ(got["datatype"], want["datatype"]);
      EXPECT_EQ(got["shape"], want["shape"]);
      ASSERT_EQ(got["data"].size(), want["data"].size());
      for (size_t k = 0; k < want["data"].size(); ++k) {
        double w = want["data"][k].get<double>(), g = got["data"][k].get<double>();
        EXPECT_NEAR(g, w, 1e-5 + 1e-5 * std::fabs(w)) << model << " output " << i << " element " << k;
      }
    }
  }
}

bool WaitFor(const std::function<bool()>& done, int timeout_s) { return PollUntil(done, timeout_s); }

bool OutputsMatch(const json& got, const json& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i]["shape"] != want[i]["shape"] || got[i]["data"].size() != want[i]["data"].size()) return false;
    for (size_t k = 0; k < want[i]["data"].size(); ++k) {
      double w = want[i]["data"][k].get<double>(), g = got[i]["data"][k].get<double>();
      if (std::fabs(g - w) > 1e-5 + 1e-5 * std::fabs(w)) return false;
    }
  }
  return true;
}

std::vector<pid_t> Pids(const std::string& needle) {
  // ps rather than /proc, which macOS does not have: "PID ARGS" a line,
  // arguments joined by spaces, never cut (-ww).
  std::vector<pid_t> out;
  FILE* ps = ::popen("ps -A -ww -o pid= -o args=", "r");
  if (ps == nullptr) return out;
  std::string line;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, ps) != nullptr) {
    line += buf;
    if (line.back() != '\n' && !std::feof(ps)) continue;  // a line longer than buf
    size_t start = line.find_first_not_of(' ');
    size_t end = start == std::string::npos ? start : line.find(' ', start);
    if (end != std::string::npos && line.find(needle, end) != std::string::npos) {
      out.push_back(static_cast<pid_t>(std::stol(line.substr(start, end - start))));
    }
    line.clear();
  }
  ::pclose(ps);
  return out;
}

}  // namespace aotid::testing
