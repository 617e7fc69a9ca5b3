/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire.c: the envelope a node sends so that its peer can import a block set.
 *
 * The layout itself travels in the layout module's own serialized form
 * ("KVLY", layout.h), untouched, so there is one definition of a layout on
 * the wire. The envelope adds what only the fabric knows: for each region
 * the extent that was registered and the transport's access key (UCX: a
 * packed rkey; in-process: a registration id). Little-endian throughout:
 *
 *   0   4  magic "KVFS"
 *   4   4  version (1)
 *   8   4  region count (must equal the layout's)
 *   12  4  reserved, zero
 *   16  8  L = byte length of the serialized layout
 *   24  L  serialized layout
 *   then per region: u64 registered base, u64 registered length,
 *                    u32 key length K (<= 65536), u32 reserved zero, K bytes
 *   nothing after the last region.
 *
 * The decoder trusts nothing: every length is checked against the bytes
 * actually present before it is used, allocation happens only after the
 * region count matched a validated layout, and every layout region must lie
 * inside the extent registered for it (otherwise a peer could steer our
 * one-sided writes outside the memory it exposed: KVBM_ERANGE).
 */
#include <stdlib.h>
#include <string.h>

#include "fabric/fabric_impl.h"
#include "common/bytes.h"


int kvbm__fabric_wire_encode(const kvbm_layout_desc *desc,
                            const kvbm_fabric_wire_region *regions,
                            uint8_t **buf, size_t *len, kvbm_error *err) {
  size_t lay = kvbm_layout_desc_encoded_size(desc);
  if (lay == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: export: layout has too many regions");
  size_t total = KVBM_FABRIC_WIRE_HEADER + lay;
  for (uint64_t r = 0; r < desc->num_regions; r++) {
    if (regions[r].key_len > KVBM_FABRIC_KEY_MAX)
      return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: export: key of region %llu is %u bytes",
                            (unsigned long long)r, regions[r].key_len);
    total += KVBM_FABRIC_WIRE_REGION + regions[r].key_len;
  }
  uint8_t *b = calloc(1, total);
  if (!b) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: export: out of memory");
  memcpy(b, KVBM_FABRIC_WIRE_MAGIC, 4);
  kvbm__put_le32(b + 4, KVBM_FABRIC_WIRE_VERSION);
  kvbm__put_le32(b + 8, (uint32_t)desc->num_regions);
  kvbm__put_le64(b + 16, lay);
  size_t wrote = 0;
  int rc = kvbm_layout_desc_encode(desc, b + KVBM_FABRIC_WIRE_HEADER, lay, &wrote, err);
  if (rc) {
    free(b);
    return rc;
  }
  uint8_t *p = b + KVBM_FABRIC_WIRE_HEADER + lay;
  for (uint64_t r = 0; r < desc->num_regions; r++) {
    kvbm__put_le64(p, regions[r].base);
    kvbm__put_le64(p + 8, regions[r].len);
    kvbm__put_le32(p + 16, regions[r].key_len);
    if (regions[r].key_len) memcpy(p + KVBM_FABRIC_WIRE_REGION, regions[r].key, regions[r].key_len);
    p += KVBM_FABRIC_WIRE_REGION + regions[r].key_len;
  }
  *buf = b;
  *len = total;
  return KVBM_OK;
}

/* The layout's region r must lie inside the extent registered for it. */
static int check_extent(const kvbm_layout_desc *d, uint64_t r,
                        const kvbm_fabric_wire_region *w, kvbm_error *err) {
  uint64_t lo = d->region_base[r], size = d->layout.region_size;
  if (w->len > UINT64_MAX - w->base)
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: import: registered extent of region %llu passes 2^64",
                          (unsigned long long)r);
  if (lo < w->base || size > w->len || lo - w->base > w->len - size)
    return kvbm_error_set(err, KVBM_ERANGE,
                          "fabric: import: region %llu [0x%llx, +%llu) reaches outside its registered extent [0x%llx, +%llu)",
                          (unsigned long long)r, (unsigned long long)lo, (unsigned long long)size,
                          (unsigned long long)w->base, (unsigned long long)w->len);
  return KVBM_OK;
}

