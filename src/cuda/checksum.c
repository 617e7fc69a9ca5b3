/* SPDX-License-Identifier: Apache-2.0 */
/*
 * checksum.c: integrity on the device -- BLAKE3 of blocks in device memory
 * (kvbm_cuda_digest_blocks), and the check of those blocks against the
 * digests kvbm recorded when it stored them (kvbm_cuda_verify_blocks).
 *
 * What: a block onboarded from G2/G3/G4 into device G1 arrives with the
 * digest kvbm keeps for it: BLAKE3 of its bytes (the fabric's and the
 * frames' BLAKE3-128 are its first 16 bytes). Checking it on the host
 * would mean copying 2 MiB back over PCIe for every block; checking it on
 * the device reads it at HBM speed where it already is, and only 32 bytes
 * a block come back. The kernels (checksum_kernels.cu) compute exactly
 * BLAKE3, from the code of blake3_hd.h that tests/cuda/test_blake3_hd.c
 * runs on the host against the official vectors.
 *
 * Why BLAKE3 and not a cheaper sum: the device must reproduce the digest
 * already stored, or every store would need a second, GPU-only checksum
 * computed at offload (another pass over the bytes, another field in every
 * frame). BLAKE3 is a tree of independent 1 KiB chunks, so it parallelizes
 * on a GPU as well as a CRC would, and it catches any corruption, not only
 * the patterns a CRC is built for. bench/bench_gpu_checksum.c measures
 * what it costs next to the onboard it checks.
 *
 * How a call goes: every argument is validated on the CPU first (nothing
 * touches CUDA for a bad call, so the refusals are the same in every build
 * and testable without a device); then each pointer is asked of CUDA:
 * device memory of this device (a host pointer would be read over PCIe,
 * or fault), and the range inside one allocation (cuMemGetAddressRange,
 * reached through cudaGetDriverEntryPointByVersion so that kvbm does not
 * link libcuda); then one stream-ordered allocation holds the block and
 * span tables, the digests and the groups' chaining values; the tables go
 * up in one copy, two kernels run, the digests come down, the allocation
 * is freed in stream order, and the stream is synchronized.
 *
 * Blocks may be given as one range each (kvbm_cuda_digest_blocks: a
 * FullyContiguous block) or as spans (kvbm_cuda_digest_spans: a
 * LayerSeparate block, one range per layer, hashed as its layers in
 * order). The pointer form is the span form with one span a block; every
 * span but a block's last is a whole number of 1 KiB chunks, so a kernel
 * thread finds its chunk with one binary search of its block's spans.
 *
 * Trade-offs: the call is synchronous (it returns the digests), which is
 * what a caller deciding whether to use a block needs; an engine that
 * wants to overlap the check with compute runs it on a stream of its own.
 * The pointer checks cost two CUDA calls per allocation, remembered for
 * the call (64 allocations; a KV cache is a few regions), so thousands of
 * layer spans cost no more than one block: on an H100 the W4 call runs at
 * 1.4 TB/s against the kernels' 1.57 TB/s. The per-call allocation is
 * cudaMallocAsync (pooled by the driver, no device-wide synchronization);
 * cudaMalloc where the device has no memory pools.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/cuda.h"
#include "cuda/blake3_hd.h"

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* What both forms check first: an output, a batch size, a device. */
static int check_batch(int32_t device, uint32_t n, const void *out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: the output array is NULL");
  if (n == 0) return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: no blocks (n == 0)");
  if (n > KVBM_CUDA_DIGEST_MAX_BATCH)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: %u blocks, more than %u in one call", n,
                          KVBM_CUDA_DIGEST_MAX_BATCH);
  if (device < 0) return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: device %d is negative", (int)device);
  return KVBM_OK;
}

