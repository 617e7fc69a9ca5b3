/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request.c: the engine's calls (see kvbm/manager.h, "Requests").
 *
 * Prefill hashes the prompt's full blocks once and walks them: block k
 * comes from the fastest tier that holds it with its bytes in place (G1,
 * G2, G3, then G4 by its index), and the walk stops at the first block
 * held nowhere. When it stops short and G4 is there, the store is asked
 * about the rest of the prompt (one lookup batch, the lock dropped, at most
 * g4_lookup_timeout_ms) and the walk is taken again with the answers: the
 * engine never waits on a store longer than that. G1 hits are pinned first
 * (so that no allocation evicts them), each block found below G1 gets a new
 * G1 block registered at once in state PENDING and an onboard job, and the
 * sequence takes the hashes and those blocks (kvbm_seq_prefill_plan) to
 * allocate the rest as kvbm_seq_prefill does, without hashing or walking
 * G1 again. Room is checked before anything is touched, so a prompt that
 * does not fit changes nothing. Everything is decided under the lock in the
 * engine's call; the workers only move bytes.
 *
 * The match a request reports settles when its onboards are done: it ends
 * before the first block whose bytes did not arrive (FAILED) or that
 * another request registered and has not computed yet (UNCOMPUTED). The
 * engine never waits for another request (that could deadlock an engine
 * that commits it later on the same thread), only for copies, which always
 * finish.
 *
 * Commit is where the offload policy runs (use_block): each full block is
 * used once, in order; a lower tier that holds it is refreshed, otherwise
 * its policy decides on a copy, which allocates (evicting LRU) and
 * registers the target at once and queues one job per block (G1 -> G2,
 * forwarded to G3 and G4 once G2 has it; or puts from G1/G2 into G3 and
 * G4). A queue without room or a tier without an evictable block skips the
 * copy and counts it: commit never waits.
 *
 * Phases (ADR-0006): every full block gets a label when it fills (the
 * prompt at prefill, generated tokens at append): THINK_ACTIVE while the
 * engine says the request reasons, OUTPUT_CRITICAL otherwise. ExitThink
 * turns the reasoning's labels into THINK_COMPLETE, asks disagg.c to push
 * them to peer 0 once offload_threshold_blocks of them are committed (at
 * ExitThink or a later commit), and destroy demotes them in G1 (first in
 * line for eviction). With output_pull, the prefill of a request in the
 * output phase (not one that starts reasoning) first makes room in G1
 * when it has too few free blocks, by dropping cached copies of blocks a
 * peer acknowledged (in eviction order: ThinkComplete first), then, if its
 * walk stops at a block that a peer acknowledged, asks that peer for the
 * blocks from there and walks again once they came (or pull_timeout_ms
 * passed); its G1 hits are pinned meanwhile (output_pull()).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/vec.h"
#include "tier/internal.h"

static int keep_tokens(kvbm_mreq *r, const uint32_t *tokens, size_t n) {
  if (n > SIZE_MAX / 4 - r->ntok) return KVBM_EOVERFLOW;
  if (kvbm__vec_reserve_of(&r->tokens, &r->tcap, r->ntok + n, 64, KVBM__VEC_NO_LIMIT))
    return KVBM_ENOMEM;
  if (n) memcpy(r->tokens + r->ntok, tokens, n * sizeof *tokens);
  r->ntok += n;
  return KVBM_OK;
}

/* Labels the full blocks not labelled yet with the current fill phase
 * (hybrid.c labels a hybrid request's shell with it too). */
int kvbm__label_full(kvbm_mreq *r) {
  size_t nfull = r->ntok / r->m->cfg.block_size;
  if (kvbm__vec_reserve_of(&r->phase, &r->phase_cap, nfull, 64, KVBM__VEC_NO_LIMIT))
    return KVBM_ENOMEM;
  for (size_t k = r->labeled; k < nfull; k++) r->phase[k] = r->fill;
  if (nfull > r->labeled) r->labeled = nfull;
  return KVBM_OK;
}

/* Whether tier ti (below G1) holds hash h with its bytes in place. */
static bool tier_has(const kvbm_manager *m, int ti, uint64_t h) {
  const kvbm__tier *t = &m->t[ti];
  uint32_t id;
  if (!t->present || !t->usable) return false;
  return kvbm_pool_peek(t->pool, h, &id, NULL) == KVBM_OK && t->state[id] == KVBM__READY;
}

/* The walk: per block the fastest tier that holds it (G1, G2, G3, then G4
 * by its index or, for blocks past lk->base, by what the lookup found), up
 * to the first block held nowhere, or the first onboard that has no room
 * in its queue (*full set). Returns the length; src[k] the tier;
 * *onboards the blocks below G1; *g1_cached the G1 hits sitting in the
 * cache (taking them uses up room the rest of the prompt might need). */
