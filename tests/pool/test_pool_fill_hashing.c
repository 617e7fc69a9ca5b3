/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pool_fill_hashing.c: kvbm__pool_fill_run_hashing (pool/pool_internal.h),
 * the prefill run that hashes its blocks itself, a few ahead of filling them.
 *
 * What it promises is "the same as hashing first and calling
 * kvbm_pool_fill_run_group": so two twin pools take the same random runs,
 * one through each path, and must agree on every hash written, every id
 * returned, every event (in order), every block's info and the stats,
 * while runs evict, deduplicate onto cached and active blocks, and chain
 * from a parent. Both schemes, with and without salt, one group and two,
 * runs shorter and longer than the hashing distance, releases at three
 * priorities. The same again with B quiet (no listener, no token copies:
 * the loop a replay runs, pool.c's fill_run_plain with one group) against
 * A on the general path (a listener), events compared on A only; its
 * cursor walks lists that empty and switch priority, and its
 * dedups leave the loop for the general path; and with every hash homed
 * in one bucket (chains that overflow and wrap). Then the refusals:
 * NULL arrays, a group past the list, more blocks than available, each
 * with no change and no hash written.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pool/pool_internal.h"
#include "pool_testutil.h"

/* BS: the block size of most cases; MAXBS: the largest any case uses (16:
 * the plain loop has an instance of its own for blocks of 16 tokens). */
enum { NB = 48, BS = 4, MAXBS = 16, MAXRUN = 24 };

static uint32_t rnd(uint32_t *x) { return (*x = *x * 1103515245u + 12345u) >> 8; }

/* A pool of the test's shape. `quiet`: no listener, no token copies (the
 * recorder still gets zeroed, and stays empty). */
static kvbm_pool *twin(kvbm_hash_scheme scheme, uint32_t groups, tu_log *log, bool quiet,
                       bool keep_tokens, uint32_t bs) {
  kvbm_pool_config c = kvbm_pool_config_default(NB, bs);
  c.scheme = scheme;
  c.num_groups = groups;
  c.keep_tokens = keep_tokens;
  memset(log, 0, sizeof *log);
  if (!quiet) {
    c.listener = tu_listener;
    c.listener_user = log;
  }
  kvbm_pool *p = NULL;
  assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_OK);
  return p;
}

static void assert_same_pools(const kvbm_pool *a, const kvbm_pool *b, const tu_log *la,
                              const tu_log *lb) {
  tu_snap *sa = tu_snap_new(a);
  tu_assert_unchanged(b, sa);
  free(sa);
  assert_false(la->overflow);
  assert_int_equal(la->n, lb->n);
  for (size_t i = 0; i < la->n; i++) {
    assert_int_equal(la->ev[i].kind, lb->ev[i].kind);
    assert_int_equal(la->ev[i].block_id, lb->ev[i].block_id);
    assert_int_equal(la->ev[i].seq_hash, lb->ev[i].seq_hash);
    assert_int_equal(la->ev[i].parent_hash, lb->ev[i].parent_hash);
    assert_int_equal(la->ev[i].salt_hash, lb->ev[i].salt_hash);
    assert_int_equal(la->ev[i].has_parent, lb->ev[i].has_parent);
    assert_memory_equal(la->ev[i].tokens, lb->ev[i].tokens, sizeof la->ev[i].tokens);
  }
}

/* One configuration: 400 random runs on twin pools. Each block's tokens
 * are one of two contents and parents one of four, so that runs often
 * repeat a previous prefix and registers deduplicate (500-ish of them);
 * runs hold their blocks for a while, so some dedups land on active
 * blocks, and allocations evict (3000-ish). */
