/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hints.c: storage hints applied (kvbm_manager_hint, kvbm/manager.h).
 *
 * A storage advisor (kvbm advisor) sees the manager only through its
 * events, and suggests: promote a hot block sitting in G3/G4 into G2,
 * demote a cold G2 block into G3/G4, drop a cold one. The seed insists
 * this stays "non-intrusive": the engine never waits on it. So a hint is
 * applied as an offload is: under the manager lock we only look the block
 * up, take the target block (registered PENDING, so a prefill walking
 * past it sees a miss, not half-written bytes) and queue one job on the
 * worker of the tier that does the I/O; the bytes move on that worker,
 * and the job's end releases what it pinned. Nothing here blocks, and a
 * hint that cannot be applied now (block in use, full queue, no room) is
 * counted and forgotten: hints are advice, the next scan repeats them.
 *
 *   PROMOTE  from a volume tier into G2: a J_GET whose destination is G2
 *            (workers.c reads into the G2 block instead of a G1 one). The
 *            G2 block takes an eviction like any offload does.
 *   DEMOTE   from G2 into a volume tier: a J_PUT from G2 (the same path
 *            as write-through), then the G2 copy is dropped: a move. If the
 *            volume already holds the block, only the drop is left to do.
 *   DROP     a cached block leaves its tier now (kvbm_pool_evict): its
 *            REMOVED event goes out as for an eviction, and an exclusive
 *            volume deletes the value.
 *
 * Groups. A hybrid model's advisor names each hint's KV cache group
 * (kvbm_hint.group); the tiers file group g's block under
 * kvbm__group_key(hash, g), so kvbm_manager_hint_group maps the hint to
 * that key and the rest is the same. The job takes the group of the
 * source block it finds, so a demoted value carries its group's bytes.
 *
 * Why not apply hints inside the prefill walk (as a cache policy would):
 * that is the engine's path; the advisor's information arrives ~10 s late
 * anyway, so acting on it asynchronously loses nothing.
 */
#include <string.h>

#include "kvbm/volume.h"
#include "tier/internal.h"

const char *kvbm_manager_volume_id(const kvbm_manager *m, kvbm_tier t) {
  if (!m || t <= KVBM_TIER_G1 || t >= KVBM_TIER_COUNT || !m->t[t].present) return NULL;
  const kvbm__tier *x = &m->t[t];
  if (x->store == KVBM__STORE_MEMORY) return m->g2_name;
  return x->usable && x->vol ? kvbm_volume_name(x->vol) : NULL;
}

void kvbm_manager_hint_stats_get(kvbm_manager *m, kvbm_manager_hint_stats *out) {
  if (!m || !out) return;
  pthread_mutex_lock(&m->mu);
  *out = m->hst;
  pthread_mutex_unlock(&m->mu);
}

/* The block of hash h in tier t, registered and READY; KVBM__NONE else. */
static uint32_t ready_block(const kvbm__tier *t, uint64_t h) {
  uint32_t id;
  if (kvbm_pool_peek(t->pool, h, &id, NULL) != KVBM_OK) return KVBM__NONE;
  return t->state[id] == KVBM__READY ? id : KVBM__NONE;
}

/* Takes a free (or evicted) block of tier t and registers it as h,
 * PENDING, with the identity the source block has (salt, parent; tokens
 * when the source kept them). KVBM__NONE when every block is in use. */
static uint32_t take_target(kvbm_manager *m, kvbm__tier *t, const kvbm__tier *src, uint32_t sid,
                            uint64_t h) {
  kvbm_block_info bi;
  KVBM__MUST(kvbm_block_info_get(src->pool, sid, &bi));
  uint32_t id, got;
  if (kvbm_pool_alloc(t->pool, 1, &id) != KVBM_OK) return KVBM__NONE;
  const uint32_t *tok = bi.tokens ? bi.tokens : m->zero_tokens;
  uint32_t g = src->grp ? src->grp[sid] : 0; /* the events name the source's group */
  KVBM__MUST(kvbm__fill_grp(t, g, id, bi.salt_hash, bi.parent_hash, bi.has_parent, tok, h, &got));
  assert(got == id && "peeked: not registered");
  t->state[id] = KVBM__PENDING;
  return id;
}

