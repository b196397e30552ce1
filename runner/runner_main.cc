#include "runner/runner_main.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <thread>

#include "base/fs.h"
#include "base/memory.h"
#include "model/loaded_model.h"
#include "runner/channel.h"
#include "runner/sandbox.h"
#include "runtime/thread_choice.h"
#include "runtime/torch_plugin.h"

namespace aotid::runner {
namespace {

// How long a slot's thread spins for the next request before it sleeps, so
// that a client that sends its next request at once finds the runner
// awake. Only where cores are plenty: on two cores the daemon's thread that
// would wake it often waits for the very core the spin holds, and a
// hand-off after idle measured 159 µs with a 100 µs spin against 6 µs
// without one (docs/BENCHMARKS.md).
int64_t RunnerSpinNs() {
  static const int64_t ns = std::thread::hardware_concurrency() >= 4 ? 30'000 : 0;
  return ns;
}

void Reply(const std::string& line) {
  std::string text = line + "\n";
  (void)!::write(kReadyFd, text.data(), text.size());
  ::close(kReadyFd);
}

int FailStart(const Status& s) {
  std::string msg = s.message();
  for (char& c : msg) {
    if (c == '\n') c = ' ';
  }
  std::cerr << "aotid runner: " << s.message() << std::endl;
  Reply("error " + std::to_string(static_cast<int>(s.code())) + " " + msg);
  return 1;
}

// An error's text as a client may see it: torch appends where it was raised
// and a backtrace (library addresses, build paths) to some of its messages.
std::string WithoutBacktrace(std::string text) {
  for (const char* marker : {"\nException raised from", "Exception raised from ", "\nframe #"}) {
    if (size_t at = text.find(marker); at != std::string::npos) text.erase(at);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// Runs the request in `slot`; the response's payload bytes, or why not.
StatusOr<uint64_t> Handle(model::LoadedModel& model, const Slot& slot, size_t max_inputs) {
  const SlotHeader* h = slot.header();
  if (h->command != kRun) return Internal("unknown command " + std::to_string(h->command));
  ASSIGN_OR_RETURN(auto inputs, ReadTensors(slot, h->payload_bytes, max_inputs));
  ASSIGN_OR_RETURN(auto outputs, model.Infer(inputs, model::RunContext{}));
  return WriteTensors(slot, outputs);
}

void Serve(model::LoadedModel* model, Slot* slot) {
  SlotHeader* h = slot->header();
  const size_t max_inputs = model->spec().inputs.size();
  // One spin per wait for a request, from the last response on (the wait
  // passes through "response not yet taken" and "idle").
  int64_t spin_until = MonotonicNs() + RunnerSpinNs();
  for (;;) {
    uint32_t v = h->state.load(std::memory_order_acquire);
    if (v != kRequest) {  // idle, a response not yet taken, or reset by the daemon
      WaitWhile(&h->state, v, std::max<int64_t>(0, spin_until - MonotonicNs()), -1);
      continue;
    }
    h->taken.store(1, std::memory_order_release);
    StatusOr<uint64_t> done = Internal("unset");
    try {
      done = Handle(*model, *slot, max_inputs);
    } catch (const std::bad_alloc&) {
      done = LimitExceeded(
          "the run needs more memory than the runner may use (runner.memory_limit_mb); send fewer or smaller "
          "inputs, or raise the limit");
    }
    h->status = static_cast<uint32_t>(done.status().code());
    h->payload_bytes = done.ok() ? *done : WriteText(*slot, WithoutBacktrace(done.status().message()));
    h->state.store(kResponse, std::memory_order_release);
    Wake(&h->state);
    spin_until = MonotonicNs() + RunnerSpinNs();
  }
}

}  // namespace

std::vector<std::string> RunnerArgv(const std::string& self_exe, const RunnerArgs& a) {
  return {self_exe,
          kRunnerCommand,
          "--label",
          a.label,
          "--entry",
          a.entry_dir,
          "--device",
          a.device,
          "--slots",
          std::to_string(a.slots),
          "--threads",
          std::to_string(a.threads),
          "--choose-threads-at-batch",
          std::to_string(a.choose_threads_at_batch),
          "--memory-limit",
          std::to_string(a.memory_limit_bytes),
          "--scratch",
          a.scratch,
          "--parent",
          std::to_string(a.parent_pid)};
}

StatusOr<RunnerArgs> ParseRunnerArgs(const std::vector<std::string>& args) {
  RunnerArgs a;
  std::map<std::string, std::string> seen;
  for (size_t i = 0; i < args.size(); i += 2) {
    if (i + 1 >= args.size())
      return InvalidArgument(std::string(kRunnerCommand) + ": " + args[i] + " needs a value");
    if (!seen.emplace(args[i], args[i + 1]).second) {
      return InvalidArgument(std::string(kRunnerCommand) + ": " + args[i] + " given twice");
    }
  }
  auto text = [&](const char* flag, std::string* out) -> Status {
    auto it = seen.find(flag);
    if (it == seen.end()) return InvalidArgument(std::string(kRunnerCommand) + ": " + flag + " is required");
    *out = it->second;
    seen.erase(it);
    return Status::OK();
  };
  auto number = [&](const char* flag, auto* out) -> Status {
    std::string v;
    RETURN_IF_ERROR(text(flag, &v));
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
    if (ec != std::errc() || p != v.data() + v.size()) {
      return InvalidArgument(std::string(kRunnerCommand) + ": " + flag + " takes a number, not " + v);
    }
    return Status::OK();
  };
  RETURN_IF_ERROR(text("--label", &a.label));
  RETURN_IF_ERROR(text("--entry", &a.entry_dir));
  RETURN_IF_ERROR(text("--device", &a.device));
  RETURN_IF_ERROR(number("--slots", &a.slots));
  RETURN_IF_ERROR(number("--threads", &a.threads));
  RETURN_IF_ERROR(number("--choose-threads-at-batch", &a.choose_threads_at_batch));
  RETURN_IF_ERROR(number("--memory-limit", &a.memory_limit_bytes));
  RETURN_IF_ERROR(text("--scratch", &a.scratch));
  RETURN_IF_ERROR(number("--parent", &a.parent_pid));
  if (!seen.empty())
    return InvalidArgument(std::string(kRunnerCommand) + ": unknown flag " + seen.begin()->first);
  if (a.slots < 1 || a.slots > 64) return InvalidArgument(std::string(kRunnerCommand) + ": --slots is 1..64");
  return a;
}

int RunRunner(const RunnerArgs& args) {
  // Each run's activations are kept for the next instead of being faulted
  // in again (base/memory.h): up to 256 MiB kept free, a high-water mark
  // that the next run of the same shape needs anyway. Kept memory counts
  // against a memory limit (RLIMIT_DATA), so under one an eighth of it at
  // most.
  size_t keep = size_t{256} << 20;
  if (args.memory_limit_bytes > 0) keep = std::min(keep, static_cast<size_t>(args.memory_limit_bytes) / 8);
  KeepFreedMemory(keep);
  SandboxOptions sandbox;
  sandbox.read_paths = {args.entry_dir};
  sandbox.write_paths = {args.scratch};
  sandbox.memory_limit_bytes = args.memory_limit_bytes;
  sandbox.gpu = args.device != "cpu";
  if (Status s = EnterLimits(sandbox, args.parent_pid); !s.ok()) return FailStart(s);
  ::setenv("TMPDIR", args.scratch.c_str(), 1);

  std::vector<Slot> slots;
  for (int i = 0; i < args.slots; ++i) {
    auto slot = Slot::Map(kFirstSlotFd + i);
    if (!slot.ok()) return FailStart(slot.status());
    slots.push_back(std::move(slot).value());
  }
  auto spec_text = fs::ReadFile(args.entry_dir + "/spec.json");
  if (!spec_text.ok()) return FailStart(spec_text.status());
  auto spec = model::ModelSpec::FromJson(*spec_text);
  if (!spec.ok()) return FailStart(spec.status().WithContext(args.entry_dir + "/spec.json"));

  // The machine's load, watched while the threads are timed: /proc is
  // closed once the sandbox is in place, so it is opened now.
  std::unique_ptr<runtime::BusyMeter> meter =
      args.choose_threads_at_batch > 0 ? runtime::OpenSystemBusyMeter() : nullptr;
  // libtorch before the sandbox (its start-up reads what it likes); the
  // package's code after.
  if (auto plugin = runtime::LoadTorchPlugin(); !plugin.ok()) return FailStart(plugin.status());
  auto report = EnterSandbox(sandbox);
  if (!report.ok()) return FailStart(report.status());

  model::CacheEntry entry;
  entry.dir = args.entry_dir;
  entry.so_path = args.entry_dir + "/model.so";
  entry.spec = *spec;
  runtime::LoadOptions load;
  load.device = args.device;
  load.num_runners = args.slots;
  load.threads = args.threads;
  auto loaded = runtime::LoadCompiledModel(entry, load);
  if (!loaded.ok()) return FailStart(loaded.status());
  std::unique_ptr<model::LoadedModel> model = std::move(loaded).value();

  int threads = args.threads;
  std::string note = "-";
  bool settled = false;
  if (args.choose_threads_at_batch > 0 && args.threads > 1) {
    runtime::ChooseOptions how;
    how.meter = meter.get();
    runtime::ThreadChoice choice =
        runtime::ChooseThreads(*model, args.threads, args.choose_threads_at_batch, how);
    threads = choice.threads;
    note = choice.note.empty() ? "-" : choice.note;
    settled = choice.settled;
  }
  meter.reset();
  std::cerr << "aotid runner " << ::getpid() << ": serving " << args.label << " from " << entry.so_path
            << " on " << args.device << " (" << args.slots << " slot" << (args.slots == 1 ? "" : "s") << ", "
            << report->Describe() << ")" << std::endl;
  Reply("ready " + std::to_string(threads) + (settled ? " 1 " : " 0 ") + note);

  std::vector<std::thread> servers;
  for (size_t i = 1; i < slots.size(); ++i) servers.emplace_back(Serve, model.get(), &slots[i]);
  Serve(model.get(), &slots[0]);  // never returns: the daemon kills the runner
  return 0;
}

}  // namespace aotid::runner
