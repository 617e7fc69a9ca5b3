/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/manager.h: the tiered block manager (G1 device, G2 host, G3 disk,
 * G4 a store shared with other engines).
 *
 * A manager owns one block pool (kvbm/pool.h) per tier, the tier's index,
 * over the tier's store:
 *
 *   G1  the engine's pool: host memory standing in for the GPU (default), or,
 *       in a CUDA build, device memory (g1_memory KVBM_MEMORY_DEVICE; copies
 *       to and from it run on a CUDA stream per worker) or pinned memory.
 *       The engine writes and reads KV through kvbm_manager_block_layer()
 *       (an address in the tier's memory) or kvbm_manager_block_write/read().
 *       Or engine-owned: the engine's own KV tensors (device or host),
 *       adopted with kvbm_storage_adopt() and given as g1_storage; kvbm
 *       never frees them.
 *   G2  host memory (kvbm/storage.h: system heap, or pinned in a CUDA build).
 *   G3  a volume (kvbm/volume.h): by default the local file of checksummed
 *       slots in g3_dir (disk://), or any URL (g3_url).
 *   G4  a volume shared with other engines (g4_url: redis://,
 *       redis+cluster://, file://, a vendor's): what one engine stores,
 *       another serves. Values are MRDN frames (kvbm/frame.h) checked in
 *       full before use; keys carry a namespace (layout fingerprint, hash
 *       scheme, block size, model id). G4's pool is this manager's index of
 *       what the store holds; blocks it does not know are looked up in the
 *       store by the prefill, one batch under g4_lookup_timeout_ms.
 *
 * Requests (kvbm_mreq) are the tiered form of kvbm/sequence.h:
 *
 *   1. kvbm_manager_prefill(): hashes the prompt's full blocks and walks them
 *      in order; block k is a hit in the fastest tier that holds it (G1, else
 *      G2, else G3, else G4) and the walk stops at the first block held
 *      nowhere (at most floor((L - 1) / block_size) blocks, as in W1). The
 *      prompt is hashed once: the sequence takes the manager's hashes and
 *      walk (kvbm_seq_prefill_plan). Blocks found
 *      below G1 get newly allocated G1 blocks, registered at once, and
 *      onboarding copies are queued; the rest of the prompt is allocated as
 *      in kvbm_seq_prefill.
 *   2. kvbm_mreq_poll() / kvbm_mreq_wait(): onboarding done? A failed onboard
 *      (I/O error, header or checksum mismatch, a value missing, foreign or
 *      truncated, queue full) shortens the match to the blocks before the first failure: the engine computes
 *      the rest, it never gets wrong bytes. A G1 block that another request
 *      registered but has not committed yet also ends the match (waiting
 *      for another request could deadlock an engine).
 *   3. The engine writes KV for blocks at and after the match, appends
 *      generated tokens (kvbm_mreq_append) and calls kvbm_mreq_commit() once
 *      the KV of every full block is written: commit is what offloads.
 *   4. kvbm_mreq_destroy() releases the request's G1 blocks, tail first.
 *
 * Offload policy (per target tier, see kvbm_offload_policy): on commit every
 * full block of the request is *used* once, in order. For each of G2, G3, G4:
 * a block already held (or being written) there is refreshed (its recency
 * is that of this use) and not copied again; otherwise the tier's policy
 * decides whether it is copied there. G2 copies come from G1; G3 and G4
 * copies come from G2 when G2 holds (or is receiving) the block, from G1
 * otherwise. A full tier evicts its least recently used cached block (the
 * pool's rule; G4's eviction forgets, it does not delete).
 *
 * Copies run on one worker thread per tier below G1 (host copies; volume
 * puts and gets), taken from bounded queues in batches. An offload that
 * finds its queue full (or its tier without a free block, or the store
 * failing) is skipped and counted;
 * no engine call ever waits for a copy (except kvbm_mreq_wait, and
 * kvbm_manager_flush, which exist to wait), and a prefill waits for a G4
 * lookup at most g4_lookup_timeout_ms.
 *
 * Threads: every function may be called from any thread at once (one
 * manager lock guards the pools; copies run outside it). A kvbm_mreq is
 * used by one thread at a time. Listeners are called with the manager lock
 * held, on the calling or a worker thread: they must not call the manager.
 */
#ifndef KVBM_MANAGER_H
#define KVBM_MANAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/fabric.h"
#include "kvbm/frame.h"
#include "kvbm/group.h"
#include "kvbm/hash.h"
#include "kvbm/hybrid.h"
#include "kvbm/layout.h"
#include "kvbm/metrics.h"
#include "kvbm/pool.h"
#include "kvbm/status.h"
#include "kvbm/tier.h"
#include "kvbm/volume.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Length bounds of kvbm_manager_config.g3_key (a secret of any bytes). */
#define KVBM_MANAGER_G3_KEY_MIN 16u
#define KVBM_MANAGER_G3_KEY_MAX 4096u
/* Length bounds of kvbm_manager_config.g4_key / g4_key_file's secret. */
#define KVBM_MANAGER_G4_KEY_MIN 16u
#define KVBM_MANAGER_G4_KEY_MAX 4096u


/* When a block that a tier does not hold is copied there on use. */
typedef enum kvbm_offload_policy {
  KVBM_OFFLOAD_NEVER = 0,     /* never (the tier only keeps what it has) */
  KVBM_OFFLOAD_ALL = 1,       /* every use: write-through */
  KVBM_OFFLOAD_FREQUENCY = 2, /* once the block's use count reaches the
                                 threshold (Dynamo's frequency filter) */
} kvbm_offload_policy;

/* "never", "all", "frequency"; parse returns false on anything else. */
KVBM_EXTERN const char *kvbm_offload_policy_name(int policy);
KVBM_EXTERN bool kvbm_offload_policy_parse(const char *s, kvbm_offload_policy *out);

typedef struct kvbm_manager_config {
  uint32_t block_size;         /* tokens per block (16) */
  kvbm_hash_scheme scheme;     /* native */
  /* Shape of one block's KV (num_blocks is ignored: each tier sets its
   * own). Default: 2 layers x 1 x 16 tokens x 64 elements x 2 bytes, 4096
   * alignment. */
  kvbm_layout_config layout;
  kvbm_layout_kind g1_kind, g2_kind; /* FullyContiguous both */
  /* Memory of G1 and G2 (kvbm/layout.h): G1 SYSTEM (default), PINNED or
   * DEVICE; G2 SYSTEM (default) or PINNED. PINNED/DEVICE need a CUDA build
   * (else create fails with KVBM_EUNSUPPORTED) and a GPU (else
   * KVBM_EDEVICE). With DEVICE G1, G1<->G2 copies are cudaMemcpyAsync on
   * the host worker's stream (pinned G2 makes them truly asynchronous) and
   * G1<->G3/G4 goes through the volume workers' staging buffers and their
   * streams. */
  kvbm_memory_type g1_memory, g2_memory;
  int32_t g1_device;           /* CUDA ordinal of DEVICE G1 (0) */
  /* Engine-owned G1 (and G2): a storage over memory the engine allocated
   * (kvbm_storage_adopt in kvbm/storage.h: its paged KV tensors on the
   * device, or host buffers), used as the tier's bytes in place instead of
   * memory kvbm allocates. Borrowed: the manager never releases it nor
   * frees, zeroes or writes its memory except through the engine's and
   * the copies' blocks; it must outlive the manager (release it after
   * kvbm_manager_destroy). Its layout must be the tier's: g1_kind (g2_kind)
   * over `layout` with g1_blocks (g2_blocks) blocks, same region count, each
   * region at least the layout's size, bases aligned (else KVBM_EINVAL
   * naming the field). The tier's memory and device are the storage's:
   * g1_memory and g1_device (g2_memory) are replaced by them, so an adopted
   * DEVICE G1 takes exactly the device path above (CUDA streams, synchronous
   * cudaMemcpy for block_write/read). G1 may be SYSTEM, PINNED or DEVICE,
   * G2 SYSTEM or PINNED; g2_storage needs g2_blocks >= 1; the two must
   * differ; a storage without addresses is refused. NULL (default): kvbm
   * allocates the tier. */
  struct kvbm_storage *g1_storage, *g2_storage;
  uint32_t g1_blocks;          /* >= 1 (1024) */
  uint32_t g2_blocks;          /* 0 = no G2 (0) */
  uint64_t g3_blocks;          /* 0 = no G3 (0); at most KVBM_POOL_MAX_BLOCKS */
  const char *g3_dir;          /* directory of the G3 file (NULL: the
                                  private /tmp/kvbm-<uid>; the rules are in
                                  docs/areas/tiers.md, "Threat model");
                                  copied at create */
  bool g3_persist;             /* keep the file (kvbm-g3.slots) across runs
                                  and rebuild the index from it (false: a
                                  fresh unlinked file) */
  const void *g3_key;          /* NULL (default): G3 slots carry XXH3 sums,
                                  which catch torn writes and bit rot. A
                                  secret of KVBM_MANAGER_G3_KEY_MIN..MAX
                                  bytes: keyed-BLAKE3 sums (key derived from
                                  it; the secret is not kept), which also
                                  catch slots forged by anyone who can write
                                  the file but lacks the secret. Costs
                                  BLAKE3's speed on every G3 write and read. */
  size_t g3_key_len;
  bool g3_direct;              /* O_DIRECT (true; refused -> buffered) */
  bool g3_uring;               /* io_uring (true; unavailable -> pread/pwrite) */
  uint32_t g3_queue_depth;     /* disk requests in flight (8) */
  kvbm_offload_policy g2_policy; /* ALL */
  kvbm_offload_policy g3_policy; /* FREQUENCY */
  uint32_t freq_threshold;     /* uses that earn a copy (2) */
  uint32_t freq_decay_uses;    /* every this many uses all counts halve (65536) */
  uint32_t freq_max_entries;   /* counts remembered; when full, decay (1 << 20) */
  uint32_t queue_capacity;     /* jobs per worker queue (4096) */
  uint32_t batch_max;          /* jobs a worker takes at once (64) */
  bool drain_on_destroy;       /* destroy finishes queued copies (true) or
                                  cancels them */
  /* Optional pool listeners, one per tier (BlockStored/Removed per tier).
   * G1's STORED events name the request that registered the block
   * (kvbm_pool_event.context is its kvbm_mreq *); other tiers' carry NULL.
   * With groups (num_groups > 1) every tier's STORED and REMOVED events
   * carry the block's own sequence hash and parent hash and its group
   * (kvbm_pool_event.group: vLLM's (block_hash, group_idx)), not the key
   * the tier files it under; two groups' blocks of one prompt have the
   * same hashes and differ by group. Give a kvbm_pool_link the manager's
   * group list (kvbm_pool_link_set_groups) and its events carry group_idx
   * and the spec kind as vLLM's do. A G3 warm restart keeps each block's
   * group (the slot file's tag): restored blocks report their own hash and
   * group, no parent; a slot file of another group list is refused at
   * create (KVBM_EFORMAT naming both lists). One group: events as they
   * were (the key is the hash). */
  kvbm_pool_listener listener[KVBM_TIER_COUNT];
  void *listener_user[KVBM_TIER_COUNT];
  /* Optional: storage events (kvbm/storage_events.h, the seed's StoreEvent
   * and RemoveEvent) for the volumes this manager writes, G2, G3 and G4:
   * a Store when a block is registered in the volume (its copy queued), a
   * Remove when it leaves it (evicted, dropped, cleared). Published under
   * the manager lock, so give a publisher with overflow DROP (the default):
   * a full queue counts a drop in the publisher's stats, never a wait.
   * Not owned; it must be started and outlive the manager. Fields:
   *   storage_location  G3, G4: kvbm_volume_name of the tier's volume;
   *                     G2: g2_volume_name
   *   prefix_hash       the sequence hash of the first block of the request
   *                     whose commit stored the block (its prefix family);
   *                     0 for blocks indexed without a request (a G4 lookup,
   *                     a warm restart's keys)
   *   block_size        the block's bytes (one FullyContiguous block)
   *   extra_metadata    {"tier": "G2" | "G3" | "G4"}; with groups also
   *                     "group_idx": g, "kv_cache_spec_kind" (and
   *                     "kv_cache_spec_sliding_window" for sw:W), and
   *                     sequence_hash is the block's own hash (see the
   *                     listeners above) */
  struct kvbm_storage_publisher *storage_events;
  const char *g2_volume_name;  /* G2's storage_location ("g2"; copied) */

  /* ---- volume tiers (kvbm/volume.h): G3 and G4 keep their bytes in a
   * volume chosen by URL; strings are copied at create. ---- */
  const char *g3_url;          /* G3's store (NULL: disk://<g3_dir>, the
                                  slot file; g3_persist, g3_direct, g3_uring
                                  and g3_queue_depth apply to it) */
  const char *g4_url;          /* G4: a store shared with other engines
                                  (redis://, redis+cluster://, file://, a
                                  vendor's scheme); NULL: no G4 */
  uint32_t g4_blocks;          /* G4's index: the blocks this manager knows
                                  the store holds, LRU (100000, Dynamo's
                                  DYN_KVBM_OBJECT_NUM_BLOCKS default);
                                  forgetting one does not delete it */
  kvbm_offload_policy g4_policy; /* ALL */
  uint32_t g4_queue_depth;     /* G4 operations in flight (16) */
  int32_t g4_timeout_ms;       /* deadline of one G4 put batch, and of a
                                  prefill's G4 onboards all together (2000):
                                  the match ends at the first block that
                                  failed or is still out then; later ones
                                  are abandoned (stats: abandoned) */
  int32_t g4_lookup_timeout_ms;/* longest a prefill waits for its G4 lookup
                                  (20; 0: no lookups, G4 serves only what
                                  this manager stored) */
  uint32_t g4_lookup_max;      /* blocks one lookup asks about (512) */
  int32_t g4_backoff_ms;       /* a G4 that failed 8 reads in a row (down,
                                  late, errors, values not ours), or made a
                                  prefill wait its whole deadline, is left
                                  alone this long (1000): no lookups, hits
                                  or puts; doubling up to 32x while it goes
                                  on failing; 0: never */
  /* G4's cluster key (issue 23; docs/areas/tiers.md "Authenticated G4").
   * NULL and NULL (default): G4 values are frames with a plain BLAKE3-128,
   * which anyone who can write the store can recompute. A secret of
   * KVBM_MANAGER_G4_KEY_MIN..MAX bytes, given as bytes (g4_key) or as the
   * path of a file holding it (g4_key_file: a regular file of this user,
   * not a symbolic link, that no other user can read or write; one
   * trailing newline is dropped), never both: values are keyed frames
   * (BLAKE3 keyed with a key derived from the secret), and a value that
   * is not one of ours under that key (unkeyed, another key, forged) is a
   * counted miss (stats: auth_failures). Every manager sharing the store
   * needs the same secret; a manager without one refuses keyed values
   * (auth_failures too). Read at create; the secret is not kept (the
   * derived key is, and is zeroed at destroy). */
  const void *g4_key;
  size_t g4_key_len;
  const char *g4_key_file;
  bool g4_encrypt;             /* with a G4 key: values are also encrypted
                                  at rest (XChaCha20-Poly1305, libsodium;
                                  a random 24-byte nonce per value, 24 bytes
                                  more a value); the store sees no KV bytes.
                                  Every manager sharing the store needs the
                                  same setting: a sealed value is refused by
                                  a manager that only MACs, and the other
                                  way round (auth_failures). Costs ~2.5-3x
                                  plain framing's CPU per block (W4,
                                  bench_g4_mac) */
  const char *model_id;        /* in the volume keys' namespace, with the
                                  layout fingerprint, hash scheme and block
                                  size: [A-Za-z0-9._-]{1,64} (NULL: "default") */
  /* A vendor's backend for g3_url's or g4_url's scheme (kvbm/volume.h;
   * NULL: the built-in backends). Pointed to: it must outlive the manager. */
  const kvbm_volume_backend *g3_backend, *g4_backend;
  void *g3_backend_user, *g4_backend_user;
  /* The metrics endpoint (kvbm/metrics.h): with metrics.enabled, create
   * starts an HTTP server on metrics.host:metrics.port serving GET
   * /metrics from a registry of the manager's own (its collector
   * registered; kvbm_manager_metrics() gives it to the engine for more).
   * Off by default; kvbm_manager_config_env switches it on as Dynamo does
   * (DYN_KVBM_METRICS=true, DYN_KVBM_METRICS_PORT, default 6880). */
  kvbm_metrics_server_config metrics;

  /* ---- disaggregation (ADR-0006; the peers: kvbm/peer.h) ---- */
  uint32_t offload_threshold_blocks; /* ExitThink pushes a request's
                                  ThinkComplete blocks to peer 0 in one batch
                                  once at least this many are ready
                                  (committed) (8; 0: never) */
  bool output_pull;            /* the OutputCritical pull (false: the ADR
                                  defers this policy). Only for a prefill
                                  of a request in the output phase
                                  (kvbm_manager_prefill, or
                                  kvbm_manager_prefill_phase with OUTPUT;
                                  never REASONING), with a peer attached:
                                  1. room: when G1 has fewer free blocks
                                  than the prefill will take (the rest of
                                  the prompt and its onboards, pulled
                                  blocks included), cached G1 copies of
                                  blocks a peer acknowledged holding are
                                  dropped, in eviction order (ThinkComplete
                                  ones first: demoted), until enough are
                                  free or none is left; blocks held only
                                  here, and the prefill's own hits, are not
                                  touched (peer stats: dropped_for_room);
                                  2. pull: if the walk stops at a block
                                  held nowhere here but acknowledged by a
                                  peer, that block and the peer-held ones
                                  after it are asked back (pulls_asked,
                                  pulled_blocks) and the walk is taken
                                  again; the prefill's G1 hits are pinned
                                  meanwhile, so the landing evicts none.
                                  Appends (decode) never pull. */
  int32_t pull_timeout_ms;     /* longest such a prefill waits for the
                                  pulled blocks, the lock dropped (200) */

  /* ---- KV cache groups of a hybrid model (kvbm/group.h; "Hybrid
   * requests" below). NULL / 0: one full-attention group, the manager as
   * described above, unchanged. With a list, every tier keeps the blocks
   * of all groups in its one block budget (as vLLM's one GPU pool does),
   * each registered under (sequence hash, group); the hybrid calls
   * kvbm_manager_hprefill / kvbm_hreq_* serve requests. Copied at create. */
  const kvbm_group_spec *groups;
  size_t num_groups;           /* 0..KVBM_GROUPS_MAX, at most g1_blocks */
  /* Optional, one per group (NULL: every group's block is the tier's whole
   * block, `layout`). */
  const struct kvbm_group_layout *group_layouts;
  /* Which full blocks of the sliding-window and Mamba groups a hybrid
   * request registers in G1 (kvbm/hybrid.h's kvbm_hseq_retention, the
   * rule of vLLM's prefix_cache_retention_interval; hybrid.md, "Session
   * 15: the manager follows sparse retention on request"):
   * KVBM_HSEQ_RETAIN_ALL (0, the default, vLLM's None): every full block,
   * as before. KVBM_HSEQ_RETAIN_BOUNDARIES (vLLM's 0, its default since
   * 2026-08): only the cdiv(W - 1, B) window blocks, or the one Mamba state
   * block, ending at the prompt's last token and at the shared-prefix
   * junction (kvbm_groups_hit_junction), each floored to a block. A block
   * not kept is never registered, never offloaded, publishes no event and
   * is never pushed to a peer: it goes back to G1's free list when
   * released, and the engine always computes it. Full attention and
   * chunked local stay dense. Ignored without groups; any other value:
   * KVBM_EINVAL at create. */
  kvbm_hseq_retention hybrid_retention;
} kvbm_manager_config;

/* The defaults above. */
KVBM_EXTERN kvbm_manager_config kvbm_manager_config_default(void);

/* Applies the environment to *cfg (see docs/areas/tiers.md): Dynamo's
 * names where Dynamo has the setting,
 *   DYN_KVBM_CPU_CACHE_GB                   G2 size in GiB (decimal allowed)
 *   DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS  G2 blocks (wins over _GB)
 *   DYN_KVBM_DISK_CACHE_GB                  G3 size in GiB
 *   DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS G3 blocks (wins over _GB)
 *   DYN_KVBM_DISK_CACHE_DIR                 G3 directory
 *   DYN_KVBM_DISK_DISABLE_O_DIRECT          true/1/yes: buffered disk I/O
 *   DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER    true: G3 policy "all"
 *   DYN_KVBM_TRANSFER_BATCH_SIZE            batch_max
 *   DYN_KVBM_OBJECT_ENABLED                 false/0: no G4 even with a URL
 *   DYN_KVBM_OBJECT_NUM_BLOCKS              g4_blocks
 *   DYN_KVBM_METRICS, DYN_KVBM_METRICS_PORT metrics.enabled, metrics.port
 *                                           (kvbm_metrics_server_config_env)
 * and kvbm's own otherwise,
 *   KVBM_G3_URL, KVBM_G4_URL                g3_url, g4_url
 *   KVBM_G2_POLICY, KVBM_G3_POLICY, KVBM_G4_POLICY   never/all/frequency
 *   KVBM_G4_QUEUE_DEPTH, KVBM_G4_TIMEOUT_MS, KVBM_G4_LOOKUP_TIMEOUT_MS,
 *   KVBM_G4_LOOKUP_MAX, KVBM_G4_BACKOFF_MS  the G4 fields of the same names
 *   KVBM_MODEL_ID                           model_id
 *   KVBM_G4_KEY_FILE                        g4_key_file (a path)
 *   KVBM_G4_ENCRYPT                         g4_encrypt (true/false)
 *   DYN_KVBM_G4_KEY                         g4_key (the secret itself;
 *                                           the file is the better way:
 *                                           the environment is readable
 *                                           by the user's processes)
 *   KVBM_METRICS_HOST                       metrics.host
 * GiB sizes count whole blocks of the config's layout. `env` is an
 * environ-style NULL-terminated "NAME=value" array, or NULL for the
 * process environment. Strings are pointed to, not copied: they must
 * outlive the config's use. A malformed value: KVBM_EINVAL naming the
 * variable, *cfg unchanged. */
KVBM_EXTERN int kvbm_manager_config_env(kvbm_manager_config *cfg, const char *const *env,
                            kvbm_error *err);

typedef struct kvbm_manager kvbm_manager;
typedef struct kvbm_mreq kvbm_mreq;

/* Creates the pools, storages, volumes and the worker threads. A G3 or G4
 * whose store cannot be opened (unwritable directory, ...) does not fail
 * create: the manager serves with that tier unavailable, counts every
 * offload to it as skipped and reports why in kvbm_manager_tier_error().
 * (A Redis that is down is not "cannot be opened": it is reconnected to
 * later, and meanwhile its operations fail and are counted.) Bad config:
 * KVBM_EINVAL naming the field; a malformed G3/G4 URL KVBM_EINVAL, an
 * unknown scheme without a backend KVBM_EUNSUPPORTED, both naming the
 * field. With metrics.enabled, create also starts the metrics endpoint
 * (a port that cannot be bound fails create with KVBM_EIO naming it).
 * Free with kvbm_manager_destroy(). */
KVBM_EXTERN int kvbm_manager_create(const kvbm_manager_config *cfg, kvbm_manager **out,
                        kvbm_error *err);

/* Stops the workers (draining or cancelling queued copies per the config),
 * then frees everything. Requests must be destroyed first. NULL: no-op. */
KVBM_EXTERN void kvbm_manager_destroy(kvbm_manager *m);

/* The manager's metrics registry when its endpoint runs (config
 * metrics.enabled), NULL otherwise: register more collectors there (a
 * publisher's, the engine's own) to serve them on the same page; they must
 * be unregistered before the manager is destroyed. Lives as long as the
 * manager. */
KVBM_EXTERN kvbm_metrics *kvbm_manager_metrics(kvbm_manager *m);

/* The port the metrics endpoint listens on (the one picked for port 0),
 * 0 when it does not run. */
KVBM_EXTERN uint16_t kvbm_manager_metrics_port(const kvbm_manager *m);

/* Waits until every queued copy has finished. */
KVBM_EXTERN void kvbm_manager_flush(kvbm_manager *m);

/* Waits until every queued copy to or from G2 and G3 has finished; G4's
 * (the network's) may still be out, bounded by g4_timeout_ms. What an
 * engine calls between steps when the next step should see this one's
 * local copies but must not stall while Redis is slow or unreachable. */
KVBM_EXTERN void kvbm_manager_flush_local(kvbm_manager *m);

/* Why G3 is unavailable ("" when it is available or not configured). The
 * string lives as long as the manager. */
KVBM_EXTERN const char *kvbm_manager_g3_error(const kvbm_manager *m);

/* The same for any tier: why it is configured but unavailable (a volume
 * that could not be registered, a slot file that could not be opened),
 * "" otherwise. Lives as long as the manager. */
KVBM_EXTERN const char *kvbm_manager_tier_error(const kvbm_manager *m, kvbm_tier tier);

/* How a tier's bytes move: "io_uring+O_DIRECT" (G3's slot file), the
 * volume's URL without user info ("redis://127.0.0.1:6379"), "memory";
 * "" for an absent tier. Lives as long as the manager. */
KVBM_EXTERN const char *kvbm_manager_tier_mode(const kvbm_manager *m, kvbm_tier tier);

/* The layout of a tier's blocks (G3: the layout blocks are gathered from);
 * NULL for an absent tier. */
KVBM_EXTERN const kvbm_layout *kvbm_manager_layout(const kvbm_manager *m, kvbm_tier tier);

/* Bytes of one block's KV (num_layers * layer_stride). */
KVBM_EXTERN uint64_t kvbm_manager_block_bytes(const kvbm_manager *m);

/* Address and size of one layer of a G1 or G2 block: where the engine
 * writes and reads KV. The address is in the tier's memory: a host pointer
 * for SYSTEM and PINNED, a device pointer (not dereferenceable on the host)
 * for DEVICE G1. KVBM_ETIER for G3 or an absent tier, KVBM_ERANGE for an id
 * or layer out of range. */
KVBM_EXTERN int kvbm_manager_block_layer(const kvbm_manager *m, kvbm_tier tier,
                             uint32_t block, uint32_t layer, void **ptr,
                             size_t *size);

/* Copies n bytes (at most the layer's size) between host memory and the
 * start of one layer of a G1 or G2 block, whatever the tier's memory
 * (memcpy, or a synchronous cudaMemcpy for DEVICE G1). Errors as
 * kvbm_manager_block_layer, KVBM_EINVAL for n too large, KVBM_EDEVICE if
 * the CUDA copy fails. The caller owns the block's bytes meanwhile (its
 * request must compute it, or it is a settled match). */
KVBM_EXTERN int kvbm_manager_block_write(const kvbm_manager *m, kvbm_tier tier, uint32_t block,
                             uint32_t layer, const void *src, size_t n, kvbm_error *err);
KVBM_EXTERN int kvbm_manager_block_read(const kvbm_manager *m, kvbm_tier tier, uint32_t block,
                            uint32_t layer, void *dst, size_t n, kvbm_error *err);

/* The memory a tier's blocks live in (G3: KVBM_MEMORY_DISK); 0 for an
 * absent tier. */
KVBM_EXTERN kvbm_memory_type kvbm_manager_memory(const kvbm_manager *m, kvbm_tier tier);

/* Per-tier counters. Pool numbers are a snapshot. */
typedef struct kvbm_tier_stats {
  bool present;               /* tier configured (G3: and its file open) */
  uint32_t num_blocks, free, cached, active;
  uint64_t allocated;         /* blocks the pool handed out, ever */
  uint64_t evictions;         /* cached blocks evicted to make room */
  uint64_t hit_blocks;        /* prefill walk hits served by this tier */
  uint64_t offloaded_blocks;  /* copies written into this tier (G1: 0) */
  uint64_t offloaded_bytes;
  uint64_t onboarded_blocks;  /* verified copies from this tier to G1 (G1: 0) */
  uint64_t onboarded_bytes;
  uint64_t filtered;          /* uses the policy did not copy here */
  uint64_t skipped_queue;     /* offloads skipped: queue full */
  uint64_t skipped_space;     /* offloads skipped: no evictable block */
  uint64_t skipped_io;        /* offloads skipped: the store refused or
                                 failed the put (G3, G4) */
  uint64_t skipped_unavailable; /* offloads skipped: store not open (G3, G4) */
  uint64_t onboard_failures;  /* onboards that failed (any reason) */
  uint64_t checksum_failures; /* reads whose value failed its check (slot
                                 header or checksum, frame BLAKE3) */
  uint64_t read_errors;       /* reads that failed or timed out (store down,
                                 slow, I/O error) */
  uint64_t copy_errors;       /* CUDA copies into (offload) or out of
                                 (onboard) this tier that failed */
  uint64_t restored_blocks;   /* G3: slots indexed at a warm restart */
  uint64_t restore_skipped;   /* G3: torn or corrupt slots skipped then */
  double busy_seconds;        /* time the worker spent copying into/out of it */
  /* Volume tiers. A value that cannot be used is a counted miss, never
   * bytes: onboard_failures counts each, and one of these says why. */
  uint64_t missing;           /* gets of indexed blocks the store no longer
                                 held (evicted, restarted, failed over) */
  uint64_t foreign;           /* values of another namespace, key, layout
                                 or size (checksum_failures: a bad check) */
  uint64_t auth_failures;     /* G4: values refused by the cluster key
                                 (g4_key): unkeyed while we hold a key,
                                 keyed while we hold none, or a MAC that
                                 does not match (forged, another key) */
  uint64_t lookups;           /* G4: lookups sent (one per prefill that
                                 reached past G3) */
  uint64_t lookup_blocks;     /* blocks they asked about */
  uint64_t lookup_found;      /* blocks the store held */
  uint64_t lookup_timeouts;   /* lookups past g4_lookup_timeout_ms: the
                                 prefill went on without them */
  uint64_t lookup_errors;     /* lookups the store failed (down, full queue) */
  uint64_t abandoned;         /* onboards given up: past the prefill's
                                 deadline (g4_timeout_ms), or after an
                                 earlier block of the match failed; never
                                 copied into G1 (not in onboard_failures) */
  uint64_t backoffs;          /* G4: times the store was left alone
                                 (g4_backoff_ms) */
  uint64_t backoff_skips;     /* G4: lookups, hits and puts skipped while
                                 it was */
} kvbm_tier_stats;
KVBM_EXTERN int kvbm_manager_stats_get(kvbm_manager *m, kvbm_tier tier, kvbm_tier_stats *out);

/* ---- storage hints (kvbm/advisor.h; the seed's "non-intrusive" storage
 * provider). A storage advisor watches the manager's storage events and
 * suggests moves; these apply one, off the engine's path: they take the
 * manager lock only to queue a copy (never wait for bytes), and the copy
 * runs on the tier's worker like an offload. Call them from any thread
 * but the engine's (kvbm_hint_applier, kvbm/advisor.h, does so on its own
 * thread for hints received over NATS). ---- */

/* The kinds, numbered as kvbm_hint_kind. */
typedef enum kvbm_manager_hint_kind {
  KVBM_MANAGER_HINT_PROMOTE = 1, /* from G3/G4 into G2: an asynchronous onboard */
  KVBM_MANAGER_HINT_DEMOTE = 2,  /* from G2 into G3/G4, then out of G2 (a move) */
  KVBM_MANAGER_HINT_DROP = 3,    /* out of `from` now (cached blocks only) */
} kvbm_manager_hint_kind;

typedef struct kvbm_manager_hint_stats {
  uint64_t received;      /* calls */
  uint64_t promoted;      /* promotions whose copy into G2 finished */
  uint64_t demoted;       /* demotions whose copy finished (and left G2) */
  uint64_t dropped;       /* blocks dropped (drops, and demotions to a tier
                             that already held the block) */
  uint64_t queued;        /* copies queued (promoted + demoted + failed
                             + in flight) */
  uint64_t failed;        /* copies that failed */
  uint64_t already;       /* nothing to do: the block is where it should be */
  uint64_t missing;       /* the block is not (readably) in `from` */
  uint64_t busy;          /* in use, a full queue, or no evictable block:
                             the hint is not applied (hints are advice) */
  uint64_t refused;       /* a kind or tier pair that makes no sense here */
} kvbm_manager_hint_stats;

/* Applies one hint about block sequence_hash. `from` and `to` are this
 * manager's tiers (kvbm_manager_volume_id maps a hint's volume ids to
 * them); `to` is ignored for DROP. Returns KVBM_OK when a copy was queued
 * or a block dropped; KVBM_EEXIST when nothing needs doing; KVBM_ENOTFOUND
 * when `from` does not hold the block ready; KVBM_EAGAIN when it is in use
 * or there is no room now; KVBM_EINVAL/KVBM_ETIER for a pair that makes
 * no sense (PROMOTE: from G3/G4 to G2; DEMOTE: from G2 to G3/G4; a tier
 * not configured, or a device G2). Each outcome is counted. Cost: a few
 * index lookups under the manager lock. */
KVBM_EXTERN int kvbm_manager_hint(kvbm_manager *m, kvbm_manager_hint_kind kind,
                                  uint64_t sequence_hash, kvbm_tier from, kvbm_tier to);

/* kvbm_manager_hint for group `group`'s block of sequence_hash on a
 * manager with KV cache groups (the advisor keeps groups apart and names
 * the group in each hint). Group 0 is kvbm_manager_hint itself; another
 * group's block is the one the tiers file under (hash, group). A group
 * this manager does not have is KVBM_EINVAL, counted as received and
 * refused. Same threads and cost as kvbm_manager_hint. */
KVBM_EXTERN int kvbm_manager_hint_group(kvbm_manager *m, kvbm_manager_hint_kind kind,
                                        uint64_t sequence_hash, uint32_t group, kvbm_tier from,
                                        kvbm_tier to);

KVBM_EXTERN void kvbm_manager_hint_stats_get(kvbm_manager *m, kvbm_manager_hint_stats *out);

/* The volume id this manager's storage events give tier t (the
 * storage_location: kvbm_volume_name of G3/G4's volume, G2's
 * g2_volume_name), or NULL when t is G1, absent or not open. Valid while
 * the manager lives. */
KVBM_EXTERN const char *kvbm_manager_volume_id(const kvbm_manager *m, kvbm_tier t);

/* G3 I/O mode in use: "io_uring+O_DIRECT", "pread/pwrite+O_DIRECT",
 * "io_uring+buffered", ...; "" without G3. Lives as long as the manager. */
KVBM_EXTERN const char *kvbm_manager_g3_mode(const kvbm_manager *m);

/* ---- where a block is ---- */

typedef struct kvbm_block_location {
  bool remote;     /* false: local (the ADR's default) */
  bool held;       /* local: some tier here holds it (tier says which) */
  kvbm_tier tier;  /* local and held: the fastest tier holding it */
  uint32_t peer;   /* remote: the peer that acknowledged it */
} kvbm_block_location;

/* Local when a tier here holds the block (or when no peer is attached),
 * else remote when a peer (kvbm/peer.h) acknowledged it within its lease,
 * else local and not held. Any thread. Cost: an index lookup per tier
 * under the manager lock, then the peers' `remote` hook. */
KVBM_EXTERN int kvbm_manager_block_location(kvbm_manager *m, uint64_t seq_hash,
                                            kvbm_block_location *out);

/* ---- the peers' side of the manager (kvbm/peer.h, src/peer/) ----
 *
 * The peers are a module above the manager: they move blocks with the
 * calls below, and the manager calls them back through hooks they
 * register, so nothing here depends on them. An engine does not need
 * these calls (kvbm/peer.h's are the peers' API); they are public so that
 * the peers use nothing else, and an engine's own transport could too.
 *
 * A block is named by a kvbm_block_ref: its tier (G1 or G2) and id there,
 * valid while pinned (kvbm_manager_block_pin keeps it from being evicted
 * or re-registered, and its bytes unchanged, until unpinned). */

typedef struct kvbm_block_ref {
  kvbm_tier tier;          /* G1 or G2 */
  uint32_t id;             /* the block's id in that tier */
  uint64_t seq_hash, parent_hash, salt_hash;
  bool has_parent;
  const uint32_t *tokens;  /* block_tokens tokens, or NULL: not known here */
  kvbm_frame_phase phase;  /* its phase label (put: ThinkComplete blocks
                              are demoted, the first to go) */
} kvbm_block_ref;

typedef struct kvbm_manager_peer_hooks {
  void *user;
  /* Whether a peer holds seq_hash by a word within its lease (*peer, may
   * be NULL: which). for_room: the manager drops its G1 copy on that word
   * (the OutputCritical pull's room; the peer counts it). Called with the
   * manager lock held or not, and under the hooks' own lock: must not call
   * the manager. */
  bool (*remote)(void *user, uint64_t seq_hash, bool for_room, uint32_t *peer);
  /* The OutputCritical pull: asks `peer` for hashes[0..n) and waits at
   * most timeout_ms until they are held here; returns how many are.
   * Without any manager lock (it may call the manager). */
  size_t (*pull)(void *user, uint32_t peer, const uint64_t *hashes, size_t n, int timeout_ms);
  /* ExitThink's batch for peer 0: blocks[0..n), pinned by the manager
   * (tokens included) until the hook returns. Without any manager lock. */
  void (*exit_think)(void *user, const kvbm_block_ref *blocks, size_t n);
  /* seq_hash has left both G1 and G2 here (all: a tier's cache was
   * cleared). Under the manager lock and the hooks' lock: must not call
   * the manager; O(peers). */
  void (*gone)(void *user, uint64_t seq_hash, bool all);
  /* kvbm_manager_destroy, before the tiers go: stop every thread that may
   * call the manager, then free user. No hook is called after it. */
  void (*destroy)(void *user);
} kvbm_manager_peer_hooks;

/* Registers the peers' hooks, once per manager (every function set).
 * KVBM_EEXIST when some are registered already (the caller then uses
 * kvbm_manager_peer_hooks_user's); KVBM_EINVAL for a missing function. A
 * gone hook costs each eviction from G1 or G2 one check of G1 or G2 from
 * then on (nothing before). */
KVBM_EXTERN int kvbm_manager_peer_hooks_set(kvbm_manager *m, const kvbm_manager_peer_hooks *h,
                                            kvbm_error *err);
/* The registered hooks' user pointer, NULL when none are. Any thread. */
KVBM_EXTERN void *kvbm_manager_peer_hooks_user(kvbm_manager *m);

/* Kept sums (issue 22): from now on each G1 and G2 block keeps the
 * 16-byte sum of its bytes (layer 0 first) once computed: at its first
 * copy into G2 (by the host worker), or by kvbm_manager_block_sum_keep;
 * copies between G1 and G2 carry it; a new registration forgets it. key
 * NULL: the sum is BLAKE3-128 (an MRDN v1 frame's checksum); a 32-byte
 * key: the keyed BLAKE3-128 under it (a version-2 frame's MAC), so a
 * block sent on a keyed link is still hashed once. Once per manager: a
 * second call with the same key (or none again) is KVBM_OK and changes
 * nothing; another key, or keyed after unkeyed and the other way round,
 * is KVBM_EINVAL (one manager's sums are of one kind). The key is copied
 * and zeroed at destroy. */
KVBM_EXTERN int kvbm_manager_keep_sums(kvbm_manager *m, const uint8_t *key, kvbm_error *err);

/* Tokens per block (the config's block_size) and the hash scheme. */
KVBM_EXTERN uint32_t kvbm_manager_block_tokens(const kvbm_manager *m);
KVBM_EXTERN kvbm_hash_scheme kvbm_manager_hash_scheme(const kvbm_manager *m);

/* Pins the block registered under seq_hash in G1, else G2, with its bytes
 * in place, and describes it in *out (phase: OUTPUT_CRITICAL). Its tokens,
 * when known here, are copied into tokens[0..block_tokens) (out->tokens
 * points there; NULL otherwise). KVBM_ENOTFOUND: neither holds it ready.
 * Release with kvbm_manager_block_unpin. Cost: two index lookups under the
 * manager lock. */
KVBM_EXTERN int kvbm_manager_block_pin(kvbm_manager *m, uint64_t seq_hash, uint32_t *tokens,
                                       kvbm_block_ref *out);
/* Releases n pins taken by kvbm_manager_block_pin (or given to a hook). */
KVBM_EXTERN void kvbm_manager_block_unpin(kvbm_manager *m, const kvbm_block_ref *b, size_t n);

/* Registers a block whose bytes the caller checked (with groups: in the
 * group its key is of, found from its tokens; group 0 without them): a free block of
 * `tier` (G1 or G2) is taken only now, filled from layers[l] (the layout's
 * layer_stride bytes of layer l, host memory; copied to the device for a
 * device tier) outside the lock, then registered under b's identity
 * (tokens NULL: not known, zeros kept). sum (may be NULL): the block's
 * kept sum, as kvbm_manager_keep_sums defines it, kept with it. Already
 * held there ready: KVBM_OK, nothing done. KVBM_ENOSPC: no block to spare
 * (nothing changed); a device copy's error. The block is cached
 * (released) when it returns. b->id is not read. */
KVBM_EXTERN int kvbm_manager_block_put(kvbm_manager *m, kvbm_tier tier, const kvbm_block_ref *b,
                                       const uint8_t *const *layers, const uint8_t *sum,
                                       kvbm_error *err);

/* The kept sum of pinned block `id` of G1 or G2 into sum: KVBM_OK, or
 * KVBM_ENOTFOUND when none is kept (KVBM_ETIER: another tier). No lock. */
KVBM_EXTERN int kvbm_manager_block_sum(const kvbm_manager *m, kvbm_tier tier, uint32_t id,
                                       uint8_t sum[16]);
/* Keeps `sum` (computed by the caller over the pinned block's bytes, of
 * kvbm_manager_keep_sums's kind) unless one is kept already. No lock. */
KVBM_EXTERN void kvbm_manager_block_sum_keep(const kvbm_manager *m, kvbm_tier tier, uint32_t id,
                                             const uint8_t sum[16]);

/* ---- requests ---- */

/* Creates a request and prefills it with a prompt of n >= 1 tokens (see
 * the top of this file). *matched_tokens (may be NULL) is the optimistic
 * match: what the walk found, before onboarding completes. KVBM_ENOSPC
 * when G1 cannot hold the prompt (nothing changed). *out is freed with
 * kvbm_mreq_destroy(). */
KVBM_EXTERN int kvbm_manager_prefill(kvbm_manager *m, uint64_t salt_hash, uint8_t priority,
                         const uint32_t *tokens, size_t n, kvbm_mreq **out,
                         size_t *matched_tokens, kvbm_error *err);

typedef struct kvbm_mreq_info {
  bool ready;              /* every onboarding of the match has finished */
  size_t matched_tokens;   /* the match now (shortened by failures) */
  size_t hit_blocks[KVBM_TIER_COUNT]; /* blocks of the match from each tier */
  size_t num_tokens;       /* tokens in the request */
} kvbm_mreq_info;

/* Non-blocking: fills *out. */
KVBM_EXTERN void kvbm_mreq_poll(kvbm_mreq *r, kvbm_mreq_info *out);

/* Blocks until onboarding has finished or `timeout_ms` passed (< 0:
 * forever), then fills *out (may be NULL). KVBM_ETIMEDOUT on time out. */
KVBM_EXTERN int kvbm_mreq_wait(kvbm_mreq *r, int timeout_ms, kvbm_mreq_info *out);

/* Whether the engine must write the KV of block k: a block after the
 * settled match that this request registered itself (a shared block that
 * another request registered is that request's to write), the partial tail
 * block, or a block whose onboard failed. False for matched blocks and k
 * out of range. Settles the match first if it can (see kvbm_mreq_poll). */
KVBM_EXTERN bool kvbm_mreq_must_compute(kvbm_mreq *r, size_t k);

/* The tier the walk found block k in (KVBM_TIER_G1..G4), or -1 for a block
 * past the walk. */
KVBM_EXTERN int kvbm_mreq_block_source(const kvbm_mreq *r, size_t k);

/* Appends decode tokens (as kvbm_seq_append). */
KVBM_EXTERN int kvbm_mreq_append(kvbm_mreq *r, const uint32_t *tokens, size_t n);

/* The engine has written the KV of every full block it must compute: they
 * become valid in G1, and the request's full blocks not committed before
 * are offloaded per policy (a shared block whose owner has not committed
 * yet is not offloaded by this request). Waits for onboarding first (the
 * match must be settled). Never waits for a copy. */
KVBM_EXTERN int kvbm_mreq_commit(kvbm_mreq *r);

/* The G1 block table: ids[0..*n) in token order, valid until the next call
 * that changes the request. */
KVBM_EXTERN void kvbm_mreq_blocks(const kvbm_mreq *r, const uint32_t **ids, size_t *n);

/* Sequence hash of full block k. */
KVBM_EXTERN int kvbm_mreq_block_hash(const kvbm_mreq *r, size_t k, uint64_t *hash);

/* ---- phases (ADR-0006) ----
 * The engine tells a request its phase. Each full block is labelled with
 * the phase in force when it filled: THINK_ACTIVE while reasoning,
 * OUTPUT_CRITICAL otherwise (the prompt and the output: KV needed at every
 * next step). At EXIT_THINK the request's THINK_ACTIVE blocks become
 * THINK_COMPLETE: known cold. They are the first candidates for demotion
 * here (released first in line for eviction from G1 when the request
 * ends) and, with a peer attached and offload_threshold_blocks > 0, they
 * are pushed to peer 0 in one batch once that many are ready (at
 * EXIT_THINK, or at a later commit). Labels travel in the frames' phase
 * byte. */
typedef enum kvbm_request_phase {
  KVBM_REQUEST_REASONING = 1,  /* reasoning starts */
  KVBM_REQUEST_EXIT_THINK = 2, /* reasoning ends (ExitThink) */
  KVBM_REQUEST_OUTPUT = 3,     /* output */
} kvbm_request_phase;

/* KVBM_EINVAL for another value; KVBM_ESTATE for REASONING after
 * EXIT_THINK (one reasoning span per request). EXIT_THINK's push, if due,
 * happens here: its errors are counted in the peer's stats, not returned. */
KVBM_EXTERN int kvbm_mreq_set_phase(kvbm_mreq *r, kvbm_request_phase phase, kvbm_error *err);

/* kvbm_manager_prefill for a request whose phase the engine knows at the
 * start: KVBM_REQUEST_REASONING (what fills after the prompt is
 * ThinkActive, and the prefill is not an OutputCritical allocation: it
 * never pulls nor drops anything for room, see output_pull),
 * KVBM_REQUEST_OUTPUT, or 0 (not said: kvbm_manager_prefill, treated as
 * output). The prompt's own blocks are labelled OUTPUT_CRITICAL either
 * way. Another phase: KVBM_EINVAL, nothing created. Otherwise as
 * kvbm_manager_prefill (same errors, threads and cost). */
KVBM_EXTERN int kvbm_manager_prefill_phase(kvbm_manager *m, uint64_t salt_hash, uint8_t priority,
                                           kvbm_request_phase phase, const uint32_t *tokens,
                                           size_t n, kvbm_mreq **out, size_t *matched_tokens,
                                           kvbm_error *err);

/* The label of full block k (KVBM_ERANGE past the full blocks). */
KVBM_EXTERN int kvbm_mreq_block_phase(const kvbm_mreq *r, size_t k, kvbm_frame_phase *out);

/* Waits for the request's onboarding, releases its G1 blocks (tail first)
 * and frees it. Queued offloads of its blocks keep their own references.
 * NULL: no-op. */
KVBM_EXTERN void kvbm_mreq_destroy(kvbm_mreq *r);

/* ---- hybrid requests: several KV cache groups (issue 20) ----
 *
 * A manager configured with groups (cfg.groups) serves a hybrid model: one
 * block table per group over the shared G1, and in every tier a block is
 * registered under (sequence hash, group) (a key derived from both; group
 * 0's key is the hash itself, so a one-group manager's keys, events and
 * stored values are what they were).
 *
 * Prefill (kvbm_manager_hprefill) finds the prefix hit every group can
 * serve, kvbm_groups_hit (kvbm/group.h: vLLM's coordinator rule) over what
 * each group holds in any tier (G1 ready, G2, G3, G4 by its index), and
 * takes in G1 only what each group needs for it: every block before the
 * hit for full attention, the blocks covering the last W - 1 tokens for a
 * window of W, the hit's chunk for chunked local attention, the one state
 * block at the hit for Mamba (block hit / B - 1). What is in G1 is shared;
 * what is below gets a new G1 block and an onboard, as kvbm_manager_prefill
 * does. Every group then gets new blocks from the hit to the end of the
 * prompt (vLLM's one prefill step); table entries before a group's first
 * needed block are KVBM_HREQ_NULL. Room for all of it is checked first
 * (onboards that do not fit: the hit is taken again from G1 alone): a
 * prompt that does not fit changes nothing (KVBM_ENOSPC).
 *
 * Commit marks the blocks the engine computed valid and offloads every full
 * block of every group per policy, as kvbm_mreq_commit does, then releases
 * what each group no longer needs (vLLM's remove_skipped_blocks: a window
 * group keeps the last W - 1 tokens' blocks, Mamba its last state): they
 * stay cached and evictable, in G1 and below.
 *
 * A group's layout (kvbm_group_layout) says how many bytes of the tier's
 * block its KV takes and, for Mamba, the state's parts. Framed values (G4,
 * G3 over a URL) carry exactly those bytes and a fingerprint of that
 * layout; a value of another size or layout is refused on load (a counted
 * foreign miss). G1, G2 and the disk:// slot file keep one fixed-size slot
 * per block (one budget per tier), the group's bytes at its start.
 *
 * G4 as a shared store: blocks its index does not know are asked about
 * (every group's keys the tiers here lack, in block order, at most
 * g4_lookup_max, one batch under g4_lookup_timeout_ms, the lock dropped),
 * as kvbm_manager_prefill does; what lands is indexed.
 *
 * Decode (kvbm_hreq_append) is vLLM's allocate_slots for a running
 * request: room for the step's new blocks in every group is checked before
 * any is taken (KVBM_ENOSPC, nothing changed), every group allocates, then
 * the blocks that filled register (group g under its key); commit offloads
 * them and releases what each group no longer needs at the new length, so
 * a window group frees (to the cache) the block that left its window while
 * the request runs. Phases (kvbm_hreq_set_phase) label appended blocks as
 * kvbm_mreq_set_phase does.
 *
 * Onboards from a store that may be given up (G4, G3 over a URL) share one
 * deadline, g4_timeout_ms from the prefill, as kvbm_manager_prefill's:
 * past it those still out are abandoned (counted `abandoned`), the engine
 * computes them, and the hit is the group rule's over what arrived.
 *
 * Peers (kvbm/peer.h): managers of equal group lists only (the hello
 * carries it; another list is refused at attach); with output_pull, a
 * hybrid prefill asks a peer back for the blocks each group needs for the
 * longest hit (keys), as kvbm_manager_prefill does for one table; at
 * ExitThink (or a later commit) every group's THINK_COMPLETE blocks the
 * request still holds go to peer 0 in one batch once
 * offload_threshold_blocks of them (blocks, all groups counted) are
 * ready. */

/* The manager's block of a Mamba group holds its state: vLLM's MambaSpec
 * gives the state as shapes per layer (conv state and SSM/temporal state),
 * page_size_bytes their sum over the group's layers, padded up to the
 * attention page. */
typedef struct kvbm_group_layout {
  uint64_t block_bytes; /* bytes of one block of this group, at most the
                           tier's block (kvbm_manager_block_bytes); 0: all
                           of it */
  uint64_t conv_bytes;  /* Mamba: the conv state's bytes (0 for others) */
  uint64_t ssm_bytes;   /* Mamba: the SSM state's bytes (0 for others);
                           conv_bytes + ssm_bytes must then be block_bytes */
} kvbm_group_layout;

#define KVBM_HREQ_NULL UINT32_MAX

typedef struct kvbm_hreq kvbm_hreq;

/* The number of groups (1 for a manager configured without). */
KVBM_EXTERN size_t kvbm_manager_num_groups(const kvbm_manager *m);

/* The group list as a peer's hello carries it: a 32-bit digest of every
 * group's kind, token count and layout (0 for a manager of one group, so
 * its hello is what it was before groups), and, when list is not NULL,
 * the list as kvbm_groups_format writes it ("full,sw:128") into
 * list[0..cap). Two managers with the same digest file a block under the
 * same key in the same group. Any thread; no lock. */
KVBM_EXTERN uint32_t kvbm_manager_groups_digest(const kvbm_manager *m, char *list, size_t cap);

/* Whether `key` follows from a block's tokens (block_tokens of them), salt
 * and parent key in one of this manager's groups: the block's hash,
 * computed with the parent's own hash under group g, is key under g (one
 * group: the hash is the key, as kvbm_hash_next). KVBM_OK and *group (may
 * be NULL), KVBM_ENOTFOUND when in none, KVBM_EINVAL for NULL m or tokens.
 * A peer checks a block's identity with it. Cost: one hash per group. */
KVBM_EXTERN int kvbm_manager_key_group(const kvbm_manager *m, uint64_t key, uint64_t salt,
                                       uint64_t parent_key, bool has_parent, const uint32_t *tokens,
                                       uint32_t *group);

/* Bytes of one block of group g's KV (its layout's block_bytes, or the
 * whole block); 0 for g out of range. */
KVBM_EXTERN uint64_t kvbm_manager_group_bytes(const kvbm_manager *m, uint32_t g);

/* Creates a hybrid request and prefills a prompt of n >= 1 tokens (see
 * above). *hit_tokens (may be NULL): the hit found, before onboarding.
 * Works on a manager of one group too. KVBM_EINVAL with a message for bad
 * arguments, KVBM_ENOSPC (nothing changed) when G1 cannot hold what the
 * prompt needs in every group. Free with kvbm_hreq_destroy. Cost: one
 * hash per full block, O(blocks x groups) index lookups under the lock. */
KVBM_EXTERN int kvbm_manager_hprefill(kvbm_manager *m, uint64_t salt_hash, uint8_t priority,
                                      const uint32_t *tokens, size_t n, kvbm_hreq **out,
                                      size_t *hit_tokens, kvbm_error *err);

typedef struct kvbm_hreq_info {
  bool ready;                /* every onboard has finished */
  size_t hit_tokens;         /* the hit now: once ready, the hit the blocks
                                that arrived serve (kvbm_groups_hit over
                                them), else the one found */
  size_t num_tokens;
  /* G1 blocks each group took for the hit: from G1 itself (shared), and
   * onboarded from below (the copies). */
  size_t hit_g1[KVBM_GROUPS_MAX], onboarded[KVBM_GROUPS_MAX];
  size_t onboarded_from[KVBM_TIER_COUNT]; /* onboards per source tier */
} kvbm_hreq_info;

/* Blocks until every onboard is over (timeout_ms < 0: forever; 0: just
 * look), then fills *out (may be NULL). KVBM_ETIMEDOUT on time out. When
 * the hit settled shorter than the one found (failed or abandoned
 * onboards), every group gets a G1 block at each place its rule needs
 * from the settled hit on (the plan for the longer hit had left some
 * null: a window's places before it, Mamba's states before the last), so
 * the engine has a block wherever it must compute; KVBM_ENOSPC when G1
 * has no room for them yet: nothing taken, *out filled (ready, the
 * settled hit), commit and append refused with KVBM_ENOSPC too; wait
 * again once room is made, or destroy (which releases everything). */
KVBM_EXTERN int kvbm_hreq_wait(kvbm_hreq *r, int timeout_ms, kvbm_hreq_info *out);

/* Group g's G1 block table: ids[0..*n) in token order, KVBM_HREQ_NULL
 * where the group holds nothing. Valid until the next call that changes
 * the request. KVBM_EINVAL for g out of range. */
KVBM_EXTERN int kvbm_hreq_table(const kvbm_hreq *r, uint32_t g, const uint32_t **ids, size_t *n);

/* Whether the engine must write group g's block k: past the settled hit
 * and registered by this request, the partial tail, an onboard that
 * failed, or (cfg.hybrid_retention BOUNDARIES) a block the request took
 * unregistered because its group does not keep it, until the commit that
 * covers it. Waits for the onboards first (kvbm_hreq_wait; false at a null
 * place while it says KVBM_ENOSPC). */
KVBM_EXTERN bool kvbm_hreq_must_compute(kvbm_hreq *r, uint32_t g, size_t k);

/* The engine wrote every block it must compute (every token so far is
 * computed): see above. Offloads the full blocks not committed before
 * (those registered: under sparse retention not a window or Mamba block
 * the group does not keep) and releases what each group no longer needs
 * (vLLM's remove_skipped_blocks at the request's length). Waits for the
 * onboards first; never for a copy. Called after the prefill and after
 * each decode step; a commit with nothing new does nothing (KVBM_OK). KVBM_ENOMEM, or KVBM_ENOSPC
 * while kvbm_hreq_wait says so: nothing done. */
KVBM_EXTERN int kvbm_hreq_commit(kvbm_hreq *r);

/* Appends n decode tokens (one scheduler step; n 0: no-op). Every group's
 * table grows to the new length: one new block when the tail fills (Mamba
 * "align": its running state block only, the places between null), all
 * groups checked for room in G1 first: KVBM_ENOSPC (message), nothing
 * changed (also while a hit that settled short lacks its places, see
 * kvbm_hreq_wait: they are taken first). Blocks that fill register
 * under (hash, group) at once (this request computes them:
 * must_compute) and are offloaded at the next
 * commit. A window group's blocks are released at commit, not here: kvbm
 * learns that tokens are computed from commit, and releasing a block the
 * engine has not written would leave it registered without its KV.
 * KVBM_EINVAL (message) for a NULL request or tokens. Cost: one hash per
 * filled block, O(groups) pool calls under the manager lock. */
KVBM_EXTERN int kvbm_hreq_append(kvbm_hreq *r, const uint32_t *tokens, size_t n, kvbm_error *err);

/* As kvbm_mreq_set_phase: blocks that fill from now on get the phase's
 * label, EXIT_THINK turns THINK_ACTIVE labels into THINK_COMPLETE (demoted
 * in G1 at destroy: first in line for eviction, every group's block).
 * KVBM_EINVAL for another value, KVBM_ESTATE for REASONING after
 * EXIT_THINK. ExitThink's push to peer 0 as above (its errors counted in
 * the peer's stats, not returned). */
KVBM_EXTERN int kvbm_hreq_set_phase(kvbm_hreq *r, kvbm_request_phase phase, kvbm_error *err);

/* The label of full block k (the same for every group; KVBM_ERANGE past
 * the full blocks). */
KVBM_EXTERN int kvbm_hreq_block_phase(const kvbm_hreq *r, size_t k, kvbm_frame_phase *out);

/* Waits for the onboards, releases every block (group 0 first, each table
 * tail first) and frees the request. NULL: no-op. */
KVBM_EXTERN void kvbm_hreq_destroy(kvbm_hreq *r);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_MANAGER_H */
