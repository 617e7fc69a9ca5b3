/* SPDX-License-Identifier: Apache-2.0 */
/*
 * w1h.c: workload W1-hybrid (see workload/w1h.h).
 *
 * What: W1 with several KV cache groups over one pool, each group with a
 * block table per request, stepped as vLLM's KVCacheManager.allocate_slots
 * steps its single-type managers (vllm/v1/core/kv_cache_manager.py,
 * kv_cache_coordinator.py, single_type_kv_cache_manager.py; the rules and
 * the choices made where vLLM leaves one are in docs/areas/hybrid.md, and
 * tests/workload/hybrid_ref.py is the slow statement this file must equal).
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
 * then caches), with W1's dedup on register. The order matters: a block
 * taken by one group may evict a block another group's registration would
 * have shared.
 *
 * Mamba has vLLM's two prefix-caching modes (kvbm/group.h). `mamba` is
 * "all", the default for models declaring SupportsMambaPrefixCaching: a
 * state block per block of tokens, every one but the last released at the
 * next step (a window of one token, as far as blocks go). `mamba-align` is
 * "align": the running state lives in the request's last block, the block
 * of the state two steps back is released, a state is registered when a
 * step ends on a block boundary, and the scheduler cuts prefill chunks at
 * block boundaries (Scheduler._mamba_block_aligned_split).
 *
 * A request is refused, changing nothing, when one of its steps would need
 * more blocks than the pool has (only it runs, so every other block is free
 * or cached): the same step code runs first on counts alone (`dry`) when a
 * full table per group would not fit, and decides.
 *
 * Tokens, hashes and tables live in buffers sized once for the longest
 * request; the loop allocates nothing.
 */
#include "workload/w1h.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

#define NUL UINT32_MAX /* vLLM's null block: a position a group does not hold */

typedef struct gstate {
  kvbm_group_spec spec;
  uint32_t *table;
  size_t len;
  size_t ncached;     /* blocks before this are registered or null */
  bool has_ncached;   /* vLLM's num_cached_block has an entry */
  int64_t last_state; /* Mamba: the block of the previous step's state, or -1 */
  uint64_t skip_seen; /* skipped blocks already released (what vLLM's loop
                         would find null from there down) */
  bool mamba_allocated;
  uint64_t held, peak, alloc;
} gstate;

typedef struct w1h {
  const kvbm_w1h_config *cfg;
  kvbm_pool *pool;
  uint32_t bs;
  size_t ng;
  bool has_mamba;
  bool dry; /* counts only: nothing in the pool changes */
  bool bs_pow2;
  gstate g[KVBM_GROUPS_MAX];
  uint32_t *tokens; /* prompt then output */
  uint64_t *hashes; /* of every full block of tokens */
  size_t nhash;
  uint32_t L;       /* prompt length of the running request */
  uint64_t peak;    /* of the running request, all groups */
} w1h;

static uint64_t cdiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* kvbm_groups_hit's question, answered by the pool without touching it. */
static bool cached_in(void *user, uint32_t group, size_t block) {
  const w1h *w = user;
  return kvbm_pool_peek_group(w->pool, group, w->hashes[block], NULL, NULL) == KVBM_OK;
}

/* vLLM's remove_skipped_blocks (and Mamba align's release of the state two
 * steps back), for `computed` tokens done. */
static int remove_skipped(w1h *w, gstate *g, uint64_t computed) {
  int rc = KVBM_OK;
  uint64_t skipped = g->spec.kind == KVBM_GROUP_FULL ? 0 : kvbm_group_skipped_tokens(&g->spec, computed);
  /* Most steps (a decode token) leave the skipped block count as it was:
   * vLLM's loop would stop at once on a null. */
  if (skipped / w->bs > g->skip_seen) {
    size_t hi = (size_t)(skipped / w->bs), lo;
    if (hi > g->len) hi = g->len; /* vLLM caps it to the blocks there are */
    g->skip_seen = hi;
    for (lo = hi; lo > 0 && g->table[lo - 1] != NUL; lo--) continue;
    if (hi > lo) {
      /* release_run goes from hi - 1 down, as vLLM frees them */
      if (!w->dry) rc = kvbm_pool_release_run(w->pool, g->table + lo, hi - lo, 0);
      for (size_t i = lo; i < hi; i++) g->table[i] = NUL;
      g->held -= hi - lo;
    }
  }
  if (g->spec.kind == KVBM_GROUP_MAMBA_ALIGN && g->last_state >= 0) {
    size_t lsi = (size_t)g->last_state;
    if (lsi + 1 < cdiv(computed, w->bs) && g->table[lsi] != NUL) {
      if (!w->dry && rc == KVBM_OK) rc = kvbm_block_release(w->pool, g->table[lsi], 0);
      g->table[lsi] = NUL;
      g->held--;
    }
  }
  return rc;
}

