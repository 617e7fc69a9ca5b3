/* SPDX-License-Identifier: Apache-2.0 */
/*
 * adopt.c: storage over memory kvbm did not allocate (kvbm_storage_adopt).
 *
 * What. An engine already owns its KV cache: vLLM's and SGLang's paged KV
 * tensors live on the device before any cache manager is asked; a host
 * engine may hand in its own buffers the same way. Adopting wraps those
 * regions (one base pointer per layout region, a memory type, a device id)
 * in the same region-array shape as kvbm's own system, pinned and device
 * storage, so every consumer (the manager's tiers, slice addresses, the
 * layout descriptors sent to peers) treats them alike. The only difference
 * is release: it frees kvbm's wrapper and never the memory.
 *
 * Why validate so much here. A wrong base pointer is not an error kvbm can
 * discover later: a host memcpy into a device address crashes, a
 * cudaMemcpyAsync from another device's memory or from pageable memory
 * behaves differently (or corrupts), a misaligned base breaks the layout's
 * promises to kernels. So adoption refuses, with a message naming the
 * region, everything it can check: NULL bases, a count that is not the
 * layout's region count, misalignment and, in a CUDA build,
 * cudaPointerGetAttributes' word on the first and last byte of each region
 * (DEVICE: device memory of that ordinal; PINNED: page-locked host memory;
 * SYSTEM: not device or managed memory, checked only when a device answers).
 * What it cannot check is whether the regions really are region_size bytes
 * long beyond their last byte's attributes, or that the caller keeps them
 * alive: that is the header's contract.
 *
 * Trade-off: the checks cost one CUDA call per region end at adoption,
 * never on the copy path. Without CUDA there is nothing to ask, so DEVICE
 * and PINNED adoption are refused (KVBM_EUNSUPPORTED) rather than trusted.
 */
#include <stdint.h>
#include <stdlib.h>

#include "storage/storage_internal.h"

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Frees the wrapper only: the regions belong to the caller. */
static void adopted_release(kvbm_storage *base) { free(base); }

static const kvbm_storage_vtable adopted_system_vtable = {
    "adopted system", kvbm__region_storage_memory_type, kvbm__region_storage_device_id,
    kvbm__region_storage_num_regions, kvbm__region_storage_region_size,
    kvbm__region_storage_region_base, adopted_release,
};
static const kvbm_storage_vtable adopted_pinned_vtable = {
    "adopted pinned", kvbm__region_storage_memory_type, kvbm__region_storage_device_id,
    kvbm__region_storage_num_regions, kvbm__region_storage_region_size,
    kvbm__region_storage_region_base, adopted_release,
};
static const kvbm_storage_vtable adopted_device_vtable = {
    "adopted device", kvbm__region_storage_memory_type, kvbm__region_storage_device_id,
    kvbm__region_storage_num_regions, kvbm__region_storage_region_size,
    kvbm__region_storage_region_base, adopted_release,
};

int kvbm__storage_is_adopted(const kvbm_storage *s) {
  return s && (s->vt == &adopted_system_vtable || s->vt == &adopted_pinned_vtable ||
               s->vt == &adopted_device_vtable);
}

#ifdef KVBM_HAVE_CUDA
static const char *cuda_type_name(enum cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeUnregistered: return "pageable host memory";
    case cudaMemoryTypeHost: return "page-locked host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "unknown memory";
}

/* What CUDA says of byte p of region r ("first"/"last"), against what
 * `memory` on `device` requires. */
static int check_byte(kvbm_memory_type memory, int32_t device, uint64_t r, const char *which,
                      const void *p, kvbm_error *err) {
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return kvbm_error_set(err, KVBM_EINVAL,
                          "storage: adopt: cudaPointerGetAttributes of region %llu's %s byte "
                          "failed: %s",
                          (unsigned long long)r, which, cudaGetErrorString(e));
  }
  switch (memory) {
    case KVBM_MEMORY_DEVICE:
      if (a.type != cudaMemoryTypeDevice)
        return kvbm_error_set(err, KVBM_EINVAL,
                              "storage: adopt: region %llu's %s byte is %s, not device memory",
                              (unsigned long long)r, which, cuda_type_name(a.type));
      if (a.device != device)
        return kvbm_error_set(err, KVBM_EINVAL,
                              "storage: adopt: region %llu's %s byte is on device %d, not %d",
                              (unsigned long long)r, which, a.device, (int)device);
      return KVBM_OK;
    case KVBM_MEMORY_PINNED:
      if (a.type != cudaMemoryTypeHost)
        return kvbm_error_set(err, KVBM_EINVAL,
                              "storage: adopt: region %llu's %s byte is %s, not page-locked "
                              "host memory",
                              (unsigned long long)r, which, cuda_type_name(a.type));
      return KVBM_OK;
    default:
      if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged)
        return kvbm_error_set(err, KVBM_EINVAL,
                              "storage: adopt: region %llu's %s byte is %s, not host memory",
                              (unsigned long long)r, which, cuda_type_name(a.type));
      return KVBM_OK;
  }
}

