/* SPDX-License-Identifier: Apache-2.0 */
/*
 * layout.c: layout configs, strides and slice offsets.
 *
 * A layout is a value computed once from its config; every later question
 * (where is slice (b, l, o)?) is a few multiplications on numbers that were
 * proven not to overflow when the layout was made, so the hot path has no
 * overflow checks, only index bounds checks.
 *
 * Validation is kind-independent on purpose: a config is accepted only if
 * the sizes of BOTH kinds fit (FullyContiguous pads each block once,
 * LayerSeparate pads each layer of each block, so either can be the larger).
 * The same config therefore never flips between valid and invalid when a
 * peer or the disk tier switches kinds, and the codec can validate a config
 * before it has looked at the kind.
 *
 * Heads (kvbm_layout_heads): a layout may also say which KV heads of which
 * model its inner dimension holds, so that a reader of another TP size can
 * take exactly its heads out of a block. The descriptor is checked against
 * the config when attached (inner_dim = held heads * head_dim, dtype_size =
 * the dtype's size), so every layout carrying one is self-consistent and
 * the fabric can trust it. The head rule is vLLM's (QKVParallelLinear):
 * split when tp_size divides the heads, replicate when the heads divide
 * tp_size; nothing else is a deployment vLLM can run.
 */
#include "kvbm/layout.h"

#include <stdint.h>

static int mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* align_up for a power-of-two alignment, failing instead of wrapping. */
static int align_up_u64(uint64_t x, uint64_t align, uint64_t *out) {
  uint64_t y;
  if (__builtin_add_overflow(x, align - 1, &y)) return -1;
  *out = y & ~(align - 1);
  return 0;
}

static int compute(const kvbm_layout_config *c, kvbm_layout_kind kind,
                        kvbm_layout *out, kvbm_error *err) {
  if (!c) return kvbm_error_set(err, KVBM_EINVAL, "layout: config is NULL");
  const uint64_t dims[] = {c->num_blocks, c->num_layers, c->outer_dim,
                           c->page_size,  c->inner_dim,  c->dtype_size};
  static const char *const names[] = {"num_blocks", "num_layers", "outer_dim",
                                      "page_size",  "inner_dim",  "dtype_size"};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    if (dims[i] == 0)
      return kvbm_error_set(err, KVBM_EINVAL, "layout: %s is 0", names[i]);
  }
  if (c->num_layers > KVBM_LAYOUT_MAX_LAYERS)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "layout: num_layers %llu is above the maximum %u",
                          (unsigned long long)c->num_layers,
                          KVBM_LAYOUT_MAX_LAYERS);
  if (c->alignment == 0 || (c->alignment & (c->alignment - 1)) != 0)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "layout: alignment %llu is not a nonzero power of two",
                          (unsigned long long)c->alignment);

  uint64_t elems, slice, layer, fc_block_bytes, fc_block, ls_block, fc_region,
      ls_region, ls_total;
  if (mul_u64(c->page_size, c->inner_dim, &elems) ||
      mul_u64(elems, c->dtype_size, &slice))
    return kvbm_error_set(err, KVBM_EOVERFLOW,
                          "layout: page_size * inner_dim * dtype_size overflows");
  if (mul_u64(c->outer_dim, slice, &layer))
    return kvbm_error_set(err, KVBM_EOVERFLOW,
                          "layout: outer_dim * slice size overflows");
  if (mul_u64(c->num_layers, layer, &fc_block_bytes))
    return kvbm_error_set(err, KVBM_EOVERFLOW,
                          "layout: num_layers * layer size overflows");
  if (align_up_u64(fc_block_bytes, c->alignment, &fc_block) ||
      align_up_u64(layer, c->alignment, &ls_block))
    return kvbm_error_set(err, KVBM_EOVERFLOW,
                          "layout: block size aligned up to alignment %llu overflows",
                          (unsigned long long)c->alignment);
  if (mul_u64(c->num_blocks, fc_block, &fc_region) ||
      mul_u64(c->num_blocks, ls_block, &ls_region) ||
      mul_u64(ls_region, c->num_layers, &ls_total))
    return kvbm_error_set(err, KVBM_EOVERFLOW,
                          "layout: num_blocks * block stride overflows");
  if (fc_region > SIZE_MAX || ls_total > SIZE_MAX)
    return kvbm_error_set(err, KVBM_EOVERFLOW,
                          "layout: total size does not fit size_t");

  if (!out) return KVBM_OK;
  kvbm_layout l = {0}; /* no heads; and no stale bytes for memcmp users */
  l.kind = kind;
  l.config = *c;
  l.outer_stride = slice;
  l.layer_stride = layer;
  if (kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    l.block_stride = fc_block;
    l.region_size = fc_region;
    l.num_regions = 1;
  } else if (kind == KVBM_LAYOUT_LAYER_SEPARATE) {
    l.block_stride = ls_block;
    l.region_size = ls_region;
    l.num_regions = c->num_layers;
  } else {
    return kvbm_error_set(err, KVBM_EINVAL, "layout: unknown kind %d", (int)kind);
  }
  *out = l;
  return KVBM_OK;
}