static size_t walk(kvbm_manager *m, const uint64_t *hashes, size_t n, uint8_t *src,
                   const kvbm__lookup *lk, size_t *onboards, size_t *g1_cached, bool *full) {
  uint32_t room[KVBM_TIER_COUNT] = {0};
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) room[ti] = kvbm__q_free(&m->t[ti].q);
  size_t k = 0;
  *onboards = *g1_cached = 0;
  *full = false;
  /* A store left alone (back-off) serves no hits, not even indexed ones:
   * their gets would wait on it as the lookups did. */
  kvbm__tier *g4 = &m->t[KVBM_TIER_G4];
  int last = g4->present && kvbm__backed_off(g4) ? KVBM_TIER_G4 : KVBM_TIER_COUNT;
  for (; k < n; k++) {
    bool cached;
    if (kvbm_pool_peek(m->t[KVBM_TIER_G1].pool, hashes[k], NULL, &cached) == KVBM_OK) {
      src[k] = KVBM_TIER_G1;
      *g1_cached += cached;
      continue;
    }
    int ti = KVBM_TIER_G2;
    while (ti < last && !tier_has(m, ti, hashes[k])) ti++;
    if (ti == last && last == KVBM_TIER_COUNT && lk && k >= lk->base && k < lk->base + lk->n &&
        lk->found[k - lk->base])
      ti = KVBM_TIER_G4;
    if (ti == last) {
      if (last == KVBM_TIER_G4 && tier_has(m, KVBM_TIER_G4, hashes[k])) g4->st.backoff_skips++;
      break;
    }
    if (!room[ti]) {
      m->t[ti].st.onboard_failures++;
      *full = true;
      break;
    }
    room[ti]--;
    src[k] = (uint8_t)ti;
    (*onboards)++;
  }
  return k;
}

/* The walk of a prefill, with G4's lookup when the first walk ends before
 * the last matchable block: the lock is dropped while the store answers
 * (at most g4_lookup_timeout_ms), then the walk is taken again with the
 * answers, since other threads may have changed the tiers meanwhile.
 * Lock held on entry and exit. */
static size_t walk_all(kvbm_manager *m, const uint64_t *hashes, size_t n, uint8_t *src,
                       size_t *onboards, size_t *g1_cached) {
  bool full;
  size_t w = walk(m, hashes, n, src, NULL, onboards, g1_cached, &full);
  kvbm__tier *g4 = &m->t[KVBM_TIER_G4];
  if (w == n || full || !g4->present || !g4->usable || !g4->lookup_vol) return w;
  if (kvbm__backed_off(g4)) {
    g4->st.backoff_skips++;
    return w;
  }
  size_t ask = n - w < m->cfg.g4_lookup_max ? n - w : m->cfg.g4_lookup_max;
  bool *found = malloc(ask * sizeof *found);
  if (!found) return w;
  pthread_mutex_unlock(&m->mu);
  int rc = kvbm__lookup_run(m, g4, hashes + w, ask, found);
  pthread_mutex_lock(&m->mu);
  size_t nfound = 0;
  for (size_t i = 0; i < ask; i++) nfound += found[i];
  g4->st.lookups++;
  g4->st.lookup_blocks += ask;
  g4->st.lookup_found += nfound;
  if (rc == KVBM_ETIMEDOUT) g4->st.lookup_timeouts++;
  else if (rc) g4->st.lookup_errors++;
  kvbm__read_result(m, g4, rc != KVBM_OK && rc != KVBM_ENOMEM);
  /* Walked again even when the store found nothing: while the lock was
   * dropped other threads may have evicted the G1 hits the first walk
   * counted (take_walk would then match blocks that are gone, and the room
   * walk_fits saw would not be there: the W5 cluster run's two aborts). */
  kvbm__lookup lk = {.base = w, .n = ask, .found = found};
  w = walk(m, hashes, n, src, nfound ? &lk : NULL, onboards, g1_cached, &full);
  free(found);
  return w;
}

/* Takes the walk's blocks in G1 (capacity was checked): the G1 hits are
 * pinned first, so that no allocation evicts them, then every block found
 * below G1 gets a new G1 block, registered at once for this request and
 * PENDING, and its source is pinned (sid[k]; KVBM__NONE for a block a G4
 * lookup found, which the G4 index does not hold yet). pins[k] receives
 * the G1 block of each walked block, with a reference the sequence adopts. */
static void take_walk(kvbm_manager *m, kvbm_mreq *r, const uint64_t *hashes, size_t n,
                      uint32_t *pins, uint32_t *sid) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1];
  const size_t B = m->cfg.block_size;
  for (size_t k = 0; k < n; k++)
    if (r->src[k] == KVBM_TIER_G1) KVBM__MUST(kvbm_pool_match(g1->pool, hashes[k], &pins[k]));
  for (size_t k = 0; k < n; k++) {
    if (r->src[k] == KVBM_TIER_G1) continue;
    uint32_t id, got;
    KVBM__MUST(kvbm_pool_alloc(g1->pool, 1, &id));
    KVBM__MUST(kvbm_block_fill_ctx(g1->pool, id, r->salt, k ? hashes[k - 1] : 0, k > 0,
                                   r->tokens + k * B, hashes[k], r, &got));
    assert(got == id && "the walk found it nowhere in G1");
    pins[k] = got;
    g1->state[got] = KVBM__PENDING;
    sid[k] = KVBM__NONE;
    if (tier_has(m, r->src[k], hashes[k]))
      KVBM__MUST(kvbm_pool_match(m->t[r->src[k]].pool, hashes[k], &sid[k]));
  }
}

