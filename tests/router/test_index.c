/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_index.c: the router's prefix index, one thread.
 *
 * Hand-made cases (prefixes per worker and tier, removes, duplicates,
 * clears, worker add/drop, ids with gaps and duplicates, recompute mode in
 * both hash schemes, batches through the vLLM codec, bad events, tenants'
 * namespaces), then a randomized model test: thousands of random stores,
 * removes, clears and worker drops on several workers and tiers over
 * chains that share prefixes, with every lookup compared to a plain
 * reference model (counts per worker, tier and hash), through table growth
 * and many deletions; once more with the workers split among tenants.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvbm/router.h"

#define MAXW KVBM_ROUTER_MAX_WORKERS

static kvbm_index *mk(bool recompute, kvbm_hash_scheme scheme, uint32_t bs, size_t expect) {
  kvbm_index_config c = kvbm_index_config_default();
  c.recompute = recompute;
  c.scheme = scheme;
  c.block_size = bs;
  c.expected_blocks = expect;
  kvbm_index *idx;
  kvbm_error err;
  assert_int_equal(kvbm_index_create(&c, &idx, &err), KVBM_OK);
  return idx;
}

static kvbm_event stored(const uint64_t *h, size_t n, const uint64_t *parent, kvbm_medium m) {
  kvbm_event e = {.type = KVBM_EVENT_STORED, .block_hashes = h, .num_block_hashes = n,
                  .medium = m, .block_size = 16};
  if (parent) e.parent_hash = *parent, e.has_parent = true;
  return e;
}
static kvbm_event removed(const uint64_t *h, size_t n, kvbm_medium m) {
  return (kvbm_event){.type = KVBM_EVENT_REMOVED, .block_hashes = h, .num_block_hashes = n,
                      .medium = m};
}

static void apply(kvbm_index *idx, uint64_t wid, kvbm_event ev) {
  kvbm_error err;
  kvbm_worker_key k = {wid, 0};
  int rc = kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, &ev, &err);
  if (rc) fail_msg("apply: %s", err.msg);
}

static uint32_t slot_of(kvbm_index *idx, uint64_t wid) {
  uint32_t s;
  kvbm_worker_key k = {wid, 0};
  assert_int_equal(kvbm_index_worker_slot(idx, k, &s), KVBM_OK);
  return s;
}

/* Prefixes G1 (device), G2 (device or host), G3 (no remote) and G4 (any
 * tier). */
static void expect_prefix4(kvbm_index *idx, const uint64_t *h, size_t n, uint64_t wid,
                           uint32_t dev, uint32_t host, uint32_t disk, uint32_t any) {
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, h, n, ov, NULL);
  uint32_t s = slot_of(idx, wid);
  if (ov[s].prefix[0] != dev || ov[s].prefix[1] != host || ov[s].prefix[2] != disk ||
      ov[s].prefix[3] != any)
    fail_msg("worker %llu: prefix %u/%u/%u/%u, expected %u/%u/%u/%u", (unsigned long long)wid,
             ov[s].prefix[0], ov[s].prefix[1], ov[s].prefix[2], ov[s].prefix[3], dev, host,
             disk, any);
}

/* The same without remote blocks: G3 and G4 prefixes agree. */
static void expect_prefix(kvbm_index *idx, const uint64_t *h, size_t n, uint64_t wid,
                          uint32_t dev, uint32_t host, uint32_t any) {
  expect_prefix4(idx, h, n, wid, dev, host, any, any);
}

static const uint64_t H[] = {101, 102, 103, 104, 105, 106, 107, 108};

static void test_prefixes(void **state) {
  (void)state;
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  apply(idx, 1, stored(H, 5, NULL, KVBM_MEDIUM_GPU));
  apply(idx, 2, stored(H, 2, NULL, KVBM_MEDIUM_GPU));
  apply(idx, 2, stored(H + 3, 2, &H[2], KVBM_MEDIUM_GPU)); /* a hole at 2 */
  kvbm_worker_key k3 = {3, 0};
  assert_int_equal(kvbm_index_add_worker(idx, k3, NULL, NULL), KVBM_OK);
  expect_prefix(idx, H, 6, 1, 5, 5, 5);
  expect_prefix(idx, H, 6, 2, 2, 2, 2);
  expect_prefix(idx, H, 6, 3, 0, 0, 0);
  expect_prefix(idx, H + 1, 3, 1, 3, 3, 3); /* any hash sequence is looked up as given */
  expect_prefix(idx, H, 0, 1, 0, 0, 0);
  uint64_t live;
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, H, 6, ov, &live);
  assert_int_equal(__builtin_popcountll(live), 3);
  for (int s = 0; s < MAXW; s++)
    if (!(live >> s & 1)) assert_int_equal(ov[s].prefix[2], 0);
  /* removing block 1 cuts worker 1 at 1; block 0 gone cuts it at 0 */
  apply(idx, 1, removed(H + 1, 1, KVBM_MEDIUM_GPU));
  expect_prefix(idx, H, 6, 1, 1, 1, 1);
  expect_prefix(idx, H, 6, 2, 2, 2, 2); /* others keep theirs */
  apply(idx, 1, removed(H, 1, KVBM_MEDIUM_GPU));
  expect_prefix(idx, H, 6, 1, 0, 0, 0);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.stored, 9);
  assert_int_equal(st.removed, 2);
  assert_int_equal(st.entries, 7); /* w1: 103..105; w2: 101, 102, 104, 105 */
  assert_int_equal(st.workers, 3);
  kvbm_index_destroy(idx);
}

/* One batch mixing events of the lean path (device stores and removes of
 * group 0 without namespace: index.c) with events the general path takes
 * (another tier, a namespaced store after which the worker's batch goes
 * the general way, an unknown remove, a clear), then a batch of lean
 * events again: every count, size and prefix as if each event had been
 * applied alone, and the lean path's counters, added once per batch, are
 * exact when the batch returns. */
static void test_lean_mixed(void **state) {
  (void)state;
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  const uint64_t unknown = 999;
  kvbm_event ev[8];
  ev[0] = stored(H, 1, NULL, KVBM_MEDIUM_GPU);           /* lean */
  ev[1] = stored(H + 1, 1, &H[0], KVBM_MEDIUM_GPU);      /* lean */
  ev[2] = stored(H + 1, 1, &H[0], KVBM_MEDIUM_CPU);      /* general: another tier */
  ev[3] = stored(H + 2, 1, &H[1], KVBM_MEDIUM_GPU);      /* lean */
  ev[4] = removed(H + 1, 1, KVBM_MEDIUM_GPU);            /* lean: held on the host too */
  ev[5] = removed(&unknown, 1, KVBM_MEDIUM_GPU);         /* unknown */
  ev[6] = stored(H + 3, 1, &H[2], KVBM_MEDIUM_GPU);      /* namespaced: general from here */
  ev[6].cache_salt = "tenant";
  ev[7] = stored(H + 4, 1, &H[2], KVBM_MEDIUM_GPU);      /* general (worker not lean) */
  kvbm_event_batch b = {.seq = KVBM_INDEX_NO_ID, .events = ev, .num_events = 8};
  kvbm_error err;
  assert_int_equal(kvbm_index_apply_batch(idx, 1, &b, &err), KVBM_OK);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.events, 8);
  assert_int_equal(st.stored, 6);
  assert_int_equal(st.removed, 1);
  assert_int_equal(st.unknown_removed, 1);
  assert_int_equal(st.entries, 5); /* 101, 102 (host), 103, ns(104), 105 */
  uint64_t n[KVBM_TIER_COUNT];
  assert_int_equal(kvbm_index_worker_blocks(idx, slot_of(idx, 1), n), KVBM_OK);
  assert_int_equal(n[KVBM_TIER_G1], 4);
  assert_int_equal(n[KVBM_TIER_G2], 1);
  /* 102 is on the host only now: device prefix 1, host 3 (101 102 103) */
  expect_prefix(idx, H, 3, 1, 1, 3, 3);
  expect_prefix(idx, H + 4, 1, 1, 1, 1, 1);
  /* the tenant's block is seen under its key only */
  uint64_t keys[4];
  kvbm_index_keys(idx, kvbm_index_namespace("tenant", NULL), H + 3, 1, keys);
  expect_prefix(idx, keys, 1, 1, 1, 1, 1);
  expect_prefix(idx, H + 3, 1, 1, 0, 0, 0);
  /* a clear, then lean events again (the worker has no namespaced block) */
  kvbm_event c[3] = {{.type = KVBM_EVENT_CLEARED}, stored(H, 2, NULL, KVBM_MEDIUM_GPU),
                     removed(H + 1, 1, KVBM_MEDIUM_GPU)};
  kvbm_event_batch b2 = {.seq = KVBM_INDEX_NO_ID, .events = c, .num_events = 3};
  assert_int_equal(kvbm_index_apply_batch(idx, 1, &b2, &err), KVBM_OK);
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.events, 11);
  assert_int_equal(st.cleared, 1);
  assert_int_equal(st.stored, 8);
  assert_int_equal(st.removed, 2);
  assert_int_equal(st.entries, 1);
  assert_int_equal(st.closed_workers, 1);
  assert_int_equal(kvbm_index_worker_blocks(idx, slot_of(idx, 1), n), KVBM_OK);
  assert_int_equal(n[KVBM_TIER_G1], 1);
  assert_int_equal(n[KVBM_TIER_G2], 0);
  expect_prefix(idx, H, 3, 1, 1, 1, 1);
  kvbm_index_destroy(idx);
}

/* The lean path's hints (the slot of the block stored last, of the parent
 * of the block removed last) are trusted only while that slot is used and
 * holds the key asked for. Here the store hint points at a slot emptied
 * since (102 removed: its key is still in the slot's memory), and 103 is
 * then stored under 102: 102 must come back as a ghost, the worker is not
 * closed, and the device prefix of 101 102 103 is 1 (trusting the stale
 * slot would count 103 on an empty slot, keep the worker closed, and the
 * bisect would answer 3). Then removes in tail-first order (the remove
 * hint) and again, unknown, after the hint's slot was emptied. */
