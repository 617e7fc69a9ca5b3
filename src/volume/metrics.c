/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c: a volume's counters as metrics (kvbm/metrics.h).
 *
 * A volume's counters are atomics (kvbm_volume_stats_get reads them with
 * no lock), so its collector may run on any thread. A volume registered on
 * its own is labelled by its name (`volume`); the manager writes its G3
 * and G4 volumes' counters with the tier they serve (`tier`), through the
 * same writer (volume/metrics.h).
 */
#include <string.h>

#include "volume/metrics.h"

/* labels + one more */
static size_t with(kvbm_metric_label *out, const kvbm_metric_label *l, size_t n, const char *name,
                   const char *value) {
  size_t k = 0;
  for (; k < n && k + 1 < KVBM_METRICS_MAX_LABELS; k++) out[k] = l[k];
  out[k++] = (kvbm_metric_label){name, value};
  return k;
}

void kvbm__volume_metrics_write(kvbm_metrics_writer *w, const kvbm_volume_stats *s,
                                const kvbm_metric_label *l, size_t nl) {
  kvbm_metric_label x[KVBM_METRICS_MAX_LABELS];
  size_t k;
  kvbm_metrics_family(w, "kvbm_volume_ops_total", KVBM_METRIC_COUNTER,
                      "Operations the volume finished, by kind");
  const struct {
    const char *k;
    uint64_t v;
  } ops[] = {{"put", s->puts}, {"get", s->gets}, {"exists", s->exists}, {"delete", s->deletes}};
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    k = with(x, l, nl, "op", ops[i].k);
    kvbm_metrics_value_u64(w, x, k, ops[i].v);
  }
  kvbm_metrics_family(w, "kvbm_volume_gets_total", KVBM_METRIC_COUNTER,
                      "Gets by result: hit (the value came back) or miss (not found, timed "
                      "out, failed, corrupt)");
  k = with(x, l, nl, "result", "hit");
  kvbm_metrics_value_u64(w, x, k, s->hits);
  k = with(x, l, nl, "result", "miss");
  kvbm_metrics_value_u64(w, x, k, s->misses);
  kvbm_metrics_family(w, "kvbm_volume_bytes_total", KVBM_METRIC_COUNTER,
                      "Bytes the volume stored (put) and returned (get)");
  k = with(x, l, nl, "op", "put");
  kvbm_metrics_value_u64(w, x, k, s->bytes_put);
  k = with(x, l, nl, "op", "get");
  kvbm_metrics_value_u64(w, x, k, s->bytes_got);
  kvbm_metrics_family(w, "kvbm_volume_errors_total", KVBM_METRIC_COUNTER,
                      "Operations that ended in an error, by kind (corrupt: a stored value "
                      "failed the backend's check)");
  const struct {
    const char *k;
    uint64_t v;
  } errs[] = {{"timeout", s->timeouts}, {"io", s->io_errors}, {"full", s->full},
              {"corrupt", s->corrupt}};
  for (size_t i = 0; i < sizeof errs / sizeof *errs; i++) {
    k = with(x, l, nl, "kind", errs[i].k);
    kvbm_metrics_value_u64(w, x, k, errs[i].v);
  }
  kvbm_metrics_counter(w, "kvbm_volume_rejected_batches_total",
                       "Batches refused because the volume's queue was full", l, nl, s->rejected);
  kvbm_metrics_counter(w, "kvbm_volume_reconnects_total", "Connections re-established", l, nl,
                       s->reconnects);
  kvbm_metrics_gauge(w, "kvbm_volume_queued_batches", "Batches waiting in the volume's queue", l,
                     nl, (double)s->queued);
  /* redis+cluster:// only (0 elsewhere) */
  kvbm_metrics_counter(w, "kvbm_volume_slot_refreshes_total",
                       "Redis Cluster slot maps read (CLUSTER SLOTS asked)", l, nl,
                       s->slot_refreshes);
  kvbm_metrics_counter(w, "kvbm_volume_slot_refreshes_limited_total",
                       "Slot map refreshes a batch wanted but did not send (rate limit, or "
                       "another thread's read in flight)",
                       l, nl, s->slot_refreshes_limited);
  kvbm_metrics_counter(w, "kvbm_volume_redirect_loops_total",
                       "Operations failed at once because their slot's MOVED/ASK redirections "
                       "go in circles",
                       l, nl, s->redirect_loops);
  kvbm_metrics_counter(w, "kvbm_volume_slot_maps_refused_total",
                       "Slot maps refused as malformed (out of range, overlapping, too many "
                       "entries)",
                       l, nl, s->slot_maps_refused);
}

void kvbm_volume_metrics_collect(void *user, kvbm_metrics_writer *w) {
  kvbm_volume *v = user;
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  const char *name = kvbm_volume_name(v);
  kvbm__volume_metrics_write(w, &s, &(kvbm_metric_label){"volume", name ? name : ""}, 1);
}
