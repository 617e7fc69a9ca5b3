/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pool_cache.c: the registry, dedup, the inactive pool and the listener.
 *
 * - registry: register then match by hash; dedup on register (from an active
 *   and from a cached registered block, and with other holders of the
 *   duplicate); allow_duplicates; commit hashes equal kvbm_hash_next() and
 *   kvbm_hash_chain() in both schemes; fill == init + append + commit +
 *   register; hashes crafted to share a home slot (and to wrap around the
 *   table's end) stay findable through every deletion.
 * - inactive pool: free blocks before any eviction; lowest priority first,
 *   then least recently released; tail-first release evicts the tail first;
 *   a match takes a block out of the cache; all-or-nothing alloc; clear;
 *   a demoted block is the first evicted.
 * - prefill: fill_run == alloc + fill per block (parents chained, dedup,
 *   ENOSPC without change, evicting for block k before looking up k + 1);
 *   keep_tokens off; peek takes no reference.
 * - listener: STORED (with parent, tokens, salt) on register only, REMOVED on
 *   eviction, CLEARED on clear, in order.
 */
#include "pool/pool_internal.h"
#include "pool_testutil.h"

#define BS 4

/* ---- registry ------------------------------------------------------------ */

static void test_register_then_match(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(8, BS, KVBM_HASH_NATIVE, false, NULL);
  uint64_t h1, h2;
  uint32_t a = tu_register_new(p, BS, 0, 0, false, 1, &h1);
  uint32_t b = tu_register_new(p, BS, 0, h1, true, 2, &h2);
  assert_int_not_equal(h1, h2);
  assert_true(kvbm_pool_contains(p, h1));
  assert_true(kvbm_pool_contains(p, h2));
  assert_false(kvbm_pool_contains(p, h1 ^ 1));
  uint32_t id = 99;
  assert_int_equal(kvbm_pool_match(p, h1 ^ 1, &id), KVBM_ENOTFOUND);
  assert_int_equal(id, 99);
  assert_int_equal(tu_stats(p).match_hits, 0);
  assert_int_equal(kvbm_pool_match(p, h2, &id), KVBM_OK);
  assert_int_equal(id, b);
  assert_int_equal(tu_refcount(p, b), 2);
  assert_int_equal(tu_stats(p).match_hits, 1);

  /* match_prefix stops at the first miss, taking references on the hits. */
  uint64_t hs[4] = {h1, h2, h1 ^ 1, h1};
  uint32_t ids[4] = {0};
  size_t m = 99;
  assert_int_equal(kvbm_pool_match_prefix(p, hs, 4, ids, &m), KVBM_OK);
  assert_int_equal(m, 2);
  assert_int_equal(ids[0], a);
  assert_int_equal(ids[1], b);
  assert_int_equal(tu_refcount(p, a), 2);
  assert_int_equal(tu_refcount(p, b), 3);
  assert_int_equal(tu_stats(p).match_hits, 3);
  uint64_t miss[2] = {h1 ^ 1, h1};
  assert_int_equal(kvbm_pool_match_prefix(p, miss, 2, ids, &m), KVBM_OK);
  assert_int_equal(m, 0);
  assert_int_equal(tu_refcount(p, a), 2);
  kvbm_pool_destroy(p);
}

/* Dedup with the registered block active: the duplicate goes back to the
 * free list, the caller gets the registered block with a reference. */
static void test_dedup_active(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(4, BS, KVBM_HASH_NATIVE, false, &log);
  uint64_t h;
  uint32_t a = tu_register_new(p, BS, 7, 0, false, 1, &h);
  size_t nev = log.n;
  kvbm_pool_stats st0 = tu_stats(p);
  uint32_t t[BS];
  tu_tokens(t, BS, 1);
  uint32_t b = tu_alloc1(p);
  assert_int_not_equal(a, b);
  assert_int_equal(kvbm_block_init(p, b, 7, 0, false), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, b, t, BS), KVBM_OK);
  assert_int_equal(kvbm_block_commit(p, b), KVBM_OK);
  uint32_t out = 99;
  assert_int_equal(kvbm_block_register(p, b, &out), KVBM_OK);
  assert_int_equal(out, a);
  assert_int_equal(tu_refcount(p, a), 2);
  assert_int_equal(tu_state(p, b), KVBM_BLOCK_RESET);
  assert_int_equal(tu_refcount(p, b), 0);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.free, st0.free);
  assert_int_equal(st.active, st0.active);
  assert_int_equal(st.registered, 1);
  assert_int_equal(st.dedup, 1);
  assert_int_equal(st.allocated, st0.allocated + 1);
  assert_int_equal(log.n, nev); /* no STORED for a dedup */
  /* The caller's reference is on a now: two releases make it cached. */
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK);
  assert_int_equal(tu_stats(p).cached, 1);
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_ESTATE);
  kvbm_pool_destroy(p);
}

/* Dedup against a cached block: it becomes active again (not evictable). */
static void test_dedup_cached(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(2, BS, KVBM_HASH_NATIVE, false, &log);
  uint64_t h;
  uint32_t a = tu_register_new(p, BS, 0, 0, false, 1, &h);
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK);
  assert_int_equal(tu_stats(p).cached, 1);
  uint32_t t[BS];
  tu_tokens(t, BS, 1);
  uint32_t b = tu_alloc1(p); /* the free block, not a */
  assert_int_not_equal(a, b);
  assert_int_equal(tu_stats(p).evicted, 0);
  uint32_t out = 99;
  assert_int_equal(kvbm_block_fill(p, b, 0, 0, false, t, h, &out), KVBM_OK);
  assert_int_equal(out, a);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.cached, 0);
  assert_int_equal(st.active, 1);
  assert_int_equal(st.free, 1);
  assert_int_equal(st.dedup, 1);
  assert_int_equal(tu_refcount(p, a), 1);
  /* a is in use: two allocations can only get one block */
  uint32_t ids[2];
  assert_int_equal(kvbm_pool_alloc(p, 2, ids), KVBM_ENOSPC);
  assert_int_equal(kvbm_pool_alloc(p, 1, ids), KVBM_OK);
  assert_int_equal(ids[0], b);
  assert_true(kvbm_pool_contains(p, h));
  assert_int_equal(log.n, 1); /* the first STORED only */
  kvbm_pool_destroy(p);
}

/* Dedup of a block that others also hold: they keep an empty block. */
static void test_dedup_shared_duplicate(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(4, BS, KVBM_HASH_NATIVE, false, NULL);
  uint64_t h;
  uint32_t a = tu_register_new(p, BS, 0, 0, false, 1, &h);
  uint32_t t[BS];
  tu_tokens(t, BS, 1);
  uint32_t b = tu_alloc1(p);
  assert_int_equal(kvbm_block_retain(p, b), KVBM_OK);
  uint32_t out;
  assert_int_equal(kvbm_block_fill(p, b, 0, 0, false, t, h, &out), KVBM_OK);
  assert_int_equal(out, a);
  assert_int_equal(tu_refcount(p, a), 2);
  assert_int_equal(tu_state(p, b), KVBM_BLOCK_RESET);
  assert_int_equal(tu_refcount(p, b), 1);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.free, 2);
  assert_int_equal(st.active, 2);
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_OK);
  assert_int_equal(tu_stats(p).free, 3);
  kvbm_pool_destroy(p);
}

