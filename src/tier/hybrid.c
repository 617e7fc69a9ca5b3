/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hybrid.c: the tier manager's KV cache groups (issue 20; kvbm/manager.h,
 * "Hybrid requests"; the rules and why in docs/areas/hybrid.md, "Tiers").
 *
 * What a group changes in the manager, and what it does not:
 *
 *   - Keys. A block of group g is registered in every tier under
 *     kvbm__group_key(hash, g) (internal.h): the hash itself for group 0,
 *     a bijective mix for the others. Pools, jobs, workers, the G4 index and
 *     the stores' keys all work on keys already, so nothing below this file
 *     needed to learn about groups except the one thing a key cannot say:
 *     how many bytes the group's block has (the job's `grp`, for framed
 *     values). A one-group manager's keys are its hashes, as before.
 *   - One budget. Every tier is still one pool: the groups share G1's,
 *     G2's, G3's and G4's blocks, as vLLM's groups share its one GPU pool
 *     (and its offloading connector's one CPU pool). A slot is the tier's
 *     block (`layout`); a group's own layout (kvbm_group_layout) is the
 *     part of it its KV takes. A Mamba state is one slot per block
 *     boundary, like an attention block, because vLLM pads the attention
 *     page until the two are equal.
 *   - The hit. A hybrid prefill does not walk left to right: it asks
 *     kvbm_groups_hit (kvbm/group.h, vLLM's coordinator rule) with a lookup
 *     that says whether group g holds block k in any tier, then takes in G1
 *     only the blocks each group needs for that hit (its first needed block
 *     is kvbm_group_skipped_tokens(hit) / B): the window's blocks, the
 *     chunk's, the last state, every block for full attention. The blocks
 *     G1 lacks get new G1 blocks and onboards; the copies are exactly those.
 *   - Failed onboards. Once the copies are over, the hit is computed again
 *     by the same rule over what the request's tables hold ready: a window
 *     block that did not arrive shortens the hit only as far as the rule
 *     says, never to a block whose bytes are not there. The plan was made
 *     for the longer hit, so each group then gets G1 blocks at the places
 *     its rule needs from the settled hit on and the plan had left null
 *     (fill_short; vLLM's allocate_slots after a load failure cut the
 *     computed tokens back): the engine has a block wherever it computes.
 *     No room: the wait says KVBM_ENOSPC and tries again next time.
 *   - Commit offloads every full block of every group through request.c's
 *     policy code (kvbm__use_block), then releases what each group no
 *     longer needs (skipped tokens), so a window group does not pin its
 *     whole history in G1: released blocks stay cached and evictable.
 *     Commit is the step boundary (kvbm learns that tokens are computed
 *     there), so it runs after the prompt and after every decode step.
 *   - Sparse retention, on request (cfg.hybrid_retention BOUNDARIES, vLLM's
 *     prefix_cache_retention_interval 0; hybrid.md, "Session 15: the
 *     manager follows sparse retention on request"): a window or Mamba
 *     group's full block that the rule does not keep (kvbm__kept) is taken
 *     unregistered, like the partial tail. Without a key nothing can hit
 *     it, so registering, offloading, announcing (STORED) or pushing it to
 *     a peer would spend G1 entries, G2..G4 slots and events on bytes no
 *     request of vLLM's rule will ever read; vLLM never hashes it either.
 *     Such a block's G1 state byte is left over from an earlier life of
 *     the id, so every walk of a table asks kvbm__registers before reading
 *     it. Dense (the default) registers every full block, as before.
 *   - Decode (kvbm_hreq_append) is vLLM's allocate_slots for a running
 *     request: room for every group's new blocks is counted before any is
 *     taken (nothing changes on ENOSPC), all groups allocate, then the
 *     blocks that filled register; tables are one vector per group.
 *   - A store's onboards share one deadline (request.c's record): past it,
 *     or past the first lost place, they are given up and the hit settles
 *     by the group rule over what arrived.
 *   - Peers: the group list's digest rides in the hello; a peer's block is
 *     placed in the group its key follows from (kvbm_manager_key_group);
 *     the OutputCritical pull asks a peer for every group's needed keys.
 *
 * Everything under the manager lock, as request.c; the request itself is
 * used by one thread at a time.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/vec.h"
#include "tier/internal.h"

#define NO_SRC 0xFFu /* src[] of a table entry that is not a hit block */

struct kvbm_hreq {
  kvbm_manager *m;
  kvbm_mreq shell;   /* what request.c's policy code reads: tokens, salt,
                        priority, phase labels (kvbm__label_full) */
  uint64_t serial;   /* the G1 owner of the blocks it registers */
  size_t n, nfull, total; /* tokens, full blocks, blocks (grow at append) */
  uint32_t ngroups;
  uint64_t *hashes;  /* nfull sequence hashes (group 0's keys) */
  size_t hcap;
  /* Group g's block table: G1 ids, KVBM_HREQ_NULL (vLLM's null block).
   * One vector per group, so that an append grows each in place. */
  uint32_t *tab[KVBM_GROUPS_MAX];
  size_t tcap[KVBM_GROUPS_MAX];
  /* Entries below skip[g] are all NULL (skipped or released), so a
   * release starts there, not at 0 (and passes Mamba align's nulls). */
  size_t skip[KVBM_GROUPS_MAX];
  uint8_t *src;      /* ngroups x stot: the hit block's tier, NO_SRC (only
                        blocks below `hit` are ever hit blocks) */
  size_t stot;       /* blocks at prefill: src's stride */
  size_t hit;        /* blocks of the hit found */
  size_t settled;    /* blocks of the hit once the onboards are over
                        (SIZE_MAX: not yet) */
  bool filled;       /* settled, and every place each group needs for the
                        settled hit has a G1 block (fill_short) */
  size_t commits;    /* kvbm_hreq_commit calls that did something */
  size_t committed;  /* full blocks the offload policy has used */
  size_t computed;   /* tokens the engine said are computed (last commit) */
  kvbm__onboards *og;/* onboards from stores that may be abandoned: one
                        deadline for the prefill (request.c's record) */
  uint64_t *found;   /* during prefill: keys G4's store answered for that
                        its index does not know (sorted; NULL: none) */
  size_t nfound;
  size_t hit_g1[KVBM_GROUPS_MAX], onboarded[KVBM_GROUPS_MAX];
  size_t from[KVBM_TIER_COUNT];
  /* Sparse retention (cfg.hybrid_retention BOUNDARIES; see kvbm__kept):
   * the prompt's length and the shared-prefix junction in tokens (0:
   * none), both fixed at prefill, from the lookup the hit was found with. */
  bool sparse;
  size_t prompt;
  uint64_t junction;
};

/* ---- config ---- */

int kvbm__groups_check(const kvbm_manager_config *c, uint64_t block_bytes, kvbm_error *err) {
  /* Checked before the early return: a bad value is refused with or
   * without groups, so that a typo never passes silently. */
  if (c->hybrid_retention != KVBM_HSEQ_RETAIN_ALL && c->hybrid_retention != KVBM_HSEQ_RETAIN_BOUNDARIES)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "manager: hybrid_retention %d is neither KVBM_HSEQ_RETAIN_ALL (0) nor "
                          "KVBM_HSEQ_RETAIN_BOUNDARIES (1)", (int)c->hybrid_retention);
  if (c->num_groups == 0 && !c->groups && !c->group_layouts) return KVBM_OK;
  if (!c->groups || c->num_groups == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: groups: %s", c->groups ? "num_groups is 0"
                                                                            : "num_groups or group_layouts given without a list");
  if (c->num_groups > KVBM_GROUPS_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: groups: %zu groups, at most %u", c->num_groups,
                          KVBM_GROUPS_MAX);
  if (c->num_groups > c->g1_blocks)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "manager: groups: %zu groups cannot be served by g1_blocks %u (one block each at least)",
                          c->num_groups, c->g1_blocks);
  for (size_t i = 0; i < c->num_groups; i++) {
    const kvbm_group_spec *g = &c->groups[i];
    bool param = g->kind == KVBM_GROUP_SLIDING_WINDOW || g->kind == KVBM_GROUP_CHUNKED_LOCAL;
    if ((unsigned)g->kind > KVBM_GROUP_MAMBA_ALIGN)
      return kvbm_error_set(err, KVBM_EINVAL, "manager: groups[%zu]: unknown kind %d", i, (int)g->kind);
    if (param && (g->tokens == 0 || g->tokens > KVBM_GROUP_MAX_TOKENS))
      return kvbm_error_set(err, KVBM_EINVAL, "manager: groups[%zu]: %s of %u tokens (1..%u)", i,
                            g->kind == KVBM_GROUP_SLIDING_WINDOW ? "a window" : "a chunk", g->tokens,
                            KVBM_GROUP_MAX_TOKENS);
    if (!param && g->tokens)
      return kvbm_error_set(err, KVBM_EINVAL, "manager: groups[%zu]: %s takes no token count (%u)", i,
                            kvbm_group_kind_name(g->kind), g->tokens);
    if (!c->group_layouts) continue;
    const kvbm_group_layout *l = &c->group_layouts[i];
    bool mamba = g->kind == KVBM_GROUP_MAMBA || g->kind == KVBM_GROUP_MAMBA_ALIGN;
    uint64_t bytes = l->block_bytes ? l->block_bytes : block_bytes;
    if (bytes > block_bytes)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "manager: group_layouts[%zu]: %llu bytes a block do not fit the tier's block of %llu bytes",
                            i, (unsigned long long)bytes, (unsigned long long)block_bytes);
    if (!mamba && (l->conv_bytes || l->ssm_bytes))
      return kvbm_error_set(err, KVBM_EINVAL, "manager: group_layouts[%zu]: conv/ssm state sizes for a %s group", i,
                            kvbm_group_kind_name(g->kind));
    if ((l->conv_bytes || l->ssm_bytes) &&
        (l->conv_bytes > bytes || l->ssm_bytes != bytes - l->conv_bytes))
      return kvbm_error_set(err, KVBM_EINVAL,
                            "manager: group_layouts[%zu]: conv %llu + ssm %llu bytes are not the block's %llu", i,
                            (unsigned long long)l->conv_bytes, (unsigned long long)l->ssm_bytes,
                            (unsigned long long)bytes);
  }
  return KVBM_OK;
}

