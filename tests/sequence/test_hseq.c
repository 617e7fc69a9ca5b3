/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_hseq.c: a hybrid request (kvbm/hybrid.h) over a pool of groups.
 *
 * The tables a sliding window leaves null, the hit every group can serve
 * (and a window taking only its last blocks of it), a step that does not
 * fit refused with nothing changed (request and pool), a hit gone stale,
 * the release order (group 0 first, tail first: the first block evicted
 * afterwards is group 0's last), reuse by reset, and hostile arguments.
 * The decode paths: a token that opens a block refused with nothing
 * changed when the pool is short, and W1-hybrid's decode
 * (kvbm__hseq_decode, its block-edge and quiet steps) against the general
 * step, request by request over twin pools, every table, count and block
 * equal.
 * W1-hybrid (tests/workload/test_replay_hybrid.sh) checks the counts
 * against the Python reference on the bundled trace.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/hybrid.h"
#include "sequence/hseq_internal.h"

#define B 4

static kvbm_pool *mkpool(uint32_t n, uint32_t groups) {
  kvbm_pool_config c = kvbm_pool_config_default(n, B);
  c.num_groups = groups;
  kvbm_pool *p;
  assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_OK);
  return p;
}

static void toks(uint32_t *t, size_t n, uint32_t base) {
  for (size_t i = 0; i < n; i++) t[i] = base + (uint32_t)i;
}

static const kvbm_group_spec FULL_SW8[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}};

static size_t table(const kvbm_hseq *s, uint32_t g, const uint32_t **ids) {
  size_t n = 0;
  assert_int_equal(kvbm_hseq_table(s, g, ids, &n), KVBM_OK);
  return n;
}

static uint32_t active(kvbm_pool *p) {
  kvbm_pool_stats st;
  kvbm_pool_stats_get(p, &st);
  return st.active;
}

/* A window of 8 tokens over blocks of 4: once 21 tokens are computed, the
 * window needs tokens 14..20, so blocks 0..2 are null in its table; full
 * attention holds all 6. */
static void window_leaves_nulls(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(64, 2);
  kvbm_hseq *s;
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 2, 0, 64, &s, NULL), KVBM_OK);
  uint32_t t[24];
  toks(t, 24, 100);
  assert_int_equal(kvbm_hseq_step(s, t, 20, 20, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, t + 20, 1, 1, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, NULL, 0, 0, NULL), KVBM_EINVAL); /* nothing known left */
  assert_int_equal(kvbm_hseq_step(s, t + 21, 1, 1, NULL), KVBM_OK); /* 22 computed: skip 15 */
  const uint32_t *ids;
  assert_int_equal(table(s, 0, &ids), 6);
  for (size_t i = 0; i < 6; i++) assert_int_not_equal(ids[i], KVBM_HSEQ_NULL);
  assert_int_equal(table(s, 1, &ids), 6);
  /* at the last step's start 21 tokens were computed: 21 - 8 + 1 = 14
   * skipped tokens, blocks 0..2 */
  for (size_t i = 0; i < 3; i++) assert_int_equal(ids[i], KVBM_HSEQ_NULL);
  for (size_t i = 3; i < 6; i++) assert_int_not_equal(ids[i], KVBM_HSEQ_NULL);
  kvbm_hseq_group_stats st;
  assert_int_equal(kvbm_hseq_group_stats_get(s, 1, &st), KVBM_OK);
  assert_int_equal(st.held, 3);
  assert_int_equal(st.allocated, 6);
  assert_int_equal(active(p), 9);
  kvbm_hseq_destroy(s);
  assert_int_equal(active(p), 0);
  kvbm_pool_destroy(p);
}

/* A second request with the same prompt hits 12 of its 16 tokens (at most
 * L - 1, block-aligned); the window takes only the blocks covering the 7
 * tokens before 12 (blocks 1 and 2): block 0 is null. */
static void hit_every_group_serves(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(64, 2);
  kvbm_hseq *a, *b;
  uint32_t t[16];
  toks(t, 16, 7);
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 2, 0, 64, &a, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(a, t, 16, 16, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_hit_tokens(a), 0);
  const uint32_t *ia, *ib;
  table(a, 0, &ia);
  uint32_t a_full1 = ia[1];
  kvbm_hseq_destroy(a);
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 2, 0, 64, &b, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_append(b, t, 16, NULL), KVBM_OK);
  uint64_t hit = 0;
  assert_int_equal(kvbm_hseq_find_hit(b, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 12);
  assert_int_equal(kvbm_hseq_step(b, NULL, 0, 4, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_num_computed(b), 16);
  assert_int_equal(table(b, 0, &ib), 4);
  assert_int_equal(ib[1], a_full1); /* the cached block itself */
  assert_int_equal(table(b, 1, &ib), 4);
  assert_int_equal(ib[0], KVBM_HSEQ_NULL);
  assert_int_not_equal(ib[1], KVBM_HSEQ_NULL);
  assert_int_not_equal(ib[2], KVBM_HSEQ_NULL);
  assert_int_equal(kvbm_hseq_find_hit(b, NULL, NULL), KVBM_ESTATE); /* after the first step */
  /* a different salt hits nothing */
  assert_int_equal(kvbm_hseq_reset(b, 99), KVBM_OK);
  assert_int_equal(kvbm_hseq_append(b, t, 16, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_find_hit(b, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 0);
  kvbm_hseq_destroy(b);
  kvbm_pool_destroy(p);
}

/* A step needing more blocks than the pool has returns KVBM_ENOSPC and
 * changes nothing: tables, known tokens, the pool's counts. */
static void nospc_changes_nothing(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(8, 2);
  kvbm_hseq *s;
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 2, 0, 64, &s, NULL), KVBM_OK);
  uint32_t t[40];
  toks(t, 40, 1);
  assert_int_equal(kvbm_hseq_step(s, t, 12, 12, NULL), KVBM_OK); /* 3 + 3 blocks */
  kvbm_pool_stats before, after;
  kvbm_pool_stats_get(p, &before);
  const uint32_t *ids;
  uint32_t full_before[3];
  assert_int_equal(table(s, 0, &ids), 3);
  memcpy(full_before, ids, sizeof full_before);
  kvbm_error err = {0};
  /* 12 more tokens: 3 + 3 new blocks, the window gives back 1: 6 - 1 > 2 */
  assert_int_equal(kvbm_hseq_step(s, t + 12, 12, 12, &err), KVBM_ENOSPC);
  assert_non_null(strstr(err.msg, "more blocks"));
  kvbm_pool_stats_get(p, &after);
  assert_memory_equal(&before, &after, sizeof before);
  assert_int_equal(kvbm_hseq_num_tokens(s), 12);
  assert_int_equal(kvbm_hseq_num_computed(s), 12);
  assert_int_equal(table(s, 0, &ids), 3);
  assert_memory_equal(ids, full_before, sizeof full_before);
  assert_int_equal(table(s, 1, &ids), 3);
  for (size_t i = 0; i < 3; i++) assert_int_not_equal(ids[i], KVBM_HSEQ_NULL);
  /* 4 tokens fit: 1 + 1 new blocks, the window releasing block 0 */
  assert_int_equal(kvbm_hseq_step(s, t + 12, 4, 4, NULL), KVBM_OK);
  /* 8 more: 2 + 2 new; 1 block cached (the window's first), the window
   * gives back 1 more: 4 > 2, refused */
  assert_int_equal(kvbm_hseq_step(s, t + 16, 8, 8, NULL), KVBM_ENOSPC);
  /* 4 more: 1 + 1 new against the cached block and the window's block 1,
   * which this request alone holds: fits exactly */
  assert_int_equal(kvbm_hseq_step(s, t + 16, 4, 4, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_num_computed(s), 20);
  kvbm_hseq_destroy(s);
  assert_int_equal(active(p), 0);
  kvbm_pool_destroy(p);
}

/* The hit found, then its blocks evicted: the step refuses (KVBM_ESTATE),
 * holds nothing, and the next step looks again. */
static void stale_hit(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(32, 2);
  kvbm_hseq *s;
  uint32_t t[16];
  toks(t, 16, 3);
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 2, 0, 64, &s, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, t, 16, 16, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_reset(s, 0), KVBM_OK);
  assert_int_equal(active(p), 0);
  assert_int_equal(kvbm_hseq_append(s, t, 16, NULL), KVBM_OK);
  uint64_t hit;
  assert_int_equal(kvbm_hseq_find_hit(s, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 12);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, NULL, 0, 4, NULL), KVBM_ESTATE);
  assert_int_equal(active(p), 0);
  assert_int_equal(kvbm_hseq_num_computed(s), 0);
  assert_int_equal(kvbm_hseq_step(s, NULL, 0, 16, NULL), KVBM_OK); /* looks again: no hit */
  assert_int_equal(kvbm_hseq_hit_tokens(s), 0);
  kvbm_hseq_destroy(s);
  kvbm_pool_destroy(p);
}

/* Destroy gives group 0 back first, each table tail first: the cache is
 * LRU, so the first block evicted afterwards is group 0's last. */
static void release_order(void **state) {
  (void)state;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 100}};
  kvbm_pool *p = mkpool(8, 2);
  kvbm_hseq *s;
  uint32_t t[16];
  toks(t, 16, 50);
  assert_int_equal(kvbm_hseq_create(p, g, 2, 0, 16, &s, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, t, 16, 16, NULL), KVBM_OK);
  const uint32_t *ids;
  assert_int_equal(table(s, 0, &ids), 4);
  uint32_t last0 = ids[3], first0 = ids[0];
  assert_int_equal(table(s, 1, &ids), 4);
  uint32_t last1 = ids[3];
  kvbm_hseq_destroy(s);
  uint32_t got[5];
  assert_int_equal(kvbm_pool_alloc_group(p, 0, 1, got), KVBM_OK);
  assert_int_equal(got[0], last0);
  assert_int_equal(kvbm_pool_alloc_group(p, 0, 3, got + 1), KVBM_OK);
  assert_int_equal(got[3], first0);
  assert_int_equal(kvbm_pool_alloc_group(p, 0, 1, got + 4), KVBM_OK);
  assert_int_equal(got[4], last1);
  kvbm_pool_destroy(p);
}

static void hostile(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(16, 2);
  kvbm_hseq *s = NULL;
  kvbm_error err = {0};
  assert_int_equal(kvbm_hseq_create(NULL, FULL_SW8, 2, 0, 8, &s, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 1, 0, 8, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "groups"));
  kvbm_group_spec bad[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 0}};
  assert_int_equal(kvbm_hseq_create(p, bad, 2, 0, 8, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "group 1"));
  bad[1] = (kvbm_group_spec){(kvbm_group_kind)42, 0};
  assert_int_equal(kvbm_hseq_create(p, bad, 2, 0, 8, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "unknown kind"));
  bad[1] = (kvbm_group_spec){KVBM_GROUP_MAMBA, 5};
  assert_int_equal(kvbm_hseq_create(p, bad, 2, 0, 8, &s, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 2, 0, 0, &s, &err), KVBM_EINVAL);
  assert_null(s);
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 2, 0, 8, &s, &err), KVBM_OK);
  uint32_t t[9] = {0};
  assert_int_equal(kvbm_hseq_append(s, NULL, 3, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_hseq_append(s, t, 9, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "max_tokens"));
  assert_int_equal(kvbm_hseq_find_hit(s, NULL, &err), KVBM_EINVAL); /* no tokens */
  assert_int_equal(kvbm_hseq_step(s, t, 4, 5, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_hseq_num_tokens(s), 0); /* the append undone */
  assert_int_equal(kvbm_hseq_step(s, t, 4, 0, &err), KVBM_EINVAL);
  const uint32_t *ids;
  size_t n;
  assert_int_equal(kvbm_hseq_table(s, 2, &ids, &n), KVBM_EINVAL);
  kvbm_hseq_group_stats st;
  assert_int_equal(kvbm_hseq_group_stats_get(s, 2, &st), KVBM_EINVAL);
  assert_int_equal(kvbm_hseq_set_retention(NULL, KVBM_HSEQ_RETAIN_BOUNDARIES), KVBM_EINVAL);
  assert_int_equal(kvbm_hseq_set_retention(s, (kvbm_hseq_retention)7), KVBM_EINVAL);
  assert_int_equal(kvbm_hseq_set_retention(s, KVBM_HSEQ_RETAIN_BOUNDARIES), KVBM_OK);
  assert_int_equal(kvbm_hseq_set_retention(s, KVBM_HSEQ_RETAIN_ALL), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, t, 8, 8, &err), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, t, 1, 1, &err), KVBM_EINVAL); /* past max_tokens */
  /* its blocks were registered by one rule: no switching mid-request */
  assert_int_equal(kvbm_hseq_set_retention(s, KVBM_HSEQ_RETAIN_BOUNDARIES), KVBM_ESTATE);
  assert_int_equal(kvbm_hseq_reset(s, 0), KVBM_OK);
  assert_int_equal(kvbm_hseq_set_retention(s, KVBM_HSEQ_RETAIN_BOUNDARIES), KVBM_OK);
  kvbm_hseq_destroy(s);
  kvbm_hseq_destroy(NULL);
  assert_int_equal(active(p), 0);
  kvbm_pool_destroy(p);
}

