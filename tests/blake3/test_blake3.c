/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_blake3.c: BLAKE3 against the official test vectors, on every
 * compression path this CPU has, plus incremental input, extended output
 * with seek, the SIMD kernels against the portable one, and a tree
 * computed independently (recursively, as the spec defines it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "blake3/blake3_impl.h"
#include "blake3_vectors.h"
#include "kvbm/blake3.h"

static vectors g_vec;

static int setup(void **state) {
  (void)state;
  return load_vectors(&g_vec) == 0 && g_vec.ncases == 35 ? 0 : -1;
}


static const kvbm_blake3_impl kImpls[] = {
    KVBM_BLAKE3_IMPL_PORTABLE, KVBM_BLAKE3_IMPL_SSE41, KVBM_BLAKE3_IMPL_AVX2,
    KVBM_BLAKE3_IMPL_AVX512};
#define NIMPLS (sizeof kImpls / sizeof kImpls[0])

enum { MODE_HASH, MODE_KEYED, MODE_DERIVE };

static void init_mode(kvbm_blake3_hasher *h, int mode, kvbm_blake3_impl impl) {
  switch (mode) {
    case MODE_HASH:
      assert_int_equal(kvbm_blake3_hasher_init(h), KVBM_OK);
      break;
    case MODE_KEYED:
      assert_int_equal(
          kvbm_blake3_hasher_init_keyed(h, (const uint8_t *)g_vec.key),
          KVBM_OK);
      break;
    default:
      assert_int_equal(kvbm_blake3_hasher_init_derive_key(h, g_vec.context),
                       KVBM_OK);
  }
  assert_int_equal(kvbm_blake3_hasher_set_impl(h, impl, NULL), KVBM_OK);
}

/* Every case, every mode, every path: full extended output, the default
 * 32-byte output as its prefix, and output read from odd seek offsets. */
static void test_vectors_all_paths(void **state) {
  (void)state;
  uint8_t *input = malloc(110000);
  assert_non_null(input);
  size_t tested_paths = 0;
  for (size_t k = 0; k < NIMPLS; k++) {
    if (!kvbm_blake3_impl_available(kImpls[k])) continue;
    tested_paths++;
    for (size_t i = 0; i < g_vec.ncases; i++) {
      const vcase *c = &g_vec.cases[i];
      fill_input(input, c->input_len);
      for (int mode = 0; mode < 3; mode++) {
        const uint8_t *want = mode == MODE_HASH    ? c->hash
                              : mode == MODE_KEYED ? c->keyed
                                                   : c->derive;
        kvbm_blake3_hasher h;
        init_mode(&h, mode, kImpls[k]);
        assert_int_equal(kvbm_blake3_hasher_update(&h, input, c->input_len),
                         KVBM_OK);
        uint8_t out[VEC_OUT], out32[32];
        assert_int_equal(kvbm_blake3_hasher_finalize(&h, out, VEC_OUT), 0);
        if (memcmp(out, want, VEC_OUT) != 0)
          fail_msg("path %s len %zu mode %d: extended output differs",
                   kvbm_blake3_impl_name(kImpls[k]), c->input_len, mode);
        assert_int_equal(kvbm_blake3_hasher_finalize(&h, out32, 32), 0);
        assert_memory_equal(out32, want, 32);
        for (uint64_t seek = 1; seek < VEC_OUT; seek += 17) {
          uint8_t part[VEC_OUT];
          size_t n = VEC_OUT - (size_t)seek;
          assert_int_equal(
              kvbm_blake3_hasher_finalize_seek(&h, seek, part, n), 0);
          assert_memory_equal(part, want + seek, n);
        }
      }
    }
  }
  assert_true(tested_paths >= 1);
  free(input);
}

static void test_one_shot_helpers(void **state) {
  (void)state;
  uint8_t *input = malloc(110000), out[VEC_OUT];
  assert_non_null(input);
  for (size_t i = 0; i < g_vec.ncases; i++) {
    const vcase *c = &g_vec.cases[i];
    fill_input(input, c->input_len);
    assert_int_equal(kvbm_blake3_hash(input, c->input_len, out, VEC_OUT), 0);
    assert_memory_equal(out, c->hash, VEC_OUT);
    assert_int_equal(kvbm_blake3_keyed_hash((const uint8_t *)g_vec.key, input,
                                            c->input_len, out, VEC_OUT),
                     0);
    assert_memory_equal(out, c->keyed, VEC_OUT);
    assert_int_equal(kvbm_blake3_derive_key(g_vec.context, input,
                                            c->input_len, out, VEC_OUT),
                     0);
    assert_memory_equal(out, c->derive, VEC_OUT);
  }
  free(input);
}

/* ---- an independent tree: the spec's recursive definition ---- */

static void ref_chunk(const uint8_t *in, size_t len, uint64_t counter,
                      int root, uint8_t out[32]) {
  uint32_t cv[8], st[16];
  memcpy(cv, b3_iv, sizeof cv);
  size_t nblocks = len == 0 ? 1 : (len + 63) / 64;
  for (size_t b = 0; b < nblocks; b++) {
    uint8_t block[64] = {0};
    size_t n = len - b * 64 < 64 ? len - b * 64 : 64;
    memcpy(block, in + b * 64, n);
    uint8_t flags = 0;
    if (b == 0) flags |= B3_CHUNK_START;
    if (b + 1 == nblocks) flags |= B3_CHUNK_END | (root ? B3_ROOT : 0);
    kvbm__b3_compress_portable(cv, block, (uint8_t)n, counter, flags, st);
    memcpy(cv, st, sizeof cv);
  }
  b3_store_cv(out, cv);
}

/* Chaining value (or, at the root, the first 32 output bytes) of the
 * subtree over `len` bytes starting at chunk `counter`. */
static void ref_tree(const uint8_t *in, size_t len, uint64_t counter,
                     int root, uint8_t out[32]) {
  if (len <= 1024) {
    ref_chunk(in, len, counter, root, out);
    return;
  }
  size_t left = 1024;
  while (left * 2 < len) left *= 2;
  uint8_t block[64];
  ref_tree(in, left, counter, 0, block);
  ref_tree(in + left, len - left, counter + left / 1024, 0, block + 32);
  uint32_t st[16];
  kvbm__b3_compress_portable(b3_iv, block, 64, 0,
                       (uint8_t)(B3_PARENT | (root ? B3_ROOT : 0)), st);
  b3_store_cv(out, st);
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Large and odd sizes (past one batch of 256 chunks), fed in random
 * pieces, on every path, against the recursive tree. */
static void test_incremental_matches_tree(void **state) {
  (void)state;
  static const size_t sizes[] = {0,      1,      1023,   1024,   1025,
                                 2047,   2048,   4096,   16384,  16385,
                                 65537,  131072, 262144, 262145, 263168,
                                 524288, 600001, 1048576 + 3072};
  const size_t maxn = 1048576 + 3072;
  uint8_t *input = malloc(maxn);
  assert_non_null(input);
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < maxn; i++) input[i] = (uint8_t)rng_next(&seed);
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t len = sizes[s];
    uint8_t want[32];
    ref_tree(input, len, 0, 1, want);
    for (size_t k = 0; k < NIMPLS; k++) {
      if (!kvbm_blake3_impl_available(kImpls[k])) continue;
      /* Three feeding patterns: all at once, tiny odd pieces, random. */
      for (int pattern = 0; pattern < 3; pattern++) {
        kvbm_blake3_hasher h;
        init_mode(&h, MODE_HASH, kImpls[k]);
        size_t off = 0;
        while (off < len) {
          size_t piece = len - off;
          if (pattern == 1) piece = piece < 7 ? piece : 7 + off % 61;
          if (pattern == 2) piece = (size_t)(rng_next(&seed) % 70000);
          if (piece > len - off) piece = len - off;
          assert_int_equal(kvbm_blake3_hasher_update(&h, input + off, piece),
                           0);
          off += piece;
        }
        uint8_t got[32];
        kvbm_blake3_hasher_finalize(&h, got, 32);
        if (memcmp(got, want, 32) != 0)
          fail_msg("path %s len %zu pattern %d differs from the tree",
                   kvbm_blake3_impl_name(kImpls[k]), len, pattern);
      }
    }
  }
  free(input);
}