static void test_lean_hints(void **state) {
  (void)state;
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  kvbm_event ev[3] = {stored(H, 2, NULL, KVBM_MEDIUM_GPU), removed(H + 1, 1, KVBM_MEDIUM_GPU),
                      stored(H + 2, 1, &H[1], KVBM_MEDIUM_GPU)};
  kvbm_event_batch b = {.seq = KVBM_INDEX_NO_ID, .events = ev, .num_events = 3};
  kvbm_error err;
  assert_int_equal(kvbm_index_apply_batch(idx, 1, &b, &err), KVBM_OK);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.closed_workers, 0);
  assert_int_equal(st.entries, 2); /* 101 and 103; the ghost 102 holds nothing */
  expect_prefix(idx, H, 3, 1, 1, 1, 1);
  /* 102 back: closed again, prefix 3; then 103, 102, 101 removed tail
   * first in one batch, and 102 once more (unknown: its slot is empty) */
  apply(idx, 1, stored(H + 1, 1, &H[0], KVBM_MEDIUM_GPU));
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.closed_workers, 1);
  expect_prefix(idx, H, 3, 1, 3, 3, 3);
  kvbm_event rm[4] = {removed(H + 2, 1, KVBM_MEDIUM_GPU), removed(H + 1, 1, KVBM_MEDIUM_GPU),
                      removed(H, 1, KVBM_MEDIUM_GPU), removed(H + 1, 1, KVBM_MEDIUM_GPU)};
  kvbm_event_batch b2 = {.seq = KVBM_INDEX_NO_ID, .events = rm, .num_events = 4};
  assert_int_equal(kvbm_index_apply_batch(idx, 1, &b2, &err), KVBM_OK);
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.entries, 0);
  assert_int_equal(st.unknown_removed, 1);
  assert_int_equal(st.closed_workers, 1);
  expect_prefix(idx, H, 3, 1, 0, 0, 0);
  /* events of no block (the one-block path must not read a first hash;
   * ASan checks it: the hashes point at a one-past-the-end pointer) */
  static const uint64_t none[1] = {0};
  kvbm_event empty[2] = {stored(none + 1, 0, &H[0], KVBM_MEDIUM_GPU),
                         removed(none + 1, 0, KVBM_MEDIUM_GPU)};
  kvbm_event_batch b3 = {.seq = KVBM_INDEX_NO_ID, .events = empty, .num_events = 2};
  assert_int_equal(kvbm_index_apply_batch(idx, 1, &b3, &err), KVBM_OK);
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.entries, 0);
  assert_int_equal(st.events, 10); /* 3 + 1 + 4 + these 2, each counted */
  kvbm_index_destroy(idx);
}

/* A BlockRemoved names no namespace, so one carrying a salt or a LoRA
 * name (fields of BlockStored) removes the block as any remove does, on
 * the lean path as on the general one; lean and general events of one
 * batch are each counted once (the lean ones by their number). */
static void test_lean_removed_salted(void **state) {
  (void)state;
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  kvbm_event ev[2] = {stored(H, 3, NULL, KVBM_MEDIUM_GPU), removed(H + 2, 1, KVBM_MEDIUM_GPU)};
  ev[1].cache_salt = "tenant-a";
  kvbm_event_batch b = {.seq = KVBM_INDEX_NO_ID, .events = ev, .num_events = 2};
  kvbm_error err;
  assert_int_equal(kvbm_index_apply_batch(idx, 1, &b, &err), KVBM_OK);
  expect_prefix(idx, H, 3, 1, 2, 2, 2);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.entries, 2);
  assert_int_equal(st.closed_workers, 1);
  /* a LoRA-named remove, a general event (a disk block), a salted remove */
  kvbm_event ev2[3] = {removed(H + 1, 1, KVBM_MEDIUM_GPU), stored(H + 5, 1, NULL, KVBM_MEDIUM_DISK),
                       removed(H, 1, KVBM_MEDIUM_GPU)};
  ev2[0].lora_name = "adapter";
  ev2[2].cache_salt = "tenant-b";
  kvbm_event_batch b2 = {.seq = KVBM_INDEX_NO_ID, .events = ev2, .num_events = 3};
  assert_int_equal(kvbm_index_apply_batch(idx, 1, &b2, &err), KVBM_OK);
  expect_prefix(idx, H, 3, 1, 0, 0, 0);
  expect_prefix(idx, H + 5, 1, 1, 0, 0, 1);
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.entries, 1);
  assert_int_equal(st.removed, 3);
  assert_int_equal(st.unknown_removed, 0);
  assert_int_equal(st.events, 5);
  kvbm_index_destroy(idx);
}

/* Batches longer than the lean loop's prefetch distance (16 events):
 * general events before, inside and after the part of the batch that
 * prefetches, and a worker that stops being lean mid-batch. Each batch,
 * applied at once, must leave the index as the same events applied one
 * by one do (counters, closure, every prefix). */
static void same_index(kvbm_index *a, kvbm_index *b, const uint64_t *k, size_t n) {
  kvbm_index_stats sa, sb;
  kvbm_index_stats_get(a, &sa);
  kvbm_index_stats_get(b, &sb);
  assert_int_equal(sa.events, sb.events);
  assert_int_equal(sa.stored, sb.stored);
  assert_int_equal(sa.removed, sb.removed);
  assert_int_equal(sa.entries, sb.entries);
  assert_int_equal(sa.unknown_removed, sb.unknown_removed);
  assert_int_equal(sa.closed_workers, sb.closed_workers);
  for (size_t len = 1; len <= n; len++) {
    kvbm_overlap oa[MAXW], ob[MAXW];
    kvbm_index_lookup(a, k, len, oa, NULL);
    kvbm_index_lookup(b, k, len, ob, NULL);
    uint32_t s = slot_of(a, 1);
    for (int t = 0; t < KVBM_TIER_COUNT; t++) assert_int_equal(oa[s].prefix[t], ob[s].prefix[t]);
  }
}

static void test_lean_long_batches(void **state) {
  (void)state;
  uint64_t k[64];
  for (int i = 0; i < 64; i++) k[i] = 5000 + (uint64_t)i * 7919;
  kvbm_index *batched = mk(false, KVBM_HASH_NATIVE, 16, 16), *single = mk(false, KVBM_HASH_NATIVE, 16, 16);
  kvbm_event ev[48];
  for (int i = 0; i < 40; i++) ev[i] = stored(k + i, 1, i ? &k[i - 1] : NULL, KVBM_MEDIUM_GPU);
  for (int i = 40; i < 48; i++) ev[i] = removed(k + 39 - (i - 40), 1, KVBM_MEDIUM_GPU);
  ev[3] = stored(k, 1, NULL, KVBM_MEDIUM_CPU);          /* general, before the prefetching part ends */
  ev[20] = stored(k + 5, 1, &k[4], KVBM_MEDIUM_DISK);   /* general, inside it */
  ev[45] = stored(k + 2, 1, &k[1], KVBM_MEDIUM_CPU);    /* general, among the last 16 */
  kvbm_event_batch b = {.seq = KVBM_INDEX_NO_ID, .events = ev, .num_events = 48};
  kvbm_error err;
  assert_int_equal(kvbm_index_apply_batch(batched, 1, &b, &err), KVBM_OK);
  for (int i = 0; i < 48; i++) apply(single, 1, ev[i]);
  same_index(batched, single, k, 40);
  /* a namespaced store at event 20 of 30: the worker stops being lean,
   * the rest of the batch goes the general way */
  kvbm_event ev2[30];
  for (int i = 0; i < 30; i++) ev2[i] = stored(k + 34 + i % 30, 1, &k[33 + i % 30], KVBM_MEDIUM_GPU);
  ev2[20].cache_salt = "tenant";
  ev2[25] = removed(k + 30, 1, KVBM_MEDIUM_GPU);
  kvbm_event_batch b2 = {.seq = KVBM_INDEX_NO_ID, .events = ev2, .num_events = 30};
  assert_int_equal(kvbm_index_apply_batch(batched, 1, &b2, &err), KVBM_OK);
  for (int i = 0; i < 30; i++) apply(single, 1, ev2[i]);
  same_index(batched, single, k, 64);
  kvbm_index_stats st;
  kvbm_index_stats_get(batched, &st);
  assert_int_equal(st.events, 78);
  kvbm_index_destroy(batched);
  kvbm_index_destroy(single);
}

/* Multi-block stores whose first blocks the worker holds already, in one
 * batch (the lean path: a held block takes the general path, and the
 * store goes on with the blocks after it, whose parent slot the lean
 * hint no longer names): 101..102 held, then 101..104 in one event (two
 * copies of 101 and 102 now), 105 under 104, and 103..106 whose first
 * two are held from the event before. Every prefix and count is what the
 * rules give (a copy is held until each of its stores is removed), and
 * the same as the events applied one at a time; then the copies removed
 * one by one, tail first, down to nothing. Once more with the first
 * block held on the host only (it gains the device tier). */
static void test_lean_store_over_held(void **state) {
  (void)state;
  kvbm_index *batched = mk(false, KVBM_HASH_NATIVE, 16, 16), *single = mk(false, KVBM_HASH_NATIVE, 16, 16);
  kvbm_event ev[4] = {stored(H, 2, NULL, KVBM_MEDIUM_GPU), stored(H, 4, NULL, KVBM_MEDIUM_GPU),
                      stored(H + 4, 1, &H[3], KVBM_MEDIUM_GPU), stored(H + 2, 4, &H[1], KVBM_MEDIUM_GPU)};
  kvbm_event_batch b = {.seq = KVBM_INDEX_NO_ID, .events = ev, .num_events = 4};
  kvbm_error err;
  assert_int_equal(kvbm_index_apply_batch(batched, 1, &b, &err), KVBM_OK);
  for (int i = 0; i < 4; i++) apply(single, 1, ev[i]);
  same_index(batched, single, H, 8);
  kvbm_index_stats st;
  kvbm_index_stats_get(batched, &st);
  assert_int_equal(st.stored, 11);
  assert_int_equal(st.entries, 6); /* 101..106 */
  expect_prefix(batched, H, 8, 1, 6, 6, 6);
  uint64_t n[KVBM_TIER_COUNT];
  assert_int_equal(kvbm_index_worker_blocks(batched, slot_of(batched, 1), n), KVBM_OK);
  assert_int_equal(n[KVBM_TIER_G1], 6);
  /* copies: 101 x2, 102 x2, 103 x2, 104 x2, 105 x2, 106 x1. One remove
   * of each, tail first: only 106 goes */
  kvbm_event rm[6];
  for (int i = 0; i < 6; i++) rm[i] = removed(H + 5 - i, 1, KVBM_MEDIUM_GPU);
  kvbm_event_batch rb = {.seq = KVBM_INDEX_NO_ID, .events = rm, .num_events = 6};
  assert_int_equal(kvbm_index_apply_batch(batched, 1, &rb, &err), KVBM_OK);
  for (int i = 0; i < 6; i++) apply(single, 1, rm[i]);
  same_index(batched, single, H, 8);
  expect_prefix(batched, H, 8, 1, 5, 5, 5);
  /* the second copies, tail first: everything goes */
  kvbm_event_batch rb2 = {.seq = KVBM_INDEX_NO_ID, .events = rm + 1, .num_events = 5};
  assert_int_equal(kvbm_index_apply_batch(batched, 1, &rb2, &err), KVBM_OK);
  for (int i = 1; i < 6; i++) apply(single, 1, rm[i]);
  same_index(batched, single, H, 8);
  expect_prefix(batched, H, 8, 1, 0, 0, 0);
  kvbm_index_stats_get(batched, &st);
  assert_int_equal(st.entries, 0);
  assert_int_equal(st.removed, 11);
  assert_int_equal(st.unknown_removed, 0);
  /* the first block held on the host only: a device store of 101..103
   * keeps 101 (now on both tiers) and adds 102 and 103 under it */
  kvbm_event ev2[2] = {stored(H, 1, NULL, KVBM_MEDIUM_CPU), stored(H, 3, NULL, KVBM_MEDIUM_GPU)};
  kvbm_event_batch b2 = {.seq = KVBM_INDEX_NO_ID, .events = ev2, .num_events = 2};
  assert_int_equal(kvbm_index_apply_batch(batched, 1, &b2, &err), KVBM_OK);
  for (int i = 0; i < 2; i++) apply(single, 1, ev2[i]);
  same_index(batched, single, H, 8);
  expect_prefix(batched, H, 8, 1, 3, 3, 3);
  assert_int_equal(kvbm_index_worker_blocks(batched, slot_of(batched, 1), n), KVBM_OK);
  assert_int_equal(n[KVBM_TIER_G1], 3);
  assert_int_equal(n[KVBM_TIER_G2], 1);
  /* the device copy of 101 removed: 102 and 103 stay, under a block held
   * on the host only (device prefix 0, host prefix 3) */
  apply(batched, 1, removed(H, 1, KVBM_MEDIUM_GPU));
  apply(single, 1, removed(H, 1, KVBM_MEDIUM_GPU));
  same_index(batched, single, H, 8);
  expect_prefix(batched, H, 8, 1, 0, 3, 3);
  kvbm_index_destroy(batched);
  kvbm_index_destroy(single);
}

/* Closed workers are bisected after a guess: the first (the leader)
 * alone, every other one from the leader's answer p (h[p] held: longer,
 * gallop on; h[p - 1] held: p; else shorter). Workers holding longer,
 * equal, one shorter, much shorter and no prefix than the leader, for
 * leaders of 0, 1, 20 and 40 blocks and every lookup length: each
 * branch of the guess, p == n and p == 0 included, against min(held, n). */
static void test_bisect_guess(void **state) {
  (void)state;
  enum { N = 40 };
  uint64_t c[N], other = 999999;
  for (size_t i = 0; i < N; i++) c[i] = 5000 + i;
  static const uint32_t leads[] = {0, 1, 20, 40};
  static const uint32_t held[] = {40, 25, 21, 20, 19, 10, 1, 0};
  for (size_t l = 0; l < sizeof leads / sizeof *leads; l++) {
    kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 64);
    /* worker 1 is added first: the lowest slot, the leader */
    apply(idx, 1, stored(&other, 1, NULL, KVBM_MEDIUM_GPU));
    if (leads[l]) apply(idx, 1, stored(c, leads[l], NULL, KVBM_MEDIUM_GPU));
    for (size_t j = 0; j < sizeof held / sizeof *held; j++) {
      apply(idx, 2 + j, stored(&other, 1, NULL, KVBM_MEDIUM_GPU));
      if (held[j]) apply(idx, 2 + j, stored(c, held[j], NULL, KVBM_MEDIUM_GPU));
    }
    kvbm_index_stats st;
    kvbm_index_stats_get(idx, &st);
    assert_int_equal(st.closed_workers, 1 + sizeof held / sizeof *held);
    assert_true(slot_of(idx, 1) < slot_of(idx, 2));
    for (size_t n = 1; n <= N; n++) {
      uint32_t lp = leads[l] < n ? leads[l] : (uint32_t)n;
      expect_prefix(idx, c, n, 1, lp, lp, lp);
      for (size_t j = 0; j < sizeof held / sizeof *held; j++) {
        uint32_t want = held[j] < n ? held[j] : (uint32_t)n;
        expect_prefix(idx, c, n, 2 + j, want, want, want);
      }
    }
    kvbm_index_destroy(idx);
  }
}

static void test_tiers(void **state) {
  (void)state;
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  apply(idx, 7, stored(H, 2, NULL, KVBM_MEDIUM_GPU));
  apply(idx, 7, stored(H + 2, 1, &H[1], KVBM_MEDIUM_CPU));
  apply(idx, 7, stored(H + 3, 2, &H[2], KVBM_MEDIUM_DISK));
  apply(idx, 7, stored(H + 5, 1, &H[4], KVBM_MEDIUM_REMOTE)); /* G4 */
  expect_prefix4(idx, H, 8, 7, 2, 3, 5, 6);
  /* block 1 also on host, then gone from device: device prefix 1 */
  apply(idx, 7, stored(H + 1, 1, &H[0], KVBM_MEDIUM_CPU));
  apply(idx, 7, removed(H + 1, 1, KVBM_MEDIUM_GPU));
  expect_prefix4(idx, H, 8, 7, 1, 3, 5, 6);
  /* a remove in the wrong tier changes nothing and is counted */
  apply(idx, 7, removed(H, 1, KVBM_MEDIUM_CPU));
  expect_prefix4(idx, H, 8, 7, 1, 3, 5, 6);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.unknown_removed, 1);
  /* no medium = device */
  apply(idx, 7, stored(H + 1, 1, &H[0], KVBM_MEDIUM_NONE));
  expect_prefix4(idx, H, 8, 7, 2, 3, 5, 6);
  /* the index's size per tier: G1 {0,1}, G2 {1,2}, G3 {3,4}, G4 {5} */
  uint32_t slot;
  uint64_t n[KVBM_TIER_COUNT];
  assert_int_equal(kvbm_index_worker_slot(idx, (kvbm_worker_key){7, 0}, &slot), KVBM_OK);
  assert_int_equal(kvbm_index_worker_blocks(idx, slot, n), KVBM_OK);
  assert_int_equal(n[KVBM_TIER_G1], 2);
  assert_int_equal(n[KVBM_TIER_G2], 2);
  assert_int_equal(n[KVBM_TIER_G3], 2);
  assert_int_equal(n[KVBM_TIER_G4], 1);
  assert_int_equal(kvbm_index_worker_blocks(idx, slot + 1, n), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_medium_tier(KVBM_MEDIUM_OTHER), KVBM_TIER_G3);
  assert_int_equal(kvbm_medium_tier(KVBM_MEDIUM_REMOTE), KVBM_TIER_G4);
  kvbm_index_destroy(idx);
}

static void test_duplicates_and_clear(void **state) {
  (void)state;
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  apply(idx, 1, stored(H, 3, NULL, KVBM_MEDIUM_GPU));
  apply(idx, 1, stored(H + 2, 1, &H[1], KVBM_MEDIUM_GPU)); /* a duplicate block */
  apply(idx, 1, removed(H + 2, 1, KVBM_MEDIUM_GPU));
  expect_prefix(idx, H, 4, 1, 3, 3, 3);
  apply(idx, 1, removed(H + 2, 1, KVBM_MEDIUM_GPU));
  expect_prefix(idx, H, 4, 1, 2, 2, 2);
  apply(idx, 2, stored(H, 4, NULL, KVBM_MEDIUM_CPU));
  kvbm_event clr = {.type = KVBM_EVENT_CLEARED};
  apply(idx, 1, clr);
  expect_prefix(idx, H, 4, 1, 0, 0, 0);
  expect_prefix(idx, H, 4, 2, 0, 4, 4);
  apply(idx, 1, stored(H, 1, NULL, KVBM_MEDIUM_GPU)); /* usable after a clear */
  expect_prefix(idx, H, 4, 1, 1, 1, 1);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.cleared, 1);
  assert_int_equal(st.entries, 5); /* w1: 101; w2: 101..104 */
  kvbm_index_destroy(idx);
}