/* allow_duplicates: both stay registered; the hash resolves to the first,
 * and to the survivor once the first is gone. */
static void test_allow_duplicates(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(3, BS, KVBM_HASH_NATIVE, true, &log);
  uint64_t h, h2;
  uint32_t a = tu_register_new(p, BS, 0, 0, false, 1, &h);
  uint32_t b = tu_register_new(p, BS, 0, 0, false, 1, &h2);
  assert_int_equal(h, h2);
  assert_int_not_equal(a, b);
  assert_int_equal(tu_state(p, b), KVBM_BLOCK_REGISTERED);
  assert_int_equal(tu_refcount(p, a), 1);
  assert_int_equal(tu_refcount(p, b), 1);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.registered, 2);
  assert_int_equal(st.free, 1);
  assert_int_equal(log.n, 2);
  assert_int_equal(log.ev[1].kind, KVBM_POOL_STORED);
  assert_int_equal(log.ev[1].block_id, b);
  uint32_t id;
  assert_int_equal(kvbm_pool_match(p, h, &id), KVBM_OK);
  assert_int_equal(id, a);
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK);
  /* a is cached; b is held. Evict a. */
  uint32_t ids[2];
  assert_int_equal(kvbm_pool_alloc(p, 2, ids), KVBM_OK);
  assert_int_equal(ids[1], a);
  assert_int_equal(tu_stats(p).registered, 1);
  assert_true(kvbm_pool_contains(p, h));
  assert_int_equal(kvbm_pool_match(p, h, &id), KVBM_OK);
  assert_int_equal(id, b);
  assert_int_equal(tu_refcount(p, b), 2);
  /* Once b is gone too, the hash is unknown. */
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_OK);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK);
  assert_false(kvbm_pool_contains(p, h));
  assert_int_equal(tu_stats(p).registered, 0);
  kvbm_pool_destroy(p);
}

static void check_commit_hashes(kvbm_hash_scheme scheme) {
  enum { NBLK = 5, B = 16 };
  uint32_t t[NBLK * B];
  tu_tokens(t, NBLK * B, 99);
  const char salt[] = "lora-adapter-7";
  uint64_t salts[2] = {0, kvbm_hash_salt(salt, sizeof salt - 1)};
  for (int si = 0; si < 2; si++) {
    uint64_t want[NBLK];
    assert_int_equal(kvbm_hash_chain(scheme, salts[si], t, NBLK * B, B, want, NBLK), NBLK);
    tu_log *log = malloc(sizeof *log);
    kvbm_pool *p = tu_pool(NBLK, B, scheme, false, log);
    uint64_t parent = 0;
    for (int k = 0; k < NBLK; k++) {
      uint32_t id = tu_alloc1(p);
      assert_int_equal(kvbm_block_init(p, id, salts[si], parent, k > 0), KVBM_OK);
      /* appended in two pieces */
      assert_int_equal(kvbm_block_append(p, id, t + k * B, 3), KVBM_OK);
      assert_int_equal(kvbm_block_append(p, id, t + k * B + 3, B - 3), KVBM_OK);
      assert_int_equal(kvbm_block_commit(p, id), KVBM_OK);
      kvbm_block_info bi;
      assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
      assert_int_equal(bi.seq_hash, kvbm_hash_next(scheme, salts[si], parent, k > 0, t + k * B, B));
      assert_int_equal(bi.seq_hash, want[k]);
      assert_int_equal(bi.salt_hash, salts[si]);
      assert_int_equal(bi.has_parent, k > 0);
      if (k > 0) assert_int_equal(bi.parent_hash, parent);
      uint32_t out;
      assert_int_equal(kvbm_block_register(p, id, &out), KVBM_OK);
      assert_true(kvbm_pool_contains(p, want[k]));
      assert_int_equal(log->ev[k].seq_hash, want[k]);
      parent = bi.seq_hash;
    }
    /* A different salt gives different hashes: none of them is registered. */
    uint64_t other[NBLK];
    kvbm_hash_chain(scheme, salts[si] + 1, t, NBLK * B, B, other, NBLK);
    for (int k = 0; k < NBLK; k++) assert_false(kvbm_pool_contains(p, other[k]));
    kvbm_pool_destroy(p);
    free(log);
  }
}

static void test_commit_hash_native(void **state) {
  (void)state;
  check_commit_hashes(KVBM_HASH_NATIVE);
}

static void test_commit_hash_dynamo(void **state) {
  (void)state;
  check_commit_hashes(KVBM_HASH_DYNAMO);
}

/* fill leaves exactly what init + append + commit + register leaves, and
 * reports the same event; also when it dedups. */
static void test_fill_equals_steps(void **state) {
  (void)state;
  for (int scheme = 0; scheme < 2; scheme++) {
    tu_log *l1 = malloc(sizeof *l1), *l2 = malloc(sizeof *l2);
    kvbm_pool *p1 = tu_pool(6, BS, (kvbm_hash_scheme)scheme, false, l1);
    kvbm_pool *p2 = tu_pool(6, BS, (kvbm_hash_scheme)scheme, false, l2);
    uint64_t parent = 0;
    for (int k = 0; k < 4; k++) {
      uint32_t t[BS];
      tu_tokens(t, BS, k == 3 ? 0 : (uint32_t)k); /* block 3 repeats block 0... */
      bool hp = k > 0 && k != 3;                   /* ...with no parent: a dedup */
      uint64_t par = hp ? parent : 0;
      uint64_t h = kvbm_hash_next((kvbm_hash_scheme)scheme, 42, par, hp, t, BS);
      uint32_t i1 = tu_alloc1(p1), i2 = tu_alloc1(p2), o1 = 99, o2 = 98;
      assert_int_equal(i1, i2);
      assert_int_equal(kvbm_block_fill(p1, i1, 42, par, hp, t, h, &o1), KVBM_OK);
      assert_int_equal(kvbm_block_init(p2, i2, 42, par, hp), KVBM_OK);
      assert_int_equal(kvbm_block_append(p2, i2, t, BS), KVBM_OK);
      assert_int_equal(kvbm_block_commit(p2, i2), KVBM_OK);
      assert_int_equal(kvbm_block_register(p2, i2, &o2), KVBM_OK);
      assert_int_equal(o1, o2);
      if (k == 3) assert_int_equal(o1, 0);
      parent = h;
    }
    tu_snap *s1 = tu_snap_new(p1);
    tu_assert_unchanged(p2, s1);
    assert_int_equal(l1->n, 3);
    assert_int_equal(l1->n, l2->n);
    for (size_t i = 0; i < l1->n; i++) assert_memory_equal(&l1->ev[i], &l2->ev[i], sizeof l1->ev[i]);
    free(s1);
    kvbm_pool_destroy(p1);
    kvbm_pool_destroy(p2);
    free(l1);
    free(l2);
  }
}

