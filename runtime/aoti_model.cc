// The one file of the serving path that includes torch, built as the plugin
// libaotid_torch.so (runtime/torch_plugin.h). It catches every exception
// torch throws and turns it into a Status.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <mutex>

#include "runtime/loaded_model.h"
#include "runtime/torch_plugin.h"

namespace aotid::runtime {
namespace {

at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kBool: return at::kBool;
    case DType::kUInt8: return at::kByte;
    case DType::kInt8: return at::kChar;
    case DType::kInt16: return at::kShort;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
  }
  return at::kFloat;
}

StatusOr<DType> FromScalarType(at::ScalarType t) {
  for (DType d : {DType::kBool, DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                  DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    if (ToScalarType(d) == t) return d;
  }
  return InvalidArgument(std::string("model produced unsupported dtype ") + c10::toString(t));
}

class AotiModel final : public LoadedModel {
 public:
  AotiModel(std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader, ModelSpec spec,
            std::string device)
      : loader_(std::move(loader)), spec_(std::move(spec)), device_(std::move(device)) {}

  const ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }

  StatusOr<std::vector<HostTensor>> Infer(const std::vector<HostTensor>& inputs) override {
    try {
      std::vector<at::Tensor> args;
      args.reserve(inputs.size());
      for (const HostTensor& t : inputs) {
        // The runner does not write its inputs; from_blob avoids a copy.
        void* data = const_cast<std::byte*>(t.data.data());
        args.push_back(at::from_blob(data, t.shape, at::TensorOptions().dtype(ToScalarType(t.dtype))));
      }
      std::vector<at::Tensor> outs = loader_->run(args);
      if (outs.size() != spec_.outputs.size()) {
        return Internal("model returned " + std::to_string(outs.size()) + " outputs, its spec declares " +
                        std::to_string(spec_.outputs.size()));
      }
      std::vector<HostTensor> result(outs.size());
      for (size_t i = 0; i < outs.size(); ++i) {
        at::Tensor o = outs[i].to(at::kCPU).contiguous();
        HostTensor& h = result[i];
        h.name = spec_.outputs[i].name;
        ASSIGN_OR_RETURN(h.dtype, FromScalarType(o.scalar_type()));
        h.shape.assign(o.sizes().begin(), o.sizes().end());
        size_t bytes = o.numel() * o.element_size();
        h.data.resize(bytes);
        if (bytes) std::memcpy(h.data.data(), o.data_ptr(), bytes);
      }
      return result;
    } catch (const c10::Error& e) {
      return Internal(std::string("model run failed: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return Internal(std::string("model run failed: ") + e.what());
    }
  }

 private:
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  ModelSpec spec_;
  std::string device_;
};

}  // namespace

StatusOr<std::unique_ptr<LoadedModel>> LoadInPlugin(const CacheEntry& entry, const LoadOptions& options) {
  if (options.device != "cpu") {
    return FailedPrecondition("device '" + options.device + "' is not supported by this build of aotid");
  }
  // torch's package loader is not safe to run twice at once: two cached
  // builds loading in parallel at start-up failed with "No device
  // information found" (seen with torch 2.13.0). Loads are rare and short,
  // so they take turns.
  static std::mutex load_mutex;
  std::lock_guard<std::mutex> lock(load_mutex);
  try {
    auto loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        entry.package_path, options.package_model, /*run_single_threaded=*/false,
        static_cast<size_t>(std::max(1, options.num_runners)), /*device_index=*/-1);
    return std::unique_ptr<LoadedModel>(new AotiModel(std::move(loader), entry.spec, options.device));
  } catch (const c10::Error& e) {
    return Internal("loading " + entry.package_path + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal("loading " + entry.package_path + ": " + e.what());
  }
}

}  // namespace aotid::runtime

// The entry point runtime/torch_plugin.cc looks up.
extern "C" __attribute__((visibility("default"))) aotid::StatusOr<std::unique_ptr<aotid::runtime::LoadedModel>>
aotid_torch_load_package_v1(const aotid::runtime::CacheEntry& entry, const aotid::runtime::LoadOptions& options) {
  static_assert(std::is_same_v<decltype(&aotid_torch_load_package_v1), aotid::runtime::LoadAotiPackageFn>);
  return aotid::runtime::LoadInPlugin(entry, options);
}
