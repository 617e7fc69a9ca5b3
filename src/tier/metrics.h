/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier/metrics.h (private): the manager's counters that only its metrics
 * read (kvbm_manager_metrics_collect, tier/metrics.c), kept apart from the
 * rest of the manager so the manager's files call into them in a few
 * places and know nothing of how they are shown.
 *
 * Guarded by the manager lock, like kvbm_tier_stats: every function here
 * is called with it held, and the snapshot is taken under it.
 */
#ifndef KVBM_TIER_METRICS_H
#define KVBM_TIER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/manager.h"
#include "kvbm/metrics.h"
#include "kvbm/volume.h"

/* Prefills in the sliding window of the hit-rate gauges (Dynamo's
 * CacheStatsTracker keeps the last 1000 requests). */
#define KVBM__HIT_WINDOW 1000

typedef struct kvbm__hit_entry {
  uint32_t queried;                 /* blocks looked for below G1 */
  uint32_t hit[KVBM_TIER_COUNT];    /* of them, found in each tier */
} kvbm__hit_entry;

/* What a snapshot carries (the window as its sums). */
typedef struct kvbm__tier_metrics_snap {
  uint64_t prefills;                /* prefills that succeeded */
  uint64_t requested_tokens;        /* their prompt tokens */
  uint64_t matched_tokens;          /* tokens of their walks' matches */
  uint64_t requested_blocks;        /* matchable prompt blocks, floor((n-1)/B) */
  uint64_t queried_below_g1;        /* of them, not found in G1 */
  /* copies by (source, destination) tier: blocks, bytes, and per transfer
   * the bytes moved and the seconds it took */
  uint64_t copy_blocks[KVBM_TIER_COUNT][KVBM_TIER_COUNT];
  uint64_t copy_bytes[KVBM_TIER_COUNT][KVBM_TIER_COUNT];
  kvbm_histogram copy_seconds_h[KVBM_TIER_COUNT][KVBM_TIER_COUNT];
  kvbm_histogram copy_bytes_h[KVBM_TIER_COUNT][KVBM_TIER_COUNT];
  /* the window */
  uint32_t window_prefills;
  uint64_t window_queried, window_hit[KVBM_TIER_COUNT];
} kvbm__tier_metrics_snap;

typedef struct kvbm__tier_metrics {
  kvbm__tier_metrics_snap s;
  kvbm__hit_entry *ring;            /* KVBM__HIT_WINDOW entries, or NULL
                                       (no memory: the gauges stay 0) */
  uint32_t head;
} kvbm__tier_metrics;

/* Allocates the window; sets the histograms' bounds. KVBM_ENOMEM. */
int kvbm__tier_metrics_init(kvbm__tier_metrics *tm);
void kvbm__tier_metrics_free(kvbm__tier_metrics *tm);

/* A prefill of n tokens whose walk matched `walk` blocks of block_size
 * tokens, src[k] the tier block k came from, out of `matchable` blocks. */
void kvbm__tier_metrics_prefill(kvbm__tier_metrics *tm, size_t n, uint32_t block_size,
                                const uint8_t *src, size_t walk, size_t matchable);

/* `blocks` blocks of `bytes` in all were copied (and verified, for an
 * onboard) from tier `src` to tier `dst`. */
void kvbm__tier_metrics_count(kvbm__tier_metrics *tm, int src, int dst, uint64_t blocks,
                              uint64_t bytes);

/* One transfer from `src` to `dst` moved `bytes` and took `seconds` (a
 * worker's batch of memory copies, or one store operation). */
void kvbm__tier_metrics_transfer(kvbm__tier_metrics *tm, int src, int dst, uint64_t bytes,
                                 double seconds);

/* The snapshot of everything a collector writes, taken by manager.c under
 * the lock. */
typedef struct kvbm__manager_snap {
  uint32_t block_size;
  uint64_t block_bytes;
  kvbm_tier_stats tier[KVBM_TIER_COUNT];
  kvbm__tier_metrics_snap tm;
  /* the volume tiers' stores (G3, G4): their own counters, and how each
   * tier's bytes move (kvbm_manager_tier_mode) */
  bool has_volume[KVBM_TIER_COUNT];
  kvbm_volume_stats volume[KVBM_TIER_COUNT];
  char mode[KVBM_TIER_COUNT][128];
} kvbm__manager_snap;

int kvbm__manager_snapshot(kvbm_manager *m, kvbm__manager_snap *out);

/* The endpoint a manager runs when its config says metrics.enabled. */
typedef struct kvbm__manager_endpoint {
  kvbm_metrics *reg;
  kvbm_metrics_server *srv;
} kvbm__manager_endpoint;

/* Starts it (nothing when disabled): a registry with the manager's
 * collector, and the server. KVBM_EIO when the port cannot be bound. */
int kvbm__manager_endpoint_start(kvbm_manager *m, const kvbm_metrics_server_config *cfg,
                                 kvbm__manager_endpoint *ep, kvbm_error *err);
/* Stops the server and frees the registry (a render in progress ends
 * first); call it before anything the collector reads goes. */
void kvbm__manager_endpoint_stop(kvbm__manager_endpoint *ep);

#endif
