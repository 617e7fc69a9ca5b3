/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_psim.c: the policy simulator's eviction policies on hand-made
 * sequences (order, tail first, pins, scan resistance, ghosts), Belady
 * never beaten by an online policy on random sequences, and whole runs on
 * generated traces: no lower tiers equals W1, the bound is never beaten,
 * with unbounded tiers every policy that writes everything gets every
 * reuse, and the advisor-guided policy moves blocks through hints.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "workload/psim.h"
#include "workload/psim_cache.h"
#include "workload/trace.h"
#include "workload/tracegen.h"
#include "workload/w1.h"

static kvsim_psim_cache *make(kvsim_psim_evict k, uint32_t cap) {
  kvsim_psim_cache *c = NULL;
  assert_int_equal(kvsim_psim_cache_create(k, cap, 1000, &c), KVBM_OK);
  return c;
}

static void test_lru_order(void **state) {
  (void)state;
  for (int tail = 0; tail < 2; tail++) {
    kvsim_psim_cache *c = make(KVSIM_PSIM_EVICT_LRU, 4);
    kvsim_psim_cache_begin(c, tail);
    for (uint32_t id = 1; id <= 4; id++) assert_true(kvsim_psim_cache_insert(c, id, 0, NULL));
    kvsim_psim_cache_begin(c, false);
    uint32_t ev;
    assert_true(kvsim_psim_cache_insert(c, 5, 0, &ev));
    /* Head first (the manager): the request's first block goes first;
     * tail first: its deepest block. */
    assert_int_equal(ev, tail ? 4 : 1);
    /* A refreshed block becomes the newest. */
    kvsim_psim_cache_begin(c, false);
    kvsim_psim_cache_access(c, tail ? 3 : 2, 0);
    assert_true(kvsim_psim_cache_insert(c, 6, 0, &ev));
    assert_int_equal(ev, tail ? 2 : 3);
    kvsim_psim_cache_destroy(c);
  }
}

static void test_pins(void **state) {
  (void)state;
  for (kvsim_psim_evict k = 0; k < KVSIM_PSIM_EVICT_COUNT; k++) {
    kvsim_psim_cache *c = make(k, 2);
    kvsim_psim_cache_begin(c, false);
    assert_true(kvsim_psim_cache_insert(c, 1, 10, NULL));
    assert_true(kvsim_psim_cache_insert(c, 2, 20, NULL));
    uint32_t ev = 7;
    assert_false(kvsim_psim_cache_insert(c, 3, 5, &ev)); /* everything pinned by this commit */
    assert_int_equal(ev, KVSIM_PSIM_NONE);
    assert_int_equal(kvsim_psim_cache_size(c), 2);
    assert_int_equal(kvsim_psim_cache_evict(c), KVSIM_PSIM_NONE);
    kvsim_psim_cache_begin(c, false);
    assert_true(kvsim_psim_cache_insert(c, 3, 5, &ev));
    assert_true(ev == 1 || ev == 2);
    assert_false(kvsim_psim_cache_has(c, ev));
    assert_true(kvsim_psim_cache_has(c, 3));
    assert_false(kvsim_psim_cache_insert(c, 3, 5, NULL)); /* present: not inserted twice */
    kvsim_psim_cache_destroy(c);
  }
  kvsim_psim_cache *z = make(KVSIM_PSIM_EVICT_LRU, 0);
  assert_false(kvsim_psim_cache_insert(z, 1, 0, NULL));
  kvsim_psim_cache_destroy(z);
  kvsim_psim_cache *bad;
  assert_int_equal(kvsim_psim_cache_create(KVSIM_PSIM_EVICT_COUNT, 4, 10, &bad), KVBM_EINVAL);
  assert_int_equal(kvsim_psim_cache_create(KVSIM_PSIM_EVICT_LRU, 4, 0, &bad), KVBM_EINVAL);
}

/* A few hot ids used again and again, then a long scan of one-time ids:
 * the frequency-aware policies keep the hot ids, LRU does not. */
