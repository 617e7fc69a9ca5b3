/*
 * manager.c: the tiered block manager (see kvbm/manager.h).
 *
 * Design. Each tier is a kvbm_pool (index, LRU, refcounts) plus a byte per
 * block saying whether the block's bytes are there yet (READY), on their
 * way (PENDING) or lost (FAILED). Indexing is synchronous, bytes are not:
 * a block is registered in its target pool the moment a copy is decided, so
 * every later decision (present? evict whom?) is made in the order of the
 * engine's calls, and the worker threads only move bytes of blocks that
 * their job pins with a pool reference. That keeps every tier's contents a
 * function of the sequence of uses (what W2's monotonicity rests on), keeps
 * the lock short (no copy runs under it), and makes a failed copy a state
 * change rather than an index repair: a FAILED block is a miss for lookups
 * and is rewritten in place by the next use that wants it there.
 *
 * Pins. An offload pins its source G1 block (released when its copy is done)
 * and its target blocks through a "batch" (all blocks one commit used, in
 * order); the batch releases them in use order when its last job is done,
 * so recency in G2/G3 is the order of use, not of copy completion. An
 * onboard pins its source and its G1 destination until it lands.
 *
 * One lock guards pools, states, queues and counters. Two workers (host
 * copies, disk I/O) take up to batch_max jobs at a time; the disk worker
 * keeps up to g3_queue_depth slot transfers in flight through io_uring and
 * overlaps gathering one slot with the I/O of the previous ones. Queues are
 * fixed rings: a full ring skips the offload (counted) instead of waiting.
 *
 * Device G1 (a CUDA build, g1_memory DEVICE): the same jobs, but every
 * copy that touches G1 is a cudaMemcpyAsync on the worker's own stream
 * (gpu.c). The host worker queues its whole batch with an event after each
 * job and then waits for the events in order; the disk worker stages G1's
 * bytes through its slot buffers (device memory is not addressable by the
 * disk) with a synchronous copy on its stream. A CUDA error fails that job
 * only: its target is FAILED and copy_errors counts it, as any lost copy.
 * The tests run this path without a GPU through gpu.c's emulated streams
 * (kvbm__manager_testing.g1_emulate): same calls, copies deferred to the waits.
 *
 * Trade-off: one lock for everything is simple and correct; with many
 * engine threads it would become the bottleneck long before the copies do.
 */
#include "kvbm/manager.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>

#include "filter.h"
#include "gpu.h"
#include "kvbm/blake3.h"
#include "volume/disk.h"
#include "tier/testing.h"
#include "kvbm/sequence.h"
#include "kvbm/storage.h"
#include "common/clock.h"

/* Per-block byte states. UNCOMPUTED (G1 only): registered by a request
 * whose engine has not committed its KV yet. */
enum { ST_READY = 0, ST_PENDING = 1, ST_FAILED = 2, ST_UNCOMPUTED = 3 };
enum { J_OFFLOAD, J_DISK_WRITE, J_ONBOARD_HOST, J_DISK_READ };
enum { W_HOST = 0, W_DISK = 1 };
#define G3_KEY_CONTEXT "kvbm 2025-06 G3 slot checksum key v1"
#define NONE UINT32_MAX

typedef struct pin {
  uint8_t tier;
  uint32_t id;
} pin;

typedef struct batch {
  uint32_t pending; /* jobs not finished */
  uint32_t n, cap;
  pin *pins;        /* in use order */
} batch;

typedef struct job {
  uint8_t kind;
  uint8_t src_tier; /* J_DISK_WRITE: G1 or G2 */
  uint8_t prio;     /* G1 release priority */
  bool g3_write;    /* J_OFFLOAD: forward to G3 after the G2 copy */
  bool has_parent;
  int result;       /* set by the worker: 0 or a kvbm_status */
  uint32_t g1, g2, g3;
  uint64_t slot;    /* G3 file slot */
  uint64_t hash, parent;
  batch *b;
} job;

typedef struct jqueue {
  job *ring;
  uint32_t cap, head, count;
} jqueue;

typedef struct tier {
  bool present;
  kvbm_pool *pool;
  kvbm_layout layout;
  kvbm_storage *storage; /* G1, G2 */
  kvbm_memory_type memory;
  bool device;           /* bytes not addressable by the host (DEVICE) */
  uint8_t **region;      /* region bases (G1, G2) */
  uint8_t *state;
  kvbm_offload_policy policy;
  bool filter_on;
  kvbm_freq_filter filter;
  kvbm_tier_stats st;
} tier;

struct kvbm_manager {
  kvbm_manager_config cfg;
  kvbm__manager_testing testing; /* test seams (tier/testing.h), zero otherwise */
  char *g3_dir;
  bool g3_keyed;                  /* G3 slots carry keyed-BLAKE3 sums */
  uint8_t g3_key[KVBM_DISK_KEY_LEN];
  tier t[KVBM_TIER_COUNT];
  kvbm_disk *disk;
  kvbm_layout slot_layout; /* one FullyContiguous block: the slot data format */
  uint64_t *slot_of, *block_of;
  uint64_t block_bytes;
  uint64_t *g1_owner;  /* request serial that registered each G1 block */
  uint64_t cur_serial, next_serial;
  uint32_t *zero_tokens;
  char g3_err[KVBM_ERROR_MSG_MAX];
  char g3_mode[64];
  pthread_mutex_t mu;
  pthread_cond_t work_cv[2], done_cv;
  jqueue q[2];
  uint32_t busy[2];
  bool stop, cancel;
  bool host_running; /* the host worker may still forward jobs to the disk queue */
  pthread_t th[2];
  int nthreads;
  void **bounce; /* disk worker's slot buffers */
  uint32_t nbounce;
  kvbm_gpu_stream *gs[2]; /* device G1: one CUDA stream per worker */
  bool emu;                 /* device G1 emulated in host memory (tests) */
  _Atomic uint64_t emu_copies;
  kvbm__disk_io *ios;                    /* one per buffer */
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

/* ---- names, config ---- */

const char *kvbm_offload_policy_name(int p) {
  static const char *const n[] = {"never", "all", "frequency"};
  return p >= 0 && p <= 2 ? n[p] : "?";
}

bool kvbm_offload_policy_parse(const char *s, kvbm_offload_policy *out) {
  for (int p = 0; p <= 2 && s; p++)
    if (!strcmp(s, kvbm_offload_policy_name(p))) {
      *out = (kvbm_offload_policy)p;
      return true;
    }
  return false;
}

kvbm_manager_config kvbm_manager_config_default(void) {
  kvbm_manager_config c;
  memset(&c, 0, sizeof c);
  c.block_size = 16;
  c.scheme = KVBM_HASH_NATIVE;
  c.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 2, .outer_dim = 1,
                                  .page_size = 16, .inner_dim = 64, .dtype_size = 2,
                                  .alignment = 4096};
  c.g1_kind = c.g2_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
  c.g1_memory = c.g2_memory = KVBM_MEMORY_SYSTEM;
  c.g1_blocks = 1024;
  c.g3_direct = true;
  c.g3_uring = true;
  c.g3_queue_depth = 8;
  c.g2_policy = KVBM_OFFLOAD_ALL;
  c.g3_policy = KVBM_OFFLOAD_FREQUENCY;
  c.freq_threshold = 2;
  c.freq_decay_uses = 65536;
  c.freq_max_entries = 1u << 20;
  c.queue_capacity = 4096;
  c.batch_max = 64;
  c.drain_on_destroy = true;
  return c;
}

static const char *env_get(const char *const *env, const char *name) {
  if (!env) return getenv(name);
  size_t n = strlen(name);
  for (; *env; env++)
    if (!strncmp(*env, name, n) && (*env)[n] == '=') return *env + n + 1;
  return NULL;
}

static int env_blocks(const char *name, const char *v, uint64_t max, uint64_t *out,
                      kvbm_error *err) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (!*v || *end || errno || v[0] == '-' || x > max)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is not a block count in 0..%llu",
                          name, v, (unsigned long long)max);
  *out = x;
  return KVBM_OK;
}

static int env_gib(const char *name, const char *v, uint64_t block_bytes, uint64_t max,
                   uint64_t *out, kvbm_error *err) {
  char *end;
  errno = 0;
  double g = strtod(v, &end);
  if (!*v || *end || errno || !(g >= 0) || g > 1e9)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is not a size in GiB", name, v);
  double blocks = g * 1073741824.0 / (double)block_bytes;
  if (blocks > (double)max)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is more than %llu blocks", name, v,
                          (unsigned long long)max);
  *out = (uint64_t)blocks;
  return KVBM_OK;
}

