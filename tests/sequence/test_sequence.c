/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_sequence.c: the engine-facing sequence API over a pool.
 *
 * Prefill (matching at most L - 1 tokens, all or nothing), append (allocate
 * on a boundary, register and dedup on fill), fork (shared full blocks,
 * copied partial tail) and destroy (tail first), each checked against the
 * pool's own view of the blocks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/sequence.h"

#define B 4

static kvbm_pool *mkpool(uint32_t n) {
  kvbm_pool_config c = kvbm_pool_config_default(n, B);
  kvbm_pool *p;
  assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_OK);
  return p;
}

static void toks(uint32_t *t, size_t n, uint32_t base) {
  for (size_t i = 0; i < n; i++) t[i] = base + (uint32_t)i;
}

static kvbm_pool_stats stats(kvbm_pool *p) {
  kvbm_pool_stats s;
  kvbm_pool_stats_get(p, &s);
  return s;
}

static uint32_t refs(kvbm_pool *p, uint32_t id) {
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
  return bi.refcount;
}

static void prefill_then_share(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(16);
  uint32_t t[10];
  toks(t, 10, 100);
  kvbm_seq *a, *b;
  size_t m = 99;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 10, &m), KVBM_OK);
  assert_int_equal(m, 0);
  const uint32_t *ia, *ib;
  size_t na, nb;
  kvbm_seq_blocks(a, &ia, &na);
  assert_int_equal(na, 3); /* 4 + 4 + 2 */
  assert_int_equal(kvbm_seq_num_tokens(a), 10);
  assert_int_equal(stats(p).registered, 2);
  uint64_t h0, h1;
  assert_int_equal(kvbm_seq_block_hash(a, 0, &h0), KVBM_OK);
  assert_int_equal(kvbm_seq_block_hash(a, 1, &h1), KVBM_OK);
  assert_int_equal(kvbm_seq_block_hash(a, 2, &h1), KVBM_EINVAL); /* partial */
  assert_int_equal(kvbm_seq_block_hash(a, 1, &h1), KVBM_OK);
  uint64_t want[2];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, t, 10, B, want, 2);
  assert_true(h0 == want[0] && h1 == want[1]);

  /* The same prompt again shares both full blocks. */
  assert_int_equal(kvbm_seq_create(p, 0, 0, &b), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(b, t, 10, &m), KVBM_OK);
  assert_int_equal(m, 8);
  kvbm_seq_blocks(b, &ib, &nb);
  assert_int_equal(nb, 3);
  assert_int_equal(ib[0], ia[0]);
  assert_int_equal(ib[1], ia[1]);
  assert_int_not_equal(ib[2], ia[2]); /* partial tails are private */
  assert_int_equal(refs(p, ia[0]), 2);
  kvbm_seq_destroy(a);
  kvbm_seq_destroy(b);
  kvbm_pool_stats s = stats(p);
  assert_int_equal(s.active, 0);
  assert_int_equal(s.cached, 2);
  assert_int_equal(s.free, 14);
  kvbm_pool_destroy(p);
}

/* A prompt of L tokens matches at most L - 1: with L = 8 (two full blocks
 * cached) only the first block matches; the second is computed again and
 * deduplicated onto the cached one when it registers. */
static void match_stops_before_last_token(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(8);
  uint32_t t[8];
  toks(t, 8, 7);
  kvbm_seq *a, *b;
  size_t m;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 8, &m), KVBM_OK);
  const uint32_t *ia, *ib;
  size_t na, nb;
  kvbm_seq_blocks(a, &ia, &na);
  uint32_t a0 = ia[0], a1 = ia[1];
  kvbm_seq_destroy(a);
  assert_int_equal(kvbm_seq_create(p, 0, 0, &b), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(b, t, 8, &m), KVBM_OK);
  assert_int_equal(m, 4);
  kvbm_seq_blocks(b, &ib, &nb);
  assert_int_equal(nb, 2);
  assert_int_equal(ib[0], a0);
  assert_int_equal(ib[1], a1); /* dedup */
  assert_int_equal(stats(p).dedup, 1);
  assert_int_equal(stats(p).allocated, 3);
  kvbm_seq_destroy(b);
  kvbm_pool_destroy(p);
}

/* Not enough blocks: nothing changes, not even which block is evicted next. */
static void prefill_is_all_or_nothing(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(4);
  uint32_t t[16];
  toks(t, 12, 500);
  kvbm_seq *a, *b;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 12, NULL), KVBM_OK); /* 3 blocks */
  const uint32_t *ia;
  size_t na;
  kvbm_seq_blocks(a, &ia, &na);
  uint32_t tail = ia[2];
  kvbm_seq_destroy(a); /* cache order: tail, middle, head */
  kvbm_pool_stats before = stats(p);
  /* 16 tokens sharing the first 2 blocks: needs 2 more (3rd differs), but
   * only free 1 + cached 3 - 2 matched = 2 -> fits. Make it need 3. */
  toks(t + 8, 8, 9000);
  uint32_t big[20];
  memcpy(big, t, 16 * sizeof *t);
  toks(big + 16, 4, 77);
  assert_int_equal(kvbm_seq_create(p, 0, 0, &b), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(b, big, 20, NULL), KVBM_ENOSPC);
  kvbm_pool_stats after = stats(p);
  assert_memory_equal(&before, &after, sizeof before);
  assert_int_equal(kvbm_seq_num_tokens(b), 0);
  kvbm_seq_blocks(b, &ia, &na);
  assert_int_equal(na, 0);
  kvbm_seq_destroy(b);
  /* The next eviction still takes the old tail first. */
  uint32_t ids[2];
  assert_int_equal(kvbm_pool_alloc(p, 2, ids), KVBM_OK); /* 1 free + 1 evicted */
  assert_true(ids[0] == tail || ids[1] == tail);
  kvbm_pool_destroy(p);
}

static void append_registers_on_fill(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(8);
  uint32_t t[12];
  toks(t, 12, 1);
  kvbm_seq *a;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 3, NULL), KVBM_OK);
  assert_int_equal(stats(p).registered, 0);
  assert_int_equal(kvbm_seq_append(a, t + 3, 1), KVBM_OK); /* fills block 0 */
  assert_int_equal(stats(p).registered, 1);
  assert_int_equal(kvbm_seq_append(a, t + 4, 6), KVBM_OK); /* fills 1, opens 2 */
  const uint32_t *ia;
  size_t na;
  kvbm_seq_blocks(a, &ia, &na);
  assert_int_equal(na, 3);
  assert_int_equal(stats(p).registered, 2);
  uint64_t want[2], got;
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, t, 8, B, want, 2);
  for (size_t k = 0; k < 2; k++) {
    assert_int_equal(kvbm_seq_block_hash(a, k, &got), KVBM_OK);
    assert_true(got == want[k]);
    assert_true(kvbm_pool_contains(p, want[k]));
  }
  assert_int_equal(kvbm_seq_append(a, t, 0), KVBM_OK);
  assert_int_equal(kvbm_seq_append(NULL, t, 1), KVBM_EINVAL);
  assert_int_equal(kvbm_seq_append(a, NULL, 1), KVBM_EINVAL);
  /* Out of blocks: 8 - 3 = 5 left; 24 more tokens need 6 blocks. */
  uint32_t more[24];
  toks(more, 24, 3000);
  kvbm_pool_stats before = stats(p);
  assert_int_equal(kvbm_seq_append(a, more, 24), KVBM_ENOSPC);
  kvbm_pool_stats after = stats(p);
  assert_memory_equal(&before, &after, sizeof before);
  assert_int_equal(kvbm_seq_num_tokens(a), 10);
  kvbm_seq_destroy(a);
  kvbm_pool_destroy(p);
}

static void fork_shares_full_blocks_and_copies_the_tail(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(8);
  uint32_t t[10];
  toks(t, 10, 40);
  kvbm_seq *a, *c;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 10, NULL), KVBM_OK);
  uint32_t src, dst;
  assert_int_equal(kvbm_seq_fork(a, &c, &src, &dst), KVBM_OK);
  const uint32_t *ia, *ic;
  size_t na, nc;
  kvbm_seq_blocks(a, &ia, &na);
  kvbm_seq_blocks(c, &ic, &nc);
  assert_int_equal(nc, 3);
  assert_int_equal(ic[0], ia[0]);
  assert_int_equal(ic[1], ia[1]);
  assert_int_equal(refs(p, ia[0]), 2);
  assert_int_equal(src, ia[2]);
  assert_int_equal(dst, ic[2]);
  assert_int_not_equal(src, dst);
  kvbm_block_info bs, bd;
  kvbm_block_info_get(p, src, &bs);
  kvbm_block_info_get(p, dst, &bd);
  assert_int_equal(bd.state, KVBM_BLOCK_PARTIAL);
  assert_int_equal(bd.num_tokens, 2);
  assert_memory_equal(bd.tokens, bs.tokens, 2 * sizeof(uint32_t));
  assert_true(bd.parent_hash == bs.parent_hash && bd.has_parent);
  /* Diverge: the child's tail fills with other tokens than the parent's. */
  uint32_t x[2] = {1000, 1001}, y[2] = {2000, 2001};
  assert_int_equal(kvbm_seq_append(a, x, 2), KVBM_OK);
  assert_int_equal(kvbm_seq_append(c, y, 2), KVBM_OK);
  uint64_t ha, hc;
  kvbm_seq_block_hash(a, 2, &ha);
  kvbm_seq_block_hash(c, 2, &hc);
  assert_true(ha != hc);
  assert_int_equal(kvbm_seq_num_tokens(c), 12);
  kvbm_seq_destroy(a);
  assert_int_equal(refs(p, ic[0]), 1);
  kvbm_seq_destroy(c);
  assert_int_equal(stats(p).active, 0);
  assert_int_equal(stats(p).cached, 4);

  /* A sequence ending on a boundary forks without a copy. */
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 8, NULL), KVBM_OK);
  assert_int_equal(kvbm_seq_fork(a, &c, &src, &dst), KVBM_OK);
  assert_int_equal(src, UINT32_MAX);
  assert_int_equal(dst, UINT32_MAX);
  kvbm_seq_destroy(c);
  kvbm_seq_destroy(a);
  kvbm_pool_destroy(p);
}

static void fork_without_room_changes_nothing(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(3);
  uint32_t t[10];
  toks(t, 10, 40);
  kvbm_seq *a, *c = (kvbm_seq *)0x1;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 10, NULL), KVBM_OK); /* all 3 blocks */
  kvbm_pool_stats before = stats(p);
  assert_int_equal(kvbm_seq_fork(a, &c, NULL, NULL), KVBM_ENOSPC);
  kvbm_pool_stats after = stats(p);
  assert_memory_equal(&before, &after, sizeof before);
  assert_ptr_equal(c, (kvbm_seq *)0x1);
  kvbm_seq_destroy(a);
  kvbm_pool_destroy(p);
}

static void destroy_releases_tail_first(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(3);
  uint32_t t[12];
  toks(t, 12, 5);
  kvbm_seq *a;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 12, NULL), KVBM_OK);
  const uint32_t *ia;
  size_t na;
  kvbm_seq_blocks(a, &ia, &na);
  uint32_t order[3] = {ia[2], ia[1], ia[0]};
  kvbm_seq_destroy(a);
  for (int k = 0; k < 3; k++) {
    uint32_t id;
    assert_int_equal(kvbm_pool_alloc(p, 1, &id), KVBM_OK);
    assert_int_equal(id, order[k]);
  }
  kvbm_pool_destroy(p);
}

static void salts_do_not_share(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(8);
  uint32_t t[9];
  toks(t, 9, 5);
  kvbm_seq *a, *b;
  size_t m;
  assert_int_equal(kvbm_seq_create(p, kvbm_hash_salt("lora-a", 6), 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_create(p, kvbm_hash_salt("lora-b", 6), 0, &b), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 9, &m), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(b, t, 9, &m), KVBM_OK);
  assert_int_equal(m, 0);
  assert_int_equal(stats(p).registered, 4);
  kvbm_seq_destroy(a);
  kvbm_seq_destroy(b);
  kvbm_pool_destroy(p);
}

