/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_mix.c: the splitmix64 finalizer (common/mix.h) stays the published
 * SplitMix64: kvbm__mix64 of the states 0, golden and 2 x golden gives
 * the first three outputs of the reference generator seeded with 0 (the
 * values in Vigna's splitmix64.c test vectors). Those outputs are what
 * W2/worker block patterns are built from, so a change of the mix would
 * break stored patterns; this test fails first. Also: the inverse of the
 * finalizer (multiplicative inverses of its constants) undoes it, i.e. it
 * is a bijection and cannot merge two inputs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/mix.h"

#define GOLDEN 0x9E3779B97F4A7C15ull

static void reference_outputs(void **state) {
  (void)state;
  assert_true(kvbm__mix64(0) == 0xE220A8397B1DCDAFull);
  assert_true(kvbm__mix64(GOLDEN) == 0x6E789E6AA1B965F4ull);
  assert_true(kvbm__mix64(2 * GOLDEN) == 0x06C45D188009454Full);
}

/* The finalizer undone step by step (xor-shift by s >= 32 is its own
 * inverse; by s < 32 needs x ^ x>>s ^ x>>2s; odd multipliers invert). */
static uint64_t unmix(uint64_t x) {
  x ^= (x >> 31) ^ (x >> 62);
  x *= 0x319642B2D24D8EC3ull;
  x ^= (x >> 27) ^ (x >> 54);
  x *= 0x96DE1B173F119089ull;
  x ^= (x >> 30) ^ (x >> 60);
  return x - GOLDEN;
}

static void bijective(void **state) {
  (void)state;
  uint64_t x = 1;
  for (int i = 0; i < 100000; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    assert_true(unmix(kvbm__mix64(x)) == x);
  }
  assert_true(unmix(kvbm__mix64(UINT64_MAX)) == UINT64_MAX);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reference_outputs),
      cmocka_unit_test(bijective),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