/* A group's layout fingerprint: the slot's when the group takes the whole
 * slot as attention does, else mixed with its kind and sizes, so a value
 * written for one shape is never read as another. */
static uint64_t group_fingerprint(uint64_t slot_fp, const kvbm_group_spec *g, const kvbm_group_layout *l,
                                  uint64_t bytes, uint64_t block_bytes) {
  if (!l || (bytes == block_bytes && !l->conv_bytes && !l->ssm_bytes)) return slot_fp;
  uint64_t parts[4] = {(uint64_t)g->kind, bytes, l->conv_bytes, l->ssm_bytes};
  uint64_t x = slot_fp;
  for (int i = 0; i < 4; i++) x = kvbm__group_key(x ^ parts[i], (uint32_t)i + 1);
  return x;
}

void kvbm__groups_init(kvbm_manager *m) {
  const kvbm_manager_config *c = &m->cfg;
  m->ngroups = c->num_groups ? (uint32_t)c->num_groups : 1;
  for (uint32_t g = 0; g < m->ngroups; g++) {
    m->groups[g] = c->num_groups ? c->groups[g] : (kvbm_group_spec){KVBM_GROUP_FULL, 0};
    const kvbm_group_layout *l = c->group_layouts && c->num_groups ? &c->group_layouts[g] : NULL;
    m->gbytes[g] = l && l->block_bytes ? l->block_bytes : m->block_bytes;
    m->gfp[g] = group_fingerprint(m->fingerprint, &m->groups[g], l, m->gbytes[g], m->block_bytes);
  }
  /* The config's pointers are the caller's: the manager keeps its copy. */
  m->cfg.groups = NULL;
  m->cfg.group_layouts = NULL;
}

size_t kvbm_manager_num_groups(const kvbm_manager *m) { return m ? m->ngroups : 0; }

uint64_t kvbm_manager_group_bytes(const kvbm_manager *m, uint32_t g) {
  return m && g < m->ngroups ? m->gbytes[g] : 0;
}

uint32_t kvbm_manager_groups_digest(const kvbm_manager *m, char *list, size_t cap) {
  if (!m) return 0;
  if (list && cap) kvbm_groups_format(m->groups, m->ngroups, list, cap);
  if (m->ngroups < 2) return 0;
  /* Every group's kind, token count and layout fingerprint (which mixes
   * its bytes and Mamba parts into the slot's): two managers whose keys
   * and values mean the same thing agree, any difference in the list or
   * a layout shows. */
  uint64_t x = m->ngroups;
  for (uint32_t g = 0; g < m->ngroups; g++) {
    x = kvbm__group_key(x ^ ((uint64_t)m->groups[g].kind << 32 | m->groups[g].tokens), g + 1);
    x = kvbm__group_key(x ^ m->gfp[g], g + 1);
  }
  uint32_t d = (uint32_t)(x ^ (x >> 32));
  return d ? d : 1; /* 0 is one group's */
}

int kvbm_manager_key_group(const kvbm_manager *m, uint64_t key, uint64_t salt, uint64_t parent_key,
                           bool has_parent, const uint32_t *tokens, uint32_t *group) {
  if (!m || !tokens) return KVBM_EINVAL;
  const uint32_t B = m->cfg.block_size;
  for (uint32_t g = 0; g < m->ngroups; g++) {
    uint64_t parent = has_parent ? kvbm__group_unkey(parent_key, g) : 0;
    uint64_t h = kvbm_hash_next(m->cfg.scheme, salt, parent, has_parent, tokens, B);
    if (kvbm__group_key(h, g) != key) continue;
    if (group) *group = g;
    return KVBM_OK;
  }
  return KVBM_ENOTFOUND;
}

/* ---- the hit ---- */

static inline uint64_t key_of(const kvbm_hreq *r, size_t k, uint32_t g) {
  return kvbm__group_key(r->hashes[k], g);
}

