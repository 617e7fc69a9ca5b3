/* SPDX-License-Identifier: Apache-2.0 */
/* test_adopt.c: engine-owned G1 and G2 (kvbm_manager_config.g1_storage,
 * g2_storage) over host memory the test allocates: the manager uses the
 * engine's bytes in place (never zeroing them at create), offloads them to
 * G2, onboards them back after eviction bit for bit, refuses storages that
 * do not hold the tier's layout, and leaves the memory alive after destroy.
 * Device memory: test_gpu_adopt.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kvbm/storage.h"
#include "tier_testutil.h"

typedef struct engine_mem {
  kvbm_layout layout;
  void *base[8]; /* the tests use at most 3 regions */
  kvbm_storage *storage;
} engine_mem;

/* The engine's own cache: regions of `blocks` blocks of the tests' block
 * shape in `kind`, filled with 0xAB, adopted. */
static void engine_alloc(engine_mem *em, const kvbm_manager_config *c, kvbm_layout_kind kind,
                         uint32_t blocks) {
  memset(em, 0, sizeof *em);
  kvbm_layout_config lc = c->layout;
  lc.num_blocks = blocks;
  kvbm_error e = {0};
  if (kvbm_layout_init(&em->layout, kind, &lc, &e)) fail_msg("%s", e.msg);
  for (uint64_t r = 0; r < em->layout.num_regions; r++) {
    assert_int_equal(posix_memalign(&em->base[r], 4096, em->layout.region_size), 0);
    memset(em->base[r], 0xAB, em->layout.region_size);
  }
  if (kvbm_storage_adopt(KVBM_MEMORY_SYSTEM, 0, &em->layout, em->base, em->layout.num_regions,
                         &em->storage, &e))
    fail_msg("adopt: %s", e.msg);
}

static void engine_free(engine_mem *em) {
  kvbm_storage_release(em->storage);
  for (uint64_t r = 0; r < em->layout.num_regions; r++) free(em->base[r]);
}

/* Reads block `id`'s layers straight from the engine's memory (not
 * through the manager) and checks they hold the KV keyed by h. */
static int engine_block_is(const engine_mem *em, uint32_t id, uint64_t h) {
  for (uint32_t l = 0; l < em->layout.config.num_layers; l++) {
    kvbm_slice sl;
    if (kvbm_layout_block_layer(&em->layout, id, l, &sl, NULL)) return 0;
    if (!tu_layer((uint8_t *)em->base[sl.region] + sl.offset, sl.size, h, l, 1)) return 0;
  }
  return 1;
}

static void adopted_roundtrip(kvbm_layout_kind g1k, kvbm_layout_kind g2k, bool adopt_g2) {
  kvbm_manager_config c = tu_config("/tmp", 8, 32, 0);
  c.g1_kind = g1k;
  c.g2_kind = g2k;
  engine_mem g1, g2;
  engine_alloc(&g1, &c, g1k, 8);
  c.g1_storage = g1.storage;
  if (adopt_g2) {
    engine_alloc(&g2, &c, g2k, 32);
    c.g2_storage = g2.storage;
  }
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  assert_int_equal(kvbm_manager_memory(m, KVBM_TIER_G1), KVBM_MEMORY_SYSTEM);
  /* The tier is the engine's memory, untouched by create. */
  void *p;
  size_t sz;
  kvbm_slice sl;
  assert_int_equal(kvbm_manager_block_layer(m, KVBM_TIER_G1, 5, 1, &p, &sz), KVBM_OK);
  assert_int_equal(kvbm_layout_block_layer(&g1.layout, 5, 1, &sl, NULL), KVBM_OK);
  assert_ptr_equal(p, (uint8_t *)g1.base[sl.region] + sl.offset);
  for (uint64_t r = 0; r < g1.layout.num_regions; r++)
    for (uint64_t i = 0; i < g1.layout.region_size; i++)
      if (((uint8_t *)g1.base[r])[i] != 0xAB) fail_msg("create wrote the engine's byte %llu", (unsigned long long)i);

  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq_info info;
  kvbm_mreq *r;
  /* A's 4 blocks are computed into the engine's memory, then offloaded. */
  assert_int_equal(tu_run(m, a, 17, &info, &r), 0);
  const uint32_t *ids;
  size_t nb;
  kvbm_mreq_blocks(r, &ids, &nb);
  for (size_t k = 0; k < 4; k++) {
    uint64_t h;
    kvbm_mreq_block_hash(r, k, &h);
    assert_true(engine_block_is(&g1, ids[k], h));
  }
  kvbm_mreq_destroy(r);
  assert_int_equal(tu_stats(m, KVBM_TIER_G2).offloaded_blocks, 4);
  /* B (7 full blocks) evicts A from G1 (8 blocks); the engine's bytes of
   * A's blocks are overwritten by B's. */
  assert_int_equal(tu_run(m, b, 29, &info, NULL), 0);
  assert_true(tu_stats(m, KVBM_TIER_G1).evictions >= 3);
  /* A again: every block comes back from G2, into the engine's memory. */
  assert_int_equal(tu_run(m, a, 17, &info, &r), 16);
  assert_true(info.ready);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G1], 0);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G2], 4);
  assert_int_equal(tu_verify(m, r, 4), 4);
  kvbm_mreq_blocks(r, &ids, &nb);
  for (size_t k = 0; k < 4; k++) {
    uint64_t h;
    kvbm_mreq_block_hash(r, k, &h);
    assert_true(engine_block_is(&g1, ids[k], h));
  }
  kvbm_mreq_destroy(r);
  kvbm_tier_stats s2 = tu_stats(m, KVBM_TIER_G2);
  assert_int_equal(s2.onboarded_blocks, 4);
  assert_int_equal(s2.onboarded_bytes, 4 * kvbm_manager_block_bytes(m));
  kvbm_manager_destroy(m);
  /* Destroy released neither storage nor memory: both still work. */
  assert_ptr_equal(kvbm_storage_region_base(g1.storage, 0), g1.base[0]);
  for (uint64_t rr = 0; rr < g1.layout.num_regions; rr++) {
    memset(g1.base[rr], 0x3C, g1.layout.region_size);
    assert_int_equal(((uint8_t *)g1.base[rr])[g1.layout.region_size - 1], 0x3C);
  }
  engine_free(&g1);
  if (adopt_g2) engine_free(&g2);
  free(a);
  free(b);
}