int kvbm_manager_config_env(kvbm_manager_config *cfg, const char *const *env, kvbm_error *err) {
  if (!cfg) return kvbm_error_set(err, KVBM_EINVAL, "manager: NULL config");
  kvbm_layout lay;
  kvbm_layout_config lc = cfg->layout;
  lc.num_blocks = 1;
  int rc = kvbm_layout_init(&lay, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, err);
  if (rc) return rc;
  uint64_t bb = lay.config.num_layers * lay.layer_stride;
  kvbm_manager_config c = *cfg;
  uint64_t x;
  const char *v;
  if ((v = env_get(env, "DYN_KVBM_CPU_CACHE_GB"))) {
    if ((rc = env_gib("DYN_KVBM_CPU_CACHE_GB", v, bb, KVBM_POOL_MAX_BLOCKS, &x, err))) return rc;
    c.g2_blocks = (uint32_t)x;
  }
  if ((v = env_get(env, "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS"))) {
    if ((rc = env_blocks("DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS", v, KVBM_POOL_MAX_BLOCKS, &x,
                         err)))
      return rc;
    c.g2_blocks = (uint32_t)x;
  }
  if ((v = env_get(env, "DYN_KVBM_DISK_CACHE_GB"))) {
    if ((rc = env_gib("DYN_KVBM_DISK_CACHE_GB", v, bb, KVBM_POOL_MAX_BLOCKS, &x, err))) return rc;
    c.g3_blocks = x;
  }
  if ((v = env_get(env, "DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS"))) {
    if ((rc = env_blocks("DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS", v, KVBM_POOL_MAX_BLOCKS, &x,
                         err)))
      return rc;
    c.g3_blocks = x;
  }
  if ((v = env_get(env, "DYN_KVBM_DISK_CACHE_DIR"))) {
    if (!*v) return kvbm_error_set(err, KVBM_EINVAL, "manager: DYN_KVBM_DISK_CACHE_DIR is empty");
    c.g3_dir = v;
  }
  if ((v = env_get(env, "DYN_KVBM_DISK_DISABLE_O_DIRECT"))) {
    if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
        !strcasecmp(v, "on"))
      c.g3_direct = false;
    else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
             !strcasecmp(v, "off") || !*v)
      c.g3_direct = true;
    else
      return kvbm_error_set(err, KVBM_EINVAL,
                            "manager: DYN_KVBM_DISK_DISABLE_O_DIRECT='%s' is not a boolean", v);
  }
  *cfg = c;
  return KVBM_OK;
}

/* ---- small helpers (lock held unless said otherwise) ---- */

static bool q_push(jqueue *q, const job *j) {
  if (q->count == q->cap) return false;
  q->ring[(q->head + q->count) % q->cap] = *j;
  q->count++;
  return true;
}

static uint32_t q_free(const jqueue *q) { return q->cap - q->count; }

/* Address of layer l of block b in a host tier (no checks: callers pass
 * blocks their pins keep valid). */
static uint8_t *layer_ptr(const tier *t, uint32_t b, uint64_t l) {
  const kvbm_layout *L = &t->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    return t->region[0] + b * L->block_stride + l * L->layer_stride;
  return t->region[l] + b * L->block_stride;
}

static void copy_block(const tier *dst, uint32_t db, const tier *src, uint32_t sb) {
  const kvbm_layout *L = &src->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS && dst->layout.kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    memcpy(layer_ptr(dst, db, 0), layer_ptr(src, sb, 0), L->config.num_layers * L->layer_stride);
    return;
  }
  for (uint64_t l = 0; l < L->config.num_layers; l++)
    memcpy(layer_ptr(dst, db, l), layer_ptr(src, sb, l), L->layer_stride);
}

static void gather(uint8_t *out, const tier *src, uint32_t b) {
  const kvbm_layout *L = &src->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    memcpy(out, layer_ptr(src, b, 0), L->config.num_layers * L->layer_stride);
    return;
  }
  for (uint64_t l = 0; l < L->config.num_layers; l++)
    memcpy(out + l * L->layer_stride, layer_ptr(src, b, l), L->layer_stride);
}

static void scatter(tier *dst, uint32_t b, const uint8_t *in) {
  const kvbm_layout *L = &dst->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    memcpy(layer_ptr(dst, b, 0), in, L->config.num_layers * L->layer_stride);
    return;
  }
  for (uint64_t l = 0; l < L->config.num_layers; l++)
    memcpy(layer_ptr(dst, b, l), in + l * L->layer_stride, L->layer_stride);
}

/* The CUDA forms of copy_block, gather and scatter: queued on stream s
 * (gather/scatter then wait for it, their buffer is reused at once).
 * Return KVBM_OK or KVBM_EDEVICE. */
static int copy_block_gpu(kvbm_gpu_stream *s, const tier *dst, uint32_t db, const tier *src,
                          uint32_t sb) {
  const kvbm_layout *L = &src->layout;
  int rc = KVBM_OK;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS && dst->layout.kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    return kvbm__gpu_copy(s, layer_ptr(dst, db, 0), layer_ptr(src, sb, 0),
                         L->config.num_layers * L->layer_stride);
  for (uint64_t l = 0; !rc && l < L->config.num_layers; l++)
    rc = kvbm__gpu_copy(s, layer_ptr(dst, db, l), layer_ptr(src, sb, l), L->layer_stride);
  return rc;
}

static int gather_gpu(kvbm_gpu_stream *s, uint8_t *out, const tier *src, uint32_t b) {
  const kvbm_layout *L = &src->layout;
  int rc = KVBM_OK;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    rc = kvbm__gpu_copy(s, out, layer_ptr(src, b, 0), L->config.num_layers * L->layer_stride);
  else
    for (uint64_t l = 0; !rc && l < L->config.num_layers; l++)
      rc = kvbm__gpu_copy(s, out + l * L->layer_stride, layer_ptr(src, b, l), L->layer_stride);
  return rc ? rc : kvbm__gpu_sync(s);
}

static int scatter_gpu(kvbm_gpu_stream *s, tier *dst, uint32_t b, const uint8_t *in) {
  const kvbm_layout *L = &dst->layout;
  int rc = KVBM_OK;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    rc = kvbm__gpu_copy(s, layer_ptr(dst, b, 0), in, L->config.num_layers * L->layer_stride);
  else
    for (uint64_t l = 0; !rc && l < L->config.num_layers; l++)
      rc = kvbm__gpu_copy(s, layer_ptr(dst, b, l), in + l * L->layer_stride, L->layer_stride);
  return rc ? rc : kvbm__gpu_sync(s);
}

/* Capacity is reserved by the commit (two pins per block at most), so
 * pinning never allocates. */
static void batch_pin(batch *b, uint8_t tier, uint32_t id) { b->pins[b->n++] = (pin){tier, id}; }

static void batch_done(kvbm_manager *m, batch *b) {
  for (uint32_t i = 0; i < b->n; i++) kvbm_block_release(m->t[b->pins[i].tier].pool, b->pins[i].id, 0);
  free(b->pins);
  free(b);
}

static void batch_job_done(kvbm_manager *m, batch *b) {
  if (b && --b->pending == 0) batch_done(m, b);
}

/* The pools report to us first: an evicted block's bytes are gone, so a
 * FAILED mark must not outlive it; then the user's listener. */
static void on_pool_event(kvbm_manager *m, int tier, const kvbm_pool_event *ev) {
  if (ev->kind == KVBM_POOL_REMOVED) m->t[tier].state[ev->block_id] = ST_READY;
  if (ev->kind == KVBM_POOL_STORED && tier == KVBM_TIER_G1) {
    /* Registered before its KV exists: not a hit for anyone until its
     * request commits (an onboard turns it PENDING right after). */
    m->t[tier].state[ev->block_id] = ST_UNCOMPUTED;
    m->g1_owner[ev->block_id] = m->cur_serial;
  }
  if (m->cfg.listener[tier]) m->cfg.listener[tier](m->cfg.listener_user[tier], ev);
}
static void on_g1(void *u, const kvbm_pool_event *ev) { on_pool_event(u, KVBM_TIER_G1, ev); }
static void on_g2(void *u, const kvbm_pool_event *ev) { on_pool_event(u, KVBM_TIER_G2, ev); }
static void on_g3(void *u, const kvbm_pool_event *ev) { on_pool_event(u, KVBM_TIER_G3, ev); }

/* ---- workers ---- */

