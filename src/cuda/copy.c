/* SPDX-License-Identifier: Apache-2.0 */
/*
 * copy.c: the copy engine between device G1 and pinned host G2.
 *
 * What: a copier owns two non-blocking CUDA streams on one device (one for
 * offloads, one for onboards and device-to-device copies, so that both
 * directions of the PCIe link are used at once) and a pool of events. A
 * transfer -- many (src block, dst block) pairs between two storages -- is
 * checked in full, planned into pieces (plan.c: merged where back to back,
 * layer 0 of every block first) and queued step by step, with one event
 * recorded after each layer. The engine's stream waits on those events
 * (cudaStreamWaitEvent), so a layer-by-layer load lets layer 0's attention
 * start while layer 31 is still on the link, with no CPU thread blocked.
 *
 * Why three methods: a 2 MiB block moved whole is one cudaMemcpyAsync at
 * the link's speed; the same block moved layer by layer from a
 * FullyContiguous layout is 32 pieces of 64 KiB, and a batch of scattered
 * 16 KiB layers is thousands of pieces, where the per-call cost of
 * cudaMemcpyAsync (CPU time and DMA set-up, microseconds each) is as large
 * as the copy. cudaMemcpyBatchAsync (CUDA 12.8+) hands a layer's pieces to
 * the driver in one call; kvbm's own kernel (copy_kernels.cu) moves them in
 * one launch with SM loads and stores over the link. Which is faster
 * depends on the machine, so every method stays selectable and
 * bench/bench_gpu_copy measures each. On an H100 the kernel is best for
 * 16 KiB pieces and the batched copy for 64 KiB and up, while one
 * cudaMemcpyAsync per 64 KiB piece reaches a third of the link: AUTO sends
 * pieces below small_bytes to the small method, the rest to the large.
 *
 * Trade-offs: the planner stores every piece (40 bytes each) rather than
 * streaming them, which costs memory proportional to blocks x layers but
 * lets each method group and split them freely. Events are pooled (created
 * once, reused) because cudaEventCreate costs as much as a small copy.
 * A job's release waits for its copies, so that freeing a storage after
 * releasing its jobs is always safe. Every call that touches the device
 * makes the copier's device current and restores the caller's.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "cuda/internal.h"
#include "cuda/plan.h"
#include "kvbm/cuda.h"

kvbm_cuda_copier_config kvbm_cuda_copier_config_default(void) {
  kvbm_cuda_copier_config c;
  memset(&c, 0, sizeof c);
  c.method = KVBM_CUDA_COPY_AUTO;
  c.small_method = KVBM_CUDA_COPY_AUTO;
  c.large_method = KVBM_CUDA_COPY_AUTO;
  c.small_bytes = 64u << 10;
  c.kernel_threads = 512;
  return c;
}

const char *kvbm_cuda_copy_method_name(int m) {
  switch (m) {
    case KVBM_CUDA_COPY_AUTO: return "auto";
    case KVBM_CUDA_COPY_MEMCPY: return "memcpy";
    case KVBM_CUDA_COPY_BATCH: return "batch";
    case KVBM_CUDA_COPY_KERNEL: return "kernel";
    default: return "?";
  }
}

static const char *dir_name(int d) {
  switch (d) {
    case KVBM_CUDA_OFFLOAD: return "offload";
    case KVBM_CUDA_ONBOARD: return "onboard";
    case KVBM_CUDA_D2D: return "device-to-device";
    default: return "?";
  }
}

int kvbm_cuda_transfer_check(const kvbm_cuda_transfer *t, int32_t device, kvbm_error *err) {
  if (!t) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: transfer is NULL");
  if (!t->src || !t->dst) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: a storage is NULL");
  if (t->flags & ~(uint32_t)KVBM_CUDA_BLOCKWISE)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: unknown flags 0x%x", (unsigned)t->flags);
  kvbm_memory_type want_src, want_dst;
  switch (t->direction) {
    case KVBM_CUDA_OFFLOAD: want_src = KVBM_MEMORY_DEVICE, want_dst = KVBM_MEMORY_PINNED; break;
    case KVBM_CUDA_ONBOARD: want_src = KVBM_MEMORY_PINNED, want_dst = KVBM_MEMORY_DEVICE; break;
    case KVBM_CUDA_D2D: want_src = KVBM_MEMORY_DEVICE, want_dst = KVBM_MEMORY_DEVICE; break;
    default:
      return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: unknown direction %d", (int)t->direction);
  }
  const kvbm_storage *s[2] = {t->src, t->dst};
  kvbm_memory_type want[2] = {want_src, want_dst};
  const char *side[2] = {"src", "dst"};
  for (int i = 0; i < 2; i++) {
    kvbm_memory_type m = kvbm_storage_memory_type(s[i]);
    if (m != want[i])
      return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: %s %s memory, but an %s needs %s%s",
                            side[i], kvbm_memory_type_name(m), dir_name(t->direction),
                            kvbm_memory_type_name(want[i]),
                            m == KVBM_MEMORY_SYSTEM ? " (pin host memory: KVBM_MEMORY_PINNED)"
                                                    : "");
    if (m == KVBM_MEMORY_DEVICE && kvbm_storage_device_id(s[i]) != device)
      return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: %s is on device %d, the copier on %d",
                            side[i], (int)kvbm_storage_device_id(s[i]), (int)device);
  }
  int rc = kvbm__plan_check_layouts(t->src_layout, t->dst_layout, err);
  if (rc) return rc;
  int same = t->src == t->dst;
  if (same && memcmp(t->src_layout, t->dst_layout, sizeof *t->src_layout) != 0)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "cuda copy: one storage seen through two different layouts");
  kvbm_error e2 = {0};
  if (kvbm_storage_check_layout(t->src, t->src_layout, &e2))
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: src layout does not fit its storage (%s)",
                          e2.msg);
  if (kvbm_storage_check_layout(t->dst, t->dst_layout, &e2))
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: dst layout does not fit its storage (%s)",
                          e2.msg);
  for (int i = 0; i < 2; i++) {
    const kvbm_layout *l = i ? t->dst_layout : t->src_layout;
    for (uint64_t r = 0; r < l->num_regions; r++)
      if (!kvbm_storage_region_base(s[i], r))
        return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: %s region %llu has no address",
                              side[i], (unsigned long long)r);
  }
  return kvbm__plan_check_ids(t->src_layout, t->dst_layout, t->src_blocks, t->dst_blocks,
                              t->num_blocks, same, err);
}

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>

#define NSTREAMS 2

struct kvbm_cuda_copier {
  int32_t device;
  kvbm_cuda_copier_config cfg;
  kvbm_cuda_copy_method small, large; /* AUTO's methods, resolved */
  cudaStream_t stream[NSTREAMS]; /* 0: offload, 1: onboard and D2D */
  pthread_mutex_t mu;            /* guards the pool, the live count, queueing */
  cudaEvent_t *pool;
  size_t pool_len, pool_cap;
  size_t live_jobs;
};

