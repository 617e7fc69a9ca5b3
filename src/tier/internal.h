/*
 * tier/internal.h (private): what the manager's files share.
 *
 * The manager is split by concern:
 *   config.c   the config: defaults, environment names, validation
 *   copy.c     moving one block's bytes between tiers' memories (host, CUDA)
 *   workers.c  the job queues and the worker threads that run copies
 *   request.c  the engine's calls: prefill (the walk), wait, commit (the
 *              offload policy), destroy
 *   manager.c  create/destroy, the tiers' set-up, pool events, accessors
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
#include "volume/disk.h"
#include "tier/filter.h"
#include "tier/gpu.h"
#include "tier/testing.h"

/* A call whose failure the manager has ruled out beforehand (room was
 * checked, the block is pinned, ...): its result is asserted in debug
 * builds and ignored otherwise. The call runs in both. */
#ifdef NDEBUG
#define KVBM__MUST(call) ((void)(call))
#else
#define KVBM__MUST(call)                                        \
  do {                                                          \
    int kvbm__must_rc = (call);                                 \
    assert(kvbm__must_rc == KVBM_OK && "ruled out: " #call);    \
    (void)kvbm__must_rc;                                        \
  } while (0)
#endif

/* Per-block byte states. UNCOMPUTED (G1 only): registered by a request
 * whose engine has not committed its KV yet. */
enum { KVBM__READY = 0, KVBM__PENDING = 1, KVBM__FAILED = 2, KVBM__UNCOMPUTED = 3 };
/* Job kinds. */
enum { KVBM__J_OFFLOAD, KVBM__J_DISK_WRITE, KVBM__J_ONBOARD_HOST, KVBM__J_DISK_READ };
/* Workers. */
enum { KVBM__W_HOST = 0, KVBM__W_DISK = 1, KVBM__NWORKERS = 2 };
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

typedef struct kvbm__job {
  uint8_t kind;
  uint8_t src_tier; /* J_DISK_WRITE: G1 or G2 */
  uint8_t prio;     /* G1 release priority */
  bool g3_write;    /* J_OFFLOAD: forward to G3 after the G2 copy */
  bool has_parent;
  int result;       /* set by the worker: 0 or a kvbm_status */
  uint32_t g1, g2, g3;
  uint64_t slot;    /* G3 file slot */
  uint64_t hash, parent;
  kvbm__batch *b;
} kvbm__job;

/* A fixed ring: a full ring skips an offload rather than waiting. */
typedef struct kvbm__jqueue {
  kvbm__job *ring;
  uint32_t cap, head, count;
} kvbm__jqueue;

typedef struct kvbm__tier {
  bool present;
  kvbm_pool *pool;
  kvbm_layout layout;
  kvbm_storage *storage; /* G1, G2 */
  kvbm_memory_type memory;
  bool device;           /* bytes not addressable by the host (DEVICE) */
  uint8_t **region;      /* region bases (G1, G2) */
  uint8_t *state;        /* KVBM__READY ... per block */
  kvbm_offload_policy policy;
  bool filter_on;
  kvbm_freq_filter filter;
  kvbm_tier_stats st;
} kvbm__tier;

struct kvbm_manager {
  kvbm_manager_config cfg;
  kvbm__manager_testing testing; /* test seams (tier/testing.h), zero otherwise */
  char *g3_dir;            /* NULL: the disk's private default */
  bool g3_keyed;           /* G3 slots carry keyed-BLAKE3 sums */
  uint8_t g3_key[KVBM_DISK_KEY_LEN];
  kvbm__tier t[KVBM_TIER_COUNT];
  kvbm_disk *disk;
  kvbm_layout slot_layout; /* one FullyContiguous block: the slot data format */
  uint64_t *slot_of, *block_of;
  uint64_t block_bytes;
  uint64_t *g1_owner; /* serial of the request that registered each G1 block */
  uint64_t next_serial;
  uint32_t *zero_tokens;
  char g3_err[KVBM_ERROR_MSG_MAX];
  char g3_mode[64];
  pthread_mutex_t mu;
  pthread_cond_t work_cv[KVBM__NWORKERS], done_cv;
  kvbm__jqueue q[KVBM__NWORKERS];
  uint32_t busy[KVBM__NWORKERS];
  bool stop, cancel;
  bool host_running; /* the host worker may still forward jobs to the disk queue */
  pthread_t th[KVBM__NWORKERS];
  int nthreads;
  void **bounce; /* disk worker's slot buffers */
  uint32_t nbounce;
  kvbm_gpu_stream *gs[KVBM__NWORKERS]; /* device G1: one CUDA stream per worker */
  bool emu;                            /* device G1 emulated in host memory (tests) */
  _Atomic uint64_t emu_copies;
  kvbm__disk_io *ios;                        /* one per buffer */
  struct iovec (*pieces)[KVBM_DISK_MAX_IOV]; /* zero-copy data pieces, one set per buffer */
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
  size_t committed; /* full blocks committed */
};

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
/* The pieces of block b of a host tier (one for FullyContiguous, one per
 * layer for LayerSeparate) into iov[0..max); 0 when they do not fit. */
int kvbm__block_pieces(const kvbm__tier *t, uint32_t b, struct iovec *iov, int max);

/* ---- workers.c ---- */

bool kvbm__q_push(kvbm__jqueue *q, const kvbm__job *j);
uint32_t kvbm__q_free(const kvbm__jqueue *q);
/* Pins a target block in the commit's batch (room reserved by the commit). */
void kvbm__batch_pin(kvbm__batch *b, uint8_t tier, uint32_t id);
/* Releases the batch's pins in use order and frees it. */
void kvbm__batch_done(kvbm_manager *m, kvbm__batch *b);
/* Wakes the workers after jobs were queued. */
void kvbm__workers_kick(kvbm_manager *m);
/* Creates the queues and starts a worker per present tier below G1
 * (lock and condition variables included). */
int kvbm__workers_start(kvbm_manager *m, kvbm_error *err);
/* Drains or cancels (per drain_on_destroy) and joins the workers. */
void kvbm__workers_stop(kvbm_manager *m);

#endif /* KVBM_TIER_INTERNAL_H */
