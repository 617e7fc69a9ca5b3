/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_route_sim.c: `kvbm route-sim`, workload W3 (KV-aware routing over N
 * W1 caches) on a trace, the bundled Mooncake conversation trace by default.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvbm/router.h"
#include "workload/w3.h"

const char kvbm_cmd_route_sim_help[] = "simulate KV-aware routing over N workers (W3)";

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvbm route-sim [TRACE] [--workers 8] [--capacity 16384] [--block-size 16]\n"
          "                      [--limit N] [--hash native|dynamo] [--recompute native|dynamo]\n"
          "                      [--active-ms 10000] [--load blocks|requests] [--load-weight 1]\n"
          "                      [--prefill-weight 1] [--temperature 0] [--seed 1]\n"
          "                      [--restart-at N [--snapshot FILE]] [--json] [--no-progress]\n"
          "Every worker is a W1 cache of --capacity blocks publishing KV events; the\n"
          "router sees only those events (through the vLLM msgpack codec). Prints hit\n"
          "tokens for kv-aware, random, round-robin and the ideal router that reads the\n"
          "caches, and how often the event-fed index disagreed with the caches.\n"
          "--recompute S: the index keys blocks by hashes it computes from the events'\n"
          "token ids in scheme S (instead of the workers' hashes).\n"
          "--active-ms T: load model; a request counts as active on its worker for T ms\n"
          "of trace time (default 10000; 0: no load term, every request then goes\n"
          "where its longest prefix is, which piles the trace onto one worker).\n"
          "--restart-at N: the router restarts warm before request N: its index is\n"
          "saved (to --snapshot FILE, or in memory), dropped and loaded back, each\n"
          "worker's last batch comes again (and must be skipped); at the end the index\n"
          "must equal, byte for byte, one that never stopped (exit 1 otherwise).\n"
          "TRACE: Mooncake JSON lines, plain or .gz; default %s\n",
          KVBM_DEFAULT_TRACE);
}

static void progress_bar(void *user, size_t done, size_t total) {
  (void)user;
  int width = 40, filled = total ? (int)((double)done / (double)total * width) : width;
  fprintf(stderr, "\r  [%.*s%*s] %zu/%zu", filled, "========================================",
          width - filled, "", done, total);
  if (done == total) fputc('\n', stderr);
  fflush(stderr);
}

