/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hindex.c: a bounded, age-ordered set of block hashes with counts (see
 * hindex.h for what it is for and why every operation is O(1)).
 *
 * Design. One array of slots holds the set: linear probing over a
 * power-of-two number of slots, at least 2 x limit, so the table is at
 * most half full and probe runs stay short. Each used slot is also a node
 * of a doubly linked list in insertion order (older/newer are slot
 * numbers), whose oldest end is what a full index evicts.
 *
 * Deletion is backward shift: the entries after a freed slot that may
 * move closer to their home slot are moved into it, until an empty slot.
 * Probe runs therefore never contain holes (no tombstones, no rebuild),
 * and a lookup stops at the first empty slot. A moved entry keeps its
 * place in the age list: its neighbours are pointed at its new slot.
 *
 * The cost of every call is a few probes of short runs, counted in
 * `probes` so that a test can bound it without a clock.
 */
#include "peer/hindex.h"

#include <stdlib.h>

#include "common/mix.h"
#include "kvbm/status.h"

#define NONE KVBM__HINDEX_NONE

static uint32_t home(const kvbm__hindex *x, uint64_t h) { return (uint32_t)((h * x->mul) >> x->shift); }

int kvbm__hindex_init(kvbm__hindex *x, uint32_t limit, uint64_t seed) {
  *x = (kvbm__hindex){.oldest = NONE, .newest = NONE};
  if (limit == 0 || limit > (1u << 26)) return KVBM_EINVAL;
  uint32_t slots = 2, bits = 1;
  while (slots < 2 * limit) {
    slots *= 2;
    bits++;
  }
  x->key = calloc(slots, sizeof *x->key);
  x->cnt = calloc(slots, sizeof *x->cnt);
  x->older = calloc(slots, sizeof *x->older);
  x->newer = calloc(slots, sizeof *x->newer);
  x->val = calloc(slots, sizeof *x->val);
  if (!x->key || !x->cnt || !x->older || !x->newer || !x->val) {
    kvbm__hindex_free(x);
    return KVBM_ENOMEM;
  }
  /* splitmix64 of the seed: any seed, even 0, gives a well-mixed odd
   * multiplier */
  x->mul = kvbm__mix64(seed) | 1;
  x->shift = 64 - bits;
  x->mask = slots - 1;
  x->limit = limit;
  return KVBM_OK;
}

void kvbm__hindex_free(kvbm__hindex *x) {
  free(x->key);
  free(x->cnt);
  free(x->older);
  free(x->newer);
  free(x->val);
  *x = (kvbm__hindex){.oldest = NONE, .newest = NONE};
}

/* h's slot, or the empty slot that ends its probe run (*found false). */
static uint32_t find(kvbm__hindex *x, uint64_t h, bool *found) {
  uint32_t i = home(x, h);
  for (;; i = (i + 1) & x->mask) {
    x->probes++;
    if (x->cnt[i] == 0) {
      *found = false;
      return i;
    }
    if (x->key[i] == h) {
      *found = true;
      return i;
    }
  }
}

static void unlink_slot(kvbm__hindex *x, uint32_t i) {
  uint32_t o = x->older[i], n = x->newer[i];
  if (o != NONE) x->newer[o] = n;
  else x->oldest = n;
  if (n != NONE) x->older[n] = o;
  else x->newest = o;
}

/* Moves the entry of slot j to the empty slot i, keeping its list place. */
static void move_slot(kvbm__hindex *x, uint32_t j, uint32_t i) {
  x->key[i] = x->key[j];
  x->cnt[i] = x->cnt[j];
  x->val[i] = x->val[j];
  uint32_t o = x->older[j], n = x->newer[j];
  x->older[i] = o;
  x->newer[i] = n;
  if (o != NONE) x->newer[o] = i;
  else x->oldest = i;
  if (n != NONE) x->older[n] = i;
  else x->newest = i;
}

/* Empties slot i, shifting back the entries after it that may move. */
static void erase(kvbm__hindex *x, uint32_t i) {
  unlink_slot(x, i);
  for (uint32_t j = i;;) {
    j = (j + 1) & x->mask;
    x->probes++;
    if (x->cnt[j] == 0) break;
    /* j's entry may fill i when its home is not in (i, j] (cyclically):
     * its distance from home is at least the distance from i to j */
    if (((j - home(x, x->key[j])) & x->mask) >= ((j - i) & x->mask)) {
      move_slot(x, j, i);
      i = j;
    }
  }
  x->cnt[i] = 0;
  x->live--;
}

uint32_t kvbm__hindex_count(kvbm__hindex *x, uint64_t h) {
  bool found;
  uint32_t i = find(x, h, &found);
  return found ? x->cnt[i] : 0;
}

void kvbm__hindex_add(kvbm__hindex *x, uint64_t h, uint32_t *evicted, uint64_t *evicted_hash) {
  if (evicted) *evicted = 0;
  bool found;
  uint32_t i = find(x, h, &found);
  if (found) {
    if (x->cnt[i] < UINT32_MAX) x->cnt[i]++;
    return;
  }
  if (x->live == x->limit) { /* full: the oldest key goes first */
    uint32_t o = x->oldest;
    if (evicted) *evicted = x->cnt[o];
    if (evicted_hash) *evicted_hash = x->key[o];
    erase(x, o);
    i = find(x, h, &found); /* the shift may have moved h's empty slot */
  }
  x->key[i] = h;
  x->cnt[i] = 1;
  x->val[i] = 0;
  x->older[i] = x->newest;
  x->newer[i] = NONE;
  if (x->newest != NONE) x->newer[x->newest] = i;
  else x->oldest = i;
  x->newest = i;
  x->live++;
}

bool kvbm__hindex_take(kvbm__hindex *x, uint64_t h) {
  bool found;
  uint32_t i = find(x, h, &found);
  if (!found) return false;
  if (--x->cnt[i] == 0) erase(x, i);
  return true;
}

void kvbm__hindex_put(kvbm__hindex *x, uint64_t h, uint64_t val, uint32_t *evicted, uint64_t *evicted_hash) {
  (void)kvbm__hindex_drop(x, h); /* to the newest end, count 1 */
  kvbm__hindex_add(x, h, evicted, evicted_hash);
  bool found;
  uint32_t i = find(x, h, &found);
  x->val[i] = val;
}

bool kvbm__hindex_get(kvbm__hindex *x, uint64_t h, uint64_t *val) {
  bool found;
  uint32_t i = find(x, h, &found);
  if (found && val) *val = x->val[i];
  return found;
}

bool kvbm__hindex_drop(kvbm__hindex *x, uint64_t h) {
  bool found;
  uint32_t i = find(x, h, &found);
  if (found) erase(x, i);
  return found;
}

bool kvbm__hindex_oldest(const kvbm__hindex *x, uint64_t *h, uint64_t *val) {
  if (x->oldest == NONE) return false;
  if (h) *h = x->key[x->oldest];
  if (val) *val = x->val[x->oldest];
  return true;
}

void kvbm__hindex_clear(kvbm__hindex *x) {
  for (uint32_t i = 0; i <= x->mask && x->live; i++)
    if (x->cnt[i]) {
      x->cnt[i] = 0;
      x->live--;
    }
  x->oldest = x->newest = NONE;
}

uint32_t kvbm__hindex_size(const kvbm__hindex *x) { return x->live; }