static void bad_calls(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(8);
  uint32_t t[4] = {1, 2, 3, 4};
  kvbm_seq *a;
  assert_int_equal(kvbm_seq_create(NULL, 0, 0, &a), KVBM_EINVAL);
  assert_int_equal(kvbm_seq_create(p, 0, 0, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 0, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_seq_prefill(a, NULL, 4, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_seq_prefill(a, t, 4, NULL), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 4, NULL), KVBM_ESTATE);
  assert_int_equal(kvbm_seq_fork(NULL, &a, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_seq_fork(a, NULL, NULL, NULL), KVBM_EINVAL);
  kvbm_seq_destroy(a);
  kvbm_seq_destroy(NULL);
  kvbm_pool_destroy(p);
}

/* A plan with the caller's hashes (and, in pool B, a prefix the caller
 * matched itself) gives exactly what kvbm_seq_prefill gives: the same
 * matches, block tables and pool counts, over prompts that share
 * prefixes, in a pool small enough to evict. */
static void prefill_plan_equals_prefill(void **state) {
  (void)state;
  kvbm_pool *pa = mkpool(12), *pb = mkpool(12);
  kvbm_seq *keep_a = NULL, *keep_b = NULL;
  uint32_t seed = 7;
  for (int round = 0; round < 200; round++) {
    seed = seed * 1103515245u + 12345u;
    size_t n = 1 + (seed >> 8) % 14;
    uint32_t t[16];
    for (size_t i = 0; i < n; i++) t[i] = (i < 6 ? (seed >> 20) % 3 : (uint32_t)round) * 100 + (uint32_t)i;
    uint64_t h[4];
    kvbm_hash_chain(KVBM_HASH_NATIVE, 0, t, n, B, h, n / B);
    kvbm_seq *a, *b;
    assert_int_equal(kvbm_seq_create(pa, 0, 0, &a), KVBM_OK);
    assert_int_equal(kvbm_seq_create(pb, 0, 0, &b), KVBM_OK);
    size_t ma = 99, mb = 99;
    int ra = kvbm_seq_prefill(a, t, n, &ma);
    /* The caller holds what it finds of the prefix (every other round). */
    uint32_t held[4];
    size_t nheld = 0;
    while (round % 2 && nheld < (n - 1) / B && kvbm_pool_match(pb, h[nheld], &held[nheld]) == KVBM_OK)
      nheld++;
    kvbm_seq_plan plan = {.hashes = h, .held = held, .nheld = nheld};
    int rb = kvbm_seq_prefill_plan(b, t, n, &plan, &mb);
    assert_int_equal(ra, rb);
    if (rb) /* ENOSPC: the caller keeps its references */
      for (size_t k = nheld; k-- > 0;) assert_int_equal(kvbm_block_release(pb, held[k], 0), KVBM_OK);
    if (!ra) {
      assert_int_equal(ma, mb);
      const uint32_t *ia, *ib;
      size_t na, nb;
      kvbm_seq_blocks(a, &ia, &na);
      kvbm_seq_blocks(b, &ib, &nb);
      assert_int_equal(na, nb);
      assert_memory_equal(ia, ib, na * sizeof *ia);
      for (size_t k = 0; k < n / B; k++) {
        uint64_t x;
        assert_int_equal(kvbm_seq_block_hash(b, k, &x), KVBM_OK);
        assert_true(x == h[k]);
      }
    }
    kvbm_pool_stats sa = stats(pa), sb = stats(pb);
    assert_int_equal(sa.free, sb.free);
    assert_int_equal(sa.cached, sb.cached);
    assert_int_equal(sa.active, sb.active);
    assert_int_equal(sa.evicted, sb.evicted);
    /* Every third pair stays alive one round more: active blocks too. */
    kvbm_seq_destroy(keep_a);
    kvbm_seq_destroy(keep_b);
    keep_a = keep_b = NULL;
    if (round % 3 == 0) {
      keep_a = a;
      keep_b = b;
    } else {
      kvbm_seq_destroy(a);
      kvbm_seq_destroy(b);
    }
  }
  kvbm_seq_destroy(keep_a);
  kvbm_seq_destroy(keep_b);
  kvbm_pool_destroy(pa);
  kvbm_pool_destroy(pb);
}

/* Held blocks pass to the sequence (no reference taken twice), and a plan
 * that does not fit changes nothing: the caller still holds its blocks. */
static void prefill_plan_adopts_held_blocks(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(4);
  uint32_t t[9];
  toks(t, 9, 500);
  kvbm_seq *a, *b, *c;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill(a, t, 9, NULL), KVBM_OK); /* 3 blocks */
  const uint32_t *ia;
  size_t na;
  kvbm_seq_blocks(a, &ia, &na);
  uint64_t h[2];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, t, 9, B, h, 2);
  uint32_t held[2];
  assert_int_equal(kvbm_pool_match(p, h[0], &held[0]), KVBM_OK);
  assert_int_equal(kvbm_pool_match(p, h[1], &held[1]), KVBM_OK);
  assert_int_equal(refs(p, ia[0]), 2);
  /* b needs one new block (the tail): only one is free. */
  assert_int_equal(kvbm_seq_create(p, 0, 0, &b), KVBM_OK);
  kvbm_seq_plan plan = {.hashes = h, .held = held, .nheld = 2};
  size_t m = 0;
  assert_int_equal(kvbm_seq_prefill_plan(b, t, 9, &plan, &m), KVBM_OK);
  assert_int_equal(m, 8);
  assert_int_equal(refs(p, ia[0]), 2); /* a's and b's: the caller's passed on */
  assert_int_equal(refs(p, ia[1]), 2);
  /* c holds the same two, but there is no block left for its tail. */
  assert_int_equal(kvbm_pool_match(p, h[0], &held[0]), KVBM_OK);
  assert_int_equal(kvbm_pool_match(p, h[1], &held[1]), KVBM_OK);
  assert_int_equal(kvbm_seq_create(p, 0, 0, &c), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill_plan(c, t, 9, &plan, &m), KVBM_ENOSPC);
  assert_int_equal(refs(p, ia[0]), 3); /* still the caller's */
  assert_int_equal(kvbm_seq_num_tokens(c), 0);
  assert_int_equal(kvbm_block_release(p, held[1], 0), KVBM_OK);
  assert_int_equal(kvbm_block_release(p, held[0], 0), KVBM_OK);
  kvbm_seq_destroy(c);
  kvbm_seq_destroy(b);
  kvbm_seq_destroy(a);
  assert_int_equal(stats(p).active, 0);
  kvbm_pool_destroy(p);
}

