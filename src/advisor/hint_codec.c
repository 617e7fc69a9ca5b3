/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hint_codec.c: the advisor's hints on the wire (see kvbm/advisor.h and
 * docs/areas/advisor.md): msgpack written and read with the library's
 * growing writer and bounds-checked reader (common/msgpack.h),
 * and JSON for HTTP. The decoder allocates one record per hint (its array,
 * reused, given back after an oversized message) and nothing else.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/msgpack.h"
#include "common/vec.h"
#include "kvbm/advisor.h"
#include "kvbm/group.h"

static bool id_ok(const char *s, size_t n) {
  if (!s || !n || n > KVBM_STORAGE_MAX_LOCATION) return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return false;
  return true;
}

int kvbm_advisor_hint_wire(const kvbm_advisor *a, const kvbm_hint *h, kvbm_wire_hint *out) {
  if (!a || !h || !out) return KVBM_EINVAL;
  kvbm_advisor_volume_info from, to;
  if (kvbm_advisor_volume_get(a, (size_t)(h->from_volume < 0 ? SIZE_MAX : (size_t)h->from_volume), &from))
    return KVBM_ENOTFOUND;
  memset(out, 0, sizeof *out);
  out->kind = h->kind;
  out->sequence_hash = h->sequence_hash;
  out->prefix_hash = h->prefix_hash;
  out->from = from.name;
  out->from_len = strlen(from.name);
  if (h->to_volume >= 0) {
    if (kvbm_advisor_volume_get(a, (size_t)h->to_volume, &to)) return KVBM_ENOTFOUND;
    out->to = to.name;
    out->to_len = strlen(to.name);
  }
  out->uses = h->uses;
  out->idle_ms = h->idle_ms;
  out->live_blocks = h->live_blocks;
  out->high_water = h->high_water;
  out->ns = h->ns;
  out->group = h->group;
  return KVBM_OK;
}

int kvbm_hints_encode(const kvbm_hint_batch *b, uint8_t **buf, size_t *len, size_t *cap,
                      kvbm_error *err) {
  if (!b || !buf || !len || !cap || (b->num_hints && !b->hints))
    return kvbm_error_set(err, KVBM_EINVAL, "hints: NULL argument");
  if (b->num_hints > UINT32_MAX) return kvbm_error_set(err, KVBM_EINVAL, "hints: too many");
  for (size_t i = 0; i < b->num_hints; i++) {
    const kvbm_wire_hint *h = &b->hints[i];
    if (h->kind < KVBM_HINT_PROMOTE || h->kind > KVBM_HINT_COMPACT)
      return kvbm_error_set(err, KVBM_EINVAL, "hint %zu: kind %d is not a hint", i, (int)h->kind);
    if (h->group >= KVBM_GROUPS_MAX)
      return kvbm_error_set(err, KVBM_EINVAL, "hint %zu: group %u is not a KV cache group (0..%d)", i,
                            h->group, KVBM_GROUPS_MAX - 1);
    if (!id_ok(h->from, h->from_len) || (h->to && !id_ok(h->to, h->to_len)))
      return kvbm_error_set(err, KVBM_EINVAL,
                            "hint %zu: a volume id is empty, longer than %d bytes or has control bytes",
                            i, KVBM_STORAGE_MAX_LOCATION);
  }
  size_t start = *len;
  kvbm__mpw w = {buf, len, cap, false};
  kvbm__mpw_array(&w, 3);
  kvbm__mpw_double(&w, b->ts);
  kvbm__mpw_array(&w, (uint32_t)b->num_hints);
  for (size_t i = 0; i < b->num_hints; i++) {
    const kvbm_wire_hint *h = &b->hints[i];
    const char *tag = kvbm_hint_kind_name(h->kind);
    kvbm__mpw_array(&w, 11);
    kvbm__mpw_str(&w, tag, strlen(tag));
    kvbm__mpw_uint(&w, h->sequence_hash);
    kvbm__mpw_uint(&w, h->prefix_hash);
    kvbm__mpw_str(&w, h->from, h->from_len);
    if (h->to) kvbm__mpw_str(&w, h->to, h->to_len);
    else kvbm__mpw_nil(&w);
    kvbm__mpw_uint(&w, h->uses);
    kvbm__mpw_uint(&w, h->idle_ms);
    kvbm__mpw_uint(&w, h->live_blocks);
    kvbm__mpw_uint(&w, h->high_water);
    kvbm__mpw_uint(&w, h->ns);
    kvbm__mpw_uint(&w, h->group);
  }
  kvbm__mpw_str(&w, b->source ? b->source : "", b->source ? b->source_len : 0);
  if (w.oom) {
    *len = start;
    return kvbm_error_set(err, KVBM_ENOMEM, "hints: out of memory");
  }
  return KVBM_OK;
}

