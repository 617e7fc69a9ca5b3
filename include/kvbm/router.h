/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/router.h: the KV-aware router. An index of which worker holds which
 * blocks, fed by KV events alone; overlap scores; a cost-based choice of
 * worker; the W3 simulation (../shared/WORKLOADS.md).
 *
 * Index. Workers are named by (worker id, data-parallel rank) and get a
 * dense slot 0..KVBM_ROUTER_MAX_WORKERS-1. For every slot and tier
 * (kvbm/tier.h: G1 device, G2 host, G3 disk, G4 remote) the index knows the
 * set of block hashes held, and a lookup of a request's block hashes
 * h[0..n) returns, per worker, the length of its longest cached prefix: the
 * largest k such that h[0..k) are all held. Because tiers mix, one prefix
 * per tier is returned per worker, each counting the tiers above it too:
 *   prefix[G1] blocks held on device,
 *   prefix[G2] blocks held on device or host,
 *   prefix[G3] blocks held on device, host or disk,
 *   prefix[G4] blocks held on any tier,
 * so prefix[G1] <= prefix[G2] <= prefix[G3] <= prefix[G4] (the engine
 * matches its device prefix, then goes on in host memory, on disk, then in
 * the remote store).
 *
 * Keys. Either the engine's hashes are used as they come (they must be
 * chained sequence hashes, as kvbm's and vLLM's are), or, with `recompute`,
 * the index computes its own sequence hashes from each BlockStored's token
 * ids, chained from the parent's (linked through a per-worker map of the
 * engine's hashes), with the configured block size, scheme and salt: the
 * way to serve engines whose hashes the router cannot reproduce, and to
 * key the index in Dynamo's scheme (KVBM_HASH_DYNAMO).
 *
 * Threads. One writer (event application, worker add/drop, approximate
 * routing records) at a time: callers serialize writers (one thread, or a
 * lock of theirs). Any number of threads may call the lookup functions at
 * the same time as the writer, without a lock: every worker has its own
 * hash table whose slots are seqlocks, deletions that move slots bump the
 * table's move counter that a reader checks before believing a miss, and a
 * grown table replaces the old one by an atomic pointer swap (retired
 * tables are kept until destroy; the sizes double, so they cost less than
 * the live one). A lookup running while events are applied sees each block
 * either before or after each event, never a torn slot.
 */
#ifndef KVBM_ROUTER_H
#define KVBM_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/events.h"
#include "kvbm/group.h"
#include "kvbm/hash.h"
#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM_ROUTER_MAX_WORKERS 64

typedef struct kvbm_worker_key {
  uint64_t worker_id;
  uint32_t dp_rank;
} kvbm_worker_key;

/* ----------------------------------------------------------------- index */

typedef struct kvbm_index kvbm_index;

/* Called (on the writer's thread) when a worker's ids jump ahead: `expected`
 * was due, `got` arrived. The events from `got` on are applied anyway; the
 * callee may ask the worker for a replay of [expected, got). */
typedef void (*kvbm_index_gap_fn)(void *user, kvbm_worker_key worker, uint64_t expected,
                                  uint64_t got);

typedef struct kvbm_index_config {
  uint32_t block_size;       /* tokens per block (for recompute and for
                                kvbm_index_hash_tokens); default 16 */
  kvbm_hash_scheme scheme;   /* how token ids become hashes (native) */
  uint64_t salt_hash;        /* salt of the chain (kvbm_hash_salt; 0) */
  bool recompute;            /* key by hashes computed from the events'
                                token ids instead of the engine's (false) */
  size_t expected_blocks;    /* blocks per worker to size its table for,
                                grown as needed (16384) */
  kvbm_index_gap_fn on_gap;  /* optional */
  void *gap_user;
  kvbm_seqno_rules seq;        /* how ids are judged (kvbm_seqno_check; zeros:
                                the defaults) */
  const kvbm_group_spec *groups; /* optional: every worker's KV cache groups
                                    (a hybrid model, kvbm/group.h; copied at
                                    create); NULL/0: learned from events */
  size_t num_groups;
} kvbm_index_config;

KVBM_EXTERN kvbm_index_config kvbm_index_config_default(void);

/* Creates an index; *out is freed with kvbm_index_destroy. KVBM_EINVAL for
 * block size 0 or above KVBM_POOL_MAX_BLOCK_SIZE, an unknown scheme, or a
 * bad group list (see kvbm_index_worker_groups_set). */
