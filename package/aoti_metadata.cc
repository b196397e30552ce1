#include "package/aoti_metadata.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

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

// The name of <root>/extra/`file`, or "" when the package has none.
std::string EntryNamed(const Archive& archive, std::string_view file) {
  for (const std::string& name : archive.names()) {
    if (AfterRoot(name) == file) return name;
  }
  return "";
}

std::string ExportRecordEntry(const Archive& archive) { return EntryNamed(archive, kExportRecord); }

// The record's "generate" or "embed" section of `package_model`: its own
// under "models" first, then the package's, as the compile worker merges
// them; null when it has neither.
json TaskSection(const json& extra, const std::string& package_model) {
  const json* one = nullptr;
  if (extra.contains("models") && extra["models"].is_object() && extra["models"].contains(package_model) &&
      extra["models"][package_model].is_object()) {
    one = &extra["models"][package_model];
  }
  for (const char* key : {"generate", "embed"}) {
    const json& section = one && one->contains(key) ? (*one)[key] : extra.value(key, json());
    if (section.is_object()) return json{{"task", key}, {"section", section}};
  }
  return json();
}

// The bytes of one element of a dtype as torch's export schema numbers it
// (torch/_export/serde/schema.py, ScalarType), and its name; {0, ""} for
// one not listed.
std::pair<int, std::string_view> ScalarType(int code) {
  switch (code) {
    case 1: return {1, "uint8"};
    case 2: return {1, "int8"};
    case 3: return {2, "int16"};
    case 4: return {4, "int32"};
    case 5: return {8, "int64"};
    case 6: return {2, "float16"};
    case 7: return {4, "float32"};
    case 8: return {8, "float64"};
    case 12: return {1, "bool"};
    case 13: return {2, "bfloat16"};
    case 28: return {2, "uint16"};
    case 29: return {1, "float8_e4m3fn"};
    case 30: return {1, "float8_e5m2"};
    case 34: return {4, "uint32"};
    case 35: return {8, "uint64"};
    default: return {0, ""};
  }
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
    if (json task = TaskSection(extra, package_model); task.is_object())
      record.task = task["task"].get<std::string>();
    return record;
  });
}

StatusOr<ExportRecord> ReadPackageRecord(const std::string& path, const std::string& package_model) {
  ASSIGN_OR_RETURN(Archive archive, Archive::Open(path));
  auto record = ReadExportRecord(archive, package_model);
  if (!record.ok() && record.status().code() == StatusCode::kInvalidArgument) return ExportRecord{};
  return record;
}

StatusOr<std::string> ReadTaskSpec(const Archive& archive, const std::string& package_model) {
  return ReadJsonSafely<std::string>("extra/aotid.json", [&]() -> StatusOr<std::string> {
    std::string name = ExportRecordEntry(archive);
    if (name.empty()) return std::string();
    ASSIGN_OR_RETURN(std::string text, archive.Read(name, kMetadataLimits.max_bytes));
    ASSIGN_OR_RETURN(json extra, ParseJson(text, name, kMetadataLimits));
    json task = extra.is_object() ? TaskSection(extra, package_model) : json();
    if (!task.is_object()) return std::string();
    json section = task["section"];
    std::string file = section.value("tokenizer", std::string());
    std::string entry = file.empty() ? "" : EntryNamed(archive, "extra/" + file);
    if (entry.empty()) {
      return InvalidArgument(name + " \"" + task["task"].get<std::string>() +
                             "\" names the tokenizer file '" + file + "', which the package lacks");
    }
    // A tokenizer is the one large document a package's record points to
    // (SmolLM2's is 3.5 MB); it is read with the limits every tokenizer is.
    ASSIGN_OR_RETURN(std::string tokenizer, archive.Read(entry));
    ASSIGN_OR_RETURN(section["tokenizer"], ParseJson(tokenizer, entry));
    return section.dump();
  });
}

std::string WeightsKind(const Archive& archive, const std::string& package_model) {
  std::string name = EntryNamed(archive, "data/weights/" + package_model + "_weights_config.json");
  if (name.empty()) return "";
  auto text = archive.Read(name);
  if (!text.ok()) return "";
  json config = ParseJsonOrDiscarded(*text);
  if (!config.is_object() || !config.contains("config") || !config["config"].is_object()) return "";
  try {
    std::map<std::string_view, int64_t> bytes;  // by dtype
    std::set<std::string> seen;                 // tied weights are stored once
    for (const json& w : config["config"]) {
      if (!w.is_object() || !w.contains("tensor_meta") || !seen.insert(w.value("path_name", "")).second)
        continue;
      const json& meta = w["tensor_meta"];
      auto [size, dtype] = ScalarType(meta.value("dtype", 0));
      int64_t n = size;
      for (const json& d : meta.value("sizes", json::array())) n *= d.value("as_int", int64_t{0});
      if (!dtype.empty()) bytes[dtype] += n;
    }
    auto most = std::max_element(bytes.begin(), bytes.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    return most == bytes.end() || most->second == 0 ? "" : std::string(most->first);
  } catch (const json::exception&) {
    return "";  // not the layout torch writes: unknown, as without a list
  }
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
