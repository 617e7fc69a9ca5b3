/*
 * blake3_sse41.c: the 4-wide many kernel (SSE4.1, 128-bit vectors).
 *
 * Built without special compiler flags: every function carries a target
 * attribute, and the hasher calls it only when __builtin_cpu_supports says
 * the CPU has SSE4.1. Rotations by 16 and 8 are byte shuffles (one
 * instruction); 12 and 7 are two shifts and an or.
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

B3V_KERNEL(b3_many_sse41, load4)

#endif /* B3_X86 */
