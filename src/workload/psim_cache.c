/* SPDX-License-Identifier: Apache-2.0 */
/*
 * psim_cache.c: the policy simulator's eviction policies (see
 * workload/psim_cache.h).
 *
 * Design. Every policy keeps its residents in slots (at most capacity of
 * them, ARC twice as many for its ghosts) and finds an id's slot through
 * one array indexed by id, so a lookup is one load. Queues are doubly
 * linked lists threaded through the slots (prev/next arrays), head = the
 * oldest end. One list library serves them all; it knows the two ways a
 * slot joins a list: placed by a commit (honouring tail_first, see below)
 * or moved inside the policy (always at the young end).
 *
 * tail_first. During a commit a list remembers the oldest slot the commit
 * placed in it (`seg`); the next placement goes just before it, so the
 * commit's blocks end up youngest-first from the request's head: the deepest
 * block is evicted first, as the G1 pool does. When `seg` leaves the list
 * the mark moves to its younger neighbour, still inside the commit's run.
 *
 * Pins are a stamp per slot: the commit counter when it was last touched.
 * `npinned` counts pinned residents, so "everything is pinned" is one
 * comparison and no policy scans a full cache to find out.
 *
 * The policies follow their papers on unit-size objects:
 * - LRU: one list.
 * - ARC (Megiddo & Modha, FAST'03): T1/T2 resident, B1/B2 ghosts, target p
 *   adapted on ghost hits; REPLACE skips pinned slots from the old end.
 * - S3-FIFO (Yang et al., SOSP'23): small FIFO of 10%, main FIFO with a
 *   2-bit clock, ghost ids as many as the main queue (an insertion clock
 *   per id instead of a ring: in the ghost iff inserted into it within the
 *   last |M| ghost insertions). A small-queue object accessed since it came
 *   (or pinned) moves to main; else it leaves and becomes a ghost.
 * - W-TinyLFU (Einziger et al., Caffeine): 1% window LRU, main segmented
 *   LRU (20% probation, 80% protected), admission from the window into a
 *   full main only if the count-min sketch (4 rows of 4-bit counters,
 *   halved every 10 x capacity increments) rates it above the main victim.
 * - Belady: a max-heap of next-use keys with lazy deletion (a version per
 *   slot); pinned tops are set aside while the victim is found.
 * - TTL: Belady's machinery on keys made online by the caller (rank,
 *   expiry, depth: KVSIM_PSIM_TTL_KEY), plus a second heap on the expiries
 *   reversed: an overdue resident (expiry at or before `now`) goes first,
 *   the earliest expired of them; with none overdue, the highest rank,
 *   then the furthest expiry, then the deepest block goes, as Belady would
 *   take the furthest next use. An expiry is a prediction of the next use
 *   with a deadline: one that passed without a use is worth nothing.
 */
#include "workload/psim_cache.h"

#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "kvbm/status.h"

enum { L_A = 0, L_B, L_C, L_D, NLISTS }; /* policy-specific meaning */

typedef struct plist {
  uint32_t head, tail, n; /* head: oldest */
  uint32_t seg, seg_stamp; /* oldest slot this commit placed (tail_first) */
} plist;

typedef struct hent {
  uint64_t key;
  uint32_t slot, ver;
} hent;

typedef struct pheap {
  hent *a;
  uint32_t n, cap;
} pheap;

struct kvsim_psim_cache {
  kvsim_psim_evict kind;
  uint32_t cap, universe, n, nslots;
  uint32_t *pos;   /* per id: slot or KVSIM_PSIM_NONE */
  uint32_t *sid;   /* per slot: id */
  uint32_t *prev, *next, *stamp;
  uint8_t *where;  /* per slot: list */
  uint8_t *freq;   /* per slot: S3-FIFO clock bits */
  uint32_t *free_slots, nfree;
  uint32_t cur, npinned;
  bool tail_first;
  plist l[NLISTS];
  /* ARC */
  double p;
  /* S3-FIFO */
  uint32_t cap_s, cap_m, *gtime, gclock;
  /* W-TinyLFU */
  uint32_t cap_w, cap_main, cap_prot;
  uint8_t *sketch;
  uint32_t smask;
  uint64_t sinc, ssample;
  /* Belady, TTL */
  uint64_t *skey;
  uint32_t *sver;
  pheap far;     /* max-heap of keys: the furthest next use / expiry on top */
  pheap soon;    /* TTL: max-heap of ~key, the earliest expiry on top */
  hent *aside;
  uint32_t naside, aside_cap;
  uint64_t now;  /* TTL: keys at or below it are overdue */
  /* Slots keyed during the open commit: pinned until the next begin, so
   * they join the heaps then, not now (on top they would be set aside at
   * every victim search: quadratic in a commit's blocks). */
  uint32_t *dslot, *dstamp, nd;
};