struct kvbm_cuda_job {
  kvbm_cuda_copier *c;
  uint64_t num_layers, num_steps;
  uint64_t calls, pieces;
  cudaEvent_t *ev; /* num_steps */
};

/* Makes the copier's device current; *prev receives the caller's. */
static int enter(int32_t device, int *prev, kvbm_error *err) {
  if (cudaGetDevice(prev) != cudaSuccess) *prev = -1;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return kvbm_error_set(err, KVBM_EDEVICE, "cuda copy: cudaSetDevice(%d): %s", (int)device,
                          cudaGetErrorString(e));
  }
  return KVBM_OK;
}

static void leave(int prev) {
  if (prev >= 0) (void)cudaSetDevice(prev);
}

static int cuda_fail(kvbm_error *err, const char *call, cudaError_t e) {
  (void)cudaGetLastError();
  return kvbm_error_set(err, KVBM_EDEVICE, "cuda copy: %s: %s", call, cudaGetErrorString(e));
}

static int have_batch(void) {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
  int rt = 0, drv = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess || cudaDriverGetVersion(&drv) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return rt >= 12080 && drv >= 12080;
#else
  return 0;
#endif
}

static int have_kernels(void) {
#ifdef KVBM_HAVE_CUDA_KERNELS
  return 1;
#else
  return 0;
#endif
}

static int method_ok(kvbm_cuda_copy_method m, const char *what, kvbm_error *err) {
  if (m == KVBM_CUDA_COPY_KERNEL && !have_kernels())
    return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                          "cuda copy: %s kernel: this build has no CUDA kernels (no nvcc)", what);
  if (m == KVBM_CUDA_COPY_BATCH && !have_batch())
    return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                          "cuda copy: %s batch: cudaMemcpyBatchAsync needs CUDA 12.8+ "
                          "(runtime and driver)", what);
  return KVBM_OK;
}

