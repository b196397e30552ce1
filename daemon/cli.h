// The `aotid` command line. Exit codes scripts can rely on:
//   0 success
//   1 the operation failed (I/O, a build, an internal error)
//   2 usage or configuration error
//   3 not found (a model, a file, a store)
//   4 already exists (a model version)
//   5 invalid input (a file that is not a package, a bad name)
#pragma once

namespace aotid::daemon {

int RunCli(int argc, char** argv);

}  // namespace aotid::daemon
