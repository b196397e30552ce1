#include "platform/device_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "base/child_env.h"
#include "base/fd.h"
#include "base/fs.h"
#include "base/json.h"

namespace aotid::platform {
namespace {

using nlohmann::json;

constexpr char kMarker[] = "aotid-devices: ";
// What is kept of the probe's output: its answer is one short line, and
// torch's warnings before it are of no interest past the last few.
constexpr size_t kMaxOutput = size_t{64} << 10;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Seconds(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms) / 1000.0);
  return text;
}

// The last `n` non-empty lines of `text`, joined by "; ", for a reason.
std::string LastLines(const std::string& text, size_t n) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    // What a Python printed reaches the log and doctor's terminal: no
    // control sequences, and ASCII alone.
    line = line.substr(0, 300);
    for (char& c : line) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    }
    lines.push_back(line);
  }
  std::string out;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) {
    out += (out.empty() ? "" : "; ") + lines[i];
  }
  return out;
}

StatusOr<DeviceState> ReadState(const json& j, const char* device) {
  if (!j.contains(device) || !j[device].is_object()) {
    return InvalidArgument(std::string("it says nothing of ") + device);
  }
  const json& d = j[device];
  DeviceState s;
  if (!d.contains("usable") || !d["usable"].is_boolean()) {
    return InvalidArgument(std::string("its '") + device + "' has no 'usable' true or false");
  }
  s.usable = d["usable"].get<bool>();
  s.reason = d.value("reason", "");
  s.name = d.value("name", "");
  s.capability = d.value("capability", "");
  s.count = d.value("count", 0);
  s.note = d.value("note", "");
  if (!s.usable && s.reason.empty()) {
    return InvalidArgument(std::string("its '") + device + "' is not usable and gives no reason");
  }
  return s;
}

json StateToJson(const DeviceState& s) {
  json j = {{"usable", s.usable}};
  if (!s.reason.empty()) j["reason"] = s.reason;
  if (!s.name.empty()) j["name"] = s.name;
  if (!s.capability.empty()) j["capability"] = s.capability;
  if (s.count > 0) j["count"] = s.count;
  if (!s.note.empty()) j["note"] = s.note;
  return j;
}

json AnswerToJson(const DeviceAnswer& a) {
  return {{"torch", a.torch_version}, {"mps", StateToJson(a.mps)}, {"cuda", StateToJson(a.cuda)}};
}

StatusOr<DeviceAnswer> AnswerFromJson(const json& j) {
  return ReadJsonSafely<DeviceAnswer>("the device answer", [&]() -> StatusOr<DeviceAnswer> {
    if (!j.is_object()) return InvalidArgument("it is not a JSON object");
    DeviceAnswer a;
    a.torch_version = j.value("torch", "");
    ASSIGN_OR_RETURN(a.mps, ReadState(j, "mps"));
    ASSIGN_OR_RETURN(a.cuda, ReadState(j, "cuda"));
    return a;
  });
}

// "mps: Apple M2 (macOS 14.5)", "cuda: not available: <why>".
std::string Describe(const char* device, const DeviceState& s) {
  std::string line = std::string(device) + ": ";
  if (!s.usable) return line + "not available: " + s.reason;
  line += s.name.empty() ? std::string("usable") : s.name;
  std::string more;
  if (!s.capability.empty()) more += "compute capability " + s.capability;
  if (s.count > 1)
    more += (more.empty() ? "" : ", ") + std::to_string(s.count) + " devices (builds use the first)";
  if (!s.note.empty()) more += (more.empty() ? "" : ", ") + s.note;
  return more.empty() ? line : line + " (" + more + ")";
}

// AOTID_CPU_ONLY=<reason>: the accelerators found are not to be used, for
// the reason given (a CI machine whose GPU is there but cannot allocate):
// `auto` means the CPU, an explicit mps or cuda is refused with the reason,
// and doctor shows it.
void KeepToTheCpuIfAsked(HardwareInfo* hw) {
  const char* why = std::getenv("AOTID_CPU_ONLY");
  if (why == nullptr || *why == '\0') return;
  std::string reason = std::string("AOTID_CPU_ONLY is set: ") + why;
  for (std::string* missing : {&hw->mps_missing, &hw->cuda_missing}) {
    if (missing->empty()) *missing = reason;
  }
  hw->accelerators.push_back("cpu only: " + reason);
}

void ApplyNoAnswer(const std::string& why, HardwareInfo* hw) {
  hw->accelerators.clear();
  hw->mps_missing = hw->cuda_missing = "the device probe gave no answer (" + why + "); the CPU only";
  hw->accelerators.push_back("mps: not available: " + hw->mps_missing);
  hw->accelerators.push_back("cuda: not available: " + hw->cuda_missing);
  KeepToTheCpuIfAsked(hw);
}

