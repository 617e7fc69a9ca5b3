/* SPDX-License-Identifier: Apache-2.0 */
/*
 * layout_codec.c: the serialized layout (versions 1 and 2), bytes <-> kvbm_layout_desc.
 *
 * The codec only turns bytes into a checked description and back; it knows
 * nothing of storage or transports (the storage module fills a desc from real
 * memory, the fabric sends the bytes).
 *
 * Wire form, every integer little-endian, fixed 128-byte header then one u64
 * per region:
 *
 *   off  size  field
 *     0     4  magic "KVLY"
 *     4     2  version (1)
 *     6     2  reserved, 0
 *     8     4  kind (1 fully-contiguous, 2 layer-separate)
 *    12     4  memory type (1 system .. 5 remote)
 *    16     4  device id (i32, -1 = none)
 *    20     4  reserved, 0
 *    24     8  block set id
 *    32  7x 8  num_blocks, num_layers, outer_dim, page_size, inner_dim,
 *              dtype_size, alignment
 *    88  5x 8  outer_stride, layer_stride, block_stride, region_size,
 *              num_regions
 *   128  n x 8 region base addresses
 *
 * Version 2 is version 1 plus the layout's heads descriptor (which KV heads
 * of which model the inner dimension holds, kvbm_layout_heads), as a 40-byte
 * trailer after the region addresses:
 *
 *     0     4  magic "KVHD"
 *     4     4  dtype id
 *     8     8  model fingerprint
 *    16  4x 4  num_kv_heads, head_dim, tp_rank, tp_size
 *    32     8  reserved, 0
 *
 * A layout without heads is still written as version 1, so that a peer of
 * an older kvbm reads every layout it could read before; only layouts that
 * carry heads (which an older peer could not bridge anyway) are version 2,
 * which such a peer refuses as an unknown version rather than misreading.
 * The trailer goes last, not into the header's reserved bytes, so that the
 * 128-byte header and its offsets stay as they are.
 *
 * Strides and region count are redundant (they follow from config + kind).
 * They are sent anyway so that a peer computing them differently (a bug, or
 * a future layout kind) is caught as "inconsistent" instead of silently
 * addressing the wrong bytes. Fields are fixed-width rather than varint:
 * the header is small, sent once per connection, and fixed offsets make the
 * truncation rules simple (shorter than 128 bytes is always truncated).
 *
 * Checks run cheapest and most fundamental first (magic, version, length of
 * the header, padding, enum ranges, config, consistency, total length) so
 * that each malformed input gets the one error that explains it, and the only
 * allocation (the region array) happens after its count equals the count the
 * validated config implies AND the input holds exactly that many entries.
 */
#include <stdlib.h>
#include <string.h>

#include "kvbm/layout.h"
#include "common/bytes.h"

#define HDR KVBM_LAYOUT_WIRE_HEADER


/* Everything in the header except the region addresses: ranges, config,
 * and that the redundant fields agree with the config. */
