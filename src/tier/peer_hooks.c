/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer_hooks.c: the manager's side of its peers (kvbm/manager.h, "The
 * peers' side of the manager").
 *
 * The peers (src/peer/, kvbm/peer.h) are a module above the manager: they
 * were a file of it (disagg.c) that reached into seven of its internals,
 * and the manager called them by name, a circle. Now the arrow goes one
 * way. What the peers did with the manager's internals is a public call
 * here (pin and unpin a block, put a checked block, a block's kept sum,
 * the layer pointers and copies kvbm_manager_block_layer/read/write
 * already offered), and what the manager needs of the peers is a hook
 * they register (whether a peer holds a block, the pull, ExitThink's
 * batch, "this block is gone", destroy). The rules that are the
 * manager's stay here: which blocks ExitThink sends (a request's
 * labels), which G1 copies the OutputCritical pull may drop for room
 * (the pool's eviction order, asked of the remote hook), when a block
 * has left both G1 and G2.
 *
 * Locks. The hooks are set once under peers_mu and read under it, except
 * through the peers_on gate, an atomic that lets an eviction with no
 * peer ever attached cost one relaxed load (as before the move). Hooks
 * called under peers_mu (remote, gone) must not call the manager; pull
 * and exit_think are called without any lock and may. Destroy takes the
 * hooks out under the lock, then calls destroy without it: the peers'
 * link threads, which call the manager, finish first.
 *
 * Kept sums' kind (kvbm_manager_keep_sums): plain BLAKE3-128, or keyed
 * under the peers' cluster key so that a keyed link still hashes a block
 * once. The key goes into G1 and G2's sum_key before hash_copies is
 * published (release; copy.c reads it with acquire), and no sum is kept
 * before that, so every kept sum is of the one kind.
 */
#include <stdlib.h>
#include <string.h>

#include "tier/internal.h"

/* ---- the hooks ---- */

int kvbm_manager_peer_hooks_set(kvbm_manager *m, const kvbm_manager_peer_hooks *h, kvbm_error *err) {
  if (!m || !h) return kvbm_error_set(err, KVBM_EINVAL, "manager: peer hooks: NULL argument");
  if (!h->remote || !h->pull || !h->exit_think || !h->gone || !h->destroy)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: peer hooks: every hook must be set");
  pthread_mutex_lock(&m->peers_mu);
  bool set = atomic_load(&m->peers_on);
  if (!set) {
    m->hooks = *h;
    atomic_store_explicit(&m->peers_on, true, memory_order_release);
  }
  pthread_mutex_unlock(&m->peers_mu);
  return set ? kvbm_error_set(err, KVBM_EEXIST, "manager: peer hooks are registered already") : KVBM_OK;
}

void *kvbm_manager_peer_hooks_user(kvbm_manager *m) {
  if (!m) return NULL;
  pthread_mutex_lock(&m->peers_mu);
  void *u = atomic_load(&m->peers_on) ? m->hooks.user : NULL;
  pthread_mutex_unlock(&m->peers_mu);
  return u;
}

/* The hooks as they are now (false: none). For the calls without a lock. */
static bool hooks_get(kvbm_manager *m, kvbm_manager_peer_hooks *out) {
  if (!atomic_load_explicit(&m->peers_on, memory_order_acquire)) return false;
  pthread_mutex_lock(&m->peers_mu);
  bool on = atomic_load(&m->peers_on);
  if (on) *out = m->hooks;
  pthread_mutex_unlock(&m->peers_mu);
  return on;
}

void kvbm__disagg_stop(kvbm_manager *m) {
  kvbm_manager_peer_hooks h;
  pthread_mutex_lock(&m->peers_mu);
  bool on = atomic_load(&m->peers_on);
  h = m->hooks;
  atomic_store(&m->peers_on, false);
  memset(&m->hooks, 0, sizeof m->hooks);
  pthread_mutex_unlock(&m->peers_mu);
  if (on) h.destroy(h.user);
  explicit_bzero(m->sum_key, sizeof m->sum_key);
}

bool kvbm__disagg_remote(kvbm_manager *m, uint64_t h, uint32_t *peer) {
  if (!atomic_load_explicit(&m->peers_on, memory_order_acquire)) return false;
  pthread_mutex_lock(&m->peers_mu);
  bool found = atomic_load(&m->peers_on) && m->hooks.remote(m->hooks.user, h, false, peer);
  pthread_mutex_unlock(&m->peers_mu);
  return found;
}

size_t kvbm__disagg_pull(kvbm_manager *m, uint32_t peer, const uint64_t *hashes, size_t n) {
  kvbm_manager_peer_hooks h;
  if (n == 0 || !hooks_get(m, &h)) return 0;
  return h.pull(h.user, peer, hashes, n, m->cfg.pull_timeout_ms > 0 ? m->cfg.pull_timeout_ms : 0);
}

/* Whether tier ti (G1 or G2) holds h with its bytes in place. m->mu held. */
static bool tier_holds(const kvbm_manager *m, int ti, uint64_t h) {
  const kvbm__tier *t = &m->t[ti];
  uint32_t id;
  return t->present && t->usable && kvbm_pool_peek(t->pool, h, &id, NULL) == KVBM_OK && t->state[id] == KVBM__READY;
}

void kvbm__disagg_block_gone(kvbm_manager *m, int tier, const kvbm_pool_event *ev) {
  if (!m->mu_ready || (tier != KVBM_TIER_G1 && tier != KVBM_TIER_G2) || ev->kind == KVBM_POOL_STORED) return;
  /* No peer ever attached: an eviction costs one relaxed load here. */
  if (!atomic_load_explicit(&m->peers_on, memory_order_relaxed)) return;
  /* A block gone from one tier may still be in the other: a pull is
   * served from either (kvbm_manager_block_pin). The event's own pool is
   * not called back (kvbm_pool_listener's rule): it no longer holds it. */
  bool all = ev->kind == KVBM_POOL_CLEARED;
  if (!all && tier_holds(m, tier == KVBM_TIER_G1 ? KVBM_TIER_G2 : KVBM_TIER_G1, ev->seq_hash)) return;
  pthread_mutex_lock(&m->peers_mu);
  if (atomic_load(&m->peers_on)) m->hooks.gone(m->hooks.user, ev->seq_hash, all);
  pthread_mutex_unlock(&m->peers_mu);
}

/* ---- where a block is ---- */

int kvbm_manager_block_location(kvbm_manager *m, uint64_t seq_hash, kvbm_block_location *out) {
  if (!m || !out) return KVBM_EINVAL;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&m->mu);
  for (int ti = KVBM_TIER_G1; ti < KVBM_TIER_COUNT && !out->held; ti++) {
    const kvbm__tier *t = &m->t[ti];
    uint32_t id;
    if (t->present && t->usable && kvbm_pool_peek(t->pool, seq_hash, &id, NULL) == KVBM_OK &&
        t->state[id] == KVBM__READY) {
      out->held = true;
      out->tier = (kvbm_tier)ti;
    }
  }
  pthread_mutex_unlock(&m->mu);
  if (!out->held && kvbm__disagg_remote(m, seq_hash, &out->peer)) out->remote = true;
  return KVBM_OK;
}

