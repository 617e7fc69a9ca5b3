/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu.c: CUDA copies for the tier manager when G1 is device memory.
 *
 * Design. Each worker (host copies G1<->G2, volume puts and gets
 * G1<->G3/G4) owns one non-blocking stream, so its copies never serialise
 * behind the engine's work on the legacy default stream, plus one event per
 * job slot. A batch
 * of jobs is queued as cudaMemcpyAsync calls with an event recorded after
 * each job; the worker then waits for the events in order
 * (cudaEventSynchronize), so a failure is charged to the job whose copies
 * ran before its event, not to the whole batch. CUDA errors never escape:
 * they become KVBM_EDEVICE on the job, which the manager turns into a
 * failed copy (a FAILED target, counted; a failed onboard shortens the
 * request's match). The sticky per-thread error is cleared after each
 * failure so that the next job is judged on its own.
 *
 * Only the C runtime API is used (no kernels), so no nvcc step: the file is
 * compiled with the toolkit's headers and linked to libcudart when
 * cmake/tier.cmake finds them (KVBM_HAVE_CUDA); otherwise every call says
 * KVBM_EUNSUPPORTED.
 *
 * Emulation (tests only, both builds): a stream made by
 * kvbm__gpu_stream_emulated() runs the same calls on host memory, and
 * defers every copy to the wait (or sync) that covers it, as a GPU would,
 * so a caller that reads a destination before waiting gets stale bytes;
 * it can fail the n-th copy of a manager (counted across its streams): the
 * copy is not done and the covering wait reports KVBM_EDEVICE. That lets
 * the manager's device path (batches, events, staging, failure handling)
 * run on machines without a GPU, CI included.
 *
 * Batching (issue 21): a LayerSeparate block is num_layers copies of one
 * layer each (32 of 64 KiB for W4), and one cudaMemcpyAsync per 64 KiB
 * piece reaches a third of the PCIe link (docs/areas/gpu.md). So where the
 * runtime and driver have cudaMemcpyBatchAsync (12.8+), kvbm__gpu_copy()
 * only collects a job's copies, and the mark (or wait, or sync) that
 * closes the job hands them to the driver in one batched call, before the
 * job's event. Pageable host memory (a system G2, staging buffers) keeps
 * one cudaMemcpyAsync per piece (the batch's pageable semantics are not
 * the ones this file relies on); a failed batch fails only its job, as a
 * failed copy did. After any error the collected copies are dropped, so a
 * failed job's copies never run with the next job's.
 *
 * Trade-off: pageable host memory (system G2, the volume workers' staging
 * buffers) is accepted: CUDA stages it and the copy is then synchronous to the host;
 * pinned G2 (g2_memory PINNED) is what makes G1<->G2 truly asynchronous.
 */
#include "gpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct emu_copy {
  void *dst;
  const void *src;
  size_t n;
  bool fail;
} emu_copy;

struct kvbm_gpu_stream {
  int device;
  bool emu;
  /* emulation: copies queued and not yet run; event i covers q[0..pos[i]) */
  emu_copy *q;
  size_t nq, cap, done;
  bool err;                  /* a failed copy not yet reported */
  _Atomic uint64_t *counter; /* copies of the manager, for fail_at */
  uint64_t fail_at;
  size_t *pos;
  uint32_t nevents;
#ifdef KVBM_HAVE_CUDA
  cudaStream_t stream;
  cudaEvent_t *ev;
  bool batch; /* cudaMemcpyBatchAsync available: copies are collected */
  void **bd;  /* the collected copies of the open job */
  const void **bs;
  size_t *bz;
  size_t bn, bcap;
#endif
};

int kvbm__gpu_stream_emulated(uint32_t nevents, _Atomic uint64_t *counter, uint64_t fail_at,
                             kvbm_gpu_stream **out, kvbm_error *err) {
  kvbm_gpu_stream *s = calloc(1, sizeof *s);
  if (s) s->pos = calloc(nevents ? nevents : 1, sizeof *s->pos);
  if (!s || !s->pos) {
    free(s);
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  }
  s->emu = true;
  s->nevents = nevents;
  s->counter = counter;
  s->fail_at = fail_at;
  *out = s;
  return KVBM_OK;
}

static int emu_copy_push(kvbm_gpu_stream *s, void *dst, const void *src, size_t n) {
  if (kvbm__vec_reserve_of(&s->q, &s->cap, s->nq + 1, 64, KVBM__VEC_NO_LIMIT))
    return KVBM_EDEVICE; /* as CUDA refusing the copy */
  uint64_t k = atomic_fetch_add(s->counter, 1) + 1;
  s->q[s->nq++] = (emu_copy){dst, src, n, k == s->fail_at};
  return KVBM_OK;
}