static void test_workers(void **state) {
  (void)state;
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  kvbm_error err;
  for (uint64_t w = 0; w < MAXW; w++) {
    kvbm_worker_key k = {1000 + w / 2, (uint32_t)(w % 2)};
    uint32_t s;
    assert_int_equal(kvbm_index_add_worker(idx, k, &s, &err), KVBM_OK);
    assert_int_equal(s, w);
    kvbm_event ev = stored(H, 1 + w % 8, NULL, KVBM_MEDIUM_GPU);
    assert_int_equal(kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, &ev, &err), KVBM_OK);
  }
  kvbm_worker_key extra = {5, 0};
  assert_int_equal(kvbm_index_add_worker(idx, extra, NULL, &err), KVBM_ENOSPC);
  kvbm_event ev = stored(H, 1, NULL, KVBM_MEDIUM_GPU);
  assert_int_equal(kvbm_index_apply(idx, extra, KVBM_INDEX_NO_ID, &ev, &err), KVBM_ENOSPC);
  /* dp ranks are distinct workers */
  kvbm_worker_key k0 = {1000, 0}, k1 = {1000, 1};
  uint32_t s0, s1;
  assert_int_equal(kvbm_index_worker_slot(idx, k0, &s0), KVBM_OK);
  assert_int_equal(kvbm_index_worker_slot(idx, k1, &s1), KVBM_OK);
  assert_int_not_equal(s0, s1);
  /* dropping one frees its slot and its blocks, nobody else's */
  assert_int_equal(kvbm_index_remove_worker(idx, k1), KVBM_OK);
  assert_int_equal(kvbm_index_remove_worker(idx, k1), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_index_worker_slot(idx, k1, NULL), KVBM_ENOTFOUND);
  kvbm_worker_key got;
  assert_false(kvbm_index_slot_worker(idx, s1, &got));
  assert_true(kvbm_index_slot_worker(idx, s0, &got));
  assert_true(got.worker_id == 1000 && got.dp_rank == 0);
  kvbm_overlap ov[MAXW];
  uint64_t live;
  kvbm_index_lookup(idx, H, 8, ov, &live);
  assert_false(live >> s1 & 1);
  assert_int_equal(ov[s1].prefix[2], 0);
  for (uint32_t s = 0; s < MAXW; s++)
    if (s != s1) assert_int_equal(ov[s].prefix[2], 1 + s % 8);
  /* the slot is reused, empty */
  assert_int_equal(kvbm_index_add_worker(idx, extra, &s0, &err), KVBM_OK);
  assert_int_equal(s0, s1);
  kvbm_index_lookup(idx, H, 8, ov, &live);
  assert_int_equal(ov[s1].prefix[2], 0);
  kvbm_index_destroy(idx);
}

typedef struct gapcall {
  int n;
  kvbm_worker_key w;
  uint64_t expected, got;
} gapcall;
static void on_gap(void *u, kvbm_worker_key w, uint64_t expected, uint64_t got) {
  gapcall *g = u;
  g->n++;
  g->w = w;
  g->expected = expected;
  g->got = got;
}

static void test_ids(void **state) {
  (void)state;
  gapcall g = {0};
  kvbm_index_config c = kvbm_index_config_default();
  c.on_gap = on_gap;
  c.gap_user = &g;
  kvbm_index *idx;
  assert_int_equal(kvbm_index_create(&c, &idx, NULL), KVBM_OK);
  kvbm_worker_key k = {9, 2};
  kvbm_event e0 = stored(H, 1, NULL, KVBM_MEDIUM_GPU);
  kvbm_event e1 = stored(H + 1, 1, &H[0], KVBM_MEDIUM_GPU);
  kvbm_event e2 = stored(H + 2, 1, &H[1], KVBM_MEDIUM_GPU);
  kvbm_event r0 = removed(H, 1, KVBM_MEDIUM_GPU);
  assert_int_equal(kvbm_index_apply(idx, k, 5, &e0, NULL), KVBM_OK); /* first id: any */
  assert_int_equal(kvbm_index_apply(idx, k, 6, &e1, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_apply(idx, k, 6, &r0, NULL), KVBM_OK); /* duplicate: skipped */
  assert_int_equal(kvbm_index_apply(idx, k, 3, &r0, NULL), KVBM_OK); /* old: skipped */
  assert_int_equal(g.n, 0);
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, H, 3, ov, NULL);
  assert_int_equal(ov[0].prefix[0], 2);
  assert_int_equal(kvbm_index_apply(idx, k, 9, &e2, NULL), KVBM_OK); /* gap 7..8 */
  assert_int_equal(g.n, 1);
  assert_true(g.w.worker_id == 9 && g.w.dp_rank == 2);
  assert_true(g.expected == 7 && g.got == 9);
  kvbm_index_lookup(idx, H, 3, ov, NULL);
  assert_int_equal(ov[0].prefix[0], 3); /* applied despite the gap */
  assert_int_equal(kvbm_index_apply(idx, k, 10, &r0, NULL), KVBM_OK);
  assert_int_equal(g.n, 1);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.duplicates, 2);
  assert_int_equal(st.gaps, 1);
  assert_int_equal(st.events, 4);
  kvbm_index_destroy(idx);
}

/* Ids are not trusted blindly: one id near 2^63 is skipped (not a new
 * mark: the next real id still applies); an id further back than max_gap
 * is a restarted engine (its blocks forgotten, the input applied). */
static void test_ids_hostile(void **state) {
  (void)state;
  kvbm_index_config c = kvbm_index_config_default();
  c.seq.max_gap = 100;
  kvbm_index *idx;
  assert_int_equal(kvbm_index_create(&c, &idx, NULL), KVBM_OK);
  kvbm_worker_key k = {9, 0};
  kvbm_event e0 = stored(H, 1, NULL, KVBM_MEDIUM_GPU);
  kvbm_event e1 = stored(H + 1, 1, &H[0], KVBM_MEDIUM_GPU);
  kvbm_event e2 = stored(H + 2, 1, &H[1], KVBM_MEDIUM_GPU);
  kvbm_event stray = stored(H + 5, 1, NULL, KVBM_MEDIUM_GPU);
  assert_int_equal(kvbm_index_apply(idx, k, 0, &e0, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_apply(idx, k, (uint64_t)1 << 63, &stray, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_apply(idx, k, 1, &e1, NULL), KVBM_OK);
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, H, 3, ov, NULL);
  assert_int_equal(ov[0].prefix[0], 2); /* the stray did not hide id 1 */
  kvbm_index_lookup(idx, H + 5, 1, ov, NULL);
  assert_int_equal(ov[0].prefix[0], 0); /* nor was it applied */
  for (uint64_t id = 2; id < 300; id++) /* (repeats of e1's block: duplicates) */
    assert_int_equal(kvbm_index_apply(idx, k, id, &e1, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_apply(idx, k, 0, &e2, NULL), KVBM_OK); /* restarted */
  kvbm_index_lookup(idx, H, 3, ov, NULL);
  assert_int_equal(ov[0].prefix[0], 0); /* the old blocks are gone */
  kvbm_index_lookup(idx, H + 2, 1, ov, NULL);
  assert_int_equal(ov[0].prefix[0], 1); /* the new stream's block is there */
  assert_int_equal(kvbm_index_apply(idx, k, 1, &e0, NULL), KVBM_OK);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.jumps, 1);
  assert_int_equal(st.resets, 1);
  assert_int_equal(st.gaps, 0);
  kvbm_index_destroy(idx);
}

/* A batch marked reset (the subscriber saw its engine restart) forgets
 * every rank of that worker, blocks and ids, before it is applied. */
static void test_batch_reset(void **state) {
  (void)state;
  kvbm_index *idx;
  kvbm_index_config c = kvbm_index_config_default();
  assert_int_equal(kvbm_index_create(&c, &idx, NULL), KVBM_OK);
  kvbm_event e = stored(H, 4, NULL, KVBM_MEDIUM_GPU);
  kvbm_event e2 = stored(H, 2, NULL, KVBM_MEDIUM_GPU);
  for (int32_t rank = 0; rank < 2; rank++) {
    kvbm_event_batch b = {.seq = 40, .dp_rank = rank, .has_dp_rank = true, .events = &e,
                          .num_events = 1};
    assert_int_equal(kvbm_index_apply_batch(idx, 5, &b, NULL), KVBM_OK);
  }
  kvbm_event_batch other = {.seq = 3, .events = &e, .num_events = 1};
  assert_int_equal(kvbm_index_apply_batch(idx, 6, &other, NULL), KVBM_OK);
  assert_int_equal(kvbm_index_workers(idx), 7);
  kvbm_event_batch r = {.seq = 0, .dp_rank = 0, .has_dp_rank = true, .events = &e2,
                        .num_events = 1, .reset = true};
  assert_int_equal(kvbm_index_apply_batch(idx, 5, &r, NULL), KVBM_OK);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.workers, 2); /* worker 5 rank 0 (anew) and worker 6 */
  assert_int_equal(st.resets, 1);
  kvbm_worker_key k50 = {5, 0}, k51 = {5, 1}, k6 = {6, 0};
  uint32_t s50, s6, x;
  assert_int_equal(kvbm_index_worker_slot(idx, k51, &x), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_index_worker_slot(idx, k50, &s50), KVBM_OK);
  assert_int_equal(kvbm_index_worker_slot(idx, k6, &s6), KVBM_OK);
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, H, 4, ov, NULL);
  assert_int_equal(ov[s50].prefix[0], 2);
  assert_int_equal(ov[s6].prefix[0], 4);
  kvbm_event_batch next = {.seq = 1, .dp_rank = 0, .has_dp_rank = true, .events = &e,
                           .num_events = 1};
  assert_int_equal(kvbm_index_apply_batch(idx, 5, &next, NULL), KVBM_OK); /* ids from 0 */
  kvbm_index_lookup(idx, H, 4, ov, NULL);
  assert_int_equal(ov[s50].prefix[0], 4);
  kvbm_index_destroy(idx);
}