static int cmp_key(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* G1's state of the key: 1 with bytes there or on their way (a ready
 * block, or one another prefill is onboarding: waited for as ours), 0 not
 * registered or FAILED (an onboard may rewrite it), -1 registered by a
 * request that has not computed it (no hit: never waited for). */
static int g1_has(const kvbm_manager *m, uint64_t key) {
  uint32_t id;
  if (kvbm_pool_peek(m->t[KVBM_TIER_G1].pool, key, &id, NULL) != KVBM_OK) return 0;
  uint8_t s = m->t[KVBM_TIER_G1].state[id];
  if (s == KVBM__UNCOMPUTED) return -1;
  return s == KVBM__READY || s == KVBM__PENDING || s == KVBM__LANDING;
}

/* The fastest tier holding group g's block k (KVBM_TIER_COUNT: none).
 * `lower`: look below G1 too. A backed-off G4 serves nothing (request.c). */
static int source_of(const kvbm_hreq *r, uint32_t g, size_t k, bool lower) {
  const kvbm_manager *m = r->m;
  uint64_t key = key_of(r, k, g);
  int in_g1 = g1_has(m, key);
  if (in_g1 > 0) return KVBM_TIER_G1;
  if (!lower || in_g1 < 0) return KVBM_TIER_COUNT;
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) {
    if (ti == KVBM_TIER_G4 && m->t[ti].present && kvbm__backed_off(&m->t[ti])) break;
    if (kvbm__tier_has(m, ti, key)) return ti;
  }
  if (r->nfound && bsearch(&key, r->found, r->nfound, sizeof key, cmp_key)) return KVBM_TIER_G4;
  return KVBM_TIER_COUNT;
}

typedef struct {
  const kvbm_hreq *r;
  bool lower;
} find_ctx;

static bool lookup_tiers(void *user, uint32_t g, size_t k) {
  const find_ctx *c = user;
  return source_of(c->r, g, k, c->lower) != KVBM_TIER_COUNT;
}

/* After the onboards: what the request's own tables hold ready. */
static bool lookup_own(void *user, uint32_t g, size_t k) {
  const kvbm_hreq *r = user;
  uint32_t id = r->tab[g][k];
  if (id == KVBM_HREQ_NULL || k >= r->hit || r->src[(size_t)g * r->stot + k] == NO_SRC) return false;
  return r->m->t[KVBM_TIER_G1].state[id] == KVBM__READY;
}

/* The first block group g needs for a hit of h blocks. */
static size_t first_needed(const kvbm_hreq *r, uint32_t g, size_t h) {
  if (h == 0) return 0;
  uint32_t B = r->m->cfg.block_size;
  return (size_t)(kvbm_group_skipped_tokens(&r->m->groups[g], (uint64_t)h * B) / B);
}

/* What taking a hit of h blocks costs G1 and the queues; whether it fits. */
static bool plan_fits(const kvbm_hreq *r, size_t h, bool lower, size_t *onboards) {
  const kvbm_manager *m = r->m;
  size_t fresh = 0, cached_hits = 0, onb[KVBM_TIER_COUNT] = {0};
  for (uint32_t g = 0; g < r->ngroups; g++) {
    for (size_t k = first_needed(r, g, h); k < h; k++) {
      int ti = source_of(r, g, k, lower);
      assert(ti != KVBM_TIER_COUNT && "the hit's rule looked at this block");
      if (ti == KVBM_TIER_G1) {
        bool cached = false;
        KVBM__MUST(kvbm_pool_peek(m->t[KVBM_TIER_G1].pool, key_of(r, k, g), NULL, &cached));
        cached_hits += cached;
      } else {
        onb[ti]++;
        fresh++;
      }
    }
    fresh += r->total - h; /* the rest of the prompt, in every group */
  }
  *onboards = 0;
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) {
    if (onb[ti] > kvbm__q_free(&m->t[ti].q)) return false;
    *onboards += onb[ti];
  }
  size_t avail = (size_t)kvbm_pool_available(m->t[KVBM_TIER_G1].pool);
  return avail >= cached_hits && fresh <= avail - cached_hits;
}

/* The hit in blocks; *junction (tokens) gets the shared-prefix junction
 * of the same lookup (kvbm_groups_hit_junction), where sparse retention
 * keeps blocks too: the caller keeps the one of the hit it takes. */
static size_t find_hit(const kvbm_hreq *r, bool lower, uint64_t *junction) {
  const kvbm_manager *m = r->m;
  uint32_t B = m->cfg.block_size;
  find_ctx c = {r, lower};
  uint64_t h = kvbm_groups_hit_junction(m->groups, r->ngroups, B, (uint64_t)(r->n - 1) / B * B, lookup_tiers,
                                        &c, junction);
  return (size_t)(h / B);
}

/* G4's lookup (request.c's walk_all, per group): when the hit found is
 * shorter than the prompt allows and G4 is a shared store, the store is
 * asked about the keys no tier here holds, every group's, in block order
 * and at most g4_lookup_max of them, the lock dropped while it answers (at
 * most g4_lookup_timeout_ms); the hit is then found again with the answers
 * (r->found). Lock held on entry and exit; returns whether it was
 * dropped (then whatever was found before is stale: other threads may have
 * evicted, registered or onboarded meanwhile). */
static bool g4_lookup(kvbm_hreq *r) {
  kvbm_manager *m = r->m;
  kvbm__tier *g4 = &m->t[KVBM_TIER_G4];
  const size_t K = (r->n - 1) / m->cfg.block_size;
  if (r->hit >= K || !g4->present || !g4->usable || !g4->lookup_vol) return false;
  if (kvbm__backed_off(g4)) {
    g4->st.backoff_skips++;
    return false;
  }
  size_t cap = m->cfg.g4_lookup_max, n = 0;
  uint64_t *keys = malloc(cap * sizeof *keys);
  bool *found = malloc(cap * sizeof *found);
  for (size_t k = 0; keys && found && k < K && n < cap; k++)
    for (uint32_t g = 0; g < r->ngroups && n < cap; g++)
      if (source_of(r, g, k, true) == KVBM_TIER_COUNT) keys[n++] = key_of(r, k, g);
  if (!keys || !found || n == 0) {
    free(keys);
    free(found);
    return false;
  }
  pthread_mutex_unlock(&m->mu);
  int rc = kvbm__lookup_run(m, g4, keys, n, found);
  pthread_mutex_lock(&m->mu);
  size_t nf = 0;
  for (size_t i = 0; i < n; i++)
    if (found[i]) keys[nf++] = keys[i];
  g4->st.lookups++;
  g4->st.lookup_blocks += n;
  g4->st.lookup_found += nf;
  if (rc == KVBM_ETIMEDOUT) g4->st.lookup_timeouts++;
  else if (rc) g4->st.lookup_errors++;
  kvbm__read_result(m, g4, rc != KVBM_OK && rc != KVBM_ENOMEM);
  free(found);
  if (nf == 0) {
    free(keys);
    return true;
  }
  qsort(keys, nf, sizeof *keys, cmp_key);
  r->found = keys;
  r->nfound = nf;
  return true;
}