static int parse(int argc, char **argv, kvsim_w3_config *o, const char **trace, bool *json,
                 bool *progress) {
  const char *v;
  uint64_t x;
  double d;
  for (int i = 1; i < argc; i++) {
    int r;
#define U64(name, lo, hi, dst)                                                       \
  if ((r = cli_opt_value("route-sim", argc, argv, &i, name, &v))) {                 \
    if (r < 0 || !cli_parse_u64("route-sim", name, v, lo, hi, &x)) return 2;         \
    dst = x;                                                                         \
    continue;                                                                        \
  }
#define DBL(name, lo, hi, dst)                                                       \
  if ((r = cli_opt_value("route-sim", argc, argv, &i, name, &v))) {                 \
    if (r < 0 || !cli_parse_double("route-sim", name, v, lo, hi, &d)) return 2;      \
    dst = d;                                                                         \
    continue;                                                                        \
  }
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      *json = true;
      continue;
    }
    if (!strcmp(argv[i], "--no-progress")) {
      *progress = false;
      continue;
    }
    U64("--workers", 1, KVBM_ROUTER_MAX_WORKERS, o->workers)
    U64("--capacity", 1, KVBM_POOL_MAX_BLOCKS, o->capacity)
    U64("--block-size", 1, KVBM_POOL_MAX_BLOCK_SIZE, o->block_size)
    U64("--limit", 0, SIZE_MAX, o->limit)
    U64("--seed", 0, UINT64_MAX, o->seed)
    U64("--restart-at", 1, SIZE_MAX, o->restart_at)
    if ((r = cli_opt_value("route-sim", argc, argv, &i, "--snapshot", &v))) {
      if (r < 0) return 2;
      o->snapshot_path = v;
      continue;
    }
    DBL("--active-ms", 0, 1e12, o->active_ms)
    DBL("--load-weight", 0, 1e12, o->choice.load_weight)
    DBL("--prefill-weight", 0, 1e12, o->choice.prefill_weight)
    DBL("--temperature", 0, 1e6, o->choice.temperature)
#define SCHEME(name, dst, extra)                                                     \
  if ((r = cli_opt_value("route-sim", argc, argv, &i, name, &v))) {                 \
    if (r < 0 || !kvbm_hash_scheme_parse(v, &dst)) {                                 \
      fprintf(stderr, "kvbm route-sim: %s: '%s' is not native or dynamo\n", name,     \
              r < 0 ? "" : v);                                                       \
      return 2;                                                                      \
    }                                                                                \
    extra;                                                                           \
    continue;                                                                        \
  }
    SCHEME("--hash", o->scheme, (void)0)
    SCHEME("--recompute", o->index_scheme, o->recompute = true)
#undef SCHEME
    if ((r = cli_opt_value("route-sim", argc, argv, &i, "--load", &v))) {
      if (r < 0) return 2;
      if (!strcmp(v, "blocks")) o->choice.load_kind = KVBM_LOAD_BLOCKS;
      else if (!strcmp(v, "requests")) o->choice.load_kind = KVBM_LOAD_REQUESTS;
      else {
        fprintf(stderr, "kvbm route-sim: --load: '%s' is not blocks or requests\n", v);
        return 2;
      }
      continue;
    }
#undef U64
#undef DBL
    if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "kvbm route-sim: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
    if (*trace) {
      fprintf(stderr, "kvbm route-sim: more than one trace given\n");
      return 2;
    }
    *trace = argv[i];
  }
  return -1;
}

static void policy_json(const char *name, const kvsim_w3_policy *p, bool comma) {
  printf("\"%s\":{\"hit_tokens\":%llu,\"prompt_tokens\":%llu,\"hit_rate\":%.6f,"
         "\"seconds\":%.6f}%s",
         name, (unsigned long long)p->hit_tokens, (unsigned long long)p->prompt_tokens,
         p->prompt_tokens ? (double)p->hit_tokens / (double)p->prompt_tokens : 0, p->seconds,
         comma ? "," : "");
}

static void policy_line(const char *name, const kvsim_w3_policy *p, const kvsim_w3_policy *ideal) {
  printf("  %-12s %12llu hit tokens  %6.2f%% of prompt tokens  %6.2f%% of ideal\n", name,
         (unsigned long long)p->hit_tokens,
         p->prompt_tokens ? 100.0 * (double)p->hit_tokens / (double)p->prompt_tokens : 0,
         ideal->hit_tokens ? 100.0 * (double)p->hit_tokens / (double)ideal->hit_tokens : 100.0);
}