/* A batch through the vLLM msgpack codec, dp_rank from the batch, seq ids. */
static void test_batches(void **state) {
  (void)state;
  gapcall g = {0};
  kvbm_index_config c = kvbm_index_config_default();
  c.on_gap = on_gap;
  c.gap_user = &g;
  kvbm_index *idx;
  assert_int_equal(kvbm_index_create(&c, &idx, NULL), KVBM_OK);
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  kvbm_event evs[2] = {stored(H, 4, NULL, KVBM_MEDIUM_GPU), removed(H + 3, 1, KVBM_MEDIUM_GPU)};
  for (int form = 0; form < 2; form++) {
    kvbm_event_batch b = {.seq = 0, .ts = 1.5, .dp_rank = 3, .has_dp_rank = true,
                          .events = evs, .num_events = 2};
    const uint8_t *data;
    size_t len;
    kvbm_event_encoder_config ec = {.form = (kvbm_event_form)form};
    kvbm_event_encoder *enc;
    assert_int_equal(kvbm_event_encoder_create(&ec, &enc, NULL), KVBM_OK);
    assert_int_equal(kvbm_event_encode(enc, &b, &data, &len, NULL), 0);
    kvbm_event_batch d;
    assert_int_equal(kvbm_event_decode(dec, data, len, (uint64_t)form * 4, &d, NULL), 0);
    assert_int_equal(kvbm_index_apply_batch(idx, 77, &d, NULL), KVBM_OK);
    kvbm_event_encoder_destroy(enc);
  }
  assert_int_equal(g.n, 1); /* seq 0 then 4 */
  assert_true(g.expected == 1 && g.got == 4);
  kvbm_worker_key k = {77, 3};
  uint32_t s;
  assert_int_equal(kvbm_index_worker_slot(idx, k, &s), KVBM_OK);
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, H, 5, ov, NULL);
  assert_int_equal(ov[s].prefix[0], 3);
  kvbm_event_decoder_destroy(dec);
  kvbm_index_destroy(idx);
}

/* Recompute mode: engine hashes are opaque (here: arbitrary numbers); the
 * index chains its own from the tokens, so a lookup of the tokens' hashes
 * finds them, in both schemes, and equals kvbm_hash_chain. */
static void test_recompute(void **state) {
  (void)state;
  for (int sch = 0; sch < 2; sch++) {
    const uint32_t bs = 4;
    kvbm_index *idx = mk(true, (kvbm_hash_scheme)sch, bs, 16);
    uint32_t tok[6 * 4];
    for (unsigned i = 0; i < 24; i++) tok[i] = 1000 + i * 7;
    uint64_t eng[6] = {0xa, 0xb, 0xc, 0xd, 0xe, 0xf};
    kvbm_event e = stored(eng, 3, NULL, KVBM_MEDIUM_GPU);
    e.token_ids = tok;
    e.num_tokens = 12;
    e.block_size = bs;
    apply(idx, 1, e);
    kvbm_event e2 = stored(eng + 3, 2, &eng[2], KVBM_MEDIUM_CPU);
    e2.token_ids = tok + 12;
    e2.num_tokens = 8;
    e2.block_size = bs;
    apply(idx, 1, e2);
    uint64_t h[6];
    assert_int_equal(kvbm_index_hash_tokens(idx, tok, 23, h, 6), 5);
    uint64_t ref[6];
    assert_int_equal(kvbm_hash_chain((kvbm_hash_scheme)sch, 0, tok, 24, bs, ref, 6), 6);
    assert_memory_equal(h, ref, 5 * sizeof *h);
    expect_prefix(idx, ref, 6, 1, 3, 5, 5);
    /* the engine's hashes are not keys */
    expect_prefix(idx, eng, 6, 1, 0, 0, 0);
    /* removes name engine hashes */
    apply(idx, 1, removed(eng + 1, 1, KVBM_MEDIUM_GPU));
    expect_prefix(idx, ref, 6, 1, 1, 1, 1);
    /* an unknown parent: orphans, counted, not stored */
    uint64_t x = 0x99, unknown = 0x1234;
    kvbm_event e3 = stored(&x, 1, &unknown, KVBM_MEDIUM_GPU);
    e3.token_ids = tok;
    e3.num_tokens = bs;
    e3.block_size = bs;
    apply(idx, 1, e3);
    kvbm_index_stats st;
    kvbm_index_stats_get(idx, &st);
    assert_int_equal(st.orphans, 1);
    /* recompute needs every token and the index's block size */
    kvbm_error err;
    kvbm_worker_key k = {1, 0};
    kvbm_event bad = e;
    bad.num_tokens = 11;
    assert_int_equal(kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, &bad, &err), KVBM_EINVAL);
    assert_non_null(strstr(err.msg, "tokens"));
    bad = e;
    bad.token_ids = NULL;
    bad.num_tokens = 0;
    assert_int_equal(kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, &bad, &err), KVBM_EINVAL);
    bad = e;
    bad.block_size = 8;
    assert_int_equal(kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, &bad, &err), KVBM_EINVAL);
    assert_non_null(strstr(err.msg, "block size"));
    kvbm_index_destroy(idx);
  }
}