static int check_config(const kvbm_cuda_copier_config *cfg, kvbm_error *err) {
  if ((unsigned)cfg->method > KVBM_CUDA_COPY_KERNEL)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: unknown method %d", (int)cfg->method);
  if ((unsigned)cfg->small_method > KVBM_CUDA_COPY_KERNEL)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: unknown small_method %d",
                          (int)cfg->small_method);
  if ((unsigned)cfg->large_method > KVBM_CUDA_COPY_KERNEL)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: unknown large_method %d",
                          (int)cfg->large_method);
  if (cfg->kernel_threads < 64 || cfg->kernel_threads > 1024 || cfg->kernel_threads % 32)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "cuda copy: kernel_threads %u (a multiple of 32 in 64..1024)",
                          (unsigned)cfg->kernel_threads);
  return KVBM_OK;
}

int kvbm_cuda_copier_create(int32_t device, const kvbm_cuda_copier_config *cfg,
                            kvbm_cuda_copier **out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: out is NULL");
  *out = NULL;
  kvbm_cuda_copier_config c = cfg ? *cfg : kvbm_cuda_copier_config_default();
  int rc = check_config(&c, err);
  if (rc) return rc;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return kvbm_error_set(err, KVBM_EDEVICE, "cuda copy: no CUDA device (%s)",
                          cudaGetErrorString(e));
  }
  if (device < 0 || device >= n)
    return kvbm_error_set(err, KVBM_EDEVICE, "cuda copy: no CUDA device %d (%d present)",
                          (int)device, n);
  if ((rc = method_ok(c.method, "method", err))) return rc;
  kvbm_cuda_copy_method small = c.small_method;
  if (small == KVBM_CUDA_COPY_AUTO)
    small = have_kernels() ? KVBM_CUDA_COPY_KERNEL
            : have_batch() ? KVBM_CUDA_COPY_BATCH
                           : KVBM_CUDA_COPY_MEMCPY;
  kvbm_cuda_copy_method large = c.large_method;
  if (large == KVBM_CUDA_COPY_AUTO) large = have_batch() ? KVBM_CUDA_COPY_BATCH : KVBM_CUDA_COPY_MEMCPY;
  if (c.method == KVBM_CUDA_COPY_AUTO && (rc = method_ok(small, "small_method", err))) return rc;
  if (c.method == KVBM_CUDA_COPY_AUTO && (rc = method_ok(large, "large_method", err))) return rc;
  kvbm_cuda_copier *cp = calloc(1, sizeof *cp);
  if (!cp) return kvbm_error_set(err, KVBM_ENOMEM, "cuda copy: no memory for a copier");
  cp->device = device;
  cp->cfg = c;
  cp->small = small;
  cp->large = large;
  if (pthread_mutex_init(&cp->mu, NULL)) {
    free(cp);
    return kvbm_error_set(err, KVBM_ENOMEM, "cuda copy: pthread_mutex_init failed");
  }
  int prev;
  if ((rc = enter(device, &prev, err))) {
    pthread_mutex_destroy(&cp->mu);
    free(cp);
    return rc;
  }
  for (int i = 0; i < NSTREAMS && !rc; i++) {
    e = cudaStreamCreateWithFlags(&cp->stream[i], cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      cp->stream[i] = NULL;
      rc = cuda_fail(err, "cudaStreamCreateWithFlags", e);
    }
  }
  leave(prev);
  if (rc) {
    for (int i = 0; i < NSTREAMS; i++)
      if (cp->stream[i]) (void)cudaStreamDestroy(cp->stream[i]);
    pthread_mutex_destroy(&cp->mu);
    free(cp);
    return rc;
  }
  *out = cp;
  return KVBM_OK;
}

int kvbm_cuda_copier_destroy(kvbm_cuda_copier *c, kvbm_error *err) {
  if (!c) return KVBM_OK;
  pthread_mutex_lock(&c->mu);
  size_t live = c->live_jobs;
  pthread_mutex_unlock(&c->mu);
  if (live)
    return kvbm_error_set(err, KVBM_ESTATE, "cuda copy: %zu jobs not released", live);
  int prev, rc = enter(c->device, &prev, err);
  int first = KVBM_OK;
  for (int i = 0; i < NSTREAMS; i++) {
    cudaError_t e = cudaStreamSynchronize(c->stream[i]);
    if (e != cudaSuccess && !first) first = cuda_fail(err, "cudaStreamSynchronize", e);
    (void)cudaStreamDestroy(c->stream[i]);
  }
  for (size_t i = 0; i < c->pool_len; i++) (void)cudaEventDestroy(c->pool[i]);
  if (!rc) leave(prev);
  free(c->pool);
  pthread_mutex_destroy(&c->mu);
  free(c);
  return rc ? rc : first;
}

