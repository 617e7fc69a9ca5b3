/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/storage.h: where a layout's bytes live.
 *
 * A storage owns `num_regions` regions of `region_size` bytes each, enough
 * for one kvbm_layout (see layout.h), in one kind of memory. It is an
 * interface: every kind (system heap here; pinned and device CUDA memory when
 * built with CUDA; a disk file and remote memory in other modules) fills a
 * kvbm_storage_vtable and embeds `kvbm_storage` as the FIRST member of its own
 * struct, so a kvbm_storage* can be cast back by the implementation.
 *
 *   struct my_storage { kvbm_storage base; int fd; ... };
 *   static const kvbm_storage_vtable my_vtable = {...};
 *   s->base.vt = &my_vtable;
 *
 * Callers use only the kvbm_storage_*() functions below, never the vtable.
 *
 * Memory kvbm allocates (kvbm_storage_create) is kvbm's to free; memory an
 * engine already owns (its paged KV tensors on the device, its host
 * buffers) is adopted (kvbm_storage_adopt): used in place, never freed.
 * A storage is not thread-safe to release while in use; reading its
 * properties and region addresses is safe from any thread.
 */
#ifndef KVBM_STORAGE_H
#define KVBM_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/layout.h"
#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvbm_storage kvbm_storage;

typedef struct kvbm_storage_vtable {
  const char *name; /* "system", "pinned", "device", "disk", ... */
  kvbm_memory_type (*memory_type)(const kvbm_storage *s);
  int32_t (*device_id)(const kvbm_storage *s); /* -1 if none */
  uint64_t (*num_regions)(const kvbm_storage *s);
  uint64_t (*region_size)(const kvbm_storage *s);
  /* Base of region r (< num_regions) in the storage's own address space:
   * host pointer (system, pinned), device pointer (device; not
   * dereferenceable on the host), NULL if the storage has no address (disk,
   * remote: their modules give offsets or remote addresses instead). */
  void *(*region_base)(const kvbm_storage *s, uint64_t r);
  /* Frees everything, including the struct. */
  void (*release)(kvbm_storage *s);
} kvbm_storage_vtable;

struct kvbm_storage {
  const kvbm_storage_vtable *vt;
};

/* Options of kvbm_storage_create(); NULL means kvbm_storage_config_default(). */
typedef struct kvbm_storage_config {
  uint64_t alignment; /* region alignment; 0 = the layout's. Must be a power
                         of two >= the layout's alignment (KVBM_EINVAL). */
  int zero;           /* nonzero: regions are zero-filled */
  int32_t device_id;  /* DEVICE memory: the CUDA ordinal (>= 0) */
} kvbm_storage_config;

/* All defaults: the layout's alignment, no zero fill, CUDA ordinal 0. */
KVBM_EXTERN kvbm_storage_config kvbm_storage_config_default(void);

/* Allocates storage for every region of `layout` in memory of type `memory`:
 *   KVBM_MEMORY_SYSTEM  posix_memalign per region. Always available.
 *   KVBM_MEMORY_PINNED  cudaHostAlloc per region.
 *   KVBM_MEMORY_DEVICE  cudaMalloc per region on opts->device_id.
 * PINNED/DEVICE: KVBM_EUNSUPPORTED in a build without CUDA, KVBM_EDEVICE
 * when CUDA finds no (such) device. DISK/REMOTE are created by their own
 * modules: KVBM_EUNSUPPORTED here. KVBM_ENOMEM if an allocation fails (then
 * nothing is left allocated). On success *out is owned by the caller:
 * kvbm_storage_release() it. The layout is not kept (copy it if needed). */
KVBM_EXTERN int kvbm_storage_create(kvbm_memory_type memory, const kvbm_layout *layout,
                        const kvbm_storage_config *opts, kvbm_storage **out,
                        kvbm_error *err);