/* Queues the onboard jobs of the walk (the walk counted the queues' room). */
static void queue_onboards(kvbm_manager *m, kvbm_mreq *r, const uint64_t *hashes, size_t n,
                           const uint32_t *pins, const uint32_t *sid) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1];
  /* The onboards from stores that may be given up share one record (no
   * memory for it: they are simply waited for, as G2's are). Its deadline
   * counts from here: the lookup and a peer pull before had deadlines of
   * their own, and are not the gets' store's to answer for. */
  bool any = false;
  for (size_t k = 0; k < n && !any; k++)
    any = r->src[k] != KVBM_TIER_G1 && kvbm__abandonable(&m->t[r->src[k]]);
  if (any && (r->og = malloc(sizeof *r->og)))
    *r->og = (kvbm__onboards){.refs = 1, .cut = SIZE_MAX,
                              .deadline_ns = kvbm_clock_ns() + (uint64_t)m->cfg.g4_timeout_ms * 1000000u};
  for (size_t k = 0; k < n; k++) {
    if (r->src[k] == KVBM_TIER_G1) continue;
    kvbm__tier *t = &m->t[r->src[k]];
    KVBM__MUST(kvbm_block_retain(g1->pool, pins[k])); /* the job's reference */
    t->st.hit_blocks++;
    kvbm__job j = {.kind = t->id == KVBM_TIER_G2 ? KVBM__J_UP : KVBM__J_GET,
                   .tier = (uint8_t)t->id, .prio = r->prio, .hash = hashes[k],
                   .parent = k ? hashes[k - 1] : 0, .has_parent = k > 0};
    for (int i = 0; i < KVBM_TIER_COUNT; i++) j.id[i] = KVBM__NONE;
    j.id[KVBM_TIER_G1] = pins[k];
    j.id[t->id] = sid[k];
    j.k = (uint32_t)k;
    if (r->og && kvbm__abandonable(t)) {
      j.og = r->og;
      r->og->refs++;
    }
    bool queued = kvbm__q_push(&t->q, &j);
    assert(queued && "the walk counted the queue's room");
    (void)queued;
  }
  kvbm__workers_kick(m);
}

/* Undoes take_walk (only if the sequence refused the plan, which the
 * capacity check rules out): the new G1 blocks have no bytes coming. */
static void drop_walk(kvbm_manager *m, kvbm_mreq *r, size_t n, const uint32_t *pins,
                      const uint32_t *sid) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1];
  for (size_t k = n; k-- > 0;) {
    if (r->src[k] != KVBM_TIER_G1) {
      g1->state[pins[k]] = KVBM__FAILED;
      if (sid[k] != KVBM__NONE) KVBM__MUST(kvbm_block_release(m->t[r->src[k]].pool, sid[k], 0));
    }
    KVBM__MUST(kvbm_block_release(g1->pool, pins[k], r->prio));
  }
}

/* The W1 room check on a walk of w blocks: G1 must hold the rest of the
 * prompt (total - w new blocks) plus the onboards' new blocks, from what is
 * free or cached, less the cached hits the prefill takes. */
static bool walk_fits(kvbm_manager *m, size_t w, size_t onboards, size_t g1_cached,
                      size_t total) {
  return total - w + onboards <= (size_t)kvbm_pool_available(m->t[KVBM_TIER_G1].pool) - g1_cached;
}

/* The G1 prefix of a walk (the lower tiers forgotten), and its cached hits. */
static size_t g1_prefix(kvbm_manager *m, const kvbm_mreq *r, const uint64_t *hashes, size_t w,
                        size_t *g1_cached) {
  size_t k = 0;
  *g1_cached = 0;
  for (; k < w && r->src[k] == KVBM_TIER_G1; k++) {
    bool cached = false;
    KVBM__MUST(kvbm_pool_peek(m->t[KVBM_TIER_G1].pool, hashes[k], NULL, &cached));
    *g1_cached += cached;
  }
  return k;
}

/* The OutputCritical pull (output_pull, a request in the output phase;
 * the policy is kvbm/manager.h's, at output_pull). When G1 has fewer free
 * blocks than the prefill will take (the rest of the prompt and the
 * onboards; pulled blocks are among them), cached G1 copies of blocks a
 * peer acknowledged are dropped first, ThinkComplete ones leading; then
 * the blocks from the first one held only at a peer are asked back from
 * it, the lock dropped while it answers (as for a G4 lookup). The walk's
 * G1 hits are pinned meanwhile, so that neither the room made nor the
 * blocks landing evict them, and the walk is taken again. Lock held. */
static size_t output_pull(kvbm_manager *m, kvbm_mreq *r, const uint64_t *hashes, size_t K,
                          size_t total, size_t w, size_t *onboards, size_t *g1_cached) {
  kvbm_pool *g1 = m->t[KVBM_TIER_G1].pool;
  uint32_t peer = 0;
  size_t run = 0;
  if (w < K && kvbm__disagg_remote(m, hashes[w], &peer)) {
    run = 1;
    while (w + run < K && kvbm__disagg_remote(m, hashes[w + run], NULL)) run++;
  }
  kvbm_pool_stats s;
  kvbm_pool_stats_get(g1, &s);
  const size_t need = total - w + *onboards;
  if (run == 0 && s.free >= need) return w;
  uint32_t *held = malloc((w ? w : 1) * sizeof *held);
  if (!held) return w;
  size_t nheld = 0;
  for (size_t k = 0; k < w; k++)
    if (r->src[k] == KVBM_TIER_G1) KVBM__MUST(kvbm_pool_match(g1, hashes[k], &held[nheld++]));
  kvbm__disagg_make_room(m, need);
  if (run) {
    pthread_mutex_unlock(&m->mu);
    (void)kvbm__disagg_pull(m, peer, hashes + w, run);
    pthread_mutex_lock(&m->mu);
  }
  for (size_t i = nheld; i-- > 0;) KVBM__MUST(kvbm_block_release(g1, held[i], r->prio));
  free(held);
  return walk_all(m, hashes, K, r->src, onboards, g1_cached);
}

