/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_index_groups.c: the router's index for hybrid models (several KV
 * cache groups, include/kvbm/router.h "Hybrid models").
 *
 * Events carrying group_idx and kv_cache_spec_kind go through the real
 * codec (kvbm_event_encode, map form as vLLM sends it, then
 * kvbm_event_decode) into the index. Cases: a worker holding only the
 * full-attention blocks of a prefix scores 0 for a full + sliding window
 * model; a sliding-window group needs only its window's blocks; Mamba
 * needs its state at the hit's boundary; groups learned from the events'
 * kinds; tiers; hostile group_idx refused and counted; snapshots keep
 * groups, refuse a hostile group byte and still load version 1; and a
 * randomized check of every tier's overlap against kvbm_groups_hit over
 * the same holdings kept in plain arrays; readers looking a hybrid worker
 * up while the writer changes its groups and blocks (run under
 * ThreadSanitizer too).
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/event_codec.h"
#include "kvbm/group.h"
#include "kvbm/router.h"

#define MAXW KVBM_ROUTER_MAX_WORKERS
#define BS 16

static uint64_t H[64];

static int setup(void **state) {
  (void)state;
  for (int i = 0; i < 64; i++) H[i] = 0x1000u + (uint64_t)i * 7919u;
  return 0;
}

static kvbm_index *mk(const char *groups, bool recompute) {
  kvbm_group_spec gs[KVBM_GROUPS_MAX];
  size_t n = 0;
  kvbm_index_config c = kvbm_index_config_default();
  c.block_size = BS;
  c.recompute = recompute;
  c.expected_blocks = 64;
  if (groups) {
    assert_int_equal(kvbm_groups_parse(groups, gs, KVBM_GROUPS_MAX, &n, NULL), KVBM_OK);
    c.groups = gs;
    c.num_groups = n;
  }
  kvbm_index *idx;
  kvbm_error err;
  if (kvbm_index_create(&c, &idx, &err)) fail_msg("create: %s", err.msg);
  return idx; /* gs may go: the index copied it */
}

/* One BlockStored of blocks [from, to) of H in group g, with its kind. */
static kvbm_event st(size_t from, size_t to, int64_t g, const char *kind, int64_t window,
                     kvbm_medium m) {
  kvbm_event e = {.type = KVBM_EVENT_STORED, .block_hashes = H + from,
                  .num_block_hashes = to - from, .medium = m, .block_size = BS,
                  .group_idx = g, .has_group_idx = true, .kv_cache_spec_kind = kind};
  if (from) e.parent_hash = H[from - 1], e.has_parent = true;
  if (window) e.sliding_window = window, e.has_sliding_window = true;
  return e;
}

/* The events through vLLM's wire (map form) and into the index. */
static int wire_apply(kvbm_index *idx, uint64_t wid, const kvbm_event *evs, size_t n,
                      kvbm_error *err) {
  kvbm_event_encoder_config ec = kvbm_event_encoder_config_default();
  ec.form = KVBM_FORM_MAP;
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_encoder_create(&ec, &enc, NULL), KVBM_OK);
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  kvbm_event_batch b = {.ts = 1.0, .events = evs, .num_events = n};
  const uint8_t *data;
  size_t len;
  kvbm_error e2;
  if (kvbm_event_encode(enc, &b, &data, &len, &e2)) fail_msg("encode: %s", e2.msg);
  kvbm_event_batch d;
  assert_int_equal(kvbm_event_decode(dec, data, len, KVBM_INDEX_NO_ID, &d, NULL), KVBM_OK);
  assert_int_equal(d.num_events, n);
  for (size_t i = 0; i < n; i++) { /* the wire kept the group and kind */
    assert_int_equal(d.events[i].has_group_idx, evs[i].has_group_idx);
    assert_int_equal(d.events[i].group_idx, evs[i].group_idx);
    if (evs[i].kv_cache_spec_kind)
      assert_string_equal(d.events[i].kv_cache_spec_kind, evs[i].kv_cache_spec_kind);
  }
  d.seq = KVBM_INDEX_NO_ID;
  int rc = kvbm_index_apply_batch(idx, wid, &d, err);
  kvbm_event_encoder_destroy(enc);
  kvbm_event_decoder_destroy(dec);
  return rc;
}