/* The checks that need no device, of the pointer form. */
static int check_args(int32_t device, const void *const *ptrs, const uint64_t *lens, uint32_t n,
                      const void *out, kvbm_error *err) {
  if (!ptrs || !lens) return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: %s is NULL", ptrs ? "lens" : "ptrs");
  int rc = check_batch(device, n, out, err);
  if (rc) return rc;
  for (uint32_t i = 0; i < n; i++) {
    if (lens[i] > KVBM_CUDA_DIGEST_MAX_LEN)
      return kvbm_error_set(err, KVBM_ETOOLONG, "cuda digest: block %u is %llu bytes, more than %llu", i,
                            (unsigned long long)lens[i], (unsigned long long)KVBM_CUDA_DIGEST_MAX_LEN);
    if (!ptrs[i] && lens[i] > 0)
      return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: block %u has %llu bytes at NULL", i,
                            (unsigned long long)lens[i]);
  }
  return KVBM_OK;
}

/* The same for the span form; *total_spans is the sum of counts. */
static int check_spans(int32_t device, const kvbm_cuda_span *spans, const uint32_t *counts, uint32_t n,
                       const void *out, uint64_t *total_spans, kvbm_error *err) {
  if (!spans || !counts)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: %s is NULL", spans ? "counts" : "spans");
  int rc = check_batch(device, n, out, err);
  if (rc) return rc;
  /* The counts first, so that no span past the limit is read. */
  uint64_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (counts[i] == 0) return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: block %u has no spans", i);
    k += counts[i];
    if (k > KVBM_CUDA_DIGEST_MAX_SPANS)
      return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: more than %u spans in one call (block %u)",
                            KVBM_CUDA_DIGEST_MAX_SPANS, i);
  }
  k = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t len = 0;
    for (uint32_t j = 0; j < counts[i]; j++, k++) {
      const kvbm_cuda_span *sp = &spans[k];
      if (sp->len > KVBM_CUDA_DIGEST_MAX_LEN - len)
        return kvbm_error_set(err, KVBM_ETOOLONG, "cuda digest: block %u is more than %llu bytes (at span %u)", i,
                              (unsigned long long)KVBM_CUDA_DIGEST_MAX_LEN, j);
      if (!sp->ptr && sp->len > 0)
        return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: block %u span %u has %llu bytes at NULL", i, j,
                              (unsigned long long)sp->len);
      if (j + 1 < counts[i] && sp->len % KVBM_HD_CHUNK_LEN != 0)
        return kvbm_error_set(err, KVBM_EINVAL,
                              "cuda digest: block %u span %u is %llu bytes; every span but a block's last must be "
                              "a multiple of 1024",
                              i, j, (unsigned long long)sp->len);
      len += sp->len;
    }
  }
  *total_spans = k;
  return KVBM_OK;
}

#if defined(KVBM_HAVE_CUDA) && defined(KVBM_HAVE_CUDA_KERNELS)

static int cuda_fail(kvbm_error *err, const char *call, cudaError_t e) {
  (void)cudaGetLastError();
  return kvbm_error_set(err, KVBM_EDEVICE, "cuda digest: %s: %s", call, cudaGetErrorString(e));
}

static const char *memory_name(enum cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeUnregistered: return "unregistered host";
    case cudaMemoryTypeHost: return "pinned host";
    case cudaMemoryTypeDevice: return "device";
    case cudaMemoryTypeManaged: return "managed";
    default: return "unknown";
  }
}

/* cuMemGetAddressRange, reached through the runtime (so that kvbm needs
 * no link to libcuda): an allocation's base and size. CUdeviceptr is an
 * unsigned 64-bit integer and CUresult an enum (0: success). */
typedef int (*range_fn)(unsigned long long *base, size_t *size, unsigned long long ptr);

static range_fn get_range_fn(void) {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12050
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 3020, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return (range_fn)fn;
#else
  return NULL;
#endif
}

/* Allocations already checked in this call (device memory of `device`). */
#define KVBM__RANGES 64
typedef struct ranges {
  uint64_t base[KVBM__RANGES], end[KVBM__RANGES];
  unsigned n, next, last;
} ranges;

static int known(ranges *r, uint64_t p, uint64_t len) {
  if (r->n && p >= r->base[r->last] && len <= r->end[r->last] - p && p < r->end[r->last]) return 1;
  for (unsigned i = 0; i < r->n; i++)
    if (p >= r->base[i] && p < r->end[i] && len <= r->end[i] - p) return r->last = i, 1;
  return 0;
}

