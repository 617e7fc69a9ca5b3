/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hindex.h (private): a bounded set of 64-bit block hashes, each with a
 * count, that forgets its oldest key when full. The peers (peers.c) keep
 * two: the blocks a peer acknowledged (the remote index, counts all 1) and
 * the blocks sent to a peer and not yet acknowledged (counts: sends in
 * flight of the same hash).
 *
 * Every operation is O(1) expected, whatever the fill: issue 24 found the
 * remote index scanning all of its slots (131072 at the default) on every
 * acknowledgement. Keys live in an open-addressing table (linear probing,
 * at least twice as many slots as keys, so at most half full), and a list
 * threaded through the slots keeps them oldest to newest. Removal by hash
 * shifts the probe run back (no tombstones, so nothing is ever rebuilt)
 * and unlinks the key; an entry moved by the shift relinks its two
 * neighbours. So "the oldest key goes when `limit` are held" is exact even
 * after removals in any order, and a later lease or remove-by-hash needs
 * nothing more than the table's lookup.
 *
 * A key's home slot is a multiply-shift hash with a random odd multiplier
 * drawn at init: block hashes come from prompts that a client chooses, and
 * a fixed slot function would let it make hashes that share a home slot
 * and turn each lookup into a long probe run.
 *
 * Leases (issue 23). Each key also carries a 64-bit value that the owner
 * sets (the peers: when the peer's word was given, in milliseconds).
 * kvbm__hindex_put makes a key the newest whatever it was, so that with
 * values that only grow the age list is also in value order, and expired
 * keys are found at the oldest end (kvbm__hindex_oldest) in O(1) each.
 *
 * Not thread-safe: the owner locks (a peer's mu). Allocation only at init.
 */
#ifndef KVBM_PEER_HINDEX_H
#define KVBM_PEER_HINDEX_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvbm__hindex {
  uint64_t *key;    /* per slot */
  uint32_t *cnt;    /* per slot: the key's count; 0 = an empty slot */
  uint32_t *older, *newer; /* per slot: the age list's neighbours (slots) */
  uint64_t *val;    /* per slot: the owner's value (kvbm__hindex_put) */
  uint64_t mul;     /* the home slot: (h * mul) >> shift; mul odd, random */
  uint32_t shift;
  uint32_t mask;    /* slots - 1 (a power of two, >= 2 * limit) */
  uint32_t limit;   /* keys held at most */
  uint32_t live;    /* keys held */
  uint32_t oldest, newest; /* the age list's ends (KVBM__HINDEX_NONE) */
  uint64_t probes;  /* slots examined, over every operation (a test seam) */
} kvbm__hindex;

#define KVBM__HINDEX_NONE UINT32_MAX

/* Room for `limit` keys (1 .. 2^26); `seed` picks the slot function (any
 * value; the caller draws it at random). KVBM_ENOMEM, KVBM_EINVAL. */
int kvbm__hindex_init(kvbm__hindex *x, uint32_t limit, uint64_t seed);
/* Frees what init allocated; x may be zeroed or half built. */
void kvbm__hindex_free(kvbm__hindex *x);
/* h's count, 0 when absent. */
uint32_t kvbm__hindex_count(kvbm__hindex *x, uint64_t h);
/* One more of h: its count + 1, or h added as the newest key with count 1.
 * A new key in a full index first evicts the oldest key: *evicted (may be
 * NULL) gets its count (0: none evicted) and *evicted_hash its hash. */
void kvbm__hindex_add(kvbm__hindex *x, uint64_t h, uint32_t *evicted, uint64_t *evicted_hash);
/* One less of h (removed at 0). false: h is absent (nothing changes). */
bool kvbm__hindex_take(kvbm__hindex *x, uint64_t h);
/* h with count 1 and value `val`, made the newest key (moved there when
 * present, added otherwise, evicting the oldest of a full index as
 * kvbm__hindex_add does). */
void kvbm__hindex_put(kvbm__hindex *x, uint64_t h, uint64_t val, uint32_t *evicted, uint64_t *evicted_hash);
/* Whether h is held; *val (may be NULL) gets its value (0 for keys added
 * by kvbm__hindex_add). */
bool kvbm__hindex_get(kvbm__hindex *x, uint64_t h, uint64_t *val);
/* Removes h whatever its count. false: h is absent. */
bool kvbm__hindex_drop(kvbm__hindex *x, uint64_t h);
/* The oldest key and its value; false when empty. */
bool kvbm__hindex_oldest(const kvbm__hindex *x, uint64_t *h, uint64_t *val);
/* Removes every key: O(slots). */
void kvbm__hindex_clear(kvbm__hindex *x);
/* Keys held. */
uint32_t kvbm__hindex_size(const kvbm__hindex *x);

#endif