/* Finishes a host job (lock held). */
static void host_done(kvbm_manager *m, job *j, bool ran) {
  tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2], *g3 = &m->t[KVBM_TIER_G3];
  bool ok = ran && j->result == KVBM_OK; /* only CUDA copies can fail */
  if (ran && !ok) g2->st.copy_errors++;
  if (j->kind == J_OFFLOAD) {
    g2->state[j->g2] = ok ? ST_READY : ST_FAILED;
    if (ok) {
      g2->st.offloaded_blocks++;
      g2->st.offloaded_bytes += m->block_bytes;
    }
    kvbm_block_release(g1->pool, j->g1, j->prio);
    if (j->g3_write) {
      job d = *j;
      d.kind = J_DISK_WRITE;
      d.src_tier = KVBM_TIER_G2;
      d.result = KVBM_OK;
      if (ok && q_push(&m->q[W_DISK], &d)) {
        pthread_cond_signal(&m->work_cv[W_DISK]);
        return; /* the disk job carries the batch on */
      }
      g3->state[j->g3] = ST_FAILED;
      if (ok) g3->st.skipped_queue++;
    }
    batch_job_done(m, j->b);
  } else { /* J_ONBOARD_HOST */
    g1->state[j->g1] = ok ? ST_READY : ST_FAILED;
    if (ok) {
      g2->st.onboarded_blocks++;
      g2->st.onboarded_bytes += m->block_bytes;
    } else {
      g2->st.onboard_failures++;
    }
    kvbm_block_release(g2->pool, j->g2, 0);
    kvbm_block_release(g1->pool, j->g1, j->prio);
  }
}

/* Finishes a disk job (lock held). */
static void disk_done(kvbm_manager *m, job *j, bool ran) {
  tier *g1 = &m->t[KVBM_TIER_G1], *g3 = &m->t[KVBM_TIER_G3];
  bool ok = ran && j->result == KVBM_OK;
  if (j->kind == J_DISK_WRITE) {
    g3->state[j->g3] = ok ? ST_READY : ST_FAILED;
    if (ok) {
      g3->st.offloaded_blocks++;
      g3->st.offloaded_bytes += m->block_bytes;
    } else if (ran && j->result == KVBM_EDEVICE) {
      g3->st.copy_errors++; /* staging out of device G1 failed */
    } else if (ran) {
      g3->st.skipped_io++;
    }
    if (j->src_tier == KVBM_TIER_G1) kvbm_block_release(g1->pool, j->g1, j->prio);
    batch_job_done(m, j->b);
  } else { /* J_DISK_READ */
    g1->state[j->g1] = ok ? ST_READY : ST_FAILED;
    if (ok) {
      g3->st.onboarded_blocks++;
      g3->st.onboarded_bytes += m->block_bytes;
    } else {
      g3->st.onboard_failures++;
      if (ran && j->result == KVBM_EDEVICE) {
        g3->st.copy_errors++; /* the slot was good; the copy into G1 failed */
      } else if (ran) {
        /* The slot cannot serve this hash: never a hit again until rewritten. */
        g3->state[j->g3] = ST_FAILED;
        if (j->result == KVBM_EIO) g3->st.read_errors++;
        else g3->st.checksum_failures++;
      }
    }
    kvbm_block_release(g3->pool, j->g3, 0);
    kvbm_block_release(g1->pool, j->g1, j->prio);
  }
}

static void host_run(kvbm_manager *m, job *j) {
  tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2];
  if (j->kind == J_OFFLOAD) copy_block(g2, j->g2, g1, j->g1);
  else copy_block(g1, j->g1, g2, j->g2);
}

/* Device G1: queue every job's copies with an event after each, then wait
 * for the events in order, so each job gets its own result. */
static void host_run_gpu(kvbm_manager *m, job *jobs, uint32_t n) {
  tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2];
  kvbm_gpu_stream *s = m->gs[W_HOST];
  for (uint32_t i = 0; i < n; i++) {
    job *j = &jobs[i];
    j->result = j->kind == J_OFFLOAD ? copy_block_gpu(s, g2, j->g2, g1, j->g1)
                                     : copy_block_gpu(s, g1, j->g1, g2, j->g2);
    if (!j->result) j->result = kvbm__gpu_mark(s, i);
  }
  for (uint32_t i = 0; i < n; i++)
    if (!jobs[i].result) jobs[i].result = kvbm__gpu_wait(s, i);
}

/* The pieces of block b of a host tier as zero-copy slot data, or 0 when
 * some piece is not page-aligned (then the slot is staged in a buffer). */
static int data_pieces(const kvbm_manager *m, const tier *t, uint32_t b, struct iovec *iov) {
  const kvbm_layout *L = &t->layout;
  int n;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    iov[0] = (struct iovec){layer_ptr(t, b, 0), (size_t)(L->config.num_layers * L->layer_stride)};
    n = 1;
  } else {
    if (L->config.num_layers > KVBM_DISK_MAX_IOV) return 0;
    n = (int)L->config.num_layers;
    for (int l = 0; l < n; l++) iov[l] = (struct iovec){layer_ptr(t, b, (uint64_t)l), (size_t)L->layer_stride};
  }
  for (int i = 0; i < n; i++)
    if (t->device || !kvbm__disk_direct_ok(m->disk, iov[i].iov_base, iov[i].iov_len)) return 0;
  return n;
}

/* Prepares and starts job i: a write is sealed (its checksum taken from the
 * tier's memory, or from the staged copy), a read targets G1 directly when
 * it can. */
static void disk_start(kvbm_manager *m, job *j, uint32_t i) {
  kvbm__disk_io *io = &m->ios[i];
  uint8_t *buf = m->bounce[i];
  bool write = j->kind == J_DISK_WRITE;
  const tier *t = &m->t[write ? j->src_tier : KVBM_TIER_G1];
  uint32_t b = write && j->src_tier == KVBM_TIER_G2 ? j->g2 : j->g1;
  int n = data_pieces(m, t, b, m->pieces[i]);
  io->slot = j->slot;
  io->buf = buf;
  io->write = write;
  io->user = j;
  io->data = (kvbm__disk_data){n ? m->pieces[i] : NULL, n};
  if (write) {
    if (!n && t->device && gather_gpu(m->gs[W_DISK], buf, t, b) != KVBM_OK) {
      j->result = KVBM_EDEVICE;
      io->user = NULL; /* finished: failed */
      return;
    }
    if (!n && !t->device) gather(buf, t, b);
    kvbm_slot_header h = {.seq_hash = j->hash, .parent_hash = j->parent,
                          .has_parent = j->has_parent};
    kvbm__disk_seal(m->disk, buf, &io->data, &h);
  }
  j->result = KVBM_EIO;
  if (kvbm__disk_begin(m->disk, io) != KVBM_OK) io->user = NULL;
}

/* A finished transfer: a read is checked (header, hash, data checksum)
 * where it landed, then copied out of the staging buffer if it was staged. */
static void disk_end(kvbm_manager *m, kvbm__disk_io *io) {
  job *j = io->user;
  if (io->result != 0) {
    j->result = KVBM_EIO;
    return;
  }
  j->result = KVBM_OK;
  if (io->write) return;
  if (kvbm__disk_check(m->disk, io->buf, &io->data, true, &j->hash, NULL) != KVBM_OK)
    j->result = KVBM_ECHECKSUM;
  else if (!io->data.iov && m->t[KVBM_TIER_G1].device)
    j->result = scatter_gpu(m->gs[W_DISK], &m->t[KVBM_TIER_G1], j->g1, io->buf);
  else if (!io->data.iov)
    scatter(&m->t[KVBM_TIER_G1], j->g1, io->buf);
}

static void disk_worker(kvbm_manager *m);

typedef struct worker_arg {
  kvbm_manager *m;
  int w;
} worker_arg;

static void *worker_main(void *arg) {
  kvbm_manager *m = ((worker_arg *)arg)->m;
  int w = ((worker_arg *)arg)->w;
  free(arg);
  /* CUDA's current device is per thread; a failed bind fails each copy. */
  if (m->gs[w]) (void)kvbm__gpu_bind(m->gs[w]);
  if (w == W_DISK) {
    disk_worker(m);
    return NULL;
  }
  jqueue *q = &m->q[w];
  uint32_t max = m->cfg.batch_max;
  job *jobs = malloc(max * sizeof *jobs);
  pthread_mutex_lock(&m->mu);
  for (;;) {
    while (!q->count && !m->stop) pthread_cond_wait(&m->work_cv[w], &m->mu);
    if (!q->count) break;
    uint32_t n = 0;
    /* Without scratch memory the worker still drains, one job at a time. */
    job one;
    job *take = jobs ? jobs : &one;
    uint32_t lim = jobs ? max : 1;
    while (q->count && n < lim) {
      take[n++] = q->ring[q->head];
      q->head = (q->head + 1) % q->cap;
      q->count--;
    }
    bool run = !m->cancel;
    m->busy[w] += n;
    pthread_mutex_unlock(&m->mu);
    double t0 = kvbm_clock_seconds();
    if (run && m->gs[W_HOST])
      host_run_gpu(m, take, n);
    else if (run)
      for (uint32_t i = 0; i < n; i++) host_run(m, &take[i]);
    double dt = kvbm_clock_seconds() - t0;
    pthread_mutex_lock(&m->mu);
    m->t[KVBM_TIER_G2].st.busy_seconds += dt;
    for (uint32_t i = 0; i < n; i++) host_done(m, &take[i], run);
    m->busy[w] -= n;
    pthread_cond_broadcast(&m->done_cv);
  }
  /* Nothing more can be forwarded: let the disk worker finish. */
  m->host_running = false;
  pthread_cond_broadcast(&m->work_cv[W_DISK]);
  pthread_mutex_unlock(&m->mu);
  free(jobs);
  return NULL;
}

