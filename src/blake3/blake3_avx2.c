/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_avx2.c: the 8-wide many kernel (AVX2, 256-bit vectors).
 *
 * Same scheme as the SSE4.1 kernel with twice the lanes; only the message
 * transpose differs (8x8, whose last step swaps 128-bit halves because
 * AVX2 unpacks work within each half).
 */
#include "blake3/blake3_impl.h"

#ifdef B3_X86
#include <immintrin.h>

/* The kernel is a long straight line of vector code; GCC's -O3 schedules
 * it noticeably better than the project's -O2 (about 10%). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#define B3V_TARGET __attribute__((target("avx2")))
#define FN static inline __attribute__((target("avx2"), always_inline))

FN __m256i ror16(__m256i x) {
  return _mm256_shuffle_epi8(
      x, _mm256_setr_epi8(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13,
                          2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12,
                          13));
}
FN __m256i ror8(__m256i x) {
  return _mm256_shuffle_epi8(
      x, _mm256_setr_epi8(1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12,
                          1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15,
                          12));
}
FN __m256i ror12(__m256i x) {
  return _mm256_or_si256(_mm256_srli_epi32(x, 12), _mm256_slli_epi32(x, 20));
}
FN __m256i ror7(__m256i x) {
  return _mm256_or_si256(_mm256_srli_epi32(x, 7), _mm256_slli_epi32(x, 25));
}

/* Two 8x8 transposes: words 0-7, then 8-15, of the 8 inputs. */
FN void load8(const uint8_t *in, size_t stride, __m256i m[16]) {
  B3_UNROLL for (int half = 0; half < 2; half++) {
    __m256i r[8], t[8], u[8];
    B3_UNROLL for (int i = 0; i < 8; i++) {
      r[i] = _mm256_loadu_si256(
          (const __m256i *)(const void *)(in + i * stride + 32 * half));
      if (half == 0) B3_PREFETCH(in + i * stride);
    }
    B3_UNROLL for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    B3_UNROLL for (int q = 0; q < 8; q += 4) {
      u[q + 0] = _mm256_unpacklo_epi64(t[q], t[q + 2]);
      u[q + 1] = _mm256_unpackhi_epi64(t[q], t[q + 2]);
      u[q + 2] = _mm256_unpacklo_epi64(t[q + 1], t[q + 3]);
      u[q + 3] = _mm256_unpackhi_epi64(t[q + 1], t[q + 3]);
    }
    /* u[s] holds words s (low half) and s+4 (high half) of inputs 0-3,
     * u[4+s] the same for inputs 4-7. */
    B3_UNROLL for (int s = 0; s < 4; s++) {
      m[8 * half + s] = _mm256_permute2x128_si256(u[s], u[4 + s], 0x20);
      m[8 * half + s + 4] = _mm256_permute2x128_si256(u[s], u[4 + s], 0x31);
    }
  }
}

#define B3V __m256i
#define B3V_W 8
#define B3V_ADD _mm256_add_epi32
#define B3V_XOR _mm256_xor_si256
#define B3V_SET1(x) _mm256_set1_epi32((int)(x))
#define B3V_LOADU(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define B3V_STOREU(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), (v))
#define B3V_ROR16 ror16
#define B3V_ROR12 ror12
#define B3V_ROR8 ror8
#define B3V_ROR7 ror7
#include "blake3/blake3_simd.h"

B3V_KERNEL(kvbm__b3_many_avx2, load8)

#endif /* B3_X86 */
