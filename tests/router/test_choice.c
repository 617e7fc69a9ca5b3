/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_choice.c: the cost function, tie breaks, temperature, load and the
 * approximate mode.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "kvbm/router.h"

#define MAXW KVBM_ROUTER_MAX_WORKERS

static kvbm_overlap ovl(uint32_t d, uint32_t h, uint32_t k) {
  return (kvbm_overlap){.prefix = {d, h, k, k}};
}

static void test_score(void **state) {
  (void)state;
  kvbm_choice_config c = kvbm_choice_config_default();
  assert_true(c.tier_weight[0] == 1.0 && c.tier_weight[1] == 0.75 && c.tier_weight[2] == 0.25 &&
              c.tier_weight[3] == 0.1);
  kvbm_overlap o = ovl(4, 8, 12);
  assert_true(fabs(kvbm_overlap_score(&c, &o) - (4 + 0.75 * 4 + 0.25 * 4)) < 1e-12);
  c.tier_weight[2] = 0;
  assert_true(fabs(kvbm_overlap_score(&c, &o) - 7) < 1e-12);
  /* remote blocks beyond the disk prefix count at the G4 weight */
  o.prefix[3] = 22;
  assert_true(fabs(kvbm_overlap_score(&c, &o) - (7 + 0.1 * 10)) < 1e-12);
}

static void test_lowest_cost(void **state) {
  (void)state;
  kvbm_choice_config c = kvbm_choice_config_default();
  kvbm_overlap ov[MAXW] = {0};
  ov[0] = ovl(2, 2, 2);
  ov[1] = ovl(0, 6, 6);  /* 4.5 blocks of overlap */
  ov[2] = ovl(5, 5, 5);
  ov[3] = ovl(9, 9, 9);  /* best, but not a candidate */
  uint64_t rng = 1;
  kvbm_choice ch;
  assert_int_equal(kvbm_choose(&c, 10, ov, NULL, 0x7, &rng, &ch), KVBM_OK);
  assert_int_equal(ch.slot, 2);
  assert_true(fabs(ch.cost - 5) < 1e-12);
  assert_int_equal(ch.ties, 1);
  /* load: worker 2 busy with 3 blocks, worker 1 costs 10-4.5 = 5.5 < 8 */
  double load[MAXW] = {0};
  load[2] = 3;
  assert_int_equal(kvbm_choose(&c, 10, ov, load, 0x7, &rng, &ch), KVBM_OK);
  assert_int_equal(ch.slot, 1);
  /* load weight 0 ignores it; prefill weight 0 leaves only the load */
  c.load_weight = 0;
  assert_int_equal(kvbm_choose(&c, 10, ov, load, 0x7, &rng, &ch), KVBM_OK);
  assert_int_equal(ch.slot, 2);
  c = kvbm_choice_config_default();
  c.prefill_weight = 0;
  load[0] = 1, load[1] = 0.5;
  assert_int_equal(kvbm_choose(&c, 10, ov, load, 0x7, &rng, &ch), KVBM_OK);
  assert_int_equal(ch.slot, 1);
  assert_int_equal(kvbm_choose(&c, 10, ov, load, 0, &rng, &ch), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_choose(NULL, 10, ov, load, 1, &rng, &ch), KVBM_EINVAL);
}

static void test_ties_random(void **state) {
  (void)state;
  kvbm_choice_config c = kvbm_choice_config_default();
  kvbm_overlap ov[MAXW] = {0};
  for (int s = 0; s < 4; s++) ov[s] = ovl(3, 3, 3);
  ov[4] = ovl(1, 1, 1);
  int count[MAXW] = {0};
  uint64_t rng = 42;
  for (int i = 0; i < 8000; i++) {
    kvbm_choice ch;
    assert_int_equal(kvbm_choose(&c, 8, ov, NULL, 0x1f, &rng, &ch), KVBM_OK);
    assert_int_equal(ch.ties, 4);
    count[ch.slot]++;
  }
  assert_int_equal(count[4], 0);
  for (int s = 0; s < 4; s++) assert_in_range(count[s], 1700, 2300); /* ~2000 each */
}

static void test_temperature(void **state) {
  (void)state;
  kvbm_choice_config c = kvbm_choice_config_default();
  kvbm_overlap ov[MAXW] = {0};
  ov[0] = ovl(10, 10, 10);
  ov[1] = ovl(0, 0, 0);
  uint64_t rng = 7;
  int wins0 = 0, n = 4000;
  c.temperature = 1.0; /* p0 / p1 = e */
  for (int i = 0; i < n; i++) {
    kvbm_choice ch;
    assert_int_equal(kvbm_choose(&c, 10, ov, NULL, 0x3, &rng, &ch), KVBM_OK);
    wins0 += ch.slot == 0;
  }
  double expect = n * M_E / (1 + M_E); /* ~2924 */
  assert_in_range(wins0, (int)(expect - 150), (int)(expect + 150));
  c.temperature = 0.01; /* nearly greedy */
  wins0 = 0;
  for (int i = 0; i < n; i++) {
    kvbm_choice ch;
    assert_int_equal(kvbm_choose(&c, 10, ov, NULL, 0x3, &rng, &ch), KVBM_OK);
    wins0 += ch.slot == 0;
  }
  assert_int_equal(wins0, n);
}

