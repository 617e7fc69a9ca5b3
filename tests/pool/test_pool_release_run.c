/* SPDX-License-Identifier: Apache-2.0 */
/* test_pool_release_run.c: releasing a block table in one call, tail first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvbm/pool.h"

static void releases_tail_first_and_stops_at_a_bad_id(void **state) {
  (void)state;
  kvbm_pool_config c = kvbm_pool_config_default(6, 2);
  kvbm_pool *p;
  assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_OK);
  uint32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t h[4];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, toks, 8, 2, h, 4);
  uint32_t ids[4];
  assert_int_equal(kvbm_pool_fill_run(p, 0, 0, false, toks, h, 4, ids), KVBM_OK);
  assert_int_equal(kvbm_pool_release_run(p, ids, 4, 0), KVBM_OK);
  /* Free blocks go first (2), then the cache from the old tail down. */
  uint32_t got[6];
  assert_int_equal(kvbm_pool_alloc(p, 6, got), KVBM_OK);
  assert_int_equal(got[2], ids[3]);
  assert_int_equal(got[3], ids[2]);
  assert_int_equal(got[4], ids[1]);
  assert_int_equal(got[5], ids[0]);
  /* An unheld id in the middle: the ids after it (in release order) stay held. */
  for (int i = 0; i < 6; i++) assert_int_equal(kvbm_block_release(p, got[i], 0), KVBM_OK);
  assert_int_equal(kvbm_pool_alloc(p, 3, ids), KVBM_OK);
  uint32_t table[4] = {ids[0], ids[1], 99, ids[2]};
  assert_int_equal(kvbm_pool_release_run(p, table, 4, 0), KVBM_EINVAL);
  kvbm_pool_stats st;
  kvbm_pool_stats_get(p, &st);
  assert_int_equal(st.active, 2); /* ids[2] released, ids[0..1] still held */
  uint32_t unheld[2] = {ids[0], ids[2]};
  assert_int_equal(kvbm_pool_release_run(p, unheld, 2, 0), KVBM_ESTATE);
  assert_int_equal(kvbm_pool_release_run(p, NULL, 1, 0), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_release_run(p, NULL, 0, 0), KVBM_OK);
  kvbm_pool_destroy(p);
}

/* Twin pools, one released with release_run and one block by block, under
 * random tables, shared blocks and priorities: the same evictions after. */
static void equals_block_by_block_release(void **state) {
  (void)state;
  enum { NB = 64, BS = 2 };
  kvbm_pool_config c = kvbm_pool_config_default(NB, BS);
  kvbm_pool *a, *b;
  assert_int_equal(kvbm_pool_create(&c, &a, NULL), KVBM_OK);
  assert_int_equal(kvbm_pool_create(&c, &b, NULL), KVBM_OK);
  uint32_t x = 7;
  for (int round = 0; round < 300; round++) {
    uint32_t toks[16 * BS];
    size_t n = 1 + (x = x * 1103515245u + 12345u) % 16;
    for (size_t i = 0; i < n * BS; i++) toks[i] = (x = x * 1103515245u + 12345u) % 40;
    uint64_t h[16];
    kvbm_hash_chain(KVBM_HASH_NATIVE, 0, toks, n * BS, BS, h, 16);
    uint32_t ia[16], ib[16];
    if (kvbm_pool_available(a) < n) break;
    assert_int_equal(kvbm_pool_fill_run(a, 0, 0, false, toks, h, n, ia), KVBM_OK);
    assert_int_equal(kvbm_pool_fill_run(b, 0, 0, false, toks, h, n, ib), KVBM_OK);
    assert_memory_equal(ia, ib, n * sizeof *ia);
    uint8_t prio = (uint8_t)((x >> 8) % 3);
    assert_int_equal(kvbm_pool_release_run(a, ia, n, prio), KVBM_OK);
    for (size_t k = n; k-- > 0;) assert_int_equal(kvbm_block_release(b, ib[k], prio), KVBM_OK);
    kvbm_pool_stats sa, sb;
    kvbm_pool_stats_get(a, &sa);
    kvbm_pool_stats_get(b, &sb);
    assert_memory_equal(&sa, &sb, sizeof sa);
  }
  /* Drain both: identical eviction order. */
  for (int i = 0; i < NB; i++) {
    uint32_t ga, gb;
    assert_int_equal(kvbm_pool_alloc(a, 1, &ga), KVBM_OK);
    assert_int_equal(kvbm_pool_alloc(b, 1, &gb), KVBM_OK);
    assert_int_equal(ga, gb);
  }
  kvbm_pool_destroy(a);
  kvbm_pool_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(releases_tail_first_and_stops_at_a_bad_id),
      cmocka_unit_test(equals_block_by_block_release),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
