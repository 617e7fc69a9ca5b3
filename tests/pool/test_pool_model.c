/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pool_model.c: the pool against an independent reference model.
 *
 * Tens of thousands of random operations (alloc, fill under a caller hash,
 * init/append/commit/register by steps, stopping half way, abort, match,
 * match_prefix, retain/fork, release of a request tail first at a random
 * priority, release of one block, clear, and refused calls) are applied to
 * the pool and to a model written here with plain arrays and O(n) scans:
 * the victim of an eviction is "the cached block with the lowest (priority,
 * release time)", a hash resolves to "the registered block with that hash
 * registered earliest", and so on. After every step the test compares the
 * stats, every block's state, reference count, hash and priority, the
 * registered set, contains() for every hash in use, and the events.
 *
 * The hashes come from a small universe so that registers often dedup, and
 * most of them are crafted to share a few home buckets of the registry
 * (two of them at its end, so overflow wraps round), so that the many
 * evictions drive the overflow counts through all their cases. Runs
 * for both hash schemes, with and without allow_duplicates.
 */
#include "pool_testutil.h"

#include <stdio.h>

#define NB 64
#define BS 4
#define NREQ 12
#define MAXREF 24
#define NCRAFT 80
#define NRAND 64
#define NTOKH 16
#define NHASH (NCRAFT + NRAND + NTOKH)
#define NIL UINT32_MAX

typedef struct mblk {
  kvbm_block_state state;
  uint32_t rc;
  uint64_t hash;       /* COMPLETE, REGISTERED */
  uint8_t prio;        /* when cached */
  uint64_t stamp;      /* release time, when cached */
  uint64_t regseq;     /* registration time, when REGISTERED */
  uint32_t ntok;       /* PARTIAL */
  uint32_t tok_seed;   /* PARTIAL/COMPLETE by steps: the tokens' seed */
} mblk;

typedef struct req {
  uint32_t ids[MAXREF];
  int n;
} req;

typedef struct model {
  mblk b[NB];
  bool allow_dup;
  kvbm_hash_scheme scheme;
  uint64_t clock, regclock;
  uint64_t allocated, evicted, dedup, match_hits;
  tu_event exp[256];
  size_t nexp;
} model;

typedef struct ctx {
  model m;
  req r[NREQ];
  kvbm_pool *p;
  tu_log log;
  uint64_t rng;
  uint64_t hashes[NHASH];
  unsigned seed;
  long step;
  const char *op;
  /* how much of each interesting thing happened */
  long n_evict, n_dedup, n_enospc, n_clear, n_match_hit, n_reject, n_abort, n_dup_reg;
} ctx;

static ctx C;

#define CHECK(cond, ...)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      char msg_[256];                                                                 \
      snprintf(msg_, sizeof msg_, __VA_ARGS__);                                       \
      fail_msg("seed %u step %ld op %s: %s (%s)", C.seed, C.step, C.op, msg_, #cond); \
    }                                                                                 \
  } while (0)

static uint64_t rnd(void) {
  uint64_t x = C.rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  C.rng = x;
  return x * 0x2545F4914F6CDD1Dull;
}
static uint32_t rndn(uint32_t n) { return (uint32_t)(rnd() % n); }

/* ---- the model ----------------------------------------------------------- */

static bool m_is_free(const model *m, uint32_t id) {
  return m->b[id].rc == 0 && m->b[id].state == KVBM_BLOCK_RESET;
}
static bool m_is_cached(const model *m, uint32_t id) {
  return m->b[id].rc == 0 && m->b[id].state == KVBM_BLOCK_REGISTERED;
}
static uint32_t m_count(const model *m, bool (*pred)(const model *, uint32_t)) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < NB; i++) n += pred(m, i);
  return n;
}
static uint32_t m_registered(const model *m) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < NB; i++) n += m->b[i].state == KVBM_BLOCK_REGISTERED;
  return n;
}

static uint32_t m_resolve(const model *m, uint64_t h) {
  uint32_t best = NIL;
  for (uint32_t i = 0; i < NB; i++)
    if (m->b[i].state == KVBM_BLOCK_REGISTERED && m->b[i].hash == h &&
        (best == NIL || m->b[i].regseq < m->b[best].regseq))
      best = i;
  return best;
}

