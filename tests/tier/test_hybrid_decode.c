/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_hybrid_decode.c: a hybrid request after its prompt (issue 20;
 * kvbm/manager.h, "hybrid requests"; docs/areas/hybrid.md, "Decode, phases
 * and the G4 deadline of a hybrid request").
 *
 * What the tests hold the manager to, each against a rule written here as
 * a fact of vLLM's code (vllm/v1/core/single_type_kv_cache_manager.py,
 * kv_cache_manager.py):
 *   - decode across a window boundary: after each step's commit, group
 *     sw:W's table has the null block exactly at the places vLLM's
 *     SlidingWindowManager.remove_skipped_blocks(num_computed) leaves null
 *     (blocks [0, max(0, n - W + 1) // B)), the full group none; the block
 *     freed stays registered and cached (evictable), nothing else moves
 *     (the pool's active count drops by exactly the blocks freed);
 *   - append with no room: KVBM_ENOSPC with a message, tables, counts and
 *     the pool unchanged; the same append succeeds once room is made;
 *   - Mamba: in "all" mode (kvbm's `mamba`) every step that crosses a
 *     block allocates each block (vLLM's generic allocate_new_blocks) and
 *     after the commit one state block is held, the last; in "align" mode
 *     (`mamba-align`) a step allocates only the running state's block, the
 *     places between null (MambaManager in align mode), so a block skipped
 *     by a multi-token step is never registered;
 *   - phases label appended blocks (reasoning, ExitThink, output);
 *   - events of appended blocks carry their group (the manager's G1
 *     listener: group_idx as vLLM's events; the wire is test_hybrid_events);
 *   - a slow G4 (a store answering after 2.5 s): the hybrid prefill gives
 *     its onboards up at g4_timeout_ms as kvbm_manager_prefill does: the
 *     wait ends after about one deadline, every late onboard is counted
 *     abandoned, the hit is the group rule's over what arrived (nothing),
 *     the engine computes every block, and late answers never overwrite
 *     what it wrote; with only one block late (full + chunk:16), the hit
 *     settles where the group rule says (32 of 36 tokens), the rest the
 *     store's bytes.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kvbm/hash.h"
#include "kvbm/manager.h"
#include "tier/internal.h"
#include "tier_testutil.h"

#define B 4

static kvbm_manager *hmgr(const kvbm_group_spec *g, size_t ng, uint32_t g1) {
  kvbm_manager_config c = tu_config(NULL, g1, 0, 0);
  c.groups = g;
  c.num_groups = ng;
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

static kvbm_pool_stats g1_stats(kvbm_manager *m) {
  kvbm_pool_stats s;
  kvbm_pool_stats_get(m->t[KVBM_TIER_G1].pool, &s);
  return s;
}

/* Group g's table now: non-null count, and a copy into ids. */
static size_t table(kvbm_hreq *r, uint32_t g, uint32_t *ids, size_t *n) {
  const uint32_t *t;
  assert_int_equal(kvbm_hreq_table(r, g, &t, n), KVBM_OK);
  size_t held = 0;
  for (size_t k = 0; k < *n; k++) {
    if (ids) ids[k] = t[k];
    held += t[k] != KVBM_HREQ_NULL;
  }
  return held;
}

/* vLLM's SlidingWindowManager, as a fact: get_num_skipped_tokens(n) =
 * max(0, n - W + 1); remove_skipped_blocks(request, n) nulls (and frees)
 * every block before skipped // block_size. So after n computed tokens
 * block k is null iff k < max(0, n - W + 1) // B. */
static bool vllm_sw_null(size_t n, size_t W, size_t k) {
  size_t skipped = n + 1 > W ? n + 1 - W : 0;
  return k < skipped / B;
}

/* Decode one token at a time across several window boundaries of sw:8;
 * after every commit the window group's nulls are vLLM's, the freed block
 * is cached, and only it moved. */
static void test_window_decode(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}};
  kvbm_manager *m = hmgr(g, 2, 64);
  uint32_t *tok = tu_prompt(100, 40);
  uint64_t h[10];
  tu_hashes(m, tok, 10, B, h);
  kvbm_hreq *r;
  kvbm_error e = {0};
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, tok, 6, &r, NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  uint32_t before[2][16], after[2][16];
  size_t nb;
  size_t freed_total = 0;
  for (size_t n = 6; n < 40; n++) {
    kvbm_pool_stats s0 = g1_stats(m);
    table(r, 0, before[0], &nb);
    table(r, 1, before[1], &nb);
    size_t nb0 = nb;
    assert_int_equal(kvbm_hreq_append(r, tok + n, 1, &e), KVBM_OK);
    size_t grew = (n + 1 + B - 1) / B - nb0; /* a new block a group when the tail was full */
    kvbm_pool_stats s1 = g1_stats(m);
    assert_int_equal(s1.active, s0.active + 2 * grew);
    assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
    kvbm_pool_stats s2 = g1_stats(m);
    table(r, 0, after[0], &nb);
    table(r, 1, after[1], &nb);
    assert_int_equal(nb, (n + 1 + B - 1) / B);
    size_t freed = 0;
    for (size_t k = 0; k < nb; k++) {
      assert_int_not_equal(after[0][k], KVBM_HREQ_NULL); /* full attention frees nothing */
      if (k < nb0) assert_int_equal(after[0][k], before[0][k]);
      bool null = after[1][k] == KVBM_HREQ_NULL;
      assert_int_equal(null, vllm_sw_null(n + 1, 8, k));
      if (k < nb0 && !null) assert_int_equal(after[1][k], before[1][k]); /* nothing else moved */
      if (k < nb0 && null && before[1][k] != KVBM_HREQ_NULL) {
        freed++;
        /* Left the window: released, still registered, cached. */
        uint32_t id;
        bool cached = false;
        assert_int_equal(kvbm_pool_peek(m->t[KVBM_TIER_G1].pool, kvbm__group_key(h[k], 1), &id, &cached),
                         KVBM_OK);
        assert_int_equal(id, before[1][k]);
        assert_true(cached);
      }
    }
    assert_int_equal(s2.active, s1.active - freed);
    assert_int_equal(s2.cached, s1.cached + freed);
    freed_total += freed;
  }
  /* 40 tokens: tokens 0..32 skipped, blocks 0..7 of the window group. */
  assert_int_equal(freed_total, 8);
  for (size_t k = 0; k < 10; k++) assert_false(kvbm_hreq_must_compute(r, 0, k)); /* all committed */
  kvbm_hreq_destroy(r);
  free(tok);
  kvbm_manager_destroy(m);
}

/* An append that needs more G1 than there is: refused, nothing changed;
 * the same append once room is made. */
static void test_append_no_room(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 64}};
  kvbm_manager *m = hmgr(g, 2, 11);
  uint32_t *a = tu_prompt(1, 20), *c = tu_prompt(5000, 2);
  kvbm_hreq *ra, *rc;
  kvbm_error e = {0};
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 14, &ra, NULL, &e), KVBM_OK); /* 4 + 4 */
  assert_int_equal(kvbm_hreq_commit(ra), KVBM_OK);
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, c, 2, &rc, NULL, &e), KVBM_OK); /* 1 + 1 */
  assert_int_equal(kvbm_pool_available(m->t[KVBM_TIER_G1].pool), 1);
  /* Filling the tail takes no block. */
  assert_int_equal(kvbm_hreq_append(ra, a + 14, 2, &e), KVBM_OK);
  assert_true(kvbm_hreq_must_compute(ra, 0, 3));
  assert_int_equal(kvbm_hreq_commit(ra), KVBM_OK);
  uint32_t t0[8], t1[8];
  size_t n0, n1;
  table(ra, 0, t0, &n0);
  table(ra, 1, t1, &n1);
  kvbm_pool_stats s0 = g1_stats(m);
  kvbm_hreq_info i0, i1;
  kvbm_hreq_wait(ra, 0, &i0);
  /* One more token: a new block in each group, 2 > 1 available. */
  memset(&e, 0, sizeof e);
  assert_int_equal(kvbm_hreq_append(ra, a + 16, 1, &e), KVBM_ENOSPC);
  assert_non_null(strstr(e.msg, "need 2 new G1 blocks in 2 groups, 1 available"));
  kvbm_pool_stats s1 = g1_stats(m);
  assert_memory_equal(&s0, &s1, sizeof s0);
  kvbm_hreq_wait(ra, 0, &i1);
  assert_int_equal(i1.num_tokens, 16);
  assert_memory_equal(&i0, &i1, sizeof i0);
  uint32_t u0[8], u1[8];
  size_t m0, m1;
  table(ra, 0, u0, &m0);
  table(ra, 1, u1, &m1);
  assert_int_equal(m0, n0);
  assert_int_equal(m1, n1);
  assert_memory_equal(t0, u0, n0 * sizeof *t0);
  assert_memory_equal(t1, u1, n1 * sizeof *t1);
  kvbm_frame_phase ph;
  assert_int_equal(kvbm_hreq_block_phase(ra, 4, &ph), KVBM_ERANGE);
  /* Room made (C's two partial blocks go back): the same append fits. */
  kvbm_hreq_destroy(rc);
  assert_int_equal(kvbm_hreq_append(ra, a + 16, 1, &e), KVBM_OK);
  assert_int_equal(table(ra, 0, NULL, &n0), 5);
  assert_int_equal(table(ra, 1, NULL, &n1), 5);
  assert_true(kvbm_hreq_must_compute(ra, 1, 4));
  assert_int_equal(kvbm_hreq_append(NULL, a, 1, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_hreq_append(ra, NULL, 1, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_hreq_append(ra, NULL, 0, &e), KVBM_OK);
  kvbm_hreq_destroy(ra);
  free(a);
  free(c);
  kvbm_manager_destroy(m);
}

/* Whether group g's block k of tok is registered in G1. */
static bool registered(kvbm_manager *m, const uint64_t *h, size_t k, uint32_t g) {
  return kvbm_pool_peek(m->t[KVBM_TIER_G1].pool, kvbm__group_key(h[k], g), NULL, NULL) == KVBM_OK;
}

/* Mamba's state block through decode, in both of vLLM's prefix-caching
 * modes. */
static void mamba_case(kvbm_group_kind kind) {
  const bool align = kind == KVBM_GROUP_MAMBA_ALIGN;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {kind, 0}};
  kvbm_manager *m = hmgr(g, 2, 64);
  uint32_t *tok = tu_prompt(300, 32);
  uint64_t h[8];
  tu_hashes(m, tok, 8, B, h);
  kvbm_hreq *r;
  kvbm_error e = {0};
  uint32_t ids[16];
  size_t nb;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, tok, 6, &r, NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  /* 6 computed: skipped 5 tokens, block 0 freed, the state is block 1. */
  assert_int_equal(table(r, 1, ids, &nb), 1);
  assert_int_equal(nb, 2);
  assert_int_not_equal(ids[1], KVBM_HREQ_NULL);
  /* One step of 7 tokens (13: blocks 2 and 3 new): "all" allocates both,
   * "align" only the running state's block 3. */
  assert_int_equal(kvbm_hreq_append(r, tok + 6, 7, &e), KVBM_OK);
  assert_int_equal(table(r, 1, ids, &nb), align ? 2 : 3);
  assert_int_equal(nb, 4);
  assert_int_equal(ids[2] == KVBM_HREQ_NULL, align);
  assert_true(registered(m, h, 1, 1)); /* block 1 filled in this step */
  assert_int_equal(registered(m, h, 2, 1), !align);
  assert_true(kvbm_hreq_must_compute(r, 1, 3));
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  /* 13 computed: one state block held, the last. */
  assert_int_equal(table(r, 1, ids, &nb), 1);
  assert_int_not_equal(ids[3], KVBM_HREQ_NULL);
  /* Then token by token: after each commit exactly the last block. */
  for (size_t n = 13; n < 32; n++) {
    assert_int_equal(kvbm_hreq_append(r, tok + n, 1, &e), KVBM_OK);
    assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
    assert_int_equal(table(r, 1, ids, &nb), 1);
    assert_int_not_equal(ids[nb - 1], KVBM_HREQ_NULL);
    size_t held0 = table(r, 0, NULL, &nb);
    assert_int_equal(held0, nb); /* full attention keeps all */
  }
  /* Every state at a block boundary a step ended on is cached. */
  for (size_t k = 3; k < 8; k++) assert_true(registered(m, h, k, 1));
  kvbm_hreq_destroy(r);
  free(tok);
  kvbm_manager_destroy(m);
}

