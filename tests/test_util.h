// Helpers shared by the tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

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

// Files written by tests/models/make_test_models.py (the test_models fixture).
inline std::string TestData(const std::string& name) { return std::string(AOTID_TESTDATA) + "/" + name; }

}  // namespace aotid::testing
