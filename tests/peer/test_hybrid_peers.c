/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_hybrid_peers.c: peers between managers of several KV cache groups
 * (issue 20; docs/areas/hybrid.md, "Peers").
 *
 * A block of group g travels under its group's key (kvbm/manager.h,
 * "hybrid requests"), which means something only to a manager of the same
 * group list. What the tests hold the peers to:
 *   - the hello carries the group list (kvbm_manager_groups_digest): two
 *     managers whose lists differ (another window, one group against two)
 *     are refused at attach on both sides, with a message naming this
 *     side's list; equal lists attach;
 *   - a block of group g > 0 sent with its tokens is accepted (its key
 *     follows from its tokens under g: kvbm_manager_key_group; before,
 *     the plain hash check refused every such block), registered in the
 *     receiver's group g: its BlockStored says group g and the block's own
 *     hash, never the key; and the receiver's hybrid prefill then hits
 *     every group from G1 with the sender's bytes.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/fabric.h"
#include "kvbm/hash.h"
#include "kvbm/peer.h"
#include "tier/internal.h"
#include "tier/tier_testutil.h"

#define B 4

static bool g_output_pull; /* make()'s output_pull (set by one test) */

static kvbm_manager *make(const char *groups, tu_g1_log *log) {
  kvbm_group_spec g[4];
  size_t ng = 0;
  if (groups) assert_int_equal(kvbm_groups_parse(groups, g, 4, &ng, NULL), KVBM_OK);
  kvbm_manager_config c = tu_config(NULL, 48, 0, 0);
  c.groups = groups ? g : NULL;
  c.num_groups = ng;
  c.offload_threshold_blocks = 0;
  c.output_pull = g_output_pull;
  if (log) tu_g1_log_attach(&c, log);
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

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

typedef struct pair {
  kvbm_manager *a, *b;
  kvbm_fabric *fa, *fb;
  attach_job ja, jb;
} pair;

static void pair_attach(pair *p) {
  assert_int_equal(kvbm_fabric_inproc_pair("prefill", "decode", &p->fa, &p->fb, NULL), KVBM_OK);
  kvbm_peer_config c = kvbm_peer_config_default();
  c.mode = KVBM_DISAGG_PUSH;
  c.landing_blocks = 3;
  c.timeout_ms = 5000;
  p->ja = (attach_job){.m = p->a, .f = p->fa, .cfg = c};
  p->jb = (attach_job){.m = p->b, .f = p->fb, .cfg = c};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, attach_thread, &p->jb), 0);
  attach_thread(&p->ja);
  pthread_join(th, NULL);
}

static void pair_free(pair *p) {
  kvbm_manager_destroy(p->a);
  kvbm_manager_destroy(p->b);
  kvbm_fabric_destroy(p->fa);
  kvbm_fabric_destroy(p->fb);
}

/* Both sides refuse, each naming its own list. */
static void refused(const char *ga, const char *gb) {
  pair p = {.a = make(ga, NULL), .b = make(gb, NULL)};
  pair_attach(&p);
  assert_int_equal(p.ja.rc, KVBM_EPROTO);
  assert_int_equal(p.jb.rc, KVBM_EPROTO);
  char want[96];
  snprintf(want, sizeof want, "groups differ (this side %s,", ga ? ga : "full");
  if (!strstr(p.ja.e.msg, want)) fprintf(stderr, "'%s' lacks '%s'\n", p.ja.e.msg, want);
  assert_non_null(strstr(p.ja.e.msg, want));
  snprintf(want, sizeof want, "groups differ (this side %s,", gb ? gb : "full");
  assert_non_null(strstr(p.jb.e.msg, want));
  pair_free(&p);
}

static void test_hello_carries_groups(void **st) {
  (void)st;
  refused("full,sw:8", "full,sw:16");
  refused("full,sw:8", NULL);
  refused(NULL, "full,mamba");
  refused("full,sw:8", "sw:8,full");
  /* Equal lists attach (one group both sides: the hello of before). */
  pair p = {.a = make("full,sw:8", NULL), .b = make("full,sw:8", NULL)};
  pair_attach(&p);
  assert_int_equal(p.ja.rc, KVBM_OK);
  assert_int_equal(p.jb.rc, KVBM_OK);
  pair_free(&p);
  pair q = {.a = make(NULL, NULL), .b = make(NULL, NULL)};
  pair_attach(&q);
  assert_int_equal(q.ja.rc, KVBM_OK);
  pair_free(&q);
  assert_int_equal(kvbm_manager_groups_digest(NULL, NULL, 0), 0);
}

/* A's prompt, computed and committed in both groups, pushed block by
 * block (every group's key) to B: B registers each in its group, and its
 * hybrid prefill then hits from G1 with A's bytes. */
static void test_put_registers_group(void **st) {
  (void)st;
  tu_g1_log log = {0};
  pthread_mutex_init(&log.mu, NULL);
  pair p = {.a = make("full,sw:8", NULL), .b = make("full,sw:8", &log)};
  pair_attach(&p);
  assert_int_equal(p.ja.rc, KVBM_OK);
  uint32_t *tok = tu_prompt(4400, 33);
  uint64_t h[8];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, 33, B, h, 8);
  kvbm_hreq *r;
  assert_int_equal(kvbm_manager_hprefill(p.a, 0, 0, tok, 33, &r, NULL, NULL), KVBM_OK);
  for (uint32_t g = 0; g < 2; g++) {
    const uint32_t *ids;
    size_t nb;
    assert_int_equal(kvbm_hreq_table(r, g, &ids, &nb), KVBM_OK);
    for (size_t k = 0; k < 8; k++) assert_true(tu_block(p.a, ids[k], kvbm__group_key(h[k], g), 0));
  }
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_hreq_destroy(r);
  for (uint32_t g = 0; g < 2; g++)
    for (size_t k = 0; k < 8; k++)
      assert_int_equal(kvbm_manager_offload_block(p.a, 0, kvbm__group_key(h[k], g), KVBM_PHASE_OUTPUT_CRITICAL, NULL),
                       KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
  kvbm_peer_stats sa, sb;
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &sa), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_stats_get(p.b, 0, &sb), KVBM_OK);
  assert_int_equal(sa.acked_blocks, 16);
  assert_int_equal(sb.refused_hash, 0);
  assert_int_equal(sb.ingested, 16);
  /* B's events: each block under its own hash, in its group. */
  size_t seen[2][8] = {{0}};
  pthread_mutex_lock(&log.mu);
  assert_int_equal(log.n, 16);
  for (size_t i = 0; i < log.n; i++) {
    int k = -1;
    for (int j = 0; j < 8; j++)
      if (log.hash[i] == h[j]) k = j;
    assert_true(k >= 0);
    assert_true(log.group[i] < 2);
    seen[log.group[i]][k]++;
  }
  pthread_mutex_unlock(&log.mu);
  for (uint32_t g = 0; g < 2; g++)
    for (size_t k = 0; k < 8; k++) assert_int_equal(seen[g][k], 1);
  /* B's hybrid prefill of the prompt: the hit from G1 in both groups. */
  size_t hit;
  assert_int_equal(kvbm_manager_hprefill(p.b, 0, 0, tok, 33, &r, &hit, NULL), KVBM_OK);
  kvbm_hreq_info i;
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  assert_int_equal(i.hit_tokens, 32);
  assert_int_equal(i.hit_g1[0], 8);
  assert_int_equal(i.hit_g1[1], 2); /* sw:8: blocks 6 and 7 */
  for (uint32_t g = 0; g < 2; g++) {
    const uint32_t *ids;
    size_t nb;
    assert_int_equal(kvbm_hreq_table(r, g, &ids, &nb), KVBM_OK);
    for (size_t k = 0; k < 8; k++)
      if (ids[k] != KVBM_HREQ_NULL) assert_true(tu_block(p.b, ids[k], kvbm__group_key(h[k], g), 1));
  }
  kvbm_hreq_destroy(r);
  free(tok);
  pair_free(&p);
  pthread_mutex_destroy(&log.mu);
}

/* The OutputCritical pull of a hybrid prompt: A gave its blocks to B
 * (acknowledged) and lost them from G1; its hybrid prefill asks B for the
 * blocks each group needs (8 + 2 keys, not the window's skipped 6) and
 * hits from them, with the bytes A computed. */
static void test_pull_for_hybrid_prefill(void **st) {
  (void)st;
  g_output_pull = true;
  pair p = {.a = make("full,sw:8", NULL), .b = make("full,sw:8", NULL)};
  g_output_pull = false;
  pair_attach(&p);
  assert_int_equal(p.ja.rc, KVBM_OK);
  uint32_t *tok = tu_prompt(5500, 33);
  uint64_t h[8];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, 33, B, h, 8);
  kvbm_hreq *r;
  assert_int_equal(kvbm_manager_hprefill(p.a, 0, 0, tok, 33, &r, NULL, NULL), KVBM_OK);
  for (uint32_t g = 0; g < 2; g++) {
    const uint32_t *ids;
    size_t nb;
    assert_int_equal(kvbm_hreq_table(r, g, &ids, &nb), KVBM_OK);
    for (size_t k = 0; k < 8; k++) assert_true(tu_block(p.a, ids[k], kvbm__group_key(h[k], g), 0));
  }
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_hreq_destroy(r);
  for (uint32_t g = 0; g < 2; g++)
    for (size_t k = 0; k < 8; k++)
      assert_int_equal(kvbm_manager_offload_block(p.a, 0, kvbm__group_key(h[k], g), KVBM_PHASE_OUTPUT_CRITICAL, NULL),
                       KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
  /* Other prompts push A's blocks out of its G1 (48 blocks, 18 a prompt). */
  for (int i = 0; i < 3; i++) {
    uint32_t *o = tu_prompt(60000u + (uint32_t)i * 1000u, 33);
    assert_int_equal(kvbm_manager_hprefill(p.a, 0, 0, o, 33, &r, NULL, NULL), KVBM_OK);
    assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
    kvbm_hreq_destroy(r);
    free(o);
  }
  for (size_t k = 0; k < 8; k++)
    assert_int_not_equal(kvbm_pool_peek(p.a->t[KVBM_TIER_G1].pool, h[k], NULL, NULL), KVBM_OK);
  kvbm_peer_stats s0;
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &s0), KVBM_OK);
  size_t hit;
  assert_int_equal(kvbm_manager_hprefill(p.a, 0, 0, tok, 33, &r, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 32);
  kvbm_hreq_info i;
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  assert_int_equal(i.hit_tokens, 32);
  assert_int_equal(i.hit_g1[0], 8);
  assert_int_equal(i.hit_g1[1], 2);
  kvbm_peer_stats s1;
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &s1), KVBM_OK);
  assert_int_equal(s1.ingested - s0.ingested, 10); /* the needed blocks only */
  for (uint32_t g = 0; g < 2; g++) {
    const uint32_t *ids;
    size_t nb;
    assert_int_equal(kvbm_hreq_table(r, g, &ids, &nb), KVBM_OK);
    for (size_t k = 0; k < 8; k++)
      if (ids[k] != KVBM_HREQ_NULL) assert_true(tu_block(p.a, ids[k], kvbm__group_key(h[k], g), 1));
  }
  kvbm_hreq_destroy(r);
  free(tok);
  pair_free(&p);
}

/* ExitThink's batch of a hybrid request: every group's THINK_COMPLETE
 * block the request still holds goes to the peer under its key, once
 * offload_threshold_blocks (4) of them are ready; the receiver files each
 * in its group. */
static void test_exit_think_push(void **st) {
  (void)st;
  tu_g1_log log = {0};
  pthread_mutex_init(&log.mu, NULL);
  pair p = {.a = make("full,sw:8", NULL), .b = make("full,sw:8", &log)};
  pair_attach(&p);
  assert_int_equal(p.ja.rc, KVBM_OK);
  p.a->cfg.offload_threshold_blocks = 4; /* (a test reaches in; set before any request) */
  uint32_t *tok = tu_prompt(7700, 24);
  uint64_t h[6];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, 24, B, h, 6);
  kvbm_hreq *r;
  kvbm_error e = {0};
  assert_int_equal(kvbm_manager_hprefill(p.a, 0, 0, tok, 8, &r, NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  assert_int_equal(kvbm_hreq_set_phase(r, KVBM_REQUEST_REASONING, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_append(r, tok + 8, 8, &e), KVBM_OK); /* blocks 2, 3: reasoning */
  /* Not committed yet: not ready, nothing pushed at ExitThink. */
  assert_int_equal(kvbm_hreq_set_phase(r, KVBM_REQUEST_EXIT_THINK, &e), KVBM_OK);
  kvbm_peer_stats sa;
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &sa), KVBM_OK);
  assert_int_equal(sa.sent_blocks, 0);
  /* The commit makes them ready (16 computed: sw:8 keeps blocks 2, 3):
   * 2 blocks x 2 groups = 4, the threshold: one batch. */
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &sa), KVBM_OK);
  assert_int_equal(sa.acked_blocks, 4);
  size_t seen[2][6] = {{0}};
  pthread_mutex_lock(&log.mu);
  for (size_t i = 0; i < log.n; i++) {
    int k = -1;
    for (int j = 0; j < 6; j++)
      if (log.hash[i] == h[j]) k = j;
    assert_true(k == 2 || k == 3);
    seen[log.group[i] & 1][k]++;
  }
  pthread_mutex_unlock(&log.mu);
  for (uint32_t g = 0; g < 2; g++) {
    assert_int_equal(seen[g][2], 1);
    assert_int_equal(seen[g][3], 1);
  }
  /* Pushed once: a later commit sends nothing more. */
  assert_int_equal(kvbm_hreq_set_phase(r, KVBM_REQUEST_OUTPUT, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_append(r, tok + 16, 4, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &sa), KVBM_OK);
  assert_int_equal(sa.sent_blocks, 4);
  kvbm_hreq_destroy(r);
  free(tok);
  pair_free(&p);
  pthread_mutex_destroy(&log.mu);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hello_carries_groups),
      cmocka_unit_test(test_put_registers_group),
      cmocka_unit_test(test_pull_for_hybrid_prefill),
      cmocka_unit_test(test_exit_think_push),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
