/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c: a block pool's counters as metrics (kvbm/metrics.h).
 *
 * A pool has no lock (one thread drives it), so there is no collect
 * function: the driver snapshots the pool (kvbm_pool_stats_get) where it
 * drives it and hands the copy over.
 */
#include "kvbm/metrics.h"
#include "kvbm/pool.h"

void kvbm_pool_metrics_write(kvbm_metrics_writer *w, const struct kvbm_pool_stats *s,
                             const kvbm_metric_label *l, size_t nl) {
  if (!w || !s) return;
  kvbm_metric_label sl[KVBM_METRICS_MAX_LABELS];
  size_t k = 0;
  for (; k < nl && k + 1 < KVBM_METRICS_MAX_LABELS; k++) sl[k] = l[k];
  kvbm_metrics_family(w, "kvbm_pool_blocks", KVBM_METRIC_GAUGE,
                      "Blocks of the pool by state: free (empty), cached (registered and "
                      "inactive), active (held); registered counts registered blocks of any use");
  const struct {
    const char *state;
    uint32_t v;
  } st[] = {{"free", s->free}, {"cached", s->cached}, {"active", s->active},
            {"registered", s->registered}};
  for (size_t i = 0; i < sizeof st / sizeof *st; i++) {
    sl[k] = (kvbm_metric_label){"state", st[i].state};
    kvbm_metrics_value_u64(w, sl, k + 1, st[i].v);
  }
  kvbm_metrics_gauge(w, "kvbm_pool_capacity_blocks", "Blocks in the pool", l, nl, s->num_blocks);
  kvbm_metrics_counter(w, "kvbm_pool_allocated_blocks_total", "Blocks the pool handed out", l, nl,
                       s->allocated);
  kvbm_metrics_counter(w, "kvbm_pool_evicted_blocks_total",
                       "Cached blocks evicted to make room", l, nl, s->evicted);
  kvbm_metrics_counter(w, "kvbm_pool_dedup_total",
                       "Registers that found the hash already registered", l, nl, s->dedup);
  kvbm_metrics_counter(w, "kvbm_pool_match_hit_blocks_total", "Blocks returned by prefix matches",
                       l, nl, s->match_hits);
}
