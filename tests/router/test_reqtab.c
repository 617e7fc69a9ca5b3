/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_reqtab.c: the router daemon's table of active requests
 * (src/router/reqtab.c): at most max records, the oldest goes first
 * (counted when live), done records squeezed out before a live one goes,
 * expiry by time, /done's lookup; and the cost of an add, counted in
 * records copied (`moved`), bounded by a constant per add whether the
 * table is empty or full. Before issue 24's fix a full table moved every
 * record on each add (the /route cliff); that count makes it visible
 * without timing anything.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "router/reqtab.h"

typedef struct drops {
  uint64_t n;
  double blocks;
  uint64_t last_id;
} drops;

static void on_drop(void *user, const kvbm__req_rec *r) {
  drops *d = user;
  assert_true(r->live); /* called once, while the record is still live */
  d->n++;
  d->blocks += r->blocks;
  d->last_id = r->id;
}

static kvbm__req_rec rec(uint64_t id, int64_t expires) {
  return (kvbm__req_rec){.id = id, .expires_ns = expires, .slot = (uint32_t)(id % 8),
                         .key = {.worker_id = id % 8 + 1}, .blocks = 2};
}

static void add(kvbm__reqtab *t, uint64_t id) {
  kvbm__req_rec r = rec(id, INT64_MAX);
  assert_int_equal(kvbm__reqtab_add(t, &r), KVBM_OK);
}

static void test_init(void **state) {
  (void)state;
  kvbm__reqtab t;
  kvbm_error err = {0};
  assert_int_equal(kvbm__reqtab_init(&t, 0, NULL, NULL, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "max 0"));
  assert_int_equal(kvbm__reqtab_init(&t, SIZE_MAX, NULL, NULL, &err), KVBM_EINVAL);
  assert_int_equal(kvbm__reqtab_init(&t, 1000, NULL, NULL, &err), KVBM_OK);
  assert_int_equal(t.cap_max, 1024);
  assert_int_equal(kvbm__reqtab_held(&t), 0);
  assert_null(kvbm__reqtab_find(&t, 1));
  assert_false(kvbm__reqtab_done(&t, 1));
  kvbm__reqtab_expire(&t, INT64_MAX);
  kvbm__reqtab_free(&t);
}

/* The finding itself: with the table full of live records, every add
 * evicts the oldest and must cost O(1), not O(max). Checked at a cap of
 * 4096 and 4 x that; before the fix each add moved max - 1 records. */
static void full_table_costs_like_empty(size_t max) {
  kvbm__reqtab t;
  drops d = {0};
  assert_int_equal(kvbm__reqtab_init(&t, max, on_drop, &d, NULL), KVBM_OK);
  uint64_t id = 0;
  for (size_t i = 0; i < max; i++) add(&t, ++id);
  assert_int_equal(kvbm__reqtab_held(&t), max);
  assert_int_equal(t.live, max);
  assert_int_equal(t.evicted, 0);
  /* growing from empty copies each record once per doubling: < 2 x cap */
  assert_true(t.moved < 2 * t.cap_max);
  size_t adds = 4 * max;
  uint64_t moved0 = t.moved;
  for (size_t i = 0; i < adds; i++) {
    add(&t, ++id);
    /* the oldest went, and only it */
    assert_int_equal(d.last_id, id - max);
    assert_int_equal(kvbm__reqtab_held(&t), max);
  }
  uint64_t moved = t.moved - moved0;
  /* a constant per add (the ring moves none); the old array moved max - 1 */
  assert_true(moved <= 2 * adds);
  assert_int_equal(t.evicted, adds);
  assert_int_equal(d.n, adds);
  assert_true(d.blocks == 2.0 * (double)adds);
  assert_int_equal(t.live, max);
  /* memory stays at the next power of two above max */
  assert_true(t.cap <= t.cap_max && t.cap_max < 2 * max);
  /* oldest first: exactly the newest max are still found */
  for (uint64_t i = 1; i <= id; i++) {
    const kvbm__req_rec *r = kvbm__reqtab_find(&t, i);
    if (i <= id - max) {
      assert_null(r);
    } else {
      assert_non_null(r);
      assert_int_equal(r->id, i);
      assert_int_equal(r->key.worker_id, i % 8 + 1);
    }
  }
  kvbm__reqtab_free(&t);
}

static void test_full_default_scale(void **state) {
  (void)state;
  full_table_costs_like_empty(4096);
  full_table_costs_like_empty(4 * 4096);
  full_table_costs_like_empty(1000); /* not a power of two */
}

/* /done: found by id across the ring's wrap, once; unknown and evicted ids
 * are not. */
static void test_done_lookup(void **state) {
  (void)state;
  kvbm__reqtab t;
  drops d = {0};
  const size_t max = 100;
  assert_int_equal(kvbm__reqtab_init(&t, max, on_drop, &d, NULL), KVBM_OK);
  uint64_t id = 0;
  for (size_t i = 0; i < 3 * max + 37; i++) add(&t, ++id); /* wraps the ring */
  uint64_t oldest = id - max + 1;
  assert_false(kvbm__reqtab_done(&t, oldest - 1)); /* evicted */
  assert_false(kvbm__reqtab_done(&t, id + 1));     /* never added */
  assert_false(kvbm__reqtab_done(&t, 0));
  uint64_t n0 = d.n;
  for (uint64_t i = oldest; i <= id; i += 3) {
    assert_true(kvbm__reqtab_done(&t, i));
    assert_int_equal(d.last_id, i);
    assert_false(kvbm__reqtab_done(&t, i)); /* only once */
    assert_null(kvbm__reqtab_find(&t, i));
  }
  for (uint64_t i = oldest; i <= id; i++)
    assert_true((kvbm__reqtab_find(&t, i) != NULL) == ((i - oldest) % 3 != 0));
  assert_int_equal(d.n - n0, (max + 2) / 3);
  /* the oldest was done: the head passed over it, nothing was evicted */
  assert_int_equal(kvbm__reqtab_held(&t), max - 1);
  uint64_t ev = t.evicted;
  add(&t, ++id);
  assert_int_equal(t.evicted, ev);
  kvbm__reqtab_free(&t);
}

/* A full table with at least half of it done squeezes the done records out
 * instead of evicting a live one: a long request among many short ones
 * that say done keeps its record (and load). Squeezes are amortised. */
static void test_squeeze_keeps_long_request(void **state) {
  (void)state;
  kvbm__reqtab t;
  drops d = {0};
  const size_t max = 1000;
  assert_int_equal(kvbm__reqtab_init(&t, max, on_drop, &d, NULL), KVBM_OK);
  uint64_t id = 0;
  add(&t, ++id); /* the long one, at the head throughout */
  uint64_t adds = 1;
  for (size_t i = 0; i < 20 * max; i++) {
    add(&t, ++id);
    adds++;
    /* short ones: of each 4, two done at once, one next, one 64 later */
    if (i % 2) assert_true(kvbm__reqtab_done(&t, id - 1));
    if (i % 4 == 3) assert_true(kvbm__reqtab_done(&t, id));
    if (i % 4 == 1 && i > 64) assert_true(kvbm__reqtab_done(&t, id - 64));
    assert_true(kvbm__reqtab_held(&t) <= max);
  }
  assert_int_equal(t.evicted, 0);
  assert_non_null(kvbm__reqtab_find(&t, 1));
  assert_true(t.moved <= 2 * t.cap_max + adds);
  kvbm__reqtab_free(&t);
}

/* Live at more than half: the oldest live record goes, counted. */
static void test_evict_counts_live_only(void **state) {
  (void)state;
  kvbm__reqtab t;
  drops d = {0};
  const size_t max = 10;
  assert_int_equal(kvbm__reqtab_init(&t, max, on_drop, &d, NULL), KVBM_OK);
  for (uint64_t i = 1; i <= 10; i++) add(&t, i);
  assert_true(kvbm__reqtab_done(&t, 2)); /* done behind a live head */
  assert_true(kvbm__reqtab_done(&t, 3));
  add(&t, 11); /* 1 (live) goes, then 2 and 3 (done) are passed over */
  assert_int_equal(t.evicted, 1);
  assert_null(kvbm__reqtab_find(&t, 1));
  assert_int_equal(kvbm__reqtab_held(&t), 8);
  add(&t, 12);
  add(&t, 13);
  assert_int_equal(t.evicted, 1); /* room was left by the done ones */
  add(&t, 14);
  assert_int_equal(t.evicted, 2);
  assert_null(kvbm__reqtab_find(&t, 4));
  assert_non_null(kvbm__reqtab_find(&t, 5));
  assert_int_equal(t.live, 10);
  kvbm__reqtab_free(&t);
}

