/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sequence.c: a request's block table over a pool (see kvbm/sequence.h).
 *
 * The sequence keeps, per block, its id and (for full blocks) its sequence
 * hash, so that the next block can chain from it without rereading tokens.
 * Every prompt token is hashed exactly once, in prefill. The dry run hashes
 * the blocks it looks up, and stops at the first block not registered: it
 * is side-effect free (how much of the prefix is registered, and how much of
 * that sits in the cache and would stop being evictable) and decides
 * all-or-nothing before the real match and allocation. The blocks after the
 * first miss are hashed by the pool call that fills them
 * (kvbm__pool_fill_run_hashing), a few blocks ahead of the fill: hashing is
 * arithmetic on tokens in cache and the fill is scattered loads, and in one
 * loop the core overlaps them (in two passes each waits for the other).
 * The real pass allocates and registers block by block, in order, which is
 * exactly W1's sequential rule (an allocation may evict a block that a
 * later register would have deduplicated onto). An append of whole blocks
 * from a block edge (a decode step of many tokens, W1's output) takes the
 * same run: a block opened, appended and sealed at a time cost some 400
 * instructions a block in calls and checks (callgrind, kvbm replay).
 *
 * A caller that has already hashed the prompt and taken the blocks of its
 * prefix (the tiered manager, which walks G1..G4 itself) hands both over
 * through kvbm_seq_prefill_plan: the same path from the first block the
 * caller does not hold, with nothing hashed or matched twice. Every block
 * the sequence registers carries its context (kvbm_seq_set_context) to the
 * pool's listener, through the registering call.
 */
#include "kvbm/sequence.h"

#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "pool/pool_internal.h"

struct kvbm_seq {
  kvbm_pool *pool;
  uint64_t salt_hash;
  uint32_t block_size;
  kvbm_hash_scheme scheme;
  uint8_t priority;
  void *context;    /* passed to every registering pool call */
  uint32_t *ids;    /* block table */
  uint64_t *hashes; /* sequence hashes of the full blocks */
  size_t nblocks;
  size_t cap;
  size_t ntok;
};

static size_t div_up(size_t a, size_t b) { return a / b + (a % b != 0); }

/* Blocks a sequence may have: past this, KVBM_EOVERFLOW (the bound the
 * hand-written growth had: the hashes' bytes stay under SIZE_MAX / 2). */
#define MAX_BLOCKS (SIZE_MAX / 2 / sizeof(uint64_t))

/* The block table and the hashes share one capacity: each grows from a
 * copy of it, and the rule gives both the same new one. A failure leaves
 * s->cap at the old value, which both arrays still hold. */
static int reserve(kvbm_seq *s, size_t nblocks) {
  size_t ci = s->cap, ch = s->cap;
  int rc = kvbm__vec_reserve_of(&s->ids, &ci, nblocks, 8, MAX_BLOCKS);
  if (rc == KVBM_OK) rc = kvbm__vec_reserve_of(&s->hashes, &ch, nblocks, 8, MAX_BLOCKS);
  if (rc == KVBM_OK) s->cap = ci;
  return rc;
}

int kvbm_seq_create(kvbm_pool *pool, uint64_t salt_hash, uint8_t priority, kvbm_seq **out) {
  if (!pool || !out) return KVBM_EINVAL;
  kvbm_seq *s = calloc(1, sizeof *s);
  if (!s) return KVBM_ENOMEM;
  s->pool = pool;
  s->salt_hash = salt_hash;
  s->priority = priority;
  s->block_size = kvbm_pool_block_size(pool);
  s->scheme = kvbm_pool_scheme(pool);
  *out = s;
  return KVBM_OK;
}

void kvbm_seq_destroy(kvbm_seq *s) {
  if (!s) return;
  kvbm_pool_release_run(s->pool, s->ids, s->nblocks, s->priority);
  free(s->ids);
  free(s->hashes);
  free(s);
}

/* Starts a new partial block at the end of the table (space reserved). */
static int open_block(kvbm_seq *s) {
  uint32_t id;
  int rc = kvbm_pool_alloc(s->pool, 1, &id);
  if (rc) return rc;
  size_t k = s->nblocks;
  rc = kvbm_block_init(s->pool, id, s->salt_hash, k ? s->hashes[k - 1] : 0, k > 0);
  if (rc) {
    kvbm_block_release(s->pool, id, 0);
    return rc;
  }
  s->ids[s->nblocks++] = id;
  return KVBM_OK;
}

void kvbm_seq_set_context(kvbm_seq *s, void *context) {
  if (s) s->context = context;
}

/* Hash of full block k, chained from block k - 1's (in s->hashes). */
static uint64_t hash_block(const kvbm_seq *s, const uint32_t *tokens, size_t k) {
  return kvbm_hash_next(s->scheme, s->salt_hash, k ? s->hashes[k - 1] : 0, k > 0,
                        tokens + k * s->block_size, s->block_size);
}

/* The prefill once s->hashes holds the hashes of the prompt's first
 * nhashed full blocks and held[0..nheld) the blocks (with a reference
 * each) of its first nheld. The dry run hashes the blocks it looks up as
 * it goes and stops at the first miss; the blocks after that are hashed
 * by the run that fills them (kvbm__pool_fill_run_hashing, where the
 * hashing overlaps the pool's scattered loads), so every token is still
 * hashed once. */
static int prefill_hashed(kvbm_seq *s, const uint32_t *tokens, size_t n, const uint32_t *held,
                          size_t nheld, size_t nhashed, size_t *matched_tokens) {
  const size_t B = s->block_size;
  const size_t nfull = n / B, total = div_up(n, B), matchable = (n - 1) / B;
  int rc;

  /* Dry run: nothing changes until we know everything fits. */
  size_t m = nheld, from_cache = 0;
  bool cached;
  while (m < matchable) {
    /* Blocks m and m + 1 hashed, m + 1's registry bucket on its way while
     * block m is looked up: a prefix hit's lookup waits on that line
     * otherwise. One block past the prefix is hashed here at most; the
     * fill takes its hash as known. */
    for (; nhashed < m + 2 && nhashed < matchable; nhashed++) {
      s->hashes[nhashed] = hash_block(s, tokens, nhashed);
      kvbm__pool_prefetch(s->pool, s->hashes[nhashed]);
    }
    if (kvbm_pool_peek(s->pool, s->hashes[m], &s->ids[m], &cached) != KVBM_OK) break;
    from_cache += cached;
    m++;
  }
  if (total - m > (size_t)kvbm_pool_available(s->pool) - from_cache) return KVBM_ENOSPC;

  if (nheld) memcpy(s->ids, held, nheld * sizeof *held);
  /* the dry run's ids: nothing has changed since it looked them up */
  for (size_t k = nheld; k < m; k++) (void)kvbm__pool_match_id(s->pool, s->ids[k]);
  if (nfull > m) {
    /* blocks m..nhashed - 1 have their hashes; the rest are hashed as filled */
    size_t known = nhashed > m ? nhashed - m : 0;
    if (known)
      rc = kvbm_pool_fill_run_ctx(s->pool, s->salt_hash, m ? s->hashes[m - 1] : 0, m > 0,
                                  tokens + m * B, s->hashes + m, known, s->context, s->ids + m);
    else
      rc = KVBM_OK;
    size_t k = m + known;
    if (!rc && nfull > k)
      rc = kvbm__pool_fill_run_hashing(s->pool, 0, s->salt_hash, k ? s->hashes[k - 1] : 0, k > 0,
                                       tokens + k * B, s->hashes + k, nfull - k, s->context,
                                       s->ids + k);
    if (rc) return rc; /* cannot happen: checked above */
  }
  s->nblocks = nfull;
  s->ntok = nfull * B;
  if (n > s->ntok) {
    if ((rc = open_block(s)) != KVBM_OK) return rc;
    if ((rc = kvbm_block_append(s->pool, s->ids[nfull], tokens + s->ntok, n - s->ntok)))
      return rc;
    s->ntok = n;
  }
  if (matched_tokens) *matched_tokens = m * B;
  return KVBM_OK;
}

int kvbm_seq_prefill(kvbm_seq *s, const uint32_t *tokens, size_t n, size_t *matched_tokens) {
  if (!s || !tokens || n == 0) return KVBM_EINVAL;
  if (s->ntok) return KVBM_ESTATE;
  int rc = reserve(s, div_up(n, s->block_size));
  if (rc) return rc;
  return prefill_hashed(s, tokens, n, NULL, 0, 0, matched_tokens);
}

int kvbm_seq_prefill_plan(kvbm_seq *s, const uint32_t *tokens, size_t n,
                          const kvbm_seq_plan *plan, size_t *matched_tokens) {
  if (!s || !tokens || n == 0 || !plan) return KVBM_EINVAL;
  if (s->ntok) return KVBM_ESTATE;
  const size_t B = s->block_size, nfull = n / B;
  if ((nfull && !plan->hashes) || plan->nheld > (n - 1) / B || (plan->nheld && !plan->held))
    return KVBM_EINVAL;
  int rc = reserve(s, div_up(n, B));
  if (rc) return rc;
  if (nfull) memcpy(s->hashes, plan->hashes, nfull * sizeof *s->hashes);
  return prefill_hashed(s, tokens, n, plan->held, plan->nheld, nfull, matched_tokens);
}

/* Commits and registers the full tail block, adopting a dedup target. */
static int seal_tail(kvbm_seq *s) {
  size_t k = s->nblocks - 1;
  uint32_t id = s->ids[k];
  int rc = kvbm_block_commit(s->pool, id);
  if (rc) return rc;
  kvbm_block_info info;
  kvbm_block_info_get(s->pool, id, &info);
  s->hashes[k] = info.seq_hash;
  return kvbm_block_register_ctx(s->pool, id, s->context, &s->ids[k]);
}

int kvbm_seq_append(kvbm_seq *s, const uint32_t *tokens, size_t n) {
  if (!s || (n && !tokens)) return KVBM_EINVAL;
  const size_t B = s->block_size;
  if (n > SIZE_MAX - s->ntok) return KVBM_EOVERFLOW;
  /* a fill_only pool builds no partial block (open_block's init fails):
   * refuse before the whole blocks below are taken, so that the refusal
   * changes nothing */
  if ((s->ntok + n) % B && kvbm__pool_fill_only(s->pool)) return KVBM_EUNSUPPORTED;
  size_t need = div_up(s->ntok + n, B) - div_up(s->ntok, B);
  if (need > kvbm_pool_available(s->pool)) return KVBM_ENOSPC;
  int rc = reserve(s, div_up(s->ntok + n, B));
  if (rc) return rc;
  size_t i = 0;
  while (i < n) {
    if (s->ntok % B == 0 && n - i >= B) {
      /* Whole blocks from a block edge: one run that takes, hashes and
       * registers them as prefill's does (the same blocks, order, dedups
       * and events as a block opened, appended and sealed at a time, at
       * a few hundred instructions a block less); a pool without
       * keep_tokens keeps no copy of their tokens, as of prefill's. */
      const size_t full = (n - i) / B, k = s->nblocks;
      rc = kvbm__pool_fill_run_hashing(s->pool, 0, s->salt_hash, k ? s->hashes[k - 1] : 0, k > 0, tokens + i,
                                       s->hashes + k, full, s->context, s->ids + k);
      if (rc) return rc; /* cannot happen: checked above */
      s->nblocks += full;
      s->ntok += full * B;
      i += full * B;
      continue;
    }
    if (s->ntok % B == 0 && (rc = open_block(s)) != KVBM_OK) return rc;
    size_t take = B - s->ntok % B;
    if (take > n - i) take = n - i;
    if ((rc = kvbm_block_append(s->pool, s->ids[s->nblocks - 1], tokens + i, take))) return rc;
    s->ntok += take;
    i += take;
    if (s->ntok % B == 0 && (rc = seal_tail(s)) != KVBM_OK) return rc;
  }
  return KVBM_OK;
}

int kvbm_seq_fork(kvbm_seq *s, kvbm_seq **child, uint32_t *cow_src, uint32_t *cow_dst) {
  if (!s || !child) return KVBM_EINVAL;
  const size_t B = s->block_size, nfull = s->ntok / B;
  kvbm_seq *c;
  int rc = kvbm_seq_create(s->pool, s->salt_hash, s->priority, &c);
  if (rc) return rc;
  c->context = s->context;
  if ((rc = reserve(c, s->nblocks))) {
    kvbm_seq_destroy(c);
    return rc;
  }
  uint32_t src = UINT32_MAX, dst = UINT32_MAX;
  if (s->nblocks > nfull) { /* partial tail: copy it first, the only step that can fail */
    if ((rc = open_block(c)) != KVBM_OK) {
      kvbm_seq_destroy(c);
      return rc;
    }
    src = s->ids[nfull];
    dst = c->ids[0];
    kvbm_block_info info;
    kvbm_block_info_get(s->pool, src, &info);
    /* open_block chained from c's (empty) table; redo init from the source. */
    kvbm_block_abort(s->pool, dst);
    kvbm_block_init(s->pool, dst, s->salt_hash, info.parent_hash, info.has_parent);
    kvbm_block_append(s->pool, dst, info.tokens, info.num_tokens);
  }
  for (size_t k = 0; k < nfull; k++) kvbm_block_retain(s->pool, s->ids[k]);
  memcpy(c->ids, s->ids, nfull * sizeof *c->ids);
  memcpy(c->hashes, s->hashes, nfull * sizeof *c->hashes);
  if (dst != UINT32_MAX) c->ids[nfull] = dst;
  c->nblocks = s->nblocks;
  c->ntok = s->ntok;
  if (cow_src) *cow_src = src;
  if (cow_dst) *cow_dst = dst;
  *child = c;
  return KVBM_OK;
}

void kvbm_seq_blocks(const kvbm_seq *s, const uint32_t **ids, size_t *n) {
  *ids = s->ids;
  *n = s->nblocks;
}

size_t kvbm_seq_num_tokens(const kvbm_seq *s) { return s->ntok; }

int kvbm_seq_block_hash(const kvbm_seq *s, size_t k, uint64_t *hash) {
  if (!s || !hash || k >= s->ntok / s->block_size) return KVBM_EINVAL;
  *hash = s->hashes[k];
  return KVBM_OK;
}
