/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/advisor.h: the storage advisor's core: an index of the blocks each
 * volume holds, fed by storage events (kvbm/storage_events.h) and KV
 * events (kvbm/events.h), with the use statistics that events alone
 * reveal, and the hints it derives from them (docs/areas/advisor.md):
 *
 *   PROMOTE  a block of a hot prefix family sitting only in a slow volume
 *            (G3/G4): prefetch it into a fast one (G2);
 *   DEMOTE   a block that went cold in a fast volume but was used at least
 *            demote_min_uses times: move it to a slow volume;
 *   DROP     a cold block in a fast volume used fewer times: drop it;
 *   COMPACT  a slow volume whose live blocks are a small fraction of what
 *            it once held (its slots are scattered): rewrite it.
 *
 * What events reveal. A block's uses are its stores on GPU (KV events,
 * BlockStored with medium GPU or none): a block onboarded to G1 from below
 * shows up as a GPU store of a hash that lives in a volume, and counts as a
 * use. A block kept in G1 is in use as long as it stays there; when it
 * leaves G1 (BlockRemoved on GPU) its idle time starts. A fast volume's
 * eviction age is the idle time of the blocks it removes (a moving average):
 * a block idle for more than (1 - demote_fraction) of it is about to go.
 * A prefix family (prefix_hash) is active when its blocks are stored or
 * used, once per time point (a request's hundreds of blocks are one use of
 * its family); its activity decays with a half-life of promote_window_ms.
 *
 * Which volume is fast or slow comes from the events' "tier" metadata or
 * from kvbm_advisor_volume_tier(); a volume of unknown tier gets no hints.
 *
 * Memory is bounded: at most max_blocks entries (56 bytes each, in a table
 * that grows as needed), max_prefixes prefix families, max_volumes
 * volumes, 64 event sources. A full index forgets the least recently used
 * of a sample of entries (blocks nobody holds go first) and counts it;
 * what is refused (bad events, volumes or sources over the bound) is
 * counted too. Nothing an event says can make it allocate more.
 *
 * Not thread-safe: one thread (the daemon's, or the simulator) drives it.
 * Times are the caller's milliseconds (wall clock or trace time), and
 * should not go back (a step back is treated as no time passing).
 */
#ifndef KVBM_ADVISOR_H
#define KVBM_ADVISOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/events.h"
#include "kvbm/status.h"
#include "kvbm/storage_events.h"
#include "kvbm/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM_ADVISOR_MAX_VOLUMES 32
#define KVBM_ADVISOR_MAX_SOURCES 64

typedef struct kvbm_advisor kvbm_advisor;

typedef struct kvbm_advisor_config {
  size_t max_blocks;           /* index entries (default 2^20, at most 2^28) */
  uint32_t max_prefixes;       /* prefix families (65536) */
  uint32_t max_volumes;        /* volumes (32, at most KVBM_ADVISOR_MAX_VOLUMES) */
  double promote_min_score;    /* a family this active (decayed uses) is hot (2) */
  uint64_t promote_window_ms;  /* half-life of family activity (60000) */
  uint32_t demote_min_uses;    /* cold fast-volume blocks used this often move down (2) */
  double demote_fraction;      /* the cold end of a fast volume's residency (0.7) */
  bool drop_cold;              /* DROP cold blocks used fewer times (true) */
  double compact_live_ratio;   /* COMPACT a slow volume below this live fraction (0.5) */
  uint64_t compact_min_blocks; /* ... whose high-water mark is at least this (1024) */
  uint64_t rehint_ms;          /* a block is not hinted again within this (30000) */
} kvbm_advisor_config;

KVBM_EXTERN kvbm_advisor_config kvbm_advisor_config_default(void);

/* KVBM_EINVAL names a setting out of range; KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_advisor_create(const kvbm_advisor_config *cfg, kvbm_advisor **out,
                                    kvbm_error *err);
KVBM_EXTERN void kvbm_advisor_destroy(kvbm_advisor *a); /* NULL is a no-op */

/* Declares (or re-declares) a volume's tier ahead of its events; the
 * events' own "tier" wins when it differs. KVBM_EINVAL for a bad name or
 * tier, KVBM_ENOSPC when max_volumes are known already. */
KVBM_EXTERN int kvbm_advisor_volume_tier(kvbm_advisor *a, const char *name, kvbm_tier tier,
                                         kvbm_error *err);

/* Applies a decoded batch of storage events. Events of a volume beyond
 * max_volumes are refused and counted; a jump in a source's event ids is
 * counted as lost events (a step back as a restarted source). Returns
 * KVBM_OK or KVBM_EINVAL (NULL arguments); never fails on content. */
KVBM_EXTERN int kvbm_advisor_storage(kvbm_advisor *a, const kvbm_storage_batch *b,
                                     uint64_t now_ms);

/* Applies a batch of KV events of one worker: GPU stores are uses,
 * GPU removes end a block's stay in G1, AllBlocksCleared ends all of them.
 * Other media are counted and ignored (storage events speak for volumes). */
KVBM_EXTERN int kvbm_advisor_kv(kvbm_advisor *a, const kvbm_event_batch *b, uint64_t now_ms);

typedef enum kvbm_hint_kind {
  KVBM_HINT_PROMOTE = 1,
  KVBM_HINT_DEMOTE = 2,
  KVBM_HINT_DROP = 3,
  KVBM_HINT_COMPACT = 4,
} kvbm_hint_kind;

/* "Promote", "Demote", "Drop", "Compact"; "?" otherwise. */
KVBM_EXTERN const char *kvbm_hint_kind_name(int kind);

typedef struct kvbm_hint {
  kvbm_hint_kind kind;
  uint64_t sequence_hash;  /* the block (0 for COMPACT) */
  uint64_t prefix_hash;    /* its family (0 for COMPACT) */
  int from_volume;         /* index (kvbm_advisor_volume_get): where it is */
  int to_volume;           /* where it should go; -1 for DROP and COMPACT */
  uint32_t uses;           /* GPU stores seen */
  uint64_t idle_ms;        /* since its last use (0 while in G1) */
  uint64_t live_blocks;    /* COMPACT: blocks held now */
  uint64_t high_water;     /* COMPACT: the most it held */
  uint64_t ns;             /* the block's namespace (kvbm_index_namespace of
                              its cache_salt and LoRA name; 0: none) */
  uint32_t group;          /* the block's KV cache group (a hybrid model's:
                              kvbm/group.h; 0 for one-group models and
                              COMPACT). The block is (sequence_hash, ns,
                              group): equal hashes of two groups are two
                              blocks. On the wire as kvbm_wire_hint.group */
} kvbm_hint;

/* Derives up to cap hints at now_ms, most valuable first within each kind
 * (promotions of the most active families, demotions of the most used
 * blocks, compactions), and marks the blocks hinted so that they are not
 * hinted again within rehint_ms. *n is how many were written. A scan of
 * the index: O(entries). */
KVBM_EXTERN int kvbm_advisor_hints(kvbm_advisor *a, uint64_t now_ms, kvbm_hint *out, size_t cap,
                                   size_t *n);

typedef struct kvbm_advisor_volume_info {
  const char *name;        /* NUL-terminated, valid while the advisor lives */
  int tier;                /* kvbm_tier or -1 */
  uint64_t live_blocks, live_bytes;
  uint64_t stores, removes;
  uint64_t high_water;
  uint64_t indexed;        /* live blocks the index knows (<= live_blocks) */
  double eviction_age_ms;  /* idle time of the blocks it removes (0: none yet) */
} kvbm_advisor_volume_info;

KVBM_EXTERN size_t kvbm_advisor_volume_count(const kvbm_advisor *a);
/* KVBM_ENOTFOUND for an index out of range. */
KVBM_EXTERN int kvbm_advisor_volume_get(const kvbm_advisor *a, size_t i,
                                        kvbm_advisor_volume_info *out);

typedef struct kvbm_advisor_prefix_info {
  uint64_t prefix_hash;
  double score;            /* decayed activity at the time asked */
  uint64_t last_ms;        /* last activity */
  uint64_t events;         /* stores and uses seen, all time */
  uint32_t blocks[KVBM_ADVISOR_MAX_VOLUMES]; /* indexed blocks per volume */
} kvbm_advisor_prefix_info;

/* The family prefix_hash in namespace ns (kvbm_index_namespace of a
 * cache_salt and LoRA name; 0: none). KVBM_ENOTFOUND when it is not
 * tracked. */
KVBM_EXTERN int kvbm_advisor_prefix_get(const kvbm_advisor *a, uint64_t prefix_hash, uint64_t ns,
                                        uint64_t now_ms, kvbm_advisor_prefix_info *out);

typedef struct kvbm_advisor_stats {
  uint64_t storage_events, kv_events, kv_other_media;
  uint64_t uses, onboard_uses;   /* GPU stores; those of blocks held in a volume */
  uint64_t refused_volume;       /* events of volumes over max_volumes */
  uint64_t refused_source;       /* batches of sources over the bound (ids not tracked) */
  uint64_t lost_events;          /* jumps in a source's event ids */
  uint64_t source_restarts;      /* a source's ids went back */
  uint64_t unknown_removes;      /* removes of blocks the index did not know */
  uint64_t forgotten_blocks;     /* entries dropped for the bound */
  uint64_t forgotten_held;       /* ... of which a volume still held */
  uint64_t forgotten_prefixes;
  uint64_t entries, prefixes;
  uint64_t memory_bytes;         /* tables now */
  uint64_t hints[5];             /* by kind (index = kvbm_hint_kind) */
  uint64_t bad_groups;           /* events refused for a group_idx outside
                                    0..KVBM_GROUPS_MAX-1 (KV events' field,
                                    storage events' extra_metadata) */
} kvbm_advisor_stats;

KVBM_EXTERN void kvbm_advisor_stats_get(const kvbm_advisor *a, kvbm_advisor_stats *out);

/* --------------------------------------------------------- hints on the wire */

/* Hints leave the advisor on a NATS subject (and over HTTP as JSON) naming
 * volumes by id. One msgpack message per derivation, with the sequence in
 * the NATS header Kvbm-Seq like KV and storage events:
 *   [ts, [hint, ...], source]
 *   hint = [kind ("Promote" | "Demote" | "Drop" | "Compact"), sequence_hash,
 *           prefix_hash, from_location, to_location | nil, uses, idle_ms,
 *           live_blocks, high_water, ...]
 * (docs/areas/advisor.md). Strings are borrowed as in storage events. */
typedef struct kvbm_wire_hint {
  kvbm_hint_kind kind;
  uint64_t sequence_hash, prefix_hash;
  const char *from; /* volume id (not NUL-terminated when decoded) */
  size_t from_len;
  const char *to;   /* NULL when none (DROP, COMPACT) */
  size_t to_len;
  uint64_t uses, idle_ms, live_blocks, high_water;
  uint64_t ns;      /* namespace (10th field; 0 when absent) */
  uint32_t group;   /* KV cache group, < KVBM_GROUPS_MAX (11th field; 0 when
                       absent, as from an advisor that predates groups) */
} kvbm_wire_hint;

typedef struct kvbm_hint_batch {
  uint64_t seq;
  double ts;
  const char *source;
  size_t source_len;
  const kvbm_wire_hint *hints;
  size_t num_hints;
} kvbm_hint_batch;

/* A derived hint with its volumes named (pointers into the advisor, valid
 * while it lives). KVBM_ENOTFOUND for a volume index it does not know. */
KVBM_EXTERN int kvbm_advisor_hint_wire(const kvbm_advisor *a, const kvbm_hint *h,
                                       kvbm_wire_hint *out);

/* Appends a batch's msgpack to *buf (as kvbm_storage_encode). KVBM_EINVAL
 * for a kind outside the enum or a volume id that is empty, too long or has
 * control bytes; KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_hints_encode(const kvbm_hint_batch *b, uint8_t **buf, size_t *len,
                                  size_t *cap, kvbm_error *err);

typedef struct kvbm_hint_decoder kvbm_hint_decoder;
KVBM_EXTERN int kvbm_hint_decoder_create(kvbm_hint_decoder **out, kvbm_error *err);
KVBM_EXTERN void kvbm_hint_decoder_destroy(kvbm_hint_decoder *d); /* NULL is a no-op */

/* Decodes one message, bounds-checked like kvbm_storage_decode: counts
 * checked against the bytes left, unknown kinds, missing or mistyped
 * fields, bad volume ids and trailing bytes refused with a message naming
 * the hint and field (a group of 16 or more is not a group); fields after
 * the eleventh skipped. */
KVBM_EXTERN int kvbm_hint_decode(kvbm_hint_decoder *d, const void *data, size_t len, uint64_t seq,
                                 kvbm_hint_batch *out, kvbm_error *err);

/* One hint as a JSON object; returns the length needed, like snprintf. */
KVBM_EXTERN size_t kvbm_wire_hint_to_json(const kvbm_wire_hint *h, char *buf, size_t cap);

/* ------------------------------------------------------- hints applied */

/* A manager's side of the hints: applies the hints of a batch that name
 * this manager's volumes (kvbm_manager_volume_id; a hint about another
 * engine's volume is counted and left alone) through kvbm_manager_hint,
 * and, when given a NATS subject, receives the advisor's batches on its own
 * thread: the engine's threads never see them. PROMOTE and DEMOTE need
 * both volumes to be this manager's; DROP its `from`; COMPACT is for the
 * storage provider and counted as ignored. */
typedef struct kvbm_hint_applier kvbm_hint_applier;

struct kvbm_manager;

typedef struct kvbm_hint_applier_config {
  const char *nats_url;    /* NULL: no subscription (apply batches by hand) */
  const char *subject;     /* the advisor's --hints-nats subject */
  int max_pending_bytes;   /* libnats' pending limit; what it drops is
                              counted (16 MiB) */
} kvbm_hint_applier_config;

KVBM_EXTERN kvbm_hint_applier_config kvbm_hint_applier_config_default(void);

typedef struct kvbm_hint_applier_stats {
  uint64_t batches, hints;   /* received (or given to _apply) */
  uint64_t bad_batches;      /* payloads that did not decode */
  uint64_t foreign;          /* hints about volumes this manager lacks */
  uint64_t ignored;          /* COMPACT */
  uint64_t applied;          /* kvbm_manager_hint returned KVBM_OK */
  uint64_t not_applied;      /* it returned anything else (its stats say why) */
  uint64_t lost;             /* batches missing by Kvbm-Seq (what libnats'
                                pending limit drops shows up here) */
} kvbm_hint_applier_stats;

/* Creates the applier for manager m (which must outlive it); with a NATS
 * URL, connects, subscribes and starts its thread. KVBM_EINVAL, KVBM_EIO
 * naming the URL, KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_hint_applier_create(const kvbm_hint_applier_config *cfg,
                                         struct kvbm_manager *m, kvbm_hint_applier **out,
                                         kvbm_error *err);

/* Applies one decoded batch now, on the caller's thread (not the
 * engine's!). Thread-safe with the applier's own thread. */
KVBM_EXTERN void kvbm_hint_applier_apply(kvbm_hint_applier *ap, const kvbm_hint_batch *b);

KVBM_EXTERN void kvbm_hint_applier_stats_get(kvbm_hint_applier *ap, kvbm_hint_applier_stats *out);

/* Stops the thread, closes the subscription, frees. NULL is a no-op. */
KVBM_EXTERN void kvbm_hint_applier_destroy(kvbm_hint_applier *ap);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_ADVISOR_H */
