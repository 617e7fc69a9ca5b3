/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c: the tiered manager as metrics (kvbm_manager_metrics_collect,
 * kvbm/metrics.h), and the counters only metrics read (tier/metrics.h).
 *
 * The collector takes one snapshot under the manager lock
 * (kvbm__manager_snapshot: the tiers' kvbm_tier_stats and the counters
 * below, a copy of a few kilobytes) and writes the page from the copy with
 * the lock released, so a scrape holds up the engine for the time of a
 * memcpy.
 *
 * Names. Dynamo's KVBM exports a fixed set (kvbm_offload_blocks_d2h,
 * _h2d, _d2d, _d2o, kvbm_onboard_blocks_h2d, _d2d, _o2d,
 * kvbm_matched_tokens, the three hit-rate gauges, the object-store bytes);
 * they are written under those names with Dynamo's meaning, so existing
 * dashboards work: d2h is G1 -> G2, h2d G2 -> G3, d2d G1 -> G3 (the disk
 * written from the device copy when G2 does not hold the block), d2o every
 * copy into G4, and onboards G2/G3/G4 -> G1. Everything else follows
 * Prometheus' conventions, with a `tier` label G1..G4 or `src`/`dst`
 * labels, so that rates and ratios can be computed from counters
 * (kvbm_requested_tokens_total and kvbm_hit_tokens_total{tier}: the
 * per-tier hit rate over any window users asked Dynamo for).
 *
 * Hit rates. Dynamo's gauges are over a sliding window of the last 1000
 * requests: blocks found in a tier over the blocks looked for below the
 * device (the prompt's matchable blocks minus those G1 held). The manager
 * keeps the same window: one entry per prefill in a ring, with running
 * sums.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tier/metrics.h"
#include "volume/metrics.h"

/* ---------------------------------------------------------- the counters */

int kvbm__tier_metrics_init(kvbm__tier_metrics *tm) {
  memset(tm, 0, sizeof *tm);
  for (int s = 0; s < KVBM_TIER_COUNT; s++)
    for (int d = 0; d < KVBM_TIER_COUNT; d++) {
      /* one transfer: 10 us .. ~40 s; 4 KiB .. ~8 GiB */
      kvbm_histogram_init_exponential(&tm->s.copy_seconds_h[s][d], 1e-5, 2.5, 17, NULL);
      kvbm_histogram_init_exponential(&tm->s.copy_bytes_h[s][d], 4096, 4, 12, NULL);
    }
  tm->ring = calloc(KVBM__HIT_WINDOW, sizeof *tm->ring);
  return tm->ring ? KVBM_OK : KVBM_ENOMEM;
}

void kvbm__tier_metrics_free(kvbm__tier_metrics *tm) {
  free(tm->ring);
  tm->ring = NULL;
}

void kvbm__tier_metrics_prefill(kvbm__tier_metrics *tm, size_t n, uint32_t block_size,
                                const uint8_t *src, size_t walk, size_t matchable) {
  kvbm__tier_metrics_snap *s = &tm->s;
  kvbm__hit_entry e = {0};
  for (size_t k = 0; k < walk; k++)
    if (src[k] < KVBM_TIER_COUNT) e.hit[src[k]]++;
  e.queried = (uint32_t)(matchable - e.hit[KVBM_TIER_G1]);
  s->prefills++;
  s->requested_tokens += n;
  s->matched_tokens += (uint64_t)walk * block_size;
  s->requested_blocks += matchable;
  s->queried_below_g1 += e.queried;
  if (!tm->ring) return;
  /* the window: the oldest entry leaves when it is full */
  if (s->window_prefills == KVBM__HIT_WINDOW) {
    const kvbm__hit_entry *old = &tm->ring[tm->head];
    s->window_queried -= old->queried;
    for (int t = 0; t < KVBM_TIER_COUNT; t++) s->window_hit[t] -= old->hit[t];
  } else {
    s->window_prefills++;
  }
  tm->ring[tm->head] = e;
  tm->head = (tm->head + 1) % KVBM__HIT_WINDOW;
  s->window_queried += e.queried;
  for (int t = 0; t < KVBM_TIER_COUNT; t++) s->window_hit[t] += e.hit[t];
}

static bool pair_ok(int src, int dst) {
  return src >= 0 && src < KVBM_TIER_COUNT && dst >= 0 && dst < KVBM_TIER_COUNT && src != dst;
}

void kvbm__tier_metrics_count(kvbm__tier_metrics *tm, int src, int dst, uint64_t blocks,
                              uint64_t bytes) {
  if (!pair_ok(src, dst)) return;
  tm->s.copy_blocks[src][dst] += blocks;
  tm->s.copy_bytes[src][dst] += bytes;
}

void kvbm__tier_metrics_transfer(kvbm__tier_metrics *tm, int src, int dst, uint64_t bytes,
                                 double seconds) {
  if (!pair_ok(src, dst) || !(seconds >= 0)) return;
  kvbm_histogram_observe(&tm->s.copy_seconds_h[src][dst], seconds);
  kvbm_histogram_observe(&tm->s.copy_bytes_h[src][dst], (double)bytes);
}

/* ------------------------------------------------------------- collector */


typedef struct lw {
  kvbm_metrics_writer *w;
  const kvbm__manager_snap *s;
} lw;

/* One counter family with a sample per present tier. */
static void per_tier(lw *c, const char *name, const char *help, bool below_g1,
                     uint64_t (*get)(const kvbm_tier_stats *t, const kvbm__manager_snap *s)) {
  kvbm_metrics_family(c->w, name, KVBM_METRIC_COUNTER, help);
  for (int t = below_g1 ? 1 : 0; t < KVBM_TIER_COUNT; t++) {
    if (!c->s->tier[t].present && !c->s->tier[t].num_blocks) continue;
    kvbm_metrics_value_u64(c->w, &(kvbm_metric_label){"tier", kvbm_tier_name(t)}, 1,
                           get(&c->s->tier[t], c->s));
  }
}

#define GETTER(fname, expr)                                                         \
  static uint64_t fname(const kvbm_tier_stats *t, const kvbm__manager_snap *s) { \
    (void)t;                                                                        \
    (void)s;                                                                        \
    return (expr);                                                                  \
  }
GETTER(g_hit_tokens, t->hit_blocks * s->block_size)
GETTER(g_hit_blocks, t->hit_blocks)
GETTER(g_offload_blocks, t->offloaded_blocks)
GETTER(g_offload_bytes, t->offloaded_bytes)
GETTER(g_onboard_blocks, t->onboarded_blocks)
GETTER(g_onboard_bytes, t->onboarded_bytes)
GETTER(g_filtered, t->filtered)
GETTER(g_onboard_failures, t->onboard_failures)
GETTER(g_copy_errors, t->copy_errors)
GETTER(g_evictions, t->evictions)
GETTER(g_allocated, t->allocated)
GETTER(g_restored, t->restored_blocks)
GETTER(g_restore_skipped, t->restore_skipped)
GETTER(g_missing, t->missing)
GETTER(g_abandoned, t->abandoned)

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

static void dynamo_names(lw *c) {
  kvbm_metrics_writer *w = c->w;
  const kvbm__tier_metrics_snap *m = &c->s->tm;
  const uint64_t(*b)[KVBM_TIER_COUNT] = m->copy_blocks;
  enum { G1 = KVBM_TIER_G1, G2 = KVBM_TIER_G2, G3 = KVBM_TIER_G3, G4 = KVBM_TIER_G4 };
  const struct {
    const char *name, *help;
    uint64_t v;
  } d[] = {
      {"kvbm_offload_blocks_d2h", "Blocks offloaded from device to host (G1 -> G2)", b[G1][G2]},
      {"kvbm_offload_blocks_h2d", "Blocks offloaded from host to disk (G2 -> G3)", b[G2][G3]},
      {"kvbm_offload_blocks_d2d", "Blocks offloaded from device to disk, bypassing host memory "
       "(G1 -> G3)", b[G1][G3]},
      {"kvbm_offload_blocks_d2o", "Blocks offloaded to object storage (G1 or G2 -> G4)",
       b[G1][G4] + b[G2][G4]},
      {"kvbm_onboard_blocks_h2d", "Blocks onboarded from host to device (G2 -> G1)", b[G2][G1]},
      {"kvbm_onboard_blocks_d2d", "Blocks onboarded from disk to device (G3 -> G1)", b[G3][G1]},
      {"kvbm_onboard_blocks_o2d", "Blocks onboarded from object storage to device (G4 -> G1)",
       b[G4][G1]},
      {"kvbm_offload_bytes_object", "Bytes transferred to object storage (offload, G4)",
       m->copy_bytes[G1][G4] + m->copy_bytes[G2][G4]},
      {"kvbm_onboard_bytes_object", "Bytes transferred from object storage (onboard, G4)",
       m->copy_bytes[G4][G1]},
      {"kvbm_matched_tokens", "Tokens of prompts matched in the cache (any tier) at prefill",
       m->matched_tokens},
  };
  for (size_t i = 0; i < sizeof d / sizeof *d; i++)
    kvbm_metrics_counter(w, d[i].name, d[i].help, NULL, 0, d[i].v);
  const struct {
    const char *name, *help;
    int tier;
  } r[] = {
      {"kvbm_host_cache_hit_rate", "Host (G2) cache hit rate (0.0-1.0) over the last 1000 "
       "prefills: blocks found in G2 over blocks looked for below G1", G2},
      {"kvbm_disk_cache_hit_rate", "Disk (G3) cache hit rate (0.0-1.0) over the last 1000 "
       "prefills", G3},
      {"kvbm_object_cache_hit_rate", "Object storage (G4) cache hit rate (0.0-1.0) over the last "
       "1000 prefills", G4},
  };
  for (size_t i = 0; i < sizeof r / sizeof *r; i++)
    kvbm_metrics_gauge(w, r[i].name, r[i].help, NULL, 0,
                       ratio(m->window_hit[r[i].tier], m->window_queried));
}

static void requests(lw *c) {
  kvbm_metrics_writer *w = c->w;
  const kvbm__tier_metrics_snap *m = &c->s->tm;
  kvbm_metrics_counter(w, "kvbm_prefill_requests_total", "Prefills the manager served", NULL, 0,
                       m->prefills);
  kvbm_metrics_counter(w, "kvbm_requested_tokens_total",
                       "Prompt tokens given to prefill (the denominator of the hit rate)", NULL, 0,
                       m->requested_tokens);
  kvbm_metrics_counter(w, "kvbm_requested_blocks_total",
                       "Prompt blocks a prefill could match (at most (L - 1) / block_size)",
                       NULL, 0, m->requested_blocks);
  kvbm_metrics_counter(w, "kvbm_lookup_blocks_below_device_total",
                       "Matchable prompt blocks not found in G1, looked for below it", NULL, 0,
                       m->queried_below_g1);
  per_tier(c, "kvbm_hit_tokens_total",
           "Prompt tokens matched at prefill, by the tier that held them", false, g_hit_tokens);
  per_tier(c, "kvbm_hit_blocks_total", "Prompt blocks matched at prefill, by tier", false,
           g_hit_blocks);
}

static void copies(lw *c) {
  kvbm_metrics_writer *w = c->w;
  const kvbm__manager_snap *s = c->s;
  per_tier(c, "kvbm_offload_blocks_total", "Blocks copied into the tier (offload)", true,
           g_offload_blocks);
  per_tier(c, "kvbm_offload_bytes_total", "Bytes copied into the tier (offload)", true,
           g_offload_bytes);
  per_tier(c, "kvbm_onboard_blocks_total", "Blocks copied from the tier to G1 and verified "
           "(onboard)", true, g_onboard_blocks);
  per_tier(c, "kvbm_onboard_bytes_total", "Bytes copied from the tier to G1 (onboard)", true,
           g_onboard_bytes);
  /* every (source, destination) pair the manager copies along */
  static const int pairs[][2] = {{0, 1}, {0, 2}, {1, 2}, {0, 3}, {1, 3}, {1, 0}, {2, 0}, {3, 0}};
  const char *fam[] = {"kvbm_copy_blocks_total", "kvbm_copy_bytes_total", "kvbm_copy_seconds",
                       "kvbm_copy_transfer_bytes"};
  const char *help[] = {
      "Blocks copied between tiers, by source and destination",
      "Bytes copied between tiers, by source and destination",
      "Time of one transfer between tiers (a worker's batch of memory copies, or one store "
      "operation), by source and destination",
      "Bytes of one transfer between tiers, by source and destination"};
  for (int f = 0; f < 4; f++) {
    kvbm_metrics_family(w, fam[f], f < 2 ? KVBM_METRIC_COUNTER : KVBM_METRIC_HISTOGRAM, help[f]);
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
      int a = pairs[p][0], b = pairs[p][1];
      if (!s->tier[a].num_blocks || !s->tier[b].num_blocks) continue;
      kvbm_metric_label l[3] = {{"op", b == 0 ? "onboard" : "offload"},
                                {"src", kvbm_tier_name(a)},
                                {"dst", kvbm_tier_name(b)}};
      if (f == 0) kvbm_metrics_value_u64(w, l, 3, s->tm.copy_blocks[a][b]);
      else if (f == 1) kvbm_metrics_value_u64(w, l, 3, s->tm.copy_bytes[a][b]);
      else if (f == 2) kvbm_metrics_histogram_value(w, l, 3, &s->tm.copy_seconds_h[a][b]);
      else kvbm_metrics_histogram_value(w, l, 3, &s->tm.copy_bytes_h[a][b]);
    }
  }
  kvbm_metrics_family(w, "kvbm_copy_busy_seconds_total", KVBM_METRIC_COUNTER,
                      "Time the tier's worker spent copying into or out of it");
  for (int t = 1; t < KVBM_TIER_COUNT; t++)
    if (s->tier[t].num_blocks)
      kvbm_metrics_value(w, &(kvbm_metric_label){"tier", kvbm_tier_name(t)}, 1,
                         s->tier[t].busy_seconds);
}

static void failures(lw *c) {
  kvbm_metrics_writer *w = c->w;
  const kvbm__manager_snap *s = c->s;
  kvbm_metrics_family(w, "kvbm_offload_skipped_total", KVBM_METRIC_COUNTER,
                      "Offloads the manager skipped, by tier and cause: queue (its queue was "
                      "full), space (no evictable block), io (the store refused or failed the "
                      "write), unavailable (the store is not open)");
  for (int t = 1; t < KVBM_TIER_COUNT; t++) {
    if (!s->tier[t].num_blocks && !s->tier[t].skipped_unavailable) continue;
    const kvbm_tier_stats *x = &s->tier[t];
    const struct {
      const char *cause;
      uint64_t v;
    } k[] = {{"queue", x->skipped_queue}, {"space", x->skipped_space}, {"io", x->skipped_io},
             {"unavailable", x->skipped_unavailable}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
      kvbm_metric_label l[2] = {{"tier", kvbm_tier_name(t)}, {"cause", k[i].cause}};
      kvbm_metrics_value_u64(w, l, 2, k[i].v);
    }
  }
  per_tier(c, "kvbm_offload_filtered_total",
           "Uses the tier's offload policy did not copy there (frequency filter, never)", true,
           g_filtered);
  per_tier(c, "kvbm_onboard_failures_total",
           "Onboards that failed (any cause): the match was shortened, the engine recomputed",
           true, g_onboard_failures);
  kvbm_metrics_family(w, "kvbm_verify_failures_total", KVBM_METRIC_COUNTER,
                      "Blocks read back from a tier that failed verification, by cause: "
                      "checksum (slot header, checksum or frame BLAKE3), foreign (a value of "
                      "another namespace, key, layout or size), read (the read failed, timed "
                      "out or came back short), auth (G4: not authenticated by the cluster key)");
  for (int t = 1; t < KVBM_TIER_COUNT; t++) {
    if (!s->tier[t].num_blocks) continue;
    kvbm_metric_label l[2] = {{"tier", kvbm_tier_name(t)}, {"cause", "checksum"}};
    kvbm_metrics_value_u64(w, l, 2, s->tier[t].checksum_failures);
    l[1].value = "foreign";
    kvbm_metrics_value_u64(w, l, 2, s->tier[t].foreign);
    l[1].value = "read";
    kvbm_metrics_value_u64(w, l, 2, s->tier[t].read_errors);
    l[1].value = "auth";
    kvbm_metrics_value_u64(w, l, 2, s->tier[t].auth_failures);
  }
  per_tier(c, "kvbm_copy_errors_total", "CUDA copies into or out of the tier that failed", true,
           g_copy_errors);
}

static void volumes(lw *c) {
  kvbm_metrics_writer *w = c->w;
  const kvbm__manager_snap *s = c->s;
  /* G4's lookups: how a prefill learns what the shared store holds */
  if (s->tier[KVBM_TIER_G4].num_blocks || s->tier[KVBM_TIER_G4].lookups) {
    const kvbm_tier_stats *g4 = &s->tier[KVBM_TIER_G4];
    kvbm_metric_label l = {"tier", "G4"};
    kvbm_metrics_counter(w, "kvbm_lookups_total",
                         "Lookups a prefill sent to the shared store (one per prefill that "
                         "reached past G3)", &l, 1, g4->lookups);
    kvbm_metrics_family(w, "kvbm_lookup_blocks_total", KVBM_METRIC_COUNTER,
                        "Blocks the lookups asked about, and those the store held");
    kvbm_metric_label lr[2] = {{"tier", "G4"}, {"result", "asked"}};
    kvbm_metrics_value_u64(w, lr, 2, g4->lookup_blocks);
    lr[1].value = "found";
    kvbm_metrics_value_u64(w, lr, 2, g4->lookup_found);
    kvbm_metrics_family(w, "kvbm_lookup_failures_total", KVBM_METRIC_COUNTER,
                        "Lookups that did not answer: timeout (past g4_lookup_timeout_ms, the "
                        "prefill went on without them), error (the store failed)");
    lr[1] = (kvbm_metric_label){"cause", "timeout"};
    kvbm_metrics_value_u64(w, lr, 2, g4->lookup_timeouts);
    lr[1].value = "error";
    kvbm_metrics_value_u64(w, lr, 2, g4->lookup_errors);
  }
  per_tier(c, "kvbm_onboard_missing_total",
           "Gets of indexed blocks the store no longer held (evicted, restarted, failed over)",
           true, g_missing);
  per_tier(c, "kvbm_onboard_abandoned_total",
           "Onboards given up past their prefill's deadline (g4_timeout_ms) or after an "
           "earlier block of the match failed; never copied into G1",
           true, g_abandoned);
  if (s->tier[KVBM_TIER_G4].num_blocks) {
    const kvbm_tier_stats *g4 = &s->tier[KVBM_TIER_G4];
    kvbm_metric_label l = {"tier", "G4"};
    kvbm_metrics_counter(w, "kvbm_store_backoffs_total",
                         "Times the shared store was left alone after failing reads in a row "
                         "(g4_backoff_ms)", &l, 1, g4->backoffs);
    kvbm_metrics_counter(w, "kvbm_store_backoff_skips_total",
                         "Lookups, hits and puts skipped while the shared store was left alone",
                         &l, 1, g4->backoff_skips);
  }
  /* the stores' own counters, by the tier they serve */
  for (int t = 1; t < KVBM_TIER_COUNT; t++)
    if (s->has_volume[t])
      kvbm__volume_metrics_write(w, &s->volume[t], &(kvbm_metric_label){"tier", kvbm_tier_name(t)}, 1);
  kvbm_metrics_family(w, "kvbm_tier_info", KVBM_METRIC_GAUGE,
                      "1 for each configured tier, labelled with how its bytes move (memory, "
                      "io_uring+O_DIRECT, a store's URL without user info)");
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    if (!s->tier[t].num_blocks) continue;
    kvbm_metric_label l[2] = {{"tier", kvbm_tier_name(t)}, {"mode", s->mode[t]}};
    kvbm_metrics_value(w, l, 2, 1);
  }
}

static void occupancy(lw *c) {
  kvbm_metrics_writer *w = c->w;
  const kvbm__manager_snap *s = c->s;
  kvbm_metrics_family(w, "kvbm_tier_blocks", KVBM_METRIC_GAUGE,
                      "Blocks of the tier by state: free (empty), cached (held for reuse, "
                      "evictable), active (in use by requests or copies)");
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    if (!s->tier[t].num_blocks) continue;
    const struct {
      const char *state;
      uint32_t v;
    } k[] = {{"free", s->tier[t].free}, {"cached", s->tier[t].cached},
             {"active", s->tier[t].active}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
      kvbm_metric_label l[2] = {{"tier", kvbm_tier_name(t)}, {"state", k[i].state}};
      kvbm_metrics_value_u64(w, l, 2, k[i].v);
    }
  }
  kvbm_metrics_family(w, "kvbm_tier_capacity_blocks", KVBM_METRIC_GAUGE, "Blocks of the tier");
  kvbm_metrics_family(w, "kvbm_tier_occupancy_ratio", KVBM_METRIC_GAUGE,
                      "Share of the tier's blocks holding data (cached + active) / capacity");
  kvbm_metrics_family(w, "kvbm_tier_present", KVBM_METRIC_GAUGE,
                      "1 when the tier is configured and usable, 0 when configured but its store "
                      "is unavailable");
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    const kvbm_tier_stats *x = &s->tier[t];
    if (!x->num_blocks && !x->present) continue;
    kvbm_metric_label l = {"tier", kvbm_tier_name(t)};
    kvbm_metrics_family(w, "kvbm_tier_capacity_blocks", KVBM_METRIC_GAUGE, NULL);
    kvbm_metrics_value_u64(w, &l, 1, x->num_blocks);
    kvbm_metrics_family(w, "kvbm_tier_occupancy_ratio", KVBM_METRIC_GAUGE, NULL);
    kvbm_metrics_value(w, &l, 1, ratio((uint64_t)x->cached + x->active, x->num_blocks));
    kvbm_metrics_family(w, "kvbm_tier_present", KVBM_METRIC_GAUGE, NULL);
    kvbm_metrics_value(w, &l, 1, x->present ? 1 : 0);
  }
  per_tier(c, "kvbm_tier_evictions_total", "Cached blocks evicted to make room", false,
           g_evictions);
  per_tier(c, "kvbm_tier_allocated_blocks_total", "Blocks the tier's pool handed out", false,
           g_allocated);
  per_tier(c, "kvbm_tier_restored_blocks_total", "Blocks indexed at a warm restart", true,
           g_restored);
  per_tier(c, "kvbm_tier_restore_skipped_total", "Torn or corrupt slots skipped at a warm "
           "restart", true, g_restore_skipped);
}