static void test_mamba_all_decode(void **st) {
  (void)st;
  mamba_case(KVBM_GROUP_MAMBA);
}

static void test_mamba_align_decode(void **st) {
  (void)st;
  mamba_case(KVBM_GROUP_MAMBA_ALIGN);
}

/* ---- phases and events of appended blocks ---- */

static void test_phases_and_events(void **st) {
  (void)st;
  const kvbm_group_spec g[3] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}, {KVBM_GROUP_MAMBA, 0}};
  tu_g1_log log = {0};
  kvbm_manager_config c = tu_config(NULL, 64, 0, 0);
  c.groups = g;
  c.num_groups = 3;
  tu_g1_log_attach(&c, &log);
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  uint32_t *tok = tu_prompt(700, 24);
  uint64_t h[6];
  tu_hashes(m, tok, 6, B, h);
  kvbm_hreq *r;
  kvbm_error e = {0};
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, tok, 8, &r, NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  size_t prompt_events = log.n;
  assert_int_equal(prompt_events, 6); /* 2 blocks x 3 groups */
  assert_int_equal(kvbm_hreq_set_phase(r, KVBM_REQUEST_REASONING, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_append(r, tok + 8, 8, &e), KVBM_OK); /* blocks 2, 3 */
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  assert_int_equal(kvbm_hreq_set_phase(r, KVBM_REQUEST_EXIT_THINK, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_set_phase(r, KVBM_REQUEST_OUTPUT, &e), KVBM_OK);
  assert_int_equal(kvbm_hreq_append(r, tok + 16, 4, &e), KVBM_OK); /* block 4 */
  const kvbm_frame_phase want[5] = {KVBM_PHASE_OUTPUT_CRITICAL, KVBM_PHASE_OUTPUT_CRITICAL,
                                    KVBM_PHASE_THINK_COMPLETE, KVBM_PHASE_THINK_COMPLETE,
                                    KVBM_PHASE_OUTPUT_CRITICAL};
  for (size_t k = 0; k < 5; k++) {
    kvbm_frame_phase ph;
    assert_int_equal(kvbm_hreq_block_phase(r, k, &ph), KVBM_OK);
    assert_int_equal(ph, want[k]);
  }
  assert_int_equal(kvbm_hreq_set_phase(r, KVBM_REQUEST_REASONING, &e), KVBM_ESTATE);
  assert_int_equal(kvbm_hreq_set_phase(r, (kvbm_request_phase)7, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "not a request phase"));
  /* Appended blocks 2, 3, 4: one STORED per group, each under the block's
   * own hash (never a group's key) with its group. */
  assert_int_equal(log.n, prompt_events + 9);
  size_t seen[3][6] = {{0}};
  for (size_t i = prompt_events; i < log.n; i++) {
    size_t k = 6;
    for (size_t j = 0; j < 6; j++)
      if (log.hash[i] == h[j]) k = j;
    assert_true(k >= 2 && k <= 4);
    assert_true(log.group[i] < 3);
    seen[log.group[i]][k]++;
  }
  for (uint32_t gi = 0; gi < 3; gi++)
    for (size_t k = 2; k <= 4; k++) assert_int_equal(seen[gi][k], 1);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  /* Destroy demotes the ended reasoning (every group's THINK_COMPLETE
   * block it still holds, tail first): the full group's block 2, demoted
   * last, is the first G1 evicts; without the demotion it would be the
   * window group's block 0, released first (at the first commit past it). */
  const uint32_t *t;
  size_t nb;
  kvbm_hreq_table(r, 0, &t, &nb);
  const uint32_t id2 = t[2];
  kvbm_hreq_destroy(r);
  kvbm_pool *g1 = m->t[KVBM_TIER_G1].pool;
  kvbm_pool_stats s = g1_stats(m);
  uint32_t *ids = malloc((s.free + 1) * sizeof *ids);
  assert_int_equal(kvbm_pool_alloc(g1, s.free + 1, ids), KVBM_OK); /* every free one, then one eviction */
  assert_int_equal(ids[s.free], id2);
  for (uint32_t i = 0; i <= s.free; i++) assert_int_equal(kvbm_block_release(g1, ids[i], 0), KVBM_OK);
  free(ids);
  free(tok);
  kvbm_manager_destroy(m);
}

/* ---- a slow G4: a vendor backend holding values in memory ---- */

typedef struct memslow {
  pthread_mutex_t mu;
  int get_delay_ms; /* every batch with a GET takes this long */
  uint64_t slow_key; /* non-zero: only a batch with a GET of this key is slow */
  uint64_t key[256];
  uint8_t *val[256];
  size_t len[256], n;
  size_t gets;
} memslow;

static int ms_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  (void)cfg;
  (void)err;
  *state = user;
  return KVBM_OK;
}