static kvbm__job hint_job(int kind, int io_tier, uint64_t h) {
  kvbm__job j = {.kind = (uint8_t)kind, .tier = (uint8_t)io_tier, .hint = true, .hash = h};
  for (int i = 0; i < KVBM_TIER_COUNT; i++) j.id[i] = KVBM__NONE;
  return j;
}

static int promote(kvbm_manager *m, uint64_t h, kvbm_tier from) {
  kvbm__tier *g2 = &m->t[KVBM_TIER_G2], *f = &m->t[from];
  if (kvbm_pool_peek(g2->pool, h, NULL, NULL) == KVBM_OK) return m->hst.already++, KVBM_EEXIST;
  uint32_t sid = ready_block(f, h);
  if (sid == KVBM__NONE) return m->hst.missing++, KVBM_ENOTFOUND;
  if (!kvbm__q_free(&f->q)) return m->hst.busy++, KVBM_EAGAIN;
  uint32_t gid = take_target(m, g2, f, sid, h);
  if (gid == KVBM__NONE) return m->hst.busy++, KVBM_EAGAIN;
  KVBM__MUST(kvbm_pool_match(f->pool, h, &sid)); /* pinned until the get is over */
  kvbm__job j = hint_job(KVBM__J_GET, from, h);
  j.dst = KVBM_TIER_G2;
  j.id[from] = sid;
  j.id[KVBM_TIER_G2] = gid;
  bool queued = kvbm__q_push(&f->q, &j);
  assert(queued && "room checked");
  (void)queued;
  m->hst.queued++;
  kvbm__workers_kick(m);
  return KVBM_OK;
}

static int drop(kvbm_manager *m, uint64_t h, kvbm_tier from) {
  int rc = kvbm_pool_evict(m->t[from].pool, h);
  if (rc == KVBM_ENOTFOUND) return m->hst.missing++, rc;
  if (rc) return m->hst.busy++, KVBM_EAGAIN; /* in use: it stays */
  m->hst.dropped++;
  return KVBM_OK;
}

static int demote(kvbm_manager *m, uint64_t h, kvbm_tier to) {
  kvbm__tier *g2 = &m->t[KVBM_TIER_G2], *t = &m->t[to];
  uint32_t gid = ready_block(g2, h);
  if (gid == KVBM__NONE) return m->hst.missing++, KVBM_ENOTFOUND;
  if (ready_block(t, h) != KVBM__NONE) return drop(m, h, KVBM_TIER_G2); /* only the move's end */
  uint32_t tid;
  if (kvbm_pool_peek(t->pool, h, &tid, NULL) == KVBM_OK) return m->hst.busy++, KVBM_EAGAIN; /* pending */
  if (!kvbm__q_free(&t->q)) return m->hst.busy++, KVBM_EAGAIN;
  tid = take_target(m, t, g2, gid, h);
  if (tid == KVBM__NONE) return m->hst.busy++, KVBM_EAGAIN;
  KVBM__MUST(kvbm_pool_match(g2->pool, h, &gid)); /* the put reads it */
  kvbm_block_info bi;
  KVBM__MUST(kvbm_block_info_get(g2->pool, gid, &bi));
  kvbm__job j = hint_job(KVBM__J_PUT, to, h);
  j.src = KVBM_TIER_G2;
  j.id[KVBM_TIER_G2] = gid;
  j.id[to] = tid;
  j.parent = bi.parent_hash;
  j.has_parent = bi.has_parent;
  j.grp = g2->grp ? g2->grp[gid] : 0; /* the slot file keeps it (workers.c) */
  bool queued = kvbm__q_push(&t->q, &j);
  assert(queued && "room checked");
  (void)queued;
  m->hst.queued++;
  kvbm__workers_kick(m);
  return KVBM_OK;
}