static void test_bad_input(void **state) {
  (void)state;
  kvbm_index_config c = kvbm_index_config_default();
  kvbm_index *idx;
  kvbm_error err;
  c.block_size = 0;
  assert_int_equal(kvbm_index_create(&c, &idx, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "block size"));
  c = kvbm_index_config_default();
  c.scheme = (kvbm_hash_scheme)7;
  assert_int_equal(kvbm_index_create(&c, &idx, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_index_create(NULL, &idx, &err), KVBM_EINVAL);
  idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  kvbm_worker_key k = {1, 0};
  kvbm_event ev = {.type = (kvbm_event_type)42};
  assert_int_equal(kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, &ev, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "unknown event type"));
  assert_int_equal(kvbm_index_workers(idx), 0); /* nothing added for a bad event */
  ev = (kvbm_event){.type = KVBM_EVENT_STORED, .num_block_hashes = 3};
  assert_int_equal(kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, &ev, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_index_apply(idx, k, KVBM_INDEX_NO_ID, NULL, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_index_apply_batch(idx, 1, NULL, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_index_store(idx, 3, KVBM_TIER_G1, H, 1), KVBM_EINVAL);
  assert_int_equal(kvbm_index_store(idx, MAXW, KVBM_TIER_G1, H, 1), KVBM_EINVAL);
  kvbm_index_destroy(idx);
  kvbm_index_destroy(NULL);
}

/* ---------------------------------------------------------------- model */

#define NW 5
#define NCHAIN 40
#define CLEN 24
#define NH (NCHAIN * CLEN)

typedef struct model {
  uint16_t cnt[NW][3][NH];
  bool live[NW];
} model;

static uint64_t rng_state = 0x1234567;
static uint32_t rnd(uint32_t n) { return (uint32_t)(kvbm_router_rand(&rng_state) % n); }

/* Chains share prefixes: chain c's block k is chain (c / 2)'s block k when
 * k < 4 + c % 8, so hash ids are folded onto a canonical one. */
static uint32_t hid(uint32_t c, uint32_t k) {
  while (c && k < 4 + c % 8) c /= 2;
  return c * CLEN + k;
}
/* Hash values clustered in the table: few high bits differ. */
static uint64_t hval(uint32_t id) { return 0x5bd1e995ull * (id + 1) + ((uint64_t)id << 48); }

/* Tenants: with `tenants` > 1, worker w stores everything under tenant
 * w % tenants (0: no salt, the default namespace; others a cache salt or a
 * LoRA name), and a lookup in tenant q's namespace must see the blocks of
 * tenant q's workers only. */
static const char *const kSalt[] = {NULL, "tenant-a", NULL};
static const char *const kLora[] = {NULL, NULL, "lora-b"};

static void model_check(const model *m, kvbm_index *idx, const uint32_t *slot, int tenants) {
  for (uint32_t c = 0; c < NCHAIN; c++) {
    uint64_t e[CLEN], h[CLEN];
    for (uint32_t k = 0; k < CLEN; k++) e[k] = hval(hid(c, k));
    uint32_t n = 1 + rnd(CLEN);
    int q = (int)rnd((uint32_t)tenants);
    kvbm_index_keys(idx, kvbm_index_namespace(kSalt[q], kLora[q]), e, CLEN, h);
    kvbm_overlap ov[MAXW];
    uint64_t live;
    kvbm_index_lookup(idx, h, n, ov, &live);
    for (int w = 0; w < NW; w++) {
      if (!m->live[w]) continue;
      assert_true(live >> slot[w] & 1);
      for (int t = 0; t < 3; t++) {
        uint32_t p = 0;
        while (w % tenants == q && p < n) {
          bool held = false;
          for (int u = 0; u <= t; u++) held |= m->cnt[w][u][hid(c, p)] > 0;
          if (!held) break;
          p++;
        }
        if (ov[slot[w]].prefix[t] != p)
          fail_msg("chain %u len %u worker %d tier %d tenant %d: index %u, model %u", c, n, w, t,
                   q, ov[slot[w]].prefix[t], p);
      }
    }
  }
}

/* kvbm_index_worker_blocks: each live worker's distinct held ids per tier,
 * as the model counts them; a free slot answers ENOTFOUND. */
static void model_check_sizes(const model *m, kvbm_index *idx, const uint32_t *slot) {
  for (int w = 0; w < NW; w++) {
    uint64_t got[KVBM_TIER_COUNT] = {0};
    if (!m->live[w]) continue;
    assert_int_equal(kvbm_index_worker_blocks(idx, slot[w], got), KVBM_OK);
    for (int t = 0; t < KVBM_TIER_COUNT; t++) {
      uint64_t want = 0;
      for (uint32_t id = 0; t < 3 && id < NH; id++) want += m->cnt[w][t][id] > 0;
      if (got[t] != want)
        fail_msg("worker %d tier %d: index says %" PRIu64 " blocks, model %" PRIu64, w, t,
                 got[t], want);
    }
  }
}

/* The workers the model says are closed (what lets lookups bisect): every
 * held block's parent, its chain predecessor (as the stores name it), is
 * held in some tier, and nothing is held outside the device tier. With
 * device blocks only the index must count exactly these in
 * stats.closed_workers; with all tiers it may count fewer (a worker it
 * walks rather than bisects is slower, not wrong: the lookups above are
 * checked either way), never more. */
static void model_check_closed(const model *m, kvbm_index *idx, bool exact) {
  uint32_t want = 0;
  for (int w = 0; w < NW; w++) {
    if (!m->live[w]) continue;
    bool closed = true;
    for (uint32_t id = 0; id < NH && closed; id++) {
      bool held = m->cnt[w][0][id] || m->cnt[w][1][id] || m->cnt[w][2][id];
      if (m->cnt[w][1][id] || m->cnt[w][2][id]) closed = false;
      if (!held || id % CLEN == 0) continue;
      uint32_t par = hid(id / CLEN, id % CLEN - 1);
      closed = m->cnt[w][0][par] || m->cnt[w][1][par] || m->cnt[w][2][par];
    }
    want += closed;
  }
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  if (exact ? st.closed_workers != want : st.closed_workers > want)
    fail_msg("closed workers: index %u, model %u", st.closed_workers, want);
}

/* Events are applied one by one (kvbm_index_apply) or, with `batched`,
 * gathered per worker into batches of up to 24 (kvbm_index_apply_batch,
 * which prefetches events ahead and a removed block's parent) that are
 * applied before anything reads the index. */
typedef struct pending {
  kvbm_worker_key key;
  kvbm_event ev[24];
  uint64_t h[24][CLEN];
  size_t n;
} pending;

static void flush(kvbm_index *idx, pending *p) {
  if (!p->n) return;
  kvbm_event_batch b = {.seq = KVBM_INDEX_NO_ID, .events = p->ev, .num_events = p->n,
                        .has_dp_rank = true, .dp_rank = 0};
  kvbm_error err;
  int rc = kvbm_index_apply_batch(idx, p->key.worker_id, &b, &err);
  if (rc) fail_msg("apply_batch: %s", err.msg);
  p->n = 0;
}

static void submit(kvbm_index *idx, pending *p, bool batched, kvbm_worker_key key,
                   kvbm_event ev) {
  kvbm_error err;
  if (!batched) {
    assert_int_equal(kvbm_index_apply(idx, key, KVBM_INDEX_NO_ID, &ev, &err), KVBM_OK);
    return;
  }
  if (p->n && (p->key.worker_id != key.worker_id || p->n == 24)) flush(idx, p);
  p->key = key;
  memcpy(p->h[p->n], ev.block_hashes, ev.num_block_hashes * sizeof(uint64_t));
  ev.block_hashes = p->h[p->n];
  p->ev[p->n++] = ev;
}

/* tiers: 3 = all tiers at random, 1 = device only (lookups may bisect);
 * tail_first: removes take the last held block of a chain run (engines
 * evict tail first), keeping tables closed most of the time. */
static void run_model(int tiers, bool tail_first, int tenants, bool batched) {
  static model m;
  static pending pend;
  pend.n = 0;
  uint64_t closed_seen = 0;
  memset(&m, 0, sizeof m);
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 8); /* grows many times */
  uint32_t slot[NW];
  kvbm_error err;
  static const kvbm_medium med[3] = {KVBM_MEDIUM_GPU, KVBM_MEDIUM_CPU, KVBM_MEDIUM_DISK};
  for (int step = 0; step < 40000; step++) {
    int w = (int)rnd(NW);
    kvbm_worker_key key = {(uint64_t)w * 11, 0};
    if (!m.live[w]) {
      assert_int_equal(kvbm_index_add_worker(idx, key, &slot[w], &err), KVBM_OK);
      m.live[w] = true;
    }
    uint32_t c = rnd(NCHAIN), t = rnd((uint32_t)tiers), op = rnd(100);
    if (op < 55) { /* store a run of a chain */
      uint32_t a = rnd(CLEN), n = 1 + rnd(CLEN - a);
      uint64_t h[CLEN];
      for (uint32_t k = 0; k < n; k++) {
        h[k] = hval(hid(c, a + k));
        m.cnt[w][t][hid(c, a + k)]++;
      }
      uint64_t par = a ? hval(hid(c, a - 1)) : 0;
      kvbm_event ev = stored(h, n, a ? &par : NULL, med[t]);
      ev.cache_salt = kSalt[w % tenants];
      ev.lora_name = kLora[w % tenants];
      submit(idx, &pend, batched, key, ev);
    } else if (op < 97) { /* remove some, held or not */
      uint32_t n = 1 + rnd(4);
      uint64_t h[4];
      uint32_t last = 0; /* tail first: the end of the chain's held prefix */
      while (tail_first && last < CLEN && m.cnt[w][t][hid(c, last)]) last++;
      for (uint32_t k = 0; k < n; k++) {
        uint32_t id = hid(c, tail_first ? (last > k ? last - 1 - k : 0) : rnd(CLEN));
        h[k] = hval(id);
        if (m.cnt[w][t][id]) m.cnt[w][t][id]--;
      }
      kvbm_event ev = removed(h, n, med[t]);
      submit(idx, &pend, batched, key, ev);
    } else if (op < 99) {
      flush(idx, &pend);
      kvbm_event ev = {.type = KVBM_EVENT_CLEARED};
      assert_int_equal(kvbm_index_apply(idx, key, KVBM_INDEX_NO_ID, &ev, &err), KVBM_OK);
      memset(m.cnt[w], 0, sizeof m.cnt[w]);
    } else {
      flush(idx, &pend);
      assert_int_equal(kvbm_index_remove_worker(idx, key), KVBM_OK);
      memset(m.cnt[w], 0, sizeof m.cnt[w]);
      m.live[w] = false;
    }
    if (step % 97 == 0) {
      flush(idx, &pend);
      model_check(&m, idx, slot, tenants);
      model_check_closed(&m, idx, tiers == 1);
      model_check_sizes(&m, idx, slot);
      kvbm_index_stats st;
      kvbm_index_stats_get(idx, &st);
      closed_seen += st.closed_workers;
    }
  }
  if (tiers == 1 && tail_first) assert_true(closed_seen > 0); /* the bisect path ran */
  if (tiers == 3 && !tail_first) (void)closed_seen;
  flush(idx, &pend);
  model_check(&m, idx, slot, tenants);
  model_check_closed(&m, idx, tiers == 1);
  model_check_sizes(&m, idx, slot);
  /* entries: the distinct hashes each worker holds, summed */
  uint64_t distinct = 0;
  for (uint32_t id = 0; id < NH; id++)
    for (int w = 0; w < NW; w++) {
      bool any = false;
      for (int t = 0; t < 3; t++) any |= m.live[w] && m.cnt[w][t][id];
      distinct += any;
    }
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.entries, distinct);
  assert_true(st.table_slots >= 64);
  /* drop everybody: the table empties */
  for (int w = 0; w < NW; w++)
    if (m.live[w]) {
      kvbm_worker_key key = {(uint64_t)w * 11, 0};
      assert_int_equal(kvbm_index_remove_worker(idx, key), KVBM_OK);
    }
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.entries, 0);
  assert_int_equal(st.workers, 0);
  uint64_t none[KVBM_TIER_COUNT];
  assert_int_equal(kvbm_index_worker_blocks(idx, slot[0], none), KVBM_ENOTFOUND);
  kvbm_index_destroy(idx);
}

static void test_model(void **state) {
  (void)state;
  run_model(3, false, 1, false);
}
static void test_model_device(void **state) {
  (void)state;
  run_model(1, false, 1, false);
}
static void test_model_tail_first(void **state) {
  (void)state;
  run_model(1, true, 1, false);
}
/* The same through kvbm_index_apply_batch (its prefetches read slots
 * ahead of the events that change them). */
static void test_model_batched(void **state) {
  (void)state;
  run_model(3, false, 1, true);
  run_model(1, true, 1, true);
}
static void test_model_tenants(void **state) {
  (void)state;
  run_model(3, false, 3, false);
  run_model(1, true, 3, true);
}

static kvbm_event salted(kvbm_event e, const char *salt, const char *lora) {
  e.cache_salt = salt;
  e.lora_name = lora;
  return e;
}

/* Expect worker `wid`'s device prefix of engine hashes h[0..n) looked up
 * in the namespace of (salt, lora). */
static void expect_ns(kvbm_index *idx, const char *salt, const char *lora, const uint64_t *h,
                      size_t n, uint64_t wid, uint32_t dev) {
  uint64_t k[8];
  kvbm_index_keys(idx, kvbm_index_namespace(salt, lora), h, n, k);
  kvbm_overlap ov[MAXW];
  kvbm_index_lookup(idx, k, n, ov, NULL);
  uint32_t s = slot_of(idx, wid);
  if (ov[s].prefix[0] != dev)
    fail_msg("worker %llu, salt %s lora %s: device prefix %u, expected %u",
             (unsigned long long)wid, salt ? salt : "-", lora ? lora : "-", ov[s].prefix[0], dev);
}

/* Tenants never match each other's blocks: the same engine hashes stored
 * with a salt, a LoRA name, both, or neither are four namespaces; removes
 * (which carry neither) find a namespaced block; a child stored without
 * the salt continues its parent's namespace. */
