/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/layout.h: where each piece of a KV block lives, and the serialized
 * form a node sends to its peers.
 *
 * A block holds, for every layer, `outer_dim` slices (2: K and V; 1: MLA) of
 * `page_size * inner_dim` elements of `dtype_size` bytes. A layout maps
 * (block, layer, outer) to (region, byte offset, size). Two kinds:
 *
 *   FullyContiguous  one region; block b starts at b * block_stride and holds
 *                    [num_layers][outer_dim][page_size * inner_dim] elements.
 *   LayerSeparate    num_layers regions; in region l, block b starts at
 *                    b * block_stride and holds [outer_dim][page_size *
 *                    inner_dim] elements (block-major inside the layer).
 *
 * Strides (bytes), the same formulas for both kinds:
 *   outer_stride = page_size * inner_dim * dtype_size   (one slice)
 *   layer_stride = outer_dim * outer_stride             (one layer of a block)
 *   block_stride = align_up(num_layers * layer_stride, alignment)  FullyContiguous
 *                = align_up(layer_stride, alignment)               LayerSeparate
 *   region_size  = num_blocks * block_stride
 * Every block start is a multiple of `alignment` from its region's base, and
 * storage allocates regions aligned to at least `alignment`, so block starts
 * are aligned in memory. Slices inside a block are packed, not padded.
 *
 * A kvbm_layout is a plain value: no allocation, copy it freely. Fill it with
 * kvbm_layout_init(), then treat its fields as read-only.
 *
 * Optionally a layout says which KV heads of which model its inner_dim holds
 * (kvbm_layout_heads, attached with kvbm_layout_attach_heads()), so that a
 * reader of another tensor-parallel size can take exactly its heads out of
 * a block (kvbm_fabric_layout_bridge_heads, fabric.h). It travels in the
 * serialized form (version 2) and changes no stride or fingerprint.
 */
#ifndef KVBM_LAYOUT_H
#define KVBM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most layers (so, regions) a layout may have. Bounds the memory a
 * deserializer may allocate for region addresses. */
#define KVBM_LAYOUT_MAX_LAYERS 65536u

typedef enum kvbm_layout_kind {
  KVBM_LAYOUT_FULLY_CONTIGUOUS = 1,
  KVBM_LAYOUT_LAYER_SEPARATE = 2,
} kvbm_layout_kind;

/* Where a layout's bytes live (carried in the serialized form so that a peer
 * knows what it is importing). */
typedef enum kvbm_memory_type {
  KVBM_MEMORY_SYSTEM = 1, /* host heap */
  KVBM_MEMORY_PINNED = 2, /* page-locked host memory (CUDA) */
  KVBM_MEMORY_DEVICE = 3, /* GPU memory (CUDA); device_id is the ordinal */
  KVBM_MEMORY_DISK = 4,   /* a file; region addresses are file offsets */
  KVBM_MEMORY_REMOTE = 5, /* another node's memory */
} kvbm_memory_type;

/* All counts and sizes are u64 so the serialized form and the arithmetic
 * have one width everywhere; sizes are checked for u64 and size_t overflow. */
typedef struct kvbm_layout_config {
  uint64_t num_blocks;
  uint64_t num_layers; /* 1 .. KVBM_LAYOUT_MAX_LAYERS */
  uint64_t outer_dim;  /* 2 for K and V, 1 for MLA */
  uint64_t page_size;  /* tokens per block */
  uint64_t inner_dim;  /* elements per token per (layer, outer): heads * head_dim */
  uint64_t dtype_size; /* bytes per element */
  uint64_t alignment;  /* block alignment in bytes, a power of two */
} kvbm_layout_config;

/* Which KV heads a layout holds, for blocks that travel between
 * deployments of different tensor-parallel sizes (TP-portable blocks; the
 * same descriptor as kvbm.vllm's KvLayout, docs/areas/engines.md).
 *
 * Under TP each rank holds a slice of the model's num_kv_heads KV heads,
 * by vLLM's rule (QKVParallelLinear, vllm/model_executor/layers/linear.py):
 *   tp_size <= num_kv_heads: tp_size divides num_kv_heads; rank r holds
 *     the num_kv_heads / tp_size heads starting at r * num_kv_heads / tp_size;
 *   tp_size >  num_kv_heads: the heads are replicated; num_kv_heads divides
 *     tp_size, every rank holds 1 head, head r / (tp_size / num_kv_heads).
 * The layout's inner_dim is then (heads held) * head_dim: per token, the
 * held heads one after the other, head_dim elements each (vLLM's
 * [..., num_kv_heads, head_size] with the token-major layout above). */
typedef struct kvbm_layout_heads {
  uint64_t model_fingerprint; /* the model (nonzero); kvbm.vllm: BLAKE3-64 of
                                 its model_fingerprint string */
  uint32_t dtype_id;          /* element type, kvbm.vllm's ids: 1 float32,
                                 2 float16, 3 bfloat16, 4 float8_e4m3fn,
                                 5 float8_e5m2, 6 int8, 7 uint8, 8 float64 */
  uint32_t num_kv_heads;      /* the model's KV heads, all ranks together */
  uint32_t head_dim;          /* elements per head */
  uint32_t tp_rank;           /* 0 .. tp_size-1 */
  uint32_t tp_size;           /* >= 1 */
} kvbm_layout_heads;