static uint32_t m_victim(const model *m) {
  uint32_t best = NIL;
  for (uint32_t i = 0; i < NB; i++) {
    if (!m_is_cached(m, i)) continue;
    if (best == NIL || m->b[i].prio < m->b[best].prio ||
        (m->b[i].prio == m->b[best].prio && m->b[i].stamp < m->b[best].stamp))
      best = i;
  }
  return best;
}

static void m_expect(model *m, kvbm_pool_event_kind kind, uint32_t id, uint64_t h,
                     uint64_t parent, bool has_parent, uint64_t salt) {
  CHECK(m->nexp < sizeof m->exp / sizeof *m->exp, "too many events in one step");
  tu_event *e = &m->exp[m->nexp++];
  memset(e, 0, sizeof *e);
  e->kind = kind;
  e->block_id = id;
  e->seq_hash = h;
  e->parent_hash = parent;
  e->has_parent = has_parent;
  e->salt_hash = salt;
}

static void m_reset(mblk *b) {
  b->state = KVBM_BLOCK_RESET;
  b->hash = 0;
  b->ntok = 0;
  b->prio = 0;
}

static void m_acquire(model *m, uint32_t id) { m->b[id].rc++; }

static void m_release(model *m, uint32_t id, uint8_t prio) {
  mblk *b = &m->b[id];
  b->rc--;
  if (b->rc) return;
  if (b->state == KVBM_BLOCK_REGISTERED) {
    b->prio = prio;
    b->stamp = ++m->clock;
  } else {
    m_reset(b);
  }
}

/* Register of a COMPLETE block held by the caller; returns the holder. */
static uint32_t m_register(model *m, uint32_t id, uint64_t parent, bool has_parent, uint64_t salt) {
  mblk *b = &m->b[id];
  uint32_t existing = m_resolve(m, b->hash);
  if (existing != NIL && !m->allow_dup) {
    m->dedup++;
    m_acquire(m, existing);
    b->rc--;
    m_reset(b);
    return existing;
  }
  if (existing != NIL) {
    m->dedup++;
    C.n_dup_reg++;
  }
  b->state = KVBM_BLOCK_REGISTERED;
  b->regseq = ++m->regclock;
  m_expect(m, KVBM_POOL_STORED, id, b->hash, has_parent ? parent : 0, has_parent, salt);
  return id;
}

/* ---- comparing ----------------------------------------------------------------- */

typedef struct regset {
  uint32_t n;
  uint32_t id[NB];
  uint64_t h[NB];
} regset;
static void collect(void *user, uint32_t id, uint64_t h) {
  regset *s = user;
  CHECK(s->n < NB, "too many registered blocks");
  s->id[s->n] = id;
  s->h[s->n] = h;
  s->n++;
}

