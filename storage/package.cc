#include "storage/package.h"

#include <zip.h>

#include <algorithm>
#include <memory>
#include <set>

namespace aotid::storage {
namespace {

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Splits "<root>/rest" and returns rest, or empty when there is no root.
std::string_view AfterRoot(std::string_view name) {
  auto slash = name.find('/');
  return slash == std::string_view::npos ? std::string_view() : name.substr(slash + 1);
}

}  // namespace

std::string_view PackageKindName(PackageKind kind) {
  switch (kind) {
    case PackageKind::kExportedProgram: return "exported_program";
    case PackageKind::kAotiCompiled: return "aoti_compiled";
    case PackageKind::kAotiSource: return "aoti_source";
  }
  return "unknown";
}

bool ParsePackageKind(std::string_view name, PackageKind* out) {
  for (auto k : {PackageKind::kExportedProgram, PackageKind::kAotiCompiled, PackageKind::kAotiSource}) {
    if (PackageKindName(k) == name) {
      *out = k;
      return true;
    }
  }
  return false;
}

StatusOr<PackageInfo> InspectPackage(const std::string& path) {
  int err = 0;
  std::unique_ptr<zip_t, ZipCloser> z(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err));
  if (!z) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    std::string why = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    if (err == ZIP_ER_NOENT || err == ZIP_ER_OPEN) return NotFound("cannot open " + path + ": " + why);
    return InvalidArgument(path + " is not a .pt2 package (not a readable zip archive: " + why + ")");
  }
  std::set<std::string> exported, compiled, source;
  zip_int64_t n = zip_get_num_entries(z.get(), 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* raw = zip_get_name(z.get(), static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
    if (raw == nullptr) continue;
    std::string_view rest = AfterRoot(raw);
    if (rest.rfind("models/", 0) == 0 && EndsWith(rest, ".json")) {
      std::string_view m = rest.substr(7, rest.size() - 7 - 5);
      if (!m.empty() && m.find('/') == std::string_view::npos) exported.emplace(m);
    } else if (rest.rfind("data/aotinductor/", 0) == 0) {
      std::string_view tail = rest.substr(17);
      auto slash = tail.find('/');
      if (slash == std::string_view::npos || slash == 0) continue;
      std::string model(tail.substr(0, slash));
      if (EndsWith(tail, ".so")) compiled.insert(model);
      else if (EndsWith(tail, ".cpp")) source.insert(model);
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
  return info;
}

}  // namespace aotid::storage
