/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool/pool_internal.h: a pool call for the sequence module (the library's
 * own prefill) beyond kvbm/pool.h.
 *
 * kvbm_pool_fill_run takes hashes the caller computed in a pass of its own
 * before the run. That pass is arithmetic on tokens in cache; the run is
 * scattered loads (the victim's record, its registry bucket, the new hash's
 * bucket) that stall. Done one after the other, neither hides the other.
 * This call hashes block k a few blocks before it fills it, in the same
 * loop, so the out-of-order core runs the hashing while the loads of the
 * blocks before it are in flight, and the registry bucket of each new hash
 * is prefetched as soon as the hash exists. Same blocks, same order, same
 * counts and events as hashing first and calling kvbm_pool_fill_run_group.
 * Not public: an engine hands kvbm hashes it already has (vLLM computes
 * them itself), and the sequence API is the engine's way to have kvbm hash.
 */
#ifndef KVBM_POOL_INTERNAL_H
#define KVBM_POOL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/pool.h"

/* As kvbm_pool_fill_run_group(pool, group, salt_hash, parent, has_parent,
 * tokens, hashes, n, context, ids), but writes hashes[k] itself: block k's
 * sequence hash by the pool's scheme (kvbm_hash_next with salt_hash and
 * the parent chain). KVBM_EINVAL (NULL arrays with n > 0, a group past the
 * list) or KVBM_ENOSPC (fewer than n blocks available), with no change and
 * no hash written. Allocates nothing. */
int kvbm__pool_fill_run_hashing(kvbm_pool *pool, uint32_t group, uint64_t salt_hash, uint64_t parent,
                                bool has_parent, const uint32_t *tokens, uint64_t *hashes, size_t n,
                                void *context, uint32_t *ids);

#endif
