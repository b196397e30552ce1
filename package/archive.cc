#include "package/archive.h"

#include <fcntl.h>
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <cerrno>

namespace aotid::package {
namespace {

struct FileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};
using ZipFile = std::unique_ptr<zip_file_t, FileCloser>;

}  // namespace

void Archive::Closer::operator()(struct ::zip* z) const { zip_discard(z); }

StatusOr<Archive> Archive::Open(const std::string& path) {
  int err = 0;
  std::unique_ptr<struct ::zip, Closer> z(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err));
  if (!z) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    std::string why = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    if (err == ZIP_ER_NOENT || err == ZIP_ER_OPEN) return NotFound("cannot open " + path + ": " + why);
    return InvalidArgument(path + " is not a .pt2 package (not a readable zip archive: " + why + ")");
  }
  std::vector<std::string> names;
  zip_int64_t n = zip_get_num_entries(z.get(), 0);
  names.reserve(n > 0 ? static_cast<size_t>(n) : 0);
  uint64_t total = 0, packed = 0;
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* raw = zip_get_name(z.get(), static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
    if (raw != nullptr) names.emplace_back(raw);
    zip_stat_t st;
    if (zip_stat_index(z.get(), static_cast<zip_uint64_t>(i), 0, &st) != 0) continue;
    if ((st.valid & ZIP_STAT_SIZE) == 0 || (st.valid & ZIP_STAT_COMP_SIZE) == 0) continue;
    // A zip bomb: an entry that expands far past what it takes in the file.
    if (st.size > kBombMinBytes && st.size / std::max<uint64_t>(st.comp_size, 1) > kMaxExpansion) {
      return InvalidArgument(path + " is refused: its entry " + (raw ? raw : "?") + " expands from " +
                             std::to_string(st.comp_size) + " to " + std::to_string(st.size) +
                             " bytes (more than " + std::to_string(kMaxExpansion) + " times; a zip bomb?)");
    }
    total += st.size;
    packed += st.comp_size;
  }
  if (total > kBombMinBytes && total / std::max<uint64_t>(packed, 1) > kMaxExpansion) {
    return InvalidArgument(path + " is refused: its entries expand from " + std::to_string(packed) + " to " +
                           std::to_string(total) + " bytes (more than " + std::to_string(kMaxExpansion) +
                           " times; a zip bomb?)");
  }
  return Archive(path, std::move(z), std::move(names));
}

StatusOr<std::string> Archive::Read(const std::string& name, size_t limit) const {
  zip_stat_t st;
  if (zip_stat(zip_.get(), name.c_str(), 0, &st) != 0) return NotFound("no " + name + " in the package");
  if (st.size > limit)
    return InvalidArgument(name + " is too large (" + std::to_string(st.size) + " bytes, the limit is " +
                           std::to_string(limit) + ")");
  ZipFile f(zip_fopen(zip_.get(), name.c_str(), 0));
  if (!f) return InvalidArgument("cannot read " + name + " from the package");
  std::string out(st.size, '\0');
  zip_int64_t n = zip_fread(f.get(), out.data(), out.size());
  if (n < 0 || static_cast<zip_uint64_t>(n) != st.size) return InvalidArgument("truncated entry " + name);
  return out;
}

Status Archive::Extract(const std::string& name, const std::string& dest) const {
  zip_stat_t st;
  if (zip_stat(zip_.get(), name.c_str(), 0, &st) != 0) return NotFound("no " + name + " in the package");
  ZipFile f(zip_fopen(zip_.get(), name.c_str(), 0));
  if (!f) return InvalidArgument("cannot read " + name + " from the package");
  int fd = ::open(dest.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create " + dest, errno);
  std::vector<char> buf(1 << 20);
  uint64_t written = 0;
  Status s = Status::OK();
  for (;;) {
    zip_int64_t n = zip_fread(f.get(), buf.data(), buf.size());
    if (n < 0) {
      s = InvalidArgument("cannot read " + name + " from the package (damaged archive?)");
      break;
    }
    if (n == 0) break;
    written += static_cast<uint64_t>(n);
    if ((st.valid & ZIP_STAT_SIZE) && written > st.size) {  // more than its header said
      s = InvalidArgument(name + " in the package holds more than the " + std::to_string(st.size) +
                          " bytes its header declares");
      break;
    }
    for (zip_int64_t done = 0; done < n && s.ok();) {
      ssize_t w = ::write(fd, buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        s = ErrnoError("write " + dest, errno);
      else
        done += w;
    }
    if (!s.ok()) break;
  }
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError("fsync " + dest, errno);
  ::close(fd);
  return s;
}

std::string_view AfterRoot(std::string_view name) {
  auto slash = name.find('/');
  return slash == std::string_view::npos ? std::string_view() : name.substr(slash + 1);
}

}  // namespace aotid::package