static const char *const kNames[KVSIM_PSIM_EVICT_COUNT] = {"lru",      "arc",    "s3fifo",
                                                      "wtinylfu", "belady", "ttl"};

const char *kvsim_psim_evict_name(int kind) {
  return kind >= 0 && kind < KVSIM_PSIM_EVICT_COUNT ? kNames[kind] : "?";
}

bool kvsim_psim_evict_parse(const char *s, kvsim_psim_evict *out) {
  for (int k = 0; s && k < KVSIM_PSIM_EVICT_COUNT; k++)
    if (!strcmp(s, kNames[k])) {
      *out = (kvsim_psim_evict)k;
      return true;
    }
  return false;
}

/* ---- lists ---- */

static void list_init(plist *l) {
  l->head = l->tail = l->seg = KVSIM_PSIM_NONE;
  l->n = l->seg_stamp = 0;
}

static void unlink_slot(kvsim_psim_cache *c, plist *l, uint32_t s) {
  uint32_t p = c->prev[s], n = c->next[s];
  if (p != KVSIM_PSIM_NONE) c->next[p] = n;
  else l->head = n;
  if (n != KVSIM_PSIM_NONE) c->prev[n] = p;
  else l->tail = p;
  if (l->seg == s) l->seg = n; /* the commit's run keeps its oldest member */
  l->n--;
}

/* Appends at the young end (moves inside a policy). */
static void push_young(kvsim_psim_cache *c, plist *l, uint8_t which, uint32_t s) {
  c->prev[s] = l->tail;
  c->next[s] = KVSIM_PSIM_NONE;
  if (l->tail != KVSIM_PSIM_NONE) c->next[l->tail] = s;
  else l->head = s;
  l->tail = s;
  l->n++;
  c->where[s] = which;
}

/* Places a slot for the commit: young end, or before the commit's oldest
 * placement when tail_first. */
static void place(kvsim_psim_cache *c, uint8_t which, uint32_t s) {
  plist *l = &c->l[which];
  bool run = c->tail_first && c->cur && l->seg_stamp == c->cur && l->seg != KVSIM_PSIM_NONE;
  if (!run) {
    push_young(c, l, which, s);
  } else {
    uint32_t at = l->seg, p = c->prev[at];
    c->prev[s] = p;
    c->next[s] = at;
    c->prev[at] = s;
    if (p != KVSIM_PSIM_NONE) c->next[p] = s;
    else l->head = s;
    l->n++;
    c->where[s] = which;
  }
  if (c->tail_first && c->cur) {
    l->seg = s;
    l->seg_stamp = c->cur;
  }
}

/* ---- slots and pins ---- */

static bool pinned(const kvsim_psim_cache *c, uint32_t s) { return c->cur && c->stamp[s] == c->cur; }

static void pin(kvsim_psim_cache *c, uint32_t s) {
  if (!c->cur || c->stamp[s] == c->cur) return;
  c->stamp[s] = c->cur;
  c->npinned++;
}

static uint32_t slot_alloc(kvsim_psim_cache *c, uint32_t id) {
  uint32_t s = c->free_slots[--c->nfree];
  c->sid[s] = id;
  c->pos[id] = s;
  c->stamp[s] = 0;
  c->freq[s] = 0;
  return s;
}

static void slot_free(kvsim_psim_cache *c, uint32_t s) {
  c->pos[c->sid[s]] = KVSIM_PSIM_NONE;
  c->sid[s] = KVSIM_PSIM_NONE;
  if (c->sver) c->sver[s]++;
  c->free_slots[c->nfree++] = s;
}

/* A resident leaves the cache (its list unlinked by the caller or here). */
static uint32_t drop_resident(kvsim_psim_cache *c, uint32_t s, bool unlink) {
  uint32_t id = c->sid[s];
  if (unlink) unlink_slot(c, &c->l[c->where[s]], s);
  if (pinned(c, s)) c->npinned--;
  c->stamp[s] = 0;
  c->n--;
  slot_free(c, s);
  return id;
}