static uint32_t slot_of(kvbm_index *idx, uint64_t wid) {
  uint32_t s;
  kvbm_worker_key k = {wid, 0};
  assert_int_equal(kvbm_index_worker_slot(idx, k, &s), KVBM_OK);
  return s;
}

static kvbm_overlap look(kvbm_index *idx, uint64_t wid, size_t n) {
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, H, n, ov, NULL);
  return ov[slot_of(idx, wid)];
}

/* full + sw:32 (a window of two 16-token blocks): the worker with only
 * the full group's blocks scores 0, the one with the window scores all. */
static void test_full_only_is_no_hit(void **state) {
  (void)state;
  kvbm_index *idx = mk("full,sw:32", false);
  kvbm_event a[2] = {st(0, 8, 0, "full_attention", 0, KVBM_MEDIUM_GPU),
                     st(6, 8, 1, "sliding_window", 32, KVBM_MEDIUM_GPU)};
  kvbm_error err;
  if (wire_apply(idx, 1, a, 2, &err)) fail_msg("%s", err.msg);
  assert_int_equal(wire_apply(idx, 2, a, 1, &err), KVBM_OK); /* full only */
  assert_int_equal(look(idx, 1, 8).prefix[0], 8);
  assert_int_equal(look(idx, 2, 8).prefix[0], 0);
  assert_int_equal(look(idx, 2, 8).prefix[3], 0);
  /* a shorter request: its window (blocks 3, 4) is not held by worker 1 */
  assert_int_equal(look(idx, 1, 5).prefix[0], 0);
  /* the sliding window group alone (no full blocks) is no hit either */
  kvbm_event sw = st(6, 8, 1, "sliding_window", 32, KVBM_MEDIUM_GPU);
  assert_int_equal(wire_apply(idx, 3, &sw, 1, &err), KVBM_OK);
  assert_int_equal(look(idx, 3, 8).prefix[3], 0);
  kvbm_index_stats stt;
  kvbm_index_stats_get(idx, &stt);
  assert_int_equal(stt.hybrid_workers, 3);
  assert_true(stt.grouped >= 2);
  /* removing one window block of worker 1 (group 1 only) shortens its hit
   * to where a window is whole again: none */
  kvbm_event rm = {.type = KVBM_EVENT_REMOVED, .block_hashes = H + 7, .num_block_hashes = 1,
                   .medium = KVBM_MEDIUM_GPU, .group_idx = 1, .has_group_idx = true};
  assert_int_equal(wire_apply(idx, 1, &rm, 1, &err), KVBM_OK);
  assert_int_equal(look(idx, 1, 8).prefix[0], 0);
  assert_int_equal(look(idx, 1, 7).prefix[0], 0); /* blocks 5, 6 needed: 5 missing */
  kvbm_event five = st(5, 6, 1, "sliding_window", 32, KVBM_MEDIUM_GPU);
  assert_int_equal(wire_apply(idx, 1, &five, 1, &err), KVBM_OK);
  assert_int_equal(look(idx, 1, 7).prefix[0], 7);
  assert_int_equal(look(idx, 1, 8).prefix[0], 7); /* block 7 of the window is gone */
  kvbm_index_destroy(idx);
}

/* The window slides: holdings of group 1 in the middle give the hit that
 * ends there; Mamba needs only its state at the boundary. */
