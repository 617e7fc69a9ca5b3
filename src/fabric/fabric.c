/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fabric.c: the transport-independent half of every fabric.
 *
 * The public kvbm_fabric_*() calls land here: arguments are checked, the
 * sticky fatal error is honoured, handle ids are assigned, and block set
 * accesses are turned into (region, offset, length) ranges and checked
 * against the peer's registered extents before the implementation (vtable)
 * sees them. Keeping every range check in one place is the point: an
 * out-of-bounds one-sided write is the worst bug a fabric can have, since
 * over shared memory (CMA) or RDMA nothing below us would stop it.
 *
 * TP bridging lives here too, for the same reason: a reader of another TP
 * size takes its KV heads out of each token's row of a writer rank's block
 * (kvbm_fabric_read_block_heads), a strided access that becomes one checked
 * generic read per row piece, so every fabric (in-process, UCX, CUDA IPC)
 * gets it without code of its own, and every piece passes remote_range()
 * before the first byte moves.
 *
 * A checked transfer's receiving half too (kvbm_fabric_read_blocks_hashed):
 * where the transport maps the peer's memory here, the blocks are copied
 * out of the mapping by a BLAKE3 pool, each piece hashed by the thread that
 * just copied it, while in its cache; one pass over the bytes instead of a
 * read and then a hash, and the copy shared by every thread. Else a read,
 * a flush and the hash.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/fabric_impl.h"
#include "fabric/map.h"

void kvbm__fabric_base_init(kvbm_fabric *f, const kvbm_fabric_vtable *vt, const char *name) {
  f->vt = vt;
  snprintf(f->name, sizeof f->name, "%s", name);
  f->peer_name[0] = '\0';
  f->next_push_id = 1;
  f->fatal = 0;
  f->fatal_msg[0] = '\0';
  f->local_sets = NULL;
  atomic_init(&f->pushes, 0);
  atomic_init(&f->push_bytes, 0);
  atomic_init(&f->pulls, 0);
  atomic_init(&f->pull_bytes, 0);
  atomic_init(&f->writes, 0);
  atomic_init(&f->write_bytes, 0);
  atomic_init(&f->reads, 0);
  atomic_init(&f->read_bytes, 0);
  atomic_init(&f->failures, 0);
}

/* One thread writes an end's counters: a relaxed load and store is enough. */
static void count(_Atomic uint64_t *c, uint64_t by) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + by,
                        memory_order_relaxed);
}

/* A transport failure (not a refusal of the arguments, a timeout or a
 * buffer too small): the connection or the peer went wrong. */
static void count_failure(kvbm_fabric *f, int rc) {
  if (rc == KVBM_EIO || rc == KVBM_ECLOSED) count(&f->failures, 1);
}

void kvbm_fabric_stats_get(const kvbm_fabric *f, kvbm_fabric_stats *out) {
  if (!out) return;
  *out = (kvbm_fabric_stats){0};
  if (!f) return;
  kvbm_fabric *m = (kvbm_fabric *)f; /* atomic loads of a const object */
#define R(x) atomic_load_explicit(&m->x, memory_order_relaxed)
  *out = (kvbm_fabric_stats){.pushes = R(pushes), .push_bytes = R(push_bytes), .pulls = R(pulls),
                             .pull_bytes = R(pull_bytes), .writes = R(writes),
                             .write_bytes = R(write_bytes), .reads = R(reads),
                             .read_bytes = R(read_bytes), .failures = R(failures)};
#undef R
}

int kvbm__fabric_set_fatal(kvbm_fabric *f, kvbm_error *err, int code, const char *fmt, ...) {
  if (!f->fatal) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->fatal_msg, sizeof f->fatal_msg, fmt, ap);
    va_end(ap);
    f->fatal = code;
  }
  return kvbm_error_set(err, f->fatal, "%s", f->fatal_msg);
}

int kvbm__fabric_check(const kvbm_fabric *f, kvbm_error *err) {
  if (!f->fatal) return KVBM_OK;
  return kvbm_error_set(err, f->fatal, "%s", f->fatal_msg);
}

int kvbm__fabric_name_check(const char *name, kvbm_error *err) {
  if (!name) return KVBM_OK;
  size_t n = strlen(name);
  if (n == 0 || n > KVBM_FABRIC_NAME_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: a node name must be 1..%d bytes, not %zu",
                          KVBM_FABRIC_NAME_MAX, n);
  for (size_t i = 0; i < n; i++)
    if (!isprint((unsigned char)name[i]) || (unsigned char)name[i] > 126)
      return kvbm_error_set(err, KVBM_EINVAL, "fabric: the node name has a non-printable byte at %zu", i);
  return KVBM_OK;
}

#define NEED(f) \
  if (!(f)) return kvbm_error_set(err, KVBM_EINVAL, "fabric: %s: NULL fabric", __func__)

void kvbm_fabric_destroy(kvbm_fabric *f) {
  if (f) f->vt->destroy(f);
}

const char *kvbm_fabric_kind(const kvbm_fabric *f) { return f ? f->vt->kind : "?"; }
const char *kvbm_fabric_label(const kvbm_fabric *f) { return f ? f->vt->label : ""; }
const char *kvbm_fabric_name(const kvbm_fabric *f) { return f ? f->name : ""; }
const char *kvbm_fabric_peer_name(const kvbm_fabric *f) { return f ? f->peer_name : ""; }

int kvbm_fabric_push(kvbm_fabric *f, const void *data, size_t len, kvbm_fabric_handle *out,
                     kvbm_error *err) {
  NEED(f);
  if (!data && len) return kvbm_error_set(err, KVBM_EINVAL, "fabric: push: NULL data of %zu bytes", len);
  int rc = kvbm__fabric_check(f, err);
  if (rc) return rc;
  uint64_t id = f->next_push_id;
  rc = f->vt->push(f, data, len, id, err);
  if (rc) {
    count_failure(f, rc);
    return rc;
  }
  count(&f->pushes, 1);
  count(&f->push_bytes, len);
  f->next_push_id++;
  if (out) out->id = id;
  return KVBM_OK;
}

int kvbm_fabric_next(kvbm_fabric *f, int timeout_ms, kvbm_fabric_handle *h, size_t *len,
                     kvbm_error *err) {
  NEED(f);
  if (!h) return kvbm_error_set(err, KVBM_EINVAL, "fabric: next: NULL handle");
  return f->vt->next(f, timeout_ms, h, len, err);
}

int kvbm_fabric_pull(kvbm_fabric *f, kvbm_fabric_handle h, void *buf, size_t cap, size_t *len,
                     int timeout_ms, kvbm_error *err) {
  NEED(f);
  if (!buf && cap) return kvbm_error_set(err, KVBM_EINVAL, "fabric: pull: NULL buffer of %zu bytes", cap);
  if (h.id == 0) return kvbm_error_set(err, KVBM_ENOTFOUND, "fabric: pull: handle 0 names no payload");
  size_t n = len ? *len : 0; /* what the transport leaves unwritten stays as it was */
  int rc = f->vt->pull(f, h, buf, cap, &n, timeout_ms, err);
  if (len) *len = n;
  if (rc) {
    count_failure(f, rc);
    return rc;
  }
  count(&f->pulls, 1);
  count(&f->pull_bytes, n);
  return KVBM_OK;
}

int kvbm_fabric_flush(kvbm_fabric *f, int timeout_ms, kvbm_error *err) {
  NEED(f);
  return f->vt->flush(f, timeout_ms, err);
}

/* ---- Block sets ---- */

static int memory_reachable(const kvbm_fabric *f, kvbm_memory_type m, const char *what, kvbm_error *err) {
  if (f->vt->device_memory ? m == KVBM_MEMORY_DEVICE : (m == KVBM_MEMORY_SYSTEM || m == KVBM_MEMORY_PINNED))
    return KVBM_OK;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "fabric: %s: %s memory is not reachable by the %s fabric (it "
                        "reaches %s memory)", what, kvbm_memory_type_name(m), f->vt->kind,
                        f->vt->device_memory ? "device" : "system and pinned");
}

static void local_set_free(kvbm_fabric_local_set *ls) {
  if (ls->regions) {
    for (uint64_t r = 0; r < ls->desc.num_regions; r++) {
      if (ls->regions[r].reg) ls->fabric->vt->mem_deregister(ls->fabric, ls->regions[r].reg);
      free(ls->regions[r].key);
    }
  }
  free(ls->regions);
  kvbm_layout_desc_release(&ls->desc);
  free(ls);
}

int kvbm_fabric_register(kvbm_fabric *f, const kvbm_layout_desc *desc, kvbm_fabric_local_set **out,
                         kvbm_error *err) {
  NEED(f);
  if (!desc || !out) return kvbm_error_set(err, KVBM_EINVAL, "fabric: register: NULL argument");
  int rc = kvbm__fabric_check(f, err);
  if (rc) return rc;
  rc = memory_reachable(f, desc->memory, "register", err);
  if (rc) return rc;
  if (desc->num_regions != desc->layout.num_regions || desc->num_regions == 0 || !desc->region_base)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: register: desc has %llu regions, its layout %llu",
                          (unsigned long long)desc->num_regions,
                          (unsigned long long)desc->layout.num_regions);
  /* Let the layout codec judge the desc once, so that what we export is
   * what the peer will accept. */
  size_t need = kvbm_layout_desc_encoded_size(desc);
  uint8_t *tmp = need ? malloc(need) : NULL;
  if (!tmp) return kvbm_error_set(err, need ? KVBM_ENOMEM : KVBM_EINVAL, "fabric: register: bad desc");
  rc = kvbm_layout_desc_encode(desc, tmp, need, NULL, err);
  free(tmp);
  if (rc) return rc;
  for (uint64_t r = 0; r < desc->num_regions; r++)
    if (desc->region_base[r] == 0)
      return kvbm_error_set(err, KVBM_EINVAL, "fabric: register: region %llu has no address",
                            (unsigned long long)r);

  kvbm_fabric_local_set *ls = calloc(1, sizeof *ls);
  if (!ls) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: register: out of memory");
  ls->fabric = f;
  ls->desc = *desc;
  ls->desc.region_base = malloc(desc->num_regions * sizeof(uint64_t));
  ls->regions = calloc(desc->num_regions, sizeof *ls->regions);
  if (!ls->desc.region_base || !ls->regions) {
    local_set_free(ls);
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: register: out of memory");
  }
  memcpy(ls->desc.region_base, desc->region_base, desc->num_regions * sizeof(uint64_t));
  for (uint64_t r = 0; r < desc->num_regions; r++) {
    kvbm_fabric_local_region *lr = &ls->regions[r];
    lr->base = desc->region_base[r];
    lr->len = desc->layout.region_size;
    rc = f->vt->mem_register(f, (void *)(uintptr_t)lr->base, lr->len, &lr->reg, &lr->key, &lr->key_len, err);
    if (rc) {
      local_set_free(ls);
      return rc;
    }
  }
  ls->next = f->local_sets;
  f->local_sets = ls;
  *out = ls;
  return KVBM_OK;
}

int kvbm_fabric_export(const kvbm_fabric_local_set *ls, uint8_t **buf, size_t *len, kvbm_error *err) {
  if (!ls || !buf || !len) return kvbm_error_set(err, KVBM_EINVAL, "fabric: export: NULL argument");
  uint64_t n = ls->desc.num_regions;
  kvbm_fabric_wire_region *w = calloc(n, sizeof *w);
  if (!w) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: export: out of memory");
  for (uint64_t r = 0; r < n; r++) {
    w[r].base = ls->regions[r].base;
    w[r].len = ls->regions[r].len;
    w[r].key = ls->regions[r].key;
    w[r].key_len = (uint32_t)ls->regions[r].key_len;
  }
  int rc = kvbm__fabric_wire_encode(&ls->desc, w, buf, len, err);
  free(w);
  return rc;
}

void kvbm_fabric_local_set_release(kvbm_fabric_local_set *ls) {
  if (!ls) return;
  kvbm_fabric_local_set **pp = &ls->fabric->local_sets;
  while (*pp && *pp != ls) pp = &(*pp)->next;
  if (*pp) *pp = ls->next;
  local_set_free(ls);
}

uint64_t kvbm_fabric_block_bytes(const kvbm_layout *layout) {
  return layout ? layout->config.num_layers * layout->layer_stride : 0;
}

static void remote_set_free(kvbm_fabric_remote_set *rs) {
  if (rs->regions)
    for (uint64_t r = 0; r < rs->desc.num_regions; r++)
      if (rs->regions[r].rkey) rs->fabric->vt->key_detach(rs->fabric, rs->regions[r].rkey);
  free(rs->regions);
  kvbm_layout_desc_release(&rs->desc);
  free(rs);
}

int kvbm_fabric_import(kvbm_fabric *f, const uint8_t *buf, size_t len, kvbm_fabric_remote_set **out,
                       kvbm_error *err) {
  NEED(f);
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "fabric: import: NULL out");
  int rc = kvbm__fabric_check(f, err);
  if (rc) return rc;
  kvbm_fabric_remote_set *rs = calloc(1, sizeof *rs);
  if (!rs) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: import: out of memory");
  rs->fabric = f;
  kvbm_fabric_wire_region *w = NULL;
  rc = kvbm__fabric_wire_decode(buf, len, &rs->desc, &w, err);
  if (rc) {
    free(rs);
    return rc;
  }
  rc = memory_reachable(f, rs->desc.memory, "import", err);
  if (rc == KVBM_OK) {
    rs->regions = calloc(rs->desc.num_regions, sizeof *rs->regions);
    if (!rs->regions) rc = kvbm_error_set(err, KVBM_ENOMEM, "fabric: import: out of memory");
  }
  for (uint64_t r = 0; rc == KVBM_OK && r < rs->desc.num_regions; r++) {
    rs->regions[r].base = w[r].base;
    rs->regions[r].len = w[r].len;
    rc = f->vt->key_attach(f, w[r].base, w[r].len, w[r].key, w[r].key_len, &rs->regions[r].rkey, err);
  }
  free(w);
  if (rc) {
    remote_set_free(rs);
    return rc;
  }
  rs->block_bytes = kvbm_fabric_block_bytes(&rs->desc.layout);
  *out = rs;
  return KVBM_OK;
}

const kvbm_layout_desc *kvbm_fabric_remote_desc(const kvbm_fabric_remote_set *rs) {
  return rs ? &rs->desc : NULL;
}

void kvbm_fabric_remote_set_release(kvbm_fabric_remote_set *rs) {
  if (rs) remote_set_free(rs);
}

/* The peer's address of [offset, offset+len) in `region`, or KVBM_ERANGE if
 * any byte of it falls outside the layout's region or its registered
 * extent. */
static int remote_range(const kvbm_fabric_remote_set *rs, uint64_t region, uint64_t offset, uint64_t len,
                        uint64_t *addr, kvbm_error *err) {
  if (region >= rs->desc.num_regions)
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: region %llu out of range (set has %llu)",
                          (unsigned long long)region, (unsigned long long)rs->desc.num_regions);
  uint64_t size = rs->desc.layout.region_size;
  if (offset > size || len > size - offset)
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: [%llu, +%llu) outside region %llu of %llu bytes",
                          (unsigned long long)offset, (unsigned long long)len,
                          (unsigned long long)region, (unsigned long long)size);
  const kvbm_fabric_remote_region *rr = &rs->regions[region];
  uint64_t a = rs->desc.region_base[region] + offset; /* no wrap: decoder checked base + size */
  if (a < rr->base || a - rr->base > rr->len || len > rr->len - (a - rr->base))
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: [0x%llx, +%llu) outside the registered extent of region %llu",
                          (unsigned long long)a, (unsigned long long)len, (unsigned long long)region);
  *addr = a;
  return KVBM_OK;
}

