/*
 * pool.c: the block pool (see kvbm/pool.h for the state machine).
 *
 * Three structures, all sized at creation so that no operation allocates:
 *
 *  - blocks[]: one small record per block (state, reference count, hashes,
 *    links). Token slots live apart in one flat array, tokens[id * bs ...],
 *    so the records stay dense for the hot path.
 *  - the free list: a stack of empty (RESET, unreferenced) block ids. Order
 *    does not matter for an empty block, and a stack reuses the most recently
 *    touched memory first.
 *  - the cache: registered blocks nobody holds, in one doubly-linked list per
 *    priority (0..255), oldest release at the head. A 256-bit mask of the
 *    non-empty lists makes "lowest priority, least recently released" two
 *    word scans and a pointer read, i.e. O(1).
 *  - the registry: sequence hash -> block id, open addressing with linear
 *    probing at load <= 1/2 and backward-shift deletion (no tombstones, so
 *    long runs of insert/evict never degrade it). Sequence hashes are already
 *    uniform, but a caller can hand kvbm_block_fill() any value, so the slot
 *    is taken from a multiplicative mix of the hash rather than its low bits.
 */
#include "kvbm/pool.h"

#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define NPRIO 256

enum {
  F_HAS_PARENT = 1u << 0,
  F_CACHED = 1u << 1,   /* in a cache list */
  F_INDEXED = 1u << 2,  /* the registry points at this block */
};

typedef struct blk {
  uint64_t seq_hash;
  uint64_t parent_hash;
  uint64_t salt_hash;
  uint32_t prev, next;  /* cache list links */
  uint32_t refcount;
  uint32_t ntok;
  uint8_t state;
  uint8_t priority;
  uint8_t flags;
} blk;

typedef struct slot {
  uint64_t hash;
  uint32_t id; /* NIL: empty */
} slot;

struct kvbm_pool {
  kvbm_pool_config cfg;
  blk *blocks;
  uint32_t *tokens;
  uint32_t *free_stack;
  uint32_t free_top;
  uint32_t head[NPRIO], tail[NPRIO];
  uint64_t nonempty[NPRIO / 64];
  uint32_t cached;
  uint32_t registered;
  slot *table;
  uint32_t table_shift; /* 64 - log2(table size) */
  uint64_t table_mask;
  uint64_t allocated, evicted, dedup, match_hits;
};

/* ---- registry ---------------------------------------------------------- */

static inline uint64_t slot_of(const kvbm_pool *p, uint64_t hash) {
  return (hash * 0x9E3779B97F4A7C15ull) >> p->table_shift;
}

static uint32_t reg_find(const kvbm_pool *p, uint64_t hash) {
  for (uint64_t i = slot_of(p, hash);; i = (i + 1) & p->table_mask) {
    const slot *s = &p->table[i];
    if (s->id == NIL) return NIL;
    if (s->hash == hash) return s->id;
  }
}

static void reg_insert(kvbm_pool *p, uint64_t hash, uint32_t id) {
  uint64_t i = slot_of(p, hash);
  while (p->table[i].id != NIL) i = (i + 1) & p->table_mask;
  p->table[i].hash = hash;
  p->table[i].id = id;
}

/* Removes the entry of block `id` (with allow_duplicates, several blocks can
 * share a hash; each has its own entry, in registration order). */
static void reg_remove(kvbm_pool *p, uint64_t hash, uint32_t id) {
  uint64_t i = slot_of(p, hash);
  while (p->table[i].hash != hash || p->table[i].id != id) {
    if (p->table[i].id == NIL) return;
    i = (i + 1) & p->table_mask;
  }
  /* Backward shift: pull later entries of the run into the hole when their
   * home slot is not inside (hole, j]. */
  uint64_t hole = i;
  for (uint64_t j = (i + 1) & p->table_mask; p->table[j].id != NIL;
       j = (j + 1) & p->table_mask) {
    uint64_t home = slot_of(p, p->table[j].hash);
    bool movable = (hole <= j) ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      p->table[hole] = p->table[j];
      hole = j;
    }
  }
  p->table[hole].id = NIL;
}