/* Decoding token by token, a token that opens a block when the pool has
 * fewer free or cached blocks than groups (and the window gives back
 * nothing at that token) is refused, the request and the pool as they
 * were; once a block is given back the same step goes on. */
static void decode_edge_nospc(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(7, 2);
  uint32_t hog;
  assert_int_equal(kvbm_pool_alloc_group(p, 0, 1, &hog), KVBM_OK);
  kvbm_hseq *s;
  assert_int_equal(kvbm_hseq_create(p, FULL_SW8, 2, 0, 64, &s, NULL), KVBM_OK);
  uint32_t t[16];
  toks(t, 16, 5);
  assert_int_equal(kvbm_hseq_append(s, t, 16, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, NULL, 0, 8, NULL), KVBM_OK); /* 2 + 2 blocks, 2 free */
  /* tokens 8..11: 8 opens block 2 in both groups (0 free after), 11 fills
   * it and the window gives its block 0 back (cached) */
  for (int i = 0; i < 4; i++) assert_int_equal(kvbm_hseq_step(s, NULL, 0, 1, NULL), KVBM_OK);
  assert_int_equal(kvbm_pool_available(p), 1);
  kvbm_pool_stats before, after;
  kvbm_pool_stats_get(p, &before);
  const uint32_t *ids;
  uint32_t full_before[3], sw_before[3];
  assert_int_equal(table(s, 0, &ids), 3);
  memcpy(full_before, ids, sizeof full_before);
  assert_int_equal(table(s, 1, &ids), 3);
  memcpy(sw_before, ids, sizeof sw_before);
  kvbm_error err = {0};
  assert_int_equal(kvbm_hseq_step(s, NULL, 0, 1, &err), KVBM_ENOSPC); /* token 12 opens block 3 */
  assert_non_null(strstr(err.msg, "more blocks"));
  kvbm_pool_stats_get(p, &after);
  assert_memory_equal(&before, &after, sizeof before);
  assert_int_equal(kvbm_hseq_num_computed(s), 12);
  assert_int_equal(table(s, 0, &ids), 3);
  assert_memory_equal(ids, full_before, sizeof full_before);
  assert_int_equal(table(s, 1, &ids), 3);
  assert_memory_equal(ids, sw_before, sizeof sw_before);
  assert_int_equal(kvbm__hseq_decode(s, 1, NULL), KVBM_ENOSPC); /* the same through the driver's call */
  assert_int_equal(kvbm_hseq_num_computed(s), 12);
  assert_int_equal(kvbm_block_release(p, hog, 0), KVBM_OK);
  assert_int_equal(kvbm_hseq_step(s, NULL, 0, 1, NULL), KVBM_OK);
  assert_int_equal(table(s, 0, &ids), 4);
  assert_int_equal(table(s, 1, &ids), 4);
  assert_int_not_equal(ids[3], KVBM_HSEQ_NULL);
  kvbm_hseq_destroy(s);
  assert_int_equal(active(p), 0);
  kvbm_pool_destroy(p);
}