typedef struct kvbm_layout {
  kvbm_layout_kind kind;
  kvbm_layout_config config;
  uint64_t outer_stride; /* bytes of one (block, layer, outer) slice */
  uint64_t layer_stride; /* bytes of one layer of one block */
  uint64_t block_stride; /* distance between block starts in a region */
  uint64_t region_size;  /* bytes of each region (all the same size) */
  uint64_t num_regions;  /* 1, or num_layers for LayerSeparate */
  int has_heads;         /* 0 (kvbm_layout_init) or 1: `heads` is set, by
                            kvbm_layout_attach_heads() only */
  kvbm_layout_heads heads;
} kvbm_layout;

/* A contiguous byte range of a layout: `size` bytes at `offset` in region
 * `region`. */
typedef struct kvbm_slice {
  uint64_t region;
  uint64_t offset;
  uint64_t size;
} kvbm_slice;

/* Checks a config: every dimension nonzero, num_layers at most
 * KVBM_LAYOUT_MAX_LAYERS, alignment a nonzero power of two, and no size
 * (strides, region size, total bytes over all regions of either kind)
 * overflows u64 or size_t. Returns KVBM_OK, KVBM_EINVAL or KVBM_EOVERFLOW;
 * the message names the field. */
KVBM_EXTERN int kvbm_layout_config_validate(const kvbm_layout_config *cfg, kvbm_error *err);

/* A config for `num_blocks` blocks of `page_size` tokens: 1 layer, K and V
 * (outer_dim 2), 1 element per token, 2-byte elements, 64-byte alignment.
 * Set the model's num_layers, inner_dim and dtype_size before use. */
KVBM_EXTERN kvbm_layout_config kvbm_layout_config_default(uint64_t num_blocks,
                                                          uint64_t page_size);

/* Validates `cfg` and fills `*out` (strides, region count and size) for
 * `kind`. `*out` is untouched on failure. Unknown kind: KVBM_EINVAL. */
KVBM_EXTERN int kvbm_layout_init(kvbm_layout *out, kvbm_layout_kind kind,
                     const kvbm_layout_config *cfg, kvbm_error *err);

/* Sum of all region sizes (fits u64 and size_t for a valid layout). */
KVBM_EXTERN uint64_t kvbm_layout_total_size(const kvbm_layout *layout);

/* The slice (block, layer, outer): region, offset and size (outer_stride).
 * Index out of range: KVBM_ERANGE (message names the index). */
KVBM_EXTERN int kvbm_layout_slice(const kvbm_layout *layout, uint64_t block,
                      uint64_t layer, uint64_t outer, kvbm_slice *out,
                      kvbm_error *err);

/* All outer slices of one layer of one block, which are contiguous in both
 * kinds: size layer_stride. Out of range: KVBM_ERANGE. */
KVBM_EXTERN int kvbm_layout_block_layer(const kvbm_layout *layout, uint64_t block,
                            uint64_t layer, kvbm_slice *out, kvbm_error *err);

/* A whole block as one range (FullyContiguous only; size num_layers *
 * layer_stride, the padding up to block_stride excluded). LayerSeparate:
 * KVBM_EINVAL (a block spans num_layers regions; use block_layer). Out of
 * range: KVBM_ERANGE. */
KVBM_EXTERN int kvbm_layout_block(const kvbm_layout *layout, uint64_t block,
                      kvbm_slice *out, kvbm_error *err);

/* A stable 64-bit tag of kind + config (not of addresses): FNV-1a 64 over
 * "kvbmlay1" and the 8 u64 values kind, num_blocks, num_layers, outer_dim,
 * page_size, inner_dim, dtype_size, alignment, each little-endian. Equal
 * layouts give equal tags on every machine and version; the disk tier uses it
 * to tag slots written under one layout. */
KVBM_EXTERN uint64_t kvbm_layout_fingerprint(const kvbm_layout *layout);

/* Checks a heads descriptor on its own: every field nonzero (tp_rank may be
 * 0), dtype_id known, tp_rank below tp_size, and tp_size dividing
 * num_kv_heads or (replication) num_kv_heads dividing tp_size. KVBM_EINVAL
 * (KVBM_ERANGE for tp_rank, dtype_id) naming the field. */
KVBM_EXTERN int kvbm_layout_heads_validate(const kvbm_layout_heads *h, kvbm_error *err);

/* The heads rank h->tp_rank holds: [*first, *first + *count). A valid h
 * only (else KVBM_EINVAL, outputs untouched). */
KVBM_EXTERN int kvbm_layout_heads_local(const kvbm_layout_heads *h, uint32_t *first,
                                        uint32_t *count, kvbm_error *err);

/* Bytes of one element of dtype_id (4, 2, 2, 1, 1, 1, 1, 8), 0 if unknown. */
KVBM_EXTERN uint32_t kvbm_layout_dtype_bytes(uint32_t dtype_id);

