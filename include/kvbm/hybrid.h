/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/hybrid.h: one request of a hybrid model (several KV cache groups,
 * kvbm/group.h) over one pool: a block table per group, stepped as vLLM's
 * KVCacheManager.allocate_slots steps its single-type managers
 * (vllm/v1/core/kv_cache_coordinator.py, single_type_kv_cache_manager.py;
 * the rules and the choices made are in docs/areas/hybrid.md).
 *
 * The engine, per request:
 *
 *   1. creates it (kvbm_hseq_create) on a pool configured with the same
 *      number of groups (kvbm_pool_config.num_groups), with the groups'
 *      specs, a salt, and the most tokens the request may ever hold;
 *   2. appends the prompt (kvbm_hseq_append: the pool untouched; its full
 *      blocks are hashed when first needed);
 *   3. may ask for the prefix hit (kvbm_hseq_find_hit: vLLM's
 *      get_computed_blocks, the longest block-aligned prefix of at most
 *      L - 1 tokens every group can serve; changes nothing) to size its
 *      first chunk; the first step finds it if the engine did not;
 *   4. steps (kvbm_hseq_step: a prefill chunk, or decode tokens): every
 *      group, in list order, releases the blocks it no longer needs (a
 *      window's old blocks, a chunk's previous chunks, Mamba's older states:
 *      they stay registered, so cached and evictable), takes the hit's
 *      blocks on the first step (only those it needs), allocates up to the
 *      step's end; then the blocks now full are registered (dedup on
 *      register). Allocation of every group comes before any registration,
 *      as in vLLM;
 *   5. reads a group's table (kvbm_hseq_table; KVBM_HSEQ_NULL where the
 *      group holds nothing, vLLM's null block);
 *   6. destroys it (kvbm_hseq_destroy) or reuses it for another request
 *      (kvbm_hseq_reset): the tables go back group 0 first, each tail
 *      first, as vLLM's coordinator frees them.
 *
 * All or nothing: a step that needs more blocks than the pool can hand out
 * (free + cached, counting what its own releases would give back) returns
 * KVBM_ENOSPC and changes nothing, in the request or the pool (the tokens
 * it was to append are not appended either). Hostile arguments return
 * KVBM_EINVAL with a message and change nothing.
 *
 * Memory: create sizes every buffer (tokens, hashes, one table per group)
 * for max_tokens, once. Nothing after create allocates: an engine knows its
 * max_model_len, and a step runs on the scheduler's hot path (W1-hybrid
 * steps once per decode token).
 *
 * Threads: a request uses its pool from the pool's thread (the pool is not
 * thread-safe). The pool must outlive the request.
 */
#ifndef KVBM_HYBRID_H
#define KVBM_HYBRID_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/group.h"
#include "kvbm/pool.h"
#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A table position a group does not hold (vLLM's null block). */
#define KVBM_HSEQ_NULL UINT32_MAX
/* kvbm_hseq_step's n_new for every known token not computed yet (the hit
 * excluded on the first step) */
#define KVBM_HSEQ_REST UINT64_MAX
/* max_tokens is at most this (2^31: tables index with size_t, ids are u32) */
#define KVBM_HSEQ_MAX_TOKENS (1u << 31)

typedef struct kvbm_hseq kvbm_hseq;

/* Creates an empty request on `pool` with groups[0..n) (n ==
 * kvbm_pool_num_groups(pool); group i uses the pool's group i), salt hash
 * `salt_hash` (0: none) and room for max_tokens (>= 1) tokens. KVBM_EINVAL
 * with a message for: NULL pool/groups/out, n of 0 or not the pool's
 * number of groups, a spec out of range (kind, a window or chunk of 0 or
 * above KVBM_GROUP_MAX_TOKENS, a parameter on full/mamba), max_tokens of 0
 * or above KVBM_HSEQ_MAX_TOKENS. KVBM_ENOMEM. Cost: the buffers,
 * O(max_tokens). */
KVBM_EXTERN int kvbm_hseq_create(kvbm_pool *pool, const kvbm_group_spec *groups, size_t n,
                                 uint64_t salt_hash, size_t max_tokens, kvbm_hseq **out,
                                 kvbm_error *err);

/* Releases every block (group 0 first, each table tail first) and frees the
 * request. NULL is a no-op. */
/* Which full blocks of the sliding-window and Mamba groups a request
 * registers (vLLM's CacheConfig.prefix_cache_retention_interval, at None or
 * 0; docs/areas/hybrid.md, "Session 14: sparse retention"):
 *   KVBM_HSEQ_RETAIN_ALL         every full block (vLLM's None; the
 *                                default of a new request);
 *   KVBM_HSEQ_RETAIN_BOUNDARIES  only those a hit can use at the prompt's
 *                                end or at the shared-prefix junction: a
 *                                window's cdiv(W - 1, B) blocks ending there,
 *                                Mamba's state block ending there (vLLM's 0,
 *                                its default since 2026-08).
 * Full attention and chunked local groups register every block either way.
 * A block not registered goes back to the free list when released, reused
 * before any cached block. */
