/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/psim.h: the policy simulator behind `kvbm policy-sim`: workload
 * W2 (../shared/WORKLOADS.md) with block identities and tiers only, no
 * bytes, and a choice of eviction and admission policy per tier.
 *
 * The manager's W2 (workload/w2.h, docs/areas/tiers.md) is reproduced
 * exactly by the configuration "today" (G1 the pool's LRU, G2 LRU with
 * write-through, G3 LRU behind Dynamo's frequency filter, a commit's blocks
 * released in use order): same hit tokens per tier, same blocks written
 * per tier, same G1 allocations (tests/workload/test_psim_cli.sh compares
 * it with `kvbm replay --g2-blocks ... --g3-blocks ...`). Other
 * configurations change only the decisions the manager makes:
 *
 * - G1: which cached block an allocation evicts (lru, or belady for the
 *   bound). Everything else of G1 is the engine's (W1's rules).
 * - G2, G3: on each commit every full block is used once, in order; a
 *   tier holding it refreshes it (per its eviction policy); otherwise the
 *   admission policy decides whether it is written (a write evicts per the
 *   eviction policy); tail_first reverses the order in which a commit's
 *   blocks are placed (see workload/psim_cache.h).
 * - advisor: the storage advisor (kvbm/advisor.h) is fed the events the
 *   manager would publish (BlockStored/BlockRemoved of G1, StoreEvent/
 *   RemoveEvent of G2 and G3) in batches of `advisor_period_ms` of trace
 *   time, and its hints are applied as the manager applies them: promote
 *   copies a block from G3 into G2, demote moves a block from G2 to G3 (or
 *   drops it), after the batch that produced them.
 *
 * Prepare a trace once (kvsim_psim_stream_build: hashes every block, interns
 * the hashes as dense ids, and, for the clairvoyant policies, finds each
 * block's next use), then run any number of configurations on it. A run
 * is single-threaded and allocates its tiers' bookkeeping (a few bytes per
 * distinct block and per slot); the stream is read-only during runs, so
 * runs may go on several threads at once.
 */
#ifndef KVSIM_WORKLOAD_PSIM_H
#define KVSIM_WORKLOAD_PSIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/hash.h"
#include "kvbm/status.h"
#include "workload/psim_cache.h"
#include "workload/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVSIM_PSIM_TIERS 3 /* G1, G2, G3 */

typedef enum kvsim_psim_admit {
  KVSIM_PSIM_ADMIT_ALL = 0,     /* write-through: every use of a block the tier lacks */
  KVSIM_PSIM_ADMIT_FREQUENCY,   /* Dynamo's filter: the block's decayed use count reaches the threshold */
  KVSIM_PSIM_ADMIT_NEVER,       /* nothing at commit (the advisor's demotions may still write) */
  KVSIM_PSIM_ADMIT_CLAIRVOYANT, /* used again before the block the write would evict (the bound) */
  KVSIM_PSIM_ADMIT_REUSED,      /* used again at all (an oracle of reuse, not of timing: analysis) */
  KVSIM_PSIM_ADMIT_VICTIM,      /* G3: a block G2 evicts, if used at least victim_min_uses times */
  KVSIM_PSIM_ADMIT_STICKY,      /* ttl: room, an overdue victim, or an expiry before the victim's */
  KVSIM_PSIM_ADMIT_TURN,        /* ttl: sticky, for requests whose turn class returns as often as all */
  KVSIM_PSIM_ADMIT_COUNT
} kvsim_psim_admit;

/* "all", "frequency", "never", "clairvoyant", "reused", "victim", "sticky",
 * "turn"; "?" otherwise. */
const char *kvsim_psim_admit_name(int a);
bool kvsim_psim_admit_parse(const char *s, kvsim_psim_admit *out);

typedef enum kvsim_psim_rank {
  KVSIM_PSIM_RANK_NONE = 0, /* all equal: the furthest expiry goes (a TTL cache) */
  KVSIM_PSIM_RANK_RANDOM,   /* a hash of the request's index: some requests stay, others go */
  KVSIM_PSIM_RANK_TURN,     /* the online return rate of the request's turn class: the lowest goes */
  KVSIM_PSIM_RANK_COUNT
} kvsim_psim_rank;

/* "none", "random", "turn"; "?" otherwise. */
const char *kvsim_psim_rank_name(int k);
bool kvsim_psim_rank_parse(const char *s, kvsim_psim_rank *out);

typedef struct kvsim_psim_tier_config {
  uint64_t capacity;     /* blocks (0: the tier is absent; G1 needs >= 1) */
  kvsim_psim_evict evict;      /* G1: lru or belady only */
  kvsim_psim_admit admit; /* G2, G3 */
  bool tail_first;       /* G2, G3: a commit's deepest block is placed oldest */
} kvsim_psim_tier_config;

