/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_advisor_groups.c: the advisor keeps a hybrid model's KV cache
 * groups apart (advisor.c "Groups"). One sequence hash stored in a volume
 * for two groups is two blocks: the group that stays in G1 is never
 * hinted while the other, cold, is demoted, and the hint names its group;
 * a GPU removal of one group leaves the other's residency alone; a
 * group_idx out of range (KV event field, storage extra_metadata) is
 * refused and counted, nothing indexed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/advisor.h"
#include "kvbm/router.h"

/* {"group_idx": g} as msgpack (g a positive fixint, or -1 / 99). */
static size_t meta(uint8_t *buf, int g) {
  size_t n = 0;
  buf[n++] = 0x81;
  buf[n++] = 0xa9;
  memcpy(buf + n, "group_idx", 9);
  n += 9;
  buf[n++] = (uint8_t)(g < 0 ? 0xff : g); /* 0xff: negative fixint -1 */
  return n;
}

static void store(kvbm_advisor *a, uint64_t h, int group, bool remove, uint64_t id,
                  uint64_t now) {
  uint8_t m[16];
  kvbm_storage_event e = {.type = remove ? KVBM_STORAGE_REMOVE : KVBM_STORAGE_STORE,
                          .event_id = id, .sequence_hash = h, .prefix_hash = 50,
                          .block_size = 4096, .location = "host", .location_len = 4,
                          .tier = KVBM_TIER_G2};
  if (group) e.extra_metadata = m, e.extra_metadata_len = meta(m, group);
  kvbm_storage_batch b = {.source = "m", .source_len = 1, .events = &e, .num_events = 1};
  assert_int_equal(kvbm_advisor_storage(a, &b, now), KVBM_OK);
}

static void gpu(kvbm_advisor *a, kvbm_event_type type, uint64_t h, int64_t group, uint64_t now) {
  kvbm_event e = {.type = type, .block_hashes = &h, .num_block_hashes = 1,
                  .medium = KVBM_MEDIUM_GPU, .group_idx = group, .has_group_idx = group != 0};
  kvbm_event_batch b = {.events = &e, .num_events = 1};
  assert_int_equal(kvbm_advisor_kv(a, &b, now), KVBM_OK);
}

static void test_groups_apart(void **state) {
  (void)state;
  kvbm_advisor_config c = kvbm_advisor_config_default();
  c.demote_fraction = 0.7;
  kvbm_advisor *a;
  assert_int_equal(kvbm_advisor_create(&c, &a, NULL), KVBM_OK);
  assert_int_equal(kvbm_advisor_volume_tier(a, "disk", KVBM_TIER_G3, NULL), KVBM_OK);
  uint64_t id = 1;
  /* host learns an eviction age of 10 s (group 0 blocks) */
  for (uint64_t x = 1000; x < 1010; x++) {
    store(a, x, 0, false, id++, 0);
    gpu(a, KVBM_EVENT_STORED, x, 0, 0);
    gpu(a, KVBM_EVENT_REMOVED, x, 0, 0);
  }
  for (uint64_t x = 1000; x < 1010; x++) store(a, x, 0, true, id++, 10000);
  /* X in host for groups 0 and 1; group 0 used twice and out of G1,
   * group 1 used twice and still in G1 */
  uint64_t X = 7;
  store(a, X, 0, false, id++, 10500);
  store(a, X, 1, false, id++, 10500);
  kvbm_advisor_stats st;
  kvbm_advisor_stats_get(a, &st);
  assert_int_equal(st.entries, 12); /* ten, and X twice */
  gpu(a, KVBM_EVENT_STORED, X, 1, 10500);
  gpu(a, KVBM_EVENT_STORED, X, 0, 10500);
  gpu(a, KVBM_EVENT_REMOVED, X, 0, 10600);
  gpu(a, KVBM_EVENT_STORED, X, 1, 10700);
  gpu(a, KVBM_EVENT_STORED, X, 0, 10700);
  gpu(a, KVBM_EVENT_REMOVED, X, 0, 11000); /* group 1 stays in G1 */
  kvbm_hint h[64];
  size_t n;
  assert_int_equal(kvbm_advisor_hints(a, 15000, h, 64, &n), KVBM_OK);
  size_t seen = 0;
  for (size_t i = 0; i < n; i++) {
    if (h[i].sequence_hash != X) continue;
    seen++;
    assert_int_equal(h[i].kind, KVBM_HINT_DEMOTE);
    assert_int_equal(h[i].group, 0);
    assert_int_equal(h[i].uses, 2);
    assert_int_equal(h[i].idle_ms, 4000);
  }
  assert_int_equal(seen, 1); /* group 1's X, in G1, is not hinted */
  /* group 1's X leaves G1 and is removed from host: group 0's stays */
  gpu(a, KVBM_EVENT_REMOVED, X, 1, 15000);
  store(a, X, 1, true, id++, 15000);
  kvbm_advisor_stats_get(a, &st);
  assert_int_equal(st.unknown_removes, 0);
  kvbm_advisor_volume_info v;
  for (size_t i = 0; i < kvbm_advisor_volume_count(a); i++) {
    kvbm_advisor_volume_get(a, i, &v);
    if (!strcmp(v.name, "host")) assert_int_equal(v.live_blocks, 1);
  }
  /* hostile groups: refused, counted, nothing indexed */
  uint64_t before = st.entries;
  gpu(a, KVBM_EVENT_STORED, 99, -1, 16000);
  gpu(a, KVBM_EVENT_STORED, 99, 16, 16000);
  gpu(a, KVBM_EVENT_STORED, 99, INT64_MAX, 16000);
  store(a, 99, -1, false, id++, 16000);
  store(a, 99, 99, false, id++, 16000);
  kvbm_advisor_stats_get(a, &st);
  assert_int_equal(st.bad_groups, 5);
  assert_int_equal(st.entries, before);
  kvbm_advisor_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_groups_apart)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
