/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_blake3.c: single-thread BLAKE3 throughput on 16 KiB and 1 MiB
 * inputs (the payload check of workload W4, data movement), as a ratio to
 * Debian's `b3sum --num-threads 1` measured in the same run.
 *
 * b3sum hashes files, so the inputs are files: N MiB of random data cut
 * into 16 KiB files, and into 1 MiB files, in a temporary folder (page
 * cache). For each input size three figures, each the best of --repeat
 * interleaved runs (on a shared machine the minimum is the least
 * disturbed run), all in CPU seconds (user + system; for the tools as
 * reported by wait4), so time slices lost to other processes do not
 * count:
 *   reference   b3sum --num-threads 1 over all the files, minus the cost of
 *               starting b3sum (a run on one empty file);
 *   cli         `kvbm b3sum` over the same files, measured the same way:
 *               like for like, both pay the same per-file system calls;
 *   lib         our library alone on the same bytes already in memory,
 *               one hasher per input (init, update, finalize).
 *   ratio     = cli / reference      (target >= 0.7)
 *   lib_ratio = lib / reference      (flatters us: b3sum's figure includes
 *                                     opening and reading the files)
 * A third row, "stream", hashes all N MiB as one input (one file for the
 * CLIs), where per-file costs vanish and hashing speed dominates.
 *
 * usage: bench_blake3 [--mib 64] [--repeat 5] [--json] [--impl NAME]
 * (--impl forces the library's path for the lib column only; the kvbm
 * command always takes the best path.)
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvbm/blake3.h"

extern char **environ;

/* CPU time of this thread: on a shared machine, time slices lost to
 * other processes do not count (the children are timed the same way). */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs argv with stdout to /dev/null; returns the child's CPU seconds
 * (user + system), or -1 if it failed. */
static double run_timed(char *const argv[]) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY,
                                   0);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int st;
  struct rusage ru;
  while (wait4(pid, &st, 0, &ru) < 0 && errno == EINTR) {
  }
  double t = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
             (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? t : -1;
}

static int write_file(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(p, 1, n, f);
  return fclose(f) == 0 && w == n ? 0 : -1;
}

typedef struct workload {
  const char *name;
  size_t piece;      /* bytes per input */
  size_t count;      /* inputs */
  char **cli_argv;   /* argv for a CLI run: [tool, b3sum?, opts..., files] */
  double lib, cli, ref;  /* best seconds */
} workload;

/* argv = prefix... then the workload's files, NULL-terminated. */
static char **make_argv(const char *const *prefix, size_t np,
                        const char *stem, size_t count) {
  char **argv = calloc(np + count + 1, sizeof *argv);
  if (!argv) return NULL;
  for (size_t i = 0; i < np; i++) argv[i] = (char *)prefix[i];
  for (size_t i = 0; i < count; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s%zu", stem, i);
    argv[np + i] = strdup(name);
  }
  return argv;
}

static double lib_seconds(const uint8_t *data, size_t piece, size_t count,
                          kvbm_blake3_impl impl, uint8_t *sink) {
  double t0 = now();
  for (size_t i = 0; i < count; i++) {
    kvbm_blake3_hasher h;
    uint8_t out[32];
    kvbm_blake3_hasher_init(&h);
    kvbm_blake3_hasher_set_impl(&h, impl, NULL);
    kvbm_blake3_hasher_update(&h, data + i * piece, piece);
    kvbm_blake3_hasher_finalize(&h, out, sizeof out);
    *sink ^= out[0];
  }
  return now() - t0;
}

static void keep_min(double *best, double t) {
  if (t >= 0 && (*best < 0 || t < *best)) *best = t;
}