/* The OutputCritical pull for a hybrid prompt (output_pull; request.c's
 * output_pull for one table): when the hit found is shorter than the
 * prompt allows, every group's blocks that the longest hit (K blocks)
 * would need (from first_needed(g, K): the window's, the state, all for
 * full attention; never the skipped ones) and that no tier here holds but
 * a peer acknowledged are asked back from that peer (the first such
 * block's; keys, which the peers treat as opaque), the lock dropped while
 * it answers (at most pull_timeout_ms); the hit is then found again. G1's
 * room is made first as the plain pull makes it (cached copies a peer
 * holds go first). Lock held on entry and exit; returns whether it was
 * dropped. */
static bool peer_pull(kvbm_hreq *r) {
  kvbm_manager *m = r->m;
  const size_t K = (r->n - 1) / m->cfg.block_size;
  if (!m->cfg.output_pull || r->hit >= K) return false;
  uint64_t *keys = malloc(K * r->ngroups * sizeof *keys);
  if (!keys) return false;
  size_t n = 0;
  uint32_t peer = 0, p;
  for (size_t k = 0; k < K; k++)
    for (uint32_t g = 0; g < r->ngroups; g++) {
      if (k < first_needed(r, g, K) || source_of(r, g, k, true) != KVBM_TIER_COUNT) continue;
      if (!kvbm__disagg_remote(m, key_of(r, k, g), &p) || (n && p != peer)) continue;
      peer = p;
      keys[n++] = key_of(r, k, g);
    }
  if (n == 0) {
    free(keys);
    return false;
  }
  kvbm__disagg_make_room(m, n + r->ngroups * (r->total - r->hit));
  pthread_mutex_unlock(&m->mu);
  (void)kvbm__disagg_pull(m, peer, keys, n);
  pthread_mutex_lock(&m->mu);
  free(keys);
  return true;
}

/* ---- sparse retention ---- */

/* Whether group g's full block k is one the request registers when it
 * allocates it (vLLM's reachable_block_mask): dense, every block; sparse
 * (cfg.hybrid_retention BOUNDARIES), kvbm_group_kept_ranges (kvbm/group.h,
 * the rule hseq.c follows too) at the prompt's end and the junction. Both
 * boundaries lie inside the prompt, so a block an append fills is never
 * kept in a window or Mamba group. */
static bool kvbm__kept(const kvbm_hreq *r, uint32_t g, size_t k) {
  if (!r->sparse) return true;
  size_t lo[2], hi[2];
  const size_t n = kvbm_group_kept_ranges(&r->m->groups[g], r->m->cfg.block_size, r->prompt, r->junction, lo, hi);
  for (size_t i = 0; i < n; i++)
    if (k >= lo[i] && k < hi[i]) return true;
  return false;
}

/* Whether the request's block at group g, place k is registered in G1
 * (or will be, once it fills): a hit block (matched or onboarded under
 * its key: src set), else a block the retention keeps. One that is not is
 * the request's alone: a plain G1 block with no key, whose G1 state is
 * whatever an earlier life of the id left there, so nothing may read it. */
static bool kvbm__registers(const kvbm_hreq *r, uint32_t g, size_t k) {
  if (k < r->hit && k < r->stot && r->src[(size_t)g * r->stot + k] != NO_SRC) return true;
  return kvbm__kept(r, g, k);
}

/* ---- taking the plan (lock held; room checked) ---- */

/* Registers G1 block id (allocated, held) as group g's block k (tokens and
 * key), this request its owner; if the key was registered already, that
 * block instead, with a reference (dedup; id goes back to the pool). */
static uint32_t register_id(kvbm_hreq *r, uint32_t g, size_t k, uint32_t id) {
  kvbm_manager *m = r->m;
  uint32_t got;
  KVBM__MUST(kvbm__fill_grp(&m->t[KVBM_TIER_G1], g, id, r->shell.salt, k ? key_of(r, k - 1, g) : 0, k > 0,
                            r->shell.tokens + k * m->cfg.block_size, key_of(r, k, g), &got));
  if (got == id) m->g1_owner[id] = r->serial; /* UNCOMPUTED since the STORED event */
  return got;
}

/* A new G1 block registered for group g's block k. */
static uint32_t register_new(kvbm_hreq *r, uint32_t g, size_t k) {
  uint32_t id;
  KVBM__MUST(kvbm_pool_alloc(r->m->t[KVBM_TIER_G1].pool, 1, &id));
  return register_id(r, g, k, id);
}

/* The shared deadline record of the prefill's onboards from stores that
 * may be given up (request.c's queue_onboards): created at the first such
 * onboard; its deadline counts from the prefill's take, after the lookup,
 * which had its own. NULL when out of memory: those onboards are then
 * simply waited for. */
static kvbm__onboards *deadline_of(kvbm_hreq *r) {
  if (!r->og && (r->og = malloc(sizeof *r->og)))
    *r->og = (kvbm__onboards){.refs = 1, .cut = SIZE_MAX,
                              .deadline_ns = kvbm_clock_ns() + (uint64_t)r->m->cfg.g4_timeout_ms * 1000000u};
  return r->og;
}

/* Group g's hit block k from lower tier ti: a new PENDING G1 block and its
 * onboard (request.c's queue_onboards, one block). From a store that may
 * be given up (kvbm__abandonable: G4, G3 over a URL) the job carries the
 * prefill's deadline record and its place k: settle() and the worker give
 * it up past the deadline, or once the hit is known to end before k. */
static uint32_t onboard(kvbm_hreq *r, uint32_t g, size_t k, int ti) {
  kvbm_manager *m = r->m;
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *t = &m->t[ti];
  uint64_t key = key_of(r, k, g);
  uint32_t id;
  /* A FAILED registration of the key (source_of: nothing else) is
   * rewritten in place, as a commit rewrites a FAILED lower-tier block. */
  if (kvbm_pool_peek(g1->pool, key, NULL, NULL) == KVBM_OK) KVBM__MUST(kvbm_pool_match(g1->pool, key, &id));
  else id = register_new(r, g, k);
  g1->state[id] = KVBM__PENDING;
  uint32_t sid = KVBM__NONE; /* none: a block G4's lookup found (indexed when it lands) */
  if (kvbm__tier_has(m, ti, key)) KVBM__MUST(kvbm_pool_match(t->pool, key, &sid)); /* the job's pin */
  KVBM__MUST(kvbm_block_retain(g1->pool, id));     /* the job's reference */
  t->st.hit_blocks++;
  kvbm__job j = {.kind = ti == KVBM_TIER_G2 ? KVBM__J_UP : KVBM__J_GET, .tier = (uint8_t)ti,
                 .prio = r->shell.prio, .hash = key, .parent = k ? key_of(r, k - 1, g) : 0,
                 .has_parent = k > 0, .grp = (uint8_t)g, .k = (uint32_t)k};
  for (int i = 0; i < KVBM_TIER_COUNT; i++) j.id[i] = KVBM__NONE;
  j.id[KVBM_TIER_G1] = id;
  j.id[ti] = sid;
  if (kvbm__abandonable(t) && (j.og = deadline_of(r))) j.og->refs++;
  bool queued = kvbm__q_push(&t->q, &j);
  assert(queued && "plan_fits counted the queue's room");
  (void)queued;
  r->onboarded[g]++;
  r->from[ti]++;
  return id;
}