static void prefill_plan_bad_calls(void **state) {
  (void)state;
  kvbm_pool *p = mkpool(8);
  uint32_t t[9];
  toks(t, 9, 1);
  uint64_t h[2];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, t, 9, B, h, 2);
  uint32_t held[3] = {0, 0, 0};
  kvbm_seq *a;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  kvbm_seq_plan ok = {.hashes = h};
  assert_int_equal(kvbm_seq_prefill_plan(a, t, 9, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_seq_prefill_plan(NULL, t, 9, &ok, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_seq_prefill_plan(a, t, 0, &ok, NULL), KVBM_EINVAL);
  kvbm_seq_plan no_hashes = {0};
  assert_int_equal(kvbm_seq_prefill_plan(a, t, 9, &no_hashes, NULL), KVBM_EINVAL);
  kvbm_seq_plan too_many = {.hashes = h, .held = held, .nheld = 3}; /* limit (9-1)/4 = 2 */
  assert_int_equal(kvbm_seq_prefill_plan(a, t, 9, &too_many, NULL), KVBM_EINVAL);
  kvbm_seq_plan no_held = {.hashes = h, .nheld = 1};
  assert_int_equal(kvbm_seq_prefill_plan(a, t, 9, &no_held, NULL), KVBM_EINVAL);
  /* A prompt with no full block needs no hashes. */
  assert_int_equal(kvbm_seq_prefill_plan(a, t, 3, &no_hashes, NULL), KVBM_OK);
  assert_int_equal(kvbm_seq_prefill_plan(a, t, 9, &ok, NULL), KVBM_ESTATE);
  kvbm_seq_destroy(a);
  kvbm_pool_destroy(p);
}

typedef struct ctx_log {
  int stored;
  void *ctx[16];
} ctx_log;

static void log_ctx(void *user, const kvbm_pool_event *ev) {
  ctx_log *l = user;
  if (ev->kind == KVBM_POOL_STORED && l->stored < 16) l->ctx[l->stored++] = ev->context;
}

/* The listener learns the registering sequence's context from each
 * registration: prefill (both forms), append, a fork's append; the plain
 * pool calls carry none. */
static void context_reaches_the_listener(void **state) {
  (void)state;
  ctx_log log = {0};
  kvbm_pool_config pc = kvbm_pool_config_default(16, B);
  pc.listener = log_ctx;
  pc.listener_user = &log;
  kvbm_pool *p;
  assert_int_equal(kvbm_pool_create(&pc, &p, NULL), KVBM_OK);
  int who_a, who_b;
  uint32_t t[8], u[8];
  toks(t, 8, 10);
  toks(u, 8, 900);
  kvbm_seq *a, *b, *c;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &a), KVBM_OK);
  kvbm_seq_set_context(a, &who_a);
  assert_int_equal(kvbm_seq_prefill(a, t, 5, NULL), KVBM_OK);   /* 1 stored */
  assert_int_equal(kvbm_seq_append(a, t + 5, 3), KVBM_OK);      /* 1 stored */
  assert_int_equal(kvbm_seq_create(p, 0, 0, &b), KVBM_OK);
  kvbm_seq_set_context(b, &who_b);
  uint64_t h[2];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, u, 6, B, h, 1);
  kvbm_seq_plan plan = {.hashes = h};
  assert_int_equal(kvbm_seq_prefill_plan(b, u, 6, &plan, NULL), KVBM_OK); /* 1 stored */
  assert_int_equal(kvbm_seq_fork(b, &c, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_seq_append(c, u + 6, 2), KVBM_OK);      /* 1 stored, b's context */
  uint32_t id, got;
  assert_int_equal(kvbm_pool_alloc(p, 1, &id), KVBM_OK);
  uint32_t w[B] = {77, 78, 79, 80};
  assert_int_equal(kvbm_block_fill(p, id, 0, 0, false, w, 12345, &got), KVBM_OK);
  assert_int_equal(log.stored, 5);
  assert_ptr_equal(log.ctx[0], &who_a);
  assert_ptr_equal(log.ctx[1], &who_a);
  assert_ptr_equal(log.ctx[2], &who_b);
  assert_ptr_equal(log.ctx[3], &who_b);
  assert_null(log.ctx[4]);
  assert_int_equal(kvbm_block_release(p, got, 0), KVBM_OK);
  kvbm_seq_destroy(c);
  kvbm_seq_destroy(b);
  kvbm_seq_destroy(a);
  kvbm_pool_destroy(p);
}