int kvbm_manager_prefill(kvbm_manager *m, uint64_t salt_hash, uint8_t priority,
                         const uint32_t *tokens, size_t n, kvbm_mreq **out,
                         size_t *matched_tokens, kvbm_error *err) {
  return kvbm_manager_prefill_phase(m, salt_hash, priority, 0, tokens, n, out, matched_tokens, err);
}

int kvbm_manager_prefill_phase(kvbm_manager *m, uint64_t salt_hash, uint8_t priority,
                               kvbm_request_phase phase, const uint32_t *tokens, size_t n,
                               kvbm_mreq **out, size_t *matched_tokens, kvbm_error *err) {
  if (!m || !tokens || !out || n == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: prefill needs a manager, tokens (n >= 1) and out");
  if (phase != 0 && phase != KVBM_REQUEST_REASONING && phase != KVBM_REQUEST_OUTPUT)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: prefill: %d is not a starting phase (reasoning 1, output 3)",
                          (int)phase);
  const size_t B = m->cfg.block_size, K = (n - 1) / B, nfull = n / B;
  const size_t total = nfull + (n % B != 0);
  kvbm_mreq *r = calloc(1, sizeof *r);
  uint64_t *hashes = malloc((nfull ? nfull : 1) * sizeof *hashes);
  uint32_t *pins = malloc((K ? K : 1) * sizeof *pins);
  uint32_t *sid = malloc((K ? K : 1) * sizeof *sid);
  int rc = r && hashes && pins && sid ? KVBM_OK : KVBM_ENOMEM;
  if (!rc) {
    r->m = m;
    r->stage = (uint8_t)phase; /* read by the pull; labels come after */
    r->salt = salt_hash;
    r->prio = priority;
    r->settled = SIZE_MAX;
    r->src = malloc(K ? K : 1);
    rc = r->src ? keep_tokens(r, tokens, n) : KVBM_ENOMEM;
  }
  if (!rc) rc = kvbm_seq_create(m->t[KVBM_TIER_G1].pool, salt_hash, priority, &r->seq);
  if (!rc) kvbm_seq_set_context(r->seq, r); /* the pool events name the registering request */
  /* The prompt is hashed once, here; the sequence takes the hashes. */
  for (size_t k = 0; !rc && k < nfull; k++)
    hashes[k] = kvbm_hash_next(m->cfg.scheme, salt_hash, k ? hashes[k - 1] : 0, k > 0,
                               tokens + k * B, B);

  size_t matched = 0, onboards = 0;
  if (!rc) {
    pthread_mutex_lock(&m->mu);
    r->serial = ++m->next_serial;
    kvbm__tier *g1 = &m->t[KVBM_TIER_G1];
    size_t g1_cached;
    size_t w = walk_all(m, hashes, K, r->src, &onboards, &g1_cached);
    /* An OutputCritical allocation: a request in the output phase. */
    if (m->cfg.output_pull && r->stage != KVBM_REQUEST_REASONING)
      w = output_pull(m, r, hashes, K, total, w, &onboards, &g1_cached);
    /* Everything past the walk gets new blocks; onboards take theirs
     * first. Too little room: forget the lower tiers, keep the G1 prefix,
     * and apply W1's own check to that. */
    if (onboards && !walk_fits(m, w, onboards, g1_cached, total)) {
      w = g1_prefix(m, r, hashes, w, &g1_cached);
      onboards = 0;
    }
    if (!walk_fits(m, w, onboards, g1_cached, total)) rc = KVBM_ENOSPC; /* nothing changed */
    if (!rc) {
      take_walk(m, r, hashes, w, pins, sid);
      kvbm_seq_plan plan = {.hashes = hashes, .held = pins, .nheld = w};
      rc = kvbm_seq_prefill_plan(r->seq, tokens, n, &plan, &matched);
      assert(rc == KVBM_OK && "walk_fits checked the room");
      if (rc) drop_walk(m, r, w, pins, sid);
    }
    if (!rc) {
      if (onboards) queue_onboards(m, r, hashes, w, pins, sid);
      /* Blocks the sequence matched past the walk (none, as the walk
       * stops at a block G1 does not hold) would be G1 hits. */
      r->walk = matched / B;
      for (size_t k = w; k < r->walk; k++) r->src[k] = KVBM_TIER_G1;
      g1->st.hit_blocks += r->walk - onboards;
      kvbm__tier_metrics_prefill(&m->tm, n, (uint32_t)B, r->src, r->walk, K);
    }
    pthread_mutex_unlock(&m->mu);
  }
  free(hashes);
  free(pins);
  free(sid);
  if (rc) {
    kvbm_mreq_destroy(r);
    if (rc == KVBM_ENOSPC)
      return kvbm_error_set(err, rc, "manager: a prompt of %zu tokens does not fit in G1", n);
    return kvbm_error_set(err, rc, "manager: prefill: %s", kvbm_strerror(rc));
  }
  r->fill = KVBM_PHASE_OUTPUT_CRITICAL; /* the prompt: needed at every step */
  if (kvbm__label_full(r)) {
    kvbm_mreq_destroy(r);
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: prefill: out of memory");
  }
  /* A request that starts reasoning: what fills next is ThinkActive. */
  if (phase == KVBM_REQUEST_REASONING) r->fill = KVBM_PHASE_THINK_ACTIVE;
  if (matched_tokens) *matched_tokens = matched;
  *out = r;
  return KVBM_OK;
}