static void take(kvbm_hreq *r, bool lower) {
  kvbm_manager *m = r->m;
  kvbm_pool *g1 = m->t[KVBM_TIER_G1].pool;
  const size_t T = r->total;
  /* G1 hits first, so that no allocation below evicts them. */
  for (uint32_t g = 0; g < r->ngroups; g++)
    for (size_t k = first_needed(r, g, r->hit); k < r->hit; k++)
      if (source_of(r, g, k, false) == KVBM_TIER_G1) {
        KVBM__MUST(kvbm_pool_match(g1, key_of(r, k, g), &r->tab[g][k]));
        r->src[g * T + k] = KVBM_TIER_G1;
        r->hit_g1[g]++;
      }
  bool any = false;
  for (uint32_t g = 0; g < r->ngroups; g++) {
    r->skip[g] = first_needed(r, g, r->hit);
    for (size_t k = r->skip[g]; k < r->hit; k++) {
      if (r->src[g * T + k] != NO_SRC) continue;
      int ti = source_of(r, g, k, lower);
      r->tab[g][k] = onboard(r, g, k, ti);
      r->src[g * T + k] = (uint8_t)ti;
      any = true;
    }
    /* The rest of the prompt: vLLM's first step allocates up to its end
     * in every group. The partial tail block is not registered, nor
     * (sparse retention) a full block the group does not keep. */
    for (size_t k = r->hit; k < T; k++) {
      if (k < r->nfull && kvbm__kept(r, g, k)) {
        r->tab[g][k] = register_new(r, g, k);
      } else {
        KVBM__MUST(kvbm_pool_alloc(g1, 1, &r->tab[g][k]));
      }
    }
  }
  m->t[KVBM_TIER_G1].st.hit_blocks += r->hit_g1[0];
  if (any) kvbm__workers_kick(m);
}

/* ---- the calls ---- */

static void hreq_free(kvbm_hreq *r) {
  if (!r) return;
  free(r->found);
  free(r->shell.tokens);
  free(r->shell.phase);
  free(r->hashes);
  for (uint32_t g = 0; g < KVBM_GROUPS_MAX; g++) free(r->tab[g]);
  free(r->src);
  free(r);
}

/* Room for `blocks` entries in every group's table, `tokens` tokens and
 * `full` hashes: grows the vectors, changes nothing a reader sees (the
 * counts stay). KVBM_ENOMEM or KVBM_EOVERFLOW, the request unchanged. */
static int reserve(kvbm_hreq *r, size_t tokens, size_t full, size_t blocks) {
  int rc = kvbm__vec_reserve_of(&r->shell.tokens, &r->shell.tcap, tokens, 64, KVBM__VEC_NO_LIMIT);
  if (!rc) rc = kvbm__vec_reserve_of(&r->hashes, &r->hcap, full ? full : 1, 4, KVBM__VEC_NO_LIMIT);
  /* the labels' room too, so that labelling after the step cannot fail */
  if (!rc) rc = kvbm__vec_reserve_of(&r->shell.phase, &r->shell.phase_cap, full, 64, KVBM__VEC_NO_LIMIT);
  for (uint32_t g = 0; g < r->ngroups && !rc; g++)
    rc = kvbm__vec_reserve_of(&r->tab[g], &r->tcap[g], blocks ? blocks : 1, 4, KVBM__VEC_NO_LIMIT);
  return rc;
}