static void test_scan_resistance(void **state) {
  (void)state;
  kvsim_psim_evict kinds[] = {KVSIM_PSIM_EVICT_S3FIFO, KVSIM_PSIM_EVICT_ARC, KVSIM_PSIM_EVICT_WTINYLFU, KVSIM_PSIM_EVICT_LRU};
  for (size_t i = 0; i < 4; i++) {
    kvsim_psim_cache *c = make(kinds[i], 100);
    for (int round = 0; round < 4; round++)
      for (uint32_t id = 0; id < 5; id++) {
        kvsim_psim_cache_begin(c, false);
        if (kvsim_psim_cache_has(c, id)) kvsim_psim_cache_access(c, id, 0);
        else kvsim_psim_cache_insert(c, id, 0, NULL);
      }
    for (uint32_t id = 100; id < 700; id++) {
      kvsim_psim_cache_begin(c, false);
      kvsim_psim_cache_insert(c, id, 0, NULL);
    }
    int kept = 0;
    for (uint32_t id = 0; id < 5; id++) kept += kvsim_psim_cache_has(c, id);
    if (kinds[i] == KVSIM_PSIM_EVICT_LRU) assert_int_equal(kept, 0);
    else assert_int_equal(kept, 5);
    assert_true(kvsim_psim_cache_size(c) <= 100);
    kvsim_psim_cache_destroy(c);
  }
}

/* S3-FIFO: an id evicted from the small queue comes back into the main
 * queue (the ghost remembers it). */
