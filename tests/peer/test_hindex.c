/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_hindex.c: the peers' bounded hash index (src/peer/hindex.h).
 *
 * Random adds and takes against a plain model (an array in age order):
 * counts, membership and which key a full index evicts agree after every
 * step, removals in any order included (the backward shift and the age
 * list relinked around moved entries). With the index full at the
 * default size of a peer's remote index (65536 keys, 131072 slots), an
 * add that evicts costs a handful of probes, counted, not timed: the
 * remote index it replaces scanned every slot on each add. Leases (issue
 * 23): put (value, moved to the newest end), get, drop, oldest and clear
 * against the same model, so the oldest key is the one with the smallest
 * value when values only grow.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "kvbm/status.h"
#include "peer/hindex.h"

static uint64_t rng(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

typedef struct model {
  uint64_t key[64];
  uint32_t cnt[64];
  uint32_t n; /* oldest first */
} model;

static int model_find(const model *m, uint64_t h) {
  for (uint32_t i = 0; i < m->n; i++)
    if (m->key[i] == h) return (int)i;
  return -1;
}

static void model_drop(model *m, uint32_t i) {
  for (uint32_t k = i + 1; k < m->n; k++) {
    m->key[k - 1] = m->key[k];
    m->cnt[k - 1] = m->cnt[k];
  }
  m->n--;
}

static void test_against_model(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 8; seed++) {
    const uint32_t limit = (uint32_t)(seed * 7); /* 7 .. 56 keys */
    kvbm__hindex x;
    assert_int_equal(kvbm__hindex_init(&x, limit, seed), KVBM_OK);
    model m = {.n = 0};
    uint64_t s = seed * 1000;
    for (int step = 0; step < 20000; step++) {
      /* few distinct keys, so that adds repeat and takes hit; some keys
       * share their low bits */
      uint64_t h = (rng(&s) % (limit * 3)) << (step % 3 == 0 ? 40 : 0);
      if (rng(&s) % 3) {
        uint32_t ev = 9;
        uint64_t evh = 0;
        kvbm__hindex_add(&x, h, &ev, &evh);
        int i = model_find(&m, h);
        if (i >= 0) {
          m.cnt[i]++;
          assert_int_equal(ev, 0);
        } else {
          if (m.n == limit) {
            assert_int_equal(ev, m.cnt[0]);
            assert_true(evh == m.key[0]);
            model_drop(&m, 0);
          } else {
            assert_int_equal(ev, 0);
          }
          m.key[m.n] = h;
          m.cnt[m.n++] = 1;
        }
      } else {
        int i = model_find(&m, h);
        assert_int_equal(kvbm__hindex_take(&x, h), i >= 0);
        if (i >= 0 && --m.cnt[i] == 0) model_drop(&m, (uint32_t)i);
      }
      assert_int_equal(x.live, m.n);
      if (step % 97 == 0)
        for (uint32_t k = 0; k < m.n; k++) assert_int_equal(kvbm__hindex_count(&x, m.key[k]), m.cnt[k]);
      assert_int_equal(kvbm__hindex_count(&x, h), model_find(&m, h) >= 0 ? m.cnt[model_find(&m, h)] : 0);
    }
    kvbm__hindex_free(&x);
  }
}

typedef struct vmodel {
  uint64_t key[64], val[64];
  uint32_t n; /* oldest first */
} vmodel;

static int vmodel_find(const vmodel *m, uint64_t h) {
  for (uint32_t i = 0; i < m->n; i++)
    if (m->key[i] == h) return (int)i;
  return -1;
}

static void vmodel_drop(vmodel *m, uint32_t i) {
  for (uint32_t k = i + 1; k < m->n; k++) {
    m->key[k - 1] = m->key[k];
    m->val[k - 1] = m->val[k];
  }
  m->n--;
}