static void test_config_check(void **state) {
  (void)state;
  kvbm_error err;
  kvbm_choice_config c = kvbm_choice_config_default();
  assert_int_equal(kvbm_choice_config_check(&c, &err), KVBM_OK);
  c.tier_weight[1] = -1;
  assert_int_equal(kvbm_choice_config_check(&c, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "G2 (host) tier weight"));
  c = kvbm_choice_config_default();
  c.temperature = NAN;
  assert_int_equal(kvbm_choice_config_check(&c, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "temperature"));
  c = kvbm_choice_config_default();
  c.load_weight = INFINITY;
  assert_int_equal(kvbm_choice_config_check(&c, &err), KVBM_EINVAL);
  c = kvbm_choice_config_default();
  c.load_kind = (kvbm_load_kind)9;
  assert_int_equal(kvbm_choice_config_check(&c, &err), KVBM_EINVAL);
}

static void test_approx(void **state) {
  (void)state;
  kvbm_index_config ic = kvbm_index_config_default();
  kvbm_index *idx;
  assert_int_equal(kvbm_index_create(&ic, &idx, NULL), KVBM_OK);
  kvbm_worker_key k0 = {1, 0}, k1 = {2, 0};
  uint32_t s0, s1;
  assert_int_equal(kvbm_index_add_worker(idx, k0, &s0, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_add_worker(idx, k1, &s1, NULL), KVBM_OK);
  kvbm_approx *ap;
  kvbm_error err;
  kvbm_approx_config ac = kvbm_approx_config_default();
  ac.ttl_s = 0;
  assert_int_equal(kvbm_approx_create(idx, &ac, &ap, &err), KVBM_EINVAL);
  ac.ttl_s = 10;
  ac.max_blocks_per_worker = 0;
  assert_int_equal(kvbm_approx_create(idx, &ac, &ap, &err), KVBM_EINVAL);
  ac = kvbm_approx_config_default();
  ac.ttl_s = 10;
  assert_int_equal(kvbm_approx_create(idx, &ac, &ap, &err), KVBM_OK);
  uint64_t h[4] = {11, 12, 13, 14};
  kvbm_overlap ov[MAXW];
  assert_int_equal(kvbm_approx_record(ap, s0, h, 3, 100.0, &err), KVBM_OK);
  assert_int_equal(kvbm_approx_record(ap, s1, h, 2, 104.0, &err), KVBM_OK);
  assert_int_equal(kvbm_approx_record(ap, s0, h, 1, 105.0, &err), KVBM_OK);
  kvbm_index_lookup(idx, h, 4, ov, NULL);
  assert_int_equal(ov[s0].prefix[0], 3);
  assert_int_equal(ov[s1].prefix[0], 2);
  /* time goes back: refused */
  assert_int_equal(kvbm_approx_record(ap, s0, h, 1, 99.0, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "goes back"));
  assert_int_equal(kvbm_approx_record(ap, 40, h, 1, 105.0, &err), KVBM_EINVAL);
  /* at 110 the first record goes; worker 0 keeps block 0 of the third */
  assert_int_equal(kvbm_approx_expire(ap, 109.9), 0);
  assert_int_equal(kvbm_approx_expire(ap, 110.0), 1);
  kvbm_index_lookup(idx, h, 4, ov, NULL);
  assert_int_equal(ov[s0].prefix[0], 1);
  assert_int_equal(ov[s1].prefix[0], 2);
  assert_int_equal(kvbm_approx_pending(ap), 2);
  /* many records: the ring grows and expires in order */
  for (int i = 0; i < 1000; i++)
    assert_int_equal(kvbm_approx_record(ap, s1, h + 3, 1, 200.0 + i * 0.001, &err), KVBM_OK);
  kvbm_index_lookup(idx, h + 3, 1, ov, NULL);
  assert_int_equal(ov[s1].prefix[0], 1);
  assert_int_equal(kvbm_approx_expire(ap, 1000), 1000);
  kvbm_index_lookup(idx, h, 4, ov, NULL);
  assert_int_equal(ov[s0].prefix[0], 0);
  assert_int_equal(ov[s1].prefix[0], 0);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.entries, 0);
  kvbm_approx_destroy(ap);
  kvbm_index_destroy(idx);
}

