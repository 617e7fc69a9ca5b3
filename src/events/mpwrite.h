/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mpwrite.h: a small msgpack writer into a growing buffer (private;
 * header-only). The counterpart of mpread.h for the formats kvbm defines
 * itself (storage events, advisor hints): a handful of integers and short
 * strings per record, where a dozen lines are easier to check than
 * msgpack-c's packer callbacks. Running out of memory is sticky: every
 * later write is a no-op and `oom` stays set, so a caller checks once.
 */
#ifndef KVBM_EVENTS_MPWRITE_H
#define KVBM_EVENTS_MPWRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"

typedef struct mpw {
  uint8_t **buf;
  size_t *len, *cap;
  bool oom;
} mpw;

static inline uint8_t *mpw_room(mpw *w, size_t n) {
  if (w->oom) return NULL;
  if (kvbm__vec_reserve_of(w->buf, w->cap, *w->len + n, 256, KVBM__VEC_NO_LIMIT)) {
    w->oom = true;
    return NULL;
  }
  uint8_t *p = *w->buf + *w->len;
  *w->len += n;
  return p;
}

static inline void mpw_be(uint8_t *p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

static inline void mpw_uint(mpw *w, uint64_t v) {
  uint8_t *p;
  if (v <= 0x7f) {
    if ((p = mpw_room(w, 1))) p[0] = (uint8_t)v;
  } else if (v <= 0xff) {
    if ((p = mpw_room(w, 2))) p[0] = 0xcc, p[1] = (uint8_t)v;
  } else if (v <= 0xffff) {
    if ((p = mpw_room(w, 3))) p[0] = 0xcd, mpw_be(p + 1, v, 2);
  } else if (v <= 0xffffffffu) {
    if ((p = mpw_room(w, 5))) p[0] = 0xce, mpw_be(p + 1, v, 4);
  } else if ((p = mpw_room(w, 9))) {
    p[0] = 0xcf, mpw_be(p + 1, v, 8);
  }
}

static inline void mpw_str(mpw *w, const void *s, size_t n) {
  uint8_t *p;
  if (n <= 31) {
    if ((p = mpw_room(w, 1 + n))) p[0] = (uint8_t)(0xa0 | n), memcpy(p + 1, s, n);
  } else if (n <= 0xff) {
    if ((p = mpw_room(w, 2 + n))) p[0] = 0xd9, p[1] = (uint8_t)n, memcpy(p + 2, s, n);
  } else if (n <= 0xffff) {
    if ((p = mpw_room(w, 3 + n))) p[0] = 0xda, mpw_be(p + 1, n, 2), memcpy(p + 3, s, n);
  } else if ((p = mpw_room(w, 5 + n))) {
    p[0] = 0xdb, mpw_be(p + 1, n, 4), memcpy(p + 5, s, n);
  }
}

static inline void mpw_array(mpw *w, uint32_t n) {
  uint8_t *p;
  if (n <= 15) {
    if ((p = mpw_room(w, 1))) p[0] = (uint8_t)(0x90 | n);
  } else if (n <= 0xffff) {
    if ((p = mpw_room(w, 3))) p[0] = 0xdc, mpw_be(p + 1, n, 2);
  } else if ((p = mpw_room(w, 5))) {
    p[0] = 0xdd, mpw_be(p + 1, n, 4);
  }
}

static inline void mpw_double(mpw *w, double d) {
  uint8_t *p = mpw_room(w, 9);
  uint64_t bits;
  memcpy(&bits, &d, 8);
  if (p) p[0] = 0xcb, mpw_be(p + 1, bits, 8);
}

static inline void mpw_nil(mpw *w) {
  uint8_t *p = mpw_room(w, 1);
  if (p) p[0] = 0xc0;
}

static inline void mpw_raw(mpw *w, const void *s, size_t n) {
  uint8_t *p = mpw_room(w, n);
  if (p && n) memcpy(p, s, n);
}

#endif