static void test_window_and_mamba(void **state) {
  (void)state;
  kvbm_index *idx = mk("full,sw:32", false);
  kvbm_worker_key k = {1, 0};
  uint32_t s;
  assert_int_equal(kvbm_index_add_worker(idx, k, &s, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_store_group(idx, s, KVBM_TIER_G1, 0, H, 8), KVBM_OK);
  assert_int_equal(kvbm_index_store_group(idx, s, KVBM_TIER_G1, 1, H, 5), KVBM_OK);
  assert_int_equal(kvbm_index_remove_group(idx, s, KVBM_TIER_G1, 1, H, 3), KVBM_OK);
  assert_int_equal(look(idx, 1, 8).prefix[0], 5); /* blocks 3, 4 */
  kvbm_index_destroy(idx);

  idx = mk("full,mamba", false);
  assert_int_equal(kvbm_index_add_worker(idx, k, &s, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_store_group(idx, s, KVBM_TIER_G1, 0, H, 8), KVBM_OK);
  /* states saved at blocks 3 and 5 only (ends of 4 and 6 blocks) */
  assert_int_equal(kvbm_index_store_group(idx, s, KVBM_TIER_G1, 1, H + 3, 1), KVBM_OK);
  assert_int_equal(kvbm_index_store_group(idx, s, KVBM_TIER_G1, 1, H + 5, 1), KVBM_OK);
  assert_int_equal(look(idx, 1, 8).prefix[0], 6);
  assert_int_equal(look(idx, 1, 5).prefix[0], 4);
  /* tiers: the state at block 7 on host: device hit 6, host hit 8 */
  assert_int_equal(kvbm_index_store_group(idx, s, KVBM_TIER_G2, 1, H + 7, 1), KVBM_OK);
  kvbm_overlap o = look(idx, 1, 8);
  assert_int_equal(o.prefix[0], 6);
  assert_int_equal(o.prefix[1], 8);
  assert_int_equal(o.prefix[3], 8);
  kvbm_index_destroy(idx);
}

/* Approximate routing on a hybrid index: a decision stands for every
 * group's blocks, and its expiry removes them all. */
static void test_approx(void **state) {
  (void)state;
  kvbm_index *idx = mk("full,sw:32,mamba", false);
  kvbm_worker_key k = {1, 0};
  uint32_t s;
  assert_int_equal(kvbm_index_add_worker(idx, k, &s, NULL), KVBM_OK);
  kvbm_approx_config ac = kvbm_approx_config_default();
  ac.ttl_s = 10;
  kvbm_approx *ap;
  assert_int_equal(kvbm_approx_create(idx, &ac, &ap, NULL), KVBM_OK);
  assert_int_equal(kvbm_approx_record(ap, s, H, 8, 1.0, NULL), KVBM_OK);
  assert_int_equal(look(idx, 1, 8).prefix[0], 8);
  assert_int_equal(kvbm_approx_expire(ap, 100.0), 1);
  assert_int_equal(look(idx, 1, 8).prefix[3], 0);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.entries, 0);
  kvbm_approx_destroy(ap);
  kvbm_index_destroy(idx);
}

/* No configured list: the kinds on the wire make the worker hybrid; an
 * index of one full group behaves as before (group_idx 0 everywhere). */
static void test_learned(void **state) {
  (void)state;
  kvbm_index *idx = mk(NULL, false);
  kvbm_event a[3] = {st(0, 8, 0, "full_attention", 0, KVBM_MEDIUM_GPU),
                     st(0, 8, 1, "sliding_window", 128, KVBM_MEDIUM_GPU),
                     st(0, 8, 2, "mamba", 0, KVBM_MEDIUM_GPU)};
  kvbm_error err;
  assert_int_equal(wire_apply(idx, 1, a, 1, &err), KVBM_OK);
  assert_int_equal(look(idx, 1, 8).prefix[0], 8);
  kvbm_index_stats stt;
  kvbm_index_stats_get(idx, &stt);
  assert_int_equal(stt.hybrid_workers, 0); /* one full group: the fast path */
  assert_int_equal(wire_apply(idx, 1, a + 1, 2, &err), KVBM_OK);
  kvbm_group_spec gs[KVBM_GROUPS_MAX];
  size_t n;
  assert_int_equal(kvbm_index_worker_groups(idx, slot_of(idx, 1), gs, KVBM_GROUPS_MAX, &n),
                   KVBM_OK);
  assert_int_equal(n, 3);
  assert_int_equal(gs[1].kind, KVBM_GROUP_SLIDING_WINDOW);
  assert_int_equal(gs[1].tokens, 128);
  assert_int_equal(gs[2].kind, KVBM_GROUP_MAMBA);
  assert_int_equal(look(idx, 1, 8).prefix[0], 8);
  /* the Mamba state of block 7 goes: the hit needs one at 6 or before */
  kvbm_event rm = {.type = KVBM_EVENT_REMOVED, .block_hashes = H + 7, .num_block_hashes = 1,
                   .group_idx = 2, .has_group_idx = true};
  assert_int_equal(wire_apply(idx, 1, &rm, 1, &err), KVBM_OK);
  assert_int_equal(look(idx, 1, 8).prefix[0], 7);
  /* a configured list is fixed: another kind on the wire is counted */
  assert_int_equal(kvbm_index_worker_groups_set(idx, (kvbm_worker_key){1, 0}, gs, 3, &err),
                   KVBM_OK);
  kvbm_event other = st(0, 1, 1, "full_attention", 0, KVBM_MEDIUM_GPU);
  assert_int_equal(wire_apply(idx, 1, &other, 1, &err), KVBM_OK);
  kvbm_index_stats_get(idx, &stt);
  assert_int_equal(stt.group_conflicts, 1);
  assert_int_equal(kvbm_index_worker_groups(idx, slot_of(idx, 1), gs, KVBM_GROUPS_MAX, &n),
                   KVBM_OK);
  assert_int_equal(gs[1].kind, KVBM_GROUP_SLIDING_WINDOW);
  /* a list shorter than the groups it holds is refused */
  assert_int_equal(kvbm_index_worker_groups_set(idx, (kvbm_worker_key){1, 0}, gs, 2, &err),
                   KVBM_EINVAL);
  kvbm_index_destroy(idx);
}

/* Recompute mode keys by the index's own hashes: groups stay apart there
 * too, and a lookup by tokens finds the hybrid hit. */
static void test_recompute(void **state) {
  (void)state;
  kvbm_index *idx = mk("full,sw:16", true);
  uint32_t tok[8 * BS];
  for (size_t i = 0; i < 8 * BS; i++) tok[i] = (uint32_t)(i * 31 + 7);
  kvbm_event a[2] = {st(0, 8, 0, NULL, 0, KVBM_MEDIUM_GPU), st(0, 4, 1, NULL, 0, KVBM_MEDIUM_GPU)};
  a[0].token_ids = tok, a[0].num_tokens = 8 * BS;
  a[1].token_ids = tok, a[1].num_tokens = 4 * BS;
  kvbm_error err;
  if (wire_apply(idx, 1, a, 2, &err)) fail_msg("%s", err.msg);
  uint64_t keys[8];
  assert_int_equal(kvbm_index_hash_tokens(idx, tok, 8 * BS, keys, 8), 8);
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, keys, 8, ov, NULL);
  assert_int_equal(ov[slot_of(idx, 1)].prefix[0], 4); /* sw:16 needs block 3 */
  kvbm_index_destroy(idx);
}

