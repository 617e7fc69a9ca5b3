/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.c: the block pool (see kvbm/pool.h for the state machine).
 *
 * Four structures, all sized at creation so that no operation allocates:
 *
 *  - blocks[]: one 32-byte record per block (state, reference count,
 *    hashes, links, the eviction priority). Token slots live apart in one
 *    flat array, tokens[id * bs ...], as does the salt, so that the
 *    records stay dense for the hot path. Full blocks filled from the caller's
 *    tokens copy them only with keep_tokens: in a replay the copy is a
 *    random write into a megabyte-sized array per block, which costs more
 *    than the hash that names the block.
 *  - the free list: a stack of empty (RESET, unreferenced) block ids. Order
 *    does not matter for an empty block, and a stack reuses the most recently
 *    touched memory first.
 *  - the cache: registered blocks nobody holds, in one doubly-linked list per
 *    priority (0..255), oldest release at the head. A 256-bit mask of the
 *    non-empty lists makes "lowest priority, least recently released" two
 *    word scans and a pointer read, i.e. O(1).
 *  - the registry: sequence hash -> block id, in 64-byte buckets of 7
 *    entries (a 32-bit fingerprint and a block id) at most 2 entries a
 *    bucket on average. A lookup compares the fingerprints of its home bucket
 *    at once (SSE2) and confirms a match on the block record's full hash; an
 *    entry that found its bucket full went on to the next one and left a
 *    count behind, so lookups continue only where something did. Entries
 *    never move: a removal is a store, not a backward shift, and neither
 *    path has a data-dependent loop the branch predictor keeps missing (the
 *    linear-probing table this replaced spent half its time on those).
 *    Sequence hashes are uniform, but a caller can hand kvbm_block_fill()
 *    any value, so the home bucket is a multiplicative mix of the
 *    fingerprint. With allow_duplicates, later blocks of an equal hash are
 *    chained behind the indexed one (dup_next) in registration order.
 *    In a pool without duplicate chains (the pools fill_run_plain and,
 *    with groups, fill_groups_plain serve), where[id] says where block id's entry sits
 *    (bucket and entry) when that is its home bucket, so that evicting a
 *    cached block clears its entry with one load and one store, without
 *    hashing the victim again or searching its bucket for the id; an
 *    entry that went past its home is marked NIL there and erased by the
 *    search, as before.
 *
 * Groups (a hybrid model's KV cache groups, kvbm/group.h): one registry
 * holds every group's entries, keyed by (sequence hash, group): the
 * fingerprint mixes in the group (group 0's is the plain one) and a match
 * is confirmed on the block's group as well as its hash, so a lookup in
 * one group never finds another's block, even under an equal hash. One
 * registry rather than one a group: entries never outnumber blocks, so
 * the memory, and what the hot loops touch, stays that of a one-group
 * pool (a registry a group made a two-group replay spill the L2 cache).
 * A side array group[] names each block's group; a one-group pool has
 * none, and its hot loops are compiled with `grouped` false, so that they
 * are the loops they were. The free list, the cache
 * lists and the block budget are shared by all groups, as vLLM's one
 * BlockPool is: eviction takes the oldest cached block whatever its group.
 *
 * Memory for a pool of N blocks of B tokens: 32 N (records) + 32..64 N
 * (registry) + 12 N (salt, free stack) + 4 N (where[], without
 * duplicate chains) + 4 N B (token slots, none
 * with fill_only: a tier below G1 only ever fills blocks whole and never
 * reads tokens back), and 4 N for the duplicate chains with
 * allow_duplicates; with groups, N more for group[].
 */
#include "kvbm/pool.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "hash/hash_inline.h"
#include "pool/pool_internal.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define NIL UINT32_MAX
/* The per-block steps of prefill and release: inlined into the run loops so
 * that the pool's fields stay in registers across a request's blocks. */
#define HOT static inline __attribute__((always_inline))
#define NPRIO 256

enum {
  F_HAS_PARENT = 1u << 0,
  F_CACHED = 1u << 1,   /* in a cache list */
  F_INDEXED = 1u << 2,  /* the registry's entry for its hash names this block */
  F_SALTED = 1u << 3,   /* salts[id] holds a nonzero salt hash */
  F_TOKENS = 1u << 4,   /* tokens[id * bs ...] holds the block's tokens */
  F_DUP = 1u << 5,      /* a registered duplicate, chained behind the indexed block */
};

/* 32 bytes, two per cache line: the hot record. The salt, rarely nonzero,
 * lives in a cold array. The state (2 bits) and the flags (6) share a
 * byte, so that the priority of the cache list a block sits in is in the
 * record too: releasing and evicting a block then touch its record's line
 * and no other (a side array of priorities was one more random store at
 * each; session 19, side by side: W1 replay -2%). */
typedef struct blk {
  uint64_t seq_hash;
  uint64_t parent_hash;
  uint32_t prev, next;  /* cache list links */
  uint32_t refcount;
  uint16_t ntok;        /* tokens appended; block_size <= 65535 */
  uint8_t prio;         /* the priority it was released with while cached, else 0 */
  uint8_t flags : 6;    /* F_* */
  uint8_t state : 2;    /* kvbm_block_state */
} blk;
_Static_assert(F_DUP < (1u << 6) && KVBM_BLOCK_REGISTERED < 4, "flags and state fit their bits");

/* One cache line of the registry: 7 entries (a 32-bit fingerprint of the
 * hash and a block id; NIL marks a free entry) and the count of entries whose
 * home is this bucket but which sit in a later one because this one was full
 * when they came. A lookup reads its home bucket and goes on only while that
 * count says something went past; entries never move, so a removal is one
 * store (and a walk decrementing the counts it passes), with no shifting. */
#define BUCKET_SLOTS 7
typedef struct bucket {
  uint32_t fp[BUCKET_SLOTS];
  uint32_t overflow;
  uint32_t id[BUCKET_SLOTS];
  uint32_t unused;
} bucket;

struct kvbm_pool {
  kvbm_pool_config cfg;
  blk *blocks;
  uint64_t *salts;
  uint32_t *tokens;
  uint32_t *free_stack;
  uint32_t free_top;
  uint32_t head[NPRIO], tail[NPRIO];
  uint64_t nonempty[NPRIO / 64];
  uint32_t cached;
  uint32_t registered;
  bucket *table;         /* the registry, every group's entries */
  uint8_t *group;        /* the group of each block; NULL with one group */
  uint32_t ngroups;
  uint32_t *dup_next;   /* allow_duplicates: the next duplicate, or NIL */
  uint32_t *where;      /* no duplicates: where_of() of each indexed block's entry */
  uint32_t table_shift; /* 32 - log2(buckets) */
  uint32_t table_mask;  /* buckets - 1 */
  uint64_t allocated, evicted, dedup, match_hits;
};

/* ---- registry ---------------------------------------------------------- */

/* The fingerprint of (hash, group): group 0's is the hash's own, so that a
 * one-group pool's registry is the one it always was; another group's is
 * mixed with the group, so that one hash in several groups spreads over
 * several buckets. A match is confirmed on the block's hash and group. */
static inline uint32_t fingerprint(uint64_t hash, uint32_t g) {
  return (uint32_t)(hash ^ (hash >> 32)) ^ (g * 0x9E3779B9u);
}

static inline uint32_t home_of(const kvbm_pool *p, uint32_t fp) {
  /* Fibonacci hashing: the top bits of the product (the table has at
   * least 2 buckets, so the shift is < 32). */
  return (fp * 0x9E3779B1u) >> p->table_shift;
}

/* A (hash, group)'s fingerprint and home bucket: a registration computes
 * it once for its lookup and its insert (each used to compute its own;
 * callgrind, kvbm replay --limit 2000: 851.5M -> 819.9M instructions).
 * Tried and dropped: carrying the keys of the blocks ahead in a ring, to
 * share them with the prefetch too (859.8M: spills), and keeping the next
 * victim's home bucket from its prefetch for its erase (no gain). */
typedef struct rkey {
  uint32_t fp, home;
} rkey;

static inline rkey rkey_of(const kvbm_pool *p, uint64_t hash, uint32_t g) {
  const uint32_t fp = fingerprint(hash, g);
  return (rkey){fp, home_of(p, fp)};
}

/* Bit i set when entry i of the bucket holds `v` in fp[] (key = 0) or id[]. */
static inline unsigned bucket_match(const bucket *b, uint32_t v, int key) {
  const uint32_t *a = key ? b->id : b->fp;
#if defined(__SSE2__)
  __m128i x = _mm_set1_epi32((int)v);
  __m128i lo = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)a), x);
  __m128i hi = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(a + 4)), x);
  unsigned m = (unsigned)_mm_movemask_ps(_mm_castsi128_ps(lo)) |
               (unsigned)_mm_movemask_ps(_mm_castsi128_ps(hi)) << 4;
  return m & ((1u << BUCKET_SLOTS) - 1); /* lane 7 is overflow / unused */
#else
  unsigned m = 0;
  for (unsigned i = 0; i < BUCKET_SLOTS; i++) m |= (unsigned)(a[i] == v) << i;
  return m;
#endif
}

/* The block indexed under `hash`, or NIL. */
/* `grouped` is whether the pool has groups (p->group != NULL): constant
 * at the hot call sites, so a one-group pool's lookup is the old one. */
HOT uint32_t reg_find_k(const kvbm_pool *p, uint64_t hash, uint32_t g, rkey k, const bool grouped) {
  for (uint32_t bi = k.home;; bi = (bi + 1) & p->table_mask) {
    const bucket *b = &p->table[bi];
    for (unsigned m = bucket_match(b, k.fp, 0); m; m &= m - 1) {
      uint32_t id = b->id[__builtin_ctz(m)];
      if (id != NIL && p->blocks[id].seq_hash == hash && (!grouped || p->group[id] == g)) return id;
    }
    if (!b->overflow) return NIL;
  }
}

HOT uint32_t reg_find(const kvbm_pool *p, uint64_t hash, uint32_t g, const bool grouped) {
  return reg_find_k(p, hash, g, rkey_of(p, hash, g), grouped);
}

/* where[id] of an entry in entry i of bucket bi: its place when bi is its
 * home, else NIL (the erase then searches from the home, updating the
 * overflow counts on the way). Buckets number at most 2^29 (num_blocks <=
 * 2^30), so the place is below NIL. */
_Static_assert(KVBM_POOL_MAX_BLOCKS <= (1u << 30), "where[] needs bucket indexes below 2^29");
static inline uint32_t where_of(uint32_t bi, unsigned i, uint32_t home) {
  return bi == home ? bi << 3 | i : NIL;
}

/* Adds an entry for block `id`, whose hash is not indexed yet. */
HOT void reg_insert(kvbm_pool *p, rkey k, uint32_t id) {
  const uint32_t fp = k.fp;
  for (uint32_t bi = k.home;; bi = (bi + 1) & p->table_mask) {
    bucket *b = &p->table[bi];
    unsigned free = bucket_match(b, NIL, 1);
    if (free) {
      unsigned i = (unsigned)__builtin_ctz(free);
      b->fp[i] = fp;
      b->id[i] = id;
      if (p->where) p->where[id] = where_of(bi, i, k.home);
      return;
    }
    b->overflow++;
  }
}

