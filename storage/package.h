// Tells the kinds of .pt2 archive apart by their contents, without torch.
//
//   exported program   <root>/models/<name>.json           (torch.export.save)
//   AOTI compiled      <root>/data/aotinductor/<name>/*.so  (aoti_compile_and_package)
//   AOTI source        <root>/data/aotinductor/<name>/*.cpp with no .so
//                                                           (aot_inductor.package_cpp_only)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace aotid::storage {

enum class PackageKind { kExportedProgram, kAotiCompiled, kAotiSource };

std::string_view PackageKindName(PackageKind kind);  // "exported_program", ...
bool ParsePackageKind(std::string_view name, PackageKind* out);

struct PackageInfo {
  PackageKind kind;
  // The models inside (the `model_name` of each), sorted.
  std::vector<std::string> model_names;
};

// Reads the archive's directory. InvalidArgument, naming the file and the
// reason, when it is not a zip archive or holds no model aotid knows.
StatusOr<PackageInfo> InspectPackage(const std::string& path);

}  // namespace aotid::storage