/* `quiet`: B has no listener and neither keeps tokens. */
static void twins_agree_bs(kvbm_hash_scheme scheme, uint64_t salt, uint32_t groups, bool quiet, uint32_t bs) {
  tu_log *la = malloc(sizeof *la), *lb = malloc(sizeof *lb);
  assert_non_null(la);
  assert_non_null(lb);
  kvbm_pool *a = twin(scheme, groups, la, false, !quiet, bs), *b = twin(scheme, groups, lb, quiet, !quiet, bs);
  uint32_t held_a[4][MAXRUN], held_b[4][MAXRUN];
  size_t held_n[4] = {0};
  uint32_t x = 12345u + (uint32_t)salt + groups;
  uint64_t dedups = 0, evictions = 0;
  for (int round = 0; round < 400; round++) {
    const size_t slot = rnd(&x) % 4;
    /* release what this slot held (tail first), in both, at one of three
     * priorities (so that evictions drain one list and go on to the next) */
    const uint8_t prio = (uint8_t)(rnd(&x) % 3 * 7);
    assert_int_equal(kvbm_pool_release_run(a, held_a[slot], held_n[slot], prio), KVBM_OK);
    assert_int_equal(kvbm_pool_release_run(b, held_b[slot], held_n[slot], prio), KVBM_OK);
    held_n[slot] = 0;
    size_t n = 1 + rnd(&x) % MAXRUN;
    if (n > kvbm_pool_available(a)) n = kvbm_pool_available(a);
    if (n == 0) continue;
    uint32_t toks[MAXRUN * MAXBS];
    for (size_t k = 0; k < n; k++) { /* each block one of two contents */
      const uint32_t v = rnd(&x) % 2;
      for (size_t i = 0; i < bs; i++) toks[k * bs + i] = v + (uint32_t)i;
    }
    const uint32_t g = groups > 1 ? rnd(&x) % groups : 0;
    const bool has_parent = rnd(&x) % 3 == 0;
    const uint64_t parent = has_parent ? 0x1234567890ull + rnd(&x) % 4 : 0;
    uint64_t ha[MAXRUN], hb[MAXRUN + 1];
    /* A: the hashes first, then the run */
    uint64_t h = parent;
    for (size_t k = 0; k < n; k++) {
      h = kvbm_hash_next(scheme, salt, h, k > 0 || has_parent, toks + k * bs, bs);
      ha[k] = h;
    }
    kvbm_pool_stats before;
    kvbm_pool_stats_get(a, &before);
    assert_int_equal(kvbm_pool_fill_run_group(a, g, salt, parent, has_parent, toks, ha, n, NULL,
                                              held_a[slot]),
                     KVBM_OK);
    /* B: the run hashes; the word after the last must stay untouched */
    hb[n] = 0xfeedfacecafef00dull;
    assert_int_equal(kvbm__pool_fill_run_hashing(b, g, salt, parent, has_parent, toks, hb, n, NULL,
                                                 held_b[slot]),
                     KVBM_OK);
    held_n[slot] = n;
    assert_memory_equal(ha, hb, n * sizeof *ha);
    assert_int_equal(hb[n], 0xfeedfacecafef00dull);
    assert_memory_equal(held_a[slot], held_b[slot], n * sizeof *held_a[slot]);
    kvbm_pool_stats after;
    kvbm_pool_stats_get(a, &after);
    dedups += after.dedup - before.dedup;
    evictions += after.evicted - before.evicted;
    if (quiet) {
      assert_int_equal(lb->n, 0);
      lb->n = la->n; /* B heard nothing: compare the pools alone */
      memcpy(lb->ev, la->ev, la->n * sizeof *la->ev);
    }
    assert_same_pools(a, b, la, lb);
    la->n = lb->n = 0;
  }
  /* the runs did what they are there for */
  assert_true(dedups > 20);
  assert_true(evictions > 20);
  kvbm_pool_destroy(a);
  kvbm_pool_destroy(b);
  free(la);
  free(lb);
}

static void twins_agree(kvbm_hash_scheme scheme, uint64_t salt, uint32_t groups, bool quiet) {
  twins_agree_bs(scheme, salt, groups, quiet, BS);
}

/* One run of n blocks into the twins of a quiet-B pair (A through the
 * public call on the general path, B through the hashing fill B's replay
 * runs): the same hashes and ids, then the pools compared alone (B keeps
 * no events: A's stand in for them). The stats of A before and after. */