static void compare(void) {
  const model *m = &C.m;
  kvbm_pool_stats st;
  kvbm_pool_stats_get(C.p, &st);
  uint32_t nfree = m_count(m, m_is_free), ncached = m_count(m, m_is_cached);
  CHECK(st.free == nfree, "free %u, model %u", st.free, nfree);
  CHECK(st.cached == ncached, "cached %u, model %u", st.cached, ncached);
  CHECK(st.active == NB - nfree - ncached, "active %u", st.active);
  CHECK(st.registered == m_registered(m), "registered %u, model %u", st.registered, m_registered(m));
  CHECK(st.allocated == m->allocated, "allocated");
  CHECK(st.evicted == m->evicted, "evicted %lu, model %lu", (unsigned long)st.evicted,
        (unsigned long)m->evicted);
  CHECK(st.dedup == m->dedup, "dedup %lu, model %lu", (unsigned long)st.dedup, (unsigned long)m->dedup);
  CHECK(st.match_hits == m->match_hits, "match_hits");
  CHECK(kvbm_pool_available(C.p) == nfree + ncached, "available");

  for (uint32_t i = 0; i < NB; i++) {
    kvbm_block_info bi;
    CHECK(kvbm_block_info_get(C.p, i, &bi) == KVBM_OK, "info");
    const mblk *b = &m->b[i];
    CHECK(bi.state == b->state, "block %u state %d, model %d", i, bi.state, b->state);
    CHECK(bi.refcount == b->rc, "block %u refcount %u, model %u", i, bi.refcount, b->rc);
    if (b->state == KVBM_BLOCK_REGISTERED || b->state == KVBM_BLOCK_COMPLETE)
      CHECK(bi.seq_hash == b->hash, "block %u hash", i);
    if (b->state == KVBM_BLOCK_PARTIAL) CHECK(bi.num_tokens == b->ntok, "block %u ntok", i);
    if (m_is_cached(m, i)) CHECK(bi.priority == b->prio, "block %u priority", i);
  }

  regset rs = {0};
  kvbm_pool_foreach_registered(C.p, collect, &rs);
  uint32_t k = 0;
  for (uint32_t i = 0; i < NB; i++) {
    if (m->b[i].state != KVBM_BLOCK_REGISTERED) continue;
    CHECK(k < rs.n && rs.id[k] == i && rs.h[k] == m->b[i].hash, "registered set differs at block %u", i);
    k++;
  }
  CHECK(k == rs.n, "registered set has %u, model %u", rs.n, k);

  for (int i = 0; i < NHASH; i++) {
    uint32_t want = m_resolve(m, C.hashes[i]), id = NIL;
    bool cached = false;
    CHECK(kvbm_pool_contains(C.p, C.hashes[i]) == (want != NIL), "contains(hash #%d)", i);
    int rc = kvbm_pool_peek(C.p, C.hashes[i], &id, &cached);
    if (want == NIL) {
      CHECK(rc == KVBM_ENOTFOUND, "peek(hash #%d) found %u", i, id);
    } else {
      CHECK(rc == KVBM_OK && id == want, "peek(hash #%d) gave %u, model %u", i, id, want);
      CHECK(cached == m_is_cached(m, want), "peek(hash #%d) cached %d", i, cached);
    }
  }

  CHECK(!C.log.overflow, "event log overflow");
  CHECK(C.log.n == m->nexp, "%zu events, model %zu", C.log.n, m->nexp);
  for (size_t i = 0; i < m->nexp; i++) {
    const tu_event *a = &C.log.ev[i], *e = &m->exp[i];
    CHECK(a->kind == e->kind, "event %zu kind %d, model %d", i, a->kind, e->kind);
    if (e->kind == KVBM_POOL_CLEARED) continue;
    CHECK(a->block_id == e->block_id, "event %zu block %u, model %u", i, a->block_id, e->block_id);
    CHECK(a->seq_hash == e->seq_hash, "event %zu hash", i);
    if (e->kind == KVBM_POOL_STORED) {
      CHECK(a->has_parent == e->has_parent, "event %zu has_parent", i);
      CHECK(a->parent_hash == e->parent_hash, "event %zu parent", i);
      CHECK(a->salt_hash == e->salt_hash, "event %zu salt", i);
      CHECK(a->num_tokens == BS, "event %zu num_tokens", i);
    }
  }
  C.log.n = 0;
  C.m.nexp = 0;
}

/* ---- operations ------------------------------------------------------------------- */

static req *pick_req_with_room(int room) {
  for (int tries = 0; tries < 8; tries++) {
    req *r = &C.r[rndn(NREQ)];
    if (MAXREF - r->n >= room) return r;
  }
  return NULL;
}

static req *pick_nonempty_req(void) {
  for (int tries = 0; tries < 8; tries++) {
    req *r = &C.r[rndn(NREQ)];
    if (r->n) return r;
  }
  return NULL;
}

/* An entry of some request whose block is in `state` (and held). */
static bool pick_entry(kvbm_block_state state, req **rout, int *eout) {
  int start = (int)rndn(NREQ);
  for (int k = 0; k < NREQ; k++) {
    req *r = &C.r[(start + k) % NREQ];
    if (!r->n) continue;
    int off = (int)rndn((uint32_t)r->n);
    for (int j = 0; j < r->n; j++) {
      int e = (off + j) % r->n;
      if (C.m.b[r->ids[e]].state == state) {
        *rout = r;
        *eout = e;
        return true;
      }
    }
  }
  return false;
}