/* The oldest unpinned slot of a list, or KVSIM_PSIM_NONE. Pinned slots sit at
 * the young end, so this is almost always the head. */
static uint32_t oldest_unpinned(const kvsim_psim_cache *c, const plist *l) {
  for (uint32_t s = l->head; s != KVSIM_PSIM_NONE; s = c->next[s])
    if (!pinned(c, s)) return s;
  return KVSIM_PSIM_NONE;
}

/* ---- Belady's heap ---- */

/* Room for `need` entries: from 1024, doubling (common/vec.h); the
 * capacity is a uint32_t, so that is the bound. */
static bool heap_reserve(hent **a, uint32_t *cap, uint32_t need) {
  size_t c = *cap;
  if (kvbm__vec_reserve_of(a, &c, need, 1024, UINT32_MAX)) return false;
  *cap = (uint32_t)c;
  return true;
}

static void heap_up(hent *h, uint32_t i) {
  hent e = h[i];
  while (i) {
    uint32_t p = (i - 1) / 2;
    if (h[p].key >= e.key) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = e;
}

static void heap_down(hent *h, uint32_t n, uint32_t i) {
  hent e = h[i];
  for (;;) {
    uint32_t l = 2 * i + 1, b = i;
    hent best = e;
    if (l < n && h[l].key > best.key) b = l, best = h[l];
    if (l + 1 < n && h[l + 1].key > best.key) b = l + 1;
    if (b == i) break;
    h[i] = h[b];
    i = b;
  }
  h[i] = e;
}

static bool heap_valid(const kvsim_psim_cache *c, const hent *e) {
  return c->sid[e->slot] != KVSIM_PSIM_NONE && c->sver[e->slot] == e->ver;
}

/* Rebuilds a heap from its live entries when stale ones pile up. */
static void heap_compact(kvsim_psim_cache *c, pheap *h) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < h->n; i++)
    if (heap_valid(c, &h->a[i])) h->a[n++] = h->a[i];
  h->n = n;
  for (uint32_t i = n / 2; i-- > 0;) heap_down(h->a, n, i);
}

/* A heap never grows past its allocation: stale entries are compacted
 * away first, and live ones are at most one per slot. */
static void heap_push(kvsim_psim_cache *c, pheap *h, uint64_t key, uint32_t s) {
  if (h->n >= h->cap) heap_compact(c, h);
  h->a[h->n] = (hent){key, s, c->sver[s]};
  heap_up(h->a, h->n++);
}

static hent heap_pop(pheap *h) {
  hent top = h->a[0];
  h->a[0] = h->a[--h->n];
  if (h->n) heap_down(h->a, h->n, 0);
  return top;
}

/* The kinds keyed by the caller and kept in heaps. */
static bool keyed_kind(kvsim_psim_evict kind) {
  return kind == KVSIM_PSIM_EVICT_BELADY || kind == KVSIM_PSIM_EVICT_TTL;
}

/* A slot's fresh entry in each heap, the old ones stale by version. */
static void heap_enter(kvsim_psim_cache *c, uint32_t s) {
  uint64_t key = c->skey[s];
  heap_push(c, &c->far, key, s);
  if (c->kind == KVSIM_PSIM_EVICT_TTL) { /* the earliest expiry on top, then the deepest */
    uint64_t order = KVSIM_PSIM_TTL_EXPIRY(key) << 16 | (KVSIM_PSIM_TTL_DEPTH_MAX - (key & KVSIM_PSIM_TTL_DEPTH_MAX));
    heap_push(c, &c->soon, ~order, s);
  }
}

/* A slot's key changed (or it arrived). Inside a commit the caller pins
 * it, so it enters the heaps at the next begin (kvsim_psim_cache_begin); the
 * heaps' old entries are stale by version at once. */
static void keyed(kvsim_psim_cache *c, uint32_t s, uint64_t key) {
  c->skey[s] = key;
  c->sver[s]++;
  if (!c->cur) {
    heap_enter(c, s);
  } else if (c->dstamp[s] != c->cur) {
    c->dstamp[s] = c->cur;
    c->dslot[c->nd++] = s;
  }
}

/* The commit is over: its slots enter the heaps (those still resident,
 * with their latest key; a slot freed and taken again meanwhile holds its
 * new block's key). */
