/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hseq.c: one request of a hybrid model, a block table per KV cache group
 * (kvbm/hybrid.h).
 *
 * What: vLLM's KVCacheManager.allocate_slots over its single-type managers
 * (vllm/v1/core/kv_cache_manager.py, kv_cache_coordinator.py,
 * single_type_kv_cache_manager.py), as a library call an engine makes once
 * per scheduler step. The rules and the choices made where vLLM leaves one
 * are in docs/areas/hybrid.md; tests/workload/hybrid_ref.py is the slow
 * statement this file must equal (W1-hybrid, src/workload/w1h.c, drives it
 * and is checked against it).
 *
 * Why this shape: one step is, for every group in list order, (1) release
 * the blocks the group no longer needs once `computed` tokens are done
 * (vLLM's remove_skipped_blocks: a window's old blocks, a chunk's previous
 * chunks, Mamba's older states; they stay registered, so they are cached
 * and evictable, and a later request can still hit them), (2) on the first
 * step take the hit's blocks (only those the group needs: a window takes
 * the last ones, Mamba the one state), (3) allocate blocks up to the step's
 * end, (4) register the blocks that are now full. Allocation of every group
 * comes before any registration, as in vLLM (it allocates for all groups,
 * then caches), with dedup on register. The order matters: a block taken
 * by one group may evict a block another group's registration would have
 * shared.
 *
 * Mamba has vLLM's two prefix-caching modes (kvbm/group.h). `mamba` is
 * "all": a state block per block of tokens, every one but the last
 * released at the next step (a window of one token, as far as blocks go).
 * `mamba-align` is "align": the running state lives in the request's last
 * block, the block of the state two steps back is released, a state is
 * registered when a step ends on a block boundary (the scheduler cutting
 * prefill chunks at block boundaries is the engine's part).
 *
 * All or nothing: before a step changes anything, it counts the blocks it
 * will take (new blocks, and hit blocks that sit in the cache) against
 * what the pool can hand out (kvbm_pool_available), and, only when that
 * falls short, adds what its own releases give back (blocks only this
 * request references). Allocation is the only thing that can fail, every
 * group allocates before anything registers, and nothing frees a block
 * in between, so the count decides exactly.
 *
 * A dry request (hseq_internal.h) runs the same code on counts alone, for
 * W1-hybrid's refusal of a request that could not fit an otherwise empty
 * pool.
 *
 * Memory: tokens, hashes and tables live in buffers sized at create for
 * max_tokens; a step allocates nothing (an engine knows max_model_len).
 */
#include <stdlib.h>
#include <string.h>

#include "kvbm/hash.h"
#include "kvbm/hybrid.h"
#include "pool/pool_internal.h"
#include "sequence/hseq_internal.h"

#define NUL KVBM_HSEQ_NULL

#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define NOINLINE
#define ALWAYS_INLINE inline
#endif

typedef struct gstate {
  kvbm_group_spec spec;
  uint32_t *table;
  size_t len;
  size_t ncached;     /* blocks before this are registered or null */
  bool has_ncached;   /* vLLM's num_cached_block has an entry */
  int64_t last_state; /* Mamba align: the block of the previous step's state, or -1 */
  uint64_t skip_seen; /* skipped blocks already released (what vLLM's loop
                         would find null from there down) */
  bool mamba_allocated;
  uint64_t held, peak, alloc;
} gstate;

struct kvbm_hseq {
  kvbm_pool *pool;
  uint32_t bs;
  bool bs_pow2;
  size_t ng;
  bool has_align;    /* a Mamba align group: registration in vLLM's order */
  bool dry;          /* counts only: nothing in the pool changes */
  uint64_t capacity; /* dry: the blocks the request may hold */
  kvbm_hash_scheme scheme;
  uint64_t salt;
  gstate g[KVBM_GROUPS_MAX];
  kvbm_group_spec specs[KVBM_GROUPS_MAX]; /* g[i].spec, in a row for kvbm_groups_hit */
  uint32_t *tokens;  /* known tokens */
  uint64_t *hashes;  /* of the first nhash full blocks of them (ensure_hashed) */
  size_t cap_tokens, ntok, nhash;
  uint64_t computed, hit;
  bool hit_found, stepped;
  uint64_t peak;     /* all groups */
  uint64_t quiet_end; /* a one-token step from computed < quiet_end only
                         counts the token (see next_quiet_end); 0: none */
  bool sparse;        /* KVBM_HSEQ_RETAIN_BOUNDARIES (see kept) */
  uint64_t prompt_tokens, junction; /* sparse: the prompt's length and the
                         shared-prefix junction, from the hit's lookup */
};

static uint64_t cdiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* The hashes of the first `blocks` full blocks (of those known), computed
 * when first needed: the hit's lookups need them up to the first miss,
 * and a prefill chunk's new blocks are hashed by the pool pass that fills
 * them (step_joint), a few blocks ahead, so that the hashing overlaps
 * that pass's scattered loads, as W1's prefill does
 * (kvbm__pool_fill_run_hashing). */
static void ensure_hashed(kvbm_hseq *s, size_t blocks) {
  const size_t full = s->ntok / s->bs;
  if (blocks > full) blocks = full;
  for (size_t k = s->nhash; k < blocks; k++)
    s->hashes[k] = kvbm_hash_next(s->scheme, s->salt, k ? s->hashes[k - 1] : 0, k > 0, s->tokens + k * s->bs, s->bs);
  if (blocks > s->nhash) s->nhash = blocks;
}

/* kvbm_groups_hit's question, answered by the pool without touching it. */
static bool cached_in(void *user, uint32_t group, size_t block) {
  kvbm_hseq *s = user;
  /* a window group's lookups revisit hashed positions: no call for them */
  if (block >= s->nhash) ensure_hashed(s, block + 1);
  return kvbm_pool_peek_group(s->pool, group, s->hashes[block], NULL, NULL) == KVBM_OK;
}

/* The first hit block a group takes (those before are skipped: null). */
static size_t hit_first(const kvbm_hseq *s, const gstate *g) {
  return (size_t)(kvbm_group_skipped_tokens(&g->spec, s->hit) / s->bs);
}

/* The blocks a group no longer needs at `computed` tokens: table[*lo..*hi)
 * (non-null), and whether Mamba align's older state goes too. Pure. */
static void skipped_range(const kvbm_hseq *s, const gstate *g, uint64_t computed, uint64_t skipped,
                          size_t *lo, size_t *hi, bool *old_state) {
  *lo = *hi = 0;
  *old_state = false;
  /* Most steps (a decode token) leave the skipped block count as it was:
   * vLLM's loop would stop at once on a null. */
  if (skipped / s->bs > g->skip_seen) {
    size_t h = (size_t)(skipped / s->bs), l;
    if (h > g->len) h = g->len; /* vLLM caps it to the blocks there are */
    if (g->spec.kind != KVBM_GROUP_MAMBA_ALIGN) {
      /* vLLM's loop, from h - 1 down to the first null, without the walk:
       * outside Mamba align's tables the nulls are exactly [0, n0), n0 the
       * hit's skipped blocks (take_hit) or the blocks released so far,
       * whichever is more (every release frees down to the first null, and
       * tables only grow at their end), so the walk stops at min(h, n0). A
       * walk read every released block's id once more (7M instructions of
       * `kvbm replay --groups full,sw:128 --limit 2000`). */
      size_t n0 = s->stepped ? hit_first(s, g) : 0;
      if (n0 < g->skip_seen) n0 = (size_t)g->skip_seen;
      l = h < n0 ? h : n0;
    } else {
      for (l = h; l > 0 && g->table[l - 1] != NUL; l--) continue;
    }
    *lo = l;
    *hi = h;
  }
  if (g->spec.kind == KVBM_GROUP_MAMBA_ALIGN && g->last_state >= 0) {
    size_t lsi = (size_t)g->last_state;
    *old_state = lsi + 1 < cdiv(computed, s->bs) && g->table[lsi] != NUL && !(lsi >= *lo && lsi < *hi);
  }
}

static uint64_t skipped_tokens(const gstate *g, uint64_t computed) {
  return g->spec.kind == KVBM_GROUP_FULL ? 0 : kvbm_group_skipped_tokens(&g->spec, computed);
}

/* vLLM's remove_skipped_blocks (and Mamba align's release of the state two
 * steps back), for `computed` tokens done, `skipped` of them skipped. */
static int remove_skipped(kvbm_hseq *s, gstate *g, uint64_t computed, uint64_t skipped) {
  int rc = KVBM_OK;
  size_t lo, hi;
  bool old_state;
  if (skipped / s->bs > g->skip_seen) {
    skipped_range(s, g, computed, skipped, &lo, &hi, &old_state);
    g->skip_seen = hi;
    if (hi > lo) {
      /* release_run goes from hi - 1 down, as vLLM frees them */
      if (!s->dry) rc = kvbm_pool_release_run(s->pool, g->table + lo, hi - lo, 0);
      for (size_t i = lo; i < hi; i++) g->table[i] = NUL;
      g->held -= hi - lo;
    }
  }
  if (g->spec.kind == KVBM_GROUP_MAMBA_ALIGN && g->last_state >= 0) {
    size_t lsi = (size_t)g->last_state;
    if (lsi + 1 < cdiv(computed, s->bs) && g->table[lsi] != NUL) {
      if (!s->dry && rc == KVBM_OK) rc = kvbm_block_release(s->pool, g->table[lsi], 0);
      g->table[lsi] = NUL;
      g->held--;
    }
  }
  return rc;
}

/* Every group's remove_skipped. Most steps (a decode token) leave every
 * group's skipped block count as it was (vLLM's loop would stop at once on
 * a null): that is decided here, without a call. */
static ALWAYS_INLINE int remove_skipped_all(kvbm_hseq *s, uint64_t computed) {
  int rc = KVBM_OK;
  for (uint32_t gi = 0; gi < s->ng && !rc; gi++) {
    gstate *g = &s->g[gi];
    if (g->spec.kind == KVBM_GROUP_FULL) continue;
    uint64_t skipped = kvbm_group_skipped_tokens(&g->spec, computed);
    if (skipped / s->bs > g->skip_seen || g->spec.kind == KVBM_GROUP_MAMBA_ALIGN)
      rc = remove_skipped(s, g, computed, skipped);
  }
  return rc;
}

/* allocate_new_computed_blocks: the hit's blocks this group needs (those
 * after its skipped ones), the skipped positions null. KVBM_ESTATE when
 * one is no longer registered (the caller gives the taken ones back). */
static int take_hit(kvbm_hseq *s, uint32_t gi) {
  gstate *g = &s->g[gi];
  size_t nb = (size_t)(s->hit / s->bs), nsb = hit_first(s, g);
  ensure_hashed(s, nb);
  for (size_t i = 0; i < nb; i++) {
    uint32_t id = 0;
    if (i < nsb) {
      id = NUL;
    } else {
      if (!s->dry && kvbm_pool_match_group(s->pool, gi, s->hashes[i], &id) != KVBM_OK) {
        g->len = i;
        return KVBM_ESTATE;
      }
      g->held++;
    }
    g->table[i] = id;
  }
  g->len = nb;
  g->ncached = nb;
  g->has_ncached = true;
  return KVBM_OK;
}

static int alloc_n(kvbm_hseq *s, uint32_t gi, size_t n) {
  gstate *g = &s->g[gi];
  if (!s->dry) {
    int rc = kvbm_pool_alloc_group(s->pool, gi, (uint32_t)n, g->table + g->len);
    if (rc) return rc;
  } else {
    for (size_t i = 0; i < n; i++) g->table[g->len + i] = 0;
  }
  g->len += n;
  g->held += n;
  g->alloc += n;
  return KVBM_OK;
}

/* allocate_new_blocks: slots for num_tokens. Mamba in align mode keeps
 * only the running state's block: the positions before it are null (in
 * "all" mode it allocates as attention does). */
static int allocate(kvbm_hseq *s, uint32_t gi, uint64_t num_tokens) {
  gstate *g = &s->g[gi];
  size_t required = (size_t)cdiv(num_tokens, s->bs);
  if (g->spec.kind != KVBM_GROUP_MAMBA_ALIGN)
    return required > g->len ? alloc_n(s, gi, required - g->len) : KVBM_OK;
  if (required <= g->len) return KVBM_OK;
  size_t prev = g->len;
  if (g->mamba_allocated || prev > 0) g->last_state = (int64_t)prev - 1;
  while (g->len + 1 < required) g->table[g->len++] = NUL;
  int rc = alloc_n(s, gi, required - g->len);
  g->mamba_allocated = true;
  return rc;
}

/* Whether group g registers every block it fills (kept is true for all
 * of them): every group but a sliding-window or Mamba one under sparse
 * retention. */
static bool caches_all(const kvbm_hseq *s, const gstate *g) {
  return !s->sparse || g->spec.kind == KVBM_GROUP_FULL || g->spec.kind == KVBM_GROUP_CHUNKED_LOCAL;
}

/* The groups 0..n-1 that the joint pass (step_joint) and the decode edge
 * (step_decode_edge) register position by position: the leading groups
 * that cache every block. The pool's calls for them take a prefix of the
 * group list; the groups after it allocate there and register on their
 * own. */
static uint32_t joint_groups(const kvbm_hseq *s) {
  uint32_t n = 0;
  while (n < s->ng && caches_all(s, &s->g[n])) n++;
  return n;
}

/* The groups the joint pass serves: the nreg leading groups that cache
 * every block, and every group after them when none of those does (each
 * then takes its blocks in the pass, and registers its kept ones in
 * cache()); a group that caches every block after one that does not
 * leaves the pass to the leading ones. */
static uint32_t joint_takers(const kvbm_hseq *s, uint32_t nreg) {
  for (uint32_t gi = nreg; gi < s->ng; gi++)
    if (caches_all(s, &s->g[gi])) return nreg;
  return (uint32_t)s->ng;
}

/* The blocks of group g cached when full (vLLM's reachable_block_mask),
 * as at most two ranges [lo, hi) in position order, their number returned
 * (kept: whether block i is among them). Dense (the default): every
 * block. Sparse (vLLM's prefix_cache_retention_interval 0, its default
 * since 2026-08): kvbm_group_kept_ranges (kvbm/group.h), the one rule the
 * tier manager's hybrid requests follow too. A block not kept is never
 * registered: released, it goes back to the free list, reused before any
 * cached block, as vLLM prepends unhashed blocks to its free queue. */
static size_t kept_ranges(const kvbm_hseq *s, const gstate *g, size_t lo[2], size_t hi[2]) {
  if (!s->sparse) {
    lo[0] = 0, hi[0] = SIZE_MAX;
    return 1;
  }
  return kvbm_group_kept_ranges(&g->spec, s->bs, s->prompt_tokens, s->junction, lo, hi);
}

static bool kept(const kvbm_hseq *s, const gstate *g, size_t i) {
  size_t lo[2], hi[2], n = kept_ranges(s, g, lo, hi);
  for (size_t r = 0; r < n; r++)
    if (i >= lo[r] && i < hi[r]) return true;
  return false;
}

/* cache_blocks: registers the blocks full at num_tokens (dedup: a block
 * whose (hash, group) is registered is swapped for the registered one),
 * those that are kept (all, but with sparse retention): the kept ranges
 * are walked, not every position asked (a sparse window group's prefill
 * keeps a few blocks of thousands). */
static int cache(kvbm_hseq *s, uint32_t gi, uint64_t num_tokens) {
  gstate *g = &s->g[gi];
  size_t nf = (size_t)(num_tokens / s->bs), nc = g->has_ncached ? g->ncached : 0;
  if (nc >= nf) return KVBM_OK;
  size_t lo[2], hi[2], nr = s->dry ? 0 : kept_ranges(s, g, lo, hi);
  for (size_t r = 0; r < nr; r++)
    for (size_t i = lo[r] > nc ? lo[r] : nc, e = hi[r] < nf ? hi[r] : nf; i < e;) {
      if (g->table[i] == NUL) {
        i++;
        continue;
      }
      size_t j = i + 1; /* a run of blocks to register, in one pool call */
      while (j < e && g->table[j] != NUL) j++;
      int rc = kvbm_pool_fill_ids(s->pool, g->table + i, j - i, s->salt, i ? s->hashes[i - 1] : 0, i > 0,
                                  s->tokens + i * s->bs, s->hashes + i, NULL);
      if (rc) return rc;
      i = j;
    }
  g->ncached = nf;
  g->has_ncached = true;
  return KVBM_OK;
}

/* allocate + cache of one group (not Mamba align), block by block: the
 * blocks allocated earlier that are now full, then the new full blocks
 * (taken and registered in one pool call, W1's hot path), then the new
 * partial tail. That is vLLM's order (every group's allocation before any
 * registration) as long as no registration deduplicates: then no block
 * goes back to the free list during the step, so both orders take the same
 * blocks (free ones, then the same cached ones evicted in the same order),
 * and taking only removes registry entries, so a registration that finds
 * nothing here finds nothing in vLLM's order either. So this stops before
 * the first block whose (hash, group) is registered, and returns false:
 * the caller finishes the step from this group on in vLLM's order. */
static bool step_group_fast(kvbm_hseq *s, uint32_t gi, uint64_t end, int *rc) {
  gstate *g = &s->g[gi];
  const size_t required = (size_t)cdiv(end, s->bs), nf = (size_t)(end / s->bs);
  const size_t nc = g->has_ncached ? g->ncached : 0;
  if (nc < nf && nc < g->len) { /* old blocks now full (no nulls here: see below) */
    size_t stop = nf < g->len ? nf : g->len;
    if (kvbm_pool_first_registered_group(s->pool, gi, s->hashes + nc, stop - nc) < stop - nc) return false;
    *rc = kvbm_pool_fill_ids(s->pool, g->table + nc, stop - nc, s->salt, nc ? s->hashes[nc - 1] : 0, nc > 0,
                             s->tokens + nc * s->bs, s->hashes + nc, NULL);
    if (*rc) return true;
    g->ncached = stop;
    g->has_ncached = true;
  }
  if (nf > g->len) { /* new full blocks */
    size_t k = g->len, n = nf - k, done = 0;
    *rc = kvbm_pool_fill_run_fresh(s->pool, gi, s->salt, k ? s->hashes[k - 1] : 0, k > 0,
                                   s->tokens + k * s->bs, s->hashes + k, n, NULL, g->table + k, &done);
    if (*rc) return true;
    g->len += done;
    g->held += done;
    g->alloc += done;
    g->ncached = g->len;
    g->has_ncached = true;
    if (done < n) return false;
  }
  if (required > g->len) *rc = alloc_n(s, gi, required - g->len); /* the partial tail */
  if (!*rc && nf > (g->has_ncached ? g->ncached : 0)) {
    g->ncached = nf;
    g->has_ncached = true;
  }
  return true;
}

/* The new full blocks of every group in one pool pass, position by
 * position (kvbm__pool_fill_groups_fresh): a prefill chunk's blocks have
 * the same hashes in every group, so the pass hashes each once (a few
 * blocks ahead of filling it) and reads its parent and tokens once for
 * all groups, instead of a pass a group. Only where every group stands at
 * the same table length with nothing left to register (a chunk's start;
 * not Mamba align, whose table differs); the pass stops where a group
 * would deduplicate, and step_group_fast then goes on from there, group by
 * group, as without it. The blocks taken are the same (only which id goes
 * to which group differs), and nothing frees a block until every group's
 * are taken, as in step_group_fast. Under sparse retention the leading
 * groups that cache every block (joint_groups, `nreg` of them) are filled
 * and registered in it, and the groups after them up to `ntake`
 * (joint_takers) take their blocks in it, unregistered. */
static void step_joint(kvbm_hseq *s, uint32_t nreg, uint32_t ntake, uint64_t end, int *rc) {
  const size_t len = s->g[0].len, nf = (size_t)(end / s->bs);
  if (nf <= len) return;
  uint32_t *tabs[KVBM_GROUPS_MAX];
  for (size_t gi = 0; gi < ntake; gi++) {
    const gstate *g = &s->g[gi];
    if (g->len != len || (g->has_ncached ? g->ncached : 0) < len) return;
    tabs[gi] = g->table + len;
  }
  ensure_hashed(s, len); /* the parent */
  if (s->nhash < len) return; /* not known: never with every block registered */
  size_t done = 0, hashed = 0;
  *rc = kvbm__pool_fill_groups_fresh(s->pool, ntake, nreg, s->salt, len ? s->hashes[len - 1] : 0, len > 0,
                                     s->tokens + len * s->bs, s->hashes + len, s->nhash - len, nf - len, tabs,
                                     &done, &hashed);
  if (*rc == KVBM_EUNSUPPORTED) *rc = KVBM_OK; /* a listener: group by group */
  if (len + hashed > s->nhash) s->nhash = len + hashed;
  for (size_t gi = 0; gi < ntake && done; gi++) {
    gstate *g = &s->g[gi];
    g->len += done;
    g->held += done;
    g->alloc += done;
    if (gi < nreg) { /* registered; the others' kept blocks: cache() */
      g->ncached = g->len;
      g->has_ncached = true;
    }
  }
}

/* The blocks group g allocates in a step ending at `end` (the hit taken
 * already counted in its length on the first step). Pure. */
static uint64_t blocks_to_allocate(const kvbm_hseq *s, const gstate *g, uint64_t end, bool first) {
  size_t len = first ? (size_t)(s->hit / s->bs) : g->len;
  size_t required = (size_t)cdiv(end, s->bs);
  if (required <= len) return 0;
  return g->spec.kind == KVBM_GROUP_MAMBA_ALIGN ? 1 : required - len;
}

/* Whether a real step ending at `end` fits the pool (the all-or-nothing
 * check, see the file comment). KVBM_ENOSPC or KVBM_ESTATE (a hit block
 * gone) when not. Pure. */
static int check_fits(const kvbm_hseq *s, uint64_t end, bool first) {
  uint64_t need = 0, take = 0;
  for (size_t gi = 0; gi < s->ng; gi++) {
    need += blocks_to_allocate(s, &s->g[gi], end, first);
    if (first && s->hit) take += s->hit / s->bs - hit_first(s, &s->g[gi]);
  }
  if (need + take == 0) return KVBM_OK; /* most decode steps */
  uint64_t avail = kvbm_pool_available(s->pool);
  if (need + take <= avail) return KVBM_OK; /* the common case: no lookups */
  /* Precisely: a hit block costs one only when cached; a released block
   * gives one back only when this request is its one reference. */
  uint64_t cost = need, gain = 0;
  for (uint32_t gi = 0; first && s->hit && gi < s->ng; gi++)
    for (size_t i = hit_first(s, &s->g[gi]); i < s->hit / s->bs; i++) {
      bool cached = false;
      if (kvbm_pool_peek_group(s->pool, gi, s->hashes[i], NULL, &cached) != KVBM_OK) return KVBM_ESTATE;
      cost += cached;
    }
  for (size_t gi = 0; !first && gi < s->ng; gi++) {
    const gstate *g = &s->g[gi];
    size_t lo, hi;
    bool old_state;
    skipped_range(s, g, s->computed, skipped_tokens(g, s->computed), &lo, &hi, &old_state);
    for (size_t i = lo; i < hi + old_state; i++) {
      size_t at = i < hi ? i : (size_t)g->last_state;
      kvbm_block_info info;
      if (kvbm_block_info_get(s->pool, g->table[at], &info) == KVBM_OK && info.refcount == 1) gain++;
    }
  }
  return cost <= avail + gain ? KVBM_OK : KVBM_ENOSPC;
}

/* A decode token that neither opens nor fills a block: it allocates and
 * registers nothing in any group (Mamba align too: its running block
 * changes only where a block opens), it can only release. */
static bool quiet_decode(const kvbm_hseq *s, uint64_t num_new) {
  if (!s->stepped || num_new != 1) return false;
  uint64_t r = s->bs_pow2 ? (s->computed & (s->bs - 1)) : s->computed % s->bs;
  return r != 0 && r + 1 != s->bs;
}

/* The least `computed` at which group g's skipped block count passes
 * skip_seen, i.e. kvbm_group_skipped_tokens(spec, c) >= (skip_seen + 1) *
 * bs: that function inverted, kind by kind (UINT64_MAX: never). */
static uint64_t next_skip(const kvbm_hseq *s, const gstate *g) {
  const uint64_t t = (g->skip_seen + 1) * s->bs;
  switch (g->spec.kind) {
    case KVBM_GROUP_SLIDING_WINDOW: return t + g->spec.tokens - 1; /* c + 1 - W >= t */
    case KVBM_GROUP_CHUNKED_LOCAL: return cdiv(t, g->spec.tokens) * g->spec.tokens;
    case KVBM_GROUP_MAMBA: return t + 1; /* c - 1 >= t */
    default: return UINT64_MAX;
  }
}

/* Where the run of one-token steps that only count their token ends, from
 * s->computed: a step from c does nothing in any group when c neither
 * opens a block (c % bs == 0) nor fills one (c % bs == bs - 1, see
 * quiet_decode) and no group's skipped block count moves at c. Decode
 * tokens are most of a request's steps (15 of 16 with blocks of 16 and a
 * window a multiple of 16): kvbm_hseq_step answers those with one
 * comparison (callgrind, `kvbm replay --groups full,sw:128
 * --max-num-batched-tokens 8192 --limit 2000`: see docs/areas/hybrid.md).
 * Mamba align releases its old state at a position of its own: none. */
static uint64_t next_quiet_end(const kvbm_hseq *s) {
  const uint64_t c = s->computed;
  if (!s->stepped || s->has_align || s->bs < 3 || c % s->bs == 0) return 0;
  uint64_t end = c - c % s->bs + s->bs - 1; /* the token that fills the block */
  for (size_t gi = 0; gi < s->ng; gi++) {
    uint64_t e = next_skip(s, &s->g[gi]);
    if (e < end) end = e;
  }
  if (end > s->ntok) end = s->ntok; /* a step needs its token known */
  return end > c ? end : 0;
}

/* One step of allocate_slots: n_new tokens computed from s->computed.
 * KVBM_ENOSPC (dry: the request would hold more than capacity). */
static int step(kvbm_hseq *s, uint64_t num_new) {
  int rc = KVBM_OK;
  const bool first = !s->stepped;
  const uint64_t computed = s->computed, end = computed + num_new;
  rc = remove_skipped_all(s, computed);
  /* held only fell: done */
  if (!rc && quiet_decode(s, num_new)) return KVBM_OK;
  if (first && s->hit > 0)
    for (uint32_t gi = 0; gi < s->ng && !rc; gi++) {
      rc = take_hit(s, gi);
      if (rc && !s->dry) /* a stale hit: give back what was taken, tail first */
        for (uint32_t gj = gi + 1; gj-- > 0;) {
          gstate *g = &s->g[gj];
          for (size_t i = g->len; i-- > 0;)
            if (g->table[i] != NUL) kvbm_block_release(s->pool, g->table[i], 0);
          g->len = g->ncached = 0;
          g->has_ncached = false;
          g->held = 0;
        }
    }
  /* Block by block while that is vLLM's order (step_group_fast), then, from
   * the first group that would deduplicate, vLLM's order itself. (Null
   * positions never lie among a group's blocks to register but in Mamba
   * align's tables, which always take vLLM's order.) A group that caches
   * only some blocks (sparse retention, kept) allocates here and registers
   * after every group has allocated (`deferred`), as vLLM does; the block
   * by block groups around it may still go first, because a registration
   * that deduplicates nothing frees nothing, and only a free (or the
   * allocations' order) could change what another group's step finds. */
  const bool fast = !s->dry && !s->has_align;
  const uint32_t nreg = joint_groups(s), ntake = joint_takers(s, nreg);
  if (fast && ntake > 1 && nreg > 0 && !rc) step_joint(s, nreg, ntake, end, &rc);
  if (!s->dry) ensure_hashed(s, (size_t)(end / s->bs)); /* what step_joint left */
  uint32_t deferred = 0; /* groups whose registration waits for cache() below */
  bool general = !fast;
  for (uint32_t gi = 0; gi < s->ng && !rc; gi++) {
    if (!general && caches_all(s, &s->g[gi])) {
      if (step_group_fast(s, gi, end, &rc)) continue;
      general = true; /* this group would deduplicate: vLLM's order from here */
    }
    rc = allocate(s, gi, end);
    deferred |= 1u << gi;
  }
  if (s->dry && !rc) {
    /* vLLM's check: the step's new and touched blocks within what is free,
     * i.e. what the request holds after the step within the pool */
    uint64_t after = 0;
    for (uint32_t gi = 0; gi < s->ng; gi++) after += s->g[gi].held;
    if (after > s->capacity) return KVBM_ENOSPC;
  }
  uint64_t held = 0;
  for (uint32_t gi = 0; gi < s->ng && !rc; gi++) {
    gstate *g = &s->g[gi];
    if (deferred & (1u << gi)) rc = cache(s, gi, end);
    if (g->held > g->peak) g->peak = g->held;
    held += g->held;
  }
  if (held > s->peak) s->peak = held;
  return rc;
}

static void clear_tables(kvbm_hseq *s) {
  for (size_t gi = 0; gi < s->ng; gi++) {
    gstate *g = &s->g[gi];
    g->len = g->ncached = 0;
    g->has_ncached = g->mamba_allocated = false;
    g->last_state = -1;
    g->skip_seen = 0;
    g->held = g->peak = g->alloc = 0;
  }
  s->peak = 0;
  s->computed = 0;
  s->stepped = false;
  s->quiet_end = 0;
}

/* The tables back to the pool: group after group, tail first (vLLM's
 * coordinator frees group 0 first, each manager its blocks reversed). The
 * runs between nulls go back from the last one (release_run frees each
 * from its end), so the order is the table's reversed without a copy. */
static int release_all(kvbm_hseq *s) {
  int first_rc = KVBM_OK;
  for (size_t gi = 0; gi < s->ng; gi++) {
    gstate *g = &s->g[gi];
    /* What the walk need not read: but in Mamba align's tables, the
     * blocks below skip_seen were all released (remove_skipped frees from
     * the last skipped block down to the first null), and a full
     * attention table has no null at all, so it is one run. (A sliding
     * window's table of a long request is mostly nulls: walking them was
     * a third of this function's instructions.) */
    const bool align = g->spec.kind == KVBM_GROUP_MAMBA_ALIGN;
    const size_t floor = align ? 0 : (size_t)g->skip_seen;
    const bool no_nulls = g->spec.kind == KVBM_GROUP_FULL;
    for (size_t hi = g->len; hi > floor && !s->dry;) {
      if (g->table[hi - 1] == NUL) {
        hi--;
        continue;
      }
      size_t lo = no_nulls ? floor : hi - 1;
      while (lo > floor && g->table[lo - 1] != NUL) lo--;
      int rc = kvbm_pool_release_run(s->pool, g->table + lo, hi - lo, 0);
      if (rc && !first_rc) first_rc = rc;
      hi = lo;
    }
    g->len = 0;
  }
  return first_rc;
}

static int check_spec(const kvbm_group_spec *g, size_t i, kvbm_error *err) {
  bool param = g->kind == KVBM_GROUP_SLIDING_WINDOW || g->kind == KVBM_GROUP_CHUNKED_LOCAL;
  if ((unsigned)g->kind > KVBM_GROUP_MAMBA_ALIGN)
    return kvbm_error_set(err, KVBM_EINVAL, "hseq: group %zu: unknown kind %d", i, (int)g->kind);
  if (param && (g->tokens == 0 || g->tokens > KVBM_GROUP_MAX_TOKENS))
    return kvbm_error_set(err, KVBM_EINVAL, "hseq: group %zu (%s): %u tokens, want 1..%u", i,
                          kvbm_group_kind_name(g->kind), g->tokens, KVBM_GROUP_MAX_TOKENS);
  if (!param && g->tokens != 0)
    return kvbm_error_set(err, KVBM_EINVAL, "hseq: group %zu (%s) takes no token parameter (got %u)", i,
                          kvbm_group_kind_name(g->kind), g->tokens);
  return KVBM_OK;
}

int kvbm_hseq_create(kvbm_pool *pool, const kvbm_group_spec *groups, size_t n, uint64_t salt_hash,
                     size_t max_tokens, kvbm_hseq **out, kvbm_error *err) {
  if (!pool || !groups || !out) return kvbm_error_set(err, KVBM_EINVAL, "hseq: NULL pool, groups or out");
  if (n == 0 || n != kvbm_pool_num_groups(pool))
    return kvbm_error_set(err, KVBM_EINVAL, "hseq: %zu groups on a pool of %u groups", n,
                          kvbm_pool_num_groups(pool));
  for (size_t i = 0; i < n; i++) {
    int rc = check_spec(&groups[i], i, err);
    if (rc) return rc;
  }
  if (max_tokens == 0 || max_tokens > KVBM_HSEQ_MAX_TOKENS)
    return kvbm_error_set(err, KVBM_EINVAL, "hseq: max_tokens %zu, want 1..%u", max_tokens,
                          KVBM_HSEQ_MAX_TOKENS);
  kvbm_hseq *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "hseq: out of memory");
  s->pool = pool;
  s->bs = kvbm_pool_block_size(pool);
  s->bs_pow2 = (s->bs & (s->bs - 1)) == 0;
  s->scheme = kvbm_pool_scheme(pool);
  s->salt = salt_hash;
  s->ng = n;
  s->cap_tokens = max_tokens;
  size_t max_blocks = max_tokens / s->bs + 2;
  s->tokens = malloc(max_tokens * sizeof *s->tokens);
  s->hashes = malloc(max_blocks * sizeof *s->hashes);
  bool ok = s->tokens && s->hashes;
  for (size_t i = 0; i < n; i++) {
    s->g[i].spec = s->specs[i] = groups[i];
    s->has_align |= groups[i].kind == KVBM_GROUP_MAMBA_ALIGN;
    if (ok) ok = (s->g[i].table = malloc(max_blocks * sizeof(uint32_t))) != NULL;
  }
  clear_tables(s);
  if (!ok) {
    kvbm_hseq_destroy(s);
    return kvbm_error_set(err, KVBM_ENOMEM, "hseq: out of memory for %zu tokens", max_tokens);
  }
  *out = s;
  return KVBM_OK;
}

void kvbm_hseq_destroy(kvbm_hseq *s) {
  if (!s) return;
  if (s->tokens && s->hashes) release_all(s);
  for (size_t i = 0; i < s->ng; i++) free(s->g[i].table);
  free(s->tokens);
  free(s->hashes);
  free(s);
}

int kvbm_hseq_reset(kvbm_hseq *s, uint64_t salt_hash) {
  if (!s) return KVBM_EINVAL;
  int rc = release_all(s);
  clear_tables(s);
  s->salt = salt_hash;
  s->ntok = s->nhash = 0;
  s->hit = 0;
  s->hit_found = false;
  return rc;
}

int kvbm_hseq_append(kvbm_hseq *s, const uint32_t *tokens, size_t n, kvbm_error *err) {
  if (!s) return kvbm_error_set(err, KVBM_EINVAL, "hseq: NULL request");
  if (n == 0) return KVBM_OK;
  if (!tokens) return kvbm_error_set(err, KVBM_EINVAL, "hseq: NULL tokens");
  if (n > s->cap_tokens - s->ntok)
    return kvbm_error_set(err, KVBM_EINVAL, "hseq: %zu tokens past max_tokens %zu (%zu held)", n,
                          s->cap_tokens, s->ntok);
  if (tokens != s->tokens + s->ntok) /* written in place (kvbm__hseq_tail) */
    memcpy(s->tokens + s->ntok, tokens, n * sizeof *tokens);
  s->ntok += n;
  return KVBM_OK;
}

