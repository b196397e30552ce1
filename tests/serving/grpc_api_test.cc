// The gRPC API in process, over a real loopback channel with gRPC's own
// C++ client (the stub generated from rpc/oip.proto), with models that are
// fakes: what each call answers, its status codes, the token, typed and
// raw tensors, cancellation, and the transport's limits.
#include "serving/grpc_api.h"

#include <arpa/inet.h>
#include <google/protobuf/message.h>
#include <grpc/support/log.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/version_info.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "base/fs.h"
#include "base/log.h"
#include "base/mutex.h"
#include "raw_http.h"
#include "rpc/oip.grpc.pb.h"
#include "serving/tensor_codec.h"
#include "test_util.h"

namespace aotid::serving {
namespace {

using model::DType;
using model::HostTensor;

// y = 2x + 1 over FP32 [-1, 4]; `z` echoes the INT64 input and `b` the
// BOOL one, so that each datatype's bytes are seen to arrive as sent.
// With Queue(), runs wait until the test ends them (as a batcher's queue
// holds them), so that a client can hang up while its run waits.
class FakeModel final : public model::LoadedModel {
 public:
  FakeModel() {
    spec_.inputs.push_back({"x", DType::kFloat32, {-1, 4}});
    spec_.inputs.push_back({"i", DType::kInt64, {-1}});
    spec_.inputs.push_back({"b", DType::kBool, {-1}});
    spec_.outputs.push_back({"y", DType::kFloat32, {-1, 4}});
    spec_.outputs.push_back({"z", DType::kInt64, {-1}});
    spec_.outputs.push_back({"c", DType::kBool, {-1}});
  }
  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  StatusOr<std::vector<HostTensor>> Infer(const std::vector<HostTensor>& in,
                                          const model::RunContext&) override {
    {
      // A held run ends when released, or after 20 s (the test has failed).
      MutexLock lock(&mu_);
      ++running_;
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (held_ && released_.WaitUntil(&mu_, until)) {
      }
    }
    HostTensor y = in[0];
    y.name = "y";
    for (size_t k = 0; k < y.data.size() / 4; ++k) {
      float f;
      std::memcpy(&f, y.data.data() + 4 * k, 4);
      f = 2 * f + 1;
      std::memcpy(y.data.data() + 4 * k, &f, 4);
    }
    HostTensor z = in[1];
    z.name = "z";
    HostTensor c = in[2];
    c.name = "c";
    return std::vector<HostTensor>{y, z, c};
  }
  Status Submit(std::vector<HostTensor> inputs, model::RunContext ctx, Done done,
                std::unique_ptr<model::Announcement>) override {
    if (!queue_) {
      done(Infer(inputs, ctx));
      return Status::OK();
    }
    MutexLock lock(&mu_);
    waiting_.push_back({std::move(ctx), std::move(done)});
    return Status::OK();
  }
  void Queue() { queue_ = true; }
  // Runs started after Hold() wait in Infer, on the thread that runs them,
  // until Release().
  void Hold() {
    MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    MutexLock lock(&mu_);
    held_ = false;
    released_.SignalAll();
  }
  int running() {
    MutexLock lock(&mu_);
    return running_;
  }
  // Waits for a queued run; its context.
  bool WaitQueued(model::RunContext* ctx, Done* done) {
    for (int i = 0; i < 500; ++i) {
      {
        MutexLock lock(&mu_);
        if (!waiting_.empty()) {
          *ctx = waiting_.front().first;
          *done = waiting_.front().second;
          waiting_.clear();
          return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  model::ModelSpec spec_;
  std::string device_ = "cpu";
  bool queue_ = false;
  Mutex mu_;
  CondVar released_;
  bool held_ GUARDED_BY(mu_) = false;
  int running_ GUARDED_BY(mu_) = 0;
  std::vector<std::pair<model::RunContext, Done>> waiting_ GUARDED_BY(mu_);
};

std::string Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * 4};
}
std::string Bytes(const std::vector<int64_t>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * 8};
}

class GrpcApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = std::make_shared<FakeModel>();
    ServedModel m{"m", 1, ServeState::kReady};
    m.model = model_;
    registry_.Put(m);
    registry_.SetStartupDone();
  }
  void Start(GrpcOptions o = {}, ModelControl control = nullptr) {
    o.server.port = 0;
    api_ = std::make_unique<GrpcApi>(&registry_, &metrics_, o);
    if (control) api_->OnRepositoryCommand(std::move(control));
    ASSERT_OK(api_->Bind());
    serving_ = std::thread([this] { api_->Serve(); });
    channel_ =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(api_->port()), grpc::InsecureChannelCredentials());
    stub_ = inference::GRPCInferenceService::NewStub(channel_);
  }
  void TearDown() override {
    stub_.reset();
    channel_.reset();
    if (api_) {
      api_->Stop();
      serving_.join();
    }
  }
  // A request for "m": x of `rows` x 4, i and b of `rows`, all raw.
  static inference::ModelInferRequest Request(int rows) {
    inference::ModelInferRequest req;
    req.set_model_name("m");
    req.set_id("r1");
    std::vector<float> x;
    std::vector<int64_t> i;
    std::string b;
    for (int r = 0; r < rows; ++r) {
      for (int k = 0; k < 4; ++k) x.push_back(static_cast<float>(r * 4 + k) / 2);
      i.push_back((int64_t{1} << 40) + r);
      b.push_back(static_cast<char>(r % 2));
    }
    auto add = [&](const char* name, const char* dtype, std::vector<int64_t> shape, std::string bytes) {
      auto* in = req.add_inputs();
      in->set_name(name);
      in->set_datatype(dtype);
      for (int64_t d : shape) in->add_shape(d);
      req.add_raw_input_contents(std::move(bytes));
    };
    add("x", "FP32", {rows, 4}, Bytes(x));
    add("i", "INT64", {rows}, Bytes(i));
    add("b", "BOOL", {rows}, b);
    return req;
  }
  grpc::Status Infer(const inference::ModelInferRequest& req, inference::ModelInferResponse* res,
                     const std::string& token = "") {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    return stub_->ModelInfer(&ctx, req, res);
  }
  // Holds the model's runs and sends one call, returned once its run has
  // started (10 s at most); the thread sets `code` when the call ends.
  std::thread CallHeldInItsRun(std::atomic<int>* code) {
    model_->Hold();
    std::thread call([this, code] {
      inference::ModelInferResponse res;
      *code = static_cast<int>(Infer(Request(1), &res).error_code());
    });
    for (int i = 0; i < 1000 && model_->running() < 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return call;
  }

  ModelRegistry registry_;
  Metrics metrics_;
  std::shared_ptr<FakeModel> model_;
  std::unique_ptr<GrpcApi> api_;
  std::thread serving_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(GrpcApiTest, InferAnswersEveryOutputAsRawContentsWithItsShape) {
  Start();
  inference::ModelInferResponse res;
  grpc::Status s = Infer(Request(3), &res);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(res.model_name(), "m");
  EXPECT_EQ(res.model_version(), "1");
  EXPECT_EQ(res.id(), "r1");
  ASSERT_EQ(res.outputs_size(), 3);
  ASSERT_EQ(res.raw_output_contents_size(), 3);
  EXPECT_EQ(res.outputs(0).name(), "y");
  EXPECT_EQ(res.outputs(0).datatype(), "FP32");
  EXPECT_EQ(std::vector<int64_t>(res.outputs(0).shape().begin(), res.outputs(0).shape().end()),
            (std::vector<int64_t>{3, 4}));
  std::vector<float> y(12);
  ASSERT_EQ(res.raw_output_contents(0).size(), 48u);
  std::memcpy(y.data(), res.raw_output_contents(0).data(), 48);
  for (int k = 0; k < 12; ++k) EXPECT_EQ(y[k], 2 * (static_cast<float>(k) / 2) + 1) << k;
  EXPECT_EQ(res.outputs(1).datatype(), "INT64");
  int64_t z0;
  std::memcpy(&z0, res.raw_output_contents(1).data(), 8);
  EXPECT_EQ(z0, int64_t{1} << 40);
  EXPECT_EQ(res.raw_output_contents(2), std::string("\0\1\0", 3));
  // Asking for one output answers that one alone.
  auto req = Request(1);
  req.add_outputs()->set_name("z");
  inference::ModelInferResponse one;
  ASSERT_TRUE(Infer(req, &one).ok());
  ASSERT_EQ(one.outputs_size(), 1);
  EXPECT_EQ(one.outputs(0).name(), "z");
  EXPECT_EQ(one.raw_output_contents_size(), 1);
}

// Typed contents are read as the raw bytes would be, and a list that does
// not fit the datatype or the shape is refused naming it.
TEST_F(GrpcApiTest, TypedContentsAreReadLikeRawOnesAndCheckedTheSameWay) {
  Start();
  auto raw = Request(2);
  inference::ModelInferRequest typed = raw;
  typed.clear_raw_input_contents();
  for (int k = 0; k < 8; ++k)
    typed.mutable_inputs(0)->mutable_contents()->add_fp32_contents(static_cast<float>(k) / 2);
  typed.mutable_inputs(1)->mutable_contents()->add_int64_contents(int64_t{1} << 40);
  typed.mutable_inputs(1)->mutable_contents()->add_int64_contents((int64_t{1} << 40) + 1);
  typed.mutable_inputs(2)->mutable_contents()->add_bool_contents(false);
  typed.mutable_inputs(2)->mutable_contents()->add_bool_contents(true);
  inference::ModelInferResponse a, b;
  ASSERT_TRUE(Infer(raw, &a).ok());
  grpc::Status s = Infer(typed, &b);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(a.raw_output_contents_size(), b.raw_output_contents_size());
  for (int k = 0; k < a.raw_output_contents_size(); ++k)
    EXPECT_EQ(a.raw_output_contents(k), b.raw_output_contents(k));

  auto refused = [&](inference::ModelInferRequest req, const std::string& part) {
    inference::ModelInferResponse r;
    grpc::Status st = Infer(req, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << part;
    EXPECT_NE(st.error_message().find(part), std::string::npos) << st.error_message();
  };
  inference::ModelInferRequest wrong_list = typed;
  wrong_list.mutable_inputs(0)->mutable_contents()->add_int64_contents(1);
  refused(wrong_list,
          "input 'x': contents.int64_contents holds elements, but FP32 is read from contents.fp32_contents");
  inference::ModelInferRequest short_list = typed;
  short_list.mutable_inputs(0)->mutable_contents()->mutable_fp32_contents()->RemoveLast();
  refused(short_list, "input 'x': contents.fp32_contents has 7 elements, its shape needs 8");
  inference::ModelInferRequest both = raw;
  both.mutable_inputs(1)->mutable_contents()->add_int64_contents(1);
  refused(both, "input 'i': has both contents and raw_input_contents");
  inference::ModelInferRequest missing_raw = raw;
  missing_raw.mutable_raw_input_contents()->RemoveLast();
  refused(missing_raw, "raw_input_contents has 2 entries for 3 inputs");
  inference::ModelInferRequest bad_bool = raw;
  (*bad_bool.mutable_raw_input_contents(2))[0] = 7;
  refused(bad_bool, "input 'b': BOOL element 0 is byte 7, expected 0 or 1");
  inference::ModelInferRequest half = raw;
  half.mutable_inputs(0)->set_datatype("FP16");
  half.clear_raw_input_contents();
  refused(half, "FP16 has no typed contents in the protocol");
  inference::ModelInferRequest bytes = raw;
  bytes.mutable_inputs(0)->set_datatype("BYTES");
  refused(bytes, "input 'x': datatype BYTES is not supported");
}

// A narrower integer is widened as over HTTP; last_position cuts only an
// output of rank 3 or more, and an output parameter aotid does not know is
// refused naming it.
TEST_F(GrpcApiTest, IntegersWidenAndOutputParametersAreCheckedAsOverHttp) {
  Start();
  auto req = Request(2);
  req.mutable_inputs(1)->set_datatype("INT32");
  std::vector<int32_t> narrow = {-5, 7};
  req.set_raw_input_contents(1, std::string(reinterpret_cast<const char*>(narrow.data()), 8));
  inference::ModelInferResponse res;
  grpc::Status s = Infer(req, &res);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(res.outputs(1).datatype(), "INT64");
  std::vector<int64_t> z(2);
  ASSERT_EQ(res.raw_output_contents(1).size(), 16u);
  std::memcpy(z.data(), res.raw_output_contents(1).data(), 16);
  EXPECT_EQ(z, (std::vector<int64_t>{-5, 7}));

  auto wide = Request(1);
  wide.mutable_inputs(0)->set_datatype("FP64");
  wide.set_raw_input_contents(0, std::string(32, '\0'));
  EXPECT_EQ(Infer(wide, &res).error_message(), "input 'x' has datatype FP64, expected FP32");

  auto last = Request(1);
  auto* out = last.add_outputs();
  out->set_name("y");
  (*out->mutable_parameters())["last_position"].set_bool_param(true);
  s = Infer(last, &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("last_position takes the last index of dim 1"), std::string::npos)
      << s.error_message();
  auto unknown = Request(1);
  auto* o2 = unknown.add_outputs();
  o2->set_name("y");
  (*o2->mutable_parameters())["classification"].set_int64_param(3);
  s = Infer(unknown, &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("unknown parameter 'classification'"), std::string::npos)
      << s.error_message();
}

// The same tensor that does not fit is refused with the words HTTP uses.
TEST_F(GrpcApiTest, AWrongShapeIsRefusedWithTheMessageHttpGives) {
  Start();
  auto req = Request(1);
  req.mutable_inputs(0)->set_shape(1, 3);
  req.set_raw_input_contents(0, std::string(12, '\0'));
  inference::ModelInferResponse res;
  grpc::Status s = Infer(req, &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto http = DecodeInferRequest(
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[0,0,0]},)"
      R"({"name":"i","datatype":"INT64","shape":[1],"data":[1]},{"name":"b","datatype":"BOOL","shape":[1],"data":[true]}]})",
      model_->spec());
  ASSERT_FALSE(http.ok());
  EXPECT_EQ(s.error_message(), http.status().message());
}

TEST_F(GrpcApiTest, StatusCodesSayWhatIsWrong) {
  ServedModel building{"later", 1, ServeState::kBuilding};
  registry_.Put(building);
  ServedModel failed{"broken", 1, ServeState::kFailed};
  failed.message = "the build failed";
  registry_.Put(failed);
  registry_.SetCatalog({{"m", 1, true, true, "latest"}, {"later", 1, true, true, "latest"}});
  Start();
  auto code = [&](const std::string& name, const std::string& version) {
    auto req = Request(1);
    req.set_model_name(name);
    req.set_model_version(version);
    inference::ModelInferResponse res;
    return Infer(req, &res).error_code();
  };
  EXPECT_EQ(code("nope", ""), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code("m", "7"), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code("m", "x"), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code("later", ""), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(code("broken", ""), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(code("m", "1"), grpc::StatusCode::OK);

  grpc::ClientContext c1;
  inference::ModelReadyRequest ready;
  ready.set_name("later");
  inference::ModelReadyResponse rr;
  ASSERT_TRUE(stub_->ModelReady(&c1, ready, &rr).ok());
  EXPECT_FALSE(rr.ready());
  grpc::ClientContext c2;
  ready.set_name("m");
  ASSERT_TRUE(stub_->ModelReady(&c2, ready, &rr).ok());
  EXPECT_TRUE(rr.ready());
  grpc::ClientContext c3;
  ready.set_name("nope");
  EXPECT_EQ(stub_->ModelReady(&c3, ready, &rr).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext c4;
  inference::ServerReadyResponse sr;
  ASSERT_TRUE(stub_->ServerReady(&c4, {}, &sr).ok());
  EXPECT_FALSE(sr.ready());  // "later" is still building
}

// An unloaded model (in the store, not served) is not ready, as one that
// builds: ModelReady answers false, not an error (tritonclient.grpc's
// is_model_ready would raise), while an inference on it is UNAVAILABLE.
TEST_F(GrpcApiTest, AnUnloadedModelIsNotReadyRatherThanAnError) {
  registry_.SetCatalog({{"m", 1, true, true, "latest"}, {"off", 1, false, true, "latest"}});
  Start();
  grpc::ClientContext c1;
  inference::ModelReadyRequest ready;
  ready.set_name("off");
  inference::ModelReadyResponse rr;
  rr.set_ready(true);
  grpc::Status s = stub_->ModelReady(&c1, ready, &rr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(rr.ready());
  auto req = Request(1);
  req.set_model_name("off");
  inference::ModelInferResponse res;
  grpc::Status infer = Infer(req, &res);
  EXPECT_EQ(infer.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(infer.error_message().find("model 'off' is unloaded"), std::string::npos)
      << infer.error_message();
  // The way back in, named for a gRPC client too.
  EXPECT_NE(infer.error_message().find("gRPC's RepositoryModelLoad"), std::string::npos)
      << infer.error_message();
}

TEST_F(GrpcApiTest, MetadataListsTensorsWithDynamicDimsAsMinusOne) {
  Start();
  grpc::ClientContext ctx;
  inference::ModelMetadataRequest req;
  req.set_name("m");
  inference::ModelMetadataResponse res;
  ASSERT_TRUE(stub_->ModelMetadata(&ctx, req, &res).ok());
  EXPECT_EQ(res.name(), "m");
  EXPECT_EQ(res.platform(), "aotid_aoti");
  ASSERT_EQ(res.versions_size(), 1);
  EXPECT_EQ(res.versions(0), "1");
  ASSERT_EQ(res.inputs_size(), 3);
  EXPECT_EQ(res.inputs(0).name(), "x");
  EXPECT_EQ(std::vector<int64_t>(res.inputs(0).shape().begin(), res.inputs(0).shape().end()),
            (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(res.outputs(2).datatype(), "BOOL");
  grpc::ClientContext sctx;
  inference::ServerMetadataResponse server;
  ASSERT_TRUE(stub_->ServerMetadata(&sctx, {}, &server).ok());
  EXPECT_EQ(server.name(), "aotid");
  EXPECT_EQ(server.version(), AOTID_VERSION);
}

// The token as HTTP takes it: UNAUTHENTICATED without, PERMISSION_DENIED
// when wrong; with the token for the repository alone, the other calls
// need none.
TEST_F(GrpcApiTest, TheTokenIsCheckedAsHttpChecksIt) {
  GrpcOptions o;
  o.token = "s3cret";
  std::vector<std::pair<std::string, bool>> asked;
  Mutex mu;
  Start(o, [&](const std::string& name, bool enable, std::function<void(Status)> done) {
    {
      MutexLock lock(&mu);
      asked.emplace_back(name, enable);
    }
    done(name == "m" ? Status::OK() : FailedPrecondition("not in this mode"));
  });
  inference::ModelInferResponse res;
  EXPECT_EQ(Infer(Request(1), &res).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Infer(Request(1), &res, "guess").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Infer(Request(1), &res, "s3cret").ok());
  grpc::ClientContext live;
  inference::ServerLiveResponse lr;
  EXPECT_EQ(stub_->ServerLive(&live, {}, &lr).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  api_->UpdateAccess("s3cret", /*token_for_all=*/false);
  EXPECT_TRUE(Infer(Request(1), &res).ok());
  grpc::ClientContext idx;
  inference::RepositoryIndexResponse ir;
  EXPECT_EQ(stub_->RepositoryIndex(&idx, {}, &ir).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext unload;
  inference::RepositoryModelUnloadRequest ur;
  ur.set_model_name("m");
  inference::RepositoryModelUnloadResponse uresp;
  EXPECT_EQ(stub_->RepositoryModelUnload(&unload, ur, &uresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  {
    MutexLock lock(&mu);
    EXPECT_TRUE(asked.empty());  // refused before the control plane heard of it
  }
  grpc::ClientContext unload2;
  unload2.AddMetadata("authorization", "Bearer s3cret");
  EXPECT_TRUE(stub_->RepositoryModelUnload(&unload2, ur, &uresp).ok());
  grpc::ClientContext load;
  load.AddMetadata("authorization", "bearer s3cret");  // the scheme in any case
  inference::RepositoryModelLoadRequest lq;
  lq.set_model_name("other");
  inference::RepositoryModelLoadResponse lresp;
  grpc::Status refused = stub_->RepositoryModelLoad(&load, lq, &lresp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(refused.error_message(), "not in this mode");
  grpc::ClientContext with_params;
  with_params.AddMetadata("authorization", "Bearer s3cret");
  (*lq.mutable_parameters())["config"].set_string_param("{}");
  grpc::Status with_config = stub_->RepositoryModelLoad(&with_params, lq, &lresp);
  EXPECT_EQ(with_config.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(with_config.error_message().find("'config' was given"), std::string::npos)
      << with_config.error_message();
  MutexLock lock(&mu);
  EXPECT_EQ(asked, (std::vector<std::pair<std::string, bool>>{{"m", false}, {"other", true}}));
}

// A client that hangs up while its run waits: the run's context says so
// (the batcher then drops it), and it is counted as 499.
TEST_F(GrpcApiTest, AClientThatHangsUpCancelsItsWaitingRun) {
  model_->Queue();
  Start();
  grpc::ClientContext ctx;
  inference::ModelInferResponse res;
  std::atomic<int> code{-1};
  std::thread call([&] { code = static_cast<int>(stub_->ModelInfer(&ctx, Request(1), &res).error_code()); });
  model::RunContext run;
  model::LoadedModel::Done done;
  ASSERT_TRUE(model_->WaitQueued(&run, &done));
  ASSERT_TRUE(run.cancelled);
  EXPECT_FALSE(run.cancelled());
  ctx.TryCancel();
  call.join();
  EXPECT_EQ(code.load(), static_cast<int>(grpc::StatusCode::CANCELLED));
  bool seen = false;
  for (int i = 0; i < 500 && !(seen = run.cancelled()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(seen);
  done(Cancelled(model::kClientGone));  // what the batcher answers for it
  std::string text;
  for (int i = 0; i < 500; ++i) {
    text = metrics_.Render();
    if (text.find("code=\"499\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(text.find("aotid_inference_requests_total{model=\"m\",version=\"1\",code=\"499\"} 1"),
            std::string::npos)
      << text;
}

TEST_F(GrpcApiTest, AMessageOverTheLimitIsResourceExhausted) {
  GrpcOptions o;
  o.server.max_message_bytes = 1024;
  Start(o);
  inference::ModelInferResponse res;
  EXPECT_TRUE(Infer(Request(2), &res).ok());
  EXPECT_EQ(Infer(Request(64), &res).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Infer(Request(2), &res).ok());
}

// Runs that hold their thread (a model run inline, as a runner's is) hold
// none of gRPC's own few: other calls, health checks too, are answered
// meanwhile. Past the workers' line, calls are refused at once.
TEST_F(GrpcApiTest, RunsThatWaitHoldNoneOfGrpcsThreads) {
  GrpcOptions o;
  o.threads = 16;
  o.max_waiting = 2;
  Start(o);
  model_->Hold();
  std::vector<std::thread> calls;
  std::atomic<int> ok{0};
  for (int i = 0; i < 18; ++i) {
    calls.emplace_back([&] {
      inference::ModelInferResponse res;
      if (Infer(Request(1), &res).ok()) ok.fetch_add(1);
    });
  }
  for (int i = 0; i < 1000 && model_->running() < 16; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(model_->running(), 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the other two reach the line
  grpc::ClientContext live;
  live.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  inference::ServerLiveResponse lr;
  grpc::Status s = stub_->ServerLive(&live, {}, &lr);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(lr.live());
  inference::ModelInferResponse res;
  s = Infer(Request(1), &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("the gRPC API's 16 workers are busy and 2 calls wait"), std::string::npos)
      << s.error_message();
  model_->Release();
  for (auto& t : calls) t.join();
  EXPECT_EQ(ok.load(), 18);
}

// Checked as HTTP checks them: an output's parameters given for the whole
// request, and binary_data that is not a bool.
TEST_F(GrpcApiTest, OutputParametersAreRefusedWhereHttpRefusesThem) {
  Start();
  inference::ModelInferResponse res;
  auto request_wide = Request(1);
  (*request_wide.mutable_parameters())["last_position"].set_bool_param(true);
  grpc::Status s = Infer(request_wide, &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(
      s.error_message().find("parameters.last_position is a parameter of an output, not of the request"),
      std::string::npos)
      << s.error_message();
  auto not_bool = Request(1);
  auto* out = not_bool.add_outputs();
  out->set_name("y");
  (*out->mutable_parameters())["binary_data"].set_int64_param(7);
  s = Infer(not_bool, &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "output 'y': binary_data must be a bool_param");
  auto fine = Request(1);
  auto* o2 = fine.add_outputs();
  o2->set_name("y");
  (*o2->mutable_parameters())["binary_data"].set_bool_param(true);
  EXPECT_TRUE(Infer(fine, &res).ok());
}

// A version with no build yet has no tensors to list: UNAVAILABLE saying
// why, rather than an answer with none.
TEST_F(GrpcApiTest, MetadataOfAModelWithoutItsBuildIsUnavailable) {
  ServedModel building{"later", 1, ServeState::kBuilding};
  registry_.Put(building);
  Start();
  grpc::ClientContext ctx;
  inference::ModelMetadataRequest req;
  req.set_name("later");
  inference::ModelMetadataResponse res;
  grpc::Status s = stub_->ModelMetadata(&ctx, req, &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.error_message(), "model 'later' version 1 is building; try again shortly");
}

#if defined(GOOGLE_PROTOBUF_VERSION) && GOOGLE_PROTOBUF_VERSION < 4022000 && GRPC_CPP_VERSION_MAJOR == 1 && \
    GRPC_CPP_VERSION_MINOR < 65
// What protobuf and gRPC log (a client's string that is not UTF-8, a ping
// flood) goes to aotid's log at debug level, not to stderr a line a call.
TEST_F(GrpcApiTest, TheLibrariesLogIntoAotidsLogAtDebugLevel) {
  Start();
  aotid::testing::TempDir dir;
  ASSERT_OK(log::SetFile(dir / "log", 1 << 20, 1));
  log::Level before = log::GetLevel();
  GOOGLE_LOG(ERROR) << "quiet probe";
  log::SetLevel(log::Level::kDebug);
  GOOGLE_LOG(ERROR) << "probe from protobuf";
  gpr_log(GPR_ERROR, "probe from %s", "grpc");
  log::SetLevel(before);
  log::ResetToStderr();
  std::string text = fs::ReadFile(dir / "log").value_or("");
  EXPECT_NE(text.find("debug protobuf: probe from protobuf"), std::string::npos) << text;
  EXPECT_NE(text.find("debug grpc: probe from grpc"), std::string::npos) << text;
  EXPECT_EQ(text.find("quiet probe"), std::string::npos) << text;
}
#endif

// grpc.health.v1.Health, spoken by hand as a probe speaks it: the request
// is {1: service}, the answer {1: status} (0 UNKNOWN, 1 SERVING,
// 2 NOT_SERVING, 3 SERVICE_UNKNOWN).
std::string HealthRequest(const std::string& service) {
  if (service.empty()) return "";
  return std::string{'\x0a', static_cast<char>(service.size())} + service;
}
int HealthStatusOf(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  if (!b.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.empty()) return 0;
  return bytes.size() == 2 && bytes[0] == '\x08' ? bytes[1] : -1;
}
grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}
// Check(service): the call's status, and the serving status answered.
std::pair<grpc::StatusCode, int> HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                                             const std::string& service) {
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call =
      generic.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", Buffer(HealthRequest(service)), &cq);
  call->StartCall();
  grpc::ByteBuffer answer;
  grpc::Status status;
  call->Finish(&answer, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return {status.error_code(), status.ok() ? HealthStatusOf(answer) : -1};
}

TEST_F(GrpcApiTest, TheHealthServiceFollowsReadinessAndAsksNoToken) {
  registry_.SetCatalog({{"m", 1, true, true, "latest"}});
  ServedModel building{"m", 1, ServeState::kBuilding};
  registry_.Put(building);
  GrpcOptions o;
  o.token = "sesame";
  Start(o);
  // The token guards the protocol's own calls, not the probes.
  grpc::ClientContext c;
  inference::ServerReadyResponse sr;
  EXPECT_EQ(stub_->ServerReady(&c, {}, &sr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const std::pair<grpc::StatusCode, int> serving{grpc::StatusCode::OK, 1},
      not_serving{grpc::StatusCode::OK, 2};
  EXPECT_EQ(HealthCheck(channel_, ""), not_serving);
  EXPECT_EQ(HealthCheck(channel_, "ready"), not_serving);
  EXPECT_EQ(HealthCheck(channel_, "inference.GRPCInferenceService"), not_serving);
  EXPECT_EQ(HealthCheck(channel_, "live"), serving);
  EXPECT_EQ(HealthCheck(channel_, "no.such.Service").first, grpc::StatusCode::NOT_FOUND);
  // Built: the next reading (once a second) says so.
  ServedModel ready{"m", 1, ServeState::kReady};
  ready.model = model_;
  registry_.Put(ready);
  for (int i = 0; i < 300 && HealthCheck(channel_, "") != serving; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(HealthCheck(channel_, ""), serving);
  EXPECT_EQ(HealthCheck(channel_, "ready"), serving);
  EXPECT_EQ(HealthCheck(channel_, "live"), serving);
}

TEST_F(GrpcApiTest, AStopTellsHealthWatchersNotServingBeforeTheDrain) {
  GrpcOptions o;
  o.server.drain_timeout_s = 20;
  Start(o);
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto watch = generic.PrepareCall(&ctx, "/grpc.health.v1.Health/Watch", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, want);
    return ok;
  };
  watch->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(reinterpret_cast<void*>(1)));
  watch->WriteLast(Buffer(HealthRequest("")), grpc::WriteOptions(), reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(reinterpret_cast<void*>(2)));
  grpc::ByteBuffer update;
  watch->Read(&update, reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(reinterpret_cast<void*>(3)));
  EXPECT_EQ(HealthStatusOf(update), 1);
  // Nothing changes, so nothing more is sent (readiness is read each
  // second, and only a change is news).
  watch->Read(&update, reinterpret_cast<void*>(4));
  auto quiet = cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::milliseconds(2500));
  EXPECT_EQ(quiet, grpc::CompletionQueue::TIMEOUT) << "sent again: " << HealthStatusOf(update);
  if (quiet != grpc::CompletionQueue::TIMEOUT) watch->Read(&update, reinterpret_cast<void*>(4));
  // A run in flight keeps the drain going; the watcher hears before it ends.
  std::atomic<int> code{-1};
  std::thread call = CallHeldInItsRun(&code);
  ASSERT_EQ(model_->running(), 1);
  api_->Stop();
  EXPECT_TRUE(step(reinterpret_cast<void*>(4)));
  EXPECT_EQ(HealthStatusOf(update), 2);
  EXPECT_EQ(model_->running(), 1);  // still draining
  model_->Release();
  call.join();
  EXPECT_EQ(code.load(), static_cast<int>(grpc::StatusCode::OK));
  serving_.join();
  grpc::Status end;
  watch->Finish(&end, reinterpret_cast<void*>(5));
  step(reinterpret_cast<void*>(5));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  stub_.reset();
  channel_.reset();
  api_.reset();
}

// Whether the server closed `fd` within `ms`.
bool ClosedWithin(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

// One address holds at most its cap of connections; one past it is closed
// at once, and a connection that closes frees its place.
TEST_F(GrpcApiTest, OneAddressHoldsNoMoreConnectionsThanItsCap) {
  GrpcOptions o;
  o.server.max_connections_per_address = 2;
  Start(o);
  int a = aotid::testing::ConnectTcp(api_->port()), b = aotid::testing::ConnectTcp(api_->port());
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_FALSE(ClosedWithin(a, 300));
  int c = aotid::testing::ConnectTcp(api_->port());
  ASSERT_GE(c, 0);
  EXPECT_TRUE(ClosedWithin(c, 5000));
  EXPECT_FALSE(ClosedWithin(b, 100));
  ::close(c);
  ::close(a);
  // gRPC closes its end; the sweep counts it out within a second or two.
  bool taken = false;
  for (int i = 0; i < 40 && !taken; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    int d = aotid::testing::ConnectTcp(api_->port());
    taken = !ClosedWithin(d, 300);
    ::close(d);
  }
  EXPECT_TRUE(taken);
  ::close(b);
}

// At a stop, a call in flight is answered within the drain, and a
// connection that never made a call does not hold the stop for the whole
// drain (gRPC's own shutdown waited 20 s for it).
TEST_F(GrpcApiTest, StopAnswersCallsInFlightAndWaitsForNoSilentConnection) {
  GrpcOptions o;
  o.server.drain_timeout_s = 20;
  Start(o);
  int silent = aotid::testing::ConnectTcp(api_->port());
  ASSERT_GE(silent, 0);
  std::atomic<int> code{-1};
  std::thread call = CallHeldInItsRun(&code);
  ASSERT_EQ(model_->running(), 1);
  const auto start = std::chrono::steady_clock::now();
  api_->Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  model_->Release();
  call.join();
  EXPECT_EQ(code.load(), static_cast<int>(grpc::StatusCode::OK));
  serving_.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ::close(silent);
  stub_.reset();
  channel_.reset();
  api_.reset();
}

}  // namespace
}  // namespace aotid::serving
