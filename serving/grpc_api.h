// The Open Inference Protocol over gRPC: service inference.GRPCInferenceService
// (rpc/oip.proto) over aotid's gRPC transport (rpc/server.h).
//
// The same calls as the HTTP routes, answered by the same code (oip.h):
// health, metadata, inference and Triton's model repository calls. Tensors
// come as raw_input_contents or typed contents, and go back as
// raw_output_contents (tritonclient.grpc reads nothing else). Status codes:
// NOT_FOUND (unknown model), INVALID_ARGUMENT (a tensor that does not fit,
// named as HTTP names it), UNAVAILABLE (building, loading, unloaded),
// RESOURCE_EXHAUSTED (a full queue, or over a fixed limit),
// UNAUTHENTICATED and PERMISSION_DENIED (the token, in the "authorization"
// metadata as "Bearer <token>"), CANCELLED (the client went away: a
// request still waiting is not run). None of its calls streams.
//
// The standard health service (grpc.health.v1) answers, with no token,
// for "" (and "ready", and "inference.GRPCInferenceService"): SERVING
// when ServerReady would say ready; and for "live": SERVING while the
// daemon answers at all. A Kubernetes liveness probe names "live", or a
// model that builds for minutes would have its daemon restarted.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "rpc/server.h"
#include "serving/metrics.h"
#include "serving/model_registry.h"
#include "serving/oip.h"
#include "serving/tensor_codec.h"

namespace inference {
class ModelInferRequest;
}

namespace aotid::serving {

struct GrpcOptions {
  rpc::ServerOptions server;  // where it listens and what it bounds
  std::string token;          // as HttpOptions::token
  bool token_for_all = true;  // false: only the repository calls need it
  bool ready_needs_resident = false;
  // Threads that run inferences (gRPC's own few never wait on a model),
  // and the calls that may wait for one; more are RESOURCE_EXHAUSTED.
  int threads = 8;
  int max_waiting = 1024;

  bool operator==(const GrpcOptions&) const = default;
};

// The gRPC code a Status answers with.
int GrpcCodeFor(const Status& s);

// A ModelInfer request's tensors decoded against `spec`, as ModelInfer
// decodes them: raw_input_contents (one per input) or typed contents
// (checked to fit their datatype), the outputs' parameters, then the
// shared decode (DecodeWireRequest). `storage` keeps the bytes of typed
// contents while the decode reads them.
StatusOr<InferRequest> DecodeGrpcInfer(const inference::ModelInferRequest& req, const model::ModelSpec& spec,
                                       std::vector<std::string>* storage);

class GrpcApi {
 public:
  // `metrics` and `registry` must outlive the server.
  GrpcApi(const ModelRegistry* registry, Metrics* metrics, GrpcOptions options);
  ~GrpcApi();

  Status Bind();
  int port() const;
  std::string Address() const;  // "127.0.0.1:8766"
  void Serve();                 // accepts until Stop(), on the calling thread
  void Stop();                  // safe from any thread
  // The repository's load and unload; without it they are UNAVAILABLE.
  // Set before Serve().
  void OnRepositoryCommand(ModelControl control);
  // A reload's token and its scope: calls that start after it are admitted
  // by them. Safe from any thread.
  void UpdateAccess(const std::string& token, bool token_for_all);

 private:
  class Service;
  const ModelRegistry* registry_;
  GrpcOptions options_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<rpc::Server> server_;
};

}  // namespace aotid::serving
