/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_util.h: what every benchmark needs and should not write again --
 * a monotonic clock in seconds, the median and spread of a figure over
 * rounds, a small reproducible random stream, and dying with the
 * benchmark's name on an error (a benchmark that hits an error has no
 * figure to give, so it stops with a non-zero status).
 *
 * Header-only (static inline), for the benchmarks in bench/; not part of the library.
 */
#ifndef KVBM_BENCH_UTIL_H
#define KVBM_BENCH_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double kvbm_bench_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((noreturn, format(printf, 2, 3))) static inline void kvbm_bench_die(const char *prog,
                                                                                const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

/* A figure over rounds: the median (the mean of the middle two for an
 * even count), the least and the greatest. */
typedef struct kvbm_bench_spread {
  double median, min, max;
} kvbm_bench_spread;

static inline int kvbm_bench__cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* v is left as it is (a sorted copy is made); n >= 1. */
static inline kvbm_bench_spread kvbm_bench_spread_of(const double *v, int n) {
  double *s = malloc((size_t)n * sizeof *s);
  if (!s) kvbm_bench_die("bench", "out of memory");
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, kvbm_bench__cmp_double);
  kvbm_bench_spread r = {n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2, s[0], s[n - 1]};
  free(s);
  return r;
}

/* xorshift64: the same stream for the same seed (nonzero), so a rerun
 * moves the same blocks. */
static inline uint64_t kvbm_bench_xorshift(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *state = x;
}

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
/* For a CK(call) macro: dies naming the call, its line and CUDA's reason. */
static inline void kvbm_bench_cuda_check(const char *prog, cudaError_t e, const char *call, int line) {
  if (e != cudaSuccess) kvbm_bench_die(prog, "%s (line %d): %s", call, line, cudaGetErrorString(e));
}
#endif

#endif