/* Device memory of `device`, each span (empty ones are not read), and
 * where the runtime offers cuMemGetAddressRange, inside one allocation
 * (KVBM_ERANGE otherwise): the kernels then never read past what the
 * caller owns. Spans in an allocation already checked in this call cost
 * no CUDA call (a LayerSeparate cache is a few allocations for thousands
 * of spans). counts NULL: one span a block (the pointer form, whose
 * messages name blocks). */
static int check_pointers(int32_t device, const kvbm_cuda_span *spans, const uint32_t *counts, uint32_t n,
                          kvbm_error *err) {
  range_fn range = get_range_fn();
  ranges r;
  r.n = r.next = r.last = 0;
  uint64_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t c = counts ? counts[i] : 1;
    for (uint32_t j = 0; j < c; j++, k++) {
      const kvbm_cuda_span *sp = &spans[k];
      const uint64_t p = (uint64_t)(uintptr_t)sp->ptr;
      if (sp->len == 0 || (range && known(&r, p, sp->len))) continue;
      char what[48];
      if (counts) snprintf(what, sizeof what, "block %u span %u", i, j);
      else snprintf(what, sizeof what, "block %u", i);
      struct cudaPointerAttributes a;
      memset(&a, 0, sizeof a);
      cudaError_t e = cudaPointerGetAttributes(&a, sp->ptr);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: %s at %p: cudaPointerGetAttributes: %s", what,
                              sp->ptr, cudaGetErrorString(e));
      }
      if (a.type != cudaMemoryTypeDevice)
        return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: %s at %p is %s memory; device memory needed", what,
                              sp->ptr, memory_name(a.type));
      if (a.device != device)
        return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: %s at %p is on device %d, not %d", what, sp->ptr,
                              a.device, (int)device);
      if (!range) continue;
      unsigned long long base = 0;
      size_t size = 0;
      if (range(&base, &size, p) != 0) /* device memory CUDA cannot size: as without the entry point */
        continue;
      if (p < base || sp->len > base + size - p)
        return kvbm_error_set(err, KVBM_ERANGE,
                              "cuda digest: %s: %llu bytes at %p run past the end of its allocation (%llu bytes at "
                              "0x%llx)",
                              what, (unsigned long long)sp->len, sp->ptr, (unsigned long long)size, base);
      r.base[r.next] = base, r.end[r.next] = base + size, r.last = r.next;
      r.next = (r.next + 1) % KVBM__RANGES;
      if (r.n < KVBM__RANGES) r.n++;
    }
  }
  return KVBM_OK;
}

/* The whole call on the device. reps > 0 (benchmarks only) also launches
 * the kernels `reps` more times between two events and puts their mean
 * time in *kernel_ms: the kernels alone, without the checks, the
 * allocation and the copies of the table and the digests. */
