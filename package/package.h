// The kinds of .pt2 package aotid serves, told apart by what the archive
// holds, without torch:
//
//   exported program   <root>/models/<name>.json           (torch.export.save)
//   AOTI compiled      <root>/data/aotinductor/<name>/*.so  (aoti_compile_and_package)
//   AOTI source        <root>/data/aotinductor/<name>/*.cpp with no .so
//                                                           (aot_inductor.package_cpp_only)
//
// The kind travels between modules as the enum; its name is the one
// spelling used where it is text (the store's rows, a build child's command
// line, JSON output).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace aotid::package {

enum class PackageKind { kExportedProgram, kAotiCompiled, kAotiSource };

// "exported_program", "aoti_compiled" or "aoti_source".
std::string_view PackageKindName(PackageKind kind);
// The kind named `name` (as PackageKindName spells it); InvalidArgument
// naming the known kinds otherwise.
StatusOr<PackageKind> ParsePackageKind(std::string_view name);

struct PackageInfo {
  PackageKind kind = PackageKind::kExportedProgram;
  // The models inside (the `model_name` of each), sorted.
  std::vector<std::string> model_names;
};

// Reads the archive's directory. NotFound when the file cannot be opened;
// InvalidArgument, naming the file and the reason, when it is not a zip
// archive or holds no model aotid knows.
StatusOr<PackageInfo> InspectPackage(const std::string& path);

}  // namespace aotid::package
