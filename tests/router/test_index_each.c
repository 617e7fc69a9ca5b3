/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_index_each.c: kvbm_index_worker_each, the listing behind the router's
 * GET /index (the W5 cluster run compares it with each worker's /blocks).
 *
 * It must list exactly the blocks held, per tier, under the engine's hash:
 * a block in two tiers once with both bits, a ghost (a removed block that
 * still has children, kept for the closure counts) never, a block of KV
 * cache group g under its engine hash (the index keeps it under a mixed
 * key), and nothing for a free slot. A callback's nonzero return stops
 * the walk and comes back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "kvbm/router.h"
#include "kvbm/tier.h"

typedef struct seen {
  uint64_t hash[16];
  unsigned tiers[16];
  uint32_t group[16];
  size_t n, stop_after;
} seen;

static int collect(void *user, uint64_t hash, unsigned tiers, uint32_t group) {
  seen *s = user;
  if (s->n >= 16) return -1000;
  s->hash[s->n] = hash;
  s->tiers[s->n] = tiers;
  s->group[s->n] = group;
  s->n++;
  return s->stop_after && s->n == s->stop_after ? 42 : 0;
}

/* The tiers and group of `hash` in s (tiers 0: not listed). */
static unsigned tiers_of(const seen *s, uint64_t hash, uint32_t *group) {
  unsigned t = 0;
  for (size_t i = 0; i < s->n; i++)
    if (s->hash[i] == hash) {
      assert_int_equal(t, 0); /* listed once */
      t = s->tiers[i];
      if (group) *group = s->group[i];
    }
  return t;
}

static void test_lists_what_is_held(void **state) {
  (void)state;
  kvbm_index_config cfg = kvbm_index_config_default();
  kvbm_index *idx = NULL;
  assert_int_equal(kvbm_index_create(&cfg, &idx, NULL), KVBM_OK);
  uint32_t slot = 0;
  assert_int_equal(kvbm_index_add_worker(idx, (kvbm_worker_key){.worker_id = 7}, &slot, NULL),
                   KVBM_OK);
  seen s = {0};
  assert_int_equal(kvbm_index_worker_each(idx, slot, collect, &s), KVBM_OK);
  assert_int_equal(s.n, 0); /* nothing yet */

  const uint64_t chain[3] = {1, 2, UINT64_MAX}, host[2] = {1, 2}, grouped[2] = {5, 6};
  assert_int_equal(kvbm_index_store(idx, slot, KVBM_TIER_G1, chain, 3), KVBM_OK);
  assert_int_equal(kvbm_index_store(idx, slot, KVBM_TIER_G2, host, 2), KVBM_OK);
  assert_int_equal(kvbm_index_store_group(idx, slot, KVBM_TIER_G3, 1, grouped, 2), KVBM_OK);
  /* block 2 leaves both tiers while its child is held: a ghost */
  assert_int_equal(kvbm_index_remove(idx, slot, KVBM_TIER_G1, &chain[1], 1), KVBM_OK);
  assert_int_equal(kvbm_index_remove(idx, slot, KVBM_TIER_G2, &chain[1], 1), KVBM_OK);

  assert_int_equal(kvbm_index_worker_each(idx, slot, collect, &s), KVBM_OK);
  assert_int_equal(s.n, 4);
  uint32_t g = 99;
  assert_int_equal(tiers_of(&s, 1, &g), 1u << KVBM_TIER_G1 | 1u << KVBM_TIER_G2);
  assert_int_equal(g, 0);
  assert_int_equal(tiers_of(&s, 2, NULL), 0); /* the ghost is not a block */
  assert_int_equal(tiers_of(&s, UINT64_MAX, NULL), 1u << KVBM_TIER_G1);
  assert_int_equal(tiers_of(&s, 5, &g), 1u << KVBM_TIER_G3);
  assert_int_equal(g, 1); /* under its engine hash, not the group's key */
  assert_int_equal(tiers_of(&s, 6, &g), 1u << KVBM_TIER_G3);

  /* a callback's nonzero return stops the walk */
  seen stop = {.stop_after = 2};
  assert_int_equal(kvbm_index_worker_each(idx, slot, collect, &stop), 42);
  assert_int_equal(stop.n, 2);

  /* a free slot, a slot out of range, no callback */
  assert_int_equal(kvbm_index_remove_worker(idx, (kvbm_worker_key){.worker_id = 7}), KVBM_OK);
  assert_int_equal(kvbm_index_worker_each(idx, slot, collect, &s), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_index_worker_each(idx, KVBM_ROUTER_MAX_WORKERS, collect, &s),
                   KVBM_ENOTFOUND);
  assert_int_equal(kvbm_index_worker_each(idx, 0, NULL, &s), KVBM_ENOTFOUND);
  kvbm_index_destroy(idx);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_lists_what_is_held)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