static void quiet_twin_fill(kvbm_pool *a, kvbm_pool *b, tu_log *la, tu_log *lb, const uint32_t *toks,
                            uint64_t *ha, uint64_t *hb, size_t n, uint32_t *ids_a, uint32_t *ids_b,
                            kvbm_pool_stats *before, kvbm_pool_stats *after) {
  kvbm_pool_stats_get(a, before);
  assert_int_equal(kvbm_pool_fill_run_group(a, 0, 0, 0, false, toks, ha, n, NULL, ids_a), KVBM_OK);
  assert_int_equal(kvbm__pool_fill_run_hashing(b, 0, 0, 0, false, toks, hb, n, NULL, ids_b), KVBM_OK);
  assert_memory_equal(ha, hb, n * sizeof *ha);
  assert_memory_equal(ids_a, ids_b, n * sizeof *ids_a);
  kvbm_pool_stats_get(a, after);
  lb->n = la->n;
  memcpy(lb->ev, la->ev, la->n * sizeof *la->ev);
  assert_same_pools(a, b, la, lb);
}


static void native_plain(void **state) {
  (void)state;
  twins_agree(KVBM_HASH_NATIVE, 0, 1, false);
}
static void native_salted_two_groups(void **state) {
  (void)state;
  twins_agree(KVBM_HASH_NATIVE, 0xabcdefull, 2, false);
}
static void dynamo_plain(void **state) {
  (void)state;
  twins_agree(KVBM_HASH_DYNAMO, 0, 1, false);
}
static void dynamo_salted_two_groups(void **state) {
  (void)state;
  twins_agree(KVBM_HASH_DYNAMO, 0x5a17ull, 2, false);
}
static void quiet_native_plain(void **state) {
  (void)state;
  twins_agree(KVBM_HASH_NATIVE, 0, 1, true);
}
static void quiet_native_salted(void **state) {
  (void)state;
  twins_agree(KVBM_HASH_NATIVE, 0xabcdefull, 1, true);
}
static void quiet_native_plain_16(void **state) { /* the plain loop's instance for blocks of 16 */
  (void)state;
  twins_agree_bs(KVBM_HASH_NATIVE, 0, 1, true, 16);
  twins_agree_bs(KVBM_HASH_NATIVE, 0xabcdefull, 1, true, 16);
}
static void quiet_dynamo_plain(void **state) { /* the plain loop's Dynamo instance */
  (void)state;
  twins_agree(KVBM_HASH_DYNAMO, 0x5a17ull, 1, true);
}
static void quiet_dynamo_two_groups(void **state) {
  (void)state;
  twins_agree(KVBM_HASH_DYNAMO, 0x5a17ull, 2, true);
}

/* The quiet twins again, with every hash homed in the registry's last
 * bucket: tokens searched block by block until the chained hash's home
 * (pool_testutil.h's copy of the pool's formula) is that bucket, so that
 * entries overflow into the next buckets and wrap round the table's end,
 * and the plain loop's lookups, inserts and erases walk those chains. Runs
 * are prefixes of four such prompts, so registers dedup too. */
