/* SPDX-License-Identifier: Apache-2.0 */
/*
 * storage_codec.c: the storage events' msgpack codec (see
 * kvbm/storage_events.h; the wire specification is
 * docs/areas/storage-events.md).
 *
 * Decoding uses the bounds-checked reader of common/msgpack.h: no
 * count is trusted before the bytes left could hold it, values are read in
 * place, and the only allocation is the decoder's event array, grown to
 * the largest batch seen and given back when a batch needs far less (one
 * flood must not pin its memory). The metadata map is validated by one
 * function shared by both directions, so what the encoder writes is
 * exactly what the decoder accepts.
 *
 * Encoding writes msgpack by hand (its growing writer) into a buffer: the
 * format is seven fields an event, integers and two strings.
 */
#include "kvbm/storage_events.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/msgpack.h"
#include "common/vec.h"
#include "events/storage_internal.h"

#define META_MAX_KEY 64
#define META_MAX_STR 256

const char *kvbm_storage_event_type_name(int type) {
  return type == KVBM_STORAGE_STORE ? "Store" : type == KVBM_STORAGE_REMOVE ? "Remove" : "?";
}

/* ---- metadata: a flat map of scalars ---- */

static bool text_ok(const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] < 0x20 || s[i] == 0x7f) return false;
  return true;
}

/* Validates a metadata map at r (consumed on success) and finds its tier. */
static int meta_parse(kvbm__mpr *r, int *tier, const char **why) {
  const uint8_t *start = r->p;
  uint32_t n;
  *tier = -1;
  if (kvbm__mpr_map(r, &n)) return *why = "extra_metadata is not a map", KVBM_EFORMAT;
  if (n > KVBM_STORAGE_MAX_META_ENTRIES)
    return *why = "extra_metadata has more than 16 entries", KVBM_ETOOLONG;
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *k, *v;
    size_t kn, vn;
    if (kvbm__mpr_bytes(r, false, &k, &kn)) return *why = "extra_metadata key is not a string", KVBM_EFORMAT;
    if (kn == 0 || kn > META_MAX_KEY || !text_ok(k, kn))
      return *why = "extra_metadata key is empty, too long or has control bytes", KVBM_EFORMAT;
    kvbm__mpr_kind kind = kvbm__mpr_peek(r);
    if (kind == KVBM__MPR_STR) {
      if (kvbm__mpr_bytes(r, false, &v, &vn) || vn > META_MAX_STR || !text_ok(v, vn))
        return *why = "extra_metadata string value is too long or has control bytes", KVBM_EFORMAT;
      if (kn == 4 && !memcmp(k, "tier", 4)) {
        kvbm_tier t;
        char name[4] = {0};
        if (vn != 2) return *why = "extra_metadata tier is not G1..G4", KVBM_EFORMAT;
        memcpy(name, v, 2);
        if (!kvbm_tier_parse(name, &t)) return *why = "extra_metadata tier is not G1..G4", KVBM_EFORMAT;
        *tier = (int)t;
      }
    } else if (kind == KVBM__MPR_NIL || kind == KVBM__MPR_BOOL || kind == KVBM__MPR_INT || kind == KVBM__MPR_FLOAT) {
      if (kn == 4 && !memcmp(k, "tier", 4)) return *why = "extra_metadata tier is not a string", KVBM_EFORMAT;
      if (kvbm__mpr_skip(r)) return *why = "extra_metadata value is truncated", KVBM_ETRUNCATED;
    } else {
      return *why = "extra_metadata value is not a scalar", KVBM_EFORMAT;
    }
  }
  if ((size_t)(r->p - start) > KVBM_STORAGE_MAX_METADATA)
    return *why = "extra_metadata is longer than 4096 bytes", KVBM_ETOOLONG;
  return KVBM_OK;
}

/* ---- encoder ---- */

