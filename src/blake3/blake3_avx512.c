/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_avx512.c: the 16-wide many kernel (AVX-512F, 512-bit vectors).
 *
 * AVX-512F has a true 32-bit rotate, so every rotation is one instruction.
 * The 16x16 message transpose is four shuffle stages: 32-bit and 64-bit
 * unpacks within 128-bit lanes, then a 4x4 transpose of 128-bit lanes.
 */
#include "blake3/blake3_impl.h"

#ifdef B3_X86
#include <immintrin.h>

/* The kernel is a long straight line of vector code; GCC's -O3 schedules
 * it noticeably better than the project's -O2 (about 10%). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#define B3V_TARGET __attribute__((target("avx512f")))
#define FN static inline __attribute__((target("avx512f"), always_inline))

FN void load16(const uint8_t *in, size_t stride, __m512i m[16]) {
  __m512i r[16], t[16], u[16];
  B3_UNROLL for (int i = 0; i < 16; i++) {
    r[i] = _mm512_loadu_si512((const void *)(in + i * stride));
    B3_PREFETCH(in + i * stride);
  }
  B3_UNROLL for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  /* u[4q+s], 128-bit lane k: word 4k+s of inputs 4q..4q+3. */
  B3_UNROLL for (int q = 0; q < 16; q += 4) {
    u[q + 0] = _mm512_unpacklo_epi64(t[q], t[q + 2]);
    u[q + 1] = _mm512_unpackhi_epi64(t[q], t[q + 2]);
    u[q + 2] = _mm512_unpacklo_epi64(t[q + 1], t[q + 3]);
    u[q + 3] = _mm512_unpackhi_epi64(t[q + 1], t[q + 3]);
  }
  /* m[4k+s] gathers lane k of u[s], u[4+s], u[8+s], u[12+s]. */
  B3_UNROLL for (int s = 0; s < 4; s++) {
    __m512i c0 = _mm512_shuffle_i32x4(u[s], u[4 + s], 0x44);
    __m512i c1 = _mm512_shuffle_i32x4(u[s], u[4 + s], 0xEE);
    __m512i c2 = _mm512_shuffle_i32x4(u[8 + s], u[12 + s], 0x44);
    __m512i c3 = _mm512_shuffle_i32x4(u[8 + s], u[12 + s], 0xEE);
    m[s] = _mm512_shuffle_i32x4(c0, c2, 0x88);
    m[4 + s] = _mm512_shuffle_i32x4(c0, c2, 0xDD);
    m[8 + s] = _mm512_shuffle_i32x4(c1, c3, 0x88);
    m[12 + s] = _mm512_shuffle_i32x4(c1, c3, 0xDD);
  }
}

#define B3V __m512i
#define B3V_W 16
#define B3V_ADD _mm512_add_epi32
#define B3V_XOR _mm512_xor_si512
#define B3V_SET1(x) _mm512_set1_epi32((int)(x))
#define B3V_LOADU(p) _mm512_loadu_si512((const void *)(p))
#define B3V_STOREU(p, v) _mm512_storeu_si512((void *)(p), (v))
#define B3V_ROR16(x) _mm512_ror_epi32((x), 16)
#define B3V_ROR12(x) _mm512_ror_epi32((x), 12)
#define B3V_ROR8(x) _mm512_ror_epi32((x), 8)
#define B3V_ROR7(x) _mm512_ror_epi32((x), 7)
/* Message words are read from memory at each use (vpaddd takes a memory
 * operand for free): left to itself GCC keeps all 16 in registers and
 * spills state words instead, which costs about 10%. */
#define B3V_MSG(i) (*(volatile __m512i *)&m[i])
#include "blake3/blake3_simd.h"

B3V_KERNEL(kvbm__b3_many_avx512, load16)

#endif /* B3_X86 */