KVBM_EXTERN int kvbm_index_create(const kvbm_index_config *cfg, kvbm_index **out, kvbm_error *err);
KVBM_EXTERN void kvbm_index_destroy(kvbm_index *idx); /* NULL is a no-op */

KVBM_EXTERN const kvbm_index_config *kvbm_index_config_get(const kvbm_index *idx);

/* --- writer side (one at a time) --- */

/* Adds a worker (no-op when known) and stores its slot in *slot (may be
 * NULL). KVBM_ENOSPC when KVBM_ROUTER_MAX_WORKERS are known. */
KVBM_EXTERN int kvbm_index_add_worker(kvbm_index *idx, kvbm_worker_key worker, uint32_t *slot,
                          kvbm_error *err);

/* Forgets a worker and everything it holds; its slot becomes free.
 * KVBM_ENOTFOUND when unknown. */
KVBM_EXTERN int kvbm_index_remove_worker(kvbm_index *idx, kvbm_worker_key worker);

/* Applies one event of `worker` (added when unknown). `id` orders the
 * worker's input by the sequence rules (kvbm_seqno_check, as for input that
 * mixes live and replayed batches): the first id seen starts the count; an
 * id a little below the next expected one is a duplicate and skipped
 * (KVBM_OK, counted); one above by at most seq.max_gap is a gap (on_gap is
 * called, the event is applied); one further back is a restart (the
 * worker's blocks are forgotten first, counted in `resets`); one further
 * ahead is skipped (counted in `jumps`) unless seq.confirm ids in a row
 * continue it, which counts as a restart. KVBM_INDEX_NO_ID skips the
 * check. Errors (nothing changed): KVBM_EINVAL for an unknown event type,
 * a STORED whose token count is not blocks x block size when recompute
 * needs them, or whose block size differs from the index's in recompute
 * mode. Blocks an engine removes that the index does not hold, and (in
 * recompute mode) blocks stored under a parent it does not know, are
 * counted in the stats, not errors: events may start mid-stream. */
#define KVBM_INDEX_NO_ID UINT64_MAX
KVBM_EXTERN int kvbm_index_apply(kvbm_index *idx, kvbm_worker_key worker, uint64_t id,
                     const kvbm_event *ev, kvbm_error *err);

/* Applies a batch: one id check on batch->seq, then every event (worker's
 * dp_rank is taken from the batch when it has one). A batch with `reset`
 * (a new stream: kvbm_subscriber) first forgets every rank of worker_id,
 * blocks and ids (counted in `resets`). Stops at the first event in error
 * and returns its status; earlier events stay applied. */
KVBM_EXTERN int kvbm_index_apply_batch(kvbm_index *idx, uint64_t worker_id,
                           const kvbm_event_batch *batch, kvbm_error *err);

/* Stores / removes blocks directly (no ids, no translation): the hashes
 * are index keys. Used by approximate routing and tests. For a worker of
 * several groups (see "Hybrid models") the blocks are stored in, and
 * removed from, every group of its list: a routing decision stands for
 * the whole request. */
KVBM_EXTERN int kvbm_index_store(kvbm_index *idx, uint32_t slot, kvbm_tier tier,
                     const uint64_t *hashes, size_t n);
KVBM_EXTERN int kvbm_index_remove(kvbm_index *idx, uint32_t slot, kvbm_tier tier,
                      const uint64_t *hashes, size_t n);