/* Takes an event from the pool or creates one (device current, mu held). */
static int event_get(kvbm_cuda_copier *c, cudaEvent_t *ev, kvbm_error *err) {
  if (c->pool_len) {
    *ev = c->pool[--c->pool_len];
    return KVBM_OK;
  }
  cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return cuda_fail(err, "cudaEventCreateWithFlags", e);
  return KVBM_OK;
}

/* Gives events back (mu held); one that cannot be kept is destroyed. */
static void event_put(kvbm_cuda_copier *c, cudaEvent_t *ev, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!ev[i]) continue;
    if (kvbm__vec_reserve_of(&c->pool, &c->pool_cap, c->pool_len + 1, 64, KVBM__VEC_NO_LIMIT)) {
      (void)cudaEventDestroy(ev[i]);
      continue;
    }
    c->pool[c->pool_len++] = ev[i];
  }
}

/* Device-visible addresses of every region of a storage: the region
 * bases themselves for device memory and for cudaMemcpy*, the mapped
 * address (cudaHostGetDevicePointer) of pinned memory for the kernel. */
static int region_ptrs(const kvbm_storage *s, uint64_t nreg, int mapped, uint8_t **out,
                       kvbm_error *err) {
  for (uint64_t r = 0; r < nreg; r++) {
    void *p = kvbm_storage_region_base(s, r);
    if (mapped && kvbm_storage_memory_type(s) == KVBM_MEMORY_PINNED) {
      void *d = NULL;
      cudaError_t e = cudaHostGetDevicePointer(&d, p, 0);
      if (e != cudaSuccess) return cuda_fail(err, "cudaHostGetDevicePointer (pinned region)", e);
      p = d;
    }
    out[r] = p;
  }
  return KVBM_OK;
}

/* What one step's pieces need on the way to the stream. */
typedef struct queue {
  kvbm_cuda_copier *c;
  cudaStream_t st;
  uint8_t **src, **dst;   /* region bases for cudaMemcpy* */
  uint8_t **ksrc, **kdst; /* region bases for the kernel */
  kvbm__kbatch kb;
  void **bd, **bs; /* batch arrays */
  size_t *bz;
  size_t bn, bcap;
  uint64_t calls;
} queue;

static int kernel_flush(queue *q, kvbm_error *err) {
  if (!q->kb.n) return KVBM_OK;
#ifdef KVBM_HAVE_CUDA_KERNELS
  int e = kvbm__copy_kernel_launch(&q->kb, q->c->cfg.kernel_threads, q->st);
  q->kb.n = 0;
  q->calls++;
  if (e != 0) return cuda_fail(err, "launch of the gather kernel", (cudaError_t)e);
  return KVBM_OK;
#else
  q->kb.n = 0;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "cuda copy: this build has no CUDA kernels");
#endif
}

static int kernel_add(queue *q, const kvbm__piece *p, kvbm_error *err) {
  uint64_t s = (uint64_t)(uintptr_t)(q->ksrc[p->src_region] + p->src_off);
  uint64_t d = (uint64_t)(uintptr_t)(q->kdst[p->dst_region] + p->dst_off);
  for (uint64_t o = 0; o < p->size; o += KVBM__KCHUNK) {
    if (q->kb.n == KVBM__KMAX) {
      int rc = kernel_flush(q, err);
      if (rc) return rc;
    }
    uint64_t len = p->size - o < KVBM__KCHUNK ? p->size - o : KVBM__KCHUNK;
    q->kb.d[q->kb.n++] = (kvbm__kdesc){s + o, d + o, len};
  }
  return KVBM_OK;
}

#define BATCH_MAX 4096 /* pieces per cudaMemcpyBatchAsync call */

