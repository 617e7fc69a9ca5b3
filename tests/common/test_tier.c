/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_tier.c: the tiers' two spellings (common/tier.c): kvbm_tier_name
 * "G1".."G4" and kvbm__tier_key "g1".."g4" name the same tier in the
 * enum's order (kvbm_tier_parse reads each back to it), differ only in
 * case, are two characters (psim's storage events send location_len 2),
 * and both give "?" outside the enum, never NULL.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/tier.h"
#include "kvbm/tier.h"

static void test_keys_match_names(void **state) {
  (void)state;
  const kvbm_tier order[KVBM_TIER_COUNT] = {KVBM_TIER_G1, KVBM_TIER_G2, KVBM_TIER_G3, KVBM_TIER_G4};
  const char *want[KVBM_TIER_COUNT] = {"g1", "g2", "g3", "g4"};
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    const char *key = kvbm__tier_key(t), *name = kvbm_tier_name(t);
    assert_string_equal(key, want[t]);
    assert_int_equal(strlen(key), 2);
    assert_int_equal(name[0], 'G');
    assert_string_equal(name + 1, key + 1);
    kvbm_tier a = KVBM_TIER_G4, b = KVBM_TIER_G1;
    assert_true(kvbm_tier_parse(key, &a));
    assert_true(kvbm_tier_parse(name, &b));
    assert_int_equal(a, order[t]);
    assert_int_equal(b, order[t]);
  }
}

static void test_outside_the_enum(void **state) {
  (void)state;
  const int bad[] = {-1, KVBM_TIER_COUNT, 1000, INT32_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_string_equal(kvbm__tier_key(bad[i]), "?");
    assert_string_equal(kvbm_tier_name(bad[i]), "?");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_keys_match_names),
      cmocka_unit_test(test_outside_the_enum),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
