/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_concurrent.c: lookups on several threads while one writer applies
 * events (also run under ThreadSanitizer: label tsan).
 *
 * The writer churns: a worker "A" stores a chain block by block and removes
 * it tail first, over and over (so A always holds a prefix of it), while
 * worker "B" holds the whole chain the whole time and also stores and
 * removes thousands of other hashes that land in the chain's probe runs of
 * B's table (forcing growth, long runs and many backward-shift deletions
 * that move the chain's slots). Readers check what must hold at every instant:
 *   - B's prefix is always the full chain: a slot moved by a deletion or a
 *     table swap never makes a present block look absent;
 *   - A's prefix: the writer publishes a mark (a version and a value m)
 *     next to every step, so that while the mark stands A holds m or m + 1
 *     blocks (stores: store block m, then publish m + 1; removes: publish
 *     m, then remove block m). A lookup that ran entirely under one mark
 *     must report m or m + 1, on every tier.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kvbm/router.h"

#define CHAIN 64
#define READERS 3
#ifdef KVBM_SANITIZED
#define ROUNDS 150
#else
#define ROUNDS 4000
#endif

typedef struct shared {
  kvbm_index *idx;
  uint64_t chain[CHAIN];
  uint32_t slot_a, slot_b;
  _Atomic uint64_t mark;  /* version << 32 | m */
  _Atomic int done;
  _Atomic uint64_t lookups, checked, violations;
} shared;

static void *reader(void *arg) {
  shared *s = arg;
  kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
  while (!atomic_load(&s->done)) {
    uint64_t m1 = atomic_load(&s->mark);
    kvbm_index_lookup(s->idx, s->chain, CHAIN, ov, NULL);
    uint64_t m2 = atomic_load(&s->mark);
    const kvbm_overlap *a = &ov[s->slot_a], *b = &ov[s->slot_b];
    bool bad = b->prefix[0] != CHAIN || b->prefix[2] != CHAIN || a->prefix[0] > CHAIN ||
               a->prefix[0] != a->prefix[2];
    if (m1 == m2) {
      uint32_t m = (uint32_t)m1;
      bad |= a->prefix[0] != m && a->prefix[0] != m + 1;
      atomic_fetch_add(&s->checked, 1);
    }
    if (bad) atomic_fetch_add(&s->violations, 1);
    atomic_fetch_add(&s->lookups, 1);
  }
  return NULL;
}

static void apply_p(shared *s, uint64_t wid, kvbm_event_type type, const uint64_t *h, size_t n,
                    const uint64_t *parent) {
  kvbm_event ev = {.type = type, .block_hashes = h, .num_block_hashes = n,
                   .medium = KVBM_MEDIUM_GPU, .block_size = 16};
  if (parent) ev.parent_hash = *parent, ev.has_parent = true;
  kvbm_worker_key k = {wid, 0};
  assert_int_equal(kvbm_index_apply(s->idx, k, KVBM_INDEX_NO_ID, &ev, NULL), KVBM_OK);
}

static void apply(shared *s, uint64_t wid, kvbm_event_type type, const uint64_t *h, size_t n) {
  apply_p(s, wid, type, h, n, NULL);
}

static void test_readers_and_writer(void **state) {
  (void)state;
  static shared s;
  kvbm_index_config c = kvbm_index_config_default();
  c.expected_blocks = 16; /* start small: the writer grows the table under the readers */
  assert_int_equal(kvbm_index_create(&c, &s.idx, NULL), KVBM_OK);
  uint64_t rng = 99;
  for (int i = 0; i < CHAIN; i++) s.chain[i] = kvbm_router_rand(&rng);
  apply(&s, 1, KVBM_EVENT_STORED, s.chain, CHAIN); /* B */
  kvbm_worker_key ka = {2, 0}, kb = {1, 0};
  assert_int_equal(kvbm_index_add_worker(s.idx, ka, &s.slot_a, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_worker_slot(s.idx, kb, &s.slot_b), KVBM_OK);
  pthread_t th[READERS];
  for (int i = 0; i < READERS; i++) assert_int_equal(pthread_create(&th[i], NULL, reader, &s), 0);
  /* B's other hashes collide with the chain's: the table's home slot is the top
   * bits of h * K (index.c), so h = K^-1 * (top bits of a chain block's
   * h * K | random low bits) lands in that block's probe run at every table
   * size, and deleting it shifts the chain's blocks back. */
  const uint64_t K = 0x9E3779B97F4A7C15ull;
  uint64_t kinv = K; /* Newton: each step doubles the correct low bits */
  for (int i = 0; i < 6; i++) kinv *= 2 - K * kinv;
  assert_true(K * kinv == 1);
  enum { NC = 4096 };
  static uint64_t other[NC];
  for (int i = 0; i < NC; i++) {
    uint64_t top = (s.chain[i % CHAIN] * K) & ~((1ull << 40) - 1);
    other[i] = kinv * (top | (kvbm_router_rand(&rng) >> 24));
  }
  uint64_t version = 0;
  /* On a loaded machine the readers may not have run at all by the end of
   * ROUNDS: the writer goes on, yielding between rounds (the mark stays
   * still meanwhile, so a reader's lookup can be checked), until a lookup
   * was checked; a bound keeps a broken reader from hanging the test. */
  for (int round = 0; round < ROUNDS || (atomic_load(&s.checked) == 0 && round < 100 * ROUNDS);
       round++) {
    if (round >= ROUNDS) sched_yield();
    for (uint32_t k = 0; k < CHAIN; k++) {
      /* in A's table another hash takes chain[k]'s home slot first, so
       * chain[k] lands behind it; removing it then shifts chain[k] back
       * while the mark says A holds it */
      const uint64_t *o = &other[(round * CHAIN + k) % NC];
      apply(&s, 2, KVBM_EVENT_STORED, o, 1);
      apply_p(&s, 2, KVBM_EVENT_STORED, &s.chain[k], 1, k ? &s.chain[k - 1] : NULL);
      atomic_store(&s.mark, (++version << 32) | (k + 1));
      apply(&s, 2, KVBM_EVENT_REMOVED, o, 1);
      apply(&s, 1, KVBM_EVENT_STORED, o, 1);
    }
    for (uint32_t k = CHAIN; k-- > 0;) {
      atomic_store(&s.mark, (++version << 32) | k);
      apply(&s, 2, KVBM_EVENT_REMOVED, &s.chain[k], 1);
      apply(&s, 1, KVBM_EVENT_REMOVED, &other[(round * CHAIN + k) % NC], 1);
    }
  }
  atomic_store(&s.done, 1);
  for (int i = 0; i < READERS; i++) pthread_join(th[i], NULL);
  assert_true(atomic_load(&s.checked) > 0);
  if (atomic_load(&s.violations))
    fail_msg("%llu of %llu lookups saw an impossible state",
             (unsigned long long)atomic_load(&s.violations),
             (unsigned long long)atomic_load(&s.lookups));
  kvbm_index_stats st;
  kvbm_index_stats_get(s.idx, &st);
  assert_true(st.table_slots > 64); /* it did grow under the readers */
  kvbm_index_destroy(s.idx);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_readers_and_writer)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
