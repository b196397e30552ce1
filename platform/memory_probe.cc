#include "platform/memory_probe.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <vector>

#include "base/fs.h"

#if defined(__APPLE__)
#include <libproc.h>
#include <sys/resource.h>
#include <sys/sysctl.h>
#endif

#if defined(__linux__)
#include <fcntl.h>
#endif

namespace aotid::platform {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The lines of `text`, without their newlines.
std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

// Whitespace-separated words.
std::vector<std::string_view> Words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

// PSI's "12.34": digits, then a point and digits; 0 to 100. Parsed here
// rather than with from_chars (the floating-point overloads came late to
// libc++) or strtod (whose decimal point is the locale's).
std::optional<double> ParsePercent(std::string_view v) {
  double whole = 0, scale = 1;
  bool any = false, point = false;
  for (char c : v) {
    if (c == '.' && !point) {
      point = true;
      continue;
    }
    if (c < '0' || c > '9') return std::nullopt;
    any = true;
    if (point) {
      scale /= 10;
      whole += (c - '0') * scale;
    } else {
      whole = whole * 10 + (c - '0');
    }
    if (whole > 100) return std::nullopt;
  }
  if (!any) return std::nullopt;
  return whole;
}

uint64_t PhysicalMemoryBytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

#if defined(__linux__)

// The whole of a /proc file (they report size 0: read to the end), or the
// errno that stopped it (0 when read): fs::ReadFile's error cannot tell a
// process that is gone (ENOENT, ESRCH) from one that is not.
struct ProcRead {
  std::string text;
  int error = 0;
};
ProcRead ReadProcFile(const std::string& path) {
  ProcRead r;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r.error = errno;
    return r;
  }
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      r.error = errno;
      break;
    }
    if (n == 0) break;
    r.text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return r;
}

// A "Key:   123 kB" line's bytes, when `line` is that key's.
std::optional<uint64_t> KiBLine(std::string_view line, std::string_view key) {
  if (line.substr(0, key.size()) != key) return std::nullopt;
  std::vector<std::string_view> words = Words(line.substr(key.size()));
  if (words.size() != 2 || words[1] != "kB") return std::nullopt;
  uint64_t kib = 0;
  auto [p, ec] = std::from_chars(words[0].data(), words[0].data() + words[0].size(), kib);
  if (ec != std::errc() || p != words[0].data() + words[0].size()) return std::nullopt;
  return kib * 1024;
}

StatusOr<uint64_t> PssFromRollup(const std::string& path, std::string_view text) {
  std::optional<uint64_t> pss, swap_pss;
  for (std::string_view line : Lines(text)) {
    if (auto v = KiBLine(line, "Pss:")) pss = v;
    if (auto v = KiBLine(line, "SwapPss:")) swap_pss = v;
  }
  if (!pss) return Internal(path + " has no \"Pss: N kB\" line");
  // SwapPss came with 4.3, before smaps_rollup (4.14): absent only from a
  // kernel that changed its format, where no swap is the best reading.
  return *pss + swap_pss.value_or(0);
}

StatusOr<uint64_t> ResidentFromStatm(const std::string& path, std::string_view text) {
  std::vector<std::string_view> words = Words(Trim(text));
  uint64_t pages = 0;
  if (words.size() < 2)
    return Internal(path + " does not read \"size resident ...\": '" + std::string(text) + "'");
  auto [p, ec] = std::from_chars(words[1].data(), words[1].data() + words[1].size(), pages);
  if (ec != std::errc() || p != words[1].data() + words[1].size())
    return Internal(path + " has no resident page count: '" + std::string(text) + "'");
  return pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

#endif  // __linux__

}  // namespace

