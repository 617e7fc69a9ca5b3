/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c: a fabric end's counters as metrics (kvbm/metrics.h).
 *
 * An end is driven by one thread at a time, but its counters are atomics
 * (kvbm_fabric_stats_get may run on any thread), so this is a collector:
 * the metrics endpoint's thread reads them while the end works, without a
 * lock. The labels say which end (the registration's: its label, its
 * peer's); the series say which way the bytes went: push and pull for
 * messages, write and read for one-sided accesses to the peer's blocks.
 */
#include "kvbm/fabric.h"
#include "kvbm/metrics.h"

void kvbm_fabric_metrics_collect(void *user, kvbm_metrics_writer *w) {
  kvbm_fabric_stats s;
  kvbm_fabric_stats_get(user, &s);
  const struct {
    const char *op;
    uint64_t n, bytes;
  } op[] = {{"push", s.pushes, s.push_bytes},
            {"pull", s.pulls, s.pull_bytes},
            {"write", s.writes, s.write_bytes},
            {"read", s.reads, s.read_bytes}};
  kvbm_metrics_family(w, "kvbm_fabric_ops_total", KVBM_METRIC_COUNTER,
                      "Fabric operations by kind: push and pull (messages), write and read "
                      "(one-sided, into and out of the peer's blocks; posted)");
  for (size_t i = 0; i < sizeof op / sizeof *op; i++)
    kvbm_metrics_value_u64(w, &(kvbm_metric_label){"op", op[i].op}, 1, op[i].n);
  kvbm_metrics_family(w, "kvbm_fabric_bytes_total", KVBM_METRIC_COUNTER,
                      "Bytes the fabric's operations moved, by kind");
  for (size_t i = 0; i < sizeof op / sizeof *op; i++)
    kvbm_metrics_value_u64(w, &(kvbm_metric_label){"op", op[i].op}, 1, op[i].bytes);
  kvbm_metrics_counter(w, "kvbm_fabric_failures_total",
                       "Fabric operations the transport failed (I/O, peer gone)", NULL, 0,
                       s.failures);
}
