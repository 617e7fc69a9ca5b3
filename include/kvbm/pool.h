/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/pool.h: the block pool of one tier.
 *
 * A pool owns `num_blocks` blocks of `block_size` token slots, numbered
 * 0..num_blocks-1 (the block id is also the block's index in the tier's
 * layout). Each block moves through the states of Dynamo's KVBM:
 *
 *   RESET --init--> PARTIAL --append..full, commit--> COMPLETE --register--> REGISTERED
 *     ^                |                                  |                      |
 *     +------abort-----+----------------abort-------------+   last release, then |
 *     +-------------------------------- evicted (BlockRemoved) ------------------+
 *
 * (alloc hands out RESET blocks with one reference; releasing the last
 * reference of a block that is not REGISTERED returns it to the free list.)
 *
 * Any other transition is KVBM_ESTATE. A REGISTERED block is visible to
 * prefix matching under its sequence hash (kvbm/hash.h) and may be held by
 * several requests at once (a reference count). When its last holder
 * releases it, it stays REGISTERED but *inactive* (cached): still matchable,
 * and evictable.
 *
 * Allocation takes an empty block (the free list) first; only when there is
 * none does it evict a cached block: the lowest priority first, then the
 * least recently released (a request releases tail first, so its tail block
 * goes first). Matching a cached block makes it active again.
 *
 * Registering a block whose sequence hash is already registered deduplicates
 * (the default, and W1's rule): the new block goes back to the free list and
 * the caller gets the registered block, with a reference taken. With
 * `allow_duplicates` both stay registered (Dynamo's option); the registry
 * then resolves the hash to the first one.
 *
 * Cost: every operation is O(1) per block (O(n) for n blocks) and none
 * allocates memory: everything is sized at creation.
 *
 * Groups: a pool may serve several KV cache groups (a hybrid model's full
 * attention, sliding window, Mamba layers: kvbm/group.h) from one block
 * budget, as vLLM's one BlockPool does. A block belongs to the group it was
 * allocated for (kvbm_pool_alloc_group, kvbm_pool_fill_run_group) and is
 * registered and matched under (sequence hash, group): the same hash in two
 * groups is two blocks, and a lookup in group g never finds group h's
 * block. Free blocks and the cache are shared: eviction takes the oldest
 * cached block of any group. Events carry the block's group. The calls
 * without _group act on group 0, so a pool of one group (the default)
 * behaves, and costs, as it always did.
 *
 * Threads: a pool is not thread-safe; one thread (or a caller-held lock)
 * drives it. The listener is called synchronously, on that thread.
 */
#ifndef KVBM_POOL_H
#define KVBM_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/hash.h"
#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvbm_pool kvbm_pool;

typedef enum kvbm_block_state {
  KVBM_BLOCK_RESET = 0,
  KVBM_BLOCK_PARTIAL = 1,
  KVBM_BLOCK_COMPLETE = 2,
  KVBM_BLOCK_REGISTERED = 3,
} kvbm_block_state;

KVBM_EXTERN const char *kvbm_block_state_name(kvbm_block_state s);

/* What the pool tells its listener, in the order it happens. */
typedef enum kvbm_pool_event_kind {
  KVBM_POOL_STORED = 0,  /* a block was registered (not on dedup) */
  KVBM_POOL_REMOVED = 1, /* a registered block was evicted or reset */
  KVBM_POOL_CLEARED = 2, /* every cached block was dropped at once */
} kvbm_pool_event_kind;

typedef struct kvbm_pool_event {
  kvbm_pool_event_kind kind;
  uint32_t block_id;
  uint64_t seq_hash;          /* STORED, REMOVED */
  uint64_t parent_hash;       /* STORED: valid when has_parent */
  bool has_parent;
  uint64_t salt_hash;         /* STORED */
  const uint32_t *tokens;     /* STORED: the block's tokens, valid during the call */
  uint32_t num_tokens;        /* STORED: == block_size */
  void *context;              /* STORED: the context of the registering call
                                 (the *_ctx functions, or a sequence's, see
                                 kvbm_seq_set_context); NULL otherwise */
  uint32_t group;             /* STORED, REMOVED: the block's group (0 in a
                                 pool of one group): vLLM's group_idx */
} kvbm_pool_event;

/* Must not call back into the pool. */
typedef void (*kvbm_pool_listener)(void *user, const kvbm_pool_event *ev);

#define KVBM_POOL_MAX_BLOCKS (1u << 30)
#define KVBM_POOL_MAX_BLOCK_SIZE 65535u
#define KVBM_POOL_MAX_GROUPS 16u /* == KVBM_GROUPS_MAX of kvbm/group.h */

typedef struct kvbm_pool_config {
  uint32_t num_blocks;        /* 1 .. KVBM_POOL_MAX_BLOCKS */
  uint32_t block_size;        /* tokens per block, 1 .. KVBM_POOL_MAX_BLOCK_SIZE */
  kvbm_hash_scheme scheme;    /* how commit computes sequence hashes */
  bool allow_duplicates;      /* false: dedup on register (default) */
  bool keep_tokens;           /* keep a copy of the tokens of blocks filled by
                                 kvbm_block_fill / kvbm_pool_fill_run, and of
                                 the whole blocks a sequence's prefill or
                                 kvbm_seq_append fills from a block edge
                                 (default true); blocks built by
                                 kvbm_block_append always keep theirs.
                                 Without it block_info.tokens is NULL for
                                 filled blocks. */
  bool fill_only;             /* blocks are only ever filled whole
                                 (kvbm_block_fill / kvbm_pool_fill_run),
                                 never built by init/append/commit: the pool
                                 then keeps no token slots at all (4 *
                                 block_size bytes a block), and
                                 kvbm_block_init / kvbm_block_append are
                                 KVBM_EUNSUPPORTED. Needs keep_tokens false
                                 (default false). A lower tier's index (G2,
                                 G3) is such a pool. */
  uint32_t num_groups;        /* KV cache groups sharing the blocks, 0..16
                                 (0 and 1 both mean one group, the default);
                                 with groups, one byte a block more */
  kvbm_pool_listener listener;/* optional */
  void *listener_user;
} kvbm_pool_config;

/* A config with defaults: the given sizes, native hashes, dedup, tokens
 * kept, no listener. */
KVBM_EXTERN kvbm_pool_config kvbm_pool_config_default(uint32_t num_blocks, uint32_t block_size);

/* Creates a pool; all its memory is allocated here. *out is set on success
 * and must be released with kvbm_pool_destroy(). */
KVBM_EXTERN int kvbm_pool_create(const kvbm_pool_config *cfg, kvbm_pool **out, kvbm_error *err);
KVBM_EXTERN void kvbm_pool_destroy(kvbm_pool *pool); /* NULL is a no-op */

/* Replaces the listener (NULL to remove). */
KVBM_EXTERN void kvbm_pool_set_listener(kvbm_pool *pool, kvbm_pool_listener fn, void *user);

/* Counts. free = empty blocks; cached = registered and inactive; active =
 * the rest (held by someone). free + cached + active == num_blocks. */
typedef struct kvbm_pool_stats {
  uint32_t num_blocks, block_size;
  uint32_t free, cached, active, registered;
  uint64_t allocated;  /* blocks handed out by alloc, ever */
  uint64_t evicted;    /* cached blocks evicted to satisfy alloc */
  uint64_t dedup;      /* registers that found the hash already registered */
  uint64_t match_hits; /* blocks returned by match */
} kvbm_pool_stats;
KVBM_EXTERN void kvbm_pool_stats_get(const kvbm_pool *pool, kvbm_pool_stats *out);

/* Blocks alloc could hand out now: free + cached. */
KVBM_EXTERN uint32_t kvbm_pool_available(const kvbm_pool *pool);

/* The number of groups (1 unless configured with more). */
KVBM_EXTERN uint32_t kvbm_pool_num_groups(const kvbm_pool *pool);

/* The group calls: as kvbm_pool_alloc, kvbm_pool_match, kvbm_pool_peek and
 * kvbm_pool_fill_run_ctx, for group `group` (KVBM_EINVAL when group >=
 * kvbm_pool_num_groups, with no change). A block allocated for a group is
 * registered in that group's registry by whatever fills or registers it
 * (kvbm_block_fill, kvbm_block_register...). Eviction to satisfy an
 * allocation takes the oldest cached block of any group. Same cost as the
 * calls without _group. */
KVBM_EXTERN int kvbm_pool_alloc_group(kvbm_pool *pool, uint32_t group, uint32_t n, uint32_t *ids);
KVBM_EXTERN int kvbm_pool_match_group(kvbm_pool *pool, uint32_t group, uint64_t seq_hash,
                                      uint32_t *id);
KVBM_EXTERN int kvbm_pool_peek_group(const kvbm_pool *pool, uint32_t group, uint64_t seq_hash,
                                     uint32_t *id, bool *cached);
/* As kvbm_pool_fill_run_group, but stops before the first block whose
 * hash is registered in `group` already, before taking a block for it:
 * *done says how many blocks were filled (ids[0..*done)), none of them by
 * dedup. For an engine that registers a step's blocks in vLLM's order
 * (every allocation first) when a dedup could change what the step
 * evicts, and block by block, faster, up to that point. KVBM_ENOSPC with
 * no change when fewer than n blocks are available. */
KVBM_EXTERN int kvbm_pool_fill_run_fresh(kvbm_pool *pool, uint32_t group, uint64_t salt_hash,
                                         uint64_t parent, bool has_parent, const uint32_t *tokens,
                                         const uint64_t *hashes, size_t n, void *context,
                                         uint32_t *ids, size_t *done);

/* The index of the first of hashes[0..n) registered in `group`, or n when
 * none is (n too for a group past the list). Takes no reference. Cost: one
 * registry lookup per hash, the next ones loaded ahead. */
KVBM_EXTERN size_t kvbm_pool_first_registered_group(const kvbm_pool *pool, uint32_t group,
                                                    const uint64_t *hashes, size_t n);
KVBM_EXTERN int kvbm_pool_fill_run_group(kvbm_pool *pool, uint32_t group, uint64_t salt_hash,
                                         uint64_t parent, bool has_parent, const uint32_t *tokens,
                                         const uint64_t *hashes, size_t n, void *context,
                                         uint32_t *ids);

/* Allocates `n` RESET blocks into ids[0..n), each with one reference; all or
 * nothing: KVBM_ENOSPC (and no change) when fewer than n are available.
 * Evicted cached blocks are reported as REMOVED. */
KVBM_EXTERN int kvbm_pool_alloc(kvbm_pool *pool, uint32_t n, uint32_t *ids);

/* Looks up a registered block by sequence hash. On a hit takes a reference
 * (reactivating a cached block), stores its id and returns KVBM_OK; returns
 * KVBM_ENOTFOUND otherwise. */
KVBM_EXTERN int kvbm_pool_match(kvbm_pool *pool, uint64_t seq_hash, uint32_t *id);

/* Whether a hash is registered, without taking a reference. */
KVBM_EXTERN bool kvbm_pool_contains(const kvbm_pool *pool, uint64_t seq_hash);

/* Looks up a registered block without taking a reference: its id, and
 * whether it is cached (inactive). KVBM_ENOTFOUND when not registered. */
KVBM_EXTERN int kvbm_pool_peek(const kvbm_pool *pool, uint64_t seq_hash, uint32_t *id, bool *cached);

KVBM_EXTERN uint32_t kvbm_pool_block_size(const kvbm_pool *pool);
KVBM_EXTERN uint32_t kvbm_pool_num_blocks(const kvbm_pool *pool);
KVBM_EXTERN kvbm_hash_scheme kvbm_pool_scheme(const kvbm_pool *pool);

/* Matches the longest prefix of hashes[0..n): stops at the first miss,
 * takes a reference on each matched block, writes their ids and returns how
 * many matched (0..n) in *matched. */
KVBM_EXTERN int kvbm_pool_match_prefix(kvbm_pool *pool, const uint64_t *hashes, size_t n,
                           uint32_t *ids, size_t *matched);

/* RESET -> PARTIAL: starts a block as the successor of `parent` (when
 * has_parent) under salt `salt_hash`. KVBM_EUNSUPPORTED in a fill_only
 * pool (as is append). */
KVBM_EXTERN int kvbm_block_init(kvbm_pool *pool, uint32_t id, uint64_t salt_hash,
                    uint64_t parent, bool has_parent);

/* PARTIAL: appends tokens; KVBM_EOVERFLOW (and no change) beyond block_size. */
KVBM_EXTERN int kvbm_block_append(kvbm_pool *pool, uint32_t id, const uint32_t *tokens, size_t n);

/* PARTIAL and full -> COMPLETE: computes the sequence hash. A block that is
 * not full is KVBM_ESTATE. */
KVBM_EXTERN int kvbm_block_commit(kvbm_pool *pool, uint32_t id);

/* COMPLETE -> REGISTERED. *out_id is the block that now holds the content:
 * `id` itself, or (dedup) the block already registered under the same hash,
 * with `id` returned to the free list and a reference taken on *out_id. */
KVBM_EXTERN int kvbm_block_register(kvbm_pool *pool, uint32_t id, uint32_t *out_id);

/* The registering calls with a context: the listener's STORED event for
 * the block carries `context` (kvbm_pool_event.context), so it learns who
 * registered the block from the call itself (a request, a tier...), not
 * from state the caller set aside. Otherwise as kvbm_block_register,
 * kvbm_block_fill and kvbm_pool_fill_run (which pass NULL). */
KVBM_EXTERN int kvbm_block_register_ctx(kvbm_pool *pool, uint32_t id, void *context,
                                        uint32_t *out_id);
KVBM_EXTERN int kvbm_block_fill_ctx(kvbm_pool *pool, uint32_t id, uint64_t salt_hash,
                                    uint64_t parent, bool has_parent, const uint32_t *tokens,
                                    uint64_t seq_hash, void *context, uint32_t *out_id);
KVBM_EXTERN int kvbm_pool_fill_run_ctx(kvbm_pool *pool, uint64_t salt_hash, uint64_t parent,
                                       bool has_parent, const uint32_t *tokens,
                                       const uint64_t *hashes, size_t n, void *context,
                                       uint32_t *ids);

/* init + append + commit + register in one call, for a block whose tokens
 * and sequence hash the caller already has (the hot path of prefill). The
 * hash is trusted: the caller computed it with the pool's scheme. */
KVBM_EXTERN int kvbm_block_fill(kvbm_pool *pool, uint32_t id, uint64_t salt_hash,
                    uint64_t parent, bool has_parent, const uint32_t *tokens,
                    uint64_t seq_hash, uint32_t *out_id);

/* Allocates and registers n consecutive full blocks: the prefill hot path.
 * Block k holds tokens[k * block_size ...], has sequence hash hashes[k]
 * (trusted, as in kvbm_block_fill) and parent hashes[k - 1] (`parent` for
 * k == 0, when has_parent). ids[k] receives the block that holds the content
 * (dedup may substitute an already registered block), with a reference.
 * Blocks are taken and registered one after the other, so a block taken
 * for k may evict one that k + 1 would have deduplicated onto, as in W1.
 * KVBM_ENOSPC, with no change, when fewer than n blocks are available. */
KVBM_EXTERN int kvbm_pool_fill_run(kvbm_pool *pool, uint64_t salt_hash, uint64_t parent,
                       bool has_parent, const uint32_t *tokens,
                       const uint64_t *hashes, size_t n, uint32_t *ids);

/* Fills and registers n blocks the caller allocated (each RESET and held,
 * as kvbm_pool_alloc_group leaves them): ids[k] gets tokens[k * block_size
 * ...], sequence hash hashes[k] (trusted) and parent hashes[k - 1] (`parent`
 * for k == 0, when has_parent), in the group it was allocated for; ids[k]
 * is replaced by the block that holds the content (dedup, as in
 * kvbm_block_register). This is the counterpart of kvbm_pool_fill_run for
 * an engine that allocates a step's blocks for every group first and
 * registers them after, as vLLM does. Every id is checked first: KVBM_EINVAL
 * (a bad id) or KVBM_ESTATE (a block not RESET and held, or an id given
 * twice) with no change. Cost: as kvbm_block_fill per block, with
 * the registry probes loaded ahead. */
KVBM_EXTERN int kvbm_pool_fill_ids(kvbm_pool *pool, uint32_t *ids, size_t n, uint64_t salt_hash,
                                   uint64_t parent, bool has_parent, const uint32_t *tokens,
                                   const uint64_t *hashes, void *context);

/* PARTIAL or COMPLETE -> RESET. The caller still holds the (now empty)
 * block: it may init it again, or release it to the free list. */
KVBM_EXTERN int kvbm_block_abort(kvbm_pool *pool, uint32_t id);

/* Drops one reference. A REGISTERED block whose last reference goes joins
 * the cache as the most recently released (at `priority`, 0 = evicted
 * first); a block in any other state goes back to the free list. Releasing
 * a block nobody holds is KVBM_ESTATE. */
KVBM_EXTERN int kvbm_block_release(kvbm_pool *pool, uint32_t id, uint8_t priority);

/* Releases ids[n-1], ids[n-2], ..., ids[0] in that order (a request's block
 * table, tail first), as n calls of kvbm_block_release would. Stops at the
 * first id that cannot be released and returns its error; the ids after it
 * in release order are untouched. */
KVBM_EXTERN int kvbm_pool_release_run(kvbm_pool *pool, const uint32_t *ids, size_t n, uint8_t priority);

/* A cached block (registered, nobody holding it) becomes the first to be
 * evicted: priority 0, ahead of every other cached block (known cold, e.g.
 * reasoning that has ended). KVBM_ESTATE if it is held or not registered,
 * KVBM_EINVAL for a bad id. O(1). */
KVBM_EXTERN int kvbm_block_demote(kvbm_pool *pool, uint32_t id);

/* Drops up to `max` cached blocks that pred(user, id, seq_hash) picks,
 * visiting the cache in eviction order (lowest priority first, oldest
 * first within a priority: demoted blocks lead). Each dropped block goes
 * back to the free list, unregistered, with a REMOVED event, and counts in
 * `evicted`. Returns how many were dropped (0 for a NULL pool or pred).
 * pred must not call the pool. Cost: O(cached) calls of pred at most. */
KVBM_EXTERN uint32_t kvbm_pool_evict_where(kvbm_pool *pool, uint32_t max,
                                           bool (*pred)(void *user, uint32_t id, uint64_t seq_hash),
                                           void *user);

/* Takes one more reference on a held or registered block (for fork). */
KVBM_EXTERN int kvbm_block_retain(kvbm_pool *pool, uint32_t id);

/* Drops every cached block; blocks in use are untouched. When that leaves
 * nothing registered, listeners get one CLEARED (vLLM's AllBlocksCleared);
 * otherwise a REMOVED per dropped block, so that a consumer of the events
 * does not forget the registered blocks still in use. */
KVBM_EXTERN int kvbm_pool_clear_cache(kvbm_pool *pool);

/* Drops the cached block registered under seq_hash now, as an eviction
 * would (listeners get its REMOVED; it goes back to the free list): a
 * storage advisor's drop or demotion. KVBM_ENOTFOUND when nothing is
 * registered under it, KVBM_ESTATE when the block is in use (refcount >
 * 0: it stays). Cost: one registry lookup. */
KVBM_EXTERN int kvbm_pool_evict(kvbm_pool *pool, uint64_t seq_hash);

/* Block inspection (for tests and tools). */
typedef struct kvbm_block_info {
  kvbm_block_state state;
  uint32_t refcount;
  uint32_t num_tokens;
  uint64_t seq_hash;      /* COMPLETE, REGISTERED */
  uint64_t parent_hash;
  bool has_parent;
  uint64_t salt_hash;
  uint8_t priority;       /* the priority it was released with while cached; 0 otherwise */
  const uint32_t *tokens; /* the block's tokens, valid until it changes; NULL
                             for a filled block without keep_tokens */
  uint32_t group;         /* the group it was last allocated for */
} kvbm_block_info;
KVBM_EXTERN int kvbm_block_info_get(const kvbm_pool *pool, uint32_t id, kvbm_block_info *out);

/* Calls fn for every registered block (active or cached), in id order. */
KVBM_EXTERN void kvbm_pool_foreach_registered(const kvbm_pool *pool,
                                  void (*fn)(void *user, uint32_t id, uint64_t seq_hash),
                                  void *user);

#ifdef __cplusplus
}
#endif
#endif
