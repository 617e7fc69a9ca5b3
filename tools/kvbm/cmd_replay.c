/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_replay.c: `kvbm replay`, workload W1 on a trace (the bundled Mooncake
 * conversation trace by default); with --groups, W1-hybrid (issue 20): the
 * trace through one pool shared by a hybrid model's KV cache groups, as
 * vLLM's KVCacheManager runs them (workload/w1h.h). The tier flags select
 * W2 (replay_w2.c), which takes --groups too (the tiered manager with a
 * hybrid model's groups).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "replay_cli.h"
#include "workload/w1.h"
#include "workload/w1h.h"
#include "replay_obs.h"
#include "replay_w2.h"

const char kvbm_cmd_replay_help[] = "replay a request trace through the block manager (W1, W1-hybrid)";

static void usage(FILE *f) { replay_cli_usage(f); }

/* ---- W1-hybrid ---------------------------------------------------------------- */

static bool is_opt(const char *a, const char *opt) {
  size_t n = strlen(opt);
  return !strncmp(a, opt, n) && (a[n] == 0 || a[n] == '=');
}

static bool hybrid_wanted(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (is_opt(argv[i], "--groups") || is_opt(argv[i], "--max-num-batched-tokens") ||
        is_opt(argv[i], "--prefix-cache-retention-interval"))
      return true;
  return false;
}

typedef struct refusals {
  size_t count;
} refusals;

/* The first few refused requests are named on stderr; the count is in the
 * report. */
static void on_refused(void *user, size_t request, const char *why) {
  refusals *r = user;
  if (r->count++ < 5) fprintf(stderr, "kvbm replay: request %zu refused: %s\n", request, why);
}

static void print_list(const uint64_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) printf("%s%llu", i ? "," : "", (unsigned long long)v[i]);
}