/* Removes (or, given `repl` != NIL, re-points to repl) the entry of `id`. */
HOT void reg_erase(kvbm_pool *p, uint32_t home, uint32_t id, uint32_t repl) {
  for (uint32_t bi = home;; bi = (bi + 1) & p->table_mask) {
    bucket *b = &p->table[bi];
    unsigned m = bucket_match(b, id, 1);
    if (m) {
      b->id[__builtin_ctz(m)] = repl;
      return;
    }
    if (repl == NIL) b->overflow--; /* the entry went past this bucket */
  }
}

/* Indexes a newly registered block: under its hash, or (allow_duplicates)
 * at the end of the chain of blocks registered earlier under it. */
HOT void reg_add(kvbm_pool *p, rkey k, uint32_t id, uint32_t existing) {
  blk *b = &p->blocks[id];
  if (existing == NIL) {
    reg_insert(p, k, id);
    b->flags |= F_INDEXED;
    return;
  }
  while (p->dup_next[existing] != NIL) existing = p->dup_next[existing];
  p->dup_next[existing] = id;
  p->dup_next[id] = NIL;
  b->flags |= F_DUP;
}

/* Takes a registered block out of the index. The first of a chain of
 * duplicates hands the entry to the next one; a later one is unlinked. */
HOT void reg_remove(kvbm_pool *p, uint64_t hash, uint32_t g, uint32_t id, const bool grouped) {
  uint8_t flags = p->blocks[id].flags;
  if (flags & F_INDEXED) {
    uint32_t next = p->dup_next ? p->dup_next[id] : NIL;
    reg_erase(p, rkey_of(p, hash, g).home, id, next);
    if (next != NIL) {
      p->blocks[next].flags = (uint8_t)((p->blocks[next].flags & ~F_DUP) | F_INDEXED);
      p->dup_next[id] = NIL;
    }
  } else if (flags & F_DUP) {
    uint32_t prev = reg_find(p, hash, g, grouped);
    while (p->dup_next[prev] != id) prev = p->dup_next[prev];
    p->dup_next[prev] = p->dup_next[id];
    p->dup_next[id] = NIL;
  }
}

/* The key of a hash, its home bucket prefetched. */
static inline rkey reg_key_prefetch(const kvbm_pool *p, uint64_t hash, uint32_t g) {
  rkey k = rkey_of(p, hash, g);
  __builtin_prefetch(&p->table[k.home]);
  return k;
}

/* The run loops load the registry bucket of block k + AHEAD while they
 * fill block k (the one random access they can see coming). */
#define AHEAD 4

/* Block id's group. `grouped` is a constant at every call site of the hot
 * paths: the public calls test p->group once and run a loop compiled for
 * one case, so a pool of one group pays nothing per block for groups
 * existing. */
HOT uint32_t gkey(const kvbm_pool *p, uint32_t id, const bool grouped) {
  return grouped ? p->group[id] : 0;
}

/* ---- cache lists --------------------------------------------------------- */

HOT void cache_push(kvbm_pool *p, uint32_t id) {
  blk *b = &p->blocks[id];
  unsigned pr = b->prio;
  b->next = NIL;
  b->prev = p->tail[pr];
  if (p->tail[pr] != NIL)
    p->blocks[p->tail[pr]].next = id;
  else
    p->head[pr] = id;
  p->tail[pr] = id;
  p->nonempty[pr / 64] |= 1ull << (pr % 64);
  b->flags |= F_CACHED;
  p->cached++;
}

static void cache_unlink(kvbm_pool *p, uint32_t id) {
  blk *b = &p->blocks[id];
  unsigned pr = b->prio;
  if (b->prev != NIL)
    p->blocks[b->prev].next = b->next;
  else
    p->head[pr] = b->next;
  if (b->next != NIL)
    p->blocks[b->next].prev = b->prev;
  else
    p->tail[pr] = b->prev;
  if (p->head[pr] == NIL) p->nonempty[pr / 64] &= ~(1ull << (pr % 64));
  b->flags &= (uint8_t)~F_CACHED;
  b->prio = 0; /* a block out of the cache has priority 0 (release_run's add) */
  p->cached--;
}

static uint32_t cache_oldest(const kvbm_pool *p) {
  for (unsigned w = 0; w < NPRIO / 64; w++)
    if (p->nonempty[w]) return p->head[w * 64 + (unsigned)__builtin_ctzll(p->nonempty[w])];
  return NIL;
}

/* ---- helpers ---------------------------------------------------------------- */

static void notify(kvbm_pool *p, const kvbm_pool_event *ev) {
  if (p->cfg.listener) p->cfg.listener(p->cfg.listener_user, ev);
}

static inline uint32_t *tokens_of(const kvbm_pool *p, uint32_t id) {
  if (!p->tokens) return NULL; /* fill_only: no slots */
  return p->tokens + (size_t)id * p->cfg.block_size;
}

static inline uint64_t salt_of(const kvbm_pool *p, uint32_t id) {
  return (p->blocks[id].flags & F_SALTED) ? p->salts[id] : 0;
}

/* Empties a block's content; its reference count is the caller's business. */
HOT void block_reset(kvbm_pool *p, uint32_t id) {
  blk *b = &p->blocks[id];
  b->state = KVBM_BLOCK_RESET;
  b->ntok = 0;
  b->flags = 0;
  b->seq_hash = b->parent_hash = 0;
  b->prio = 0;
}

HOT void free_push(kvbm_pool *p, uint32_t id) {
  block_reset(p, id);
  p->blocks[id].refcount = 0;
  p->free_stack[p->free_top++] = id;
}

/* Drops a registered block from the registry and counts (not the lists). */
static void unregister(kvbm_pool *p, uint32_t id) {
  const bool grouped = p->group != NULL;
  reg_remove(p, p->blocks[id].seq_hash, gkey(p, id, grouped), id, grouped);
  p->registered--;
}

/* Evicts the oldest cached block (the head of the lowest non-empty
 * priority list) and returns it, RESET. With `refill` the caller writes
 * every field of the record at once (fill_one), so the reset stores are
 * skipped, unless a listener may look at the block during its event. */
/* `quiet`: the caller knows the pool has no listener (a constant at the
 * run loops' call sites, which are compiled once for each case), so the
 * per-block tests of p->cfg.listener go; false is always correct. */
HOT uint32_t evict_oldest(kvbm_pool *p, const bool grouped, const bool refill, const bool quiet) {
  unsigned w = 0;
  while (!p->nonempty[w]) w++; /* the caller checked that the cache is not empty */
  unsigned pr = w * 64 + (unsigned)__builtin_ctzll(p->nonempty[w]);
  uint32_t id = p->head[pr];
  blk *b = &p->blocks[id];
  uint64_t hash = b->seq_hash;
  /* Unlink the head; the next victim is usually its successor, so start
   * loading that one's registry slot and the record after it now. */
  uint32_t next = b->next;
  p->head[pr] = next;
  if (next != NIL) {
    blk *n = &p->blocks[next];
    n->prev = NIL;
    (void)reg_key_prefetch(p, n->seq_hash, gkey(p, next, grouped));
    if (n->next != NIL) __builtin_prefetch(&p->blocks[n->next]);
  } else {
    p->tail[pr] = NIL;
    p->nonempty[w] &= ~(1ull << (pr % 64));
  }
  p->cached--;
  reg_remove(p, hash, gkey(p, id, grouped), id, grouped);
  p->registered--;
  p->evicted++;
  if (!refill || (!quiet && p->cfg.listener))
    block_reset(p, id);
  else
    b->prio = 0;
  if (!quiet && p->cfg.listener) {
    kvbm_pool_event ev = {.kind = KVBM_POOL_REMOVED, .block_id = id, .seq_hash = hash,
                          .group = grouped ? p->group[id] : 0};
    notify(p, &ev);
  }
  return id;
}

/* One block off the free list, or else the oldest cached block evicted.
 * The caller has checked that one is available; `refill`: see evict_oldest. */
HOT uint32_t take_block(kvbm_pool *p, const bool grouped, uint32_t group, const bool refill,
                        const bool quiet) {
  uint32_t id = p->free_top ? p->free_stack[--p->free_top] : evict_oldest(p, grouped, refill, quiet);
  if (grouped) p->group[id] = (uint8_t)group;
  p->blocks[id].refcount = 1;
  p->allocated++;
  return id;
}

static inline uint32_t group_of(const kvbm_pool *p, uint32_t id) {
  return p->group ? p->group[id] : 0;
}

static inline bool valid_id(const kvbm_pool *p, uint32_t id) {
  return id < p->cfg.num_blocks;
}

/* Takes a reference on a registered block, reactivating it if cached. */
static void acquire(kvbm_pool *p, uint32_t id) {
  blk *b = &p->blocks[id];
  if (b->flags & F_CACHED) cache_unlink(p, id);
  b->refcount++;
}

/* COMPLETE -> REGISTERED, or dedup onto the registered block (see
 * kvbm_block_register). `tokens` are the block's tokens and `context` the
 * registering call's, both for the event. */
/* `absent`: the caller has just seen the hash unregistered in the block's
 * group (kvbm_pool_fill_run_fresh), so the lookup is skipped. */
/* `k` is the key (rkey_of) of the block's (hash, group). */
HOT uint32_t do_register(kvbm_pool *p, uint32_t id, const uint32_t *tokens, void *context,
                         rkey k, const bool grouped, const bool absent, const bool quiet) {
  blk *b = &p->blocks[id];
  const uint32_t g = gkey(p, id, grouped);
  uint32_t existing = absent ? NIL : reg_find_k(p, b->seq_hash, g, k, grouped);
  if (existing != NIL) {
    p->dedup++;
    if (!p->cfg.allow_duplicates) {
      /* Our holder switches to the registered block. */
      acquire(p, existing);
      if (--b->refcount == 0)
        free_push(p, id);
      else
        block_reset(p, id); /* other holders keep an empty block */
      return existing;
    }
  }
  b->state = KVBM_BLOCK_REGISTERED;
  /* A duplicate is chained behind the block registered first: lookups
   * find the first, and the next once the first is gone. */
  reg_add(p, k, id, existing);
  p->registered++;
  if (!quiet && p->cfg.listener) {
    kvbm_pool_event ev = {
        .kind = KVBM_POOL_STORED,
        .block_id = id,
        .seq_hash = b->seq_hash,
        .parent_hash = b->parent_hash,
        .has_parent = (b->flags & F_HAS_PARENT) != 0,
        .salt_hash = salt_of(p, id),
        .tokens = tokens,
        .num_tokens = b->ntok,
        .context = context,
        .group = grouped ? p->group[id] : 0,
    };
    notify(p, &ev);
  }
  return id;
}

/* RESET -> PARTIAL without checks. */
HOT void start_block(kvbm_pool *p, uint32_t id, uint64_t salt_hash, uint64_t parent,
                        bool has_parent) {
  blk *b = &p->blocks[id];
  b->state = KVBM_BLOCK_PARTIAL;
  b->parent_hash = has_parent ? parent : 0;
  b->flags = has_parent ? F_HAS_PARENT : 0;
  if (salt_hash) {
    p->salts[id] = salt_hash;
    b->flags |= F_SALTED;
  }
  b->ntok = 0;
}

