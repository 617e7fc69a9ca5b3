/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_g4_prefill.c: how long a prefill waits on a G4 that does not
 * deliver, against the same prefill on a healthy G4, in the same run.
 *
 * Workload: W2's G4 path (../shared/WORKLOADS.md, "W2: tiered replay"),
 * one request shape: a prompt of --blocks full blocks of 16 tokens (422 by
 * default, the prompt issue 24's probe used) that G4 claims to hold, on a
 * manager whose G1, G2 and G3 do not. The store is tests/tier/fake_redis.h
 * on loopback:
 *   healthy   holds every block (stored by a first manager) and answers;
 *   trickle   answers GET with a value header, then a byte every 50 ms;
 *   stall     never answers a GET;
 *   errors    answers every GET with -ERR;
 *   garbage   answers every GET with a short string that is not a block.
 * Every store but the healthy one says every block exists (STRLEN).
 *
 * Figures, per store, over --reps rounds that take the stores in turn
 * (A B C D E, A B C D E, ...): the first prefill's wait (prefill + wait for
 * its onboards, a fresh manager each time), median [min..max], its ratio to
 * the healthy wait and to one deadline (g4_timeout_ms: the bound the
 * manager promises), and the wait of the next prefill on the same manager
 * (another prompt), which a store that is backed off no longer costs.
 *
 * usage: bench_g4_prefill [--blocks N (422)] [--reps R (5)]
 *                         [--timeout-ms T (1000)] [--json]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/tier/fake_redis.h"
#include "kvbm/manager.h"

#define B 16

typedef struct opts {
  size_t blocks;
  int reps, timeout_ms;
  bool json;
} opts;

static char url[64];

static kvbm_manager *mgr(const fake *f, const opts *o) {
  kvbm_manager_config c = kvbm_manager_config_default();
  c.block_size = B;
  c.layout.page_size = B;
  c.g1_blocks = (uint32_t)(2 * o->blocks + 64);
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", f->port);
  c.g4_url = url;
  c.g4_timeout_ms = o->timeout_ms;
  c.g4_lookup_timeout_ms = o->timeout_ms; /* the lookup is answered at once */
  kvbm_manager *m = NULL;
  kvbm_error e = {0};
  if (kvbm_manager_create(&c, &m, &e)) {
    fprintf(stderr, "bench_g4_prefill: %s\n", e.msg);
    exit(1);
  }
  return m;
}

static uint32_t *prompt(uint32_t base, size_t n) {
  uint32_t *t = malloc(n * sizeof *t);
  for (size_t i = 0; i < n; i++) t[i] = base + (uint32_t)i;
  return t;
}

/* One request: prefill, wait for its onboards; the engine then computes
 * the rest and commits, untimed. Returns the wait; *hit its G4 blocks. */
static double request(kvbm_manager *m, const uint32_t *p, size_t n, size_t *hit) {
  kvbm_mreq *r;
  kvbm_mreq_info info;
  double t0 = fake_now();
  if (kvbm_manager_prefill(m, 0, 0, p, n, &r, NULL, NULL) || kvbm_mreq_wait(r, -1, &info)) {
    fprintf(stderr, "bench_g4_prefill: prefill failed\n");
    exit(1);
  }
  double dt = fake_now() - t0;
  if (hit) *hit = info.hit_blocks[KVBM_TIER_G4];
  kvbm_mreq_commit(r);
  kvbm_mreq_destroy(r);
  return dt;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
  opts o = {.blocks = 422, .reps = 5, .timeout_ms = 1000};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--blocks") && i + 1 < argc) o.blocks = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc) o.timeout_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--json")) o.json = true;
    else {
      fprintf(stderr, "usage: bench_g4_prefill [--blocks N] [--reps R] [--timeout-ms T] [--json]\n");
      return 2;
    }
  }
  if (o.blocks < 1 || o.blocks > 100000 || o.reps < 1 || o.reps > 1000 || o.timeout_ms < 1) {
    fprintf(stderr, "bench_g4_prefill: --blocks 1..100000, --reps 1..1000, --timeout-ms >= 1\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const size_t n = o.blocks * B + 1;
  uint32_t *p = prompt(1000, n), *q = prompt(1u << 28, n);
  static const char *name[] = {"healthy", "trickle", "stall", "errors", "garbage"};
  static const int mode[] = {GOOD, TRICKLE, STALL, ERROR, GARBAGE};
  enum { NS = 5 };
  fake *f = calloc(NS, sizeof *f); /* 4 MiB each: not on the stack */
  if (!f) return 1;
  for (int s = 0; s < NS; s++)
    if (fake_start(&f[s], GOOD)) {
      fprintf(stderr, "bench_g4_prefill: cannot start a fake store\n");
      return 1;
    }
  { /* the healthy store holds the prompt */
    kvbm_manager *a = mgr(&f[0], &o);
    request(a, p, n, NULL);
    kvbm_manager_flush(a);
    kvbm_manager_destroy(a);
  }
  for (int s = 1; s < NS; s++) fake_set(&f[s], mode[s], 0, NULL);
  double *first[NS], *next[NS];
  for (int s = 0; s < NS; s++) {
    first[s] = calloc((size_t)o.reps, sizeof(double));
    next[s] = calloc((size_t)o.reps, sizeof(double));
  }
  for (int r = 0; r < o.reps; r++)
    for (int s = 0; s < NS; s++) {
      kvbm_manager *m = mgr(&f[s], &o);
      size_t hit;
      first[s][r] = request(m, p, n, &hit);
      if (s == 0 && hit != o.blocks) {
        fprintf(stderr, "bench_g4_prefill: healthy store served %zu of %zu blocks\n", hit, o.blocks);
        return 1;
      }
      next[s][r] = request(m, q, n, NULL);
      kvbm_manager_destroy(m); /* waits for what is still in flight: untimed */
    }
  double mh = median(first[0], o.reps);
  if (o.json) printf("{\"workload\":\"W2 G4 path, %zu-block prompt\",\"timeout_ms\":%d,\"stores\":{",
                     o.blocks, o.timeout_ms);
  else
    printf("W2's G4 path: a %zu-block prompt, g4_timeout_ms %d, %d rounds\n"
           "store     first wait s [min..max]        /healthy  /deadline  next wait s\n",
           o.blocks, o.timeout_ms, o.reps);
  for (int s = 0; s < NS; s++) {
    double mn = first[s][0], mx = first[s][0];
    for (int r = 0; r < o.reps; r++) {
      if (first[s][r] < mn) mn = first[s][r];
      if (first[s][r] > mx) mx = first[s][r];
    }
    double md = median(first[s], o.reps), nx = median(next[s], o.reps);
    if (o.json)
      printf("%s\"%s\":{\"wait_s\":%.4g,\"min_s\":%.4g,\"max_s\":%.4g,\"vs_healthy\":%.4g,"
             "\"vs_deadline\":%.4g,\"next_wait_s\":%.4g}",
             s ? "," : "", name[s], md, mn, mx, md / mh, md * 1000 / o.timeout_ms, nx);
    else
      printf("%-8s  %8.4f [%.4f..%.4f]  %8.2f  %9.2f  %10.4f\n", name[s], md, mn, mx, md / mh,
             md * 1000 / o.timeout_ms, nx);
  }
  if (o.json) printf("}}\n");
  for (int s = 0; s < NS; s++) {
    fake_stop(&f[s]);
    free(first[s]);
    free(next[s]);
  }
  free(f);
  free(p);
  free(q);
  return 0;
}