kvbm_layout_config kvbm_layout_config_default(uint64_t num_blocks, uint64_t page_size) {
  return (kvbm_layout_config){.num_blocks = num_blocks, .num_layers = 1, .outer_dim = 2,
                              .page_size = page_size, .inner_dim = 1, .dtype_size = 2,
                              .alignment = 64};
}

int kvbm_layout_config_validate(const kvbm_layout_config *cfg, kvbm_error *err) {
  return compute(cfg, KVBM_LAYOUT_FULLY_CONTIGUOUS, NULL, err);
}

int kvbm_layout_init(kvbm_layout *out, kvbm_layout_kind kind,
                     const kvbm_layout_config *cfg, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "layout: out is NULL");
  if (kind != KVBM_LAYOUT_FULLY_CONTIGUOUS && kind != KVBM_LAYOUT_LAYER_SEPARATE)
    return kvbm_error_set(err, KVBM_EINVAL, "layout: unknown kind %d", (int)kind);
  return compute(cfg, kind, out, err);
}

uint64_t kvbm_layout_total_size(const kvbm_layout *layout) {
  /* Proven to fit by compute(). */
  return layout ? layout->region_size * layout->num_regions : 0;
}

static int check_index(const kvbm_layout *l, uint64_t block, uint64_t layer,
                       kvbm_error *err) {
  if (!l) return kvbm_error_set(err, KVBM_EINVAL, "layout: layout is NULL");
  if (block >= l->config.num_blocks)
    return kvbm_error_set(err, KVBM_ERANGE, "layout: block %llu out of range (num_blocks %llu)",
                          (unsigned long long)block,
                          (unsigned long long)l->config.num_blocks);
  if (layer >= l->config.num_layers)
    return kvbm_error_set(err, KVBM_ERANGE, "layout: layer %llu out of range (num_layers %llu)",
                          (unsigned long long)layer,
                          (unsigned long long)l->config.num_layers);
  return KVBM_OK;
}

int kvbm_layout_block_layer(const kvbm_layout *l, uint64_t block,
                            uint64_t layer, kvbm_slice *out, kvbm_error *err) {
  int rc = check_index(l, block, layer, err);
  if (rc) return rc;
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "layout: out is NULL");
  if (l->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    out->region = 0;
    out->offset = block * l->block_stride + layer * l->layer_stride;
  } else {
    out->region = layer;
    out->offset = block * l->block_stride;
  }
  out->size = l->layer_stride;
  return KVBM_OK;
}

int kvbm_layout_slice(const kvbm_layout *l, uint64_t block, uint64_t layer,
                      uint64_t outer, kvbm_slice *out, kvbm_error *err) {
  int rc = check_index(l, block, layer, err);
  if (rc) return rc;
  if (outer >= l->config.outer_dim)
    return kvbm_error_set(err, KVBM_ERANGE, "layout: outer %llu out of range (outer_dim %llu)",
                          (unsigned long long)outer,
                          (unsigned long long)l->config.outer_dim);
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "layout: out is NULL");
  rc = kvbm_layout_block_layer(l, block, layer, out, err);
  if (rc) return rc;
  out->offset += outer * l->outer_stride;
  out->size = l->outer_stride;
  return KVBM_OK;
}

int kvbm_layout_block(const kvbm_layout *l, uint64_t block, kvbm_slice *out,
                      kvbm_error *err) {
  int rc = check_index(l, block, 0, err);
  if (rc) return rc;
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "layout: out is NULL");
  if (l->kind != KVBM_LAYOUT_FULLY_CONTIGUOUS)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "layout: a %s block is not contiguous (use block_layer)",
                          kvbm_layout_kind_name(l->kind));
  out->region = 0;
  out->offset = block * l->block_stride;
  out->size = l->config.num_layers * l->layer_stride;
  return KVBM_OK;
}

/* FNV-1a: tiny, dependency-free and fixed forever, which is what a tag
 * stored on disk needs; the input is a few dozen bytes, so speed and
 * avalanche quality beyond FNV's do not matter here. */
