/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_blake3_hd.c: the BLAKE3 code the device runs (src/cuda/blake3_hd.h),
 * run here on the host, where CI has no nvcc and no GPU.
 *
 * hd_hash() below drives the header's functions in the kernels' order:
 * one chunk value per chunk, each group of KVBM_HD_GROUP_CHUNKS chunks
 * reduced level by level (kvbm_hd_level_node, as the threads of one CUDA
 * thread block do it), then the groups' values reduced the same way, the
 * ROOT flag on the top node. It must equal BLAKE3: the official vectors
 * (../shared/data/blake3_test_vectors.json, plain hash, 32 bytes), and
 * kvbm_blake3_hash of random inputs of every interesting length: empty,
 * within a chunk, around chunk, group and power-of-two edges, 2 MiB (W4's
 * block), odd sizes, and more than one group level. A CPU-only test: it
 * never skips, it passes in every build.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "blake3_vectors.h"
#include "cuda/blake3_hd.h"
#include "kvbm/blake3.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return rng_state = x;
}

/* One group's value (or the digest when the input is one group). */
static void group_cv(const uint8_t *in, uint64_t len, uint64_t g, int whole, uint32_t out[8]) {
  static uint32_t cvs[KVBM_HD_GROUP_CHUNKS][8], next[KVBM_HD_GROUP_CHUNKS][8];
  uint64_t chunks = kvbm_hd_chunks(len), c0 = g * KVBM_HD_GROUP_CHUNKS;
  uint32_t n = (uint32_t)(chunks - c0 < KVBM_HD_GROUP_CHUNKS ? chunks - c0 : KVBM_HD_GROUP_CHUNKS);
  for (uint32_t t = 0; t < n; t++) {
    uint64_t c = c0 + t, off = c * KVBM_HD_CHUNK_LEN;
    uint32_t clen = (uint32_t)(len - off < KVBM_HD_CHUNK_LEN ? len - off : KVBM_HD_CHUNK_LEN);
    kvbm_hd_chunk_cv(in + off, clen, c, chunks == 1, cvs[t]);
  }
  while (n > 1) {
    uint32_t up = (n + 1) / 2;
    for (uint32_t i = 0; i < up; i++) kvbm_hd_level_node((const uint32_t(*)[8])cvs, n, i, whole, next[i]);
    memcpy(cvs, next, (size_t)up * 32);
    n = up;
  }
  memcpy(out, cvs[0], 32);
}

static void hd_hash(const uint8_t *in, uint64_t len, uint8_t out[32]) {
  uint64_t groups = kvbm_hd_groups(len);
  uint32_t(*cvs)[8] = malloc(groups * 32), (*next)[8] = malloc(groups * 32);
  assert_non_null(cvs);
  assert_non_null(next);
  for (uint64_t g = 0; g < groups; g++) group_cv(in, len, g, groups == 1, cvs[g]);
  uint32_t n = (uint32_t)groups;
  while (n > 1) {
    uint32_t up = (n + 1) / 2;
    for (uint32_t i = 0; i < up; i++) kvbm_hd_level_node((const uint32_t(*)[8])cvs, n, i, 1, next[i]);
    memcpy(cvs, next, (size_t)up * 32);
    n = up;
  }
  kvbm_hd_store_cv(cvs[0], out);
  free(cvs);
  free(next);
}

/* ---- the official vectors ---- */

static void test_vectors(void **state) {
  (void)state;
  static vectors v; /* about 26 KiB: not on the stack */
  assert_int_equal(load_vectors(&v), 0);
  uint8_t *in = malloc(110000);
  assert_non_null(in);
  int cases = 0;
  for (size_t k = 0; k < v.ncases; k++) {
    size_t len = v.cases[k].input_len;
    uint8_t got[32];
    assert_true(len <= 110000);
    fill_input(in, len);
    hd_hash(in, len, got);
    if (memcmp(got, v.cases[k].hash, 32) != 0) fail_msg("vector input_len %zu: device code's hash differs", len);
    cases++;
  }
  assert_true(cases >= 30); /* the file has 35 cases, 0 .. 102400 bytes */
  free(in);
}

/* ---- against the library's BLAKE3 ---- */

static void check_len(uint8_t *buf, uint64_t len) {
  for (uint64_t i = 0; i < len; i++) buf[i] = (uint8_t)(rnd() >> 24);
  uint8_t want[32], got[32];
  assert_int_equal(kvbm_blake3_hash(buf, (size_t)len, want, 32), 0);
  hd_hash(buf, len, got);
  if (memcmp(got, want, 32) != 0) fail_msg("length %llu: device code's hash differs", (unsigned long long)len);
}

static void test_lengths(void **state) {
  (void)state;
  const uint64_t G = (uint64_t)KVBM_HD_GROUP_CHUNKS * KVBM_HD_CHUNK_LEN;
  const uint64_t lens[] = {0,         1,         63,        64,        65,         1023,
                           1024,      1025,      2047,      2048,      2049,       3072,
                           3073,      5000,      65536,     65537,     G - 1,      G,
                           G + 1,     G + 1024,  2 * G,     3 * G + 7, 2u << 20,   (2u << 20) - 1,
                           (2u << 20) + 1, 1234567, 5 * G - 1024, 9 * G + 1,   (8u << 20) + 4097};
  uint8_t *buf = malloc((9u << 20));
  assert_non_null(buf);
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) check_len(buf, lens[i]);
  for (int i = 0; i < 40; i++) check_len(buf, rnd() % (3u << 20));
  free(buf);
}

/* Unaligned starts: the device's 16-byte loads must fall back cleanly;
 * here the host path reads the same bytes whatever the offset. */
static void test_offsets(void **state) {
  (void)state;
  uint8_t *buf = malloc(70000);
  assert_non_null(buf);
  for (size_t i = 0; i < 70000; i++) buf[i] = (uint8_t)(rnd() >> 24);
  for (int off = 0; off < 17; off++) {
    uint8_t want[32], got[32];
    assert_int_equal(kvbm_blake3_hash(buf + off, 65537, want, 32), 0);
    hd_hash(buf + off, 65537, got);
    assert_memory_equal(got, want, 32);
  }
  free(buf);
}

/* The level step: an odd last node is carried up unchanged, the root flag
 * only on the top pair, so a flipped word anywhere changes the digest. */
static void test_level_node(void **state) {
  (void)state;
  uint32_t cvs[3][8], out[8], plain[8], root[8];
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 8; k++) cvs[i][k] = (uint32_t)rnd();
  kvbm_hd_level_node((const uint32_t(*)[8])cvs, 3, 1, 1, out);
  assert_memory_equal(out, cvs[2], 32);
  kvbm_hd_level_node((const uint32_t(*)[8])cvs, 3, 0, 1, plain);
  kvbm_hd_level_node((const uint32_t(*)[8])cvs, 2, 0, 1, root);
  assert_memory_not_equal(plain, root, 32); /* n == 2 at the top: ROOT */
  kvbm_hd_level_node((const uint32_t(*)[8])cvs, 2, 0, 0, out);
  assert_memory_equal(out, plain, 32); /* not the top: no ROOT */
  assert_int_equal(kvbm_hd_chunks(0), 1);
  assert_int_equal(kvbm_hd_chunks(1024), 1);
  assert_int_equal(kvbm_hd_chunks(1025), 2);
  assert_int_equal(kvbm_hd_groups(2u << 20), 8);
  assert_int_equal(kvbm_hd_groups(256u << 20), KVBM_HD_MAX_GROUPS);
}

/* Spans: a block in ranges (one per layer), each but the last a whole
 * number of chunks; hashing chunk by chunk through kvbm_hd_span_ptr gives
 * the hash of the ranges' concatenation, empty spans passed over. */
static void test_spans(void **state) {
  (void)state;
  enum { NS = 7 };
  const uint64_t lens[NS] = {4096, 0, 65536, 1024, 0, 300 * 1024, 777};
  uint8_t *parts[NS], *whole = malloc(1u << 20);
  assert_non_null(whole);
  kvbm__dspan sp[NS];
  uint64_t total = 0;
  for (int j = 0; j < NS; j++) {
    parts[j] = malloc(lens[j] + 1);
    assert_non_null(parts[j]);
    for (uint64_t i = 0; i < lens[j]; i++) parts[j][i] = (uint8_t)(rnd() >> 24);
    memcpy(whole + total, parts[j], lens[j]);
    sp[j] = (kvbm__dspan){.ptr = (uint64_t)(uintptr_t)parts[j], .len = lens[j], .off = total};
    total += lens[j];
  }
  /* every chunk start maps into the right span, at the right byte */
  for (uint64_t off = 0; off < total; off += KVBM_HD_CHUNK_LEN) {
    const uint8_t *p = kvbm_hd_span_ptr(sp, NS, off);
    uint64_t clen = total - off < KVBM_HD_CHUNK_LEN ? total - off : KVBM_HD_CHUNK_LEN;
    assert_memory_equal(p, whole + off, clen);
  }
  /* the hash chunk by chunk through the spans (as the kernel reads) */
  uint64_t chunks = kvbm_hd_chunks(total);
  uint32_t(*cvs)[8] = malloc(chunks * 32), (*next)[8] = malloc(chunks * 32);
  assert_true(cvs && next);
  for (uint64_t c = 0; c < chunks; c++) {
    uint64_t off = c * KVBM_HD_CHUNK_LEN;
    uint32_t clen = (uint32_t)(total - off < KVBM_HD_CHUNK_LEN ? total - off : KVBM_HD_CHUNK_LEN);
    kvbm_hd_chunk_cv(kvbm_hd_span_ptr(sp, NS, off), clen, c, chunks == 1, cvs[c]);
  }
  uint32_t n = (uint32_t)chunks;
  while (n > 1) {
    uint32_t up = (n + 1) / 2;
    for (uint32_t i = 0; i < up; i++) kvbm_hd_level_node((const uint32_t(*)[8])cvs, n, i, 1, next[i]);
    memcpy(cvs, next, (size_t)up * 32);
    n = up;
  }
  uint8_t got[32], want[32];
  kvbm_hd_store_cv(cvs[0], got);
  assert_int_equal(kvbm_blake3_hash(whole, total, want, 32), 0);
  assert_memory_equal(got, want, 32);
  /* one span: offset 0 is its start whatever the length */
  assert_ptr_equal(kvbm_hd_span_ptr(sp, 1, 0), parts[0]);
  for (int j = 0; j < NS; j++) free(parts[j]);
  free(whole), free(cvs), free(next);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors),
      cmocka_unit_test(test_lengths),
      cmocka_unit_test(test_offsets),
      cmocka_unit_test(test_level_node),
      cmocka_unit_test(test_spans),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
