/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool/pool_internal.h: pool calls for the sequence module (the library's
 * own prefill, and a hybrid request's steps) beyond kvbm/pool.h.
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
 * kvbm__pool_fill_groups_fresh is the same for a hybrid request's step, in
 * every group at once; kvbm__pool_alloc_groups and
 * kvbm__pool_fill_groups_one are a hybrid decode token's block edges, a
 * block in every group in one call.
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

/* As kvbm_pool_match of the hash block `id` is registered under, for an
 * id a peek (kvbm_pool_peek) returned with no change to the pool since:
 * the sequence's prefill looks its prefix up once, in the dry run, and
 * takes the references here without a second lookup. KVBM_EINVAL for an
 * id past the pool, KVBM_ESTATE for a block not registered (a stale id):
 * no change then. Allocates nothing. */
int kvbm__pool_match_id(kvbm_pool *pool, uint32_t id);

/* Starts loading the registry line a lookup of seq_hash (group 0) reads
 * first; changes nothing. */
void kvbm__pool_prefetch(const kvbm_pool *pool, uint64_t seq_hash);

/* Whether the pool was created fill_only (no token slots: it builds no
 * block by init/append, so a sequence refuses a partial block up front). */
bool kvbm__pool_fill_only(const kvbm_pool *pool);

/* The new full blocks of a hybrid request's step in every group at once
 * (the sequence module's hybrid request, sequence/hseq.c): for positions
 * k = 0.. of groups 0..ngroups-1, as kvbm_pool_fill_run_fresh(pool, g,
 * ...) for each group, but position by position: position k is filled in
 * every group (block taken, filled with tokens[k * block_size ...] under
 * hashes[k], registered; its id in tables[g][k]) when none of its
 * (hashes[k], g) is registered, and the run stops at the first position
 * where one is. hashes[0..nhashed) are given; the rest this call writes
 * itself (block k's sequence hash by the pool's scheme, salt_hash and the
 * parent chain from `parent`), a few positions ahead of filling them.
 * *done: the positions filled; *hashed: the hashes now in hashes[] (at
 * least *done). The blocks taken are those group-by-group runs would take
 * (free ones, then the same cached ones in the same order; only which id
 * goes to which group differs), and nothing is registered twice, so a
 * caller stepping vLLM's way gets the same counts. Only the first
 * `nregister` groups are filled and registered (and looked up for the
 * stop); the groups after them take their block at each position and
 * hold it RESET, as kvbm_pool_alloc_group(pool, g, 1, ...) would (a window
 * group under sparse retention, whose kept blocks the caller registers
 * afterwards). KVBM_EUNSUPPORTED (nothing done) for a pool of one group,
 * with a listener (its events would come position by position instead of
 * group by group), duplicate chains or token copies; KVBM_EINVAL (NULL
 * arrays with n > 0, ngroups 0 or past the pool's, nregister 0 or past
 * ngroups) or KVBM_ENOSPC (fewer than n * ngroups blocks available), with
 * no change. Allocates nothing. */
int kvbm__pool_fill_groups_fresh(kvbm_pool *pool, uint32_t ngroups, uint32_t nregister, uint64_t salt_hash,
                                 uint64_t parent, bool has_parent, const uint32_t *tokens, uint64_t *hashes,
                                 size_t nhashed, size_t n, uint32_t *const *tables, size_t *done, size_t *hashed);

/* A hybrid request's decode token that opens a block: one block for each
 * group g < ngroups, in group order, into *slots[g]; as
 * kvbm_pool_alloc_group(pool, g, 1, slots[g]) for g = 0, 1, ... in one
 * call. KVBM_EINVAL (NULL slots, ngroups 0 or past the pool's) or
 * KVBM_ENOSPC (fewer than ngroups blocks available), with no change. */
int kvbm__pool_alloc_groups(kvbm_pool *pool, uint32_t ngroups, uint32_t *const *slots);

/* A hybrid request's decode token that fills a block: the held RESET
 * block *slots[g] of each group g < ngroups filled with the same tokens
 * (block_size of them) under `hash` (its parent and salt as
 * kvbm_pool_fill_ids takes them) and registered, in group order; as
 * kvbm_pool_fill_ids(pool, slots[g], 1, ...) for g = 0, 1, ... in one call:
 * a (hash, group) registered already gives *slots[g] that block (dedup),
 * events as those calls send them. KVBM_EINVAL (NULL arguments, ngroups 0
 * or past the pool's, an id out of range or named twice) or KVBM_ESTATE
 * (a block not RESET or not held), with no change. */
int kvbm__pool_fill_groups_one(kvbm_pool *pool, uint32_t ngroups, uint32_t *const *slots, uint64_t salt_hash,
                               uint64_t parent, bool has_parent, const uint32_t *tokens, uint64_t hash);

#endif