/* Hostile group_idx: refused, counted, nothing held, no crash. */
static void test_hostile(void **state) {
  (void)state;
  kvbm_index *idx = mk("full,sw:32", false);
  kvbm_error err;
  int64_t bad[] = {-1, 16, 1000, INT64_MIN, INT64_MAX, 2};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kvbm_event e = st(0, 4, bad[i], NULL, 0, KVBM_MEDIUM_GPU);
    kvbm_worker_key k = {9, 0};
    assert_int_equal(kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, &e, &err), KVBM_EINVAL);
    assert_non_null(strstr(err.msg, "group_idx"));
  }
  kvbm_index_stats stt;
  kvbm_index_stats_get(idx, &stt);
  assert_int_equal(stt.bad_groups, 6);
  assert_int_equal(stt.entries, 0);
  /* through the wire: a group beyond the configured list */
  kvbm_event e = st(0, 4, 5, NULL, 0, KVBM_MEDIUM_GPU);
  assert_int_equal(wire_apply(idx, 9, &e, 1, &err), KVBM_EINVAL);
  kvbm_index_stats_get(idx, &stt);
  assert_int_equal(stt.bad_groups, 7);
  assert_int_equal(stt.entries, 0);
  assert_int_equal(kvbm_index_store_group(idx, slot_of(idx, 9), KVBM_TIER_G1, 2, H, 1),
                   KVBM_EINVAL);
  /* through the wire and a batch: negative and too large */
  int64_t wbad[] = {-1, 16, 1 << 20};
  for (size_t i = 0; i < 3; i++) {
    e = st(0, 4, wbad[i], NULL, 0, KVBM_MEDIUM_GPU);
    assert_int_equal(wire_apply(idx, 9, &e, 1, &err), KVBM_EINVAL);
    assert_non_null(strstr(err.msg, "group_idx"));
  }
  kvbm_index_stats_get(idx, &stt);
  assert_int_equal(stt.bad_groups, 11); /* and store_group's above */
  assert_int_equal(stt.entries, 0);
  /* bad configured lists */
  kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 0}};
  assert_int_equal(kvbm_index_worker_groups_set(idx, (kvbm_worker_key){3, 0}, g, 2, &err),
                   KVBM_EINVAL);
  g[1] = (kvbm_group_spec){(kvbm_group_kind)77, 0};
  assert_int_equal(kvbm_index_worker_groups_set(idx, (kvbm_worker_key){3, 0}, g, 2, &err),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_index_worker_groups_set(idx, (kvbm_worker_key){3, 0}, g, 0, &err),
                   KVBM_EINVAL);
  kvbm_index_config c = kvbm_index_config_default();
  c.groups = g;
  c.num_groups = KVBM_GROUPS_MAX + 1;
  kvbm_index *x;
  assert_int_equal(kvbm_index_create(&c, &x, &err), KVBM_EINVAL);
  /* a learned list grows to any group below 16 */
  kvbm_index *l = mk(NULL, false);
  e = st(0, 2, 15, NULL, 0, KVBM_MEDIUM_GPU);
  assert_int_equal(wire_apply(l, 4, &e, 1, &err), KVBM_OK);
  size_t n;
  assert_int_equal(kvbm_index_worker_groups(l, slot_of(l, 4), NULL, 0, &n), KVBM_OK);
  assert_int_equal(n, 16);
  assert_int_equal(look(l, 4, 2).prefix[0], 0); /* groups 0..14 hold nothing */
  kvbm_index_destroy(l);
  kvbm_index_destroy(idx);
}