/* What kvbm_pool takes for one block: a free one (any) or the victim.
 * Returns the model's choice, or NIL for "some free block". */
static uint32_t m_take_expect(model *m) {
  if (m_count(m, m_is_free)) return NIL;
  uint32_t v = m_victim(m);
  CHECK(v != NIL, "nothing to take");
  m_expect(m, KVBM_POOL_REMOVED, v, m->b[v].hash, 0, false, 0);
  m_reset(&m->b[v]);
  m->evicted++;
  C.n_evict++;
  return v;
}

static void op_alloc(void) {
  C.op = "alloc";
  uint32_t n = 1 + rndn(4);
  req *r = pick_req_with_room((int)n);
  if (!r) return;
  model *m = &C.m;
  uint32_t ids[4];
  uint32_t avail = m_count(m, m_is_free) + m_count(m, m_is_cached);
  int rc = kvbm_pool_alloc(C.p, n, ids);
  if (n > avail) {
    CHECK(rc == KVBM_ENOSPC, "rc %d with %u available for %u", rc, avail, n);
    C.n_enospc++;
    return;
  }
  CHECK(rc == KVBM_OK, "rc %d", rc);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t id = ids[i];
    CHECK(id < NB, "id %u", id);
    uint32_t v = m_take_expect(m);
    if (v == NIL) CHECK(m_is_free(m, id), "block %u handed out is not free (free ones exist)", id);
    else CHECK(id == v, "evicted %u, model evicts %u", id, v);
    m->b[id].rc = 1;
    r->ids[r->n++] = id;
  }
  m->allocated += n;
}

static void op_fill(void) {
  C.op = "fill";
  req *r;
  int e;
  if (!pick_entry(KVBM_BLOCK_RESET, &r, &e)) return;
  model *m = &C.m;
  uint32_t id = r->ids[e];
  uint64_t h = C.hashes[rndn(NCRAFT + NRAND)];
  uint64_t salt = rndn(3), parent = rnd();
  bool hp = rndn(2);
  uint32_t t[BS];
  tu_tokens(t, BS, (uint32_t)rnd());
  uint32_t out = NIL;
  int rc = kvbm_block_fill(C.p, id, salt, parent, hp, t, h, &out);
  CHECK(rc == KVBM_OK, "rc %d", rc);
  m->b[id].hash = h;
  uint32_t dedup0 = (uint32_t)m->dedup;
  uint32_t want = m_register(m, id, parent, hp, salt);
  if (m->dedup != dedup0 && want != id) C.n_dedup++;
  CHECK(out == want, "fill gave %u, model %u", out, want);
  r->ids[e] = want;
}

/* The prefill path: n blocks taken and registered one after the other. */
static void op_fill_run(void) {
  C.op = "fill_run";
  size_t n = 1 + rndn(4);
  req *r = pick_req_with_room((int)n);
  if (!r) return;
  model *m = &C.m;
  uint64_t hs[4];
  for (size_t k = 0; k < n; k++) hs[k] = C.hashes[rndn(NCRAFT + NRAND)];
  uint32_t t[4 * BS], ids[4];
  tu_tokens(t, n * BS, (uint32_t)rnd());
  uint64_t salt = rndn(2), parent = rnd();
  bool hp = rndn(2);
  uint32_t avail = m_count(m, m_is_free) + m_count(m, m_is_cached);
  /* the pool's events come during the call: replay them in the model after */
  int rc = kvbm_pool_fill_run(C.p, salt, parent, hp, t, hs, n, ids);
  if (n > avail) {
    CHECK(rc == KVBM_ENOSPC, "rc %d with %u available for %zu", rc, avail, n);
    C.n_enospc++;
    return;
  }
  CHECK(rc == KVBM_OK, "rc %d", rc);
  for (size_t k = 0; k < n; k++) {
    uint32_t v = m_take_expect(m);
    m->allocated++;
    uint32_t existing = m_resolve(m, hs[k]);
    uint64_t par = k ? hs[k - 1] : parent;
    bool hpk = k ? true : hp;
    if (existing != NIL && !m->allow_dup) {
      /* dedup: the taken block (v, or a free one) is free again */
      CHECK(ids[k] == existing, "run[%zu] gave %u, model dedups onto %u", k, ids[k], existing);
      m->dedup++;
      m_acquire(m, existing);
      C.n_dedup++;
    } else {
      uint32_t id = v == NIL ? ids[k] : v;
      CHECK(ids[k] == id, "run[%zu] gave %u, model %u", k, ids[k], id);
      CHECK(v != NIL || m_is_free(m, id), "run[%zu] took %u, not free", k, id);
      m->b[id].rc = 1;
      m->b[id].hash = hs[k];
      CHECK(m_register(m, id, par, hpk, salt) == id, "model register");
    }
    r->ids[r->n++] = ids[k];
  }
}

