/* SPDX-License-Identifier: Apache-2.0 */
/* test_pool_link.c: a block pool's events reach a publisher in the pool's
 * order with the pool's content (hash, parent, tokens, block size, the
 * link's medium), and refusals are counted on the link. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvbm/events.h"

typedef struct rec {
  kvbm_event_type type[16];
  uint64_t hash[16], parent[16], id[16];
  bool has_parent[16];
  uint32_t tok0[16], ntok[16], bs[16];
  kvbm_medium medium[16];
  size_t n;
} rec;

static void on_batch(void *user, const kvbm_event_batch *b) {
  rec *r = user;
  for (size_t i = 0; i < b->num_events && r->n < 16; i++) {
    const kvbm_event *e = &b->events[i];
    size_t k = r->n++;
    r->type[k] = e->type;
    r->id[k] = e->event_id;
    r->hash[k] = e->num_block_hashes ? e->block_hashes[0] : 0;
    r->has_parent[k] = e->has_parent;
    r->parent[k] = e->parent_hash;
    r->ntok[k] = (uint32_t)e->num_tokens;
    r->tok0[k] = e->num_tokens ? e->token_ids[0] : 0;
    r->bs[k] = e->block_size;
    r->medium[k] = e->medium;
  }
}

static void test_pool_events_in_order(void **st) {
  (void)st;
  rec r = {0};
  kvbm_publisher *p;
  assert_int_equal(kvbm_publisher_create(NULL, &p, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(p, on_batch, &r, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, NULL), KVBM_OK);
  kvbm_pool_config cfg = kvbm_pool_config_default(2, 2);
  kvbm_pool *pool;
  kvbm_error err;
  if (kvbm_pool_create(&cfg, &pool, &err)) fail_msg("%s", err.msg);
  kvbm_pool_link link;
  assert_int_equal(kvbm_pool_link_attach(&link, pool, p, KVBM_MEDIUM_CPU, &err), KVBM_OK);
  uint32_t ids[2], out;
  assert_int_equal(kvbm_pool_alloc(pool, 2, ids), KVBM_OK);
  const uint32_t t1[2] = {1, 2}, t2[2] = {3, 4}, t3[2] = {5, 6};
  assert_int_equal(kvbm_block_fill(pool, ids[0], 0, 0, false, t1, 100, &out), KVBM_OK);
  assert_int_equal(kvbm_block_fill(pool, ids[1], 0, 100, true, t2, 200, &out), KVBM_OK);
  assert_int_equal(kvbm_block_release(pool, ids[1], 0), KVBM_OK); /* tail first */
  assert_int_equal(kvbm_block_release(pool, ids[0], 0), KVBM_OK);
  uint32_t again;
  assert_int_equal(kvbm_pool_alloc(pool, 1, &again), KVBM_OK);    /* evicts 200 */
  assert_int_equal(kvbm_block_fill(pool, again, 0, 100, true, t3, 300, &out), KVBM_OK);
  assert_int_equal(kvbm_block_release(pool, again, 0), KVBM_OK);
  assert_int_equal(kvbm_pool_clear_cache(pool), KVBM_OK);
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK);
  assert_int_equal(link.forwarded, 5);
  assert_int_equal(link.failed, 0);
  assert_int_equal(r.n, 5);
  const kvbm_event_type want[5] = {KVBM_EVENT_STORED, KVBM_EVENT_STORED, KVBM_EVENT_REMOVED,
                                   KVBM_EVENT_STORED, KVBM_EVENT_CLEARED};
  const uint64_t wh[5] = {100, 200, 200, 300, 0};
  for (size_t i = 0; i < 5; i++) {
    assert_int_equal(r.type[i], want[i]);
    assert_int_equal(r.id[i], i + 1);
    if (want[i] != KVBM_EVENT_CLEARED) {
      assert_true(r.hash[i] == wh[i]);
      assert_int_equal(r.medium[i], KVBM_MEDIUM_CPU);
    }
  }
  assert_false(r.has_parent[0]);
  assert_true(r.has_parent[1] && r.parent[1] == 100);
  assert_int_equal(r.ntok[0], 2);
  assert_int_equal(r.tok0[0], 1);
  assert_int_equal(r.tok0[1], 3);
  assert_int_equal(r.tok0[3], 5);
  assert_int_equal(r.bs[3], 2);
  kvbm_pool_destroy(pool);
  kvbm_publisher_destroy(p);
}

static void test_refusals_counted(void **st) {
  (void)st;
  kvbm_publisher *p;
  assert_int_equal(kvbm_publisher_create(NULL, &p, NULL), KVBM_OK); /* never started */
  kvbm_pool_config cfg = kvbm_pool_config_default(1, 1);
  kvbm_pool *pool;
  assert_int_equal(kvbm_pool_create(&cfg, &pool, NULL), KVBM_OK);
  kvbm_pool_link link;
  kvbm_error err;
  assert_int_equal(kvbm_pool_link_attach(&link, pool, p, KVBM_MEDIUM_OTHER, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_link_attach(&link, NULL, p, KVBM_MEDIUM_GPU, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_link_attach(&link, pool, p, KVBM_MEDIUM_GPU, &err), KVBM_OK);
  uint32_t id, out;
  const uint32_t t = 9;
  assert_int_equal(kvbm_pool_alloc(pool, 1, &id), KVBM_OK);
  assert_int_equal(kvbm_block_fill(pool, id, 0, 0, false, &t, 7, &out), KVBM_OK);
  assert_int_equal(link.failed, 1);
  assert_int_equal(link.last_status, KVBM_ESTATE);
  assert_int_equal(link.forwarded, 0);
  kvbm_pool_destroy(pool);
  kvbm_publisher_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_events_in_order),
      cmocka_unit_test(test_refusals_counted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