/* Lock held. Gives up block k's onboard: no bytes will reach it, the
 * engine computes it (must_compute), and its job, queued or in flight,
 * finds it no longer PENDING and drops what it brings (workers.c). */
static void abandon(kvbm_mreq *r, size_t k, uint32_t g1id) {
  r->m->t[KVBM_TIER_G1].state[g1id] = KVBM__FAILED;
  r->m->t[r->src[k]].st.abandoned++;
}

/* Lock held. Scans the match: returns false while it may still grow;
 * otherwise sets r->settled to the blocks before the first one whose bytes
 * were lost, or that another request registered and has not computed yet
 * (waiting for another request could deadlock an engine that commits it
 * later on the same thread).
 *
 * One deadline for the whole prefill (store.c): the match ends at the
 * first block that failed, or that is still out from an abandonable store
 * at r->og->deadline_ns, and every abandonable onboard behind that point is
 * given up at once, so neither later batches nor a trickling store can
 * hold the engine. Onboards that cannot be abandoned (G2, the disk://
 * slot file, a copy LANDING) are waited for: they end by themselves. */
static bool settle(kvbm_mreq *r) {
  if (r->settled != SIZE_MAX) return true;
  kvbm_manager *m = r->m;
  const uint32_t *ids;
  size_t n;
  kvbm_seq_blocks(r->seq, &ids, &n);
  uint8_t *st = m->t[KVBM_TIER_G1].state;
  bool late = false, clock_read = false;
  size_t cut = r->walk;
  bool waiting = false;
  for (size_t k = 0; k < r->walk; k++) {
    uint8_t s = st[ids[k]];
    bool may_go = r->og && kvbm__abandonable(&m->t[r->src[k]]);
    if (s == KVBM__PENDING && cut == r->walk && may_go) {
      if (!clock_read) { /* read once, and only when it can matter */
        late = kvbm_clock_ns() >= r->og->deadline_ns; /* may_go: og is there */
        clock_read = true;
      }
      if (late) {
        abandon(r, k, ids[k]);
        s = KVBM__FAILED;
        kvbm__onboards_late(m, &m->t[r->src[k]], r->og);
      }
    }
    if ((s == KVBM__FAILED || s == KVBM__UNCOMPUTED) && cut == r->walk) {
      cut = k;
      continue;
    }
    if (s == KVBM__PENDING && cut < k && may_go) {
      abandon(r, k, ids[k]); /* past the cut: nothing it brings is used */
      continue;
    }
    if (s == KVBM__PENDING || s == KVBM__LANDING) waiting = true;
  }
  /* Where the match ends is known as soon as it is cut: the jobs behind
   * are not sent, and what they bring is dropped (workers.c). */
  if (r->og && cut < r->og->cut) r->og->cut = cut;
  if (waiting) return false;
  r->settled = cut;
  return true;
}

static void fill_info(const kvbm_mreq *r, bool ready, kvbm_mreq_info *out) {
  memset(out, 0, sizeof *out);
  out->ready = ready;
  size_t m = ready ? r->settled : r->walk;
  out->matched_tokens = m * r->m->cfg.block_size;
  for (size_t k = 0; k < m; k++) out->hit_blocks[r->src[k]]++;
  out->num_tokens = kvbm_seq_num_tokens(r->seq);
}

void kvbm_mreq_poll(kvbm_mreq *r, kvbm_mreq_info *out) {
  if (!r || !out) return;
  pthread_mutex_lock(&r->m->mu);
  fill_info(r, settle(r), out);
  pthread_mutex_unlock(&r->m->mu);
}

/* Lock held. The wait both request kinds share: on done_cv until
 * settled(arg), for timeout_ms (0: look once, < 0: for ever). It also
 * wakes at *own_ns (a prefill's own G4 deadline, when it has one), so that
 * settled() then gives up what a store still owes, however long the caller
 * is prepared to wait. KVBM_OK when settled, else KVBM_ETIMEDOUT. */
int kvbm__manager_wait_settled(kvbm_manager *m, int timeout_ms, bool (*settled)(void *), void *arg,
                               const uint64_t *own_ns) {
  uint64_t dl = timeout_ms > 0 ? kvbm_clock_ns() + (uint64_t)timeout_ms * 1000000u : 0;
  while (!settled(arg)) {
    if (timeout_ms == 0) return KVBM_ETIMEDOUT;
    uint64_t now = kvbm_clock_ns(), wake = dl;
    uint64_t own = own_ns ? *own_ns : 0;
    if (own > now && (!wake || own < wake)) wake = own;
    if (!wake) {
      pthread_cond_wait(&m->done_cv, &m->mu);
      continue;
    }
    struct timespec ts = kvbm__timespec_of_ns(wake);
    if (pthread_cond_timedwait(&m->done_cv, &m->mu, &ts) == ETIMEDOUT && dl &&
        kvbm_clock_ns() >= dl)
      return settled(arg) ? KVBM_OK : KVBM_ETIMEDOUT;
  }
  return KVBM_OK;
}

