// libFuzzer target for the gRPC API's decode of an inference: arbitrary
// bytes read as inference::ModelInferRequest (protobuf's parser, as gRPC
// hands the message over), then decoded as ModelInfer decodes it
// (serving::DecodeGrpcInfer: raw or typed contents, output parameters, the
// shared tensor decode) against each of a few contracts. Built with clang's
// -fsanitize=fuzzer,address,undefined (tests/fuzz/CMakeLists.txt) and run
// by tests/fuzz/run.sh.
//
// Beyond no crash: a refusal says why; an accepted request holds one
// tensor per input of the contract, named and typed as the contract says,
// with a shape that fits it and exactly the bytes its shape needs.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/tensor.h"
#include "rpc/oip.pb.h"
#include "serving/grpc_api.h"

namespace {

using aotid::model::DimRange;
using aotid::model::DType;
using aotid::model::ModelSpec;

const std::vector<ModelSpec>& Specs() {
  static const auto* specs = [] {
    auto* v = new std::vector<ModelSpec>;
    ModelSpec mlp;  // dynamic batch, as the test models have it
    mlp.inputs.push_back({"x", DType::kFloat32, {-1, 8}});
    mlp.outputs.push_back({"y", DType::kFloat32, {-1, 4}});
    v->push_back(mlp);

    ModelSpec ids;  // token ids in a range, sharing the batch and sequence dims with a mask
    ids.inputs.push_back({"ids",
                          DType::kInt64,
                          {-1, -1},
                          {DimRange{"b", 1, 8}, DimRange{"s", 1, 64}},
                          aotid::model::ValueRange{0, 49}});
    ids.inputs.push_back({"mask", DType::kBool, {-1, -1}, {DimRange{"b", 1, 8}, DimRange{"s", 1, 64}}});
    ids.outputs.push_back({"logits", DType::kFloat32, {-1, -1, 50}});
    ids.outputs.push_back({"pooled", DType::kFloat32, {-1, 6}});
    v->push_back(ids);

    ModelSpec narrow;  // the typed lists that narrow, and the types that have none
    narrow.inputs.push_back({"i8", DType::kInt8, {2}});
    narrow.inputs.push_back({"u16", DType::kUInt16, {-1}});
    narrow.inputs.push_back({"u64", DType::kUInt64, {1}});
    narrow.inputs.push_back({"f64", DType::kFloat64, {-1}});
    narrow.inputs.push_back({"h", DType::kFloat16, {2, -1}});
    narrow.outputs.push_back({"i8", DType::kInt8, {2}});
    v->push_back(narrow);
    return v;
  }();
  return *specs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  inference::ModelInferRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const ModelSpec& spec : Specs()) {
    std::vector<std::string> storage;
    auto decoded = aotid::serving::DecodeGrpcInfer(req, spec, &storage);
    if (!decoded.ok()) {
      if (decoded.status().message().empty()) __builtin_trap();
      continue;
    }
    if (decoded->inputs.size() != spec.inputs.size()) __builtin_trap();
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      const auto& t = decoded->inputs[i];
      const auto& want = spec.inputs[i];
      if (t.name != want.name || t.dtype != want.dtype || t.shape.size() != want.shape.size())
        __builtin_trap();
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (t.shape[d] < 0 || (want.shape[d] >= 0 && t.shape[d] != want.shape[d])) __builtin_trap();
      }
      int64_t n = t.num_elements();
      if (n < 0 || t.data.size() != static_cast<size_t>(n) * aotid::model::DTypeSize(t.dtype))
        __builtin_trap();
    }
  }
  return 0;
}