/* Hashes that all share a few home buckets (and wrap round the table's
 * end), inserted and evicted in many orders: every registered one stays
 * findable, every evicted one is gone. 16 hashes in 3 buckets of 7 entries
 * drive the overflow counts through chains that wrap round. */
static void test_registry_collisions(void **state) {
  (void)state;
  enum { NB = 16 }; /* 8 buckets */
  uint32_t last = (1u << tu_table_bits(NB)) - 1;
  uint64_t hs[NB];
  uint32_t rng = 12345;
  for (int round = 0; round < 400; round++) {
    /* homes: the last slot, the one before, and slot 0; pairs (2k, 2k+1)
     * share their home and their 32-bit fingerprint */
    uint32_t home = 0;
    for (int i = 0; i < NB; i++) {
      rng = rng * 1103515245u + 12345u;
      uint32_t r = rng >> 16;
      if (i % 2 == 0) home = r % 3 == 0 ? last : r % 3 == 1 ? last - 1 : 0;
      if (i % 2 == 0 && round % 4 == 3) home = (r >> 4) % (last + 1);
      hs[i] = tu_hash_at_slot(NB, home, (uint64_t)round * 64 + (uint64_t)i);
      assert_int_equal(tu_home_of(NB, hs[i]), home);
      if (i % 2) {
        assert_int_equal(tu_fingerprint(hs[i]), tu_fingerprint(hs[i - 1]));
        assert_int_not_equal(hs[i], hs[i - 1]);
      }
    }
    kvbm_pool *p = tu_pool(NB, BS, KVBM_HASH_NATIVE, false, NULL);
    uint32_t ids[NB];
    /* register all, releasing each at a random priority */
    for (int i = 0; i < NB; i++) {
      ids[i] = tu_fill_new(p, BS, hs[i], (uint32_t)i);
      rng = rng * 1103515245u + 12345u;
      assert_int_equal(kvbm_block_release(p, ids[i], (uint8_t)((rng >> 16) % 4)), KVBM_OK);
    }
    bool present[NB];
    for (int i = 0; i < NB; i++) present[i] = true;
    /* evict one at a time (random order through priorities), checking all */
    for (int k = 0; k < NB; k++) {
      uint32_t got = tu_alloc1(p);
      int gone = -1;
      for (int i = 0; i < NB; i++)
        if (ids[i] == got) gone = i;
      assert_true(gone >= 0 && present[gone]);
      present[gone] = false;
      for (int i = 0; i < NB; i++) {
        assert_int_equal(kvbm_pool_contains(p, hs[i]), present[i]);
        if (present[i]) {
          uint32_t id;
          assert_int_equal(kvbm_pool_match(p, hs[i], &id), KVBM_OK);
          assert_int_equal(id, ids[i]);
          kvbm_block_info bi;
          assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
          assert_int_equal(kvbm_block_release(p, id, bi.priority), KVBM_OK);
        }
      }
      /* re-register the evicted hash in its new block half of the time */
      if (k % 2 == 0) {
        uint32_t out;
        uint32_t t[BS];
        tu_tokens(t, BS, 5);
        assert_int_equal(kvbm_block_fill(p, got, 0, 0, false, t, hs[gone], &out), KVBM_OK);
        assert_int_equal(out, got);
        ids[gone] = got;
        present[gone] = true;
        assert_int_equal(kvbm_block_release(p, got, 3), KVBM_OK);
      }
    }
    kvbm_pool_destroy(p);
  }
}

/* ---- inactive pool ------------------------------------------------------------ */

/* Free blocks go first; a cached block is evicted only when none is left. */
static void test_free_before_cached(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(8, BS, KVBM_HASH_NATIVE, false, &log);
  uint64_t h[3];
  uint32_t c[3];
  for (int i = 0; i < 3; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i, &h[i]);
  for (int i = 0; i < 3; i++) assert_int_equal(kvbm_block_release(p, c[i], 0), KVBM_OK);
  size_t nev = log.n;
  uint32_t ids[5];
  assert_int_equal(kvbm_pool_alloc(p, 5, ids), KVBM_OK);
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 3; j++) assert_int_not_equal(ids[i], c[j]);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.evicted, 0);
  assert_int_equal(st.cached, 3);
  assert_int_equal(st.free, 0);
  for (int j = 0; j < 3; j++) assert_true(kvbm_pool_contains(p, h[j]));
  assert_int_equal(log.n, nev);
  /* Releasing a never-registered block refills the free list, which again
   * goes before the cache. */
  assert_int_equal(kvbm_block_release(p, ids[2], 0), KVBM_OK);
  assert_int_equal(tu_alloc1(p), ids[2]);
  assert_int_equal(tu_stats(p).evicted, 0);
  /* Now one eviction: the oldest, c[0]. */
  assert_int_equal(tu_alloc1(p), c[0]);
  st = tu_stats(p);
  assert_int_equal(st.evicted, 1);
  assert_int_equal(st.cached, 2);
  assert_false(kvbm_pool_contains(p, h[0]));
  assert_int_equal(log.n, nev + 1);
  assert_int_equal(log.ev[nev].kind, KVBM_POOL_REMOVED);
  assert_int_equal(log.ev[nev].block_id, c[0]);
  assert_int_equal(log.ev[nev].seq_hash, h[0]);
  kvbm_pool_destroy(p);
}

/* Lowest priority first, then least recently released. */
static void test_eviction_order(void **state) {
  (void)state;
  enum { N = 12 };
  tu_log *log = malloc(sizeof *log);
  kvbm_pool *p = tu_pool(N, BS, KVBM_HASH_NATIVE, false, log);
  static const uint8_t prio[N] = {5, 0, 255, 5, 1, 0, 255, 64, 63, 0, 1, 200};
  uint32_t c[N];
  uint64_t h[N];
  for (int i = 0; i < N; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i + 100, &h[i]);
  /* release in a scrambled order */
  static const int order[N] = {3, 11, 0, 7, 2, 9, 5, 1, 10, 8, 6, 4};
  for (int k = 0; k < N; k++) assert_int_equal(kvbm_block_release(p, c[order[k]], prio[order[k]]), KVBM_OK);
  for (int i = 0; i < N; i++) {
    kvbm_block_info bi;
    assert_int_equal(kvbm_block_info_get(p, c[i], &bi), KVBM_OK);
    assert_int_equal(bi.priority, prio[i]);
  }
  /* expected: sort by (priority, release position) */
  int want[N];
  for (int k = 0; k < N; k++) want[k] = order[k];
  for (int i = 1; i < N; i++)
    for (int j = i; j > 0 && prio[want[j - 1]] > prio[want[j]]; j--) {
      int t = want[j];
      want[j] = want[j - 1];
      want[j - 1] = t;
    }
  size_t nev = log->n;
  for (int k = 0; k < N; k++) {
    assert_int_equal(tu_alloc1(p), c[want[k]]);
    assert_int_equal(log->ev[nev + (size_t)k].kind, KVBM_POOL_REMOVED);
    assert_int_equal(log->ev[nev + (size_t)k].block_id, c[want[k]]);
    assert_int_equal(log->ev[nev + (size_t)k].seq_hash, h[want[k]]);
  }
  /* (priority 0 blocks 1, 9, 5 in release order 9, 5, 1 go first) */
  assert_int_equal(want[0], 9);
  assert_int_equal(want[N - 1], 6);
  /* A batch alloc evicts in the same order as single ones. */
  kvbm_pool_destroy(p);
  free(log);
}

/* evict_where: in eviction order, only the picked blocks, at most max,
 * each freed and unregistered; held blocks are never offered. */
typedef struct pick {
  uint64_t want[2];
  uint32_t seen[8];
  int nseen;
} pick;
static bool pick_some(void *user, uint32_t id, uint64_t h) {
  pick *k = user;
  k->seen[k->nseen++] = id;
  return h == k->want[0] || h == k->want[1];
}
static void test_evict_where(void **state) {
  (void)state;
  enum { N = 6 };
  kvbm_pool *p = tu_pool(N, BS, KVBM_HASH_NATIVE, false, NULL);
  uint32_t c[N];
  uint64_t h[N];
  for (int i = 0; i < N; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i + 700, &h[i]);
  /* c[0] held; cached order: c[5] (priority 0), c[1], c[2], c[3], c[4] (9) */
  for (int i = 1; i < N; i++) assert_int_equal(kvbm_block_release(p, c[i], i == 5 ? 0 : 9), KVBM_OK);
  pick k = {.want = {h[2], h[4]}};
  assert_int_equal(kvbm_pool_evict_where(p, 1, pick_some, &k), 1); /* max 1: c[2] only */
  assert_int_equal(k.nseen, 3);
  assert_int_equal(k.seen[0], c[5]);
  assert_int_equal(k.seen[1], c[1]);
  assert_false(kvbm_pool_contains(p, h[2]));
  assert_true(kvbm_pool_contains(p, h[4]));
  k.nseen = 0;
  assert_int_equal(kvbm_pool_evict_where(p, 10, pick_some, &k), 1); /* c[4] */
  assert_int_equal(k.nseen, 4); /* c[5], c[1], c[3], c[4]: never c[0] (held) */
  assert_false(kvbm_pool_contains(p, h[4]));
  kvbm_pool_stats s = tu_stats(p);
  assert_int_equal(s.free, 2);
  assert_int_equal(s.cached, 3);
  assert_int_equal(s.evicted, 2);
  assert_int_equal(kvbm_pool_evict_where(NULL, 1, pick_some, &k), 0);
  assert_int_equal(kvbm_pool_evict_where(p, 1, NULL, &k), 0);
  assert_int_equal(kvbm_block_release(p, c[0], 0), KVBM_OK);
  kvbm_pool_destroy(p);
}

/* A demoted cached block is evicted first, ahead of every priority and
 * release order; demoting another after it puts that one first; a held
 * block cannot be demoted. */
static void test_demote(void **state) {
  (void)state;
  enum { N = 6 };
  kvbm_pool *p = tu_pool(N, BS, KVBM_HASH_NATIVE, false, NULL);
  uint32_t c[N];
  uint64_t h[N];
  for (int i = 0; i < N; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i + 500, &h[i]);
  assert_int_equal(kvbm_block_demote(p, c[0]), KVBM_ESTATE); /* held */
  for (int i = 0; i < N; i++) assert_int_equal(kvbm_block_release(p, c[i], i == 5 ? 0 : 9), KVBM_OK);
  /* without demotion c[5] (priority 0) would go first, then c[0] */
  assert_int_equal(kvbm_block_demote(p, c[3]), KVBM_OK);
  assert_int_equal(kvbm_block_demote(p, c[4]), KVBM_OK);
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, c[4], &bi), KVBM_OK);
  assert_int_equal(bi.priority, 0);
  assert_int_equal(tu_alloc1(p), c[4]);
  assert_int_equal(tu_alloc1(p), c[3]);
  assert_int_equal(tu_alloc1(p), c[5]);
  assert_int_equal(tu_alloc1(p), c[0]);
  assert_false(kvbm_pool_contains(p, h[3]));
  assert_true(kvbm_pool_contains(p, h[1]));
  assert_int_equal(kvbm_block_demote(p, c[3]), KVBM_ESTATE); /* evicted: held by us, not registered */
  assert_int_equal(kvbm_block_demote(p, N), KVBM_EINVAL);
  kvbm_pool_destroy(p);
}

/* A batch allocation evicts in the same order, and reports each REMOVED. */
static void test_batch_eviction_order(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(6, BS, KVBM_HASH_NATIVE, false, &log);
  uint32_t c[4];
  for (int i = 0; i < 4; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i, NULL);
  assert_int_equal(kvbm_block_release(p, c[2], 1), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, c[0], 2), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, c[3], 1), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, c[1], 1), KVBM_OK);
  size_t nev = log.n;
  uint32_t ids[5];
  assert_int_equal(kvbm_pool_alloc(p, 5, ids), KVBM_OK);
  /* two free ones first (order unspecified), then c2, c3, c1 */
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) assert_int_not_equal(ids[i], c[j]);
  assert_int_equal(ids[2], c[2]);
  assert_int_equal(ids[3], c[3]);
  assert_int_equal(ids[4], c[1]);
  assert_int_equal(log.n, nev + 3);
  assert_int_equal(log.ev[nev].block_id, c[2]);
  assert_int_equal(log.ev[nev + 1].block_id, c[3]);
  assert_int_equal(log.ev[nev + 2].block_id, c[1]);
  for (int i = 0; i < 5; i++) assert_int_equal(tu_refcount(p, ids[i]), 1);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.evicted, 3);
  assert_int_equal(st.cached, 1);
  assert_int_equal(st.allocated, 4 + 5);
  kvbm_pool_destroy(p);
}

/* A request releases its blocks tail first: the tail is evicted first, and
 * the head (the shared prefix other requests match) last. */
static void test_tail_first(void **state) {
  (void)state;
  enum { L = 6 };
  kvbm_pool *p = tu_pool(L, BS, KVBM_HASH_NATIVE, false, NULL);
  uint32_t ids[L];
  uint64_t h[L], parent = 0;
  for (int k = 0; k < L; k++) {
    ids[k] = tu_register_new(p, BS, 0, parent, k > 0, (uint32_t)k, &h[k]);
    parent = h[k];
  }
  for (int k = L - 1; k >= 0; k--) assert_int_equal(kvbm_block_release(p, ids[k], 0), KVBM_OK);
  /* the next allocation takes the tail; the prefix is still matchable */
  assert_int_equal(tu_alloc1(p), ids[L - 1]);
  uint32_t got[L];
  size_t m;
  assert_int_equal(kvbm_pool_match_prefix(p, h, L, got, &m), KVBM_OK);
  assert_int_equal(m, L - 1);
  for (int k = 0; k < L - 1; k++) assert_int_equal(got[k], ids[k]);
  kvbm_pool_destroy(p);

  /* without matching in between, evictions go tail to head */
  p = tu_pool(L, BS, KVBM_HASH_NATIVE, false, NULL);
  parent = 0;
  for (int k = 0; k < L; k++) {
    ids[k] = tu_register_new(p, BS, 0, parent, k > 0, (uint32_t)k, &h[k]);
    parent = h[k];
  }
  for (int k = L - 1; k >= 0; k--) assert_int_equal(kvbm_block_release(p, ids[k], 0), KVBM_OK);
  for (int k = L - 1; k >= 0; k--) assert_int_equal(tu_alloc1(p), ids[k]);
  kvbm_pool_destroy(p);
}

