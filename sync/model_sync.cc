#include "sync/model_sync.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/json.h"
#include "package/aoti_metadata.h"
#include "package/package.h"

namespace aotid::sync {
namespace {

using json = nlohmann::json;

constexpr char kTitle[] = "org.opencontainers.image.title";

json SettingsObject(const storage::VersionSettings& s) {
  json out = json::object();
  for (const auto& f : storage::VersionSettingFields()) out[std::string(f.key)] = f.Text(s);
  return out;
}

// The pushed settings over the defaults. Keys this aotid does not know (a
// newer one pushed them) are left out, and said.
StatusOr<storage::VersionSettings> ReadSettings(const json& j, std::vector<std::string>* notes,
                                                bool trusted) {
  storage::VersionSettings s;
  if (j.is_null()) return s;
  if (!j.is_object()) return InvalidArgument("'settings' is not an object");
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string()) return InvalidArgument("setting '" + key + "' in the config is not a string");
    const storage::SettingField* field = nullptr;
    for (const auto& f : storage::VersionSettingFields()) {
      if (f.key == key) field = &f;
    }
    if (!field) {
      notes->push_back("setting '" + key + "' is unknown to this aotid; left at its default");
      continue;
    }
    if (field->type == storage::SettingType::kOptions) {
      std::string text = value.get<std::string>();
      if (text == "{}" || text.empty()) continue;
      // Inductor options reach the compiler's command line: from a
      // registry they would be a way to run anything on this machine.
      if (!trusted) {
        notes->push_back(
            "its inductor options are not applied: options from a registry reach the compiler's "
            "command line (set them here with 'aotid set NAME inductor.KEY=VALUE')");
        continue;
      }
      s.*(field->text) = text;
    } else {
      RETURN_IF_ERROR(
          storage::ApplySetting(&s, key, value.get<std::string>()).WithContext("setting '" + key + "'"));
    }
  }
  RETURN_IF_ERROR(storage::ValidateSettings(s));
  return s;
}

// A manifest or a config nests four levels; a registry's documents deeper
// than this are refused before they are built (base/json.h).
constexpr JsonLimits kRegistryJson{.max_depth = 32};

StatusOr<Manifest> ReadManifest(const json& m, const RegistryLimits& limits) {
  if (!m.is_object()) return InvalidArgument("the manifest is not a JSON object");
  auto str = [&](const json& o, const char* k) {
    return o.is_object() && o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : std::string();
  };
  if (!m.contains("schemaVersion") || !m["schemaVersion"].is_number_integer() ||
      m["schemaVersion"].get<int64_t>() != 2)
    return InvalidArgument("the manifest's schemaVersion is not 2");
  std::string media = str(m, "mediaType");
  if (!media.empty() && media != kOciManifestMediaType) {
    return InvalidArgument("the manifest is a '" + media +
                           "', not an OCI image manifest (an image index or a " +
                           "Docker image is not an aotid model)");
  }
  const json& config = m.contains("config") ? m["config"] : json();
  std::string artifact_type = str(m, "artifactType");
  std::string config_type = str(config, "mediaType");
  // The artifact type says what it is; tools that cannot set one (older
  // oras) say it with the config's media type.
  if (artifact_type != kArtifactType && !(artifact_type.empty() && config_type == kConfigMediaType)) {
    return InvalidArgument("the manifest's artifact type is '" +
                           (artifact_type.empty() ? config_type : artifact_type) +
                           "', not an aotid model ('" + kArtifactType + "')");
  }
  Manifest p;
  p.config_digest = str(config, "digest");
  if (!IsValidDigest(p.config_digest))
    return InvalidArgument("the manifest's config digest '" + p.config_digest +
                           "' is not sha256:<64 hex digits>");
  if (!config.contains("size") || !config["size"].is_number_integer())
    return InvalidArgument("the manifest's config has no size");
  p.config_size = config["size"].get<int64_t>();
  if (p.config_size < 0) return InvalidArgument("the manifest's config size is negative");
  if (p.config_size > limits.max_config_bytes) {
    return ResourceExhausted("the config is " + std::to_string(p.config_size) + " bytes, over the limit of " +
                             std::to_string(limits.max_config_bytes));
  }
  if (!m.contains("layers") || !m["layers"].is_array()) return InvalidArgument("the manifest has no layers");
  int packages = 0;
  for (const auto& l : m["layers"]) {
    std::string digest = str(l, "digest");
    if (!IsValidDigest(digest))
      return InvalidArgument("a layer's digest '" + digest + "' is not sha256:<64 hex digits>");
    if (str(l, "mediaType") != kPackageMediaType) continue;  // not ours: not fetched
    if (!l.contains("size") || !l["size"].is_number_integer() || l["size"].get<int64_t>() < 0)
      return InvalidArgument("the package layer has no size");
    p.layer = {digest, l["size"].get<int64_t>()};
    ++packages;
  }
  if (packages != 1) {
    return InvalidArgument("the manifest has " + std::to_string(packages) + " layers of type '" +
                           kPackageMediaType + "'; an aotid model has one");
  }
  if (p.layer.size > limits.max_layer_bytes) {
    return ResourceExhausted("the package is " + std::to_string(p.layer.size) + " bytes, over the limit of " +
                             std::to_string(limits.max_layer_bytes));
  }
  return p;
}