StatusOr<uint64_t> ProcessMemoryBytes(int pid) {
  if (pid <= 0) return InvalidArgument("no process " + std::to_string(pid));
#if defined(__linux__)
  const std::string dir = "/proc/" + std::to_string(pid);
  const std::string rollup = dir + "/smaps_rollup";
  ProcRead r = ReadProcFile(rollup);
  // A zombie has no memory left: its smaps_rollup fails with ESRCH (older
  // kernels read it empty). A reaped process has no folder.
  if (r.error == ESRCH || (r.error == 0 && Trim(r.text).empty()))
    return NotFound("process " + std::to_string(pid) + " has exited");
  if (r.error == 0) return PssFromRollup(rollup, r.text);
  if (r.error != ENOENT) return ErrnoError("read " + rollup, r.error);
  // No smaps_rollup: the process is gone, or the kernel is older than 4.14.
  const std::string statm = dir + "/statm";
  ProcRead s = ReadProcFile(statm);
  if (s.error == ENOENT || s.error == ESRCH) return NotFound("process " + std::to_string(pid) + " is gone");
  if (s.error != 0) return ErrnoError("read " + statm, s.error);
  return ResidentFromStatm(statm, s.text);
#elif defined(__APPLE__)
  rusage_info_v2 info{};
  if (::proc_pid_rusage(pid, RUSAGE_INFO_V2, reinterpret_cast<rusage_info_t*>(&info)) != 0) {
    int e = errno;
    if (e == ESRCH) return NotFound("process " + std::to_string(pid) + " is gone");
    return ErrnoError("proc_pid_rusage(" + std::to_string(pid) + ", RUSAGE_INFO_V2)", e);
  }
  return static_cast<uint64_t>(info.ri_phys_footprint);
#else
  return Unavailable("a process's memory cannot be measured on this system (Linux and macOS only)");
#endif
}

StatusOr<MemoryPressure> ParsePsi(std::string_view text) {
  MemoryPressure p;
  bool have_some = false, have_full = false;
  for (std::string_view line : Lines(text)) {
    if (Trim(line).empty()) continue;
    std::vector<std::string_view> words = Words(line);
    std::string_view kind = words[0];
    if (kind != "some" && kind != "full") {
      return InvalidArgument("PSI line starts with '" + std::string(kind) + "', not 'some' or 'full': '" +
                             std::string(line) + "'");
    }
    bool& have = kind == "some" ? have_some : have_full;
    if (have) return InvalidArgument("PSI has two '" + std::string(kind) + "' lines");
    std::optional<double> avg10;
    for (size_t i = 1; i < words.size(); ++i) {
      size_t eq = words[i].find('=');
      if (eq == std::string_view::npos || eq == 0) {
        return InvalidArgument("PSI '" + std::string(kind) + "' line has '" + std::string(words[i]) +
                               "' where key=value belongs");
      }
      if (words[i].substr(0, eq) != "avg10") continue;
      std::string_view v = words[i].substr(eq + 1);
      std::optional<double> d = ParsePercent(v);
      if (!d) {
        return InvalidArgument("PSI '" + std::string(kind) + "' avg10 is not a percentage: '" +
                               std::string(v) + "'");
      }
      avg10 = *d;
    }
    if (!avg10)
      return InvalidArgument("PSI '" + std::string(kind) + "' line has no avg10: '" + std::string(line) +
                             "'");
    have = true;
    (kind == "some" ? p.some_avg10 : p.full_avg10) = *avg10;
  }
  if (!have_some) return InvalidArgument("PSI has no 'some avg10=...' line");
  p.known = true;
  if (p.full_avg10 >= kPsiCriticalPercent)
    p.level = PressureLevel::kCritical;
  else if (p.some_avg10 >= kPsiWarnPercent)
    p.level = PressureLevel::kWarning;
  return p;
}

std::optional<uint64_t> ParseOomKills(std::string_view vmstat) {
  size_t at = 0;
  while (at < vmstat.size()) {
    size_t end = vmstat.find('\n', at);
    if (end == std::string_view::npos) end = vmstat.size();
    std::string_view line = vmstat.substr(at, end - at);
    at = end + 1;
    constexpr std::string_view kKey = "oom_kill ";
    if (line.substr(0, kKey.size()) != kKey) continue;
    std::string_view digits = line.substr(kKey.size());
    if (digits.empty()) return std::nullopt;
    uint64_t n = 0;
    for (char c : digits) {
      if (c < '0' || c > '9' || n > (UINT64_MAX - 9) / 10) return std::nullopt;
      n = n * 10 + static_cast<uint64_t>(c - '0');
    }
    return n;
  }
  return std::nullopt;
}