/* ---- public ------------------------------------------------------------------ */

const char *kvbm_block_state_name(kvbm_block_state s) {
  switch (s) {
    case KVBM_BLOCK_RESET: return "reset";
    case KVBM_BLOCK_PARTIAL: return "partial";
    case KVBM_BLOCK_COMPLETE: return "complete";
    case KVBM_BLOCK_REGISTERED: return "registered";
  }
  return "unknown";
}

kvbm_pool_config kvbm_pool_config_default(uint32_t num_blocks, uint32_t block_size) {
  kvbm_pool_config c;
  memset(&c, 0, sizeof c);
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.scheme = KVBM_HASH_NATIVE;
  c.keep_tokens = true;
  return c;
}

int kvbm_pool_create(const kvbm_pool_config *cfg, kvbm_pool **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "pool: config and out must not be NULL");
  if (cfg->num_blocks == 0 || cfg->num_blocks > KVBM_POOL_MAX_BLOCKS)
    return kvbm_error_set(err, KVBM_EINVAL, "pool: num_blocks %u is not in [1, 2^30]", cfg->num_blocks);
  if (cfg->block_size == 0 || cfg->block_size > KVBM_POOL_MAX_BLOCK_SIZE)
    return kvbm_error_set(err, KVBM_EINVAL, "pool: block_size %u is not in [1, 65535]", cfg->block_size);
  if (cfg->scheme != KVBM_HASH_NATIVE && cfg->scheme != KVBM_HASH_DYNAMO)
    return kvbm_error_set(err, KVBM_EINVAL, "pool: unknown hash scheme %d", (int)cfg->scheme);
  if (cfg->fill_only && cfg->keep_tokens)
    return kvbm_error_set(err, KVBM_EINVAL, "pool: fill_only keeps no tokens: keep_tokens must be false");
  if (cfg->num_groups > KVBM_POOL_MAX_GROUPS)
    return kvbm_error_set(err, KVBM_EINVAL, "pool: %u groups: at most %u", cfg->num_groups,
                          KVBM_POOL_MAX_GROUPS);

  kvbm_pool *p = calloc(1, sizeof *p);
  if (!p) return kvbm_error_set(err, KVBM_ENOMEM, "pool: out of memory");
  p->cfg = *cfg;
  uint32_t n = cfg->num_blocks;
  /* Buckets for at most 2 entries each on average (of 7 slots). */
  uint64_t tsize = 2;
  unsigned tbits = 1;
  while (tsize * 2 < n) tsize <<= 1, tbits++;
  p->table_shift = 32 - tbits;
  p->table_mask = (uint32_t)(tsize - 1);
  p->blocks = calloc(n, sizeof *p->blocks);
  p->salts = calloc(n, sizeof *p->salts);
  if (!cfg->fill_only) p->tokens = calloc((size_t)n * cfg->block_size, sizeof *p->tokens);
  p->free_stack = malloc((size_t)n * sizeof *p->free_stack);
  p->ngroups = cfg->num_groups ? cfg->num_groups : 1;
  p->table = aligned_alloc(64, tsize * sizeof *p->table);
  const bool tabs_ok = p->table != NULL;
  if (p->ngroups > 1) p->group = calloc(n, sizeof *p->group);
  if (cfg->allow_duplicates) p->dup_next = malloc((size_t)n * sizeof *p->dup_next);
  /* where[]: the pools fill_run_plain and fill_groups_plain may serve (no
   * duplicates). */
  const bool placed = !cfg->allow_duplicates;
  if (placed) p->where = calloc(n, sizeof *p->where); /* zeros: the cursor may read a never-placed block's */
  if (!p->blocks || !p->salts || (!p->tokens && !cfg->fill_only) || !p->free_stack || !tabs_ok ||
      (p->ngroups > 1 && !p->group) || (cfg->allow_duplicates && !p->dup_next) || (placed && !p->where)) {
    kvbm_pool_destroy(p);
    return kvbm_error_set(err, KVBM_ENOMEM, "pool: out of memory for %u blocks", n);
  }
  memset(p->table, 0xff, tsize * sizeof *p->table); /* every id NIL */
  for (uint64_t i = 0; i < tsize; i++) p->table[i].overflow = 0;
  if (p->dup_next) memset(p->dup_next, 0xff, (size_t)n * sizeof *p->dup_next);
  for (unsigned i = 0; i < NPRIO; i++) p->head[i] = p->tail[i] = NIL;
  /* Push in reverse so that the first allocations get ids 0, 1, 2, ... */
  for (uint32_t i = n; i-- > 0;) free_push(p, i);
  *out = p;
  return KVBM_OK;
}

void kvbm_pool_destroy(kvbm_pool *pool) {
  if (!pool) return;
  free(pool->blocks);
  free(pool->salts);
  free(pool->tokens);
  free(pool->free_stack);
  free(pool->table);
  free(pool->where);
  free(pool->group);
  free(pool->dup_next);
  free(pool);
}

void kvbm_pool_set_listener(kvbm_pool *pool, kvbm_pool_listener fn, void *user) {
  pool->cfg.listener = fn;
  pool->cfg.listener_user = user;
}

void kvbm_pool_stats_get(const kvbm_pool *p, kvbm_pool_stats *s) {
  s->num_blocks = p->cfg.num_blocks;
  s->block_size = p->cfg.block_size;
  s->free = p->free_top;
  s->cached = p->cached;
  s->active = p->cfg.num_blocks - p->free_top - p->cached;
  s->registered = p->registered;
  s->allocated = p->allocated;
  s->evicted = p->evicted;
  s->dedup = p->dedup;
  s->match_hits = p->match_hits;
}

uint32_t kvbm_pool_available(const kvbm_pool *p) { return p->free_top + p->cached; }

int kvbm_pool_alloc_group(kvbm_pool *p, uint32_t group, uint32_t n, uint32_t *ids) {
  if ((n && !ids) || group >= p->ngroups) return KVBM_EINVAL;
  if (n > p->free_top + p->cached) return KVBM_ENOSPC;
  if (p->group)
    for (uint32_t i = 0; i < n; i++) ids[i] = take_block(p, true, group, false, false);
  else
    for (uint32_t i = 0; i < n; i++) ids[i] = take_block(p, false, 0, false, false);
  return KVBM_OK;
}

int kvbm_pool_alloc(kvbm_pool *p, uint32_t n, uint32_t *ids) {
  return kvbm_pool_alloc_group(p, 0, n, ids);
}

/* A match's reference on registered block `found` (NIL: none), its id
 * to *id. */
static int match_found(kvbm_pool *p, uint32_t found, uint32_t *id) {
  if (found == NIL) return KVBM_ENOTFOUND;
  acquire(p, found);
  p->match_hits++;
  if (id) *id = found;
  return KVBM_OK;
}

int kvbm_pool_match_group(kvbm_pool *p, uint32_t group, uint64_t seq_hash, uint32_t *id) {
  if (group >= p->ngroups) return KVBM_EINVAL;
  return match_found(p, reg_find(p, seq_hash, group, p->group != NULL), id);
}

int kvbm_pool_match(kvbm_pool *p, uint64_t seq_hash, uint32_t *id) {
  return match_found(p, reg_find(p, seq_hash, 0, p->group != NULL), id);
}

void kvbm__pool_prefetch(const kvbm_pool *p, uint64_t seq_hash) {
  (void)reg_key_prefetch(p, seq_hash, 0);
}

int kvbm__pool_match_id(kvbm_pool *p, uint32_t id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  if (p->blocks[id].state != KVBM_BLOCK_REGISTERED) return KVBM_ESTATE;
  return match_found(p, id, NULL);
}

bool kvbm_pool_contains(const kvbm_pool *p, uint64_t seq_hash) {
  return reg_find(p, seq_hash, 0, p->group != NULL) != NIL;
}

int kvbm_pool_peek_group(const kvbm_pool *p, uint32_t group, uint64_t seq_hash, uint32_t *id,
                         bool *cached) {
  if (group >= p->ngroups) return KVBM_EINVAL;
  uint32_t found = reg_find(p, seq_hash, group, p->group != NULL);
  if (found == NIL) return KVBM_ENOTFOUND;
  if (id) *id = found;
  if (cached) *cached = (p->blocks[found].flags & F_CACHED) != 0;
  return KVBM_OK;
}

uint32_t kvbm_pool_num_groups(const kvbm_pool *p) { return p->ngroups; }

size_t kvbm_pool_first_registered_group(const kvbm_pool *p, uint32_t group, const uint64_t *hashes,
                                        size_t n) {
  if (group >= p->ngroups || !hashes) return n;
  const bool grouped = p->group != NULL;
  for (size_t j = 0; j < n && j < AHEAD; j++) (void)reg_key_prefetch(p, hashes[j], group);
  for (size_t k = 0; k < n; k++) {
    if (k + AHEAD < n) (void)reg_key_prefetch(p, hashes[k + AHEAD], group);
    if (reg_find(p, hashes[k], group, grouped) != NIL) return k;
  }
  return n;
}

int kvbm_pool_peek(const kvbm_pool *p, uint64_t seq_hash, uint32_t *id, bool *cached) {
  uint32_t found = reg_find(p, seq_hash, 0, p->group != NULL);
  if (found == NIL) return KVBM_ENOTFOUND;
  if (id) *id = found;
  if (cached) *cached = (p->blocks[found].flags & F_CACHED) != 0;
  return KVBM_OK;
}

uint32_t kvbm_pool_block_size(const kvbm_pool *p) { return p->cfg.block_size; }
uint32_t kvbm_pool_num_blocks(const kvbm_pool *p) { return p->cfg.num_blocks; }
kvbm_hash_scheme kvbm_pool_scheme(const kvbm_pool *p) { return p->cfg.scheme; }
bool kvbm__pool_fill_only(const kvbm_pool *p) { return p->cfg.fill_only; }

int kvbm_pool_match_prefix(kvbm_pool *p, const uint64_t *hashes, size_t n,
                           uint32_t *ids, size_t *matched) {
  if ((n && (!hashes || !ids)) || !matched) return KVBM_EINVAL;
  size_t k = 0;
  while (k < n && kvbm_pool_match(p, hashes[k], &ids[k]) == KVBM_OK) k++;
  *matched = k;
  return KVBM_OK;
}

int kvbm_block_init(kvbm_pool *p, uint32_t id, uint64_t salt_hash, uint64_t parent,
                    bool has_parent) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  if (p->cfg.fill_only) return KVBM_EUNSUPPORTED; /* no token slots to build a block in */
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_RESET || b->refcount == 0) return KVBM_ESTATE;
  start_block(p, id, salt_hash, parent, has_parent);
  b->flags |= F_TOKENS;
  return KVBM_OK;
}

int kvbm_block_append(kvbm_pool *p, uint32_t id, const uint32_t *tokens, size_t n) {
  if (!valid_id(p, id) || (n && !tokens)) return KVBM_EINVAL;
  if (p->cfg.fill_only) return KVBM_EUNSUPPORTED;
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_PARTIAL) return KVBM_ESTATE;
  if (n > p->cfg.block_size - b->ntok) return KVBM_EOVERFLOW;
  if (n) memcpy(tokens_of(p, id) + b->ntok, tokens, n * sizeof *tokens); /* NULL, 0 is allowed */
  b->ntok = (uint16_t)(b->ntok + n);
  return KVBM_OK;
}

int kvbm_block_commit(kvbm_pool *p, uint32_t id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_PARTIAL || b->ntok != p->cfg.block_size) return KVBM_ESTATE;
  b->seq_hash = kvbm_hash_next(p->cfg.scheme, salt_of(p, id), b->parent_hash,
                               b->flags & F_HAS_PARENT, tokens_of(p, id), b->ntok);
  b->state = KVBM_BLOCK_COMPLETE;
  return KVBM_OK;
}

int kvbm_block_register_ctx(kvbm_pool *p, uint32_t id, void *context, uint32_t *out_id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  if (p->blocks[id].state != KVBM_BLOCK_COMPLETE) return KVBM_ESTATE;
  const bool grouped = p->group != NULL;
  uint32_t got = do_register(p, id, tokens_of(p, id), context,
                             rkey_of(p, p->blocks[id].seq_hash, gkey(p, id, grouped)), grouped, false, false);
  if (out_id) *out_id = got;
  return KVBM_OK;
}

int kvbm_block_register(kvbm_pool *p, uint32_t id, uint32_t *out_id) {
  return kvbm_block_register_ctx(p, id, NULL, out_id);
}

/* start + tokens + hash + register, checks done by the caller. Every
 * field of the record but the links and the count is written here, in one
 * go (a block taken by evict_oldest with `refill` was not reset). */
HOT uint32_t fill_one(kvbm_pool *p, uint32_t id, uint64_t salt_hash, uint64_t parent,
                         bool has_parent, const uint32_t *tokens, uint64_t seq_hash, rkey k,
                         void *context, const bool grouped, const bool absent, const bool quiet) {
  blk *b = &p->blocks[id];
  uint8_t flags = has_parent ? F_HAS_PARENT : 0;
  if (salt_hash) {
    p->salts[id] = salt_hash;
    flags |= F_SALTED;
  }
  if (p->cfg.keep_tokens) {
    memcpy(tokens_of(p, id), tokens, p->cfg.block_size * sizeof *tokens);
    flags |= F_TOKENS;
  }
  b->seq_hash = seq_hash;
  b->parent_hash = has_parent ? parent : 0;
  b->ntok = (uint16_t)p->cfg.block_size;
  b->state = KVBM_BLOCK_COMPLETE;
  b->flags = flags;
  return do_register(p, id, tokens, context, k, grouped, absent, quiet);
}

int kvbm_block_fill_ctx(kvbm_pool *p, uint32_t id, uint64_t salt_hash, uint64_t parent,
                        bool has_parent, const uint32_t *tokens, uint64_t seq_hash,
                        void *context, uint32_t *out_id) {
  if (!tokens || !valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_RESET || b->refcount == 0) return KVBM_ESTATE;
  const bool grouped = p->group != NULL;
  uint32_t got = fill_one(p, id, salt_hash, parent, has_parent, tokens, seq_hash,
                          rkey_of(p, seq_hash, gkey(p, id, grouped)), context, grouped, false, false);
  if (out_id) *out_id = got;
  return KVBM_OK;
}

int kvbm_block_fill(kvbm_pool *p, uint32_t id, uint64_t salt_hash, uint64_t parent,
                    bool has_parent, const uint32_t *tokens, uint64_t seq_hash,
                    uint32_t *out_id) {
  return kvbm_block_fill_ctx(p, id, salt_hash, parent, has_parent, tokens, seq_hash, NULL,
                             out_id);
}

int kvbm_pool_fill_run(kvbm_pool *p, uint64_t salt_hash, uint64_t parent, bool has_parent,
                       const uint32_t *tokens, const uint64_t *hashes, size_t n,
                       uint32_t *ids) {
  return kvbm_pool_fill_run_ctx(p, salt_hash, parent, has_parent, tokens, hashes, n, NULL, ids);
}

/* The loop of kvbm_pool_fill_run_group, compiled once per `grouped`. */
HOT void fill_run(kvbm_pool *p, uint32_t group, uint64_t salt_hash, uint64_t parent,
                  bool has_parent, const uint32_t *tokens, const uint64_t *hashes, size_t n,
                  void *context, uint32_t *ids, const bool grouped) {
  const size_t bs = p->cfg.block_size;
  for (size_t j = 0; j < n && j < AHEAD; j++) (void)reg_key_prefetch(p, hashes[j], group);
  for (size_t k = 0; k < n; k++) {
    if (k + AHEAD < n) (void)reg_key_prefetch(p, hashes[k + AHEAD], group);
    uint32_t id = take_block(p, grouped, group, true, false);
    ids[k] = fill_one(p, id, salt_hash, k ? hashes[k - 1] : parent, k ? true : has_parent,
                      tokens + k * bs, hashes[k], rkey_of(p, hashes[k], group), context, grouped, false,
                      false);
  }
}

/* The loop of kvbm__pool_fill_run_hashing (pool/pool_internal.h), once
 * per `grouped`: fill_run, with block k + AHEAD hashed (and its registry
 * bucket prefetched) in the iteration that fills block k. The hashes stay
 * a fixed distance ahead, so each bucket has had the work of AHEAD blocks
 * to arrive. */
HOT void fill_run_hashing(kvbm_pool *p, uint32_t group, uint64_t salt_hash, uint64_t parent,
                          bool has_parent, const uint32_t *tokens, uint64_t *hashes, size_t n,
                          void *context, uint32_t *ids, const bool grouped, const bool quiet) {
  const size_t bs = p->cfg.block_size;
  const kvbm_hash_scheme scheme = p->cfg.scheme;
  uint64_t h = parent;
  bool hp = has_parent;
  size_t hashed = 0;
  for (; hashed < n && hashed < AHEAD; hashed++, hp = true) {
    h = kvbm_hash_next(scheme, salt_hash, h, hp, tokens + hashed * bs, bs);
    hashes[hashed] = h;
    (void)reg_key_prefetch(p, h, group);
  }
  for (size_t k = 0; k < n; k++) {
    if (hashed < n) {
      h = kvbm_hash_next(scheme, salt_hash, h, true, tokens + hashed * bs, bs);
      hashes[hashed] = h;
      (void)reg_key_prefetch(p, h, group);
      hashed++;
    }
    uint32_t id = take_block(p, grouped, group, true, quiet);
    ids[k] = fill_one(p, id, salt_hash, k ? hashes[k - 1] : parent, k ? true : has_parent,
                      tokens + k * bs, hashes[k], rkey_of(p, hashes[k], group), context, grouped, false,
                      quiet);
  }
}

/* ---- the plain run ------------------------------------------------------- */

/* fill_run_hashing for the pool most callers have: one group, no listener,
 * no duplicate chains, no token copies (W1, and G1 under a manager whose
 * events go elsewhere). Same blocks, same order, same counts as the
 * general loop, which it replaces only for that case. What it does
 * differently, each measured with callgrind on `kvbm replay --limit 2000`
 * (see docs/areas/pool-speed.md):
 *  - the pool's fields in locals: the loop's byte stores (state, flags,
 *    priority) may alias any field of *p, so read through p they are
 *    loaded again for every block; the counters are summed in registers and
 *    stored once;
 *  - the block's record is written once, REGISTERED, with no COMPLETE
 *    step, and the hash's key (fingerprint, home bucket) computed once;
 *  - a victim's entry is cleared at its place (where[]), not searched for
 *    from its hash's home bucket;
 *  - the eviction list is walked PF_DEPTH blocks ahead of its head by a
 *    cursor: each eviction moves the cursor one block on and prefetches
 *    the registry bucket of the block under it (from where[]), so the
 *    victim's erase finds its bucket loaded PF_DEPTH evictions later
 *    instead of one.
 * A dedup (the hash already registered: rare in a replay) leaves the loop's
 * locals in *p and takes the general path for that block. The cursor is a
 * hint only: a cursor that went stale (a block in the window left the
 * cache through a dedup) prefetches the wrong lines, never reads out of
 * the records, and is dropped at the next dedup or list change. */
#define PF_DEPTH 8
/* How far ahead of its fill the plain loop hashes a block and prefetches
 * its bucket (AHEAD for the general loops). */
#define PLAIN_AHEAD 8

/* Removes the registry entry of block `id` (indexed, no duplicates) from
 * the chain that starts at bucket `home`. */
HOT void plain_erase(bucket *table, uint32_t mask, uint32_t home, uint32_t id) {
  for (uint32_t bi = home;; bi = (bi + 1) & mask) {
    bucket *b = &table[bi];
    unsigned m = bucket_match(b, id, 1);
    if (m) {
      b->id[__builtin_ctz(m)] = NIL;
      return;
    }
    b->overflow--; /* the entry went past this bucket */
  }
}

/* The block registered under `hash` in a pool without groups, or NIL
 * (reg_find_k with no group to compare). */
HOT uint32_t plain_find(const blk *blocks, const bucket *table, uint32_t mask, uint32_t fp,
                        uint32_t home, uint64_t hash) {
  for (uint32_t bi = home;; bi = (bi + 1) & mask) {
    const bucket *b = &table[bi];
    for (unsigned m = bucket_match(b, fp, 0); m; m &= m - 1) {
      uint32_t id = b->id[__builtin_ctz(m)];
      if (id != NIL && blocks[id].seq_hash == hash) return id;
    }
    if (!b->overflow) return NIL;
  }
}

/* reg_insert with the registry's table and mask from the caller's
 * registers rather than loaded through the pool, recording the entry's
 * place in where[id]. */
HOT void placed_insert(bucket *table, uint32_t *where, uint32_t mask, uint32_t fp, uint32_t home, uint32_t id) {
  for (uint32_t bi = home;; bi = (bi + 1) & mask) {
    bucket *b = &table[bi];
    const unsigned free = bucket_match(b, NIL, 1);
    if (free) {
      const unsigned i = (unsigned)__builtin_ctz(free);
      b->fp[i] = fp;
      b->id[i] = id;
      where[id] = where_of(bi, i, home);
      return;
    }
    b->overflow++;
  }
}

/* Registers block `id` under (hash, fp, home) in a pool without groups or
 * duplicate chains, unless the hash is registered already: then it
 * returns that block and changes nothing; else NIL (and where[id] says
 * where its entry went). The common case, no fingerprint of the hash in
 * its home bucket, nothing gone past it and a free entry there, reads the
 * bucket once for both the lookup and the insert (plain_find then
 * reg_insert read it twice, and reg_insert the table through the pool). */
