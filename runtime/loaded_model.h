// A compiled model loaded for serving. The only interface the serving path
// uses; it hides torch entirely.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/build_cache.h"
#include "runtime/tensor.h"

namespace aotid::runtime {

class LoadedModel {
 public:
  virtual ~LoadedModel() = default;

  virtual const ModelSpec& spec() const = 0;
  virtual const std::string& device() const = 0;

  // Runs the model on `inputs`, which must already match spec().inputs in
  // order, datatype and shape (CheckTensorAgainstSpec). Thread-safe: up to
  // the model's runner count run at once, further callers wait. A failure
  // inside the model comes back as a Status, never as an exception.
  virtual StatusOr<std::vector<HostTensor>> Infer(const std::vector<HostTensor>& inputs) = 0;
};

struct LoadOptions {
  std::string package_model = "model";
  std::string device = "cpu";
  int num_runners = 1;
};

// Loads an AOTInductor package from a cache entry. Errors name the package
// and carry torch's message without its backtrace.
StatusOr<std::unique_ptr<LoadedModel>> LoadAotiPackage(const CacheEntry& entry, const LoadOptions& options);

}  // namespace aotid::runtime
