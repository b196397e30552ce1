// The floor under a cached start: a process that loads libtorch (the torch
// plugin aotid's runners load, with libtorch behind it). It prints the
// wall clock (ns since the epoch) once loaded, and bench/start.sh takes its
// exec time from it: exec to loaded, without libtorch's teardown at exit.
#include <chrono>
#include <cstdio>

#include "runtime/torch_plugin.h"

int main() {
  auto loaded = aotid::runtime::LoadTorchPlugin();
  if (!loaded.ok()) {
    std::fprintf(stderr, "aotid_dlopen_floor: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  auto now = std::chrono::system_clock::now().time_since_epoch();
  std::printf("%lld\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
  std::fflush(stdout);
  return 0;
}
