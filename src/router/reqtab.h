/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reqtab.h: the router daemon's table of active requests (private; see
 * reqtab.c for the design). One /route adds a record, /done, request_ttl_s
 * or the cap (max_active_requests) takes it away.
 *
 * Threads: a table is driven by one thread (the daemon's HTTP thread); no
 * call locks. No call blocks. Only kvbm__reqtab_add allocates.
 */
#ifndef KVBM_ROUTER_REQTAB_H
#define KVBM_ROUTER_REQTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/router.h"
#include "kvbm/status.h"

typedef struct kvbm__req_rec {
  uint64_t id;          /* ids only grow: the ring is in id order */
  int64_t expires_ns;   /* its load goes then (request_ttl_s after /route) */
  uint32_t slot;        /* the worker slot it was routed to ... */
  kvbm_worker_key key;  /* ... while that slot held this worker */
  double blocks;        /* its load in blocks */
  bool live;            /* false once done (by /done, ttl or the cap) */
} kvbm__req_rec;

/* Called for every live record the table lets go of (done, expired,
 * evicted), once, before the record is marked done: the daemon takes its
 * load away. `r` is valid during the call only. */
typedef void (*kvbm__reqtab_drop_fn)(void *user, const kvbm__req_rec *r);

typedef struct kvbm__reqtab {
  kvbm__req_rec *r;       /* cap slots; position p lives in r[p & (cap - 1)] */
  size_t cap;             /* a power of two; 0 before the first add */
  size_t cap_max;         /* the least power of two >= max: cap stops there */
  size_t max;             /* records kept at most (done ones included) */
  uint64_t head, tail;    /* records at positions [head, tail); both only grow */
  size_t live;            /* records not yet done */
  uint64_t expired;       /* live records dropped by their ttl */
  uint64_t evicted;       /* live records dropped for max */
  uint64_t moved;         /* records copied to another slot (growth, squeezes):
                             the cost the tests bound per add */
  kvbm__reqtab_drop_fn drop;
  void *user;
} kvbm__reqtab;

/* Sets up an empty table of at most `max` records (>= 1, and at most
 * SIZE_MAX / 2 / sizeof(kvbm__req_rec)); `drop` (may be NULL) and `user`
 * are kept. Allocates nothing (the first add does). KVBM_EINVAL (err
 * filled) for a bad max. */
kvbm_status kvbm__reqtab_init(kvbm__reqtab *t, size_t max, kvbm__reqtab_drop_fn drop, void *user,
                              kvbm_error *err);

/* Frees the slots; the table is empty (and may be initialised again). */
void kvbm__reqtab_free(kvbm__reqtab *t);

/* Adds a live copy of `rec`, whose id must be above every id added before
 * (the daemon's counter). When `max` records are held, squeezes out the
 * done ones if they are at least half (amortised), else lets the oldest go
 * (counted in `evicted` when live). O(1) amortised, and O(1) worst case
 * once the slots have grown to cap_max and no squeeze is due. KVBM_ENOMEM
 * when the slots cannot grow: the record is not kept. */
kvbm_status kvbm__reqtab_add(kvbm__reqtab *t, const kvbm__req_rec *rec);

/* Drops the records at the head that are done or expire at or before
 * `now` (those live are counted in `expired`). O(records dropped). */
void kvbm__reqtab_expire(kvbm__reqtab *t, int64_t now);

/* The live record of `id`, or NULL (never added, done, expired or
 * evicted). Binary search: O(log max). Valid until the next call that
 * changes the table. */
const kvbm__req_rec *kvbm__reqtab_find(const kvbm__reqtab *t, uint64_t id);

/* /done: the live record of `id` is dropped (drop called). false when
 * there is none. */
bool kvbm__reqtab_done(kvbm__reqtab *t, uint64_t id);

/* Records held, done ones not yet passed over included (<= max). */
static inline size_t kvbm__reqtab_held(const kvbm__reqtab *t) {
  return (size_t)(t->tail - t->head);
}

#endif
