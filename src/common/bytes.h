/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bytes.h: little-endian integers in byte buffers (private).
 *
 * The binary formats kvbm writes itself (the fabric's wire, block
 * messages, serialized layouts, the disk slot file, framed tier values,
 * the peers' control messages) store integers little-endian, byte by
 * byte, so that they read the same on any host and from any alignment.
 * One copy of the four helpers serves them all; compilers turn each into
 * a single load or store.
 */
#ifndef KVBM_COMMON_BYTES_H
#define KVBM_COMMON_BYTES_H

#include <stdint.h>

static inline void kvbm__put_le16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void kvbm__put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvbm__put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kvbm__get_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t kvbm__get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t kvbm__get_le64(const uint8_t *p) {
  return (uint64_t)kvbm__get_le32(p) | (uint64_t)kvbm__get_le32(p + 4) << 32;
}

/* The low n bytes of v (n = 1..8), for formats whose field widths come
 * from a table (the router's snapshots); msgpack.h has the big-endian
 * pair. */
static inline void kvbm__put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++, v >>= 8) p[i] = (uint8_t)v;
}
static inline uint64_t kvbm__get_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

#endif
