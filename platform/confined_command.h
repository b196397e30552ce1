// `aotid internal-confine --read PATH ... --write PATH ... [--gpu] --
// COMMAND ARGS...`: the daemon's own binary enters the build child's
// sandbox (runner/sandbox.h, with processes allowed) and then execs
// COMMAND in it, so that a child the daemon cannot confine itself (the
// Python compile worker, and the compiler it runs) starts confined: the
// sandbox lasts across exec and passes to every process it starts.
// Its command line is defined here once, for both sides.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace aotid::platform {

inline constexpr char kConfineCommand[] = "internal-confine";

struct ConfineArgs {
  std::vector<std::string> read_paths;   // read beneath these, beyond the system's
  std::vector<std::string> write_paths;  // read, write, create and remove beneath these
  bool gpu = false;                      // the GPU's device files too
  std::vector<std::string> command;      // what runs confined; not empty
};

// `self_exe internal-confine ...`.
std::vector<std::string> ConfineArgv(const std::string& self_exe, const ConfineArgs& args);
// Parses what follows the subcommand; InvalidArgument naming an unknown
// flag, a flag without its value, or a missing command.
StatusOr<ConfineArgs> ParseConfineArgs(const std::vector<std::string>& args);

}  // namespace aotid::platform