static int batch_flush(queue *q, kvbm_error *err) {
  if (!q->bn) return KVBM_OK;
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
  struct cudaMemcpyAttributes attr;
  memset(&attr, 0, sizeof attr);
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t idx = 0;
#if CUDART_VERSION >= 13000
  cudaError_t e = cudaMemcpyBatchAsync((void *const *)q->bd, (const void *const *)q->bs, q->bz,
                                       q->bn, &attr, &idx, 1, q->st);
#else
  size_t fail = 0;
  cudaError_t e = cudaMemcpyBatchAsync((void **)q->bd, (void **)q->bs, q->bz, q->bn, &attr, &idx,
                                       1, &fail, q->st);
#endif
  size_t n = q->bn;
  q->bn = 0;
  q->calls++;
  if (e != cudaSuccess) {
    kvbm_error e2 = {0};
    cuda_fail(&e2, "cudaMemcpyBatchAsync", e);
    return kvbm_error_set(err, KVBM_EDEVICE, "%s (batch of %zu copies)", e2.msg, n);
  }
  return KVBM_OK;
#else
  q->bn = 0;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "cuda copy: cudaMemcpyBatchAsync needs CUDA 12.8+");
#endif
}

static int batch_add(queue *q, const kvbm__piece *p, kvbm_error *err) {
  if (q->bn == BATCH_MAX) {
    int rc = batch_flush(q, err);
    if (rc) return rc;
  }
  q->bd[q->bn] = q->dst[p->dst_region] + p->dst_off;
  q->bs[q->bn] = q->src[p->src_region] + p->src_off;
  q->bz[q->bn] = (size_t)p->size;
  q->bn++;
  return KVBM_OK;
}

static int memcpy_one(queue *q, const kvbm__piece *p, kvbm_error *err) {
  cudaError_t e = cudaMemcpyAsync(q->dst[p->dst_region] + p->dst_off,
                                  q->src[p->src_region] + p->src_off, (size_t)p->size,
                                  cudaMemcpyDefault, q->st);
  q->calls++;
  if (e != cudaSuccess) return cuda_fail(err, "cudaMemcpyAsync", e);
  return KVBM_OK;
}

/* Queues pieces [a, b) of one step by the copier's method. */
static int queue_step(queue *q, const kvbm__piece *pc, size_t a, size_t b, kvbm_error *err) {
  kvbm_cuda_copier *c = q->c;
  int rc = KVBM_OK;
  for (size_t i = a; i < b && !rc; i++) {
    kvbm_cuda_copy_method m = c->cfg.method;
    if (m == KVBM_CUDA_COPY_AUTO)
      m = pc[i].size >= c->cfg.small_bytes ? c->large : c->small;
    if (m == KVBM_CUDA_COPY_MEMCPY) rc = memcpy_one(q, &pc[i], err);
    else if (m == KVBM_CUDA_COPY_BATCH) rc = batch_add(q, &pc[i], err);
    else rc = kernel_add(q, &pc[i], err);
  }
  if (!rc) rc = batch_flush(q, err);
  if (!rc) rc = kernel_flush(q, err);
  return rc;
}

static void job_free(kvbm_cuda_job *j) {
  kvbm_cuda_copier *c = j->c;
  pthread_mutex_lock(&c->mu);
  event_put(c, j->ev, j->num_steps);
  c->live_jobs--;
  pthread_mutex_unlock(&c->mu);
  free(j->ev);
  free(j);
}