/* Attaches `h` to `layout` (a copy) after checking it (as
 * kvbm_layout_heads_validate) and that it describes this layout: inner_dim
 * == held heads * head_dim, dtype_size == the dtype's size (KVBM_EINVAL
 * naming the field and both values). h NULL: detaches. The layout is
 * untouched on failure. Strides, sizes and kvbm_layout_fingerprint() do
 * not change: the descriptor says what the bytes mean, not where they are. */
KVBM_EXTERN int kvbm_layout_attach_heads(kvbm_layout *layout, const kvbm_layout_heads *h,
                                         kvbm_error *err);

/* ---- Serialized layout (for peers: the fabric's remote import) ---- */

/* A layout bound to memory somewhere: what a node tells a peer so that the
 * peer can address its blocks by id. */
typedef struct kvbm_layout_desc {
  kvbm_layout layout;
  kvbm_memory_type memory;
  int32_t device_id;     /* -1 = none; DEVICE memory needs one (>= 0) */
  uint64_t block_set_id; /* the owner's name for this set of blocks */
  uint64_t num_regions;  /* == layout.num_regions */
  uint64_t *region_base; /* num_regions addresses, each aligned to
                            layout.config.alignment; base + region_size
                            must stay below 2^64 */
} kvbm_layout_desc;

/* Magic and version of the serialized form (see docs/areas/layout-storage.md
 * for the byte layout). A layout without heads is written as version 1,
 * byte for byte what older kvbm writes and reads; one with heads
 * (layout.has_heads) as version 2: the same bytes plus a
 * KVBM_LAYOUT_WIRE_HEADS_TRAILER-byte trailer after the region addresses.
 * The decoder reads both. */
#define KVBM_LAYOUT_WIRE_MAGIC "KVLY"
#define KVBM_LAYOUT_WIRE_VERSION 1u
#define KVBM_LAYOUT_WIRE_VERSION_HEADS 2u
#define KVBM_LAYOUT_WIRE_HEADER 128u
#define KVBM_LAYOUT_WIRE_HEADS_MAGIC "KVHD"
#define KVBM_LAYOUT_WIRE_HEADS_TRAILER 40u

/* Bytes kvbm_layout_desc_encode() writes for `desc`
 * (KVBM_LAYOUT_WIRE_HEADER + 8 * num_regions, plus
 * KVBM_LAYOUT_WIRE_HEADS_TRAILER with heads), or 0 if num_regions is above
 * KVBM_LAYOUT_MAX_LAYERS. */
KVBM_EXTERN size_t kvbm_layout_desc_encoded_size(const kvbm_layout_desc *desc);

/* Checks `desc` as the decoder would, then writes it to buf[0..cap). On
 * success *out_len (may be NULL) is the byte count. cap too small:
 * KVBM_ENOSPC, nothing useful written. An inconsistent desc gets the same
 * error the decoder would give. No allocation. */
KVBM_EXTERN int kvbm_layout_desc_encode(const kvbm_layout_desc *desc, uint8_t *buf,
                            size_t cap, size_t *out_len, kvbm_error *err);

/* Parses and validates buf[0..len). Distinct errors:
 *   KVBM_EMAGIC      wrong magic
 *   KVBM_EVERSION    unknown version (1 and 2 are known)
 *   KVBM_EPADDING    reserved bytes not zero (header or heads trailer)
 *   KVBM_EMAGIC      version 2 whose trailer is not "KVHD"
 *   KVBM_EINVAL / KVBM_ERANGE  a heads trailer that
 *                    kvbm_layout_attach_heads() refuses (names the field)
 *   KVBM_ETRUNCATED  shorter than the header or than its regions
 *   KVBM_ETOOLONG    bytes after the last region
 *   KVBM_ERANGE      out-of-range value: unknown kind or memory type,
 *                    device id below -1, region count above
 *                    KVBM_LAYOUT_MAX_LAYERS, a region passing 2^64
 *   KVBM_EINVAL      config rejected by kvbm_layout_config_validate()
 *   KVBM_EOVERFLOW   config whose sizes overflow
 *   KVBM_EFORMAT     inconsistent: strides, region size or region count not
 *                    those of the config and kind; a base not aligned; a
 *                    DEVICE layout without a device id
 * On success fills *out and allocates out->region_base (only after the
 * count is checked against the config and the input length); the caller
 * frees it with kvbm_layout_desc_release(). On failure *out holds no
 * allocation (region_base NULL). KVBM_ENOMEM if the allocation fails. */
KVBM_EXTERN int kvbm_layout_desc_decode(const uint8_t *buf, size_t len,
                            kvbm_layout_desc *out, kvbm_error *err);

/* Frees desc->region_base (from decode or kvbm_storage_describe) and sets it
 * to NULL, num_regions to 0. NULL or already released: no-op. */
KVBM_EXTERN void kvbm_layout_desc_release(kvbm_layout_desc *desc);

/* Names for messages and the CLI ("fully-contiguous", "system"; "?" if
 * unknown). */
KVBM_EXTERN const char *kvbm_layout_kind_name(int kind);
KVBM_EXTERN const char *kvbm_memory_type_name(int memory);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_LAYOUT_H */
