/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/w3.h: workload W3 (../shared/WORKLOADS.md), KV-aware routing.
 *
 * Not part of libkvbm: the workload module drives the library the way an
 * engine and a router would, for the `kvbm route-sim` command, benchmarks
 * and tests. It links the router's index and the events codec like any
 * other user of the public API.
 */
#ifndef KVSIM_WORKLOAD_W3_H
#define KVSIM_WORKLOAD_W3_H

#include "kvbm/router.h"
#include "workload/trace.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct kvsim_w3_config {
  uint32_t workers;        /* 8 */
  uint32_t block_size;     /* 16 */
  uint32_t capacity;       /* blocks per worker (16384) */
  size_t limit;            /* first N requests; 0 = all */
  kvbm_hash_scheme scheme; /* the workers' hashes (native) */
  bool recompute;          /* index keyed by hashes it computes from the
                              events' tokens, in index_scheme (false: the
                              workers' hashes as published) */
  kvbm_hash_scheme index_scheme; /* with recompute (dynamo) */
  kvbm_choice_config choice;
  double active_ms;        /* load model (10000): a request counts as active for this
                              long after its arrival, in trace time (0: no
                              load) */
  uint64_t seed;           /* for random routing and tie breaks */
  size_t restart_at;       /* kv-aware run: before request N (> 0), the
                              router restarts warm: its index is saved,
                              dropped and loaded back, each worker's last
                              batch is delivered again (it must be skipped
                              as already applied), and at the end the index
                              is compared with one that never stopped
                              (0: no restart) */
  const char *snapshot_path; /* the restart's snapshot goes through this
                                file (NULL: memory) */
  /* optional: called every few hundred requests and at the end */
  void (*progress)(void *user, size_t done, size_t total);
  void *progress_user;
  /* optional, kv-aware run: sees, in order, every batch the index applies
   * (as decoded; valid during the call) and every lookup's keys */
  void (*tap_batch)(void *user, uint32_t worker, const kvbm_event_batch *b);
  void (*tap_lookup)(void *user, const uint64_t *keys, size_t n);
  void *tap_user;
} kvsim_w3_config;

kvsim_w3_config kvsim_w3_config_default(void);

typedef struct kvsim_w3_policy {
  uint64_t hit_tokens;
  uint64_t prompt_tokens;
  uint64_t requests;
  double seconds;
} kvsim_w3_policy;

typedef struct kvsim_w3_result {
  kvsim_w3_policy kv_aware, random, round_robin, ideal;
  uint64_t index_mismatches; /* (lookup, worker) pairs where the event-fed
                                index and the caches disagree */
  uint64_t lookups;
  uint64_t events;           /* events applied to the index */
  uint64_t event_bytes;      /* their msgpack size */
  double index_seconds;      /* time in the index: applying events, lookups */
  double wire_seconds;       /* capture, encode, decode and apply */
  /* with restart_at: */
  bool restarted;
  bool restart_equal;        /* the restarted index's snapshot is
                                byte-equal to the never-stopped one's */
  uint64_t snapshot_bytes;   /* the restart's snapshot */
  uint64_t redelivered;      /* batches delivered again after the restart */
  uint64_t redelivered_skipped; /* of them, skipped as already applied */
} kvsim_w3_result;

/* Runs W3: `workers` W1 caches, each publishing its pool's events through
 * the vLLM msgpack codec into the router's index after every request; the
 * kv-aware router chooses from the index only, and every lookup is checked
 * against the caches. Then the same trace with random, round-robin and the
 * ideal router (which reads the caches). KVBM_ENOSPC when a request does
 * not fit in one worker. */
int kvsim_w3_run(const kvsim_trace *trace, const kvsim_w3_config *opts, kvsim_w3_result *out,
                kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVSIM_WORKLOAD_W3_H */