static void heap_enter_deferred(kvsim_psim_cache *c) {
  for (uint32_t i = 0; i < c->nd; i++)
    if (c->sid[c->dslot[i]] != KVSIM_PSIM_NONE) heap_enter(c, c->dslot[i]);
  c->nd = 0;
}

/* The unpinned resident on top of heap h (KVSIM_PSIM_NONE if none); its entry
 * stays in the heap unless take. */
static uint32_t heap_top(kvsim_psim_cache *c, pheap *h, bool take) {
  uint32_t found = KVSIM_PSIM_NONE;
  c->naside = 0;
  while (h->n) {
    hent e = heap_pop(h);
    if (!heap_valid(c, &e)) continue;
    if (pinned(c, e.slot)) { /* live and pinned: at most one per slot */
      c->aside[c->naside++] = e;
      continue;
    }
    found = e.slot;
    if (!take) c->aside[c->naside++] = e;
    break;
  }
  for (uint32_t i = 0; i < c->naside; i++) {
    h->a[h->n] = c->aside[i];
    heap_up(h->a, h->n++);
  }
  return found;
}

/* TTL's victim: an overdue resident (the earliest expiry) if any, else
 * the furthest expiry, as Belady's furthest next use. */
static uint32_t ttl_victim(kvsim_psim_cache *c, bool *overdue) {
  uint32_t s = heap_top(c, &c->soon, false);
  *overdue = s != KVSIM_PSIM_NONE && KVSIM_PSIM_TTL_EXPIRY(c->skey[s]) <= c->now;
  return *overdue ? s : heap_top(c, &c->far, false);
}

/* ---- W-TinyLFU's sketch ---- */

static uint32_t sk_index(const kvsim_psim_cache *c, uint32_t id, unsigned row) {
  uint64_t x = ((uint64_t)id + 1) * 0x9E3779B97F4A7C15ull + row * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (uint32_t)x & c->smask;
}

static void sk_inc(kvsim_psim_cache *c, uint32_t id) {
  for (unsigned r = 0; r < 4; r++) {
    uint8_t *v = &c->sketch[(size_t)r * (c->smask + 1) + sk_index(c, id, r)];
    if (*v < 15) (*v)++;
  }
  if (++c->sinc >= c->ssample) {
    size_t total = (size_t)4 * (c->smask + 1);
    for (size_t i = 0; i < total; i++) c->sketch[i] >>= 1;
    c->sinc /= 2;
  }
}

static uint8_t sk_est(const kvsim_psim_cache *c, uint32_t id) {
  uint8_t m = 15;
  for (unsigned r = 0; r < 4; r++) {
    uint8_t v = c->sketch[(size_t)r * (c->smask + 1) + sk_index(c, id, r)];
    if (v < m) m = v;
  }
  return m;
}

/* ---- create / destroy ---- */

