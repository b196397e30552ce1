#include "compile/package_build.h"

#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <csignal>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <streambuf>

#include "base/fs.h"
#include "base/json.h"
#include "compile/aoti_build.h"
#include "model/loaded_model.h"
#include "package/package.h"
#include "platform/install_layout.h"
#include "runtime/torch_plugin.h"

namespace aotid::compile {
namespace {

void Step(int n, const std::string& what) {
  std::cout << "[aotid-build] step " << n << "/3: " << what << std::endl;
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  return fs::WriteFileAtomic(path, j.dump(2));
}

// Passes what is written to a stream on and keeps its last 64 KiB: a
// compiled model's input checks say why they refused only on std::cerr.
class KeepingBuf final : public std::streambuf {
 public:
  explicit KeepingBuf(std::ostream& stream) : stream_(stream), next_(stream.rdbuf(this)) {}
  ~KeepingBuf() override { stream_.rdbuf(next_); }
  // The last line naming an input that the model's checks refused, or "".
  std::string LastInputRefusal() const {
    size_t at = kept_.rfind("input_handles[");
    if (at == std::string::npos) return "";
    size_t end = kept_.find('\n', at);
    return kept_.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    Keep(std::string(1, static_cast<char>(c)));
    return next_->sputc(static_cast<char>(c));
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    Keep(std::string(s, static_cast<size_t>(n)));
    return next_->sputn(s, n);
  }
  int sync() override { return next_->pubsync(); }

