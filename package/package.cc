#include "package/package.h"

#include <set>

#include "package/aoti_metadata.h"
#include "package/archive.h"

namespace aotid::package {
namespace {

constexpr PackageKind kKinds[] = {PackageKind::kExportedProgram, PackageKind::kAotiCompiled,
                                  PackageKind::kAotiSource};

}  // namespace

std::string_view PackageKindName(PackageKind kind) {
  switch (kind) {
    case PackageKind::kExportedProgram: return "exported_program";
    case PackageKind::kAotiCompiled: return "aoti_compiled";
    case PackageKind::kAotiSource: return "aoti_source";
  }
  return "unknown";
}

StatusOr<PackageKind> ParsePackageKind(std::string_view name) {
  std::string known;
  for (PackageKind k : kKinds) {
    if (PackageKindName(k) == name) return k;
    known += (known.empty() ? "" : ", ") + std::string(PackageKindName(k));
  }
  return InvalidArgument("unknown package kind '" + std::string(name) + "' (expected one of " + known + ")");
}

StatusOr<PackageInfo> InspectPackage(const std::string& path) {
  ASSIGN_OR_RETURN(Archive archive, Archive::Open(path));
  std::set<std::string> exported, compiled, source;
  for (const std::string& name : archive.names()) {
    std::string_view rest = AfterRoot(name);
    if (rest.starts_with("models/") && rest.ends_with(".json")) {
      std::string_view m = rest.substr(7, rest.size() - 7 - 5);
      if (!m.empty() && m.find('/') == std::string_view::npos) exported.emplace(m);
    } else if (rest.starts_with("data/aotinductor/")) {
      std::string_view tail = rest.substr(17);
      auto slash = tail.find('/');
      if (slash == std::string_view::npos || slash == 0) continue;
      std::string model(tail.substr(0, slash));
      if (tail.ends_with(".so"))
        compiled.insert(model);
      else if (tail.ends_with(".cpp"))
        source.insert(model);
    }
  }
  PackageInfo info;
  if (!exported.empty()) {
    info.kind = PackageKind::kExportedProgram;
    info.model_names.assign(exported.begin(), exported.end());
  } else if (!compiled.empty()) {
    info.kind = PackageKind::kAotiCompiled;
    info.model_names.assign(compiled.begin(), compiled.end());
  } else if (!source.empty()) {
    info.kind = PackageKind::kAotiSource;
    info.model_names.assign(source.begin(), source.end());
  } else {
    return InvalidArgument(path +
                           " is a zip archive but holds no model: expected an exported program "
                           "(torch.export.save) or an AOTInductor package");
  }
  RETURN_IF_ERROR(CheckPackageMetadata(archive).WithContext(path));
  return info;
}

}  // namespace aotid::package