int kvbm_cuda_copy_start(kvbm_cuda_copier *c, const kvbm_cuda_transfer *t, void *after_stream,
                         kvbm_cuda_job **out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: out is NULL");
  *out = NULL;
  if (!c) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: copier is NULL");
  int rc = kvbm_cuda_transfer_check(t, c->device, err);
  if (rc) return rc;
  kvbm__plan plan;
  rc = kvbm__plan_build(t->src_layout, t->dst_layout, t->src_blocks, t->dst_blocks, t->num_blocks,
                        (t->flags & KVBM_CUDA_BLOCKWISE) != 0, &plan, err);
  if (rc) return rc;
  uint64_t sreg = t->src_layout->num_regions, dreg = t->dst_layout->num_regions;
  int is_auto = c->cfg.method == KVBM_CUDA_COPY_AUTO;
  int uses_kernel = c->cfg.method == KVBM_CUDA_COPY_KERNEL ||
                    (is_auto && (c->small == KVBM_CUDA_COPY_KERNEL || c->large == KVBM_CUDA_COPY_KERNEL));
  int uses_batch = c->cfg.method == KVBM_CUDA_COPY_BATCH ||
                   (is_auto && (c->small == KVBM_CUDA_COPY_BATCH || c->large == KVBM_CUDA_COPY_BATCH));
  queue q;
  memset(&q, 0, sizeof q);
  q.c = c;
  q.st = c->stream[t->direction == KVBM_CUDA_OFFLOAD ? 0 : 1];
  q.src = malloc((sreg + dreg) * 2 * sizeof(uint8_t *));
  if (uses_batch) {
    q.bd = malloc(BATCH_MAX * sizeof *q.bd);
    q.bs = malloc(BATCH_MAX * sizeof *q.bs);
    q.bz = malloc(BATCH_MAX * sizeof *q.bz);
  }
  kvbm_cuda_job *j = calloc(1, sizeof *j);
  if (j) j->ev = calloc(plan.num_steps, sizeof *j->ev);
  if (!q.src || !j || !j->ev || (uses_batch && (!q.bd || !q.bs || !q.bz))) {
    rc = kvbm_error_set(err, KVBM_ENOMEM, "cuda copy: no memory to queue a job");
    goto out_free;
  }
  q.dst = q.src + sreg;
  q.ksrc = q.dst + dreg;
  q.kdst = q.ksrc + sreg;
  j->c = c;
  j->num_layers = plan.num_layers;
  j->num_steps = plan.num_steps;
  j->pieces = plan.num_pieces;

  int prev;
  if ((rc = enter(c->device, &prev, err))) goto out_free;
  rc = region_ptrs(t->src, sreg, 0, q.src, err);
  if (!rc) rc = region_ptrs(t->dst, dreg, 0, q.dst, err);
  if (!rc && uses_kernel) rc = region_ptrs(t->src, sreg, 1, q.ksrc, err);
  if (!rc && uses_kernel) rc = region_ptrs(t->dst, dreg, 1, q.kdst, err);
  pthread_mutex_lock(&c->mu);
  for (uint64_t s = 0; s < plan.num_steps && !rc; s++) rc = event_get(c, &j->ev[s], err);
  c->live_jobs++;
  if (!rc && after_stream) {
    cudaEvent_t dep = NULL;
    rc = event_get(c, &dep, err);
    cudaError_t e = cudaSuccess;
    if (!rc) e = cudaEventRecord(dep, (cudaStream_t)after_stream);
    if (!rc && e != cudaSuccess) rc = cuda_fail(err, "cudaEventRecord on after_stream", e);
    if (!rc && (e = cudaStreamWaitEvent(q.st, dep, 0)) != cudaSuccess)
      rc = cuda_fail(err, "cudaStreamWaitEvent (after_stream)", e);
    if (dep) event_put(c, &dep, 1);
  }
  /* Queued under the mutex: two threads' jobs on one stream do not
   * interleave their layers. */
  for (uint64_t s = 0; s < plan.num_steps && !rc; s++) {
    size_t a = s ? plan.step_end[s - 1] : 0;
    rc = queue_step(&q, plan.pieces, a, plan.step_end[s], err);
    if (!rc) {
      cudaError_t e = cudaEventRecord(j->ev[s], q.st);
      if (e != cudaSuccess) rc = cuda_fail(err, "cudaEventRecord (layer done)", e);
    }
  }
  pthread_mutex_unlock(&c->mu);
  j->calls = q.calls;
  if (rc) (void)cudaStreamSynchronize(q.st); /* what was queued finishes first */
  leave(prev);
  if (rc) {
    (void)cudaGetLastError();
    job_free(j);
    j = NULL;
  }
out_free:
  if (rc && j) {
    free(j->ev);
    free(j);
  }
  free(q.src);
  free(q.bd);
  free(q.bs);
  free(q.bz);
  kvbm__plan_free(&plan);
  if (!rc) *out = j;
  return rc;
}

int kvbm_cuda_job_info(const kvbm_cuda_job *j, uint64_t *num_layers, uint64_t *num_calls,
                       uint64_t *num_pieces) {
  if (!j) return KVBM_EINVAL;
  if (num_layers) *num_layers = j->num_layers;
  if (num_calls) *num_calls = j->calls;
  if (num_pieces) *num_pieces = j->pieces;
  return KVBM_OK;
}