static long ms_find(memslow *s, uint64_t key) {
  for (size_t i = 0; i < s->n; i++)
    if (s->key[i] == key) return (long)i;
  return -1;
}

static void ms_run(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  (void)deadline_ns;
  memslow *s = state;
  pthread_mutex_lock(&s->mu);
  int d = 0;
  for (size_t i = 0; i < n; i++)
    if (ops[i].kind == KVBM_VOLUME_GET && (!s->slow_key || ops[i].key == s->slow_key)) d = s->get_delay_ms;
  pthread_mutex_unlock(&s->mu);
  if (d) {
    struct timespec ts = {d / 1000, (long)(d % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < n; i++) {
    kvbm_volume_op *o = &ops[i];
    long at = ms_find(s, o->key);
    switch (o->kind) {
    case KVBM_VOLUME_PUT:
      if (at < 0 && s->n < 256) at = (long)s->n++;
      if (at < 0) {
        o->status = KVBM_ENOSPC;
        break;
      }
      free(s->val[at]);
      s->key[at] = o->key;
      s->val[at] = malloc(o->len);
      memcpy(s->val[at], o->src, o->len);
      s->len[at] = o->len;
      o->status = KVBM_OK;
      break;
    case KVBM_VOLUME_GET:
      s->gets++;
      if (at < 0) {
        o->status = KVBM_ENOTFOUND;
      } else if (s->len[at] > o->cap) {
        o->status = KVBM_ETOOLONG;
      } else {
        memcpy(o->dst, s->val[at], s->len[at]);
        o->size = s->len[at];
        o->status = KVBM_OK;
      }
      break;
    case KVBM_VOLUME_EXISTS:
      o->size = at < 0 ? 0 : s->len[at];
      o->status = at < 0 ? KVBM_ENOTFOUND : KVBM_OK;
      break;
    default:
      o->status = at < 0 ? KVBM_ENOTFOUND : KVBM_OK;
      break;
    }
  }
  pthread_mutex_unlock(&s->mu);
}

static void ms_close(void *state) { (void)state; }

static const kvbm_volume_backend memslow_backend = {
    .scheme = "memslow", .open = ms_open, .run = ms_run, .close = ms_close};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The bytes the engine writes for group g's block k (tu_layer's pattern,
 * keyed so that a value from the store cannot pass for them). */
static int engine_block(kvbm_manager *m, uint32_t id, uint64_t key, int check) {
  return tu_block(m, id, key ^ 0xE1E1E1E1u, check);
}

static void test_g4_deadline(void **st) {
  (void)st;
  memslow s = {0};
  pthread_mutex_init(&s.mu, NULL);
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}};
  kvbm_manager_config c = tu_config(NULL, 40, 0, 0);
  c.groups = g;
  c.num_groups = 2;
  c.g4_url = "memslow://store";
  c.g4_backend = &memslow_backend;
  c.g4_backend_user = &s;
  c.g4_policy = KVBM_OFFLOAD_ALL;
  c.g4_timeout_ms = 200;
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  uint32_t *a = tu_prompt(40000, 40);
  uint64_t h[10];
  tu_hashes(m, a, 10, B, h);
  /* A's 10 blocks a group reach G4; then other prompts push A out of G1. */
  kvbm_hreq *r;
  kvbm_error e = {0};
  for (int round = 0; round < 5; round++) {
    uint32_t *p = round ? tu_prompt(90000u + (uint32_t)round * 1000u, 36) : a;
    assert_int_equal(kvbm_manager_hprefill(m, 0, 0, p, round ? 36 : 40, &r, NULL, &e), KVBM_OK);
    assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
    kvbm_manager_flush(m);
    kvbm_hreq_destroy(r);
    if (round) free(p);
  }
  kvbm_tier_stats g4a = tu_stats(m, KVBM_TIER_G4);
  assert_true(g4a.offloaded_blocks >= 20);
  pthread_mutex_lock(&s.mu);
  s.get_delay_ms = 2500;
  pthread_mutex_unlock(&s.mu);

  double t0 = now_s();
  size_t hit;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 40, &r, &hit, &e), KVBM_OK);
  assert_int_equal(hit, 36); /* found: 9 blocks, 9 + 2 onboards */
  kvbm_hreq_info i;
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  double waited = now_s() - t0;
  assert_true(waited < 2.0); /* one deadline of 0.2 s, not the store's 2.5 s (margin: a loaded machine) */
  assert_int_equal(i.onboarded[0], 9);
  assert_int_equal(i.onboarded[1], 2);
  assert_int_equal(i.hit_tokens, 0); /* nothing arrived: the rule's hit is 0 */
  kvbm_tier_stats g4b = tu_stats(m, KVBM_TIER_G4);
  assert_int_equal(g4b.abandoned - g4a.abandoned, 11);
  /* The engine computes everything, commits; late answers land after. */
  const uint32_t *ids;
  size_t nb;
  for (uint32_t gi = 0; gi < 2; gi++) {
    assert_int_equal(kvbm_hreq_table(r, gi, &ids, &nb), KVBM_OK);
    for (size_t k = 0; k < 10; k++) {
      if (ids[k] == KVBM_HREQ_NULL) continue;
      assert_true(kvbm_hreq_must_compute(r, gi, k));
      assert_true(engine_block(m, ids[k], kvbm__group_key(h[k], gi), 0));
    }
  }
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  struct timespec ts = {2, 700000000L}; /* the store answers meanwhile */
  nanosleep(&ts, NULL);
  kvbm_manager_flush(m);
  for (uint32_t gi = 0; gi < 2; gi++) {
    assert_int_equal(kvbm_hreq_table(r, gi, &ids, &nb), KVBM_OK);
    for (size_t k = 0; k < 10; k++)
      if (ids[k] != KVBM_HREQ_NULL) assert_true(engine_block(m, ids[k], kvbm__group_key(h[k], gi), 1));
  }
  kvbm_tier_stats g4c = tu_stats(m, KVBM_TIER_G4);
  assert_int_equal(g4c.onboarded_blocks, g4a.onboarded_blocks); /* none landed */
  assert_int_equal(g4c.hit_blocks - g4a.hit_blocks,
                   (g4c.onboarded_blocks - g4a.onboarded_blocks) + (g4c.onboard_failures - g4a.onboard_failures) +
                       (g4c.abandoned - g4a.abandoned));
  kvbm_hreq_destroy(r);
  kvbm_manager_destroy(m);
  for (size_t k = 0; k < s.n; k++) free(s.val[k]);
  pthread_mutex_destroy(&s.mu);
  free(a);
}