static void quiet_colliding(void **state) {
  (void)state;
  enum { NPROMPT = 4 };
  const uint32_t last = (1u << tu_table_bits(NB)) - 1;
  static uint32_t prompt[NPROMPT][MAXRUN * BS];
  for (size_t q = 0; q < NPROMPT; q++) {
    uint64_t parent = 0;
    for (size_t k = 0; k < MAXRUN; k++) {
      uint32_t *t = prompt[q] + k * BS;
      for (size_t i = 0; i < BS; i++) t[i] = (uint32_t)(q * 1000 + i);
      uint64_t h;
      for (t[0] = 0;; t[0]++) { /* ~32 tries a block */
        h = kvbm_hash_next(KVBM_HASH_NATIVE, 0, parent, k > 0, t, BS);
        if (tu_home_of(NB, h) == last) break;
      }
      parent = h;
    }
  }
  tu_log *la = malloc(sizeof *la), *lb = malloc(sizeof *lb);
  assert_non_null(la);
  assert_non_null(lb);
  kvbm_pool *a = twin(KVBM_HASH_NATIVE, 1, la, false, false, BS), *b = twin(KVBM_HASH_NATIVE, 1, lb, true, false, BS);
  uint32_t held_a[4][MAXRUN], held_b[4][MAXRUN];
  size_t held_n[4] = {0};
  uint32_t x = 777u, most_registered = 0;
  uint64_t dedups = 0, evictions = 0;
  for (int round = 0; round < 400; round++) {
    const size_t slot = rnd(&x) % 4;
    const uint8_t prio = (uint8_t)(rnd(&x) % 2 * 5);
    assert_int_equal(kvbm_pool_release_run(a, held_a[slot], held_n[slot], prio), KVBM_OK);
    assert_int_equal(kvbm_pool_release_run(b, held_b[slot], held_n[slot], prio), KVBM_OK);
    held_n[slot] = 0;
    size_t n = 1 + rnd(&x) % MAXRUN;
    if (n > kvbm_pool_available(a)) n = kvbm_pool_available(a);
    if (n == 0) continue;
    const uint32_t *toks = prompt[rnd(&x) % NPROMPT];
    uint64_t ha[MAXRUN], hb[MAXRUN];
    kvbm_hash_chain(KVBM_HASH_NATIVE, 0, toks, n * BS, BS, ha, MAXRUN);
    kvbm_pool_stats before, after;
    quiet_twin_fill(a, b, la, lb, toks, ha, hb, n, held_a[slot], held_b[slot], &before, &after);
    held_n[slot] = n;
    dedups += after.dedup - before.dedup;
    evictions += after.evicted - before.evicted;
    if (after.registered > most_registered) most_registered = after.registered;
    la->n = lb->n = 0;
  }
  assert_true(dedups > 20);
  assert_true(evictions > 20);
  assert_true(most_registered > 3 * 7); /* one home bucket: chains of 4+ buckets */
  kvbm_pool_destroy(a);
  kvbm_pool_destroy(b);
  free(la);
  free(lb);
}

/* Long runs (up to 200 blocks, far past the plain loop's hashing and
 * prefetch distances) that empty a priority's list mid-run (three
 * priorities). Each run's blocks share one content up to a random block
 * and take one of two contents after it, so the shared prefix dedups
 * (the plain loop leaves for the general path there) and the random
 * tails are fresh stretches of many blocks. Written for session 12's
 * chunked loop (measured slower and dropped, docs/areas/pool-speed.md);
 * kept for the fused loop. The twins
 * must agree as in twins_agree: blocks, hashes, ids and stats. */
enum { LNB = 256, LRUN = 200 }; /* LNB: the most pool_testutil.h snapshots */
static void long_runs(void **state) {
  (void)state;
  kvbm_pool_config c = kvbm_pool_config_default(LNB, BS);
  c.keep_tokens = false; /* B: the plain loop (no listener, no token copies) */
  kvbm_pool *b = NULL, *a = NULL;
  assert_int_equal(kvbm_pool_create(&c, &b, NULL), KVBM_OK);
  tu_log *la = malloc(sizeof *la), *lb = malloc(sizeof *lb);
  assert_non_null(la);
  assert_non_null(lb);
  memset(la, 0, sizeof *la);
  memset(lb, 0, sizeof *lb);
  c.listener = tu_listener; /* A on the general path */
  c.listener_user = la;
  assert_int_equal(kvbm_pool_create(&c, &a, NULL), KVBM_OK);
  static uint32_t held_a[3][LRUN], held_b[3][LRUN], toks[LRUN * BS];
  static uint64_t ha[LRUN], hb[LRUN];
  size_t held_n[3] = {0};
  uint32_t x = 4242u;
  uint64_t dedups = 0, evictions = 0, long_dedups = 0;
  for (int round = 0; round < 120; round++) {
    const size_t slot = rnd(&x) % 3;
    const uint8_t prio = (uint8_t)(rnd(&x) % 3 * 4);
    assert_int_equal(kvbm_pool_release_run(a, held_a[slot], held_n[slot], prio), KVBM_OK);
    assert_int_equal(kvbm_pool_release_run(b, held_b[slot], held_n[slot], prio), KVBM_OK);
    held_n[slot] = 0;
    size_t n = 1 + rnd(&x) % LRUN;
    if (n > kvbm_pool_available(a)) n = kvbm_pool_available(a);
    if (n == 0) continue;
    /* block k's content: one of two from a point on (a shared prefix
     * up to a random block, then a random tail) */
    const size_t split = rnd(&x) % (n + 1);
    for (size_t k = 0; k < n; k++) {
      const uint32_t v = k < split ? 0 : rnd(&x) % 2 + 1;
      for (size_t i = 0; i < BS; i++) toks[k * BS + i] = v * 7 + (uint32_t)(i + k % 5);
    }
    kvbm_hash_chain(KVBM_HASH_NATIVE, 0, toks, n * BS, BS, ha, LRUN);
    kvbm_pool_stats before, after;
    quiet_twin_fill(a, b, la, lb, toks, ha, hb, n, held_a[slot], held_b[slot], &before, &after);
    held_n[slot] = n;
    dedups += after.dedup - before.dedup;
    evictions += after.evicted - before.evicted;
    if (n > 64 && after.dedup > before.dedup) long_dedups++;
    la->n = lb->n = 0;
  }
  assert_true(dedups > 20);
  assert_true(evictions > 1000);
  assert_true(long_dedups > 5);
  kvbm_pool_destroy(a);
  kvbm_pool_destroy(b);
  free(la);
  free(lb);
}