HOT uint32_t plain_find_or_insert(const blk *blocks, bucket *table, uint32_t *where, uint32_t mask, uint32_t fp,
                                  uint32_t home, uint64_t hash, uint32_t id) {
  bucket *b = &table[home];
  if (!bucket_match(b, fp, 0) && !b->overflow) {
    const unsigned free = bucket_match(b, NIL, 1);
    if (free) {
      const unsigned i = (unsigned)__builtin_ctz(free);
      b->fp[i] = fp;
      b->id[i] = id;
      where[id] = home << 3 | i;
      return NIL;
    }
  }
  const uint32_t existing = plain_find(blocks, table, mask, fp, home, hash);
  if (existing == NIL) placed_insert(table, where, mask, fp, home, id);
  return existing;
}

/* One step of fill_run_plain's cursor: the registry bucket of its block
 * prefetched (from where[]: NIL, an entry past its home, prefetches a line
 * past the table, which never faults), and the cursor on the block after
 * it. The next step's read of that block's record is its load: a
 * prefetch of it one step earlier (dropped in session 19: W1 614.8M
 * against 623.2M instructions, time equal or 1% less side by side) came
 * too late to hide anything. Tried and dropped: keeping each
 * bucket's index in a ring for the victim's erase (callgrind, kvbm replay
 * --limit 2000: 774.0M -> 778.9M instructions; the ring's stores and index
 * cost more than hashing the victim again). */
#define PF_STEP()                                                                   \
  do {                                                                              \
    __builtin_prefetch((const char *)table + (size_t)(where[cursor] >> 3) * sizeof(bucket)); \
    cursor = blocks[cursor].next;                                                   \
  } while (0)

/* The cursor: PF_DEPTH blocks past the eviction list's head, NIL once it
 * has passed the list's end (it stays so until the list empties: the loop
 * only takes from the list), or CURSOR_RESTART when the loop starts, the
 * list changes or a dedup ran. After the head moved on by one to `next`
 * (not NIL) it moves one block on, or restarts from the new head and
 * walks PF_DEPTH blocks on at once (a stall for each, once per run). The
 * restart was a count of the blocks between the head and the cursor
 * before (session 19): one more live value in loops short of registers.
 * A macro, as PF_STEP: the two fill loops keep the cursor in a register. */
#define CURSOR_RESTART (NIL - 1)
_Static_assert(KVBM_POOL_MAX_BLOCKS < CURSOR_RESTART, "no block id is the cursor's restart mark");
#define CURSOR_ADVANCE(next)                                                        \
  do {                                                                              \
    if (cursor < CURSOR_RESTART) {                                                  \
      PF_STEP();                                                                    \
    } else if (cursor == CURSOR_RESTART) {                                          \
      cursor = (next);                                                              \
      for (unsigned d_ = 0; d_ < PF_DEPTH && cursor != NIL; d_++) PF_STEP();        \
    }                                                                               \
  } while (0)

/* The two plain loops' take: `id` off the free stack, or else the head
 * of the lowest non-empty cache list evicted. The list (pr) and its head
 * (vh) are found again only when it empties or after a dedup (vh == NIL):
 * only the loop's own evictions change the lists in between, so the head
 * lives in a register and p->head[pr] is written at a stop (HEAD_PREV),
 * not a load and a store through p an eviction (session 19). The victim's
 * prev link is left (HEAD_PREV clears the head's), the cursor moves on
 * (CURSOR_ADVANCE), and its registry entry is cleared at its place
 * (where[]) or, past its home, searched from the home of (its hash,
 * `vgroup`), its group. A macro, as CURSOR_ADVANCE: the loops keep
 * ftop, vh and the cursor in registers. The caller checked that enough
 * blocks are free or cached. */
#define PLAIN_TAKE(id, vgroup)                                                              \
  do {                                                                                      \
    if (ftop) {                                                                             \
      (id) = fstack[--ftop];                                                                \
      break;                                                                                \
    }                                                                                       \
    if (vh == NIL) {                                                                        \
      unsigned w_ = 0;                                                                      \
      while (!p->nonempty[w_]) w_++;                                                        \
      pr = w_ * 64 + (unsigned)__builtin_ctzll(p->nonempty[w_]);                            \
      vh = p->head[pr];                                                                     \
    }                                                                                       \
    (id) = vh;                                                                              \
    const blk *v_ = &blocks[(id)];                                                          \
    const uint32_t next_ = v_->next;                                                        \
    vh = next_;                                                                             \
    if (next_ != NIL) {                                                                     \
      CURSOR_ADVANCE(next_);                                                                \
    } else {                                                                                \
      p->head[pr] = p->tail[pr] = NIL;                                                      \
      p->nonempty[pr / 64] &= ~(1ull << (pr % 64));                                         \
      cursor = CURSOR_RESTART;                                                              \
    }                                                                                       \
    const uint32_t wv_ = where[(id)];                                                       \
    if (wv_ != NIL)                                                                         \
      table[wv_ >> 3].id[wv_ & 7] = NIL;                                                    \
    else                                                                                    \
      plain_erase(table, mask, (fingerprint(v_->seq_hash, (vgroup)) * 0x9E3779B1u) >> shift, (id)); \
  } while (0)

/* A record's last 8 bytes (refcount, ntok, priority, flags and state),
 * as the word one store writes them with: five stores a block become one,
 * and a block taken from a cache list of another priority needs no store
 * of its own to leave its priority at 0. */
_Static_assert(offsetof(blk, refcount) == 24 && sizeof(blk) == 32,
               "refcount, ntok, priority, flags and state are the record's last 8 bytes");
static inline uint64_t rec_tail8(uint32_t refcount, uint16_t ntok, uint8_t prio, uint8_t state, uint8_t flags) {
  blk t = {.refcount = refcount, .ntok = ntok, .prio = prio, .state = state, .flags = flags};
  uint64_t w;
  memcpy(&w, (const char *)&t + offsetof(blk, refcount), sizeof w);
  return w;
}

/* The flags byte of a word rec_tail8 made. */
static inline uint8_t rec_tail8_flags(uint64_t w) {
  blk t;
  memcpy((char *)&t + offsetof(blk, refcount), &w, sizeof w);
  return t.flags;
}

/* The loop keeps the list's head in vh and unlinks each victim without
 * clearing its successor's prev link (the successor is most often the
 * next victim): at a stop (a dedup, the run's end) the list gets its head
 * back and the head its prev link. vh NIL: no list taken from since the
 * last stop, or the list emptied (PLAIN_TAKE wrote its ends then). */
#define HEAD_PREV()                                                  \
  do {                                                               \
    if (vh != NIL) {                                                 \
      p->head[pr] = vh;                                              \
      blocks[vh].prev = NIL;                                         \
    }                                                                \
  } while (0)

HOT void fill_run_plain(kvbm_pool *p, uint64_t salt_hash, uint64_t parent, bool has_parent,
                        const uint32_t *tokens, uint64_t *hashes, size_t n, uint32_t *ids,
                        const kvbm_hash_scheme scheme, const uint32_t cbs, const bool salted) {
  const size_t bs = cbs ? cbs : p->cfg.block_size;
  blk *const blocks = p->blocks;
  bucket *const table = p->table;
  uint32_t *const where = p->where;
  const uint32_t *const fstack = p->free_stack;
  const uint32_t shift = p->table_shift, mask = p->table_mask;
  const uint32_t ftop0 = p->free_top;
  uint32_t ftop = ftop0, dedups = 0;
  uint32_t cursor = CURSOR_RESTART; /* see CURSOR_ADVANCE */
  unsigned pr = NPRIO;              /* the list evictions take from, while vh != NIL */
  uint32_t vh = NIL;                /* its head; NIL: find it */
  uint64_t h = parent;
  bool hp = has_parent;
  size_t hashed = 0;
  for (; hashed < n && hashed < PLAIN_AHEAD; hashed++, hp = true) {
    h = kvbm__hash_next_inline(scheme, salt_hash, h, hp, tokens + hashed * bs, bs);
    hashes[hashed] = h;
    __builtin_prefetch(&table[home_of(p, fingerprint(h, 0))]);
  }
  const uint32_t *tnext = tokens + hashed * bs; /* the next block to hash */
  /* Block k's parent (block k - 1's hash) and its flags as its record
   * holds them: only block 0 may have no parent, so they are set once
   * before the loop and changed once in it, with no test a block. */
  uint64_t pk = has_parent ? parent : 0;
  /* The last 8 bytes of a registered block's record, as one store, with
   * F_HAS_PARENT: block 0, the only one that may have no parent, has it
   * cleared after the loop (or on the dedup path). A constant of the
   * loop's instance where the block size and the salt are (the native
   * 16-token instances), so that it takes no register: the word it
   * replaces, or'ed with F_HAS_PARENT a block, was a load and a store of
   * the stack each (session 19). */
  const uint64_t tail8 = rec_tail8(1, (uint16_t)bs, 0, KVBM_BLOCK_REGISTERED,
                                   (uint8_t)(F_HAS_PARENT | (salted ? F_SALTED : 0) | F_INDEXED));
  bool dedup0 = false; /* block 0 deduplicated: ids[0] is another's block */
  for (size_t k = 0; k < n; k++) {
    if (k + PLAIN_AHEAD < n) { /* hashed == k + PLAIN_AHEAD */
      h = kvbm__hash_next_inline(scheme, salt_hash, h, true, tnext, bs);
      tnext += bs;
      hashes[k + PLAIN_AHEAD] = h;
      __builtin_prefetch(&table[(fingerprint(h, 0) * 0x9E3779B1u) >> shift]);
    }
    uint32_t id;
    PLAIN_TAKE(id, 0);
    ids[k] = id;
    blk *b = &blocks[id];
    const uint64_t hk = hashes[k];
    const uint32_t fp = fingerprint(hk, 0), home = (fp * 0x9E3779B1u) >> shift;
    if (salted) p->salts[id] = salt_hash;
    b->seq_hash = hk;
    b->parent_hash = pk;
    pk = hk;
    if (plain_find_or_insert(blocks, table, where, mask, fp, home, hk, id) != NIL) {
      /* Dedup: the general path, with the pool's fields back in *p; it
       * hands the new block back to the free list. */
      b->refcount = 1;
      b->ntok = (uint16_t)bs;
      b->state = KVBM_BLOCK_COMPLETE;
      b->flags = (uint8_t)(rec_tail8_flags(tail8) & ~F_INDEXED);
      dedup0 |= k == 0;
      HEAD_PREV();
      p->free_top = ftop;
      ids[k] = do_register(p, id, tokens + k * bs, NULL, (rkey){fp, home}, false, false, true);
      ftop = p->free_top;
      dedups++;
      vh = NIL;
      cursor = CURSOR_RESTART;
    } else {
      /* refcount 1, ntok, REGISTERED, flags | F_INDEXED (indexed by
       * plain_find_or_insert) */
      memcpy((char *)b + offsetof(blk, refcount), &tail8, sizeof tail8);
    }
  }
  /* The counts from what the loop had to track anyway: every block came
   * off the free list or was evicted, every dedup put one back on it, and
   * every block that did not dedup was registered. */
  HEAD_PREV();
  if (n && !has_parent && !dedup0) blocks[ids[0]].flags &= (uint8_t)~F_HAS_PARENT;
  const uint32_t evicted = (uint32_t)n - (ftop0 - ftop + dedups);
  p->free_top = ftop;
  p->cached -= evicted;
  p->evicted += evicted;
  p->registered += (uint32_t)n - dedups - evicted;
  p->allocated += n;
}