/* ---- cache lists --------------------------------------------------------- */

static void cache_push(kvbm_pool *p, uint32_t id) {
  blk *b = &p->blocks[id];
  unsigned pr = b->priority;
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
  unsigned pr = b->priority;
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

static void block_reset(blk *b) {
  b->state = KVBM_BLOCK_RESET;
  b->ntok = 0;
  b->flags = 0;
  b->priority = 0;
  b->seq_hash = b->parent_hash = b->salt_hash = 0;
}

static void free_push(kvbm_pool *p, uint32_t id) {
  block_reset(&p->blocks[id]);
  p->blocks[id].refcount = 0;
  p->free_stack[p->free_top++] = id;
}

/* Drops a registered block from the registry and counts (not the lists). */
static void unregister(kvbm_pool *p, uint32_t id) {
  blk *b = &p->blocks[id];
  if (b->flags & F_INDEXED) reg_remove(p, b->seq_hash, id);
  p->registered--;
}

static void evict(kvbm_pool *p, uint32_t id) {
  blk *b = &p->blocks[id];
  cache_unlink(p, id);
  unregister(p, id);
  kvbm_pool_event ev = {.kind = KVBM_POOL_REMOVED, .block_id = id, .seq_hash = b->seq_hash};
  p->evicted++;
  block_reset(b);
  notify(p, &ev);
}

static inline bool valid_id(const kvbm_pool *p, uint32_t id) {
  return id < p->cfg.num_blocks;
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
  return c;
}

int kvbm_pool_create(const kvbm_pool_config *cfg, kvbm_pool **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "pool: config and out must not be NULL");
  if (cfg->num_blocks == 0 || cfg->num_blocks >= (1u << 31))
    return kvbm_error_set(err, KVBM_EINVAL, "pool: num_blocks %u is not in [1, 2^31)", cfg->num_blocks);
  if (cfg->block_size == 0 || cfg->block_size > (1u << 16))
    return kvbm_error_set(err, KVBM_EINVAL, "pool: block_size %u is not in [1, 65536]", cfg->block_size);
  if (cfg->scheme != KVBM_HASH_NATIVE && cfg->scheme != KVBM_HASH_DYNAMO)
    return kvbm_error_set(err, KVBM_EINVAL, "pool: unknown hash scheme %d", (int)cfg->scheme);

  kvbm_pool *p = calloc(1, sizeof *p);
  if (!p) return kvbm_error_set(err, KVBM_ENOMEM, "pool: out of memory");
  p->cfg = *cfg;
  uint32_t n = cfg->num_blocks;
  uint64_t tsize = 4;
  unsigned tbits = 2;
  while (tsize < 2ull * n) tsize <<= 1, tbits++;
  p->table_shift = 64 - tbits;
  p->table_mask = tsize - 1;
  p->blocks = calloc(n, sizeof *p->blocks);
  p->tokens = calloc((size_t)n * cfg->block_size, sizeof *p->tokens);
  p->free_stack = malloc((size_t)n * sizeof *p->free_stack);
  p->table = malloc(tsize * sizeof *p->table);
  if (!p->blocks || !p->tokens || !p->free_stack || !p->table) {
    kvbm_pool_destroy(p);
    return kvbm_error_set(err, KVBM_ENOMEM, "pool: out of memory for %u blocks", n);
  }
  for (uint64_t i = 0; i < tsize; i++) p->table[i].id = NIL;
  for (unsigned i = 0; i < NPRIO; i++) p->head[i] = p->tail[i] = NIL;
  /* Push in reverse so that the first allocations get ids 0, 1, 2, ... */
  for (uint32_t i = n; i-- > 0;) free_push(p, i);
  *out = p;
  return KVBM_OK;
}

