/* SPDX-License-Identifier: Apache-2.0 */
/*
 * system.c: system (host heap) storage, and the region-array shape that
 * pinned and device storage share.
 *
 * One posix_memalign per region rather than one allocation carved into
 * regions: a LayerSeparate layout then gets independent per-layer buffers,
 * as an engine's per-layer KV tensors are, and a failure part way frees
 * exactly what was taken. The region count is at most
 * KVBM_LAYOUT_MAX_LAYERS, so the extra allocations are bounded.
 *
 * Zero-filling is optional because touching every page of a large pool at
 * startup costs seconds and commits memory the kernel would otherwise
 * provide lazily (and already zeroed).
 */
#include <stdlib.h>
#include <string.h>

#include "storage/storage_internal.h"

kvbm_region_storage *kvbm__region_storage_create(const kvbm_storage_vtable *vt,
                                             kvbm_memory_type memory, int32_t device_id,
                                             uint64_t num_regions, uint64_t region_size) {
  /* num_regions <= KVBM_LAYOUT_MAX_LAYERS (a validated layout): no overflow. */
  kvbm_region_storage *s =
      calloc(1, sizeof *s + (size_t)num_regions * sizeof s->region[0]);
  if (!s) return NULL;
  s->base.vt = vt;
  s->memory = memory;
  s->device_id = device_id;
  s->num_regions = num_regions;
  s->region_size = region_size;
  return s;
}

#define RS(s) ((const kvbm_region_storage *)(const void *)(s))

kvbm_memory_type kvbm__region_storage_memory_type(const kvbm_storage *s) { return RS(s)->memory; }
int32_t kvbm__region_storage_device_id(const kvbm_storage *s) { return RS(s)->device_id; }
uint64_t kvbm__region_storage_num_regions(const kvbm_storage *s) { return RS(s)->num_regions; }
uint64_t kvbm__region_storage_region_size(const kvbm_storage *s) { return RS(s)->region_size; }
void *kvbm__region_storage_region_base(const kvbm_storage *s, uint64_t r) {
  return RS(s)->region[r];
}

static void system_release(kvbm_storage *base) {
  kvbm_region_storage *s = (kvbm_region_storage *)(void *)base;
  for (uint64_t r = 0; r < s->num_regions; r++) free(s->region[r]);
  free(s);
}

static const kvbm_storage_vtable system_vtable = {
    "system",
    kvbm__region_storage_memory_type,
    kvbm__region_storage_device_id,
    kvbm__region_storage_num_regions,
    kvbm__region_storage_region_size,
    kvbm__region_storage_region_base,
    system_release,
};

int kvbm__system_storage_create(const kvbm_layout *layout, const kvbm_storage_config *opts,
                               kvbm_storage **out, kvbm_error *err) {
  kvbm_region_storage *s = kvbm__region_storage_create(&system_vtable, KVBM_MEMORY_SYSTEM, -1,
                                                   layout->num_regions, layout->region_size);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "storage: cannot allocate system storage");
  /* posix_memalign wants a multiple of sizeof(void *). */
  size_t align = (size_t)opts->alignment;
  if (align < sizeof(void *)) align = sizeof(void *);
  for (uint64_t r = 0; r < s->num_regions; r++) {
    void *p = NULL;
    if (posix_memalign(&p, align, (size_t)s->region_size) != 0) {
      system_release(&s->base);
      return kvbm_error_set(err, KVBM_ENOMEM,
                            "storage: cannot allocate region %llu of %llu bytes (aligned to %zu)",
                            (unsigned long long)r, (unsigned long long)layout->region_size,
                            align);
    }
    if (opts->zero) memset(p, 0, (size_t)s->region_size);
    s->region[r] = p;
  }
  *out = &s->base;
  return KVBM_OK;
}
