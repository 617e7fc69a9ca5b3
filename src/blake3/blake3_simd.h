/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_simd.h: the body shared by the SIMD kernels, as a template.
 *
 * Each kernel file defines a vector type and its operations, includes this
 * file, and gets B3V_KERNEL(name, load): a many kernel of width B3V_W that
 * keeps lane i = input i ("one input per lane": the state of W independent
 * compressions lives in 16 vectors, word j of every input in vector j), so
 * G mixes are plain vertical adds, xors and rotates with no shuffles; the
 * price is transposing each message block on load, done by `load`.
 *
 * Required macros: B3V (vector type), B3V_W (lanes), B3V_TARGET (the
 * kernel's target attribute), B3V_ADD, B3V_XOR, B3V_SET1, B3V_LOADU and
 * B3V_STOREU (W words, unaligned), B3V_ROR16, B3V_ROR12, B3V_ROR8,
 * B3V_ROR7 (rotate each word right).
 */
#ifndef B3V
#error "define the vector operations before including blake3_simd.h"
#endif

/* How a round reads message word i; a kernel may override it. */
#ifndef B3V_MSG
#define B3V_MSG(i) m[i]
#endif

#define B3V_G(a, b, c, d, x, y)               \
  do {                                         \
    v[a] = B3V_ADD(B3V_ADD(v[a], v[b]), (x)); \
    v[d] = B3V_ROR16(B3V_XOR(v[d], v[a]));    \
    v[c] = B3V_ADD(v[c], v[d]);               \
    v[b] = B3V_ROR12(B3V_XOR(v[b], v[c]));    \
    v[a] = B3V_ADD(B3V_ADD(v[a], v[b]), (y)); \
    v[d] = B3V_ROR8(B3V_XOR(v[d], v[a]));     \
    v[c] = B3V_ADD(v[c], v[d]);               \
    v[b] = B3V_ROR7(B3V_XOR(v[b], v[c]));     \
  } while (0)

/* One round with the message words in the given (constant) order. */
#define B3V_ROUND(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, \
                  s13, s14, s15)                                         \
  do {                                                                   \
    B3V_G(0, 4, 8, 12, B3V_MSG(s0), B3V_MSG(s1));                                    \
    B3V_G(1, 5, 9, 13, B3V_MSG(s2), B3V_MSG(s3));                                    \
    B3V_G(2, 6, 10, 14, B3V_MSG(s4), B3V_MSG(s5));                                   \
    B3V_G(3, 7, 11, 15, B3V_MSG(s6), B3V_MSG(s7));                                   \
    B3V_G(0, 5, 10, 15, B3V_MSG(s8), B3V_MSG(s9));                                   \
    B3V_G(1, 6, 11, 12, B3V_MSG(s10), B3V_MSG(s11));                                 \
    B3V_G(2, 7, 8, 13, B3V_MSG(s12), B3V_MSG(s13));                                  \
    B3V_G(3, 4, 9, 14, B3V_MSG(s14), B3V_MSG(s15));                                  \
  } while (0)

/* The seven rounds, schedule as in b3_schedule. */
#define B3V_ROUNDS \
  B3V_ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); \
  B3V_ROUND(2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8); \
  B3V_ROUND(3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1); \
  B3V_ROUND(10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6); \
  B3V_ROUND(12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4); \
  B3V_ROUND(9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7); \
  B3V_ROUND(11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13); \
  do {            \
  } while (0)

#define B3V_KERNEL(name, load)                                              \
  B3V_TARGET void name(const b3_many_args *a, uint8_t *out) {                 \
    uint32_t lo[B3V_W], hi[B3V_W];                                          \
    B3_UNROLL for (int i = 0; i < B3V_W; i++) {                                       \
      uint64_t c = a->counter + (uint64_t)a->counter_step * (uint64_t)i;    \
      lo[i] = (uint32_t)c;                                                  \
      hi[i] = (uint32_t)(c >> 32);                                          \
    }                                                                       \
    const B3V ctr_lo = B3V_LOADU(lo), ctr_hi = B3V_LOADU(hi);               \
    B3V h[8];                                                               \
    B3_UNROLL for (int i = 0; i < 8; i++) h[i] = B3V_SET1(a->key[i]);                 \
    for (size_t b = 0; b < a->nblocks; b++) {                               \
      B3V m[16], v[16];                                                     \
      load(a->in + b * B3_BLOCK_LEN, a->stride, m);                         \
      uint32_t fl = a->flags;                                               \
      if (b == 0) fl |= a->flags_first;                                     \
      if (b + 1 == a->nblocks) fl |= a->flags_last;                         \
      B3_UNROLL for (int i = 0; i < 8; i++) v[i] = h[i];                              \
      B3_UNROLL for (int i = 0; i < 4; i++) v[8 + i] = B3V_SET1(b3_iv[i]);            \
      v[12] = ctr_lo;                                                       \
      v[13] = ctr_hi;                                                       \
      v[14] = B3V_SET1(B3_BLOCK_LEN);                                       \
      v[15] = B3V_SET1(fl);                                                 \
      B3V_ROUNDS;                                                           \
      B3_UNROLL for (int i = 0; i < 8; i++) h[i] = B3V_XOR(v[i], v[i + 8]);           \
    }                                                                       \
    /* Back from word-major to input-major: rare next to the rounds. The  \
     * kernels are x86 only, so words are stored little-endian as is. */  \
    uint32_t w[8][B3V_W];                                                   \
    B3_UNROLL for (int i = 0; i < 8; i++) B3V_STOREU(w[i], h[i]);           \
    for (int l = 0; l < B3V_W; l++)                                         \
      for (int i = 0; i < 8; i++) memcpy(out + 32 * l + 4 * i, &w[i][l], 4); \
  }