/* The budget per worker: the oldest decisions of that worker go first (and
 * are counted), other workers keep theirs, a decision longer than the
 * budget keeps its prefix, and the index never holds more than the budget
 * per worker. */
static void test_approx_budget(void **state) {
  (void)state;
  kvbm_index_config ic = kvbm_index_config_default();
  kvbm_index *idx;
  assert_int_equal(kvbm_index_create(&ic, &idx, NULL), KVBM_OK);
  uint32_t s0, s1;
  assert_int_equal(kvbm_index_add_worker(idx, (kvbm_worker_key){1, 0}, &s0, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_add_worker(idx, (kvbm_worker_key){2, 0}, &s1, NULL), KVBM_OK);
  kvbm_approx_config ac = {.ttl_s = 100, .max_blocks_per_worker = 10};
  kvbm_approx *ap;
  kvbm_error err;
  assert_int_equal(kvbm_approx_create(idx, &ac, &ap, &err), KVBM_OK);
  uint64_t a[4] = {101, 102, 103, 104}, b[4] = {201, 202, 203, 204}, c[4] = {301, 302, 303, 304};
  kvbm_overlap ov[MAXW];
  assert_int_equal(kvbm_approx_record(ap, s0, a, 4, 1.0, &err), KVBM_OK);
  assert_int_equal(kvbm_approx_record(ap, s1, a, 4, 1.5, &err), KVBM_OK);
  assert_int_equal(kvbm_approx_record(ap, s0, b, 4, 2.0, &err), KVBM_OK);
  kvbm_approx_stats st;
  kvbm_approx_stats_get(ap, &st);
  assert_int_equal(st.evicted_records, 0);
  assert_int_equal(st.max_worker_blocks, 8);
  /* 8 + 4 > 10: worker 0's oldest (a) goes, worker 1's a stays */
  assert_int_equal(kvbm_approx_record(ap, s0, c, 4, 3.0, &err), KVBM_OK);
  kvbm_index_lookup(idx, a, 4, ov, NULL);
  assert_int_equal(ov[s0].prefix[0], 0);
  assert_int_equal(ov[s1].prefix[0], 4);
  kvbm_index_lookup(idx, b, 4, ov, NULL);
  assert_int_equal(ov[s0].prefix[0], 4);
  kvbm_approx_stats_get(ap, &st);
  assert_int_equal(st.evicted_records, 1);
  assert_int_equal(st.evicted_blocks, 4);
  assert_int_equal(st.records, 3);
  assert_int_equal(st.blocks, 12);
  assert_int_equal(st.max_worker_blocks, 8);
  /* one decision of 1000 new blocks: the first 10 kept, everything older
   * of that worker evicted, the index at the budget */
  uint64_t big[1000];
  for (int i = 0; i < 1000; i++) big[i] = 5000 + (uint64_t)i;
  assert_int_equal(kvbm_approx_record(ap, s0, big, 1000, 4.0, &err), KVBM_OK);
  kvbm_index_lookup(idx, big, 1000, ov, NULL);
  assert_int_equal(ov[s0].prefix[0], 10);
  kvbm_approx_stats_get(ap, &st);
  assert_int_equal(st.truncated_blocks, 990);
  assert_int_equal(st.evicted_records, 3);
  assert_int_equal(st.max_worker_blocks, 10);
  kvbm_index_stats is;
  kvbm_index_stats_get(idx, &is);
  assert_int_equal(is.entries, 10 + 4);
  /* a flood of distinct decisions: entries stay at the budget */
  for (int i = 0; i < 5000; i++) {
    uint64_t h[3] = {100000 + 3 * (uint64_t)i, 100001 + 3 * (uint64_t)i, 100002 + 3 * (uint64_t)i};
    assert_int_equal(kvbm_approx_record(ap, s0, h, 3, 5.0 + i * 1e-3, &err), KVBM_OK);
  }
  kvbm_index_stats_get(idx, &is);
  assert_true(is.entries <= 10 + 4);
  kvbm_approx_stats_get(ap, &st);
  assert_int_equal(st.recorded, 5000 + 5);
  assert_int_equal(st.records, 3 + 1); /* 3 x 3 blocks for worker 0, a for worker 1 */
  /* expiry counts too */
  assert_int_equal(kvbm_approx_expire(ap, 1000), 4);
  kvbm_approx_stats_get(ap, &st);
  assert_int_equal(st.expired, 4);
  assert_int_equal(st.blocks, 0);
  kvbm_index_stats_get(idx, &is);
  assert_int_equal(is.entries, 0);
  kvbm_approx_destroy(ap);
  kvbm_index_destroy(idx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_score),       cmocka_unit_test(test_lowest_cost),
      cmocka_unit_test(test_ties_random), cmocka_unit_test(test_temperature),
      cmocka_unit_test(test_config_check), cmocka_unit_test(test_approx),
      cmocka_unit_test(test_approx_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
