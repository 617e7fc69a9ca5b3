/* SPDX-License-Identifier: Apache-2.0 */
/* storage_internal.h: constructors of the storage kinds this module owns,
 * dispatched by kvbm_storage_create(). `opts` is never NULL here and its
 * alignment is already resolved (a power of two >= the layout's). */
#ifndef KVBM_STORAGE_INTERNAL_H
#define KVBM_STORAGE_INTERNAL_H

#include "kvbm/storage.h"

int kvbm__system_storage_create(const kvbm_layout *layout,
                               const kvbm_storage_config *opts,
                               kvbm_storage **out, kvbm_error *err);
int kvbm__pinned_storage_create(const kvbm_layout *layout,
                               const kvbm_storage_config *opts,
                               kvbm_storage **out, kvbm_error *err);
int kvbm__device_storage_create(const kvbm_layout *layout,
                               const kvbm_storage_config *opts,
                               kvbm_storage **out, kvbm_error *err);
int kvbm__storage_cuda_compiled(void);

/* KVBM_OK if `l` is non-NULL and its derived fields are what
 * kvbm_layout_init() makes of its config (storage.c); KVBM_EINVAL else. */
int kvbm__storage_check_layout_value(const kvbm_layout *l, kvbm_error *err);

/* Whether `s` was made by kvbm_storage_adopt() (adopt.c). */
int kvbm__storage_is_adopted(const kvbm_storage *s);

/* The shape shared by system, pinned and device storage: an array of
 * separately allocated regions. Each kind supplies its vtable (with its own
 * release) and uses the accessors below for the rest. */
typedef struct kvbm_region_storage {
  kvbm_storage base;
  kvbm_memory_type memory;
  int32_t device_id;
  uint64_t num_regions;
  uint64_t region_size;
  void *region[]; /* num_regions entries, NULL until allocated */
} kvbm_region_storage;

/* calloc'ed with num_regions NULL regions; NULL on allocation failure. */
kvbm_region_storage *kvbm__region_storage_create(const kvbm_storage_vtable *vt,
                                             kvbm_memory_type memory,
                                             int32_t device_id,
                                             uint64_t num_regions,
                                             uint64_t region_size);
kvbm_memory_type kvbm__region_storage_memory_type(const kvbm_storage *s);
int32_t kvbm__region_storage_device_id(const kvbm_storage *s);
uint64_t kvbm__region_storage_num_regions(const kvbm_storage *s);
uint64_t kvbm__region_storage_region_size(const kvbm_storage *s);
void *kvbm__region_storage_region_base(const kvbm_storage *s, uint64_t r);

#endif