StatusOr<RemoteConfig> ReadRemoteConfig(const json& config) {
  if (!config.is_object()) return InvalidArgument("the config is not a JSON object");
  RemoteConfig c;
  if (config.contains("package_model") && config["package_model"].is_string())
    c.package_model = config["package_model"].get<std::string>();
  auto settings =
      ReadSettings(config.contains("settings") ? config["settings"] : json(), &c.notes, /*trusted=*/false);
  if (!settings.ok()) return settings.status().WithContext("the config's settings");
  c.settings = std::move(*settings);
  return c;
}

}  // namespace

StatusOr<Manifest> ParseManifest(std::string_view text, const RegistryLimits& limits) {
  ASSIGN_OR_RETURN(json m, ParseJson(text, "the manifest", kRegistryJson));
  auto read = ReadJsonSafely<Manifest>("the manifest",
                                       [&]() -> StatusOr<Manifest> { return ReadManifest(m, limits); });
  // A registry's words reach the terminal and the logs.
  if (!read.ok()) return Status(read.status().code(), Printable(read.status().message()));
  return read;
}

StatusOr<RemoteConfig> ParseRemoteConfig(std::string_view text) {
  ASSIGN_OR_RETURN(json config, ParseJson(text, "the config", kRegistryJson));
  auto read = ReadJsonSafely<RemoteConfig>(
      "the config", [&]() -> StatusOr<RemoteConfig> { return ReadRemoteConfig(config); });
  // A registry's words reach the terminal, the logs and the store's events.
  if (!read.ok()) return Status(read.status().code(), Printable(read.status().message()));
  return read;
}

std::string MakeConfig(const storage::ModelVersion& v, const std::string& author_metadata) {
  json metadata = ParseJsonOrDiscarded(author_metadata);
  json c = {{"name", v.model},
            {"version", v.version},
            {"package_model", v.package_model},
            {"kind", std::string(package::PackageKindName(v.kind))},
            {"settings", SettingsObject(v.settings)},
            {"metadata", metadata.is_object() ? metadata : json::object()}};
  return c.dump();
}

std::string MakeManifest(const std::string& config, const storage::ModelVersion& v,
                         const std::string& file_name) {
  json m = {
      {"schemaVersion", 2},
      {"mediaType", kOciManifestMediaType},
      {"artifactType", kArtifactType},
      {"config",
       {{"mediaType", kConfigMediaType},
        {"digest", "sha256:" + fs::Sha256Hex(config)},
        {"size", config.size()}}},
      {"layers", json::array({{{"mediaType", kPackageMediaType},
                               {"digest", "sha256:" + v.artifact},
                               {"size", v.size},
                               {"annotations", {{kTitle, file_name}}}}})},
      {"annotations", {{"dev.aotid.model", v.model}, {"dev.aotid.version", std::to_string(v.version)}}}};
  return m.dump();
}

StatusOr<SyncResult> Push(storage::ModelStore& store, const std::string& name, std::optional<int64_t> version,
                          const OciRef& ref, const PushOptions& options) {
  ASSIGN_OR_RETURN(storage::ModelInfo model, store.GetModel(name));
  const storage::ModelVersion* v = nullptr;
  for (const auto& mv : model.versions) {
    if (!version || mv.version == *version) v = &mv;
  }
  if (!v) return NotFound("model '" + name + "' has no version " + (version ? std::to_string(*version) : ""));
  std::string blob = store.BlobPath(v->artifact);
  if (!fs::Exists(blob))
    return NotFound("the blob of " + name + ":" + std::to_string(v->version) + " is missing");
  auto record = package::ReadPackageRecord(blob);
  std::string config = MakeConfig(*v, record.ok() ? record->author_metadata : "{}");
  std::string manifest = MakeManifest(config, *v, name + "-" + std::to_string(v->version) + ".pt2");

  OciRef target = ref;
  if (target.tag.empty()) target.tag = std::to_string(v->version);
  Registry registry(target, options.creds, options.limits);
  SyncResult r;
  r.ref = target.ToString();
  r.model = name;
  r.version = v->version;
  std::string layer = "sha256:" + v->artifact;
  ASSIGN_OR_RETURN(bool has_layer, registry.HasBlob(layer));
  if (!has_layer) {
    RETURN_IF_ERROR(registry.PushBlob(layer, blob, v->size, options.progress));
    r.bytes += v->size;
    r.added = true;
  }
  std::string config_digest = "sha256:" + fs::Sha256Hex(config);
  ASSIGN_OR_RETURN(bool has_config, registry.HasBlob(config_digest));
  if (!has_config) {
    RETURN_IF_ERROR(registry.PushBlobBytes(config_digest, config));
    r.bytes += static_cast<int64_t>(config.size());
  }
  ASSIGN_OR_RETURN(r.manifest, registry.PutManifest(target.tag, kOciManifestMediaType, manifest));
  return r;
}