typedef struct kvsim_psim_config {
  kvsim_psim_tier_config tier[KVSIM_PSIM_TIERS];
  /* Dynamo's frequency filter (the manager's defaults: 2, 65536, 2^20), G3's. */
  uint32_t freq_threshold, freq_decay_uses, freq_max_entries;
  /* G2's frequency filter, its own (3, 2^26, 2^22): G2 admission wants a
   * memory longer than G3's, whose fast decay is what keeps its writes low. */
  uint32_t g2_freq_threshold, g2_freq_decay_uses, g2_freq_max_entries;
  /* victim admission: uses (commits) a block needs to be demoted (2). */
  uint32_t victim_min_uses;
  /* The advisor (off unless advisor is true). */
  bool advisor;
  uint32_t advisor_period_ms; /* event batches and hints, trace time (10000) */
  uint32_t advisor_promote_min_uses; /* see kvbm_advisor_config */
  uint32_t advisor_demote_min_uses;
  double advisor_demote_fraction;
  /* Analysis only: noise on the clairvoyant next-use keys (belady eviction
   * and clairvoyant admission, every tier). 0 (the default): the exact
   * bound. sigma > 0: a block next used by request n, seen at request c,
   * gets the key of request c + (n - c) * exp(sigma * z), z ~ N(0, 1)
   * drawn from a hash of (n, c): one draw per request's chain, the same in
   * every run. Blocks never used again keep KVSIM_PSIM_KEY_NEVER (which blocks
   * return stays exact; only when they return is blurred). 0..64. */
  double eta_noise;
  /* Online TTL eviction (evict ttl, G2/G3): a commit gives its blocks the
   * expiry request time + ttl_s * exp(ttl_sigma * z) (whole seconds), z ~
   * N(0, 1) drawn from a hash of the request's index (one per request,
   * deterministic); a use refreshes it. ttl_sigma 0: one TTL for all
   * (120 s, 0). Among blocks not overdue the highest rank goes first, then
   * the furthest expiry; the rank of a request's blocks: */
  double ttl_s, ttl_sigma;
  kvsim_psim_rank ttl_rank;
  size_t limit; /* first N requests of the stream (0: all) */
} kvsim_psim_config;

/* G1 16384 LRU; G2 65536 LRU write-through; G3 262144 LRU frequency;
 * head first; filter 2/65536/2^20 (G2's, when asked for: 3/2^26/2^22);
 * advisor off (period 10 s). */
kvsim_psim_config kvsim_psim_config_default(void);

/* Named configurations for the CLI and the curves (capacities untouched):
 *   today     G2 lru+all, G3 lru+frequency, head first (the manager now)
 *   lru-tail  today with tail-first placement in G2 and G3
 *   arc       G2 arc+all, G3 arc+frequency, tail first
 *   s3fifo    G2 s3fifo+all, G3 s3fifo+frequency, tail first
 *   wtinylfu  G2 wtinylfu+all, G3 lru+frequency, tail first
 *   victim    G2 lru+all, G3 lru+victim (what G2 evicts after 2 uses), tail first
 *   g2-freq   G2 lru+frequency (its own filter: a block's 3rd use, long memory),
 *             G3 lru+frequency as today, tail first
 *   advisor   G2 lru+all, G3 lru+frequency, tail first, advisor on
 *   belady    every tier belady, G2/G3 clairvoyant admission (the bound)
 * Returns false for an unknown name (config untouched). */
bool kvsim_psim_preset(const char *name, kvsim_psim_config *cfg);
/* The preset names in order, NULL-terminated. */
extern const char *const kvsim_psim_preset_names[];

typedef struct kvsim_psim_stream kvsim_psim_stream;

/* Prepares the first `limit` requests (0: all) of a trace with blocks of
 * block_size tokens hashed by `scheme`. `next_use` also computes each
 * block's next use (what belady and clairvoyant need; 8 bytes per block
 * position). Errors: KVBM_EINVAL (block size 0 or above 2^16),
 * KVBM_ENOSPC (a request has more blocks than 2^24), KVBM_ENOMEM. */
int kvsim_psim_stream_build(const kvsim_trace *trace, size_t limit, uint32_t block_size,
                           kvbm_hash_scheme scheme, bool next_use, kvsim_psim_stream **out,
                           kvbm_error *err);
void kvsim_psim_stream_destroy(kvsim_psim_stream *s); /* NULL is a no-op */
size_t kvsim_psim_stream_requests(const kvsim_psim_stream *s);
uint32_t kvsim_psim_stream_universe(const kvsim_psim_stream *s); /* distinct full blocks */
uint64_t kvsim_psim_stream_max_blocks(const kvsim_psim_stream *s); /* of one request */
bool kvsim_psim_stream_has_next_use(const kvsim_psim_stream *s);

typedef struct kvsim_psim_tier_result {
  uint64_t hit_tokens;     /* matched tokens served by this tier (fastest holder) */
  uint64_t written_blocks; /* blocks written into it (offloads, promotions, demotions) */
  uint64_t evictions;
  uint64_t filtered;       /* uses its admission policy declined */
  uint64_t skipped_space;  /* writes with nothing evictable (all pinned) */
  uint64_t promoted;       /* G2: blocks copied up from G3 by a hint */
  uint64_t demoted;        /* G2: blocks moved down to G3 by a hint */
  uint64_t dropped;        /* G2: blocks dropped by a hint */
} kvsim_psim_tier_result;

typedef struct kvsim_psim_result {
  uint64_t requests, prompt_tokens, hit_tokens;
  uint64_t g1_allocated; /* W1's blocks_allocated */
  kvsim_psim_tier_result tier[KVSIM_PSIM_TIERS];
  uint64_t advisor_events, advisor_hints;
  double seconds;
} kvsim_psim_result;

/* Runs one configuration. KVBM_EINVAL for a bad configuration (named in
 * err: G1 of 0 blocks or with a policy other than lru/belady, belady or
 * clairvoyant on a stream without next uses, an unknown policy),
 * KVBM_ENOSPC when a request does not fit in G1 (as W2), KVBM_ENOMEM. */
int kvsim_psim_run(const kvsim_psim_stream *s, const kvsim_psim_config *cfg, kvsim_psim_result *out,
                  kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif
