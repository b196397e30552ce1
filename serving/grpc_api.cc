#include "serving/grpc_api.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <thread>
#include <utility>

#include "base/log.h"
#include "rpc/oip.grpc.pb.h"
#include "serving/http_api.h"

namespace aotid::serving {
namespace {

using model::DType;

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(GrpcCodeFor(s)), s.message());
}

// The typed list `contents` holds for `dtype`, as little-endian bytes, with
// a count that must be `n`. Narrower integers are checked to fit.
template <typename To, typename List>
Status PutAll(const std::string& who, const char* field, const List& list, int64_t n, std::string* out) {
  if (static_cast<int64_t>(list.size()) != n) {
    return InvalidArgument(who + ": contents." + field + " has " + std::to_string(list.size()) +
                           " elements, its shape needs " + std::to_string(n));
  }
  out->resize(list.size() * sizeof(To));
  char* p = out->data();
  for (const auto& v : list) {
    if constexpr (!std::is_same_v<To, float> && !std::is_same_v<To, double> && !std::is_same_v<To, bool>) {
      if (v < std::numeric_limits<To>::min() || v > std::numeric_limits<To>::max()) {
        return InvalidArgument(who + ": contents." + field + " holds " + std::to_string(v) +
                               ", out of range for its datatype");
      }
    }
    To x = static_cast<To>(v);
    std::memcpy(p, &x, sizeof x);
    p += sizeof x;
  }
  return Status::OK();
}

// Typed contents as the raw bytes the shared decode reads.
Status TypedToBytes(const std::string& who, const inference::ModelInferRequest::InferInputTensor& in,
                    std::string* out) {
  DType dtype;
  if (!model::ParseDType(in.datatype(), &dtype)) return Status::OK();  // the decode names the datatype
  const int64_t n = model::NumElements({in.shape().begin(), in.shape().end()});
  if (n < 0) return Status::OK();  // the decode names the shape
  const inference::InferTensorContents& c = in.contents();
  const char* want = nullptr;
  Status s;
  switch (dtype) {
    case DType::kBool:
      want = "bool_contents";
      s = PutAll<bool>(who, want, c.bool_contents(), n, out);
      break;
    case DType::kInt8:
      want = "int_contents";
      s = PutAll<int8_t>(who, want, c.int_contents(), n, out);
      break;
    case DType::kInt16:
      want = "int_contents";
      s = PutAll<int16_t>(who, want, c.int_contents(), n, out);
      break;
    case DType::kInt32:
      want = "int_contents";
      s = PutAll<int32_t>(who, want, c.int_contents(), n, out);
      break;
    case DType::kInt64:
      want = "int64_contents";
      s = PutAll<int64_t>(who, want, c.int64_contents(), n, out);
      break;
    case DType::kUInt8:
      want = "uint_contents";
      s = PutAll<uint8_t>(who, want, c.uint_contents(), n, out);
      break;
    case DType::kUInt16:
      want = "uint_contents";
      s = PutAll<uint16_t>(who, want, c.uint_contents(), n, out);
      break;
    case DType::kUInt32:
      want = "uint_contents";
      s = PutAll<uint32_t>(who, want, c.uint_contents(), n, out);
      break;
    case DType::kUInt64:
      want = "uint64_contents";
      s = PutAll<uint64_t>(who, want, c.uint64_contents(), n, out);
      break;
    case DType::kFloat32:
      want = "fp32_contents";
      s = PutAll<float>(who, want, c.fp32_contents(), n, out);
      break;
    case DType::kFloat64:
      want = "fp64_contents";
      s = PutAll<double>(who, want, c.fp64_contents(), n, out);
      break;
    case DType::kFloat16:
    case DType::kBFloat16:
      return InvalidArgument(who + ": " + in.datatype() +
                             " has no typed contents in the protocol: send it in raw_input_contents");
  }
  if (!s.ok()) return s;
  // Elements in a list of another type would be silently ignored.
  const std::pair<const char*, int> lists[] = {
      {"bool_contents", c.bool_contents_size()},     {"int_contents", c.int_contents_size()},
      {"int64_contents", c.int64_contents_size()},   {"uint_contents", c.uint_contents_size()},
      {"uint64_contents", c.uint64_contents_size()}, {"fp32_contents", c.fp32_contents_size()},
      {"fp64_contents", c.fp64_contents_size()},     {"bytes_contents", c.bytes_contents_size()}};
  for (const auto& [name, size] : lists) {
    if (size > 0 && std::strcmp(name, want) != 0) {
      return InvalidArgument(who + ": contents." + name + " holds elements, but " + in.datatype() +
                             " is read from contents." + want);
    }
  }
  return Status::OK();
}

// The request's inputs and outputs in the shared decode's terms. `typed`
// holds the bytes of inputs sent as typed contents; the views point into
// it and into `req`, which must outlive the decode.
StatusOr<WireRequest> ReadRequest(const inference::ModelInferRequest& req, std::vector<std::string>* typed) {
  WireRequest wire;
  wire.id = req.id();
  const int raw = req.raw_input_contents_size();
  if (raw > 0 && raw != req.inputs_size()) {
    return InvalidArgument("raw_input_contents has " + std::to_string(raw) + " entries for " +
                           std::to_string(req.inputs_size()) + " inputs: give one per input, in their order");
  }
  typed->resize(static_cast<size_t>(req.inputs_size()));
  for (int i = 0; i < req.inputs_size(); ++i) {
    const auto& in = req.inputs(i);
    const std::string who = "input '" + in.name() + "'";
    for (const auto& [key, unused] : in.parameters()) {
      if (key.rfind("shared_memory", 0) == 0)
        return InvalidArgument(who + ": shared memory is not supported: send the tensor in the request");
    }
    WireInput w;
    w.name = in.name();
    w.datatype = in.datatype();
    w.shape.assign(in.shape().begin(), in.shape().end());
    if (raw > 0) {
      if (in.has_contents() && in.contents().ByteSizeLong() > 0)
        return InvalidArgument(who + ": has both contents and raw_input_contents; send one");
      w.bytes = req.raw_input_contents(i);
      w.size_name = "raw_input_contents[" + std::to_string(i) + "]";
    } else {
      RETURN_IF_ERROR(TypedToBytes(who, in, &(*typed)[static_cast<size_t>(i)]));
      w.bytes = (*typed)[static_cast<size_t>(i)];
      w.size_name = "its contents";
    }
    wire.inputs.push_back(std::move(w));
  }
  // An output's own parameters given for the whole request would be
  // ignored: refused, as HTTP refuses them.
  for (const char* own : {"binary_data", "last_position"}) {
    if (req.parameters().count(own)) {
      return InvalidArgument(std::string("parameters.") + own +
                             " is a parameter of an output, not of the request: give it in the "
                             "parameters of the entry of 'outputs' it is for");
    }
  }
  for (const auto& out : req.outputs()) {
    WireOutput w;
    w.name = out.name();
    for (const auto& [key, p] : out.parameters()) {
      if (key != "last_position" && key != "binary_data") {
        return InvalidArgument("output '" + out.name() + "': unknown parameter '" + key +
                               "'; an output's parameters are binary_data and last_position");
      }
      if (p.parameter_choice_case() != inference::InferParameter::kBoolParam)
        return InvalidArgument("output '" + out.name() + "': " + key + " must be a bool_param");
      // gRPC answers every output raw: binary_data, checked as HTTP checks
      // it, changes nothing.
      if (key == "last_position") w.last_position = p.bool_param();
    }
    wire.outputs.push_back(std::move(w));
  }
  return wire;
}

// The outcome's outputs (moved out of it) as the answer.
void FillResponse(InferOutcome& o, inference::ModelInferResponse* res) {
  res->set_model_name(o.model->name);
  res->set_model_version(std::to_string(o.model->version));
  res->set_id(o.request->id);
  std::vector<model::HostTensor> outputs = AnsweredOutputs(*o.request, std::move(o.outputs));
  for (const auto& t : outputs) {
    auto* out = res->add_outputs();
    out->set_name(t.name);
    out->set_datatype(std::string(model::DTypeName(t.dtype)));
    for (int64_t d : t.shape) out->add_shape(d);
    res->add_raw_output_contents(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
}

// A unary call's reactor that knows when its client has gone: a request
// still waiting for its run (in the batcher's queue) is then not run.
class InferReactor : public grpc::ServerUnaryReactor {
 public:
  // Counted in `in_flight` from here until gRPC is done with the call.
  explicit InferReactor(std::atomic<size_t>* in_flight) : in_flight_(in_flight) { in_flight_->fetch_add(1); }
  std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);
  void OnCancel() override { gone->store(true); }
  void OnDone() override {
    in_flight_->fetch_sub(1);
    delete this;
  }

 private:
  std::atomic<size_t>* in_flight_;
};

// Answers a unary call at once.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const grpc::Status& s) {
  auto* r = ctx->DefaultReactor();
  r->Finish(s);
  return r;
}
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const Status& s) {
  return Answer(ctx, ToGrpc(s));
}

// A few threads of aotid's own that take the inferences off gRPC's, with a
// bounded line of calls waiting for one.
class Workers {
 public:
  Workers(int threads, int max_waiting) : max_waiting_(static_cast<size_t>(std::max(1, max_waiting))) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Work(); });
  }
  ~Workers() { Stop(); }

  // ResourceExhausted, running nothing, when the line is full.
  Status Add(std::function<void()> task) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (stopping_) return Unavailable("the server is stopping");
    // Taken and not yet done: the ones running, and those that wait.
    if (taken_ >= threads_.size() + max_waiting_) {
      return ResourceExhausted("the gRPC API's " + std::to_string(threads_.size()) +
                               " workers are busy and " + std::to_string(taken_ - threads_.size()) +
                               " calls wait for them; try again shortly");
    }
    ++taken_;
    waiting_.push_back(std::move(task));
    more_.Signal();
    return Status::OK();
  }

  // Runs what waits, then ends the threads. Once.
  void Stop() EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      more_.SignalAll();
    }
    for (auto& t : threads_) t.join();
  }

 private:
  void Work() EXCLUDES(mu_) {
    for (;;) {
      std::function<void()> task;
      {
        MutexLock lock(&mu_);
        while (waiting_.empty() && !stopping_) more_.Wait(&mu_);
        if (waiting_.empty()) return;
        task = std::move(waiting_.front());
        waiting_.pop_front();
      }
      task();
      MutexLock lock(&mu_);
      --taken_;
    }
  }

  const size_t max_waiting_;
  Mutex mu_;
  CondVar more_;
  std::deque<std::function<void()>> waiting_ GUARDED_BY(mu_);
  size_t taken_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace

StatusOr<InferRequest> DecodeGrpcInfer(const inference::ModelInferRequest& req, const model::ModelSpec& spec,
                                       std::vector<std::string>* storage) {
  ASSIGN_OR_RETURN(WireRequest wire, ReadRequest(req, storage));
  return DecodeWireRequest(wire, spec);
}

int GrpcCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return grpc::StatusCode::OK;
    case StatusCode::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kAlreadyExists: return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kFailedPrecondition: return grpc::StatusCode::FAILED_PRECONDITION;
    case StatusCode::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kCancelled: return grpc::StatusCode::CANCELLED;
    case StatusCode::kDeadlineExceeded: return grpc::StatusCode::DEADLINE_EXCEEDED;
    // Over a fixed limit: gRPC's own code for a message over its limit.
    case StatusCode::kLimitExceeded: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    default: return grpc::StatusCode::INTERNAL;
  }
}

class GrpcApi::Service final : public inference::GRPCInferenceService::CallbackService {
 public:
  Service(const ModelRegistry* registry, Metrics* metrics, const GrpcOptions& options)
      : registry_(registry),
        metrics_(metrics),
        needs_resident_(options.ready_needs_resident),
        workers_(options.threads, options.max_waiting) {
    SetAccess(options.token, options.token_for_all);
  }

