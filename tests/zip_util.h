// Writes small zip archives for tests that need a package of their own
// making (a damaged or hostile one). Needs libzip (the package library's).
#pragma once

#include <gtest/gtest.h>
#include <zip.h>

#include <map>
#include <string>

namespace aotid::testing {

// Writes a zip archive at `path` holding `entries` (name -> bytes); a
// failure fails the calling test (check with ASSERT_NO_FATAL_FAILURE).
inline void WriteZip(const std::string& path, const std::map<std::string, std::string>& entries) {
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  ASSERT_NE(z, nullptr) << "libzip error " << err;
  for (const auto& [name, bytes] : entries) {
    zip_source_t* src = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
    ASSERT_NE(src, nullptr);
    ASSERT_GE(zip_file_add(z, name.c_str(), src, ZIP_FL_ENC_UTF_8), 0) << zip_strerror(z);
  }
  ASSERT_EQ(zip_close(z), 0);
}

}  // namespace aotid::testing
