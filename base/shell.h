// Runs a shell command through /bin/sh and captures what it prints. Used
// for the probes that ask a tool its version (the compiler in
// platform/hardware.cc, the worker's Python in daemon/doctor.cc) and for
// compiling and linking a source package's C++ in the build child
// (compile/aoti_build.cc), which folds the compiler's stderr into stdout
// with `2>&1` to keep its messages. Blocks until the command exits; quote
// every argument with ShellQuote.
#pragma once

#include <string>

namespace aotid {

struct ShellResult {
  int exit_code = -1;  // -1 when it could not run or was killed by a signal
  std::string out;     // stdout without the trailing newline; stderr is dropped
                       // unless the command redirects it
};

ShellResult RunShell(const std::string& command);

// `s` quoted for a POSIX shell.
std::string ShellQuote(const std::string& s);

}  // namespace aotid
