/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_policy_sim.c: `kvbm policy-sim`, eviction and admission policies per
 * tier measured on W2 (workload/psim.h), against the clairvoyant bound,
 * with an optional capacity sweep written as JSON and as an SVG chart.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "workload/psim.h"
#include "workload/svg.h"

const char kvbm_cmd_policy_sim_help[] =
    "replay W2 with a choice of tier policies against the clairvoyant bound";

#define MAX_RUNS 32
#define MAX_SWEEP 32

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvbm policy-sim [TRACE] [--policy NAME[,NAME...]] [--g1 EVICT]\n"
          "                       [--g2 EVICT:ADMIT[:head|tail]] [--g3 EVICT:ADMIT[:head|tail]]\n"
          "                       [--g1-blocks 16384] [--g2-blocks 65536] [--g3-blocks 262144]\n"
          "                       [--block-size 16] [--hash native|dynamo] [--limit N]\n"
          "                       [--freq-threshold 2] [--freq-decay-uses 65536]\n"
          "                       [--victim-min-uses 2] [--advisor-period-ms 10000]\n"
          "                       [--g2-freq-threshold 3] [--g2-freq-decay-uses 67108864]\n"
          "                       [--g2-freq-max-entries 4194304]\n"
          "                       [--advisor-demote-min-uses 2] [--advisor-demote-fraction 0.7]\n"
          "                       [--eta-noise SIGMA] [--ttl-s 120] [--ttl-sigma 0]\n"
          "                       [--ttl-rank none|random|turn]\n"
          "                       [--sweep F[,F...]] [--svg FILE] [--title TEXT] [--json]\n"
          "Replays W2 (docs/areas/policies.md) with block identities only and reports,\n"
          "per policy and tier, hit tokens and blocks written.\n"
          "  --policy   presets, run in order (default: all of them):\n"
          "             today lru-tail arc s3fifo wtinylfu victim g2-freq advisor belady\n"
          "  --g1/2/3   a custom policy, run after the presets (named 'custom'):\n"
          "             EVICT lru|arc|s3fifo|wtinylfu|belady|ttl (G1: lru|belady),\n"
          "             ADMIT all|frequency|never|clairvoyant|reused|victim|sticky|turn;\n"
          "             tail: a commit's deepest block is the first to go (default head,\n"
          "             the manager's order); reused is an oracle (analysis only)\n"
          "  ttl        online: a commit's blocks expire --ttl-s * exp(--ttl-sigma * z)\n"
          "             later (z ~ N(0,1) per request); overdue first, then the furthest\n"
          "             expiry; sticky admits when that frees room or expires sooner\n"
          "             than the victim, turn as sticky for requests whose turn class\n"
          "             (learned online) returns at least as often as all requests;\n"
          "             --ttl-rank orders what is not overdue: none (the furthest\n"
          "             expiry), random (per request), turn (the turn class with the\n"
          "             lowest online return rate goes first)\n"
          "  --eta-noise  analysis only: blur the clairvoyant next uses (belady,\n"
          "             clairvoyant) by a factor exp(SIGMA * z), z ~ N(0,1), one draw per\n"
          "             request's chain, deterministic; which blocks return stays exact\n"
          "             (0..64, default 0: the exact bound)\n"
          "  --sweep    capacity factors applied to G2 and G3 (G1 stays): one run per\n"
          "             policy and factor; --svg writes hit rate against G2+G3 blocks\n"
          "TRACE: Mooncake JSON lines, plain or .gz; default %s\n",
          KVBM_DEFAULT_TRACE);
}

typedef struct opts {
  const char *trace, *svg, *title;
  bool json, custom;
  size_t limit;
  uint32_t block_size;
  kvbm_hash_scheme scheme;
  kvsim_psim_config base;    /* capacities, filter, advisor settings */
  kvsim_psim_config custom_cfg;
  const char *names[MAX_RUNS];
  int nnames;
  double sweep[MAX_SWEEP];
  int nsweep;
} opts;

