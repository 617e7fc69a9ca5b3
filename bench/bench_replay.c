/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_replay.c: workload W1 on the full bundled trace (block size 16,
 * capacity 16384, native hashes unless --hash dynamo), against its bound.
 *
 * The bound is measured in the same run: making the same tokens from the
 * trace (each request's prompt and output tokens, as the replay makes them)
 * and hashing each of them once into the block hash chain (every full block
 * of prompt + output, as the replay registers them), which any block
 * manager must do. The figure that matters is
 *   ratio = replay time / bound time        (target: <= 1.5, issue 22)
 * and prompt tokens per second (target: >= 100 M/s on one core). Each side
 * runs --repeat times interleaved; the best time of each is kept, since on a
 * shared, noisy machine the minimum is the least disturbed run. Each
 * round's own ratio (bound and replay back to back) is kept too, and given
 * as the median with its least and greatest.
 *
 * The same rounds are also timed on the thread's CPU clock
 * (CLOCK_THREAD_CPUTIME_ID): on a shared 2-core machine at load 10 the
 * replay is often descheduled, and wall time then counts other engineers'
 * work. The CPU ratio (replay CPU / bound CPU of one round, median with its
 * least and greatest) still counts what neighbours do to the caches, but
 * not the time the thread waits for a core. The target is stated on wall
 * time; the CPU ratio is what to compare on a loaded machine.
 *
 * With --oracle the counts are checked against ../shared/tools/ref_replay.py
 * on the same trace (slow: about two minutes for the full trace).
 *
 * The hybrid row (issue 20): W1-hybrid (workload/w1h.h) of a gpt-oss-like
 * model (--groups full,sw:128, prefill in chunks of
 * --max-num-batched-tokens 8192) on the same trace, in the same rounds,
 * against W1's single-group replay:
 *   hybrid ratio = hybrid replay time / W1 replay time   (target: <= 1.5)
 * under vLLM's default retention (prefix_cache_retention_interval 0: a
 * window group caches only the blocks a replay boundary can use), which
 * is `kvbm replay --groups`' default too; --prefix-cache-retention-interval
 * none measures the dense rule (every full block of every group cached).
 * given as the median over rounds with its least and greatest (each round
 * times both back to back, so a noisy neighbour hits both).
 * It is also given on the thread's CPU clock (hybrid CPU / W1 CPU of one
 * round, each with its pool's set-up), the figure to compare on a loaded
 * machine, as for W1 above.
 *
 * usage: bench_replay [TRACE] [--repeat 5] [--hash native|dynamo] [--oracle] [--limit N]
 *                     [--groups LIST] [--max-num-batched-tokens N] [--no-hybrid]
 *                     [--prefix-cache-retention-interval 0|none]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kvbm/group.h"
#include "kvbm/hash.h"
#include "workload/w1.h"
#include "workload/w1h.h"
#include "workload/trace.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This thread's CPU time in seconds (what it ran, not what it waited). */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The bound: make every token the replay makes (prompt and output) and
 * hash it once, into the chain of the request's full blocks. (Until
 * 2026-11-27 it made and hashed the prompt tokens only; the output tokens,
 * 2.8% of the trace's tokens, are made and their full blocks registered by
 * the replay too.) */
static double bound_seconds(const kvsim_trace *t, size_t n, kvbm_hash_scheme scheme,
                            uint32_t bs, uint64_t *sink) {
  size_t max_in, max_out;
  kvsim_trace_max_lengths(t, n, &max_in, &max_out);
  const size_t max_tok = max_in + max_out, max_blocks = max_tok / bs + 1;
  uint32_t *tok = malloc(max_tok * sizeof *tok);
  uint64_t *h = malloc(max_blocks * sizeof *h);
  if (!tok || !h) kvbm_bench_die("bench_replay", "out of memory for the bound");
  double t0 = now();
  for (size_t i = 0; i < n; i++) {
    const kvsim_trace_request *r = kvsim_trace_get(t, i);
    kvsim_trace_prompt_tokens(r, tok);
    kvsim_trace_output_tokens(r, i, tok + r->input_length);
    size_t nb = kvbm_hash_chain(scheme, 0, tok, (size_t)r->input_length + r->output_length, bs, h,
                                max_blocks);
    if (nb) *sink ^= h[nb - 1];
  }
  double s = now() - t0;
  free(tok);
  free(h);
  return s;
}