/* Refused calls change nothing and write no hash. */
static void refusals_change_nothing(void **state) {
  (void)state;
  tu_log *log = malloc(sizeof *log);
  assert_non_null(log);
  kvbm_pool *p = twin(KVBM_HASH_NATIVE, 2, log, false, true, BS);
  uint32_t toks[8 * BS] = {0}, ids[NB + 1];
  uint64_t hashes[NB + 1];
  /* something registered and cached first, so that "no change" means something */
  uint64_t h0[4];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, toks, 4 * BS, BS, h0, 4);
  assert_int_equal(kvbm_pool_fill_run_group(p, 0, 0, 0, false, toks, h0, 4, NULL, ids), KVBM_OK);
  assert_int_equal(kvbm_pool_release_run(p, ids, 4, 0), KVBM_OK);
  log->n = 0;
  tu_snap *before = tu_snap_new(p);
  for (size_t i = 0; i < NB + 1; i++) hashes[i] = 7;
  assert_int_equal(kvbm__pool_fill_run_hashing(p, 0, 0, 0, false, NULL, hashes, 2, NULL, ids), KVBM_EINVAL);
  assert_int_equal(kvbm__pool_fill_run_hashing(p, 0, 0, 0, false, toks, NULL, 2, NULL, ids), KVBM_EINVAL);
  assert_int_equal(kvbm__pool_fill_run_hashing(p, 0, 0, 0, false, toks, hashes, 2, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm__pool_fill_run_hashing(p, 2, 0, 0, false, toks, hashes, 2, NULL, ids), KVBM_EINVAL);
  assert_int_equal(kvbm__pool_fill_run_hashing(p, 0, 0, 0, false, toks, hashes, NB + 1, NULL, ids),
                   KVBM_ENOSPC);
  for (size_t i = 0; i < NB + 1; i++) assert_int_equal(hashes[i], 7);
  tu_assert_unchanged(p, before);
  assert_int_equal(log->n, 0);
  /* n == 0 with NULL arrays is an empty run */
  assert_int_equal(kvbm__pool_fill_run_hashing(p, 0, 0, 0, false, NULL, NULL, 0, NULL, NULL), KVBM_OK);
  tu_assert_unchanged(p, before);
  free(before);
  kvbm_pool_destroy(p);
  free(log);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(native_plain),
      cmocka_unit_test(native_salted_two_groups),
      cmocka_unit_test(dynamo_plain),
      cmocka_unit_test(dynamo_salted_two_groups),
      cmocka_unit_test(quiet_native_plain),
      cmocka_unit_test(quiet_native_salted),
      cmocka_unit_test(quiet_native_plain_16),
      cmocka_unit_test(quiet_dynamo_plain),
      cmocka_unit_test(quiet_dynamo_two_groups),
      cmocka_unit_test(quiet_colliding),
      cmocka_unit_test(long_runs),
      cmocka_unit_test(refusals_change_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