static void test_s3fifo_ghost(void **state) {
  (void)state;
  kvsim_psim_cache *c = make(KVSIM_PSIM_EVICT_S3FIFO, 10);
  for (uint32_t id = 0; id < 11; id++) {
    kvsim_psim_cache_begin(c, false);
    kvsim_psim_cache_insert(c, id, 0, NULL);
  }
  assert_false(kvsim_psim_cache_has(c, 0)); /* one-hit, left through the small queue */
  kvsim_psim_cache_begin(c, false);
  kvsim_psim_cache_insert(c, 0, 0, NULL);
  /* Now in main: a scan through the small queue does not push it out. */
  for (uint32_t id = 20; id < 40; id++) {
    kvsim_psim_cache_begin(c, false);
    kvsim_psim_cache_insert(c, id, 0, NULL);
  }
  assert_true(kvsim_psim_cache_has(c, 0));
  kvsim_psim_cache_destroy(c);
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Demand caching (every miss inserted): Belady's hits are the most any
 * policy gets, on random skewed sequences and several capacities. */
static void test_belady_optimal(void **state) {
  (void)state;
  uint64_t seed = 12345;
  for (int trial = 0; trial < 20; trial++) {
    enum { N = 3000, IDS = 80 };
    static uint32_t seq[N];
    static uint64_t next[N];
    for (int i = 0; i < N; i++) { /* skewed: small ids more often */
      uint64_t r = rnd(&seed);
      seq[i] = (uint32_t)((r % IDS) * (r % IDS) / IDS);
    }
    for (int i = N; i-- > 0;) {
      next[i] = KVSIM_PSIM_KEY_NEVER;
      for (int j = i + 1; j < N; j++)
        if (seq[j] == seq[i]) {
          next[i] = (uint64_t)j;
          break;
        }
    }
    uint32_t cap = 4 + (uint32_t)(trial % 5) * 6;
    long hits[KVSIM_PSIM_EVICT_COUNT];
    for (kvsim_psim_evict k = 0; k < KVSIM_PSIM_EVICT_COUNT; k++) {
      kvsim_psim_cache *c = make(k, cap);
      hits[k] = 0;
      for (int i = 0; i < N; i++) {
        kvsim_psim_cache_begin(c, false);
        if (kvsim_psim_cache_has(c, seq[i])) {
          hits[k]++;
          kvsim_psim_cache_access(c, seq[i], next[i]);
        } else {
          assert_true(kvsim_psim_cache_insert(c, seq[i], next[i], NULL));
        }
        assert_true(kvsim_psim_cache_size(c) <= cap);
      }
      kvsim_psim_cache_destroy(c);
    }
    for (kvsim_psim_evict k = 0; k < KVSIM_PSIM_EVICT_COUNT; k++) {
      if (hits[k] > hits[KVSIM_PSIM_EVICT_BELADY])
        fail_msg("trial %d cap %u: %s %ld hits beat belady %ld", trial, cap, kvsim_psim_evict_name(k),
                 hits[k], hits[KVSIM_PSIM_EVICT_BELADY]);
    }
    assert_true(hits[KVSIM_PSIM_EVICT_BELADY] > hits[KVSIM_PSIM_EVICT_LRU]);
  }
}

/* ---- whole runs on a generated trace ---- */

static kvsim_trace *gen_trace(kvsim_tracegen_config g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  kvbm_error err = {0};
  assert_int_equal(kvsim_tracegen_write(&g, f, NULL, &err), KVBM_OK);
  fclose(f);
  kvsim_trace *t = NULL;
  assert_int_equal(kvsim_trace_parse(buf, len, 0, &t, &err), KVBM_OK);
  free(buf);
  return t;
}

static kvsim_tracegen_config small_chat(void) {
  kvsim_tracegen_config g = kvsim_tracegen_chat();
  g.requests = 600;
  g.session_rate = 4;
  g.think_s = 20;
  g.user_tokens = 600;
  g.max_context = 8192;
  return g;
}

/* The 1500-request chat trace's stream (with next uses or not), for the
 * whole-run tests; *t is the caller's to destroy after the stream. */
static kvsim_psim_stream *chat1500_stream(bool next_uses, kvsim_trace **t) {
  kvsim_tracegen_config g = small_chat();
  g.requests = 1500;
  *t = gen_trace(g);
  kvbm_error err = {0};
  kvsim_psim_stream *s = NULL;
  assert_int_equal(kvsim_psim_stream_build(*t, 0, 16, KVBM_HASH_NATIVE, next_uses, &s, &err), KVBM_OK);
  return s;
}

/* Capacities the 1500-request trace overflows at every tier. */
static void small_capacities(kvsim_psim_config *c) {
  c->tier[0].capacity = 2048;
  c->tier[1].capacity = 2048;
  c->tier[2].capacity = 4096;
}

static void test_no_lower_tiers_is_w1(void **state) {
  (void)state;
  kvsim_trace *t = gen_trace(small_chat());
  kvbm_error err = {0};
  kvsim_psim_stream *s;
  assert_int_equal(kvsim_psim_stream_build(t, 0, 16, KVBM_HASH_NATIVE, false, &s, &err), KVBM_OK);
  for (uint32_t cap = 4096; cap <= 16384; cap *= 2) {
    kvsim_w1_config w = kvsim_w1_config_default();
    w.capacity = cap;
    kvsim_w1_result want;
    assert_int_equal(kvsim_w1_run(t, &w, &want, &err), KVBM_OK);
    kvsim_psim_config c = kvsim_psim_config_default();
    c.tier[0].capacity = cap;
    c.tier[1].capacity = c.tier[2].capacity = 0;
    kvsim_psim_result got;
    assert_int_equal(kvsim_psim_run(s, &c, &got, &err), KVBM_OK);
    assert_int_equal(got.requests, want.requests);
    assert_int_equal(got.prompt_tokens, want.prompt_tokens);
    assert_int_equal(got.hit_tokens, want.hit_tokens);
    assert_int_equal(got.g1_allocated, want.blocks_allocated);
    assert_true(got.hit_tokens > 0);
  }
  kvsim_psim_stream_destroy(s);
  kvsim_trace_destroy(t);
}

static void test_bound_and_presets(void **state) {
  (void)state;
  kvsim_trace *t = gen_trace(small_chat());
  kvbm_error err = {0};
  kvsim_psim_stream *s;
  assert_int_equal(kvsim_psim_stream_build(t, 0, 16, KVBM_HASH_NATIVE, true, &s, &err), KVBM_OK);
  uint64_t caps[][3] = {{4096, 2048, 4096}, {4096, 8192, 16384}, {8192, 0, 30000}};
  for (size_t k = 0; k < 3; k++) {
    kvsim_psim_result res[16];
    int nres = 0, bound = -1;
    for (int i = 0; kvsim_psim_preset_names[i]; i++) {
      kvsim_psim_config c = kvsim_psim_config_default();
      for (int tt = 0; tt < 3; tt++) c.tier[tt].capacity = caps[k][tt];
      assert_true(kvsim_psim_preset(kvsim_psim_preset_names[i], &c));
      int rc = kvsim_psim_run(s, &c, &res[nres], &err);
      if (rc) fail_msg("%s: %s", kvsim_psim_preset_names[i], err.msg);
      if (!strcmp(kvsim_psim_preset_names[i], "belady")) bound = nres;
      uint64_t sum = 0;
      for (int tt = 0; tt < 3; tt++) sum += res[nres].tier[tt].hit_tokens;
      assert_int_equal(sum, res[nres].hit_tokens);
      nres++;
    }
    assert_true(bound >= 0);
    for (int i = 0; i < nres; i++)
      if (res[i].hit_tokens > res[bound].hit_tokens)
        fail_msg("%s beats the bound at G2 %llu G3 %llu: %llu > %llu", kvsim_psim_preset_names[i],
                 (unsigned long long)caps[k][1], (unsigned long long)caps[k][2],
                 (unsigned long long)res[i].hit_tokens, (unsigned long long)res[bound].hit_tokens);
  }
  /* Unbounded: write-through LRU keeps everything, and so does the bound:
   * both get every reuse there is. */
  kvsim_psim_config all = kvsim_psim_config_default(), bel = all;
  kvsim_psim_preset("today", &all);
  kvsim_psim_preset("belady", &bel);
  all.tier[1].capacity = bel.tier[1].capacity = 1u << 22;
  kvsim_psim_result ra, rb;
  assert_int_equal(kvsim_psim_run(s, &all, &ra, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &bel, &rb, &err), KVBM_OK);
  assert_int_equal(ra.hit_tokens, rb.hit_tokens);
  assert_int_equal(ra.tier[1].evictions, 0);
  kvsim_psim_stream_destroy(s);
  kvsim_trace_destroy(t);
}

/* G2's frequency filter has its own settings: threshold 1 admits every
 * use (write-through's writes), a higher one admits fewer, and G3's filter
 * (today's settings) is untouched by G2's: same G3 writes as today. */
static void test_g2_filter(void **state) {
  (void)state;
  kvsim_trace *t = gen_trace(small_chat());
  kvbm_error err = {0};
  kvsim_psim_stream *s;
  assert_int_equal(kvsim_psim_stream_build(t, 0, 16, KVBM_HASH_NATIVE, false, &s, &err), KVBM_OK);
  kvsim_psim_config today = kvsim_psim_config_default(), f1, f2, f3;
  today.tier[1].capacity = 2048;
  today.tier[2].capacity = 4096;
  assert_true(kvsim_psim_preset("lru-tail", &today));
  f1 = f2 = f3 = today;
  assert_true(kvsim_psim_preset("g2-freq", &f3));
  assert_int_equal(f3.tier[1].admit, KVSIM_PSIM_ADMIT_FREQUENCY);
  f1.tier[1].admit = f2.tier[1].admit = KVSIM_PSIM_ADMIT_FREQUENCY;
  f1.g2_freq_threshold = 1;
  f2.g2_freq_threshold = 2;
  kvsim_psim_result rt, r1, r2, r3;
  assert_int_equal(kvsim_psim_run(s, &today, &rt, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &f1, &r1, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &f2, &r2, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &f3, &r3, &err), KVBM_OK);
  assert_int_equal(r1.tier[1].written_blocks, rt.tier[1].written_blocks);
  assert_int_equal(r1.hit_tokens, rt.hit_tokens);
  assert_true(r2.tier[1].written_blocks < r1.tier[1].written_blocks);
  assert_true(r3.tier[1].written_blocks < r2.tier[1].written_blocks);
  assert_true(r3.tier[1].filtered > 0);
  assert_int_equal(r1.tier[2].written_blocks, rt.tier[2].written_blocks);
  assert_int_equal(r2.tier[2].written_blocks, rt.tier[2].written_blocks);
  assert_int_equal(r3.tier[2].written_blocks, rt.tier[2].written_blocks);
  kvsim_psim_stream_destroy(s);
  kvsim_trace_destroy(t);
}

/* The advisor-guided policy: the advisor sees the run's events and its
 * demotions write G3; with a G3 that takes nothing at commit, every G3
 * block came through a hint. */
static void test_advisor_guided(void **state) {
  (void)state;
  kvsim_trace *t;
  kvsim_psim_stream *s = chat1500_stream(false, &t);
  kvbm_error err = {0};
  kvsim_psim_config c = kvsim_psim_config_default();
  assert_true(kvsim_psim_preset("advisor", &c));
  c.tier[0].capacity = 2048;
  c.tier[1].capacity = 4096;
  c.tier[2].admit = KVSIM_PSIM_ADMIT_NEVER;
  c.advisor_period_ms = 2000;
  kvsim_psim_result r;
  assert_int_equal(kvsim_psim_run(s, &c, &r, &err), KVBM_OK);
  assert_true(r.advisor_events > 0);
  assert_true(r.advisor_hints > 0);
  assert_true(r.tier[1].demoted > 0);
  assert_true(r.tier[2].written_blocks > 0);
  assert_true(r.tier[2].written_blocks <= r.tier[1].demoted);
  assert_true(r.tier[2].hit_tokens > 0);
  /* The same without the advisor: G3 stays empty. */
  c.advisor = false;
  kvsim_psim_result r0;
  assert_int_equal(kvsim_psim_run(s, &c, &r0, &err), KVBM_OK);
  assert_int_equal(r0.tier[2].written_blocks, 0);
  assert_true(r.hit_tokens > r0.hit_tokens);
  kvsim_psim_stream_destroy(s);
  kvsim_trace_destroy(t);
}

/* TTL: an overdue resident goes first (the earliest expiry, then the
 * deepest), else the highest rank, then the furthest expiry, then the
 * deepest; the victim's key says "free" when it is overdue. */
static void test_ttl_cache(void **state) {
  (void)state;
  kvsim_psim_cache *c = make(KVSIM_PSIM_EVICT_TTL, 4);
  kvsim_psim_cache_set_now(c, 0);
  kvsim_psim_cache_begin(c, false);
  assert_true(kvsim_psim_cache_insert(c, 1, KVSIM_PSIM_TTL_KEY(0, 100, 0), NULL));
  assert_true(kvsim_psim_cache_insert(c, 2, KVSIM_PSIM_TTL_KEY(0, 100, 1), NULL));
  assert_true(kvsim_psim_cache_insert(c, 3, KVSIM_PSIM_TTL_KEY(0, 300, 0), NULL));
  assert_true(kvsim_psim_cache_insert(c, 4, KVSIM_PSIM_TTL_KEY(0, 200, 0), NULL));
  kvsim_psim_cache_begin(c, false);
  /* Nothing overdue: the furthest expiry is the victim. */
  assert_int_equal(kvsim_psim_cache_victim_key(c), KVSIM_PSIM_TTL_KEY(0, 300, 0));
  kvsim_psim_cache_set_now(c, 150);
  assert_int_equal(kvsim_psim_cache_victim_key(c), KVSIM_PSIM_KEY_NEVER); /* 1 and 2 are overdue */
  uint32_t ev;
  assert_true(kvsim_psim_cache_insert(c, 5, KVSIM_PSIM_TTL_KEY(0, 400, 0), &ev));
  assert_int_equal(ev, 2); /* the deeper of the two */
  kvsim_psim_cache_begin(c, false);
  assert_int_equal(kvsim_psim_cache_evict(c), 1);
  /* A refreshed key counts, not the old one: 3 now expires first. */
  kvsim_psim_cache_access(c, 4, KVSIM_PSIM_TTL_KEY(0, 500, 0));
  kvsim_psim_cache_begin(c, false);
  kvsim_psim_cache_set_now(c, 350);
  assert_int_equal(kvsim_psim_cache_evict(c), 3);
  /* None overdue: a higher rank goes before a later expiry. */
  kvsim_psim_cache_set_now(c, 0);
  assert_true(kvsim_psim_cache_insert(c, 6, KVSIM_PSIM_TTL_KEY(7, 10, 0), NULL));
  kvsim_psim_cache_begin(c, false);
  assert_int_equal(kvsim_psim_cache_evict(c), 6);
  assert_int_equal(kvsim_psim_cache_evict(c), 4); /* expiry 500 */
  assert_int_equal(kvsim_psim_cache_evict(c), 5);
  assert_int_equal(kvsim_psim_cache_evict(c), KVSIM_PSIM_NONE);
  kvsim_psim_cache_destroy(c);
}

/* The online TTL policies in whole runs: deterministic; sticky admission
 * writes less to G2 than write-through and leaves G3 (today's filter)
 * alone; a TTL shorter than the gap between requests makes every
 * resident overdue at each request, which is LRU (tail first); sticky,
 * turn and the ranks are refused on anything but ttl. */
static void test_ttl_runs(void **state) {
  (void)state;
  kvsim_trace *t;
  kvsim_psim_stream *s = chat1500_stream(false, &t);
  kvbm_error err = {0};
  kvsim_psim_config lru = kvsim_psim_config_default();
  assert_true(kvsim_psim_preset("lru-tail", &lru));
  small_capacities(&lru);
  kvsim_psim_config ttl_all = lru, sticky = lru, turn = lru;
  ttl_all.tier[1].evict = sticky.tier[1].evict = turn.tier[1].evict = KVSIM_PSIM_EVICT_TTL;
  ttl_all.ttl_s = 0.001;
  sticky.tier[1].admit = KVSIM_PSIM_ADMIT_STICKY;
  sticky.ttl_s = 60;
  turn.tier[1].admit = KVSIM_PSIM_ADMIT_TURN;
  turn.ttl_s = 60;
  turn.ttl_rank = KVSIM_PSIM_RANK_TURN;
  kvsim_psim_result rl, ra, rs, rs2, rt, rt2;
  assert_int_equal(kvsim_psim_run(s, &lru, &rl, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &ttl_all, &ra, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &sticky, &rs, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &sticky, &rs2, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &turn, &rt, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &turn, &rt2, &err), KVBM_OK);
  assert_true(rl.tier[1].hit_tokens > 0);
  assert_int_equal(ra.hit_tokens, rl.hit_tokens);
  assert_int_equal(ra.tier[1].hit_tokens, rl.tier[1].hit_tokens);
  assert_int_equal(ra.tier[1].written_blocks, rl.tier[1].written_blocks);
  assert_int_equal(rs.hit_tokens, rs2.hit_tokens);
  assert_int_equal(rs.tier[1].written_blocks, rs2.tier[1].written_blocks);
  assert_int_equal(rt.hit_tokens, rt2.hit_tokens);
  assert_int_equal(rt.tier[1].written_blocks, rt2.tier[1].written_blocks);
  assert_true(rs.tier[1].written_blocks < rl.tier[1].written_blocks);
  assert_true(rs.tier[1].filtered > 0);
  assert_true(rs.tier[1].hit_tokens > 0);
  assert_true(rt.tier[1].hit_tokens > 0);
  assert_int_equal(rs.tier[2].written_blocks, rl.tier[2].written_blocks);
  assert_int_equal(rt.tier[2].written_blocks, rl.tier[2].written_blocks);
  kvsim_psim_config bad = sticky;
  bad.tier[1].evict = KVSIM_PSIM_EVICT_LRU;
  assert_int_equal(kvsim_psim_run(s, &bad, &rs, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "needs ttl eviction"));
  bad = sticky;
  bad.ttl_s = 0;
  assert_int_equal(kvsim_psim_run(s, &bad, &rs, &err), KVBM_EINVAL);
  bad = sticky;
  bad.ttl_sigma = 0.0 / 0.0;
  assert_int_equal(kvsim_psim_run(s, &bad, &rs, &err), KVBM_EINVAL);
  bad = sticky;
  bad.ttl_rank = KVSIM_PSIM_RANK_COUNT;
  assert_int_equal(kvsim_psim_run(s, &bad, &rs, &err), KVBM_EINVAL);
  kvsim_psim_stream_destroy(s);
  kvsim_trace_destroy(t);
}

/* --eta-noise blurs the bound's next uses, per request: 0 is the bound
 * itself (the default), a positive sigma is deterministic, changes the
 * decisions and never gains on the bound here; out-of-range values are
 * refused by name. */
static void test_eta_noise(void **state) {
  (void)state;
  kvsim_trace *t;
  kvsim_psim_stream *s = chat1500_stream(true, &t);
  kvbm_error err = {0};
  kvsim_psim_config exact = kvsim_psim_config_default();
  assert_true(kvsim_psim_preset("today", &exact));
  small_capacities(&exact);
  exact.tier[1].evict = KVSIM_PSIM_EVICT_BELADY;
  exact.tier[1].admit = KVSIM_PSIM_ADMIT_CLAIRVOYANT;
  exact.tier[1].tail_first = true;
  assert_true(exact.eta_noise == 0);
  kvsim_psim_config zero = exact, noisy = exact, bound = exact;
  zero.eta_noise = 0.0;
  noisy.eta_noise = 1.0;
  kvsim_psim_result re, rz, rn, rn2;
  assert_int_equal(kvsim_psim_run(s, &exact, &re, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &zero, &rz, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &noisy, &rn, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &noisy, &rn2, &err), KVBM_OK);
  assert_int_equal(rz.hit_tokens, re.hit_tokens);
  assert_int_equal(rz.tier[1].written_blocks, re.tier[1].written_blocks);
  assert_true(re.tier[1].hit_tokens > 0);
  assert_int_equal(rn.hit_tokens, rn2.hit_tokens); /* deterministic */
  assert_int_equal(rn.tier[1].written_blocks, rn2.tier[1].written_blocks);
  assert_int_equal(rn.tier[1].evictions, rn2.tier[1].evictions);
  assert_true(rn.hit_tokens <= re.hit_tokens);
  assert_true(rn.hit_tokens != re.hit_tokens || rn.tier[1].written_blocks != re.tier[1].written_blocks);
  /* G3 is today's: the noise on G2 does not reach its writes' rule. */
  assert_int_equal(rn.tier[2].written_blocks, re.tier[2].written_blocks);
  /* The whole bound (every tier belady) with noise stays below it. */
  assert_true(kvsim_psim_preset("belady", &bound));
  bound.tier[0].capacity = 2048;
  bound.tier[1].capacity = 2048;
  bound.tier[2].capacity = 4096;
  kvsim_psim_config nb = bound;
  nb.eta_noise = 2.0;
  kvsim_psim_result rb, rnb;
  assert_int_equal(kvsim_psim_run(s, &bound, &rb, &err), KVBM_OK);
  assert_int_equal(kvsim_psim_run(s, &nb, &rnb, &err), KVBM_OK);
  assert_true(rnb.hit_tokens < rb.hit_tokens);
  const double bad[] = {-1.0, 64.5, 1e300 * 1e300, 0.0 / 0.0};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    kvsim_psim_config c = exact;
    c.eta_noise = bad[k];
    err.msg[0] = 0;
    assert_int_equal(kvsim_psim_run(s, &c, &rn, &err), KVBM_EINVAL);
    assert_non_null(strstr(err.msg, "eta noise"));
  }
  kvsim_psim_stream_destroy(s);
  kvsim_trace_destroy(t);
}