/* allocate_new_computed_blocks: the hit's blocks this group needs (those
 * after its skipped ones), the skipped positions null. */
static int take_hit(w1h *w, uint32_t gi, uint64_t hit) {
  gstate *g = &w->g[gi];
  size_t nb = (size_t)(hit / w->bs);
  size_t nsb = (size_t)(kvbm_group_skipped_tokens(&g->spec, hit) / w->bs);
  for (size_t i = 0; i < nb; i++) {
    uint32_t id = 0;
    if (i < nsb) {
      id = NUL;
    } else {
      if (!w->dry && kvbm_pool_match_group(w->pool, gi, w->hashes[i], &id) != KVBM_OK)
        return KVBM_ESTATE; /* the hit rule promised it */
      g->held++;
    }
    g->table[i] = id;
  }
  g->len = nb;
  g->ncached = nb;
  g->has_ncached = true;
  return KVBM_OK;
}

static int alloc_n(w1h *w, uint32_t gi, size_t n) {
  gstate *g = &w->g[gi];
  if (!w->dry) {
    int rc = kvbm_pool_alloc_group(w->pool, gi, (uint32_t)n, g->table + g->len);
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
static int allocate(w1h *w, uint32_t gi, uint64_t num_tokens) {
  gstate *g = &w->g[gi];
  size_t required = (size_t)cdiv(num_tokens, w->bs);
  if (g->spec.kind != KVBM_GROUP_MAMBA_ALIGN)
    return required > g->len ? alloc_n(w, gi, required - g->len) : KVBM_OK;
  if (required <= g->len) return KVBM_OK;
  size_t prev = g->len;
  if (g->mamba_allocated || prev > 0) g->last_state = (int64_t)prev - 1;
  while (g->len + 1 < required) g->table[g->len++] = NUL;
  int rc = alloc_n(w, gi, required - g->len);
  g->mamba_allocated = true;
  return rc;
}

/* cache_blocks: registers the blocks full at num_tokens (W1's dedup: a block
 * whose (hash, group) is registered is swapped for the registered one). */
static int cache(w1h *w, uint32_t gi, uint64_t num_tokens) {
  gstate *g = &w->g[gi];
  size_t nf = (size_t)(num_tokens / w->bs), nc = g->has_ncached ? g->ncached : 0;
  if (nc >= nf) return KVBM_OK;
  if (!w->dry)
    for (size_t i = nc; i < nf;) {
      if (g->table[i] == NUL) {
        i++;
        continue;
      }
      size_t j = i; /* a run of blocks to register, in one pool call */
      while (j < nf && g->table[j] != NUL) j++;
      int rc = kvbm_pool_fill_ids(w->pool, g->table + i, j - i, 0, i ? w->hashes[i - 1] : 0, i > 0,
                                  w->tokens + i * w->bs, w->hashes + i, NULL);
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
static bool step_group_fast(w1h *w, uint32_t gi, uint64_t end, uint64_t to_cache, int *rc) {
  gstate *g = &w->g[gi];
  const size_t required = (size_t)cdiv(end, w->bs), nf = (size_t)(to_cache / w->bs);
  const size_t nc = g->has_ncached ? g->ncached : 0;
  if (nc < nf && nc < g->len) { /* old blocks now full (no nulls here: see below) */
    size_t stop = nf < g->len ? nf : g->len;
    if (kvbm_pool_first_registered_group(w->pool, gi, w->hashes + nc, stop - nc) < stop - nc) return false;
    *rc = kvbm_pool_fill_ids(w->pool, g->table + nc, stop - nc, 0, nc ? w->hashes[nc - 1] : 0, nc > 0,
                             w->tokens + nc * w->bs, w->hashes + nc, NULL);
    if (*rc) return true;
    g->ncached = stop;
    g->has_ncached = true;
  }
  if (nf > g->len) { /* new full blocks */
    size_t k = g->len, n = nf - k, done = 0;
    *rc = kvbm_pool_fill_run_fresh(w->pool, gi, 0, k ? w->hashes[k - 1] : 0, k > 0,
                                   w->tokens + k * w->bs, w->hashes + k, n, NULL, g->table + k, &done);
    if (*rc) return true;
    g->len += done;
    g->held += done;
    g->alloc += done;
    g->ncached = g->len;
    g->has_ncached = true;
    if (done < n) return false;
  }
  if (required > g->len) *rc = alloc_n(w, gi, required - g->len); /* the partial tail */
  if (!*rc && nf > (g->has_ncached ? g->ncached : 0)) {
    g->ncached = nf;
    g->has_ncached = true;
  }
  return true;
}

/* One step of allocate_slots: `computed` tokens done (the hit included;
 * on the first step the tables are still empty), num_new computed now,
 * num_tokens_now the request's tokens so far.
 * KVBM_ENOSPC (dry) when the step's blocks do not fit. */
static int step(w1h *w, uint64_t computed, uint64_t num_new, uint64_t hit, bool first,
                uint64_t num_tokens_now) {
  int rc = KVBM_OK;
  for (uint32_t gi = 0; gi < w->ng && !rc; gi++) rc = remove_skipped(w, &w->g[gi], computed);
  /* A decode token that neither opens nor fills a block allocates and
   * registers nothing in any group (Mamba align too: its running block
   * changes only where a block opens), so held only fell: done. */
  if (!first && num_new == 1 && !rc) {
    uint64_t r = w->bs_pow2 ? (computed & (w->bs - 1)) : computed % w->bs;
    if (r != 0 && r + 1 != w->bs) return KVBM_OK;
  }
  if (first && hit > 0)
    for (uint32_t gi = 0; gi < w->ng && !rc; gi++) rc = take_hit(w, gi, hit);
  uint64_t end = computed + num_new;
  uint64_t to_cache = end < num_tokens_now ? end : num_tokens_now;
  /* Block by block while that is vLLM's order (step_group_fast), then, from
   * the first group that would deduplicate, vLLM's order itself. (Null
   * positions never lie among a group's blocks to register but in Mamba
   * align's tables, which always take vLLM's order.) */
  uint32_t from = 0;
  if (!w->dry && !w->has_mamba)
    while (from < w->ng && !rc && step_group_fast(w, from, end, to_cache, &rc)) from++;
  for (uint32_t gi = from; gi < w->ng && !rc; gi++) rc = allocate(w, gi, end);
  if (w->dry) {
    /* vLLM's check: the step's new and touched blocks within what is free,
     * i.e. what the request holds after the step within the pool */
    uint64_t after = 0;
    for (uint32_t gi = 0; gi < w->ng; gi++) after += w->g[gi].held;
    if (after > w->cfg->capacity) return KVBM_ENOSPC;
  }
  uint64_t held = 0;
  for (uint32_t gi = 0; gi < w->ng && !rc; gi++) {
    gstate *g = &w->g[gi];
    if (gi >= from) rc = cache(w, gi, to_cache);
    if (g->held > g->peak) g->peak = g->held;
    held += g->held;
  }
  if (held > w->peak) w->peak = held;
  return rc;
}

/* The scheduler's next prefill chunk from `start` (vLLM's token budget, and
 * with a Mamba group _mamba_block_aligned_split). */
static uint64_t chunk_len(const w1h *w, uint64_t start) {
  uint64_t n = w->L - start;
  if (w->cfg->max_num_batched_tokens && n > w->cfg->max_num_batched_tokens)
    n = w->cfg->max_num_batched_tokens;
  if (w->has_mamba) {
    uint64_t last = w->L - w->L % w->bs;
    if (start + n < last)
      n = n / w->bs * w->bs;
    else if (start < last && last < start + n)
      n = last - start;
  }
  return n;
}

static void reset_tables(w1h *w) {
  for (size_t gi = 0; gi < w->ng; gi++) {
    gstate *g = &w->g[gi];
    g->len = g->ncached = 0;
    g->has_ncached = g->mamba_allocated = false;
    g->last_state = -1;
    g->skip_seen = 0;
    g->held = g->peak = g->alloc = 0;
  }
  w->peak = 0;
}

/* Every step of the request (prefill chunks, then one per output token). */
static int run_steps(w1h *w, uint64_t hit, uint32_t out_len) {
  reset_tables(w);
  uint64_t computed = hit;
  bool first = true;
  while (computed < w->L) {
    uint64_t n = chunk_len(w, computed);
    int rc = step(w, computed, n, hit, first, w->L);
    if (rc) return rc;
    computed += n;
    first = false;
  }
  for (uint32_t m = 0; m < out_len; m++, computed++) {
    int rc = step(w, computed, 1, 0, false, (uint64_t)w->L + m + 1);
    if (rc) return rc;
  }
  return KVBM_OK;
}

/* The tables back to the pool: group after group, tail first. */
static int release_all(w1h *w) {
  for (size_t gi = 0; gi < w->ng; gi++) {
    gstate *g = &w->g[gi];
    size_t k = 0;
    for (size_t i = 0; i < g->len; i++)
      if (g->table[i] != NUL) g->table[k++] = g->table[i];
    int rc = kvbm_pool_release_run(w->pool, g->table, k, 0);
    if (rc) return rc;
    g->len = 0;
  }
  return KVBM_OK;
}

/* Whether every prefill chunk computes something (a Mamba model cuts at
 * block boundaries: a budget below one block never advances). */
static bool schedule_advances(const w1h *w, uint64_t hit) {
  for (uint64_t c = hit; c < w->L;) {
    uint64_t n = chunk_len(w, c);
    if (n == 0) return false;
    c += n;
  }
  return true;
}

static void refuse(w1h *w, size_t idx, const char *why, kvbm_w1h_result *res) {
  res->refused++;
  if (w->cfg->on_refused) w->cfg->on_refused(w->cfg->refused_user, idx, why);
}

static int run_request(w1h *w, const kvbm_trace_request *r, size_t idx, kvbm_w1h_result *res,
                       kvbm_error *err) {
  res->requests++;
  res->prompt_tokens += r->input_length;
  if (r->input_length == 0) return KVBM_OK;
  w->L = r->input_length;
  const uint64_t total = (uint64_t)r->input_length + r->output_length;
  kvbm_trace_prompt_tokens(r, w->tokens);
  kvbm_trace_output_tokens(r, idx, w->tokens + r->input_length);
  w->nhash = kvbm_hash_chain(w->cfg->scheme, 0, w->tokens, (size_t)total, w->bs, w->hashes,
                             (size_t)(total / w->bs));
  uint64_t hit = kvbm_groups_hit(w->cfg->groups, w->ng, w->bs, w->L - 1, cached_in, w);
  if (!schedule_advances(w, hit)) {
    refuse(w, idx, "--max-num-batched-tokens is below one block: a Mamba model's chunk never advances", res);
    return KVBM_OK;
  }
  if (w->ng * cdiv(total, w->bs) > w->cfg->capacity) {
    w->dry = true;
    int rc = run_steps(w, hit, r->output_length);
    w->dry = false;
    if (rc) {
      refuse(w, idx, "its blocks do not fit in the pool", res);
      return KVBM_OK;
    }
  }
  int rc = run_steps(w, hit, r->output_length);
  if (!rc) rc = release_all(w);
  if (rc) return kvbm_error_set(err, rc, "replay: request %zu: %s", idx, kvbm_strerror(rc));
  res->hit_tokens += hit;
  for (size_t gi = 0; gi < w->ng; gi++) {
    res->blocks_allocated_per_group[gi] += w->g[gi].alloc;
    res->blocks_allocated += w->g[gi].alloc;
    if (w->g[gi].peak > res->peak_blocks_held_per_group[gi])
      res->peak_blocks_held_per_group[gi] = w->g[gi].peak;
  }
  if (w->peak > res->peak_blocks_held) res->peak_blocks_held = w->peak;
  return KVBM_OK;
}

kvbm_w1h_config kvbm_w1h_config_default(void) {
  kvbm_w1h_config c;
  memset(&c, 0, sizeof c);
  c.groups[0].kind = KVBM_GROUP_FULL;
  c.num_groups = 1;
  c.block_size = 16;
  c.capacity = 16384;
  c.scheme = KVBM_HASH_NATIVE;
  return c;
}

static int check_config(const kvbm_w1h_config *c, kvbm_error *err) {
  if (c->num_groups == 0 || c->num_groups > KVBM_GROUPS_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "replay: %zu groups: 1..%u", c->num_groups, KVBM_GROUPS_MAX);
  if (c->block_size == 0 || c->block_size > KVBM_POOL_MAX_BLOCK_SIZE || c->capacity == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "replay: block size %u, capacity %u", c->block_size, c->capacity);
  if (c->num_groups > c->capacity)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "replay: %zu groups cannot share %u blocks: each needs at least one",
                          c->num_groups, c->capacity);
  for (size_t i = 0; i < c->num_groups; i++) {
    const kvbm_group_spec *g = &c->groups[i];
    bool param = g->kind == KVBM_GROUP_SLIDING_WINDOW || g->kind == KVBM_GROUP_CHUNKED_LOCAL;
    if ((unsigned)g->kind > KVBM_GROUP_MAMBA_ALIGN || (param && (g->tokens == 0 || g->tokens > KVBM_GROUP_MAX_TOKENS)))
      return kvbm_error_set(err, KVBM_EINVAL, "replay: group %zu is not a valid spec", i);
  }
  return KVBM_OK;
}

int kvbm_w1h_run(const kvbm_trace *trace, const kvbm_w1h_config *cfg, kvbm_w1h_result *out,
                 kvbm_error *err) {
  if (!trace || !cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "replay: NULL argument");
  int rc = check_config(cfg, err);
  if (rc) return rc;
  size_t n = kvbm_trace_count(trace);
  if (cfg->limit && cfg->limit < n) n = cfg->limit;
  w1h w;
  memset(&w, 0, sizeof w);
  w.cfg = cfg;
  w.bs = cfg->block_size;
  w.bs_pow2 = (w.bs & (w.bs - 1)) == 0;
  w.ng = cfg->num_groups;
  for (size_t i = 0; i < w.ng; i++) {
    w.g[i].spec = cfg->groups[i];
    w.has_mamba |= cfg->groups[i].kind == KVBM_GROUP_MAMBA_ALIGN; /* the aligned split */
  }
  kvbm_pool_config pc = kvbm_pool_config_default(cfg->capacity, cfg->block_size);
  pc.scheme = cfg->scheme;
  pc.keep_tokens = false;
  pc.num_groups = (uint32_t)w.ng;
  pc.listener = cfg->listener;
  pc.listener_user = cfg->listener_user;
  rc = kvbm_pool_create(&pc, &w.pool, err);
  if (rc) return rc;
  size_t max_in, max_out;
  kvbm_trace_max_lengths(trace, n, &max_in, &max_out);
  size_t max_tok = max_in + max_out, max_blocks = max_tok / w.bs + 2;
  w.tokens = malloc((max_tok + 1) * sizeof *w.tokens);
  w.hashes = malloc(max_blocks * sizeof *w.hashes);
  bool ok = w.tokens && w.hashes;
  for (size_t i = 0; i < w.ng && ok; i++) ok = (w.g[i].table = malloc(max_blocks * sizeof(uint32_t))) != NULL;
  kvbm_w1h_result res;
  memset(&res, 0, sizeof res);
  if (!ok) rc = kvbm_error_set(err, KVBM_ENOMEM, "replay: out of memory for requests of %zu tokens", max_tok);
  double t0 = kvbm_clock_seconds();
  for (size_t i = 0; i < n && !rc; i++) rc = run_request(&w, kvbm_trace_get(trace, i), i, &res, err);
  res.seconds = kvbm_clock_seconds() - t0;
  if (!rc) *out = res;
  for (size_t i = 0; i < w.ng; i++) free(w.g[i].table);
  free(w.tokens);
  free(w.hashes);
  kvbm_pool_destroy(w.pool);
  return rc;
}