/* An event as the twins below compare it. */
typedef struct twin_ev {
  kvbm_pool_event_kind kind;
  uint32_t id, ntok;
  uint64_t hash, parent;
  bool has_parent;
  void *ctx;
} twin_ev;
typedef struct twin_log {
  twin_ev ev[4096];
  size_t n;
} twin_log;

static void log_twin(void *user, const kvbm_pool_event *ev) {
  twin_log *l = user;
  assert_true(l->n < 4096);
  l->ev[l->n++] = (twin_ev){ev->kind, ev->block_id, ev->num_tokens, ev->seq_hash,
                            ev->kind == KVBM_POOL_STORED ? ev->parent_hash : 0,
                            ev->kind == KVBM_POOL_STORED && ev->has_parent, ev->context};
}

static uint32_t rnd(uint32_t *x) { return (*x = *x * 1103515245u + 12345u) >> 8; }

/* kvbm_seq_append of many tokens fills the whole blocks from a block edge
 * as one pool run (as prefill does); appending one token at a time opens,
 * appends and seals each block. Twin pools (listeners, small enough that
 * appends evict, contents repeated so that appended blocks dedup onto
 * cached and active ones) take the same requests, A token by token and B
 * at once: the same events in the same order (blocks, hashes, parents,
 * contexts), block tables, stats and block states. */
