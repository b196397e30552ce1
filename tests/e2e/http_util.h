// HTTP and store helpers shared by the end-to-end tests: a real client
// over loopback, bounded polls, and comparison against eager outputs.
#pragma once

#include <sys/types.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace aotid::testing {

using json = nlohmann::json;

struct Reply {
  int status = 0;
  json body;
};

Reply Post(int port, const std::string& path, const std::string& body);
Reply Get(int port, const std::string& path);

// Polls until the model is ready; false when it failed or `timeout_s` passed.
// The default bound covers two cold compiles on 2 cores.
bool WaitReady(int port, const std::string& model, int timeout_s = 900);

// Events of `kind` in the store whose message contains `contains`.
int CountEvents(const std::string& store_dir, const std::string& kind, const std::string& contains = "");

// Every output of every recorded case matches eager PyTorch.
// `cases_of` names the exported model whose cases apply (default: `model`).
void ExpectCasesMatchEager(int port, const std::string& model, std::string cases_of = "");

// Polls `done` every 50 ms until it holds or `timeout_s` passes.
bool WaitFor(const std::function<bool()>& done, int timeout_s);

// Processes whose command line contains `needle`.
std::vector<pid_t> Pids(const std::string& needle);

bool OutputsMatch(const json& got, const json& want);

}  // namespace aotid::testing