/* The disk worker streams: it keeps up to g3_queue_depth transfers in
 * flight, finishes them one at a time as they complete (checking a read
 * while the next ones are still on their way) and refills from the queue,
 * so the disk never idles between batches. Slots (buffer + io) are the
 * unit: a job holds one from the queue until it is completed. */
static void disk_worker(kvbm_manager *m) {
  jqueue *q = &m->q[W_DISK];
  uint32_t ns = m->nbounce, nfree = ns, depth = m->cfg.g3_queue_depth;
  job *jobs = calloc(ns, sizeof *jobs);
  uint32_t *freel = calloc(ns, sizeof *freel), *took = calloc(ns, sizeof *took);
  bool *ran = calloc(ns, sizeof *ran);
  uint32_t *ready = calloc(ns, sizeof *ready);
  bool ok = jobs && freel && took && ran && ready;
  for (uint32_t i = 0; ok && i < ns; i++) freel[i] = i;
  pthread_mutex_lock(&m->mu);
  for (;;) {
    uint32_t nt = 0;
    if (ok)
      while (nfree && q->count && kvbm__disk_pending(m->disk) + nt < depth) {
        uint32_t sl = freel[--nfree];
        jobs[sl] = q->ring[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
        ran[sl] = !m->cancel;
        took[nt++] = sl;
      }
    else if (q->count) { /* no scratch memory: cancel what is queued */
      jobs[0] = q->ring[q->head];
      q->head = (q->head + 1) % q->cap;
      q->count--;
      disk_done(m, &jobs[0], false);
      pthread_cond_broadcast(&m->done_cv);
      continue;
    }
    if (!nt && nfree == ns) {
      if (m->stop && !q->count && !m->host_running) break;
      pthread_cond_wait(&m->work_cv[W_DISK], &m->mu);
      continue;
    }
    m->busy[W_DISK] += nt;
    pthread_mutex_unlock(&m->mu);
    double t0 = kvbm_clock_seconds();
    uint32_t nready = 0;
    for (uint32_t i = 0; i < nt; i++) {
      uint32_t sl = took[i];
      if (ran[sl]) disk_start(m, &jobs[sl], sl);
      if (!ran[sl] || !m->ios[sl].user) ready[nready++] = sl; /* cancelled or refused */
    }
    if (!nready) {
      kvbm__disk_io *io = kvbm__disk_reap(m->disk);
      if (io) {
        disk_end(m, io);
        ready[nready++] = (uint32_t)(io - m->ios);
      }
    }
    double dt = kvbm_clock_seconds() - t0;
    pthread_mutex_lock(&m->mu);
    m->t[KVBM_TIER_G3].st.busy_seconds += dt;
    for (uint32_t i = 0; i < nready; i++) {
      uint32_t sl = ready[i];
      disk_done(m, &jobs[sl], ran[sl]);
      freel[nfree++] = sl;
      m->busy[W_DISK]--;
    }
    pthread_cond_broadcast(&m->done_cv);
  }
  pthread_mutex_unlock(&m->mu);
  free(jobs);
  free(freel);
  free(took);
  free(ran);
  free(ready);
}

/* ---- create / destroy ---- */

/* Large host tiers are backed by transparent huge pages where the kernel
 * allows it (MADV_HUGEPAGE; an error or THP "never" leaves 4 KiB pages).
 * Why: an O_DIRECT request is built from the physical segments of its
 * memory, at most max_segments (254 on virtio) per request. A 2 MiB block
 * in scattered 4 KiB pages (recycled memory, typical after a while) then
 * goes to the disk as two ~1 MiB requests plus a fragment, ~20% slower
 * for reads here; on a huge page it is one 2 MiB request. It also cuts
 * TLB misses of the G1<->G2 copies. Zeroed after the advice, so the pages
 * are faulted in huge. */
#define HUGE_PAGE ((uint64_t)2 << 20)

static void advise_huge(void *p, uint64_t len) {
  if (!p) return;
  (void)madvise(p, (size_t)len, MADV_HUGEPAGE);
  memset(p, 0, (size_t)len);
}

static int host_tier(kvbm_manager *m, int ti, uint32_t nblocks, kvbm_layout_kind kind,
                     kvbm_memory_type memory, kvbm_pool_listener fn, kvbm_error *err) {
  tier *t = &m->t[ti];
  kvbm_layout_config lc = m->cfg.layout;
  lc.num_blocks = nblocks;
  int rc = kvbm_layout_init(&t->layout, kind, &lc, err);
  bool emu = memory == KVBM_MEMORY_DEVICE && ti == KVBM_TIER_G1 && m->testing.g1_emulate;
  if (!rc && memory != KVBM_MEMORY_SYSTEM && !emu && !kvbm__gpu_compiled())
    return kvbm_error_set(err, KVBM_EUNSUPPORTED, "manager: %s memory for %s needs a CUDA build",
                          kvbm_memory_type_name(memory), kvbm_tier_name(ti));
  /* Zero-filled: every page is touched now, not on the first copy into it
   * (what pinned memory would give; the cost moves to create). */
  kvbm_storage_config so = {.zero = 1, .device_id = m->cfg.g1_device};
  kvbm_memory_type alloc = emu ? KVBM_MEMORY_SYSTEM : memory;
  bool huge = alloc == KVBM_MEMORY_SYSTEM && !rc && t->layout.region_size >= HUGE_PAGE;
  if (huge) { /* we zero it ourselves, after the advice */
    so.zero = 0;
    so.alignment = t->layout.config.alignment > HUGE_PAGE ? 0 : HUGE_PAGE;
  }
  if (!rc) rc = kvbm_storage_create(alloc, &t->layout, &so, &t->storage, err);
  if (rc) return rc;
  for (uint64_t r = 0; huge && r < t->layout.num_regions; r++)
    advise_huge(kvbm_storage_region_base(t->storage, r), t->layout.region_size);
  t->memory = memory;
  t->device = memory == KVBM_MEMORY_DEVICE;
  /* Device G1: each worker gets a stream (events: one per job of a batch). */
  if (t->device) m->emu = emu;
  for (int w = 0; t->device && w < 2; w++) {
    uint32_t nev = w == W_HOST ? m->cfg.batch_max : 0;
    rc = emu ? kvbm__gpu_stream_emulated(nev, &m->emu_copies, m->testing.g1_fail_copy, &m->gs[w],
                                        err)
             : kvbm__gpu_stream_create(m->cfg.g1_device, nev, &m->gs[w], err);
    if (rc) return rc;
  }
  t->region = calloc(t->layout.num_regions, sizeof *t->region);
  t->state = calloc(nblocks, 1);
  if (!t->region || !t->state) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  for (uint64_t r = 0; r < t->layout.num_regions; r++)
    t->region[r] = kvbm_storage_region_base(t->storage, r);
  kvbm_pool_config pc = kvbm_pool_config_default(nblocks, m->cfg.block_size);
  pc.scheme = m->cfg.scheme;
  pc.keep_tokens = false;
  pc.fill_only = ti != KVBM_TIER_G1; /* G2 blocks are filled whole by copies, never appended to */
  pc.listener = fn;
  pc.listener_user = m;
  if ((rc = kvbm_pool_create(&pc, &t->pool, err))) return rc;
  t->present = true;
  return KVBM_OK;
}

typedef struct restore_ent {
  uint64_t slot;
  kvbm_slot_header h;
} restore_ent;

typedef struct restore_list {
  restore_ent *v;
  size_t n, cap;
  bool oom;
} restore_list;

static void restore_collect(void *user, uint64_t slot, const kvbm_slot_header *h) {
  restore_list *l = user;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    restore_ent *v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = true;
      return;
    }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = (restore_ent){slot, *h};
}

static int by_write_seq(const void *a, const void *b) {
  uint64_t x = ((const restore_ent *)a)->h.write_seq, y = ((const restore_ent *)b)->h.write_seq;
  return x < y ? -1 : x > y;
}

/* Maps G3 pool block b to file slot s (a swap keeps both maps permutations). */
static void assign_slot(kvbm_manager *m, uint32_t b, uint64_t s) {
  uint64_t s0 = m->slot_of[b], b0 = m->block_of[s];
  m->slot_of[b] = s;
  m->block_of[s] = b;
  m->slot_of[b0] = s0;
  m->block_of[s0] = b0;
}

/* Warm restart: index every valid slot, oldest first so that the LRU order
 * is the write order. */