static int check_header(const kvbm_layout_desc *d, kvbm_error *err) {
  const kvbm_layout *l = &d->layout;
  if (l->kind != KVBM_LAYOUT_FULLY_CONTIGUOUS && l->kind != KVBM_LAYOUT_LAYER_SEPARATE)
    return kvbm_error_set(err, KVBM_ERANGE, "layout desc: unknown layout kind %u",
                          (unsigned)l->kind);
  if (d->memory < KVBM_MEMORY_SYSTEM || d->memory > KVBM_MEMORY_REMOTE)
    return kvbm_error_set(err, KVBM_ERANGE, "layout desc: unknown memory type %u",
                          (unsigned)d->memory);
  if (d->device_id < -1)
    return kvbm_error_set(err, KVBM_ERANGE, "layout desc: device id %d is below -1",
                          (int)d->device_id);
  if (d->num_regions > KVBM_LAYOUT_MAX_LAYERS)
    return kvbm_error_set(err, KVBM_ERANGE,
                          "layout desc: num_regions %llu is above the maximum %u",
                          (unsigned long long)d->num_regions, KVBM_LAYOUT_MAX_LAYERS);

  kvbm_layout want;
  int rc = kvbm_layout_init(&want, l->kind, &l->config, err);
  if (rc) return rc;
  static const struct {
    const char *name;
    size_t off;
  } derived[] = {
      {"outer_stride", offsetof(kvbm_layout, outer_stride)},
      {"layer_stride", offsetof(kvbm_layout, layer_stride)},
      {"block_stride", offsetof(kvbm_layout, block_stride)},
      {"region_size", offsetof(kvbm_layout, region_size)},
      {"num_regions", offsetof(kvbm_layout, num_regions)},
  };
  for (size_t i = 0; i < sizeof derived / sizeof derived[0]; i++) {
    uint64_t got, exp;
    memcpy(&got, (const char *)l + derived[i].off, sizeof got);
    memcpy(&exp, (const char *)&want + derived[i].off, sizeof exp);
    if (got != exp)
      return kvbm_error_set(err, KVBM_EFORMAT,
                            "layout desc: %s %llu does not match the config (%s wants %llu)",
                            derived[i].name, (unsigned long long)got,
                            kvbm_layout_kind_name(l->kind), (unsigned long long)exp);
  }
  if (d->num_regions != want.num_regions)
    return kvbm_error_set(err, KVBM_EFORMAT,
                          "layout desc: %llu region addresses for a %s layout of %llu regions",
                          (unsigned long long)d->num_regions,
                          kvbm_layout_kind_name(l->kind),
                          (unsigned long long)want.num_regions);
  if (d->memory == KVBM_MEMORY_DEVICE && d->device_id < 0)
    return kvbm_error_set(err, KVBM_EFORMAT, "layout desc: device memory without a device id");
  if (l->has_heads != 0 && l->has_heads != 1)
    return kvbm_error_set(err, KVBM_EINVAL, "layout desc: has_heads %d is neither 0 nor 1", l->has_heads);
  /* The heads must describe this layout: attach them to the checked copy. */
  if (l->has_heads) return kvbm_layout_attach_heads(&want, &l->heads, err);
  return KVBM_OK;
}

#define TRAILER KVBM_LAYOUT_WIRE_HEADS_TRAILER

static void put_heads(uint8_t *p, const kvbm_layout_heads *h) {
  memset(p, 0, TRAILER);
  memcpy(p, KVBM_LAYOUT_WIRE_HEADS_MAGIC, 4);
  kvbm__put_le32(p + 4, h->dtype_id);
  kvbm__put_le64(p + 8, h->model_fingerprint);
  kvbm__put_le32(p + 16, h->num_kv_heads);
  kvbm__put_le32(p + 20, h->head_dim);
  kvbm__put_le32(p + 24, h->tp_rank);
  kvbm__put_le32(p + 28, h->tp_size);
}

/* The trailer's own form (magic, reserved bytes); its values are judged by
 * check_header like an encoder's. */
static int get_heads(const uint8_t *p, kvbm_layout_heads *h, kvbm_error *err) {
  if (memcmp(p, KVBM_LAYOUT_WIRE_HEADS_MAGIC, 4) != 0)
    return kvbm_error_set(err, KVBM_EMAGIC, "layout desc: version 2 trailer is not \"KVHD\"");
  if (kvbm__get_le64(p + 32) != 0)
    return kvbm_error_set(err, KVBM_EPADDING, "layout desc: reserved heads trailer bytes are not zero");
  h->dtype_id = kvbm__get_le32(p + 4);
  h->model_fingerprint = kvbm__get_le64(p + 8);
  h->num_kv_heads = kvbm__get_le32(p + 16);
  h->head_dim = kvbm__get_le32(p + 20);
  h->tp_rank = kvbm__get_le32(p + 24);
  h->tp_size = kvbm__get_le32(p + 28);
  return KVBM_OK;
}