/* ---- the OutputCritical pull's room ---- */

/* kvbm_pool_evict_where's choice: a block some peer holds by a word
 * within its lease (the hook counts the drop). Under m->mu; peers_mu is
 * taken per call, not around the eviction, whose pool event (the gone
 * hook) takes it too. */
static bool held_by_peer(void *user, uint32_t id, uint64_t h) {
  kvbm_manager *m = user;
  (void)id;
  pthread_mutex_lock(&m->peers_mu);
  bool held = atomic_load(&m->peers_on) && m->hooks.remote(m->hooks.user, h, true, NULL);
  pthread_mutex_unlock(&m->peers_mu);
  return held;
}

size_t kvbm__disagg_make_room(kvbm_manager *m, size_t need) {
  if (!atomic_load_explicit(&m->peers_on, memory_order_acquire)) return 0;
  kvbm_pool *g1 = m->t[KVBM_TIER_G1].pool;
  kvbm_pool_stats s;
  kvbm_pool_stats_get(g1, &s);
  if (s.free >= need) return 0;
  size_t want = need - s.free;
  return kvbm_pool_evict_where(g1, want > UINT32_MAX ? UINT32_MAX : (uint32_t)want, held_by_peer, m);
}

/* ---- ExitThink's batch ---- */

void kvbm__disagg_exit_think(kvbm_mreq *r) {
  kvbm_manager *m = r->m;
  kvbm_manager_peer_hooks hk;
  if (!r->exit_pending || m->cfg.offload_threshold_blocks == 0 || !hooks_get(m, &hk)) return;
  const size_t B = m->cfg.block_size;
  kvbm_block_ref *blocks = malloc((r->labeled ? r->labeled : 1) * sizeof *blocks);
  if (!blocks) return;
  size_t n = 0;
  pthread_mutex_lock(&m->mu);
  const uint32_t *ids;
  size_t nb;
  kvbm_seq_blocks(r->seq, &ids, &nb);
  const uint8_t *st = m->t[KVBM_TIER_G1].state;
  size_t ready = 0;
  for (size_t k = 0; k < r->labeled && k < nb; k++)
    ready += r->phase[k] == KVBM_PHASE_THINK_COMPLETE && st[ids[k]] == KVBM__READY;
  if (ready >= m->cfg.offload_threshold_blocks) {
    for (size_t k = 0; k < r->labeled && k < nb; k++) {
      if (r->phase[k] != KVBM_PHASE_THINK_COMPLETE || st[ids[k]] != KVBM__READY) continue;
      KVBM__MUST(kvbm_block_retain(m->t[KVBM_TIER_G1].pool, ids[k]));
      uint64_t h, parent = 0;
      KVBM__MUST(kvbm_seq_block_hash(r->seq, k, &h));
      if (k) KVBM__MUST(kvbm_seq_block_hash(r->seq, k - 1, &parent));
      blocks[n++] = (kvbm_block_ref){.tier = KVBM_TIER_G1, .id = ids[k], .seq_hash = h, .parent_hash = parent,
                                     .salt_hash = r->salt, .has_parent = k > 0, .tokens = r->tokens + k * B,
                                     .phase = KVBM_PHASE_THINK_COMPLETE};
    }
    r->exit_pending = false;
  }
  pthread_mutex_unlock(&m->mu);
  if (n) {
    hk.exit_think(hk.user, blocks, n);
    kvbm_manager_block_unpin(m, blocks, n);
  }
  free(blocks);
}