struct kvbm_hint_decoder {
  kvbm_wire_hint *h;
  size_t cap;
};

int kvbm_hint_decoder_create(kvbm_hint_decoder **out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "hints: NULL decoder");
  *out = calloc(1, sizeof **out);
  return *out ? KVBM_OK : kvbm_error_set(err, KVBM_ENOMEM, "hints: out of memory");
}

void kvbm_hint_decoder_destroy(kvbm_hint_decoder *d) {
  if (!d) return;
  free(d->h);
  free(d);
}

static int u64(kvbm__mpr *r, uint64_t *v, size_t i, const char *name, kvbm_error *err) {
  bool neg;
  int rc = kvbm__mpr_peek(r) == KVBM__MPR_INT ? kvbm__mpr_int(r, v, &neg) : KVBM_EFORMAT;
  if (rc == KVBM_ETRUNCATED) return kvbm_error_set(err, rc, "hint %zu: %s is truncated", i, name);
  if (rc || neg) return kvbm_error_set(err, KVBM_EFORMAT, "hint %zu: %s is not an unsigned integer", i, name);
  return KVBM_OK;
}

static int volume(kvbm__mpr *r, const char **s, size_t *n, bool may_be_nil, size_t i, const char *name,
                  kvbm_error *err) {
  if (may_be_nil && kvbm__mpr_nil(r)) {
    *s = NULL;
    *n = 0;
    return KVBM_OK;
  }
  const uint8_t *p;
  if (kvbm__mpr_bytes(r, false, &p, n) || !id_ok((const char *)p, *n))
    return kvbm_error_set(err, KVBM_EFORMAT, "hint %zu: %s is not a volume id", i, name);
  *s = (const char *)p;
  return KVBM_OK;
}

static int decode_hint(kvbm__mpr *r, kvbm_wire_hint *h, size_t i, kvbm_error *err) {
  uint32_t n;
  if (kvbm__mpr_array(r, &n)) return kvbm_error_set(err, KVBM_EFORMAT, "hint %zu is not an array", i);
  if (n < 9) return kvbm_error_set(err, KVBM_EFORMAT, "hint %zu has %u fields, not 9", i, n);
  const uint8_t *t;
  size_t tl;
  memset(h, 0, sizeof *h);
  if (kvbm__mpr_bytes(r, false, &t, &tl)) return kvbm_error_set(err, KVBM_EFORMAT, "hint %zu: kind is not a string", i);
  for (int k = KVBM_HINT_PROMOTE; k <= KVBM_HINT_COMPACT; k++) {
    const char *name = kvbm_hint_kind_name(k);
    if (strlen(name) == tl && !memcmp(name, t, tl)) h->kind = (kvbm_hint_kind)k;
  }
  if (!h->kind) return kvbm_error_set(err, KVBM_EFORMAT, "hint %zu: unknown kind", i);
  int rc;
  if ((rc = u64(r, &h->sequence_hash, i, "sequence_hash", err)) ||
      (rc = u64(r, &h->prefix_hash, i, "prefix_hash", err)) ||
      (rc = volume(r, &h->from, &h->from_len, false, i, "from", err)) ||
      (rc = volume(r, &h->to, &h->to_len, true, i, "to", err)) ||
      (rc = u64(r, &h->uses, i, "uses", err)) || (rc = u64(r, &h->idle_ms, i, "idle_ms", err)) ||
      (rc = u64(r, &h->live_blocks, i, "live_blocks", err)) ||
      (rc = u64(r, &h->high_water, i, "high_water", err)))
    return rc;
  if (n > 9 && (rc = u64(r, &h->ns, i, "namespace", err))) return rc;
  uint64_t group = 0;
  if (n > 10 && (rc = u64(r, &group, i, "group", err))) return rc;
  if (group >= KVBM_GROUPS_MAX)
    return kvbm_error_set(err, KVBM_EFORMAT, "hint %zu: group %" PRIu64 " is not a KV cache group (0..%d)",
                          i, group, KVBM_GROUPS_MAX - 1);
  h->group = (uint32_t)group;
  for (uint32_t k = 11; k < n; k++)
    if (kvbm__mpr_skip(r)) return kvbm_error_set(err, KVBM_ETRUNCATED, "hint %zu: extra field truncated", i);
  return KVBM_OK;
}