  void SetAccess(const std::string& token, bool token_for_all) {
    auto a = std::make_shared<Access>(Access{token, token_for_all});
    MutexLock lock(&mu_);
    access_ = std::move(a);
  }
  void SetControl(ModelControl control) { control_ = std::move(control); }
  // Once the server has ended every call: the workers end.
  void StopWorkers() { workers_.Stop(); }
  // Inferences gRPC has not yet finished with.
  size_t InFlight() const { return in_flight_.load(); }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* res) override {
    if (grpc::Status s = Admit(ctx, false); !s.ok()) return Answer(ctx, s);
    res->set_live(true);
    return Answer(ctx, Status::OK());
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* res) override {
    if (grpc::Status s = Admit(ctx, false); !s.ok()) return Answer(ctx, s);
    res->set_ready(CheckServerReady(registry_, needs_resident_).ready);
    return Answer(ctx, Status::OK());
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const inference::ModelReadyRequest* req,
                                       inference::ModelReadyResponse* res) override {
    if (grpc::Status s = Admit(ctx, false); !s.ok()) return Answer(ctx, s);
    auto m = ResolveModel(registry_, req->name(), req->version());
    // An unloaded model is one the store has that does not answer now:
    // not ready, as one that builds (HTTP answers 503 for both). An
    // error here would raise in a client's is_model_ready instead.
    if (m.status().code() == StatusCode::kUnavailable) {
      res->set_ready(false);
      return Answer(ctx, Status::OK());
    }
    if (!m.ok()) return Answer(ctx, m.status());
    res->set_ready(AnswersNow(registry_, **m).ok());
    return Answer(ctx, Status::OK());
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* res) override {
    if (grpc::Status s = Admit(ctx, false); !s.ok()) return Answer(ctx, s);
    res->set_name(kServerName);
    res->set_version(AOTID_VERSION);
    for (const auto& e : ServerExtensions()) res->add_extensions(e);
    return Answer(ctx, Status::OK());
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* req,
                                          inference::ModelMetadataResponse* res) override {
    if (grpc::Status s = Admit(ctx, false); !s.ok()) return Answer(ctx, s);
    auto m = ResolveModel(registry_, req->name(), req->version());
    if (!m.ok()) return Answer(ctx, m.status());
    const ServedModel& sm = **m;
    // Its tensors come with its build: until then (queued, building,
    // failed) the answer would list none, and the protocol's message has
    // no field to say why. UNAVAILABLE says it, as for an unloaded one.
    if (!sm.model) return Answer(ctx, NotReady(sm));
    res->set_name(sm.name);
    res->set_platform("aotid_aoti");
    auto served = registry_->All();
    if (auto it = served->find(sm.name); it != served->end()) {
      for (const auto& [n, unused] : it->second) res->add_versions(std::to_string(n));
    }
    auto add = [](const std::vector<model::TensorSpec>& specs, auto* list) {
      for (const auto& t : specs) {
        auto* e = list->Add();
        e->set_name(t.name);
        e->set_datatype(std::string(model::DTypeName(t.dtype)));
        for (int64_t d : t.shape) e->add_shape(d);
      }
    };
    add(sm.model->spec().inputs, res->mutable_inputs());
    add(sm.model->spec().outputs, res->mutable_outputs());
    return Answer(ctx, Status::OK());
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const inference::ModelInferRequest* req,
                                       inference::ModelInferResponse* res) override {
    auto* reactor = new InferReactor(&in_flight_);
    if (grpc::Status s = Admit(ctx, false); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
    // gRPC runs handlers on a few threads of its own (two on two cores);
    // a model run inline would hold one, and with them every other call,
    // health checks too. The run is handed to this API's workers.
    Status queued = workers_.Add([this, req, res, reactor] { Run(req, res, reactor); });
    if (!queued.ok()) reactor->Finish(ToGrpc(queued));
    return reactor;
  }

  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const inference::RepositoryIndexRequest* req,
                                            inference::RepositoryIndexResponse* res) override {
    if (grpc::Status s = Admit(ctx, true); !s.ok()) return Answer(ctx, s);
    if (Status s = CheckRepository(req->repository_name()); !s.ok()) return Answer(ctx, s);
    for (const RepositoryEntry& e : serving::RepositoryIndex(registry_, req->ready())) {
      auto* m = res->add_models();
      m->set_name(e.name);
      m->set_version(std::to_string(e.version));
      m->set_state(e.state);
      m->set_reason(e.reason);
    }
    return Answer(ctx, Status::OK());
  }

  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const inference::RepositoryModelLoadRequest* req,
                                                inference::RepositoryModelLoadResponse*) override {
    if (const auto& params = req->parameters(); !params.empty()) {
      auto first = std::min_element(params.begin(), params.end(),
                                    [](const auto& a, const auto& b) { return a.first < b.first; });
      return Answer(ctx, LoadParameterRefused(first->first));
    }
    return SetEnabled(ctx, req->repository_name(), req->model_name(), true);
  }

  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const inference::RepositoryModelUnloadRequest* req,
                                                  inference::RepositoryModelUnloadResponse*) override {
    return SetEnabled(ctx, req->repository_name(), req->model_name(), false);
  }

 private:
  struct Access {
    std::string token;
    bool token_for_all;
  };

  // The token, as HTTP checks it: UNAUTHENTICATED without one,
  // PERMISSION_DENIED for a wrong one.
  grpc::Status Admit(grpc::CallbackServerContext* ctx, bool repository) const {
    std::shared_ptr<const Access> a;
    {
      MutexLock lock(&mu_);
      a = access_;
    }
    std::string auth;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    bool has = it != md.end();
    if (has) auth.assign(it->second.data(), it->second.size());
    switch (CheckToken(a->token, a->token_for_all || repository, has ? &auth : nullptr)) {
      case TokenCheck::kOk: break;
      case TokenCheck::kMissing:
        return grpc::Status(
            grpc::StatusCode::UNAUTHENTICATED,
            "this aotid needs a bearer token: send the metadata 'authorization: Bearer <token>' "
            "(the token is in the file server.token_file names)");
      case TokenCheck::kWrong: return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "wrong bearer token");
    }
    return grpc::Status::OK;
  }

  // One inference, on a worker: the shared path, answered from wherever
  // the run ends.
  void Run(const inference::ModelInferRequest* req, inference::ModelInferResponse* res,
           InferReactor* reactor) {
    std::vector<std::string> typed;
    InferDecode decode = [req, &typed](const model::ModelSpec& spec) -> StatusOr<InferRequest> {
      return DecodeGrpcInfer(*req, spec, &typed);
    };
    std::function<bool()> gone = [flag = reactor->gone] { return flag->load(); };
    RunInfer(registry_, metrics_, req->model_name(), req->model_version(), decode, std::move(gone),
             [reactor, res](InferOutcome o) {
               if (o.status.ok()) FillResponse(o, res);
               if (o.record) o.record->Answered(HttpStatusFor(o.status));
               reactor->Finish(ToGrpc(o.status));
             });
  }

  static Status CheckRepository(const std::string& name) {
    if (name.empty() || name == kServerName) return Status::OK();
    return NotFound("unknown repository '" + name + "': aotid has one, its store ('' or 'aotid')");
  }

  grpc::ServerUnaryReactor* SetEnabled(grpc::CallbackServerContext* ctx, const std::string& repository,
                                       const std::string& name, bool enable) {
    if (grpc::Status s = Admit(ctx, true); !s.ok()) return Answer(ctx, s);
    if (Status s = CheckRepository(repository); !s.ok()) return Answer(ctx, s);
    if (Status s = storage::ValidateModelName(name); !s.ok()) return Answer(ctx, s);
    if (!control_) return Answer(ctx, Unavailable("models cannot be loaded or unloaded here"));
    auto* reactor = ctx->DefaultReactor();
    control_(name, enable, [reactor](Status s) { reactor->Finish(ToGrpc(s)); });
    return reactor;
  }

  const ModelRegistry* registry_;
  Metrics* metrics_;
  const bool needs_resident_;
  Workers workers_;
  std::atomic<size_t> in_flight_{0};
  ModelControl control_;
  mutable Mutex mu_;
  std::shared_ptr<const Access> access_ GUARDED_BY(mu_);
};

