/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay_w2.c: `kvbm replay --g2-blocks N --g3-blocks N --g4 URL ...`,
 * workload W2 (the tiered manager's replay, src/workload/w2.c). Any tier
 * flag, or an environment that configures a tier below G1 (Dynamo's
 * DYN_KVBM_* names, kvbm's KVBM_* ones: kvbm_manager_config_env), selects
 * W2; without either, cmd_replay.c runs W1 unchanged. The environment
 * gives the defaults and the flags override it. W1's flags keep their
 * meaning (--capacity is G1's size) and --json keeps W1's keys.
 *
 * --groups LIST (W1-hybrid's parser, kvbm_groups_parse: the same list, the
 * same refusals) makes the W2 run a hybrid model's (workload/w2.h): the
 * report adds the group list and, per group, the hit's blocks, the
 * onboards and the peak of G1 blocks one request held.
 */
#include "replay_w2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common/tier.h"
#include "replay_cli.h"
#include "replay_obs.h"
#include "workload/w2.h"

/* W2 reports every tier, G1..G4. */
#define W2_TIERS KVBM_TIER_COUNT

static const char *const w2_flags[] = {
    "--g2-blocks", "--g3-blocks", "--g3-dir",    "--block-bytes", "--g2-policy",  "--g3-policy",
    "--g3-buffered", "--g1-memory", "--g4",      "--g4-blocks",   "--g4-policy",  "--model-id",
    "--g4-lookup-ms", "--g4-key-file"};

bool replay_w2_wanted(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    for (size_t f = 0; f < sizeof w2_flags / sizeof *w2_flags; f++) {
      size_t n = strlen(w2_flags[f]);
      if (!strncmp(argv[i], w2_flags[f], n) && (argv[i][n] == 0 || argv[i][n] == '=')) return true;
    }
  /* The environment configures a tier below G1 (or says something wrong,
   * which W2 reports). */
  kvbm_manager_config c = kvbm_manager_config_default();
  if (kvbm_manager_config_env(&c, NULL, NULL)) return true;
  return c.g2_blocks || c.g3_blocks || c.g4_url;
}

static void usage(FILE *f) { replay_cli_usage(f); }

static bool policy_opt(const char *opt, const char *v, kvbm_offload_policy *p) {
  if (kvbm_offload_policy_parse(v, p)) return true;
  fprintf(stderr, "kvbm replay: %s: '%s' is not all, frequency or never\n", opt, v);
  return false;
}

static double gbps(uint64_t bytes, double s) { return s > 0 ? (double)bytes / s / 1e9 : 0; }

static uint64_t skipped_total(const kvsim_w2_result *r) {
  uint64_t n = 0;
  for (int t = 0; t < W2_TIERS; t++) n += r->tiers[t].skipped;
  return n;
}

/* With groups: the list and each group's counts. */
static void print_groups_json(const kvsim_w2_config *o, const kvsim_w2_result *r) {
  if (!o->num_groups) return;
  char list[256];
  kvbm_groups_format(o->groups, o->num_groups, list, sizeof list);
  printf(",\"groups\":\"%s\",\"per_group\":[", list);
  for (size_t g = 0; g < o->num_groups; g++)
    printf("%s{\"hit_blocks\":%llu,\"onboarded_blocks\":%llu,\"peak_blocks_held\":%llu}", g ? "," : "",
           (unsigned long long)r->groups[g].hit_blocks, (unsigned long long)r->groups[g].onboarded_blocks,
           (unsigned long long)r->groups[g].peak_held);
  printf("]");
}

static void print_json(const char *trace, const kvsim_w2_config *o,
                       const kvsim_w2_result *r) {
  double tps = r->w1.seconds > 0 ? (double)r->w1.prompt_tokens / r->w1.seconds : 0;
  double rate = r->w1.prompt_tokens ? (double)r->w1.hit_tokens / (double)r->w1.prompt_tokens : 0;
  printf("{\"workload\":\"W2\",\"trace\":\"%s\",\"block_size\":%u,\"capacity\":%u,"
         "\"hash\":\"%s\",\"requests\":%llu,\"prompt_tokens\":%llu,\"hit_tokens\":%llu,"
         "\"hit_rate\":%.6f,\"blocks_allocated\":%llu,\"seconds\":%.6f,"
         "\"prompt_tokens_per_s\":%.0f,\"g2_blocks\":%u,\"g3_blocks\":%llu,\"block_bytes\":%llu,"
         "\"g2_policy\":\"%s\",\"g3_policy\":\"%s\",\"g3_mode\":\"%s\",\"g4_url\":\"%s\","
         "\"g4_blocks\":%u,\"g4_policy\":\"%s\",\"skipped_offloads\":%llu,\"tiers\":{",
         trace, o->w1.block_size, o->w1.capacity, kvbm_hash_scheme_name(o->w1.scheme),
         (unsigned long long)r->w1.requests, (unsigned long long)r->w1.prompt_tokens,
         (unsigned long long)r->w1.hit_tokens, rate, (unsigned long long)r->w1.blocks_allocated,
         r->w1.seconds, tps, o->g2_blocks, (unsigned long long)o->g3_blocks,
         (unsigned long long)o->block_bytes, kvbm_offload_policy_name(o->g2_policy),
         kvbm_offload_policy_name(o->g3_policy), r->g3_mode, r->g4_mode, o->g4_url ? o->g4_blocks : 0,
         kvbm_offload_policy_name(o->g4_policy), (unsigned long long)skipped_total(r));
  for (int t = 0; t < W2_TIERS; t++) {
    const kvsim_w2_tier *x = &r->tiers[t];
    printf("%s\"%s\":{\"hit_tokens\":%llu,\"offloaded_blocks\":%llu,\"offloaded_bytes\":%llu,"
           "\"onboarded_blocks\":%llu,\"onboarded_bytes\":%llu,\"skipped_offloads\":%llu,"
           "\"checksum_failures\":%llu,\"auth_failures\":%llu,\"onboard_failures\":%llu,\"missing\":%llu,"
           "\"foreign\":%llu,\"lookups\":%llu,\"lookup_found\":%llu,\"lookup_timeouts\":%llu,"
           "\"lookup_errors\":%llu,\"evictions\":%llu,\"copy_seconds\":%.6f,"
           "\"copy_gb_per_s\":%.3f}",
           t ? "," : "", kvbm__tier_key(t), (unsigned long long)x->hit_tokens,
           (unsigned long long)x->offloaded_blocks, (unsigned long long)x->offloaded_bytes,
           (unsigned long long)x->onboarded_blocks, (unsigned long long)x->onboarded_bytes,
           (unsigned long long)x->skipped, (unsigned long long)x->checksum_failures,
           (unsigned long long)x->auth_failures, (unsigned long long)x->onboard_failures, (unsigned long long)x->missing,
           (unsigned long long)x->foreign, (unsigned long long)x->lookups,
           (unsigned long long)x->lookup_found, (unsigned long long)x->lookup_timeouts,
           (unsigned long long)x->lookup_errors, (unsigned long long)x->evictions, x->busy_seconds,
           gbps(x->offloaded_bytes + x->onboarded_bytes, x->busy_seconds));
  }
  printf("},\"verify_failures\":%llu", (unsigned long long)r->verify_failures);
  print_groups_json(o, r);
  printf("}\n");
}

static void print_text(const char *trace, const kvsim_w2_config *o,
                       const kvsim_w2_result *r) {
  double rate = r->w1.prompt_tokens ? (double)r->w1.hit_tokens / (double)r->w1.prompt_tokens : 0;
  printf("W2 replay of %s\n", trace);
  printf("  block size %u tokens, %llu bytes; G1 %u, G2 %u, G3 %llu blocks; %s hashes\n",
         o->w1.block_size, (unsigned long long)o->block_bytes, o->w1.capacity, o->g2_blocks,
         (unsigned long long)o->g3_blocks, kvbm_hash_scheme_name(o->w1.scheme));
  printf("  policies          G2 %s, G3 %s, G4 %s; G3 I/O %s\n",
         kvbm_offload_policy_name(o->g2_policy), kvbm_offload_policy_name(o->g3_policy),
         kvbm_offload_policy_name(o->g4_policy), r->g3_mode[0] ? r->g3_mode : "-");
  if (o->g4_url)
    printf("  G4                %s, index of %u blocks\n", r->g4_mode[0] ? r->g4_mode : "-",
           o->g4_blocks);
  if (r->g3_error[0]) printf("  G3 unavailable    %s\n", r->g3_error);
  if (r->g4_error[0]) printf("  G4 unavailable    %s\n", r->g4_error);
  printf("  requests          %llu\n", (unsigned long long)r->w1.requests);
  printf("  prompt tokens     %llu\n", (unsigned long long)r->w1.prompt_tokens);
  printf("  hit tokens        %llu (%.2f%% of prompt tokens)\n",
         (unsigned long long)r->w1.hit_tokens, 100 * rate);
  for (int t = 0; t < W2_TIERS; t++) {
    const kvsim_w2_tier *x = &r->tiers[t];
    if (t == KVBM_TIER_G4 && !o->g4_url) continue;
    printf("    %s              %llu hit tokens, %llu offloaded, %llu onboarded, %llu skipped,"
           " %llu evicted",
           kvbm_tier_name(t), (unsigned long long)x->hit_tokens,
           (unsigned long long)x->offloaded_blocks, (unsigned long long)x->onboarded_blocks,
           (unsigned long long)x->skipped, (unsigned long long)x->evictions);
    if (t) printf(", copies %.2f GB/s", gbps(x->offloaded_bytes + x->onboarded_bytes, x->busy_seconds));
    if (x->onboard_failures)
      printf(", %llu failed onboards (%llu missing, %llu foreign, %llu bad checksums, %llu not "
             "authenticated)",
             (unsigned long long)x->onboard_failures, (unsigned long long)x->missing,
             (unsigned long long)x->foreign, (unsigned long long)x->checksum_failures,
             (unsigned long long)x->auth_failures);
    if (x->lookups)
      printf(", %llu lookups found %llu blocks (%llu late, %llu failed)",
             (unsigned long long)x->lookups, (unsigned long long)x->lookup_found,
             (unsigned long long)x->lookup_timeouts, (unsigned long long)x->lookup_errors);
    printf("\n");
  }
  printf("  skipped copies    %llu\n", (unsigned long long)skipped_total(r));
  printf("  verify failures   %llu\n", (unsigned long long)r->verify_failures);
  printf("  blocks allocated  %llu\n", (unsigned long long)r->w1.blocks_allocated);
  if (o->num_groups) {
    char list[256];
    kvbm_groups_format(o->groups, o->num_groups, list, sizeof list);
    printf("  groups            %s\n", list);
    for (size_t g = 0; g < o->num_groups; g++)
      printf("    group %zu (%s): %llu hit blocks, %llu onboarded, peak %llu G1 blocks held\n", g,
             kvbm_group_kind_name(o->groups[g].kind), (unsigned long long)r->groups[g].hit_blocks,
             (unsigned long long)r->groups[g].onboarded_blocks, (unsigned long long)r->groups[g].peak_held);
  }
  printf("  time              %.3f s\n", r->w1.seconds);
}

/* The environment's settings are W2's defaults (flags override them). */
static bool from_env(kvsim_w2_config *o, kvbm_manager_config *base) {
  *base = kvbm_manager_config_default();
  kvbm_error err = {0};
  if (kvbm_manager_config_env(base, NULL, &err)) {
    fprintf(stderr, "kvbm replay: %s\n", err.msg);
    return false;
  }
  o->base = base;
  o->g2_blocks = base->g2_blocks;
  o->g3_blocks = base->g3_blocks;
  o->g3_dir = base->g3_dir;
  o->g3_direct = base->g3_direct;
  o->g2_policy = base->g2_policy;
  o->g3_policy = base->g3_policy;
  o->g4_url = base->g4_url;
  o->g4_blocks = base->g4_blocks;
  o->g4_policy = base->g4_policy;
  o->model_id = base->model_id;
  o->g4_key_file = base->g4_key_file; /* KVBM_G4_KEY_FILE */
  o->g4_key = base->g4_key;           /* DYN_KVBM_G4_KEY */
  o->g4_key_len = base->g4_key_len;
  if (getenv("KVBM_G4_LOOKUP_TIMEOUT_MS")) o->g4_lookup_timeout_ms = base->g4_lookup_timeout_ms;
  return true;
}

typedef struct print_ctx {
  const char *trace;
  const kvsim_w2_config *o;
  bool json;
} print_ctx;

/* The summary, from inside the run when an observer holds the manager
 * (its endpoint then still serves the same numbers). */
static void print_summary(void *user, const kvsim_w2_result *res) {
  const print_ctx *p = user;
  if (p->json) print_json(p->trace, p->o, res);
  else print_text(p->trace, p->o, res);
  fflush(stdout);
}

int replay_w2_main(int argc, char **argv) {
  kvsim_w2_config o = kvsim_w2_config_default();
  kvbm_manager_config base;
  if (!from_env(&o, &base)) return 2;
  replay_cli c;
  replay_cli_init(&c);
  replay_obs_opts oo;
  if (!replay_obs_opts_init(&oo)) return 2;
  const char *v;
  uint64_t x;
  kvbm_group_spec groups[KVBM_GROUPS_MAX];
  for (int i = 1; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--groups", &v))) {
      kvbm_error gerr = {0};
      if (r < 0) return 2;
      if (kvbm_groups_parse(v, groups, KVBM_GROUPS_MAX, &o.num_groups, &gerr)) {
        fprintf(stderr, "kvbm replay: --groups: %s\n", gerr.msg);
        return 2;
      }
      o.groups = groups;
    } else if ((r = replay_cli_take(argc, argv, &i, &o.w1, &c)) ||
               (r = replay_obs_take(argc, argv, &i, &oo))) {
      if (r < 0) return 2;
    } else if (!strcmp(argv[i], "--g3-buffered")) {
      o.g3_direct = false;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g2-blocks", &v))) {
      if (r < 0 || !cli_parse_u64("replay", "--g2-blocks", v, 0, KVBM_POOL_MAX_BLOCKS, &x)) return 2;
      o.g2_blocks = (uint32_t)x;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g3-blocks", &v))) {
      if (r < 0 || !cli_parse_u64("replay", "--g3-blocks", v, 0, KVBM_POOL_MAX_BLOCKS, &x)) return 2;
      o.g3_blocks = x;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--block-bytes", &v))) {
      if (r < 0 || !cli_parse_u64("replay", "--block-bytes", v, 16, 1u << 30, &x)) return 2;
      if (x % 16) {
        fprintf(stderr, "kvbm replay: --block-bytes: %llu is not a multiple of 16\n",
                (unsigned long long)x);
        return 2;
      }
      o.block_bytes = x;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g1-memory", &v))) {
      if (r < 0) return 2;
      if (!strcmp(v, "system")) o.g1_memory = KVBM_MEMORY_SYSTEM;
      else if (!strcmp(v, "pinned")) o.g1_memory = KVBM_MEMORY_PINNED;
      else if (!strcmp(v, "device")) o.g1_memory = KVBM_MEMORY_DEVICE;
      else {
        fprintf(stderr, "kvbm replay: --g1-memory: '%s' is not system, pinned or device\n", v);
        return 2;
      }
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g3-dir", &v))) {
      if (r < 0) return 2;
      o.g3_dir = v;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g2-policy", &v))) {
      if (r < 0 || !policy_opt("--g2-policy", v, &o.g2_policy)) return 2;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g3-policy", &v))) {
      if (r < 0 || !policy_opt("--g3-policy", v, &o.g3_policy)) return 2;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g4-policy", &v))) {
      if (r < 0 || !policy_opt("--g4-policy", v, &o.g4_policy)) return 2;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g4-blocks", &v))) {
      if (r < 0 || !cli_parse_u64("replay", "--g4-blocks", v, 1, KVBM_POOL_MAX_BLOCKS, &x)) return 2;
      o.g4_blocks = (uint32_t)x;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g4-lookup-ms", &v))) {
      if (r < 0 || !cli_parse_u64("replay", "--g4-lookup-ms", v, 0, 3600000, &x)) return 2;
      o.g4_lookup_timeout_ms = (int32_t)x;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g4-key-file", &v))) {
      if (r < 0) return 2;
      o.g4_key_file = v; /* a path only: a secret in argv is visible to every user */
      o.g4_key = NULL;
      o.g4_key_len = 0;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--g4", &v))) {
      if (r < 0) return 2;
      o.g4_url = v;
    } else if ((r = cli_opt_value("replay", argc, argv, &i, "--model-id", &v))) {
      if (r < 0) return 2;
      o.model_id = v;
    } else {
      fprintf(stderr, "kvbm replay: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  const char *trace_path = c.trace ? c.trace : KVBM_DEFAULT_TRACE;
  const bool json = c.json;
  if (o.num_groups > o.w1.capacity) {
    fprintf(stderr, "kvbm replay: --groups: %zu groups cannot share a G1 of %u blocks\n", o.num_groups,
            o.w1.capacity);
    return 2;
  }
  if (o.g3_dir && access(o.g3_dir, W_OK) != 0) {
    fprintf(stderr, "kvbm replay: --g3-dir: %s is not a writable directory\n", o.g3_dir);
    return 2;
  }
  kvbm_error err = {0};
  kvsim_trace *trace;
  if (kvsim_trace_load(trace_path, o.w1.limit, &trace, &err)) {
    fprintf(stderr, "kvbm replay: %s: %s\n", trace_path, err.msg);
    return 2;
  }
  if (c.progress && !json) o.w1.progress = replay_cli_progress;
  oo.trace = trace_path;
  replay_obs *obs;
  if (!replay_obs_create(&oo, true, &obs)) {
    replay_obs_destroy(obs);
    kvsim_trace_destroy(trace);
    return 1;
  }
  print_ctx pc = {trace_path, &o, json};
  replay_obs_w2(obs, &o, print_summary, &pc);
  kvsim_w2_result res;
  int rc = kvsim_w2_run(trace, &o, &res, &err);
  kvsim_trace_destroy(trace);
  bool obs_ok = replay_obs_ok(obs);
  replay_obs_destroy(obs);
  if (rc) {
    fprintf(stderr, "kvbm replay: %s\n", err.msg);
    bool gpu = o.g1_memory != KVBM_MEMORY_SYSTEM && (rc == KVBM_EDEVICE || rc == KVBM_EUNSUPPORTED);
    if (gpu)
      fprintf(stderr, "kvbm replay: --g1-memory %s needs a CUDA build and a GPU\n",
              kvbm_memory_type_name(o.g1_memory));
    /* A bad setting (a malformed or unknown G3/G4 URL too) is a usage error. */
    return rc == KVBM_EINVAL || (rc == KVBM_EUNSUPPORTED && !gpu) ? 2 : 1;
  }
  if (!obs) print_summary(&pc, &res); /* else printed inside the run */
  return obs_ok ? 0 : 1;
}