int kvbm_hseq_find_hit(kvbm_hseq *s, uint64_t *hit_tokens, kvbm_error *err) {
  if (!s) return kvbm_error_set(err, KVBM_EINVAL, "hseq: NULL request");
  if (s->stepped) return kvbm_error_set(err, KVBM_ESTATE, "hseq: the hit is found before the first step");
  if (s->ntok == 0) return kvbm_error_set(err, KVBM_EINVAL, "hseq: no tokens to look up");
  s->hit = kvbm_groups_hit_junction(s->specs, s->ng, s->bs, s->ntok - 1, cached_in, s, &s->junction);
  s->prompt_tokens = s->ntok;
  s->hit_found = true;
  if (hit_tokens) *hit_tokens = s->hit;
  return KVBM_OK;
}

/* kvbm_hseq_step but for its quiet decode tokens: kept out of line so that
 * the common call stays short (its prologue saved registers only this part
 * uses), and remove_skipped_all is forced inline into the short path
 * (callgrind, `kvbm replay --groups full,sw:128 --limit 300`: 261.95M
 * instructions with everything inlined as the compiler chose, 260.62M with
 * this out of line, 259.51M with remove_skipped_all inline too; 259.05M
 * before the stepping moved here from w1h.c). */
static NOINLINE int step_checked(kvbm_hseq *s, const uint32_t *tokens, size_t n_tokens, uint64_t n_new,
                                 kvbm_error *err) {
  const size_t ntok0 = s->ntok, nhash0 = s->nhash;
  int rc = n_tokens ? kvbm_hseq_append(s, tokens, n_tokens, err) : KVBM_OK;
  if (rc) return rc;
  if (!s->stepped) {
    if (!s->hit_found && s->ntok > 0) (void)kvbm_hseq_find_hit(s, NULL, NULL);
    s->computed = s->hit;
  }
  if (n_new == KVBM_HSEQ_REST) n_new = s->ntok - s->computed;
  if (n_new == 0 || n_new > s->ntok - s->computed) {
    rc = kvbm_error_set(err, KVBM_EINVAL, "hseq: %llu new tokens, %llu known and not computed",
                        (unsigned long long)n_new, (unsigned long long)(s->ntok - s->computed));
  } else if (!s->dry) {
    if (!s->stepped) ensure_hashed(s, (size_t)(s->hit / s->bs)); /* check_fits may look the hit up */
    rc = check_fits(s, s->computed + n_new, !s->stepped);
    if (rc == KVBM_ENOSPC)
      kvbm_error_set(err, rc, "hseq: a step of %llu tokens needs more blocks than the pool has",
                     (unsigned long long)n_new);
    else if (rc)
      kvbm_error_set(err, rc, "hseq: the hit found earlier is no longer cached");
  }
  if (!rc) {
    rc = step(s, n_new);
    if (!rc) {
      s->stepped = true;
      s->computed += n_new;
      s->quiet_end = next_quiet_end(s);
      return KVBM_OK;
    }
    if (!s->dry) /* only a stale hit gets here: the step gave back what it took */
      kvbm_error_set(err, rc, "hseq: step: %s (the hit found earlier is no longer cached)", kvbm_strerror(rc));
    else
      kvbm_error_set(err, rc, "hseq: a step of %llu tokens would not fit the pool", (unsigned long long)n_new);
  }
  if (rc == KVBM_ESTATE) s->hit_found = false; /* the next step looks again */
  if (!s->stepped) s->computed = 0;
  s->ntok = ntok0;
  s->nhash = nhash0;
  return rc;
}