/* The local registration (if any) that covers [p, p+len): lets UCX skip
 * registering the buffer again. */
static void *local_reg(const kvbm_fabric *f, const void *p, size_t len) {
  uintptr_t a = (uintptr_t)p;
  for (const kvbm_fabric_local_set *ls = f->local_sets; ls; ls = ls->next)
    for (uint64_t r = 0; r < ls->desc.num_regions; r++) {
      const kvbm_fabric_local_region *lr = &ls->regions[r];
      if (a >= lr->base && a - lr->base <= lr->len && len <= lr->len - (a - lr->base)) return lr->reg;
    }
  return NULL;
}

static int rma(kvbm_fabric *f, kvbm_fabric_remote_set *rs, bool write, uint64_t region, uint64_t offset,
               void *local, size_t len, kvbm_error *err) {
  NEED(f);
  if (!rs) return kvbm_error_set(err, KVBM_EINVAL, "fabric: NULL remote set");
  if (rs->fabric != f) return kvbm_error_set(err, KVBM_EINVAL, "fabric: remote set imported on another fabric");
  if (!local && len) return kvbm_error_set(err, KVBM_EINVAL, "fabric: NULL local buffer");
  int rc = kvbm__fabric_check(f, err);
  if (rc) return rc;
  uint64_t addr;
  rc = remote_range(rs, region, offset, len, &addr, err);
  if (rc || len == 0) return rc;
  rc = f->vt->rma(f, write, rs->regions[region].rkey, addr, local, len, local_reg(f, local, len), err);
  if (rc) {
    count_failure(f, rc);
    return rc;
  }
  count(write ? &f->writes : &f->reads, 1);
  count(write ? &f->write_bytes : &f->read_bytes, len);
  return KVBM_OK;
}

int kvbm_fabric_write(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t region, uint64_t offset,
                      const void *src, size_t len, kvbm_error *err) {
  return rma(f, rs, true, region, offset, (void *)(uintptr_t)src, len, err);
}

int kvbm_fabric_read(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t region, uint64_t offset, void *dst,
                     size_t len, kvbm_error *err) {
  return rma(f, rs, false, region, offset, dst, len, err);
}

/* One whole block: one range for FullyContiguous, one per layer for
 * LayerSeparate. Every range is checked before the first byte moves. */
static int block_rma(kvbm_fabric *f, kvbm_fabric_remote_set *rs, bool write, uint64_t block, void *local,
                     size_t len, kvbm_error *err) {
  NEED(f);
  if (!rs) return kvbm_error_set(err, KVBM_EINVAL, "fabric: NULL remote set");
  const kvbm_layout *lay = &rs->desc.layout;
  if (block >= lay->config.num_blocks)
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: block %llu out of range (set has %llu blocks)",
                          (unsigned long long)block, (unsigned long long)lay->config.num_blocks);
  if (len != rs->block_bytes)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: block buffer of %zu bytes, a block is %llu",
                          len, (unsigned long long)rs->block_bytes);
  if (!local) return kvbm_error_set(err, KVBM_EINVAL, "fabric: NULL block buffer");
  uint64_t nl = lay->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS ? 1 : lay->config.num_layers;
  uint64_t piece = len / nl;
  for (int pass = 0; pass < 2; pass++) {
    for (uint64_t l = 0; l < nl; l++) {
      kvbm_slice s;
      int rc = nl == 1 ? kvbm_layout_block(lay, block, &s, err) : kvbm_layout_block_layer(lay, block, l, &s, err);
      if (rc) return rc;
      if (pass == 0) {
        uint64_t addr;
        rc = remote_range(rs, s.region, s.offset, s.size, &addr, err);
      } else {
        rc = rma(f, rs, write, s.region, s.offset, (char *)local + l * piece, s.size, err);
      }
      if (rc) return rc;
    }
  }
  return KVBM_OK;
}

/* The bridge: per layer, from wherever the local layout keeps it to the
 * peer's (block, layer) slice, all ranges checked first. */
static int layers_rma(kvbm_fabric *f, kvbm_fabric_remote_set *rs, bool write, uint64_t block,
                      void *const *layers, uint64_t num_layers, uint64_t layer_bytes, kvbm_error *err) {
  NEED(f);
  if (!rs || !layers) return kvbm_error_set(err, KVBM_EINVAL, "fabric: NULL remote set or layers");
  const kvbm_layout *lay = &rs->desc.layout;
  if (block >= lay->config.num_blocks)
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: block %llu out of range (set has %llu blocks)",
                          (unsigned long long)block, (unsigned long long)lay->config.num_blocks);
  if (num_layers != lay->config.num_layers || layer_bytes != lay->layer_stride)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "fabric: %llu layers of %llu bytes given, the peer's blocks have %llu of %llu",
                          (unsigned long long)num_layers, (unsigned long long)layer_bytes,
                          (unsigned long long)lay->config.num_layers, (unsigned long long)lay->layer_stride);
  for (int pass = 0; pass < 2; pass++) {
    for (uint64_t l = 0; l < num_layers; l++) {
      kvbm_slice s;
      int rc = kvbm_layout_block_layer(lay, block, l, &s, err);
      if (rc) return rc;
      if (pass == 0) {
        uint64_t addr;
        if (!layers[l]) return kvbm_error_set(err, KVBM_EINVAL, "fabric: layer %llu is NULL", (unsigned long long)l);
        rc = remote_range(rs, s.region, s.offset, s.size, &addr, err);
      } else {
        rc = rma(f, rs, write, s.region, s.offset, layers[l], s.size, err);
      }
      if (rc) return rc;
    }
  }
  return KVBM_OK;
}

