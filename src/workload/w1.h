/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/w1.h: workload W1 (../shared/WORKLOADS.md), sequential replay of
 * a trace through one pool, the way an engine would drive kvbm.
 *
 * Each request runs through the sequence API: prefill (match, allocate,
 * register the prompt's full blocks), append its output tokens, destroy
 * (release tail first). The counts equal the oracle
 * ../shared/tools/ref_replay.py exactly.
 */
#ifndef KVSIM_REPLAY_H
#define KVSIM_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/pool.h"
#include "kvbm/status.h"
#include "workload/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvsim_w1_result;

typedef struct kvsim_w1_config {
  uint32_t block_size;          /* tokens per block (16) */
  uint32_t capacity;            /* blocks in the pool (16384) */
  size_t limit;                 /* first N requests; 0 = all */
  kvbm_hash_scheme scheme;      /* native (default) or dynamo */
  kvbm_pool_listener listener;  /* optional: the pool's events */
  void *listener_user;
  /* optional: called every few hundred requests and at the end */
  void (*progress)(void *user, size_t done, size_t total);
  void *progress_user;
  /* optional: called once at the end with the pool, before it is destroyed */
  void (*on_finish)(void *user, const kvbm_pool *pool);
  void *finish_user;
  /* optional: called after every request on the replay's thread, with the
   * counts so far and the pool (kvbm replay --metrics-port and --plot
   * snapshot it there: the pool has no lock of its own) */
  void (*on_request)(void *user, size_t done, size_t total, const struct kvsim_w1_result *so_far,
                     const kvbm_pool *pool);
  void *request_user;
} kvsim_w1_config;

typedef struct kvsim_w1_result {
  uint64_t requests;
  uint64_t prompt_tokens;
  uint64_t hit_tokens;
  uint64_t blocks_allocated;
  double seconds; /* wall time of the replay loop (tokens made, hashed, managed) */
} kvsim_w1_result;

/* Defaults: block size 16, capacity 16384, all requests, native hashes. */
kvsim_w1_config kvsim_w1_config_default(void);

/* Runs W1. KVBM_ENOSPC with a message when one request does not fit in the
 * pool (the oracle stops there too). */
int kvsim_w1_run(const kvsim_trace *trace, const kvsim_w1_config *opts,
                   kvsim_w1_result *out, kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif
