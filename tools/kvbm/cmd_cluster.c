/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_cluster.c: `kvbm cluster`, the W5 cluster run (issue 23), by exec of
 * its orchestrator.
 *
 * What and why. W5 starts a whole cluster on loopback (nats-server with
 * JetStream, a Redis Cluster, N `kvbm worker`s, two `kvbm router`
 * replicas, `kvbm advisor`, Prometheus), replays a trace through it under
 * a fault schedule and checks its invariants. That is process management
 * and HTTP calls, which the orchestrator in scripts/cluster/ (Python,
 * standard library only) does; this command only finds it and the right
 * binaries, so that one command runs it from a build tree or an install:
 *
 *   the kvbm binary   /proc/self/exe (its real path), passed as KVBM_BIN;
 *   the orchestrator  $KVBM_CLUSTER_SCRIPT when set, else the first of
 *                     <bin dir>/share/kvbm/cluster/cluster.py (a build
 *                     tree: cmake/cluster.cmake copies it there) and
 *                     <bin dir>/../share/kvbm/cluster/cluster.py (an
 *                     install prefix: bin/ and share/ side by side);
 *   kvbm's Python     <bin dir>/python when it holds the package (a build
 *                     tree), passed as KVBM_PYTHON_DIR (the ideal router
 *                     hashes requests with kvbm.block_hashes); an install
 *                     puts the package where the interpreter looks anyway;
 *   the interpreter   $KVBM_PYTHON, else /usr/bin/python3.
 *
 * Every argument is passed on unchanged (`kvbm cluster --help` is the
 * orchestrator's). The exec replaces this process, so signals sent to
 * `kvbm cluster` reach the orchestrator, which stops what it started.
 * Errors: a binary or script that cannot be found or run is said with its
 * path, exit 2 (as for bad usage).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

const char kvbm_cmd_cluster_help[] =
    "W5: a whole cluster on loopback (workers, router replicas, advisor, Redis Cluster, "
    "JetStream, Prometheus) under a fault schedule, invariants checked";

/* dir + "/" + rel into out; false when it does not fit. */
static bool join(char *out, size_t cap, const char *dir, const char *rel) {
  int n = snprintf(out, cap, "%s/%s", dir, rel);
  return n > 0 && (size_t)n < cap;
}

/* The running binary (its real path) into exe, its directory into dir
 * (both PATH_MAX). */
static bool self_paths(char *exe, char *dir) {
  ssize_t n = readlink("/proc/self/exe", exe, PATH_MAX - 1);
  if (n <= 0) return false;
  exe[n] = 0;
  const char *slash = strrchr(exe, '/');
  if (!slash) return false;
  memcpy(dir, exe, (size_t)(slash - exe));
  dir[slash - exe] = 0;
  return true;
}

/* The orchestrator script, by the order above; false when none exists. */
static bool find_script(const char *dir, char *out, size_t cap) {
  const char *env = getenv("KVBM_CLUSTER_SCRIPT");
  if (env && *env) {
    int n = snprintf(out, cap, "%s", env);
    return n > 0 && (size_t)n < cap && access(out, R_OK) == 0;
  }
  static const char *const rel[] = {"share/kvbm/cluster/cluster.py",
                                    "../share/kvbm/cluster/cluster.py"};
  for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++)
    if (join(out, cap, dir, rel[i]) && access(out, R_OK) == 0) return true;
  return false;
}

int kvbm_cmd_cluster(int argc, char **argv) {
  char dir[PATH_MAX], exe[PATH_MAX], script[PATH_MAX], py[PATH_MAX];
  if (!self_paths(exe, dir)) {
    fprintf(stderr, "kvbm cluster: cannot find the kvbm binary (/proc/self/exe)\n");
    return 2;
  }
  if (!find_script(dir, script, sizeof script)) {
    fprintf(stderr, "kvbm cluster: the orchestrator is not at %s/share/kvbm/cluster/cluster.py "
            "nor %s/../share/kvbm/cluster/cluster.py (set KVBM_CLUSTER_SCRIPT to "
            "scripts/cluster/cluster.py)\n", dir, dir);
    return 2;
  }
  if (setenv("KVBM_BIN", exe, 1)) {
    fprintf(stderr, "kvbm cluster: setenv: %s\n", strerror(errno));
    return 2;
  }
  if (join(py, sizeof py, dir, "python/kvbm/__init__.py") && access(py, R_OK) == 0 &&
      join(py, sizeof py, dir, "python"))
    setenv("KVBM_PYTHON_DIR", py, 0); /* one the caller set wins */
  const char *interp = getenv("KVBM_PYTHON");
  if (!interp || !*interp) interp = "/usr/bin/python3";
  char **args = calloc((size_t)argc + 3, sizeof *args);
  if (!args) {
    fprintf(stderr, "kvbm cluster: out of memory\n");
    return 2;
  }
  args[0] = (char *)interp;
  args[1] = script;
  for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
  execv(interp, args);
  fprintf(stderr, "kvbm cluster: cannot run %s %s: %s\n", interp, script, strerror(errno));
  free(args);
  return 2;
}