static int restore_g3(kvbm_manager *m, kvbm_error *err) {
  tier *t = &m->t[KVBM_TIER_G3];
  restore_list l = {0};
  uint64_t bad = 0;
  int rc = kvbm__disk_scan(m->disk, true, restore_collect, &l, &bad, err);
  if (!rc && l.oom) rc = kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  if (!rc) {
    if (l.n) qsort(l.v, l.n, sizeof *l.v, by_write_seq);
    for (size_t i = 0; i < l.n; i++) {
      uint32_t id, got;
      if (kvbm_pool_alloc(t->pool, 1, &id)) break;
      kvbm_block_fill(t->pool, id, 0, l.v[i].h.parent_hash, l.v[i].h.has_parent, m->zero_tokens,
                      l.v[i].h.seq_hash, &got);
      if (got == id) {
        assign_slot(m, id, l.v[i].slot);
        t->state[id] = ST_READY;
        t->st.restored_blocks++;
      }
      kvbm_block_release(t->pool, got, 0);
    }
    t->st.restore_skipped = bad;
  }
  free(l.v);
  return rc;
}

static void open_g3(kvbm_manager *m) {
  tier *t = &m->t[KVBM_TIER_G3];
  kvbm_error e = {0};
  kvbm__disk_config dc = {.dir = m->g3_dir, .num_slots = m->cfg.g3_blocks,
                         .data_bytes = m->block_bytes,
                         .fingerprint = kvbm_layout_fingerprint(&m->slot_layout),
                         .persist = m->cfg.g3_persist, .direct = m->cfg.g3_direct,
                         .uring = m->cfg.g3_uring, .queue_depth = m->cfg.g3_queue_depth,
                         .test_refuse = m->testing.g3_refuse,
                         .checksum_key = m->g3_keyed ? m->g3_key : NULL};
  int rc = kvbm__disk_open(&dc, &m->disk, &e);
  if (!rc) rc = restore_g3(m, &e);
  if (rc) {
    snprintf(m->g3_err, sizeof m->g3_err, "%s", e.msg);
    kvbm__disk_close(m->disk);
    m->disk = NULL;
    t->present = false;
    return;
  }
  snprintf(m->g3_mode, sizeof m->g3_mode, "%s+%s",
           kvbm__disk_is_uring(m->disk) ? "io_uring" : "pread/pwrite",
           kvbm__disk_is_direct(m->disk) ? "O_DIRECT" : "buffered");
}

static int g3_tier(kvbm_manager *m, kvbm_error *err) {
  tier *t = &m->t[KVBM_TIER_G3];
  uint64_t n = m->cfg.g3_blocks;
  t->state = calloc(n, 1);
  m->slot_of = malloc(n * sizeof *m->slot_of);
  m->block_of = malloc(n * sizeof *m->block_of);
  if (!t->state || !m->slot_of || !m->block_of)
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  for (uint64_t i = 0; i < n; i++) m->slot_of[i] = m->block_of[i] = i;
  kvbm_pool_config pc = kvbm_pool_config_default((uint32_t)n, m->cfg.block_size);
  pc.scheme = m->cfg.scheme;
  pc.keep_tokens = false;
  pc.fill_only = true; /* the index only names blocks: no token slots (4 B x block_size each) */
  pc.listener = on_g3;
  pc.listener_user = m;
  int rc = kvbm_pool_create(&pc, &t->pool, err);
  if (rc) return rc;
  t->present = true;
  m->nbounce = m->cfg.g3_queue_depth + 1; /* in flight + one being finished */
  m->bounce = calloc(m->nbounce, sizeof *m->bounce);
  m->ios = calloc(m->nbounce, sizeof *m->ios);
  m->pieces = calloc(m->nbounce, sizeof *m->pieces);
  if (!m->bounce || !m->ios || !m->pieces)
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  open_g3(m);
  for (uint32_t i = 0; m->disk && i < m->nbounce; i++)
    if (!(m->bounce[i] = kvbm__disk_buffer(m->disk)))
      return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  return KVBM_OK;
}

static int check_config(const kvbm_manager_config *c, kvbm_error *err) {
  if (c->block_size == 0 || c->block_size > KVBM_POOL_MAX_BLOCK_SIZE)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: block_size %u is not in 1..%u",
                          c->block_size, KVBM_POOL_MAX_BLOCK_SIZE);
  if (c->g1_blocks == 0 || c->g1_blocks > KVBM_POOL_MAX_BLOCKS)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g1_blocks %u is not in 1..%u", c->g1_blocks,
                          KVBM_POOL_MAX_BLOCKS);
  if (c->g2_blocks > KVBM_POOL_MAX_BLOCKS)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g2_blocks %u is above %u", c->g2_blocks,
                          KVBM_POOL_MAX_BLOCKS);
  if (c->g3_key && (c->g3_key_len < KVBM_MANAGER_G3_KEY_MIN || c->g3_key_len > KVBM_MANAGER_G3_KEY_MAX))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g3_key must be %u..%u bytes, not %zu",
                          KVBM_MANAGER_G3_KEY_MIN, KVBM_MANAGER_G3_KEY_MAX, c->g3_key_len);
  if (c->g3_blocks > KVBM_POOL_MAX_BLOCKS)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g3_blocks %llu is above %u",
                          (unsigned long long)c->g3_blocks, KVBM_POOL_MAX_BLOCKS);
  if (c->g1_memory != KVBM_MEMORY_SYSTEM && c->g1_memory != KVBM_MEMORY_PINNED &&
      c->g1_memory != KVBM_MEMORY_DEVICE)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g1_memory %d is not system, pinned or device",
                          (int)c->g1_memory);
  if (c->g2_memory != KVBM_MEMORY_SYSTEM && c->g2_memory != KVBM_MEMORY_PINNED)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g2_memory %d is not system or pinned",
                          (int)c->g2_memory);
  if (c->g1_memory == KVBM_MEMORY_DEVICE && c->g1_device < 0)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g1_device %d is negative", (int)c->g1_device);
  for (int k = 0; k < 2; k++) {
    int kind = k ? c->g2_kind : c->g1_kind;
    if (kind != KVBM_LAYOUT_FULLY_CONTIGUOUS && kind != KVBM_LAYOUT_LAYER_SEPARATE)
      return kvbm_error_set(err, KVBM_EINVAL, "manager: %s layout kind %d is unknown",
                            k ? "g2" : "g1", kind);
  }
  if ((unsigned)c->g2_policy > KVBM_OFFLOAD_FREQUENCY || (unsigned)c->g3_policy > KVBM_OFFLOAD_FREQUENCY)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: unknown offload policy");
  if (c->freq_threshold == 0 || c->freq_decay_uses == 0 || c->freq_max_entries == 0 ||
      c->freq_max_entries > (1u << 28))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "manager: freq_threshold, freq_decay_uses must be >= 1 and "
                          "freq_max_entries in 1..2^28");
  if (c->queue_capacity == 0 || c->queue_capacity > (1u << 24))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: queue_capacity %u is not in 1..2^24",
                          c->queue_capacity);
  if (c->batch_max == 0 || c->batch_max > 256)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: batch_max %u is not in 1..256", c->batch_max);
  if (c->g3_queue_depth == 0 || c->g3_queue_depth > 128)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g3_queue_depth %u is not in 1..128",
                          c->g3_queue_depth);
  return KVBM_OK;
}

static int start_workers(kvbm_manager *m, kvbm_error *err) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->done_cv, &ca);
  pthread_cond_init(&m->work_cv[0], NULL);
  pthread_cond_init(&m->work_cv[1], NULL);
  pthread_condattr_destroy(&ca);
  for (int w = 0; w < 2; w++) {
    m->q[w].cap = m->cfg.queue_capacity;
    if (!(m->q[w].ring = malloc(m->q[w].cap * sizeof *m->q[w].ring)))
      return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  }
  for (int w = 0; w < 2; w++) {
    if (w == W_HOST && !m->t[KVBM_TIER_G2].present) continue;
    if (w == W_DISK && !m->disk) continue;
    worker_arg *a = malloc(sizeof *a);
    if (!a) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
    *a = (worker_arg){m, w};
    if (w == W_HOST) m->host_running = true;
    if (pthread_create(&m->th[m->nthreads], NULL, worker_main, a)) {
      if (w == W_HOST) m->host_running = false;
      free(a);
      return kvbm_error_set(err, KVBM_ENOMEM, "manager: cannot start a worker thread");
    }
    m->nthreads++;
  }
  return KVBM_OK;
}

int kvbm_manager_create(const kvbm_manager_config *cfg, kvbm_manager **out, kvbm_error *err) {
  return kvbm__manager_create_testing(cfg, NULL, out, err);
}

