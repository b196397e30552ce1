// What a child process is started with: the environment it inherits, with
// the variables the parent means to set replaced rather than added beside
// the inherited ones, and the null-terminated arrays exec and posix_spawn
// take. The build children and the device probe start Python this way.
#pragma once

#include <string>
#include <vector>

namespace aotid {

// This process's environment with every variable named in `set` (each
// "NAME=value") taken out, then `set` itself. A name is never there twice:
// a child reading the first of two (getenv) and one reading the last
// (Python's os.environ) would disagree.
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& set);

// Pointers to each string's characters, then a null: argv or envp for
// exec. They point into `strings`, which must outlive them unchanged.
std::vector<char*> NullTerminated(std::vector<std::string>& strings);

}  // namespace aotid