int kvbm__storage_check(const kvbm_storage_event *e, size_t i, kvbm_error *err) {
  if (e->type != KVBM_STORAGE_STORE && e->type != KVBM_STORAGE_REMOVE)
    return kvbm_error_set(err, KVBM_EINVAL, "storage event %zu: type %d is not Store or Remove", i,
                          (int)e->type);
  if (!e->location || !e->location_len || e->location_len > KVBM_STORAGE_MAX_LOCATION ||
      !text_ok((const uint8_t *)e->location, e->location_len))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "storage event %zu: storage_location is empty, longer than %d bytes or "
                          "has control bytes",
                          i, KVBM_STORAGE_MAX_LOCATION);
  if (e->extra_metadata) {
    kvbm__mpr r = {e->extra_metadata, e->extra_metadata + e->extra_metadata_len};
    int tier;
    const char *why = NULL;
    if (meta_parse(&r, &tier, &why) || r.p != r.end)
      return kvbm_error_set(err, KVBM_EINVAL, "storage event %zu: %s", i,
                            why ? why : "extra_metadata has trailing bytes");
  } else if (e->tier >= KVBM_TIER_COUNT) {
    return kvbm_error_set(err, KVBM_EINVAL, "storage event %zu: tier %d is not G1..G4", i, e->tier);
  }
  return KVBM_OK;
}

int kvbm_storage_encode(const kvbm_storage_batch *b, uint8_t **buf, size_t *len, size_t *cap,
                        kvbm_error *err) {
  if (!b || !buf || !len || !cap || (b->num_events && !b->events))
    return kvbm_error_set(err, KVBM_EINVAL, "storage events: NULL argument");
  if (b->num_events > UINT32_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "storage events: too many events in one batch");
  for (size_t i = 0; i < b->num_events; i++) {
    int rc = kvbm__storage_check(&b->events[i], i, err);
    if (rc) return rc;
  }
  size_t start = *len;
  kvbm__mpw w = {buf, len, cap, false};
  kvbm__mpw_array(&w, 3);
  kvbm__mpw_double(&w, b->ts);
  kvbm__mpw_array(&w, (uint32_t)b->num_events);
  for (size_t i = 0; i < b->num_events; i++) {
    const kvbm_storage_event *e = &b->events[i];
    const char *tag = kvbm_storage_event_type_name(e->type);
    kvbm__mpw_array(&w, 7);
    kvbm__mpw_str(&w, tag, strlen(tag));
    kvbm__mpw_uint(&w, e->event_id);
    kvbm__mpw_uint(&w, e->sequence_hash);
    kvbm__mpw_uint(&w, e->prefix_hash);
    kvbm__mpw_uint(&w, e->block_size);
    kvbm__mpw_str(&w, e->location, e->location_len);
    if (e->extra_metadata) {
      kvbm__mpw_raw(&w, e->extra_metadata, e->extra_metadata_len);
    } else if (e->tier >= 0) {
      kvbm__mpw_raw(&w, "\x81", 1); /* {"tier": "Gn"} */
      kvbm__mpw_str(&w, "tier", 4);
      kvbm__mpw_str(&w, kvbm_tier_name(e->tier), 2);
    } else {
      kvbm__mpw_nil(&w);
    }
  }
  kvbm__mpw_str(&w, b->source ? b->source : "", b->source ? b->source_len : 0);
  if (w.oom) {
    *len = start;
    return kvbm_error_set(err, KVBM_ENOMEM, "storage events: out of memory");
  }
  return KVBM_OK;
}

/* ---- decoder ---- */

struct kvbm_storage_decoder {
  kvbm_storage_event *ev;
  size_t cap;
};

int kvbm_storage_decoder_create(kvbm_storage_decoder **out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "storage events: NULL decoder");
  *out = calloc(1, sizeof **out);
  return *out ? KVBM_OK : kvbm_error_set(err, KVBM_ENOMEM, "storage events: out of memory");
}

void kvbm_storage_decoder_destroy(kvbm_storage_decoder *d) {
  if (!d) return;
  free(d->ev);
  free(d);
}

/* Room for exactly n events (16 at least); a large array is given back
 * when n is far smaller (common/vec.h's kvbm__vec_fit). */
static int reserve(kvbm_storage_decoder *d, size_t n) {
  return kvbm__vec_fit_of(&d->ev, &d->cap, n, 16, KVBM__VEC_NO_LIMIT);
}

static int u64_field(kvbm__mpr *r, uint64_t *v, size_t i, const char *name, kvbm_error *err) {
  bool neg;
  int rc = kvbm__mpr_peek(r) == KVBM__MPR_INT ? kvbm__mpr_int(r, v, &neg) : KVBM_EFORMAT;
  if (rc == KVBM_ETRUNCATED)
    return kvbm_error_set(err, rc, "storage event %zu: %s is truncated", i, name);
  if (rc || neg)
    return kvbm_error_set(err, KVBM_EFORMAT, "storage event %zu: %s is not an unsigned integer",
                          i, name);
  return KVBM_OK;
}