int kvbm__pool_fill_run_hashing(kvbm_pool *p, uint32_t group, uint64_t salt_hash, uint64_t parent,
                                bool has_parent, const uint32_t *tokens, uint64_t *hashes, size_t n,
                                void *context, uint32_t *ids) {
  if ((n && (!tokens || !hashes || !ids)) || group >= p->ngroups) return KVBM_EINVAL;
  if (n > kvbm_pool_available(p)) return KVBM_ENOSPC;
  const bool quiet = p->cfg.listener == NULL;
  const bool plain = !p->group && quiet && !p->dup_next && !p->cfg.keep_tokens;
  /* The plain loop is compiled once per scheme: the hash step is inlined
   * into it (hash/hash_inline.h) with the scheme a constant; and for the
   * native scheme once more with the block size a constant 16 (vLLM's
   * default, W1's), where XXH3's 64-byte case has no length tests and
   * the loop one register less (callgrind, kvbm replay --limit 2000:
   * 673.4M -> 650.2M instructions). kvbm_hash_chain, the W1 bound's
   * hashing, has the same instance (hash.c). That instance comes twice,
   * salted and not: the unsalted one (the usual request) has no salt
   * store and no test for it a block (626.9M -> 620.1M). */
  const bool salted = salt_hash != 0;
  if (plain && p->cfg.scheme == KVBM_HASH_DYNAMO)
    fill_run_plain(p, salt_hash, parent, has_parent, tokens, hashes, n, ids, KVBM_HASH_DYNAMO, 0, salted);
  else if (plain && p->cfg.block_size == 16 && !salted)
    fill_run_plain(p, 0, parent, has_parent, tokens, hashes, n, ids, KVBM_HASH_NATIVE, 16, false);
  else if (plain && p->cfg.block_size == 16)
    fill_run_plain(p, salt_hash, parent, has_parent, tokens, hashes, n, ids, KVBM_HASH_NATIVE, 16, true);
  else if (plain)
    fill_run_plain(p, salt_hash, parent, has_parent, tokens, hashes, n, ids, KVBM_HASH_NATIVE, 0, salted);
  else if (p->group && quiet)
    fill_run_hashing(p, group, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, true, true);
  else if (p->group)
    fill_run_hashing(p, group, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, true, false);
  else if (quiet)
    fill_run_hashing(p, 0, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, false, true);
  else
    fill_run_hashing(p, 0, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, false, false);
  return KVBM_OK;
}

/* The loop of kvbm_pool_fill_run_fresh: look the hash up first, stop if it
 * is registered, else take a block and register it without a second
 * lookup (taking a block only ever removes registry entries). */
HOT size_t fill_run_fresh(kvbm_pool *p, uint32_t group, uint64_t salt_hash, uint64_t parent,
                          bool has_parent, const uint32_t *tokens, const uint64_t *hashes, size_t n,
                          void *context, uint32_t *ids, const bool grouped, const bool quiet) {
  const size_t bs = p->cfg.block_size;
  for (size_t j = 0; j < n && j < AHEAD; j++) (void)reg_key_prefetch(p, hashes[j], group);
  size_t k = 0;
  for (; k < n; k++) {
    if (k + AHEAD < n) (void)reg_key_prefetch(p, hashes[k + AHEAD], group);
    const rkey kk = rkey_of(p, hashes[k], group);
    if (reg_find_k(p, hashes[k], group, kk, grouped) != NIL) break;
    uint32_t id = take_block(p, grouped, group, true, quiet);
    ids[k] = fill_one(p, id, salt_hash, k ? hashes[k - 1] : parent, k ? true : has_parent,
                      tokens + k * bs, hashes[k], kk, context, grouped, true, quiet);
  }
  return k;
}

int kvbm_pool_fill_run_fresh(kvbm_pool *p, uint32_t group, uint64_t salt_hash, uint64_t parent,
                             bool has_parent, const uint32_t *tokens, const uint64_t *hashes,
                             size_t n, void *context, uint32_t *ids, size_t *done) {
  if ((n && (!tokens || !hashes || !ids)) || !done || group >= p->ngroups) return KVBM_EINVAL;
  if (n > kvbm_pool_available(p)) return KVBM_ENOSPC;
  const bool quiet = p->cfg.listener == NULL;
  if (p->group && quiet)
    *done = fill_run_fresh(p, group, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, true, true);
  else if (p->group)
    *done = fill_run_fresh(p, group, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, true, false);
  else if (quiet)
    *done = fill_run_fresh(p, 0, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, false, true);
  else
    *done = fill_run_fresh(p, 0, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, false, false);
  return KVBM_OK;
}

/* ---- a hybrid request's step: every group at once ------------------------ */

/* fill_run_plain for a pool of groups (a hybrid model's G1 in W1-hybrid:
 * no listener, no duplicate chains, no token copies), filling the new
 * full blocks of a step in every group position by position
 * (kvbm__pool_fill_groups_fresh in pool/pool_internal.h): a position's
 * blocks in every group have the same hash, parent and tokens, so the
 * position is hashed once (PLAIN_AHEAD positions ahead, its buckets
 * prefetched then) and its groups registered one after the other. As in
 * fill_run_plain: the pool's fields in locals, the counters stored once,
 * and a cursor PF_DEPTH blocks down the eviction list prefetching each
 * victim's record and registry bucket (two evictions a position here, so
 * the cursor matters twice as much). Unlike it, a position whose hash is
 * registered in some group is not filled: the run stops there (the
 * caller goes on group by group, vLLM's order). */

/* The home bucket of (hash, group), as rkey_of computes it. */
HOT uint32_t ghome(uint64_t hash, uint32_t g, uint32_t shift) {
  return (fingerprint(hash, g) * 0x9E3779B1u) >> shift;
}

/* The block registered under (hash, g) in a pool of groups, or NIL. */
HOT uint32_t group_find(const blk *blocks, const uint8_t *grp, const bucket *table, uint32_t mask,
                        uint32_t fp, uint32_t home, uint64_t hash, uint32_t g) {
  for (uint32_t bi = home;; bi = (bi + 1) & mask) {
    const bucket *b = &table[bi];
    for (unsigned m = bucket_match(b, fp, 0); m; m &= m - 1) {
      uint32_t id = b->id[__builtin_ctz(m)];
      if (id != NIL && blocks[id].seq_hash == hash && grp[id] == g) return id;
    }
    if (!b->overflow) return NIL;
  }
}

/* Whether (hash, g) is registered for some g < ng. Group g's fingerprint
 * is group 0's xor g * 0x9E3779B9 (fingerprint()), so the hash is folded
 * once. */
HOT bool groups_any(const blk *blocks, const uint8_t *grp, const bucket *table, uint32_t mask, uint32_t shift,
                    uint64_t hash, const uint32_t ng) {
  const uint32_t fp0 = fingerprint(hash, 0);
#pragma GCC unroll 4
  for (uint32_t g = 0; g < ng; g++) {
    const uint32_t fp = fp0 ^ (g * 0x9E3779B9u);
    if (group_find(blocks, grp, table, mask, fp, (fp * 0x9E3779B1u) >> shift, hash, g) != NIL) return true;
  }
  return false;
}

/* fill_groups_plain's cursor steps as fill_run_plain's (PF_STEP: the
 * bucket from where[], whatever the block's group). */

/* The loop is fill_run_plain's, with a position's groups one after the
 * other inside it; what it keeps out of the per-block work, each measured
 * with callgrind (docs/areas/hybrid.md, "Speed, session 11"):
 *  - the list evictions take from is found once and kept until it
 *    empties (nothing else changes the lists during the run), not found
 *    again for every eviction;
 *  - the key of (hash, g) is recomputed where it is used from the hash's
 *    fold (a few ALU instructions) rather than kept in per-group arrays on
 *    the stack across the evictions;
 *  - the counts are derived once at the end (no dedup here: every block
 *    taken is registered, and the free stack's fall says how many were
 *    not evicted);
 *  - block 0's parent and flags are set once before the loop, as in
 *    fill_run_plain;
 *  - the loops over the groups unrolled (ng is a constant at the call
 *    that matters, 2): no loop counter and no multiply by g in a block's
 *    path (1,211.0M -> 1,173.2M instructions);
 *  - the hash step inlined (hash/hash_inline.h, as fill_run_plain), the
 *    loop compiled once per scheme, and for two groups and the native
 *    scheme once more with the block size a constant 16 (and that once
 *    more without a salt);
 *  - a victim's entry cleared at its place (where[], as fill_run_plain),
 *    and the cursor's prefetch of a bucket read from there: no victim
 *    hashed again, its group not read. */