static bool settled_mreq(void *r) { return settle(r); }

int kvbm_mreq_wait(kvbm_mreq *r, int timeout_ms, kvbm_mreq_info *out) {
  if (!r) return KVBM_EINVAL;
  kvbm_manager *m = r->m;
  pthread_mutex_lock(&m->mu);
  int rc = kvbm__manager_wait_settled(m, timeout_ms, settled_mreq, r,
                                      r->og ? &r->og->deadline_ns : NULL);
  if (out) fill_info(r, rc == KVBM_OK, out);
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int kvbm_mreq_block_source(const kvbm_mreq *r, size_t k) {
  return r && k < r->walk ? r->src[k] : -1;
}

bool kvbm_mreq_must_compute(kvbm_mreq *r, size_t k) {
  if (!r) return false;
  kvbm_manager *m = r->m;
  pthread_mutex_lock(&m->mu);
  const uint32_t *ids;
  size_t nb;
  kvbm_seq_blocks(r->seq, &ids, &nb);
  size_t matched = settle(r) ? r->settled : r->walk;
  bool must = false;
  if (k < nb && k >= matched) {
    uint8_t st = m->t[KVBM_TIER_G1].state[ids[k]];
    must = k >= kvbm_seq_num_tokens(r->seq) / m->cfg.block_size || st == KVBM__FAILED ||
           (st == KVBM__UNCOMPUTED && m->g1_owner[ids[k]] == r->serial);
  }
  pthread_mutex_unlock(&m->mu);
  return must;
}

int kvbm_mreq_append(kvbm_mreq *r, const uint32_t *tokens, size_t n) {
  if (!r || (n && !tokens)) return KVBM_EINVAL;
  size_t before = r->ntok;
  int rc = keep_tokens(r, tokens, n);
  if (rc) return rc;
  pthread_mutex_lock(&r->m->mu);
  rc = kvbm_seq_append(r->seq, tokens, n);
  pthread_mutex_unlock(&r->m->mu);
  if (rc) r->ntok = before;
  return rc ? rc : kvbm__label_full(r);
}

/* The policy's part of one use: in tier t, refresh the block if held,
 * else decide on a copy and, if so, take and register its target block
 * (PENDING) at once. Returns the target's id when a copy is due,
 * KVBM__NONE otherwise; *held is the block refreshed (KVBM__NONE: none). `forwarded`: the copy will reach t through G2 (its queue
 * room is checked at the forward). Lock held. */
static inline __attribute__((always_inline)) uint32_t
use_in_tier(kvbm__tier *t, kvbm_mreq *r, kvbm__batch *b, const uint32_t *tok, uint64_t h,
            uint64_t parent, bool has_parent, uint8_t grp, bool forwarded, uint32_t *held) {
  bool want = t->policy == KVBM_OFFLOAD_ALL;
  if (t->filter_on) want = kvbm__freq_filter_use(&t->filter, h);
  *held = KVBM__NONE;
  if (!t->usable) {
    if (want) t->st.skipped_unavailable++;
    return KVBM__NONE;
  }
  uint32_t id;
  bool present = kvbm_pool_peek(t->pool, h, &id, NULL) == KVBM_OK;
  if (present && t->state[id] != KVBM__FAILED) {
    KVBM__MUST(kvbm_pool_match(t->pool, h, &id)); /* refresh: re-released in use order */
    kvbm__batch_pin(b, (uint8_t)t->id, id);
    *held = id;
    return KVBM__NONE;
  }
  if (!want && !present) {
    t->st.filtered++;
    return KVBM__NONE;
  }
  if (t->shared && kvbm__backed_off(t)) { /* left alone for now (store.c) */
    t->st.backoff_skips++;
    return KVBM__NONE;
  }
  if (!forwarded && !kvbm__q_free(&t->q)) {
    t->st.skipped_queue++;
    return KVBM__NONE;
  }
  if (present) {
    KVBM__MUST(kvbm_pool_match(t->pool, h, &id)); /* FAILED: rewrite in place */
  } else {
    uint32_t got;
    if (kvbm_pool_alloc(t->pool, 1, &id) != KVBM_OK) {
      t->st.skipped_space++;
      return KVBM__NONE;
    }
    KVBM__MUST(kvbm__fill_grp(t, grp, id, r->salt, parent, has_parent, tok, h, &got));
    assert(got == id && "not registered: no dedup");
  }
  t->state[id] = KVBM__PENDING;
  kvbm__batch_pin(b, (uint8_t)t->id, id);
  return id;
}

/* One use of full block k (G1 block g1id) by a commit: refresh or copy in
 * G2, G3 and G4 per policy. A copy into G2 is one host job that forwards
 * to the volume tiers once G2 has the bytes; without one, each volume
 * tier gets its own put, from G2 when G2 holds the block, else from G1.
 * Lock held. */
/* Forced inline, as use_in_tier above: commit's loop had both inlined
 * before hybrid.c called this too, and a call per block and tier cost W2
 * 0.6-2.4% more instructions. */
static inline __attribute__((always_inline)) void use_block(kvbm_manager *m, kvbm_mreq *r,
                                                            kvbm__batch *b, size_t k, uint32_t g1id,
                                                            uint64_t h, uint64_t parent,
                                                            bool has_parent, uint8_t grp) {
  const uint32_t *tok = r->tokens + k * m->cfg.block_size;
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2];
  if (g1->state[g1id] != KVBM__READY) return; /* another request's, not written yet */
  kvbm__job j = {.kind = KVBM__J_DOWN, .tier = KVBM_TIER_G2, .prio = r->prio, .hash = h,
                 .parent = parent, .has_parent = has_parent, .b = b,
                 .phase = k < r->labeled ? r->phase[k] : KVBM_PHASE_OUTPUT_CRITICAL, .grp = grp};
  for (int i = 0; i < KVBM_TIER_COUNT; i++) j.id[i] = KVBM__NONE;
  j.id[KVBM_TIER_G1] = g1id;
  bool g2_write = false, g2_ready = false;
  uint32_t held;
  uint8_t puts = 0;
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) {
    kvbm__tier *t = &m->t[ti];
    if (!t->present) continue;
    uint32_t id = use_in_tier(t, r, b, tok, h, parent, has_parent, grp,
                              ti != KVBM_TIER_G2 && g2_write, &held);
    if (ti == KVBM_TIER_G2 && held != KVBM__NONE && g2->state[held] == KVBM__READY) {
      g2_ready = true; /* the volume tiers' puts read G2 */
      j.id[KVBM_TIER_G2] = held;
    }
    if (id == KVBM__NONE) continue;
    j.id[ti] = id;
    if (ti == KVBM_TIER_G2) g2_write = true;
    else puts |= (uint8_t)(1u << ti);
  }
  bool queued = true;
  if (g2_write) {
    j.fwd = puts;
    KVBM__MUST(kvbm_block_retain(g1->pool, g1id));
    b->pending++;
    queued = kvbm__q_push(&g2->q, &j);
  }
  for (int ti = KVBM_TIER_G3; !g2_write && ti < KVBM_TIER_COUNT; ti++) {
    if (!(puts & (1u << ti))) continue;
    kvbm__job p = j;
    p.kind = KVBM__J_PUT;
    p.tier = (uint8_t)ti;
    p.src = g2_ready ? KVBM_TIER_G2 : KVBM_TIER_G1;
    if (!g2_ready) KVBM__MUST(kvbm_block_retain(g1->pool, g1id));
    b->pending++;
    queued = queued && kvbm__q_push(&m->t[ti].q, &p);
  }
  assert(queued && "room checked above");
  (void)queued;
}