static int decode_event(kvbm__mpr *r, kvbm_storage_event *e, size_t i, kvbm_error *err) {
  uint32_t n;
  if (kvbm__mpr_array(r, &n))
    return kvbm_error_set(err, KVBM_EFORMAT, "storage event %zu is not an array", i);
  if (n < 7)
    return kvbm_error_set(err, KVBM_EFORMAT, "storage event %zu has %u fields, not 7", i, n);
  const uint8_t *s;
  size_t sl;
  if (kvbm__mpr_bytes(r, false, &s, &sl))
    return kvbm_error_set(err, KVBM_EFORMAT, "storage event %zu: the tag is not a string", i);
  memset(e, 0, sizeof *e);
  if (sl == 5 && !memcmp(s, "Store", 5)) e->type = KVBM_STORAGE_STORE;
  else if (sl == 6 && !memcmp(s, "Remove", 6)) e->type = KVBM_STORAGE_REMOVE;
  else return kvbm_error_set(err, KVBM_EFORMAT, "storage event %zu: unknown tag", i);
  int rc;
  if ((rc = u64_field(r, &e->event_id, i, "event_id", err)) ||
      (rc = u64_field(r, &e->sequence_hash, i, "sequence_hash", err)) ||
      (rc = u64_field(r, &e->prefix_hash, i, "prefix_hash", err)) ||
      (rc = u64_field(r, &e->block_size, i, "block_size", err)))
    return rc;
  if (kvbm__mpr_bytes(r, false, &s, &sl))
    return kvbm_error_set(err, KVBM_EFORMAT, "storage event %zu: storage_location is not a string", i);
  if (!sl || sl > KVBM_STORAGE_MAX_LOCATION || !text_ok(s, sl))
    return kvbm_error_set(err, KVBM_EFORMAT,
                          "storage event %zu: storage_location is empty, longer than %d bytes or "
                          "has control bytes",
                          i, KVBM_STORAGE_MAX_LOCATION);
  e->location = (const char *)s;
  e->location_len = sl;
  e->tier = -1;
  if (!kvbm__mpr_nil(r)) {
    const uint8_t *m = r->p;
    const char *why = "extra_metadata is malformed";
    if ((rc = meta_parse(r, &e->tier, &why)))
      return kvbm_error_set(err, rc, "storage event %zu: %s", i, why);
    e->extra_metadata = m;
    e->extra_metadata_len = (size_t)(r->p - m);
  }
  for (uint32_t k = 7; k < n; k++)
    if (kvbm__mpr_skip(r))
      return kvbm_error_set(err, KVBM_ETRUNCATED, "storage event %zu: extra field truncated", i);
  return KVBM_OK;
}

int kvbm_storage_decode(kvbm_storage_decoder *d, const void *data, size_t len, uint64_t seq,
                        kvbm_storage_batch *out, kvbm_error *err) {
  if (!d || (!data && len) || !out) return kvbm_error_set(err, KVBM_EINVAL, "storage events: NULL argument");
  kvbm__mpr r = {data, (const uint8_t *)data + len};
  uint32_t n, count;
  memset(out, 0, sizeof *out);
  out->seq = seq;
  if (kvbm__mpr_array(&r, &n)) return kvbm_error_set(err, KVBM_EFORMAT, "storage batch is not an array");
  if (n < 2) return kvbm_error_set(err, KVBM_EFORMAT, "storage batch has %u fields, not [ts, events, source]", n);
  if (kvbm__mpr_double(&r, &out->ts)) return kvbm_error_set(err, KVBM_EFORMAT, "storage batch: ts is not a number");
  int ac = kvbm__mpr_array(&r, &count);
  if (ac == KVBM_ETRUNCATED)
    return kvbm_error_set(err, ac, "storage batch: the events array claims more than the bytes left");
  if (ac) return kvbm_error_set(err, KVBM_EFORMAT, "storage batch: events is not an array");
  /* Each event takes at least 8 bytes; the count is bounded by the input. */
  if ((size_t)count > kvbm__mpr_left(&r) / 8)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "storage batch: %u events cannot fit in %zu bytes",
                          count, kvbm__mpr_left(&r));
  if (reserve(d, count)) return kvbm_error_set(err, KVBM_ENOMEM, "storage events: out of memory");
  for (uint32_t i = 0; i < count; i++) {
    int rc = decode_event(&r, &d->ev[i], i, err);
    if (rc) return rc;
  }
  if (n >= 3) {
    const uint8_t *s;
    size_t sl;
    if (kvbm__mpr_nil(&r)) {
      sl = 0, s = NULL;
    } else if (kvbm__mpr_bytes(&r, false, &s, &sl) || sl > KVBM_STORAGE_MAX_LOCATION || !text_ok(s, sl)) {
      return kvbm_error_set(err, KVBM_EFORMAT, "storage batch: source is not a short printable string");
    }
    out->source = (const char *)s;
    out->source_len = sl;
  }
  for (uint32_t k = 3; k < n; k++)
    if (kvbm__mpr_skip(&r)) return kvbm_error_set(err, KVBM_ETRUNCATED, "storage batch: extra field truncated");
  if (r.p != r.end)
    return kvbm_error_set(err, KVBM_EFORMAT, "storage batch: %zu trailing bytes", kvbm__mpr_left(&r));
  out->events = d->ev;
  out->num_events = count;
  return KVBM_OK;
}