static int replay_hybrid(int argc, char **argv) {
  kvsim_w1_config o = kvsim_w1_config_default();
  kvsim_w1h_config h = kvsim_w1h_config_default();
  replay_cli c;
  replay_cli_init(&c);
  const char *groups = NULL;
  h.retention = KVBM_HSEQ_RETAIN_BOUNDARIES; /* vLLM's default, prefix_cache_retention_interval 0 */
  for (int i = 1; i < argc; i++) {
    const char *v;
    uint64_t x;
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if ((r = cli_opt_value("replay", argc, argv, &i, "--groups", &v))) {
      if (r < 0) return 2;
      groups = v;
      continue;
    }
    if ((r = cli_opt_value("replay", argc, argv, &i, "--max-num-batched-tokens", &v))) {
      if (r < 0 || !cli_parse_u64("replay", "--max-num-batched-tokens", v, 1, UINT32_MAX, &x)) return 2;
      h.max_num_batched_tokens = (uint32_t)x;
      continue;
    }
    if ((r = cli_opt_value("replay", argc, argv, &i, "--prefix-cache-retention-interval", &v))) {
      if (r < 0) return 2;
      if (!strcmp(v, "0")) {
        h.retention = KVBM_HSEQ_RETAIN_BOUNDARIES;
      } else if (!strcmp(v, "none") || !strcmp(v, "None")) {
        h.retention = KVBM_HSEQ_RETAIN_ALL;
      } else {
        fprintf(stderr, "kvbm replay: --prefix-cache-retention-interval: '%s': want none (every full "
                        "block cached) or 0 (vLLM's sparse default); other intervals are not modelled\n",
                v);
        return 2;
      }
      continue;
    }
    r = replay_cli_take(argc, argv, &i, &o, &c);
    if (r < 0) return 2;
    if (r == 0) {
      fprintf(stderr, "kvbm replay: '%s' is not supported with --groups (W1-hybrid)\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  kvbm_error err = {0};
  if (!groups) {
    fprintf(stderr, "kvbm replay: --max-num-batched-tokens and --prefix-cache-retention-interval need "
                    "--groups (W1-hybrid)\n");
    return 2;
  }
  if (kvbm_groups_parse(groups, h.groups, KVBM_GROUPS_MAX, &h.num_groups, &err)) {
    fprintf(stderr, "kvbm replay: --groups: %s\n", err.msg);
    return 2;
  }
  if (h.num_groups > o.capacity) {
    fprintf(stderr, "kvbm replay: --groups: %zu groups cannot share a pool of %u blocks\n", h.num_groups,
            o.capacity);
    return 2;
  }
  h.block_size = o.block_size;
  h.capacity = o.capacity;
  h.limit = o.limit;
  h.scheme = o.scheme;
  const char *trace_path = c.trace ? c.trace : KVBM_DEFAULT_TRACE;
  kvsim_trace *trace;
  if (kvsim_trace_load(trace_path, o.limit, &trace, &err)) {
    fprintf(stderr, "kvbm replay: %s: %s\n", trace_path, err.msg);
    return 2;
  }
  refusals ref = {0};
  h.on_refused = on_refused;
  h.refused_user = &ref;
  kvsim_w1h_result res;
  int rc = kvsim_w1h_run(trace, &h, &res, &err);
  kvsim_trace_destroy(trace);
  if (rc) {
    fprintf(stderr, "kvbm replay: %s\n", err.msg);
    return 1;
  }
  char gtext[KVBM_GROUPS_MAX * 24];
  kvbm_groups_format(h.groups, h.num_groups, gtext, sizeof gtext);
  double tps = res.seconds > 0 ? (double)res.prompt_tokens / res.seconds : 0;
  double hit_rate = res.prompt_tokens ? (double)res.hit_tokens / (double)res.prompt_tokens : 0;
  if (c.json) {
    printf("{\"workload\":\"W1-hybrid\",\"trace\":\"%s\",\"groups\":\"%s\",\"block_size\":%u,"
           "\"capacity\":%u,\"max_num_batched_tokens\":%u,\"prefix_cache_retention_interval\":%s,"
           "\"hash\":\"%s\",\"requests\":%llu,"
           "\"prompt_tokens\":%llu,\"hit_tokens\":%llu,\"hit_rate\":%.6f,\"refused\":%llu,"
           "\"blocks_allocated\":%llu,\"blocks_allocated_per_group\":[",
           trace_path, gtext, h.block_size, h.capacity, h.max_num_batched_tokens,
           h.retention == KVBM_HSEQ_RETAIN_BOUNDARIES ? "0" : "null", kvbm_hash_scheme_name(h.scheme), (unsigned long long)res.requests,
           (unsigned long long)res.prompt_tokens, (unsigned long long)res.hit_tokens, hit_rate,
           (unsigned long long)res.refused, (unsigned long long)res.blocks_allocated);
    print_list(res.blocks_allocated_per_group, h.num_groups);
    printf("],\"peak_blocks_held\":%llu,\"peak_blocks_held_per_group\":[",
           (unsigned long long)res.peak_blocks_held);
    print_list(res.peak_blocks_held_per_group, h.num_groups);
    printf("],\"seconds\":%.6f,\"prompt_tokens_per_s\":%.0f}\n", res.seconds, tps);
  } else {
    printf("W1-hybrid replay of %s\n", trace_path);
    printf("  groups %s, block size %u tokens, capacity %u blocks, %s hashes\n", gtext, h.block_size,
           h.capacity, kvbm_hash_scheme_name(h.scheme));
    if (h.max_num_batched_tokens)
      printf("  prefill in chunks of at most %u tokens\n", h.max_num_batched_tokens);
    else
      printf("  prefill in one step\n");
    printf("  prefix-cache retention %s\n",
           h.retention == KVBM_HSEQ_RETAIN_BOUNDARIES ? "sparse (interval 0: window and Mamba blocks at the prompt's end and "
                                "the shared-prefix junction)"
                              : "dense (every full block cached)");
    printf("  requests          %llu (%llu refused: they cannot run in this pool)\n", (unsigned long long)res.requests,
           (unsigned long long)res.refused);
    printf("  prompt tokens     %llu\n", (unsigned long long)res.prompt_tokens);
    printf("  hit tokens        %llu (%.2f%% of prompt tokens)\n", (unsigned long long)res.hit_tokens,
           100 * hit_rate);
    printf("  blocks allocated  %llu (per group ", (unsigned long long)res.blocks_allocated);
    print_list(res.blocks_allocated_per_group, h.num_groups);
    printf(")\n  peak blocks held  %llu (per group ", (unsigned long long)res.peak_blocks_held);
    print_list(res.peak_blocks_held_per_group, h.num_groups);
    printf(")\n  time              %.3f s\n", res.seconds);
    printf("  throughput        %.1f M prompt tokens/s\n", tps / 1e6);
  }
  fflush(stdout);
  return 0;
}

int kvbm_cmd_replay(int argc, char **argv) {
  /* Tiers below G1: W2, which takes --groups too (replay_w2.c). */
  if (replay_w2_wanted(argc, argv)) return replay_w2_main(argc, argv);
  if (hybrid_wanted(argc, argv)) return replay_hybrid(argc, argv);
  kvsim_w1_config o = kvsim_w1_config_default();
  replay_cli c;
  replay_cli_init(&c);
  replay_obs_opts oo;
  if (!replay_obs_opts_init(&oo)) return 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    int r = replay_cli_take(argc, argv, &i, &o, &c);
    if (r == 0) r = replay_obs_take(argc, argv, &i, &oo);
    if (r < 0) return 2;
    if (r == 0) {
      fprintf(stderr, "kvbm replay: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  const char *trace_path = c.trace ? c.trace : KVBM_DEFAULT_TRACE;
  const bool json = c.json;

  kvbm_error err = {0};
  kvsim_trace *trace;
  double t0 = cli_now();
  if (kvsim_trace_load(trace_path, o.limit, &trace, &err)) {
    fprintf(stderr, "kvbm replay: %s: %s\n", trace_path, err.msg);
    return 2;
  }
  double load_s = cli_now() - t0;
  if (c.progress && !json) o.progress = replay_cli_progress;
  oo.trace = trace_path;
  replay_obs *obs;
  if (!replay_obs_create(&oo, false, &obs)) {
    replay_obs_destroy(obs);
    kvsim_trace_destroy(trace);
    return 1;
  }
  replay_obs_w1(obs, &o);
  kvsim_w1_result res;
  int rc = kvsim_w1_run(trace, &o, &res, &err);
  kvsim_trace_destroy(trace);
  if (rc) {
    fprintf(stderr, "kvbm replay: %s\n", err.msg);
    replay_obs_destroy(obs);
    return 1;
  }
  double tps = res.seconds > 0 ? (double)res.prompt_tokens / res.seconds : 0;
  double hit_rate = res.prompt_tokens ? (double)res.hit_tokens / (double)res.prompt_tokens : 0;
  if (json) {
    printf("{\"workload\":\"W1\",\"trace\":\"%s\",\"block_size\":%u,\"capacity\":%u,"
           "\"hash\":\"%s\",\"requests\":%llu,\"prompt_tokens\":%llu,\"hit_tokens\":%llu,"
           "\"hit_rate\":%.6f,\"blocks_allocated\":%llu,\"seconds\":%.6f,"
           "\"prompt_tokens_per_s\":%.0f}\n",
           trace_path, o.block_size, o.capacity, kvbm_hash_scheme_name(o.scheme),
           (unsigned long long)res.requests, (unsigned long long)res.prompt_tokens,
           (unsigned long long)res.hit_tokens, hit_rate, (unsigned long long)res.blocks_allocated,
           res.seconds, tps);
  } else {
    printf("W1 replay of %s\n", trace_path);
    printf("  block size %u tokens, capacity %u blocks, %s hashes\n", o.block_size, o.capacity,
           kvbm_hash_scheme_name(o.scheme));
    printf("  requests          %llu\n", (unsigned long long)res.requests);
    printf("  prompt tokens     %llu\n", (unsigned long long)res.prompt_tokens);
    printf("  hit tokens        %llu (%.2f%% of prompt tokens)\n",
           (unsigned long long)res.hit_tokens, 100 * hit_rate);
    printf("  blocks allocated  %llu\n", (unsigned long long)res.blocks_allocated);
    printf("  time              %.3f s (trace load %.3f s)\n", res.seconds, load_s);
    printf("  throughput        %.1f M prompt tokens/s\n", tps / 1e6);
  }
  fflush(stdout);
  replay_obs_w1_done(obs, &res);
  bool ok = replay_obs_ok(obs);
  replay_obs_destroy(obs);
  return ok ? 0 : 1;
}
