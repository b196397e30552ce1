#include "package/aoti_metadata.h"

#include <nlohmann/json.hpp>

#include "base/json.h"

namespace aotid::package {
namespace {

using nlohmann::json;

constexpr std::string_view kExportRecord = "extra/aotid.json";

// A package's metadata is copied into the store, the cache and a registry's
// config, and shown by `aotid show`: it is refused at add when it is larger
// or deeper than this, so nothing a package holds grows without bound on
// its way (an exporter's record is a few KB and four levels deep).
constexpr JsonLimits kMetadataLimits{.max_depth = 16, .max_bytes = size_t{1} << 20};

// The name of <root>/extra/aotid.json, or "" when the package has none.
std::string ExportRecordEntry(const Archive& archive) {
  for (const std::string& name : archive.names()) {
    if (AfterRoot(name) == kExportRecord) return name;
  }
  return "";
}

}  // namespace

std::vector<std::string> AotiModelEntries(const Archive& archive, const std::string& package_model) {
  std::vector<std::string> files;
  const std::string prefix = "data/aotinductor/" + package_model + "/";
  for (const std::string& name : archive.names()) {
    std::string_view rest = AfterRoot(name);
    if (!rest.starts_with(prefix)) continue;
    std::string_view file = rest.substr(prefix.size());
    if (!file.empty() && file.find('/') == std::string_view::npos) files.push_back(name);
  }
  return files;
}

StatusOr<AotiMetadata> ReadAotiMetadata(const Archive& archive, const std::string& package_model) {
  return ReadJsonSafely<AotiMetadata>("the package's AOTInductor metadata", [&]() -> StatusOr<AotiMetadata> {
    std::vector<std::string> files = AotiModelEntries(archive, package_model);
    if (files.empty()) return InvalidArgument("the package has no AOTInductor model '" + package_model + "'");
    std::string meta_name;
    for (const auto& f : files) {
      if (f.ends_with("_metadata.json") && (meta_name.empty() || f.ends_with("wrapper_metadata.json")))
        meta_name = f;
    }
    if (meta_name.empty())
      return InvalidArgument("the package has no AOTInductor metadata for '" + package_model + "'");
    ASSIGN_OR_RETURN(std::string meta_text, archive.Read(meta_name, kMetadataLimits.max_bytes));
    ASSIGN_OR_RETURN(json meta, ParseJson(meta_text, meta_name, kMetadataLimits));
    if (!meta.is_object()) return InvalidArgument(meta_name + " is not a JSON object");
    auto field = [&](const char* k) {
      return meta.contains(k) && meta[k].is_string() ? meta[k].get<std::string>() : "";
    };
    AotiMetadata m{field("AOTI_DEVICE_KEY"), field("AOTI_PLATFORM"), field("AOTI_MACHINE"),
                   field("AOTI_CPU_ISA"), meta.dump()};
    if (m.device_key.empty())
      return InvalidArgument("the package's metadata names no device (AOTI_DEVICE_KEY)");
    return m;
  });
}

StatusOr<AotiMetadata> ReadAotiMetadata(const std::string& path, const std::string& package_model) {
  ASSIGN_OR_RETURN(Archive archive, Archive::Open(path));
  return ReadAotiMetadata(archive, package_model);
}

Status CheckPackageMetadata(const Archive& archive) {
  for (const std::string& name : archive.names()) {
    std::string_view rest = AfterRoot(name);
    bool aoti = rest.starts_with("data/aotinductor/") && rest.ends_with("_metadata.json");
    if (!aoti && rest != kExportRecord) continue;
    ASSIGN_OR_RETURN(std::string text, archive.Read(name, kMetadataLimits.max_bytes));
    RETURN_IF_ERROR(ParseJson(text, name, kMetadataLimits).status());
  }
  return Status::OK();
}

StatusOr<ExportRecord> ReadExportRecord(const Archive& archive, const std::string& package_model) {
  return ReadJsonSafely<ExportRecord>("extra/aotid.json", [&]() -> StatusOr<ExportRecord> {
    ExportRecord record;
    std::string name = ExportRecordEntry(archive);
    if (name.empty()) return record;
    ASSIGN_OR_RETURN(std::string text, archive.Read(name, kMetadataLimits.max_bytes));
    ASSIGN_OR_RETURN(json extra, ParseJson(text, name, kMetadataLimits));
    if (!extra.is_object()) return InvalidArgument(name + " is not a JSON object");
    if (extra.contains("metadata") && extra["metadata"].is_object())
      record.author_metadata = extra["metadata"].dump();
    if (extra.contains("inductor_options") && extra["inductor_options"].is_object())
      record.package_options = extra["inductor_options"].dump();
    if (extra.contains("models") && extra["models"].is_object() && extra["models"].contains(package_model)) {
      const json& one = extra["models"][package_model];
      if (one.is_object() && one.contains("inputs") && one.contains("outputs"))
        record.model_spec = one.dump();
    }
    return record;
  });
}

StatusOr<ExportRecord> ReadPackageRecord(const std::string& path) {
  ASSIGN_OR_RETURN(Archive archive, Archive::Open(path));
  auto record = ReadExportRecord(archive, "");
  if (!record.ok() && record.status().code() == StatusCode::kInvalidArgument) return ExportRecord{};
  return record;
}

std::string ExternalWeightsEntry(const Archive& archive) {
  for (const std::string& name : archive.names()) {
    if (name.find("/data/weights/") != std::string::npos ||
        name.find("/data/constants/") != std::string::npos) {
      return name;
    }
  }
  return "";
}

}  // namespace aotid::package