 private:
  void Keep(const std::string& text) {
    kept_ += text;
    if (kept_.size() > (64u << 10)) kept_.erase(0, kept_.size() - (32u << 10));
  }
  std::ostream& stream_;
  std::streambuf* next_;
  std::string kept_;
};

StatusOr<std::vector<model::HostTensor>> RunOnZeros(model::LoadedModel& model, const model::ModelSpec& spec,
                                                    const std::vector<std::vector<int64_t>>& shapes,
                                                    const KeepingBuf& errors) {
  std::vector<model::HostTensor> inputs;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    model::HostTensor t;
    t.name = spec.inputs[i].name;
    t.dtype = spec.inputs[i].dtype;
    t.shape = shapes[i];
    t.data.assign(static_cast<size_t>(t.num_elements()) * model::DTypeSize(t.dtype), std::byte{0});
    inputs.push_back(std::move(t));
  }
  auto outputs = model.Infer(inputs, {});
  if (!outputs.ok() && outputs.status().message().find("expected inputs vector size") != std::string::npos) {
    return InvalidArgument("the package declares " + std::to_string(spec.inputs.size()) +
                           " inputs, which its compiled model does not take (" + outputs.status().message() +
                           ")");
  }
  if (!outputs.ok()) {
    if (std::string refused = errors.LastInputRefusal(); !refused.empty()) {
      std::string shown;
      for (const auto& s : shapes) shown += (shown.empty() ? "" : ", ") + model::ShapeString(s);
      return InvalidArgument("the compiled model's own input checks refuse inputs of shape " + shown +
                             ", which its declared inputs allow: " + refused);
    }
  }
  return outputs;
}

// Runs the model on zeros of its smallest accepted shapes, under its own
// input checks (AOTI_RUNTIME_CHECK_INPUTS, set by RunPackageBuild), and
// again with each dynamic dim one larger: a dim the package declares
// dynamic but its model was compiled for one value of is refused there.
// The outputs' datatypes and ranks complete a spec read from the package's
// C++.
Status FirstRun(const PackageBuildResult& built, const std::string& dir, const std::string& device,
                model::ModelSpec* spec) {
  ASSIGN_OR_RETURN(std::string plugin, runtime::LoadTorchPlugin());
  std::cout << "torch runtime: " << plugin << std::endl;
  model::CacheEntry entry;
  entry.dir = dir;
  entry.so_path = dir + "/model.so";
  entry.spec = *spec;
  entry.spec.outputs.clear();
  runtime::LoadOptions opts;
  opts.device = device;
  opts.threads = 1;
  ASSIGN_OR_RETURN(auto model, runtime::LoadCompiledModel(entry, opts));
  KeepingBuf errors(std::cerr);
  // Without the package's C++, a dynamic dim is first tried at 1; a model
  // traced for at least N (torch.export says 2) is then run at N.
  std::vector<std::vector<int64_t>> shapes = built.min_shapes;
  StatusOr<std::vector<model::HostTensor>> outputs = Internal("not run");
  for (int attempt = 0;; ++attempt) {
    outputs = RunOnZeros(*model, *spec, shapes, errors);
    if (outputs.ok() || attempt >= 8) break;
    static const std::regex kTooSmall(
        R"re(input_handles\[(\d+)\]: dim value is too small at (\d+), expected it to be >= (\d+))re");
    std::smatch m;
    std::string refused = errors.LastInputRefusal();
    if (!std::regex_search(refused, m, kTooSmall)) break;
    // A fixed dim too: a package declared for batch 1 of a model traced
    // for at least 2 is checked at 2 (its kernels run 1 correctly).
    size_t i = std::stoul(m[1]), d = std::stoul(m[2]);
    if (i >= shapes.size() || d >= shapes[i].size()) break;
    int64_t least = std::stoll(m[3]);
    if (least <= shapes[i][d] || least > 64) break;
    std::cout << "(that refusal is the model's least size for input " << i << " dim " << d << "; running at "
              << least << ")" << std::endl;
    shapes[i][d] = least;
  }
  RETURN_IF_ERROR(outputs.status());
  std::vector<std::vector<int64_t>> larger = shapes;
  bool any_dynamic = false;
  for (size_t i = 0; i < spec->inputs.size(); ++i) {
    const model::TensorSpec& t = spec->inputs[i];
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] >= 0) continue;
      int64_t max = !t.dims.empty() && t.dims[d] ? t.dims[d]->max : std::numeric_limits<int64_t>::max();
      if (larger[i][d] + 1 > max) continue;
      ++larger[i][d];
      any_dynamic = true;
    }
  }
  if (any_dynamic) RETURN_IF_ERROR(RunOnZeros(*model, *spec, larger, errors).status());
  if (built.outputs_declared) {
    // Fixed output dims are compared when the run was at the declared
    // shapes (not when a fixed dim had to be raised to the model's least).
    bool at_declared = true;
    for (size_t i = 0; i < spec->inputs.size(); ++i) {
      for (size_t d = 0; d < spec->inputs[i].shape.size(); ++d) {
        int64_t want = spec->inputs[i].shape[d];
        if (want >= 0 && shapes[i][d] != want) at_declared = false;
      }
    }
    if (outputs->size() != spec->outputs.size()) {
      return InvalidArgument("the package declares " + std::to_string(spec->outputs.size()) +
                             " outputs but the model returns " + std::to_string(outputs->size()));
    }
    for (size_t i = 0; i < outputs->size(); ++i) {
      const model::TensorSpec& declared = spec->outputs[i];
      const model::HostTensor& got = (*outputs)[i];
      if (got.dtype != declared.dtype) {
        return InvalidArgument("output '" + declared.name + "' is declared " +
                               std::string(model::DTypeName(declared.dtype)) + " but the model returns " +
                               std::string(model::DTypeName(got.dtype)));
      }
      bool fits = got.shape.size() == declared.shape.size();
      for (size_t d = 0; fits && at_declared && d < got.shape.size(); ++d) {
        fits = declared.shape[d] < 0 || declared.shape[d] == got.shape[d];
      }
      if (!fits) {
        return InvalidArgument("output '" + declared.name + "' is declared " +
                               model::ShapeString(declared.shape) + " but the model returns " +
                               model::ShapeString(got.shape) + " for inputs of shape " +
                               model::ShapeString(shapes[0]) + (shapes.size() > 1 ? ", ..." : ""));
      }
    }
    return Status::OK();
  }
  for (const model::HostTensor& o : *outputs) {
    model::TensorSpec t;
    t.name = "output" + std::to_string(spec->outputs.size());
    t.dtype = o.dtype;
    t.shape.assign(o.shape.size(), -1);  // which dims vary is not recorded in the package
    spec->outputs.push_back(std::move(t));
  }
  std::cout << "first run on zeros: " << outputs->size() << " outputs" << std::endl;
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