/* Runs the queued copies up to `upto`; KVBM_EDEVICE if one of them (or an
 * earlier unreported one) failed. The queue empties once all ran. */
static int emu_run(kvbm_gpu_stream *s, size_t upto) {
  for (; s->done < upto; s->done++) {
    emu_copy *c = &s->q[s->done];
    if (c->fail) s->err = true;
    else memcpy(c->dst, c->src, c->n);
  }
  if (s->done == s->nq) s->done = s->nq = 0;
  bool e = s->err;
  s->err = false;
  return e ? KVBM_EDEVICE : KVBM_OK;
}

static void emu_free(kvbm_gpu_stream *s) {
  free(s->q);
  free(s->pos);
  free(s);
}

#ifdef KVBM_HAVE_CUDA

int kvbm__gpu_compiled(void) { return 1; }

static int fail(kvbm_error *err, const char *what, cudaError_t e) {
  (void)cudaGetLastError(); /* clear it: the next call is judged alone */
  return kvbm_error_set(err, KVBM_EDEVICE, "manager: %s: %s", what, cudaGetErrorString(e));
}

void kvbm__gpu_stream_destroy(kvbm_gpu_stream *s) {
  if (!s) return;
  if (s->emu) {
    emu_free(s);
    return;
  }
  for (uint32_t i = 0; s->ev && i < s->nevents; i++)
    if (s->ev[i]) cudaEventDestroy(s->ev[i]);
  if (s->stream) cudaStreamDestroy(s->stream);
  free(s->ev);
  free(s->bd);
  free(s->bs);
  free(s->bz);
  free(s);
}

static bool have_batch(void) {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
  int rt = 0, drv = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess || cudaDriverGetVersion(&drv) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return rt >= 12080 && drv >= 12080;
#else
  return false;
#endif
}

static bool pageable(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true; /* unknown: the safe path */
  }
  return a.type == cudaMemoryTypeUnregistered;
}

/* Queues the collected copies: one batched call (at most 4096 a call), or
 * one cudaMemcpyAsync each where a side is pageable host memory or there
 * is only one. The list is empty afterwards, whatever the result. */
static int flush(kvbm_gpu_stream *s) {
  size_t n = s->bn;
  s->bn = 0;
  if (!n) return KVBM_OK;
  cudaError_t e = cudaSuccess;
  if (n == 1 || pageable(s->bd[0]) || pageable(s->bs[0])) {
    for (size_t i = 0; e == cudaSuccess && i < n; i++)
      e = cudaMemcpyAsync(s->bd[i], s->bs[i], s->bz[i], cudaMemcpyDefault, s->stream);
    return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaMemcpyAsync", e);
  }
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
  struct cudaMemcpyAttributes attr;
  memset(&attr, 0, sizeof attr);
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  for (size_t i = 0; e == cudaSuccess && i < n; i += 4096) {
    size_t k = n - i < 4096 ? n - i : 4096, idx = 0;
#if CUDART_VERSION >= 13000
    e = cudaMemcpyBatchAsync(s->bd + i, (const void *const *)(s->bs + i), s->bz + i, k, &attr,
                             &idx, 1, s->stream);
#else
    size_t failed = 0;
    e = cudaMemcpyBatchAsync(s->bd + i, (void **)(s->bs + i), s->bz + i, k, &attr, &idx, 1,
                             &failed, s->stream);
#endif
  }
#endif
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaMemcpyBatchAsync", e);
}

int kvbm__gpu_stream_create(int32_t device, uint32_t nevents, kvbm_gpu_stream **out,
                           kvbm_error *err) {
  int n = 0, prev = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return fail(err, "no CUDA device", e);
  if (device < 0 || device >= n)
    return kvbm_error_set(err, KVBM_EDEVICE, "manager: no CUDA device %d (%d present)",
                          (int)device, n);
  kvbm_gpu_stream *s = calloc(1, sizeof *s);
  if (s) s->ev = calloc(nevents ? nevents : 1, sizeof *s->ev);
  if (!s || !s->ev) {
    free(s);
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  }
  s->device = device;
  (void)cudaGetDevice(&prev);
  e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
  /* Events only order and report: no timing, so no timer overhead. */
  for (uint32_t i = 0; e == cudaSuccess && i < nevents; i++, s->nevents++)
    e = cudaEventCreateWithFlags(&s->ev[i], cudaEventDisableTiming);
  (void)cudaSetDevice(prev);
  if (e != cudaSuccess) {
    kvbm__gpu_stream_destroy(s);
    return fail(err, "cannot create a CUDA stream", e);
  }
  s->batch = have_batch();
  *out = s;
  return KVBM_OK;
}

