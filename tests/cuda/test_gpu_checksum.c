/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_gpu_checksum.c: integrity on the device (kvbm_cuda_digest_blocks,
 * kvbm_cuda_verify_blocks, and their span forms; src/cuda/checksum.c and
 * its kernels).
 *
 * On the CPU, in every build: every refusal of bad arguments, with its
 * status and a message naming what is wrong, before anything touches
 * CUDA (outputs untouched); then what a good call says without a device
 * or without kernels (KVBM_EUNSUPPORTED, KVBM_EDEVICE, as
 * kvbm_cuda_available tells), with out zeroed.
 *
 * Then on a device (kvbm_test_gpu_or_skip): random bytes on the device in
 * one batch of many sizes (0, 1, chunk and group edges, 2 MiB, odd sizes,
 * the 256 MiB maximum) and unaligned starts: each digest equals
 * kvbm_blake3_hash of the same bytes on the host; a mixed batch of 1000
 * small blocks; W4 blocks (2 MiB) verified against their host digests
 * (32 and 16 bytes), then one flipped bit at the first byte, the last
 * byte, group and chunk edges and random places of random blocks: the
 * block is reported bad with its index, the others not; two bad blocks
 * are counted; a stream-ordered check (copy and check queued on one
 * stream with no sync between) sees the new bytes; host memory (plain and
 * pinned), a device index past the last and a range running past its
 * allocation (KVBM_ERANGE) are refused. Spans (kvbm_cuda_digest_spans):
 * every refusal on the CPU (counts checked before any span is read); on
 * the device, LayerSeparate blocks (32 layer regions) hash as kvbm_blake3
 * of their layers in order and as the same bytes laid out contiguously, a
 * flipped bit in a layer names its block, odd and empty spans at odd
 * addresses, a host span refused by name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpu_testutil.h"
#include "kvbm/blake3.h"
#include "kvbm/cuda.h"

static uint64_t rng_state = 0x13198a2e03707344ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return rng_state = x;
}
static void fill_random(uint8_t *p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rnd();
    memcpy(p + i, &v, 8);
  }
  for (; i < n; i++) p[i] = (uint8_t)(rnd() >> 40);
}

static void expect_msg(const kvbm_error *e, const char *part) {
  if (!strstr(e->msg, part)) fail_msg("message \"%s\" lacks \"%s\"", e->msg, part);
}

/* ---- on the CPU ---- */

static void test_refusals(void **state) {
  (void)state;
  uint8_t host[64];
  const void *ptrs[2] = {host, host};
  uint64_t lens[2] = {64, 64};
  uint8_t out[2][32], exp[64];
  kvbm_error e;
  memset(out, 0x5a, sizeof out);
  memset(exp, 0, sizeof exp);

  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, NULL, lens, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "ptrs is NULL");
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, ptrs, NULL, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "lens is NULL");
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, 2, NULL, &e), KVBM_EINVAL);
  expect_msg(&e, "output array is NULL");
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, 0, out, &e), KVBM_EINVAL);
  expect_msg(&e, "n == 0");
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, KVBM_CUDA_DIGEST_MAX_BATCH + 1, out, &e),
                   KVBM_EINVAL);
  expect_msg(&e, "more than");
  assert_int_equal(kvbm_cuda_digest_blocks(-1, NULL, ptrs, lens, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "device -1");
  lens[1] = KVBM_CUDA_DIGEST_MAX_LEN + 1;
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, 2, out, &e), KVBM_ETOOLONG);
  expect_msg(&e, "block 1 is 268435457 bytes");
  lens[1] = 64;
  ptrs[1] = NULL;
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "block 1 has 64 bytes at NULL");
  /* refused arguments leave out untouched */
  for (size_t i = 0; i < sizeof out; i++) assert_int_equal(((uint8_t *)out)[i], 0x5a);
  ptrs[1] = host;

  uint32_t bi = 77, bc = 88;
  assert_int_equal(kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, 2, NULL, 32, &bi, &bc, &e), KVBM_EINVAL);
  expect_msg(&e, "expected is NULL");
  assert_int_equal(kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, 2, exp, 0, &bi, &bc, &e), KVBM_EINVAL);
  expect_msg(&e, "digest_len 0");
  assert_int_equal(kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, 2, exp, 33, &bi, &bc, &e), KVBM_EINVAL);
  expect_msg(&e, "digest_len 33");
  assert_int_equal(kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, 0, exp, 32, &bi, &bc, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_cuda_verify_blocks(0, NULL, NULL, lens, 2, exp, 32, &bi, &bc, &e), KVBM_EINVAL);
  assert_int_equal(bi, 77);
  assert_int_equal(bc, 88);
  /* a NULL err is allowed */
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, NULL, lens, 2, out, NULL), KVBM_EINVAL);
}