static bool parse_tier(const char *opt, const char *v, int t, kvsim_psim_config *c) {
  char buf[64];
  if (strlen(v) >= sizeof buf) goto bad;
  strcpy(buf, v);
  char *e = strtok(buf, ":"), *a = strtok(NULL, ":"), *o = strtok(NULL, ":");
  if (!e || !kvsim_psim_evict_parse(e, &c->tier[t].evict)) goto bad;
  if (t == 0) {
    if (a) goto bad;
    return true;
  }
  if (!a || !kvsim_psim_admit_parse(a, &c->tier[t].admit)) goto bad;
  if (o && strcmp(o, "tail") && strcmp(o, "head")) goto bad;
  c->tier[t].tail_first = o && !strcmp(o, "tail");
  if (strtok(NULL, ":")) goto bad;
  return true;
bad:
  fprintf(stderr, "kvbm policy-sim: %s: '%s' is not %s\n", opt, v,
          t ? "EVICT:ADMIT[:head|tail]" : "lru or belady");
  return false;
}

static bool parse_list(const char *v, opts *o, bool factors) {
  char buf[1024];
  if (strlen(v) >= sizeof buf) {
    fprintf(stderr, "kvbm policy-sim: list too long\n");
    return false;
  }
  strcpy(buf, v);
  for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
    if (factors) {
      double d;
      if (o->nsweep == MAX_SWEEP) {
        fprintf(stderr, "kvbm policy-sim: --sweep: at most %d factors\n", MAX_SWEEP);
        return false;
      }
      if (!cli_parse_double("policy-sim", "--sweep", t, 1.0 / 4096, 4096, &d)) return false;
      o->sweep[o->nsweep++] = d;
      continue;
    }
    kvsim_psim_config probe = o->base;
    if (!kvsim_psim_preset(t, &probe)) {
      fprintf(stderr, "kvbm policy-sim: --policy: unknown policy '%s'\n", t);
      return false;
    }
    if (o->nnames == MAX_RUNS - 1) {
      fprintf(stderr, "kvbm policy-sim: --policy: too many policies\n");
      return false;
    }
    for (int i = 0; kvsim_psim_preset_names[i]; i++)
      if (!strcmp(kvsim_psim_preset_names[i], t)) o->names[o->nnames++] = kvsim_psim_preset_names[i];
  }
  return true;
}

static int parse(int argc, char **argv, opts *o) {
  const char *v;
  uint64_t x;
  int r;
  o->custom_cfg = o->base;
  kvsim_psim_preset("today", &o->custom_cfg);
  for (int i = 1; i < argc; i++) {
#define U64(name, lo, hi, dst)                                                 \
  if ((r = cli_opt_value("policy-sim", argc, argv, &i, name, &v))) {           \
    if (r < 0 || !cli_parse_u64("policy-sim", name, v, lo, hi, &x)) return 2;  \
    dst = x;                                                                   \
    continue;                                                                  \
  }
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      o->json = true;
      continue;
    }
    U64("--g1-blocks", 1, 1u << 30, o->base.tier[0].capacity)
    U64("--g2-blocks", 0, 1u << 30, o->base.tier[1].capacity)
    U64("--g3-blocks", 0, 1u << 30, o->base.tier[2].capacity)
    U64("--capacity", 1, 1u << 30, o->base.tier[0].capacity)
    U64("--block-size", 1, 1u << 16, o->block_size)
    U64("--limit", 0, SIZE_MAX, o->limit)
    U64("--freq-threshold", 1, UINT32_MAX, o->base.freq_threshold)
    U64("--freq-decay-uses", 1, UINT32_MAX, o->base.freq_decay_uses)
    U64("--advisor-period-ms", 1, 86400000, o->base.advisor_period_ms)
    U64("--victim-min-uses", 1, 255, o->base.victim_min_uses)
    U64("--g2-freq-threshold", 1, UINT32_MAX, o->base.g2_freq_threshold)
    U64("--g2-freq-decay-uses", 1, UINT32_MAX, o->base.g2_freq_decay_uses)
    U64("--g2-freq-max-entries", 1, 1u << 26, o->base.g2_freq_max_entries)
    U64("--advisor-demote-min-uses", 1, 65535, o->base.advisor_demote_min_uses)
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--advisor-demote-fraction", &v))) {
      double d;
      if (r < 0 || !cli_parse_double("policy-sim", "--advisor-demote-fraction", v, 0.001, 0.999, &d))
        return 2;
      o->base.advisor_demote_fraction = d;
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--eta-noise", &v))) {
      double d;
      if (r < 0 || !cli_parse_double("policy-sim", "--eta-noise", v, 0, 64, &d)) return 2;
      o->base.eta_noise = d;
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--ttl-s", &v))) {
      double d;
      if (r < 0 || !cli_parse_double("policy-sim", "--ttl-s", v, 0.001, 1e6, &d)) return 2;
      o->base.ttl_s = d;
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--ttl-sigma", &v))) {
      double d;
      if (r < 0 || !cli_parse_double("policy-sim", "--ttl-sigma", v, 0, 16, &d)) return 2;
      o->base.ttl_sigma = d;
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--ttl-rank", &v))) {
      if (r < 0 || !kvsim_psim_rank_parse(v, &o->base.ttl_rank)) {
        fprintf(stderr, "kvbm policy-sim: --ttl-rank: '%s' is not none, random or turn\n",
                r < 0 ? "" : v);
        return 2;
      }
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--hash", &v))) {
      if (r < 0 || !kvbm_hash_scheme_parse(v, &o->scheme)) {
        fprintf(stderr, "kvbm policy-sim: --hash: '%s' is not native or dynamo\n", r < 0 ? "" : v);
        return 2;
      }
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--policy", &v))) {
      if (r < 0 || !parse_list(v, o, false)) return 2;
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--sweep", &v))) {
      if (r < 0 || !parse_list(v, o, true)) return 2;
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--svg", &v))) {
      if (r < 0) return 2;
      o->svg = v;
      continue;
    }
    if ((r = cli_opt_value("policy-sim", argc, argv, &i, "--title", &v))) {
      if (r < 0) return 2;
      o->title = v;
      continue;
    }
    static const char *const tiers[] = {"--g1", "--g2", "--g3"};
    bool done = false;
    for (int t = 0; t < 3 && !done; t++)
      if ((r = cli_opt_value("policy-sim", argc, argv, &i, tiers[t], &v))) {
        if (r < 0 || !parse_tier(tiers[t], v, t, &o->custom_cfg)) return 2;
        o->custom = done = true;
      }
    if (done) continue;
    if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "kvbm policy-sim: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
    if (o->trace) {
      fprintf(stderr, "kvbm policy-sim: more than one trace given\n");
      return 2;
    }
    o->trace = argv[i];
  }
  return -1;
}