int kvbm__manager_create_testing(const kvbm_manager_config *cfg, const kvbm__manager_testing *t,
                                 kvbm_manager **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "manager: NULL argument");
  int rc = check_config(cfg, err);
  if (rc) return rc;
  kvbm_manager *m = calloc(1, sizeof *m);
  if (!m) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  m->cfg = *cfg;
  if (t) m->testing = *t;
  m->g3_dir = cfg->g3_dir ? strdup(cfg->g3_dir) : NULL; /* NULL: the disk's private default */
  m->cfg.g3_dir = m->g3_dir;
  if (cfg->g3_key) {
    /* the secret is not kept: only the slot key derived from it */
    kvbm_blake3_derive_key(G3_KEY_CONTEXT, cfg->g3_key, cfg->g3_key_len, m->g3_key, sizeof m->g3_key);
    m->g3_keyed = true;
    m->cfg.g3_key = NULL;
    m->cfg.g3_key_len = 0;
  }
  m->zero_tokens = calloc(cfg->block_size, sizeof *m->zero_tokens);
  kvbm_layout_config lc = cfg->layout;
  lc.num_blocks = 1;
  if ((cfg->g3_dir && !m->g3_dir) || !m->zero_tokens) rc = kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  if (!rc) rc = kvbm_layout_init(&m->slot_layout, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, err);
  if (!rc) m->block_bytes = lc.num_layers * m->slot_layout.layer_stride;
  if (!rc && !(m->g1_owner = calloc(cfg->g1_blocks, sizeof *m->g1_owner)))
    rc = kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  if (!rc)
    rc = host_tier(m, KVBM_TIER_G1, cfg->g1_blocks, cfg->g1_kind, cfg->g1_memory, on_g1, err);
  if (!rc && cfg->g2_blocks)
    rc = host_tier(m, KVBM_TIER_G2, cfg->g2_blocks, cfg->g2_kind, cfg->g2_memory, on_g2, err);
  m->t[KVBM_TIER_G2].policy = cfg->g2_policy;
  m->t[KVBM_TIER_G3].policy = cfg->g3_policy;
  for (int ti = 1; !rc && ti < 3; ti++) {
    tier *t = &m->t[ti];
    if (t->policy != KVBM_OFFLOAD_FREQUENCY) continue;
    rc = kvbm__freq_filter_init(&t->filter, cfg->freq_threshold, cfg->freq_decay_uses,
                               cfg->freq_max_entries);
    if (rc) rc = kvbm_error_set(err, rc, "manager: cannot create the frequency filter");
    else t->filter_on = true;
  }
  if (!rc && cfg->g3_blocks) rc = g3_tier(m, err);
  if (!rc) rc = start_workers(m, err);
  if (rc) {
    kvbm_manager_destroy(m);
    return rc;
  }
  *out = m;
  return KVBM_OK;
}

void kvbm_manager_destroy(kvbm_manager *m) {
  if (!m) return;
  if (m->nthreads) {
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    m->cancel = !m->cfg.drain_on_destroy;
    pthread_cond_broadcast(&m->work_cv[0]);
    pthread_cond_broadcast(&m->work_cv[1]);
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; i < m->nthreads; i++) pthread_join(m->th[i], NULL);
  }
  if (m->q[0].ring || m->q[1].ring) {
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->done_cv);
    pthread_cond_destroy(&m->work_cv[0]);
    pthread_cond_destroy(&m->work_cv[1]);
  }
  for (int w = 0; w < 2; w++) {
    free(m->q[w].ring);
    kvbm__gpu_stream_destroy(m->gs[w]);
  }
  for (int ti = 0; ti < KVBM_TIER_COUNT; ti++) {
    tier *t = &m->t[ti];
    kvbm_pool_destroy(t->pool);
    kvbm_storage_release(t->storage);
    free(t->region);
    free(t->state);
    if (t->filter_on) kvbm__freq_filter_destroy(&t->filter);
  }
  for (uint32_t i = 0; m->bounce && i < m->nbounce; i++) free(m->bounce[i]);
  free(m->bounce);
  free(m->ios);
  free(m->pieces);
  kvbm__disk_close(m->disk);
  free(m->slot_of);
  free(m->block_of);
  free(m->zero_tokens);
  free(m->g1_owner);
  free(m->g3_dir);
  explicit_bzero(m->g3_key, sizeof m->g3_key);
  free(m);
}

void kvbm_manager_flush(kvbm_manager *m) {
  if (!m || !m->nthreads) return;
  pthread_mutex_lock(&m->mu);
  while (m->q[0].count || m->q[1].count || m->busy[0] || m->busy[1])
    pthread_cond_wait(&m->done_cv, &m->mu);
  pthread_mutex_unlock(&m->mu);
}

const char *kvbm_manager_g3_error(const kvbm_manager *m) { return m ? m->g3_err : ""; }
const char *kvbm_manager_g3_mode(const kvbm_manager *m) { return m ? m->g3_mode : ""; }
uint64_t kvbm_manager_block_bytes(const kvbm_manager *m) { return m ? m->block_bytes : 0; }

const kvbm_layout *kvbm_manager_layout(const kvbm_manager *m, kvbm_tier ti) {
  if (!m || ti < 0 || ti >= KVBM_TIER_COUNT) return NULL;
  if (ti == KVBM_TIER_G3) return m->disk ? &m->slot_layout : NULL;
  return m->t[ti].present ? &m->t[ti].layout : NULL;
}

int kvbm_manager_block_layer(const kvbm_manager *m, kvbm_tier ti, uint32_t block,
                             uint32_t layer, void **ptr, size_t *size) {
  if (!m || !ptr) return KVBM_EINVAL;
  if (ti != KVBM_TIER_G1 && ti != KVBM_TIER_G2) return KVBM_ETIER;
  const tier *t = &m->t[ti];
  if (!t->present) return KVBM_ETIER;
  if (block >= t->layout.config.num_blocks || layer >= t->layout.config.num_layers)
    return KVBM_ERANGE;
  *ptr = layer_ptr(t, block, layer);
  if (size) *size = t->layout.layer_stride;
  return KVBM_OK;
}

static int block_io(const kvbm_manager *m, kvbm_tier ti, uint32_t block, uint32_t layer,
                    void *host, size_t n, bool to_block, kvbm_error *err) {
  void *p;
  size_t sz;
  int rc = kvbm_manager_block_layer(m, ti, block, layer, &p, &sz);
  if (rc)
    return kvbm_error_set(err, rc, "manager: no block %u layer %u in %s", block, layer,
                          kvbm_tier_name(ti));
  if (!host && n) return kvbm_error_set(err, KVBM_EINVAL, "manager: NULL buffer");
  if (n > sz)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %zu bytes do not fit a layer of %zu", n, sz);
  if (m->t[ti].device && !m->emu) return kvbm__gpu_copy_now(m->cfg.g1_device, to_block ? p : host,
                                                to_block ? host : p, n, err);
  if (n) memcpy(to_block ? p : host, to_block ? host : p, n);
  return KVBM_OK;
}

int kvbm_manager_block_write(const kvbm_manager *m, kvbm_tier tier, uint32_t block,
                             uint32_t layer, const void *src, size_t n, kvbm_error *err) {
  return block_io(m, tier, block, layer, (void *)(uintptr_t)src, n, true, err);
}

int kvbm_manager_block_read(const kvbm_manager *m, kvbm_tier tier, uint32_t block,
                            uint32_t layer, void *dst, size_t n, kvbm_error *err) {
  return block_io(m, tier, block, layer, dst, n, false, err);
}

kvbm_memory_type kvbm_manager_memory(const kvbm_manager *m, kvbm_tier ti) {
  if (!m || ti < 0 || ti >= KVBM_TIER_COUNT) return (kvbm_memory_type)0;
  if (ti == KVBM_TIER_G3) return m->disk ? KVBM_MEMORY_DISK : (kvbm_memory_type)0;
  return m->t[ti].present ? m->t[ti].memory : (kvbm_memory_type)0;
}

int kvbm_manager_stats_get(kvbm_manager *m, kvbm_tier ti, kvbm_tier_stats *out) {
  if (!m || !out || ti < 0 || ti >= KVBM_TIER_COUNT) return KVBM_EINVAL;
  pthread_mutex_lock(&m->mu);
  tier *t = &m->t[ti];
  *out = t->st;
  out->present = t->present && (ti != KVBM_TIER_G3 || m->disk);
  if (t->pool) {
    kvbm_pool_stats ps;
    kvbm_pool_stats_get(t->pool, &ps);
    out->num_blocks = ps.num_blocks;
    out->free = ps.free;
    out->cached = ps.cached;
    out->active = ps.active;
    out->evictions = ps.evicted;
    out->allocated = ps.allocated;
  }
  pthread_mutex_unlock(&m->mu);
  return KVBM_OK;
}

/* ---- requests ---- */

static int keep_tokens(kvbm_mreq *r, const uint32_t *tokens, size_t n) {
  if (n > SIZE_MAX / 4 - r->ntok) return KVBM_EOVERFLOW;
  if (r->ntok + n > r->tcap) {
    size_t cap = r->tcap ? r->tcap : 64;
    while (cap < r->ntok + n) cap *= 2;
    uint32_t *t = realloc(r->tokens, cap * sizeof *t);
    if (!t) return KVBM_ENOMEM;
    r->tokens = t;
    r->tcap = cap;
  }
  if (n) memcpy(r->tokens + r->ntok, tokens, n * sizeof *tokens);
  r->ntok += n;
  return KVBM_OK;
}

