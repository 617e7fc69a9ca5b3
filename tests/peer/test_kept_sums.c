/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_kept_sums.c: a block's checksum is hashed once in its life (issue
 * 22, tier/copy.c "Kept checksums"), two managers in one process over the
 * in-process fabric, push and put modes.
 *
 * The peer stats count what was hashed: sent_hashed_bytes (the send path
 * hashed a block that had no kept checksum), sent_sums_kept (a block sent
 * with its tier's kept checksum, nothing hashed), received_hashed_bytes
 * (the receiver's check). What is asserted:
 *   - with G2 and a peer attached, the commit's offload to G2 computes
 *     each block's sum, so sending the prompt hashes 0 bytes at the
 *     sender, and the receiver hashes each byte once; every byte lands
 *     right (the decode side's prefill matches the whole prompt);
 *   - without G2, the first send of a block hashes it (once), the second
 *     send of the same blocks hashes nothing; the receiver hashes every
 *     copy it receives once;
 *   - a block brought back into G1 from G2 keeps its sum (carried by the
 *     copy): sent again from G1 after eviction, it is not hashed; and the
 *     G1 blocks it was evicted from, reused by another prompt, forget the
 *     old sums (that prompt's blocks are all taken by the peer);
 *   - a stale kept sum (the block's bytes changed in G1 after its sum was
 *     computed): the sender frames it without hashing, the receiver
 *     refuses that block by checksum, counts it, and holds it nowhere,
 *     while every other block is taken; the sender learns the refusal.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kvbm/fabric.h"
#include "kvbm/hash.h"
#include "kvbm/peer.h"
#include "peer/testing.h"
#include "tier/tier_testutil.h"

#define NTOK 33 /* 8 full blocks of 4 tokens, and a partial one */
#define NBLK 8

typedef struct attach_job {
  kvbm_manager *m;
  kvbm_fabric *f;
  kvbm_peer_config cfg;
  int rc;
  kvbm_error e;
} attach_job;

static void *attach_thread(void *arg) {
  attach_job *j = arg;
  uint32_t peer;
  j->rc = kvbm_manager_attach(j->m, j->f, &j->cfg, &peer, &j->e);
  return NULL;
}

/* Prefill (a) attached to decode (b), both in `mode`. */
typedef struct pair {
  kvbm_manager *a, *b;
  kvbm_fabric *fa, *fb;
} pair;

static kvbm_manager *make(uint32_t g1, uint32_t g2) {
  kvbm_manager_config c = tu_config(NULL, g1, g2, 0);
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

static void pair_attach(pair *p, kvbm_disagg_mode mode) {
  kvbm_peer_config c = kvbm_peer_config_default();
  c.mode = mode;
  c.landing_blocks = 3; /* fewer than the blocks: grants are reused */
  assert_int_equal(kvbm_fabric_inproc_pair("prefill", "decode", &p->fa, &p->fb, NULL), KVBM_OK);
  attach_job jb = {.m = p->b, .f = p->fb, .cfg = c};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, attach_thread, &jb), 0);
  uint32_t peer;
  kvbm_error e = {0};
  int rc = kvbm_manager_attach(p->a, p->fa, &c, &peer, &e);
  pthread_join(th, NULL);
  if (rc || jb.rc) fail_msg("attach: %s / %s", e.msg, jb.e.msg);
}

static void pair_free(pair *p) {
  kvbm_manager_destroy(p->a);
  kvbm_manager_destroy(p->b);
  kvbm_fabric_destroy(p->fa);
  kvbm_fabric_destroy(p->fb);
}

static void hashes_of(const uint32_t *tok, size_t n, uint64_t *h) {
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, n, 4, h, n / 4);
}

static uint64_t block_bytes(kvbm_manager *m) {
  const kvbm_layout *L = kvbm_manager_layout(m, KVBM_TIER_G1);
  return L->config.num_layers * L->layer_stride;
}

/* Sends blocks h[0..n) to peer 0 and waits for every answer. */
static void offload(kvbm_manager *m, const uint64_t *h, size_t n) {
  for (size_t k = 0; k < n; k++) {
    kvbm_error e = {0};
    if (kvbm_manager_offload_block(m, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, &e))
      fail_msg("offload %zu: %s", k, e.msg);
  }
  assert_int_equal(kvbm_manager_peer_flush(m, 0, 5000, NULL), KVBM_OK);
}

static kvbm_peer_stats stats(kvbm_manager *m) {
  kvbm_peer_stats s;
  assert_int_equal(kvbm_manager_peer_stats_get(m, 0, &s), KVBM_OK);
  return s;
}

/* The decode side's prefill of the prompt: blocks matched, and how many
 * of them hold the right bytes. */
static size_t match_on(kvbm_manager *m, const uint32_t *tok, size_t *good) {
  kvbm_mreq *r = NULL;
  kvbm_mreq_info info;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, tok, NTOK, &r, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_mreq_wait(r, 5000, &info), KVBM_OK);
  size_t blocks = info.matched_tokens / 4;
  *good = tu_verify(m, r, blocks);
  kvbm_mreq_destroy(r);
  return blocks;
}

/* With G2 and a peer attached, the commit's offload to G2 hashes each
 * block; the sends hash nothing; the receiver hashes each byte once. */
static void kept_at_offload(kvbm_disagg_mode mode) {
  pair p = {.a = make(32, 32), .b = make(32, 0)};
  pair_attach(&p, mode);
  uint32_t *tok = tu_prompt(7000, NTOK);
  assert_int_equal(tu_run(p.a, tok, NTOK, NULL, NULL), 0);
  assert_int_equal(tu_stats(p.a, KVBM_TIER_G2).offloaded_blocks, NBLK);
  uint64_t h[NBLK], bb = block_bytes(p.a);
  hashes_of(tok, NTOK, h);
  offload(p.a, h, NBLK);
  kvbm_peer_stats sa = stats(p.a), sb = stats(p.b);
  assert_int_equal(sa.sent_blocks, NBLK);
  assert_int_equal(sa.acked_blocks, NBLK);
  assert_int_equal(sa.sent_sums_kept, NBLK);
  assert_int_equal(sa.sent_hashed_bytes, 0);
  assert_int_equal(sb.ingested, NBLK);
  assert_int_equal(sb.received_hashed_bytes, NBLK * bb);
  size_t good = 0;
  assert_int_equal(match_on(p.b, tok, &good), NBLK);
  assert_int_equal(good, NBLK);
  free(tok);
  pair_free(&p);
}

static void test_kept_at_offload(void **state) {
  (void)state;
  kept_at_offload(KVBM_DISAGG_PUSH);
  kept_at_offload(KVBM_DISAGG_PUT);
}

/* Without G2: hashed at the first send, kept, not hashed at the second. */
static void kept_at_first_send(kvbm_disagg_mode mode) {
  pair p = {.a = make(32, 0), .b = make(32, 0)};
  pair_attach(&p, mode);
  uint32_t *tok = tu_prompt(9000, NTOK);
  assert_int_equal(tu_run(p.a, tok, NTOK, NULL, NULL), 0);
  uint64_t h[NBLK], bb = block_bytes(p.a);
  hashes_of(tok, NTOK, h);
  offload(p.a, h, NBLK);
  kvbm_peer_stats sa = stats(p.a);
  assert_int_equal(sa.sent_hashed_bytes, NBLK * bb);
  assert_int_equal(sa.sent_sums_kept, 0);
  offload(p.a, h, NBLK); /* again: the peer checks them again, we do not hash */
  sa = stats(p.a);
  kvbm_peer_stats sb = stats(p.b);
  assert_int_equal(sa.sent_blocks, 2 * NBLK);
  assert_int_equal(sa.acked_blocks, 2 * NBLK);
  assert_int_equal(sa.sent_hashed_bytes, NBLK * bb);
  assert_int_equal(sa.sent_sums_kept, NBLK);
  assert_int_equal(sb.received, 2 * NBLK);
  assert_int_equal(sb.received_hashed_bytes, 2 * NBLK * bb);
  size_t good = 0;
  assert_int_equal(match_on(p.b, tok, &good), NBLK);
  assert_int_equal(good, NBLK);
  free(tok);
  pair_free(&p);
}

static void test_kept_at_first_send(void **state) {
  (void)state;
  kept_at_first_send(KVBM_DISAGG_PUSH);
  kept_at_first_send(KVBM_DISAGG_PUT);
}

/* A block evicted from G1 and brought back from G2 keeps its sum (the
 * copy carries it): sending it from G1 again hashes nothing. */
static void test_carried_through_g2(void **state) {
  (void)state;
  pair p = {.a = make(12, 32), .b = make(32, 0)};
  pair_attach(&p, KVBM_DISAGG_PUT);
  uint32_t *tok = tu_prompt(11000, NTOK), *other = tu_prompt(50000, 45);
  uint64_t h[NBLK];
  hashes_of(tok, NTOK, h);
  assert_int_equal(tu_run(p.a, tok, NTOK, NULL, NULL), 0);
  /* another prompt fills G1: the first one's blocks leave it (G2 keeps them) */
  assert_int_equal(tu_run(p.a, other, 45, NULL, NULL), 0);
  kvbm_block_location loc;
  kvbm_manager_block_location(p.a, h[0], &loc);
  assert_true(loc.held);
  assert_int_equal(loc.tier, KVBM_TIER_G2);
  /* back into G1 from G2 (a prefill's onboard), then sent from there */
  kvbm_mreq_info info;
  assert_int_equal(tu_run(p.a, tok, NTOK, &info, NULL), NBLK * 4);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G2], NBLK);
  kvbm_manager_block_location(p.a, h[0], &loc);
  assert_int_equal(loc.tier, KVBM_TIER_G1);
  offload(p.a, h, NBLK);
  kvbm_peer_stats sa = stats(p.a), sb = stats(p.b);
  assert_int_equal(sa.sent_hashed_bytes, 0);
  assert_int_equal(sa.sent_sums_kept, NBLK);
  assert_int_equal(sb.ingested, NBLK);
  size_t good = 0;
  assert_int_equal(match_on(p.b, tok, &good), NBLK);
  assert_int_equal(good, NBLK);
  /* The other prompt's blocks reused G1 blocks whose sums were of the
   * first prompt's bytes: forgotten at their new registration, so they
   * too are sent with their own sums and all taken. */
  uint64_t ho[11];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, other, 45, 4, ho, 11);
  offload(p.a, ho, 11);
  sa = stats(p.a);
  sb = stats(p.b);
  assert_int_equal(sb.ingested, NBLK + 11);
  assert_int_equal(sb.refused_checksum, 0);
  assert_int_equal(sa.acked_blocks, NBLK + 11);
  free(tok);
  free(other);
  pair_free(&p);
}

/* The bytes of block 2 change in G1 after its sum was kept: the sender
 * frames the stale sum (hashing nothing), the receiver refuses that block
 * by checksum (counted) and holds it nowhere; the others are taken. */
static void stale_sum(kvbm_disagg_mode mode) {
  pair p = {.a = make(32, 32), .b = make(32, 0)};
  pair_attach(&p, mode);
  uint32_t *tok = tu_prompt(13000, NTOK);
  kvbm_mreq *r = NULL;
  assert_int_equal(tu_run(p.a, tok, NTOK, NULL, &r), 0);
  const uint32_t *ids;
  size_t n;
  kvbm_mreq_blocks(r, &ids, &n);
  assert_true(n >= NBLK);
  uint8_t byte;
  assert_int_equal(kvbm_manager_block_read(p.a, KVBM_TIER_G1, ids[2], 1, &byte, 1, NULL), KVBM_OK);
  byte ^= 0x10;
  assert_int_equal(kvbm_manager_block_write(p.a, KVBM_TIER_G1, ids[2], 1, &byte, 1, NULL), KVBM_OK);
  kvbm_mreq_destroy(r);
  uint64_t h[NBLK], bb = block_bytes(p.a);
  hashes_of(tok, NTOK, h);
  offload(p.a, h, NBLK);
  kvbm_peer_stats sa = stats(p.a), sb = stats(p.b);
  assert_int_equal(sa.sent_hashed_bytes, 0);
  assert_int_equal(sa.sent_sums_kept, NBLK);
  assert_int_equal(sa.acked_blocks, NBLK - 1);
  assert_int_equal(sa.peer_refused, 1);
  assert_int_equal(sb.received, NBLK);
  assert_int_equal(sb.ingested, NBLK - 1);
  assert_int_equal(sb.refused_checksum, 1);
  assert_non_null(strstr(sb.last_refusal, "KVBM_ECHECKSUM"));
  assert_int_equal(sb.received_hashed_bytes, NBLK * bb);
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(p.b, h[2], &loc), KVBM_OK);
  assert_false(loc.held);
  /* the receiver's prefix stops before the refused block, bytes right */
  size_t good = 0;
  assert_int_equal(match_on(p.b, tok, &good), 2);
  assert_int_equal(good, 2);
  free(tok);
  pair_free(&p);
}

static void test_stale_sum_refused(void **state) {
  (void)state;
  stale_sum(KVBM_DISAGG_PUSH);
  stale_sum(KVBM_DISAGG_PUT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kept_at_offload),
      cmocka_unit_test(test_kept_at_first_send),
      cmocka_unit_test(test_carried_through_g2),
      cmocka_unit_test(test_stale_sum_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