static void test_values_against_model(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 6; seed++) {
    const uint32_t limit = (uint32_t)(seed * 9);
    kvbm__hindex x;
    assert_int_equal(kvbm__hindex_init(&x, limit, seed), KVBM_OK);
    vmodel m = {.n = 0};
    uint64_t s = seed * 77, clock = 0;
    for (int step = 0; step < 20000; step++) {
      uint64_t h = (rng(&s) % (limit * 3)) << (step % 3 == 0 ? 40 : 0), v;
      uint32_t op = (uint32_t)(rng(&s) % 8);
      int i = vmodel_find(&m, h);
      if (op < 4) { /* put: newest, value = the clock */
        uint32_t ev = 9;
        uint64_t evh = 0;
        kvbm__hindex_put(&x, h, ++clock, &ev, &evh);
        if (i >= 0) {
          vmodel_drop(&m, (uint32_t)i);
          assert_int_equal(ev, 0);
        } else if (m.n == limit) {
          assert_int_equal(ev, 1);
          assert_true(evh == m.key[0]);
          vmodel_drop(&m, 0);
        } else {
          assert_int_equal(ev, 0);
        }
        m.key[m.n] = h;
        m.val[m.n++] = clock;
      } else if (op < 6) {
        assert_int_equal(kvbm__hindex_drop(&x, h), i >= 0);
        if (i >= 0) vmodel_drop(&m, (uint32_t)i);
      } else if (op < 7) {
        uint64_t oh, ov;
        assert_int_equal(kvbm__hindex_oldest(&x, &oh, &ov), m.n > 0);
        if (m.n) {
          assert_true(oh == m.key[0]);
          assert_true(ov == m.val[0]);
        }
      } else if (step % 500 == 7) {
        kvbm__hindex_clear(&x);
        m.n = 0;
      }
      assert_int_equal(kvbm__hindex_size(&x), m.n);
      i = vmodel_find(&m, h);
      assert_int_equal(kvbm__hindex_get(&x, h, &v), i >= 0);
      if (i >= 0) assert_true(v == m.val[i]);
      for (uint32_t k = 1; k < m.n; k++) assert_true(m.val[k - 1] < m.val[k]);
    }
    kvbm__hindex_free(&x);
  }
}

static void test_full_default_size_constant_probes(void **state) {
  (void)state;
  const uint32_t limit = 65536; /* kvbm_peer_config_default().remote_index_blocks */
  kvbm__hindex x;
  assert_int_equal(kvbm__hindex_init(&x, limit, 42), KVBM_OK);
  uint64_t s = 7;
  for (uint32_t k = 0; k < limit; k++) kvbm__hindex_add(&x, rng(&s), NULL, NULL);
  assert_int_equal(x.live, limit);
  const uint32_t adds = 100000;
  uint64_t before = x.probes, evictions = 0;
  for (uint32_t k = 0; k < adds; k++) {
    uint32_t ev;
    kvbm__hindex_add(&x, rng(&s), &ev, NULL);
    evictions += ev;
  }
  assert_int_equal(evictions, adds);
  assert_int_equal(x.live, limit);
  uint64_t probes = x.probes - before;
  print_message("%.2f probes per add, %u keys in %u slots\n", (double)probes / adds, limit, x.mask + 1);
  /* about 6 at half full (a miss, the oldest's erase, the miss again);
   * the old remote index examined all 131072 slots per add */
  if (probes > 32ull * adds) fail_msg("%llu probes for %u adds", (unsigned long long)probes, adds);
  kvbm__hindex_free(&x);
}

static void test_bad_limits(void **state) {
  (void)state;
  kvbm__hindex x;
  assert_int_equal(kvbm__hindex_init(&x, 0, 1), KVBM_EINVAL);
  assert_int_equal(kvbm__hindex_init(&x, (1u << 26) + 1, 1), KVBM_EINVAL);
  kvbm__hindex_free(&x);
  assert_int_equal(kvbm__hindex_init(&x, 1, 0), KVBM_OK); /* one key, two slots */
  uint32_t ev;
  uint64_t evh;
  kvbm__hindex_add(&x, 5, &ev, &evh);
  kvbm__hindex_add(&x, 6, &ev, &evh);
  assert_int_equal(ev, 1);
  assert_true(evh == 5);
  assert_int_equal(kvbm__hindex_count(&x, 5), 0);
  assert_int_equal(kvbm__hindex_count(&x, 6), 1);
  kvbm__hindex_free(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_against_model), cmocka_unit_test(test_values_against_model),
      cmocka_unit_test(test_full_default_size_constant_probes),
      cmocka_unit_test(test_bad_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