void kvbm_pool_destroy(kvbm_pool *pool) {
  if (!pool) return;
  free(pool->blocks);
  free(pool->tokens);
  free(pool->free_stack);
  free(pool->table);
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

int kvbm_pool_alloc(kvbm_pool *p, uint32_t n, uint32_t *ids) {
  if (n && !ids) return KVBM_EINVAL;
  if (n > p->free_top + p->cached) return KVBM_ENOSPC;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t id;
    if (p->free_top) {
      id = p->free_stack[--p->free_top];
    } else {
      id = cache_oldest(p);
      evict(p, id);
    }
    p->blocks[id].refcount = 1;
    ids[i] = id;
  }
  p->allocated += n;
  return KVBM_OK;
}

/* Takes a reference on a registered block, reactivating it if cached. */
static void acquire(kvbm_pool *p, uint32_t id) {
  blk *b = &p->blocks[id];
  if (b->flags & F_CACHED) cache_unlink(p, id);
  b->refcount++;
}

int kvbm_pool_match(kvbm_pool *p, uint64_t seq_hash, uint32_t *id) {
  uint32_t found = reg_find(p, seq_hash);
  if (found == NIL) return KVBM_ENOTFOUND;
  acquire(p, found);
  p->match_hits++;
  if (id) *id = found;
  return KVBM_OK;
}

bool kvbm_pool_contains(const kvbm_pool *p, uint64_t seq_hash) {
  return reg_find(p, seq_hash) != NIL;
}

int kvbm_pool_peek(const kvbm_pool *p, uint64_t seq_hash, uint32_t *id, bool *cached) {
  uint32_t found = reg_find(p, seq_hash);
  if (found == NIL) return KVBM_ENOTFOUND;
  if (id) *id = found;
  if (cached) *cached = (p->blocks[found].flags & F_CACHED) != 0;
  return KVBM_OK;
}

uint32_t kvbm_pool_block_size(const kvbm_pool *p) { return p->cfg.block_size; }
uint32_t kvbm_pool_num_blocks(const kvbm_pool *p) { return p->cfg.num_blocks; }
kvbm_hash_scheme kvbm_pool_scheme(const kvbm_pool *p) { return p->cfg.scheme; }

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
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_RESET || b->refcount == 0) return KVBM_ESTATE;
  b->state = KVBM_BLOCK_PARTIAL;
  b->salt_hash = salt_hash;
  b->parent_hash = has_parent ? parent : 0;
  b->flags = has_parent ? F_HAS_PARENT : 0;
  b->ntok = 0;
  return KVBM_OK;
}

int kvbm_block_append(kvbm_pool *p, uint32_t id, const uint32_t *tokens, size_t n) {
  if (!valid_id(p, id) || (n && !tokens)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_PARTIAL) return KVBM_ESTATE;
  if (n > p->cfg.block_size - b->ntok) return KVBM_EOVERFLOW;
  memcpy(p->tokens + (size_t)id * p->cfg.block_size + b->ntok, tokens, n * sizeof *tokens);
  b->ntok += (uint32_t)n;
  return KVBM_OK;
}

int kvbm_block_commit(kvbm_pool *p, uint32_t id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_PARTIAL || b->ntok != p->cfg.block_size) return KVBM_ESTATE;
  b->seq_hash = kvbm_hash_next(p->cfg.scheme, b->salt_hash, b->parent_hash,
                               b->flags & F_HAS_PARENT,
                               p->tokens + (size_t)id * p->cfg.block_size, b->ntok);
  b->state = KVBM_BLOCK_COMPLETE;
  return KVBM_OK;
}