GrpcApi::GrpcApi(const ModelRegistry* registry, Metrics* metrics, GrpcOptions options)
    : registry_(registry),
      options_(std::move(options)),
      service_(std::make_unique<Service>(registry, metrics, options_)) {}

GrpcApi::~GrpcApi() = default;

Status GrpcApi::Bind() {
  server_ = std::make_unique<rpc::Server>(options_.server, service_.get());
  server_->SetInFlight([service = service_.get()] { return service->InFlight(); });
  server_->SetHealth([registry = registry_, needs_resident = options_.ready_needs_resident] {
    bool ready = CheckServerReady(registry, needs_resident).ready;
    return std::vector<std::pair<std::string, bool>>{
        {"", ready}, {"ready", ready}, {"inference.GRPCInferenceService", ready}, {"live", true}};
  });
  return server_->Bind();
}

int GrpcApi::port() const { return server_ ? server_->port() : 0; }

std::string GrpcApi::Address() const {
  const std::string& host = options_.server.host;
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port());
}

void GrpcApi::Serve() {
  if (server_) server_->Serve();  // returns once every call has ended
  service_->StopWorkers();
}

void GrpcApi::Stop() {
  if (server_) server_->Stop();
}

void GrpcApi::OnRepositoryCommand(ModelControl control) { service_->SetControl(std::move(control)); }

void GrpcApi::UpdateAccess(const std::string& token, bool token_for_all) {
  service_->SetAccess(token, token_for_all);
}

}  // namespace aotid::serving