static int check_base(const kvbm_layout_desc *d, uint64_t r, uint64_t base,
                      kvbm_error *err) {
  if (base & (d->layout.config.alignment - 1))
    return kvbm_error_set(err, KVBM_EFORMAT,
                          "layout desc: region %llu base 0x%llx is not aligned to %llu",
                          (unsigned long long)r, (unsigned long long)base,
                          (unsigned long long)d->layout.config.alignment);
  uint64_t end;
  if (__builtin_add_overflow(base, d->layout.region_size, &end))
    return kvbm_error_set(err, KVBM_ERANGE,
                          "layout desc: region %llu at 0x%llx + %llu bytes passes 2^64",
                          (unsigned long long)r, (unsigned long long)base,
                          (unsigned long long)d->layout.region_size);
  return KVBM_OK;
}

size_t kvbm_layout_desc_encoded_size(const kvbm_layout_desc *d) {
  if (!d || d->num_regions > KVBM_LAYOUT_MAX_LAYERS) return 0;
  return HDR + 8 * (size_t)d->num_regions + (d->layout.has_heads ? TRAILER : 0);
}

int kvbm_layout_desc_encode(const kvbm_layout_desc *d, uint8_t *buf, size_t cap,
                            size_t *out_len, kvbm_error *err) {
  if (!d) return kvbm_error_set(err, KVBM_EINVAL, "layout desc: desc is NULL");
  int rc = check_header(d, err);
  if (rc) return rc;
  if (d->num_regions && !d->region_base)
    return kvbm_error_set(err, KVBM_EINVAL, "layout desc: region_base is NULL");
  for (uint64_t r = 0; r < d->num_regions; r++)
    if ((rc = check_base(d, r, d->region_base[r], err))) return rc;
  size_t need = kvbm_layout_desc_encoded_size(d);
  if (!buf || cap < need)
    return kvbm_error_set(err, KVBM_ENOSPC, "layout desc: needs %zu bytes, buffer has %zu",
                          need, buf ? cap : (size_t)0);

  const kvbm_layout *l = &d->layout;
  memset(buf, 0, HDR);
  memcpy(buf, KVBM_LAYOUT_WIRE_MAGIC, 4);
  kvbm__put_le16(buf + 4, l->has_heads ? KVBM_LAYOUT_WIRE_VERSION_HEADS : KVBM_LAYOUT_WIRE_VERSION);
  kvbm__put_le32(buf + 8, (uint32_t)l->kind);
  kvbm__put_le32(buf + 12, (uint32_t)d->memory);
  kvbm__put_le32(buf + 16, (uint32_t)d->device_id);
  kvbm__put_le64(buf + 24, d->block_set_id);
  const uint64_t f[] = {l->config.num_blocks, l->config.num_layers, l->config.outer_dim,
                        l->config.page_size,  l->config.inner_dim,  l->config.dtype_size,
                        l->config.alignment,  l->outer_stride,      l->layer_stride,
                        l->block_stride,      l->region_size,       d->num_regions};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) kvbm__put_le64(buf + 32 + 8 * i, f[i]);
  for (uint64_t r = 0; r < d->num_regions; r++) kvbm__put_le64(buf + HDR + 8 * r, d->region_base[r]);
  if (l->has_heads) put_heads(buf + HDR + 8 * (size_t)d->num_regions, &l->heads);
  if (out_len) *out_len = need;
  return KVBM_OK;
}

