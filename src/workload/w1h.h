/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/w1h.h: workload W1-hybrid (issue 20): W1 of ../shared/WORKLOADS.md
 * for a hybrid model, several KV cache groups (kvbm/group.h) over one pool of
 * `capacity` blocks, driven as vLLM's KVCacheManager drives its
 * single-type managers (docs/areas/hybrid.md states the rules; the Python
 * reference tests/workload/hybrid_ref.py is the oracle). Each request is a
 * library hybrid request (kvbm/hybrid.h), which holds the stepping rules;
 * this is the scheduler around it.
 *
 * Per request: the prefix hit every group can serve (kvbm_groups_hit over
 * the prompt's first floor((L - 1) / B) blocks); the prompt in one step, or
 * in chunks of at most max_num_batched_tokens (and, with a Mamba group, cut
 * at block boundaries as vLLM's scheduler does in "align" mode); then one
 * step per output token. Each step, in vLLM's order: every group releases
 * the blocks it no longer needs (they stay cached), takes the hit (first
 * step), allocates what the step's tokens need, and registers the blocks
 * that filled (dedup on register, W1's rule). The request releases its
 * tables, group after group, tail first.
 *
 * A request whose steps would need more blocks than the pool has is
 * refused before it runs: it changes nothing and counts in `refused`.
 * With the one group `full`, the counts are W1's.
 */
#ifndef KVSIM_W1H_H
#define KVSIM_W1H_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/group.h"
#include "kvbm/hybrid.h"
#include "kvbm/pool.h"
#include "kvbm/status.h"
#include "workload/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvsim_w1h_config {
  kvbm_group_spec groups[KVBM_GROUPS_MAX];
  size_t num_groups;                /* 1..KVBM_GROUPS_MAX */
  uint32_t block_size;              /* 16 */
  uint32_t capacity;                /* usable blocks (vLLM: num_blocks - 1), 16384 */
  uint32_t max_num_batched_tokens;  /* 0: a prompt is one step */
  kvbm_hseq_retention retention;    /* KVBM_HSEQ_RETAIN_ALL (vLLM's
                                       prefix_cache_retention_interval None, the
                                       default here) or _BOUNDARIES (vLLM's 0);
                                       kvbm/hybrid.h */
  size_t limit;                     /* first N requests; 0 = all */
  kvbm_hash_scheme scheme;
  kvbm_pool_listener listener;      /* optional: the pool's events */
  void *listener_user;
  /* optional: called for each refused request (index, why) */
  void (*on_refused)(void *user, size_t request, const char *why);
  void *refused_user;
} kvsim_w1h_config;

typedef struct kvsim_w1h_result {
  uint64_t requests;        /* every request of the slice, refused included */
  uint64_t prompt_tokens;   /* of every request, refused included */
  uint64_t hit_tokens;
  uint64_t refused;
  uint64_t blocks_allocated;
  uint64_t blocks_allocated_per_group[KVBM_GROUPS_MAX];
  uint64_t peak_blocks_held;  /* most blocks one request held after a step */
  uint64_t peak_blocks_held_per_group[KVBM_GROUPS_MAX];
  double seconds;
} kvsim_w1h_result;

/* Defaults: the group `full`, block size 16, capacity 16384, one step a
 * prompt, all requests, native hashes. */
kvsim_w1h_config kvsim_w1h_config_default(void);

/* Runs W1-hybrid. KVBM_EINVAL with a message for a bad configuration. */
int kvsim_w1h_run(const kvsim_trace *trace, const kvsim_w1h_config *cfg, kvsim_w1h_result *out,
                 kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif
