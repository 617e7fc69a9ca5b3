/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/psim_cache.h: the eviction policies of the policy simulator
 * (workload/psim.h), each a set of resident block ids with a capacity.
 *
 * Ids are dense (0 .. universe - 1, given at creation): the simulator
 * interns every block hash of a trace once, so a policy indexes plain
 * arrays instead of hashing. A cache holds no bytes, only which ids are
 * resident and the policy's bookkeeping.
 *
 * Pins. The manager pins the blocks one commit touches until the commit's
 * copies are done, so a commit never evicts what it just wrote or
 * refreshed. Here kvsim_psim_cache_begin() opens a commit: every id accessed or
 * inserted until the next begin is pinned, and an insert that finds only
 * pinned residents fails (the manager's skipped_space).
 *
 * Order within a commit. The manager releases a commit's pins in use
 * order, so in its LRU the request's first block is the oldest of the
 * commit and leaves first ("head_first"), which cuts a prefix at its root.
 * With tail_first the commit's blocks are placed the other way round: the
 * deepest block is the oldest and the first block the newest, as the G1
 * pool releases a request (tail first). Every queue-based policy here
 * honours the flag for the blocks it places during a commit.
 *
 * Not thread-safe: one simulator drives its caches. Memory: 4 bytes per id
 * of the universe plus a few words per slot (ARC keeps 2 x capacity slots
 * for its ghosts, S3-FIFO a ring of ghost ids as large as its main queue).
 */
#ifndef KVSIM_WORKLOAD_PSIM_CACHE_H
#define KVSIM_WORKLOAD_PSIM_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#define KVSIM_PSIM_NONE UINT32_MAX
#define KVSIM_PSIM_KEY_NEVER UINT64_MAX /* Belady: no further use */

typedef enum kvsim_psim_evict {
  KVSIM_PSIM_EVICT_LRU = 0,  /* least recently used (the pool's rule) */
  KVSIM_PSIM_EVICT_ARC,      /* adaptive replacement (Megiddo & Modha) */
  KVSIM_PSIM_EVICT_S3FIFO,   /* small FIFO + main FIFO with 2-bit clock + ghost (Yang et al.) */
  KVSIM_PSIM_EVICT_WTINYLFU, /* window LRU + segmented LRU behind a TinyLFU filter (Caffeine) */
  KVSIM_PSIM_EVICT_BELADY,   /* clairvoyant: evict the furthest next use (keys from the caller) */
  KVSIM_PSIM_EVICT_TTL,      /* online: keys KVSIM_PSIM_TTL_KEY; overdue first, then the highest key */
  KVSIM_PSIM_EVICT_COUNT
} kvsim_psim_evict;

/* "lru", "arc", "s3fifo", "wtinylfu", "belady", "ttl"; "?" otherwise. */
const char *kvsim_psim_evict_name(int kind);
/* The inverse; false for anything else (NULL included). */
bool kvsim_psim_evict_parse(const char *s, kvsim_psim_evict *out);

typedef struct kvsim_psim_cache kvsim_psim_cache;

/* A cache of `capacity` ids out of `universe`. KVBM_EINVAL for a bad kind
 * or a zero universe, KVBM_ENOMEM. capacity 0 is an empty cache whose
 * inserts all fail. */
int kvsim_psim_cache_create(kvsim_psim_evict kind, uint32_t capacity, uint32_t universe, kvsim_psim_cache **out);
void kvsim_psim_cache_destroy(kvsim_psim_cache *c); /* NULL is a no-op */

bool kvsim_psim_cache_has(const kvsim_psim_cache *c, uint32_t id);
uint32_t kvsim_psim_cache_size(const kvsim_psim_cache *c);
uint32_t kvsim_psim_cache_capacity(const kvsim_psim_cache *c);

/* Opens a commit: earlier pins end; tail_first orders what it places. */
void kvsim_psim_cache_begin(kvsim_psim_cache *c, bool tail_first);

/* A use of a resident id: refreshed per policy and pinned. `key` is the
 * id's next use (Belady; ignored by the others). */
void kvsim_psim_cache_access(kvsim_psim_cache *c, uint32_t id, uint64_t key);

/* Inserts an absent id, pinned, evicting per policy when full. Returns
 * false (nothing changed) when every resident is pinned. *evicted is the
 * resident that left (KVSIM_PSIM_NONE if none); W-TinyLFU may evict the id that
 * was inserted earlier in the window rather than a main-queue one, and
 * never the id being inserted. */
bool kvsim_psim_cache_insert(kvsim_psim_cache *c, uint32_t id, uint64_t key, uint32_t *evicted);

/* Removes a resident id (absent: no-op); ghosts of ARC/S3-FIFO are kept. */
void kvsim_psim_cache_remove(kvsim_psim_cache *c, uint32_t id);

/* Evicts one unpinned resident per policy and returns it (KVSIM_PSIM_NONE when
 * there is none). Used where the caller, not an insert, needs room (G1). */
uint32_t kvsim_psim_cache_evict(kvsim_psim_cache *c);

/* Belady and TTL: the key of the resident the next eviction would take
 * (KVSIM_PSIM_KEY_NEVER when none, and for TTL when it is overdue: an insert
 * then costs nothing); other kinds return 0. */
uint64_t kvsim_psim_cache_victim_key(kvsim_psim_cache *c);

/* TTL's keys: rank (16 bits: the highest goes first among residents not
 * overdue), expiry (32 bits, in the unit of kvsim_psim_cache_set_now), depth in
 * the request (16 bits, clamped: among equals the deepest goes first, so
 * a chain loses its tail, not its middle). */
#define KVSIM_PSIM_TTL_RANK_MAX 0xFFFFu
#define KVSIM_PSIM_TTL_EXPIRY_MAX 0xFFFFFFFFu
#define KVSIM_PSIM_TTL_DEPTH_MAX 0xFFFFu
#define KVSIM_PSIM_TTL_KEY(rank, expiry, depth) \
  ((uint64_t)(rank) << 48 | (uint64_t)(expiry) << 16 | (uint64_t)(depth))
#define KVSIM_PSIM_TTL_EXPIRY(key) ((key) >> 16 & KVSIM_PSIM_TTL_EXPIRY_MAX)

/* TTL: the current time in the unit of the keys' expiries; residents
 * whose expiry is at or below it are overdue. Other kinds ignore it. */
void kvsim_psim_cache_set_now(kvsim_psim_cache *c, uint64_t now);

#endif