static int run(int32_t device, cudaStream_t s, const kvbm_cuda_span *spans, const uint32_t *counts, uint32_t n,
               uint64_t nspans, uint8_t (*out)[32], int reps, float *kernel_ms, kvbm_error *err) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return kvbm_error_set(err, KVBM_EDEVICE, "cuda digest: no CUDA device (%s)", cudaGetErrorString(e));
  }
  if (device >= count)
    return kvbm_error_set(err, KVBM_EDEVICE, "cuda digest: no CUDA device %d (%d present)", (int)device, count);
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) {
    (void)cudaGetLastError();
    prev = -1;
  }
  e = cudaSetDevice(device);
  if (e != cudaSuccess) return cuda_fail(err, "cudaSetDevice", e);

  int rc = check_pointers(device, spans, counts, n, err);
  uint64_t groups = 0, max_groups = 0;
  for (uint64_t i = 0, k = 0; i < n; i++) {
    uint64_t len = 0;
    for (uint32_t j = 0, c = counts ? counts[i] : 1; j < c; j++) len += spans[k++].len;
    uint64_t g = kvbm_hd_groups(len);
    groups += g;
    if (g > max_groups) max_groups = g;
  }
  /* Device: [blocks: n x 32][spans: nspans x 32][owners: groups x 4, to
   * 32][digests: n x 32][group values: groups x 32]; the first three come
   * from one host buffer in one copy. */
  const size_t tab_bytes = (size_t)n * sizeof(kvbm__dblock) + (size_t)nspans * sizeof(kvbm__dspan),
               own_bytes = ((size_t)groups * 4 + 31) / 32 * 32;
  uint8_t *host = NULL, *dmem = NULL;
  int pooled = 0;
  if (!rc) {
    host = malloc(tab_bytes + own_bytes);
    if (!host) rc = kvbm_error_set(err, KVBM_ENOMEM, "cuda digest: no memory for a table of %u blocks", n);
  }
  if (!rc) {
    kvbm__dblock *tab = (kvbm__dblock *)(void *)host;
    kvbm__dspan *sp = (kvbm__dspan *)(void *)(host + (size_t)n * sizeof(kvbm__dblock));
    uint32_t *own = (uint32_t *)(void *)(host + tab_bytes);
    uint64_t g0 = 0, k = 0;
    for (uint32_t i = 0; i < n; i++) {
      uint32_t c = counts ? counts[i] : 1;
      uint64_t len = 0, k0 = k;
      for (uint32_t j = 0; j < c; j++, k++) {
        sp[k] = (kvbm__dspan){.ptr = (uint64_t)(uintptr_t)spans[k].ptr, .len = spans[k].len, .off = len};
        len += spans[k].len;
      }
      uint64_t g = kvbm_hd_groups(len);
      tab[i] = (kvbm__dblock){.len = len, .group0 = g0, .groups = g, .span0 = k0, .nspans = c};
      for (uint64_t q = 0; q < g; q++) own[g0 + q] = i;
      g0 += g;
    }
    size_t bytes = tab_bytes + own_bytes + (size_t)n * 32 + (size_t)groups * 32;
    int pools = 0;
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess) {
      (void)cudaGetLastError();
      pools = 0;
    }
    e = pools ? cudaMallocAsync((void **)&dmem, bytes, s) : cudaMalloc((void **)&dmem, bytes);
    if (e != cudaSuccess) {
      dmem = NULL;
      rc = cuda_fail(err, pools ? "cudaMallocAsync" : "cudaMalloc", e);
    }
    pooled = pools;
  }
  /* (offsets taken only from a real allocation) */
  uint8_t *dtab = dmem, *dspn = dmem ? dmem + (size_t)n * sizeof(kvbm__dblock) : NULL,
          *down = dmem ? dmem + tab_bytes : NULL, *ddig = dmem ? down + own_bytes : NULL,
          *dscr = dmem ? ddig + (size_t)n * 32 : NULL;
  if (!rc && (e = cudaMemcpyAsync(dtab, host, tab_bytes + own_bytes, cudaMemcpyHostToDevice, s)) != cudaSuccess)
    rc = cuda_fail(err, "cudaMemcpyAsync (block table to the device)", e);
  if (!rc && (e = (cudaError_t)kvbm__digest_launch((const kvbm__dblock *)(void *)dtab, (const kvbm__dspan *)(void *)dspn,
                                                   (const uint32_t *)(void *)down, n, groups, (uint32_t)max_groups, dscr, ddig, s)) != cudaSuccess)
    rc = cuda_fail(err, "launch of the BLAKE3 kernels", e);
  if (!rc && reps > 0) {
    cudaEvent_t ev[2] = {NULL, NULL};
    if ((e = cudaEventCreate(&ev[0])) != cudaSuccess || (e = cudaEventCreate(&ev[1])) != cudaSuccess)
      rc = cuda_fail(err, "cudaEventCreate", e);
    if (!rc && (e = cudaEventRecord(ev[0], s)) != cudaSuccess) rc = cuda_fail(err, "cudaEventRecord", e);
    for (int r = 0; !rc && r < reps; r++)
      if ((e = (cudaError_t)kvbm__digest_launch((const kvbm__dblock *)(void *)dtab, (const kvbm__dspan *)(void *)dspn,
                                                (const uint32_t *)(void *)down, n, groups, (uint32_t)max_groups, dscr, ddig, s)) != cudaSuccess)
        rc = cuda_fail(err, "launch of the BLAKE3 kernels", e);
    if (!rc && (e = cudaEventRecord(ev[1], s)) != cudaSuccess) rc = cuda_fail(err, "cudaEventRecord", e);
    if (!rc && (e = cudaEventSynchronize(ev[1])) != cudaSuccess) rc = cuda_fail(err, "cudaEventSynchronize", e);
    float ms = 0;
    if (!rc && (e = cudaEventElapsedTime(&ms, ev[0], ev[1])) != cudaSuccess) rc = cuda_fail(err, "cudaEventElapsedTime", e);
    if (!rc) *kernel_ms = ms / (float)reps;
    for (int k = 0; k < 2; k++)
      if (ev[k]) (void)cudaEventDestroy(ev[k]);
  }
  if (!rc && (e = cudaMemcpyAsync(out, ddig, (size_t)n * 32, cudaMemcpyDeviceToHost, s)) != cudaSuccess)
    rc = cuda_fail(err, "cudaMemcpyAsync (digests to the host)", e);
  if (dmem) {
    e = pooled ? cudaFreeAsync(dmem, s) : cudaSuccess;
    if (e != cudaSuccess && !rc) rc = cuda_fail(err, "cudaFreeAsync", e);
  }
  /* Wait even after a failure: the table and out must outlive the copies. */
  e = cudaStreamSynchronize(s);
  if (e != cudaSuccess && !rc) rc = cuda_fail(err, "cudaStreamSynchronize (the BLAKE3 kernels)", e);
  if (dmem && !pooled) {
    e = cudaFree(dmem);
    if (e != cudaSuccess && !rc) rc = cuda_fail(err, "cudaFree", e);
  }
  free(host);
  if (prev >= 0) (void)cudaSetDevice(prev);
  return rc;
}