typedef enum kvbm_hseq_retention {
  KVBM_HSEQ_RETAIN_ALL = 0,
  KVBM_HSEQ_RETAIN_BOUNDARIES = 1
} kvbm_hseq_retention;

/* Sets the retention for the request's next steps; it stays across
 * kvbm_hseq_reset. Set it before a request's first step: KVBM_ESTATE once
 * it has stepped (its blocks were registered by the other rule),
 * KVBM_EINVAL for a NULL request or an unknown value; nothing changes
 * then. Boundaries-retention steps take the general path (no joint pass
 * over the groups): a prefill costs more there. */
KVBM_EXTERN int kvbm_hseq_set_retention(kvbm_hseq *seq, kvbm_hseq_retention retention);

KVBM_EXTERN void kvbm_hseq_destroy(kvbm_hseq *seq);

/* Releases every block as destroy does and makes the request empty again
 * with salt `salt_hash`, keeping its buffers (no allocation). */
KVBM_EXTERN int kvbm_hseq_reset(kvbm_hseq *seq, uint64_t salt_hash);

/* Appends n known tokens (the prompt, or generated tokens before the step
 * that computes them). The pool is not touched. The blocks they fill are
 * hashed when first needed: by the hit's lookups, or by the step that
 * fills them (a prefill chunk hashes its blocks in the pool pass that
 * registers them). KVBM_EINVAL (no change) for NULL tokens with n > 0 or
 * past max_tokens. Cost: O(n) copying (none when the tokens were written
 * in place); the hashing, O(n), falls on the hit and the steps. */
KVBM_EXTERN int kvbm_hseq_append(kvbm_hseq *seq, const uint32_t *tokens, size_t n, kvbm_error *err);

/* Before the first step: finds the prefix hit over the tokens appended so
 * far (L of them: at most L - 1 tokens, a multiple of the block size) and
 * keeps it for the first step; *hit_tokens (may be NULL) gets it. Changes
 * nothing in the pool. The first step takes exactly these blocks, so the
 * pool must not change in between (as vLLM's scheduler calls
 * get_computed_blocks then allocate_slots); if one was evicted meanwhile
 * the step returns KVBM_ESTATE, gives back the hit blocks it had taken
 * (their place in the cache's eviction order is the one change) and looks
 * the hit up again at the next step. KVBM_ESTATE after the
 * first step; KVBM_EINVAL with no tokens. Cost: O(blocks) pool lookups per
 * group. */
KVBM_EXTERN int kvbm_hseq_find_hit(kvbm_hseq *seq, uint64_t *hit_tokens, kvbm_error *err);

/* One step of the scheduler: appends tokens[0..n_tokens) (as
 * kvbm_hseq_append; n_tokens may be 0) then computes n_new >= 1 more tokens
 * (KVBM_HSEQ_REST: all the known ones not computed yet),
 * from the hit on the first step (kvbm_hseq_find_hit, called here if the
 * engine did not), i.e. tokens [computed, computed + n_new), which must all
 * be known. See the file comment for what a step does. KVBM_EINVAL (with a
 * message, no change) for n_new of 0 or past the known tokens;
 * KVBM_ENOSPC (no change) when the blocks do not fit; KVBM_ESTATE when the
 * hit found earlier went stale (see kvbm_hseq_find_hit). Cost: O(blocks the step
 * allocates, registers or releases) pool calls; a decode token that opens
 * and fills no block costs O(groups). */
KVBM_EXTERN int kvbm_hseq_step(kvbm_hseq *seq, const uint32_t *tokens, size_t n_tokens,
                               uint64_t n_new, kvbm_error *err);

/* Group `group`'s block table: ids[0..*n), KVBM_HSEQ_NULL where the group
 * holds nothing (before a window, Mamba's older states). Valid until the
 * next call that changes the request. KVBM_EINVAL for a group past the
 * list. */
KVBM_EXTERN int kvbm_hseq_table(const kvbm_hseq *seq, uint32_t group, const uint32_t **ids,
                                size_t *n);

/* The prefix hit taken (or found by find_hit), in tokens; 0 before. */
KVBM_EXTERN uint64_t kvbm_hseq_hit_tokens(const kvbm_hseq *seq);
/* Tokens known (appended) and computed (the hit included). */
KVBM_EXTERN uint64_t kvbm_hseq_num_tokens(const kvbm_hseq *seq);
KVBM_EXTERN uint64_t kvbm_hseq_num_computed(const kvbm_hseq *seq);
KVBM_EXTERN size_t kvbm_hseq_num_groups(const kvbm_hseq *seq);

/* Per group since create/reset: blocks held now (non-null table entries),
 * the most held after a step, blocks allocated (hit blocks not counted). */
typedef struct kvbm_hseq_group_stats {
  uint64_t held, peak_held, allocated;
} kvbm_hseq_group_stats;
/* KVBM_EINVAL for a group past the list. */
KVBM_EXTERN int kvbm_hseq_group_stats_get(const kvbm_hseq *seq, uint32_t group,
                                          kvbm_hseq_group_stats *out);
/* The most blocks held after a step, all groups together. */
KVBM_EXTERN uint64_t kvbm_hseq_peak_held(const kvbm_hseq *seq);

#ifdef __cplusplus
}
#endif
#endif
