// Fills a store through the real add path, in one process, and reports how
// long each add took: copy while hashing, fsync of file and directory, the
// digest check, and the SQLite commit.
//
//   aotid_store_bench --store DIR --file F.pt2 --models N
//
// Each add is a new model ("m00000", "m00001", ...) sharing one artifact, so
// the blob is stored once and every later add takes the existing-blob path
// (which re-verifies the stored blob's digest).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "storage/model_store.h"

int main(int argc, char** argv) {
  std::string store_dir, file;
  int models = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--store")) store_dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--file")) file = argv[i + 1];
    else if (!std::strcmp(argv[i], "--models")) models = std::atoi(argv[i + 1]);
  }
  if (store_dir.empty() || file.empty() || models < 1) {
    std::fprintf(stderr, "usage: aotid_store_bench --store DIR --file F.pt2 --models N\n");
    return 2;
  }
  auto store = aotid::storage::ModelStore::Open(store_dir, true);
  if (!store.ok()) {
    std::fprintf(stderr, "aotid_store_bench: %s\n", store.status().message().c_str());
    return 1;
  }
  std::vector<double> ms;
  auto start_all = std::chrono::steady_clock::now();
  for (int i = 0; i < models; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "m%05d", i);
    aotid::storage::AddRequest req;
    req.file = file;
    req.name = name;
    auto t0 = std::chrono::steady_clock::now();
    auto added = (*store)->Add(req);
    auto t1 = std::chrono::steady_clock::now();
    if (!added.ok()) {
      std::fprintf(stderr, "aotid_store_bench: add %s: %s\n", name, added.status().message().c_str());
      return 1;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_all).count();
  std::sort(ms.begin(), ms.end());
  std::printf("added %d models in %.1f s: per add p50 %.2f ms, p99 %.2f ms\n", models, total, ms[ms.size() / 2],
              ms[static_cast<size_t>(0.99 * (ms.size() - 1))]);
  return 0;
}