int kvbm_layout_desc_decode(const uint8_t *buf, size_t len, kvbm_layout_desc *out,
                            kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "layout desc: out is NULL");
  memset(out, 0, sizeof *out);
  if (!buf && len) return kvbm_error_set(err, KVBM_EINVAL, "layout desc: buffer is NULL");

  /* A prefix of the magic is a truncated message, not a wrong one. */
  if (memcmp(buf ? (const void *)buf : "", KVBM_LAYOUT_WIRE_MAGIC, len < 4 ? len : 4) != 0)
    return kvbm_error_set(err, KVBM_EMAGIC, "layout desc: wrong magic (not \"KVLY\")");
  if (len < 6)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "layout desc: %zu bytes, shorter than the header",
                          len);
  uint16_t version = kvbm__get_le16(buf + 4);
  if (version != KVBM_LAYOUT_WIRE_VERSION && version != KVBM_LAYOUT_WIRE_VERSION_HEADS)
    return kvbm_error_set(err, KVBM_EVERSION, "layout desc: unknown version %u (want %u or %u)",
                          (unsigned)version, KVBM_LAYOUT_WIRE_VERSION, KVBM_LAYOUT_WIRE_VERSION_HEADS);
  const size_t trailer = version == KVBM_LAYOUT_WIRE_VERSION_HEADS ? TRAILER : 0;
  if (len < HDR)
    return kvbm_error_set(err, KVBM_ETRUNCATED,
                          "layout desc: %zu bytes, shorter than the %u-byte header", len, HDR);
  if (kvbm__get_le16(buf + 6) != 0 || kvbm__get_le32(buf + 20) != 0)
    return kvbm_error_set(err, KVBM_EPADDING, "layout desc: reserved header bytes are not zero");

  kvbm_layout_desc d;
  memset(&d, 0, sizeof d);
  uint32_t kind = kvbm__get_le32(buf + 8), memory = kvbm__get_le32(buf + 12);
  /* Range-check before storing into the enum-typed fields, so that no
   * out-of-range value is ever held in an enum. */
  if (kind != KVBM_LAYOUT_FULLY_CONTIGUOUS && kind != KVBM_LAYOUT_LAYER_SEPARATE)
    return kvbm_error_set(err, KVBM_ERANGE, "layout desc: unknown layout kind %u", kind);
  if (memory < KVBM_MEMORY_SYSTEM || memory > KVBM_MEMORY_REMOTE)
    return kvbm_error_set(err, KVBM_ERANGE, "layout desc: unknown memory type %u", memory);
  d.layout.kind = (kvbm_layout_kind)kind;
  d.memory = (kvbm_memory_type)memory;
  d.device_id = (int32_t)kvbm__get_le32(buf + 16);
  d.block_set_id = kvbm__get_le64(buf + 24);
  uint64_t *const f[] = {&d.layout.config.num_blocks, &d.layout.config.num_layers,
                         &d.layout.config.outer_dim,  &d.layout.config.page_size,
                         &d.layout.config.inner_dim,  &d.layout.config.dtype_size,
                         &d.layout.config.alignment,  &d.layout.outer_stride,
                         &d.layout.layer_stride,      &d.layout.block_stride,
                         &d.layout.region_size,       &d.num_regions};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) *f[i] = kvbm__get_le64(buf + 32 + 8 * i);
  d.layout.num_regions = d.num_regions;

  /* Header alone first (heads unknown yet), so that a bad config or region
   * count gets its own error before lengths that depend on it are read. */
  int rc = check_header(&d, err);
  if (rc) return rc;
  /* num_regions <= KVBM_LAYOUT_MAX_LAYERS here, so this cannot overflow. */
  size_t need = HDR + 8 * (size_t)d.num_regions + trailer;
  if (len < need)
    return kvbm_error_set(err, KVBM_ETRUNCATED,
                          "layout desc: %zu bytes, the %llu region addresses%s need %zu", len,
                          (unsigned long long)d.num_regions, trailer ? " and the heads trailer" : "",
                          need);
  if (len > need)
    return kvbm_error_set(err, KVBM_ETOOLONG, "layout desc: %zu bytes after the end (%zu)",
                          len - need, need);
  if (trailer) {
    if ((rc = get_heads(buf + HDR + 8 * (size_t)d.num_regions, &d.layout.heads, err))) return rc;
    d.layout.has_heads = 1;
    if ((rc = check_header(&d, err))) return rc;
  }
  for (uint64_t r = 0; r < d.num_regions; r++)
    if ((rc = check_base(&d, r, kvbm__get_le64(buf + HDR + 8 * r), err))) return rc;

  d.region_base = malloc(8 * (size_t)d.num_regions);
  if (!d.region_base)
    return kvbm_error_set(err, KVBM_ENOMEM, "layout desc: cannot allocate %llu region addresses",
                          (unsigned long long)d.num_regions);
  for (uint64_t r = 0; r < d.num_regions; r++) d.region_base[r] = kvbm__get_le64(buf + HDR + 8 * r);
  *out = d;
  return KVBM_OK;
}

void kvbm_layout_desc_release(kvbm_layout_desc *d) {
  if (!d) return;
  free(d->region_base);
  d->region_base = NULL;
  d->num_regions = 0;
}
