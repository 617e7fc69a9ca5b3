/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fstorage.c: storage (kvbm/storage.h) whose regions the fabric allocates.
 *
 * Why: UCX moves a one-sided write fastest into memory it allocated itself
 * (ucp_mem_map with ALLOCATE): on one host the peer maps such a segment
 * and the write is a memcpy, while a write into memory that came from
 * malloc goes through a bounce protocol several times slower; on RDMA the
 * allocation is registered once. So a node that receives blocks over a
 * fabric keeps them in this storage. It implements the storage vtable
 * (only the header's types are used, so the fabric module does not link
 * the storage module) and frees through the fabric, which must therefore
 * outlive it.
 */
#include <stdlib.h>
#include <string.h>

#include "fabric/fabric_impl.h"

typedef struct fabric_storage {
  kvbm_storage base;
  kvbm_fabric *fabric;
  uint64_t num_regions, region_size;
  void **addr;
  void **alloc;
} fabric_storage;

static const fabric_storage *FS(const kvbm_storage *s) { return (const fabric_storage *)s; }

static kvbm_memory_type fs_memory_type(const kvbm_storage *s) {
  (void)s;
  return KVBM_MEMORY_SYSTEM;
}
static int32_t fs_device_id(const kvbm_storage *s) {
  (void)s;
  return -1;
}
static uint64_t fs_num_regions(const kvbm_storage *s) { return FS(s)->num_regions; }
static uint64_t fs_region_size(const kvbm_storage *s) { return FS(s)->region_size; }
static void *fs_region_base(const kvbm_storage *s, uint64_t r) {
  return r < FS(s)->num_regions ? FS(s)->addr[r] : NULL;
}

static void fs_release(kvbm_storage *s) {
  fabric_storage *fs = (fabric_storage *)s;
  for (uint64_t r = 0; r < fs->num_regions; r++)
    if (fs->alloc && fs->alloc[r]) fs->fabric->vt->mem_free(fs->fabric, fs->alloc[r]);
  free(fs->addr);
  free(fs->alloc);
  free(fs);
}

static const kvbm_storage_vtable fs_vtable = {
    .name = "fabric",
    .memory_type = fs_memory_type,
    .device_id = fs_device_id,
    .num_regions = fs_num_regions,
    .region_size = fs_region_size,
    .region_base = fs_region_base,
    .release = fs_release,
};

int kvbm_fabric_storage_create(kvbm_fabric *f, const kvbm_layout *layout, kvbm_storage **out, kvbm_error *err) {
  if (!f || !layout || !out) return kvbm_error_set(err, KVBM_EINVAL, "fabric: storage: NULL argument");
  int rc = kvbm__fabric_check(f, err);
  if (rc) return rc;
  if (layout->config.alignment > 4096)
    return kvbm_error_set(err, KVBM_EUNSUPPORTED, "fabric: storage: alignment %llu above the page size",
                          (unsigned long long)layout->config.alignment);
  if (layout->num_regions == 0 || layout->region_size == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: storage: empty layout");
  fabric_storage *fs = calloc(1, sizeof *fs);
  if (!fs) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: storage: out of memory");
  fs->base.vt = &fs_vtable;
  fs->fabric = f;
  fs->region_size = layout->region_size;
  fs->addr = calloc(layout->num_regions, sizeof *fs->addr);
  fs->alloc = calloc(layout->num_regions, sizeof *fs->alloc);
  if (!fs->addr || !fs->alloc) {
    fs_release(&fs->base);
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: storage: out of memory");
  }
  for (uint64_t r = 0; r < layout->num_regions; r++) {
    rc = f->vt->mem_alloc(f, layout->region_size, &fs->addr[r], &fs->alloc[r], err);
    if (rc) {
      fs_release(&fs->base);
      return rc;
    }
    fs->num_regions = r + 1;
    memset(fs->addr[r], 0, layout->region_size);
  }
  *out = &fs->base;
  return KVBM_OK;
}
