// The build child for AOTInductor packages, `aotid internal-build ...`: the
// process the Builder runs to turn a compiled or source package into a
// cache entry without Python. Its command line and exit codes are defined
// here once, for both sides.
//
// It writes a build directory (compile/build_cache.h) and exits
// kBuildExitOk; kBuildExitPermanent when the package cannot be built here
// (a retry will not help); kBuildExitMayPass for anything else. Its output
// is the build log, with "[aotid-build] step N/M: what" lines for progress.
//
// Running the model once on zeros happens here too, in the child: it finds
// the outputs of a package that does not declare them, and a package that
// slipped past the checks and crashes on this CPU (SIGILL) kills this
// process, never the daemon.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace aotid::compile {

// Exit codes of every build child: this one and the Python compile worker
// (python/aotid_worker/compile.py says the same).
inline constexpr int kBuildExitOk = 0;
inline constexpr int kBuildExitMayPass = 1;
inline constexpr int kBuildExitPermanent = 2;

// The subcommand the daemon's own binary runs as the build child.
inline constexpr char kPackageBuildCommand[] = "internal-build";

struct PackageBuildArgs {
  std::string artifact;  // the package's blob
  std::string out;       // the staging directory to fill
  std::string kind;      // aoti_compiled or aoti_source
  std::string device = "cpu";
  std::string package_model = "model";
  std::string cxx = "c++";  // compiler for source packages
};

// `self_exe internal-build --artifact ... --out ...`.
std::vector<std::string> PackageBuildArgv(const std::string& self_exe, const PackageBuildArgs& args);
// Parses what follows the subcommand; InvalidArgument naming an unknown,
// repeated or missing flag.
StatusOr<PackageBuildArgs> ParsePackageBuildArgs(const std::vector<std::string>& args);
// Runs the build in this process; returns the exit code. `before_load`
// runs after the package's C++ is compiled and before its model.so is
// loaded (the caller confines the process there); an error from it fails
// the build for good.
int RunPackageBuild(const PackageBuildArgs& args, const std::function<Status()>& before_load = nullptr);

}  // namespace aotid::compile