uint64_t kvbm_layout_fingerprint(const kvbm_layout *l) {
  if (!l) return 0;
  const uint64_t v[8] = {(uint64_t)l->kind,        l->config.num_blocks,
                         l->config.num_layers,     l->config.outer_dim,
                         l->config.page_size,      l->config.inner_dim,
                         l->config.dtype_size,     l->config.alignment};
  uint64_t h = 0xcbf29ce484222325ull;
  const char *tag = "kvbmlay1";
  for (int i = 0; i < 8; i++) {
    h ^= (uint8_t)tag[i];
    h *= 0x100000001b3ull;
  }
  for (int i = 0; i < 8; i++) {
    for (int b = 0; b < 8; b++) {
      h ^= (uint8_t)(v[i] >> (8 * b));
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

uint32_t kvbm_layout_dtype_bytes(uint32_t dtype_id) {
  /* kvbm.vllm's _DTYPE_IDS, in id order from 1. */
  static const uint8_t bytes[] = {0, 4, 2, 2, 1, 1, 1, 1, 8};
  return dtype_id < sizeof bytes ? bytes[dtype_id] : 0;
}

int kvbm_layout_heads_validate(const kvbm_layout_heads *h, kvbm_error *err) {
  if (!h) return kvbm_error_set(err, KVBM_EINVAL, "layout heads: descriptor is NULL");
  if (h->model_fingerprint == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "layout heads: model_fingerprint is 0");
  if (kvbm_layout_dtype_bytes(h->dtype_id) == 0)
    return kvbm_error_set(err, KVBM_ERANGE, "layout heads: dtype_id %u is not one of 1..8",
                          (unsigned)h->dtype_id);
  const uint32_t v[] = {h->num_kv_heads, h->head_dim, h->tp_size};
  static const char *const names[] = {"num_kv_heads", "head_dim", "tp_size"};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    if (v[i] == 0) return kvbm_error_set(err, KVBM_EINVAL, "layout heads: %s is 0", names[i]);
  if (h->tp_rank >= h->tp_size)
    return kvbm_error_set(err, KVBM_ERANGE, "layout heads: tp_rank %u is not below tp_size %u",
                          (unsigned)h->tp_rank, (unsigned)h->tp_size);
  if (h->tp_size <= h->num_kv_heads ? h->num_kv_heads % h->tp_size : h->tp_size % h->num_kv_heads)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "layout heads: num_kv_heads %u and tp_size %u: neither divides the other "
                          "(vLLM splits or replicates heads, nothing else)",
                          (unsigned)h->num_kv_heads, (unsigned)h->tp_size);
  return KVBM_OK;
}

int kvbm_layout_heads_local(const kvbm_layout_heads *h, uint32_t *first, uint32_t *count,
                            kvbm_error *err) {
  int rc = kvbm_layout_heads_validate(h, err);
  if (rc) return rc;
  if (!first || !count) return kvbm_error_set(err, KVBM_EINVAL, "layout heads: NULL output");
  if (h->tp_size <= h->num_kv_heads) {
    uint32_t per = h->num_kv_heads / h->tp_size;
    *first = h->tp_rank * per;
    *count = per;
  } else { /* replicated: tp_size / num_kv_heads ranks share each head */
    *first = h->tp_rank / (h->tp_size / h->num_kv_heads);
    *count = 1;
  }
  return KVBM_OK;
}

int kvbm_layout_attach_heads(kvbm_layout *l, const kvbm_layout_heads *h, kvbm_error *err) {
  if (!l) return kvbm_error_set(err, KVBM_EINVAL, "layout heads: layout is NULL");
  if (!h) {
    l->has_heads = 0;
    l->heads = (kvbm_layout_heads){0};
    return KVBM_OK;
  }
  uint32_t first, count;
  int rc = kvbm_layout_heads_local(h, &first, &count, err);
  if (rc) return rc;
  uint64_t inner = (uint64_t)count * h->head_dim; /* u32 * u32: no overflow */
  if (inner != l->config.inner_dim)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "layout heads: inner_dim %llu is not held heads * head_dim = %u * %u "
                          "(rank %u of %u, %u KV heads)",
                          (unsigned long long)l->config.inner_dim, (unsigned)count,
                          (unsigned)h->head_dim, (unsigned)h->tp_rank, (unsigned)h->tp_size,
                          (unsigned)h->num_kv_heads);
  if (kvbm_layout_dtype_bytes(h->dtype_id) != l->config.dtype_size)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "layout heads: dtype_id %u is %u-byte, the layout's dtype_size is %llu",
                          (unsigned)h->dtype_id, (unsigned)kvbm_layout_dtype_bytes(h->dtype_id),
                          (unsigned long long)l->config.dtype_size);
  l->heads = *h;
  l->has_heads = 1;
  return KVBM_OK;
}

const char *kvbm_layout_kind_name(int kind) {
  switch (kind) {
    case KVBM_LAYOUT_FULLY_CONTIGUOUS: return "fully-contiguous";
    case KVBM_LAYOUT_LAYER_SEPARATE: return "layer-separate";
    default: return "?";
  }
}

const char *kvbm_memory_type_name(int memory) {
  switch (memory) {
    case KVBM_MEMORY_SYSTEM: return "system";
    case KVBM_MEMORY_PINNED: return "pinned";
    case KVBM_MEMORY_DEVICE: return "device";
    case KVBM_MEMORY_DISK: return "disk";
    case KVBM_MEMORY_REMOTE: return "remote";
    default: return "?";
  }
}