/* The little-endian u64 at p. */
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++, v >>= 8) p[i] = (uint8_t)v;
}

static void test_snapshot(void **state) {
  (void)state;
  kvbm_index *idx = mk("full,sw:32", false);
  kvbm_event a[2] = {st(0, 8, 0, NULL, 0, KVBM_MEDIUM_GPU), st(5, 8, 1, NULL, 0, KVBM_MEDIUM_CPU)};
  kvbm_error err;
  assert_int_equal(wire_apply(idx, 1, a, 2, &err), KVBM_OK);
  uint8_t *buf;
  size_t len;
  assert_int_equal(kvbm_index_snapshot(idx, &buf, &len, &err), KVBM_OK);
  kvbm_index *r = mk(NULL, false);
  if (kvbm_index_restore(r, buf, len, &err)) fail_msg("%s", err.msg);
  kvbm_overlap o = look(r, 1, 8);
  assert_int_equal(o.prefix[0], 0);
  assert_int_equal(o.prefix[1], 8);
  uint8_t *b2;
  size_t l2;
  assert_int_equal(kvbm_index_snapshot(r, &b2, &l2, &err), KVBM_OK);
  assert_int_equal(l2, len);
  assert_memory_equal(b2, buf, len); /* canonical: groups included */
  free(b2);
  kvbm_index_destroy(r);
  /* a block's group byte beyond its worker's list: refused */
  size_t first_block = 40 + 80 + 8 + 8 * KVBM_GROUPS_MAX;
  uint8_t *bad = malloc(len);
  memcpy(bad, buf, len);
  bad[first_block + 18] = 2;
  put64(bad + len - 8, kvbm_hash_salt(bad, len - 8));
  r = mk(NULL, false);
  assert_int_equal(kvbm_index_restore(r, bad, len, &err), KVBM_EFORMAT);
  assert_non_null(strstr(err.msg, "group"));
  assert_int_equal(kvbm_index_workers(r), 0);
  /* a worker of 17 groups: refused */
  memcpy(bad, buf, len);
  bad[40 + 80] = 17;
  put64(bad + len - 8, kvbm_hash_salt(bad, len - 8));
  assert_int_equal(kvbm_index_restore(r, bad, len, &err), KVBM_EFORMAT);
  free(bad);
  kvbm_index_destroy(r);
  free(buf);
  kvbm_index_destroy(idx);

  /* version 1 (no groups) still loads, every block in group 0 */
  idx = mk(NULL, false);
  assert_int_equal(wire_apply(idx, 1, a, 1, &err), KVBM_OK);
  assert_int_equal(kvbm_index_snapshot(idx, &buf, &len, &err), KVBM_OK);
  size_t l1 = len - 8 - 8 * KVBM_GROUPS_MAX;
  uint8_t *v1 = malloc(len);
  memcpy(v1, buf, 40 + 80);
  memcpy(v1 + 120, buf + 120 + 8 + 8 * KVBM_GROUPS_MAX, l1 - 120 - 8);
  v1[8] = 1;
  put64(v1 + l1 - 8, kvbm_hash_salt(v1, l1 - 8));
  r = mk(NULL, false);
  if (kvbm_index_restore(r, v1, l1, &err)) fail_msg("%s", err.msg);
  assert_int_equal(look(r, 1, 8).prefix[0], 8);
  kvbm_index_destroy(r);
  free(v1);
  free(buf);
  kvbm_index_destroy(idx);
}