static void test_bad_configs(void **state) {
  (void)state;
  kvsim_trace *t = gen_trace(small_chat());
  kvbm_error err = {0};
  kvsim_psim_stream *s;
  assert_int_equal(kvsim_psim_stream_build(t, 50, 0, KVBM_HASH_NATIVE, false, &s, &err), KVBM_EINVAL);
  assert_int_equal(kvsim_psim_stream_build(t, 50, 16, KVBM_HASH_NATIVE, false, &s, &err), KVBM_OK);
  kvsim_psim_result r;
  kvsim_psim_config c = kvsim_psim_config_default();
  assert_true(kvsim_psim_preset("belady", &c));
  assert_int_equal(kvsim_psim_run(s, &c, &r, &err), KVBM_EINVAL); /* no next uses */
  assert_non_null(strstr(err.msg, "next uses"));
  c = kvsim_psim_config_default();
  c.tier[0].evict = KVSIM_PSIM_EVICT_ARC;
  assert_int_equal(kvsim_psim_run(s, &c, &r, &err), KVBM_EINVAL);
  c = kvsim_psim_config_default();
  c.tier[0].capacity = 0;
  assert_int_equal(kvsim_psim_run(s, &c, &r, &err), KVBM_EINVAL);
  c = kvsim_psim_config_default();
  c.tier[0].capacity = 8;
  assert_int_equal(kvsim_psim_run(s, &c, &r, &err), KVBM_ENOSPC);
  c = kvsim_psim_config_default();
  c.tier[1].admit = KVSIM_PSIM_ADMIT_VICTIM;
  assert_int_equal(kvsim_psim_run(s, &c, &r, &err), KVBM_EINVAL);
  kvsim_psim_config p;
  assert_false(kvsim_psim_preset("nope", &p));
  kvsim_psim_stream_destroy(s);
  kvsim_trace_destroy(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lru_order),          cmocka_unit_test(test_pins),
      cmocka_unit_test(test_scan_resistance),    cmocka_unit_test(test_s3fifo_ghost),
      cmocka_unit_test(test_belady_optimal),     cmocka_unit_test(test_no_lower_tiers_is_w1),
      cmocka_unit_test(test_bound_and_presets),  cmocka_unit_test(test_advisor_guided),
      cmocka_unit_test(test_bad_configs),        cmocka_unit_test(test_g2_filter),
      cmocka_unit_test(test_eta_noise),          cmocka_unit_test(test_ttl_cache),
      cmocka_unit_test(test_ttl_runs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
