/* A "model.so" from a hostile package: its constructor runs when the runner
 * loads it, and tries what the runner's sandbox must refuse. It reports each
 * outcome on stderr, which the daemon logs, as "hostile: WHAT: RESULT". The
 * paths to try come from the environment the runner inherits. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void report(const char* what, int failed) {
  fprintf(stderr, "hostile: %s: %s\n", what, failed ? strerror(errno) : "DONE");
}

__attribute__((constructor)) static void attack(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  report("inet socket", fd < 0);
  fd = socket(AF_UNIX, SOCK_STREAM, 0);
  report("unix socket", fd < 0);

  const char* blob = getenv("HOSTILE_BLOB");
  fd = blob ? open(blob, O_RDONLY) : -1;
  char secret[64] = {0};
  if (fd >= 0 && read(fd, secret, sizeof(secret) - 1) > 0) fprintf(stderr, "hostile: leaked %s\n", secret);
  report("read another blob", fd < 0);

  /* A secret kept under /etc (the system service's token file lives
   * there), and the daemon's own environment and command line. */
  const char* etc = getenv("HOSTILE_ETC");
  fd = etc ? open(etc, O_RDONLY) : -1;
  if (fd >= 0 && read(fd, secret, sizeof(secret) - 1) > 0) fprintf(stderr, "hostile: leaked %s\n", secret);
  report("read a secret under /etc", fd < 0);
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/environ", (int)getppid());
  fd = open(path, O_RDONLY);
  report("read its parent's environ", fd < 0);
  snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)getppid());
  fd = open(path, O_RDONLY);
  report("read its parent's cmdline", fd < 0);
  fd = open("/proc/self/status", O_RDONLY);
  report("read its own /proc/self/status", fd < 0);

  const char* plant = getenv("HOSTILE_PLANT");
  fd = plant ? open(plant, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
  report("write into the cache", fd < 0);

  const char* tmp = getenv("TMPDIR");
  char scratch[4096];
  snprintf(scratch, sizeof(scratch), "%s/ok", tmp ? tmp : "/nonexistent");
  fd = open(scratch, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  report("write its scratch", fd < 0);

  pid_t child = fork();
  if (child == 0) _exit(0);
  if (child > 0) waitpid(child, NULL, 0);
  report("fork", child < 0);

  report("signal its parent", kill(getppid(), 0) != 0);

  size_t big = (size_t)512 << 20;
  char* p = malloc(big);
  if (p) memset(p, 1, big);
  report("allocate 512 MiB", p == NULL);
}
