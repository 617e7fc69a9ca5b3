/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mpread.h: a bounds-checked msgpack reader over a byte range (private).
 *
 * Why not msgpack-c's unpacker for decoding: msgpack_unpack() allocates
 * `count * sizeof(msgpack_object)` for an array header before it checks that
 * the input holds that many elements, so a 5-byte message (0xdd ff ff ff ff)
 * asks for 64 GiB. This reader checks every declared count against the
 * bytes left (each element takes at least one byte, a map entry two) before
 * anyone sizes anything by it, never allocates, and reads values in place,
 * which is also what makes decoding a million block events a second cheap.
 * Encoding still goes through msgpack-c (codec.c).
 *
 * Every function returns 0 or a negative kvbm_status and advances the
 * cursor only on success.
 */
#ifndef KVBM_EVENT_CODEC_MPREAD_H
#define KVBM_EVENT_CODEC_MPREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvbm/status.h"

typedef struct mpr {
  const uint8_t *p;
  const uint8_t *end;
} mpr;

/* What the next value is, coarsely. */
typedef enum mpr_kind {
  MPR_NIL, MPR_BOOL, MPR_INT, MPR_FLOAT, MPR_STR, MPR_BIN, MPR_ARRAY, MPR_MAP,
  MPR_EXT, MPR_BAD, MPR_END
} mpr_kind;

static inline size_t mpr_left(const mpr *r) { return (size_t)(r->end - r->p); }

static inline uint64_t mpr_be(const uint8_t *p, int n) {
  if (n == 8) { /* hashes: one load and a byte swap, not eight shifts */
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
  }
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = v << 8 | p[i];
  return v;
}

static inline mpr_kind mpr_peek(const mpr *r) {
  if (r->p >= r->end) return MPR_END;
  uint8_t b = *r->p;
  if (b <= 0x7f || b >= 0xe0) return MPR_INT;
  if (b <= 0x8f) return MPR_MAP;
  if (b <= 0x9f) return MPR_ARRAY;
  if (b <= 0xbf) return MPR_STR;
  switch (b) {
    case 0xc0: return MPR_NIL;
    case 0xc2: case 0xc3: return MPR_BOOL;
    case 0xc4: case 0xc5: case 0xc6: return MPR_BIN;
    case 0xc7: case 0xc8: case 0xc9: case 0xd4: case 0xd5: case 0xd6:
    case 0xd7: case 0xd8: return MPR_EXT;
    case 0xca: case 0xcb: return MPR_FLOAT;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: return MPR_INT;
    case 0xd9: case 0xda: case 0xdb: return MPR_STR;
    case 0xdc: case 0xdd: return MPR_ARRAY;
    case 0xde: case 0xdf: return MPR_MAP;
    default: return MPR_BAD; /* 0xc1 is never used */
  }
}

static inline const char *mpr_kind_name(mpr_kind k) {
  static const char *const names[] = {"nil", "bool", "integer", "float", "str",
                                      "bin", "array", "map", "ext", "invalid byte",
                                      "end of input"};
  return names[k];
}

/* Reads an integer. *neg tells whether it is negative; *u is the value for
 * non-negative ones and the two's complement bits for negative ones. */
