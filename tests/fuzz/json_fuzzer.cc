// libFuzzer target for the JSON aotid reads from outside: the bounded
// reader (base/json.h) and what sync makes of a registry's manifest and
// config (sync/model_sync.h). Built and run as the other targets
// (tests/fuzz/).
//
// Checks besides the sanitizers: a document the reader accepts is within
// its depth by the depth scan too, dumps without throwing and reads back
// to the same value; a manifest accepted names digests of the one valid
// form and sizes within the limits; a config accepted carries no inductor
// options (a registry may not set them).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/json.h"
#include "sync/model_sync.h"
#include "sync/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  constexpr aotid::JsonLimits kLimits{.max_depth = 8, .max_bytes = 4096};
  auto j = aotid::ParseJson(in, "the input", kLimits);
  if (j.ok()) {
    if (!aotid::CheckJsonDepth(in, kLimits.max_depth).ok()) __builtin_trap();
    // Compared as text: a number too large for a double reads as inf and
    // dumps as null, which reads back as null.
    std::string text = j->dump();
    auto back = aotid::ParseJson(text, "its dump", {.max_depth = kLimits.max_depth, .max_bytes = 1 << 20});
    if (!back.ok() || back->dump() != text) __builtin_trap();
  } else if (j.status().message().empty()) {
    __builtin_trap();
  }
  if (aotid::ParseJsonOrDiscarded(in, kLimits).is_discarded() == j.ok()) __builtin_trap();

  aotid::sync::RegistryLimits limits;
  limits.max_config_bytes = 1 << 16;
  limits.max_layer_bytes = 1 << 30;
  auto manifest = aotid::sync::ParseManifest(in, limits);
  if (manifest.ok()) {
    if (!aotid::sync::IsValidDigest(manifest->config_digest) ||
        !aotid::sync::IsValidDigest(manifest->layer.digest))
      __builtin_trap();
    if (manifest->config_size < 0 || manifest->config_size > limits.max_config_bytes) __builtin_trap();
    if (manifest->layer.size < 0 || manifest->layer.size > limits.max_layer_bytes) __builtin_trap();
  }
  auto config = aotid::sync::ParseRemoteConfig(in);
  if (config.ok() && !config->settings.inductor_options.empty()) __builtin_trap();
  return 0;
}