static int check_cuda(kvbm_memory_type memory, int32_t device, const kvbm_layout *l,
                      void *const *bases, kvbm_error *err) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    if (memory == KVBM_MEMORY_SYSTEM) return KVBM_OK; /* nothing could be device memory */
    return kvbm_error_set(err, KVBM_EDEVICE, "storage: adopt: no CUDA device (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
  }
  if (memory == KVBM_MEMORY_DEVICE && device >= n)
    return kvbm_error_set(err, KVBM_EDEVICE, "storage: adopt: no CUDA device %d (%d present)",
                          (int)device, n);
  for (uint64_t r = 0; r < l->num_regions; r++) {
    const char *b = bases[r];
    int rc = check_byte(memory, device, r, "first", b, err);
    if (!rc) rc = check_byte(memory, device, r, "last", b + l->region_size - 1, err);
    if (rc) return rc;
  }
  return KVBM_OK;
}
#endif

int kvbm_storage_adopt(kvbm_memory_type memory, int32_t device_id, const kvbm_layout *layout,
                       void *const *bases, uint64_t num_bases, kvbm_storage **out,
                       kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "storage: adopt: out is NULL");
  *out = NULL;
  int rc = kvbm__storage_check_layout_value(layout, err);
  if (rc) return rc;
  const kvbm_storage_vtable *vt;
  switch (memory) {
    case KVBM_MEMORY_SYSTEM: vt = &adopted_system_vtable; break;
    case KVBM_MEMORY_PINNED: vt = &adopted_pinned_vtable; break;
    case KVBM_MEMORY_DEVICE: vt = &adopted_device_vtable; break;
    default:
      return kvbm_error_set(err, KVBM_EINVAL,
                            "storage: adopt: memory type %d is not system, pinned or device",
                            (int)memory);
  }
  if (memory == KVBM_MEMORY_DEVICE && device_id < 0)
    return kvbm_error_set(err, KVBM_EINVAL, "storage: adopt: device id %d is negative",
                          (int)device_id);
  if (!bases) return kvbm_error_set(err, KVBM_EINVAL, "storage: adopt: bases is NULL");
  if (num_bases != layout->num_regions)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "storage: adopt: %llu base pointers for a layout of %llu regions",
                          (unsigned long long)num_bases,
                          (unsigned long long)layout->num_regions);
  for (uint64_t r = 0; r < num_bases; r++) {
    uintptr_t b = (uintptr_t)bases[r];
    if (!b)
      return kvbm_error_set(err, KVBM_EINVAL, "storage: adopt: region %llu's base is NULL",
                            (unsigned long long)r);
    if (b & (layout->config.alignment - 1))
      return kvbm_error_set(err, KVBM_EINVAL,
                            "storage: adopt: region %llu's base %#llx is not aligned to the "
                            "layout's %llu",
                            (unsigned long long)r, (unsigned long long)b,
                            (unsigned long long)layout->config.alignment);
    if (b > UINTPTR_MAX - layout->region_size)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "storage: adopt: region %llu at %#llx wraps the address space",
                            (unsigned long long)r, (unsigned long long)b);
  }
#ifdef KVBM_HAVE_CUDA
  if ((rc = check_cuda(memory, device_id, layout, bases, err))) return rc;
#else
  if (memory != KVBM_MEMORY_SYSTEM)
    return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                          "storage: adopt: %s memory needs a CUDA build",
                          kvbm_memory_type_name(memory));
#endif
  kvbm_region_storage *s = kvbm__region_storage_create(
      vt, memory, memory == KVBM_MEMORY_DEVICE ? device_id : -1, layout->num_regions,
      layout->region_size);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "storage: adopt: out of memory");
  for (uint64_t r = 0; r < num_bases; r++) s->region[r] = bases[r];
  *out = &s->base;
  return KVBM_OK;
}

int kvbm_storage_is_adopted(const kvbm_storage *s) { return kvbm__storage_is_adopted(s); }