static void test_span_refusals(void **state) {
  (void)state;
  uint8_t host[4096];
  kvbm_cuda_span sp[3] = {{host, 1024}, {host, 2048}, {host, 5}};
  uint32_t counts[2] = {2, 1};
  uint8_t out[2][32], exp[64] = {0};
  kvbm_error e;
  memset(out, 0x5a, sizeof out);
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, NULL, counts, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "spans is NULL");
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, NULL, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "counts is NULL");
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, counts, 2, NULL, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, counts, 0, out, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_cuda_digest_spans(-2, NULL, sp, counts, 2, out, &e), KVBM_EINVAL);
  counts[1] = 0;
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, counts, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "block 1 has no spans");
  counts[1] = 1;
  sp[0].len = 1000;
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, counts, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "block 0 span 0 is 1000 bytes; every span but a block's last must be a multiple of 1024");
  sp[0].len = 1024;
  sp[1].ptr = NULL;
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, counts, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "block 0 span 1 has 2048 bytes at NULL");
  sp[1].ptr = host;
  sp[1].len = KVBM_CUDA_DIGEST_MAX_LEN; /* 1024 + this: one byte too many */
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, counts, 2, out, &e), KVBM_ETOOLONG);
  expect_msg(&e, "block 0 is more than 268435456 bytes (at span 1)");
  sp[1].len = 2048;
  uint32_t huge[2] = {KVBM_CUDA_DIGEST_MAX_SPANS, 1}; /* refused before any span is read */
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, huge, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "spans in one call");
  for (size_t i = 0; i < sizeof out; i++) assert_int_equal(((uint8_t *)out)[i], 0x5a);
  uint32_t bi = 7;
  assert_int_equal(kvbm_cuda_verify_spans(0, NULL, sp, counts, 2, NULL, 32, &bi, NULL, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_cuda_verify_spans(0, NULL, sp, counts, 2, exp, 40, &bi, NULL, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_cuda_verify_spans(0, NULL, sp, NULL, 2, exp, 32, &bi, NULL, &e), KVBM_EINVAL);
  assert_int_equal(bi, 7);
  /* accepted arguments: the build's or machine's answer, out zeroed */
  int kernels = 0, avail = kvbm_cuda_available(NULL, &kernels, NULL);
  if (avail != KVBM_OK || !kernels) {
    assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, counts, 2, out, &e),
                     avail == KVBM_EUNSUPPORTED || !kernels ? KVBM_EUNSUPPORTED : KVBM_EDEVICE);
    for (size_t i = 0; i < sizeof out; i++) assert_int_equal(((uint8_t *)out)[i], 0);
  }
}

/* A good call where there is no device or no kernel says so, out zeroed. */
static void test_without_device(void **state) {
  (void)state;
  int devices = 0, kernels = 0;
  int avail = kvbm_cuda_available(&devices, &kernels, NULL);
  if (avail == KVBM_OK && kernels) skip(); /* a device and kernels: the GPU part checks the calls */
  uint8_t host[100];
  fill_random(host, sizeof host);
  const void *ptrs[1] = {host};
  uint64_t lens[1] = {sizeof host};
  uint8_t out[1][32];
  memset(out, 0x5a, sizeof out);
  kvbm_error e;
  int rc = kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, 1, out, &e);
  if (avail == KVBM_EUNSUPPORTED || !kernels) {
    assert_int_equal(rc, KVBM_EUNSUPPORTED);
    expect_msg(&e, "cuda digest: this build has no CUDA");
  } else {
    assert_int_equal(rc, KVBM_EDEVICE);
    expect_msg(&e, "no CUDA device");
  }
  for (int i = 0; i < 32; i++) assert_int_equal(out[0][i], 0);
  uint8_t exp[32] = {0};
  uint32_t bi = 77;
  assert_int_equal(kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, 1, exp, 32, &bi, NULL, &e), rc);
  assert_int_equal(bi, 77);
}

/* ---- on a device ---- */

#ifdef KVBM_HAVE_CUDA

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) fail_msg("%s (line %d): %s", #call, __LINE__, cudaGetErrorString(e_)); \
  } while (0)

