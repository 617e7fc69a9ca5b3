/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_engine_latency.c: how long the engine's calls into the tiered
 * manager take on workload W2, with and without the tiers below G1
 * (issue 22: a report, no target).
 *
 * What it measures. An engine that adopts kvbm calls it on its own
 * scheduling thread for every request: kvbm_manager_prefill (hash the
 * prompt, walk G1..G4, allocate), kvbm_mreq_wait (the onboards of what the
 * walk found below G1), kvbm_mreq_append (the output tokens),
 * kvbm_mreq_commit (the offload decisions) and kvbm_mreq_destroy (release,
 * tail first). Every microsecond there is a microsecond the engine's batch
 * does not run, and its tail (p99, max) is what an engine builder asks
 * about first. This bench times each of those calls, every one of them,
 * with CLOCK_MONOTONIC, while W2 (../shared/WORKLOADS.md) replays the
 * bundled Mooncake trace through the manager: the W2 driver
 * (src/workload/w2.c) is the engine and reports each call's duration
 * through its on_call observer (the clock is read only for an observer),
 * so what is timed is exactly what `kvbm replay` with tiers runs. Three configurations, in the same
 * run, on the same requests:
 *   1. G1 only (C1 blocks, W1's pool);
 *   2. G1 + G2 (host memory) + G3 (a disk:// slot file in a fresh
 *      directory under --dir, /tmp by default);
 *   3. as 2, plus a redis:// G4 on a redis-server this bench starts on a
 *      free loopback port (emptied before each run). Without redis-server
 *      the configuration is skipped, and the output says so.
 * Sizes are W2's documented run (docs/areas/tiers.md): B 16, C1 16384,
 * C2 262144, C3 1048576, 256-byte blocks (2 layers of 128), default
 * policies (G2 and G4 write-through, G3 behind the frequency filter),
 * W2's 1000 ms G4 lookup deadline.
 *
 * What the numbers mean. Per call: p50, p90, p99 and max (nearest rank
 * over every call of the run), and calls/s = calls / time spent inside
 * that call (1 / mean: how many such calls one thread could make back to
 * back; not the replay's rate, printed separately as requests/s, which
 * also pays W2's own work). With --reps R the three configurations run R
 * times (the order rotated each rep, so no configuration always runs
 * first), and each figure is the median [min..max] over the reps.
 * For context, the share of requests whose match took at least one block
 * from each tier (a request may count under several), and of prompt
 * tokens served by each tier; how many prefills asked G4's store (a
 * lookup: one round trip); and, to tell what makes the tail, the mean
 * size of the requests behind the slowest 1% of prefills and commits
 * against that of all: a tail of long prompts is work proportional to
 * the prompt, a tail of average ones is waiting (the store, the machine).
 *
 * What the numbers are not. W2 waits for every copy after each request
 * (kvbm_manager_flush, timed and printed as "flush (W2's)"), so the
 * counts do not depend on thread timing; an engine does not. So here
 * every prefill starts with the workers idle and no copy of an earlier
 * request pending (a commit's own copies do start while it is still
 * deciding the rest, on the other core): these figures are the calls' own
 * cost on a manager that keeps up, not their cost under a full copy
 * queue, and not with several engine threads on the one manager lock. W2's driver also writes and checks a byte pattern in every block
 * (the engine's compute, untimed). The machine is a shared 2-core VM: run
 * it with nothing else busy and report the load average next to the
 * figures.
 *
 * The bench fails (exit 1) if any call returns an error, an onboarded
 * block's bytes are wrong, or a configured tier is unavailable.
 *
 * usage: bench_engine_latency [TRACE] [--requests N (600)] [--reps R (1)]
 *                             [--dir DIR (/tmp)] [--json FILE]
 *                             [--g4-lookup-max N (512)]
 *
 * --g4-lookup-max is the most blocks one G4 lookup asks the store about
 * (the manager's g4_lookup_max): the lookup is one pipelined batch of that
 * many EXISTS, so it sets what a prefill that G1..G3 do not cover costs.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tests/volume/volume_testutil.h"
#include "workload/trace.h"
#include "workload/w2.h"

enum { NCFG = 3, NSTAT = 6 };
static const char *const cfg_name[NCFG] = {"G1 only", "G1+G2+G3", "G1+G2+G3+G4 (redis)"};
static const char *const cfg_key[NCFG] = {"g1", "g1_g2_g3", "g1_g2_g3_g4"};
static const char *const call_name[KVSIM_W2_CALL_COUNT] = {"prefill", "wait", "append",
                                                          "commit", "flush", "destroy"};
/* Printed in this order: the two the issue names first, W2's flush last. */
static const kvsim_w2_call call_order[KVSIM_W2_CALL_COUNT] = {
    KVSIM_W2_CALL_PREFILL, KVSIM_W2_CALL_COMMIT, KVSIM_W2_CALL_WAIT,
    KVSIM_W2_CALL_APPEND,  KVSIM_W2_CALL_DESTROY, KVSIM_W2_CALL_FLUSH};
static const char *const stat_name[NSTAT] = {"p50_us", "p90_us", "p99_us", "max_us", "mean_us",
                                             "calls_per_s"};
static const char *const tier_name[KVBM_TIER_COUNT] = {"G1", "G2", "G3", "G4"};

/* Every duration of one call in one run. Sized before the run for one
 * call per request (W2 makes each call at most once per request), so the
 * observer never allocates between two timed calls. */
typedef struct sample {
  double s;   /* seconds in the call */
  size_t req; /* the request's index in the trace */
} sample;

typedef struct samples {
  sample *v;
  size_t n, cap;
} samples;

/* What one configuration's run observed. */
typedef struct run_obs {
  samples call[KVSIM_W2_CALL_COUNT];
  uint64_t prev_hit[KVBM_TIER_COUNT]; /* hit tokens per tier so far */
  uint64_t req_hit[KVBM_TIER_COUNT];  /* requests with a block from the tier */
  uint64_t req_nohit, requests; /* requests: also the index of the one in flight */
  bool overflow; /* more calls than sized for: a bug, fails the run */
} run_obs;

/* One configuration's figures in one rep. */
typedef struct rep_fig {
  bool ran;
  double stat[KVSIM_W2_CALL_COUNT][NSTAT];
  size_t calls[KVSIM_W2_CALL_COUNT];
  double req_share[KVBM_TIER_COUNT], nohit_share; /* of requests */
  double tok_share[KVBM_TIER_COUNT];              /* of prompt tokens */
  double requests_per_s;
  /* Why the tail is the tail: the mean tokens (prompt for prefill, prompt
   * plus output for commit) of the requests of the slowest 1% of calls,
   * and of all. */
  double tail_tokens[KVSIM_W2_CALL_COUNT], all_tokens[KVSIM_W2_CALL_COUNT];
  uint64_t skipped, lookups, lookup_timeouts;
  char g3_mode[64], g4_mode[64];
} rep_fig;

static void on_call(void *user, kvsim_w2_call call, double seconds) {
  run_obs *o = user;
  samples *s = &o->call[call];
  if (s->n == s->cap) {
    o->overflow = true;
    return;
  }
  s->v[s->n++] = (sample){seconds, (size_t)o->requests};
}

/* After each request: which tiers its match came from (the driver's
 * per-tier hit tokens, cumulative, so this request's are the difference). */
static void on_request(void *user, size_t done, size_t total, const kvsim_w2_result *so_far,
                       kvbm_manager *m) {
  (void)done;
  (void)total;
  (void)m;
  run_obs *o = user;
  bool any = false;
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    uint64_t h = so_far->tiers[t].hit_tokens;
    if (h > o->prev_hit[t]) {
      o->req_hit[t]++;
      any = true;
    }
    o->prev_hit[t] = h;
  }
  o->req_nohit += !any;
  o->requests++;
}

static int cmp_sample(const void *a, const void *b) {
  double x = ((const sample *)a)->s, y = ((const sample *)b)->s;
  return (x > y) - (x < y);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest rank on a sorted array: the smallest value with at least p of
 * the samples at or below it. */
static size_t rank(size_t n, double p) {
  size_t k = (size_t)(p * (double)n + 0.999999);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return k - 1;
}

/* The tokens a call of kind k handles for request q. */
static double call_tokens(const kvsim_trace_request *q, int k) {
  return k == KVSIM_W2_CALL_PREFILL || k == KVSIM_W2_CALL_WAIT
             ? (double)q->input_length
             : (double)q->input_length + (double)q->output_length;
}

static void summarize(samples *s, int k, const kvsim_trace *t, double out[NSTAT], double *tail,
                      double *all) {
  memset(out, 0, NSTAT * sizeof *out);
  *tail = *all = 0;
  if (!s->n) return;
  qsort(s->v, s->n, sizeof *s->v, cmp_sample);
  double sum = 0, tok = 0, tail_tok = 0;
  size_t from = rank(s->n, 0.99);
  for (size_t i = 0; i < s->n; i++) {
    sum += s->v[i].s;
    double x = call_tokens(kvsim_trace_get(t, s->v[i].req), k);
    tok += x;
    if (i >= from) tail_tok += x;
  }
  *all = tok / (double)s->n;
  *tail = tail_tok / (double)(s->n - from);
  out[0] = s->v[rank(s->n, 0.50)].s * 1e6;
  out[1] = s->v[rank(s->n, 0.90)].s * 1e6;
  out[2] = s->v[rank(s->n, 0.99)].s * 1e6;
  out[3] = s->v[s->n - 1].s * 1e6;
  out[4] = sum / (double)s->n * 1e6;
  out[5] = sum > 0 ? (double)s->n / sum : 0;
}

typedef struct bench {
  const kvsim_trace *trace;
  size_t requests;
  const char *dir;
  vt_redis redis; /* pid 0: none */
  char g4_url[64];
  kvbm_manager_config base; /* what W2 does not set: the manager's defaults
                               but g4_lookup_max (--g4-lookup-max) */
} bench;

/* Runs W2 once in configuration c and fills *f. Returns 0, or 1 after
 * saying why on stderr. */
static int run_config(bench *b, int c, rep_fig *f) {
  memset(f, 0, sizeof *f);
  kvsim_w2_config o = kvsim_w2_config_default();
  o.w1.limit = b->requests;
  char g3dir[512] = "";
  if (c >= 1) {
    /* A fresh slot file every run: G3 starts cold, as G1 and G2 do. */
    int k = snprintf(g3dir, sizeof g3dir, "%s/kvbm-lat-g3-XXXXXX", b->dir);
    if (k < 0 || (size_t)k >= sizeof g3dir || !mkdtemp(g3dir)) {
      fprintf(stderr, "bench_engine_latency: cannot make a directory under %s: %s\n", b->dir,
              strerror(errno));
      return 1;
    }
    o.g2_blocks = 262144;
    o.g3_blocks = 1048576;
    o.g3_dir = g3dir;
  }
  if (c == 2) {
    /* An empty store every run: G4 hits come from this run's puts only. */
    char out[64];
    if (VT_CLI(b->redis.port, out, sizeof out, "FLUSHALL") != 0 || strncmp(out, "OK", 2)) {
      fprintf(stderr, "bench_engine_latency: FLUSHALL on redis port %d failed\n", b->redis.port);
      vt_rmrf(g3dir);
      return 1;
    }
    o.g4_url = b->g4_url;
  }
  o.base = &b->base;
  run_obs obs;
  memset(&obs, 0, sizeof obs);
  int rc = 0;
  for (int k = 0; k < KVSIM_W2_CALL_COUNT && !rc; k++) {
    obs.call[k].cap = b->requests;
    obs.call[k].v = malloc(b->requests * sizeof(sample));
    if (!obs.call[k].v) rc = 1;
  }
  if (rc) fprintf(stderr, "bench_engine_latency: out of memory\n");
  o.on_call = on_call;
  o.on_request = on_request;
  o.observer_user = &obs;
  kvsim_w2_result res;
  kvbm_error err = {0};
  if (!rc && kvsim_w2_run(b->trace, &o, &res, &err)) {
    fprintf(stderr, "bench_engine_latency: %s: %s\n", cfg_name[c], err.msg);
    rc = 1;
  }
  if (!rc && obs.overflow) {
    fprintf(stderr, "bench_engine_latency: more calls than requests (a driver change?)\n");
    rc = 1;
  }
  if (!rc && res.verify_failures) {
    fprintf(stderr, "bench_engine_latency: %s: %llu onboarded blocks had wrong bytes\n",
            cfg_name[c], (unsigned long long)res.verify_failures);
    rc = 1;
  }
  /* A tier that could not be opened makes the configuration another one. */
  if (!rc && c >= 1 && (!res.g3_mode[0] || res.g3_error[0])) {
    fprintf(stderr, "bench_engine_latency: %s: G3 unavailable: %s\n", cfg_name[c], res.g3_error);
    rc = 1;
  }
  if (!rc && c == 2 && (!res.g4_mode[0] || res.g4_error[0])) {
    fprintf(stderr, "bench_engine_latency: %s: G4 unavailable: %s\n", cfg_name[c], res.g4_error);
    rc = 1;
  }
  if (!rc) {
    f->ran = true;
    for (int k = 0; k < KVSIM_W2_CALL_COUNT; k++) {
      summarize(&obs.call[k], k, b->trace, f->stat[k], &f->tail_tokens[k], &f->all_tokens[k]);
      f->calls[k] = obs.call[k].n;
    }
    double nreq = obs.requests ? (double)obs.requests : 1;
    double ptok = res.w1.prompt_tokens ? (double)res.w1.prompt_tokens : 1;
    for (int t = 0; t < KVBM_TIER_COUNT; t++) {
      f->req_share[t] = (double)obs.req_hit[t] / nreq;
      f->tok_share[t] = (double)res.tiers[t].hit_tokens / ptok;
      f->skipped += res.tiers[t].skipped;
    }
    f->nohit_share = (double)obs.req_nohit / nreq;
    f->requests_per_s = res.w1.seconds > 0 ? (double)res.w1.requests / res.w1.seconds : 0;
    f->lookups = res.tiers[KVBM_TIER_G4].lookups;
    f->lookup_timeouts = res.tiers[KVBM_TIER_G4].lookup_timeouts;
    snprintf(f->g3_mode, sizeof f->g3_mode, "%s", res.g3_mode);
    snprintf(f->g4_mode, sizeof f->g4_mode, "%s", res.g4_mode);
  }
  for (int k = 0; k < KVSIM_W2_CALL_COUNT; k++) free(obs.call[k].v);
  if (g3dir[0]) vt_rmrf(g3dir);
  return rc;
}

/* Median and range of one figure over the reps that ran. */
typedef struct spread {
  double med, min, max;
} spread;

static spread spread_of(double *v, int n) {
  spread s = {0, 0, 0};
  if (n < 1) return s;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  s.min = v[0];
  s.max = v[n - 1];
  s.med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

typedef double (*fig_get)(const rep_fig *f, int a, int b);
static double get_stat(const rep_fig *f, int k, int s) { return f->stat[k][s]; }
static double get_req(const rep_fig *f, int t, int unused) {
  (void)unused;
  return t < KVBM_TIER_COUNT ? f->req_share[t] : f->nohit_share;
}
static double get_tok(const rep_fig *f, int t, int unused) {
  (void)unused;
  return f->tok_share[t];
}
static double get_tail(const rep_fig *f, int k, int unused) {
  (void)unused;
  return f->tail_tokens[k];
}
static double get_all(const rep_fig *f, int k, int unused) {
  (void)unused;
  return f->all_tokens[k];
}
static double get_rps(const rep_fig *f, int a, int b) {
  (void)a;
  (void)b;
  return f->requests_per_s;
}

/* The spread of figure get(a, b) of configuration c over the reps. */
static spread over_reps(rep_fig *const figs[], int reps, int c, fig_get get, int a, int b,
                        double *scratch) {
  int n = 0;
  for (int r = 0; r < reps; r++)
    if (figs[r][c].ran) scratch[n++] = get(&figs[r][c], a, b);
  return spread_of(scratch, n);
}

/* Three significant figures or whole units, whichever is longer: the
 * spread between reps is far wider than that. */
static void num(char *out, size_t cap, double v) {
  if (v >= 100) snprintf(out, cap, "%.0f", v);
  else if (v >= 10) snprintf(out, cap, "%.1f", v);
  else snprintf(out, cap, "%.2f", v);
}

static void print_text(rep_fig *const figs[], int reps, const bench *b, const bool skip[NCFG],
                       double *scratch) {
  printf("workload W2: bundled Mooncake trace, first %zu requests, B 16, C1 16384, "
         "256-byte blocks; g4_lookup_max %u; %d rep%s (order rotated)\n",
         b->requests, b->base.g4_lookup_max, reps, reps > 1 ? "s" : "");
  printf("each figure: median [min..max] over the reps; us per call; calls/s = calls / time in "
         "the call\n");
  for (int c = 0; c < NCFG; c++) {
    printf("\n%s", cfg_name[c]);
    if (skip[c]) {
      printf(": skipped (%s not installed)\n", VT_REDIS_SERVER);
      continue;
    }
    const rep_fig *f0 = &figs[0][c];
    if (c >= 1) printf("  [G3 %s]", f0->g3_mode);
    if (c == 2) printf("  [G4 %s]", f0->g4_mode);
    spread rps = over_reps(figs, reps, c, get_rps, 0, 0, scratch);
    printf("  requests/s of the replay %.0f [%.0f..%.0f]\n", rps.med, rps.min, rps.max);
    printf("  %-14s %6s", "call", "calls");
    for (int s = 0; s < NSTAT; s++)
      if (s != 4) printf("  %-22s", stat_name[s]); /* the mean is in the JSON */
    printf("\n");
    for (int i = 0; i < KVSIM_W2_CALL_COUNT; i++) {
      int k = call_order[i];
      char label[32];
      snprintf(label, sizeof label, "%s%s", call_name[k], k == KVSIM_W2_CALL_FLUSH ? " (W2's)" : "");
      printf("  %-14s %6zu", label, f0->calls[k]);
      for (int s = 0; s < NSTAT; s++) {
        if (s == 4) continue;
        spread x = over_reps(figs, reps, c, get_stat, k, s, scratch);
        char a[16], lo[16], hi[16], cell[64];
        num(a, sizeof a, x.med);
        num(lo, sizeof lo, x.min);
        num(hi, sizeof hi, x.max);
        if (reps > 1) snprintf(cell, sizeof cell, "%s [%s..%s]", a, lo, hi);
        else snprintf(cell, sizeof cell, "%s", a);
        printf("  %-22s", cell);
      }
      printf("\n");
    }
    printf("  requests with a hit from:");
    for (int t = 0; t < KVBM_TIER_COUNT; t++)
      printf(" %s %.1f%%", tier_name[t], 100 * over_reps(figs, reps, c, get_req, t, 0, scratch).med);
    printf("; none %.1f%%\n", 100 * over_reps(figs, reps, c, get_req, KVBM_TIER_COUNT, 0, scratch).med);
    printf("  prompt tokens served by:");
    for (int t = 0; t < KVBM_TIER_COUNT; t++)
      printf(" %s %.1f%%", tier_name[t], 100 * over_reps(figs, reps, c, get_tok, t, 0, scratch).med);
    uint64_t skipped = 0, lto = 0;
    for (int r = 0; r < reps; r++) {
      skipped += figs[r][c].skipped;
      lto += figs[r][c].lookup_timeouts;
    }
    printf("\n  skipped offloads %llu, G4 lookup timeouts %llu (all reps)", (unsigned long long)skipped,
           (unsigned long long)lto);
    if (c == 2)
      printf("; G4 lookups (one store round trip each) in %llu of %zu prefills",
             (unsigned long long)f0->lookups, f0->calls[KVSIM_W2_CALL_PREFILL]);
    printf("\n");
    printf("  slowest 1%% of calls, mean tokens of their requests (of all calls):");
    static const kvsim_w2_call why[] = {KVSIM_W2_CALL_PREFILL, KVSIM_W2_CALL_COMMIT};
    for (int i = 0; i < 2; i++)
      printf("%s %s %.0f (%.0f)", i ? ";" : "", call_name[why[i]],
             over_reps(figs, reps, c, get_tail, why[i], 0, scratch).med,
             over_reps(figs, reps, c, get_all, why[i], 0, scratch).med);
    printf("\n");
  }
}

static void json_spread(FILE *o, spread x) {
  fprintf(o, "{\"median\":%.6g,\"min\":%.6g,\"max\":%.6g}", x.med, x.min, x.max);
}

static int write_json(const char *path, rep_fig *const figs[], int reps, const bench *b,
                      const bool skip[NCFG], double *scratch) {
  FILE *o = fopen(path, "w");
  if (!o) {
    fprintf(stderr, "bench_engine_latency: --json %s: %s\n", path, strerror(errno));
    return 1;
  }
  fprintf(o, "{\"workload\":\"W2\",\"requests\":%zu,\"reps\":%d,\"block_size\":16,"
             "\"c1\":16384,\"c2\":262144,\"c3\":1048576,\"block_bytes\":256,"
             "\"g4_lookup_max\":%u,\"configs\":{",
          b->requests, reps, b->base.g4_lookup_max);
  for (int c = 0; c < NCFG; c++) {
    fprintf(o, "%s\"%s\":{\"name\":\"%s\",\"skipped\":%s", c ? "," : "", cfg_key[c], cfg_name[c],
            skip[c] ? "true" : "false");
    if (!skip[c]) {
      fprintf(o, ",\"g3_mode\":\"%s\",\"g4_mode\":\"%s\",\"g4_lookups\":%llu,\"requests_per_s\":",
              figs[0][c].g3_mode, figs[0][c].g4_mode, (unsigned long long)figs[0][c].lookups);
      json_spread(o, over_reps(figs, reps, c, get_rps, 0, 0, scratch));
      fprintf(o, ",\"calls\":{");
      for (int i = 0; i < KVSIM_W2_CALL_COUNT; i++) {
        int k = call_order[i];
        fprintf(o, "%s\"%s\":{\"count\":%zu,\"tokens_mean\":%.6g,\"slowest_1pct_tokens_mean\":", i ? "," : "",
                call_name[k], figs[0][c].calls[k], figs[0][c].all_tokens[k]);
        json_spread(o, over_reps(figs, reps, c, get_tail, k, 0, scratch));
        for (int s = 0; s < NSTAT; s++) {
          fprintf(o, ",\"%s\":", stat_name[s]);
          json_spread(o, over_reps(figs, reps, c, get_stat, k, s, scratch));
        }
        fprintf(o, "}");
      }
      fprintf(o, "},\"request_hit_share\":{");
      for (int t = 0; t <= KVBM_TIER_COUNT; t++) {
        fprintf(o, "%s\"%s\":", t ? "," : "", t < KVBM_TIER_COUNT ? tier_name[t] : "none");
        json_spread(o, over_reps(figs, reps, c, get_req, t, 0, scratch));
      }
      fprintf(o, "},\"token_hit_share\":{");
      for (int t = 0; t < KVBM_TIER_COUNT; t++) {
        fprintf(o, "%s\"%s\":", t ? "," : "", tier_name[t]);
        json_spread(o, over_reps(figs, reps, c, get_tok, t, 0, scratch));
      }
      fprintf(o, "}");
    }
    fprintf(o, "}");
  }
  fprintf(o, "}}\n");
  if (fclose(o) != 0) {
    fprintf(stderr, "bench_engine_latency: --json %s: %s\n", path, strerror(errno));
    return 1;
  }
  return 0;
}

static int usage(void) {
  fprintf(stderr, "usage: bench_engine_latency [TRACE] [--requests N (600)] [--reps R (1)] "
                  "[--dir DIR (/tmp)] [--json FILE] [--g4-lookup-max N (512)]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *trace_path = KVBM_DEFAULT_TRACE, *json = NULL;
  bench b;
  memset(&b, 0, sizeof b);
  b.requests = 600;
  b.dir = "/tmp";
  /* Fixed, not from the environment: the figures must not depend on the
   * caller's KVBM_* variables (as bench_tiers). */
  b.base = kvbm_manager_config_default();
  int reps = 1;
  for (int i = 1; i < argc; i++) {
    char *end = NULL;
    if (!strcmp(argv[i], "--requests") && i + 1 < argc) {
      unsigned long long v = strtoull(argv[++i], &end, 10);
      if (*end || v < 1 || v > 1000000) return usage();
      b.requests = (size_t)v;
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 100) return usage();
      reps = (int)v;
    } else if (!strcmp(argv[i], "--g4-lookup-max") && i + 1 < argc) {
      unsigned long v = strtoul(argv[++i], &end, 10);
      if (*end || v < 1 || v > 65536) return usage();
      b.base.g4_lookup_max = (uint32_t)v;
    } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
      b.dir = argv[++i];
    } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (argv[i][0] != '-') {
      trace_path = argv[i];
    } else {
      return usage();
    }
  }
  if (access(b.dir, W_OK) != 0) {
    fprintf(stderr, "bench_engine_latency: --dir %s is not a writable directory\n", b.dir);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN); /* a store that hangs up is an error, not a death */
  kvbm_error err = {0};
  kvsim_trace *trace;
  if (kvsim_trace_load(trace_path, b.requests, &trace, &err)) {
    fprintf(stderr, "bench_engine_latency: %s: %s\n", trace_path, err.msg);
    return 1;
  }
  b.trace = trace;
  if (kvsim_trace_count(trace) < b.requests) b.requests = kvsim_trace_count(trace);
  bool skip[NCFG] = {false, false, false};
  if (access(VT_REDIS_SERVER, X_OK) != 0) {
    skip[2] = true;
    fprintf(stderr, "bench_engine_latency: %s is not installed: skipping %s\n", VT_REDIS_SERVER,
            cfg_name[2]);
  } else {
    int k = snprintf(b.redis.dir, sizeof b.redis.dir, "%s/kvbm-lat-redis-XXXXXX", b.dir);
    if (k < 0 || (size_t)k >= sizeof b.redis.dir || !mkdtemp(b.redis.dir)) {
      fprintf(stderr, "bench_engine_latency: cannot make a directory under %s\n", b.dir);
      kvsim_trace_destroy(trace);
      return 1;
    }
    if (vt_redis_start(&b.redis) != 0) {
      fprintf(stderr, "bench_engine_latency: redis-server is installed but did not start\n");
      vt_redis_destroy(&b.redis);
      kvsim_trace_destroy(trace);
      return 1;
    }
    snprintf(b.g4_url, sizeof b.g4_url, "redis://127.0.0.1:%d", b.redis.port);
  }
  rep_fig *figs[100];
  double *scratch = calloc((size_t)reps, sizeof *scratch);
  int rc = scratch ? 0 : 1;
  int made = 0;
  for (int r = 0; r < reps && !rc; r++) {
    figs[r] = calloc(NCFG, sizeof(rep_fig));
    if (!figs[r]) {
      rc = 1;
      break;
    }
    made++;
    for (int i = 0; i < NCFG && !rc; i++) {
      int c = (r + i) % NCFG; /* rotated: each configuration takes each place */
      if (skip[c]) continue;
      rc = run_config(&b, c, &figs[r][c]);
    }
  }
  if (!rc) {
    print_text(figs, reps, &b, skip, scratch);
    if (json) rc = write_json(json, figs, reps, &b, skip, scratch);
  }
  for (int r = 0; r < made; r++) free(figs[r]);
  free(scratch);
  if (b.redis.dir[0]) vt_redis_destroy(&b.redis);
  kvsim_trace_destroy(trace);
  return rc;
}