bool kvbm__disagg_push_think(kvbm_manager *m, const kvbm_block_ref *blocks, size_t n) {
  kvbm_manager_peer_hooks hk;
  if (!hooks_get(m, &hk)) return false;
  if (n) hk.exit_think(hk.user, blocks, n);
  return true;
}

/* ---- the block calls the peers use ---- */

int kvbm_manager_keep_sums(kvbm_manager *m, const uint8_t *key, kvbm_error *err) {
  if (!m) return kvbm_error_set(err, KVBM_EINVAL, "manager: keep_sums: NULL manager");
  uint8_t kind = key ? 2 : 1;
  int rc = KVBM_OK;
  pthread_mutex_lock(&m->peers_mu);
  if (m->sums_kind == 0) {
    if (key) memcpy(m->sum_key, key, sizeof m->sum_key);
    for (int ti = KVBM_TIER_G1; ti <= KVBM_TIER_G2; ti++) m->t[ti].sum_key = key ? m->sum_key : NULL;
    m->sums_kind = kind;
    /* From now on a block's sum is computed when it is first offloaded to
     * G2, by the host worker, and kept for its sends (copy.c). */
    atomic_store_explicit(&m->t[KVBM_TIER_G2].hash_copies, true, memory_order_release);
  } else {
    uint8_t diff = m->sums_kind != kind;
    for (size_t i = 0; key && !diff && i < sizeof m->sum_key; i++) diff |= m->sum_key[i] ^ key[i];
    if (diff)
      rc = kvbm_error_set(err, KVBM_EINVAL, "manager: its kept sums are %s already; one manager's peers share "
                          "one key or none", m->sums_kind == 2 ? "keyed under another key" : "unkeyed");
  }
  pthread_mutex_unlock(&m->peers_mu);
  return rc;
}

uint32_t kvbm_manager_block_tokens(const kvbm_manager *m) { return m ? m->cfg.block_size : 0; }

kvbm_hash_scheme kvbm_manager_hash_scheme(const kvbm_manager *m) {
  return m ? m->cfg.scheme : KVBM_HASH_NATIVE;
}

int kvbm_manager_block_pin(kvbm_manager *m, uint64_t seq_hash, uint32_t *tokens, kvbm_block_ref *out) {
  if (!m || !out) return KVBM_EINVAL;
  pthread_mutex_lock(&m->mu);
  for (int ti = KVBM_TIER_G1; ti <= KVBM_TIER_G2; ti++) {
    kvbm__tier *t = &m->t[ti];
    uint32_t id;
    if (!tier_holds(m, ti, seq_hash)) continue;
    KVBM__MUST(kvbm_pool_match(t->pool, seq_hash, &id));
    kvbm_block_info bi;
    KVBM__MUST(kvbm_block_info_get(t->pool, id, &bi));
    *out = (kvbm_block_ref){.tier = (kvbm_tier)ti, .id = id, .seq_hash = seq_hash, .parent_hash = bi.parent_hash,
                            .salt_hash = bi.salt_hash, .has_parent = bi.has_parent,
                            .phase = KVBM_PHASE_OUTPUT_CRITICAL};
    if (bi.tokens && tokens) { /* valid while the lock is held */
      memcpy(tokens, bi.tokens, m->cfg.block_size * sizeof *tokens);
      out->tokens = tokens;
    }
    pthread_mutex_unlock(&m->mu);
    return KVBM_OK;
  }
  pthread_mutex_unlock(&m->mu);
  return KVBM_ENOTFOUND;
}