static uint64_t tok_hash(uint32_t seed) {
  uint32_t t[BS];
  tu_tokens(t, BS, seed);
  return kvbm_hash_next(C.m.scheme, 0, 0, false, t, BS);
}

/* init + append in pieces; may stop partial or complete; else register. */
static void op_steps(void) {
  C.op = "steps";
  req *r;
  int e;
  if (!pick_entry(KVBM_BLOCK_RESET, &r, &e)) return;
  model *m = &C.m;
  uint32_t id = r->ids[e];
  uint32_t seed = rndn(NTOKH);
  uint32_t t[BS];
  tu_tokens(t, BS, seed);
  CHECK(kvbm_block_init(C.p, id, 0, 0, false) == KVBM_OK, "init");
  m->b[id].state = KVBM_BLOCK_PARTIAL;
  m->b[id].ntok = 0;
  m->b[id].tok_seed = seed;
  uint32_t upto = rndn(4) == 0 ? rndn(BS) : BS;
  while (m->b[id].ntok < upto) {
    uint32_t k = 1 + rndn(upto - m->b[id].ntok);
    CHECK(kvbm_block_append(C.p, id, t + m->b[id].ntok, k) == KVBM_OK, "append");
    m->b[id].ntok += k;
  }
  if (upto < BS) return;
  CHECK(kvbm_block_commit(C.p, id) == KVBM_OK, "commit");
  m->b[id].state = KVBM_BLOCK_COMPLETE;
  m->b[id].hash = tok_hash(seed);
  if (rndn(6) == 0) return;
  uint32_t out = NIL;
  CHECK(kvbm_block_register(C.p, id, &out) == KVBM_OK, "register");
  uint32_t want = m_register(m, id, 0, false, 0);
  if (want != id) C.n_dedup++;
  CHECK(out == want, "register gave %u, model %u", out, want);
  r->ids[e] = want;
}

/* Finishes a partial block (append the rest, commit, register), or registers
 * a complete one. */
static void op_advance(void) {
  C.op = "advance";
  req *r;
  int e;
  model *m = &C.m;
  if (pick_entry(KVBM_BLOCK_PARTIAL, &r, &e)) {
    uint32_t id = r->ids[e];
    uint32_t t[BS];
    tu_tokens(t, BS, m->b[id].tok_seed);
    /* one token too many is refused first */
    if (m->b[id].ntok > 0) {
      uint32_t big[BS + 1] = {0};
      CHECK(kvbm_block_append(C.p, id, big, BS - m->b[id].ntok + 1) == KVBM_EOVERFLOW, "overflow");
    }
    CHECK(kvbm_block_commit(C.p, id) == KVBM_ESTATE, "commit of a partial block");
    CHECK(kvbm_block_append(C.p, id, t + m->b[id].ntok, BS - m->b[id].ntok) == KVBM_OK, "append rest");
    m->b[id].ntok = BS;
    CHECK(kvbm_block_commit(C.p, id) == KVBM_OK, "commit");
    m->b[id].state = KVBM_BLOCK_COMPLETE;
    m->b[id].hash = tok_hash(m->b[id].tok_seed);
    return;
  }
  if (pick_entry(KVBM_BLOCK_COMPLETE, &r, &e)) {
    uint32_t id = r->ids[e];
    uint32_t out = NIL;
    CHECK(kvbm_block_register(C.p, id, &out) == KVBM_OK, "register");
    uint32_t want = m_register(m, id, 0, false, 0);
    CHECK(out == want, "register gave %u, model %u", out, want);
    r->ids[e] = want;
  }
}

static void op_abort(void) {
  C.op = "abort";
  req *r;
  int e;
  if (!pick_entry(rndn(2) ? KVBM_BLOCK_PARTIAL : KVBM_BLOCK_COMPLETE, &r, &e)) return;
  uint32_t id = r->ids[e];
  CHECK(kvbm_block_abort(C.p, id) == KVBM_OK, "abort");
  m_reset(&C.m.b[id]);
  C.n_abort++;
}

static void op_match(void) {
  C.op = "match";
  req *r = pick_req_with_room(1);
  if (!r) return;
  model *m = &C.m;
  uint64_t h = C.hashes[rndn(NHASH)];
  uint32_t want = m_resolve(m, h), id = NIL;
  int rc = kvbm_pool_match(C.p, h, &id);
  if (want == NIL) {
    CHECK(rc == KVBM_ENOTFOUND && id == NIL, "rc %d id %u for an unknown hash", rc, id);
    return;
  }
  CHECK(rc == KVBM_OK && id == want, "rc %d id %u, model %u", rc, id, want);
  m_acquire(m, want);
  m->match_hits++;
  C.n_match_hit++;
  r->ids[r->n++] = want;
}

static void op_match_prefix(void) {
  C.op = "match_prefix";
  req *r = pick_req_with_room(4);
  if (!r) return;
  model *m = &C.m;
  uint64_t hs[4];
  size_t n = 1 + rndn(4);
  for (size_t i = 0; i < n; i++) hs[i] = C.hashes[rndn(NHASH)];
  uint32_t ids[4];
  size_t got = 99;
  CHECK(kvbm_pool_match_prefix(C.p, hs, n, ids, &got) == KVBM_OK, "match_prefix");
  size_t k = 0;
  while (k < n) {
    uint32_t want = m_resolve(m, hs[k]);
    if (want == NIL) break;
    CHECK(k < got && ids[k] == want, "prefix[%zu] id %u, model %u", k, ids[k], want);
    m_acquire(m, want);
    m->match_hits++;
    r->ids[r->n++] = want;
    k++;
  }
  CHECK(got == k, "matched %zu, model %zu", got, k);
}

/* Fork: another request takes a reference on a held block. */
static void op_retain(void) {
  C.op = "retain";
  req *from = pick_nonempty_req(), *to = pick_req_with_room(1);
  if (!from || !to) return;
  uint32_t id = from->ids[rndn((uint32_t)from->n)];
  CHECK(kvbm_block_retain(C.p, id) == KVBM_OK, "retain of held block %u", id);
  m_acquire(&C.m, id);
  to->ids[to->n++] = id;
}

/* Retain of a cached block (by id): it leaves the cache. */
static void op_retain_cached(void) {
  C.op = "retain_cached";
  req *to = pick_req_with_room(1);
  if (!to) return;
  uint32_t id = rndn(NB);
  int rc = kvbm_block_retain(C.p, id);
  if (C.m.b[id].rc == 0 && C.m.b[id].state != KVBM_BLOCK_REGISTERED) {
    CHECK(rc == KVBM_ESTATE, "retain of free block %u gave %d", id, rc);
    C.n_reject++;
    return;
  }
  CHECK(rc == KVBM_OK, "retain %u gave %d", id, rc);
  m_acquire(&C.m, id);
  to->ids[to->n++] = id;
}

static uint8_t rnd_prio(void) {
  uint32_t x = rndn(16);
  return x < 12 ? (uint8_t)(x % 3) : x < 14 ? 255 : (uint8_t)rndn(256);
}

/* A request ends: its blocks go tail first. */
static void op_release_req(void) {
  C.op = "release_req";
  req *r = pick_nonempty_req();
  if (!r) return;
  uint8_t prio = rnd_prio();
  while (r->n) {
    uint32_t id = r->ids[--r->n];
    CHECK(kvbm_block_release(C.p, id, prio) == KVBM_OK, "release %u", id);
    m_release(&C.m, id, prio);
  }
}

static void op_release_one(void) {
  C.op = "release_one";
  req *r = pick_nonempty_req();
  if (!r) return;
  int e = (int)rndn((uint32_t)r->n);
  uint32_t id = r->ids[e];
  uint8_t prio = rnd_prio();
  CHECK(kvbm_block_release(C.p, id, prio) == KVBM_OK, "release %u", id);
  m_release(&C.m, id, prio);
  r->ids[e] = r->ids[--r->n];
}

static void op_clear(void) {
  C.op = "clear";
  model *m = &C.m;
  CHECK(kvbm_pool_clear_cache(C.p) == KVBM_OK, "clear");
  /* Nothing registered stays in use: one CLEARED. Otherwise a REMOVED per
   * dropped block, in eviction order. */
  bool in_use = false;
  for (uint32_t i = 0; i < NB; i++)
    if (m->b[i].state == KVBM_BLOCK_REGISTERED && !m_is_cached(m, i)) in_use = true;
  if (!in_use) {
    for (uint32_t i = 0; i < NB; i++)
      if (m_is_cached(m, i)) m_reset(&m->b[i]);
    m_expect(m, KVBM_POOL_CLEARED, NIL, 0, 0, false, 0);
  } else {
    uint32_t v;
    while ((v = m_victim(m)) != NIL) {
      m_expect(m, KVBM_POOL_REMOVED, v, m->b[v].hash, 0, false, 0);
      m_reset(&m->b[v]);
    }
  }
  C.n_clear++;
}

/* Calls the model says are not allowed: each is refused (and compare()
 * afterwards shows that nothing changed). */
static void op_reject(void) {
  C.op = "reject";
  model *m = &C.m;
  uint32_t id = rndn(NB);
  const mblk *b = &m->b[id];
  uint32_t t[BS] = {1, 2, 3, 4}, out = NIL;
  if (b->rc == 0) {
    CHECK(kvbm_block_release(C.p, id, 0) == KVBM_ESTATE, "release of unheld %u", id);
    CHECK(kvbm_block_init(C.p, id, 0, 0, false) == KVBM_ESTATE, "init of unheld %u", id);
    CHECK(kvbm_block_fill(C.p, id, 0, 0, false, t, 1, &out) == KVBM_ESTATE, "fill of unheld %u", id);
  }
  if (b->state != KVBM_BLOCK_COMPLETE)
    CHECK(kvbm_block_register(C.p, id, &out) == KVBM_ESTATE, "register of %u in state %d", id, b->state);
  if (b->state != KVBM_BLOCK_PARTIAL) {
    CHECK(kvbm_block_append(C.p, id, t, 1) == KVBM_ESTATE, "append to %u", id);
    CHECK(kvbm_block_commit(C.p, id) == KVBM_ESTATE, "commit of %u", id);
  }
  if (b->state == KVBM_BLOCK_REGISTERED || b->state == KVBM_BLOCK_RESET)
    CHECK(kvbm_block_abort(C.p, id) == KVBM_ESTATE, "abort of %u", id);
  if (b->state != KVBM_BLOCK_RESET)
    CHECK(kvbm_block_init(C.p, id, 0, 0, false) == KVBM_ESTATE, "init of %u", id);
  CHECK(out == NIL, "out written by a refused call");
  CHECK(kvbm_block_retain(C.p, NB + rndn(5)) == KVBM_EINVAL, "bad id");
  C.n_reject++;
}