// Reads what `pid` writes on `fd` until it exits and the pipe ends, or
// `deadline_ms` (steady clock) passes; then kills its process group.
// Returns the output (its last kMaxOutput bytes); sets *status to its wait
// status, *timed_out when it was killed for time.
std::string Collect(pid_t pid, int fd, int64_t deadline_ms, int* status, bool* timed_out) {
  std::string out;
  bool open = true;
  bool exited = false;
  *timed_out = false;
  while (!exited || open) {
    int64_t left = deadline_ms - SteadyMs();
    if (left <= 0) {
      *timed_out = !exited;
      break;
    }
    if (open) {
      struct pollfd p = {fd, POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 50)));
      if (n > 0) {
        char buf[8192];
        ssize_t got = ::read(fd, buf, sizeof buf);
        if (got > 0) {
          out.append(buf, static_cast<size_t>(got));
          if (out.size() > 2 * kMaxOutput) out.erase(0, out.size() - kMaxOutput);
        } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
          open = false;
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!exited) {
      pid_t r = ::waitpid(pid, status, WNOHANG);
      exited = r == pid || (r < 0 && errno == ECHILD);
    }
    // The probe is done once it exited and the pipe drained: what it left
    // running (none expected) may hold the pipe open, and is killed below.
    if (exited && open) {
      struct pollfd p = {fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
    }
  }
  // Killed only while the group is certainly this probe's: the leader not
  // yet reaped, or something of it still holding the pipe.
  if (!exited || open) ::kill(-pid, SIGKILL);
  if (!exited) ::waitpid(pid, status, 0);
  if (out.size() > kMaxOutput) out.erase(0, out.size() - kMaxOutput);
  return out;
}

std::string FirstLineOf(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

StatusOr<DeviceAnswer> ParseDeviceProbeOutput(const std::string& output) {
  size_t at = std::string::npos;
  for (size_t pos = 0; (pos = output.find(kMarker, pos)) != std::string::npos; pos += 1) {
    if (pos == 0 || output[pos - 1] == '\n') at = pos;
  }
  if (at == std::string::npos) {
    std::string tail = LastLines(output, 3);
    return InvalidArgument("the device probe printed no answer" + (tail.empty() ? "" : ": " + tail));
  }
  size_t start = at + sizeof kMarker - 1;
  size_t end = output.find('\n', start);
  std::string_view line =
      std::string_view(output).substr(start, end == std::string::npos ? end : end - start);
  auto parsed = ParseJson(line, "the device probe's answer", JsonLimits{8, 1 << 16});
  if (!parsed.ok()) return parsed.status();
  auto answer = AnswerFromJson(*parsed);
  if (!answer.ok())
    return InvalidArgument("the device probe's answer is unreadable: " + answer.status().message());
  return answer;
}

std::string DeviceAnswerToJson(const DeviceAnswer& answer) { return AnswerToJson(answer).dump(); }

StatusOr<DeviceAnswer> DeviceAnswerFromJson(const std::string& text) {
  ASSIGN_OR_RETURN(json j, ParseJson(text, "the device answer", JsonLimits{8, 1 << 16}));
  return AnswerFromJson(j);
}

DeviceProbeOptions DeviceProbeForCache(const std::string& cache_dir, const std::string& python,
                                       const std::string& worker_dir) {
  DeviceProbeOptions o;
  o.python = python;
  o.worker_dir = worker_dir;
  o.cache_file = cache_dir + "/devices.json";
  return o;
}

StatusOr<std::string> RunWorkerProbe(const DeviceProbeOptions& options) {
  std::vector<std::string> args = {options.python, "-m", "aotid_worker.probe"};
  std::vector<std::string> env =
      ChildEnvironment({"PYTHONPATH=" + options.worker_dir, "PYTHONDONTWRITEBYTECODE=1"});
  std::vector<char*> argv = NullTerminated(args), envp = NullTerminated(env);

  int fds[2];
  RETURN_IF_ERROR(fd::Pipe(fds));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so that a timeout kills what it started too.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Unavailable("cannot start " + options.python + ": " + std::strerror(rc));
  }
  int status = 0;
  bool timed_out = false;
  std::string out = Collect(pid, fds[0], SteadyMs() + options.timeout_ms, &status, &timed_out);
  ::close(fds[0]);
  if (timed_out) {
    return Unavailable(options.python + " -m aotid_worker.probe did not answer within " +
                       Seconds(options.timeout_ms) + " and was stopped");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string how = WIFEXITED(status)     ? "exited with status " + std::to_string(WEXITSTATUS(status))
                      : WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                            : "ended";
    std::string tail = LastLines(out, 2);
    return Unavailable(options.python + " -m aotid_worker.probe " + how + (tail.empty() ? "" : ": " + tail));
  }
  return out;
}

std::string DeviceProbeKey(const HardwareInfo& hw, const std::string& python) {
  std::string release;
  struct utsname u;
  if (::uname(&u) == 0) release = u.release;
  std::string driver = FirstLineOf("/proc/driver/nvidia/version");
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return Fingerprint(hw) + "|python=" + python + "|release=" + release + "|nvidia=" + driver +
         "|CUDA_VISIBLE_DEVICES=" + (visible == nullptr ? std::string("(unset)") : visible);
}

