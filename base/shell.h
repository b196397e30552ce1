// Runs a shell command and captures what it prints: for probes that ask a
// tool its version (the compiler, the worker's Python).
#pragma once

#include <string>

namespace aotid {

struct ShellResult {
  int exit_code = -1;  // -1 when it could not run or was killed by a signal
  std::string out;     // stdout without the trailing newline; stderr is dropped
};

ShellResult RunShell(const std::string& command);

// `s` quoted for a POSIX shell.
std::string ShellQuote(const std::string& s);

}  // namespace aotid
