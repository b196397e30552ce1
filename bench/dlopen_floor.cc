// The floor under a cached start: a process that loads libtorch (the torch
// plugin aotid's runners load, with libtorch behind it) and exits. bench/
// start.sh times it from exec to exit, next to aotid's exec to ready.
#include <cstdio>

#include "runtime/torch_plugin.h"

int main() {
  auto loaded = aotid::runtime::LoadTorchPlugin();
  if (!loaded.ok()) {
    std::fprintf(stderr, "aotid_dlopen_floor: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  return 0;
}