/* Hybrid models (docs/areas/hybrid.md, kvbm/group.h). vLLM keeps one
 * block table per KV cache group (full attention, sliding window, chunked
 * local, Mamba) and its events name the group of every block (group_idx,
 * absent = 0) and, on BlockStored, the group's kind (kv_cache_spec_kind,
 * kv_cache_spec_sliding_window). The index keeps every block under
 * (worker, group, key): two groups' blocks with equal hashes (vLLM's
 * groups share one hash chain) are two entries. A worker's group list is
 * configured (kvbm_index_config.groups for every worker, or this call for
 * one) or learned from its events: an event of group g makes the list at
 * least g + 1 long (groups not yet described count as full attention)
 * and a BlockStored's kind describes its group ("full_attention",
 * "sliding_window" with its window, "chunked_local_attention" with its
 * chunk in the window field, "mamba"). A configured list is fixed: an
 * event of a group beyond it is refused (KVBM_EINVAL, counted in
 * bad_groups) and a kind that disagrees is counted (group_conflicts), the
 * configured spec kept. An event's group_idx < 0 or >= KVBM_GROUPS_MAX is
 * always refused (nothing changed, counted).
 *
 * The overlap of a worker whose list is anything but one full-attention
 * group is kvbm_groups_hit over its per-group holdings, in blocks: per
 * tier as for one group, prefix[G1] is the hit every group serves from
 * the device, prefix[G2] from device or host, ..., prefix[G4] from any
 * tier (more holdings never shorten a hit, so the order holds). A worker
 * holding only the full-attention blocks of a prefix scores 0 for a
 * full + sliding window model; a sliding-window group needs only the
 * blocks of its window. Workers of one full group are looked up as
 * always (no cost for them).
 *
 * Sets worker's group list (added when unknown) and fixes it. KVBM_EINVAL
 * with a message for n == 0 or above KVBM_GROUPS_MAX, an unknown kind, a
 * window or chunk of 0 (or a parameter on full/Mamba), or a list shorter
 * than a group the worker already holds blocks of. Writer side. */
KVBM_EXTERN int kvbm_index_worker_groups_set(kvbm_index *idx, kvbm_worker_key worker,
                                             const kvbm_group_spec *specs, size_t n,
                                             kvbm_error *err);
/* The group list of the worker of a live slot: writes at most max specs
 * into out and the list's length into *n (0: none known yet, one full
 * group assumed). Any thread. KVBM_ENOTFOUND when the slot is free. */
KVBM_EXTERN int kvbm_index_worker_groups(const kvbm_index *idx, uint32_t slot,
                                         kvbm_group_spec *out, size_t max, size_t *n);
/* kvbm_index_store / kvbm_index_remove in group `group` of the slot's
 * list (KVBM_EINVAL for a group >= KVBM_GROUPS_MAX or beyond a fixed
 * list; a learned list grows to hold it). */
KVBM_EXTERN int kvbm_index_store_group(kvbm_index *idx, uint32_t slot, kvbm_tier tier,
                                       uint32_t group, const uint64_t *hashes, size_t n);
KVBM_EXTERN int kvbm_index_remove_group(kvbm_index *idx, uint32_t slot, kvbm_tier tier,
                                        uint32_t group, const uint64_t *hashes, size_t n);

/* --- reader side (any thread, no lock) --- */

typedef struct kvbm_overlap {
  uint32_t prefix[KVBM_TIER_COUNT]; /* see the top of this file */
} kvbm_overlap;

/* For every slot s < KVBM_ROUTER_MAX_WORKERS writes out[s] (zeros for free
 * slots) and returns in *workers (may be NULL) the mask of live slots.
 * `out` must hold KVBM_ROUTER_MAX_WORKERS entries. n may be 0. */
KVBM_EXTERN void kvbm_index_lookup(const kvbm_index *idx, const uint64_t *hashes, size_t n,
                       kvbm_overlap *out, uint64_t *workers);

/* The index's hashes of the full blocks of tokens[0..n): writes at most
 * max_out, returns how many (kvbm_hash_chain with the index's settings). */
KVBM_EXTERN size_t kvbm_index_hash_tokens(const kvbm_index *idx, const uint32_t *tokens, size_t n,
                              uint64_t *out, size_t max_out);

/* Namespaces. A block stored with a cache salt (SGLang's cache_salt) or a
 * LoRA name belongs to that tenant's namespace, and only lookups in the
 * same namespace see it: tenants never match each other's blocks. A
 * BlockStored with neither continues its parent's namespace when the
 * parent is a namespaced block the worker holds; removes find a block in
 * whichever namespace it was stored. 0 is the default namespace (no salt,
 * no LoRA name), whose keys are the hashes themselves.
 *
 * The namespace of (cache_salt, lora_name); NULL and "" are absent; 0 when
 * both are. Pure, any thread. */
KVBM_EXTERN uint64_t kvbm_index_namespace(const char *cache_salt, const char *lora_name);

/* The keys to look up for a request's engine block hashes h[0..n) in
 * namespace ns (keys may be hashes: in place is fine). With recompute the
 * index's keys are its own hashes (kvbm_index_hash_tokens_ns), copied as
 * they are. */
KVBM_EXTERN void kvbm_index_keys(const kvbm_index *idx, uint64_t ns, const uint64_t *hashes,
                                 size_t n, uint64_t *keys);

/* kvbm_index_hash_tokens in namespace ns: the keys a request of that
 * tenant looks up (ns 0: the same as kvbm_index_hash_tokens). */
KVBM_EXTERN size_t kvbm_index_hash_tokens_ns(const kvbm_index *idx, uint64_t ns,
                                             const uint32_t *tokens, size_t n, uint64_t *out,
                                             size_t max_out);

/* Slot of a worker; KVBM_ENOTFOUND when unknown. */
KVBM_EXTERN int kvbm_index_worker_slot(const kvbm_index *idx, kvbm_worker_key worker, uint32_t *slot);
/* Worker of a live slot; false when the slot is free. */
KVBM_EXTERN bool kvbm_index_slot_worker(const kvbm_index *idx, uint32_t slot, kvbm_worker_key *out);
/* Mask of live slots. */
KVBM_EXTERN uint64_t kvbm_index_workers(const kvbm_index *idx);
/* The index's size for the worker of a live slot: out[t] is the number of
 * distinct keys it holds in tier t (a block held in G1 and G2 counts in
 * both; copies of one hash count once). Any thread, O(KVBM_TIER_COUNT),
 * no lock: numbers a moment stale while the writer applies events.
 * KVBM_ENOTFOUND when the slot is free (out untouched). */
KVBM_EXTERN int kvbm_index_worker_blocks(const kvbm_index *idx, uint32_t slot,
                                         uint64_t out[KVBM_TIER_COUNT]);
/* Calls fn(user, hash, tiers, group) for every block the worker of a live
 * slot holds: hash is the engine's block hash (a namespaced block's is its
 * namespace key), tiers a mask of 1 << kvbm_tier (G1..G4), group its KV
 * cache group. Writer side (not while events are applied: the caller holds
 * what serializes its writers), O(the worker's table); the order is the
 * table's, not sorted. A nonzero return of fn stops the walk and is
 * returned. KVBM_ENOTFOUND when the slot is free. */
typedef int (*kvbm_index_block_fn)(void *user, uint64_t hash, unsigned tiers, uint32_t group);
KVBM_EXTERN int kvbm_index_worker_each(const kvbm_index *idx, uint32_t slot,
                                       kvbm_index_block_fn fn, void *user);
/* The id of the batch a worker's input expects next (writer side);
 * KVBM_ENOTFOUND when the worker is unknown or has seen no numbered batch.
 * A restored router asks an engine's replay socket for batches from here. */
KVBM_EXTERN int kvbm_index_next_id(const kvbm_index *idx, kvbm_worker_key worker, uint64_t *next);

/* --- snapshots (writer side: not while events are applied; lookups may
 * run meanwhile) --- */

/* The index as bytes: every worker's blocks, its map and where its input
 * stood (the next id due). Canonical: two indexes holding the same blocks
 * with the same ids give the same bytes. *out is malloc'd, the caller
 * frees it with free(). O(blocks log blocks). KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_index_snapshot(const kvbm_index *idx, uint8_t **out, size_t *len,
                                    kvbm_error *err);

/* Loads a snapshot into an index with no workers, created with the same
 * block size, scheme, salt and recompute setting; afterwards events apply
 * as they would have to the index that was snapshotted (ids below a
 * worker's next are duplicates). Errors, the index left empty: KVBM_ESTATE
 * (the index has workers), KVBM_EMAGIC, KVBM_EVERSION, KVBM_ECHECKSUM,
 * KVBM_ETRUNCATED, KVBM_ETOOLONG, KVBM_EFORMAT (a count beyond the bytes,
 * a value out of range, a worker or entry twice), KVBM_EINVAL (another
 * configuration), KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_index_restore(kvbm_index *idx, const void *data, size_t len,
                                   kvbm_error *err);

/* kvbm_index_snapshot into a file, atomically (a synced temporary file
 * renamed over `path`), and kvbm_index_restore from one (KVBM_ENOTFOUND
 * when there is none, KVBM_EIO). */
KVBM_EXTERN int kvbm_index_save(const kvbm_index *idx, const char *path, kvbm_error *err);
KVBM_EXTERN int kvbm_index_load(kvbm_index *idx, const char *path, kvbm_error *err);

