/* SPDX-License-Identifier: Apache-2.0 */
/* fabric_util.h: layouts and memory for the fabric tests. */
#ifndef KVBM_TESTS_FABRIC_UTIL_H
#define KVBM_TESTS_FABRIC_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/fabric.h"
#include "kvbm/layout.h"

/* A layout plus system memory for it, described as a kvbm_layout_desc. */
typedef struct test_set {
  kvbm_layout_desc desc;
  void *region[8];
  kvbm_storage *storage; /* set: regions belong to it (fabric storage) */
} test_set;

static inline int test_set_make(test_set *ts, kvbm_layout_kind kind, uint64_t blocks, uint64_t layers,
                                uint64_t block_set_id) {
  memset(ts, 0, sizeof *ts);
  kvbm_layout_config c = {.num_blocks = blocks, .num_layers = layers, .outer_dim = 2, .page_size = 4,
                          .inner_dim = 8, .dtype_size = 2, .alignment = 64};
  int rc = kvbm_layout_init(&ts->desc.layout, kind, &c, NULL);
  if (rc) return rc;
  if (ts->desc.layout.num_regions > 8) return KVBM_EINVAL;
  ts->desc.memory = KVBM_MEMORY_SYSTEM;
  ts->desc.device_id = -1;
  ts->desc.block_set_id = block_set_id;
  ts->desc.num_regions = ts->desc.layout.num_regions;
  ts->desc.region_base = calloc(ts->desc.num_regions, sizeof(uint64_t));
  for (uint64_t r = 0; r < ts->desc.num_regions; r++) {
    if (posix_memalign(&ts->region[r], 64, ts->desc.layout.region_size)) return KVBM_ENOMEM;
    memset(ts->region[r], 0, ts->desc.layout.region_size);
    ts->desc.region_base[r] = (uint64_t)(uintptr_t)ts->region[r];
  }
  return KVBM_OK;
}

/* Same, with the regions in storage allocated by fabric f. */
static inline int test_set_make_fabric(test_set *ts, kvbm_fabric *f, kvbm_layout_kind kind, uint64_t blocks,
                                       uint64_t layers, uint64_t block_set_id) {
  memset(ts, 0, sizeof *ts);
  kvbm_layout_config c = {.num_blocks = blocks, .num_layers = layers, .outer_dim = 2, .page_size = 4,
                          .inner_dim = 8, .dtype_size = 2, .alignment = 64};
  int rc = kvbm_layout_init(&ts->desc.layout, kind, &c, NULL);
  if (rc) return rc;
  rc = kvbm_fabric_storage_create(f, &ts->desc.layout, &ts->storage, NULL);
  if (rc) return rc;
  ts->desc.memory = KVBM_MEMORY_SYSTEM;
  ts->desc.device_id = -1;
  ts->desc.block_set_id = block_set_id;
  ts->desc.num_regions = ts->desc.layout.num_regions;
  ts->desc.region_base = calloc(ts->desc.num_regions, sizeof(uint64_t));
  for (uint64_t r = 0; r < ts->desc.num_regions; r++) {
    ts->region[r] = ts->storage->vt->region_base(ts->storage, r);
    ts->desc.region_base[r] = (uint64_t)(uintptr_t)ts->region[r];
  }
  return KVBM_OK;
}

static inline void test_set_free(test_set *ts) {
  if (ts->storage)
    ts->storage->vt->release(ts->storage);
  else
    for (uint64_t r = 0; r < ts->desc.num_regions; r++) free(ts->region[r]);
  free(ts->desc.region_base);
  memset(ts, 0, sizeof *ts);
}

/* Deterministic bytes for (seed, i). */
static inline void test_pattern(void *buf, size_t len, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  unsigned char *p = buf;
  for (size_t i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (unsigned char)x;
  }
}

/* Copies block b of a set's memory into out (block bytes, [layer][...]). */
static inline void test_set_block(const test_set *ts, uint64_t b, void *out) {
  const kvbm_layout *l = &ts->desc.layout;
  uint64_t nl = l->config.num_layers;
  for (uint64_t layer = 0; layer < nl; layer++) {
    kvbm_slice s;
    kvbm_layout_block_layer(l, b, layer, &s, NULL);
    memcpy((char *)out + layer * l->layer_stride, (char *)ts->region[s.region] + s.offset, s.size);
  }
}

#endif