/* The decode token's step that can only release (no block opened or
 * filled): no check, no allocation. Out of line, as step_checked, so that
 * kvbm_hseq_step's quiet path saves no register. */
static NOINLINE int step_release_only(kvbm_hseq *s, kvbm_error *err) {
  int rc = remove_skipped_all(s, s->computed);
  if (rc) return kvbm_error_set(err, rc, "hseq: step: %s", kvbm_strerror(rc));
  s->computed++;
  s->quiet_end = next_quiet_end(s);
  return KVBM_OK;
}

/* A decode token's step that opens or fills a block (not Mamba align, not
 * dry, blocks of 2 tokens or more, so that a token does one or the other),
 * without the general step's passes: every other group's table has
 * cdiv(computed, bs) blocks and the ones before the last registered, so
 * opening allocates one block a group (nothing to register: vLLM's
 * allocate-all-then-cache order is group order) and filling registers the
 * last block of each group, in group order, with nothing allocated (cache;
 * dedup as ever). Its room check is the general one's common case (a block
 * a group, within what the pool has before any release); short of that
 * the general step decides, precisely. Two of these a block of decode
 * tokens (callgrind, `kvbm replay --groups full,sw:128
 * --max-num-batched-tokens 8192 --limit 2000`: see docs/areas/hybrid.md,
 * "Speed, session 11"). */