int kvbm_cmd_route_sim(int argc, char **argv) {
  kvsim_w3_config o = kvsim_w3_config_default();
  const char *trace_path = NULL;
  bool json = false, progress = isatty(STDERR_FILENO);
  int rc = parse(argc, argv, &o, &trace_path, &json, &progress);
  if (rc >= 0) return rc;
  if (!trace_path) trace_path = KVBM_DEFAULT_TRACE;
  kvbm_error err = {0};
  kvsim_trace *trace;
  if (kvsim_trace_load(trace_path, o.limit, &trace, &err)) {
    fprintf(stderr, "kvbm route-sim: %s: %s\n", trace_path, err.msg);
    return 2;
  }
  if (progress && !json) o.progress = progress_bar;
  kvsim_w3_result r;
  rc = kvsim_w3_run(trace, &o, &r, &err);
  kvsim_trace_destroy(trace);
  if (rc) {
    fprintf(stderr, "kvbm route-sim: %s\n", err.msg);
    return rc == KVBM_EINVAL ? 2 : 1;
  }
  double ops = r.index_seconds > 0 ? (double)(r.events + r.lookups) / r.index_seconds : 0;
  /* an inexact index, or a restarted one that differs, is a failure */
  int status = r.index_mismatches || (r.restarted && !r.restart_equal) ? 1 : 0;
  if (json) {
    printf("{\"workload\":\"W3\",\"trace\":\"%s\",\"workers\":%u,\"capacity\":%u,"
           "\"block_size\":%u,\"hash\":\"%s\",\"index_keys\":\"%s\",\"active_ms\":%g,"
           "\"requests\":%llu,",
           trace_path, o.workers, o.capacity, o.block_size, kvbm_hash_scheme_name(o.scheme),
           o.recompute ? kvbm_hash_scheme_name(o.index_scheme) : "engine", o.active_ms,
           (unsigned long long)r.kv_aware.requests);
    policy_json("kv_aware", &r.kv_aware, true);
    policy_json("random", &r.random, true);
    policy_json("round_robin", &r.round_robin, true);
    policy_json("ideal", &r.ideal, true);
    printf("\"index_mismatches\":%llu,\"lookups\":%llu,\"events\":%llu,\"event_bytes\":%llu,"
           "\"index_seconds\":%.6f,\"index_ops_per_s\":%.0f",
           (unsigned long long)r.index_mismatches, (unsigned long long)r.lookups,
           (unsigned long long)r.events, (unsigned long long)r.event_bytes, r.index_seconds,
           ops);
    if (r.restarted)
      printf(",\"restart\":{\"at\":%zu,\"snapshot_bytes\":%llu,\"redelivered\":%llu,"
             "\"redelivered_skipped\":%llu,\"equal_to_unstopped\":%s}",
             o.restart_at, (unsigned long long)r.snapshot_bytes,
             (unsigned long long)r.redelivered, (unsigned long long)r.redelivered_skipped,
             r.restart_equal ? "true" : "false");
    printf("}\n");
    return status;
  }
  printf("W3 routing simulation of %s\n", trace_path);
  printf("  %u workers x %u blocks of %u tokens, %s hashes, index keyed by %s%s\n", o.workers,
         o.capacity, o.block_size, kvbm_hash_scheme_name(o.scheme),
         o.recompute ? kvbm_hash_scheme_name(o.index_scheme) : "the workers'",
         o.recompute ? " hashes recomputed from tokens" : " hashes");
  printf("  %llu requests, %llu prompt tokens; load model: %s\n",
         (unsigned long long)r.kv_aware.requests, (unsigned long long)r.kv_aware.prompt_tokens,
         o.active_ms > 0 ? "active for --active-ms of trace time" : "none");
  policy_line("kv-aware", &r.kv_aware, &r.ideal);
  policy_line("random", &r.random, &r.ideal);
  policy_line("round-robin", &r.round_robin, &r.ideal);
  policy_line("ideal", &r.ideal, &r.ideal);
  printf("  index: %llu events (%.1f MB msgpack), %llu lookups, %llu mismatches with the caches\n",
         (unsigned long long)r.events, (double)r.event_bytes / 1e6,
         (unsigned long long)r.lookups, (unsigned long long)r.index_mismatches);
  printf("  index time %.3f s: %.1f M events+lookups/s (lookups include long prefixes)\n",
         r.index_seconds, ops / 1e6);
  if (r.restarted)
    printf("  warm restart before request %zu: snapshot %.1f MB, %llu of %llu redelivered "
           "batches skipped, final index %s the never-stopped one\n",
           o.restart_at, (double)r.snapshot_bytes / 1e6, (unsigned long long)r.redelivered_skipped,
           (unsigned long long)r.redelivered, r.restart_equal ? "equal to" : "DIFFERENT from");
  return status;
}
