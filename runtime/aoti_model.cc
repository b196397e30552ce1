// The one file of the serving path that includes torch, built as the plugin
// libaotid_torch.so (runtime/torch_plugin.h). It catches every exception
// torch throws and turns it into a Status.
#include <ATen/ATen.h>
#include <ATen/cpu/Utils.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/mutex.h"
#include "model/loaded_model.h"
#include "runtime/torch_plugin.h"

namespace aotid::runtime {
namespace {

using SetThreadsFn = void (*)(int);

// omp_set_num_threads of the OpenMP runtime libtorch links (libgomp on
// Linux, libomp on macOS), looked up among the plugin's own dependencies
// (it is loaded RTLD_LOCAL, so not in the global scope); nullptr for a
// torch without OpenMP, whose threads are then torch's default. Not a weak
// reference: macOS's linker must resolve those at link time, and the plugin
// does not link the OpenMP runtime itself.
SetThreadsFn FindOmpSetNumThreads() {
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&FindOmpSetNumThreads), &self) == 0 || self.dli_fname == nullptr)
    return nullptr;
  void* handle = ::dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  auto fn = reinterpret_cast<SetThreadsFn>(::dlsym(handle, "omp_set_num_threads"));
  ::dlclose(handle);  // the reference RTLD_NOLOAD took: the plugin stays loaded
  return fn;
}

SetThreadsFn OmpSetNumThreads() {
  static const SetThreadsFn fn = FindOmpSetNumThreads();
  return fn;
}

at::ScalarType ToScalarType(model::DType d) {
  switch (d) {
    case model::DType::kBool: return at::kBool;
    case model::DType::kUInt8: return at::kByte;
    case model::DType::kInt8: return at::kChar;
    case model::DType::kInt16: return at::kShort;
    case model::DType::kInt32: return at::kInt;
    case model::DType::kInt64: return at::kLong;
    case model::DType::kFloat16: return at::kHalf;
    case model::DType::kBFloat16: return at::kBFloat16;
    case model::DType::kFloat32: return at::kFloat;
    case model::DType::kFloat64: return at::kDouble;
    case model::DType::kUInt16: return at::kUInt16;
    case model::DType::kUInt32: return at::kUInt32;
    case model::DType::kUInt64: return at::kUInt64;
  }
  return at::kFloat;
}

StatusOr<model::DType> FromScalarType(at::ScalarType t) {
  for (model::DType d : {model::DType::kBool, model::DType::kUInt8, model::DType::kInt8, model::DType::kInt16,
                         model::DType::kInt32, model::DType::kInt64, model::DType::kFloat16,
                         model::DType::kBFloat16, model::DType::kFloat32, model::DType::kFloat64,
                         model::DType::kUInt16, model::DType::kUInt32, model::DType::kUInt64}) {
    if (ToScalarType(d) == t) return d;
  }
  return InvalidArgument(std::string("model produced unsupported dtype ") + c10::toString(t));
}

// Run failures that are the caller's: with AOTI_RUNTIME_CHECK_INPUTS set,
// the model's own input checks reject a dim outside the traced range. aotid
// does not set it: torch.export traces a dynamic batch as >= 2, and the
// checks would then refuse batch 1, which the kernels run correctly.
Status RunError(const std::string& what) {
  bool input = what.find("input_handles[") != std::string::npos;
  std::string msg = "model run failed: " + what;
  return input ? InvalidArgument(msg) : Internal(msg);
}

// The torch device a runner key names ("cuda" the current CUDA device);
// FailedPrecondition when this torch knows no such device.
StatusOr<c10::Device> TensorDevice(const std::string& key) {
  try {
    return c10::Device(key);
  } catch (const c10::Error& e) {
    return FailedPrecondition("this aotid's torch has no device '" + key +
                              "': " + e.what_without_backtrace());
  }
}