StatusOr<std::vector<SyncResult>> PullDir(storage::ModelStore& store, const std::string& dir,
                                          const std::string& name, const MayAdd& may_add) {
  if (!fs::IsDirectory(dir)) return NotFound("'" + dir + "' is not a folder");
  struct Item {
    std::string file, name;
    json settings;
  };
  std::vector<Item> items;
  std::string index_path = dir + "/index.json";
  if (fs::Exists(index_path)) {
    ASSIGN_OR_RETURN(std::string text, fs::ReadFile(index_path));
    json index = ParseJsonOrDiscarded(text);
    if (!index.is_object() || !index.contains("models") || !index["models"].is_array())
      return InvalidArgument(index_path + ": expected {\"models\": [{\"file\": ..., \"name\": ...}]}");
    for (const auto& m : index["models"]) {
      if (!m.is_object() || !m.contains("file") || !m["file"].is_string())
        return InvalidArgument(index_path + ": every entry needs a \"file\"");
      std::string file = m["file"];
      // A name inside the folder, never a path out of it.
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        return InvalidArgument(index_path + ": \"" + file + "\" is not a file name in the folder");
      std::string model = m.contains("name") && m["name"].is_string() ? m["name"].get<std::string>()
                                                                      : file.substr(0, file.rfind(".pt2"));
      items.push_back({file, model, m.contains("settings") ? m["settings"] : json()});
    }
  } else {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      std::string file = e.path().filename().string();
      if (!file.ends_with(".pt2") || file.size() <= 4 || !e.is_regular_file(ec)) continue;
      items.push_back({file, file.substr(0, file.size() - 4), json()});
    }
    if (ec) return IOError("reading " + dir + ": " + ec.message());
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.file < b.file; });
  }
  if (!name.empty()) {
    if (items.size() != 1)
      return InvalidArgument("--name needs a folder of one package; " + dir + " has " +
                             std::to_string(items.size()));
    items[0].name = name;
  }
  // Two files for one model would replace each other at every sync.
  std::map<std::string, std::string> owner;
  for (const auto& item : items) {
    auto [it, fresh] = owner.emplace(item.name, item.file);
    if (!fresh) {
      return InvalidArgument(dir + ": " + it->second + " and " + item.file + " are both model '" +
                             Printable(item.name) +
                             "'; each sync would replace one with the other (name them apart in index.json)");
    }
  }
  std::vector<SyncResult> out;
  for (const auto& item : items) {
    SyncResult& r = out.emplace_back();
    r.ref = dir + "/" + item.file;
    r.model = item.name;
    r.error = [&]() -> Status {
      RETURN_IF_ERROR(storage::ValidateModelName(item.name).WithContext(r.ref));
      auto settings = ReadSettings(item.settings, &r.notes, /*trusted=*/true);
      if (!settings.ok()) return settings.status().WithContext(index_path);
      ASSIGN_OR_RETURN(std::string sha, fs::Sha256File(r.ref));
      r.manifest = "sha256:" + sha;
      auto model = store.GetModel(item.name);
      if (model.ok() && !model->versions.empty() && model->versions.back().artifact == sha) {
        r.version = model->versions.back().version;
        return Status::OK();
      }
      if (may_add) RETURN_IF_ERROR(may_add(item.name).WithContext(r.ref));
      storage::AddRequest req;
      req.file = r.ref;
      req.name = item.name;
      req.settings = *settings;
      auto added = store.Add(req);
      if (!added.ok()) return added.status().WithContext(r.ref);
      r.version = added->version;
      r.added = true;
      (void)store.AppendEvent(item.name, r.version, "synced", "from " + r.ref);
      return Status::OK();
    }();
  }
  return out;
}

