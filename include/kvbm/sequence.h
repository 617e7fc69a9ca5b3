/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/sequence.h: the engine-facing API, one request's block table.
 *
 * A sequence is what vLLM's scheduler keeps per request: the blocks that hold
 * its tokens, in order. The engine
 *
 *   1. creates it (kvbm_seq_create) for a pool and a salt,
 *   2. prefills it with the prompt (kvbm_seq_prefill): the longest
 *      registered prefix is shared, the rest gets new blocks, all or
 *      nothing; the matched token count is at most L - 1 for a prompt of L
 *      (the last prompt token is always computed, as in vLLM),
 *   3. appends generated tokens (kvbm_seq_append): a token that opens a
 *      block allocates one, a block that fills is registered (and may be
 *      deduplicated onto an equal registered block),
 *   4. may fork it (kvbm_seq_fork): the child shares every full block and
 *      gets a copy of the partial tail block (copy-on-write: the engine copies
 *      that block's KV data from the reported source to the destination),
 *   5. frees it (kvbm_seq_destroy): blocks are released tail first, so a
 *      request's tail is the first of its blocks to be evicted.
 *
 * A sequence uses its pool from the pool's thread; it allocates its own
 * block table (growing geometrically), never on the pool's hot path.
 */
#ifndef KVBM_SEQUENCE_H
#define KVBM_SEQUENCE_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/pool.h"
#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvbm_seq kvbm_seq;

/* Creates an empty sequence on `pool` (which must outlive it) with salt
 * hash `salt_hash` (0: none; see kvbm_hash_salt) and the eviction priority
 * its blocks get when released (0 = evicted first). Free with
 * kvbm_seq_destroy(). */
KVBM_EXTERN int kvbm_seq_create(kvbm_pool *pool, uint64_t salt_hash, uint8_t priority,
                    kvbm_seq **out);

/* Releases every block, tail first, and frees the sequence. NULL is a no-op. */
KVBM_EXTERN void kvbm_seq_destroy(kvbm_seq *seq);

/* Matches and allocates blocks for a prompt of `n` >= 1 tokens on an empty
 * sequence. On success *matched_tokens (may be NULL) is the number of
 * leading prompt tokens whose KV is already cached. KVBM_ENOSPC when the pool
 * cannot hold the rest: then nothing changed, in the sequence or the pool
 * (cache order included). KVBM_ESTATE if the sequence is not empty. */
KVBM_EXTERN int kvbm_seq_prefill(kvbm_seq *seq, const uint32_t *tokens, size_t n,
                     size_t *matched_tokens);

/* What a caller that has already looked the prompt up hands to
 * kvbm_seq_prefill_plan, so that nothing is hashed or matched twice (the
 * tiered manager hashes the prompt once and walks G1..G4 itself). */
typedef struct kvbm_seq_plan {
  /* Sequence hashes of the prompt's n / block_size full blocks, chained
   * with the pool's scheme from the sequence's salt (kvbm_hash_next).
   * Trusted: a wrong hash registers wrong content. Copied. */
  const uint64_t *hashes;
  /* Blocks the caller holds for the prefix hashes[0..nheld): registered
   * under those hashes, one reference each. On success the references
   * pass to the sequence (the caller must not release them); on failure
   * the caller keeps them. */
  const uint32_t *held;
  size_t nheld; /* at most (n - 1) / block_size */
} kvbm_seq_plan;

/* kvbm_seq_prefill without hashing: the match starts with the plan's held
 * blocks and continues with registered blocks after them (as in
 * kvbm_seq_prefill, at most (n - 1) / block_size blocks in all); the rest
 * is allocated. *matched_tokens counts the held blocks too. The all-or-
 * nothing rule is kvbm_seq_prefill's, the held blocks needing no room.
 * KVBM_EINVAL for a NULL plan, NULL hashes (with a full block), NULL held
 * (with nheld > 0) or nheld above the limit. Cost: O(blocks), no hashing. */
KVBM_EXTERN int kvbm_seq_prefill_plan(kvbm_seq *seq, const uint32_t *tokens, size_t n,
                                      const kvbm_seq_plan *plan, size_t *matched_tokens);

/* Every block the sequence registers from now on (prefill, append) is
 * reported to the pool's listener with this context
 * (kvbm_pool_event.context): the listener learns which request registered
 * a block from the registering call. A fork inherits it. NULL: none. */
KVBM_EXTERN void kvbm_seq_set_context(kvbm_seq *seq, void *context);

/* Appends `n` tokens (decode). Whole blocks from a block edge are filled
 * as one run (a pool without keep_tokens keeps no copy of their tokens);
 * a block left partial is built token by token. KVBM_ENOSPC, with no
 * change, when the blocks they need are not available; KVBM_EUNSUPPORTED,
 * with no change, when they would leave a partial block in a fill_only
 * pool. */
KVBM_EXTERN int kvbm_seq_append(kvbm_seq *seq, const uint32_t *tokens, size_t n);

/* Forks `seq` into a new sequence *child sharing its full blocks. When seq
 * ends in a partial block the child gets a new block with the same tokens,
 * and *cow_src / *cow_dst (may be NULL) name the block whose KV data the
 * engine must copy and where; both are UINT32_MAX when nothing is to be
 * copied. KVBM_ENOSPC (no change) when that block is not available. */
KVBM_EXTERN int kvbm_seq_fork(kvbm_seq *seq, kvbm_seq **child, uint32_t *cow_src,
                  uint32_t *cow_dst);

/* The block table: ids[0..*n) in token order; valid until the next call
 * that changes the sequence. */
KVBM_EXTERN void kvbm_seq_blocks(const kvbm_seq *seq, const uint32_t **ids, size_t *n);

KVBM_EXTERN size_t kvbm_seq_num_tokens(const kvbm_seq *seq);

/* Sequence hash of full block k (k < num_tokens / block_size). */
KVBM_EXTERN int kvbm_seq_block_hash(const kvbm_seq *seq, size_t k, uint64_t *hash);

#ifdef __cplusplus
}
#endif
#endif