// A state input (ModelSpec::state_inputs): zeros of its shape on the
// model's device. On the CPU, anonymous memory, which the kernel hands out
// as zeros a page at a time when first touched: only the pages runs write
// (a cache's slots and positions that sequences reach) become resident.
StatusOr<at::Tensor> StateTensor(const model::TensorSpec& t, c10::Device device) {
  at::TensorOptions options = at::TensorOptions().dtype(ToScalarType(t.dtype)).device(device);
  int64_t n = model::NumElements(t.shape);
  if (n < 0) return InvalidArgument("state input '" + t.name + "' has no fixed shape");
  size_t bytes = static_cast<size_t>(n) * model::DTypeSize(t.dtype);
  if (!device.is_cpu() || bytes == 0) return at::zeros(t.shape, options);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return ErrnoError("allocating state input '" + t.name + "' (" + std::to_string(bytes) + " bytes)", errno);
  return at::from_blob(
      p, t.shape, [bytes](void* q) { ::munmap(q, bytes); }, options);
}

class AotiModel final : public model::LoadedModel {
 public:
  AotiModel(std::unique_ptr<torch::inductor::AOTIModelContainerRunner> runner, model::ModelSpec spec,
            std::string device, c10::Device tensor_device, int threads, std::vector<at::Tensor> state)
      : runner_(std::move(runner)),
        spec_(std::move(spec)),
        device_(std::move(device)),
        tensor_device_(tensor_device),
        threads_(threads),
        state_(std::move(state)) {}

  const model::ModelSpec& spec() const override { return spec_; }
  const std::string& device() const override { return device_; }
  bool SetThreads(int threads) override {
    if (OmpSetNumThreads() == nullptr) return false;
    threads_.store(threads);
    return true;
  }

  StatusOr<std::vector<model::HostTensor>> Infer(const std::vector<model::HostTensor>& inputs,
                                                 const model::RunContext&) override {
    try {
      std::vector<at::Tensor> args;
      args.reserve(inputs.size() + state_.size());
      for (const model::HostTensor& t : inputs) {
        // The runner does not write its inputs; from_blob avoids a copy on
        // the CPU. A device model was compiled for inputs on its device
        // (its generated code reads them there): one copy each, here.
        void* data = const_cast<std::byte*>(t.data.data());
        at::Tensor host = at::from_blob(data, t.shape, at::TensorOptions().dtype(ToScalarType(t.dtype)));
        args.push_back(tensor_device_.is_cpu() ? std::move(host) : host.to(tensor_device_));
      }
      // The state inputs last, the same tensors every run: the model
      // writes them in place, and the next run reads what it wrote.
      args.insert(args.end(), state_.begin(), state_.end());
      // Kernels are built with dynamic threads: the count is this thread's
      // OpenMP setting, chosen per model (LoadOptions::threads).
      if (int n = threads_.load(std::memory_order_relaxed); n > 0 && OmpSetNumThreads() != nullptr) {
        OmpSetNumThreads()(n);
      }
      std::vector<at::Tensor> outs = runner_->run(args);
      if (!spec_.outputs.empty() && outs.size() != spec_.outputs.size()) {
        return Internal("model returned " + std::to_string(outs.size()) + " outputs, its spec declares " +
                        std::to_string(spec_.outputs.size()));
      }
      std::vector<model::HostTensor> result(outs.size());
      for (size_t i = 0; i < outs.size(); ++i) {
        const at::Tensor& o = outs[i];
        model::HostTensor& h = result[i];
        h.name = spec_.outputs.empty() ? "output" + std::to_string(i) : spec_.outputs[i].name;
        ASSIGN_OR_RETURN(h.dtype, FromScalarType(o.scalar_type()));
        h.shape.assign(o.sizes().begin(), o.sizes().end());
        size_t bytes = o.numel() * o.element_size();
        h.data.resize(bytes);
        if (bytes == 0) continue;
        if (o.is_cpu() && o.is_contiguous()) {
          std::memcpy(h.data.data(), o.data_ptr(), bytes);
        } else {
          // One copy into the answer's own memory from wherever the model
          // left it: its device (the copy waits for the model's work), or
          // strided on the CPU.
          at::from_blob(h.data.data(), o.sizes(), at::TensorOptions().dtype(o.scalar_type())).copy_(o);
        }
      }
      return result;
    } catch (const c10::Error& e) {
      return RunError(e.what_without_backtrace());
    } catch (const std::exception& e) {
      return RunError(e.what());
    }
  }

 private:
  std::unique_ptr<torch::inductor::AOTIModelContainerRunner> runner_;
  model::ModelSpec spec_;
  std::string device_;         // the runner's key: cpu, cuda, mps
  c10::Device tensor_device_;  // where the model takes its inputs and leaves its outputs
  std::atomic<int> threads_;
  std::vector<at::Tensor> state_;  // spec_.state_inputs', made at load, kept between runs
};

}  // namespace