/* The two above for hybrid.c (kept static here, so that the one-group
 * paths inline them as before). */
bool kvbm__tier_has(const kvbm_manager *m, int ti, uint64_t h) { return tier_has(m, ti, h); }

void kvbm__use_block(kvbm_manager *m, kvbm_mreq *r, kvbm__batch *b, size_t k, uint32_t g1id,
                     uint64_t h, uint64_t parent, bool has_parent, uint8_t grp) {
  use_block(m, r, b, k, g1id, h, parent, has_parent, grp);
}

int kvbm_mreq_commit(kvbm_mreq *r) {
  if (!r) return KVBM_EINVAL;
  kvbm_mreq_wait(r, -1, NULL);
  kvbm_manager *m = r->m;
  const size_t B = m->cfg.block_size;
  const uint32_t *ids;
  size_t nb;
  size_t nfull = kvbm_seq_num_tokens(r->seq) / B, todo = nfull - r->committed;
  kvbm__batch *b = calloc(1, sizeof *b);
  /* Pins: one per tier below G1 and block at most. */
  if (b) b->pins = malloc(((KVBM_TIER_COUNT - 1) * todo + 1) * sizeof *b->pins);
  if (!b || !b->pins) {
    free(b);
    return KVBM_ENOMEM;
  }
  b->cap = (uint32_t)((KVBM_TIER_COUNT - 1) * todo + 1);
  pthread_mutex_lock(&m->mu);
  kvbm_seq_blocks(r->seq, &ids, &nb);
  uint64_t parent = 0;
  if (r->committed) KVBM__MUST(kvbm_seq_block_hash(r->seq, r->committed - 1, &parent));
  /* The storage events' prefix_hash: this request's first block. */
  m->ev_prefix = 0;
  if (nfull) KVBM__MUST(kvbm_seq_block_hash(r->seq, 0, &m->ev_prefix));
  for (size_t k = r->committed; k < nfull; k++) {
    uint64_t h;
    KVBM__MUST(kvbm_seq_block_hash(r->seq, k, &h));
    uint8_t *st = &m->t[KVBM_TIER_G1].state[ids[k]];
    /* Computed now: the blocks this request registered, and those whose
     * onboard failed (the engine recomputed them). */
    if ((*st == KVBM__UNCOMPUTED && m->g1_owner[ids[k]] == r->serial) ||
        (k >= r->settled && *st == KVBM__FAILED))
      *st = KVBM__READY;
    use_block(m, r, b, k, ids[k], h, parent, k > 0, 0);
    parent = h;
  }
  m->ev_prefix = 0;
  r->committed = nfull;
  if (b->pending == 0) {
    kvbm__batch_done(m, b);
  } else {
    kvbm__workers_kick(m);
  }
  pthread_mutex_unlock(&m->mu);
  /* ExitThink's push waits for enough committed THINK_COMPLETE blocks. */
  if (r->exit_pending) kvbm__disagg_exit_think(r);
  return KVBM_OK;
}