typedef struct kvbm_index_stats {
  uint64_t events;          /* events applied */
  uint64_t stored, removed, cleared; /* blocks stored/removed, clears */
  uint64_t duplicates;      /* events or batches skipped by id */
  uint64_t gaps;            /* id jumps */
  uint64_t resets;          /* restarts: batches with reset, ids gone back */
  uint64_t jumps;           /* ids too far ahead, skipped */
  uint64_t unknown_removed; /* removes of blocks not held */
  uint64_t orphans;         /* recompute: blocks under an unknown parent */
  uint64_t entries;         /* blocks held: distinct hashes per worker, summed */
  uint64_t table_slots;     /* slots of the workers' tables */
  uint32_t workers;
  uint32_t closed_workers;  /* workers whose lookups bisect (see index.c) */
  uint64_t grouped;         /* events of a group other than 0 applied */
  uint64_t bad_groups;      /* events refused for their group_idx */
  uint64_t group_conflicts; /* kinds that disagreed with a configured list */
  uint32_t hybrid_workers;  /* workers looked up by kvbm_groups_hit */
} kvbm_index_stats;
/* Counters are read without the writer's help: call it from the writer, or
 * accept slightly stale numbers. */
KVBM_EXTERN void kvbm_index_stats_get(const kvbm_index *idx, kvbm_index_stats *out);

/* ---------------------------------------------------------------- choice */

typedef enum kvbm_load_kind {
  KVBM_LOAD_BLOCKS = 0,   /* active blocks */
  KVBM_LOAD_REQUESTS = 1, /* active requests */
} kvbm_load_kind;

typedef struct kvbm_choice_config {
  double tier_weight[KVBM_TIER_COUNT]; /* G1..G4: 1.0, 0.75, 0.25 (Dynamo's), 0.1 */
  double prefill_weight;  /* weight of blocks to prefill (1.0) */
  double load_weight;     /* weight of the load (1.0) */
  kvbm_load_kind load_kind;
  double temperature;     /* 0: lowest cost wins (ties at random); > 0:
                             softmax sampling over -cost / temperature of
                             costs normalized to [0, 1] */
} kvbm_choice_config;

KVBM_EXTERN kvbm_choice_config kvbm_choice_config_default(void);

/* KVBM_EINVAL (with a message) for a negative or non-finite weight or
 * temperature. */
KVBM_EXTERN int kvbm_choice_config_check(const kvbm_choice_config *cfg, kvbm_error *err);

/* Blocks a worker would not have to prefill: the device prefix at weight
 * tier_weight[0], the part the host adds at [1], what disk adds at [2]. */
KVBM_EXTERN double kvbm_overlap_score(const kvbm_choice_config *cfg, const kvbm_overlap *ov);

typedef struct kvbm_choice {
  uint32_t slot;   /* the chosen worker's slot */
  double cost;     /* its cost */
  uint32_t ties;   /* how many slots shared the lowest cost */
} kvbm_choice;

/* Chooses among the slots in `candidates`: cost(s) = prefill_weight *
 * (n_blocks - score(ov[s])) + load_weight * load[s]. `load` may be NULL
 * (no load). `rng` is the caller's generator state (any nonzero start;
 * one per thread). KVBM_ENOTFOUND when candidates is 0. */
KVBM_EXTERN int kvbm_choose(const kvbm_choice_config *cfg, size_t n_blocks, const kvbm_overlap *ov,
                const double *load, uint64_t candidates, uint64_t *rng,
                kvbm_choice *out);

/* A small generator for the tie breaks (xorshift64*). */
KVBM_EXTERN uint64_t kvbm_router_rand(uint64_t *state);

/* ---------------------------------------------------------- approximate */

/* For engines that publish no events: every routing decision is recorded
 * in the index as if the chosen worker had stored the request's blocks on
 * device, and forgotten `ttl` seconds later. A writer: serialize it with
 * the index's other writers. Owns nothing of the index. Memory is bounded:
 * each worker keeps at most max_blocks_per_worker recorded blocks (copies
 * counted); a decision that would pass that evicts the worker's oldest
 * decisions first (counted in the stats), and one longer than the budget
 * keeps only its first max_blocks_per_worker blocks. */
typedef struct kvbm_approx kvbm_approx;

typedef struct kvbm_approx_config {
  double ttl_s;                 /* > 0: how long a decision counts (120) */
  size_t max_blocks_per_worker; /* >= 1: blocks recorded per worker (65536) */
} kvbm_approx_config;

KVBM_EXTERN kvbm_approx_config kvbm_approx_config_default(void);

