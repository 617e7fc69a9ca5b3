/*
 * gpu.c: CUDA copies for the tier manager when G1 is device memory.
 *
 * Design. Each worker (host copies G1<->G2, disk I/O G1<->G3) owns one
 * non-blocking stream, so its copies never serialise behind the engine's
 * work on the legacy default stream, plus one event per job slot. A batch
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
 * Trade-off: pageable host memory (system G2, the disk bounce buffers) is
 * accepted: CUDA stages it and the copy is then synchronous to the host;
 * pinned G2 (g2_memory PINNED) is what makes G1<->G2 truly asynchronous.
 */
#include "gpu.h"

#include <stdlib.h>

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>

struct kvbm_gpu_stream {
  int device;
  cudaStream_t stream;
  uint32_t nevents;
  cudaEvent_t ev[];
};

int kvbm_gpu_compiled(void) { return 1; }

static int fail(kvbm_error *err, const char *what, cudaError_t e) {
  (void)cudaGetLastError(); /* clear it: the next call is judged alone */
  return kvbm_error_set(err, KVBM_EDEVICE, "manager: %s: %s", what, cudaGetErrorString(e));
}

void kvbm_gpu_stream_destroy(kvbm_gpu_stream *s) {
  if (!s) return;
  for (uint32_t i = 0; i < s->nevents; i++)
    if (s->ev[i]) cudaEventDestroy(s->ev[i]);
  if (s->stream) cudaStreamDestroy(s->stream);
  free(s);
}

int kvbm_gpu_stream_create(int32_t device, uint32_t nevents, kvbm_gpu_stream **out,
                           kvbm_error *err) {
  int n = 0, prev = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return fail(err, "no CUDA device", e);
  if (device < 0 || device >= n)
    return kvbm_error_set(err, KVBM_EDEVICE, "manager: no CUDA device %d (%d present)",
                          (int)device, n);
  kvbm_gpu_stream *s = calloc(1, sizeof *s + nevents * sizeof(cudaEvent_t));
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  s->device = device;
  (void)cudaGetDevice(&prev);
  e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
  /* Events only order and report: no timing, so no timer overhead. */
  for (uint32_t i = 0; e == cudaSuccess && i < nevents; i++, s->nevents++)
    e = cudaEventCreateWithFlags(&s->ev[i], cudaEventDisableTiming);
  (void)cudaSetDevice(prev);
  if (e != cudaSuccess) {
    kvbm_gpu_stream_destroy(s);
    return fail(err, "cannot create a CUDA stream", e);
  }
  *out = s;
  return KVBM_OK;
}

int kvbm_gpu_bind(kvbm_gpu_stream *s) {
  cudaError_t e = cudaSetDevice(s->device);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaSetDevice", e);
}

int kvbm_gpu_copy(kvbm_gpu_stream *s, void *dst, const void *src, size_t n) {
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s->stream);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaMemcpyAsync", e);
}

int kvbm_gpu_mark(kvbm_gpu_stream *s, uint32_t i) {
  if (i >= s->nevents) return KVBM_EINVAL;
  cudaError_t e = cudaEventRecord(s->ev[i], s->stream);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaEventRecord", e);
}

int kvbm_gpu_wait(kvbm_gpu_stream *s, uint32_t i) {
  if (i >= s->nevents) return KVBM_EINVAL;
  cudaError_t e = cudaEventSynchronize(s->ev[i]);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaEventSynchronize", e);
}

int kvbm_gpu_sync(kvbm_gpu_stream *s) {
  cudaError_t e = cudaStreamSynchronize(s->stream);
  return e == cudaSuccess ? KVBM_OK : fail(NULL, "cudaStreamSynchronize", e);
}

int kvbm_gpu_copy_now(int32_t device, void *dst, const void *src, size_t n, kvbm_error *err) {
  int prev = 0;
  (void)cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  (void)cudaSetDevice(prev);
  return e == cudaSuccess ? KVBM_OK : fail(err, "cudaMemcpy", e);
}

#else /* !KVBM_HAVE_CUDA */

struct kvbm_gpu_stream {
  int unused;
};

int kvbm_gpu_compiled(void) { return 0; }

int kvbm_gpu_stream_create(int32_t device, uint32_t nevents, kvbm_gpu_stream **out,
                           kvbm_error *err) {
  (void)device, (void)nevents, (void)out;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "manager: CUDA copies need a CUDA build");
}

void kvbm_gpu_stream_destroy(kvbm_gpu_stream *s) { (void)s; }
int kvbm_gpu_bind(kvbm_gpu_stream *s) { (void)s; return KVBM_EUNSUPPORTED; }

int kvbm_gpu_copy(kvbm_gpu_stream *s, void *dst, const void *src, size_t n) {
  (void)s, (void)dst, (void)src, (void)n;
  return KVBM_EUNSUPPORTED;
}

int kvbm_gpu_mark(kvbm_gpu_stream *s, uint32_t i) { (void)s, (void)i; return KVBM_EUNSUPPORTED; }
int kvbm_gpu_wait(kvbm_gpu_stream *s, uint32_t i) { (void)s, (void)i; return KVBM_EUNSUPPORTED; }
int kvbm_gpu_sync(kvbm_gpu_stream *s) { (void)s; return KVBM_EUNSUPPORTED; }

int kvbm_gpu_copy_now(int32_t device, void *dst, const void *src, size_t n, kvbm_error *err) {
  (void)device, (void)dst, (void)src, (void)n;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "manager: CUDA copies need a CUDA build");
}

#endif