static void run_model(unsigned seed, kvbm_hash_scheme scheme, bool allow_dup, long steps) {
  memset(&C, 0, sizeof C);
  C.seed = seed;
  C.rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);
  for (int i = 0; i < 4; i++) rnd();
  C.m.scheme = scheme;
  C.m.allow_dup = allow_dup;
  C.p = tu_pool(NB, BS, scheme, allow_dup, &C.log);

  /* The universe of hashes: crafted ones in 4 home slots (two of them the
   * last slots, so runs wrap), random ones, and those of token blocks. */
  uint32_t slots = 1u << tu_table_bits(NB);
  const uint32_t homes[4] = {slots - 1, 0, slots - 2, slots / 2};
  /* groups of 4 consecutive ones share a home and a fingerprint */
  for (int i = 0; i < NCRAFT; i++)
    C.hashes[i] = tu_hash_at_slot(NB, homes[(i / 4) % 4], (uint64_t)seed * 1000 + (uint64_t)i);
  for (int i = 0; i < NRAND; i++) C.hashes[NCRAFT + i] = rnd();
  for (int i = 0; i < NTOKH; i++) C.hashes[NCRAFT + NRAND + i] = tok_hash((uint32_t)i);

  compare();
  for (C.step = 0; C.step < steps; C.step++) {
    uint32_t x = rndn(1000);
    if (x < 200) op_alloc();
    else if (x < 340) op_fill();
    else if (x < 400) op_fill_run();
    else if (x < 500) op_steps();
    else if (x < 540) op_advance();
    else if (x < 560) op_abort();
    else if (x < 680) op_match();
    else if (x < 720) op_match_prefix();
    else if (x < 750) op_retain();
    else if (x < 770) op_retain_cached();
    else if (x < 880) op_release_req();
    else if (x < 960) op_release_one();
    else if (x < 962) op_clear();
    else op_reject();
    compare();
  }
  /* everything released: all blocks are free or cached */
  C.op = "final release";
  for (int i = 0; i < NREQ; i++) {
    req *r = &C.r[i];
    while (r->n) {
      uint32_t id = r->ids[--r->n];
      CHECK(kvbm_block_release(C.p, id, 1) == KVBM_OK, "release %u", id);
      m_release(&C.m, id, 1);
    }
  }
  compare();
  kvbm_pool_stats st = tu_stats(C.p);
  assert_int_equal(st.active, 0);
  /* and the cache drains in the model's order */
  C.op = "drain";
  uint32_t n = kvbm_pool_available(C.p);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t ids[1];
    CHECK(kvbm_pool_alloc(C.p, 1, ids) == KVBM_OK, "drain alloc");
    uint32_t v = m_take_expect(&C.m);
    if (v == NIL) CHECK(m_is_free(&C.m, ids[0]), "drain: %u not free", ids[0]);
    else CHECK(ids[0] == v, "drain evicted %u, model %u", ids[0], v);
    C.m.b[ids[0]].rc = 1;
    C.m.allocated++;
    compare();
  }
  kvbm_pool_destroy(C.p);

  print_message("seed %u scheme %s%s: %ld steps, %ld evictions, %ld dedups, %ld duplicate "
                "registers, %ld match hits, %ld ENOSPC, %ld clears, %ld aborts, %ld refusals\n",
                seed, kvbm_hash_scheme_name(scheme), allow_dup ? " allow_duplicates" : "", steps,
                C.n_evict, C.n_dedup, C.n_dup_reg, C.n_match_hit, C.n_enospc, C.n_clear,
                C.n_abort, C.n_reject);
  /* The run exercised what it is meant to. */
  assert_true(C.n_evict > steps / 20);
  assert_true(C.n_match_hit > steps / 50);
  assert_true(C.n_enospc > 0);
  assert_true(C.n_clear > 0);
  assert_true(C.n_abort > 0);
  assert_true(C.n_reject > 0);
  if (allow_dup) assert_true(C.n_dup_reg > steps / 100);
  else assert_true(C.n_dedup > steps / 100);
}

#define STEPS 30000

static void test_model_native(void **state) {
  (void)state;
  run_model(1, KVBM_HASH_NATIVE, false, STEPS);
  run_model(2, KVBM_HASH_NATIVE, false, STEPS);
}

static void test_model_dynamo(void **state) {
  (void)state;
  run_model(3, KVBM_HASH_DYNAMO, false, STEPS);
}

static void test_model_allow_duplicates(void **state) {
  (void)state;
  run_model(4, KVBM_HASH_NATIVE, true, STEPS);
  run_model(5, KVBM_HASH_DYNAMO, true, STEPS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_native),
      cmocka_unit_test(test_model_dynamo),
      cmocka_unit_test(test_model_allow_duplicates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