static int layer_event(kvbm_cuda_job *j, uint64_t layer, cudaEvent_t *ev, kvbm_error *err) {
  if (!j) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: job is NULL");
  if (layer >= j->num_layers)
    return kvbm_error_set(err, KVBM_ERANGE, "cuda copy: layer %llu out of range (%llu layers)",
                          (unsigned long long)layer, (unsigned long long)j->num_layers);
  *ev = j->ev[j->num_steps == 1 ? 0 : layer];
  return KVBM_OK;
}

int kvbm_cuda_job_wait_layer(kvbm_cuda_job *j, uint64_t layer, void *engine_stream,
                             kvbm_error *err) {
  cudaEvent_t ev = NULL;
  int rc = layer_event(j, layer, &ev, err);
  if (rc) return rc;
  cudaError_t e = cudaStreamWaitEvent((cudaStream_t)engine_stream, ev, 0);
  if (e != cudaSuccess) return cuda_fail(err, "cudaStreamWaitEvent (engine stream)", e);
  return KVBM_OK;
}

int kvbm_cuda_job_sync_layer(kvbm_cuda_job *j, uint64_t layer, kvbm_error *err) {
  cudaEvent_t ev = NULL;
  int rc = layer_event(j, layer, &ev, err);
  if (rc) return rc;
  cudaError_t e = cudaEventSynchronize(ev);
  if (e != cudaSuccess) return cuda_fail(err, "cudaEventSynchronize (a copy failed)", e);
  return KVBM_OK;
}

int kvbm_cuda_job_sync(kvbm_cuda_job *j, kvbm_error *err) {
  if (!j) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: job is NULL");
  return kvbm_cuda_job_sync_layer(j, j->num_layers - 1, err);
}

int kvbm_cuda_job_query(kvbm_cuda_job *j, kvbm_error *err) {
  if (!j) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: job is NULL");
  cudaError_t e = cudaEventQuery(j->ev[j->num_steps - 1]);
  if (e == cudaSuccess) return KVBM_OK;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return KVBM_EAGAIN;
  }
  return cuda_fail(err, "cudaEventQuery (a copy failed)", e);
}

int kvbm_cuda_job_release(kvbm_cuda_job *j, kvbm_error *err) {
  if (!j) return KVBM_OK;
  int rc = kvbm_cuda_job_sync(j, err);
  job_free(j);
  return rc;
}

#else /* !KVBM_HAVE_CUDA */

#define NO_CUDA(err) kvbm_error_set(err, KVBM_EUNSUPPORTED, "cuda copy: this build has no CUDA runtime")

int kvbm_cuda_copier_create(int32_t device, const kvbm_cuda_copier_config *cfg,
                            kvbm_cuda_copier **out, kvbm_error *err) {
  (void)device, (void)cfg;
  if (out) *out = NULL;
  return NO_CUDA(err);
}
int kvbm_cuda_copier_destroy(kvbm_cuda_copier *c, kvbm_error *err) {
  return c ? NO_CUDA(err) : KVBM_OK;
}
int kvbm_cuda_copy_start(kvbm_cuda_copier *c, const kvbm_cuda_transfer *t, void *after_stream,
                         kvbm_cuda_job **out, kvbm_error *err) {
  (void)c, (void)t, (void)after_stream;
  if (out) *out = NULL;
  return NO_CUDA(err);
}
int kvbm_cuda_job_info(const kvbm_cuda_job *j, uint64_t *num_layers, uint64_t *num_calls,
                       uint64_t *num_pieces) {
  (void)j, (void)num_layers, (void)num_calls, (void)num_pieces;
  return KVBM_EUNSUPPORTED;
}
int kvbm_cuda_job_wait_layer(kvbm_cuda_job *j, uint64_t layer, void *engine_stream,
                             kvbm_error *err) {
  (void)j, (void)layer, (void)engine_stream;
  return NO_CUDA(err);
}
int kvbm_cuda_job_sync_layer(kvbm_cuda_job *j, uint64_t layer, kvbm_error *err) {
  (void)j, (void)layer;
  return NO_CUDA(err);
}
int kvbm_cuda_job_sync(kvbm_cuda_job *j, kvbm_error *err) {
  (void)j;
  return NO_CUDA(err);
}
int kvbm_cuda_job_query(kvbm_cuda_job *j, kvbm_error *err) {
  (void)j;
  return NO_CUDA(err);
}
int kvbm_cuda_job_release(kvbm_cuda_job *j, kvbm_error *err) {
  return j ? NO_CUDA(err) : KVBM_OK;
}
#endif