/* ---- W1-hybrid's decode against the general step ---- */

enum { TW_DOCS = 6, TW_DOC_LEN = 96, TW_MAX_OUT = 40, TW_REQS = 300 };

static uint32_t tw_rnd(uint32_t *x) { return (*x = *x * 1103515245u + 12345u) >> 8; }

static kvbm_pool *tw_pool(uint32_t blocks, uint32_t groups) {
  kvbm_pool_config c = kvbm_pool_config_default(blocks, B);
  c.num_groups = groups;
  c.keep_tokens = false; /* as W1-hybrid: the joint prefill pass runs */
  kvbm_pool *p;
  assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_OK);
  return p;
}

/* Both requests and both pools equal: the tables, each group's counts and
 * every block's record. */
static void tw_same(kvbm_pool *pa, kvbm_hseq *a, kvbm_pool *pb, kvbm_hseq *b, size_t ng) {
  assert_int_equal(kvbm_hseq_num_computed(a), kvbm_hseq_num_computed(b));
  assert_int_equal(kvbm_hseq_peak_held(a), kvbm_hseq_peak_held(b));
  for (uint32_t g = 0; g < ng; g++) {
    const uint32_t *ia, *ib;
    size_t na = table(a, g, &ia), nb = table(b, g, &ib);
    assert_int_equal(na, nb);
    if (na) assert_memory_equal(ia, ib, na * sizeof *ia);
    kvbm_hseq_group_stats sa, sb;
    assert_int_equal(kvbm_hseq_group_stats_get(a, g, &sa), KVBM_OK);
    assert_int_equal(kvbm_hseq_group_stats_get(b, g, &sb), KVBM_OK);
    assert_memory_equal(&sa, &sb, sizeof sa);
  }
  kvbm_pool_stats qa, qb;
  kvbm_pool_stats_get(pa, &qa);
  kvbm_pool_stats_get(pb, &qb);
  assert_memory_equal(&qa, &qb, sizeof qa);
  for (uint32_t id = 0; id < kvbm_pool_num_blocks(pa); id++) {
    kvbm_block_info x, y;
    assert_int_equal(kvbm_block_info_get(pa, id, &x), KVBM_OK);
    assert_int_equal(kvbm_block_info_get(pb, id, &y), KVBM_OK);
    assert_int_equal(x.state, y.state);
    assert_int_equal(x.refcount, y.refcount);
    assert_int_equal(x.num_tokens, y.num_tokens);
    assert_true(x.seq_hash == y.seq_hash && x.parent_hash == y.parent_hash && x.has_parent == y.has_parent);
    assert_int_equal(x.group, y.group);
  }
}

/* Random requests over a few shared documents (hits, dedups, evictions,
 * refusals in a pool of a few dozen blocks), each run twice: (a) every decode token
 * appended and stepped in one call (the general step), (b) the output
 * appended with the prompt and decoded by kvbm__hseq_decode (the quiet,
 * release-only and block-edge steps). Same status, and everything equal,
 * after every request. */