int RunPackageBuild(const PackageBuildArgs& args, const std::function<Status()>& before_load) {
  // The model's own input checks, for the first runs: read once, at the
  // first check.
  ::setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/1);
#ifdef __linux__
  // Never outlive the daemon. It may be pid 1 itself (a container's
  // entrypoint): the parent is compared with the one seen before, not with 1.
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) return kBuildExitMayPass;
#endif
  auto kind = package::ParsePackageKind(args.kind);
  if (!kind.ok()) {
    std::cout << "error: " << kind.status().message() << std::endl;
    return kBuildExitPermanent;
  }
  platform::HardwareInfo hw = platform::ProbeHardware(args.cxx);
  PackageBuildRequest req;
  req.artifact_path = args.artifact;
  req.package_model = args.package_model;
  req.kind = *kind;
  req.device = args.device;
  req.out_dir = args.out;
  req.cxx = args.cxx;
  // Its headers and libraries compile a package's C++: the torch this
  // process links, wherever it is installed.
  if (auto plugin = runtime::LoadTorchPlugin(); !plugin.ok()) {
    std::cout << "error: " << plugin.status().message() << std::endl;
    return kBuildExitMayPass;
  }
  req.torch_dir = platform::LoadedTorchDir();
  Step(1, req.kind == package::PackageKind::kAotiSource
              ? "checking the package and compiling its C++ with " + args.cxx
              : "checking the package and copying its compiled model");
  auto built = BuildFromAotiPackage(req, hw, std::cout);
  if (!built.ok()) {
    std::cout << "error: " << built.status().message() << std::endl;
    StatusCode c = built.status().code();
    // A package that does not fit, does not compile or whose metadata does
    // not parse will not build on a retry either.
    return c == StatusCode::kInvalidArgument || c == StatusCode::kFailedPrecondition ||
                   c == StatusCode::kCorruption
               ? kBuildExitPermanent
               : kBuildExitMayPass;
  }
  if (before_load) {
    if (Status s = before_load(); !s.ok()) {
      std::cout << "error: " << s.message() << std::endl;
      return kBuildExitPermanent;
    }
  }
  Step(2, "loading the model and running it once on zeros");
  model::ModelSpec spec = built->spec;
  if (Status s = FirstRun(*built, args.out, args.device, &spec); !s.ok()) {
    std::cout << "error: "
              << (s.code() == StatusCode::kInvalidArgument ? "" : "the model does not run on this machine: ")
              << s.message() << std::endl;
    return s.code() == StatusCode::kInternal ? kBuildExitMayPass : kBuildExitPermanent;
  }
  Step(3, "writing the build");
  Status s = fs::WriteFileAtomic(args.out + "/spec.json", spec.ToJson());
  if (s.ok()) {
    s = WriteJson(args.out + "/package.json", {{"kind", std::string(package::PackageKindName(req.kind))},
                                               {"package_model", args.package_model},
                                               {"aoti", ParseJsonOrDiscarded(built->metadata.json)},
                                               {"author", ParseJsonOrDiscarded(built->author_metadata)}});
  }
  if (!s.ok()) {
    std::cout << "error: " << s.message() << std::endl;
    return kBuildExitMayPass;
  }
  return kBuildExitOk;
}

}  // namespace aotid::compile