std::optional<uint64_t> ReadOomKillCount() {
#if defined(__linux__)
  ProcRead r = ReadProcFile("/proc/vmstat");
  if (r.error != 0) return std::nullopt;
  return ParseOomKills(r.text);
#else
  return std::nullopt;
#endif
}

MemoryPressure ReadMemoryPressure() {
  MemoryPressure p;
#if defined(__linux__)
  const std::string path = "/proc/pressure/memory";
  ProcRead r = ReadProcFile(path);
  if (r.error == ENOENT) {
    p.source = path + " is missing (a kernel before 4.20, or built without PSI)";
    return p;
  }
  if (r.error == EOPNOTSUPP) {
    p.source = path + " is off (the kernel was booted with psi=0)";
    return p;
  }
  if (r.error != 0) {
    p.source = ErrnoError("read " + path, r.error).message();
    return p;
  }
  StatusOr<MemoryPressure> parsed = ParsePsi(r.text);
  if (!parsed.ok()) {
    p.source = path + ": " + parsed.status().message();
    return p;
  }
  p = *parsed;
  p.source = path;
  return p;
#elif defined(__APPLE__)
  const char* name = "kern.memorystatus_vm_pressure_level";
  int level = 0;
  size_t size = sizeof level;
  if (::sysctlbyname(name, &level, &size, nullptr, 0) != 0) {
    p.source = ErrnoError(std::string("sysctl ") + name, errno).message();
    return p;
  }
  // The kernel's DISPATCH_MEMORYPRESSURE_* values.
  switch (level) {
    case 1: p.level = PressureLevel::kNormal; break;
    case 2: p.level = PressureLevel::kWarning; break;
    case 4: p.level = PressureLevel::kCritical; break;
    default: p.source = std::string(name) + " is " + std::to_string(level) + ", not 1, 2 or 4"; return p;
  }
  p.known = true;
  p.source = name;
  return p;
#else
  p.source = "memory pressure is not read on this system (Linux and macOS only)";
  return p;
#endif
}

std::optional<uint64_t> ParseCgroupLimit(std::string_view text) {
  text = Trim(text);
  if (text.empty() || text == "max") return std::nullopt;
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
  // cgroup v1 says "no limit" with the largest page count in bytes
  // (9223372036854771712 with 4 KiB pages, less with larger ones): anything
  // from 2^62 up is no machine's memory.
  if (v >= (uint64_t{1} << 62)) return std::nullopt;
  return v;
}

UsableMemory ReadUsableMemory() {
  UsableMemory out;
  out.bytes = PhysicalMemoryBytes();
  out.source = "physical memory";
#if defined(__linux__)
  StatusOr<std::string> cgroups = fs::ReadFile("/proc/self/cgroup");
  if (!cgroups.ok()) return out;
  // Each line "ID:CONTROLLERS:PATH"; v2's is "0::PATH".
  for (std::string_view line : Lines(*cgroups)) {
    size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view id = line.substr(0, c1);
    std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path(line.substr(c2 + 1));
    std::string mount, file;
    if (id == "0" && controllers.empty()) {
      mount = "/sys/fs/cgroup";
      file = "memory.max";
    } else {
      bool memory = false;
      std::string_view rest = controllers;
      while (!rest.empty()) {
        size_t comma = rest.find(',');
        if (rest.substr(0, comma) == "memory") memory = true;
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
      if (!memory) continue;
      mount = "/sys/fs/cgroup/memory";
      file = "memory.limit_in_bytes";
    }
    if (path.empty() || path[0] != '/' || path.find("/..") != std::string::npos) continue;
    // The cgroup and each ancestor, up to the mount's root.
    for (;;) {
      while (path.size() > 1 && path.back() == '/') path.pop_back();
      std::string candidate = mount + (path == "/" ? "" : path) + "/" + file;
      if (StatusOr<std::string> text = fs::ReadFile(candidate); text.ok()) {
        std::optional<uint64_t> limit = ParseCgroupLimit(*text);
        if (limit && *limit > 0 && *limit < out.bytes) {
          out.bytes = *limit;
          out.source = "cgroup limit (" + candidate + ")";
        }
      }
      if (path == "/") break;
      path.erase(path.rfind('/') == 0 ? 1 : path.rfind('/'));
    }
  }
#endif
  return out;
}

}  // namespace aotid::platform
