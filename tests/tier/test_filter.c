/* SPDX-License-Identifier: Apache-2.0 */
/* The frequency filter: a block earns its copy on its second use; counts
 * decay (halve) every decay_uses uses and when the table is full; the
 * decay's work is spread over later uses and answers as if done at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
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

/* The definition, done the slow way: every count halved at once at a
 * decay, zeros forgotten; the filter spreads that work over the uses
 * after it and must answer exactly as this does. */
typedef struct ref_filter {
  uint64_t key[4096];
  uint32_t count[4096];
  uint32_t n, max, threshold, decay_uses, since;
} ref_filter;

static void ref_decay(ref_filter *r) {
  uint32_t kept = 0;
  for (uint32_t i = 0; i < r->n; i++)
    if (r->count[i] / 2) r->key[kept] = r->key[i], r->count[kept++] = r->count[i] / 2;
  r->n = kept;
  r->since = 0;
}

static bool ref_use(ref_filter *r, uint64_t hash) {
  uint64_t key = hash ? hash : 1;
  if (++r->since >= r->decay_uses) ref_decay(r);
  uint32_t i = 0;
  while (i < r->n && r->key[i] != key) i++;
  if (i == r->n) {
    while (r->n >= r->max) ref_decay(r); /* a decay that frees nothing, again */
    i = r->n++;
    r->key[i] = key;
    r->count[i] = 0;
  }
  if (r->count[i] < UINT32_MAX) r->count[i]++;
  return r->count[i] >= r->threshold;
}

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Random streams (a few hot keys, many cold ones, hash 0 among them)
 * through the filter and the definition: every answer and every entries
 * count equal, across decays by use count and by a full table, with
 * decays landing while the last one's drain or clearing is under way. */
static void test_spread_decay_equals_definition(void **st) {
  (void)st;
  static const uint32_t decays[] = {1, 2, 3, 5, 17, 64, 1000, 70000};
  static const uint32_t maxes[] = {1, 3, 8, 64, 1000, 4000};
  static ref_filter r;
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (size_t d = 0; d < sizeof decays / sizeof *decays; d++)
    for (size_t m = 0; m < sizeof maxes / sizeof *maxes; m++)
      for (uint32_t thr = 1; thr <= 4; thr += 3) {
        kvbm_freq_filter f;
        assert_int_equal(kvbm__freq_filter_init(&f, thr, decays[d], maxes[m]), KVBM_OK);
        r = (ref_filter){.max = maxes[m], .threshold = thr, .decay_uses = decays[d]};
        uint64_t universe = 2 + xorshift(&seed) % (4 * maxes[m] + 8);
        for (int i = 0; i < 20000; i++) {
          uint64_t x = xorshift(&seed);
          uint64_t key = x % 4 == 0 ? x % 5 : (x >> 8) % universe; /* hot 0..4, else cold */
          bool want = ref_use(&r, key);
          if (kvbm__freq_filter_use(&f, key) != want || f.entries != r.n) {
            print_error("decay_uses %u max_entries %u threshold %u, use %d of key %llu: "
                        "answer %d entries %u, the definition's %d %u\n",
                        decays[d], maxes[m], thr, i, (unsigned long long)key, !want, f.entries,
                        want, r.n);
            fail();
          }
        }
        kvbm__freq_filter_destroy(&f);
      }
}

/* A decay's work is its entries, not its table, and it is spread: the
 * manager's default filter (2^21 slots) after 65,536 uses of 40,000 keys
 * leaves 40,000 filled slots to drain, 16 a use. */
static void test_decay_work_is_spread(void **st) {
  (void)st;
  kvbm_freq_filter f;
  assert_int_equal(kvbm__freq_filter_init(&f, 2, 65536, 1u << 20), KVBM_OK);
  for (uint64_t x = 1; x < 65536; x++) kvbm__freq_filter_use(&f, 1 + x % 40000);
  assert_int_equal(f.phase, 0);
  assert_int_equal(f.nslots, 40000);
  kvbm__freq_filter_use(&f, 7); /* use 65,536: the decay only swaps */
  assert_int_equal(f.phase, 1);
  assert_int_equal(f.old_nslots, 40000);
  assert_int_equal(f.step, 16);
  assert_int_equal(f.at, 0);
  kvbm__freq_filter_use(&f, 8);
  assert_int_equal(f.at, 16);
  /* drained and cleared within the next decay_uses uses */
  for (uint64_t x = 0; x < 5000; x++) kvbm__freq_filter_use(&f, 100000 + x);
  assert_int_equal(f.phase, 0);
  kvbm__freq_filter_destroy(&f);
}

/* Keys kept warm (each used twice between new ones) never push entries
 * past max_entries: a full table decays until there is room. The one-pass
 * filter before session 14 let them grow past it, towards the table's
 * size. */
static void test_warm_keys_stay_bounded(void **st) {
  (void)st;
  kvbm_freq_filter f;
  assert_int_equal(kvbm__freq_filter_init(&f, 2, 1u << 30, 4), KVBM_OK);
  for (uint64_t round = 1; round <= 64; round++)
    for (uint64_t k = 1; k <= round; k++) {
      kvbm__freq_filter_use(&f, k);
      kvbm__freq_filter_use(&f, k);
      assert_true(f.entries <= 4);
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
      cmocka_unit_test(test_full_table_decays), cmocka_unit_test(test_spread_decay_equals_definition),
      cmocka_unit_test(test_decay_work_is_spread), cmocka_unit_test(test_warm_keys_stay_bounded),
      cmocka_unit_test(test_bad_init)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