typedef struct runres {
  const char *name;
  kvsim_psim_config cfg;
  kvsim_psim_result res[MAX_SWEEP];
} runres;

static void print_tier_json(const kvsim_psim_tier_result *t, const kvsim_psim_tier_config *c) {
  printf("{\"capacity\":%llu,\"evict\":\"%s\",\"admit\":\"%s\",\"order\":\"%s\","
         "\"hit_tokens\":%llu,\"written_blocks\":%llu,\"evictions\":%llu,\"filtered\":%llu,"
         "\"skipped_space\":%llu,\"promoted\":%llu,\"demoted\":%llu,\"dropped\":%llu}",
         (unsigned long long)c->capacity, kvsim_psim_evict_name(c->evict),
         kvsim_psim_admit_name(c->admit), c->tail_first ? "tail" : "head",
         (unsigned long long)t->hit_tokens, (unsigned long long)t->written_blocks,
         (unsigned long long)t->evictions, (unsigned long long)t->filtered,
         (unsigned long long)t->skipped_space, (unsigned long long)t->promoted,
         (unsigned long long)t->demoted, (unsigned long long)t->dropped);
}

static kvsim_psim_config scaled(const kvsim_psim_config *c, double f) {
  kvsim_psim_config s = *c;
  for (int t = 1; t < 3; t++) {
    double v = (double)c->tier[t].capacity * f + 0.5;
    s.tier[t].capacity = v > (double)(1u << 30) ? (1u << 30) : (uint64_t)v;
  }
  return s;
}