static void test_namespaces(void **state) {
  (void)state;
  assert_int_equal(kvbm_index_namespace(NULL, NULL), 0);
  assert_int_equal(kvbm_index_namespace("", ""), 0);
  assert_true(kvbm_index_namespace("a", NULL) != 0);
  assert_true(kvbm_index_namespace("a", NULL) != kvbm_index_namespace(NULL, "a"));
  assert_true(kvbm_index_namespace("a", "b") != kvbm_index_namespace("ab", NULL));
  assert_true(kvbm_index_namespace("a", "b") == kvbm_index_namespace("a", "b"));
  kvbm_index *idx = mk(false, KVBM_HASH_NATIVE, 16, 16);
  apply(idx, 1, salted(stored(H, 4, NULL, KVBM_MEDIUM_GPU), "tenant-a", NULL));
  apply(idx, 2, stored(H, 4, NULL, KVBM_MEDIUM_GPU));
  apply(idx, 3, salted(stored(H, 4, NULL, KVBM_MEDIUM_GPU), NULL, "lora-x"));
  apply(idx, 4, salted(stored(H, 4, NULL, KVBM_MEDIUM_GPU), "tenant-a", "lora-x"));
  static const char *const salts[] = {"tenant-a", NULL, NULL, "tenant-a"};
  static const char *const loras[] = {NULL, NULL, "lora-x", "lora-x"};
  for (int q = 0; q < 4; q++)
    for (int w = 1; w <= 4; w++) expect_ns(idx, salts[q], loras[q], H, 5, (uint64_t)w, q + 1 == w ? 4 : 0);
  expect_ns(idx, "tenant-b", NULL, H, 5, 1, 0); /* another salt: nothing */
  /* the default namespace is the engine's hashes themselves */
  expect_prefix(idx, H, 5, 2, 4, 4, 4);
  expect_prefix(idx, H, 5, 1, 0, 0, 0);
  /* a remove names no salt: it finds the namespaced block */
  apply(idx, 1, removed(H + 2, 1, KVBM_MEDIUM_GPU));
  expect_ns(idx, "tenant-a", NULL, H, 5, 1, 2);
  /* a child stored without the salt continues its parent's namespace */
  apply(idx, 1, stored(H + 2, 3, &H[1], KVBM_MEDIUM_GPU));
  expect_ns(idx, "tenant-a", NULL, H, 6, 1, 5);
  expect_prefix(idx, H, 6, 1, 0, 0, 0);
  /* and is removed from it; duplicates count per namespace too */
  apply(idx, 1, salted(stored(H, 1, NULL, KVBM_MEDIUM_GPU), "tenant-a", NULL));
  apply(idx, 1, removed(H, 1, KVBM_MEDIUM_GPU));
  expect_ns(idx, "tenant-a", NULL, H, 6, 1, 5); /* one copy left */
  apply(idx, 1, removed(H, 1, KVBM_MEDIUM_GPU));
  expect_ns(idx, "tenant-a", NULL, H, 6, 1, 0);
  kvbm_index_stats st;
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.unknown_removed, 0);
  /* a clear forgets the namespaced blocks too */
  kvbm_event clr = {.type = KVBM_EVENT_CLEARED};
  apply(idx, 4, clr);
  expect_ns(idx, "tenant-a", "lora-x", H, 5, 4, 0);
  apply(idx, 4, removed(H, 1, KVBM_MEDIUM_GPU));
  kvbm_index_stats_get(idx, &st);
  assert_int_equal(st.unknown_removed, 1);
  kvbm_index_destroy(idx);
}

/* Recompute mode: the namespace is the root of the chain, so the same
 * tokens under two salts give two chains; kvbm_index_hash_tokens_ns gives
 * the keys a request of that tenant looks up. */
static void test_namespaces_recompute(void **state) {
  (void)state;
  for (int scheme = 0; scheme < 2; scheme++) {
    kvbm_index *idx = mk(true, (kvbm_hash_scheme)scheme, 4, 16);
    uint32_t tok[12];
    for (int i = 0; i < 12; i++) tok[i] = (uint32_t)(1000 + i);
    kvbm_event a = stored(H, 3, NULL, KVBM_MEDIUM_GPU), b = stored(H + 3, 3, NULL, KVBM_MEDIUM_GPU);
    a.token_ids = b.token_ids = tok;
    a.num_tokens = b.num_tokens = 12;
    a.block_size = b.block_size = 4;
    apply(idx, 1, salted(a, "tenant-a", NULL));
    apply(idx, 2, b);
    uint64_t ka[3], k0[3], kplain[3];
    assert_int_equal(kvbm_index_hash_tokens_ns(idx, kvbm_index_namespace("tenant-a", NULL), tok,
                                               12, ka, 3), 3);
    assert_int_equal(kvbm_index_hash_tokens_ns(idx, 0, tok, 12, k0, 3), 3);
    assert_int_equal(kvbm_index_hash_tokens(idx, tok, 12, kplain, 3), 3);
    assert_memory_equal(k0, kplain, sizeof k0); /* namespace 0 is the plain chain */
    kvbm_overlap ov[MAXW];
    kvbm_index_lookup(idx, ka, 3, ov, NULL);
    assert_int_equal(ov[slot_of(idx, 1)].prefix[0], 3);
    assert_int_equal(ov[slot_of(idx, 2)].prefix[0], 0);
    kvbm_index_lookup(idx, k0, 3, ov, NULL);
    assert_int_equal(ov[slot_of(idx, 1)].prefix[0], 0);
    assert_int_equal(ov[slot_of(idx, 2)].prefix[0], 3);
    /* keys of index keys are themselves in recompute mode */
    uint64_t same[3];
    kvbm_index_keys(idx, 12345, ka, 3, same);
    assert_memory_equal(same, ka, sizeof ka);
    /* a remove (no salt) of the salted worker's engine hash */
    apply(idx, 1, removed(H + 2, 1, KVBM_MEDIUM_GPU));
    kvbm_index_lookup(idx, ka, 3, ov, NULL);
    assert_int_equal(ov[slot_of(idx, 1)].prefix[0], 2);
    /* SGLang's token pairs: blocks x size + 1 tokens, the blocks' own first */
    kvbm_event p = stored(H + 6, 2, NULL, KVBM_MEDIUM_GPU);
    p.token_ids = tok;
    p.num_tokens = 9;
    p.block_size = 4;
    p.token_pairs = true;
    apply(idx, 3, p);
    kvbm_index_lookup(idx, k0, 3, ov, NULL);
    assert_int_equal(ov[slot_of(idx, 3)].prefix[0], 2);
    kvbm_index_destroy(idx);
  }
}

/* Copies of a block on the remote tier (G4) count like the others: stored
 * three times, removed twice, it is still held. */
static void test_remote_copies(void **state) {
  (void)state;
  for (int rc = 0; rc < 2; rc++) {
    kvbm_index *idx = mk(rc, KVBM_HASH_NATIVE, 1, 16);
    uint32_t tok[1] = {7};
    kvbm_event ev = stored(H, 1, NULL, KVBM_MEDIUM_REMOTE);
    ev.token_ids = tok;
    ev.num_tokens = 1;
    ev.block_size = 1;
    for (int i = 0; i < 3; i++) apply(idx, 1, ev);
    for (int i = 0; i < 2; i++) apply(idx, 1, removed(H, 1, KVBM_MEDIUM_REMOTE));
    uint64_t k[1];
    if (rc) kvbm_index_hash_tokens(idx, tok, 1, k, 1);
    else k[0] = H[0];
    expect_prefix4(idx, k, 1, 1, 0, 0, 0, 1);
    apply(idx, 1, removed(H, 1, KVBM_MEDIUM_REMOTE));
    expect_prefix4(idx, k, 1, 1, 0, 0, 0, 0);
    kvbm_index_destroy(idx);
  }
}

/* Snapshots: a copy restored from one holds the same blocks (its own
 * snapshot is byte-equal, every lookup agrees), takes later events like
 * the original and skips ids already applied; hostile snapshots are
 * refused and leave the index empty. */
static kvbm_index *busy_index(bool recompute) {
  kvbm_index *idx = mk(recompute, KVBM_HASH_NATIVE, 1, 8);
  uint32_t tok[8];
  for (int i = 0; i < 8; i++) tok[i] = (uint32_t)(50 + i);
  kvbm_error err;
  for (uint64_t w = 1; w <= 4; w++) {
    kvbm_event ev[3] = {stored(H, 5, NULL, KVBM_MEDIUM_GPU),
                        stored(H + 5, 2, &H[4], w % 2 ? KVBM_MEDIUM_CPU : KVBM_MEDIUM_REMOTE),
                        removed(H + 2, 1, KVBM_MEDIUM_GPU)}; /* a broken chain: a ghost */
    for (int i = 0; i < 3; i++) {
      ev[i].token_ids = tok + (ev[i].has_parent ? 5 : 0);
      ev[i].num_tokens = ev[i].num_block_hashes;
      ev[i].block_size = 1;
      if (w == 3) ev[i].cache_salt = "tenant-a";
    }
    kvbm_event_batch b = {.seq = 10 * w, .dp_rank = (int32_t)(w % 2), .has_dp_rank = true,
                          .events = ev, .num_events = 3};
    assert_int_equal(kvbm_index_apply_batch(idx, w, &b, &err), KVBM_OK);
    b.num_events = 1; /* a duplicate block: stored twice */
    b.seq++;
    assert_int_equal(kvbm_index_apply_batch(idx, w, &b, &err), KVBM_OK);
  }
  return idx;
}

static void same_lookups(kvbm_index *a, kvbm_index *b) {
  for (size_t off = 0; off < 8; off++)
    for (int q = 0; q < 2; q++) {
      uint64_t k[8];
      kvbm_index_keys(a, kvbm_index_namespace(q ? "tenant-a" : NULL, NULL), H + off, 8 - off, k);
      kvbm_overlap oa[MAXW], ob[MAXW];
      uint64_t la, lb;
      kvbm_index_lookup(a, k, 8 - off, oa, &la);
      kvbm_index_lookup(b, k, 8 - off, ob, &lb);
      assert_int_equal(__builtin_popcountll(la), __builtin_popcountll(lb));
      for (uint32_t s = 0; s < MAXW; s++) {
        kvbm_worker_key wk;
        if (!kvbm_index_slot_worker(a, s, &wk)) continue;
        uint32_t t;
        assert_int_equal(kvbm_index_worker_slot(b, wk, &t), KVBM_OK);
        assert_memory_equal(&oa[s], &ob[t], sizeof oa[s]);
      }
    }
}