void kvbm_manager_metrics_collect(void *user, kvbm_metrics_writer *w) {
  kvbm__manager_snap *s = malloc(sizeof *s);
  if (!s) return;
  if (kvbm__manager_snapshot(user, s) == KVBM_OK) {
    lw c = {w, s};
    dynamo_names(&c);
    requests(&c);
    copies(&c);
    failures(&c);
    volumes(&c);
    occupancy(&c);
  }
  free(s);
}

/* -------------------------------------------------------------- endpoint */

int kvbm__manager_endpoint_start(kvbm_manager *m, const kvbm_metrics_server_config *cfg,
                                 kvbm__manager_endpoint *ep, kvbm_error *err) {
  *ep = (kvbm__manager_endpoint){0};
  if (!cfg->enabled) return KVBM_OK;
  int rc = kvbm_metrics_create(&ep->reg, err);
  if (!rc) rc = kvbm_metrics_register(ep->reg, kvbm_manager_metrics_collect, m, NULL, 0, NULL, err);
  if (!rc) rc = kvbm_metrics_server_start(ep->reg, cfg, &ep->srv, err);
  if (rc) kvbm__manager_endpoint_stop(ep);
  return rc;
}

void kvbm__manager_endpoint_stop(kvbm__manager_endpoint *ep) {
  kvbm_metrics_server_stop(ep->srv);
  kvbm_metrics_destroy(ep->reg);
  *ep = (kvbm__manager_endpoint){0};
}