HOT size_t fill_groups_plain(kvbm_pool *p, const uint32_t ng, const uint32_t nreg, uint64_t salt_hash,
                             uint64_t parent, bool has_parent, const uint32_t *tokens, uint64_t *hashes, size_t nhashed,
                             size_t n, uint32_t *const *tables, size_t *hashed_out,
                             const kvbm_hash_scheme scheme, const uint32_t cbs) {
  const size_t bs = cbs ? cbs : p->cfg.block_size;
  blk *const blocks = p->blocks;
  bucket *const table = p->table;
  uint8_t *const grp = p->group;
  uint32_t *const where = p->where;
  const uint32_t *const fstack = p->free_stack;
  const uint32_t shift = p->table_shift, mask = p->table_mask;
  const uint32_t ftop0 = p->free_top;
  uint32_t ftop = ftop0;
  uint32_t cursor = CURSOR_RESTART; /* see CURSOR_ADVANCE */
  unsigned pr = NPRIO;              /* the list evictions take from, while vh != NIL */
  uint32_t vh = NIL;                /* its head; NIL: find it */
  size_t hashed = nhashed < n ? nhashed : n;
  uint64_t h = hashed ? hashes[hashed - 1] : parent; /* the chain's last hash */
  bool hp = hashed ? true : has_parent;
  /* positions [0, PLAIN_AHEAD) hashed (where not given) and their buckets
   * prefetched; the loop then does position k + PLAIN_AHEAD at k */
  for (size_t j = 0; j < n && j < PLAIN_AHEAD; j++) {
    if (j >= hashed) {
      h = kvbm__hash_next_inline(scheme, salt_hash, h, hp, tokens + j * bs, bs);
      hashes[j] = h;
      hp = true;
      hashed = j + 1;
    }
    for (uint32_t g = 0; g < nreg; g++) __builtin_prefetch(&table[ghome(hashes[j], g, shift)]);
  }
  /* block k's parent and flags as its record holds them: only position 0
   * may lack a parent */
  uint64_t pk = has_parent ? parent : 0;
  const uint8_t fl = (uint8_t)(F_INDEXED | (salt_hash ? F_SALTED : 0));
  /* refcount 1, ntok, REGISTERED, flags: one store a block */
  uint64_t tail8 = rec_tail8(1, (uint16_t)bs, 0, KVBM_BLOCK_REGISTERED, (uint8_t)(fl | (has_parent ? F_HAS_PARENT : 0)));
  const uint64_t tail8_rest = rec_tail8(1, (uint16_t)bs, 0, KVBM_BLOCK_REGISTERED, (uint8_t)(fl | F_HAS_PARENT));
  const uint64_t tail8_alloc = rec_tail8(1, 0, 0, KVBM_BLOCK_RESET, 0);
  size_t k = 0;
  for (; k < n; k++, tail8 = tail8_rest) {
    const size_t j = k + PLAIN_AHEAD;
    if (j < n) {
      uint64_t hj;
      if (j >= hashed) { /* position j - 1 is hashed: it has a parent */
        h = kvbm__hash_next_inline(scheme, salt_hash, h, true, tokens + j * bs, bs);
        hashes[j] = h;
        hashed = j + 1;
        hj = h;
      } else {
        hj = hashes[j];
      }
      for (uint32_t g = 0; g < nreg; g++) __builtin_prefetch(&table[ghome(hj, g, shift)]);
    }
    const uint64_t hk = hashes[k];
    if (groups_any(blocks, grp, table, mask, shift, hk, nreg)) break; /* the caller's: vLLM's order */
    const uint32_t fp0 = fingerprint(hk, 0);
#pragma GCC unroll 4
    for (uint32_t g = 0; g < ng; g++) {
      uint32_t id;
      PLAIN_TAKE(id, grp[id]);
      tables[g][k] = id;
      blk *b = &blocks[id];
      if (g >= nreg) { /* taken only: held and RESET, as kvbm_pool_alloc_group leaves it */
        grp[id] = (uint8_t)g;
        b->seq_hash = b->parent_hash = 0;
        memcpy((char *)b + offsetof(blk, refcount), &tail8_alloc, sizeof tail8_alloc);
        continue;
      }
      if (salt_hash) p->salts[id] = salt_hash;
      grp[id] = (uint8_t)g;
      b->seq_hash = hk;
      b->parent_hash = pk;
      memcpy((char *)b + offsetof(blk, refcount), &tail8, sizeof tail8);
      const uint32_t fp = fp0 ^ (g * 0x9E3779B9u);
      placed_insert(table, where, mask, fp, (fp * 0x9E3779B1u) >> shift, id);
    }
    pk = hk;
  }
  HEAD_PREV();
  /* the blocks taken in the first nreg groups were registered; those not
   * off the free stack were evicted */
  const uint32_t taken = (uint32_t)(k * ng), evicted = taken - (ftop0 - ftop);
  p->free_top = ftop;
  p->cached -= evicted;
  p->evicted += evicted;
  p->registered = p->registered + k * nreg - evicted;
  p->allocated += taken;
  *hashed_out = hashed;
  return k;
}

int kvbm__pool_fill_groups_fresh(kvbm_pool *p, uint32_t ngroups, uint32_t nregister, uint64_t salt_hash,
                                 uint64_t parent, bool has_parent, const uint32_t *tokens, uint64_t *hashes,
                                 size_t nhashed, size_t n, uint32_t *const *tables, size_t *done, size_t *hashed) {
  if (!done || !hashed || ngroups == 0 || ngroups > p->ngroups || nregister == 0 || nregister > ngroups ||
      (n && (!tokens || !hashes || !tables)))
    return KVBM_EINVAL;
  for (uint32_t g = 0; n && g < ngroups; g++)
    if (!tables[g]) return KVBM_EINVAL;
  *done = 0;
  *hashed = nhashed < n ? nhashed : n;
  if (!p->group || !p->where || p->cfg.listener || p->dup_next || p->cfg.keep_tokens) return KVBM_EUNSUPPORTED;
  if ((uint64_t)n * ngroups > kvbm_pool_available(p)) return KVBM_ENOSPC;
  /* compiled for two groups (a full and a window group: gpt-oss) and for
   * any number, each once per scheme (the hash step inlined), and for two
   * groups of 16-token blocks (vLLM's default) with the native scheme,
   * salted and not: without a salt (the usual request: vLLM's cache_salt
   * is optional) the salt is a constant 0, so the loop keeps no salt in a
   * register and stores none (callgrind, the hybrid replay of
   * docs/areas/hybrid.md: 989.2M -> 959.5M instructions) */
  const bool dynamo = p->cfg.scheme == KVBM_HASH_DYNAMO;
  /* groups past nregister only take blocks (a window under sparse
   * retention); compiled for gpt-oss's two groups, 16-token blocks, the
   * native scheme and no salt, and for anything else */
  if (nregister < ngroups) {
    if (ngroups == 2 && !dynamo && p->cfg.block_size == 16 && !salt_hash)
      *done = fill_groups_plain(p, 2, 1, 0, parent, has_parent, tokens, hashes, nhashed, n, tables, hashed,
                                KVBM_HASH_NATIVE, 16);
    else if (!dynamo)
      *done = fill_groups_plain(p, ngroups, nregister, salt_hash, parent, has_parent, tokens, hashes, nhashed, n,
                                tables, hashed, KVBM_HASH_NATIVE, 0);
    else
      *done = fill_groups_plain(p, ngroups, nregister, salt_hash, parent, has_parent, tokens, hashes, nhashed, n,
                                tables, hashed, KVBM_HASH_DYNAMO, 0);
    return KVBM_OK;
  }
  if (ngroups == 2 && !dynamo && p->cfg.block_size == 16 && !salt_hash) /* no salt: a constant 0 */
    *done = fill_groups_plain(p, 2, 2, 0, parent, has_parent, tokens, hashes, nhashed, n, tables, hashed,
                              KVBM_HASH_NATIVE, 16);
  else if (ngroups == 2 && !dynamo && p->cfg.block_size == 16)
    *done = fill_groups_plain(p, 2, 2, salt_hash, parent, has_parent, tokens, hashes, nhashed, n, tables, hashed,
                              KVBM_HASH_NATIVE, 16);
  else if (ngroups == 2 && !dynamo)
    *done = fill_groups_plain(p, 2, 2, salt_hash, parent, has_parent, tokens, hashes, nhashed, n, tables, hashed,
                              KVBM_HASH_NATIVE, 0);
  else if (ngroups == 2)
    *done = fill_groups_plain(p, 2, 2, salt_hash, parent, has_parent, tokens, hashes, nhashed, n, tables, hashed,
                              KVBM_HASH_DYNAMO, 0);
  else if (!dynamo)
    *done = fill_groups_plain(p, ngroups, ngroups, salt_hash, parent, has_parent, tokens, hashes, nhashed, n,
                              tables, hashed, KVBM_HASH_NATIVE, 0);
  else
    *done = fill_groups_plain(p, ngroups, ngroups, salt_hash, parent, has_parent, tokens, hashes, nhashed, n,
                              tables, hashed, KVBM_HASH_DYNAMO, 0);
  return KVBM_OK;
}

/* ---- a hybrid request's decode token: one block in every group ---------- */

/* kvbm__pool_alloc_groups' loop, compiled per `grouped` and `quiet`. */
HOT void alloc_groups(kvbm_pool *p, uint32_t ng, uint32_t *const *slots, const bool grouped, const bool quiet) {
  for (uint32_t g = 0; g < ng; g++) *slots[g] = take_block(p, grouped, g, false, quiet);
}

int kvbm__pool_alloc_groups(kvbm_pool *p, uint32_t ngroups, uint32_t *const *slots) {
  if (!slots || ngroups == 0 || ngroups > p->ngroups) return KVBM_EINVAL;
  for (uint32_t g = 0; g < ngroups; g++)
    if (!slots[g]) return KVBM_EINVAL;
  if (ngroups > kvbm_pool_available(p)) return KVBM_ENOSPC;
  const bool quiet = p->cfg.listener == NULL;
  if (p->group && quiet)
    alloc_groups(p, ngroups, slots, true, true);
  else if (p->group)
    alloc_groups(p, ngroups, slots, true, false);
  else
    alloc_groups(p, ngroups, slots, false, quiet);
  return KVBM_OK;
}

/* kvbm__pool_fill_groups_one's loop, compiled per `grouped` and `quiet`. */
HOT void fill_groups_one(kvbm_pool *p, uint32_t ng, uint32_t *const *slots, uint64_t salt_hash, uint64_t parent,
                         bool has_parent, const uint32_t *tokens, uint64_t hash, const bool grouped,
                         const bool quiet) {
  for (uint32_t g = 0; g < ng; g++) {
    const uint32_t id = *slots[g];
    *slots[g] = fill_one(p, id, salt_hash, parent, has_parent, tokens, hash, rkey_of(p, hash, gkey(p, id, grouped)),
                         NULL, grouped, false, quiet);
  }
}

int kvbm__pool_fill_groups_one(kvbm_pool *p, uint32_t ngroups, uint32_t *const *slots, uint64_t salt_hash,
                               uint64_t parent, bool has_parent, const uint32_t *tokens, uint64_t hash) {
  if (!slots || !tokens || ngroups == 0 || ngroups > p->ngroups) return KVBM_EINVAL;
  /* every block held, RESET and named once (the check kvbm_pool_fill_ids
   * makes), before anything changes */
  for (uint32_t g = 0; g < ngroups; g++) {
    if (!slots[g] || !valid_id(p, *slots[g])) return KVBM_EINVAL;
    const blk *b = &p->blocks[*slots[g]];
    if (b->state != KVBM_BLOCK_RESET || b->refcount == 0) return KVBM_ESTATE;
    for (uint32_t e = 0; e < g; e++)
      if (*slots[e] == *slots[g]) return KVBM_EINVAL;
  }
  const bool quiet = p->cfg.listener == NULL;
  if (p->group && quiet)
    fill_groups_one(p, ngroups, slots, salt_hash, parent, has_parent, tokens, hash, true, true);
  else if (p->group)
    fill_groups_one(p, ngroups, slots, salt_hash, parent, has_parent, tokens, hash, true, false);
  else
    fill_groups_one(p, ngroups, slots, salt_hash, parent, has_parent, tokens, hash, false, quiet);
  return KVBM_OK;
}

int kvbm_pool_fill_run_group(kvbm_pool *p, uint32_t group, uint64_t salt_hash, uint64_t parent,
                             bool has_parent, const uint32_t *tokens, const uint64_t *hashes,
                             size_t n, void *context, uint32_t *ids) {
  if ((n && (!tokens || !hashes || !ids)) || group >= p->ngroups) return KVBM_EINVAL;
  if (n > kvbm_pool_available(p)) return KVBM_ENOSPC;
  if (p->group)
    fill_run(p, group, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, true);
  else
    fill_run(p, 0, salt_hash, parent, has_parent, tokens, hashes, n, context, ids, false);
  return KVBM_OK;
}

int kvbm_pool_fill_run_ctx(kvbm_pool *p, uint64_t salt_hash, uint64_t parent, bool has_parent,
                           const uint32_t *tokens, const uint64_t *hashes, size_t n,
                           void *context, uint32_t *ids) {
  return kvbm_pool_fill_run_group(p, 0, salt_hash, parent, has_parent, tokens, hashes, n, context,
                                  ids);
}