static inline int mpr_int(mpr *r, uint64_t *u, bool *neg) {
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
  if (mpr_left(r) < (size_t)n + 1) return KVBM_ETRUNCATED;
  uint64_t v = mpr_be(r->p + 1, n);
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
static inline int mpr_double(mpr *r, double *out) {
  if (r->p >= r->end) return KVBM_ETRUNCATED;
  uint8_t b = *r->p;
  if (b == 0xca || b == 0xcb) {
    int n = b == 0xca ? 4 : 8;
    if (mpr_left(r) < (size_t)n + 1) return KVBM_ETRUNCATED;
    uint64_t bits = mpr_be(r->p + 1, n);
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
  int rc = mpr_int(r, &u, &neg);
  if (rc) return rc;
  *out = neg ? (double)(int64_t)u : (double)u;
  return 0;
}

/* Header of a str (want_bin false) or bin (true): length, then the bytes
 * in place. */
static inline int mpr_bytes(mpr *r, bool want_bin, const uint8_t **data, size_t *len) {
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
    if (mpr_left(r) < (size_t)w + 1) return KVBM_ETRUNCATED;
    hdr = 1 + (size_t)w;
    n = (size_t)mpr_be(r->p + 1, w);
  }
  if (mpr_left(r) - hdr < n) return KVBM_ETRUNCATED;
  *data = r->p + hdr;
  *len = n;
  r->p += hdr + n;
  return 0;
}

/* Array or map header. The count is checked against the bytes left:
 * `per` is the least bytes one counted item takes (1 array, 2 map). */
static inline int mpr_container(mpr *r, bool map, uint32_t *count) {
  if (r->p >= r->end) return KVBM_ETRUNCATED;
  uint8_t b = *r->p;
  size_t hdr;
  uint64_t n;
  if (!map && b >= 0x90 && b <= 0x9f) { hdr = 1; n = b & 0x0f; }
  else if (map && b >= 0x80 && b <= 0x8f) { hdr = 1; n = b & 0x0f; }
  else if (b == (map ? 0xde : 0xdc)) { hdr = 3; }
  else if (b == (map ? 0xdf : 0xdd)) { hdr = 5; }
  else return KVBM_EFORMAT;
  if (mpr_left(r) < hdr) return KVBM_ETRUNCATED;
  if (hdr > 1) n = mpr_be(r->p + 1, (int)hdr - 1);
  if (n * (map ? 2u : 1u) > mpr_left(r) - hdr) return KVBM_ETRUNCATED;
  *count = (uint32_t)n;
  r->p += hdr;
  return 0;
}

static inline int mpr_array(mpr *r, uint32_t *n) { return mpr_container(r, false, n); }
static inline int mpr_map(mpr *r, uint32_t *n) { return mpr_container(r, true, n); }

static inline bool mpr_nil(mpr *r) {
  if (r->p < r->end && *r->p == 0xc0) { r->p++; return true; }
  return false;
}

/* Skips one value of any kind, nested ones included, without recursion:
 * `pending` counts values still to skip. */
static inline int mpr_skip(mpr *r) {
  uint64_t pending = 1;
  while (pending) {
    pending--;
    mpr_kind k = mpr_peek(r);
    int rc = 0;
    switch (k) {
      case MPR_END: return KVBM_ETRUNCATED;
      case MPR_BAD: return KVBM_EFORMAT;
      case MPR_NIL: case MPR_BOOL: r->p++; break;
      case MPR_INT: { uint64_t u; bool n; rc = mpr_int(r, &u, &n); break; }
      case MPR_FLOAT: { double d; rc = mpr_double(r, &d); break; }
      case MPR_STR: case MPR_BIN: {
        const uint8_t *d; size_t l;
        rc = mpr_bytes(r, k == MPR_BIN, &d, &l);
        break;
      }
      case MPR_ARRAY: case MPR_MAP: {
        uint32_t n;
        rc = mpr_container(r, k == MPR_MAP, &n);
        pending += (uint64_t)n * (k == MPR_MAP ? 2 : 1);
        break;
      }
      case MPR_EXT: {
        uint8_t b = *r->p;
        size_t hdr, n;
        if (b >= 0xd4 && b <= 0xd8) { hdr = 2; n = (size_t)1 << (b - 0xd4); }
        else {
          int w = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
          if (mpr_left(r) < (size_t)w + 2) return KVBM_ETRUNCATED;
          hdr = (size_t)w + 2;
          n = (size_t)mpr_be(r->p + 1, w);
        }
        if (mpr_left(r) < hdr || mpr_left(r) - hdr < n) return KVBM_ETRUNCATED;
        r->p += hdr + n;
        break;
      }
    }
    if (rc) return rc;
  }
  return 0;
}

#endif