int main(int argc, char **argv) {
  const char *path = KVBM_DEFAULT_TRACE;
  int repeat = 5, oracle = 0;
  size_t limit = 0;
  kvbm_hash_scheme scheme = KVBM_HASH_NATIVE;
  const char *groups = "full,sw:128";
  uint32_t mbt = 8192;
  int hybrid = 1;
  kvbm_hseq_retention retention = KVBM_HSEQ_RETAIN_BOUNDARIES; /* vLLM's default */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--groups") && i + 1 < argc) groups = argv[++i];
    else if (!strcmp(argv[i], "--max-num-batched-tokens") && i + 1 < argc) mbt = (uint32_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--no-hybrid")) hybrid = 0;
    else if (!strcmp(argv[i], "--prefix-cache-retention-interval") && i + 1 < argc && !strcmp(argv[i + 1], "0"))
      retention = KVBM_HSEQ_RETAIN_BOUNDARIES, i++;
    else if (!strcmp(argv[i], "--prefix-cache-retention-interval") && i + 1 < argc && !strcmp(argv[i + 1], "none"))
      retention = KVBM_HSEQ_RETAIN_ALL, i++;
    else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit = (size_t)atoll(argv[++i]);
    else if (!strcmp(argv[i], "--oracle")) oracle = 1;
    else if (!strcmp(argv[i], "--hash") && i + 1 < argc) {
      if (!kvbm_hash_scheme_parse(argv[++i], &scheme)) return 2;
    } else if (argv[i][0] != '-') path = argv[i];
    else {
      fprintf(stderr, "usage: bench_replay [TRACE] [--repeat N] [--hash native|dynamo] [--oracle] [--limit N]\n"
                      "                    [--groups LIST] [--max-num-batched-tokens N] [--no-hybrid]\n"
                      "                    [--prefix-cache-retention-interval 0|none]\n");
      return 2;
    }
  }
  if (repeat < 1) repeat = 1;
  kvbm_error err = {0};
  kvsim_trace *t;
  if (kvsim_trace_load(path, limit, &t, &err)) {
    fprintf(stderr, "bench_replay: %s\n", err.msg);
    return 1;
  }
  size_t n = kvsim_trace_count(t);
  kvsim_w1_config o = kvsim_w1_config_default();
  o.scheme = scheme;
  kvsim_w1_result res = {0}, r;
  kvsim_w1h_config hc = kvsim_w1h_config_default();
  hc.scheme = scheme;
  hc.max_num_batched_tokens = mbt;
  hc.retention = retention;
  if (hybrid && kvbm_groups_parse(groups, hc.groups, KVBM_GROUPS_MAX, &hc.num_groups, &err))
    kvbm_bench_die("bench_replay", "--groups: %s", err.msg);
  kvsim_w1h_result hres = {0};
  double *hratio = calloc((size_t)repeat, sizeof *hratio);
  double *wratio = calloc((size_t)repeat, sizeof *wratio); /* each round's replay / bound */
  double *cratio = calloc((size_t)repeat, sizeof *cratio); /* the same on the CPU clock */
  double *hcratio = calloc((size_t)repeat, sizeof *hcratio); /* hybrid / W1 on the CPU clock */
  if (!hratio || !wratio || !cratio || !hcratio) kvbm_bench_die("bench_replay", "out of memory");
  double best_replay = 1e30, best_bound = 1e30, best_hybrid = 1e30;
  uint64_t sink = 0;
  for (int k = 0; k < repeat; k++) {
    double c0 = cpu_now();
    double b = bound_seconds(t, n, scheme, o.block_size, &sink);
    double c1 = cpu_now();
    if (b < best_bound) best_bound = b;
    if (kvsim_w1_run(t, &o, &r, &err)) {
      fprintf(stderr, "bench_replay: %s\n", err.msg);
      return 1;
    }
    const double c2 = cpu_now();
    cratio[k] = (c2 - c1) / (c1 - c0); /* both include their buffers' set-up */
    if (r.seconds < best_replay) best_replay = r.seconds;
    wratio[k] = r.seconds / b;
    res = r;
    if (hybrid) {
      const double c3 = cpu_now();
      if (kvsim_w1h_run(t, &hc, &hres, &err)) kvbm_bench_die("bench_replay", "%s", err.msg);
      hcratio[k] = (cpu_now() - c3) / (c2 - c1); /* both with their pool's set-up */
      if (hres.seconds < best_hybrid) best_hybrid = hres.seconds;
      hratio[k] = hres.seconds / r.seconds;
    }
  }
  double tps = (double)res.prompt_tokens / best_replay;
  double ratio = best_replay / best_bound;
  printf("W1 sequential replay, %s, block size %u, capacity %u, %s hashes, %zu requests, best of %d\n",
         path, o.block_size, o.capacity, kvbm_hash_scheme_name(scheme), n, repeat);
  printf("  counts: prompt_tokens %llu hit_tokens %llu blocks_allocated %llu\n",
         (unsigned long long)res.prompt_tokens, (unsigned long long)res.hit_tokens,
         (unsigned long long)res.blocks_allocated);
  printf("  replay      %.3f s  %.1f M prompt tokens/s   (target >= 100)\n", best_replay, tps / 1e6);
  printf("  bound       %.3f s  %.1f M prompt tokens/s   (make + hash each prompt and output token once; %llx)\n",
         best_bound, (double)res.prompt_tokens / best_bound / 1e6, (unsigned long long)(sink & 0xff));
  kvbm_bench_spread ws = kvbm_bench_spread_of(wratio, repeat);
  printf("  ratio       %.2f  replay / bound, best of each (target <= 1.5)\n", ratio);
  printf("  per round   %.2f (%.2f..%.2f over %d rounds)  median replay / bound of one round\n",
         ws.median, ws.min, ws.max, repeat);
  kvbm_bench_spread cs = kvbm_bench_spread_of(cratio, repeat);
  printf("  cpu ratio   %.2f (%.2f..%.2f over %d rounds)  the same on the thread's CPU clock\n",
         cs.median, cs.min, cs.max, repeat);
  printf("{\"workload\":\"W1\",\"requests\":%zu,\"prompt_tokens\":%llu,\"hit_tokens\":%llu,"
         "\"blocks_allocated\":%llu,\"replay_s\":%.4f,\"bound_s\":%.4f,\"ratio\":%.3f,"
         "\"prompt_tokens_per_s\":%.0f,\"ratio_median\":%.3f,\"ratio_min\":%.3f,\"ratio_max\":%.3f,"
         "\"cpu_ratio_median\":%.3f,\"cpu_ratio_min\":%.3f,\"cpu_ratio_max\":%.3f}\n",
         n, (unsigned long long)res.prompt_tokens, (unsigned long long)res.hit_tokens,
         (unsigned long long)res.blocks_allocated, best_replay, best_bound, ratio, tps, ws.median, ws.min,
         ws.max, cs.median, cs.min, cs.max);
  if (hybrid) {
    char gtext[KVBM_GROUPS_MAX * 24];
    kvbm_groups_format(hc.groups, hc.num_groups, gtext, sizeof gtext);
    kvbm_bench_spread hs = kvbm_bench_spread_of(hratio, repeat);
    const bool sparse = retention == KVBM_HSEQ_RETAIN_BOUNDARIES;
    printf("W1-hybrid, groups %s, prefill chunks of %u tokens (0: one step), %s, same trace and rounds\n",
           gtext, mbt,
           sparse ? "prefix_cache_retention_interval 0 (vLLM's default: window blocks cached at the "
                    "replay boundaries only)"
                  : "prefix_cache_retention_interval None (dense: every full block cached)");
    printf("  counts: hit_tokens %llu blocks_allocated %llu refused %llu peak_blocks_held %llu\n",
           (unsigned long long)hres.hit_tokens, (unsigned long long)hres.blocks_allocated,
           (unsigned long long)hres.refused, (unsigned long long)hres.peak_blocks_held);
    printf("  hybrid      %.3f s  %.1f M prompt tokens/s\n", best_hybrid,
           (double)hres.prompt_tokens / best_hybrid / 1e6);
    printf("  hybrid ratio %.2f (%.2f..%.2f over %d rounds)  hybrid / W1 replay   (target <= 1.5)\n",
           hs.median, hs.min, hs.max, repeat);
    kvbm_bench_spread hcs = kvbm_bench_spread_of(hcratio, repeat);
    printf("  cpu ratio    %.2f (%.2f..%.2f over %d rounds)  the same on the thread's CPU clock\n",
           hcs.median, hcs.min, hcs.max, repeat);
    printf("{\"workload\":\"W1-hybrid\",\"groups\":\"%s\",\"max_num_batched_tokens\":%u,"
           "\"prefix_cache_retention_interval\":%s,\"hit_tokens\":%llu,\"blocks_allocated\":%llu,"
           "\"refused\":%llu,\"hybrid_s\":%.4f,"
           "\"w1_s\":%.4f,\"ratio_median\":%.3f,\"ratio_min\":%.3f,\"ratio_max\":%.3f,"
           "\"cpu_ratio_median\":%.3f,\"cpu_ratio_min\":%.3f,\"cpu_ratio_max\":%.3f}\n",
           gtext, mbt, sparse ? "0" : "null", (unsigned long long)hres.hit_tokens,
           (unsigned long long)hres.blocks_allocated, (unsigned long long)hres.refused, best_hybrid, best_replay, hs.median, hs.min, hs.max, hcs.median,
           hcs.min, hcs.max);
  }
  free(hratio);
  free(wratio);
  free(cratio);
  free(hcratio);
  int rc = 0;
  if (oracle) {
    char cmd[4096];
    /* the oracle reads plain JSON lines: decompress to a temporary file */
    snprintf(cmd, sizeof cmd,
             "f=$(mktemp) && zcat -f '%s' > \"$f\" && /usr/bin/python3 '%s/tools/ref_replay.py' \"$f\" --limit %zu; rm -f \"$f\"",
             path, KVBM_SHARED_DIR, limit);
    FILE *p = popen(cmd, "r");
    char line[1024] = {0};
    if (!p || !fgets(line, sizeof line, p)) {
      fprintf(stderr, "bench_replay: the oracle did not run\n");
      return 1;
    }
    pclose(p);
    unsigned long long req, pt, ht, ba;
    if (sscanf(line, "{\"requests\": %llu, \"prompt_tokens\": %llu, \"hit_tokens\": %llu, \"blocks_allocated\": %llu",
               &req, &pt, &ht, &ba) != 4) {
      fprintf(stderr, "bench_replay: cannot read the oracle's output: %s", line);
      return 1;
    }
    int same = req == n && pt == res.prompt_tokens && ht == res.hit_tokens && ba == res.blocks_allocated;
    printf("  oracle      %s (%s)", same ? "counts equal" : "COUNTS DIFFER", line);
    rc = !same;
  }
  kvsim_trace_destroy(t);
  return rc;
}
