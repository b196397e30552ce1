// Building one model of an AOTInductor package (package/aoti_metadata.h)
// for this machine, into a build directory (compile/build_cache.h):
//
//   compiled package  the .so is copied out as is, after the checks;
//   source package    (aot_inductor.package_cpp_only) its C++ is compiled
//                     here with the local compiler against the libtorch this
//                     aotid links, with the flags the package records, and
//                     the paths of the machine that exported it replaced.
//
// The checks compare the package's metadata with this machine. The model's
// inputs and outputs come from the package's extra/aotid.json (written by
// aotid_export) when it has one; otherwise the inputs are read from the
// input checks in the generated C++ (names, datatypes, fixed and dynamic
// dims) and the outputs are found by running the model once in the build
// child (compile/package_build.cc).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/tensor.h"
#include "package/aoti_metadata.h"
#include "package/package.h"
#include "platform/hardware.h"

namespace aotid::compile {

// Ok when a build with this metadata can run here; otherwise
// FailedPrecondition naming the mismatch, for example "package was compiled
// for AVX512 (avx512f avx512dq avx512vl avx512bw), this CPU has AVX2 only".
Status CheckFitsMachine(const package::AotiMetadata& m, const platform::HardwareInfo& hw);

// Ok when this machine has the device a compiled package was built for;
// otherwise FailedPrecondition "package was built for cuda; this machine has
// none (why)". Its kernels are for that device alone: such a package is
// never run anywhere else.
Status CheckPackageDevice(const package::AotiMetadata& m, const platform::HardwareInfo& hw);

// A model's inputs as read from generated C++, with the lowest value each
// dynamic dim accepts (to run the model once on zeros).
struct DerivedInputs {
  std::vector<model::TensorSpec> inputs;
  std::vector<std::vector<int64_t>> min_shapes;
  std::vector<std::string> output_names;
};
StatusOr<DerivedInputs> DeriveInputsFromSource(const std::string& cpp);

// Checks the inputs a package declares (extra/aotid.json) against those its
// C++ checks (`compiled`): InvalidArgument naming the input when a datatype,
// rank or fixed dim differs. A dim declared dynamic that the C++ fixes
// becomes fixed, and a dynamic dim takes the C++'s upper bound. Sets the
// shapes to run the model on once: the fixed dims, and the C++'s least
// value for dynamic ones.
Status CheckDeclaredAgainstChecks(const DerivedInputs& compiled, model::ModelSpec* declared,
                                  std::vector<std::vector<int64_t>>* min_shapes, std::ostream& log);

// The flags that turn OpenMP on where a source package is built (`os` as
// HardwareInfo::os has it). GCC and clang on Linux take -fopenmp to compile
// and to link. Apple's clang refuses -fopenmp: it takes -Xclang -fopenmp,
// and the OpenMP runtime is linked by name (-lomp), the one torch's macOS
// wheel ships (include/omp.h and lib/libomp.dylib, on the paths the build
// already passes), so the model uses the runtime libtorch does. A package
// records its exporter's OpenMP flags; those are dropped and these used.
struct OpenMpFlags {
  std::vector<std::string> compile;
  std::vector<std::string> link;
};
OpenMpFlags OpenMpFlagsFor(const std::string& os);

struct PackageBuildRequest {
  std::string artifact_path;
  std::string package_model = "model";
  package::PackageKind kind = package::PackageKind::kAotiCompiled;  // or kAotiSource
  std::string device;  // the device asked for: must match the package's
  std::string out_dir;
  std::string cxx = "c++";
  std::string torch_dir;  // the torch this aotid links: include/ and lib/
};

struct PackageBuildResult {
  package::AotiMetadata metadata;
  model::ModelSpec spec;  // outputs empty when the package does not declare them
  bool outputs_declared = false;
  std::vector<std::vector<int64_t>> min_shapes;  // for a run on zeros
  std::string author_metadata;                   // JSON object from extra/aotid.json, "{}" without
};

// Writes out_dir/model.so for one model of an AOTInductor package, logging
// each step and command to `log`. InvalidArgument for a package that cannot
// be built (does not fit, fails to compile: a retry will not help).
StatusOr<PackageBuildResult> BuildFromAotiPackage(const PackageBuildRequest& req,
                                                  const platform::HardwareInfo& hw, std::ostream& log);

}  // namespace aotid::compile
