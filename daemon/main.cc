#include "daemon/cli.h"

int main(int argc, char** argv) { return aotid::daemon::RunCli(argc, argv); }
