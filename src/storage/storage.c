/* SPDX-License-Identifier: Apache-2.0 */
/*
 * storage.c: the storage interface (dispatch through the vtable), slice
 * addresses through layout + storage, and describing a storage for peers.
 *
 * Storage is a vtable rather than a tagged union so that kinds living in
 * other modules (the disk tier's file, the fabric's remote memory) plug in
 * without this module knowing them or linking their libraries. The price is
 * an indirect call per property read, which is nothing next to the copies
 * that follow.
 *
 * A storage does not keep the layout it was made for: one storage may be
 * viewed through several layouts (e.g. the same bytes addressed per block
 * and per layer), so every address query takes the layout and checks, in
 * O(1), that it fits the storage (same region count, regions large enough).
 */
#include "kvbm/storage.h"

#include <stdlib.h>
#include <string.h>

#include "storage/storage_internal.h"

/* Rejects a layout whose derived fields were not made by kvbm_layout_init()
 * for its config (a hand-filled or corrupted struct), since every offset
 * below trusts them. */
int kvbm__storage_check_layout_value(const kvbm_layout *l, kvbm_error *err) {
  if (!l) return kvbm_error_set(err, KVBM_EINVAL, "storage: layout is NULL");
  kvbm_layout want;
  int rc = kvbm_layout_init(&want, l->kind, &l->config, err);
  if (rc) return rc;
  if (want.outer_stride != l->outer_stride || want.layer_stride != l->layer_stride ||
      want.block_stride != l->block_stride || want.region_size != l->region_size ||
      want.num_regions != l->num_regions)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "storage: layout strides do not match its config "
                          "(not made by kvbm_layout_init?)");
  return KVBM_OK;
}

kvbm_storage_config kvbm_storage_config_default(void) {
  return (kvbm_storage_config){.alignment = 0, .zero = 0, .device_id = 0};
}

int kvbm_storage_create(kvbm_memory_type memory, const kvbm_layout *layout,
                        const kvbm_storage_config *opts, kvbm_storage **out,
                        kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "storage: out is NULL");
  *out = NULL;
  int rc = kvbm__storage_check_layout_value(layout, err);
  if (rc) return rc;
  kvbm_storage_config o = opts ? *opts : kvbm_storage_config_default();
  if (o.alignment == 0) o.alignment = layout->config.alignment;
  if ((o.alignment & (o.alignment - 1)) != 0 || o.alignment < layout->config.alignment)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "storage: alignment %llu is not a power of two >= the layout's %llu",
                          (unsigned long long)o.alignment,
                          (unsigned long long)layout->config.alignment);
  switch (memory) {
    case KVBM_MEMORY_SYSTEM: return kvbm__system_storage_create(layout, &o, out, err);
    case KVBM_MEMORY_PINNED: return kvbm__pinned_storage_create(layout, &o, out, err);
    case KVBM_MEMORY_DEVICE: return kvbm__device_storage_create(layout, &o, out, err);
    case KVBM_MEMORY_DISK:
    case KVBM_MEMORY_REMOTE:
      return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                            "storage: %s storage is created by its own module",
                            kvbm_memory_type_name(memory));
  }
  return kvbm_error_set(err, KVBM_EINVAL, "storage: unknown memory type %d", (int)memory);
}

int kvbm_storage_have_cuda(void) { return kvbm__storage_cuda_compiled(); }

void kvbm_storage_release(kvbm_storage *s) {
  if (s) s->vt->release(s);
}

const char *kvbm_storage_name(const kvbm_storage *s) { return s ? s->vt->name : "?"; }

kvbm_memory_type kvbm_storage_memory_type(const kvbm_storage *s) {
  return s ? s->vt->memory_type(s) : (kvbm_memory_type)0;
}

int32_t kvbm_storage_device_id(const kvbm_storage *s) { return s ? s->vt->device_id(s) : -1; }

uint64_t kvbm_storage_num_regions(const kvbm_storage *s) {
  return s ? s->vt->num_regions(s) : 0;
}

uint64_t kvbm_storage_region_size(const kvbm_storage *s) {
  return s ? s->vt->region_size(s) : 0;
}

void *kvbm_storage_region_base(const kvbm_storage *s, uint64_t r) {
  if (!s || r >= s->vt->num_regions(s)) return NULL;
  return s->vt->region_base(s, r);
}

