// A .pt2 file read as what it is, a zip archive: its entry names, an entry's
// bytes, an entry copied out to a file. Every entry of a .pt2 sits under one
// root folder (`<root>/...`) whose name depends on the exporter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

struct zip;  // libzip's zip_t

namespace aotid::package {

class Archive {
 public:
  // Zip bombs: an archive, or one entry, larger than kBombMinBytes once
  // expanded may expand at most kMaxExpansion times its compressed size.
  // torch stores weights uncompressed and code compresses 5-10 times; a
  // zero-filled entry compresses about 1000 times.
  static constexpr uint64_t kBombMinBytes = uint64_t{16} << 20;
  static constexpr uint64_t kMaxExpansion = 100;

  // Opens `path` for reading and checks the archive's consistency. NotFound
  // when the file cannot be opened; InvalidArgument, naming the file and
  // libzip's reason, when it is not a readable zip archive, or naming the
  // entry when it would expand past the limits above (before anything is
  // extracted).
  static StatusOr<Archive> Open(const std::string& path);

  Archive(Archive&&) noexcept = default;
  Archive& operator=(Archive&&) noexcept = default;
  ~Archive() = default;

  const std::string& path() const { return path_; }
  // Every entry name, as stored, in the archive's order.
  const std::vector<std::string>& names() const { return names_; }

  // The bytes of entry `name`. NotFound when there is no such entry;
  // InvalidArgument when it is larger than `limit` or cannot be read whole.
  StatusOr<std::string> Read(const std::string& name, size_t limit = size_t{64} << 20) const;
  // Writes entry `name` to the file `dest` (created or truncated), fsynced.
  // InvalidArgument when the entry cannot be read, IOError when `dest`
  // cannot be written.
  Status Extract(const std::string& name, const std::string& dest) const;

 private:
  struct Closer {
    void operator()(struct ::zip* z) const;
  };
  Archive(std::string path, std::unique_ptr<struct ::zip, Closer> zip, std::vector<std::string> names)
      : path_(std::move(path)), zip_(std::move(zip)), names_(std::move(names)) {}

  std::string path_;
  std::unique_ptr<struct ::zip, Closer> zip_;
  std::vector<std::string> names_;
};

// The part of an entry name after its root folder ("mlp/models/model.json"
// gives "models/model.json"); empty when the name has no root folder.
std::string_view AfterRoot(std::string_view name);

}  // namespace aotid::package