int kvsim_psim_cache_create(kvsim_psim_evict kind, uint32_t capacity, uint32_t universe, kvsim_psim_cache **out) {
  if (!out || kind < 0 || kind >= KVSIM_PSIM_EVICT_COUNT || universe == 0) return KVBM_EINVAL;
  if (capacity > (1u << 30)) return KVBM_EINVAL;
  kvsim_psim_cache *c = calloc(1, sizeof *c);
  if (!c) return KVBM_ENOMEM;
  c->kind = kind;
  c->cap = capacity;
  c->universe = universe;
  /* ARC keeps its ghosts in slots; W-TinyLFU holds the newcomer before the
   * window gives up its candidate. */
  c->nslots = kind == KVSIM_PSIM_EVICT_ARC ? 2 * capacity
              : kind == KVSIM_PSIM_EVICT_WTINYLFU && capacity ? capacity + 1 : capacity;
  uint32_t ns = c->nslots ? c->nslots : 1;
  c->pos = malloc((size_t)universe * sizeof *c->pos);
  c->sid = malloc((size_t)ns * sizeof *c->sid);
  c->prev = malloc((size_t)ns * sizeof *c->prev);
  c->next = malloc((size_t)ns * sizeof *c->next);
  c->stamp = calloc(ns, sizeof *c->stamp);
  c->where = calloc(ns, 1);
  c->freq = calloc(ns, 1);
  c->free_slots = malloc((size_t)ns * sizeof *c->free_slots);
  bool ok = c->pos && c->sid && c->prev && c->next && c->stamp && c->where && c->freq &&
            c->free_slots;
  if (ok && kind == KVSIM_PSIM_EVICT_S3FIFO) {
    c->cap_s = capacity / 10 ? capacity / 10 : 1;
    c->cap_m = capacity > c->cap_s ? capacity - c->cap_s : 1;
    ok = (c->gtime = calloc(universe, sizeof *c->gtime)) != NULL;
  }
  if (ok && kind == KVSIM_PSIM_EVICT_WTINYLFU) {
    c->cap_w = capacity / 100 ? capacity / 100 : 1;
    c->cap_main = capacity > c->cap_w ? capacity - c->cap_w : 0;
    c->cap_prot = c->cap_main / 10 * 8;
    uint32_t w = 16;
    while (w < capacity && w < (1u << 28)) w *= 2;
    c->smask = w - 1;
    c->ssample = 10ull * (capacity ? capacity : 1);
    ok = (c->sketch = calloc((size_t)4 * w, 1)) != NULL;
  }
  if (ok && keyed_kind(kind)) {
    c->skey = calloc(ns, sizeof *c->skey);
    c->sver = calloc(ns, sizeof *c->sver);
    c->dslot = calloc(ns, sizeof *c->dslot);
    c->dstamp = calloc(ns, sizeof *c->dstamp);
    /* Live entries are one per slot; twice that plus slack leaves room for
     * stale ones between compactions. */
    ok = c->skey && c->sver && c->dslot && c->dstamp &&
         heap_reserve(&c->far.a, &c->far.cap, 2 * ns + 1024) &&
         heap_reserve(&c->aside, &c->aside_cap, ns + 1) &&
         (kind != KVSIM_PSIM_EVICT_TTL || heap_reserve(&c->soon.a, &c->soon.cap, 2 * ns + 1024));
  }
  if (!ok) {
    kvsim_psim_cache_destroy(c);
    return KVBM_ENOMEM;
  }
  memset(c->pos, 0xff, (size_t)universe * sizeof *c->pos);
  memset(c->sid, 0xff, (size_t)ns * sizeof *c->sid);
  for (uint32_t i = 0; i < c->nslots; i++) c->free_slots[i] = c->nslots - 1 - i;
  c->nfree = c->nslots;
  for (int i = 0; i < NLISTS; i++) list_init(&c->l[i]);
  c->p = 0;
  *out = c;
  return KVBM_OK;
}

void kvsim_psim_cache_destroy(kvsim_psim_cache *c) {
  if (!c) return;
  free(c->pos);
  free(c->sid);
  free(c->prev);
  free(c->next);
  free(c->stamp);
  free(c->where);
  free(c->freq);
  free(c->free_slots);
  free(c->gtime);
  free(c->sketch);
  free(c->skey);
  free(c->sver);
  free(c->dslot);
  free(c->dstamp);
  free(c->far.a);
  free(c->soon.a);
  free(c->aside);
  free(c);
}

bool kvsim_psim_cache_has(const kvsim_psim_cache *c, uint32_t id) {
  if (id >= c->universe) return false;
  uint32_t s = c->pos[id];
  return s != KVSIM_PSIM_NONE && (c->kind != KVSIM_PSIM_EVICT_ARC || c->where[s] <= L_B);
}

uint32_t kvsim_psim_cache_size(const kvsim_psim_cache *c) { return c->n; }
uint32_t kvsim_psim_cache_capacity(const kvsim_psim_cache *c) { return c->cap; }

void kvsim_psim_cache_begin(kvsim_psim_cache *c, bool tail_first) {
  if (c->dslot) heap_enter_deferred(c);
  if (++c->cur == 0) { /* wrapped: clear the stamps so no slot looks pinned */
    memset(c->stamp, 0, (size_t)(c->nslots ? c->nslots : 1) * sizeof *c->stamp);
    if (c->dstamp) memset(c->dstamp, 0, (size_t)(c->nslots ? c->nslots : 1) * sizeof *c->dstamp);
    c->cur = 1;
  }
  c->npinned = 0;
  c->tail_first = tail_first;
}

/* ---- LRU ---- */