static void print_json(const opts *o, const runres *runs, int nruns, const kvsim_psim_stream *st) {
  printf("{\"workload\":\"W2-policy\",\"trace\":\"%s\",\"block_size\":%u,\"hash\":\"%s\","
         "\"requests\":%zu,\"distinct_blocks\":%u,\"factors\":[",
         o->trace, o->block_size, kvbm_hash_scheme_name(o->scheme),
         kvsim_psim_stream_requests(st), kvsim_psim_stream_universe(st));
  for (int k = 0; k < o->nsweep; k++) printf("%s%g", k ? "," : "", o->sweep[k]);
  printf("],\"policies\":[");
  for (int i = 0; i < nruns; i++) {
    printf("%s{\"name\":\"%s\",\"points\":[", i ? "," : "", runs[i].name);
    for (int k = 0; k < o->nsweep; k++) {
      const kvsim_psim_result *r = &runs[i].res[k];
      kvsim_psim_config c = scaled(&runs[i].cfg, o->sweep[k]);
      printf("%s{\"factor\":%g,\"requests\":%llu,\"prompt_tokens\":%llu,\"hit_tokens\":%llu,"
             "\"hit_rate\":%.6f,\"g1_allocated\":%llu,\"advisor\":%s,\"advisor_events\":%llu,"
             "\"advisor_hints\":%llu,\"seconds\":%.3f,\"tiers\":{",
             k ? "," : "", o->sweep[k], (unsigned long long)r->requests,
             (unsigned long long)r->prompt_tokens, (unsigned long long)r->hit_tokens,
             r->prompt_tokens ? (double)r->hit_tokens / (double)r->prompt_tokens : 0,
             (unsigned long long)r->g1_allocated, c.advisor ? "true" : "false",
             (unsigned long long)r->advisor_events, (unsigned long long)r->advisor_hints,
             r->seconds);
      for (int t = 0; t < 3; t++) {
        printf("%s\"g%d\":", t ? "," : "", t + 1);
        print_tier_json(&r->tier[t], &c.tier[t]);
      }
      printf("}}");
    }
    printf("]}");
  }
  printf("]}\n");
}

static void print_text(const opts *o, const runres *runs, int nruns, const kvsim_psim_stream *st) {
  printf("W2 policy simulation of %s\n", o->trace);
  printf("  %zu requests, %u distinct blocks of %u tokens, %s hashes\n",
         kvsim_psim_stream_requests(st), kvsim_psim_stream_universe(st), o->block_size,
         kvbm_hash_scheme_name(o->scheme));
  for (int k = 0; k < o->nsweep; k++) {
    kvsim_psim_config c = scaled(&o->base, o->sweep[k]);
    printf("\n  G1 %llu, G2 %llu, G3 %llu blocks (factor %g)\n",
           (unsigned long long)c.tier[0].capacity, (unsigned long long)c.tier[1].capacity,
           (unsigned long long)c.tier[2].capacity, o->sweep[k]);
    printf("  %-10s %12s %7s %11s %11s %11s %11s %10s\n", "policy", "hit tokens", "rate",
           "G1 hits", "G2 hits", "G3 hits", "G2 writes", "G3 writes");
    for (int i = 0; i < nruns; i++) {
      const kvsim_psim_result *r = &runs[i].res[k];
      printf("  %-10s %12llu %6.2f%% %11llu %11llu %11llu %11llu %10llu\n", runs[i].name,
             (unsigned long long)r->hit_tokens,
             r->prompt_tokens ? 100.0 * (double)r->hit_tokens / (double)r->prompt_tokens : 0,
             (unsigned long long)r->tier[0].hit_tokens, (unsigned long long)r->tier[1].hit_tokens,
             (unsigned long long)r->tier[2].hit_tokens,
             (unsigned long long)r->tier[1].written_blocks,
             (unsigned long long)r->tier[2].written_blocks);
    }
  }
}

static int write_svg(const opts *o, const runres *runs, int nruns) {
  kvsim_svg_chart ch;
  kvsim_svg_chart_init(&ch);
  ch.title = o->title ? o->title : "hit rate against lower-tier capacity";
  ch.x_label = "G2 + G3 capacity (blocks, log scale)";
  ch.y_label = "hit tokens / prompt tokens (%)";
  ch.x_log = true;
  double xs[MAX_RUNS][MAX_SWEEP], ys[MAX_RUNS][MAX_SWEEP];
  for (int i = 0; i < nruns && i < KVSIM_SVG_MAX_SERIES; i++) {
    for (int k = 0; k < o->nsweep; k++) {
      kvsim_psim_config c = scaled(&runs[i].cfg, o->sweep[k]);
      const kvsim_psim_result *r = &runs[i].res[k];
      xs[i][k] = (double)(c.tier[1].capacity + c.tier[2].capacity);
      ys[i][k] = r->prompt_tokens ? 100.0 * (double)r->hit_tokens / (double)r->prompt_tokens : 0;
    }
    kvsim_svg_chart_add(&ch, runs[i].name, xs[i], ys[i], (size_t)o->nsweep);
  }
  kvbm_error err = {0};
  if (kvsim_svg_chart_write(&ch, o->svg, &err)) {
    fprintf(stderr, "kvbm policy-sim: %s\n", err.msg);
    return 1;
  }
  return 0;
}