#endif

/* Spans already checked (check_spans or check_args); counts NULL: one
 * span a block. */
static int digest(int32_t device, void *stream, const kvbm_cuda_span *spans, const uint32_t *counts, uint32_t n,
                  uint64_t nspans, uint8_t (*out)[32], int reps, float *kernel_ms, kvbm_error *err) {
  int rc;
#if !defined(KVBM_HAVE_CUDA)
  (void)device, (void)stream, (void)spans, (void)counts, (void)nspans, (void)reps, (void)kernel_ms;
  rc = kvbm_error_set(err, KVBM_EUNSUPPORTED, "cuda digest: this build has no CUDA runtime");
#elif !defined(KVBM_HAVE_CUDA_KERNELS)
  (void)device, (void)stream, (void)spans, (void)counts, (void)nspans, (void)reps, (void)kernel_ms;
  rc = kvbm_error_set(err, KVBM_EUNSUPPORTED, "cuda digest: this build has no CUDA kernels (no nvcc, or a sanitizer build)");
#else
  rc = run(device, (cudaStream_t)stream, spans, counts, n, nspans, out, reps, kernel_ms, err);
#endif
  if (rc) memset(out, 0, (size_t)n * 32); /* arguments accepted: n entries are the caller's */
  return rc;
}

/* The pointer form as spans, one a block. */
static int digest_ptrs(int32_t device, void *stream, const void *const *ptrs, const uint64_t *lens, uint32_t n,
                       uint8_t (*out)[32], int reps, float *kernel_ms, kvbm_error *err) {
  int rc = check_args(device, ptrs, lens, n, out, err);
  if (rc) return rc;
  kvbm_cuda_span *sp = malloc((size_t)n * sizeof *sp);
  if (!sp) return kvbm_error_set(err, KVBM_ENOMEM, "cuda digest: no memory for %u blocks", n);
  for (uint32_t i = 0; i < n; i++) sp[i] = (kvbm_cuda_span){.ptr = ptrs[i], .len = lens[i]};
  rc = digest(device, stream, sp, NULL, n, n, out, reps, kernel_ms, err);
  free(sp);
  return rc;
}

int kvbm_cuda_digest_blocks(int32_t device, void *stream, const void *const *ptrs, const uint64_t *lens, uint32_t n,
                            uint8_t (*out)[32], kvbm_error *err) {
  return digest_ptrs(device, stream, ptrs, lens, n, out, 0, NULL, err);
}