/* Updates split at every boundary of a 3-chunk input; finalize may be
 * called midway and hashing goes on. */
static void test_split_everywhere(void **state) {
  (void)state;
  uint8_t input[3 * 1024 + 5], want[32], got[32], mid[32], mid_want[32];
  fill_input(input, sizeof input);
  kvbm_blake3_hash(input, sizeof input, want, 32);
  for (size_t cut = 0; cut <= sizeof input; cut++) {
    kvbm_blake3_hasher h;
    kvbm_blake3_hasher_init(&h);
    kvbm_blake3_hasher_update(&h, input, cut);
    kvbm_blake3_hasher_finalize(&h, mid, 32);
    kvbm_blake3_hash(input, cut, mid_want, 32);
    assert_memory_equal(mid, mid_want, 32);
    kvbm_blake3_hasher_update(&h, input + cut, sizeof input - cut);
    kvbm_blake3_hasher_finalize(&h, got, 32);
    assert_memory_equal(got, want, 32);
  }
}

/* The SIMD kernels alone, against the portable one, for chunks and
 * parents, with a counter crossing 2^32 (the vectors never set the high
 * counter word) and every flag combination used. */
static void test_kernels_match_portable(void **state) {
  (void)state;
#ifdef B3_X86
  static const struct {
    kvbm_blake3_impl impl;
    size_t width;
    b3_many_fn fn;
  } kernels[] = {{KVBM_BLAKE3_IMPL_SSE41, 4, kvbm__b3_many_sse41},
                 {KVBM_BLAKE3_IMPL_AVX2, 8, kvbm__b3_many_avx2},
                 {KVBM_BLAKE3_IMPL_AVX512, 16, kvbm__b3_many_avx512}};
  uint8_t *input = malloc(16 * 1024);
  assert_non_null(input);
  uint64_t seed = 12345;
  for (size_t i = 0; i < 16 * 1024; i++) input[i] = (uint8_t)rng_next(&seed);
  uint32_t key[8];
  for (int i = 0; i < 8; i++) key[i] = (uint32_t)rng_next(&seed);
  for (size_t k = 0; k < 3; k++) {
    if (!kvbm_blake3_impl_available(kernels[k].impl)) continue;
    size_t w = kernels[k].width;
    b3_many_args chunks = {input, 1024, 16, key, 0xFFFFFFFCull, 1,
                           B3_KEYED_HASH, B3_CHUNK_START, B3_CHUNK_END};
    b3_many_args parents = {input, 64, 1, key, 0, 0,
                            B3_PARENT | B3_DERIVE_KEY_MATERIAL, 0, 0};
    b3_many_args odd = {input + 3, 100, 3, key, 7, 1, 0, B3_CHUNK_START, 0};
    const b3_many_args *cases[] = {&chunks, &parents, &odd};
    for (int c = 0; c < 3; c++) {
      uint8_t got[16 * 32], want[16 * 32];
      kernels[k].fn(cases[c], got);
      kvbm__b3_many_portable(cases[c], w, want);
      assert_memory_equal(got, want, 32 * w);
    }
  }
  /* The row-wise single compression. */
  if (kvbm_blake3_impl_available(KVBM_BLAKE3_IMPL_SSE41)) {
    for (int t = 0; t < 200; t++) {
      uint32_t cv[8], got[16], want[16];
      for (int i = 0; i < 8; i++) cv[i] = (uint32_t)rng_next(&seed);
      const uint8_t *block = input + (size_t)t * 61;
      uint64_t counter = 0xFFFFFFF0ull + (uint64_t)t;
      uint8_t len = (uint8_t)(t % 65), flags = (uint8_t)(t & 0x7F);
      kvbm__b3_compress_sse41(cv, block, len, counter, flags, got);
      kvbm__b3_compress_portable(cv, block, len, counter, flags, want);
      assert_memory_equal(got, want, sizeof want);
    }
  }
  free(input);
#endif
}

static void test_impl_queries(void **state) {
  (void)state;
  assert_true(kvbm_blake3_impl_available(KVBM_BLAKE3_IMPL_PORTABLE));
  assert_true(kvbm_blake3_impl_available(kvbm_blake3_impl_best()));
  assert_string_equal(kvbm_blake3_impl_name(KVBM_BLAKE3_IMPL_AVX2), "avx2");
  assert_string_equal(kvbm_blake3_impl_name((kvbm_blake3_impl)99), "?");
  kvbm_blake3_hasher h;
  kvbm_blake3_hasher_init(&h);
  kvbm_error err;
  assert_int_equal(kvbm_blake3_hasher_set_impl(&h, (kvbm_blake3_impl)9, &err),
                   KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "unknown path"));
  for (size_t k = 0; k < NIMPLS; k++) {
    int rc = kvbm_blake3_hasher_set_impl(&h, kImpls[k], &err);
    if (kvbm_blake3_impl_available(kImpls[k])) {
      assert_int_equal(rc, KVBM_OK);
    } else {
      assert_int_equal(rc, KVBM_EUNSUPPORTED);
      assert_non_null(strstr(err.msg, "cannot run"));
    }
  }
  printf("best path on this CPU: %s\n",
         kvbm_blake3_impl_name(kvbm_blake3_impl_best()));
}

