/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_g4_faults.c: what a faulty or hostile G4 store costs the writes
 * that go to it (issue 24), each fault as a row against a healthy
 * baseline measured in the same run.
 *
 * A row names a fault and the healthy case it is compared with; both
 * sides run the same G4-shaped workload (batches of --ops puts of --bytes,
 * one batch at a time, as the tier's offload writes them: each batch under
 * the volume's deadline) and the figure is milliseconds per batch, fault
 * over baseline. Each rep measures the baseline right before and right
 * after the fault and takes the ratio to their mean; the row reports the
 * median over --reps, with min and max, and what the fault side did per
 * batch (CLUSTER SLOTS the store was asked, ops that failed).
 *
 * Rows:
 *   cluster-moved-loop  a Redis Cluster node that answers MOVED to a node
 *                       that answers MOVED back (fake nodes on loopback,
 *                       tests/volume/fake_cluster.h), against a healthy
 *                       fake node that owns every slot and answers +OK.
 *   cluster-huge-map    a node whose slot map has 16384 single-slot
 *                       entries, every odd slot without an endpoint,
 *                       against the same map without holes.
 * Both sides of a row use the same fake server code, so the ratio is the
 * client's reaction to the fault, not a difference between servers. A new
 * row is a name, a baseline name and one function that starts either
 * side (see `rows`).
 *
 * usage: bench_g4_faults [--reps R (5)] [--batches B (1000)] [--ops N (16)]
 *                        [--bytes S (16384)] [--timeout-ms T (1000)]
 *                        [--only ROW]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/volume/fake_cluster.h"
#include "kvbm/volume.h"

typedef struct opts {
  int reps, batches, ops, bytes, timeout_ms;
  const char *only;
} opts;

/* One side of a row, running: its volume and the fake nodes under it. */
typedef struct side {
  fc_node node[2];
  int nnodes;
  kvbm_volume *v;
} side;

typedef int (*side_start_fn)(side *s, bool fault, const opts *o);

typedef struct row {
  const char *name, *baseline;
  side_start_fn start;
} row;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int open_volume(side *s, const opts *o) {
  char url[128];
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", s->node[0].port);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.key_namespace = "g4bench";
  c.timeout_ms = o->timeout_ms;
  kvbm_error e;
  if (kvbm_volume_register(&c, &s->v, &e)) {
    fprintf(stderr, "register %s: %s\n", url, e.msg);
    return -1;
  }
  return 0;
}

static int start_nodes(side *s) {
  for (int i = 0; i < s->nnodes; i++)
    if (fc_start(&s->node[i])) return -1;
  return 0;
}

/* MOVED back and forth between two nodes; healthy: one node serving. */
static int start_moved_loop(side *s, bool fault, const opts *o) {
  memset(s, 0, sizeof *s);
  s->nnodes = fault ? 2 : 1;
  for (int i = 0; i < s->nnodes; i++)
    if (fc_bind(&s->node[i])) return -1;
  if (fault) {
    s->node[0].moved_port = s->node[1].port;
    s->node[1].moved_port = s->node[0].port;
  }
  if (start_nodes(s)) return -1;
  return open_volume(s, o);
}

/* 16384 single-slot entries, odd slots without an endpoint; healthy: the
 * same map without holes. */
static int start_huge_map(side *s, bool fault, const opts *o) {
  memset(s, 0, sizeof *s);
  s->nnodes = 1;
  if (fc_bind(&s->node[0])) return -1;
  s->node[0].map = fault ? FC_MAP_HOLES : FC_MAP_SINGLES;
  if (start_nodes(s)) return -1;
  return open_volume(s, o);
}

static const row rows[] = {
    {"cluster-moved-loop", "healthy cluster node", start_moved_loop},
    {"cluster-huge-map", "16384-entry map, no holes", start_huge_map},
};

static void side_stop(side *s) {
  kvbm_volume_unregister(s->v);
  for (int i = 0; i < s->nnodes; i++) fc_stop(&s->node[i]);
}

typedef struct result {
  double ms_per_batch;
  double slots_per_batch; /* CLUSTER SLOTS the nodes were asked */
  double failed_per_batch;
  double worst_ms;
} result;

/* Runs the workload on a fresh side; -1 if it could not start. Keys are
 * new on every batch (as offloads are), from `key0` on. */
static int measure(const row *r, bool fault, const opts *o, const uint8_t *val, uint64_t key0,
                   result *out) {
  side s;
  if (r->start(&s, fault, o)) {
    fprintf(stderr, "%s: cannot start the %s side\n", r->name, fault ? "fault" : "baseline");
    return -1;
  }
  kvbm_volume_op *ops = calloc((size_t)o->ops, sizeof *ops);
  uint64_t failed = 0;
  double worst = 0, t0 = now_s();
  for (int b = 0; b < o->batches; b++) {
    for (int i = 0; i < o->ops; i++)
      ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT,
                                .key = key0 + (uint64_t)b * (uint64_t)o->ops + (uint64_t)i,
                                .src = val, .len = (size_t)o->bytes};
    double b0 = now_s();
    if (kvbm_volume_run(s.v, ops, (size_t)o->ops, NULL)) failed += (uint64_t)o->ops;
    double dt = now_s() - b0;
    if (dt > worst) worst = dt;
    for (int i = 0; i < o->ops; i++) failed += ops[i].status != KVBM_OK;
  }
  double total = now_s() - t0;
  unsigned asked = 0;
  for (int i = 0; i < s.nnodes; i++) asked += atomic_load(&s.node[i].slots_asked);
  side_stop(&s);
  free(ops);
  out->ms_per_batch = total * 1e3 / o->batches;
  out->slots_per_batch = (double)asked / o->batches;
  out->failed_per_batch = (double)failed / o->batches;
  out->worst_ms = worst * 1e3;
  return 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  opts o = {.reps = 5, .batches = 1000, .ops = 16, .bytes = 16384, .timeout_ms = 1000};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--reps") && v) o.reps = atoi(argv[++i]);
    else if (!strcmp(a, "--batches") && v) o.batches = atoi(argv[++i]);
    else if (!strcmp(a, "--ops") && v) o.ops = atoi(argv[++i]);
    else if (!strcmp(a, "--bytes") && v) o.bytes = atoi(argv[++i]);
    else if (!strcmp(a, "--timeout-ms") && v) o.timeout_ms = atoi(argv[++i]);
    else if (!strcmp(a, "--only") && v) o.only = argv[++i];
    else {
      fprintf(stderr,
              "usage: bench_g4_faults [--reps R] [--batches B] [--ops N] [--bytes S] "
              "[--timeout-ms T] [--only ROW]\n");
      return 2;
    }
  }
  if (o.reps < 1 || o.batches < 1 || o.ops < 1 || o.bytes < 1 || o.timeout_ms < 1) {
    fprintf(stderr, "bench_g4_faults: every count must be at least 1\n");
    return 2;
  }
  uint8_t *val = malloc((size_t)o.bytes);
  for (int i = 0; i < o.bytes; i++) val[i] = (uint8_t)(i * 31 + 7);
  printf("G4 faults: %d batches of %d puts of %d bytes, deadline %d ms, %d reps; ms per batch, "
         "fault / mean of the baselines before and after it\n",
         o.batches, o.ops, o.bytes, o.timeout_ms, o.reps);
  printf("%-20s %-28s %10s %10s %8s %8s %8s %12s %12s %10s\n", "row", "baseline", "base ms",
         "fault ms", "ratio", "min", "max", "slots/batch", "failed/batch", "worst ms");
  uint64_t key = 1;
  for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
    if (o.only && strcmp(o.only, rows[r].name)) continue;
    double *ratio = calloc((size_t)o.reps, sizeof *ratio);
    double base_sum = 0, fault_sum = 0, slots = 0, failed = 0, worst = 0;
    for (int rep = 0; rep < o.reps; rep++) {
      result before, fault, after;
      uint64_t span = (uint64_t)o.batches * (uint64_t)o.ops;
      if (measure(&rows[r], false, &o, val, key, &before) ||
          measure(&rows[r], true, &o, val, key + span, &fault) ||
          measure(&rows[r], false, &o, val, key + 2 * span, &after))
        return 1;
      key += 3 * span;
      double base = (before.ms_per_batch + after.ms_per_batch) / 2;
      ratio[rep] = fault.ms_per_batch / base;
      base_sum += base;
      fault_sum += fault.ms_per_batch;
      slots += fault.slots_per_batch;
      failed += fault.failed_per_batch;
      if (fault.worst_ms > worst) worst = fault.worst_ms;
    }
    qsort(ratio, (size_t)o.reps, sizeof *ratio, cmp_d);
    printf("%-20s %-28s %10.3f %10.3f %8.2f %8.2f %8.2f %12.3f %12.2f %10.1f\n", rows[r].name,
           rows[r].baseline, base_sum / o.reps, fault_sum / o.reps, ratio[o.reps / 2], ratio[0],
           ratio[o.reps - 1], slots / o.reps, failed / o.reps, worst);
    free(ratio);
  }
  free(val);
  return 0;
}