static void append_twins(bool quiet, uint8_t prio) {
  static twin_log la, lb;
  la.n = lb.n = 0;
  kvbm_pool *pa, *pb;
  kvbm_pool_config c = kvbm_pool_config_default(40, B);
  c.keep_tokens = false;
  c.listener = quiet ? NULL : log_twin;
  c.listener_user = &la;
  assert_int_equal(kvbm_pool_create(&c, &pa, NULL), KVBM_OK);
  c.listener_user = &lb;
  assert_int_equal(kvbm_pool_create(&c, &pb, NULL), KVBM_OK);
  kvbm_seq *sa[3] = {0}, *sb[3] = {0};
  int ctx[3];
  uint32_t x = 99u, t[64];
  size_t appended_runs = 0;
  for (int round = 0; round < 300; round++) {
    const size_t slot = rnd(&x) % 3;
    kvbm_seq_destroy(sa[slot]);
    kvbm_seq_destroy(sb[slot]);
    sa[slot] = sb[slot] = NULL;
    const size_t np = 1 + rnd(&x) % 12, no = rnd(&x) % 40;
    for (size_t i = 0; i < np + no; i++) t[i] = rnd(&x) % 4 == 0 ? 1000 + (uint32_t)i : (uint32_t)(i % 7);
    if ((np + no + B - 1) / B > kvbm_pool_available(pa)) continue;
    assert_int_equal(kvbm_seq_create(pa, 0, prio, &sa[slot]), KVBM_OK);
    assert_int_equal(kvbm_seq_create(pb, 0, prio, &sb[slot]), KVBM_OK);
    kvbm_seq_set_context(sa[slot], &ctx[slot]);
    kvbm_seq_set_context(sb[slot], &ctx[slot]);
    assert_int_equal(kvbm_seq_prefill(sa[slot], t, np, NULL), KVBM_OK);
    assert_int_equal(kvbm_seq_prefill(sb[slot], t, np, NULL), KVBM_OK);
    for (size_t i = 0; i < no; i++) assert_int_equal(kvbm_seq_append(sa[slot], t + np + i, 1), KVBM_OK);
    assert_int_equal(kvbm_seq_append(sb[slot], t + np, no), KVBM_OK);
    appended_runs += no >= 2 * B;
    const uint32_t *ia, *ib;
    size_t na, nb;
    kvbm_seq_blocks(sa[slot], &ia, &na);
    kvbm_seq_blocks(sb[slot], &ib, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ia, ib, na * sizeof *ia);
    assert_int_equal(la.n, lb.n);
    for (size_t i = 0; i < la.n; i++) {
      assert_int_equal(la.ev[i].kind, lb.ev[i].kind);
      assert_int_equal(la.ev[i].id, lb.ev[i].id);
      assert_int_equal(la.ev[i].ntok, lb.ev[i].ntok);
      assert_int_equal(la.ev[i].hash, lb.ev[i].hash);
      assert_int_equal(la.ev[i].parent, lb.ev[i].parent);
      assert_int_equal(la.ev[i].has_parent, lb.ev[i].has_parent);
      assert_ptr_equal(la.ev[i].ctx, lb.ev[i].ctx);
    }
    la.n = lb.n = 0;
    const kvbm_pool_stats a = stats(pa), b = stats(pb);
    assert_memory_equal(&a, &b, sizeof a);
    for (uint32_t id = 0; id < 40; id++) {
      kvbm_block_info x1, x2;
      assert_int_equal(kvbm_block_info_get(pa, id, &x1), KVBM_OK);
      assert_int_equal(kvbm_block_info_get(pb, id, &x2), KVBM_OK);
      assert_int_equal(x1.state, x2.state);
      assert_int_equal(x1.refcount, x2.refcount);
      assert_int_equal(x1.num_tokens, x2.num_tokens);
      if (x1.state == KVBM_BLOCK_REGISTERED) assert_int_equal(x1.seq_hash, x2.seq_hash);
      assert_int_equal(x1.priority, x2.priority);
    }
  }
  const kvbm_pool_stats a = stats(pa);
  assert_true(a.dedup > 20);
  assert_true(a.evicted > 100);
  assert_true(appended_runs > 50);
  for (int i = 0; i < 3; i++) {
    kvbm_seq_destroy(sa[i]);
    kvbm_seq_destroy(sb[i]);
  }
  kvbm_pool_destroy(pa);
  kvbm_pool_destroy(pb);
}