int kvbm_cmd_policy_sim(int argc, char **argv) {
  opts o;
  memset(&o, 0, sizeof o);
  o.block_size = 16;
  o.scheme = KVBM_HASH_NATIVE;
  o.base = kvsim_psim_config_default();
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  if (!o.trace) o.trace = KVBM_DEFAULT_TRACE;
  if (!o.nsweep) o.sweep[o.nsweep++] = 1;
  if (!o.nnames && !o.custom)
    for (int i = 0; kvsim_psim_preset_names[i]; i++) o.names[o.nnames++] = kvsim_psim_preset_names[i];
  static runres runs[MAX_RUNS];
  int nruns = 0;
  bool clair = false;
  for (int i = 0; i < o.nnames; i++) {
    runs[nruns].name = o.names[i];
    runs[nruns].cfg = o.base;
    kvsim_psim_preset(o.names[i], &runs[nruns].cfg);
    nruns++;
  }
  if (o.custom) {
    runs[nruns].name = "custom";
    runs[nruns].cfg = o.custom_cfg;
    for (int t = 0; t < 3; t++) runs[nruns].cfg.tier[t].capacity = o.base.tier[t].capacity;
    runs[nruns].cfg.freq_threshold = o.base.freq_threshold;
    runs[nruns].cfg.freq_decay_uses = o.base.freq_decay_uses;
    runs[nruns].cfg.advisor_period_ms = o.base.advisor_period_ms;
    runs[nruns].cfg.victim_min_uses = o.base.victim_min_uses;
    runs[nruns].cfg.g2_freq_threshold = o.base.g2_freq_threshold;
    runs[nruns].cfg.g2_freq_decay_uses = o.base.g2_freq_decay_uses;
    runs[nruns].cfg.g2_freq_max_entries = o.base.g2_freq_max_entries;
    runs[nruns].cfg.advisor_demote_min_uses = o.base.advisor_demote_min_uses;
    runs[nruns].cfg.advisor_demote_fraction = o.base.advisor_demote_fraction;
    runs[nruns].cfg.eta_noise = o.base.eta_noise;
    runs[nruns].cfg.ttl_s = o.base.ttl_s;
    runs[nruns].cfg.ttl_sigma = o.base.ttl_sigma;
    runs[nruns].cfg.ttl_rank = o.base.ttl_rank;
    nruns++;
  }
  for (int i = 0; i < nruns; i++)
    for (int t = 0; t < 3; t++)
      clair |= runs[i].cfg.tier[t].evict == KVSIM_PSIM_EVICT_BELADY ||
               (t && (runs[i].cfg.tier[t].admit == KVSIM_PSIM_ADMIT_CLAIRVOYANT ||
                      runs[i].cfg.tier[t].admit == KVSIM_PSIM_ADMIT_REUSED));
  kvbm_error err = {0};
  kvsim_trace *trace;
  if (kvsim_trace_load(o.trace, o.limit, &trace, &err)) {
    fprintf(stderr, "kvbm policy-sim: %s: %s\n", o.trace, err.msg);
    return 2;
  }
  kvsim_psim_stream *st;
  rc = kvsim_psim_stream_build(trace, o.limit, o.block_size, o.scheme, clair, &st, &err);
  kvsim_trace_destroy(trace);
  if (rc) {
    fprintf(stderr, "kvbm policy-sim: %s\n", err.msg);
    return rc == KVBM_EINVAL ? 2 : 1;
  }
  for (int i = 0; i < nruns && !rc; i++)
    for (int k = 0; k < o.nsweep && !rc; k++) {
      kvsim_psim_config c = scaled(&runs[i].cfg, o.sweep[k]);
      rc = kvsim_psim_run(st, &c, &runs[i].res[k], &err);
    }
  if (rc) {
    fprintf(stderr, "kvbm policy-sim: %s\n", err.msg);
    kvsim_psim_stream_destroy(st);
    return rc == KVBM_EINVAL ? 2 : 1;
  }
  if (o.json) print_json(&o, runs, nruns, st);
  else print_text(&o, runs, nruns, st);
  kvsim_psim_stream_destroy(st);
  return o.svg ? write_svg(&o, runs, nruns) : 0;
}