/* Wraps memory the caller allocated and owns (an engine's own KV cache:
 * its paged device tensors, or host buffers) as a storage for `layout`,
 * without copying or touching it: num_bases base pointers, one per layout
 * region (layout->num_regions), each the start of region_size bytes of
 * `memory`:
 *   KVBM_MEMORY_SYSTEM  host memory (any allocator).
 *   KVBM_MEMORY_PINNED  page-locked host memory (cudaHostAlloc,
 *                       cudaHostRegister, torch pin_memory()).
 *   KVBM_MEMORY_DEVICE  device memory of CUDA ordinal device_id (cudaMalloc,
 *                       a torch CUDA tensor's data_ptr()).
 * device_id is used for DEVICE only (>= 0); the storage reports -1 for the
 * others. The bases array is copied; the layout is not kept.
 *
 * Ownership: the storage never frees, writes or zeroes the memory.
 * kvbm_storage_release() frees only kvbm's wrapper. The caller keeps every
 * region alive and in place until the storage and every manager (or other
 * user) it was given to are released; the caller must not hand the same
 * memory to two storages that are written at once.
 *
 * Errors (nothing is left allocated): KVBM_EINVAL for a NULL out, layout or
 * bases, an invalid layout, num_bases != the layout's region count, a NULL
 * base, a base not aligned to the layout's alignment, a region that would
 * wrap the address space, another memory type, a negative device id for
 * DEVICE; in a CUDA build also (cudaPointerGetAttributes on the first and
 * last byte of every region) DEVICE memory that is not device memory of
 * device_id, PINNED memory that is not page-locked host memory, SYSTEM
 * memory that is device or managed memory (checked only when a device
 * answers). KVBM_EDEVICE for DEVICE/PINNED when CUDA finds no (such)
 * device; KVBM_EUNSUPPORTED for DEVICE/PINNED in a build without CUDA;
 * KVBM_ENOMEM. Every message names the region at fault.
 *
 * Threads: any thread; the storage is used as any other (properties from
 * any thread). Cost: one small allocation and, in a CUDA build, two
 * cudaPointerGetAttributes per region (one cudaGetDeviceCount for SYSTEM). */
KVBM_EXTERN int kvbm_storage_adopt(kvbm_memory_type memory, int32_t device_id,
                                   const kvbm_layout *layout, void *const *bases,
                                   uint64_t num_bases, kvbm_storage **out, kvbm_error *err);

/* Whether `s` was made by kvbm_storage_adopt() (its memory is not kvbm's).
 * NULL: 0. */
KVBM_EXTERN int kvbm_storage_is_adopted(const kvbm_storage *s);

/* Whether this build has CUDA (pinned and device storage compiled in). */
KVBM_EXTERN int kvbm_storage_have_cuda(void);

/* Frees the storage and all its regions (an adopted storage: only kvbm's
 * wrapper, never the caller's memory). NULL: no-op. */
KVBM_EXTERN void kvbm_storage_release(kvbm_storage *s);

KVBM_EXTERN const char *kvbm_storage_name(const kvbm_storage *s);
KVBM_EXTERN kvbm_memory_type kvbm_storage_memory_type(const kvbm_storage *s);
KVBM_EXTERN int32_t kvbm_storage_device_id(const kvbm_storage *s);
KVBM_EXTERN uint64_t kvbm_storage_num_regions(const kvbm_storage *s);
KVBM_EXTERN uint64_t kvbm_storage_region_size(const kvbm_storage *s);
/* NULL if r is out of range or the storage has no address. */
KVBM_EXTERN void *kvbm_storage_region_base(const kvbm_storage *s, uint64_t r);

/* KVBM_OK if `s` can hold `layout`: same region count, regions at least
 * region_size bytes, bases aligned to the layout's alignment. Otherwise
 * KVBM_EINVAL naming the mismatch. */
KVBM_EXTERN int kvbm_storage_check_layout(const kvbm_storage *s, const kvbm_layout *layout,
                              kvbm_error *err);

/* Address of slice (block, layer, outer) of `layout` in `s`: *ptr (in the
 * storage's address space, see region_base) and *size (may be NULL).
 * KVBM_ERANGE for an index out of range, KVBM_EINVAL if the layout does not
 * fit the storage, KVBM_EUNSUPPORTED if the storage has no address. */
KVBM_EXTERN int kvbm_storage_slice_ptr(const kvbm_storage *s, const kvbm_layout *layout,
                           uint64_t block, uint64_t layer, uint64_t outer,
                           void **ptr, size_t *size, kvbm_error *err);

/* Same for one layer of one block (all its outer slices, contiguous). */
KVBM_EXTERN int kvbm_storage_block_layer_ptr(const kvbm_storage *s,
                                 const kvbm_layout *layout, uint64_t block,
                                 uint64_t layer, void **ptr, size_t *size,
                                 kvbm_error *err);

/* Fills `*out` to serialize `layout` as held by `s` (memory type, device id,
 * region addresses as integers; 0 for a storage without addresses) under
 * `block_set_id`. Allocates out->region_base: free with
 * kvbm_layout_desc_release(). Errors as kvbm_storage_check_layout(), or
 * KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_storage_describe(const kvbm_storage *s, const kvbm_layout *layout,
                          uint64_t block_set_id, kvbm_layout_desc *out,
                          kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_STORAGE_H */
