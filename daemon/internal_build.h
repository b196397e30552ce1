// The build child for AOTInductor packages (daemon/internal_build.cc).
#pragma once

#include <string>

namespace aotid::daemon {

struct InternalBuildArgs {
  std::string artifact;
  std::string out;
  std::string kind;  // as package::PackageKindName spells it; parsed by the build
  std::string device = "cpu";
  std::string package_model = "model";
  std::string cxx = "c++";
};

int RunInternalBuild(const InternalBuildArgs& args);

}  // namespace aotid::daemon