/* A match takes a cached block out of the cache; its next release makes it
 * the most recently released. */
static void test_match_reactivates(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(3, BS, KVBM_HASH_NATIVE, false, NULL);
  uint64_t h[3];
  uint32_t c[3];
  for (int i = 0; i < 3; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i, &h[i]);
  for (int i = 0; i < 3; i++) assert_int_equal(kvbm_block_release(p, c[i], 0), KVBM_OK);
  uint32_t id;
  assert_int_equal(kvbm_pool_match(p, h[0], &id), KVBM_OK);
  assert_int_equal(id, c[0]);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.cached, 2);
  assert_int_equal(st.active, 1);
  assert_int_equal(tu_refcount(p, c[0]), 1);
  assert_int_equal(kvbm_pool_available(p), 2);
  /* c0 is not evictable: the two others go, then ENOSPC */
  uint32_t ids[3];
  assert_int_equal(kvbm_pool_alloc(p, 3, ids), KVBM_ENOSPC);
  assert_int_equal(kvbm_pool_alloc(p, 2, ids), KVBM_OK);
  assert_int_equal(ids[0], c[1]);
  assert_int_equal(ids[1], c[2]);
  assert_true(kvbm_pool_contains(p, h[0]));
  assert_int_equal(kvbm_pool_alloc(p, 1, ids), KVBM_ENOSPC);
  kvbm_pool_destroy(p);

  /* LRU refresh: release c0..c2, match+release c0: now c1 is the oldest */
  p = tu_pool(3, BS, KVBM_HASH_NATIVE, false, NULL);
  for (int i = 0; i < 3; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i, &h[i]);
  for (int i = 0; i < 3; i++) assert_int_equal(kvbm_block_release(p, c[i], 0), KVBM_OK);
  assert_int_equal(kvbm_pool_match(p, h[0], &id), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, id, 0), KVBM_OK);
  assert_int_equal(tu_alloc1(p), c[1]);
  assert_int_equal(tu_alloc1(p), c[2]);
  assert_int_equal(tu_alloc1(p), c[0]);
  kvbm_pool_destroy(p);

  /* retain of a cached block reactivates it the same way */
  p = tu_pool(2, BS, KVBM_HASH_NATIVE, false, NULL);
  for (int i = 0; i < 2; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i, &h[i]);
  for (int i = 0; i < 2; i++) assert_int_equal(kvbm_block_release(p, c[i], 0), KVBM_OK);
  assert_int_equal(kvbm_block_retain(p, c[0]), KVBM_OK);
  assert_int_equal(tu_stats(p).cached, 1);
  assert_int_equal(tu_alloc1(p), c[1]);
  assert_int_equal(kvbm_pool_alloc(p, 1, ids), KVBM_ENOSPC);
  kvbm_pool_destroy(p);
}

/* kvbm__pool_match_id, the sequence's second half of a peek: a reference
 * on the peeked block as kvbm_pool_match takes it, and a refusal, with no
 * change, of an id past the pool or of a block not registered. A block
 * out of the cache reports priority 0; released again (release_run's one
 * add to its record) it joins the list of its new priority. */
static void test_match_id(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(3, BS, KVBM_HASH_NATIVE, false, NULL);
  uint64_t h[3];
  uint32_t c[3];
  for (int i = 0; i < 3; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i, &h[i]);
  assert_int_equal(kvbm_pool_release_run(p, c, 3, 5), KVBM_OK);
  uint32_t id = 99;
  bool cached = false;
  assert_int_equal(kvbm_pool_peek(p, h[1], &id, &cached), KVBM_OK);
  assert_int_equal(id, c[1]);
  assert_true(cached);
  assert_int_equal(kvbm__pool_match_id(p, 3), KVBM_EINVAL);
  assert_int_equal(kvbm__pool_match_id(p, UINT32_MAX), KVBM_EINVAL);
  assert_int_equal(tu_stats(p).match_hits, 0);
  assert_int_equal(kvbm__pool_match_id(p, id), KVBM_OK);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.match_hits, 1);
  assert_int_equal(st.cached, 2);
  assert_int_equal(tu_refcount(p, c[1]), 1);
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, c[1], &bi), KVBM_OK);
  assert_int_equal(bi.priority, 0); /* out of the cache */
  assert_int_equal(bi.state, KVBM_BLOCK_REGISTERED);
  /* back at priority 2, below the others' 5: evicted first */
  assert_int_equal(kvbm_pool_release_run(p, &c[1], 1, 2), KVBM_OK);
  assert_int_equal(kvbm_block_info_get(p, c[1], &bi), KVBM_OK);
  assert_int_equal(bi.priority, 2);
  assert_int_equal(bi.refcount, 0);
  assert_int_equal(tu_alloc1(p), c[1]);
  /* the freshly allocated block is not registered: refused, unchanged */
  assert_int_equal(kvbm__pool_match_id(p, c[1]), KVBM_ESTATE);
  assert_int_equal(tu_refcount(p, c[1]), 1);
  assert_int_equal(tu_stats(p).match_hits, 1);
  /* release_run's order among the others: the run's last block is the
   * oldest (tail first) */
  assert_int_equal(tu_alloc1(p), c[2]);
  assert_int_equal(tu_alloc1(p), c[0]);
  kvbm_pool_destroy(p);
}

/* A block held by two requests is cached only after both release it, at the
 * priority of the last release. */
static void test_shared_release(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(2, BS, KVBM_HASH_NATIVE, false, NULL);
  uint64_t h0, h1;
  uint32_t a = tu_register_new(p, BS, 0, 0, false, 0, &h0);
  uint32_t b = tu_register_new(p, BS, 0, 0, false, 1, &h1);
  uint32_t id;
  assert_int_equal(kvbm_pool_match(p, h0, &id), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK);
  assert_int_equal(tu_stats(p).cached, 0);
  assert_int_equal(kvbm_block_release(p, b, 1), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, a, 2), KVBM_OK); /* last: priority 2 */
  assert_int_equal(tu_stats(p).cached, 2);
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, a, &bi), KVBM_OK);
  assert_int_equal(bi.priority, 2);
  assert_int_equal(tu_alloc1(p), b);
  assert_int_equal(tu_alloc1(p), a);
  kvbm_pool_destroy(p);
}

/* kvbm_pool_evict: one cached block out now (REMOVED, back to free), a
 * block in use stays (ESTATE), an unknown hash is ENOTFOUND; the others in
 * the cache keep their order. */