int kvbm_manager_hprefill(kvbm_manager *m, uint64_t salt_hash, uint8_t priority,
                          const uint32_t *tokens, size_t n, kvbm_hreq **out, size_t *hit_tokens,
                          kvbm_error *err) {
  if (!m || !tokens || !out || n == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: hprefill needs a manager, tokens (n >= 1) and out");
  const size_t B = m->cfg.block_size;
  if (n > (size_t)KVBM_POOL_MAX_BLOCKS * B)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: hprefill: %zu tokens is more than a pool can hold", n);
  kvbm_hreq *r = calloc(1, sizeof *r);
  if (!r) return kvbm_error_set(err, KVBM_ENOMEM, "manager: hprefill: out of memory");
  r->m = m;
  r->n = n;
  r->nfull = n / B;
  r->total = r->stot = r->nfull + (n % B != 0);
  r->ngroups = m->ngroups;
  r->settled = SIZE_MAX;
  r->sparse = m->cfg.hybrid_retention == KVBM_HSEQ_RETAIN_BOUNDARIES;
  r->prompt = n;
  r->shell.m = m;
  r->shell.salt = salt_hash;
  r->shell.prio = priority;
  r->shell.fill = KVBM_PHASE_OUTPUT_CRITICAL; /* the prompt: needed at every step */
  r->src = malloc(r->ngroups * r->total);
  if (!r->src || reserve(r, n, r->nfull, r->total)) {
    hreq_free(r);
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: hprefill: out of memory");
  }
  memcpy(r->shell.tokens, tokens, n * sizeof *tokens);
  r->shell.ntok = n;
  if (kvbm__label_full(&r->shell)) {
    hreq_free(r);
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: hprefill: out of memory");
  }
  for (uint32_t g = 0; g < r->ngroups; g++)
    memset(r->tab[g], 0xFF, r->total * sizeof *r->tab[g]); /* KVBM_HREQ_NULL */
  memset(r->src, NO_SRC, r->ngroups * r->total);
  for (size_t k = 0; k < r->nfull; k++)
    r->hashes[k] = kvbm_hash_next(m->cfg.scheme, salt_hash, k ? r->hashes[k - 1] : 0, k > 0, tokens + k * B, B);

  pthread_mutex_lock(&m->mu);
  r->serial = r->shell.serial = ++m->next_serial;
  /* The hit over every tier; if its onboards do not fit (G1 room or a
   * queue), the hit G1 alone can serve; if that does not fit either,
   * nothing is taken. */
  size_t onboards = 0;
  bool lower = true;
  r->hit = find_hit(r, true, &r->junction);
  if (g4_lookup(r)) r->hit = find_hit(r, true, &r->junction); /* the lock was dropped: again */
  if (peer_pull(r)) r->hit = find_hit(r, true, &r->junction);  /* the same */
  if (!plan_fits(r, r->hit, true, &onboards) && onboards) {
    lower = false;
    r->hit = find_hit(r, false, &r->junction);
  }
  int rc = plan_fits(r, r->hit, lower, &onboards) ? KVBM_OK : KVBM_ENOSPC;
  if (!rc) take(r, lower);
  free(r->found); /* the lookup's answers served this prefill only */
  r->found = NULL;
  r->nfound = 0;
  pthread_mutex_unlock(&m->mu);
  if (rc) {
    hreq_free(r);
    return kvbm_error_set(err, rc, "manager: hprefill: a prompt of %zu tokens does not fit in G1 in %u groups",
                          n, m->ngroups);
  }
  if (hit_tokens) *hit_tokens = r->hit * B;
  *out = r;
  return KVBM_OK;
}

/* Lock held. Gives up group g's onboard of block k (G1 block id, from
 * tier ti): no bytes will reach it, the engine computes it (must_compute),
 * and its job, queued or in flight, finds it no longer PENDING and drops
 * what it brings (workers.c). */
static void abandon(kvbm_hreq *r, uint32_t id, int ti) {
  r->m->t[KVBM_TIER_G1].state[id] = KVBM__FAILED;
  r->m->t[ti].st.abandoned++;
}

/* Lock held. Whether every hit block's bytes are in (or known lost); then
 * the settled hit is the rule's over what arrived, at most the hit found.
 *
 * One deadline for the prefill's onboards from stores that may be given
 * up, as kvbm_manager_prefill's (request.c, settle): past it, each one
 * still out is abandoned (FAILED) and the rule then shortens the hit only
 * as far as the group rule says (lookup_own). A lost hit block at place k
 * (failed, abandoned, or another request's G1 block that failed) ends the
 * hit at k at the latest, whatever its group: a hit longer than k would
 * need it (every group's needed blocks for a hit h > k include block k,
 * since the first needed block only grows with h). So the onboards behind
 * the first lost place are of no use: given up at once here, and the
 * worker does not send those still queued (og->cut). */
static bool settle(kvbm_hreq *r) {
  if (r->settled != SIZE_MAX) return true;
  kvbm_manager *m = r->m;
  uint8_t *st = m->t[KVBM_TIER_G1].state;
  const size_t T = r->stot;
  bool late = false, clock_read = false, waiting = false;
  size_t cut = r->og && r->og->cut < r->hit ? r->og->cut : r->hit;
  for (uint32_t g = 0; g < r->ngroups; g++)
    for (size_t k = r->skip[g]; k < r->hit; k++) {
      uint8_t ti = r->src[g * T + k];
      if (ti == NO_SRC) continue;
      uint32_t id = r->tab[g][k];
      if (st[id] == KVBM__PENDING && ti != KVBM_TIER_G1 && r->og && kvbm__abandonable(&m->t[ti])) {
        if (!clock_read) { /* read once, and only when it can matter */
          late = kvbm_clock_ns() >= r->og->deadline_ns;
          clock_read = true;
        }
        if (late) {
          abandon(r, id, ti);
          kvbm__onboards_late(m, &m->t[ti], r->og);
        }
      }
      if (st[id] == KVBM__FAILED && k < cut) cut = k;
    }
  for (uint32_t g = 0; g < r->ngroups; g++)
    for (size_t k = r->skip[g]; k < r->hit; k++) {
      uint8_t ti = r->src[g * T + k];
      if (ti == NO_SRC) continue;
      uint32_t id = r->tab[g][k];
      if (st[id] == KVBM__PENDING && k > cut && ti != KVBM_TIER_G1 && r->og && kvbm__abandonable(&m->t[ti])) {
        abandon(r, id, ti); /* past the cut: nothing it brings is used */
        continue;
      }
      if (st[id] == KVBM__PENDING || st[id] == KVBM__LANDING) waiting = true;
    }
  if (r->og && cut < r->og->cut) r->og->cut = cut;
  if (waiting) return false;
  uint32_t B = m->cfg.block_size;
  r->settled = r->hit ? (size_t)(kvbm_groups_hit(m->groups, r->ngroups, B, (uint64_t)r->hit * B,
                                                 lookup_own, r) / B)
                      : 0;
  return true;
}

static void fill_info(const kvbm_hreq *r, bool ready, kvbm_hreq_info *out) {
  memset(out, 0, sizeof *out);
  out->ready = ready;
  out->hit_tokens = (ready ? r->settled : r->hit) * r->m->cfg.block_size;
  out->num_tokens = r->n;
  memcpy(out->hit_g1, r->hit_g1, sizeof out->hit_g1);
  memcpy(out->onboarded, r->onboarded, sizeof out->onboarded);
  memcpy(out->onboarded_from, r->from, sizeof out->onboarded_from);
}

static bool settled_hreq(void *r) { return settle(r); }

/* Lock held, settled. The places group g lacks for the settled hit:
 * [first_needed(g, settled), skip[g]), all null (the plan skipped them for
 * the longer hit found; nothing below skip[g] is held). */
static size_t short_places(const kvbm_hreq *r) {
  size_t need = 0;
  for (uint32_t g = 0; g < r->ngroups; g++) {
    size_t f = first_needed(r, g, r->settled);
    if (f < r->skip[g]) need += r->skip[g] - f;
  }
  return need;
}

/* Lock held, settled. A hit that settled short (failed or abandoned
 * onboards) leaves the engine computing from the settled hit S on, and
 * each group then needs real blocks from first_needed(g, S) on, as vLLM's
 * allocate_slots gives a request whose num_computed_tokens a load failure
 * cut back (hybrid.md, "A hit that settles short"). The plan held blocks
 * only from first_needed(g, H) on, so the places between get G1 blocks
 * now, registered by this request (must_compute: the engine writes them).
 * Every such place is at or past S: the settled hit is the group rule's
 * over the tables (lookup_own), so what a group reads for S is held
 * already. Room for all of them or none: KVBM_ENOSPC, nothing taken, and
 * the next wait tries again (vLLM: allocate_slots returns None, the
 * request waits a step); destroy releases what the request holds. */
static int fill_short(kvbm_hreq *r) {
  if (r->filled) return KVBM_OK;
  size_t need = short_places(r);
  if (need > kvbm_pool_available(r->m->t[KVBM_TIER_G1].pool)) return KVBM_ENOSPC;
  for (uint32_t g = 0; g < r->ngroups; g++) {
    size_t f = first_needed(r, g, r->settled);
    for (size_t k = f; k < r->skip[g]; k++) {
      assert(k >= r->settled && k < r->nfull && r->tab[g][k] == KVBM_HREQ_NULL);
      if (kvbm__kept(r, g, k)) r->tab[g][k] = register_new(r, g, k);
      else KVBM__MUST(kvbm_pool_alloc(r->m->t[KVBM_TIER_G1].pool, 1, &r->tab[g][k])); /* never a hit */
    }
    if (f < r->skip[g]) r->skip[g] = f;
  }
  r->filled = true;
  return KVBM_OK;
}

/* Lock held. The onboards over (settle), then the settled hit's places
 * (fill_short); KVBM_ENOSPC when G1 has no room for them yet. */
static int wait_ready(kvbm_hreq *r, int timeout_ms) {
  int rc = kvbm__manager_wait_settled(r->m, timeout_ms, settled_hreq, r, r->og ? &r->og->deadline_ns : NULL);
  return rc ? rc : fill_short(r);
}

int kvbm_hreq_wait(kvbm_hreq *r, int timeout_ms, kvbm_hreq_info *out) {
  if (!r) return KVBM_EINVAL;
  kvbm_manager *m = r->m;
  pthread_mutex_lock(&m->mu);
  int rc = wait_ready(r, timeout_ms);
  if (out) fill_info(r, rc == KVBM_OK || rc == KVBM_ENOSPC, out);
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int kvbm_hreq_table(const kvbm_hreq *r, uint32_t g, const uint32_t **ids, size_t *n) {
  if (!r || !ids || !n || g >= r->ngroups) return KVBM_EINVAL;
  *ids = r->tab[g];
  *n = r->total;
  return KVBM_OK;
}

/* Lock held, settled. */
static bool must_compute(const kvbm_hreq *r, uint32_t g, size_t k) {
  uint32_t id = r->tab[g][k];
  if (id == KVBM_HREQ_NULL || k < r->settled) return false;
  if (k >= r->nfull) return true; /* the partial tail */
  /* Not registered (sparse retention): new, it holds nothing until the
   * engine writes it, and its G1 state is stale, so never read; the
   * commit that covers it is the engine saying it wrote it. */
  if (!kvbm__registers(r, g, k)) return k >= r->committed;
  uint8_t s = r->m->t[KVBM_TIER_G1].state[id];
  return s == KVBM__FAILED || (s == KVBM__UNCOMPUTED && r->m->g1_owner[id] == r->serial) ||
         (s == KVBM__READY && k < r->hit && r->src[(size_t)g * r->stot + k] != NO_SRC && r->commits == 0);
}

bool kvbm_hreq_must_compute(kvbm_hreq *r, uint32_t g, size_t k) {
  if (!r || g >= r->ngroups || k >= r->total) return false;
  kvbm_hreq_wait(r, -1, NULL);
  pthread_mutex_lock(&r->m->mu);
  bool must = must_compute(r, g, k);
  pthread_mutex_unlock(&r->m->mu);
  return must;
}

/* Lock held. Releases group g's blocks before its first needed one once
 * `computed` tokens are computed (vLLM's remove_skipped_blocks), highest
 * first. Everything below skip[g] is released already, so a step looks at
 * what left the window since the last one (and passes Mamba align's
 * nulls, which vLLM's loop, stopping at the first null, handles with its
 * separate last_state_block_idx). */
static void release_skipped(kvbm_hreq *r, uint32_t g, size_t computed) {
  size_t first = (size_t)(kvbm_group_skipped_tokens(&r->m->groups[g], computed) / r->m->cfg.block_size);
  if (first > r->total) first = r->total; /* vLLM caps it to the blocks there are */
  uint32_t *tab = r->tab[g];
  for (size_t k = first; k-- > r->skip[g];) {
    if (tab[k] == KVBM_HREQ_NULL) continue;
    KVBM__MUST(kvbm_block_release(r->m->t[KVBM_TIER_G1].pool, tab[k], r->shell.prio));
    tab[k] = KVBM_HREQ_NULL;
  }
  if (first > r->skip[g]) r->skip[g] = first;
}

static void exit_think(kvbm_hreq *r);

int kvbm_hreq_commit(kvbm_hreq *r) {
  if (!r) return KVBM_EINVAL;
  /* Without the settled hit's places the engine had nowhere to write
   * some of its tokens: nothing to commit yet. */
  int wrc = kvbm_hreq_wait(r, -1, NULL);
  if (wrc) return wrc;
  kvbm_manager *m = r->m;
  const size_t todo = r->ngroups * (r->nfull - r->committed);
  kvbm__batch *b = calloc(1, sizeof *b);
  if (b) b->pins = malloc(((KVBM_TIER_COUNT - 1) * todo + 1) * sizeof *b->pins);
  if (!b || !b->pins) {
    free(b);
    return KVBM_ENOMEM;
  }
  b->cap = (uint32_t)((KVBM_TIER_COUNT - 1) * todo + 1);
  pthread_mutex_lock(&m->mu);
  uint8_t *st = m->t[KVBM_TIER_G1].state;
  m->ev_prefix = r->nfull ? r->hashes[0] : 0;
  for (uint32_t g = 0; g < r->ngroups; g++) {
    for (size_t k = r->committed; k < r->nfull; k++) {
      uint32_t id = r->tab[g][k];
      if (id == KVBM_HREQ_NULL || !kvbm__registers(r, g, k)) continue; /* nothing to offload: no key */
      /* Computed now: what it registered, and hit blocks the engine had to
       * recompute (a failed onboard, or past a shortened hit). */
      if (must_compute(r, g, k)) st[id] = KVBM__READY;
      kvbm__use_block(m, &r->shell, b, k, id, key_of(r, k, g), k ? key_of(r, k - 1, g) : 0, k > 0,
                      (uint8_t)g);
    }
  }
  m->ev_prefix = 0;
  r->committed = r->nfull;
  r->computed = r->n;
  r->commits++;
  if (b->pending == 0) kvbm__batch_done(m, b);
  else kvbm__workers_kick(m);
  /* Every token is computed now: what each group no longer needs for the
   * next step goes (before that step's allocation, as in vLLM). */
  for (uint32_t g = 0; g < r->ngroups; g++) release_skipped(r, g, r->computed);
  pthread_mutex_unlock(&m->mu);
  /* ExitThink's push waits for enough committed THINK_COMPLETE blocks. */
  if (r->shell.exit_pending) exit_think(r);
  return KVBM_OK;
}

/* New blocks group g takes for a step that ends at `total` blocks (vLLM's
 * get_num_blocks_to_allocate for a running request): every block for
 * attention and Mamba "all"; Mamba "align" keeps its running state in the
 * last block only (the places between stay null). */
static size_t step_blocks(const kvbm_hreq *r, uint32_t g, size_t total) {
  if (total <= r->total) return 0;
  return r->m->groups[g].kind == KVBM_GROUP_MAMBA_ALIGN ? 1 : total - r->total;
}

int kvbm_hreq_append(kvbm_hreq *r, const uint32_t *tokens, size_t n, kvbm_error *err) {
  if (!r || (n && !tokens))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: hreq_append needs a request and tokens");
  if (n == 0) return KVBM_OK;
  kvbm_manager *m = r->m;
  const size_t B = m->cfg.block_size;
  if (n > (size_t)KVBM_POOL_MAX_BLOCKS * B - r->n)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: hreq_append: %zu more tokens is more than a pool can hold", n);
  const size_t nn = r->n + n, nfull = nn / B, total = nfull + (nn % B != 0);
  /* Memory first, outside the lock: the vectors grow, the counts do not,
   * so a failure here leaves the request as it was. */
  int rc = reserve(r, nn, nfull, total);
  if (rc) return kvbm_error_set(err, rc, "manager: hreq_append: %s", kvbm_strerror(rc));
  memcpy(r->shell.tokens + r->n, tokens, n * sizeof *tokens);
  for (size_t k = r->nfull; k < nfull; k++)
    r->hashes[k] = kvbm_hash_next(m->cfg.scheme, r->shell.salt, k ? r->hashes[k - 1] : 0, k > 0,
                                  r->shell.tokens + k * B, B);
  pthread_mutex_lock(&m->mu);
  kvbm_pool *g1 = m->t[KVBM_TIER_G1].pool;
  /* A hit that settled short takes its places first (fill_short): a
   * step must not grow past prompt places the engine cannot write. */
  if (r->settled != SIZE_MAX && fill_short(r)) {
    size_t need = short_places(r);
    pthread_mutex_unlock(&m->mu);
    return kvbm_error_set(err, KVBM_ENOSPC,
                          "manager: hreq_append: the hit settled short and its %zu places in G1 are not "
                          "allocated yet (%u available)", need, kvbm_pool_available(g1));
  }
  /* vLLM's allocate_slots: the skipped blocks first (a no-op after a
   * commit, which released them at the same length), then room for every
   * group before any allocation. */
  for (uint32_t g = 0; g < r->ngroups; g++) release_skipped(r, g, r->computed);
  size_t need = 0;
  for (uint32_t g = 0; g < r->ngroups; g++) need += step_blocks(r, g, total);
  if (need > kvbm_pool_available(g1)) {
    pthread_mutex_unlock(&m->mu);
    return kvbm_error_set(err, KVBM_ENOSPC,
                          "manager: hreq_append: %zu tokens need %zu new G1 blocks in %u groups, %u available",
                          n, need, r->ngroups, kvbm_pool_available(g1));
  }
  /* Every group allocates, then the blocks that are now full register
   * (vLLM: allocate_new_blocks in group order, then cache_blocks). */
  for (uint32_t g = 0; g < r->ngroups; g++) {
    size_t k = r->total, nb = step_blocks(r, g, total);
    for (; k < total - nb; k++) r->tab[g][k] = KVBM_HREQ_NULL;
    for (; k < total; k++) KVBM__MUST(kvbm_pool_alloc(g1, 1, &r->tab[g][k]));
  }
  r->n = r->shell.ntok = nn;
  r->total = total;
  for (uint32_t g = 0; g < r->ngroups; g++)
    for (size_t k = r->nfull; k < nfull; k++)
      if (r->tab[g][k] != KVBM_HREQ_NULL && kvbm__kept(r, g, k)) /* sparse: never a window's, Mamba's */
        r->tab[g][k] = register_id(r, g, k, r->tab[g][k]);
  r->nfull = nfull;
  pthread_mutex_unlock(&m->mu);
  /* Labelled with the phase they filled in (kvbm_hreq_set_phase); room
   * for the labels was reserved above. */
  KVBM__MUST(kvbm__label_full(&r->shell));
  return KVBM_OK;
}

/* ExitThink's batch (request.c's kvbm__disagg_exit_think, every group):
 * once at least offload_threshold_blocks of the request's THINK_COMPLETE
 * blocks are ready in G1 (counted over every group's table: what each
 * group still holds, a window's released blocks not among them), they go
 * to peer 0 in one batch under their keys, pinned until the hook returns.
 * Without the lock. */
static void exit_think(kvbm_hreq *r) {
  kvbm_manager *m = r->m;
  kvbm_mreq *sh = &r->shell;
  if (!sh->exit_pending || m->cfg.offload_threshold_blocks == 0) return;
  const size_t B = m->cfg.block_size;
  kvbm_block_ref *blocks = malloc((sh->labeled * r->ngroups + 1) * sizeof *blocks);
  if (!blocks) return;
  size_t n = 0, ready = 0;
  pthread_mutex_lock(&m->mu);
  const uint8_t *st = m->t[KVBM_TIER_G1].state;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t k = 0; k < sh->labeled && k < r->nfull; k++) {
      if (sh->phase[k] != KVBM_PHASE_THINK_COMPLETE) continue;
      for (uint32_t g = 0; g < r->ngroups; g++) {
        uint32_t id = r->tab[g][k];
        if (id == KVBM_HREQ_NULL || !kvbm__registers(r, g, k) || st[id] != KVBM__READY) continue;
        if (pass == 0) {
          ready++;
          continue;
        }
        KVBM__MUST(kvbm_block_retain(m->t[KVBM_TIER_G1].pool, id));
        blocks[n++] = (kvbm_block_ref){.tier = KVBM_TIER_G1, .id = id, .seq_hash = key_of(r, k, g),
                                       .parent_hash = k ? key_of(r, k - 1, g) : 0, .salt_hash = sh->salt,
                                       .has_parent = k > 0, .tokens = sh->tokens + k * B,
                                       .phase = KVBM_PHASE_THINK_COMPLETE};
      }
    }
    if (ready < m->cfg.offload_threshold_blocks) break;
  }
  if (n) sh->exit_pending = false;
  pthread_mutex_unlock(&m->mu);
  if (n) {
    if (!kvbm__disagg_push_think(m, blocks, n)) sh->exit_pending = true; /* no peer (yet) */
    kvbm_manager_block_unpin(m, blocks, n);
  }
  free(blocks);
}