/* The phase change both request kinds share: checks, labels, ExitThink's
 * relabelling; the push to peer 0 is the caller's (hybrid requests have
 * none yet). */
int kvbm__phase_set(kvbm_mreq *r, kvbm_request_phase phase, kvbm_error *err) {
  if (phase != KVBM_REQUEST_REASONING && phase != KVBM_REQUEST_EXIT_THINK && phase != KVBM_REQUEST_OUTPUT)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: set_phase: %d is not a request phase (1..3)", (int)phase);
  if (phase == KVBM_REQUEST_REASONING && r->stage >= KVBM_REQUEST_EXIT_THINK)
    return kvbm_error_set(err, KVBM_ESTATE, "manager: set_phase: reasoning again after ExitThink");
  /* Blocks that filled before this call keep the phase they filled in. */
  int rc = kvbm__label_full(r);
  if (rc) return kvbm_error_set(err, rc, "manager: set_phase: out of memory");
  if (phase == KVBM_REQUEST_EXIT_THINK && r->stage == KVBM_REQUEST_REASONING) {
    for (size_t k = 0; k < r->labeled; k++)
      if (r->phase[k] == KVBM_PHASE_THINK_ACTIVE) r->phase[k] = KVBM_PHASE_THINK_COMPLETE;
    r->exit_pending = r->m->cfg.offload_threshold_blocks > 0;
  }
  r->fill = phase == KVBM_REQUEST_REASONING ? KVBM_PHASE_THINK_ACTIVE : KVBM_PHASE_OUTPUT_CRITICAL;
  r->stage = (uint8_t)phase;
  return KVBM_OK;
}

int kvbm_mreq_set_phase(kvbm_mreq *r, kvbm_request_phase phase, kvbm_error *err) {
  if (!r) return kvbm_error_set(err, KVBM_EINVAL, "manager: set_phase: NULL request");
  int rc = kvbm__phase_set(r, phase, err);
  if (!rc && r->exit_pending) kvbm__disagg_exit_think(r);
  return rc;
}

int kvbm_mreq_block_phase(const kvbm_mreq *r, size_t k, kvbm_frame_phase *out) {
  if (!r || !out) return KVBM_EINVAL;
  size_t nfull = r->ntok / r->m->cfg.block_size;
  if (k >= nfull) return KVBM_ERANGE;
  /* a block filled since the last label (none: append labels) */
  *out = k < r->labeled ? (kvbm_frame_phase)r->phase[k] : (kvbm_frame_phase)r->fill;
  return KVBM_OK;
}

void kvbm_mreq_blocks(const kvbm_mreq *r, const uint32_t **ids, size_t *n) {
  kvbm_seq_blocks(r->seq, ids, n);
}

int kvbm_mreq_block_hash(const kvbm_mreq *r, size_t k, uint64_t *hash) {
  if (!r) return KVBM_EINVAL;
  return kvbm_seq_block_hash(r->seq, k, hash);
}

void kvbm_mreq_destroy(kvbm_mreq *r) {
  if (!r) return;
  if (r->seq) {
    kvbm_mreq_wait(r, -1, NULL);
    pthread_mutex_lock(&r->m->mu);
    /* Blocks it registered but never committed have no KV: whoever
     * matched them must not wait for them, nor use them. */
    const uint32_t *ids;
    size_t nb;
    kvbm_seq_blocks(r->seq, &ids, &nb);
    uint8_t *st = r->m->t[KVBM_TIER_G1].state;
    for (size_t k = 0; k < nb; k++)
      if (st[ids[k]] == KVBM__UNCOMPUTED && r->m->g1_owner[ids[k]] == r->serial) st[ids[k]] = KVBM__FAILED;
    /* Reasoning that has ended is known cold: once released, its blocks
     * are the first G1 evicts (those another request still holds are
     * not released, and keep their place). */
    uint32_t *cold = NULL;
    size_t ncold = 0;
    for (size_t k = 0; k < r->labeled && k < nb; k++)
      if (r->phase[k] == KVBM_PHASE_THINK_COMPLETE) ncold++;
    if (ncold && (cold = malloc(ncold * sizeof *cold))) {
      ncold = 0;
      for (size_t k = 0; k < r->labeled && k < nb; k++)
        if (r->phase[k] == KVBM_PHASE_THINK_COMPLETE) cold[ncold++] = ids[k];
    }
    kvbm_seq_destroy(r->seq);
    /* Tail first, so that the oldest reasoning ends up first in line. */
    for (size_t i = cold ? ncold : 0; i-- > 0;) (void)kvbm_block_demote(r->m->t[KVBM_TIER_G1].pool, cold[i]);
    free(cold);
    kvbm__onboards_release(r->og);
    r->og = NULL;
    pthread_mutex_unlock(&r->m->mu);
  }
  free(r->phase);
  free(r->tokens);
  free(r->src);
  free(r);
}