/* The O(1) part of the fit check, done on every address query. */
static int check_fit(const kvbm_storage *s, const kvbm_layout *l, kvbm_error *err) {
  if (!s) return kvbm_error_set(err, KVBM_EINVAL, "storage: storage is NULL");
  if (!l) return kvbm_error_set(err, KVBM_EINVAL, "storage: layout is NULL");
  uint64_t n = s->vt->num_regions(s), size = s->vt->region_size(s);
  if (n != l->num_regions)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "storage: %s storage has %llu regions, the layout %llu",
                          s->vt->name, (unsigned long long)n,
                          (unsigned long long)l->num_regions);
  if (size < l->region_size)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "storage: region size %llu is smaller than the layout's %llu",
                          (unsigned long long)size, (unsigned long long)l->region_size);
  return KVBM_OK;
}

int kvbm_storage_check_layout(const kvbm_storage *s, const kvbm_layout *l, kvbm_error *err) {
  int rc = kvbm__storage_check_layout_value(l, err);
  if (rc || (rc = check_fit(s, l, err))) return rc;
  for (uint64_t r = 0; r < l->num_regions; r++) {
    uintptr_t base = (uintptr_t)s->vt->region_base(s, r);
    if (base & (l->config.alignment - 1))
      return kvbm_error_set(err, KVBM_EINVAL,
                            "storage: region %llu is not aligned to the layout's %llu",
                            (unsigned long long)r, (unsigned long long)l->config.alignment);
  }
  return KVBM_OK;
}

static int slice_to_ptr(const kvbm_storage *s, const kvbm_slice *sl, void **ptr,
                        size_t *size, kvbm_error *err) {
  /* Redundant for a layout made by kvbm_layout_init() that passed
   * check_fit(); it keeps a hand-edited layout from yielding a pointer
   * outside the region, for the price of a compare. */
  uint64_t end;
  if (__builtin_add_overflow(sl->offset, sl->size, &end) || end > s->vt->region_size(s))
    return kvbm_error_set(err, KVBM_ERANGE,
                          "storage: slice at %llu + %llu is outside region %llu (%llu bytes)",
                          (unsigned long long)sl->offset, (unsigned long long)sl->size,
                          (unsigned long long)sl->region,
                          (unsigned long long)s->vt->region_size(s));
  char *base = s->vt->region_base(s, sl->region);
  if (!base)
    return kvbm_error_set(err, KVBM_EUNSUPPORTED, "storage: %s storage has no addresses",
                          s->vt->name);
  if (ptr) *ptr = base + sl->offset;
  if (size) *size = (size_t)sl->size;
  return KVBM_OK;
}

int kvbm_storage_slice_ptr(const kvbm_storage *s, const kvbm_layout *l, uint64_t block,
                           uint64_t layer, uint64_t outer, void **ptr, size_t *size,
                           kvbm_error *err) {
  kvbm_slice sl;
  int rc = check_fit(s, l, err);
  if (rc || (rc = kvbm_layout_slice(l, block, layer, outer, &sl, err))) return rc;
  return slice_to_ptr(s, &sl, ptr, size, err);
}

int kvbm_storage_block_layer_ptr(const kvbm_storage *s, const kvbm_layout *l,
                                 uint64_t block, uint64_t layer, void **ptr, size_t *size,
                                 kvbm_error *err) {
  kvbm_slice sl;
  int rc = check_fit(s, l, err);
  if (rc || (rc = kvbm_layout_block_layer(l, block, layer, &sl, err))) return rc;
  return slice_to_ptr(s, &sl, ptr, size, err);
}

int kvbm_storage_describe(const kvbm_storage *s, const kvbm_layout *l, uint64_t block_set_id,
                          kvbm_layout_desc *out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "storage: out is NULL");
  memset(out, 0, sizeof *out);
  int rc = kvbm_storage_check_layout(s, l, err);
  if (rc) return rc;
  uint64_t *bases = malloc(8 * (size_t)l->num_regions);
  if (!bases) return kvbm_error_set(err, KVBM_ENOMEM, "storage: cannot allocate region list");
  for (uint64_t r = 0; r < l->num_regions; r++)
    bases[r] = (uint64_t)(uintptr_t)s->vt->region_base(s, r);
  out->layout = *l;
  out->memory = s->vt->memory_type(s);
  out->device_id = s->vt->device_id(s);
  out->block_set_id = block_set_id;
  out->num_regions = l->num_regions;
  out->region_base = bases;
  return KVBM_OK;
}
