/* SPDX-License-Identifier: Apache-2.0 */
/* The frequency filter: a block earns its copy on its second use; counts
 * decay (halve) every decay_uses uses and when the table is full. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tier/filter.h"
#include "kvbm/status.h"

static void test_second_use_qualifies(void **st) {
  (void)st;
  kvbm_freq_filter f;
  assert_int_equal(kvbm__freq_filter_init(&f, 2, 1000, 64), KVBM_OK);
  assert_false(kvbm__freq_filter_use(&f, 42));
  assert_true(kvbm__freq_filter_use(&f, 42));
  assert_true(kvbm__freq_filter_use(&f, 42));
  assert_false(kvbm__freq_filter_use(&f, 0)); /* hash 0 is a key like any other */
  assert_true(kvbm__freq_filter_use(&f, 0));
  assert_false(kvbm__freq_filter_use(&f, 7));
  kvbm__freq_filter_destroy(&f);
}

static void test_decay(void **st) {
  (void)st;
  kvbm_freq_filter f;
  assert_int_equal(kvbm__freq_filter_init(&f, 2, 4, 64), KVBM_OK);
  assert_false(kvbm__freq_filter_use(&f, 42));
  assert_true(kvbm__freq_filter_use(&f, 42)); /* count 2 */
  /* Two decays (8 uses of others): 2 -> 1 -> 0, forgotten. */
  for (uint64_t x = 100; x < 108; x++) kvbm__freq_filter_use(&f, x);
  assert_false(kvbm__freq_filter_use(&f, 42)); /* must earn it again */
  /* A hot block survives a decay. */
  kvbm_freq_filter g;
  assert_int_equal(kvbm__freq_filter_init(&g, 2, 4, 64), KVBM_OK);
  for (int i = 0; i < 3; i++) kvbm__freq_filter_use(&g, 9); /* 3 */
  kvbm__freq_filter_use(&g, 1);                             /* 4th use: decay, 9 -> 1 */
  assert_true(kvbm__freq_filter_use(&g, 9));                /* 1 + 1 = 2 */
  kvbm__freq_filter_destroy(&f);
  kvbm__freq_filter_destroy(&g);
}

static void test_full_table_decays(void **st) {
  (void)st;
  kvbm_freq_filter f;
  assert_int_equal(kvbm__freq_filter_init(&f, 2, 1u << 30, 8), KVBM_OK);
  for (uint64_t x = 1; x <= 1000; x++) {
    kvbm__freq_filter_use(&f, x);
    assert_true(f.entries <= 8);
  }
  /* A block used often still qualifies among many one-offs. */
  for (uint64_t x = 2000; x < 2100; x++) {
    kvbm__freq_filter_use(&f, x);
    if (x % 2) assert_true(kvbm__freq_filter_use(&f, 77) || x < 2003);
  }
  kvbm__freq_filter_destroy(&f);
}

static void test_bad_init(void **st) {
  (void)st;
  kvbm_freq_filter f;
  assert_int_equal(kvbm__freq_filter_init(&f, 0, 4, 64), KVBM_EINVAL);
  assert_int_equal(kvbm__freq_filter_init(&f, 2, 0, 64), KVBM_EINVAL);
  assert_int_equal(kvbm__freq_filter_init(&f, 2, 4, 0), KVBM_EINVAL);
  assert_int_equal(kvbm__freq_filter_init(&f, 2, 4, (1u << 28) + 1), KVBM_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_use_qualifies), cmocka_unit_test(test_decay),
      cmocka_unit_test(test_full_table_decays), cmocka_unit_test(test_bad_init)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
