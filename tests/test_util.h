// Helpers shared by the tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "base/fs.h"
#include "base/status.h"

#define ASSERT_OK(expr)                                  \
  do {                                                   \
    const ::aotid::Status _s = (expr);                   \
    ASSERT_TRUE(_s.ok()) << _s.ToString();               \
  } while (0)
#define EXPECT_OK(expr)                                  \
  do {                                                   \
    const ::aotid::Status _s = (expr);                   \
    EXPECT_TRUE(_s.ok()) << _s.ToString();               \
  } while (0)

namespace aotid::testing {

// A fresh directory under the system temp dir, removed when destroyed.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "aotid-test-XXXXXX").string();
    path_ = ::mkdtemp(templ.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// Every file under `dir` (path relative to it) with the sha256 of its
// contents: "unchanged" means equal snapshots. SQLite's -shm file is a
// shared-memory index that readers touch, not stored data, so it is left out.
inline std::map<std::string, std::string> DirSnapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    std::string p = e.path().string();
    if (e.is_regular_file() && !p.ends_with("-shm")) out[p.substr(dir.size())] = fs::Sha256File(p).value_or("?");
  }
  return out;
}

// Files written by tests/models/make_test_models.py (the test_models fixture).
inline std::string TestData(const std::string& name) { return std::string(AOTID_TESTDATA) + "/" + name; }

}  // namespace aotid::testing