int main(int argc, char **argv) {
  size_t mib = 64;
  int repeat = 5, json = 0;
  kvbm_blake3_impl impl = KVBM_BLAKE3_IMPL_AUTO;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
      mib = strtoul(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
      repeat = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--json")) {
      json = 1;
    } else if (!strcmp(argv[i], "--impl") && i + 1 < argc) {
      const char *n = argv[++i];
      impl = !strcmp(n, "portable") ? KVBM_BLAKE3_IMPL_PORTABLE
             : !strcmp(n, "sse4.1") ? KVBM_BLAKE3_IMPL_SSE41
             : !strcmp(n, "avx2")   ? KVBM_BLAKE3_IMPL_AVX2
             : !strcmp(n, "avx512") ? KVBM_BLAKE3_IMPL_AVX512
                                    : KVBM_BLAKE3_IMPL_AUTO;
    } else {
      fprintf(stderr,
              "usage: bench_blake3 [--mib 64] [--repeat 5] [--json] "
              "[--impl portable|sse4.1|avx2|avx512]\n");
      return 2;
    }
  }
  if (mib < 1 || mib > 4096 || repeat < 1) {
    fprintf(stderr, "bench_blake3: --mib in [1, 4096], --repeat >= 1\n");
    return 2;
  }
  if (!kvbm_blake3_impl_available(impl)) {
    fprintf(stderr, "bench_blake3: this CPU cannot run %s\n",
            kvbm_blake3_impl_name(impl));
    return 1;
  }
  if (impl == KVBM_BLAKE3_IMPL_AUTO) impl = kvbm_blake3_impl_best();

  /* The kvbm command sits next to the benchmarks in the build folder. */
  char self[PATH_MAX], kvbm[PATH_MAX + 8];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sl <= 0) return 1;
  self[sl] = '\0';
  *strrchr(self, '/') = '\0';
  snprintf(kvbm, sizeof kvbm, "%s/kvbm", self);
  int have_cli = access(kvbm, X_OK) == 0;

  char dir[] = "/tmp/bench_blake3.XXXXXX";
  if (!mkdtemp(dir) || chdir(dir) != 0) {
    perror("bench_blake3: temp dir");
    return 1;
  }
  size_t total = mib << 20;
  uint8_t *data = malloc(total);
  if (!data) return 1;
  uint64_t s = 0x243F6A8885A308D3ull;
  for (size_t i = 0; i < total; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    data[i] = (uint8_t)s;
  }
  workload w[3] = {{"16KiB", 16384, total / 16384, NULL, -1, -1, -1},
                   {"1MiB", 1 << 20, total >> 20, NULL, -1, -1, -1},
                   {"stream", total, 1, NULL, -1, -1, -1}};
  const char *stems[3] = {"s", "m", "big"};
  int ok = 1;
  for (int k = 0; k < 3 && ok; k++) {
    for (size_t i = 0; i < w[k].count && ok; i++) {
      char name[64];
      snprintf(name, sizeof name, "%s%zu", stems[k], i);
      ok = write_file(name, data + i * w[k].piece, w[k].piece) == 0;
    }
  }
  ok = ok && write_file("empty", data, 0) == 0;
  if (!ok) {
    perror("bench_blake3: writing inputs");
    return 1;
  }

  const char *ref_prefix[] = {"b3sum", "--num-threads", "1"};
  const char *cli_prefix[] = {kvbm, "b3sum"};
  char *ref_empty[] = {"b3sum", "--num-threads", "1", "empty", NULL};
  char *cli_empty[] = {kvbm, "b3sum", "empty", NULL};
  char **ref_argv[3], **cli_argv[3];
  for (int k = 0; k < 3; k++) {
    ref_argv[k] = make_argv(ref_prefix, 3, stems[k], w[k].count);
    cli_argv[k] = make_argv(cli_prefix, 2, stems[k], w[k].count);
  }
  if (run_timed(ref_empty) < 0) {
    fprintf(stderr, "bench_blake3: b3sum does not run (apt install b3sum)\n");
    return 1;
  }

  double ref_start = -1, cli_start = -1;
  uint8_t sink = 0;
  for (int r = 0; r < repeat; r++) {
    keep_min(&ref_start, run_timed(ref_empty));
    if (have_cli) keep_min(&cli_start, run_timed(cli_empty));
    for (int k = 0; k < 3; k++) {
      keep_min(&w[k].lib, lib_seconds(data, w[k].piece, w[k].count, impl,
                                      &sink));
      keep_min(&w[k].ref, run_timed(ref_argv[k]));
      if (have_cli) keep_min(&w[k].cli, run_timed(cli_argv[k]));
    }
  }

  /* Clean up the inputs before reporting. */
  for (int k = 0; k < 3; k++)
    for (size_t i = 0; i < w[k].count; i++) unlink(ref_argv[k][3 + i]);
  unlink("empty");
  if (chdir("/") == 0) rmdir(dir);

  const double gb = (double)total / 1e9;
  if (json) printf("{\"workload\": \"W4 payload check (BLAKE3)\", \"path\": "
                   "\"%s\", \"mib\": %zu, \"target_ratio\": 0.7, \"results\": [",
                   kvbm_blake3_impl_name(impl), mib);
  else
    printf("W4 payload check (BLAKE3), one thread, path %s, %zu MiB per "
           "row, best of %d\n%-7s %10s %10s %10s %8s %10s\n",
           kvbm_blake3_impl_name(impl), mib, repeat, "input", "b3sum GB/s",
           "cli GB/s", "lib GB/s", "ratio", "lib_ratio");
  for (int k = 0; k < 3; k++) {
    double ref = w[k].ref - ref_start;
    double cli = have_cli ? w[k].cli - cli_start : -1;
    double ref_gbps = ref > 0 ? gb / ref : 0;
    double cli_gbps = cli > 0 ? gb / cli : 0;
    double lib_gbps = gb / w[k].lib;
    double ratio = ref_gbps > 0 ? cli_gbps / ref_gbps : 0;
    double lib_ratio = ref_gbps > 0 ? lib_gbps / ref_gbps : 0;
    if (json)
      printf("%s{\"input\": \"%s\", \"reference_gbps\": %.3f, \"cli_gbps\": "
             "%.3f, \"gbps\": %.3f, \"ratio\": %.3f, \"lib_ratio\": %.3f}",
             k ? ", " : "", w[k].name, ref_gbps, cli_gbps, lib_gbps, ratio,
             lib_ratio);
    else
      printf("%-7s %10.2f %10.2f %10.2f %8.2f %10.2f\n", w[k].name, ref_gbps,
             cli_gbps, lib_gbps, ratio, lib_ratio);
  }
  if (json) printf("], \"sink\": %u}\n", sink);
  for (int k = 0; k < 3; k++) {
    for (size_t i = 0; i < w[k].count; i++) free(ref_argv[k][3 + i]);
    for (size_t i = 0; i < w[k].count; i++) free(cli_argv[k][2 + i]);
    free(ref_argv[k]);
    free(cli_argv[k]);
  }
  free(data);
  return 0;
}