/* KVBM_EINVAL (with a message) for a ttl that is not finite and > 0 or a
 * budget of 0; KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_approx_create(kvbm_index *idx, const kvbm_approx_config *cfg,
                                   kvbm_approx **out, kvbm_error *err);
KVBM_EXTERN void kvbm_approx_destroy(kvbm_approx *ap); /* NULL is a no-op; leaves the index as is */

/* Expires records older than now_s - ttl, then records `hashes` for `slot`
 * at time now_s (any monotonic clock in seconds, non-decreasing), evicting
 * the slot's oldest records while its budget would be passed. O(n) plus
 * O(1) per record expired or evicted. */
KVBM_EXTERN int kvbm_approx_record(kvbm_approx *ap, uint32_t slot, const uint64_t *hashes, size_t n,
                       double now_s, kvbm_error *err);
/* Expires only. Returns how many records went. */
KVBM_EXTERN size_t kvbm_approx_expire(kvbm_approx *ap, double now_s);
KVBM_EXTERN size_t kvbm_approx_pending(const kvbm_approx *ap);

typedef struct kvbm_approx_stats {
  uint64_t records;           /* decisions held now */
  uint64_t blocks;            /* blocks they hold (copies counted), all workers */
  uint64_t max_worker_blocks; /* the most any one worker holds (<= the budget) */
  uint64_t recorded;          /* decisions recorded since creation */
  uint64_t expired;           /* records that reached their ttl */
  uint64_t evicted_records;   /* records evicted early for the budget */
  uint64_t evicted_blocks;    /* their blocks */
  uint64_t truncated_blocks;  /* blocks past the budget in one decision, not kept */
} kvbm_approx_stats;
KVBM_EXTERN void kvbm_approx_stats_get(const kvbm_approx *ap, kvbm_approx_stats *out);

/* ---------------------------------------------------------------- daemon */

/* `kvbm router`: event subscriptions feeding an index, and routing queries
 * over HTTP/1.1 with JSON bodies on one port:
 *   POST /route  {"token_ids": [...]} or {"block_hashes": [...]}
 *                -> {"worker_id", "dp_rank", "request_id", "blocks", "cost",
 *                    "workers": [{"worker_id", "dp_rank", "device", "host",
 *                    "disk", "score", "load", "cost"}, ...]}
 *   POST /done   {"request_id": N}  (the request finished: its load goes)
 *   GET  /health -> {"status": "ok" or "degraded", "workers", "entries",
 *                    "events", ..., "degraded_workers": [...], "sources":
 *                    [{"worker_id", "batches", "lost", "degraded",
 *                    "duplicates", "resets", "jumps", ...}]} (see the note
 *                    docs/areas/router.md for every field)
 * A worker whose stream lost batches that replay could not give back is
 * DEGRADED (its index is known to be incomplete) until its engine starts a
 * new stream or clears its cache: /route marks it in its answer and routes
 * to it as approximate mode does (the decision is recorded in the index).
 * /route takes optional "cache_salt" and "lora_name" (strings): the
 * request's namespace (kvbm_index_namespace). 
 * Bad requests get a 4xx status and {"error": "..."}. */
typedef enum kvbm_source_kind {
  KVBM_SOURCE_ZMQ = 0,  /* a ZMQ PUB endpoint (vLLM's wire) */
  KVBM_SOURCE_NATS = 1, /* a NATS subject (kvbm's NATS sink: payload as the
                           ZMQ third frame, sequence in header Kvbm-Seq) */
  KVBM_SOURCE_JETSTREAM = 2, /* a subject of a JetStream stream (kvbm's
                           JetStream sink), read with a durable consumer
                           named "<durable>-<worker id>": the server keeps
                           where the router stands, so a restarted router
                           (or a replica) reads on without any replay
                           request to the engine */
} kvbm_source_kind;

typedef struct kvbm_router_source {
  kvbm_source_kind kind;
  uint64_t worker_id;          /* the dp rank comes from each batch */
  const char *endpoint;        /* ZMQ endpoint, or NATS server URL */
  const char *replay_endpoint; /* the worker's ZMQ ROUTER replay socket (both
                                  kinds; optional): gaps are asked for there */
  const char *subject;         /* NATS subject; JetStream: the worker's
                                  subject in the stream */
  const char *topic;           /* ZMQ topic prefix (NULL: all) */
  const char *stream;          /* JetStream stream */
} kvbm_router_source;