/* One late block: full + chunk:16 (B 4), G4 answering at once but for
 * the full group's block 8, one GET in flight at a time (the prompt's
 * order). The hit found is 9 blocks (full: 0..8; chunk: only block 8,
 * the hit's chunk); at the deadline block 8 of both groups is given up,
 * and the group rule over what arrived gives 8 blocks: full attention
 * has 0..7, and a hit of 32 tokens needs nothing of the chunked group
 * (its chunk starts at 32). Blocks 0..7 are the store's bytes; the
 * engine computes block 8 in both groups. */
static void test_g4_deadline_one_late(void **st) {
  (void)st;
  memslow s = {0};
  pthread_mutex_init(&s.mu, NULL);
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_CHUNKED_LOCAL, 16}};
  kvbm_manager_config c = tu_config(NULL, 40, 0, 0);
  c.groups = g;
  c.num_groups = 2;
  c.g4_url = "memslow://store";
  c.g4_backend = &memslow_backend;
  c.g4_backend_user = &s;
  c.g4_policy = KVBM_OFFLOAD_ALL;
  c.g4_timeout_ms = 300;
  c.g4_queue_depth = 1;
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  uint32_t *a = tu_prompt(50000, 40);
  uint64_t h[10];
  tu_hashes(m, a, 10, B, h);
  kvbm_hreq *r;
  kvbm_error e = {0};
  for (int round = 0; round < 5; round++) {
    uint32_t *p = round ? tu_prompt(95000u + (uint32_t)round * 1000u, 36) : a;
    assert_int_equal(kvbm_manager_hprefill(m, 0, 0, p, round ? 36 : 40, &r, NULL, &e), KVBM_OK);
    for (uint32_t gi = 0; gi < 2 && !round; gi++) {
      const uint32_t *ids;
      size_t nb;
      assert_int_equal(kvbm_hreq_table(r, gi, &ids, &nb), KVBM_OK);
      for (size_t k = 0; k < 10; k++) assert_true(tu_block(m, ids[k], kvbm__group_key(h[k], gi), 0));
    }
    assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
    kvbm_manager_flush(m);
    kvbm_hreq_destroy(r);
    if (round) free(p);
  }
  kvbm_tier_stats g4a = tu_stats(m, KVBM_TIER_G4);
  pthread_mutex_lock(&s.mu);
  s.get_delay_ms = 2500;
  s.slow_key = h[8]; /* group 0's key is the hash */
  pthread_mutex_unlock(&s.mu);
  size_t hit;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 40, &r, &hit, &e), KVBM_OK);
  assert_int_equal(hit, 36);
  kvbm_hreq_info i;
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  assert_int_equal(i.onboarded[0], 9);
  assert_int_equal(i.onboarded[1], 1); /* the chunk's block 8 only */
  assert_int_equal(i.hit_tokens, 32);
  kvbm_tier_stats g4b = tu_stats(m, KVBM_TIER_G4);
  assert_int_equal(g4b.onboarded_blocks - g4a.onboarded_blocks, 8);
  assert_int_equal(g4b.abandoned - g4a.abandoned, 2);
  const uint32_t *ids;
  size_t nb;
  assert_int_equal(kvbm_hreq_table(r, 0, &ids, &nb), KVBM_OK);
  for (size_t k = 0; k < 8; k++) {
    assert_false(kvbm_hreq_must_compute(r, 0, k));
    assert_true(tu_block(m, ids[k], h[k], 1)); /* the store's bytes */
  }
  assert_true(kvbm_hreq_must_compute(r, 0, 8));
  assert_true(kvbm_hreq_must_compute(r, 1, 8));
  kvbm_hreq_destroy(r);
  kvbm_manager_destroy(m);
  for (size_t k = 0; k < s.n; k++) free(s.val[k]);
  pthread_mutex_destroy(&s.mu);
  free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window_decode),      cmocka_unit_test(test_append_no_room),
      cmocka_unit_test(test_mamba_all_decode),   cmocka_unit_test(test_mamba_align_decode),
      cmocka_unit_test(test_phases_and_events),  cmocka_unit_test(test_g4_deadline),
      cmocka_unit_test(test_g4_deadline_one_late),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
