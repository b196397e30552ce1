#include <csignal>

#include "daemon/cli.h"

int main(int argc, char** argv) {
  // A peer that closes its socket (a registry, a client) is an error to
  // report, never a signal that ends the process without a word.
  std::signal(SIGPIPE, SIG_IGN);
  return aotid::daemon::RunCli(argc, argv);
}