int kvbm_block_register(kvbm_pool *p, uint32_t id, uint32_t *out_id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_COMPLETE) return KVBM_ESTATE;
  uint32_t existing = reg_find(p, b->seq_hash);
  if (existing != NIL && !p->cfg.allow_duplicates) {
    /* Dedup: our holder switches to the registered block. */
    p->dedup++;
    acquire(p, existing);
    if (--b->refcount == 0) free_push(p, id);
    else block_reset(b); /* other holders keep an empty block */
    if (out_id) *out_id = existing;
    return KVBM_OK;
  }
  if (existing != NIL) p->dedup++;
  b->state = KVBM_BLOCK_REGISTERED;
  /* A duplicate gets its own entry too, behind the first one's in the probe
   * run: lookups still find the first, and the duplicate once it is gone. */
  reg_insert(p, b->seq_hash, id);
  b->flags |= F_INDEXED;
  p->registered++;
  if (out_id) *out_id = id;
  kvbm_pool_event ev = {
      .kind = KVBM_POOL_STORED,
      .block_id = id,
      .seq_hash = b->seq_hash,
      .parent_hash = b->parent_hash,
      .has_parent = (b->flags & F_HAS_PARENT) != 0,
      .salt_hash = b->salt_hash,
      .tokens = p->tokens + (size_t)id * p->cfg.block_size,
      .num_tokens = b->ntok,
  };
  notify(p, &ev);
  return KVBM_OK;
}

int kvbm_block_fill(kvbm_pool *p, uint32_t id, uint64_t salt_hash, uint64_t parent,
                    bool has_parent, const uint32_t *tokens, uint64_t seq_hash,
                    uint32_t *out_id) {
  if (!tokens) return KVBM_EINVAL;
  int rc = kvbm_block_init(p, id, salt_hash, parent, has_parent);
  if (rc) return rc;
  blk *b = &p->blocks[id];
  memcpy(p->tokens + (size_t)id * p->cfg.block_size, tokens,
         p->cfg.block_size * sizeof *tokens);
  b->ntok = p->cfg.block_size;
  b->seq_hash = seq_hash;
  b->state = KVBM_BLOCK_COMPLETE;
  return kvbm_block_register(p, id, out_id);
}

int kvbm_block_abort(kvbm_pool *p, uint32_t id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->state != KVBM_BLOCK_PARTIAL && b->state != KVBM_BLOCK_COMPLETE) return KVBM_ESTATE;
  block_reset(b);
  return KVBM_OK;
}

int kvbm_block_release(kvbm_pool *p, uint32_t id, uint8_t priority) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->refcount == 0) return KVBM_ESTATE;
  if (--b->refcount) return KVBM_OK;
  if (b->state == KVBM_BLOCK_REGISTERED) {
    b->priority = priority;
    cache_push(p, id);
  } else {
    free_push(p, id);
  }
  return KVBM_OK;
}

int kvbm_block_retain(kvbm_pool *p, uint32_t id) {
  if (!valid_id(p, id)) return KVBM_EINVAL;
  blk *b = &p->blocks[id];
  if (b->refcount == 0 && b->state != KVBM_BLOCK_REGISTERED) return KVBM_ESTATE;
  acquire(p, id);
  return KVBM_OK;
}

int kvbm_pool_clear_cache(kvbm_pool *p) {
  uint32_t id;
  while ((id = cache_oldest(p)) != NIL) {
    cache_unlink(p, id);
    unregister(p, id);
    free_push(p, id);
  }
  kvbm_pool_event ev = {.kind = KVBM_POOL_CLEARED, .block_id = NIL};
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
  out->salt_hash = b->salt_hash;
  out->priority = b->priority;
  out->tokens = p->tokens + (size_t)id * p->cfg.block_size;
  return KVBM_OK;
}

void kvbm_pool_foreach_registered(const kvbm_pool *p,
                                  void (*fn)(void *user, uint32_t id, uint64_t seq_hash),
                                  void *user) {
  for (uint32_t id = 0; id < p->cfg.num_blocks; id++)
    if (p->blocks[id].state == KVBM_BLOCK_REGISTERED) fn(user, id, p->blocks[id].seq_hash);
}
