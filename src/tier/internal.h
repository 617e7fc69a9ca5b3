/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier/internal.h (private): what the manager's files share.
 *
 * The manager is split by concern:
 *   config.c   the config: defaults, environment names, validation
 *   copy.c     moving one block's bytes between tiers' memories (host, CUDA)
 *   store.c    a volume tier's values: framing, checks, the G4 lookup
 *   workers.c  the job queues and the worker threads that move bytes
 *   request.c  the engine's calls: prefill (the walk), wait, commit (the
 *              offload policy), destroy
 *   manager.c  create/destroy, the tiers' set-up, pool events, accessors
 *   peer_hooks.c  the peers' side (src/peer/ above us, kvbm/peer.h): their
 *              hooks, block location, ExitThink's batch, the pull's room,
 *              the block calls they use (pin, put, kept sums)
 *
 * One tier type. Every tier is a pool (index, LRU, references) plus a byte
 * of state per block, over a store: G1 and G2 over memory (a layout in a
 * storage), G3 and G4 over a kvbm_volume (kvbm/volume.h). The manager's
 * code knows stores by kind only: a new backend is a URL.
 *
 * Everything here is guarded by the manager lock (kvbm_manager.mu) unless
 * a comment says otherwise.
 */
#ifndef KVBM_TIER_INTERNAL_H
#define KVBM_TIER_INTERNAL_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvbm/manager.h"
#include "kvbm/sequence.h"
#include "kvbm/storage.h"
#include "kvbm/volume.h"
#include "tier/filter.h"
#include "tier/gpu.h"
#include "tier/metrics.h"
#include "tier/testing.h"
#include "volume/disk.h" /* KVBM_DISK_REFUSE_*: the test seam */

/* A call whose failure the manager has ruled out beforehand (room was
 * checked, the block is pinned, ...): its result is asserted in debug
 * builds and ignored otherwise. The call runs in both. */