static void test_adopted_g1_fc(void **st) {
  (void)st;
  adopted_roundtrip(KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_FULLY_CONTIGUOUS, false);
}

static void test_adopted_g1_ls(void **st) {
  (void)st;
  adopted_roundtrip(KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_FULLY_CONTIGUOUS, false);
}

static void test_adopted_g1_and_g2(void **st) {
  (void)st;
  adopted_roundtrip(KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_LAYER_SEPARATE, true);
  adopted_roundtrip(KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_LAYER_SEPARATE, true);
}

static void expect_create_refused(const kvbm_manager_config *c, const char *needle) {
  kvbm_manager *m = (kvbm_manager *)(uintptr_t)1;
  kvbm_error e = {0};
  int rc = kvbm_manager_create(c, &m, &e);
  if (rc != KVBM_EINVAL) fail_msg("create: got %d (%s), want EINVAL", rc, e.msg);
  if (!strstr(e.msg, needle)) fail_msg("message '%s' lacks '%s'", e.msg, needle);
}

/* Storages that cannot be the tier are refused at create, naming the
 * field; the refused storage is still the caller's (released below). */
static void test_adopted_refusals(void **st) {
  (void)st;
  kvbm_manager_config c = tu_config("/tmp", 8, 8, 0);
  engine_mem small, ls, big;
  engine_alloc(&small, &c, KVBM_LAYOUT_FULLY_CONTIGUOUS, 4); /* 4 blocks for a G1 of 8 */
  engine_alloc(&ls, &c, KVBM_LAYOUT_LAYER_SEPARATE, 8);      /* 3 regions for FC's 1 */
  engine_alloc(&big, &c, KVBM_LAYOUT_FULLY_CONTIGUOUS, 8);
  c.g1_storage = small.storage;
  expect_create_refused(&c, "g1_storage does not hold G1's layout");
  expect_create_refused(&c, "smaller");
  c.g1_storage = ls.storage;
  expect_create_refused(&c, "has 3 regions, the layout 1");
  c.g1_storage = big.storage;
  c.g2_storage = big.storage;
  expect_create_refused(&c, "g1_storage and g2_storage are the same storage");
  c.g2_storage = small.storage;
  expect_create_refused(&c, "g2_storage does not hold G2's layout");
  c.g2_blocks = 0;
  expect_create_refused(&c, "g2_storage given but g2_blocks is 0");
  /* A larger storage than the tier needs is fine: the layout fits. */
  c = tu_config("/tmp", 4, 0, 0);
  c.g1_storage = big.storage;
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  kvbm_manager_destroy(m);
  /* Every storage survived the refusals and the create. */
  for (uint64_t r = 0; r < ls.layout.num_regions; r++)
    assert_ptr_equal(kvbm_storage_region_base(ls.storage, r), ls.base[r]);
  engine_free(&small);
  engine_free(&ls);
  engine_free(&big);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adopted_g1_fc),
      cmocka_unit_test(test_adopted_g1_ls),
      cmocka_unit_test(test_adopted_g1_and_g2),
      cmocka_unit_test(test_adopted_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
