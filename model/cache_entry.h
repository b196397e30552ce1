// A compiled model's files in the build cache (compile/build_cache.h), as
// a loader takes them: the build cache finds and checks entries, the torch
// plugin (runtime/torch_plugin.h) loads them.
#pragma once

#include <string>

#include "model/tensor.h"

namespace aotid::model {

struct CacheEntry {
  std::string dir;
  std::string so_path;  // dir + "/model.so"
  ModelSpec spec;
  std::string package_json;   // package.json as written by the build
  std::string generate_path;  // generate.json (a language model's generate spec), "" when the build has none
  std::string embed_path;     // embed.json (a sentence encoder's embed spec), "" when the build has none
};

}  // namespace aotid::model