/* ---- JSON ---- */

typedef struct jout {
  char *buf;
  size_t cap, n;
} jout;

static void jput(jout *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jput(jout *j, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(j->n < j->cap ? j->buf + j->n : NULL, j->n < j->cap ? j->cap - j->n : 0, fmt, ap);
  va_end(ap);
  if (k > 0) j->n += (size_t)k;
}

static void jstr(jout *j, const uint8_t *s, size_t n) {
  jput(j, "\"");
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '"' || s[i] == '\\') jput(j, "\\%c", s[i]);
    else if (s[i] < 0x20 || s[i] == 0x7f) jput(j, "\\u%04x", s[i]);
    else jput(j, "%c", s[i]);
  }
  jput(j, "\"");
}

/* The metadata map as a JSON object (already validated: flat scalars). */
static void jmeta(jout *j, const uint8_t *m, size_t len) {
  kvbm__mpr r = {m, m + len};
  uint32_t n;
  if (kvbm__mpr_map(&r, &n)) {
    jput(j, "null");
    return;
  }
  jput(j, "{");
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *s;
    size_t sl;
    if (kvbm__mpr_bytes(&r, false, &s, &sl)) break;
    jput(j, i ? "," : "");
    jstr(j, s, sl);
    jput(j, ":");
    uint64_t u;
    bool neg;
    double d;
    switch (kvbm__mpr_peek(&r)) {
      case KVBM__MPR_STR:
        if (kvbm__mpr_bytes(&r, false, &s, &sl)) return;
        jstr(j, s, sl);
        break;
      case KVBM__MPR_INT:
        if (kvbm__mpr_int(&r, &u, &neg)) return;
        if (neg) jput(j, "%" PRId64, (int64_t)u);
        else jput(j, "%" PRIu64, u);
        break;
      case KVBM__MPR_FLOAT:
        if (kvbm__mpr_double(&r, &d)) return;
        jput(j, "%.17g", d);
        break;
      case KVBM__MPR_BOOL:
        jput(j, *r.p == 0xc3 ? "true" : "false");
        r.p++;
        break;
      default:
        r.p++;
        jput(j, "null");
    }
  }
  jput(j, "}");
}

size_t kvbm_storage_event_to_json(const kvbm_storage_event *e, char *buf, size_t cap) {
  jout j = {buf, cap, 0};
  if (!e) return 0;
  jput(&j, "{\"type\":\"%s\",\"event_id\":%" PRIu64 ",\"sequence_hash\":%" PRIu64
           ",\"prefix_hash\":%" PRIu64 ",\"block_size\":%" PRIu64 ",\"storage_location\":",
       kvbm_storage_event_type_name(e->type), e->event_id, e->sequence_hash, e->prefix_hash,
       e->block_size);
  jstr(&j, (const uint8_t *)(e->location ? e->location : ""), e->location ? e->location_len : 0);
  jput(&j, ",\"tier\":");
  if (e->tier >= 0 && e->tier < KVBM_TIER_COUNT) jput(&j, "\"%s\"", kvbm_tier_name(e->tier));
  else jput(&j, "null");
  jput(&j, ",\"extra_metadata\":");
  if (e->extra_metadata) jmeta(&j, e->extra_metadata, e->extra_metadata_len);
  else jput(&j, "null");
  jput(&j, "}");
  if (cap) buf[j.n < cap ? j.n : cap - 1] = 0;
  return j.n;
}
