/* SPDX-License-Identifier: Apache-2.0 */
/* Storage hints applied by the manager (kvbm_manager_hint): a promotion
 * brings blocks that left G2 back from G3 (the next prefill finds them in
 * G2, bytes intact, none from G3); a demotion moves a G2 block into G3 and
 * out of G2; a drop takes a cached block out; nonsense pairs are refused;
 * every outcome is counted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tier_testutil.h"

static void test_promote(void **st) {
  (void)st;
  char *dir = tu_tmpdir("hints");
  kvbm_manager_config c = tu_config(dir, 8, 8, 64);
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq *r;
  tu_run(m, a, 17, NULL, &r);
  uint64_t ha[4];
  for (int k = 0; k < 4; k++) kvbm_mreq_block_hash(r, (size_t)k, &ha[k]);
  kvbm_mreq_destroy(r);
  tu_run(m, b, 29, NULL, NULL); /* B's 7 blocks push 3 of A's out of G2 (all stay in G3) */
  int ok = 0, exist = 0;
  for (int k = 0; k < 4; k++) {
    int rc = kvbm_manager_hint(m, KVBM_MANAGER_HINT_PROMOTE, ha[k], KVBM_TIER_G3, KVBM_TIER_G2);
    ok += rc == KVBM_OK;
    exist += rc == KVBM_EEXIST;
  }
  /* 3 had left G2; the one still there may be the G2 block a promotion
   * evicts for room (the oldest), and then it is promoted too. */
  assert_true(ok >= 3);
  assert_int_equal(ok + exist, 4);
  kvbm_manager_flush(m);
  kvbm_manager_hint_stats hs;
  kvbm_manager_hint_stats_get(m, &hs);
  assert_int_equal(hs.received, 4);
  assert_int_equal(hs.queued, (uint64_t)ok);
  assert_int_equal(hs.promoted, (uint64_t)ok);
  assert_int_equal(hs.already, (uint64_t)exist);
  assert_int_equal(hs.failed, 0);
  /* A again: every block from G1 or G2 (without the hints, 3 from G3),
   * and the bytes that came up through the promotion are A's. */
  kvbm_mreq_info info;
  size_t opt;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 17, &r, &opt, NULL), KVBM_OK);
  assert_int_equal(kvbm_mreq_wait(r, -1, &info), KVBM_OK);
  assert_int_equal(info.matched_tokens, 16);
  for (size_t k = 0; k < 4; k++) {
    int src = kvbm_mreq_block_source(r, k);
    assert_true(src == KVBM_TIER_G1 || src == KVBM_TIER_G2);
  }
  assert_int_equal(tu_verify(m, r, 4), 4);
  kvbm_mreq_destroy(r);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  tu_rmdir(dir);
}

static void test_demote_drop(void **st) {
  (void)st;
  char *dir = tu_tmpdir("hints");
  kvbm_manager_config c = tu_config(dir, 8, 8, 64);
  c.g3_policy = KVBM_OFFLOAD_FREQUENCY; /* one use: G2 only */
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17);
  kvbm_mreq *r;
  tu_run(m, a, 17, NULL, &r);
  uint64_t ha[4];
  for (int k = 0; k < 4; k++) kvbm_mreq_block_hash(r, (size_t)k, &ha[k]);
  kvbm_mreq_destroy(r);
  kvbm_tier_stats g3;
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &g3);
  assert_int_equal(g3.offloaded_blocks, 0);
  /* In G2 already: nothing to promote. */
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_PROMOTE, ha[0], KVBM_TIER_G3, KVBM_TIER_G2),
                   KVBM_EEXIST);
  /* Demote block 0: into G3, out of G2. */
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_DEMOTE, ha[0], KVBM_TIER_G2, KVBM_TIER_G3),
                   KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &g3);
  assert_int_equal(g3.offloaded_blocks, 1);
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_DEMOTE, ha[0], KVBM_TIER_G2, KVBM_TIER_G3),
                   KVBM_ENOTFOUND); /* it left G2 */
  /* It is in G3 and not in G2: a promotion brings it back. */
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_PROMOTE, ha[0], KVBM_TIER_G3, KVBM_TIER_G2),
                   KVBM_OK);
  kvbm_manager_flush(m);
  /* Drop block 1 from G2; then it is gone. */
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_DROP, ha[1], KVBM_TIER_G2, KVBM_TIER_G2), KVBM_OK);
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_DROP, ha[1], KVBM_TIER_G2, KVBM_TIER_G2),
                   KVBM_ENOTFOUND);
  /* A demotion to a tier already holding the block only drops it from G2. */
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_DEMOTE, ha[0], KVBM_TIER_G2, KVBM_TIER_G3),
                   KVBM_OK);
  /* Nonsense: refused, counted. */
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_PROMOTE, ha[2], KVBM_TIER_G2, KVBM_TIER_G3),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_DEMOTE, ha[2], KVBM_TIER_G2, KVBM_TIER_G1),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_DROP, ha[2], KVBM_TIER_G1, KVBM_TIER_G1),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_manager_hint(m, KVBM_MANAGER_HINT_DEMOTE, ha[2], KVBM_TIER_G2, (kvbm_tier)9),
                   KVBM_ETIER);
  assert_int_equal(kvbm_manager_hint(m, (kvbm_manager_hint_kind)7, ha[2], KVBM_TIER_G2, KVBM_TIER_G3),
                   KVBM_EINVAL);
  kvbm_manager_hint_stats hs;
  kvbm_manager_hint_stats_get(m, &hs);
  assert_int_equal(hs.demoted, 1);
  assert_int_equal(hs.promoted, 1);
  assert_int_equal(hs.dropped, 2);
  assert_int_equal(hs.missing, 2);
  assert_int_equal(hs.already, 1);
  assert_int_equal(hs.refused, 5);
  assert_int_equal(hs.failed, 0);
  assert_string_equal(kvbm_manager_volume_id(m, KVBM_TIER_G2), "g2");
  assert_non_null(kvbm_manager_volume_id(m, KVBM_TIER_G3));
  assert_null(kvbm_manager_volume_id(m, KVBM_TIER_G1));
  assert_null(kvbm_manager_volume_id(m, KVBM_TIER_G4)); /* not configured */
  kvbm_manager_destroy(m);
  free(a);
  tu_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_promote),
                                     cmocka_unit_test(test_demote_drop)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
