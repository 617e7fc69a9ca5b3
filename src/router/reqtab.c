/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reqtab.c: the router daemon's active requests (see reqtab.h).
 *
 * A /route adds a record (its worker and load); /done finds it by id and
 * takes the load away; so do request_ttl_s and the cap max_active_requests
 * (a client that routes and never says done would otherwise hold memory
 * and load for the whole ttl). Ids come from one counter, so records are
 * added in id order, and expiry times grow with them (one ttl for all):
 * the oldest record is always the first to expire and the first to go.
 *
 * A ring. Records live at logical positions [head, tail) that only grow;
 * position p is slot p & (cap - 1) of a power-of-two array. Adding writes
 * at tail, evicting or expiring the oldest advances head: both O(1), and
 * nothing moves. /done's lookup is a binary search over positions (ids
 * are in position order). The array starts at 1024 slots and doubles while
 * it is full and below cap_max, the least power of two >= max, copying
 * each record once per doubling (under 2 x cap_max copies in a table's
 * life); so memory is at most cap_max records, under 2 x max.
 *
 * Before (issue 24), records were an array whose head advanced and whose
 * rest moved to the front whenever the tail reached the end. Once the
 * table was full and every record live, that was every add: each /route
 * moved max records (15 MB at the default 262144), and routing fell from
 * 27,500 to 2,400 a second (447 at 4 x the cap). `moved` counts the
 * records copied so the tests can hold the cost to a constant per add.
 *
 * Done records. /done marks a record done where it is; done records at the
 * head are passed over whenever the head is looked at (each once). Done
 * records further in still hold their slots, and when the table is full
 * with at least half of its records done, those are squeezed out (the
 * live ones packed towards the head, in order) rather than letting a live
 * record go for the sake of done ones: a long request among many short
 * ones keeps its load while fewer than max are active. A squeeze reads
 * the max records held and copies at most max / 2, and leaves at most
 * max / 2 held, so the next one is at least max / 2 adds away: amortised
 * O(1) (at most one copy and two reads per add). Otherwise the oldest
 * record goes, counted in `evicted` when it was live.
 */
#include "router/reqtab.h"

#include <stdlib.h>
#include <string.h>

#define FIRST_CAP 1024

kvbm_status kvbm__reqtab_init(kvbm__reqtab *t, size_t max, kvbm__reqtab_drop_fn drop, void *user,
                              kvbm_error *err) {
  if (!t) return kvbm_error_set(err, KVBM_EINVAL, "request table: NULL table");
  memset(t, 0, sizeof *t);
  if (max < 1 || max > SIZE_MAX / 2 / sizeof(kvbm__req_rec))
    return kvbm_error_set(err, KVBM_EINVAL, "request table: max %zu is not in 1..%zu", max,
                          SIZE_MAX / 2 / sizeof(kvbm__req_rec));
  size_t c = 1;
  while (c < max) c <<= 1;
  t->cap_max = c;
  t->max = max;
  t->drop = drop;
  t->user = user;
  return KVBM_OK;
}

void kvbm__reqtab_free(kvbm__reqtab *t) {
  free(t->r);
  t->r = NULL;
  t->cap = 0;
  t->head = t->tail = 0;
  t->live = 0;
}

static inline kvbm__req_rec *at(const kvbm__reqtab *t, uint64_t pos) {
  return &t->r[pos & (t->cap - 1)];
}

/* The record at `r` stops being live. */
static void let_go(kvbm__reqtab *t, kvbm__req_rec *r) {
  if (!r->live) return;
  if (t->drop) t->drop(t->user, r);
  r->live = false;
  t->live--;
}

/* Passes over done records at the head. */
static void skip_done(kvbm__reqtab *t) {
  while (t->head < t->tail && !at(t, t->head)->live) t->head++;
}

/* Packs the live records towards the head, in order. */
static void squeeze(kvbm__reqtab *t) {
  uint64_t w = t->head;
  for (uint64_t p = t->head; p < t->tail; p++) {
    kvbm__req_rec *r = at(t, p);
    if (!r->live) continue;
    if (w != p) {
      *at(t, w) = *r;
      t->moved++;
    }
    w++;
  }
  t->tail = w;
}

/* Doubles the slots (the table is full and below cap_max). */
static kvbm_status grow(kvbm__reqtab *t) {
  size_t nc = t->cap ? t->cap * 2 : (FIRST_CAP < t->cap_max ? FIRST_CAP : t->cap_max);
  kvbm__req_rec *n = malloc(nc * sizeof *n);
  if (!n) return KVBM_ENOMEM;
  for (uint64_t p = t->head; p < t->tail; p++) n[p & (nc - 1)] = *at(t, p);
  t->moved += t->tail - t->head;
  free(t->r);
  t->r = n;
  t->cap = nc;
  return KVBM_OK;
}

kvbm_status kvbm__reqtab_add(kvbm__reqtab *t, const kvbm__req_rec *rec) {
  if (kvbm__reqtab_held(t) >= t->max) {
    skip_done(t);
    if (kvbm__reqtab_held(t) >= t->max && t->live <= t->max / 2) squeeze(t);
    while (kvbm__reqtab_held(t) >= t->max) { /* once: held never passes max */
      kvbm__req_rec *old = at(t, t->head++);
      t->evicted += old->live;
      let_go(t, old);
    }
    skip_done(t);
  }
  if (kvbm__reqtab_held(t) == t->cap) { /* only below cap_max: cap_max >= max > held */
    kvbm_status rc = grow(t);
    if (rc) return rc;
  }
  kvbm__req_rec *r = at(t, t->tail++);
  *r = *rec;
  r->live = true;
  t->live++;
  return KVBM_OK;
}

void kvbm__reqtab_expire(kvbm__reqtab *t, int64_t now) {
  while (t->head < t->tail) {
    kvbm__req_rec *r = at(t, t->head);
    if (r->live && r->expires_ns > now) break;
    t->expired += r->live;
    let_go(t, r);
    t->head++;
  }
}

/* The position of the first record whose id is >= id (tail if none). */
static uint64_t lower_bound(const kvbm__reqtab *t, uint64_t id) {
  uint64_t lo = t->head, hi = t->tail;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (at(t, mid)->id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

const kvbm__req_rec *kvbm__reqtab_find(const kvbm__reqtab *t, uint64_t id) {
  uint64_t p = lower_bound(t, id);
  if (p == t->tail) return NULL;
  const kvbm__req_rec *r = at(t, p);
  return r->id == id && r->live ? r : NULL;
}

bool kvbm__reqtab_done(kvbm__reqtab *t, uint64_t id) {
  uint64_t p = lower_bound(t, id);
  if (p == t->tail) return false;
  kvbm__req_rec *r = at(t, p);
  if (r->id != id || !r->live) return false;
  let_go(t, r);
  skip_done(t);
  return true;
}