static void test_evict_one(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(6, BS, KVBM_HASH_NATIVE, false, &log);
  uint64_t h[3];
  uint32_t c[3];
  for (int i = 0; i < 3; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i, &h[i]);
  for (int i = 0; i < 2; i++) assert_int_equal(kvbm_block_release(p, c[i], 0), KVBM_OK);
  size_t nev = log.n;
  kvbm_pool_stats st0 = tu_stats(p);
  assert_int_equal(kvbm_pool_evict(p, h[2]), KVBM_ESTATE); /* in use */
  assert_int_equal(kvbm_pool_evict(p, h[0] ^ 1), KVBM_ENOTFOUND);
  assert_int_equal(log.n, nev);
  assert_int_equal(kvbm_pool_evict(p, h[1]), KVBM_OK);
  assert_int_equal(log.n, nev + 1);
  assert_int_equal(log.ev[nev].kind, KVBM_POOL_REMOVED);
  assert_int_equal(log.ev[nev].block_id, c[1]);
  assert_true(log.ev[nev].seq_hash == h[1]);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.cached, st0.cached - 1);
  assert_int_equal(st.free, st0.free + 1);
  assert_int_equal(st.registered, st0.registered - 1);
  assert_false(kvbm_pool_contains(p, h[1]));
  assert_true(kvbm_pool_contains(p, h[0]));
  assert_int_equal(tu_state(p, c[1]), KVBM_BLOCK_RESET);
  assert_int_equal(kvbm_pool_evict(p, h[1]), KVBM_ENOTFOUND);
  tu_assert_stats_sane(p);
  kvbm_pool_destroy(p);
}

static void test_clear_cache(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(6, BS, KVBM_HASH_NATIVE, false, &log);
  uint64_t h[4];
  uint32_t c[4];
  for (int i = 0; i < 4; i++) c[i] = tu_register_new(p, BS, 0, 0, false, (uint32_t)i, &h[i]);
  uint32_t partial = tu_alloc1(p);
  assert_int_equal(kvbm_block_init(p, partial, 0, 0, false), KVBM_OK);
  for (int i = 0; i < 3; i++) assert_int_equal(kvbm_block_release(p, c[i], (uint8_t)i), KVBM_OK);
  size_t nev = log.n;
  kvbm_pool_stats st0 = tu_stats(p);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.cached, 0);
  assert_int_equal(st.free, st0.free + 3);
  assert_int_equal(st.active, st0.active);
  assert_int_equal(st.registered, 1);
  assert_int_equal(st.evicted, 0); /* clearing is not eviction for alloc */
  for (int i = 0; i < 3; i++) {
    assert_false(kvbm_pool_contains(p, h[i]));
    assert_int_equal(tu_state(p, c[i]), KVBM_BLOCK_RESET);
    assert_int_equal(tu_refcount(p, c[i]), 0);
  }
  /* blocks in use are untouched */
  assert_true(kvbm_pool_contains(p, h[3]));
  assert_int_equal(tu_state(p, c[3]), KVBM_BLOCK_REGISTERED);
  assert_int_equal(tu_state(p, partial), KVBM_BLOCK_PARTIAL);
  /* c[3] is still registered and in use: consumers must not forget it, so
   * each dropped block is a REMOVED (in eviction order: priority 0 first). */
  assert_int_equal(log.n, nev + 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(log.ev[nev + i].kind, KVBM_POOL_REMOVED);
    assert_int_equal(log.ev[nev + i].block_id, c[i]);
    assert_true(log.ev[nev + i].seq_hash == h[i]);
  }
  nev = log.n;
  /* cleared blocks are plain free blocks: reusable without eviction */
  uint32_t ids[4];
  assert_int_equal(kvbm_pool_alloc(p, 4, ids), KVBM_OK);
  assert_int_equal(tu_stats(p).evicted, 0);
  assert_int_equal(log.n, nev);
  /* with nothing registered left in use, a clear is one CLEARED */
  assert_int_equal(kvbm_block_release(p, c[3], 0), KVBM_OK);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK);
  assert_int_equal(log.n, nev + 1);
  assert_int_equal(log.ev[nev].kind, KVBM_POOL_CLEARED);
  assert_false(kvbm_pool_contains(p, h[3]));
  nev = log.n;
  /* an empty cache clears fine and still says CLEARED */
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK);
  assert_int_equal(log.n, nev + 1);
  assert_int_equal(log.ev[nev].kind, KVBM_POOL_CLEARED);
  /* a hash cleared can be registered again and is then found */
  uint32_t t[BS];
  tu_tokens(t, BS, 0);
  uint32_t out;
  assert_int_equal(kvbm_block_fill(p, ids[0], 0, 0, false, t, h[0], &out), KVBM_OK);
  assert_int_equal(out, ids[0]);
  assert_true(kvbm_pool_contains(p, h[0]));
  kvbm_pool_destroy(p);
}

/* ---- prefill path, token copies, peek ----------------------------------------- */