int kvbm_fabric_write_block_layers(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block,
                                   const void *const *layers, uint64_t num_layers, uint64_t layer_bytes,
                                   kvbm_error *err) {
  return layers_rma(f, rs, true, block, (void *const *)(uintptr_t)layers, num_layers, layer_bytes, err);
}

int kvbm_fabric_read_block_layers(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block,
                                  void *const *layers, uint64_t num_layers, uint64_t layer_bytes,
                                  kvbm_error *err) {
  return layers_rma(f, rs, false, block, layers, num_layers, layer_bytes, err);
}

int kvbm_fabric_export_layout(const uint8_t *buf, size_t len, kvbm_layout *out, kvbm_error *err) {
  if (!buf || !out) return kvbm_error_set(err, KVBM_EINVAL, "fabric: NULL export or layout");
  kvbm_layout_desc d;
  kvbm_fabric_wire_region *regions = NULL;
  int rc = kvbm__fabric_wire_decode(buf, len, &d, &regions, err);
  if (rc) return rc;
  *out = d.layout;
  kvbm_layout_desc_release(&d);
  free(regions);
  return KVBM_OK;
}

/* The block's shape: what every bridge needs to agree. */
static int shape_agrees(const kvbm_layout *ours, const kvbm_layout *theirs, const char *how, kvbm_error *err) {
  const kvbm_layout_config *a = &ours->config, *b = &theirs->config;
  const struct {
    const char *name;
    uint64_t here, there;
  } fields[] = {
      {"num_layers", a->num_layers, b->num_layers}, {"outer_dim", a->outer_dim, b->outer_dim},
      {"page_size", a->page_size, b->page_size},    {"inner_dim", a->inner_dim, b->inner_dim},
      {"dtype_size", a->dtype_size, b->dtype_size},
  };
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    /* Bridged by head, the row width follows from the heads held. */
    if (how && strcmp(fields[i].name, "inner_dim") == 0) continue;
    if (fields[i].here != fields[i].there)
      return kvbm_error_set(err, KVBM_EUNSUPPORTED, "layout mismatch: %s %llu here, %llu at the peer (%s)",
                            fields[i].name, (unsigned long long)fields[i].here, (unsigned long long)fields[i].there,
                            how ? how : "kind, alignment and block count may differ; the block's shape may not");
  }
  return KVBM_OK;
}

/* The model half of two heads descriptors (not which heads each holds). */
static int model_agrees(const kvbm_layout_heads *a, const kvbm_layout_heads *b, kvbm_error *err) {
  const struct {
    const char *name;
    uint64_t here, there;
  } fields[] = {
      {"model_fingerprint", a->model_fingerprint, b->model_fingerprint},
      {"dtype_id", a->dtype_id, b->dtype_id},
      {"num_kv_heads", a->num_kv_heads, b->num_kv_heads},
      {"head_dim", a->head_dim, b->head_dim},
  };
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (fields[i].here != fields[i].there)
      return kvbm_error_set(err, KVBM_EUNSUPPORTED, "layout mismatch: %s %#llx here, %#llx at the peer",
                            fields[i].name, (unsigned long long)fields[i].here,
                            (unsigned long long)fields[i].there);
  return KVBM_OK;
}

int kvbm_fabric_layout_bridge(const kvbm_layout *ours, const kvbm_layout *theirs, kvbm_error *err) {
  if (!ours || !theirs) return kvbm_error_set(err, KVBM_EINVAL, "fabric: NULL layout");
  int rc = shape_agrees(ours, theirs, NULL, err);
  if (rc || !ours->has_heads || !theirs->has_heads) return rc;
  const kvbm_layout_heads *a = &ours->heads, *b = &theirs->heads;
  if ((rc = model_agrees(a, b, err))) return rc;
  /* Same row width is not the same heads: rank 0 and rank 1 of one TP size
   * have equal layouts and hold different heads. */
  uint32_t fa = 0, na = 0, fb = 0, nb = 0;
  if ((rc = kvbm_layout_heads_local(a, &fa, &na, err)) || (rc = kvbm_layout_heads_local(b, &fb, &nb, err)))
    return rc;
  if (a->tp_size != b->tp_size && (fa != fb || na != nb))
    return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                          "layout mismatch: tp_size %u here, %u at the peer (a layer copy cannot bridge it; "
                          "read by head: kvbm_fabric_layout_bridge_heads)",
                          (unsigned)a->tp_size, (unsigned)b->tp_size);
  if (fa != fb || na != nb)
    return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                          "layout mismatch: tp_rank %u here (heads %u..%u), %u at the peer (heads %u..%u)",
                          (unsigned)a->tp_rank, (unsigned)fa, (unsigned)(fa + na - 1), (unsigned)b->tp_rank,
                          (unsigned)fb, (unsigned)(fb + nb - 1));
  return KVBM_OK;
}

/* Which writer rank holds global head h, and at which of its local heads:
 * vLLM's rule (layout.h), the first replica when heads are replicated. */