static void append_runs_equal_token_at_a_time(void **state) {
  (void)state;
  append_twins(false, 0);
}

/* The same without listeners (B's runs then take the pool's quiet fill
 * loop, the one a replay runs) and at another priority: tables, stats and
 * block states (priorities among them) compared; no events to compare. */
static void append_runs_equal_quiet(void **state) {
  (void)state;
  append_twins(true, 7);
}

/* A fill_only pool builds no partial block: an append that would leave
 * one is refused before anything changes (the whole blocks it starts with
 * are not taken); one of whole blocks is filled. */
static void append_fill_only_refuses_partial(void **state) {
  (void)state;
  kvbm_pool *p;
  kvbm_pool_config c = kvbm_pool_config_default(8, B);
  c.keep_tokens = false;
  c.fill_only = true;
  assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_OK);
  kvbm_seq *s;
  assert_int_equal(kvbm_seq_create(p, 0, 0, &s), KVBM_OK);
  uint32_t t[3 * B];
  for (size_t i = 0; i < 3 * B; i++) t[i] = (uint32_t)i;
  const uint32_t avail = kvbm_pool_available(p);
  assert_int_equal(kvbm_seq_append(s, t, 2 * B + 1), KVBM_EUNSUPPORTED);
  assert_int_equal(kvbm_pool_available(p), avail);
  assert_int_equal(kvbm_seq_num_tokens(s), 0);
  const uint32_t *ids;
  size_t n;
  kvbm_seq_blocks(s, &ids, &n);
  assert_int_equal(n, 0);
  assert_int_equal(kvbm_seq_append(s, t, 2 * B), KVBM_OK);
  kvbm_seq_blocks(s, &ids, &n);
  assert_int_equal(n, 2);
  assert_int_equal(kvbm_seq_num_tokens(s), 2 * B);
  assert_int_equal(kvbm_pool_available(p), avail - 2);
  assert_int_equal(kvbm_seq_append(s, t + 2 * B, 1), KVBM_EUNSUPPORTED);
  assert_int_equal(kvbm_seq_num_tokens(s), 2 * B);
  kvbm_seq_destroy(s);
  kvbm_pool_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(prefill_then_share),
      cmocka_unit_test(match_stops_before_last_token),
      cmocka_unit_test(prefill_is_all_or_nothing),
      cmocka_unit_test(append_registers_on_fill),
      cmocka_unit_test(fork_shares_full_blocks_and_copies_the_tail),
      cmocka_unit_test(fork_without_room_changes_nothing),
      cmocka_unit_test(destroy_releases_tail_first),
      cmocka_unit_test(salts_do_not_share),
      cmocka_unit_test(bad_calls),
      cmocka_unit_test(prefill_plan_equals_prefill),
      cmocka_unit_test(prefill_plan_adopts_held_blocks),
      cmocka_unit_test(prefill_plan_bad_calls),
      cmocka_unit_test(context_reaches_the_listener),
      cmocka_unit_test(append_runs_equal_token_at_a_time),
      cmocka_unit_test(append_runs_equal_quiet),
      cmocka_unit_test(append_fill_only_refuses_partial),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