static uint32_t lru_evict(kvsim_psim_cache *c) {
  if (c->npinned >= c->n) return KVSIM_PSIM_NONE;
  uint32_t s = oldest_unpinned(c, &c->l[L_A]);
  return s == KVSIM_PSIM_NONE ? KVSIM_PSIM_NONE : drop_resident(c, s, true);
}

/* ---- S3-FIFO: L_A small, L_B main ---- */

static bool ghost_has(const kvsim_psim_cache *c, uint32_t id) {
  return c->gtime[id] && c->gclock - c->gtime[id] < c->cap_m;
}

static uint32_t s3_evict(kvsim_psim_cache *c) {
  if (c->npinned >= c->n) return KVSIM_PSIM_NONE;
  plist *S = &c->l[L_A], *M = &c->l[L_B];
  for (uint64_t guard = 8ull * c->n + 16; guard--;) {
    if (S->n && (S->n >= c->cap_s || !M->n)) {
      uint32_t t = S->head;
      unlink_slot(c, S, t);
      if (c->freq[t] || pinned(c, t)) {
        c->freq[t] = 0;
        push_young(c, M, L_B, t);
        continue;
      }
      uint32_t id = c->sid[t];
      c->gtime[id] = ++c->gclock;
      return drop_resident(c, t, false);
    }
    uint32_t t = M->head;
    if (t == KVSIM_PSIM_NONE) break;
    if (c->freq[t] || pinned(c, t)) {
      if (c->freq[t]) c->freq[t]--;
      unlink_slot(c, M, t);
      push_young(c, M, L_B, t);
      continue;
    }
    return drop_resident(c, t, true);
  }
  return KVSIM_PSIM_NONE;
}

/* ---- ARC: L_A T1, L_B T2, L_C B1, L_D B2 ---- */

/* Moves a resident to its ghost list (B1 from T1, B2 from T2). */
static uint32_t arc_to_ghost(kvsim_psim_cache *c, uint32_t s) {
  uint8_t from = c->where[s];
  unlink_slot(c, &c->l[from], s);
  if (pinned(c, s)) c->npinned--;
  c->stamp[s] = 0;
  c->n--;
  push_young(c, &c->l[from == L_A ? L_C : L_D], from == L_A ? L_C : L_D, s);
  return c->sid[s];
}

static void arc_drop_ghost(kvsim_psim_cache *c, uint8_t which) {
  uint32_t s = c->l[which].head;
  if (s == KVSIM_PSIM_NONE) return;
  unlink_slot(c, &c->l[which], s);
  slot_free(c, s);
}

static uint32_t arc_replace(kvsim_psim_cache *c, bool in_b2) {
  if (c->npinned >= c->n) return KVSIM_PSIM_NONE;
  plist *T1 = &c->l[L_A], *T2 = &c->l[L_B];
  bool from_t1 = T1->n >= 1 && ((double)T1->n > c->p || (in_b2 && (double)T1->n == c->p));
  uint32_t s = oldest_unpinned(c, from_t1 ? T1 : T2);
  if (s == KVSIM_PSIM_NONE) s = oldest_unpinned(c, from_t1 ? T2 : T1);
  return s == KVSIM_PSIM_NONE ? KVSIM_PSIM_NONE : arc_to_ghost(c, s);
}

static bool arc_insert(kvsim_psim_cache *c, uint32_t id, uint32_t *evicted) {
  plist *T1 = &c->l[L_A], *T2 = &c->l[L_B], *B1 = &c->l[L_C], *B2 = &c->l[L_D];
  uint32_t s = c->pos[id];
  bool full = c->n >= c->cap;
  if (full && c->npinned >= c->n) return false;
  if (s != KVSIM_PSIM_NONE) { /* a ghost hit: adapt, make room, back to T2 */
    bool b2 = c->where[s] == L_D;
    double d = b2 ? (B1->n > B2->n ? (double)B1->n / B2->n : 1.0)
                  : (B2->n > B1->n ? (double)B2->n / B1->n : 1.0);
    c->p = b2 ? (c->p - d < 0 ? 0 : c->p - d) : (c->p + d > c->cap ? c->cap : c->p + d);
    if (full && (*evicted = arc_replace(c, b2)) == KVSIM_PSIM_NONE) return false;
    unlink_slot(c, &c->l[c->where[s]], s);
    c->stamp[s] = 0;
    place(c, L_B, s);
  } else {
    if (T1->n + B1->n >= c->cap) {
      if (T1->n < c->cap) {
        arc_drop_ghost(c, L_C);
        if (full && (*evicted = arc_replace(c, false)) == KVSIM_PSIM_NONE) return false;
      } else {
        uint32_t v = oldest_unpinned(c, T1);
        if (v == KVSIM_PSIM_NONE) return false;
        *evicted = drop_resident(c, v, true);
      }
    } else if (T1->n + T2->n + B1->n + B2->n >= c->cap) {
      if (T1->n + T2->n + B1->n + B2->n >= 2 * c->cap) arc_drop_ghost(c, L_D);
      if (full && (*evicted = arc_replace(c, false)) == KVSIM_PSIM_NONE) return false;
    }
    if (!c->nfree) arc_drop_ghost(c, B2->n ? L_D : L_C);
    s = slot_alloc(c, id);
    place(c, L_A, s);
  }
  c->n++;
  pin(c, s);
  return true;
}