int kvbm__gpu_bind(kvbm_gpu_stream *s) {
  if (s->emu) return KVBM_OK;
  cudaError_t e = cudaSetDevice(s->device);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaSetDevice", e);
}

int kvbm__gpu_copy(kvbm_gpu_stream *s, void *dst, const void *src, size_t n) {
  if (s->emu) return emu_copy_push(s, dst, src, n);
  if (s->batch) {
    if (s->bn == s->bcap) {
      /* Three arrays in step: each grows from a copy of the one capacity
       * (vec.h's rule gives all three the same); bcap moves only when all
       * three grew, and one that grew alone is merely larger. */
      size_t need = s->bn + 1, cd = s->bcap, cs = s->bcap, cz = s->bcap;
      if (!kvbm__vec_reserve_of(&s->bd, &cd, need, 64, KVBM__VEC_NO_LIMIT) &&
          !kvbm__vec_reserve_of(&s->bs, &cs, need, 64, KVBM__VEC_NO_LIMIT) &&
          !kvbm__vec_reserve_of(&s->bz, &cz, need, 64, KVBM__VEC_NO_LIMIT))
        s->bcap = cz;
    }
    if (s->bn < s->bcap) {
      s->bd[s->bn] = dst, s->bs[s->bn] = src, s->bz[s->bn] = n;
      s->bn++;
      return KVBM_OK;
    }
    int rc = flush(s); /* no memory to collect: queue what we have */
    if (rc) return rc;
  }
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s->stream);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaMemcpyAsync", e);
}

int kvbm__gpu_mark(kvbm_gpu_stream *s, uint32_t i) {
  if (i >= s->nevents) return KVBM_EINVAL;
  if (s->emu) {
    s->pos[i] = s->nq;
    return KVBM_OK;
  }
  int rc = flush(s);
  if (rc) return rc;
  cudaError_t e = cudaEventRecord(s->ev[i], s->stream);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaEventRecord", e);
}

int kvbm__gpu_wait(kvbm_gpu_stream *s, uint32_t i) {
  if (i >= s->nevents) return KVBM_EINVAL;
  if (s->emu) return emu_run(s, s->pos[i]);
  s->bn = 0; /* copies after the last mark belong to no job: dropped */
  cudaError_t e = cudaEventSynchronize(s->ev[i]);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaEventSynchronize", e);
}

int kvbm__gpu_sync(kvbm_gpu_stream *s) {
  if (s->emu) return emu_run(s, s->nq);
  int rc = flush(s);
  if (rc) return rc;
  cudaError_t e = cudaStreamSynchronize(s->stream);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaStreamSynchronize", e);
}

int kvbm__gpu_copy_now(int32_t device, void *dst, const void *src, size_t n, kvbm_error *err) {
  int prev = 0;
  (void)cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  (void)cudaSetDevice(prev);
  return e == cudaSuccess ? KVBM_OK : fail(err, "cudaMemcpy", e);
}

#else /* !KVBM_HAVE_CUDA: only emulated streams exist */

int kvbm__gpu_compiled(void) { return 0; }

int kvbm__gpu_stream_create(int32_t device, uint32_t nevents, kvbm_gpu_stream **out,
                           kvbm_error *err) {
  (void)device, (void)nevents, (void)out;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "manager: CUDA copies need a CUDA build");
}

void kvbm__gpu_stream_destroy(kvbm_gpu_stream *s) {
  if (s) emu_free(s);
}

int kvbm__gpu_bind(kvbm_gpu_stream *s) { return s->emu ? KVBM_OK : KVBM_EUNSUPPORTED; }

int kvbm__gpu_copy(kvbm_gpu_stream *s, void *dst, const void *src, size_t n) {
  return s->emu ? emu_copy_push(s, dst, src, n) : KVBM_EUNSUPPORTED;
}

int kvbm__gpu_mark(kvbm_gpu_stream *s, uint32_t i) {
  if (!s->emu) return KVBM_EUNSUPPORTED;
  if (i >= s->nevents) return KVBM_EINVAL;
  s->pos[i] = s->nq;
  return KVBM_OK;
}

int kvbm__gpu_wait(kvbm_gpu_stream *s, uint32_t i) {
  if (!s->emu) return KVBM_EUNSUPPORTED;
  if (i >= s->nevents) return KVBM_EINVAL;
  return emu_run(s, s->pos[i]);
}

int kvbm__gpu_sync(kvbm_gpu_stream *s) { return s->emu ? emu_run(s, s->nq) : KVBM_EUNSUPPORTED; }

int kvbm__gpu_copy_now(int32_t device, void *dst, const void *src, size_t n, kvbm_error *err) {
  (void)device, (void)dst, (void)src, (void)n;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "manager: CUDA copies need a CUDA build");
}

#endif