#ifdef NDEBUG
#define KVBM__MUST(call) ((void)(call))
#else
#define KVBM__MUST(call)                                     \
  do {                                                       \
    int kvbm__must_rc = (call);                              \
    assert(kvbm__must_rc == KVBM_OK && "ruled out: " #call); \
    (void)kvbm__must_rc;                                     \
  } while (0)
#endif

/* Per-block byte states. UNCOMPUTED (G1 only): registered by a request
 * whose engine has not committed its KV yet. LANDING (G1 only): an
 * onboard's checked bytes are being copied in, outside the lock; unlike a
 * PENDING block it can no longer be abandoned (request.c, settle), since
 * the copy cannot be called back and always finishes quickly. */
enum { KVBM__READY = 0, KVBM__PENDING = 1, KVBM__FAILED = 2, KVBM__UNCOMPUTED = 3,
       KVBM__LANDING = 4 };

/* Job kinds. Every job belongs to the worker of the tier below G1 that it
 * moves bytes into or out of (kvbm__job.tier). */
enum {
  KVBM__J_DOWN, /* G1 -> G2 (host worker), then forwarded to the volume tiers in fwd */
  KVBM__J_UP,   /* G2 -> G1 (host worker) */
  KVBM__J_PUT,  /* G1 or G2 -> a volume tier */
  KVBM__J_GET,  /* a volume tier -> G1 */
  KVBM__J_DEL,  /* drop an evicted block's value from an exclusive volume */
};

#define KVBM__NONE UINT32_MAX

typedef struct kvbm__pin {
  uint8_t tier;
  uint32_t id;
} kvbm__pin;

/* The target blocks one commit used, in use order: released together when
 * the commit's last copy is done, so recency below G1 is the order of use. */
typedef struct kvbm__batch {
  uint32_t pending; /* jobs not finished */
  uint32_t n, cap;
  kvbm__pin *pins;
} kvbm__batch;

/* What a prefill's onboards from abandonable tiers share (store.c, "One
 * deadline per prefill"): where its match is known to end, and its
 * deadline. Held by the request and by each such job; freed by the last
 * (lock held). */
typedef struct kvbm__onboards {
  uint32_t refs;
  size_t cut;           /* the first block known lost (SIZE_MAX: none yet):
                           an onboard past it is of no use */
  uint64_t deadline_ns; /* CLOCK_MONOTONIC: past it, none is of use */
  uint32_t sent;        /* gets sent to the store (a late one is its fault) */
  bool late;            /* the deadline was reported to the back-off */
} kvbm__onboards;

typedef struct kvbm__job {
  uint8_t kind;
  uint8_t tier;     /* the tier below G1 whose worker runs it */
  uint8_t src;      /* J_PUT: where the bytes come from (G1 or G2) */
  uint8_t fwd;      /* J_DOWN: bit ti set: then J_PUT into tier ti from G2 */
  uint8_t prio;     /* G1 release priority */
  uint8_t dst;      /* J_GET: the tier it lands in (G1; G2 for a promotion) */
  bool hint;        /* a storage hint's copy (hints.c): no batch, nobody
                       waits; its blocks are released when it is over */
  uint8_t phase;    /* the block's phase label (kvbm_frame_phase), for
                       framed values */
  uint8_t grp;      /* the block's KV cache group (hybrid.c): the bytes
                       and layout its framed value carries */
  bool has_parent;
  int result;       /* set by the worker: KVBM_OK or why not */
  uint32_t id[KVBM_TIER_COUNT]; /* the job's block in each tier it touches
                                   (KVBM__NONE: none; a J_GET found by a G4
                                   lookup has no index entry yet) */
  uint64_t hash, parent;
  kvbm__batch *b;
  kvbm__onboards *og; /* J_GET of a prefill from an abandonable tier: its
                         request's (a reference); NULL otherwise */
  uint32_t k;         /* J_GET: the block's place in its prompt */
} kvbm__job;

/* A fixed ring: a full ring skips an offload rather than waiting. */
typedef struct kvbm__jqueue {
  kvbm__job *ring;
  uint32_t cap, head, count;
} kvbm__jqueue;

typedef enum kvbm__store_kind {
  KVBM__STORE_MEMORY = 0, /* G1, G2: a layout in a kvbm_storage */
  KVBM__STORE_VOLUME,     /* G3, G4: a kvbm_volume */
} kvbm__store_kind;

/* A memory tier block's kept checksum (copy.c, "Kept checksums"): the
 * BLAKE3-128 of its bytes in canonical order (layer 0 first), as an MRDN
 * frame carries it. state: KVBM__SUM_NONE, _BUSY (being written by the
 * one writer that won it), _KEPT (sum valid for the block's bytes). */
enum { KVBM__SUM_NONE = 0, KVBM__SUM_BUSY = 1, KVBM__SUM_KEPT = 2 };
typedef struct kvbm__blocksum {
  _Atomic uint8_t state;
  uint8_t sum[16];
} kvbm__blocksum;

typedef struct kvbm__vworker kvbm__vworker; /* workers.c */

typedef struct kvbm__tier {
  kvbm_tier id;
  bool present;          /* configured: it has a pool */
  bool usable;           /* its store is open (false: skipped, counted) */
  kvbm__store_kind store;
  kvbm_pool *pool;
  uint8_t *state;        /* KVBM__READY ... per block */
  /* A manager of several groups (hybrid.c): each registered block's KV
   * cache group, written by its STORED event from reg_grp (the group of
   * the registration under way, kvbm__fill_grp; 0 otherwise), read by its
   * REMOVED event, so the events name (hash, group) and not the mixed
   * key. NULL with one group. */
  uint8_t *grp;
  uint8_t reg_grp;
  kvbm_offload_policy policy;
  bool filter_on;
  kvbm_freq_filter filter;
  kvbm_tier_stats st;
  char err[KVBM_ERROR_MSG_MAX]; /* why it is not usable */
  char mode[64];         /* how its bytes move ("io_uring+O_DIRECT", "redis", ...) */

  /* KVBM__STORE_MEMORY */
  kvbm_layout layout;
  kvbm_storage *storage;
  kvbm_memory_type memory;
  bool device;           /* bytes not addressable by the host (DEVICE) */
  uint8_t **region;      /* region bases */
  kvbm__blocksum *sums;  /* a kept checksum per block (copy.c; no lock) */
  uint64_t nsums;
  _Atomic bool hash_copies; /* G2: a host copy into it hashes a block that
                               has no kept checksum (set once a peer is
                               attached: copy.c, "Kept checksums") */
  const uint8_t *sum_key;   /* G1, G2: kept sums are keyed BLAKE3-128 under
                               it (m->sum_key), NULL: plain; set before
                               hash_copies (release) and never after */

  /* KVBM__STORE_VOLUME */
  kvbm_volume *vol;
  kvbm_volume *lookup_vol; /* shared tiers: the same store, for lookups
                              only, so they never queue behind bulk data */
  bool framed;           /* values are MRDN frames (store.c); false: the
                            bare block bytes, checked by the volume itself
                            (the disk:// slot file) */
  bool shared;           /* other engines write it too (G4): blocks the
                            index does not know are looked up in the store,
                            and an evicted index entry keeps its value */
  bool keyed;            /* G4 with a cluster key: values are keyed frames
                            (store.c, "Authenticated values") */
  uint8_t mac_key[32];   /* derived from g4_key; zeroed at destroy */
  bool sealed;           /* g4_encrypt: values are sealed frames (AEAD) */
  uint8_t aead_key[32];  /* derived from g4_key; zeroed at destroy */
  uint32_t depth;        /* operations in flight */
  uint32_t batch_ops;    /* operations per batch: depth spread over the
                            volume's threads, so batches run side by side */

  /* Its worker: one per tier below G1. */
  kvbm__jqueue q;
  kvbm__jqueue dq;       /* exclusive volumes: deletions of evicted blocks'
                            values (apart, so they never take a copy's room) */
  pthread_cond_t work_cv;
  uint32_t busy;         /* jobs taken and not finished */
  pthread_t th;
  bool running;
  kvbm_gpu_stream *gs;   /* device G1: the worker's CUDA stream */
  kvbm__vworker *vw;     /* volume tiers: in-flight operations */

  /* Back-off of a shared store that keeps failing (G4; store.c). Reads
   * (lookups and gets) that fail in a row count up; at
   * KVBM__BACKOFF_FAILS the tier is left alone until backoff_until_ns,
   * g4_backoff_ms doubling while it goes on failing, back to the start on
   * the first good read. */
  uint32_t fail_run;     /* reads failed in a row */
  uint32_t backoff_level;/* back-offs in a row (the doubling) */
  uint64_t backoff_until_ns; /* CLOCK_MONOTONIC; 0: not backed off */
} kvbm__tier;

struct kvbm_manager {
  kvbm_manager_config cfg;
  kvbm__manager_testing testing; /* test seams (tier/testing.h), zero otherwise */
  char *g2_name;          /* G2's storage_location (owned) */
  uint64_t ev_prefix;     /* storage events: the prefix_hash of the commit
                             registering blocks now (0: none) */
  char *g3_dir, *g3_url, *g4_url, *model_id; /* owned copies (g3_dir NULL: the
                                                disk's private default) */
  char ns[224];           /* key namespace of the volume tiers */
  uint8_t ns_digest[16];  /* BLAKE3-128 of ns, in every frame's body header */
  kvbm__tier t[KVBM_TIER_COUNT];
  uint64_t block_bytes;
  uint64_t fingerprint;   /* of one FullyContiguous block: the value format */
  kvbm_layout slot_layout; /* one FullyContiguous block */
  uint64_t *g1_owner;     /* serial of the request that registered each G1 block */
  uint64_t next_serial;
  uint32_t *zero_tokens;  /* tokens of index entries that came from a store */
  pthread_mutex_t mu;
  bool mu_ready;
  pthread_cond_t done_cv;
  bool stop, cancel;
  bool host_running;      /* the host worker may still forward jobs */
  bool emu;               /* device G1 emulated in host memory (tests) */
  kvbm_manager_hint_stats hst; /* storage hints applied (hints.c) */
  _Atomic uint64_t emu_copies;
  kvbm__tier_metrics tm;  /* what only metrics read (tier/metrics.h) */
  kvbm__manager_endpoint mx; /* the metrics endpoint, when configured */

  /* The peers' hooks (peer_hooks.c). Set once under peers_mu (a leaf lock:
   * taken with m->mu held or not, never the other way round); every hook
   * but pull and exit_think is called under it. peers_on: set (a gate read
   * without the lock). */
  pthread_mutex_t peers_mu;
  kvbm_manager_peer_hooks hooks;
  _Atomic bool peers_on;
  uint8_t sums_kind;      /* kvbm_manager_keep_sums: 0 not yet, 1 plain, 2 keyed */
  uint8_t sum_key[32];    /* keyed: the key (zeroed at destroy) */

  /* KV cache groups (hybrid.c). ngroups >= 1; one group unless configured.
   * gbytes/gfp: each group's block bytes and layout fingerprint (group
   * layouts; a group without one: block_bytes, fingerprint). */
  kvbm_group_spec groups[KVBM_GROUPS_MAX];
  uint32_t ngroups;
  uint64_t gbytes[KVBM_GROUPS_MAX];
  uint64_t gfp[KVBM_GROUPS_MAX];

};

struct kvbm_mreq {
  kvbm_manager *m;
  kvbm_seq *seq;
  uint64_t serial;
  uint64_t salt;
  uint8_t prio;
  uint32_t *tokens;
  size_t ntok, tcap;
  uint8_t *src;     /* tier of each walked block */
  size_t walk;      /* blocks the walk matched */
  size_t settled;   /* blocks of the match after onboarding (SIZE_MAX: not yet) */
  kvbm__onboards *og;   /* its onboards from stores that may be abandoned
                           (store.c, kvbm__abandonable): their cut and their
                           one deadline, shared with their jobs (NULL: none) */
  size_t committed; /* full blocks committed */
  /* Phases (ADR-0006): a label per full block (kvbm_frame_phase). */
  uint8_t *phase;
  size_t labeled, phase_cap;
  uint8_t fill;     /* the label blocks filled now get */
  uint8_t stage;    /* 0 none yet, else the last kvbm_request_phase */
  bool exit_pending;/* ExitThink's push still due (threshold not reached) */
};

/* ---- hybrid.c: groups ---- */

/* The key block `h` of group g is registered under in every tier: h for
 * group 0 (a one-group manager is unchanged), a bijective mix of h and g
 * otherwise, so two groups' blocks of one hash never meet. */
static inline uint64_t kvbm__group_key(uint64_t h, uint32_t g) {
  if (g == 0) return h;
  uint64_t x = h ^ (0x9E3779B97F4A7C15ull * g);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/* The inverse of kvbm__group_key for group g: the block's own sequence
 * hash, which the events carry (vLLM's (block_hash, group_idx)). Each
 * step of the mix undone in reverse order: an xor-shift by s >= 21 is its
 * own inverse after two more shifts, an odd multiplier has an inverse
 * modulo 2^64. */
static inline uint64_t kvbm__group_unkey(uint64_t x, uint32_t g) {
  if (g == 0) return x;
  x ^= (x >> 31) ^ (x >> 62);
  x *= 0x319642B2D24D8EC3ull; /* 0x94D049BB133111EB^-1 */
  x ^= (x >> 27) ^ (x >> 54);
  x *= 0x96DE1B173F119089ull; /* 0xBF58476D1CE4E5B9^-1 */
  x ^= (x >> 30) ^ (x >> 60);
  return x ^ (0x9E3779B97F4A7C15ull * g);
}
/* kvbm_block_fill of block id in tier t as a block of group g: the STORED
 * event it raises records g (kvbm__tier.grp). Lock held. */
static inline int kvbm__fill_grp(kvbm__tier *t, uint32_t g, uint32_t id, uint64_t salt,
                                 uint64_t parent, bool has_parent, const uint32_t *tokens,
                                 uint64_t key, uint32_t *got) {
  t->reg_grp = (uint8_t)g;
  int rc = kvbm_block_fill(t->pool, id, salt, parent, has_parent, tokens, key, got);
  t->reg_grp = 0;
  return rc;
}
/* Checks the config's groups and layouts (KVBM_EINVAL naming the item). */
int kvbm__groups_check(const kvbm_manager_config *c, uint64_t block_bytes, kvbm_error *err);
/* Copies the groups and derives each one's bytes and fingerprint. */
void kvbm__groups_init(kvbm_manager *m);
/* Lock held: waits until settled(arg) (request.c says how). */
int kvbm__manager_wait_settled(kvbm_manager *m, int timeout_ms, bool (*settled)(void *), void *arg,
                               const uint64_t *own_ns);

/* ---- request.c, shared with hybrid.c (lock held) ---- */

/* Whether tier ti (below G1) holds key h with its bytes in place. */
bool kvbm__tier_has(const kvbm_manager *m, int ti, uint64_t h);
/* request.c: labels r's full blocks not labelled yet with its fill phase
 * (KVBM_ENOMEM); a phase change without ExitThink's push to the peers. */
int kvbm__label_full(kvbm_mreq *r);
int kvbm__phase_set(kvbm_mreq *r, kvbm_request_phase phase, kvbm_error *err);
/* One use of full block k (G1 block g1id, registered under key h, of
 * group grp) by a commit of r: refresh or copy in G2, G3, G4 per policy. */
void kvbm__use_block(kvbm_manager *m, kvbm_mreq *r, kvbm__batch *b, size_t k, uint32_t g1id,
                     uint64_t h, uint64_t parent, bool has_parent, uint8_t grp);

/* ---- config.c ---- */

/* KVBM_EINVAL naming the first bad field of c. */
int kvbm__manager_check_config(const kvbm_manager_config *c, kvbm_error *err);

/* ---- copy.c (no lock: callers pass blocks their pins keep valid) ---- */

uint8_t *kvbm__layer_ptr(const kvbm__tier *t, uint32_t b, uint64_t l);
void kvbm__copy_block(const kvbm__tier *dst, uint32_t db, const kvbm__tier *src, uint32_t sb);
void kvbm__gather(uint8_t *out, const kvbm__tier *src, uint32_t b);
void kvbm__scatter(kvbm__tier *dst, uint32_t b, const uint8_t *in);
/* The CUDA forms: queued on stream s (gather/scatter then wait for it,
 * their buffer is reused at once). KVBM_OK or KVBM_EDEVICE. */
int kvbm__copy_block_gpu(kvbm_gpu_stream *s, const kvbm__tier *dst, uint32_t db,
                         const kvbm__tier *src, uint32_t sb);
int kvbm__gather_gpu(kvbm_gpu_stream *s, uint8_t *out, const kvbm__tier *src, uint32_t b);
int kvbm__scatter_gpu(kvbm_gpu_stream *s, kvbm__tier *dst, uint32_t b, const uint8_t *in);
/* The pieces of block b of a memory tier (one for FullyContiguous, one per
 * layer for LayerSeparate) into iov[0..max); 0 when they do not fit. */
int kvbm__block_pieces(const kvbm__tier *t, uint32_t b, struct iovec *iov, int max);
/* The block's bytes as one contiguous host piece, or NULL (LayerSeparate,
 * device memory). */
uint8_t *kvbm__block_contiguous(const kvbm__tier *t, uint32_t b);

/* Kept checksums (copy.c, no lock; see "Kept checksums" there). The
 * per-block array of a memory tier of n blocks (KVBM_ENOMEM), freed with
 * the tier. */
int kvbm__sums_create(kvbm__tier *t, uint64_t n);
void kvbm__sums_destroy(kvbm__tier *t);
/* Block b's kept checksum into out: true, or false when none is kept. The
 * caller pins b (its bytes and its sum do not change meanwhile). */
bool kvbm__sum_get(const kvbm__tier *t, uint32_t b, uint8_t out[16]);
/* Keeps `sum` for pinned READY block b unless one is kept already (the
 * first writer wins; every writer hashed the same bytes). */
void kvbm__sum_keep(const kvbm__tier *t, uint32_t b, const uint8_t sum[16]);
/* Forgets block b's checksum: a new registration (its bytes are to come),
 * an eviction. Lock held (or b owned by the caller). */
void kvbm__sum_clear(const kvbm__tier *t, uint32_t b);
/* Forgets every block's (the pool was cleared). */
void kvbm__sums_clear_all(const kvbm__tier *t);
/* BLAKE3-128 of host block b's bytes in canonical order (layer 0 first). */
void kvbm__block_hash(const kvbm__tier *t, uint32_t b, uint8_t sum[16]);

/* ---- store.c: values in volume tiers (no lock) ---- */

/* Bytes of one value: the framed form (frame header + body header + block)
 * or the bare block. */
size_t kvbm__value_len(const kvbm_manager *m, const kvbm__tier *t);
/* ... of a block of group g (framed values carry the group's bytes). */
size_t kvbm__value_len_group(const kvbm_manager *m, const kvbm__tier *t, uint32_t g);
/* Offset of the block's bytes inside a value. */
size_t kvbm__value_data_off(const kvbm__tier *t);
/* Seals a framed value whose block bytes are already at buf +
 * kvbm__value_data_off(): writes the body header (namespace, key, parent,
 * layout) and the frame header (BLAKE3-128 of the body). */
void kvbm__value_seal(const kvbm_manager *m, const kvbm__tier *t, uint8_t *buf, uint64_t key,
                      uint64_t parent, bool has_parent, kvbm_frame_phase phase, uint32_t grp);
/* Checks a framed value of `size` bytes read for `key`: KVBM_OK, or
 * KVBM_ETRUNCATED / KVBM_ETOOLONG (its size), KVBM_ECHECKSUM (the frame's
 * BLAKE3 or header), KVBM_EFORMAT (another namespace, key, layout or
 * block size). The block's bytes are then at kvbm__value_data_off(). */
/* G4: reads the cluster key (g4_key or g4_key_file), derives the tier's
 * MAC key from it and zeroes every copy of the secret it made; no key
 * configured: t stays unkeyed. KVBM_EINVAL with a message for a key that
 * cannot be used (short, unreadable file, file others can read). */
int kvbm__value_key_init(kvbm_manager *m, kvbm__tier *t, kvbm_error *err);
int kvbm__value_check(const kvbm_manager *m, const kvbm__tier *t, uint8_t *buf,
                      size_t size, uint64_t key, uint32_t grp);
/* The namespace of the volume tiers' keys (m->ns, m->ns_digest), from the
 * layout fingerprint, hash scheme, block size and model id. */
int kvbm__namespace_init(kvbm_manager *m, kvbm_error *err);

/* What a G4 lookup learned: found[i] for hashes[base + i], i < n. */
typedef struct kvbm__lookup {
  size_t base, n;
  bool *found;
} kvbm__lookup;
/* Asks the shared tier t whether it holds hashes[0..n), waiting at most
 * lookup_timeout_ms (called WITHOUT the lock). found[i] is set for each
 * held one; a lookup that times out or fails finds nothing. Returns
 * KVBM_OK, KVBM_ETIMEDOUT or the store's error (counted by the caller). */
int kvbm__lookup_run(kvbm_manager *m, kvbm__tier *t, const uint64_t *hashes, size_t n,
                     bool *found);

/* The shared store's back-off (lock held). Reads that fail in a row before
 * the store is left alone: one planted value is a counted miss, not a
 * reason to stop reading a store. */
#define KVBM__BACKOFF_FAILS 8
/* Whether tier t is backed off now (only a shared tier ever is; the
 * clock is read only while a pause is set). */
bool kvbm__backed_off(const kvbm__tier *t);
/* A read of t (a lookup, a get) is over: `failed` says the store failed
 * it (down, late, an error, a value that is not ours), not that the key
 * was absent. Counts toward or resets the back-off. */
void kvbm__read_result(kvbm_manager *m, kvbm__tier *t, bool failed);
/* Lock held. og's deadline passed with onboards from t still out: reports
 * it to t's back-off once per prefill (whichever side saw it first, the
 * worker or the engine's wait), and only if a get of it was sent: a get
 * still queued says nothing of the store. */
void kvbm__onboards_late(kvbm_manager *m, kvbm__tier *t, kvbm__onboards *og);
/* Whether an onboard from tier t may be abandoned while it is in flight:
 * its bytes land in a staging buffer first (a framed value), so a late
 * answer can be dropped without touching G1. */
bool kvbm__abandonable(const kvbm__tier *t);
/* Lock held. Drops one reference to og (NULL: nothing). */
void kvbm__onboards_release(kvbm__onboards *og);
/* Lock held. Whether get job j (into G1) is of no use any more: its
 * request gave it up, or its match ends before it, or its prefill's
 * deadline passed. A block still waiting for it is marked FAILED and
 * counted abandoned here; the caller then drops what the job brings. */
bool kvbm__onboard_given_up(kvbm_manager *m, kvbm__tier *t, const kvbm__job *j);

/* ---- workers.c ---- */

bool kvbm__q_push(kvbm__jqueue *q, const kvbm__job *j);
/* ---- hints.c: a storage hint's copy is over (lock held) ---- */
void kvbm__hint_put_done(kvbm_manager *m, kvbm__tier *t, const kvbm__job *j, bool ok);
void kvbm__hint_get_done(kvbm_manager *m, kvbm__tier *t, const kvbm__job *j, bool ok);
uint32_t kvbm__q_free(const kvbm__jqueue *q);
/* Pins a target block in the commit's batch (room reserved by the commit). */
void kvbm__batch_pin(kvbm__batch *b, uint8_t tier, uint32_t id);
/* Releases the batch's pins in use order and frees it. */
void kvbm__batch_done(kvbm_manager *m, kvbm__batch *b);
/* Wakes the workers after jobs were queued. */
void kvbm__workers_kick(kvbm_manager *m);
/* Creates the lock, the queues and a worker per usable tier below G1. */
int kvbm__workers_start(kvbm_manager *m, kvbm_error *err);
/* Drains or cancels (per drain_on_destroy) and joins the workers. */
void kvbm__workers_stop(kvbm_manager *m);
/* Queues the deletion of an evicted block's value (exclusive volumes). */
void kvbm__queue_delete(kvbm_manager *m, kvbm__tier *t, uint64_t hash);

/* ---- peer_hooks.c: the peers' hooks (src/peer/ registers them) ---- */

/* Calls the destroy hook (before the tiers go); no hook is called after. */
void kvbm__disagg_stop(kvbm_manager *m);
/* ExitThink's push of r's ready THINK_COMPLETE blocks to peer 0, when at
 * least offload_threshold_blocks are ready. Called without the lock. */
void kvbm__disagg_exit_think(kvbm_mreq *r);
/* A hybrid request's ExitThink batch (hybrid.c builds it, pinned):
 * handed to the exit_think hook, without the lock. False (nothing done)
 * when no peer hooks are registered. The caller unpins. */
bool kvbm__disagg_push_think(kvbm_manager *m, const kvbm_block_ref *blocks, size_t n);
/* Whether a peer acknowledged hash h (*peer: which). Any lock. */
bool kvbm__disagg_remote(kvbm_manager *m, uint64_t h, uint32_t *peer);
/* Asks `peer` for hashes[0..n) back and waits (at most pull_timeout_ms)
 * until they are held here; returns how many are. Without the lock. */
size_t kvbm__disagg_pull(kvbm_manager *m, uint32_t peer, const uint64_t *hashes, size_t n);
/* The OutputCritical pull's room: while G1 has fewer than `need` free
 * blocks, drops cached G1 blocks that a peer acknowledged holding, in
 * eviction order (ThinkComplete ones lead: they were demoted). Returns how
 * many were dropped. Lock held. */
size_t kvbm__disagg_make_room(kvbm_manager *m, size_t need);
/* A G1 or G2 pool event (on_pool_event, m->mu held): a block the peers
 * were told we hold and that left both tiers is queued for a remove. */
void kvbm__disagg_block_gone(kvbm_manager *m, int tier, const kvbm_pool_event *ev);

#endif /* KVBM_TIER_INTERNAL_H */