/* ---- W-TinyLFU: L_A window, L_B probation, L_C protected ---- */

static uint32_t tlfu_main_victim(const kvsim_psim_cache *c) {
  uint32_t s = oldest_unpinned(c, &c->l[L_B]);
  return s != KVSIM_PSIM_NONE ? s : oldest_unpinned(c, &c->l[L_C]);
}

static bool tlfu_insert(kvsim_psim_cache *c, uint32_t id, uint32_t *evicted) {
  if (c->n >= c->cap && c->npinned >= c->n) return false;
  sk_inc(c, id);
  uint32_t s = slot_alloc(c, id);
  place(c, L_A, s);
  c->n++;
  pin(c, s);
  plist *W = &c->l[L_A], *P = &c->l[L_B];
  while (W->n > c->cap_w) {
    uint32_t cand = W->head;
    unlink_slot(c, W, cand);
    if (c->n <= c->cap) { /* room in main */
      push_young(c, P, L_B, cand);
      continue;
    }
    uint32_t mv = tlfu_main_victim(c);
    if (pinned(c, cand) && mv == KVSIM_PSIM_NONE) { /* find room anywhere else */
      push_young(c, P, L_B, cand);
      mv = oldest_unpinned(c, W);
      if (mv == KVSIM_PSIM_NONE) mv = tlfu_main_victim(c);
      if (mv != KVSIM_PSIM_NONE) *evicted = drop_resident(c, mv, true);
      break;
    }
    if (!pinned(c, cand) && (mv == KVSIM_PSIM_NONE || sk_est(c, c->sid[cand]) <= sk_est(c, c->sid[mv]))) {
      *evicted = drop_resident(c, cand, false);
    } else {
      *evicted = drop_resident(c, mv, true);
      push_young(c, P, L_B, cand);
    }
  }
  if (c->n > c->cap) { /* the window had room but main was over: evict from main */
    uint32_t mv = tlfu_main_victim(c);
    if (mv == KVSIM_PSIM_NONE) mv = oldest_unpinned(c, W);
    if (mv != KVSIM_PSIM_NONE) *evicted = drop_resident(c, mv, true);
  }
  return true;
}

static void tlfu_access(kvsim_psim_cache *c, uint32_t s) {
  sk_inc(c, c->sid[s]);
  uint8_t w = c->where[s];
  unlink_slot(c, &c->l[w], s);
  if (w == L_A) {
    place(c, L_A, s);
    return;
  }
  place(c, L_C, s);
  plist *R = &c->l[L_C];
  if (R->n > c->cap_prot) {
    uint32_t d = R->head;
    unlink_slot(c, R, d);
    push_young(c, &c->l[L_B], L_B, d);
  }
}

static uint32_t tlfu_evict(kvsim_psim_cache *c) {
  if (c->npinned >= c->n) return KVSIM_PSIM_NONE;
  uint32_t s = tlfu_main_victim(c);
  if (s == KVSIM_PSIM_NONE) s = oldest_unpinned(c, &c->l[L_A]);
  return s == KVSIM_PSIM_NONE ? KVSIM_PSIM_NONE : drop_resident(c, s, true);
}

/* ---- the interface ---- */

