/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/msgpack.h: msgpack reading and writing, once for the library
 * (private, header-only).
 *
 * kvbm speaks msgpack in three formats: the engines' KV event batches
 * (event_codec), kvbm's own storage events (events/storage_codec.c) and the
 * advisor's hints (advisor/hint_codec.c). Each used to carry its own
 * primitives (a reader in event_codec/mpread.h, a growing writer in
 * events/mpwrite.h, and the event encoder's cursor writers in codec.c);
 * they are here now, in three layers:
 *
 * - Reader (kvbm__mpr_*): a bounds-checked reader over a byte range.
 *   Why not msgpack-c's unpacker: msgpack_unpack() allocates `count *
 *   sizeof(msgpack_object)` for an array header before it checks that the
 *   input holds that many elements, so a 5-byte message (0xdd ff ff ff ff)
 *   asks for 64 GiB. This reader checks every declared count against the
 *   bytes left (each element takes at least one byte, a map entry two)
 *   before anyone sizes anything by it, never allocates, and reads values
 *   in place, which is also what makes decoding millions of block events a
 *   second cheap. Every function returns 0 or a negative kvbm_status and
 *   advances the cursor only on success.
 * - Cursor writers (kvbm__mp_put_*): write one value at `p` and return the
 *   byte after it; the caller has reserved room (at most 9 bytes per
 *   scalar or header, 5 + n for a string). The event encoder reserves
 *   once per event for a bound of its size and then only stores: for the
 *   tagged-map form, a dozen values an event, a capacity check per value
 *   (msgpack-c's packer makes a callback per value) was most of the cost.
 * - Growing writer (kvbm__mpw_*): the cursor writers over a caller-owned
 *   buffer that grows with kvbm__vec_reserve, for the formats kvbm defines
 *   itself (a few integers and short strings per record). Running out of
 *   memory is sticky: every later write is a no-op and `oom` stays set, so
 *   a caller checks once.
 *
 * All write the shortest encoding of each value, as msgpack-c and msgspec
 * do, so that the bytes are the same whoever wrote them.
 */
#ifndef KVBM_COMMON_MSGPACK_H
#define KVBM_COMMON_MSGPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/vec.h"
#include "kvbm/status.h"

/* ------------------------------------------------------------ big-endian */

/* msgpack's integers and lengths are big-endian; so are the events'
 * sequence frames. n = 1, 2, 4 or 8 bytes. */
static inline uint64_t kvbm__get_be(const uint8_t *p, int n) {
  if (n == 8) { /* hashes: one load and a byte swap, not eight shifts */
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
  }
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = v << 8 | p[i];
  return v;
}

static inline uint8_t *kvbm__put_be(uint8_t *p, uint64_t v, int n) {
  if (n == 8) { /* hashes: a byte swap and one store */
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
    return p + 8;
  }
  for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
  return p + n;
}

/* ---------------------------------------------------------------- reader */

typedef struct kvbm__mpr {
  const uint8_t *p;
  const uint8_t *end;
} kvbm__mpr;

/* What the next value is, coarsely. */
typedef enum kvbm__mpr_kind {
  KVBM__MPR_NIL, KVBM__MPR_BOOL, KVBM__MPR_INT, KVBM__MPR_FLOAT, KVBM__MPR_STR, KVBM__MPR_BIN, KVBM__MPR_ARRAY, KVBM__MPR_MAP,
  KVBM__MPR_EXT, KVBM__MPR_BAD, KVBM__MPR_END
} kvbm__mpr_kind;

static inline size_t kvbm__mpr_left(const kvbm__mpr *r) { return (size_t)(r->end - r->p); }

static inline kvbm__mpr_kind kvbm__mpr_peek(const kvbm__mpr *r) {
  if (r->p >= r->end) return KVBM__MPR_END;
  uint8_t b = *r->p;
  if (b <= 0x7f || b >= 0xe0) return KVBM__MPR_INT;
  if (b <= 0x8f) return KVBM__MPR_MAP;
  if (b <= 0x9f) return KVBM__MPR_ARRAY;
  if (b <= 0xbf) return KVBM__MPR_STR;
  switch (b) {
    case 0xc0: return KVBM__MPR_NIL;
    case 0xc2: case 0xc3: return KVBM__MPR_BOOL;
    case 0xc4: case 0xc5: case 0xc6: return KVBM__MPR_BIN;
    case 0xc7: case 0xc8: case 0xc9: case 0xd4: case 0xd5: case 0xd6:
    case 0xd7: case 0xd8: return KVBM__MPR_EXT;
    case 0xca: case 0xcb: return KVBM__MPR_FLOAT;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: return KVBM__MPR_INT;
    case 0xd9: case 0xda: case 0xdb: return KVBM__MPR_STR;
    case 0xdc: case 0xdd: return KVBM__MPR_ARRAY;
    case 0xde: case 0xdf: return KVBM__MPR_MAP;
    default: return KVBM__MPR_BAD; /* 0xc1 is never used */
  }
}

static inline const char *kvbm__mpr_kind_name(kvbm__mpr_kind k) {
  static const char *const names[] = {"nil", "bool", "integer", "float", "str",
                                      "bin", "array", "map", "ext", "invalid byte",
                                      "end of input"};
  return names[k];
}

/* Reads an integer. *neg tells whether it is negative; *u is the value for
 * non-negative ones and the two's complement bits for negative ones. */
static inline int kvbm__mpr_int(kvbm__mpr *r, uint64_t *u, bool *neg) {
  if (r->p >= r->end) return KVBM_ETRUNCATED;
  uint8_t b = *r->p;
  if (b <= 0x7f) { *u = b; *neg = false; r->p++; return 0; }
  if (b >= 0xe0) { *u = (uint64_t)(int64_t)(int8_t)b; *neg = true; r->p++; return 0; }
  int n;
  bool s;
  switch (b) {
    case 0xcc: n = 1; s = false; break;
    case 0xcd: n = 2; s = false; break;
    case 0xce: n = 4; s = false; break;
    case 0xcf: n = 8; s = false; break;
    case 0xd0: n = 1; s = true; break;
    case 0xd1: n = 2; s = true; break;
    case 0xd2: n = 4; s = true; break;
    case 0xd3: n = 8; s = true; break;
    default: return KVBM_EFORMAT;
  }
  if (kvbm__mpr_left(r) < (size_t)n + 1) return KVBM_ETRUNCATED;
  uint64_t v = kvbm__get_be(r->p + 1, n);
  if (s) {
    int shift = 64 - 8 * n;  /* sign-extend */
    int64_t sv = shift ? (int64_t)(v << shift) >> shift : (int64_t)v;
    *neg = sv < 0;
    v = (uint64_t)sv;
  } else {
    *neg = false;
  }
  *u = v;
  r->p += 1 + n;
  return 0;
}

/* Reads a float32/float64, or an integer as a double. */
static inline int kvbm__mpr_double(kvbm__mpr *r, double *out) {
  if (r->p >= r->end) return KVBM_ETRUNCATED;
  uint8_t b = *r->p;
  if (b == 0xca || b == 0xcb) {
    int n = b == 0xca ? 4 : 8;
    if (kvbm__mpr_left(r) < (size_t)n + 1) return KVBM_ETRUNCATED;
    uint64_t bits = kvbm__get_be(r->p + 1, n);
    if (n == 4) {
      uint32_t b32 = (uint32_t)bits;
      float f;
      memcpy(&f, &b32, 4);
      *out = f;
    } else {
      memcpy(out, &bits, 8);
    }
    r->p += 1 + n;
    return 0;
  }
  uint64_t u;
  bool neg;
  int rc = kvbm__mpr_int(r, &u, &neg);
  if (rc) return rc;
  *out = neg ? (double)(int64_t)u : (double)u;
  return 0;
}

/* Header of a str (want_bin false) or bin (true): length, then the bytes
 * in place. */
static inline int kvbm__mpr_bytes(kvbm__mpr *r, bool want_bin, const uint8_t **data, size_t *len) {
  if (r->p >= r->end) return KVBM_ETRUNCATED;
  uint8_t b = *r->p;
  size_t hdr, n;
  if (!want_bin && b >= 0xa0 && b <= 0xbf) {
    hdr = 1;
    n = b & 0x1f;
  } else {
    int w;
    switch (b) {
      case 0xd9: w = 1; if (want_bin) return KVBM_EFORMAT; break;
      case 0xda: w = 2; if (want_bin) return KVBM_EFORMAT; break;
      case 0xdb: w = 4; if (want_bin) return KVBM_EFORMAT; break;
      case 0xc4: w = 1; if (!want_bin) return KVBM_EFORMAT; break;
      case 0xc5: w = 2; if (!want_bin) return KVBM_EFORMAT; break;
      case 0xc6: w = 4; if (!want_bin) return KVBM_EFORMAT; break;
      default: return KVBM_EFORMAT;
    }
    if (kvbm__mpr_left(r) < (size_t)w + 1) return KVBM_ETRUNCATED;
    hdr = 1 + (size_t)w;
    n = (size_t)kvbm__get_be(r->p + 1, w);
  }
  if (kvbm__mpr_left(r) - hdr < n) return KVBM_ETRUNCATED;
  *data = r->p + hdr;
  *len = n;
  r->p += hdr + n;
  return 0;
}

/* Array or map header. The count is checked against the bytes left:
 * `per` is the least bytes one counted item takes (1 array, 2 map). */
static inline int kvbm__mpr_container(kvbm__mpr *r, bool map, uint32_t *count) {
  if (r->p >= r->end) return KVBM_ETRUNCATED;
  uint8_t b = *r->p;
  size_t hdr;
  uint64_t n;
  if (!map && b >= 0x90 && b <= 0x9f) { hdr = 1; n = b & 0x0f; }
  else if (map && b >= 0x80 && b <= 0x8f) { hdr = 1; n = b & 0x0f; }
  else if (b == (map ? 0xde : 0xdc)) { hdr = 3; }
  else if (b == (map ? 0xdf : 0xdd)) { hdr = 5; }
  else return KVBM_EFORMAT;
  if (kvbm__mpr_left(r) < hdr) return KVBM_ETRUNCATED;
  if (hdr > 1) n = kvbm__get_be(r->p + 1, (int)hdr - 1);
  if (n * (map ? 2u : 1u) > kvbm__mpr_left(r) - hdr) return KVBM_ETRUNCATED;
  *count = (uint32_t)n;
  r->p += hdr;
  return 0;
}

static inline int kvbm__mpr_array(kvbm__mpr *r, uint32_t *n) { return kvbm__mpr_container(r, false, n); }
static inline int kvbm__mpr_map(kvbm__mpr *r, uint32_t *n) { return kvbm__mpr_container(r, true, n); }

static inline bool kvbm__mpr_nil(kvbm__mpr *r) {
  if (r->p < r->end && *r->p == 0xc0) { r->p++; return true; }
  return false;
}

/* Skips one value of any kind, nested ones included, without recursion:
 * `pending` counts values still to skip. */
static inline int kvbm__mpr_skip(kvbm__mpr *r) {
  uint64_t pending = 1;
  while (pending) {
    pending--;
    kvbm__mpr_kind k = kvbm__mpr_peek(r);
    int rc = 0;
    switch (k) {
      case KVBM__MPR_END: return KVBM_ETRUNCATED;
      case KVBM__MPR_BAD: return KVBM_EFORMAT;
      case KVBM__MPR_NIL: case KVBM__MPR_BOOL: r->p++; break;
      case KVBM__MPR_INT: { uint64_t u; bool n; rc = kvbm__mpr_int(r, &u, &n); break; }
      case KVBM__MPR_FLOAT: { double d; rc = kvbm__mpr_double(r, &d); break; }
      case KVBM__MPR_STR: case KVBM__MPR_BIN: {
        const uint8_t *d; size_t l;
        rc = kvbm__mpr_bytes(r, k == KVBM__MPR_BIN, &d, &l);
        break;
      }
      case KVBM__MPR_ARRAY: case KVBM__MPR_MAP: {
        uint32_t n;
        rc = kvbm__mpr_container(r, k == KVBM__MPR_MAP, &n);
        pending += (uint64_t)n * (k == KVBM__MPR_MAP ? 2 : 1);
        break;
      }
      case KVBM__MPR_EXT: {
        uint8_t b = *r->p;
        size_t hdr, n;
        if (b >= 0xd4 && b <= 0xd8) { hdr = 2; n = (size_t)1 << (b - 0xd4); }
        else {
          int w = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
          if (kvbm__mpr_left(r) < (size_t)w + 2) return KVBM_ETRUNCATED;
          hdr = (size_t)w + 2;
          n = (size_t)kvbm__get_be(r->p + 1, w);
        }
        if (kvbm__mpr_left(r) < hdr || kvbm__mpr_left(r) - hdr < n) return KVBM_ETRUNCATED;
        r->p += hdr + n;
        break;
      }
    }
    if (rc) return rc;
  }
  return 0;
}

/* ------------------------------------------------------- cursor writers */

/* Most bytes one scalar or container header takes. */
#define KVBM__MP_SCALAR_MAX 9

/* Array (map = false) or map header of n items. */
static inline uint8_t *kvbm__mp_put_hdr(uint8_t *p, size_t n, bool map) {
  if (n < 16) { *p++ = (uint8_t)((map ? 0x80 : 0x90) | n); return p; }
  if (n < 65536) { *p++ = map ? 0xde : 0xdc; return kvbm__put_be(p, n, 2); }
  *p++ = map ? 0xdf : 0xdd;
  return kvbm__put_be(p, n, 4);
}

static inline uint8_t *kvbm__mp_put_uint(uint8_t *p, uint64_t v) {
  if (v < 128) { *p++ = (uint8_t)v; return p; }
  if (v < 256) { *p++ = 0xcc; *p++ = (uint8_t)v; return p; }
  if (v < 65536) { p[0] = 0xcd; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)v; return p + 3; }
  if (v <= UINT32_MAX) {
    p[0] = 0xce;
    p[1] = (uint8_t)(v >> 24);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 8);
    p[4] = (uint8_t)v;
    return p + 5;
  }
  *p++ = 0xcf;
  return kvbm__put_be(p, v, 8);
}

/* The same for a 32-bit value (token ids: 16 per block, most of a
 * BlockStored's bytes), each form one store: a uint32 is its tag and a
 * byte-swapped word, not five byte stores. */
static inline uint8_t *kvbm__mp_put_u32(uint8_t *p, uint32_t v) {
  if (v < 128) { *p = (uint8_t)v; return p + 1; }
  if (v >= 65536) {
    uint32_t be = __builtin_bswap32(v);
    p[0] = 0xce;
    memcpy(p + 1, &be, 4);
    return p + 5;
  }
  if (v < 256) { p[0] = 0xcc; p[1] = (uint8_t)v; return p + 2; }
  uint16_t be = __builtin_bswap16((uint16_t)v);
  p[0] = 0xcd;
  memcpy(p + 1, &be, 2);
  return p + 3;
}

/* A signed integer: non-negative ones as kvbm__mp_put_uint, negative ones
 * in the shortest signed form. */
static inline uint8_t *kvbm__mp_put_int(uint8_t *p, int64_t x) {
  uint64_t v = (uint64_t)x;
  if (x >= 0) return kvbm__mp_put_uint(p, v);
  if (x >= -32) { *p++ = (uint8_t)x; return p; }
  if (x >= INT8_MIN) { *p++ = 0xd0; return kvbm__put_be(p, v, 1); }
  if (x >= INT16_MIN) { *p++ = 0xd1; return kvbm__put_be(p, v, 2); }
  if (x >= INT32_MIN) { *p++ = 0xd2; return kvbm__put_be(p, v, 4); }
  *p++ = 0xd3;
  return kvbm__put_be(p, v, 8);
}

static inline uint8_t *kvbm__mp_put_nil(uint8_t *p) {
  *p++ = 0xc0;
  return p;
}

/* float64, as msgpack-c writes a double. */
static inline uint8_t *kvbm__mp_put_double(uint8_t *p, double d) {
  uint64_t bits;
  memcpy(&bits, &d, 8);
  *p++ = 0xcb;
  return kvbm__put_be(p, bits, 8);
}

/* A str of n bytes (room: n + 5). */
static inline uint8_t *kvbm__mp_put_str(uint8_t *p, const void *s, size_t n) {
  if (n < 32) *p++ = (uint8_t)(0xa0 | n);
  else if (n < 256) { *p++ = 0xd9; *p++ = (uint8_t)n; }
  else if (n < 65536) { *p++ = 0xda; p = kvbm__put_be(p, n, 2); }
  else { *p++ = 0xdb; p = kvbm__put_be(p, n, 4); }
  if (n) memcpy(p, s, n);
  return p + n;
}

/* Bytes that are msgpack already (a carried field, a preset header). */
static inline uint8_t *kvbm__mp_put_raw(uint8_t *p, const void *raw, size_t n) {
  if (n) memcpy(p, raw, n);
  return p + n;
}

/* ------------------------------------------------------- growing writer */

typedef struct kvbm__mpw {
  uint8_t **buf;
  size_t *len, *cap;
  bool oom;
} kvbm__mpw;

/* Room for n more bytes at the end, or NULL (then oom is set). */
static inline uint8_t *kvbm__mpw_room(kvbm__mpw *w, size_t n) {
  if (w->oom) return NULL;
  if (n > SIZE_MAX - *w->len ||
      kvbm__vec_reserve_of(w->buf, w->cap, *w->len + n, 256, KVBM__VEC_NO_LIMIT)) {
    w->oom = true;
    return NULL;
  }
  return *w->buf + *w->len;
}

/* The bytes up to `end` (inside the room just asked for) are written. */
static inline void kvbm__mpw_done(kvbm__mpw *w, uint8_t *end) {
  if (end) *w->len = (size_t)(end - *w->buf);
}

static inline void kvbm__mpw_uint(kvbm__mpw *w, uint64_t v) {
  uint8_t *p = kvbm__mpw_room(w, KVBM__MP_SCALAR_MAX);
  kvbm__mpw_done(w, p ? kvbm__mp_put_uint(p, v) : NULL);
}

static inline void kvbm__mpw_int(kvbm__mpw *w, int64_t v) {
  uint8_t *p = kvbm__mpw_room(w, KVBM__MP_SCALAR_MAX);
  kvbm__mpw_done(w, p ? kvbm__mp_put_int(p, v) : NULL);
}

static inline void kvbm__mpw_array(kvbm__mpw *w, uint32_t n) {
  uint8_t *p = kvbm__mpw_room(w, KVBM__MP_SCALAR_MAX);
  kvbm__mpw_done(w, p ? kvbm__mp_put_hdr(p, n, false) : NULL);
}

static inline void kvbm__mpw_map(kvbm__mpw *w, uint32_t n) {
  uint8_t *p = kvbm__mpw_room(w, KVBM__MP_SCALAR_MAX);
  kvbm__mpw_done(w, p ? kvbm__mp_put_hdr(p, n, true) : NULL);
}

static inline void kvbm__mpw_double(kvbm__mpw *w, double d) {
  uint8_t *p = kvbm__mpw_room(w, KVBM__MP_SCALAR_MAX);
  kvbm__mpw_done(w, p ? kvbm__mp_put_double(p, d) : NULL);
}

static inline void kvbm__mpw_nil(kvbm__mpw *w) {
  uint8_t *p = kvbm__mpw_room(w, 1);
  kvbm__mpw_done(w, p ? kvbm__mp_put_nil(p) : NULL);
}

static inline void kvbm__mpw_str(kvbm__mpw *w, const void *s, size_t n) {
  uint8_t *p = n > SIZE_MAX - 5 ? (w->oom = true, NULL) : kvbm__mpw_room(w, n + 5);
  kvbm__mpw_done(w, p ? kvbm__mp_put_str(p, s, n) : NULL);
}

static inline void kvbm__mpw_raw(kvbm__mpw *w, const void *s, size_t n) {
  uint8_t *p = kvbm__mpw_room(w, n);
  kvbm__mpw_done(w, p ? kvbm__mp_put_raw(p, s, n) : NULL);
}

#endif
