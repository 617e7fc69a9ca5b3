/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pool_groups.c: a pool shared by several KV cache groups (kvbm/pool.h,
 * "Groups"): blocks are named by (sequence hash, group), lookups stay in
 * their group, eviction draws on the one budget whatever the group, and
 * every event carries the block's group.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kvbm/pool.h"

#define BS 4

typedef struct seen {
  kvbm_pool_event ev[64];
  size_t n;
} seen;

static void record(void *user, const kvbm_pool_event *ev) {
  seen *s = user;
  if (s->n < 64) s->ev[s->n++] = *ev;
}

static kvbm_pool *make(uint32_t blocks, uint32_t groups, seen *s) {
  kvbm_pool_config c = kvbm_pool_config_default(blocks, BS);
  c.num_groups = groups;
  c.keep_tokens = false;
  if (s) {
    c.listener = record;
    c.listener_user = s;
  }
  kvbm_pool *p;
  kvbm_error err = {0};
  assert_int_equal(kvbm_pool_create(&c, &p, &err), KVBM_OK);
  return p;
}

static const uint32_t TOK[BS] = {1, 2, 3, 4};

/* One full block of hash h registered in group g; returns the block
 * holding it (held once by the caller). */
static uint32_t put(kvbm_pool *p, uint32_t g, uint64_t h) {
  uint32_t id, got;
  assert_int_equal(kvbm_pool_alloc_group(p, g, 1, &id), KVBM_OK);
  assert_int_equal(kvbm_block_fill(p, id, 0, 0, false, TOK, h, &got), KVBM_OK);
  return got;
}

static void test_same_hash_two_groups_two_blocks(void **state) {
  (void)state;
  kvbm_pool *p = make(8, 2, NULL);
  assert_int_equal(kvbm_pool_num_groups(p), 2);
  uint32_t a = put(p, 0, 0x1234), b = put(p, 1, 0x1234);
  assert_int_not_equal(a, b);
  kvbm_pool_stats st;
  kvbm_pool_stats_get(p, &st);
  assert_int_equal(st.registered, 2);
  assert_int_equal(st.dedup, 0);
  kvbm_block_info ia, ib;
  assert_int_equal(kvbm_block_info_get(p, a, &ia), KVBM_OK);
  assert_int_equal(kvbm_block_info_get(p, b, &ib), KVBM_OK);
  assert_int_equal(ia.group, 0);
  assert_int_equal(ib.group, 1);
  /* within a group the hash still deduplicates */
  uint32_t c = put(p, 1, 0x1234);
  assert_int_equal(c, b);
  kvbm_pool_stats_get(p, &st);
  assert_int_equal(st.dedup, 1);
  assert_int_equal(st.registered, 2);
  kvbm_pool_destroy(p);
}

static void test_match_stays_in_group(void **state) {
  (void)state;
  kvbm_pool *p = make(8, 3, NULL);
  uint32_t b = put(p, 1, 0xabc);
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_OK);
  uint32_t id = 999;
  bool cached = false;
  assert_int_equal(kvbm_pool_match_group(p, 0, 0xabc, &id), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_pool_match_group(p, 2, 0xabc, &id), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_pool_match(p, 0xabc, &id), KVBM_ENOTFOUND); /* group 0 */
  assert_false(kvbm_pool_contains(p, 0xabc));
  assert_int_equal(kvbm_pool_peek_group(p, 0, 0xabc, &id, &cached), KVBM_ENOTFOUND);
  assert_int_equal(id, 999);
  assert_int_equal(kvbm_pool_peek_group(p, 1, 0xabc, &id, &cached), KVBM_OK);
  assert_int_equal(id, b);
  assert_true(cached);
  assert_int_equal(kvbm_pool_match_group(p, 1, 0xabc, &id), KVBM_OK);
  assert_int_equal(id, b);
  assert_int_equal(kvbm_pool_peek_group(p, 1, 0xabc, NULL, &cached), KVBM_OK);
  assert_false(cached);
  /* a group past the list is refused, nothing changes */
  kvbm_pool_stats before, after;
  kvbm_pool_stats_get(p, &before);
  uint32_t ids[2];
  assert_int_equal(kvbm_pool_match_group(p, 3, 0xabc, &id), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_peek_group(p, 3, 0xabc, &id, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_alloc_group(p, 3, 1, ids), KVBM_EINVAL);
  uint64_t h = 5;
  assert_int_equal(kvbm_pool_fill_run_group(p, 16, 0, 0, false, TOK, &h, 1, NULL, ids), KVBM_EINVAL);
  kvbm_pool_stats_get(p, &after);
  assert_memory_equal(&before, &after, sizeof before);
  kvbm_pool_destroy(p);
}