int kvbm_hint_decode(kvbm_hint_decoder *d, const void *data, size_t len, uint64_t seq,
                     kvbm_hint_batch *out, kvbm_error *err) {
  if (!d || (!data && len) || !out) return kvbm_error_set(err, KVBM_EINVAL, "hints: NULL argument");
  kvbm__mpr r = {data, (const uint8_t *)data + len};
  uint32_t n, count;
  memset(out, 0, sizeof *out);
  out->seq = seq;
  if (kvbm__mpr_array(&r, &n) || n < 2)
    return kvbm_error_set(err, KVBM_EFORMAT, "hints: not an array [ts, hints, source]");
  if (kvbm__mpr_double(&r, &out->ts)) return kvbm_error_set(err, KVBM_EFORMAT, "hints: ts is not a number");
  int ac = kvbm__mpr_array(&r, &count);
  if (ac == KVBM_ETRUNCATED)
    return kvbm_error_set(err, ac, "hints: the hints array claims more than the bytes left");
  if (ac) return kvbm_error_set(err, KVBM_EFORMAT, "hints: hints is not an array");
  if ((size_t)count > kvbm__mpr_left(&r) / 12)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "hints: %u hints cannot fit in %zu bytes", count, kvbm__mpr_left(&r));
  /* Exactly count (16 at least); a large array is given back when count
   * is far smaller (common/vec.h's kvbm__vec_fit). */
  if (kvbm__vec_fit_of(&d->h, &d->cap, count, 16, KVBM__VEC_NO_LIMIT))
    return kvbm_error_set(err, KVBM_ENOMEM, "hints: out of memory");
  for (uint32_t i = 0; i < count; i++) {
    int rc = decode_hint(&r, &d->h[i], i, err);
    if (rc) return rc;
  }
  if (n >= 3) {
    const uint8_t *s = NULL;
    size_t sl = 0;
    if (!kvbm__mpr_nil(&r) && (kvbm__mpr_bytes(&r, false, &s, &sl) || (sl && !id_ok((const char *)s, sl))))
      return kvbm_error_set(err, KVBM_EFORMAT, "hints: source is not a short printable string");
    out->source = (const char *)s;
    out->source_len = sl;
  }
  for (uint32_t k = 3; k < n; k++)
    if (kvbm__mpr_skip(&r)) return kvbm_error_set(err, KVBM_ETRUNCATED, "hints: extra field truncated");
  if (r.p != r.end) return kvbm_error_set(err, KVBM_EFORMAT, "hints: %zu trailing bytes", kvbm__mpr_left(&r));
  out->hints = d->h;
  out->num_hints = count;
  return KVBM_OK;
}

static size_t jstr(char *buf, size_t cap, size_t at, const char *s, size_t n) {
  size_t k = at;
#define PUT(c)                      \
  do {                              \
    if (k + 1 < cap) buf[k] = (c);  \
    k++;                            \
  } while (0)
  PUT('"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      PUT('\\');
      PUT((char)c);
    } else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\u%04x", c);
      for (int j = 0; esc[j]; j++) PUT(esc[j]);
    } else {
      PUT((char)c);
    }
  }
  PUT('"');
#undef PUT
  return k;
}

size_t kvbm_wire_hint_to_json(const kvbm_wire_hint *h, char *buf, size_t cap) {
  if (!h) return 0;
  char head[160];
  int hn = snprintf(head, sizeof head, "{\"kind\":\"%s\",\"sequence_hash\":%" PRIu64 ",\"prefix_hash\":%" PRIu64 ",\"from\":",
                    kvbm_hint_kind_name(h->kind), h->sequence_hash, h->prefix_hash);
  size_t k = 0;
  for (int i = 0; i < hn; i++, k++)
    if (k + 1 < cap) buf[k] = head[i];
  k = jstr(buf, cap, k, h->from ? h->from : "", h->from ? h->from_len : 0);
  const char *mid = ",\"to\":";
  for (const char *m = mid; *m; m++, k++)
    if (k + 1 < cap) buf[k] = *m;
  if (h->to) {
    k = jstr(buf, cap, k, h->to, h->to_len);
  } else {
    for (const char *m = "null"; *m; m++, k++)
      if (k + 1 < cap) buf[k] = *m;
  }
  char tail[256];
  int tn = snprintf(tail, sizeof tail, ",\"uses\":%" PRIu64 ",\"idle_ms\":%" PRIu64 ",\"live_blocks\":%" PRIu64
                    ",\"high_water\":%" PRIu64 ",\"namespace\":%" PRIu64 ",\"group\":%u}", h->uses, h->idle_ms,
                    h->live_blocks, h->high_water, h->ns, h->group);
  for (int i = 0; i < tn; i++, k++)
    if (k + 1 < cap) buf[k] = tail[i];
  if (cap) buf[k < cap ? k : cap - 1] = 0;
  return k;
}
