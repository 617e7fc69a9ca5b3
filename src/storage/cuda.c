/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda.c: pinned host (cudaHostAlloc) and device (cudaMalloc) storage.
 *
 * Compiled against the CUDA runtime only when cmake/cuda.cmake found the
 * toolkit (KVBM_HAVE_CUDA); otherwise both constructors report
 * KVBM_EUNSUPPORTED, so the rest of kvbm builds and runs on machines without
 * CUDA and callers can fall back to system storage. Only the C runtime API
 * is used (no kernels), so no nvcc step is needed.
 *
 * A machine with the toolkit but no GPU (or no driver) is the common CI
 * case: cudaGetDeviceCount() fails or reports zero, and we return
 * KVBM_EDEVICE before attempting any allocation.
 *
 * cudaMalloc changes nothing the caller can see: the current device is
 * switched to opts->device_id for the allocation and switched back.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/storage_internal.h"

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>

int kvbm__storage_cuda_compiled(void) { return 1; }

static int device_count(int *n, kvbm_error *err) {
  cudaError_t e = cudaGetDeviceCount(n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* clear the sticky error for later calls */
    return kvbm_error_set(err, KVBM_EDEVICE, "storage: no CUDA device (%s)",
                          cudaGetErrorString(e));
  }
  if (*n <= 0) return kvbm_error_set(err, KVBM_EDEVICE, "storage: no CUDA device");
  return KVBM_OK;
}

static void pinned_release(kvbm_storage *base) {
  kvbm_region_storage *s = (kvbm_region_storage *)(void *)base;
  for (uint64_t r = 0; r < s->num_regions; r++)
    if (s->region[r]) cudaFreeHost(s->region[r]);
  free(s);
}

static void device_release(kvbm_storage *base) {
  kvbm_region_storage *s = (kvbm_region_storage *)(void *)base;
  for (uint64_t r = 0; r < s->num_regions; r++)
    if (s->region[r]) cudaFree(s->region[r]);
  free(s);
}

static const kvbm_storage_vtable pinned_vtable = {
    "pinned", kvbm__region_storage_memory_type, kvbm__region_storage_device_id,
    kvbm__region_storage_num_regions, kvbm__region_storage_region_size,
    kvbm__region_storage_region_base, pinned_release,
};

static const kvbm_storage_vtable device_vtable = {
    "device", kvbm__region_storage_memory_type, kvbm__region_storage_device_id,
    kvbm__region_storage_num_regions, kvbm__region_storage_region_size,
    kvbm__region_storage_region_base, device_release,
};

/* CUDA picks the alignment (pages for host, >= 256 bytes on the device);
 * a larger request than it happened to give is refused, not faked. */
static int check_aligned(kvbm_region_storage *s, uint64_t r, uint64_t align,
                         kvbm_error *err) {
  if (((uintptr_t)s->region[r] & (align - 1)) == 0) return KVBM_OK;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                        "storage: CUDA %s allocation is not aligned to %llu",
                        s->base.vt->name, (unsigned long long)align);
}

int kvbm__pinned_storage_create(const kvbm_layout *layout, const kvbm_storage_config *opts,
                               kvbm_storage **out, kvbm_error *err) {
  int n, rc = device_count(&n, err);
  if (rc) return rc;
  kvbm_region_storage *s = kvbm__region_storage_create(&pinned_vtable, KVBM_MEMORY_PINNED, -1,
                                                   layout->num_regions, layout->region_size);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "storage: cannot allocate pinned storage");
  for (uint64_t r = 0; r < s->num_regions; r++) {
    cudaError_t e = cudaHostAlloc(&s->region[r], (size_t)s->region_size, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      s->region[r] = NULL;
      (void)cudaGetLastError();
      pinned_release(&s->base);
      return kvbm_error_set(err, KVBM_ENOMEM, "storage: cudaHostAlloc of %llu bytes: %s",
                            (unsigned long long)layout->region_size, cudaGetErrorString(e));
    }
    if ((rc = check_aligned(s, r, opts->alignment, err))) {
      pinned_release(&s->base);
      return rc;
    }
    if (opts->zero) memset(s->region[r], 0, (size_t)s->region_size);
  }
  *out = &s->base;
  return KVBM_OK;
}

int kvbm__device_storage_create(const kvbm_layout *layout, const kvbm_storage_config *opts,
                               kvbm_storage **out, kvbm_error *err) {
  int n, prev = 0, rc = device_count(&n, err);
  if (rc) return rc;
  if (opts->device_id < 0 || opts->device_id >= n)
    return kvbm_error_set(err, KVBM_EDEVICE, "storage: no CUDA device %d (%d present)",
                          (int)opts->device_id, n);
  kvbm_region_storage *s = kvbm__region_storage_create(&device_vtable, KVBM_MEMORY_DEVICE,
                                                   opts->device_id, layout->num_regions,
                                                   layout->region_size);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "storage: cannot allocate device storage");
  (void)cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(opts->device_id);
  for (uint64_t r = 0; e == cudaSuccess && r < s->num_regions; r++) {
    e = cudaMalloc(&s->region[r], (size_t)s->region_size);
    if (e != cudaSuccess) {
      s->region[r] = NULL;
      break;
    }
    if (opts->zero) e = cudaMemset(s->region[r], 0, (size_t)s->region_size);
    if (e == cudaSuccess && (rc = check_aligned(s, r, opts->alignment, err))) break;
  }
  (void)cudaSetDevice(prev);
  if (e != cudaSuccess || rc) {
    (void)cudaGetLastError();
    device_release(&s->base);
    if (rc) return rc;
    return kvbm_error_set(err, KVBM_ENOMEM, "storage: cudaMalloc of %llu bytes on device %d: %s",
                          (unsigned long long)layout->region_size, (int)opts->device_id,
                          cudaGetErrorString(e));
  }
  *out = &s->base;
  return KVBM_OK;
}

#else /* !KVBM_HAVE_CUDA */

int kvbm__storage_cuda_compiled(void) { return 0; }

int kvbm__pinned_storage_create(const kvbm_layout *layout, const kvbm_storage_config *opts,
                               kvbm_storage **out, kvbm_error *err) {
  (void)layout, (void)opts, (void)out;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "storage: pinned memory needs a CUDA build");
}

int kvbm__device_storage_create(const kvbm_layout *layout, const kvbm_storage_config *opts,
                               kvbm_storage **out, kvbm_error *err) {
  (void)layout, (void)opts, (void)out;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "storage: device memory needs a CUDA build");
}

#endif