/* fill_run == alloc + fill of each block, with the chain's parents. */
static void test_fill_run(void **state) {
  (void)state;
  enum { N = 5, B = 8 };
  uint32_t t[N * B];
  tu_tokens(t, N * B, 31);
  uint64_t salt = kvbm_hash_salt("x", 1), hs[N];
  assert_int_equal(kvbm_hash_chain(KVBM_HASH_DYNAMO, salt, t, N * B, B, hs, N), N);
  tu_log *l1 = malloc(sizeof *l1), *l2 = malloc(sizeof *l2);
  /* room for both runs in full: fill_run asks for n available blocks even
   * when every one of them will dedup */
  kvbm_pool *p1 = tu_pool(2 * N + 2, B, KVBM_HASH_DYNAMO, false, l1);
  kvbm_pool *p2 = tu_pool(2 * N + 2, B, KVBM_HASH_DYNAMO, false, l2);
  uint32_t ids[N], ids2[N];
  assert_int_equal(kvbm_pool_fill_run(p1, salt, 0, false, t, hs, N, ids), KVBM_OK);
  for (int k = 0; k < N; k++) {
    uint32_t id = tu_alloc1(p2);
    assert_int_equal(kvbm_block_fill(p2, id, salt, k ? hs[k - 1] : 0, k > 0, t + k * B, hs[k], &ids2[k]),
                     KVBM_OK);
    assert_int_equal(ids[k], ids2[k]);
    kvbm_block_info bi;
    assert_int_equal(kvbm_block_info_get(p1, ids[k], &bi), KVBM_OK);
    assert_int_equal(bi.state, KVBM_BLOCK_REGISTERED);
    assert_int_equal(bi.refcount, 1);
    assert_int_equal(bi.seq_hash, hs[k]);
    assert_int_equal(bi.has_parent, k > 0);
    if (k) assert_int_equal(bi.parent_hash, hs[k - 1]);
    assert_int_equal(bi.salt_hash, salt);
  }
  tu_snap *s2 = tu_snap_new(p2);
  tu_assert_unchanged(p1, s2);
  free(s2);
  assert_int_equal(l1->n, N);
  for (size_t i = 0; i < N; i++) assert_memory_equal(&l1->ev[i], &l2->ev[i], sizeof l1->ev[i]);

  /* The same run again dedups every block onto the first run's. */
  kvbm_pool_stats st0 = tu_stats(p1);
  assert_int_equal(kvbm_pool_fill_run(p1, salt, 0, false, t, hs, N, ids2), KVBM_OK);
  kvbm_pool_stats st = tu_stats(p1);
  for (int k = 0; k < N; k++) {
    assert_int_equal(ids2[k], ids[k]);
    assert_int_equal(tu_refcount(p1, ids[k]), 2);
  }
  assert_int_equal(st.dedup, st0.dedup + N);
  assert_int_equal(st.free, st0.free);
  assert_int_equal(st.allocated, st0.allocated + N);
  assert_int_equal(l1->n, N); /* no STORED for dedups */

  /* A run continuing a chain takes the parent given. */
  uint32_t more;
  uint32_t t2[B];
  tu_tokens(t2, B, 32);
  uint64_t h6 = kvbm_hash_next(KVBM_HASH_DYNAMO, salt, hs[N - 1], true, t2, B);
  assert_int_equal(kvbm_pool_fill_run(p1, salt, hs[N - 1], true, t2, &h6, 1, &more), KVBM_OK);
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p1, more, &bi), KVBM_OK);
  assert_true(bi.has_parent);
  assert_int_equal(bi.parent_hash, hs[N - 1]);
  assert_true(l1->ev[N].has_parent);
  assert_int_equal(l1->ev[N].parent_hash, hs[N - 1]);

  /* Short of blocks: ENOSPC and no change; NULLs: EINVAL; n == 0: nothing. */
  tu_snap *s1 = tu_snap_new(p1);
  size_t nev = l1->n;
  assert_int_equal(kvbm_pool_available(p1), N + 1);
  uint64_t hx[N + 2] = {1, 2, 3, 4, 5, 6, 7};
  uint32_t tx[(N + 2) * B] = {0}, idx[N + 2] = {7, 7, 7};
  for (int i = 0; i < 3; i++) idx[i] = 7;
  assert_int_equal(kvbm_pool_fill_run(p1, 0, 0, false, tx, hx, N + 2, idx), KVBM_ENOSPC);
  hx[0] = hs[0]; /* even when the first would dedup */
  assert_int_equal(kvbm_pool_fill_run(p1, 0, 0, false, tx, hx, N + 2, idx), KVBM_ENOSPC);
  assert_int_equal(kvbm_pool_fill_run(p1, 0, 0, false, NULL, hx, 1, idx), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_fill_run(p1, 0, 0, false, tx, NULL, 1, idx), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_fill_run(p1, 0, 0, false, tx, hx, 1, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_fill_run(p1, 0, 0, false, NULL, NULL, 0, NULL), KVBM_OK);
  for (int i = 0; i < 3; i++) assert_int_equal(idx[i], 7);
  tu_assert_unchanged(p1, s1);
  assert_int_equal(l1->n, nev);
  free(s1);
  kvbm_pool_destroy(p1);
  kvbm_pool_destroy(p2);
  free(l1);
  free(l2);
}

/* W1's order inside a run: block k is taken (evicting) before block k + 1 is
 * looked up, so k can evict what k + 1 would have deduplicated onto. */
static void test_fill_run_evicts_before_lookup(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(2, BS, KVBM_HASH_NATIVE, false, &log);
  uint32_t a = tu_fill_new(p, BS, 0xa, 1), b = tu_fill_new(p, BS, 0xb, 2);
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK); /* a: oldest */
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_OK);
  uint64_t hs[2] = {0xc, 0xa};
  uint32_t t[2 * BS] = {0}, ids[2];
  assert_int_equal(kvbm_pool_fill_run(p, 0, 0, false, t, hs, 2, ids), KVBM_OK);
  assert_int_equal(ids[0], a); /* a evicted for 0xc */
  assert_int_equal(ids[1], b); /* so 0xa is new: b evicted for it */
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.dedup, 0);
  assert_int_equal(st.evicted, 2);
  /* events: REMOVED a, STORED c, REMOVED b, STORED a */
  assert_int_equal(log.n, 6);
  assert_int_equal(log.ev[2].kind, KVBM_POOL_REMOVED);
  assert_int_equal(log.ev[2].seq_hash, 0xa);
  assert_int_equal(log.ev[3].kind, KVBM_POOL_STORED);
  assert_int_equal(log.ev[3].seq_hash, 0xc);
  assert_int_equal(log.ev[4].kind, KVBM_POOL_REMOVED);
  assert_int_equal(log.ev[4].seq_hash, 0xb);
  assert_int_equal(log.ev[5].kind, KVBM_POOL_STORED);
  assert_int_equal(log.ev[5].seq_hash, 0xa);
  assert_true(log.ev[5].has_parent);
  assert_int_equal(log.ev[5].parent_hash, 0xc);
  kvbm_pool_destroy(p);
}

/* keep_tokens off: filled blocks keep no copy (info.tokens NULL) but events
 * still carry the tokens; blocks built by append keep theirs. */
static void test_keep_tokens_off(void **state) {
  (void)state;
  tu_log *log = malloc(sizeof *log);
  memset(log, 0, sizeof *log);
  kvbm_pool_config cfg = kvbm_pool_config_default(4, BS);
  assert_true(cfg.keep_tokens); /* the default */
  cfg.keep_tokens = false;
  cfg.listener = tu_listener;
  cfg.listener_user = log;
  kvbm_pool *p;
  assert_int_equal(kvbm_pool_create(&cfg, &p, NULL), KVBM_OK);
  uint32_t t[2 * BS];
  tu_tokens(t, 2 * BS, 5);
  uint32_t id = tu_alloc1(p), out;
  assert_int_equal(kvbm_block_fill(p, id, 0, 0, false, t, 0x11, &out), KVBM_OK);
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, out, &bi), KVBM_OK);
  assert_null(bi.tokens);
  assert_int_equal(bi.num_tokens, BS);
  assert_int_equal(log->ev[0].num_tokens, BS);
  assert_memory_equal(log->ev[0].tokens, t, BS * sizeof *t);
  uint64_t h2 = 0x22;
  uint32_t rid;
  assert_int_equal(kvbm_pool_fill_run(p, 0, 0x11, true, t + BS, &h2, 1, &rid), KVBM_OK);
  assert_int_equal(kvbm_block_info_get(p, rid, &bi), KVBM_OK);
  assert_null(bi.tokens);
  assert_memory_equal(log->ev[1].tokens, t + BS, BS * sizeof *t);
  uint32_t s = tu_alloc1(p);
  assert_int_equal(kvbm_block_init(p, s, 0, 0, false), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, s, t, 3), KVBM_OK);
  assert_int_equal(kvbm_block_info_get(p, s, &bi), KVBM_OK);
  assert_non_null(bi.tokens);
  assert_memory_equal(bi.tokens, t, 3 * sizeof *t);
  kvbm_pool_destroy(p);
  free(log);
}