static void head_owner(const kvbm_layout_heads *w, uint32_t h, uint32_t *rank, uint32_t *offset) {
  if (w->tp_size <= w->num_kv_heads) {
    uint32_t per = w->num_kv_heads / w->tp_size;
    *rank = h / per;
    *offset = h % per;
  } else {
    *rank = h * (w->tp_size / w->num_kv_heads);
    *offset = 0;
  }
}

static const char *const heads_how = "a TP bridge reads heads; the rest of the block's shape must agree";

int kvbm_fabric_layout_bridge_heads(const kvbm_layout *ours, const kvbm_layout *theirs,
                                    kvbm_fabric_head_piece *pieces, size_t cap, size_t *num_pieces,
                                    kvbm_error *err) {
  if (!ours || !theirs || !num_pieces || (cap && !pieces))
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: bridge heads: NULL argument");
  if (!ours->has_heads || !theirs->has_heads)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: bridge heads: %s layout carries no heads descriptor",
                          ours->has_heads ? "the peer's" : "our");
  /* Re-check each descriptor against its layout (a caller may have edited
   * the fields after attaching): the row offsets below rely on inner_dim ==
   * held heads * head_dim on both sides. */
  kvbm_layout copy = *ours;
  int rc = kvbm_layout_attach_heads(&copy, &ours->heads, err);
  copy = *theirs;
  if (!rc) rc = kvbm_layout_attach_heads(&copy, &theirs->heads, err);
  if (!rc) rc = shape_agrees(ours, theirs, heads_how, err);
  if (!rc) rc = model_agrees(&ours->heads, &theirs->heads, err);
  uint32_t first = 0, count = 0;
  if (!rc) rc = kvbm_layout_heads_local(&ours->heads, &first, &count, err);
  if (rc) return rc;
  size_t n = 0;
  kvbm_fabric_head_piece cur = {0};
  for (uint32_t i = 0; i < count; i++) {
    uint32_t rank, off;
    head_owner(&theirs->heads, first + i, &rank, &off);
    /* Extend the run while the next head sits right after it at the same
     * writer rank; else a new piece begins. */
    if (i > 0 && rank == cur.peer_rank && off == cur.peer_offset + cur.num_heads) {
      cur.num_heads++;
      continue;
    }
    if (i > 0 && n++ < cap) pieces[n - 1] = cur;
    cur = (kvbm_fabric_head_piece){.peer_rank = rank, .our_offset = i, .peer_offset = off, .num_heads = 1};
  }
  if (count > 0 && n++ < cap) pieces[n - 1] = cur;
  *num_pieces = n;
  if (n > cap)
    return kvbm_error_set(err, KVBM_ENOSPC, "fabric: bridge heads: the head map has %zu pieces, room for %zu", n,
                          cap);
  return KVBM_OK;
}

/* One piece of one block, from a writer rank's set into our layers: pass 0
 * checks every range (nothing moves), pass 1 reads. */
static int heads_rma(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block, const kvbm_layout *ours,
                     void *const *layers, uint64_t num_layers, const kvbm_fabric_head_piece *p, int pass,
                     kvbm_error *err) {
  NEED(f);
  if (!rs || !ours || !layers || !p) return kvbm_error_set(err, KVBM_EINVAL, "fabric: read heads: NULL argument");
  const kvbm_layout *lay = &rs->desc.layout;
  if (pass == 0) {
    if (rs->fabric != f) return kvbm_error_set(err, KVBM_EINVAL, "fabric: remote set imported on another fabric");
    kvbm_fabric_head_piece map[1];
    size_t n = 0;
    int rc = kvbm_fabric_layout_bridge_heads(ours, lay, map, 0, &n, err);
    if (rc && rc != KVBM_ENOSPC) return rc;
    if (block >= lay->config.num_blocks)
      return kvbm_error_set(err, KVBM_ERANGE, "fabric: block %llu out of range (set has %llu blocks)",
                            (unsigned long long)block, (unsigned long long)lay->config.num_blocks);
    if (num_layers != ours->config.num_layers)
      return kvbm_error_set(err, KVBM_EINVAL, "fabric: read heads: %llu layer pointers for %llu layers",
                            (unsigned long long)num_layers, (unsigned long long)ours->config.num_layers);
    uint32_t of, oc, pf, pc;
    kvbm_layout_heads_local(&ours->heads, &of, &oc, NULL);
    kvbm_layout_heads_local(&lay->heads, &pf, &pc, NULL);
    if (p->peer_rank != lay->heads.tp_rank || p->num_heads == 0 || p->our_offset > oc ||
        p->num_heads > oc - p->our_offset || p->peer_offset > pc || p->num_heads > pc - p->peer_offset ||
        of + p->our_offset != pf + p->peer_offset)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "fabric: read heads: piece (rank %u, heads %u+%u at peer offset %u) is not in the head "
                            "map of this set (rank %u, heads %u..%u; ours %u..%u)",
                            (unsigned)p->peer_rank, (unsigned)p->our_offset, (unsigned)p->num_heads,
                            (unsigned)p->peer_offset, (unsigned)lay->heads.tp_rank, (unsigned)pf,
                            (unsigned)(pf + pc - 1), (unsigned)of, (unsigned)(of + oc - 1));
    for (uint64_t l = 0; l < num_layers; l++)
      if (!layers[l]) return kvbm_error_set(err, KVBM_EINVAL, "fabric: layer %llu is NULL", (unsigned long long)l);
  }
  const uint64_t ds = lay->config.dtype_size, hd = lay->heads.head_dim;
  const uint64_t peer_row = lay->config.inner_dim * ds, our_row = ours->config.inner_dim * ds;
  const uint64_t width = p->num_heads * hd * ds, peer_at = p->peer_offset * hd * ds, our_at = p->our_offset * hd * ds;
  /* A piece that is a whole row on both sides (equal heads held) moves as
   * one slice; otherwise one read per token row. */
  const int whole = width == peer_row && width == our_row;
  const uint64_t tokens = whole ? 1 : lay->config.page_size, len = whole ? lay->outer_stride : width;
  for (uint64_t l = 0; l < num_layers; l++) {
    for (uint64_t o = 0; o < lay->config.outer_dim; o++) {
      kvbm_slice s;
      int rc = kvbm_layout_slice(lay, block, l, o, &s, err);
      if (rc) return rc;
      char *dst = (char *)layers[l] + o * ours->outer_stride + our_at;
      for (uint64_t t = 0; t < tokens; t++) {
        uint64_t off = s.offset + t * peer_row + peer_at, addr;
        rc = pass == 0 ? remote_range(rs, s.region, off, len, &addr, err)
                       : rma(f, rs, false, s.region, off, dst + t * our_row, len, err);
        if (rc) return rc;
      }
    }
  }
  return KVBM_OK;
}

