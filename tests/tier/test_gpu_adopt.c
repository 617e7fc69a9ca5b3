/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_gpu_adopt.c: engine-owned device G1. The test plays the engine: it
 * cudaMallocs its paged KV cache (one region per layer, LayerSeparate, as
 * an engine's per-layer tensors; and one FullyContiguous region), adopts it
 * (kvbm_storage_adopt, DEVICE) and gives it to a manager as g1_storage,
 * with pinned G2 that kvbm allocates.
 *
 * On the CPU, in every build: device and pinned adoption of host memory
 * are refused (KVBM_EUNSUPPORTED without CUDA; with the toolkit, no device
 * or "not device memory"), and nothing is created.
 *
 * On a device (kvbm_test_gpu_or_skip): random bytes written into the
 * engine's device memory with cudaMemcpy at the layout's offsets; commit
 * offloads them to G2; a second request evicts every block of the first
 * from G1 and the test poisons the whole G1 (cudaMemset); the first prompt
 * again onboards every block from G2 into the engine's memory: every byte
 * read back with cudaMemcpy (into a poisoned host buffer) equals what was
 * written, and the manager's own synchronous read (block_read) agrees.
 * Stats: 8 blocks offloaded, 8 onboarded, no copy errors. After the
 * manager is destroyed and the storage released the memory is intact (a
 * snapshot taken before destroy equals a copy taken after) and cudaFree by
 * the test succeeds. Refusals with real CUDA memory: device memory adopted
 * as PINNED, pinned memory adopted as DEVICE, a device index that does
 * not exist. Well under a second on an H100.
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
#include "kvbm/manager.h"
#include "kvbm/storage.h"

#define BS 16u     /* tokens per block */
#define G1_BLOCKS 16u
#define A_BLOCKS 8u

static kvbm_layout_config block_shape(void) {
  /* 4 layers x 2 (K, V) x 16 tokens x 128 x 2 bytes: 8 KiB per layer. */
  return (kvbm_layout_config){.num_blocks = 1, .num_layers = 4, .outer_dim = 2,
                              .page_size = BS, .inner_dim = 128, .dtype_size = 2,
                              .alignment = 256};
}

static kvbm_layout make_layout(kvbm_layout_kind kind, uint32_t blocks) {
  kvbm_layout_config c = block_shape();
  c.num_blocks = blocks;
  kvbm_layout l;
  kvbm_error e = {0};
  if (kvbm_layout_init(&l, kind, &c, &e)) fail_msg("layout: %s", e.msg);
  return l;
}

/* On the CPU: adopting host memory as device or pinned memory never
 * succeeds, whatever this build and machine have. */
static void test_refusals_on_cpu(void **st) {
  (void)st;
  kvbm_layout l = make_layout(KVBM_LAYOUT_LAYER_SEPARATE, 2);
  void *b[8] = {0};
  for (uint64_t r = 0; r < l.num_regions; r++)
    assert_int_equal(posix_memalign(&b[r], 4096, l.region_size), 0);
  kvbm_error e = {0};
  kvbm_storage *s = NULL;
  int rc = kvbm_storage_adopt(KVBM_MEMORY_DEVICE, 0, &l, b, l.num_regions, &s, &e);
  if (!kvbm_storage_have_cuda()) {
    assert_int_equal(rc, KVBM_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "needs a CUDA build"));
  } else {
    assert_true(rc == KVBM_EDEVICE || rc == KVBM_EINVAL);
    if (rc == KVBM_EINVAL) assert_non_null(strstr(e.msg, "not device memory"));
  }
  assert_null(s);
  rc = kvbm_storage_adopt(KVBM_MEMORY_PINNED, 0, &l, b, l.num_regions, &s, &e);
  assert_true(rc == (kvbm_storage_have_cuda() ? rc : KVBM_EUNSUPPORTED));
  assert_true(rc == KVBM_EUNSUPPORTED || rc == KVBM_EDEVICE || rc == KVBM_EINVAL);
  assert_null(s);
  for (uint64_t r = 0; r < l.num_regions; r++) free(b[r]);
}

#ifdef KVBM_HAVE_CUDA
#define CK(call)                                                                   \
  do {                                                                             \
    cudaError_t ck_e = (call);                                                     \
    if (ck_e != cudaSuccess)                                                       \
      fail_msg("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(ck_e)); \
  } while (0)

static uint64_t rnd(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *s = x;
}

static void fill_random(uint8_t *p, size_t n, uint64_t *s) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rnd(s);
    memcpy(p + i, &v, n - i < 8 ? n - i : 8);
  }
}

/* Device address of one layer of one block of the engine's cache. */
static uint8_t *layer_at(const kvbm_layout *l, void *const *base, uint32_t block, uint32_t layer) {
  kvbm_slice sl;
  kvbm_error e = {0};
  if (kvbm_layout_block_layer(l, block, layer, &sl, &e)) fail_msg("slice: %s", e.msg);
  return (uint8_t *)base[sl.region] + sl.offset;
}

static void roundtrip(kvbm_layout_kind g1k, uint64_t seed) {
  kvbm_layout l = make_layout(g1k, G1_BLOCKS);
  const uint32_t NL = (uint32_t)l.config.num_layers;
  const size_t LB = (size_t)l.layer_stride;
  void *base[8] = {0}; /* 4 layers at most here */
  for (uint64_t r = 0; r < l.num_regions; r++) {
    CK(cudaMalloc(&base[r], (size_t)l.region_size));
    CK(cudaMemset(base[r], 0x11, (size_t)l.region_size));
  }
  kvbm_storage *s = NULL;
  kvbm_error e = {0};
  if (kvbm_storage_adopt(KVBM_MEMORY_DEVICE, 0, &l, base, l.num_regions, &s, &e))
    fail_msg("adopt: %s", e.msg);
  assert_string_equal(kvbm_storage_name(s), "adopted device");
  assert_int_equal(kvbm_storage_device_id(s), 0);

  kvbm_manager_config c = kvbm_manager_config_default();
  c.block_size = BS;
  c.layout = block_shape();
  c.g1_kind = g1k;
  c.g1_blocks = G1_BLOCKS;
  c.g1_storage = s;
  c.g2_blocks = 64;
  c.g2_memory = KVBM_MEMORY_PINNED;
  kvbm_manager *m = NULL;
  if (kvbm_manager_create(&c, &m, &e)) fail_msg("manager create: %s", e.msg);
  assert_int_equal(kvbm_manager_memory(m, KVBM_TIER_G1), KVBM_MEMORY_DEVICE);
  assert_int_equal(kvbm_manager_memory(m, KVBM_TIER_G2), KVBM_MEMORY_PINNED);
  void *p;
  assert_int_equal(kvbm_manager_block_layer(m, KVBM_TIER_G1, 3, 1, &p, NULL), KVBM_OK);
  assert_ptr_equal(p, layer_at(&l, base, 3, 1)); /* G1 is the engine's memory */

  /* A: 8 full blocks (+1 token); the engine computes them into its memory. */
  uint32_t a[A_BLOCKS * BS + 1], b[(G1_BLOCKS - 1) * BS + 1];
  for (uint32_t i = 0; i < A_BLOCKS * BS + 1; i++) a[i] = 7000 + i;
  for (uint32_t i = 0; i < (G1_BLOCKS - 1) * BS + 1; i++) b[i] = 90000 + i;
  uint8_t *want = malloc(A_BLOCKS * NL * LB), *got = malloc(LB);
  assert_non_null(want);
  assert_non_null(got);
  uint64_t rs = seed;
  fill_random(want, A_BLOCKS * NL * LB, &rs);
  kvbm_mreq *r = NULL;
  size_t opt = 0;
  kvbm_mreq_info info;
  if (kvbm_manager_prefill(m, 0, 0, a, A_BLOCKS * BS + 1, &r, &opt, &e)) fail_msg("prefill: %s", e.msg);
  assert_int_equal(kvbm_mreq_wait(r, 10000, &info), KVBM_OK);
  assert_int_equal(info.matched_tokens, 0);
  const uint32_t *ids;
  size_t nb;
  kvbm_mreq_blocks(r, &ids, &nb);
  assert_true(nb >= A_BLOCKS);
  for (uint32_t k = 0; k < A_BLOCKS; k++) {
    assert_true(kvbm_mreq_must_compute(r, k));
    for (uint32_t ly = 0; ly < NL; ly++)
      CK(cudaMemcpy(layer_at(&l, base, ids[k], ly), want + ((size_t)k * NL + ly) * LB, LB,
                    cudaMemcpyHostToDevice));
  }
  CK(cudaDeviceSynchronize());
  assert_int_equal(kvbm_mreq_commit(r), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_mreq_destroy(r);
  kvbm_tier_stats s2;
  assert_int_equal(kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2), KVBM_OK);
  assert_int_equal(s2.offloaded_blocks, A_BLOCKS);
  assert_int_equal(s2.copy_errors, 0);

  /* B: 15 full blocks and a partial one, the whole G1: every block of A
   * is evicted from G1. */
  if (kvbm_manager_prefill(m, 0, 0, b, (G1_BLOCKS - 1) * BS + 1, &r, &opt, &e)) fail_msg("prefill B: %s", e.msg);
  assert_int_equal(kvbm_mreq_wait(r, 10000, &info), KVBM_OK);
  assert_int_equal(kvbm_mreq_commit(r), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_mreq_destroy(r);
  kvbm_tier_stats s1;
  assert_int_equal(kvbm_manager_stats_get(m, KVBM_TIER_G1, &s1), KVBM_OK);
  assert_true(s1.evictions >= A_BLOCKS);
  /* The engine wipes its cache: only G2 holds A's bytes now. */
  for (uint64_t rr = 0; rr < l.num_regions; rr++)
    CK(cudaMemset(base[rr], 0xEE, (size_t)l.region_size));
  CK(cudaDeviceSynchronize());

  /* A again: 8 blocks onboarded from G2 into the engine's memory. */
  if (kvbm_manager_prefill(m, 0, 0, a, A_BLOCKS * BS + 1, &r, &opt, &e)) fail_msg("prefill A2: %s", e.msg);
  assert_int_equal(kvbm_mreq_wait(r, 10000, &info), KVBM_OK);
  assert_true(info.ready);
  assert_int_equal(info.matched_tokens, A_BLOCKS * BS);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G2], A_BLOCKS);
  kvbm_mreq_blocks(r, &ids, &nb);
  size_t bad = 0;
  for (uint32_t k = 0; k < A_BLOCKS; k++)
    for (uint32_t ly = 0; ly < NL; ly++) {
      const uint8_t *w = want + ((size_t)k * NL + ly) * LB;
      memset(got, 0x5A, LB);
      CK(cudaMemcpy(got, layer_at(&l, base, ids[k], ly), LB, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < LB; i++)
        if (got[i] != w[i] && bad++ < 5)
          print_message("block %u layer %u byte %zu: %02x, want %02x\n", k, ly, i, got[i], w[i]);
      memset(got, 0xA5, LB);
      assert_int_equal(kvbm_manager_block_read(m, KVBM_TIER_G1, ids[k], ly, got, LB, &e), KVBM_OK);
      if (memcmp(got, w, LB)) bad++;
    }
  if (bad) fail_msg("%zu bytes (or block_read layers) differ after the onboard", bad);
  kvbm_mreq_destroy(r);
  assert_int_equal(kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2), KVBM_OK);
  assert_int_equal(s2.onboarded_blocks, A_BLOCKS);
  assert_int_equal(s2.copy_errors, 0);
  assert_int_equal(s2.onboard_failures, 0);

  /* Destroy and release leave the engine's memory alive and unchanged. */
  kvbm_manager_flush(m);
  size_t total = (size_t)l.region_size;
  uint8_t *before = malloc(total * l.num_regions), *after = malloc(total);
  assert_non_null(before);
  assert_non_null(after);
  for (uint64_t rr = 0; rr < l.num_regions; rr++)
    CK(cudaMemcpy(before + rr * total, base[rr], total, cudaMemcpyDeviceToHost));
  kvbm_manager_destroy(m);
  kvbm_storage_release(s);
  for (uint64_t rr = 0; rr < l.num_regions; rr++) {
    memset(after, 0x77, total);
    CK(cudaMemcpy(after, base[rr], total, cudaMemcpyDeviceToHost));
    assert_memory_equal(before + rr * total, after, total);
    CK(cudaMemset(base[rr], 0x42, total)); /* still the engine's to write */
    CK(cudaFree(base[rr]));
  }
  CK(cudaDeviceSynchronize());
  free(before);
  free(after);
  free(want);
  free(got);
}

/* Real CUDA memory of the wrong kind, or on a device that does not exist. */
static void device_refusals(void) {
  kvbm_layout l = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 4);
  void *dev = NULL, *pin = NULL;
  CK(cudaMalloc(&dev, (size_t)l.region_size));
  CK(cudaHostAlloc(&pin, (size_t)l.region_size, cudaHostAllocPortable));
  kvbm_storage *s = NULL;
  kvbm_error e = {0};
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_PINNED, 0, &l, &pin, 1, &s, &e), KVBM_OK);
  assert_string_equal(kvbm_storage_name(s), "adopted pinned");
  kvbm_storage_release(s);
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_PINNED, 0, &l, &dev, 1, &s, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "is device memory, not page-locked"));
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_DEVICE, 0, &l, &pin, 1, &s, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "not device memory"));
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_SYSTEM, 0, &l, &dev, 1, &s, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "not host memory"));
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_DEVICE, n, &l, &dev, 1, &s, &e), KVBM_EDEVICE);
  assert_non_null(strstr(e.msg, "no CUDA device"));
  assert_null(s);
  /* The manager refuses an adopted device G2 (G2 is host memory). */
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_DEVICE, 0, &l, &dev, 1, &s, &e), KVBM_OK);
  kvbm_manager_config c = kvbm_manager_config_default();
  c.block_size = BS;
  c.layout = block_shape();
  c.g1_blocks = 4;
  c.g2_blocks = 4;
  c.g2_storage = s;
  kvbm_manager *m = NULL;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "g2_storage is device memory"));
  assert_null(m);
  kvbm_storage_release(s);
  CK(cudaFree(dev));
  CK(cudaFreeHost(pin));
}
#endif

static void test_on_device(void **st) {
  (void)st;
  kvbm_test_gpu_or_skip();
#ifdef KVBM_HAVE_CUDA
  CK(cudaSetDevice(0));
  device_refusals();
  roundtrip(KVBM_LAYOUT_LAYER_SEPARATE, 0x9E3779B97F4A7C15ull);
  roundtrip(KVBM_LAYOUT_FULLY_CONTIGUOUS, 0xD1B54A32D192ED03ull);
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals_on_cpu),
      cmocka_unit_test(test_on_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
