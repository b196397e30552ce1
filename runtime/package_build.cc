#include "runtime/package_build.h"

#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "package/package.h"
#include "runtime/aoti_build.h"
#include "runtime/loaded_model.h"
#include "runtime/torch_plugin.h"

namespace aotid::runtime {
namespace {

void Step(int n, const std::string& what) {
  std::cout << "[aotid-build] step " << n << "/3: " << what << std::endl;
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  return fs::WriteFileAtomic(path, j.dump(2));
}

// Runs the model on zeros of its smallest accepted shapes; the outputs'
// datatypes and ranks complete a spec read from the package's C++.
Status FirstRun(const PackageBuildResult& built, const std::string& dir, const std::string& device,
                ModelSpec* spec) {
  ASSIGN_OR_RETURN(std::string plugin, LoadTorchPlugin());
  std::cout << "torch runtime: " << plugin << std::endl;
  CacheEntry entry;
  entry.dir = dir;
  entry.so_path = dir + "/model.so";
  entry.spec = *spec;
  entry.spec.outputs.clear();
  LoadOptions opts;
  opts.device = device;
  opts.threads = 1;
  ASSIGN_OR_RETURN(auto model, LoadCompiledModel(entry, opts));
  std::vector<HostTensor> inputs;
  for (size_t i = 0; i < spec->inputs.size(); ++i) {
    HostTensor t;
    t.name = spec->inputs[i].name;
    t.dtype = spec->inputs[i].dtype;
    t.shape = built.min_shapes[i];
    t.data.assign(static_cast<size_t>(t.num_elements()) * DTypeSize(t.dtype), std::byte{0});
    inputs.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(auto outputs, model->Infer(inputs, {}));
  if (built.outputs_declared) {
    if (outputs.size() != spec->outputs.size()) {
      return InvalidArgument("the package declares " + std::to_string(spec->outputs.size()) +
                             " outputs but the model returns " + std::to_string(outputs.size()));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].dtype != spec->outputs[i].dtype) {
        return InvalidArgument("output '" + spec->outputs[i].name + "' is declared " +
                               std::string(DTypeName(spec->outputs[i].dtype)) + " but the model returns " +
                               std::string(DTypeName(outputs[i].dtype)));
      }
    }
    return Status::OK();
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorSpec t;
    t.name = "output" + std::to_string(i);
    t.dtype = outputs[i].dtype;
    t.shape.assign(outputs[i].shape.size(), -1);  // which dims vary is not recorded in the package
    spec->outputs.push_back(std::move(t));
  }
  std::cout << "first run on zeros: " << outputs.size() << " outputs" << std::endl;
  return Status::OK();
}

}  // namespace

std::vector<std::string> PackageBuildArgv(const std::string& self_exe, const PackageBuildArgs& a) {
  return {self_exe, kPackageBuildCommand, "--artifact", a.artifact,        "--out",         a.out,   "--kind",
          a.kind,   "--device",           a.device,     "--package-model", a.package_model, "--cxx", a.cxx};
}

StatusOr<PackageBuildArgs> ParsePackageBuildArgs(const std::vector<std::string>& args) {
  PackageBuildArgs a;
  const std::pair<const char*, std::string*> flags[] = {
      {"--artifact", &a.artifact},           {"--out", &a.out}, {"--kind", &a.kind}, {"--device", &a.device},
      {"--package-model", &a.package_model}, {"--cxx", &a.cxx}};
  std::vector<std::string> seen;
  for (size_t i = 0; i < args.size(); i += 2) {
    std::string* field = nullptr;
    for (const auto& [name, f] : flags) {
      if (args[i] == name) field = f;
    }
    if (field == nullptr) return InvalidArgument("internal-build: unknown argument '" + args[i] + "'");
    if (std::find(seen.begin(), seen.end(), args[i]) != seen.end()) {
      return InvalidArgument("internal-build: " + args[i] + " given twice");
    }
    if (i + 1 >= args.size()) return InvalidArgument("internal-build: " + args[i] + " needs a value");
    seen.push_back(args[i]);
    *field = args[i + 1];
  }
  for (const char* required : {"--artifact", "--out", "--kind"}) {
    if (std::find(seen.begin(), seen.end(), required) == seen.end()) {
      return InvalidArgument(std::string("internal-build: ") + required + " is required");
    }
  }
  return a;
}

std::string TorchDir() { return AOTID_TORCH_DIR; }

int RunPackageBuild(const PackageBuildArgs& args, const std::function<Status()>& before_load) {
#ifdef __linux__
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the daemon
  if (::getppid() == 1) return kBuildExitMayPass;
#endif
  auto kind = package::ParsePackageKind(args.kind);
  if (!kind.ok()) {
    std::cout << "error: " << kind.status().message() << std::endl;
    return kBuildExitPermanent;
  }
  HardwareInfo hw = ProbeHardware(args.cxx);
  PackageBuildRequest req;
  req.artifact_path = args.artifact;
  req.package_model = args.package_model;
  req.kind = *kind;
  req.device = args.device;
  req.out_dir = args.out;
  req.cxx = args.cxx;
  req.torch_dir = AOTID_TORCH_DIR;
  Step(1, req.kind == package::PackageKind::kAotiSource
              ? "checking the package and compiling its C++ with " + args.cxx
              : "checking the package and copying its compiled model");
  auto built = BuildFromAotiPackage(req, hw, std::cout);
  if (!built.ok()) {
    std::cout << "error: " << built.status().message() << std::endl;
    StatusCode c = built.status().code();
    return c == StatusCode::kInvalidArgument || c == StatusCode::kFailedPrecondition ? kBuildExitPermanent
                                                                                     : kBuildExitMayPass;
  }
  if (before_load) {
    if (Status s = before_load(); !s.ok()) {
      std::cout << "error: " << s.message() << std::endl;
      return kBuildExitPermanent;
    }
  }
  Step(2, "loading the model and running it once on zeros");
  ModelSpec spec = built->spec;
  if (Status s = FirstRun(*built, args.out, args.device, &spec); !s.ok()) {
    std::cout << "error: the model does not run on this machine: " << s.message() << std::endl;
    return s.code() == StatusCode::kInternal ? kBuildExitMayPass : kBuildExitPermanent;
  }
  Step(3, "writing the build");
  Status s = fs::WriteFileAtomic(args.out + "/spec.json", spec.ToJson());
  if (s.ok()) {
    s = WriteJson(args.out + "/package.json", {{"kind", std::string(package::PackageKindName(req.kind))},
                                               {"package_model", args.package_model},
                                               {"aoti", nlohmann::json::parse(built->metadata.json)},
                                               {"author", nlohmann::json::parse(built->author_metadata)}});
  }
  if (!s.ok()) {
    std::cout << "error: " << s.message() << std::endl;
    return kBuildExitMayPass;
  }
  return kBuildExitOk;
}

}  // namespace aotid::runtime