static void test_snapshot(void **state) {
  (void)state;
  for (int rc = 0; rc < 2; rc++) {
    kvbm_index *a = busy_index(rc);
    uint8_t *sa, *sb;
    size_t la, lb;
    kvbm_error err;
    assert_int_equal(kvbm_index_snapshot(a, &sa, &la, &err), KVBM_OK);
    kvbm_index *b = mk(rc, KVBM_HASH_NATIVE, 1, 2); /* smaller: tables grow on restore */
    if (kvbm_index_restore(b, sa, la, &err)) fail_msg("%s", err.msg);
    assert_int_equal(kvbm_index_restore(b, sa, la, &err), KVBM_ESTATE);
    assert_int_equal(kvbm_index_snapshot(b, &sb, &lb, &err), KVBM_OK);
    assert_int_equal(la, lb);
    assert_memory_equal(sa, sb, la); /* the same index, byte for byte */
    free(sb);
    same_lookups(a, b);
    kvbm_index_stats st1, st2;
    kvbm_index_stats_get(a, &st1);
    kvbm_index_stats_get(b, &st2);
    assert_int_equal(st1.entries, st2.entries);
    assert_int_equal(st1.closed_workers, st2.closed_workers);
    for (uint32_t s = 0; s < MAXW; s++) { /* every worker's size, tier by tier */
      kvbm_worker_key wk;
      uint32_t t;
      uint64_t na[KVBM_TIER_COUNT], nb[KVBM_TIER_COUNT];
      if (!kvbm_index_slot_worker(a, s, &wk)) continue;
      assert_int_equal(kvbm_index_worker_slot(b, wk, &t), KVBM_OK);
      assert_int_equal(kvbm_index_worker_blocks(a, s, na), KVBM_OK);
      assert_int_equal(kvbm_index_worker_blocks(b, t, nb), KVBM_OK);
      assert_memory_equal(na, nb, sizeof na);
    }
    /* later input applies alike; input the snapshot already had is skipped */
    kvbm_event rm = removed(H, 2, KVBM_MEDIUM_GPU);
    kvbm_event_batch late = {.seq = 12, .dp_rank = 1, .has_dp_rank = true, .events = &rm,
                             .num_events = 1};
    kvbm_event_batch old = {.seq = 30, .dp_rank = 1, .has_dp_rank = true, .events = &rm,
                            .num_events = 1};
    for (int i = 0; i < 2; i++) {
      kvbm_index *x = i ? b : a;
      assert_int_equal(kvbm_index_apply_batch(x, 1, &late, &err), KVBM_OK);
      uint64_t dups = 0;
      kvbm_index_stats_get(x, &st1);
      dups = st1.duplicates;
      assert_int_equal(kvbm_index_apply_batch(x, 3, &old, &err), KVBM_OK);
      kvbm_index_stats_get(x, &st1);
      assert_int_equal(st1.duplicates, dups + 1);
    }
    same_lookups(a, b);
    free(sa);
    assert_int_equal(kvbm_index_snapshot(a, &sa, &la, &err), KVBM_OK);
    assert_int_equal(kvbm_index_snapshot(b, &sb, &lb, &err), KVBM_OK);
    assert_true(la == lb && !memcmp(sa, sb, la));
    free(sb);
    /* a file round trip */
    char dir[] = "/tmp/kvbm_snap_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/index", dir);
    kvbm_index *c = mk(rc, KVBM_HASH_NATIVE, 1, 8);
    assert_int_equal(kvbm_index_load(c, path, &err), KVBM_ENOTFOUND);
    assert_int_equal(kvbm_index_save(a, path, &err), KVBM_OK);
    assert_int_equal(kvbm_index_load(c, path, &err), KVBM_OK);
    assert_int_equal(kvbm_index_snapshot(c, &sb, &lb, &err), KVBM_OK);
    assert_true(la == lb && !memcmp(sa, sb, la));
    free(sb);
    unlink(path);
    rmdir(dir);
    /* another configuration is refused */
    kvbm_index *d = mk(!rc, KVBM_HASH_NATIVE, 1, 8);
    assert_int_equal(kvbm_index_restore(d, sa, la, &err), KVBM_EINVAL);
    assert_non_null(strstr(err.msg, "block size"));
    free(sa);
    kvbm_index_destroy(a);
    kvbm_index_destroy(b);
    kvbm_index_destroy(c);
    kvbm_index_destroy(d);
  }
}

static void seal(uint8_t *p, size_t len) { /* a valid checksum over a forged body */
  uint64_t h = kvbm_hash_salt(p, len - 8);
  for (int i = 0; i < 8; i++) p[len - 8 + i] = (uint8_t)(h >> (8 * i));
}

static void expect_refused(const uint8_t *p, size_t len, int want) {
  kvbm_index *x = mk(false, KVBM_HASH_NATIVE, 1, 8);
  kvbm_error err = {0};
  int rc = kvbm_index_restore(x, p, len, &err);
  if (want && rc != want) fail_msg("got %s (%s), want %s", kvbm_status_name(rc), err.msg, kvbm_status_name(want));
  assert_true(rc != KVBM_OK);
  assert_true(err.msg[0] != '\0');
  assert_int_equal(kvbm_index_workers(x), 0); /* nothing half-restored */
  kvbm_index_destroy(x);
}

/* The layout's offsets (index.c): the header, a worker's record (version
 * 2: 80 bytes, then its group list of 8 + 8 x 16). */
#define WK 40
#define WL (80 + 8 + 8 * 16)

static void test_snapshot_hostile(void **state) {
  (void)state;
  kvbm_index *a = busy_index(false);
  uint8_t *s;
  size_t n;
  assert_int_equal(kvbm_index_snapshot(a, &s, &n, NULL), KVBM_OK);
  kvbm_index_destroy(a);
  /* every truncation, every corrupted byte: an error (the sum) */
  for (size_t cut = 0; cut < n; cut++) {
    uint8_t *t = malloc(cut ? cut : 1);
    memcpy(t, s, cut);
    expect_refused(t, cut, 0);
    free(t);
  }
  uint8_t *c = malloc(n);
  for (size_t i = 0; i < n; i += 3) {
    memcpy(c, s, n);
    c[i] ^= 0x5a;
    expect_refused(c, n, 0);
  }
  /* forged bodies with a valid sum: every value is still checked */
  memcpy(c, s, n);
  c[0] = 'X';
  expect_refused(c, n, KVBM_EMAGIC);
  memcpy(c, s, n);
  c[8] = 3; /* versions 1 (before groups) and 2 load */
  seal(c, n);
  expect_refused(c, n, KVBM_EVERSION);
  memcpy(c, s, n);
  c[32] = 65; /* 65 workers */
  seal(c, n);
  expect_refused(c, n, KVBM_EFORMAT);
  memcpy(c, s, n);
  for (int i = 0; i < 8; i++) c[WK + 64 + i] = 0xff; /* worker 0 declares 2^64-1 blocks */
  seal(c, n);
  expect_refused(c, n, KVBM_EFORMAT);
  memcpy(c, s, n);
  c[WK + WL + 16] = 0; /* worker 0's first block on no tier */
  seal(c, n);
  expect_refused(c, n, KVBM_EFORMAT);
  memcpy(c, s, n);
  c[WK + WL + 16] = 0x30; /* beyond the 4 tier bits */
  seal(c, n);
  expect_refused(c, n, KVBM_EFORMAT);
  memcpy(c, s, n);
  c[32] = 3; /* one worker fewer: bytes left over */
  seal(c, n);
  expect_refused(c, n, KVBM_ETOOLONG);
  memcpy(c, s, n);
  c[32] = 5; /* one more than there is */
  seal(c, n);
  expect_refused(c, n, KVBM_ETRUNCATED);
  /* the same worker twice: the first worker's bytes where the second's are */
  uint8_t *dup = malloc(2 * n);
  size_t w0 = WK + WL + 24 * (size_t)(s[WK + 64] | s[WK + 65] << 8) +
              40 * (size_t)(s[WK + 72] | s[WK + 73] << 8);
  memcpy(dup, s, w0);
  memcpy(dup + w0, s + WK, w0 - WK);
  memcpy(dup + 2 * w0 - WK, s + w0, n - w0);
  dup[32] = 5;
  seal(dup, n + w0 - WK);
  expect_refused(dup, n + w0 - WK, KVBM_EFORMAT);
  /* a worker's flags beyond its two bits */
  memcpy(c, s, n);
  c[WK + 12] = 4;
  seal(c, n);
  expect_refused(c, n, KVBM_EFORMAT);
  free(dup);
  free(c);
  free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefixes),  cmocka_unit_test(test_tiers),
      cmocka_unit_test(test_lean_mixed), cmocka_unit_test(test_lean_hints),
      cmocka_unit_test(test_lean_removed_salted), cmocka_unit_test(test_lean_long_batches),
      cmocka_unit_test(test_lean_store_over_held),
      cmocka_unit_test(test_bisect_guess),
      cmocka_unit_test(test_duplicates_and_clear), cmocka_unit_test(test_workers),
      cmocka_unit_test(test_ids),       cmocka_unit_test(test_batches),
      cmocka_unit_test(test_recompute), cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_model),    cmocka_unit_test(test_model_device),
      cmocka_unit_test(test_model_tail_first), cmocka_unit_test(test_model_batched),
      cmocka_unit_test(test_ids_hostile), cmocka_unit_test(test_batch_reset),
      cmocka_unit_test(test_namespaces), cmocka_unit_test(test_namespaces_recompute),
      cmocka_unit_test(test_model_tenants), cmocka_unit_test(test_remote_copies),
      cmocka_unit_test(test_snapshot),   cmocka_unit_test(test_snapshot_hostile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