/* Whether tier ti (G2, G3) holds hash h with its bytes in place. */
static bool tier_has(const kvbm_manager *m, int ti, uint64_t h) {
  const tier *t = &m->t[ti];
  uint32_t id;
  if (!t->present || (ti == KVBM_TIER_G3 && !m->disk)) return false;
  return kvbm_pool_peek(t->pool, h, &id, NULL) == KVBM_OK && t->state[id] == ST_READY;
}

/* The walk: per block the fastest tier that holds it, up to the first
 * block held nowhere, or the first onboard that has no room in its queue.
 * Returns the length; src[k] the tier; *onboards the blocks below G1;
 * *g1_cached the G1 hits now sitting in the cache. */
static size_t walk(kvbm_manager *m, const uint64_t *hashes, size_t n, uint8_t *src,
                   size_t *onboards, size_t *g1_cached) {
  uint32_t room[2] = {q_free(&m->q[W_HOST]), q_free(&m->q[W_DISK])};
  size_t k = 0;
  *onboards = *g1_cached = 0;
  for (; k < n; k++) {
    bool cached;
    if (kvbm_pool_peek(m->t[KVBM_TIER_G1].pool, hashes[k], NULL, &cached) == KVBM_OK) {
      src[k] = KVBM_TIER_G1;
      *g1_cached += cached;
      continue;
    }
    int ti = tier_has(m, KVBM_TIER_G2, hashes[k]) ? KVBM_TIER_G2
             : tier_has(m, KVBM_TIER_G3, hashes[k]) ? KVBM_TIER_G3 : -1;
    if (ti < 0) break;
    int w = ti == KVBM_TIER_G2 ? W_HOST : W_DISK;
    if (!room[w]) {
      m->t[ti].st.onboard_failures++;
      break;
    }
    room[w]--;
    src[k] = (uint8_t)ti;
    (*onboards)++;
  }
  return k;
}

/* Allocates, registers and queues the onboards of the walk (capacity was
 * checked). G1 hits are pinned first so that no allocation evicts them. */
static void start_onboards(kvbm_manager *m, kvbm_mreq *r, const uint64_t *hashes, size_t n,
                           uint32_t *pins) {
  tier *g1 = &m->t[KVBM_TIER_G1];
  const size_t B = m->cfg.block_size;
  for (size_t k = 0; k < n; k++)
    if (r->src[k] == KVBM_TIER_G1) kvbm_pool_match(g1->pool, hashes[k], &pins[k]);
  for (size_t k = 0; k < n; k++) {
    if (r->src[k] == KVBM_TIER_G1) continue;
    tier *t = &m->t[r->src[k]];
    uint32_t id, got, sid;
    kvbm_pool_alloc(g1->pool, 1, &id);
    kvbm_block_fill(g1->pool, id, r->salt, k ? hashes[k - 1] : 0, k > 0, r->tokens + k * B,
                    hashes[k], &got);
    pins[k] = got;
    g1->state[got] = ST_PENDING;
    kvbm_block_retain(g1->pool, got); /* the job's reference */
    kvbm_pool_match(t->pool, hashes[k], &sid);
    t->st.hit_blocks++;
    job j = {.kind = r->src[k] == KVBM_TIER_G2 ? J_ONBOARD_HOST : J_DISK_READ, .prio = r->prio,
             .g1 = got, .hash = hashes[k]};
    if (r->src[k] == KVBM_TIER_G2) {
      j.g2 = sid;
      q_push(&m->q[W_HOST], &j);
    } else {
      j.g3 = sid;
      j.slot = m->slot_of[sid];
      q_push(&m->q[W_DISK], &j);
    }
  }
}

int kvbm_manager_prefill(kvbm_manager *m, uint64_t salt_hash, uint8_t priority,
                         const uint32_t *tokens, size_t n, kvbm_mreq **out,
                         size_t *matched_tokens, kvbm_error *err) {
  if (!m || !tokens || !out || n == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: prefill needs a manager, tokens (n >= 1) and out");
  const size_t B = m->cfg.block_size, K = (n - 1) / B, total = n / B + (n % B != 0);
  kvbm_mreq *r = calloc(1, sizeof *r);
  uint64_t *hashes = malloc((K ? K : 1) * sizeof *hashes);
  uint32_t *pins = malloc((K ? K : 1) * sizeof *pins);
  int rc = r && hashes && pins ? KVBM_OK : KVBM_ENOMEM;
  if (!rc) {
    r->m = m;
    r->salt = salt_hash;
    r->prio = priority;
    r->settled = SIZE_MAX;
    r->src = malloc(K ? K : 1);
    rc = r->src ? keep_tokens(r, tokens, n) : KVBM_ENOMEM;
  }
  if (!rc) rc = kvbm_seq_create(m->t[KVBM_TIER_G1].pool, salt_hash, priority, &r->seq);
  if (rc) {
    free(hashes);
    free(pins);
    kvbm_mreq_destroy(r);
    return kvbm_error_set(err, rc, "manager: prefill: %s", kvbm_strerror(rc));
  }
  for (size_t k = 0; k < K; k++)
    hashes[k] = kvbm_hash_next(m->cfg.scheme, salt_hash, k ? hashes[k - 1] : 0, k > 0,
                               tokens + k * B, B);

  pthread_mutex_lock(&m->mu);
  r->serial = m->cur_serial = ++m->next_serial;
  tier *g1 = &m->t[KVBM_TIER_G1];
  size_t onboards, g1_cached;
  size_t w = walk(m, hashes, K, r->src, &onboards, &g1_cached);
  /* Everything past the walk gets new blocks; onboards take theirs first.
   * Too little room: forget the lower tiers (W1's own check follows). */
  if (onboards && total - w + onboards > (size_t)kvbm_pool_available(g1->pool) - g1_cached) {
    size_t g1_prefix = 0;
    while (g1_prefix < w && r->src[g1_prefix] == KVBM_TIER_G1) g1_prefix++;
    w = g1_prefix;
    onboards = 0;
  }
  if (onboards) start_onboards(m, r, hashes, w, pins);
  size_t matched = 0;
  rc = kvbm_seq_prefill(r->seq, tokens, n, &matched);
  if (onboards) {
    /* The sequence holds its own references now. */
    for (size_t k = 0; k < w; k++) kvbm_block_release(g1->pool, pins[k], priority);
    pthread_cond_signal(&m->work_cv[W_HOST]);
    pthread_cond_signal(&m->work_cv[W_DISK]);
  }
  if (!rc) {
    r->walk = matched / B;
    g1->st.hit_blocks += r->walk - onboards;
  }
  pthread_mutex_unlock(&m->mu);
  free(hashes);
  free(pins);
  if (rc) {
    kvbm_mreq_destroy(r);
    if (rc == KVBM_ENOSPC)
      return kvbm_error_set(err, rc, "manager: a prompt of %zu tokens does not fit in G1", n);
    return kvbm_error_set(err, rc, "manager: prefill: %s", kvbm_strerror(rc));
  }
  if (matched_tokens) *matched_tokens = matched;
  *out = r;
  return KVBM_OK;
}

/* Lock held. Scans the match: returns false while a block is still being
 * onboarded; otherwise sets r->settled to the blocks before the first one
 * whose bytes were lost. */
static bool settle(kvbm_mreq *r) {
  if (r->settled != SIZE_MAX) return true;
  const uint32_t *ids;
  size_t n;
  kvbm_seq_blocks(r->seq, &ids, &n);
  const uint8_t *st = r->m->t[KVBM_TIER_G1].state;
  size_t first_bad = r->walk;
  for (size_t k = 0; k < r->walk; k++) {
    if (st[ids[k]] == ST_PENDING) return false;
    /* Lost bytes, or another request's block whose KV is not written yet:
     * the match ends there (waiting for another request could deadlock an
     * engine that commits it later on the same thread). */
    if ((st[ids[k]] == ST_FAILED || st[ids[k]] == ST_UNCOMPUTED) && first_bad == r->walk)
      first_bad = k;
  }
  r->settled = first_bad;
  return true;
}

static void fill_info(const kvbm_mreq *r, bool ready, kvbm_mreq_info *out) {
  memset(out, 0, sizeof *out);
  out->ready = ready;
  size_t m = ready ? r->settled : r->walk;
  out->matched_tokens = m * r->m->cfg.block_size;
  for (size_t k = 0; k < m; k++) out->hit_blocks[r->src[k]]++;
  out->num_tokens = kvbm_seq_num_tokens(r->seq);
}

void kvbm_mreq_poll(kvbm_mreq *r, kvbm_mreq_info *out) {
  if (!r || !out) return;
  pthread_mutex_lock(&r->m->mu);
  fill_info(r, settle(r), out);
  pthread_mutex_unlock(&r->m->mu);
}

int kvbm_mreq_wait(kvbm_mreq *r, int timeout_ms, kvbm_mreq_info *out) {
  if (!r) return KVBM_EINVAL;
  kvbm_manager *m = r->m;
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout_ms > 0) {
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000L;
    }
  }
  int rc = KVBM_OK;
  pthread_mutex_lock(&m->mu);
  while (!settle(r)) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&m->done_cv, &m->mu);
    } else if (timeout_ms == 0 || pthread_cond_timedwait(&m->done_cv, &m->mu, &dl) == ETIMEDOUT) {
      if (!settle(r)) rc = KVBM_ETIMEDOUT;
      break;
    }
  }
  if (out) fill_info(r, rc == KVBM_OK, out);
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int kvbm_mreq_block_source(const kvbm_mreq *r, size_t k) {
  return r && k < r->walk ? r->src[k] : -1;
}

