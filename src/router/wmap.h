/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wmap.h: the writer's private map of one worker's blocks (engine hash ->
 * index key and a count per tier). Open addressing, linear probing,
 * backward-shift deletion; never touched by readers, so no atomics.
 */
#ifndef KVBM_ROUTER_WMAP_H
#define KVBM_ROUTER_WMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/router.h"

typedef struct wentry {
  uint64_t ehash;                     /* the engine's hash (map key) */
  uint64_t rhash;                     /* the index key */
  uint32_t cnt[KVBM_TIER_COUNT];    /* stores minus removes, per tier */
  uint32_t used;
} wentry;

typedef struct wmap {
  wentry *e;
  size_t cap, n; /* cap a power of two, 0 before the first insert */
} wmap;

/* The entry of `ehash`, or NULL. */
wentry *kvbm__wmap_find(const wmap *m, uint64_t ehash);
/* The entry of `ehash`, added (zeroed, rhash set) when missing; *added says
 * which. NULL when out of memory. May move entries: earlier pointers die. */
wentry *kvbm__wmap_upsert(wmap *m, uint64_t ehash, uint64_t rhash, bool *added);
/* Deletes the entry `e` points to (from kvbm__wmap_find / kvbm__wmap_upsert). */
void kvbm__wmap_erase(wmap *m, wentry *e);
void kvbm__wmap_clear(wmap *m);
void kvbm__wmap_free(wmap *m);

static inline size_t wmap_home(uint64_t h, size_t cap) {
  return (size_t)((h * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

#endif