/* The loop of kvbm_pool_fill_ids, compiled once per `grouped`. */
HOT void fill_ids(kvbm_pool *p, uint32_t *ids, size_t n, uint64_t salt_hash, uint64_t parent,
                  bool has_parent, const uint32_t *tokens, const uint64_t *hashes, void *context,
                  const bool grouped) {
  const size_t bs = p->cfg.block_size;
  for (size_t j = 0; j < n && j < AHEAD; j++)
    (void)reg_key_prefetch(p, hashes[j], gkey(p, ids[j], grouped));
  for (size_t k = 0; k < n; k++) {
    if (k + AHEAD < n)
      (void)reg_key_prefetch(p, hashes[k + AHEAD], gkey(p, ids[k + AHEAD], grouped));
    ids[k] = fill_one(p, ids[k], salt_hash, k ? hashes[k - 1] : parent, k ? true : has_parent,
                      tokens + k * bs, hashes[k], rkey_of(p, hashes[k], gkey(p, ids[k], grouped)), context,
                      grouped, false, false);
  }
}

int kvbm_pool_fill_ids(kvbm_pool *p, uint32_t *ids, size_t n, uint64_t salt_hash, uint64_t parent,
                       bool has_parent, const uint32_t *tokens, const uint64_t *hashes,
                       void *context) {
  if (n && (!ids || !tokens || !hashes)) return KVBM_EINVAL;
  /* Every block must be RESET and held, and named once: each checked one
   * is marked PARTIAL (which fill_one sets anyway), so a repeated id fails
   * its check; on a failure the marks are undone. */
  for (size_t k = 0; k < n; k++) {
    int rc = !valid_id(p, ids[k]) ? KVBM_EINVAL
             : (p->blocks[ids[k]].state != KVBM_BLOCK_RESET || p->blocks[ids[k]].refcount == 0)
                 ? KVBM_ESTATE
                 : KVBM_OK;
    if (rc) {
      while (k-- > 0) p->blocks[ids[k]].state = KVBM_BLOCK_RESET;
      return rc;
    }
    p->blocks[ids[k]].state = KVBM_BLOCK_PARTIAL;
  }
  if (p->group)
    fill_ids(p, ids, n, salt_hash, parent, has_parent, tokens, hashes, context, true);
  else
    fill_ids(p, ids, n, salt_hash, parent, has_parent, tokens, hashes, context, false);
  return KVBM_OK;
}

int kvbm_block_abort(kvbm_pool *p, uint32_t id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_PARTIAL && b->state != KVBM_BLOCK_COMPLETE) return KVBM_ESTATE;
  block_reset(p, id);
  return KVBM_OK;
}

HOT int release_one(kvbm_pool *p, uint32_t id, uint8_t priority) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->refcount == 0) return KVBM_ESTATE;
  if (--b->refcount) return KVBM_OK;
  if (b->state == KVBM_BLOCK_REGISTERED) {
    b->prio = priority;
    cache_push(p, id);
  } else {
    free_push(p, id);
  }
  return KVBM_OK;
}

int kvbm_block_demote(kvbm_pool *p, uint32_t id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (!(b->flags & F_CACHED)) return KVBM_ESTATE;
  cache_unlink(p, id); /* priority 0 now */
  /* At the head of priority 0's list: the oldest of the lowest. */
  b->prev = NIL;
  b->next = p->head[0];
  if (p->head[0] != NIL)
    p->blocks[p->head[0]].prev = id;
  else
    p->tail[0] = id;
  p->head[0] = id;
  p->nonempty[0] |= 1ull;
  b->flags |= F_CACHED;
  p->cached++;
  return KVBM_OK;
}

/* Walks the cache in eviction order (the lists from the lowest priority
 * up, each from its head) and drops the blocks pred picks, as
 * evict_oldest drops its victim. The next block is read before pred runs,
 * since a dropped block's links are reset. */
uint32_t kvbm_pool_evict_where(kvbm_pool *p, uint32_t max,
                               bool (*pred)(void *user, uint32_t id, uint64_t seq_hash), void *user) {
  uint32_t n = 0;
  if (!p || !pred) return 0;
  for (unsigned pr = 0; pr < NPRIO && n < max; pr++) {
    if (!(p->nonempty[pr / 64] & (1ull << (pr % 64)))) continue;
    for (uint32_t id = p->head[pr], next; id != NIL && n < max; id = next) {
      next = p->blocks[id].next;
      uint64_t hash = p->blocks[id].seq_hash;
      if (!pred(user, id, hash)) continue;
      cache_unlink(p, id);
      unregister(p, id);
      p->evicted++;
      free_push(p, id);
      n++;
      if (p->cfg.listener) {
        kvbm_pool_event ev = {.kind = KVBM_POOL_REMOVED, .block_id = id, .seq_hash = hash,
                              .group = group_of(p, id)};
        notify(p, &ev);
      }
    }
  }
  return n;
}

int kvbm_block_release(kvbm_pool *p, uint32_t id, uint8_t priority) {
  return release_one(p, id, priority);
}

/* How many blocks ahead release_run prefetches a record. */
#define RELEASE_AHEAD 8

int kvbm_pool_release_run(kvbm_pool *p, const uint32_t *ids, size_t n, uint8_t priority) {
  if (n && !ids) return KVBM_EINVAL;
  /* Every block that joins the cache here goes to the tail of the same
   * list: keep that tail in a register and link the blocks one after the
   * other, storing the list's ends once at the end. */
  const unsigned pr = priority;
  uint32_t tail = p->tail[pr], pushed = 0;
  /* Where the next pushed block's id goes: the list tail's next link, or
   * the list's head when it is empty (one store a push, no test). */
  uint32_t *link = tail != NIL ? &p->blocks[tail].next : &p->head[pr];
  int rc = KVBM_OK;
  /* The arrays and the bound in locals: the loop's byte stores (priority,
   * flags) may alias any pool field, so read through p they were loaded
   * again for every block (callgrind, kvbm replay --limit 2000: release_run
   * 68.7M -> 59.9M instructions). */
  blk *const blocks = p->blocks;
  const uint32_t nblocks = p->cfg.num_blocks;
  const uintptr_t base = (uintptr_t)blocks;
  /* The usual block, registered, held once, priority 0 and not cached (as
   * every held block is), is told by its record's last 8 bytes (rec_tail8)
   * under one mask and cached by one add to them: reference 1 -> 0, the
   * priority and F_CACHED set. Its reference, state, flags and priority
   * were a load and a store each (callgrind, kvbm replay --limit 2000:
   * release_run 52.8M -> 45.8M instructions). */
  const uint64_t held_mask = rec_tail8(UINT32_MAX, 0, UINT8_MAX, 3, F_CACHED);
  const uint64_t held_once = rec_tail8(1, 0, 0, KVBM_BLOCK_REGISTERED, 0);
  const uint64_t to_cached = rec_tail8(0, 0, priority, 0, F_CACHED) - 1;
  for (size_t k = n; k-- > 0;) {
    /* Block records of a table are scattered: load a few ahead. */
    /* The address from integers, unchecked: a prefetch never faults, and
     * an id past the pool is refused below before any record is read. */
    if (k >= RELEASE_AHEAD)
      __builtin_prefetch((const void *)(base + (uintptr_t)ids[k - RELEASE_AHEAD] * sizeof(blk)));
    uint32_t id = ids[k];
    if (id >= nblocks) {
      rc = KVBM_EINVAL;
      break;
    }
    blk *b = &blocks[id];
    uint64_t w;
    memcpy(&w, (char *)b + offsetof(blk, refcount), sizeof w);
    if ((w & held_mask) == held_once) {
      w += to_cached;
      memcpy((char *)b + offsetof(blk, refcount), &w, sizeof w);
    } else {
      if (b->refcount == 0) {
        rc = KVBM_ESTATE;
        break;
      }
      if (--b->refcount) continue;
      if (b->state != KVBM_BLOCK_REGISTERED) {
        free_push(p, id);
        continue;
      }
      b->prio = priority;
      b->flags |= F_CACHED;
    }
    b->prev = tail; /* next: set by the next push, or after the loop */
    *link = id;
    link = &b->next;
    tail = id;
    pushed++;
  }
  if (pushed) {
    *link = NIL;
    p->tail[pr] = tail;
    p->nonempty[pr / 64] |= 1ull << (pr % 64);
    p->cached += pushed;
  }
  return rc;
}

int kvbm_block_retain(kvbm_pool *p, uint32_t id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->refcount == 0 && b->state != KVBM_BLOCK_REGISTERED) return KVBM_ESTATE;
  acquire(p, id);
  return KVBM_OK;
}

int kvbm_pool_clear_cache(kvbm_pool *p) {
  const bool all = p->registered == p->cached;
  uint32_t id;
  while ((id = cache_oldest(p)) != NIL) {
    kvbm_pool_event ev = {.kind = KVBM_POOL_REMOVED, .block_id = id,
                          .seq_hash = p->blocks[id].seq_hash, .group = group_of(p, id)};
    cache_unlink(p, id);
    unregister(p, id);
    free_push(p, id);
    if (!all) notify(p, &ev);
  }
  if (all) {
    kvbm_pool_event ev = {.kind = KVBM_POOL_CLEARED, .block_id = NIL};
    notify(p, &ev);
  }
  return KVBM_OK;
}

int kvbm_pool_evict(kvbm_pool *p, uint64_t seq_hash) {
  if (!p) return KVBM_EINVAL;
  uint32_t id = reg_find(p, seq_hash, 0, p->group != NULL);
  if (id == NIL) return KVBM_ENOTFOUND;
  if (!(p->blocks[id].flags & F_CACHED)) return KVBM_ESTATE;
  kvbm_pool_event ev = {.kind = KVBM_POOL_REMOVED, .block_id = id, .seq_hash = seq_hash,
                        .group = group_of(p, id)};
  cache_unlink(p, id);
  unregister(p, id);
  p->evicted++;
  free_push(p, id);
  notify(p, &ev);
  return KVBM_OK;
}

int kvbm_block_info_get(const kvbm_pool *p, uint32_t id, kvbm_block_info *out) {
  if (!valid_id(p, id) || !out) return KVBM_EINVAL;
  const blk *b = &p->blocks[id];
  out->state = (kvbm_block_state)b->state;
  out->refcount = b->refcount;
  out->num_tokens = b->ntok;
  out->seq_hash = b->seq_hash;
  out->parent_hash = b->parent_hash;
  out->has_parent = (b->flags & F_HAS_PARENT) != 0;
  out->salt_hash = salt_of(p, id);
  out->priority = b->prio;
  out->tokens = (b->flags & F_TOKENS) ? tokens_of(p, id) : NULL;
  out->group = group_of(p, id);
  return KVBM_OK;
}

void kvbm_pool_foreach_registered(const kvbm_pool *p,
                                  void (*fn)(void *user, uint32_t id, uint64_t seq_hash),
                                  void *user) {
  for (uint32_t id = 0; id < p->cfg.num_blocks; id++)
    if (p->blocks[id].state == KVBM_BLOCK_REGISTERED) fn(user, id, p->blocks[id].seq_hash);
}