/* Expiry by time from the head; done records are not counted expired. */
static void test_expire(void **state) {
  (void)state;
  kvbm__reqtab t;
  drops d = {0};
  assert_int_equal(kvbm__reqtab_init(&t, 1 << 12, on_drop, &d, NULL), KVBM_OK);
  for (uint64_t i = 1; i <= 3000; i++) {
    kvbm__req_rec r = rec(i, (int64_t)i * 100);
    assert_int_equal(kvbm__reqtab_add(&t, &r), KVBM_OK);
  }
  assert_true(kvbm__reqtab_done(&t, 5));
  kvbm__reqtab_expire(&t, 999); /* 1..9 expire, 5 was done */
  assert_int_equal(t.expired, 8);
  assert_int_equal(d.n, 9); /* 5 by /done, 8 by time */
  assert_null(kvbm__reqtab_find(&t, 9));
  assert_non_null(kvbm__reqtab_find(&t, 10));
  kvbm__reqtab_expire(&t, 1000); /* at the instant: 10 goes */
  assert_int_equal(t.expired, 9);
  assert_int_equal(kvbm__reqtab_held(&t), 2990);
  kvbm__reqtab_expire(&t, INT64_MAX);
  assert_int_equal(t.expired, 2999);
  assert_int_equal(t.live, 0);
  assert_int_equal(kvbm__reqtab_held(&t), 0);
  assert_true(d.blocks == 2.0 * 3000);
  /* still usable, and a new add goes after the old positions */
  add(&t, 3001);
  assert_non_null(kvbm__reqtab_find(&t, 3001));
  kvbm__reqtab_free(&t);
}

/* Random adds, /dones and expiries against a plain model of what must hold:
 * at most max held, live counts agree, every id the model has live and
 * among the newest max is found, an id done is never found, and the copies
 * stay within a constant per add. */
static uint64_t xs(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void test_random(void **state) {
  (void)state;
  const size_t max = 777, n = 200000;
  kvbm__reqtab t;
  drops d = {0};
  assert_int_equal(kvbm__reqtab_init(&t, max, on_drop, &d, NULL), KVBM_OK);
  uint8_t *gone = calloc(n + 2, 1); /* 1: done by /done */
  assert_non_null(gone);
  uint64_t s = 42, id = 0, adds = 0;
  for (size_t step = 0; step < n; step++) {
    uint64_t x = xs(&s) % 100;
    if (x < 55 && id < n) {
      add(&t, ++id);
      adds++;
    } else if (x < 95 && id) {
      uint64_t back = xs(&s) % (2 * max);
      uint64_t v = id > back ? id - back : 1;
      bool was = kvbm__reqtab_find(&t, v) != NULL;
      assert_int_equal(kvbm__reqtab_done(&t, v), was);
      if (was) gone[v] = 1;
    } else {
      kvbm__reqtab_expire(&t, -1); /* nothing expires: only done heads go */
    }
    assert_true(kvbm__reqtab_held(&t) <= max);
  }
  size_t live = 0;
  for (uint64_t v = 1; v <= id; v++) {
    const kvbm__req_rec *r = kvbm__reqtab_find(&t, v);
    if (gone[v]) assert_null(r);
    if (r) live++;
    if (v + t.live > id && !gone[v]) /* among the newest records: kept */
      assert_non_null(r);
  }
  assert_int_equal(live, t.live);
  assert_int_equal(t.expired, 0);
  assert_true(t.moved <= 2 * t.cap_max + adds);
  free(gone);
  kvbm__reqtab_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_init),
      cmocka_unit_test(test_full_default_scale),
      cmocka_unit_test(test_done_lookup),
      cmocka_unit_test(test_squeeze_keeps_long_request),
      cmocka_unit_test(test_evict_counts_live_only),
      cmocka_unit_test(test_expire),
      cmocka_unit_test(test_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
