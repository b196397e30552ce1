#include "platform/confined_command.h"

namespace aotid::platform {

std::vector<std::string> ConfineArgv(const std::string& self_exe, const ConfineArgs& args) {
  std::vector<std::string> argv = {self_exe, kConfineCommand};
  for (const std::string& p : args.read_paths) {
    argv.push_back("--read");
    argv.push_back(p);
  }
  for (const std::string& p : args.write_paths) {
    argv.push_back("--write");
    argv.push_back(p);
  }
  if (args.gpu) argv.push_back("--gpu");
  argv.push_back("--");
  argv.insert(argv.end(), args.command.begin(), args.command.end());
  return argv;
}

StatusOr<ConfineArgs> ParseConfineArgs(const std::vector<std::string>& args) {
  ConfineArgs a;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "--gpu") {
      a.gpu = true;
      continue;
    }
    std::vector<std::string>* list = args[i] == "--read"    ? &a.read_paths
                                     : args[i] == "--write" ? &a.write_paths
                                                            : nullptr;
    if (list == nullptr)
      return InvalidArgument(std::string(kConfineCommand) + ": unknown argument '" + args[i] + "'");
    if (i + 1 >= args.size() || args[i + 1] == "--")
      return InvalidArgument(std::string(kConfineCommand) + ": " + args[i] + " needs a path");
    list->push_back(args[++i]);
  }
  if (i + 1 >= args.size()) return InvalidArgument(std::string(kConfineCommand) + ": no command after --");
  a.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
  return a;
}

}  // namespace aotid::platform