int kvbm_hreq_set_phase(kvbm_hreq *r, kvbm_request_phase phase, kvbm_error *err) {
  if (!r) return kvbm_error_set(err, KVBM_EINVAL, "manager: hreq_set_phase: NULL request");
  int rc = kvbm__phase_set(&r->shell, phase, err);
  if (!rc && r->shell.exit_pending) exit_think(r);
  return rc;
}

int kvbm_hreq_block_phase(const kvbm_hreq *r, size_t k, kvbm_frame_phase *out) {
  return r ? kvbm_mreq_block_phase(&r->shell, k, out) : KVBM_EINVAL;
}

void kvbm_hreq_destroy(kvbm_hreq *r) {
  if (!r) return;
  kvbm_manager *m = r->m;
  pthread_mutex_lock(&m->mu);
  /* The onboards over; never fill_short's places, only to release them. */
  (void)kvbm__manager_wait_settled(m, -1, settled_hreq, r, r->og ? &r->og->deadline_ns : NULL);
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1];
  /* Blocks it registered but never committed have no KV: whoever matched
   * them must not wait for them, nor use them (as kvbm_mreq_destroy). */
  for (uint32_t g = 0; g < r->ngroups; g++)
    for (size_t k = 0; k < r->total; k++) {
      uint32_t id = r->tab[g][k];
      if (id != KVBM_HREQ_NULL && kvbm__registers(r, g, k) && g1->state[id] == KVBM__UNCOMPUTED &&
          m->g1_owner[id] == r->serial)
        g1->state[id] = KVBM__FAILED;
    }
  /* vLLM's coordinator free: group 0 first, each table tail first. */
  for (uint32_t g = 0; g < r->ngroups; g++)
    for (size_t k = r->total; k-- > 0;) {
      uint32_t id = r->tab[g][k];
      if (id != KVBM_HREQ_NULL) KVBM__MUST(kvbm_block_release(g1->pool, id, r->shell.prio));
    }
  /* Reasoning that has ended is known cold (as kvbm_mreq_destroy): its
   * blocks, once released, are the first G1 evicts, the oldest first in
   * line (those another request holds keep their place). */
  for (size_t k = r->shell.labeled; k-- > 0;)
    if (r->shell.phase[k] == KVBM_PHASE_THINK_COMPLETE)
      for (uint32_t g = 0; g < r->ngroups; g++)
        if (k < r->total && r->tab[g][k] != KVBM_HREQ_NULL && kvbm__registers(r, g, k))
          (void)kvbm_block_demote(g1->pool, r->tab[g][k]); /* a block with no key is free already */
  kvbm__onboards_release(r->og);
  r->og = NULL;
  pthread_mutex_unlock(&m->mu);
  hreq_free(r);
}