/* ------------------------------------------------------------ random */

typedef struct model {
  uint32_t copies[KVBM_GROUPS_MAX][64][KVBM_TIER_COUNT]; /* the index counts copies */
  unsigned mask;
} model;

static bool model_held(void *user, uint32_t g, size_t b) {
  model *m = user;
  for (int t = 0; t < KVBM_TIER_COUNT; t++)
    if ((m->mask >> t & 1) && m->copies[g][b][t]) return true;
  return false;
}

static uint64_t rnd(uint64_t *s) { return kvbm_router_rand(s); }

/* Random group lists and holdings (stores and removes on random tiers);
 * every tier's overlap equals kvbm_groups_hit over the model. */
static void test_random(void **state) {
  (void)state;
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (int round = 0; round < 200; round++) {
    kvbm_group_spec gs[4];
    size_t ng = 1 + rnd(&seed) % 4;
    for (size_t g = 0; g < ng; g++) {
      switch (rnd(&seed) % 4) {
        case 0: gs[g] = (kvbm_group_spec){KVBM_GROUP_FULL, 0}; break;
        case 1: gs[g] = (kvbm_group_spec){KVBM_GROUP_SLIDING_WINDOW,
                                          (uint32_t)(1 + rnd(&seed) % 80)}; break;
        case 2: gs[g] = (kvbm_group_spec){KVBM_GROUP_CHUNKED_LOCAL,
                                          (uint32_t)(BS * (1 + rnd(&seed) % 4))}; break;
        default: gs[g] = (kvbm_group_spec){KVBM_GROUP_MAMBA, 0}; break;
      }
    }
    kvbm_index_config c = kvbm_index_config_default();
    c.block_size = BS;
    c.expected_blocks = 16;
    c.groups = gs;
    c.num_groups = ng;
    kvbm_index *idx;
    assert_int_equal(kvbm_index_create(&c, &idx, NULL), KVBM_OK);
    kvbm_worker_key k = {1, 0};
    uint32_t s;
    assert_int_equal(kvbm_index_add_worker(idx, k, &s, NULL), KVBM_OK);
    model m;
    memset(&m, 0, sizeof m);
    size_t nb = 1 + rnd(&seed) % 40;
    for (int op = 0; op < 200; op++) {
      uint32_t g = (uint32_t)(rnd(&seed) % ng);
      size_t b = rnd(&seed) % nb, len = 1 + rnd(&seed) % 6;
      if (b + len > nb) len = nb - b;
      int t = (int)(rnd(&seed) % 3 ? 0 : rnd(&seed) % KVBM_TIER_COUNT);
      bool store = rnd(&seed) % 3 != 0;
      if (store)
        assert_int_equal(kvbm_index_store_group(idx, s, (kvbm_tier)t, g, H + b, len), KVBM_OK);
      else
        assert_int_equal(kvbm_index_remove_group(idx, s, (kvbm_tier)t, g, H + b, len), KVBM_OK);
      for (size_t i = b; i < b + len; i++) {
        if (store) m.copies[g][i][t]++;
        else if (m.copies[g][i][t]) m.copies[g][i][t]--;
      }
      if (op % 10) continue;
      size_t n = 1 + rnd(&seed) % nb;
      kvbm_overlap ov[MAXW];
      kvbm_index_lookup(idx, H, n, ov, NULL);
      for (int tier = 0; tier < KVBM_TIER_COUNT; tier++) {
        m.mask = (2u << tier) - 1;
        uint64_t want = kvbm_groups_hit(gs, ng, BS, n * BS, model_held, &m) / BS;
        if (ov[s].prefix[tier] != want) {
          char txt[128];
          kvbm_groups_format(gs, ng, txt, sizeof txt);
          fail_msg("round %d op %d groups %s n %zu tier %d: %u, want %llu", round, op, txt, n,
                   tier, ov[s].prefix[tier], (unsigned long long)want);
        }
      }
    }
    kvbm_index_destroy(idx);
  }
}