static void test_eviction_shares_one_budget(void **state) {
  (void)state;
  seen s = {0};
  kvbm_pool *p = make(4, 2, &s);
  uint64_t h0[2] = {10, 11}, h1[2] = {20, 21};
  uint32_t a[2], b[2];
  assert_int_equal(kvbm_pool_fill_run_group(p, 0, 0, 0, false, (const uint32_t[]){1, 2, 3, 4, 5, 6, 7, 8},
                                            h0, 2, NULL, a), KVBM_OK);
  assert_int_equal(kvbm_pool_release_run(p, a, 2, 0), KVBM_OK); /* group 0 cached first */
  assert_int_equal(kvbm_pool_fill_run_group(p, 1, 0, 0, false, (const uint32_t[]){1, 2, 3, 4, 5, 6, 7, 8},
                                            h1, 2, NULL, b), KVBM_OK);
  assert_int_equal(kvbm_pool_release_run(p, b, 2, 0), KVBM_OK);
  assert_int_equal(kvbm_pool_available(p), 4);
  s.n = 0;
  /* group 1 needs two blocks: the free list is empty, so the two oldest
   * cached blocks go, and they are group 0's (tail first: 11, then 10) */
  uint32_t c[2];
  assert_int_equal(kvbm_pool_alloc_group(p, 1, 2, c), KVBM_OK);
  assert_int_equal(s.n, 2);
  assert_int_equal(s.ev[0].kind, KVBM_POOL_REMOVED);
  assert_int_equal(s.ev[0].seq_hash, 11);
  assert_int_equal(s.ev[0].group, 0);
  assert_int_equal(s.ev[1].seq_hash, 10);
  assert_int_equal(s.ev[1].group, 0);
  assert_int_equal(kvbm_pool_peek_group(p, 0, 10, NULL, NULL), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_pool_peek_group(p, 1, 20, NULL, NULL), KVBM_OK);
  /* and the budget is one: nothing is left for group 0 beyond the cache */
  uint32_t d[3];
  assert_int_equal(kvbm_pool_alloc_group(p, 0, 3, d), KVBM_ENOSPC);
  assert_int_equal(kvbm_pool_alloc_group(p, 0, 2, d), KVBM_OK);
  assert_int_equal(s.ev[2].group, 1);
  assert_int_equal(s.ev[3].group, 1);
  assert_int_equal(kvbm_pool_available(p), 0);
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, d[0], &bi), KVBM_OK);
  assert_int_equal(bi.group, 0);
  kvbm_pool_destroy(p);
}

static void test_events_carry_group(void **state) {
  (void)state;
  seen s = {0};
  kvbm_pool *p = make(8, 4, &s);
  uint32_t x = put(p, 3, 0x77), y = put(p, 0, 0x78), z = put(p, 2, 0x77);
  assert_int_equal(s.n, 3);
  assert_int_equal(s.ev[0].kind, KVBM_POOL_STORED);
  assert_int_equal(s.ev[0].group, 3);
  assert_int_equal(s.ev[1].group, 0);
  assert_int_equal(s.ev[2].group, 2);
  assert_int_equal(s.ev[2].seq_hash, 0x77);
  assert_int_equal(kvbm_block_release(p, x, 0), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, y, 0), KVBM_OK);
  /* an advisor's drop (group 0 by hash) and a cleared cache report groups */
  assert_int_equal(kvbm_pool_evict(p, 0x77), KVBM_ENOTFOUND); /* 0x77 is not in group 0 */
  assert_int_equal(kvbm_pool_evict(p, 0x78), KVBM_OK);
  assert_int_equal(s.ev[3].kind, KVBM_POOL_REMOVED);
  assert_int_equal(s.ev[3].group, 0);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK); /* z still held: REMOVED per block */
  assert_int_equal(s.ev[4].kind, KVBM_POOL_REMOVED);
  assert_int_equal(s.ev[4].seq_hash, 0x77);
  assert_int_equal(s.ev[4].group, 3);
  assert_int_equal(kvbm_pool_peek_group(p, 2, 0x77, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, z, 0), KVBM_OK);
  kvbm_pool_destroy(p);
}

static void test_one_group_is_group_zero(void **state) {
  (void)state;
  seen s = {0};
  kvbm_pool *p = make(4, 0, &s);
  assert_int_equal(kvbm_pool_num_groups(p), 1);
  uint32_t id;
  assert_int_equal(kvbm_pool_alloc_group(p, 1, 1, &id), KVBM_EINVAL);
  uint32_t b = put(p, 0, 0x5);
  assert_int_equal(s.ev[0].group, 0);
  assert_int_equal(kvbm_pool_match_group(p, 0, 0x5, &id), KVBM_OK);
  assert_int_equal(id, b);
  kvbm_pool_destroy(p);
}

static void test_too_many_groups(void **state) {
  (void)state;
  kvbm_pool_config c = kvbm_pool_config_default(4, BS);
  c.num_groups = KVBM_POOL_MAX_GROUPS + 1;
  kvbm_pool *p = NULL;
  kvbm_error err = {0};
  assert_int_equal(kvbm_pool_create(&c, &p, &err), KVBM_EINVAL);
  assert_null(p);
  assert_non_null(strstr(err.msg, "groups"));
  c.num_groups = KVBM_POOL_MAX_GROUPS;
  assert_int_equal(kvbm_pool_create(&c, &p, &err), KVBM_OK);
  assert_int_equal(kvbm_pool_num_groups(p), KVBM_POOL_MAX_GROUPS);
  put(p, KVBM_POOL_MAX_GROUPS - 1, 1);
  kvbm_pool_destroy(p);
}