int kvbm_fabric_read_block_heads(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block, const kvbm_layout *ours,
                                 void *const *layers, uint64_t num_layers, const kvbm_fabric_head_piece *piece,
                                 kvbm_error *err) {
  int rc = heads_rma(f, rs, block, ours, layers, num_layers, piece, 0, err);
  return rc ? rc : heads_rma(f, rs, block, ours, layers, num_layers, piece, 1, err);
}

/* The most pieces a gather plans on the stack: one per writer rank at most,
 * and no deployment has more than this many TP ranks. */
#define TP_PIECES_MAX 1024

int kvbm_fabric_read_block_tp(kvbm_fabric *f, kvbm_fabric_remote_set *const *peers, size_t num_peers, uint64_t block,
                              const kvbm_layout *ours, void *const *layers, uint64_t num_layers, kvbm_error *err) {
  NEED(f);
  if (!peers || num_peers == 0 || !ours)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: read tp: no peers or NULL layout");
  for (size_t i = 0; i < num_peers; i++)
    if (!peers[i]) return kvbm_error_set(err, KVBM_EINVAL, "fabric: read tp: peer %zu is NULL", i);
  kvbm_fabric_head_piece map[64], *pieces = map;
  size_t n = 0;
  int rc = kvbm_fabric_layout_bridge_heads(ours, &peers[0]->desc.layout, map, 64, &n, err);
  if (rc == KVBM_ENOSPC && n <= TP_PIECES_MAX) {
    pieces = malloc(n * sizeof *pieces);
    if (!pieces) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: read tp: out of memory");
    rc = kvbm_fabric_layout_bridge_heads(ours, &peers[0]->desc.layout, pieces, n, &n, err);
  }
  kvbm_fabric_remote_set **by_piece = rc ? NULL : calloc(n ? n : 1, sizeof *by_piece);
  if (!rc && !by_piece) rc = kvbm_error_set(err, KVBM_ENOMEM, "fabric: read tp: out of memory");
  /* Every peer must be a rank of the same deployment as peers[0]. */
  for (size_t i = 0; !rc && i < num_peers; i++) {
    const kvbm_layout_heads *a = &peers[0]->desc.layout.heads, *b = &peers[i]->desc.layout.heads;
    if (!peers[i]->desc.layout.has_heads || a->tp_size != b->tp_size)
      rc = kvbm_error_set(err, KVBM_EINVAL, "fabric: read tp: peer %zu is not a rank of peer 0's deployment (tp_size)",
                          i);
    else
      rc = model_agrees(a, b, err);
  }
  for (size_t k = 0; !rc && k < n; k++) {
    for (size_t i = 0; i < num_peers && !by_piece[k]; i++)
      if (peers[i]->desc.layout.heads.tp_rank == pieces[k].peer_rank) by_piece[k] = peers[i];
    if (!by_piece[k])
      rc = kvbm_error_set(err, KVBM_ENOTFOUND, "fabric: read tp: no peer is writer rank %u (of %u), which holds "
                          "heads this rank needs", (unsigned)pieces[k].peer_rank,
                          (unsigned)peers[0]->desc.layout.heads.tp_size);
  }
  for (int pass = 0; pass < 2 && !rc; pass++)
    for (size_t k = 0; k < n && !rc; k++)
      rc = heads_rma(f, by_piece[k], block, ours, layers, num_layers, &pieces[k], pass, err);
  free(by_piece);
  if (pieces != map) free(pieces);
  return rc;
}

/* ---- Reading blocks and hashing them as they land ---- */

/* Where block `block` of a FullyContiguous remote set is mapped here, or
 * KVBM_EUNSUPPORTED (not mapped: the caller reads instead). */
static int map_block(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block, const void **out,
                     kvbm_error *err) {
  const kvbm_layout *lay = &rs->desc.layout;
  if (!f->vt->map || lay->kind != KVBM_LAYOUT_FULLY_CONTIGUOUS) return KVBM_EUNSUPPORTED;
  kvbm_slice s;
  uint64_t addr;
  int rc = kvbm_layout_block(lay, block, &s, err);
  if (!rc) rc = remote_range(rs, s.region, s.offset, s.size, &addr, err);
  if (!rc) rc = f->vt->map(f, rs->regions[s.region].rkey, addr, s.size, out);
  if (rc == KVBM_ECLOSED) return kvbm_error_set(err, rc, "fabric: peer '%s' is closed", f->peer_name);
  return rc;
}

int kvbm__fabric_map_block(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block, const void **out,
                           kvbm_error *err) {
  NEED(f);
  if (!rs || !out || rs->fabric != f) return kvbm_error_set(err, KVBM_EINVAL, "fabric: map: NULL or foreign set");
  int rc = kvbm__fabric_check(f, err);
  if (rc) return rc;
  if (block >= rs->desc.layout.config.num_blocks)
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: map: block %llu out of range (set has %llu blocks)",
                          (unsigned long long)block, (unsigned long long)rs->desc.layout.config.num_blocks);
  return map_block(f, rs, block, out, err);
}

/* The mapped path: every block's mapping first (all or none: one that is
 * not mapped sends every block down the read path), then the copies and
 * hashes on the pool, a piece per thread at a time. */
static int copy_hash_mapped(kvbm_fabric *f, kvbm_fabric_remote_set *rs, const uint64_t *blocks,
                            void *const *dsts, size_t n, kvbm_blake3_pool *pool, kvbm_blake3_job *jobs,
                            kvbm_error *err) {
  for (size_t i = 0; i < n; i++) {
    int rc = map_block(f, rs, blocks[i], &jobs[i].in, err);
    if (rc) return rc;
  }
  uint64_t ticket;
  int rc = kvbm_blake3_pool_submit_copy(pool, jobs, dsts, n, &ticket, err);
  return rc ? rc : kvbm_blake3_pool_wait(pool, ticket, err);
}

/* The read path: one-sided reads, a flush, then the hashes in place. */
static int read_then_hash(kvbm_fabric *f, kvbm_fabric_remote_set *rs, const uint64_t *blocks, void *const *dsts,
                          size_t n, kvbm_blake3_pool *pool, kvbm_blake3_job *jobs, int timeout_ms,
                          kvbm_error *err) {
  for (size_t i = 0; i < n; i++) {
    int rc = block_rma(f, rs, false, blocks[i], dsts[i], rs->block_bytes, err);
    if (rc) return rc;
    jobs[i].in = dsts[i];
  }
  int rc = kvbm_fabric_flush(f, timeout_ms, err);
  uint64_t ticket;
  if (!rc) rc = kvbm_blake3_pool_submit(pool, jobs, n, &ticket, err);
  return rc ? rc : kvbm_blake3_pool_wait(pool, ticket, err);
}

int kvbm_fabric_read_blocks_hashed(kvbm_fabric *f, kvbm_fabric_remote_set *rs, const uint64_t *blocks,
                                   void *const *dsts, size_t n, kvbm_blake3_pool *pool, uint8_t *sums,
                                   size_t sum_len, int timeout_ms, kvbm_error *err) {
  NEED(f);
  if (!rs || !blocks || !dsts || !pool || !sums || n == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: read hashed: NULL argument or no block");
  if (sum_len == 0 || sum_len > 64)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: read hashed: %zu-byte sums (1..64)", sum_len);
  if (rs->fabric != f) return kvbm_error_set(err, KVBM_EINVAL, "fabric: remote set imported on another fabric");
  int rc = kvbm__fabric_check(f, err);
  if (rc) return rc;
  const kvbm_layout *lay = &rs->desc.layout;
  for (size_t i = 0; i < n; i++) {
    if (blocks[i] >= lay->config.num_blocks)
      return kvbm_error_set(err, KVBM_ERANGE, "fabric: read hashed: block %llu out of range (set has %llu blocks)",
                            (unsigned long long)blocks[i], (unsigned long long)lay->config.num_blocks);
    if (!dsts[i]) return kvbm_error_set(err, KVBM_EINVAL, "fabric: read hashed: NULL destination %zu", i);
  }
  kvbm_blake3_job *jobs = malloc(n * sizeof *jobs);
  if (!jobs) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: read hashed: out of memory");
  for (size_t i = 0; i < n; i++) jobs[i] = (kvbm_blake3_job){NULL, rs->block_bytes, sums + i * sum_len, sum_len};
  rc = copy_hash_mapped(f, rs, blocks, dsts, n, pool, jobs, err);
  if (rc == KVBM_EUNSUPPORTED) {
    rc = read_then_hash(f, rs, blocks, dsts, n, pool, jobs, timeout_ms, err); /* counted by its reads */
  } else if (rc == KVBM_OK) {
    count(&f->reads, n);
    count(&f->read_bytes, n * rs->block_bytes);
  } else {
    count_failure(f, rc);
  }
  free(jobs);
  return rc;
}

int kvbm_fabric_write_block(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block, const void *src,
                            size_t len, kvbm_error *err) {
  return block_rma(f, rs, true, block, (void *)(uintptr_t)src, len, err);
}

int kvbm_fabric_read_block(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block, void *dst, size_t len,
                           kvbm_error *err) {
  return block_rma(f, rs, false, block, dst, len, err);
}