static unsigned tw_run(const kvbm_group_spec *groups, size_t ng, uint32_t blocks, uint32_t seed) {
  kvbm_pool *pa = tw_pool(blocks, (uint32_t)ng), *pb = tw_pool(blocks, (uint32_t)ng);
  kvbm_hseq *a, *b;
  const size_t cap = TW_DOC_LEN + TW_MAX_OUT + 8;
  assert_int_equal(kvbm_hseq_create(pa, groups, ng, 0, cap, &a, NULL), KVBM_OK);
  assert_int_equal(kvbm_hseq_create(pb, groups, ng, 0, cap, &b, NULL), KVBM_OK);
  uint32_t x = seed, t[TW_DOC_LEN + TW_MAX_OUT];
  unsigned refused = 0, decode_refused = 0, decoded = 0;
  for (int r = 0; r < TW_REQS; r++) {
    const uint32_t doc = tw_rnd(&x) % TW_DOCS, L = 1 + tw_rnd(&x) % TW_DOC_LEN, O = tw_rnd(&x) % TW_MAX_OUT;
    const uint32_t chunk = 1 + tw_rnd(&x) % 24;
    for (uint32_t i = 0; i < L; i++) t[i] = doc * 1000 + i;
    for (uint32_t i = 0; i < O; i++) t[L + i] = 0x80000000u | (uint32_t)r << 8 | i;
    assert_int_equal(kvbm_hseq_append(a, t, L, NULL), KVBM_OK);
    assert_int_equal(kvbm_hseq_append(b, t, L, NULL), KVBM_OK);
    uint64_t ha, hb;
    assert_int_equal(kvbm_hseq_find_hit(a, &ha, NULL), KVBM_OK);
    assert_int_equal(kvbm_hseq_find_hit(b, &hb, NULL), KVBM_OK);
    assert_int_equal(ha, hb);
    assert_int_equal(kvbm_hseq_append(b, t + L, O, NULL), KVBM_OK);
    int ra = KVBM_OK, rb = KVBM_OK;
    for (uint64_t c = ha; c < L && !ra && !rb; c += chunk) {
      const uint64_t n = L - c < chunk ? L - c : chunk;
      ra = kvbm_hseq_step(a, NULL, 0, n, NULL);
      rb = kvbm_hseq_step(b, NULL, 0, n, NULL);
      assert_int_equal(ra, rb);
    }
    if (!ra) {
      for (uint32_t m = 0; m < O && !ra; m++) ra = kvbm_hseq_step(a, t + L + m, 1, 1, NULL);
      rb = kvbm__hseq_decode(b, O, NULL);
      assert_int_equal(ra, rb);
      decoded += O;
      decode_refused += ra != KVBM_OK;
    }
    if (!ra) { /* then a step of a few tokens more, as an engine may take:
                * the decode left the same state behind */
      uint32_t more[8];
      const uint32_t k = 1 + tw_rnd(&x) % 8;
      for (uint32_t i = 0; i < k; i++) more[i] = 0x40000000u | (uint32_t)r << 8 | i;
      if (kvbm_hseq_num_tokens(a) + k <= cap) {
        ra = kvbm_hseq_step(a, more, k, k, NULL);
        rb = kvbm_hseq_step(b, more, k, k, NULL);
        assert_int_equal(ra, rb);
      }
    }
    assert_true(ra == KVBM_OK || ra == KVBM_ENOSPC); /* refused for room, never broken */
    refused += ra != KVBM_OK;
    tw_same(pa, a, pb, b, ng);
    assert_int_equal(kvbm_hseq_reset(a, 0), KVBM_OK);
    assert_int_equal(kvbm_hseq_reset(b, 0), KVBM_OK);
    tw_same(pa, a, pb, b, ng);
  }
  /* the run did what it is for: decode steps, and refusals */
  assert_true(decoded > 1000);
  assert_true(refused > 0 && refused < TW_REQS / 2);
  kvbm_hseq_destroy(a);
  kvbm_hseq_destroy(b);
  kvbm_pool_destroy(pa);
  kvbm_pool_destroy(pb);
  return decode_refused;
}

static void decode_matches_steps(void **state) {
  (void)state;
  unsigned at_decode = tw_run(FULL_SW8, 2, 34, 1);
  const kvbm_group_spec mix[4] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 6},
                                  {KVBM_GROUP_CHUNKED_LOCAL, 8}, {KVBM_GROUP_MAMBA, 0}};
  at_decode += tw_run(mix, 4, 42, 7);
  const kvbm_group_spec align[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_MAMBA_ALIGN, 0}};
  at_decode += tw_run(align, 2, 34, 3);
  assert_true(at_decode > 0); /* some refused at a decode token */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(window_leaves_nulls),   cmocka_unit_test(hit_every_group_serves),
      cmocka_unit_test(nospc_changes_nothing), cmocka_unit_test(stale_hit),
      cmocka_unit_test(release_order),         cmocka_unit_test(hostile),
      cmocka_unit_test(decode_edge_nospc),     cmocka_unit_test(decode_matches_steps),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