static NOINLINE int step_decode_edge(kvbm_hseq *s, kvbm_error *err) {
  const uint64_t c = s->computed;
  const bool opens = c % s->bs == 0;
  if (opens && kvbm_pool_available(s->pool) < s->ng) return step_checked(s, NULL, 0, 1, err);
  const size_t i = s->g[0].len - !opens; /* opens: the new place; fills: the last */
  /* Filling registers the block in the groups that cache every block, a
   * prefix of the list (joint_groups); under sparse retention the others
   * keep no block past the prompt's last, so they register nothing. Any
   * other layout (a kept block: a prompt stepped a token at a time) takes
   * the general step. */
  const uint32_t nreg = opens ? (uint32_t)s->ng : joint_groups(s);
  for (uint32_t gi = nreg; gi < s->ng; gi++)
    if (kept(s, &s->g[gi], i) || caches_all(s, &s->g[gi])) return step_checked(s, NULL, 0, 1, err);
  if (nreg == 0) return step_checked(s, NULL, 0, 1, err);
  int rc = remove_skipped_all(s, c);
  /* The pool's one call for every group (each table's last place; the
   * tables have one length here). */
  uint32_t *slots[KVBM_GROUPS_MAX];
  for (uint32_t gi = 0; gi < s->ng; gi++) slots[gi] = s->g[gi].table + i;
  if (!rc && opens) {
    rc = kvbm__pool_alloc_groups(s->pool, (uint32_t)s->ng, slots);
  } else if (!rc) {
    ensure_hashed(s, i + 1);
    rc = kvbm__pool_fill_groups_one(s->pool, nreg, slots, s->salt, i ? s->hashes[i - 1] : 0, i > 0,
                                    s->tokens + i * s->bs, s->hashes[i]);
  }
  uint64_t held = 0;
  for (uint32_t gi = 0; gi < s->ng && !rc; gi++) {
    gstate *g = &s->g[gi];
    if (opens) {
      g->len++;
      g->held++;
      g->alloc++;
    } else {
      g->ncached = i + 1;
      g->has_ncached = true;
    }
    if (g->held > g->peak) g->peak = g->held;
    held += g->held;
  }
  if (rc) return kvbm_error_set(err, rc, "hseq: step: %s", kvbm_strerror(rc));
  if (held > s->peak) s->peak = held;
  s->computed = c + 1;
  s->quiet_end = next_quiet_end(s);
  return KVBM_OK;
}

