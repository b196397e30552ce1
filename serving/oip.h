// The Open Inference Protocol's calls as aotid answers them, under both of
// its front ends: HTTP (http_api.h) and gRPC (grpc_api.h). What a call
// means lives here once: which served version a name and version pick,
// whether the server and a model are ready, what the repository index
// lists, the token, and the path of an inference (resolve, readiness,
// decode against the model's contract, client-gone check, the run through
// the batcher, the metrics). A front end reads its wire form and writes its
// answer; it decides nothing the other could decide differently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/tensor.h"
#include "serving/metrics.h"
#include "serving/model_registry.h"
#include "serving/tensor_codec.h"

namespace aotid::serving {

// The server's name and the protocol extensions it serves, as the server
// metadata call lists them.
inline constexpr char kServerName[] = "aotid";
std::vector<std::string> ServerExtensions();

// The served version a call names; `version` empty picks the newest ready
// one. NotFound for a name the store does not know or a version it does
// not serve (naming those it does), Unavailable for a model that is
// unloaded, InvalidArgument for a name or version that is not one.
StatusOr<std::shared_ptr<const ServedModel>> ResolveModel(const ModelRegistry* registry,
                                                          const std::string& name,
                                                          const std::string& version);

// Why a version that is not ready does not answer (Unavailable, naming it
// and its state).
Status NotReady(const ServedModel& m);

// Whether `m` answers a request now: not ready (NotReady), or ready yet
// too large for the memory budget beside what always stays (every request
// would be refused), are Unavailable.
Status AnswersNow(const ModelRegistry* registry, const ServedModel& m);

// Server readiness: the start-up is done and every version that should be
// served (enabled, and its model's version policy wants it) answers
// requests; with `needs_resident` each must also be loaded, and a server
// with nothing to serve is not ready.
struct ServerReadiness {
  struct Waiting {
    std::string name;
    int64_t version = 0;
    std::string state;      // "queued", "building", ...
    std::string residency;  // where loading is what it waits for
    std::string reason;
  };
  bool ready = false;
  std::string reason;            // "starting", "no model is served", or ""
  std::vector<Waiting> waiting;  // the first 20 not ready
  size_t not_ready = 0;          // all of them
};
ServerReadiness CheckServerReady(const ModelRegistry* registry, bool needs_resident);

// One line of the repository index: every version in the store, served or
// not. `state` is READY, LOADING or UNAVAILABLE, as Triton names them.
struct RepositoryEntry {
  std::string name;
  int64_t version = 0;
  std::string state;
  std::string reason;
};
std::vector<RepositoryEntry> RepositoryIndex(const ModelRegistry* registry, bool only_ready);

// The bearer token. `needed` says whether this call needs it (the
// repository calls always do; the others when the token is for all), and
// `authorization` is the request's "Authorization" value (null: none).
// kMissing: none was sent; kWrong: not "Bearer <token>". Each front end
// answers them as its protocol does (401 and 403; UNAUTHENTICATED and
// PERMISSION_DENIED).
enum class TokenCheck { kOk, kMissing, kWrong };
TokenCheck CheckToken(const std::string& token, bool needed, const std::string* authorization);

// What the repository's load and unload calls ask of the control plane:
// enable (load) or disable (unload) the model in the store, and act on it.
// It must not block: it calls `done` once, later, on any thread, with OK
// once the served models show the change (or its time to show it has
// passed), or why it could not be made.
using ModelControl =
    std::function<void(const std::string& name, bool enable, std::function<void(Status)> done)>;

// Why a load that names a parameter (Triton's "config" or "file:..." to
// load instead of what the repository holds) is refused: a model's files
// and settings come from the store.
Status LoadParameterRefused(const std::string& name);

// ---- inference ----

// Counts one inference in the metrics once its answer is made: its status
// (HTTP's, or the HTTP status a gRPC code stands for), its times, and the
// end of its in-flight count.
class InferRecord {
 public:
  InferRecord(Metrics* metrics, std::shared_ptr<const ServedModel> model);
  // Once; later calls are ignored.
  void Answered(int http_status);
  void SetComputeSeconds(double s) { compute_s_ = s; }

 private:
  Metrics* metrics_;
  std::shared_ptr<const ServedModel> model_;
  Metrics::InFlight in_flight_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double compute_s_ = 0;
  std::atomic<bool> answered_{false};
};

// How an inference ended, for its front end to answer.
struct InferOutcome {
  Status status;             // OK, or why there are no outputs
  bool retry_later = false;  // refused while its model is on its way (not failed): worth a retry
  std::shared_ptr<const ServedModel> model;     // null when the name picked none
  std::shared_ptr<const InferRequest> request;  // null when refused before it was decoded
  std::vector<model::HostTensor> outputs;
  // Null when the request is not counted (its name picked no model: the
  // name is the caller's, not a model's). The front end calls Answered()
  // once its answer is made.
  std::shared_ptr<InferRecord> record;
};

// The front end's reading of its wire form against the model's contract
// (tensor_codec.h): the same checks, the same errors, either way.
using InferDecode = std::function<StatusOr<InferRequest>(const model::ModelSpec&)>;

// Runs one inference: resolves the model, refuses one that is not ready,
// decodes against its contract, refuses a client that has gone (`gone`,
// also asked by the batcher before the run; empty: never), and runs it
// (in turn with a language model's sequences, batched for a model that
// batches). `answer` runs once: on this thread when the request is
// refused before it runs, otherwise on one of the model's threads.
void RunInfer(const ModelRegistry* registry, Metrics* metrics, const std::string& name,
              const std::string& version, const InferDecode& decode, std::function<bool()> gone,
              std::function<void(InferOutcome)> answer);

}  // namespace aotid::serving