void kvbm_manager_block_unpin(kvbm_manager *m, const kvbm_block_ref *b, size_t n) {
  if (!m || !b) return;
  pthread_mutex_lock(&m->mu);
  for (size_t i = 0; i < n; i++) KVBM__MUST(kvbm_block_release(m->t[b[i].tier].pool, b[i].id, 0));
  pthread_mutex_unlock(&m->mu);
}

/* Copies the block's layers into tier block `id` (any memory: host
 * directly, device through block_write). */
static int fill_layers(kvbm_manager *m, kvbm_tier ti, uint32_t id, const uint8_t *const *layers, kvbm_error *err) {
  const kvbm__tier *t = &m->t[ti];
  for (uint64_t l = 0; l < t->layout.config.num_layers; l++) {
    int rc = kvbm_manager_block_write(m, ti, id, (uint32_t)l, layers[l], t->layout.layer_stride, err);
    if (rc) return rc;
  }
  return KVBM_OK;
}

int kvbm_manager_block_put(kvbm_manager *m, kvbm_tier ti, const kvbm_block_ref *b, const uint8_t *const *layers,
                           const uint8_t *sum, kvbm_error *err) {
  if (!m || !b || !layers) return kvbm_error_set(err, KVBM_EINVAL, "manager: block_put: NULL argument");
  if ((ti != KVBM_TIER_G1 && ti != KVBM_TIER_G2) || !m->t[ti].present || !m->t[ti].usable)
    return kvbm_error_set(err, KVBM_ETIER, "manager: block_put: tier %s is not a memory tier here", kvbm_tier_name(ti));
  kvbm__tier *t = &m->t[ti];
  uint32_t id, got;
  /* A hybrid manager's key names its group only through the block's
   * tokens: registered with it, its events say its group_idx and hash. */
  uint32_t grp = 0;
  if (m->ngroups > 1 && b->tokens)
    (void)kvbm_manager_key_group(m, b->seq_hash, b->salt_hash, b->parent_hash, b->has_parent, b->tokens, &grp);
  pthread_mutex_lock(&m->mu);
  if (tier_holds(m, ti, b->seq_hash)) {
    pthread_mutex_unlock(&m->mu);
    return KVBM_OK; /* already here */
  }
  int rc = kvbm_pool_alloc(t->pool, 1, &id);
  pthread_mutex_unlock(&m->mu);
  if (rc) return kvbm_error_set(err, KVBM_ENOSPC, "manager: %s has no block to spare", kvbm_tier_name(ti));
  rc = fill_layers(m, ti, id, layers, err);
  pthread_mutex_lock(&m->mu);
  if (rc == KVBM_OK)
    rc = kvbm__fill_grp(t, grp, id, b->salt_hash, b->parent_hash, b->has_parent,
                        b->tokens ? b->tokens : m->zero_tokens, b->seq_hash, &got);
  if (rc) {
    KVBM__MUST(kvbm_block_release(t->pool, id, 0));
  } else {
    if (got == id) {
      t->state[id] = KVBM__READY;
      /* its registration forgot any sum: the one checked on the way in */
      if (sum) kvbm__sum_keep(t, id, sum);
    }
    KVBM__MUST(kvbm_block_release(t->pool, got, 0));
    /* Known cold: the first candidate for demotion. */
    if (b->phase == KVBM_PHASE_THINK_COMPLETE) (void)kvbm_block_demote(t->pool, got);
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int kvbm_manager_block_sum(const kvbm_manager *m, kvbm_tier ti, uint32_t id, uint8_t sum[16]) {
  if (!m || !sum) return KVBM_EINVAL;
  if (ti != KVBM_TIER_G1 && ti != KVBM_TIER_G2) return KVBM_ETIER;
  return kvbm__sum_get(&m->t[ti], id, sum) ? KVBM_OK : KVBM_ENOTFOUND;
}

void kvbm_manager_block_sum_keep(const kvbm_manager *m, kvbm_tier ti, uint32_t id, const uint8_t sum[16]) {
  if (!m || !sum || (ti != KVBM_TIER_G1 && ti != KVBM_TIER_G2)) return;
  kvbm__sum_keep(&m->t[ti], id, sum);
}