/* Only the quiet decode token is answered here; everything else is a tail
 * call (callgrind, `kvbm replay --groups full,sw:128
 * --max-num-batched-tokens 8192 --limit 2000`: this function's prologue
 * and epilogue, saving the registers the release-only path used inline,
 * were 12.6M of its 23.6M instructions for 709K calls). */
int kvbm_hseq_step(kvbm_hseq *s, const uint32_t *tokens, size_t n_tokens, uint64_t n_new, kvbm_error *err) {
  if (!s) return kvbm_error_set(err, KVBM_EINVAL, "hseq: NULL request");
  if (n_tokens == 0 && n_new == 1 && s->computed < s->quiet_end) {
    /* a decode token that changes nothing in any group */
    s->computed++;
    return KVBM_OK;
  }
  if (n_tokens == 0 && n_new == 1 && s->computed < s->ntok && s->stepped) {
    if (quiet_decode(s, 1)) return step_release_only(s, err);
    if (!s->dry && !s->has_align && s->bs >= 2) return step_decode_edge(s, err);
  }
  return step_checked(s, tokens, n_tokens, n_new, err);
}

int kvbm__hseq_decode(kvbm_hseq *s, uint64_t n, kvbm_error *err) {
  if (!s) return kvbm_error_set(err, KVBM_EINVAL, "hseq: NULL request");
  for (uint64_t m = 0; m < n;) {
    if (s->computed < s->quiet_end) {
      /* the run of tokens whose steps only count their token, at once */
      uint64_t q = s->quiet_end - s->computed;
      if (q > n - m) q = n - m;
      s->computed += q;
      m += q;
      continue;
    }
    int rc = kvbm_hseq_step(s, NULL, 0, 1, err);
    if (rc) return rc;
    m++;
  }
  return KVBM_OK;
}