// AOTInductor's CPU runtime copies the constants out of model.so into
// memory of its own when it loads; the library's read-only pages they came
// from stay resident, so the weights counted twice. Those pages are handed
// back: MADV_PAGEOUT reclaims only clean file pages (a page that was
// written, like relocated data, is not dropped), and one touched again is
// read back from the file. Returns the bytes advised.
int64_t ReleaseLibraryPages(const std::string& so_path) {
#ifdef MADV_PAGEOUT
  std::error_code ec;
  std::string real = std::filesystem::canonical(so_path, ec).string();
  if (ec) return 0;
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return 0;
  int64_t advised = 0;
  char line[4096];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long start = 0, end = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &start, &end, perms, &path_at) < 3 || path_at == 0)
      continue;
    std::string path(line + path_at);
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    // Data, not code: read-only (the constants in the library) or private
    // writable (the weights AOTInductor maps from the file's end with
    // aot_inductor.force_mmap_weights; relocated data there is dirty and stays).
    if (path != real || (std::string(perms) != "r--p" && std::string(perms) != "rw-p")) continue;
    if (::madvise(reinterpret_cast<void*>(start), end - start, MADV_PAGEOUT) == 0)
      advised += static_cast<int64_t>(end - start);
  }
  std::fclose(maps);
  return advised;
#else
  (void)so_path;
  return 0;
#endif
}

StatusOr<std::unique_ptr<model::LoadedModel>> LoadInPlugin(const model::CacheEntry& entry,
                                                           const LoadOptions& options) {
  // Loads take turns: they are rare and short, and one at a time keeps
  // torch's runner registry and dlopen of model code simple to reason about.
  static Mutex load_mutex;
  MutexLock lock(&load_mutex);
  try {
    auto& registry = torch::inductor::getAOTIModelRunnerRegistry();
    auto it = registry.find(options.device);
    if (it == registry.end()) {
      std::string have;
      for (const auto& [k, v] : registry) have += (have.empty() ? "" : ", ") + k;
      return FailedPrecondition("this aotid's torch has no AOTInductor runner for device '" + options.device +
                                "' (it has: " + have + ")");
    }
    ASSIGN_OR_RETURN(c10::Device tensor_device, TensorDevice(options.device));
    // A CPU build may use AMX tiles (inductor's C++ GEMM chooses them where
    // the CPU has them, as for int8 products of several rows). Linux hands
    // a process the tile state only once it asks (arch_prctl), which the
    // compile worker's torch did and this process has not: the first tile
    // instruction would end it with SIGILL. Once a process; false where
    // there is no AMX.
    if (tensor_device.is_cpu()) {
      static const bool amx = at::cpu::init_amx();
      (void)amx;
    }
    // bin_dir: where the model finds the kernel files its build keeps
    // beside model.so (a CUDA model's .cubin files).
    auto runner =
        it->second(entry.so_path, static_cast<size_t>(std::max(1, options.num_runners)), options.device,
                   /*bin_dir=*/entry.dir, /*run_single_threaded=*/false);
    (void)ReleaseLibraryPages(entry.so_path);
    std::vector<at::Tensor> state;
    for (const model::TensorSpec& t : entry.spec.state_inputs) {
      ASSIGN_OR_RETURN(at::Tensor made, StateTensor(t, tensor_device));
      state.push_back(std::move(made));
    }
    return std::unique_ptr<model::LoadedModel>(new AotiModel(
        std::move(runner), entry.spec, options.device, tensor_device, options.threads, std::move(state)));
  } catch (const c10::Error& e) {
    return Internal("loading " + entry.so_path + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal("loading " + entry.so_path + ": " + e.what());
  }
}

}  // namespace aotid::runtime

// The entry point runtime/torch_plugin.cc looks up.
extern "C" __attribute__((visibility("default"))) aotid::StatusOr<std::unique_ptr<aotid::model::LoadedModel>>
aotid_torch_load_v2(const aotid::model::CacheEntry& entry, const aotid::runtime::LoadOptions& options) {
  static_assert(std::is_same_v<decltype(&aotid_torch_load_v2), aotid::runtime::LoadCompiledModelFn>);
  return aotid::runtime::LoadInPlugin(entry, options);
}