void kvsim_psim_cache_access(kvsim_psim_cache *c, uint32_t id, uint64_t key) {
  if (!kvsim_psim_cache_has(c, id)) return;
  uint32_t s = c->pos[id];
  switch (c->kind) {
    case KVSIM_PSIM_EVICT_LRU:
      unlink_slot(c, &c->l[L_A], s);
      place(c, L_A, s);
      break;
    case KVSIM_PSIM_EVICT_ARC:
      unlink_slot(c, &c->l[c->where[s]], s);
      place(c, L_B, s);
      break;
    case KVSIM_PSIM_EVICT_S3FIFO:
      if (c->freq[s] < 3) c->freq[s]++;
      break;
    case KVSIM_PSIM_EVICT_WTINYLFU:
      tlfu_access(c, s);
      break;
    case KVSIM_PSIM_EVICT_BELADY:
    case KVSIM_PSIM_EVICT_TTL:
      keyed(c, s, key);
      break;
    default:
      break;
  }
  pin(c, s);
}

bool kvsim_psim_cache_insert(kvsim_psim_cache *c, uint32_t id, uint64_t key, uint32_t *evicted) {
  uint32_t ev = KVSIM_PSIM_NONE;
  if (evicted) *evicted = KVSIM_PSIM_NONE;
  if (id >= c->universe || c->cap == 0 || kvsim_psim_cache_has(c, id)) return false;
  bool ok = true;
  switch (c->kind) {
    case KVSIM_PSIM_EVICT_ARC:
      ok = arc_insert(c, id, &ev);
      break;
    case KVSIM_PSIM_EVICT_WTINYLFU:
      ok = tlfu_insert(c, id, &ev);
      break;
    default: {
      if (c->n >= c->cap) {
        ev = c->kind == KVSIM_PSIM_EVICT_LRU      ? lru_evict(c)
             : c->kind == KVSIM_PSIM_EVICT_S3FIFO ? s3_evict(c)
                                            : kvsim_psim_cache_evict(c);
        if (ev == KVSIM_PSIM_NONE) return false;
      }
      uint32_t s = slot_alloc(c, id);
      c->n++;
      if (keyed_kind(c->kind)) {
        keyed(c, s, key);
      } else if (c->kind == KVSIM_PSIM_EVICT_S3FIFO && ghost_has(c, id)) {
        c->gtime[id] = 0;
        place(c, L_B, s);
      } else {
        place(c, L_A, s);
      }
      pin(c, s);
    }
  }
  if (evicted) *evicted = ev;
  return ok;
}

void kvsim_psim_cache_remove(kvsim_psim_cache *c, uint32_t id) {
  if (!kvsim_psim_cache_has(c, id)) return;
  uint32_t s = c->pos[id];
  drop_resident(c, s, !keyed_kind(c->kind));
}

uint32_t kvsim_psim_cache_evict(kvsim_psim_cache *c) {
  switch (c->kind) {
    case KVSIM_PSIM_EVICT_LRU:
      return lru_evict(c);
    case KVSIM_PSIM_EVICT_S3FIFO:
      return s3_evict(c);
    case KVSIM_PSIM_EVICT_ARC:
      return arc_replace(c, false);
    case KVSIM_PSIM_EVICT_WTINYLFU:
      return tlfu_evict(c);
    case KVSIM_PSIM_EVICT_BELADY: {
      uint32_t s = heap_top(c, &c->far, true);
      return s == KVSIM_PSIM_NONE ? KVSIM_PSIM_NONE : drop_resident(c, s, false);
    }
    case KVSIM_PSIM_EVICT_TTL: {
      bool overdue;
      uint32_t s = ttl_victim(c, &overdue);
      return s == KVSIM_PSIM_NONE ? KVSIM_PSIM_NONE : drop_resident(c, s, false); /* its entries go stale */
    }
    default:
      return KVSIM_PSIM_NONE;
  }
}

uint64_t kvsim_psim_cache_victim_key(kvsim_psim_cache *c) {
  if (c->kind == KVSIM_PSIM_EVICT_TTL) {
    bool overdue;
    uint32_t s = ttl_victim(c, &overdue);
    return s == KVSIM_PSIM_NONE || overdue ? KVSIM_PSIM_KEY_NEVER : c->skey[s];
  }
  if (c->kind != KVSIM_PSIM_EVICT_BELADY) return 0;
  uint32_t s = heap_top(c, &c->far, false);
  return s == KVSIM_PSIM_NONE ? KVSIM_PSIM_KEY_NEVER : c->skey[s];
}

void kvsim_psim_cache_set_now(kvsim_psim_cache *c, uint64_t now) { c->now = now; }