int kvbm_hseq_table(const kvbm_hseq *s, uint32_t group, const uint32_t **ids, size_t *n) {
  if (!s || !ids || !n || group >= s->ng) return KVBM_EINVAL;
  *ids = s->g[group].table;
  *n = s->g[group].len;
  return KVBM_OK;
}

uint64_t kvbm_hseq_hit_tokens(const kvbm_hseq *s) { return s ? s->hit : 0; }
uint64_t kvbm_hseq_num_tokens(const kvbm_hseq *s) { return s ? s->ntok : 0; }
uint64_t kvbm_hseq_num_computed(const kvbm_hseq *s) { return s ? s->computed : 0; }
size_t kvbm_hseq_num_groups(const kvbm_hseq *s) { return s ? s->ng : 0; }
uint64_t kvbm_hseq_peak_held(const kvbm_hseq *s) { return s ? s->peak : 0; }

int kvbm_hseq_group_stats_get(const kvbm_hseq *s, uint32_t group, kvbm_hseq_group_stats *out) {
  if (!s || !out || group >= s->ng) return KVBM_EINVAL;
  out->held = s->g[group].held;
  out->peak_held = s->g[group].peak;
  out->allocated = s->g[group].alloc;
  return KVBM_OK;
}

void kvbm__hseq_set_dry(kvbm_hseq *s, bool dry, uint64_t capacity) {
  s->dry = dry;
  s->quiet_end = 0;
  s->capacity = capacity;
}

void kvbm__hseq_rewind(kvbm_hseq *s) { clear_tables(s); }

int kvbm_hseq_set_retention(kvbm_hseq *s, kvbm_hseq_retention r) {
  if (!s || (r != KVBM_HSEQ_RETAIN_ALL && r != KVBM_HSEQ_RETAIN_BOUNDARIES)) return KVBM_EINVAL;
  if (s->stepped) return KVBM_ESTATE;
  s->sparse = r == KVBM_HSEQ_RETAIN_BOUNDARIES;
  return KVBM_OK;
}

uint32_t *kvbm__hseq_tail(kvbm_hseq *s, size_t n) {
  return n <= s->cap_tokens - s->ntok ? s->tokens + s->ntok : NULL;
}