static void test_bad_arguments(void **state) {
  (void)state;
  kvbm_blake3_hasher h;
  uint8_t out[32];
  assert_int_equal(kvbm_blake3_hasher_init(NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_hasher_init_keyed(&h, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_hasher_init_derive_key(&h, NULL), KVBM_EINVAL);
  kvbm_blake3_hasher_init(&h);
  assert_int_equal(kvbm_blake3_hasher_update(&h, NULL, 1), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_hasher_update(&h, NULL, 0), KVBM_OK);
  assert_int_equal(kvbm_blake3_hasher_finalize(&h, NULL, 1), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_hasher_finalize_seek(&h, UINT64_MAX, out, 2),
                   KVBM_EOVERFLOW);
  assert_int_equal(kvbm_blake3_hasher_finalize_seek(&h, UINT64_MAX, out, 1),
                   KVBM_OK);
  assert_int_equal(kvbm_blake3_hash(NULL, 5, out, 32), KVBM_EINVAL);
}

/* Reset forgets the input and keeps the key. */
static void test_reset_keeps_mode(void **state) {
  (void)state;
  uint8_t a[32], b[32];
  kvbm_blake3_hasher h;
  kvbm_blake3_hasher_init_keyed(&h, (const uint8_t *)g_vec.key);
  kvbm_blake3_hasher_update(&h, "junk", 4);
  kvbm_blake3_hasher_reset(&h);
  kvbm_blake3_hasher_finalize(&h, a, 32);
  assert_memory_equal(a, g_vec.cases[0].keyed, 32);
  kvbm_blake3_hash("", 0, b, 32);
  assert_memory_not_equal(a, b, 32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors_all_paths),
      cmocka_unit_test(test_one_shot_helpers),
      cmocka_unit_test(test_incremental_matches_tree),
      cmocka_unit_test(test_split_everywhere),
      cmocka_unit_test(test_kernels_match_portable),
      cmocka_unit_test(test_impl_queries),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_reset_keeps_mode),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