/* kvbm_pool_fill_ids registers blocks allocated before (vLLM's order),
 * deduplicating in their own group; a repeated or unheld id is refused
 * with nothing changed. */
static void test_fill_ids(void **state) {
  (void)state;
  kvbm_pool *p = make(8, 2, NULL);
  uint32_t old = put(p, 1, 0x20);
  uint32_t ids[3];
  assert_int_equal(kvbm_pool_alloc_group(p, 1, 3, ids), KVBM_OK);
  const uint64_t h[3] = {0x10, 0x20, 0x30};
  const uint32_t tok[3 * BS] = {0};
  uint32_t dup[2] = {ids[0], ids[0]};
  kvbm_pool_stats before, after;
  kvbm_pool_stats_get(p, &before);
  assert_int_equal(kvbm_pool_fill_ids(p, dup, 2, 0, 0, false, tok, h, NULL), KVBM_ESTATE);
  uint32_t bad[2] = {ids[0], 99};
  assert_int_equal(kvbm_pool_fill_ids(p, bad, 2, 0, 0, false, tok, h, NULL), KVBM_EINVAL);
  uint32_t reg[1] = {old};
  assert_int_equal(kvbm_pool_fill_ids(p, reg, 1, 0, 0, false, tok, h, NULL), KVBM_ESTATE);
  kvbm_pool_stats_get(p, &after);
  assert_memory_equal(&before, &after, sizeof before);
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, ids[0], &bi), KVBM_OK);
  assert_int_equal(bi.state, KVBM_BLOCK_RESET); /* the marks were undone */
  uint32_t got[3] = {ids[0], ids[1], ids[2]};
  assert_int_equal(kvbm_pool_fill_ids(p, got, 3, 0, 0, false, tok, h, NULL), KVBM_OK);
  assert_int_equal(got[0], ids[0]);
  assert_int_equal(got[1], old); /* 0x20 was registered in group 1: shared */
  assert_int_equal(got[2], ids[2]);
  kvbm_pool_stats_get(p, &after);
  assert_int_equal(after.dedup, before.dedup + 1);
  assert_int_equal(kvbm_pool_peek_group(p, 1, 0x30, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_pool_peek_group(p, 0, 0x30, NULL, NULL), KVBM_ENOTFOUND);
  kvbm_pool_destroy(p);
}

/* kvbm_pool_fill_run_fresh stops before the first hash registered in its
 * group, without taking a block for it; another group's equal hash does
 * not stop it. */
static void test_fill_run_fresh(void **state) {
  (void)state;
  kvbm_pool *p = make(8, 2, NULL);
  put(p, 0, 0x3); /* group 0 has 0x3: no bearing on group 1 */
  uint32_t b = put(p, 1, 0x4);
  assert_int_equal(kvbm_pool_first_registered_group(p, 1, (const uint64_t[]){1, 2, 3, 4, 5}, 5), 3);
  assert_int_equal(kvbm_pool_first_registered_group(p, 0, (const uint64_t[]){1, 2, 3, 4, 5}, 5), 2);
  assert_int_equal(kvbm_pool_first_registered_group(p, 7, (const uint64_t[]){1, 2, 3, 4, 5}, 5), 5);
  const uint64_t h[5] = {1, 2, 3, 4, 5};
  const uint32_t tok[5 * BS] = {0};
  uint32_t ids[5];
  size_t done = 99;
  kvbm_pool_stats before, after;
  kvbm_pool_stats_get(p, &before);
  assert_int_equal(kvbm_pool_fill_run_fresh(p, 1, 0, 0, false, tok, h, 5, NULL, ids, &done), KVBM_OK);
  assert_int_equal(done, 3);
  kvbm_pool_stats_get(p, &after);
  assert_int_equal(after.allocated, before.allocated + 3);
  assert_int_equal(after.dedup, before.dedup);
  assert_int_equal(kvbm_pool_peek_group(p, 1, 3, NULL, NULL), KVBM_OK);
  uint32_t id;
  assert_int_equal(kvbm_pool_peek_group(p, 1, 4, &id, NULL), KVBM_OK);
  assert_int_equal(id, b);
  /* not enough blocks: no change */
  assert_int_equal(kvbm_pool_fill_run_fresh(p, 1, 0, 0, false, tok, h, 5, NULL, ids, &done), KVBM_ENOSPC);
  assert_int_equal(kvbm_pool_fill_run_fresh(p, 2, 0, 0, false, tok, h, 1, NULL, ids, &done), KVBM_EINVAL);
  kvbm_pool_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_hash_two_groups_two_blocks),
      cmocka_unit_test(test_match_stays_in_group),
      cmocka_unit_test(test_eviction_shares_one_budget),
      cmocka_unit_test(test_events_carry_group),
      cmocka_unit_test(test_one_group_is_group_zero),
      cmocka_unit_test(test_too_many_groups),
      cmocka_unit_test(test_fill_ids),
      cmocka_unit_test(test_fill_run_fresh),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