int kvbm__fabric_wire_decode(const uint8_t *buf, size_t len, kvbm_layout_desc *desc,
                            kvbm_fabric_wire_region **regions, kvbm_error *err) {
  memset(desc, 0, sizeof *desc);
  *regions = NULL;
  if (!buf || len < KVBM_FABRIC_WIRE_HEADER)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "fabric: import: %zu bytes, shorter than the %u-byte header",
                          buf ? len : 0, KVBM_FABRIC_WIRE_HEADER);
  if (memcmp(buf, KVBM_FABRIC_WIRE_MAGIC, 4) != 0)
    return kvbm_error_set(err, KVBM_EMAGIC, "fabric: import: wrong magic (not an exported block set)");
  if (kvbm__get_le32(buf + 4) != KVBM_FABRIC_WIRE_VERSION)
    return kvbm_error_set(err, KVBM_EVERSION, "fabric: import: unknown version %u", kvbm__get_le32(buf + 4));
  if (kvbm__get_le32(buf + 12) != 0)
    return kvbm_error_set(err, KVBM_EPADDING, "fabric: import: reserved header bytes are not zero");
  uint32_t nreg = kvbm__get_le32(buf + 8);
  uint64_t lay = kvbm__get_le64(buf + 16);
  if (lay > len - KVBM_FABRIC_WIRE_HEADER)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "fabric: import: layout of %llu bytes, only %zu present",
                          (unsigned long long)lay, len - KVBM_FABRIC_WIRE_HEADER);
  int rc = kvbm_layout_desc_decode(buf + KVBM_FABRIC_WIRE_HEADER, (size_t)lay, desc, err);
  if (rc) return rc;
  if (desc->num_regions != nreg) {
    kvbm_layout_desc_release(desc);
    return kvbm_error_set(err, KVBM_EFORMAT, "fabric: import: envelope says %u regions, layout has %llu",
                          nreg, (unsigned long long)desc->num_regions);
  }
  kvbm_fabric_wire_region *w = calloc(nreg ? nreg : 1, sizeof *w);
  if (!w) {
    kvbm_layout_desc_release(desc);
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: import: out of memory");
  }
  size_t off = KVBM_FABRIC_WIRE_HEADER + (size_t)lay;
  for (uint32_t r = 0; r < nreg && rc == KVBM_OK; r++) {
    if (len - off < KVBM_FABRIC_WIRE_REGION) {
      rc = kvbm_error_set(err, KVBM_ETRUNCATED, "fabric: import: region %u entry truncated", r);
      break;
    }
    w[r].base = kvbm__get_le64(buf + off);
    w[r].len = kvbm__get_le64(buf + off + 8);
    w[r].key_len = kvbm__get_le32(buf + off + 16);
    if (kvbm__get_le32(buf + off + 20) != 0) {
      rc = kvbm_error_set(err, KVBM_EPADDING, "fabric: import: reserved bytes of region %u not zero", r);
      break;
    }
    off += KVBM_FABRIC_WIRE_REGION;
    if (w[r].key_len > KVBM_FABRIC_KEY_MAX) {
      rc = kvbm_error_set(err, KVBM_EFORMAT, "fabric: import: key of region %u is %u bytes (limit %u)", r,
                          w[r].key_len, KVBM_FABRIC_KEY_MAX);
      break;
    }
    if (len - off < w[r].key_len) {
      rc = kvbm_error_set(err, KVBM_ETRUNCATED, "fabric: import: key of region %u truncated", r);
      break;
    }
    w[r].key = buf + off;
    off += w[r].key_len;
    rc = check_extent(desc, r, &w[r], err);
  }
  if (rc == KVBM_OK && off != len)
    rc = kvbm_error_set(err, KVBM_ETOOLONG, "fabric: import: %zu bytes after the last region", len - off);
  if (rc) {
    free(w);
    kvbm_layout_desc_release(desc);
    return rc;
  }
  *regions = w;
  return KVBM_OK;
}