static void host_digest(const uint8_t *p, uint64_t len, uint8_t out[32]) {
  assert_int_equal(kvbm_blake3_hash(p, (size_t)len, out, 32), KVBM_OK);
}

static void hexs(const uint8_t *d, char *s) {
  for (int i = 0; i < 32; i++) sprintf(s + 2 * i, "%02x", d[i]);
}

/* Every size and alignment in one batch, then the same one by one. */
static void test_gpu_sizes(void **state) {
  (void)state;
  const uint64_t G = 256u << 10;
  const uint64_t sizes[] = {0,     1,         63,        64,       65,        1023,       1024,
                            1025,  2047,      2048,      2049,     4097,      65536,      G - 1,
                            G,     G + 1,     G + 1024,  3 * G,    (1u << 20) + 5, 2u << 20,
                            (2u << 20) + 1,   (3u << 20) + 7, 4u << 20, KVBM_CUDA_DIGEST_MAX_LEN};
  const uint64_t offs[] = {0, 1, 4, 8, 15, 16};
  enum { NS = sizeof sizes / sizeof sizes[0], NO = sizeof offs / sizeof offs[0], N = NS + NO };
  uint64_t lens[N], at[N], total = 0;
  for (int i = 0; i < N; i++) {
    lens[i] = i < NS ? sizes[i] : 65537 + (uint64_t)i; /* odd sizes at unaligned starts */
    uint64_t off = i < NS ? 0 : offs[i - NS];
    total = (total + 255) / 256 * 256 + off;
    at[i] = total;
    total += lens[i];
  }
  uint8_t *h = malloc(total), *d = NULL;
  assert_non_null(h);
  fill_random(h, total);
  CK(cudaMalloc((void **)&d, total));
  CK(cudaMemcpy(d, h, total, cudaMemcpyHostToDevice));
  const void *ptrs[N];
  for (int i = 0; i < N; i++) ptrs[i] = d + at[i];
  uint8_t out[N][32], want[32];
  memset(out, 0xa5, sizeof out);
  kvbm_error e;
  if (kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, N, out, &e)) fail_msg("digest: %s", e.msg);
  for (int i = 0; i < N; i++) {
    host_digest(h + at[i], lens[i], want);
    if (memcmp(out[i], want, 32)) {
      char a[65], b[65];
      hexs(out[i], a), hexs(want, b);
      fail_msg("block %d (%llu bytes at offset %llu): device %s, host %s", i, (unsigned long long)lens[i],
               (unsigned long long)(at[i] % 256), a, b);
    }
  }
  /* one by one (inputs of one group finish in the first kernel) */
  for (int i = 0; i < N; i++) {
    uint8_t one[1][32];
    memset(one, 0xa5, sizeof one);
    if (kvbm_cuda_digest_blocks(0, NULL, &ptrs[i], &lens[i], 1, one, &e)) fail_msg("digest %d: %s", i, e.msg);
    assert_memory_equal(one[0], out[i], 32);
  }
  CK(cudaFree(d));
  free(h);
}

/* 1000 blocks of random sizes 0..9 KiB, back to back at random offsets. */
static void test_gpu_mixed_batch(void **state) {
  (void)state;
  enum { N = 1000 };
  uint64_t *lens = malloc(N * sizeof *lens), *at = malloc(N * sizeof *at), total = 0;
  const void **ptrs = malloc(N * sizeof *ptrs);
  uint8_t(*out)[32] = malloc(N * 32);
  assert_true(lens && at && ptrs && out);
  for (int i = 0; i < N; i++) {
    lens[i] = rnd() % (9u << 10);
    total += rnd() % 32;
    at[i] = total;
    total += lens[i];
  }
  uint8_t *h = malloc(total), *d = NULL;
  assert_non_null(h);
  fill_random(h, total);
  CK(cudaMalloc((void **)&d, total));
  CK(cudaMemcpy(d, h, total, cudaMemcpyHostToDevice));
  for (int i = 0; i < N; i++) ptrs[i] = d + at[i];
  memset(out, 0xa5, (size_t)N * 32);
  kvbm_error e;
  if (kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, N, out, &e)) fail_msg("digest: %s", e.msg);
  for (int i = 0; i < N; i++) {
    uint8_t want[32];
    host_digest(h + at[i], lens[i], want);
    if (memcmp(out[i], want, 32)) fail_msg("block %d of %llu bytes differs", i, (unsigned long long)lens[i]);
  }
  CK(cudaFree(d));
  free(h), free(lens), free(at), free(ptrs), free(out);
}

static void flip_bit(uint8_t *d, uint64_t at, unsigned bit) {
  uint8_t b;
  CK(cudaMemcpy(&b, d + at, 1, cudaMemcpyDeviceToHost));
  b ^= (uint8_t)(1u << bit);
  CK(cudaMemcpy(d + at, &b, 1, cudaMemcpyHostToDevice));
}

/* W4 blocks: verified good, then one flipped bit anywhere is found. */
static void test_gpu_flipped_bit(void **state) {
  (void)state;
  enum { N = 24 };
  const uint64_t B = 2u << 20;
  uint8_t *h = malloc(N * B), *d = NULL, *exp32 = malloc(N * 32), *exp16 = malloc(N * 16);
  assert_true(h && exp32 && exp16);
  fill_random(h, N * B);
  CK(cudaMalloc((void **)&d, N * B));
  CK(cudaMemcpy(d, h, N * B, cudaMemcpyHostToDevice));
  const void *ptrs[N];
  uint64_t lens[N];
  for (int i = 0; i < N; i++) {
    ptrs[i] = d + i * B, lens[i] = B;
    host_digest(h + i * B, B, exp32 + 32 * i);
    memcpy(exp16 + 16 * i, exp32 + 32 * i, 16);
  }
  kvbm_error e;
  uint32_t bi = 99, bc = 99;
  if (kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, N, exp32, 32, &bi, &bc, &e)) fail_msg("verify: %s", e.msg);
  assert_int_equal(bi, 0);
  assert_int_equal(bc, 0);
  if (kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, N, exp16, 16, &bi, &bc, &e)) fail_msg("verify16: %s", e.msg);

  const uint64_t places[] = {0, B - 1, 1023, 1024, (256u << 10) - 1, 256u << 10, B / 2, B - 1024};
  for (int k = 0; k < 20; k++) {
    uint32_t blk = (uint32_t)(rnd() % N);
    uint64_t at = k < 8 ? places[k] : rnd() % B;
    unsigned bit = (unsigned)(rnd() % 8);
    flip_bit(d, blk * B + at, bit);
    bi = bc = 99;
    int rc = kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, N, k & 1 ? exp16 : exp32, k & 1 ? 16 : 32, &bi, &bc, &e);
    if (rc != KVBM_ECHECKSUM)
      fail_msg("bit %u of byte %llu of block %u flipped: verify said %d", bit, (unsigned long long)at, blk, rc);
    assert_int_equal(bi, blk);
    assert_int_equal(bc, 1);
    char want[64];
    snprintf(want, sizeof want, "block %u (of %d)", blk, N);
    expect_msg(&e, want);
    flip_bit(d, blk * B + at, bit); /* restored: good again */
    if (kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, N, exp32, 32, &bi, &bc, &e))
      fail_msg("verify after restore: %s", e.msg);
  }
  /* two bad blocks: counted, the first named */
  flip_bit(d, 17 * B + 12345, 3);
  flip_bit(d, 5 * B + 777, 0);
  assert_int_equal(kvbm_cuda_verify_blocks(0, NULL, ptrs, lens, N, exp32, 32, &bi, &bc, &e), KVBM_ECHECKSUM);
  assert_int_equal(bi, 5);
  assert_int_equal(bc, 2);
  CK(cudaFree(d));
  free(h), free(exp32), free(exp16);
}

/* The check follows the copy queued before it on the same stream. */
static void test_gpu_stream_order(void **state) {
  (void)state;
  const uint64_t B = 2u << 20;
  enum { N = 16 };
  uint8_t *h = NULL, *d = NULL;
  CK(cudaMallocHost((void **)&h, N * B));
  CK(cudaMalloc((void **)&d, N * B));
  CK(cudaMemset(d, 0, N * B));
  fill_random(h, N * B);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMemcpyAsync(d, h, N * B, cudaMemcpyHostToDevice, s)); /* no sync: the check must wait */
  const void *ptrs[N];
  uint64_t lens[N];
  uint8_t out[N][32], want[32];
  for (int i = 0; i < N; i++) ptrs[i] = d + i * B, lens[i] = B;
  kvbm_error e;
  if (kvbm_cuda_digest_blocks(0, s, ptrs, lens, N, out, &e)) fail_msg("digest: %s", e.msg);
  for (int i = 0; i < N; i++) {
    host_digest(h + i * B, B, want);
    if (memcmp(out[i], want, 32)) fail_msg("block %d: the check did not see the onboarded bytes", i);
  }
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  CK(cudaFreeHost(h));
}

static void test_gpu_refusals(void **state) {
  (void)state;
  uint8_t host[4096], *pinned = NULL, *d = NULL;
  CK(cudaMallocHost((void **)&pinned, 4096));
  CK(cudaMalloc((void **)&d, 4096));
  const void *ptrs[2] = {d, host};
  uint64_t lens[2] = {4096, 4096};
  uint8_t out[2][32];
  kvbm_error e;
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "block 1 at");
  expect_msg(&e, "unregistered host memory; device memory needed");
  ptrs[1] = pinned;
  assert_int_equal(kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, 2, out, &e), KVBM_EINVAL);
  expect_msg(&e, "pinned host memory");
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  ptrs[1] = d;
  assert_int_equal(kvbm_cuda_digest_blocks(count, NULL, ptrs, lens, 2, out, &e), KVBM_EDEVICE);
  expect_msg(&e, "no CUDA device");
  if (count > 1) {
    assert_int_equal(kvbm_cuda_digest_blocks(1, NULL, ptrs, lens, 2, out, &e), KVBM_EINVAL);
    expect_msg(&e, "is on device 0, not 1");
  }
  /* a refused host block with length 0 is not read, so it is accepted */
  ptrs[1] = host, lens[1] = 0;
  if (kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, 2, out, &e)) fail_msg("empty host block: %s", e.msg);
  uint8_t want[32];
  host_digest(NULL, 0, want);
  assert_memory_equal(out[1], want, 32);
  /* a range past the end of its allocation (8 MiB: no rounding up) */
  uint8_t *big = NULL;
  CK(cudaMalloc((void **)&big, 8u << 20));
  int rtv = 0;
  CK(cudaRuntimeGetVersion(&rtv));
  const void *bp[1] = {big + (8u << 20) - 100};
  uint64_t bl[1] = {100};
  if (kvbm_cuda_digest_blocks(0, NULL, bp, bl, 1, out, &e)) fail_msg("last 100 bytes: %s", e.msg);
  bl[0] = 101;
  int rc = kvbm_cuda_digest_blocks(0, NULL, bp, bl, 1, out, &e);
  if (rtv >= 12050) {
    assert_int_equal(rc, KVBM_ERANGE);
    expect_msg(&e, "block 0: 101 bytes at");
    expect_msg(&e, "run past the end of its allocation (8388608 bytes at");
    kvbm_cuda_span sp[3] = {{big, 1024}, {d, 1024}, {big + 4096, (8u << 20)}};
    uint32_t c3 = 3;
    assert_int_equal(kvbm_cuda_digest_spans(0, NULL, sp, &c3, 1, out, &e), KVBM_ERANGE);
    expect_msg(&e, "block 0 span 2: 8388608 bytes at");
  }
  CK(cudaFree(big));
  CK(cudaFree(d));
  CK(cudaFreeHost(pinned));
}

/* LayerSeparate blocks: 32 layer regions, block b's layer l at region l
 * + b x 64 KiB. The span digest equals kvbm_blake3 of the layers in order
 * and the contiguous digest of the same bytes; a flipped bit in one layer
 * is found with its block's index; odd spans; a host span is refused. */
static void test_gpu_spans(void **state) {
  (void)state;
  enum { NB = 12, NL = 32 };
  const uint64_t L = 64u << 10, B = NL * L;
  uint8_t *h = malloc(NB * B), *dl = NULL, *dc = NULL; /* h: block-major (canonical) */
  assert_non_null(h);
  fill_random(h, NB * B);
  CK(cudaMalloc((void **)&dl, NB * B)); /* layer-major, as LayerSeparate */
  CK(cudaMalloc((void **)&dc, NB * B)); /* block-major, as FullyContiguous */
  CK(cudaMemcpy(dc, h, NB * B, cudaMemcpyHostToDevice));
  for (int b = 0; b < NB; b++)
    for (int l = 0; l < NL; l++)
      CK(cudaMemcpy(dl + (uint64_t)l * NB * L + b * L, h + b * B + l * L, L, cudaMemcpyHostToDevice));
  kvbm_cuda_span sp[NB * NL];
  uint32_t counts[NB];
  const void *ptrs[NB];
  uint64_t lens[NB];
  uint8_t want[NB * 32], got[NB][32], cont[NB][32];
  for (int b = 0; b < NB; b++) {
    counts[b] = NL, ptrs[b] = dc + b * B, lens[b] = B;
    for (int l = 0; l < NL; l++) sp[b * NL + l] = (kvbm_cuda_span){dl + (uint64_t)l * NB * L + b * L, L};
    host_digest(h + b * B, B, want + 32 * b);
  }
  kvbm_error e;
  memset(got, 0xa5, sizeof got);
  if (kvbm_cuda_digest_spans(0, NULL, sp, counts, NB, got, &e)) fail_msg("spans: %s", e.msg);
  if (kvbm_cuda_digest_blocks(0, NULL, ptrs, lens, NB, cont, &e)) fail_msg("blocks: %s", e.msg);
  for (int b = 0; b < NB; b++) {
    if (memcmp(got[b], want + 32 * b, 32)) fail_msg("block %d: span digest differs from kvbm_blake3", b);
    assert_memory_equal(cont[b], got[b], 32);
  }
  uint32_t bi = 99, bc = 99;
  if (kvbm_cuda_verify_spans(0, NULL, sp, counts, NB, want, 32, &bi, &bc, &e)) fail_msg("verify: %s", e.msg);
  assert_int_equal(bc, 0);
  for (int k = 0; k < 6; k++) {
    uint32_t b = (uint32_t)(rnd() % NB), l = (uint32_t)(rnd() % NL);
    uint64_t at = (uint64_t)l * NB * L + b * L + rnd() % L;
    flip_bit(dl, at, (unsigned)(rnd() % 8));
    assert_int_equal(kvbm_cuda_verify_spans(0, NULL, sp, counts, NB, want, 32, &bi, &bc, &e), KVBM_ECHECKSUM);
    assert_int_equal(bi, b);
    assert_int_equal(bc, 1);
    CK(cudaMemcpy(dl + at - at % L, h + b * B + l * L, L, cudaMemcpyHostToDevice)); /* restored */
  }
  /* odd spans of one block: 1 KiB, empty, 3 KiB, 5 bytes, at odd places */
  kvbm_cuda_span odd[4] = {{dc + 7, 1024}, {NULL, 0}, {dl + 4099, 3072}, {dc + 100003, 5}};
  uint8_t cat[1024 + 3072 + 5], one[1][32], w1[32];
  uint8_t *tmp = malloc(4096);
  assert_non_null(tmp);
  memcpy(cat, h + 7, 1024);
  CK(cudaMemcpy(tmp, dl + 4099, 3072, cudaMemcpyDeviceToHost));
  memcpy(cat + 1024, tmp, 3072);
  memcpy(cat + 4096, h + 100003, 5);
  uint32_t c4 = 4;
  if (kvbm_cuda_digest_spans(0, NULL, odd, &c4, 1, one, &e)) fail_msg("odd spans: %s", e.msg);
  host_digest(cat, sizeof cat, w1);
  assert_memory_equal(one[0], w1, 32);
  /* a host span is refused, named */
  odd[1] = (kvbm_cuda_span){tmp, 1024};
  assert_int_equal(kvbm_cuda_digest_spans(0, NULL, odd, &c4, 1, one, &e), KVBM_EINVAL);
  expect_msg(&e, "block 0 span 1 at");
  free(tmp);
  CK(cudaFree(dl));
  CK(cudaFree(dc));
  free(h);
}

#endif

int main(void) {
  const struct CMUnitTest cpu[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_without_device),
      cmocka_unit_test(test_span_refusals),
  };
  if (cmocka_run_group_tests_name("cpu", cpu, NULL, NULL)) return 1;
  kvbm_test_gpu_or_skip();
#ifdef KVBM_HAVE_CUDA
  int kernels = 0;
  kvbm_error e;
  if (kvbm_cuda_available(NULL, &kernels, &e)) {
    fprintf(stderr, "kvbm_cuda_available: %s\n", e.msg);
    return 1;
  }
  if (!kernels) kvbm_test_gpu_skip("this build has no CUDA kernels (no nvcc, or a sanitizer build)");
  const struct CMUnitTest gpu[] = {
      cmocka_unit_test(test_gpu_refusals),     cmocka_unit_test(test_gpu_sizes),
      cmocka_unit_test(test_gpu_mixed_batch),  cmocka_unit_test(test_gpu_flipped_bit),
      cmocka_unit_test(test_gpu_stream_order), cmocka_unit_test(test_gpu_spans),
  };
  return cmocka_run_group_tests_name("gpu", gpu, NULL, NULL) ? 1 : 0;
#else
  return 0;
#endif
}
