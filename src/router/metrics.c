/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c: the router index's counters as metrics (kvbm/metrics.h).
 *
 * The index keeps its counters as atomics and its stats getter reads them
 * without the writer's help, so the collector may run on any thread while
 * events are applied (numbers a moment stale, never torn). Dynamo's
 * standalone indexer calls its worker count dynamo_kvindexer_workers; the
 * rest are kvbm_index_*. kvbm_index_worker_blocks is the index's size per
 * worker and tier (Dynamo counts only a total).
 */
#include <inttypes.h>
#include <stdio.h>

#include "kvbm/metrics.h"
#include "kvbm/router.h"
#include "kvbm/tier.h"

/* The index's size per worker (id and dp rank) and tier: one series per
 * live worker and tier, so a worker that leaves takes its series along. */
static void worker_blocks(const kvbm_index *idx, kvbm_metrics_writer *w) {
  kvbm_metrics_family(w, "kvbm_index_worker_blocks", KVBM_METRIC_GAUGE,
                      "Blocks the index holds for a worker (id, dp rank), by tier");
  char id[24], rank[16];
  for (uint32_t slot = 0; slot < KVBM_ROUTER_MAX_WORKERS; slot++) {
    kvbm_worker_key k;
    uint64_t n[KVBM_TIER_COUNT];
    if (!kvbm_index_slot_worker(idx, slot, &k) || kvbm_index_worker_blocks(idx, slot, n))
      continue;
    snprintf(id, sizeof id, "%" PRIu64, k.worker_id);
    snprintf(rank, sizeof rank, "%" PRIu32, k.dp_rank);
    for (int t = 0; t < KVBM_TIER_COUNT; t++) {
      kvbm_metric_label l[3] = {{"worker_id", id}, {"dp_rank", rank},
                                {"tier", kvbm_tier_name(t)}};
      kvbm_metrics_value_u64(w, l, 3, n[t]);
    }
  }
}

void kvbm_index_metrics_collect(void *user, kvbm_metrics_writer *w) {
  kvbm_index_stats s;
  kvbm_index_stats_get(user, &s);
  kvbm_metrics_gauge(w, "dynamo_kvindexer_workers", "Workers the index knows", NULL, 0, s.workers);
  kvbm_metrics_counter(w, "kvbm_index_events_applied_total", "KV events applied to the index",
                       NULL, 0, s.events);
  kvbm_metrics_family(w, "kvbm_index_blocks_total", KVBM_METRIC_COUNTER,
                      "Blocks the applied events stored and removed");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"op", "stored"}, 1, s.stored);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"op", "removed"}, 1, s.removed);
  const struct {
    const char *name, *help;
    uint64_t v;
  } c[] = {
      {"kvbm_index_clears_total", "AllBlocksCleared events applied", s.cleared},
      {"kvbm_index_duplicates_total", "Events or batches skipped as already applied (by id)",
       s.duplicates},
      {"kvbm_index_gaps_total", "Jumps in a worker's event ids", s.gaps},
      {"kvbm_index_resets_total", "Worker restarts: its blocks forgotten", s.resets},
      {"kvbm_index_jumps_total", "Ids too far ahead, skipped", s.jumps},
      {"kvbm_index_unknown_removed_total", "Removes of blocks the index did not hold",
       s.unknown_removed},
      {"kvbm_index_orphans_total", "Blocks stored under a parent the index did not know (recompute)",
       s.orphans},
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++)
    kvbm_metrics_counter(w, c[i].name, c[i].help, NULL, 0, c[i].v);
  kvbm_metrics_gauge(w, "kvbm_index_entries", "Blocks held: distinct hashes per worker, summed",
                     NULL, 0, (double)s.entries);
  kvbm_metrics_gauge(w, "kvbm_index_table_slots", "Slots of the workers' hash tables", NULL, 0,
                     (double)s.table_slots);
  kvbm_metrics_gauge(w, "kvbm_index_closed_workers", "Workers whose lookups bisect", NULL, 0,
                     s.closed_workers);
  worker_blocks(user, w);
}