StatusOr<SyncResult> Pull(storage::ModelStore& store, const OciRef& ref, const PullOptions& options) {
  if (ref.tag.empty()) return InvalidArgument(ref.ToString() + " names no tag to sync");
  RETURN_IF_ERROR(options.name.empty() ? Status::OK() : storage::ValidateModelName(options.name));
  Registry registry(ref, options.creds, options.limits, options.cancel);
  SyncResult r;
  r.ref = ref.ToString();
  ASSIGN_OR_RETURN(std::string manifest, registry.GetManifest(ref.tag));
  r.manifest = "sha256:" + fs::Sha256Hex(manifest);
  auto parsed = ParseManifest(manifest, options.limits);
  if (!parsed.ok()) return parsed.status().WithContext(ref.ToString());
  ASSIGN_OR_RETURN(std::string config_text,
                   registry.GetSmallBlob(parsed->config_digest, options.limits.max_config_bytes));
  if (static_cast<int64_t>(config_text.size()) != parsed->config_size) {
    return Corruption(ref.ToString() + ": the config is " + std::to_string(config_text.size()) +
                      " bytes, not the " + std::to_string(parsed->config_size) + " its manifest says");
  }
  auto config = ParseRemoteConfig(config_text);
  if (!config.ok()) return config.status().WithContext(ref.ToString());
  r.notes.insert(r.notes.end(), config->notes.begin(), config->notes.end());
  // The store's name is this side's to choose: --name, else the
  // repository's last part. The config's name is only a suggestion a
  // registry could use to replace another local model.
  std::string name = options.name;
  if (name.empty()) name = ref.repo.substr(ref.repo.rfind('/') + 1);
  RETURN_IF_ERROR(storage::ValidateModelName(name).WithContext(ref.ToString() + ": the model's name"));
  r.model = name;
  const std::string& package_model = config->package_model;
  const std::string sha = parsed->layer.digest.substr(7);  // validated: 64 hex digits

  // Up to date when the model's newest version is this artifact (a
  // followed tag: a tag moved back to an older package makes it the newest
  // again), or with `any_version`, when any version is (every tag of a
  // repository: its tags name several versions at once).
  auto model = store.GetModel(name);
  if (model.ok() && !model->versions.empty()) {
    for (auto it = model->versions.rbegin(); it != model->versions.rend(); ++it) {
      if (it->artifact == sha && (package_model.empty() || it->package_model == package_model)) {
        r.version = it->version;
        return r;
      }
      if (!options.any_version) break;
    }
  } else if (!model.ok() && model.status().code() != StatusCode::kNotFound) {
    return model.status();
  }

  if (options.may_add) RETURN_IF_ERROR(options.may_add(name).WithContext(ref.ToString()));

  // The bytes: the store's own blob when it has them, else downloaded.
  std::string file = store.BlobPath(sha);
  std::string partial;
  if (!fs::Exists(file)) {
    std::string dir = store.dir() + "/downloads";
    RETURN_IF_ERROR(fs::MakeDirs(dir, 0700));
    partial = dir + "/" + sha + ".partial";
    std::error_code ec;
    r.resumed_from = fs::Exists(partial) ? static_cast<int64_t>(std::filesystem::file_size(partial, ec)) : 0;
    if (ec || r.resumed_from >= parsed->layer.size) r.resumed_from = 0;
    ASSIGN_OR_RETURN(r.bytes,
                     registry.FetchBlob(parsed->layer.digest, parsed->layer.size, partial, options.progress));
    // What was there before: less than guessed when the registry ignored
    // the Range and sent the whole again.
    r.resumed_from = std::max<int64_t>(0, parsed->layer.size - r.bytes);
    file = partial;
  }
  storage::AddRequest req;
  req.file = file;
  req.name = name;
  req.package_model = package_model;
  req.settings = config->settings;
  req.move_file = !partial.empty();  // the download goes into the blob store, not copied
  auto added = store.Add(req);
  // A verified download stays for the next sync when the store refuses it
  // for a reason that may pass (locked, full; Add moves it back); one that
  // is no package goes.
  if (!added.ok() && !partial.empty() && added.status().code() == StatusCode::kInvalidArgument) {
    ::unlink(partial.c_str());
  }
  if (!added.ok()) return added.status().WithContext(ref.ToString());
  if (!partial.empty()) ::unlink(partial.c_str());
  r.version = added->version;
  r.added = true;
  (void)store.AppendEvent(name, r.version, "synced",
                          "from " + r.ref + " (" + r.manifest.substr(0, 19) + "), " +
                              std::to_string(r.bytes) + " bytes downloaded");
  return r;
}

}  // namespace aotid::sync