typedef struct kvbm_router_daemon_config {
  const char *host;               /* listening address ("127.0.0.1") */
  uint16_t port;                  /* 0: any free port (kvbm_router_daemon_port) */
  kvbm_index_config index;
  kvbm_choice_config choice;
  const kvbm_router_source *sources;
  size_t num_sources;
  const kvbm_worker_key *workers; /* known from the start (approximate mode
                                     has no events to learn them from) */
  size_t num_workers;
  double approx_ttl_s;            /* > 0: approximate mode, decisions expire
                                     after this long */
  size_t approx_max_blocks;       /* approximate mode: blocks recorded per
                                     worker, oldest evicted first (65536) */
  double worker_timeout_s;        /* > 0: a source silent this long has its
                                     workers dropped until it speaks again */
  double request_ttl_s;           /* load of a request never reported done
                                     goes after this long (600) */
  size_t max_active_requests;     /* /route records kept for /done and load;
                                     beyond, the oldest goes first (1 << 18) */
  size_t max_body;                /* bytes (8 MiB) */
  size_t max_tokens;              /* per query (1 << 20) */
  size_t max_connections;         /* (256); with the descriptors open at
                                     create it must fit RLIMIT_NOFILE. A
                                     newcomer past it takes the slot of the
                                     connection idle longest; 503 only when
                                     none is idle */
  size_t max_per_peer;            /* connections from one client address
                                     (256, the default table: no bound of
                                     its own; >= 1): past it the address's
                                     own idle connection goes, 503 when
                                     none is idle. Not lower by default:
                                     a router's clients are a few
                                     frontends, often one proxy or
                                     everything on 127.0.0.1, and a bound
                                     below the table would cut what they
                                     may have in flight. Lower it where
                                     clients are many and not trusted */
  double io_timeout_s;            /* a request must arrive, and its answer be
                                     taken by the client, within (10) */
  uint64_t seed;
  /* event sources (see kvbm_subscriber_config) */
  size_t queue_bytes;             /* byte budget of each source's queue
                                     (64 MiB; >= 2 * max_payload) */
  size_t max_payload;             /* larger batches are refused (2 MiB) */
  uint32_t max_ranks;             /* dp ranks one source may fill worker
                                     slots with (8; 1..64): batches of more
                                     ranks are refused and counted */
  int replay_timeout_ms;          /* one replay, request to end (2000) */
  const char *durable;            /* JetStream sources' consumer names:
                                     "<durable>-<worker id>" ("kvbm-router");
                                     replicas take different ones */
  /* warm restart */
  const char *snapshot_path;      /* NULL: none. At create, when the file
                                     exists: the index is loaded from it,
                                     JetStream sources read on from the
                                     positions it holds, ZMQ sources ask
                                     their replay socket for what came after
                                     it; the file is written again every
                                     snapshot_every_s and at destroy */
  double snapshot_every_s;        /* (30; 0: only at destroy) */
  /* optional: one line of log (no newline) */
  void (*log)(void *user, const char *line);
  void *log_user;
} kvbm_router_daemon_config;

KVBM_EXTERN kvbm_router_daemon_config kvbm_router_daemon_config_default(void);

typedef struct kvbm_router_daemon kvbm_router_daemon;

/* Checks the config, binds the port and starts the subscriptions (a ZMQ
 * or NATS endpoint that cannot be reached is an error here: KVBM_EIO).
 * KVBM_EINVAL (with a message) for a bad config: two sources with one
 * worker id, an endpoint whose port is not 1..65535, max_connections that
 * the descriptor limit (RLIMIT_NOFILE) cannot hold beside those already
 * open. Strings in cfg are copied. Free with kvbm_router_daemon_destroy. */
KVBM_EXTERN int kvbm_router_daemon_create(const kvbm_router_daemon_config *cfg, kvbm_router_daemon **out,
                           kvbm_error *err);
/* The port it listens on. */
KVBM_EXTERN uint16_t kvbm_router_daemon_port(const kvbm_router_daemon *d);
/* Serves until kvbm_router_daemon_stop; returns KVBM_OK, or KVBM_EIO when
 * the listening socket fails. */
KVBM_EXTERN int kvbm_router_daemon_run(kvbm_router_daemon *d, kvbm_error *err);
/* Makes run return soon. Async-signal-safe. */
KVBM_EXTERN void kvbm_router_daemon_stop(kvbm_router_daemon *d);
KVBM_EXTERN void kvbm_router_daemon_destroy(kvbm_router_daemon *d); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif
#endif
