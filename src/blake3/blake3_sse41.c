/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_sse41.c: the 4-wide many kernel (SSE4.1, 128-bit vectors).
 *
 * Built without special compiler flags: every function carries a target
 * attribute, and the hasher calls it only when __builtin_cpu_supports says
 * the CPU has SSE4.1. Rotations by 16 and 8 are byte shuffles (one
 * instruction); 12 and 7 are two shifts and an or.
 *
 * Also here: one compression at a time with the state held as four row
 * vectors (kvbm__b3_compress_sse41), for what cannot be batched (the current
 * chunk, stack merges, the root and extended output). The four G mixes of
 * a column step run in the lanes of the rows; rotating rows b, c, d by
 * one, two and three lanes turns diagonals into columns and back. About
 * twice as fast as the portable function.
 */
#include "blake3/blake3_impl.h"

#ifdef B3_X86
#include <immintrin.h>

/* The kernel is a long straight line of vector code; GCC's -O3 schedules
 * it noticeably better than the project's -O2 (about 10%). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#define B3V_TARGET __attribute__((target("sse4.1")))
#define FN static inline __attribute__((target("sse4.1"), always_inline))

FN __m128i ror16(__m128i x) {
  return _mm_shuffle_epi8(
      x, _mm_setr_epi8(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
}
FN __m128i ror8(__m128i x) {
  return _mm_shuffle_epi8(
      x, _mm_setr_epi8(1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12));
}
FN __m128i ror12(__m128i x) {
  return _mm_or_si128(_mm_srli_epi32(x, 12), _mm_slli_epi32(x, 20));
}
FN __m128i ror7(__m128i x) {
  return _mm_or_si128(_mm_srli_epi32(x, 7), _mm_slli_epi32(x, 25));
}

/* Word j of the block of input i goes to lane i of m[j]: four 4x4
 * transposes of 32-bit words. */
FN void load4(const uint8_t *in, size_t stride, __m128i m[16]) {
  B3_UNROLL for (int g = 0; g < 4; g++) {
    __m128i r0 = _mm_loadu_si128((const __m128i *)(in + 16 * g));
    __m128i r1 = _mm_loadu_si128((const __m128i *)(in + stride + 16 * g));
    __m128i r2 = _mm_loadu_si128((const __m128i *)(in + 2 * stride + 16 * g));
    __m128i r3 = _mm_loadu_si128((const __m128i *)(in + 3 * stride + 16 * g));
    if (g == 0)
      for (int i = 0; i < 4; i++) B3_PREFETCH(in + i * stride);
    __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpackhi_epi32(r0, r1);
    __m128i t2 = _mm_unpacklo_epi32(r2, r3), t3 = _mm_unpackhi_epi32(r2, r3);
    m[4 * g + 0] = _mm_unpacklo_epi64(t0, t2);
    m[4 * g + 1] = _mm_unpackhi_epi64(t0, t2);
    m[4 * g + 2] = _mm_unpacklo_epi64(t1, t3);
    m[4 * g + 3] = _mm_unpackhi_epi64(t1, t3);
  }
}

#define B3V __m128i
#define B3V_W 4
#define B3V_ADD _mm_add_epi32
#define B3V_XOR _mm_xor_si128
#define B3V_SET1(x) _mm_set1_epi32((int)(x))
#define B3V_LOADU(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define B3V_STOREU(p, v) _mm_storeu_si128((__m128i *)(void *)(p), (v))
#define B3V_ROR16 ror16
#define B3V_ROR12 ror12
#define B3V_ROR8 ror8
#define B3V_ROR7 ror7
#include "blake3/blake3_simd.h"

B3V_KERNEL(kvbm__b3_many_sse41, load4)

FN __m128i words4(const uint32_t m[16], const uint8_t *s, int first) {
  return _mm_setr_epi32((int)m[s[first]], (int)m[s[first + 2]],
                        (int)m[s[first + 4]], (int)m[s[first + 6]]);
}

/* Half a G on all four lanes: add a message word, then rotate d by r1
 * and b by r2 (16/12 for the first half, 8/7 for the second). */
#define HALF_G(mw, rot_d, rot_b)                      \
  do {                                                \
    a = _mm_add_epi32(_mm_add_epi32(a, b), (mw));     \
    d = rot_d(_mm_xor_si128(d, a));                   \
    c = _mm_add_epi32(c, d);                          \
    b = rot_b(_mm_xor_si128(b, c));                   \
  } while (0)

B3V_TARGET void kvbm__b3_compress_sse41(const uint32_t cv[8], const uint8_t block[64],
                                  uint8_t block_len, uint64_t counter,
                                  uint8_t flags, uint32_t out[16]) {
  uint32_t m[16];
  memcpy(m, block, sizeof m); /* x86: little-endian already */
  const __m128i cv0 = _mm_loadu_si128((const __m128i *)(const void *)cv);
  const __m128i cv1 = _mm_loadu_si128((const __m128i *)(const void *)(cv + 4));
  __m128i a = cv0, b = cv1;
  __m128i c = _mm_setr_epi32((int)b3_iv[0], (int)b3_iv[1], (int)b3_iv[2],
                             (int)b3_iv[3]);
  __m128i d = _mm_setr_epi32((int)(uint32_t)counter,
                             (int)(uint32_t)(counter >> 32), block_len, flags);
  B3_UNROLL for (int r = 0; r < 7; r++) {
    const uint8_t *s = b3_schedule[r];
    HALF_G(words4(m, s, 0), ror16, ror12);
    HALF_G(words4(m, s, 1), ror8, ror7);
    /* Diagonals into columns. */
    b = _mm_shuffle_epi32(b, 0x39);
    c = _mm_shuffle_epi32(c, 0x4E);
    d = _mm_shuffle_epi32(d, 0x93);
    HALF_G(words4(m, s, 8), ror16, ror12);
    HALF_G(words4(m, s, 9), ror8, ror7);
    b = _mm_shuffle_epi32(b, 0x93);
    c = _mm_shuffle_epi32(c, 0x4E);
    d = _mm_shuffle_epi32(d, 0x39);
  }
  _mm_storeu_si128((__m128i *)(void *)out, _mm_xor_si128(a, c));
  _mm_storeu_si128((__m128i *)(void *)(out + 4), _mm_xor_si128(b, d));
  _mm_storeu_si128((__m128i *)(void *)(out + 8), _mm_xor_si128(c, cv0));
  _mm_storeu_si128((__m128i *)(void *)(out + 12), _mm_xor_si128(d, cv1));
}

#endif /* B3_X86 */