StatusOr<DeviceAnswer> ReadKeptDevices(const std::string& cache_file, const std::string& key) {
  // A plain file of at most 64 KiB, read without following a link: a FIFO
  // would hold the start for ever, and a link to /dev/zero fill memory.
  struct stat st {};
  if (::lstat(cache_file.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound("no device answer kept in " + cache_file);
    return Corruption(cache_file + " cannot be read: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return Corruption(cache_file + " is not a regular file");
  if (st.st_size > (1 << 16)) {
    return Corruption(cache_file + " is " + std::to_string(st.st_size) + " bytes, over the limit of 65536");
  }
  auto text = fs::ReadFile(cache_file);
  if (!text.ok()) {
    if (!fs::Exists(cache_file)) return NotFound("no device answer kept in " + cache_file);
    return Corruption(cache_file + " cannot be read: " + text.status().message());
  }
  auto parsed = ParseJson(*text, cache_file, JsonLimits{8, 1 << 16});
  if (!parsed.ok()) return Corruption(parsed.status().message());
  const json& j = *parsed;
  if (!j.is_object() || !j.contains("key") || !j["key"].is_string() || !j.contains("answer")) {
    return Corruption(cache_file + " has no key and answer");
  }
  if (j["key"].get<std::string>() != key) {
    return FailedPrecondition(cache_file + " was kept for another machine, torch or Python (" +
                              j["key"].get<std::string>().substr(0, 300) + ")");
  }
  auto answer = AnswerFromJson(j["answer"]);
  if (!answer.ok()) return Corruption(cache_file + ": " + answer.status().message());
  return answer;
}

void ApplyDeviceAnswer(const DeviceAnswer& answer, HardwareInfo* hw) {
  hw->accelerators.clear();
  hw->mps_missing = answer.mps.usable ? "" : answer.mps.reason;
  hw->cuda_missing = answer.cuda.usable ? "" : answer.cuda.reason;
  hw->accelerators.push_back(Describe("mps", answer.mps));
  hw->accelerators.push_back(Describe("cuda", answer.cuda));
  KeepToTheCpuIfAsked(hw);
}

DeviceProbeReport ProbeDevices(const DeviceProbeOptions& options, HardwareInfo* hw) {
  DeviceProbeReport report;
  const std::string key = DeviceProbeKey(*hw, options.python);
  std::string kept_note;
  if (!options.cache_file.empty()) {
    auto kept = ReadKeptDevices(options.cache_file, key);
    if (kept.ok()) {
      // Kept answers are checked against what this machine is: a file
      // that says MPS works off a Mac, or CUDA with a CPU build of torch,
      // is not believed (each would send builds to a device that is not there).
      if (kept->mps.usable && hw->os != "darwin") {
        kept = Corruption(options.cache_file + " says MPS is usable on a machine that is not a Mac");
      } else if (kept->cuda.usable && kept->torch_version.find("+cpu") != std::string::npos) {
        kept = Corruption(options.cache_file + " says CUDA is usable with a CPU build of torch (" +
                          kept->torch_version + ")");
      }
    }
    if (kept.ok() && !options.refresh) {
      report.from_cache = true;
      report.note = "kept in " + options.cache_file;
      ApplyDeviceAnswer(*kept, hw);
      return report;
    }
    if (!kept.ok() && kept.status().code() == StatusCode::kCorruption) {
      kept_note = "; the kept answer was refused: " + kept.status().message();
    } else if (!kept.ok() && kept.status().code() == StatusCode::kFailedPrecondition) {
      kept_note = "; the kept answer was for another machine, torch or Python";
    }
  }
  report.ran = true;
  int64_t started = SteadyMs();
  StatusOr<std::string> output = options.run ? options.run(options) : RunWorkerProbe(options);
  report.probe_ms = SteadyMs() - started;
  StatusOr<DeviceAnswer> answer = output.ok() ? ParseDeviceProbeOutput(*output) : output.status();
  if (!answer.ok()) {
    report.status = answer.status();
    report.note = "the device probe failed after " + Seconds(report.probe_ms) + ": " +
                  answer.status().message() + kept_note;
    ApplyNoAnswer(answer.status().message(), hw);
    return report;
  }
  report.note = "probed by " + options.python + " in " + Seconds(report.probe_ms);
  if (!options.cache_file.empty()) {
    std::string dir = options.cache_file.substr(0, options.cache_file.rfind('/'));
    if (fs::IsDirectory(dir)) {
      json kept = {{"key", key}, {"answer", AnswerToJson(*answer)}, {"probe_ms", report.probe_ms}};
      Status s = fs::WriteFileAtomic(options.cache_file, kept.dump(2) + "\n");
      report.note += s.ok() ? ", kept in " + options.cache_file : " (not kept: " + s.message() + ")";
    }
  }
  report.note += kept_note;
  ApplyDeviceAnswer(*answer, hw);
  return report;
}

}  // namespace aotid::platform