/* peek looks without taking a reference. */
static void test_peek(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(3, BS, KVBM_HASH_NATIVE, false, NULL);
  uint32_t a = tu_fill_new(p, BS, 0xa, 1), b = tu_fill_new(p, BS, 0xb, 2);
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_OK);
  tu_snap *s = tu_snap_new(p);
  uint32_t id = 99;
  bool cached = true;
  assert_int_equal(kvbm_pool_peek(p, 0xa, &id, &cached), KVBM_OK);
  assert_int_equal(id, a);
  assert_false(cached);
  assert_int_equal(kvbm_pool_peek(p, 0xb, &id, &cached), KVBM_OK);
  assert_int_equal(id, b);
  assert_true(cached);
  id = 99;
  assert_int_equal(kvbm_pool_peek(p, 0xc, &id, &cached), KVBM_ENOTFOUND);
  assert_int_equal(id, 99);
  assert_int_equal(kvbm_pool_peek(p, 0xa, NULL, NULL), KVBM_OK);
  tu_assert_unchanged(p, s); /* no reference, no LRU change, no hit counted */
  free(s);
  kvbm_pool_destroy(p);
}

/* ---- listener ------------------------------------------------------------------ */

static void test_listener_sequence(void **state) {
  (void)state;
  tu_log *log = malloc(sizeof *log);
  kvbm_pool *p = tu_pool(3, BS, KVBM_HASH_DYNAMO, false, log);
  uint64_t salt = kvbm_hash_salt("s", 1);
  uint32_t t0[BS], t1[BS];
  tu_tokens(t0, BS, 10);
  tu_tokens(t1, BS, 11);
  uint64_t h0, h1;
  uint32_t a = tu_register_new(p, BS, salt, 0, false, 10, &h0);
  uint32_t b = tu_register_new(p, BS, salt, h0, true, 11, &h1);
  assert_int_equal(log->n, 2);
  const tu_event *e = &log->ev[0];
  assert_int_equal(e->kind, KVBM_POOL_STORED);
  assert_int_equal(e->block_id, a);
  assert_int_equal(e->seq_hash, h0);
  assert_false(e->has_parent);
  assert_int_equal(e->salt_hash, salt);
  assert_int_equal(e->num_tokens, BS);
  assert_memory_equal(e->tokens, t0, sizeof t0);
  e = &log->ev[1];
  assert_int_equal(e->kind, KVBM_POOL_STORED);
  assert_int_equal(e->block_id, b);
  assert_int_equal(e->seq_hash, h1);
  assert_true(e->has_parent);
  assert_int_equal(e->parent_hash, h0);
  assert_int_equal(e->salt_hash, salt);
  assert_memory_equal(e->tokens, t1, sizeof t1);
  /* dedup: nothing */
  uint32_t d = tu_alloc1(p), out;
  assert_int_equal(kvbm_block_fill(p, d, salt, h0, true, t1, h1, &out), KVBM_OK);
  assert_int_equal(out, b);
  assert_int_equal(log->n, 2);
  /* release all (b twice: dedup took a reference), evict one, clear */
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, b, 0), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK);
  assert_int_equal(log->n, 2); /* releasing is not removing */
  uint32_t ids[2];
  assert_int_equal(kvbm_pool_alloc(p, 2, ids), KVBM_OK); /* free one, then b */
  assert_int_equal(ids[1], b);
  assert_int_equal(log->n, 3);
  assert_int_equal(log->ev[2].kind, KVBM_POOL_REMOVED);
  assert_int_equal(log->ev[2].block_id, b);
  assert_int_equal(log->ev[2].seq_hash, h1);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK); /* drops a: no REMOVED */
  assert_int_equal(log->n, 4);
  assert_int_equal(log->ev[3].kind, KVBM_POOL_CLEARED);
  assert_false(kvbm_pool_contains(p, h0));
  /* a replaced listener gets the rest; NULL stops them */
  tu_log *log2 = malloc(sizeof *log2);
  memset(log2, 0, sizeof *log2);
  kvbm_pool_set_listener(p, tu_listener, log2);
  uint32_t e2 = tu_register_new(p, BS, 0, 0, false, 50, NULL);
  assert_int_equal(log->n, 4);
  assert_int_equal(log2->n, 1);
  assert_int_equal(log2->ev[0].block_id, e2);
  kvbm_pool_set_listener(p, NULL, NULL);
  assert_int_equal(kvbm_block_release(p, e2, 0), KVBM_OK);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK);
  assert_int_equal(log2->n, 1);
  kvbm_pool_destroy(p);
  free(log);
  free(log2);
}

/* The listener's user pointer is passed through. */
typedef struct counter {
  int stored, removed, cleared;
} counter;
static void count_events(void *user, const kvbm_pool_event *ev) {
  counter *c = user;
  if (ev->kind == KVBM_POOL_STORED) c->stored++;
  if (ev->kind == KVBM_POOL_REMOVED) c->removed++;
  if (ev->kind == KVBM_POOL_CLEARED) c->cleared++;
}

static void test_listener_counts(void **state) {
  (void)state;
  counter cnt = {0, 0, 0};
  kvbm_pool_config cfg = kvbm_pool_config_default(4, BS);
  cfg.listener = count_events;
  cfg.listener_user = &cnt;
  kvbm_pool *p;
  assert_int_equal(kvbm_pool_create(&cfg, &p, NULL), KVBM_OK);
  for (int round = 0; round < 10; round++) {
    for (int i = 0; i < 4; i++) {
      uint32_t id = tu_register_new(p, BS, 0, 0, false, (uint32_t)(round * 4 + i), NULL);
      assert_int_equal(kvbm_block_release(p, id, 0), KVBM_OK);
    }
  }
  /* 40 stored; every round after the first evicted 4 */
  assert_int_equal(cnt.stored, 40);
  assert_int_equal(cnt.removed, 36);
  assert_int_equal((int)tu_stats(p).evicted, 36);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK);
  assert_int_equal(cnt.cleared, 1);
  kvbm_pool_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_register_then_match),
      cmocka_unit_test(test_match_id),
      cmocka_unit_test(test_demote),
      cmocka_unit_test(test_dedup_active),
      cmocka_unit_test(test_dedup_cached),
      cmocka_unit_test(test_dedup_shared_duplicate),
      cmocka_unit_test(test_allow_duplicates),
      cmocka_unit_test(test_commit_hash_native),
      cmocka_unit_test(test_commit_hash_dynamo),
      cmocka_unit_test(test_fill_equals_steps),
      cmocka_unit_test(test_registry_collisions),
      cmocka_unit_test(test_free_before_cached),
      cmocka_unit_test(test_eviction_order),
      cmocka_unit_test(test_batch_eviction_order),
      cmocka_unit_test(test_tail_first),
      cmocka_unit_test(test_match_reactivates),
      cmocka_unit_test(test_shared_release),
      cmocka_unit_test(test_evict_one), cmocka_unit_test(test_clear_cache),
      cmocka_unit_test(test_fill_run),
      cmocka_unit_test(test_fill_run_evicts_before_lookup),
      cmocka_unit_test(test_keep_tokens_off),
      cmocka_unit_test(test_peek),
      cmocka_unit_test(test_evict_where),
      cmocka_unit_test(test_listener_sequence),
      cmocka_unit_test(test_listener_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