bool kvbm_mreq_must_compute(kvbm_mreq *r, size_t k) {
  if (!r) return false;
  kvbm_manager *m = r->m;
  pthread_mutex_lock(&m->mu);
  const uint32_t *ids;
  size_t nb;
  kvbm_seq_blocks(r->seq, &ids, &nb);
  size_t matched = settle(r) ? r->settled : r->walk;
  bool must = false;
  if (k < nb && k >= matched) {
    uint8_t st = m->t[KVBM_TIER_G1].state[ids[k]];
    must = k >= kvbm_seq_num_tokens(r->seq) / m->cfg.block_size || st == ST_FAILED ||
           (st == ST_UNCOMPUTED && m->g1_owner[ids[k]] == r->serial);
  }
  pthread_mutex_unlock(&m->mu);
  return must;
}

int kvbm_mreq_append(kvbm_mreq *r, const uint32_t *tokens, size_t n) {
  if (!r || (n && !tokens)) return KVBM_EINVAL;
  size_t before = r->ntok;
  int rc = keep_tokens(r, tokens, n);
  if (rc) return rc;
  pthread_mutex_lock(&r->m->mu);
  r->m->cur_serial = r->serial;
  rc = kvbm_seq_append(r->seq, tokens, n);
  pthread_mutex_unlock(&r->m->mu);
  if (rc) r->ntok = before;
  return rc;
}

/* One use of full block k (G1 block g1) by a commit: refresh or copy in G2
 * and G3 per policy. Lock held. */
static void use_block(kvbm_manager *m, kvbm_mreq *r, batch *b, size_t k, uint32_t g1id,
                      uint64_t h, uint64_t parent, bool has_parent) {
  const uint32_t *tok = r->tokens + k * m->cfg.block_size;
  tier *g1 = &m->t[KVBM_TIER_G1];
  if (g1->state[g1id] != ST_READY) return; /* another request's, not written yet */
  job j = {.kind = J_OFFLOAD, .prio = r->prio, .g1 = g1id, .g2 = NONE, .g3 = NONE, .hash = h,
           .parent = parent, .has_parent = has_parent, .b = b};
  bool g2_write = false, g2_ready = false, g3_write = false;
  for (int ti = KVBM_TIER_G2; ti <= KVBM_TIER_G3; ti++) {
    tier *t = &m->t[ti];
    if (!t->pool) continue; /* not configured */
    bool want = t->policy == KVBM_OFFLOAD_ALL;
    if (t->filter_on) want = kvbm__freq_filter_use(&t->filter, h);
    if (ti == KVBM_TIER_G3 && !m->disk) {
      if (want) t->st.skipped_unavailable++;
      continue;
    }
    uint32_t id;
    bool present = kvbm_pool_peek(t->pool, h, &id, NULL) == KVBM_OK;
    if (present && t->state[id] != ST_FAILED) {
      kvbm_pool_match(t->pool, h, &id); /* refresh: re-released in use order */
      batch_pin(b, (uint8_t)ti, id);
      if (ti == KVBM_TIER_G2) g2_ready = t->state[id] == ST_READY, j.g2 = id;
      continue;
    }
    if (!want && !present) {
      t->st.filtered++;
      continue;
    }
    int w = ti == KVBM_TIER_G2 ? W_HOST : W_DISK;
    /* Room for the job: the G3 copy of a block that goes to G2 in the same
     * job is checked when the host worker forwards it. */
    if (!(ti == KVBM_TIER_G3 && g2_write) && !q_free(&m->q[w])) {
      t->st.skipped_queue++;
      continue;
    }
    if (present) {
      kvbm_pool_match(t->pool, h, &id); /* FAILED: rewrite in place */
    } else {
      uint32_t got;
      if (kvbm_pool_alloc(t->pool, 1, &id) != KVBM_OK) {
        t->st.skipped_space++;
        continue;
      }
      kvbm_block_fill(t->pool, id, r->salt, parent, has_parent, tok, h, &got);
    }
    t->state[id] = ST_PENDING;
    batch_pin(b, (uint8_t)ti, id);
    if (ti == KVBM_TIER_G2) {
      g2_write = true;
      j.g2 = id;
    } else {
      g3_write = true;
      j.g3 = id;
      j.slot = m->slot_of[id];
    }
  }
  if (g2_write) {
    j.g3_write = g3_write;
    kvbm_block_retain(g1->pool, g1id);
    b->pending++;
    q_push(&m->q[W_HOST], &j); /* room checked above */
  } else if (g3_write) {
    j.kind = J_DISK_WRITE;
    j.src_tier = g2_ready ? KVBM_TIER_G2 : KVBM_TIER_G1;
    if (!g2_ready) kvbm_block_retain(g1->pool, g1id);
    b->pending++;
    q_push(&m->q[W_DISK], &j); /* room checked above */
  }
}

int kvbm_mreq_commit(kvbm_mreq *r) {
  if (!r) return KVBM_EINVAL;
  kvbm_mreq_wait(r, -1, NULL);
  kvbm_manager *m = r->m;
  const size_t B = m->cfg.block_size;
  const uint32_t *ids;
  size_t nb;
  size_t nfull = kvbm_seq_num_tokens(r->seq) / B, todo = nfull - r->committed;
  batch *b = calloc(1, sizeof *b);
  if (b) b->pins = malloc((2 * todo + 1) * sizeof *b->pins);
  if (!b || !b->pins) {
    free(b);
    return KVBM_ENOMEM;
  }
  b->cap = (uint32_t)(2 * todo + 1);
  pthread_mutex_lock(&m->mu);
  kvbm_seq_blocks(r->seq, &ids, &nb);
  uint64_t parent = 0;
  if (r->committed) kvbm_seq_block_hash(r->seq, r->committed - 1, &parent);
  for (size_t k = r->committed; k < nfull; k++) {
    uint64_t h;
    kvbm_seq_block_hash(r->seq, k, &h);
    uint8_t *st = &m->t[KVBM_TIER_G1].state[ids[k]];
    /* Computed now: the blocks this request registered, and those whose
     * onboard failed (the engine recomputed them). */
    if ((*st == ST_UNCOMPUTED && m->g1_owner[ids[k]] == r->serial) ||
        (k >= r->settled && *st == ST_FAILED))
      *st = ST_READY;
    use_block(m, r, b, k, ids[k], h, parent, k > 0);
    parent = h;
  }
  r->committed = nfull;
  if (b->pending == 0) {
    batch_done(m, b);
  } else {
    pthread_cond_signal(&m->work_cv[W_HOST]);
    pthread_cond_signal(&m->work_cv[W_DISK]);
  }
  pthread_mutex_unlock(&m->mu);
  return KVBM_OK;
}

void kvbm_mreq_blocks(const kvbm_mreq *r, const uint32_t **ids, size_t *n) {
  kvbm_seq_blocks(r->seq, ids, n);
}

int kvbm_mreq_block_hash(const kvbm_mreq *r, size_t k, uint64_t *hash) {
  if (!r) return KVBM_EINVAL;
  return kvbm_seq_block_hash(r->seq, k, hash);
}

void kvbm_mreq_destroy(kvbm_mreq *r) {
  if (!r) return;
  if (r->seq) {
    kvbm_mreq_wait(r, -1, NULL);
    pthread_mutex_lock(&r->m->mu);
    /* Blocks it registered but never committed have no KV: whoever
     * matched them must not wait for them, nor use them. */
    const uint32_t *ids;
    size_t nb;
    kvbm_seq_blocks(r->seq, &ids, &nb);
    uint8_t *st = r->m->t[KVBM_TIER_G1].state;
    for (size_t k = 0; k < nb; k++)
      if (st[ids[k]] == ST_UNCOMPUTED && r->m->g1_owner[ids[k]] == r->serial) st[ids[k]] = ST_FAILED;
    kvbm_seq_destroy(r->seq);
    pthread_mutex_unlock(&r->m->mu);
  }
  free(r->tokens);
  free(r->src);
  free(r);
}
