/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_portable.c: the BLAKE3 compression function in plain C.
 *
 * This is the reference path every SIMD kernel is tested against, and the
 * path used for the few compressions that cannot be batched (the current
 * chunk, parent merges on the subtree stack, the root and extended
 * output). It follows the specification literally: a 16-word state, seven
 * rounds of column then diagonal G mixes, message words picked through a
 * precomputed per-round schedule rather than permuting the block in place.
 */
#include "blake3/blake3_impl.h"

const uint32_t b3_iv[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u,
                           0xA54FF53Au, 0x510E527Fu, 0x9B05688Cu,
                           0x1F83D9ABu, 0x5BE0CD19u};

static inline uint32_t rotr(uint32_t w, unsigned c) {
  return (w >> c) | (w << (32 - c));
}

static inline void g(uint32_t v[16], int a, int b, int c, int d, uint32_t x,
                     uint32_t y) {
  v[a] = v[a] + v[b] + x;
  v[d] = rotr(v[d] ^ v[a], 16);
  v[c] = v[c] + v[d];
  v[b] = rotr(v[b] ^ v[c], 12);
  v[a] = v[a] + v[b] + y;
  v[d] = rotr(v[d] ^ v[a], 8);
  v[c] = v[c] + v[d];
  v[b] = rotr(v[b] ^ v[c], 7);
}

void kvbm__b3_compress_portable(const uint32_t cv[8], const uint8_t block[64],
                          uint8_t block_len, uint64_t counter, uint8_t flags,
                          uint32_t out[16]) {
  uint32_t m[16], v[16];
  for (int i = 0; i < 16; i++) m[i] = b3_load32(block + 4 * i);
  for (int i = 0; i < 8; i++) v[i] = cv[i];
  for (int i = 0; i < 4; i++) v[8 + i] = b3_iv[i];
  v[12] = (uint32_t)counter;
  v[13] = (uint32_t)(counter >> 32);
  v[14] = block_len;
  v[15] = flags;
  for (int r = 0; r < 7; r++) {
    const uint8_t *s = b3_schedule[r];
    g(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
    g(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
    g(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
    g(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
    g(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
    g(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
    g(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
    g(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; i++) {
    out[i] = v[i] ^ v[i + 8];
    out[i + 8] = v[i + 8] ^ cv[i];
  }
}

void kvbm__b3_many_portable(const b3_many_args *a, size_t n, uint8_t *out) {
  for (size_t i = 0; i < n; i++) {
    const uint8_t *in = a->in + i * a->stride;
    uint64_t counter = a->counter + (uint64_t)a->counter_step * i;
    uint32_t cv[8], st[16];
    memcpy(cv, a->key, sizeof cv);
    for (size_t b = 0; b < a->nblocks; b++) {
      uint8_t flags = a->flags;
      if (b == 0) flags |= a->flags_first;
      if (b + 1 == a->nblocks) flags |= a->flags_last;
      kvbm__b3_compress_portable(cv, in + b * B3_BLOCK_LEN, B3_BLOCK_LEN, counter,
                           flags, st);
      memcpy(cv, st, sizeof cv);
    }
    b3_store_cv(out + 32 * i, cv);
  }
}