static bool volume_tier(const kvbm_manager *m, kvbm_tier t) {
  /* A store left alone (back-off, store.c) takes no hint's copy either. */
  return t >= KVBM_TIER_G3 && t < KVBM_TIER_COUNT && m->t[t].present && m->t[t].usable &&
         !kvbm__backed_off(&m->t[t]);
}

int kvbm_manager_hint(kvbm_manager *m, kvbm_manager_hint_kind kind, uint64_t h, kvbm_tier from,
                      kvbm_tier to) {
  if (!m) return KVBM_EINVAL;
  pthread_mutex_lock(&m->mu);
  m->hst.received++;
  const kvbm__tier *g2 = &m->t[KVBM_TIER_G2];
  bool g2_ok = g2->present && !g2->device;
  int rc;
  if (m->stop) {
    rc = KVBM_ECLOSED;
  } else if (kind == KVBM_MANAGER_HINT_PROMOTE && g2_ok && volume_tier(m, from) && to == KVBM_TIER_G2) {
    rc = promote(m, h, from);
  } else if (kind == KVBM_MANAGER_HINT_DEMOTE && g2_ok && from == KVBM_TIER_G2 && volume_tier(m, to)) {
    rc = demote(m, h, to);
  } else if (kind == KVBM_MANAGER_HINT_DROP && from > KVBM_TIER_G1 && from < KVBM_TIER_COUNT &&
             m->t[from].present) {
    rc = drop(m, h, from);
  } else {
    m->hst.refused++;
    rc = from < KVBM_TIER_G1 || from >= KVBM_TIER_COUNT || to < KVBM_TIER_G1 || to >= KVBM_TIER_COUNT
             ? KVBM_ETIER
             : KVBM_EINVAL;
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int kvbm_manager_hint_group(kvbm_manager *m, kvbm_manager_hint_kind kind, uint64_t h,
                            uint32_t group, kvbm_tier from, kvbm_tier to) {
  if (!m) return KVBM_EINVAL;
  if (group >= m->ngroups) { /* ngroups is fixed at create: no lock to read it */
    pthread_mutex_lock(&m->mu);
    m->hst.received++;
    m->hst.refused++;
    pthread_mutex_unlock(&m->mu);
    return KVBM_EINVAL;
  }
  return kvbm_manager_hint(m, kind, kvbm__group_key(h, group), from, to);
}

/* A demotion's put is over (put_done set the target's state): release
 * what it pinned, and on success the G2 copy leaves (the move). */
void kvbm__hint_put_done(kvbm_manager *m, kvbm__tier *t, const kvbm__job *j, bool ok) {
  kvbm__tier *g2 = &m->t[KVBM_TIER_G2];
  KVBM__MUST(kvbm_block_release(t->pool, j->id[t->id], 0));
  KVBM__MUST(kvbm_block_release(g2->pool, j->id[KVBM_TIER_G2], 0));
  if (!ok) {
    m->hst.failed++;
    return;
  }
  m->hst.demoted++;
  (void)kvbm_pool_evict(g2->pool, j->hash); /* someone took it meanwhile: it stays */
}

/* A promotion's get is over: the G2 block is READY (or FAILED: a miss
 * until rewritten), both blocks released. */
void kvbm__hint_get_done(kvbm_manager *m, kvbm__tier *t, const kvbm__job *j, bool ok) {
  kvbm__tier *g2 = &m->t[KVBM_TIER_G2];
  g2->state[j->id[KVBM_TIER_G2]] = ok ? KVBM__READY : KVBM__FAILED;
  if (ok) m->hst.promoted++;
  else m->hst.failed++;
  KVBM__MUST(kvbm_block_release(t->pool, j->id[t->id], 0));
  KVBM__MUST(kvbm_block_release(g2->pool, j->id[KVBM_TIER_G2], 0));
}