typedef struct rd {
  kvbm_index *idx;
  atomic_int stop;
  _Atomic uint64_t lookups;
  uint64_t bad;
} rd;

static void *reader(void *arg) {
  rd *r = arg;
  kvbm_overlap ov[MAXW];
  while (!atomic_load(&r->stop)) {
    uint64_t live;
    kvbm_index_lookup(r->idx, H, 32, ov, &live);
    for (int s = 0; s < MAXW; s++) {
      const uint32_t *p = ov[s].prefix;
      if (p[0] > p[1] || p[1] > p[2] || p[2] > p[3] || p[3] > 32) r->bad++;
    }
    atomic_fetch_add(&r->lookups, 1);
  }
  return NULL;
}

/* The writer stores and removes blocks of three groups, and changes the
 * worker's list, while a reader looks up: every answer is well formed
 * (tiers in order, within the request), no torn list. */
static void test_concurrent(void **state) {
  (void)state;
  kvbm_index *idx = mk(NULL, false);
  kvbm_worker_key k = {1, 0};
  uint32_t s;
  assert_int_equal(kvbm_index_add_worker(idx, k, &s, NULL), KVBM_OK);
  rd r = {.idx = idx};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, reader, &r), 0);
  while (!atomic_load(&r.lookups)) sched_yield(); /* the reader runs */
  kvbm_group_spec a[3] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 48}, {KVBM_GROUP_MAMBA, 0}};
  kvbm_group_spec b[3] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_CHUNKED_LOCAL, 64}, {KVBM_GROUP_FULL, 0}};
  uint64_t seed = 7;
  for (int i = 0; i < 3000; i++) {
    uint32_t g = (uint32_t)(kvbm_router_rand(&seed) % 3);
    size_t at = kvbm_router_rand(&seed) % 28, len = 1 + kvbm_router_rand(&seed) % 4;
    kvbm_tier t = (kvbm_tier)(kvbm_router_rand(&seed) % KVBM_TIER_COUNT);
    if (i % 500 == 0)
      assert_int_equal(kvbm_index_worker_groups_set(idx, k, i % 1000 ? b : a, 3, NULL), KVBM_OK);
    if (kvbm_router_rand(&seed) % 3)
      assert_int_equal(kvbm_index_store_group(idx, s, t, g, H + at, len), KVBM_OK);
    else
      assert_int_equal(kvbm_index_remove_group(idx, s, t, g, H + at, len), KVBM_OK);
  }
  uint64_t seen = atomic_load(&r.lookups);
  while (atomic_load(&r.lookups) < seen + 2) sched_yield(); /* and after the last change */
  atomic_store(&r.stop, 1);
  pthread_join(th, NULL);
  assert_int_equal(r.bad, 0);
  kvbm_index_destroy(idx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_full_only_is_no_hit, setup),
      cmocka_unit_test_setup(test_window_and_mamba, setup),
      cmocka_unit_test_setup(test_learned, setup),
      cmocka_unit_test_setup(test_approx, setup),
      cmocka_unit_test_setup(test_recompute, setup),
      cmocka_unit_test_setup(test_hostile, setup),
      cmocka_unit_test_setup(test_snapshot, setup),
      cmocka_unit_test_setup(test_random, setup),
      cmocka_unit_test_setup(test_concurrent, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