int kvbm_cuda_digest_spans(int32_t device, void *stream, const kvbm_cuda_span *spans, const uint32_t *counts,
                           uint32_t n, uint8_t (*out)[32], kvbm_error *err) {
  uint64_t nspans = 0;
  int rc = check_spans(device, spans, counts, n, out, &nspans, err);
  return rc ? rc : digest(device, stream, spans, counts, n, nspans, out, 0, NULL, err);
}

int kvbm__cuda_digest_timed(int32_t device, void *stream, const void *const *ptrs, const uint64_t *lens, uint32_t n,
                            uint8_t (*out)[32], int reps, float *kernel_ms, kvbm_error *err) {
  if (reps < 1 || !kernel_ms) return kvbm_error_set(err, KVBM_EINVAL, "cuda digest: reps < 1 or kernel_ms NULL");
  return digest_ptrs(device, stream, ptrs, lens, n, out, reps, kernel_ms, err);
}

/* Compares got[i] with expected's i-th digest_len bytes. */
static int compare(const uint8_t (*got)[32], uint32_t n, const uint8_t *expected, uint32_t digest_len,
                   uint32_t *bad_index, uint32_t *bad_count, kvbm_error *err) {
  uint32_t first = 0, bad = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (memcmp(got[i], expected + (size_t)i * digest_len, digest_len) != 0) {
      if (bad == 0) first = i;
      bad++;
    }
  }
  if (bad_index) *bad_index = first;
  if (bad_count) *bad_count = bad;
  if (bad)
    return kvbm_error_set(err, KVBM_ECHECKSUM, "cuda verify: block %u (of %u) does not match its digest (%u blocks bad)",
                          first, n, bad);
  return KVBM_OK;
}

static int check_expected(const uint8_t *expected, uint32_t digest_len, kvbm_error *err) {
  if (!expected) return kvbm_error_set(err, KVBM_EINVAL, "cuda verify: expected is NULL");
  if (digest_len < 1 || digest_len > 32)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda verify: digest_len %u is outside 1..32", digest_len);
  return KVBM_OK;
}

int kvbm_cuda_verify_blocks(int32_t device, void *stream, const void *const *ptrs, const uint64_t *lens, uint32_t n,
                            const uint8_t *expected, uint32_t digest_len, uint32_t *bad_index, uint32_t *bad_count,
                            kvbm_error *err) {
  int rc = check_expected(expected, digest_len, err);
  /* expected stands in for the output array in the NULL check. */
  if (!rc) rc = check_args(device, ptrs, lens, n, expected, err);
  if (rc) return rc;
  uint8_t(*got)[32] = malloc((size_t)n * 32);
  if (!got) return kvbm_error_set(err, KVBM_ENOMEM, "cuda verify: no memory for %u digests", n);
  rc = digest_ptrs(device, stream, ptrs, lens, n, got, 0, NULL, err);
  if (!rc) rc = compare((const uint8_t(*)[32])got, n, expected, digest_len, bad_index, bad_count, err);
  free(got);
  return rc;
}

int kvbm_cuda_verify_spans(int32_t device, void *stream, const kvbm_cuda_span *spans, const uint32_t *counts,
                           uint32_t n, const uint8_t *expected, uint32_t digest_len, uint32_t *bad_index,
                           uint32_t *bad_count, kvbm_error *err) {
  uint64_t nspans = 0;
  int rc = check_expected(expected, digest_len, err);
  if (!rc) rc = check_spans(device, spans, counts, n, expected, &nspans, err);
  if (rc) return rc;
  uint8_t(*got)[32] = malloc((size_t)n * 32);
  if (!got) return kvbm_error_set(err, KVBM_ENOMEM, "cuda verify: no memory for %u digests", n);
  rc = digest(device, stream, spans, counts, n, nspans, got, 0, NULL, err);
  if (!rc) rc = compare((const uint8_t(*)[32])got, n, expected, digest_len, bad_index, bad_count, err);
  free(got);
  return rc;
}
