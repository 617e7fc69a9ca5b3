/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_replay.c: `kvbm replay`, workload W1 on a trace (the bundled Mooncake
 * conversation trace by default).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "replay_cli.h"
#include "workload/w1.h"
#include "replay_obs.h"
#include "replay_w2.h"

const char kvbm_cmd_replay_help[] = "replay a request trace through the block manager (W1)";

static void usage(FILE *f) { replay_cli_usage(f); }

int kvbm_cmd_replay(int argc, char **argv) {
  if (replay_w2_wanted(argc, argv)) return replay_w2_main(argc, argv); /* W2: tier flags */
  kvbm_w1_config o = kvbm_w1_config_default();
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
  kvbm_trace *trace;
  double t0 = cli_now();
  if (kvbm_trace_load(trace_path, o.limit, &trace, &err)) {
    fprintf(stderr, "kvbm replay: %s: %s\n", trace_path, err.msg);
    return 2;
  }
  double load_s = cli_now() - t0;
  if (c.progress && !json) o.progress = replay_cli_progress;
  oo.trace = trace_path;
  replay_obs *obs;
  if (!replay_obs_create(&oo, false, &obs)) {
    replay_obs_destroy(obs);
    kvbm_trace_destroy(trace);
    return 1;
  }
  replay_obs_w1(obs, &o);
  kvbm_w1_result res;
  int rc = kvbm_w1_run(trace, &o, &res, &err);
  kvbm_trace_destroy(trace);
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
