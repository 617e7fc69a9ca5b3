/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_disagg.c: the manager's peers (kvbm/peer.h, and kvbm/manager.h's
 * "phases"), two managers in one process over the in-process fabric.
 *
 * Without a fabric: offload and ingest say "disaggregation unavailable",
 * location says local. Phases: labels per block (prompt and output
 * OutputCritical, reasoning ThinkActive, ThinkComplete after ExitThink),
 * the ExitThink batch pushed to the peer once offload_threshold_blocks are
 * ready and not before, ThinkComplete blocks first out of G1 after the
 * request ends. Offload/ingest in push and put modes: the decode side's
 * prefill of the same prompt then matches every full block and every
 * byte is right; layouts that differ (kind and alignment) bridged, a
 * shape that differs refused by name. Corruption in flight refused. A
 * hostile peer (a raw fabric end speaking the protocol) sends a frame for
 * a block it was not granted, a wrong length, a bad checksum, a stale
 * layout, a hash that does not follow from its tokens: each refused with
 * its reason, and the decode cache untouched. OutputCritical pull: off,
 * the evicted blocks are recomputed; on, they come back from the peer;
 * with G1 full, an output-phase prefill drops peer-held copies
 * (ThinkComplete first, never blocks held only here nor its own hits)
 * and pulls its blocks back, while a reasoning-phase one does neither.
 * Acknowledgements (issue 24): a peer's answer for a hash never sent,
 * answered already, or forgotten beyond the bound of awaited sends is
 * refused and counted, and never makes a block "remote" nor ends a flush;
 * with the remote index full, an acknowledgement costs a bounded number
 * of index probes (a test seam's count, not a clock).
 * What a peer holds (issue 23): a block the peer evicted and said so, or
 * answered "not held" for, is no longer remote; a closed peer's word is
 * all forgotten; a word older than its lease (a test seam moves the lease
 * clock) is not believed, and a new answer renews it; an output-phase
 * prefill drops no G1 copy for room on a word its peer took back, nor on
 * one older than the lease (on the old code: the cluster's last copy).
 * Hellos of version 1, 2 and 3 are accepted, 4 refused.
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

typedef struct attach_job {
  kvbm_manager *m;
  kvbm_fabric *f;
  kvbm_peer_config cfg;
  uint32_t peer;
  int rc;
  kvbm_error e;
} attach_job;

static void *attach_thread(void *arg) {
  attach_job *j = arg;
  j->rc = kvbm_manager_attach(j->m, j->f, &j->cfg, &j->peer, &j->e);
  return NULL;
}

/* Two managers (and fabric ends) attached to each other. */
typedef struct pair {
  kvbm_manager *a, *b;
  kvbm_fabric *fa, *fb;
  int rc_a, rc_b;
  kvbm_error ea, eb;
} pair;

static void pair_attach(pair *p, const kvbm_peer_config *ca, const kvbm_peer_config *cb) {
  assert_int_equal(kvbm_fabric_inproc_pair("prefill", "decode", &p->fa, &p->fb, NULL), KVBM_OK);
  attach_job jb = {.m = p->b, .f = p->fb, .cfg = cb ? *cb : kvbm_peer_config_default()};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, attach_thread, &jb), 0);
  uint32_t peer = 99;
  kvbm_peer_config a = ca ? *ca : kvbm_peer_config_default();
  p->rc_a = kvbm_manager_attach(p->a, p->fa, &a, &peer, &p->ea);
  pthread_join(th, NULL);
  p->rc_b = jb.rc;
  p->eb = jb.e;
  if (p->rc_a == KVBM_OK) assert_int_equal(peer, 0);
}

static void pair_free(pair *p) {
  kvbm_manager_destroy(p->a);
  kvbm_manager_destroy(p->b);
  kvbm_fabric_destroy(p->fa);
  kvbm_fabric_destroy(p->fb);
}

static kvbm_manager *make(uint32_t g1, kvbm_layout_kind kind, uint64_t alignment, uint64_t corrupt) {
  kvbm_manager_config c = tu_config(NULL, g1, 0, 0);
  c.g1_kind = kind;
  c.layout.alignment = alignment;
  c.offload_threshold_blocks = 3;
  kvbm_manager *m = NULL;
  kvbm_error e = {0};
  if (kvbm_manager_create(&c, &m, &e)) fail_msg("create: %s", e.msg);
  if (corrupt) assert_int_equal(kvbm__peer_corrupt_offloads(m, corrupt), KVBM_OK);
  return m;
}

/* The sequence hashes of the full blocks of tok[0..n). */
static void hashes_of(const uint32_t *tok, size_t n, uint64_t *h) {
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, n, 4, h, n / 4);
}

/* ---- without a fabric: the ADR's defaults ---- */

static void test_no_fabric_defaults(void **state) {
  (void)state;
  kvbm_manager *m = make(16, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0);
  uint32_t *tok = tu_prompt(100, 12);
  assert_int_equal(tu_run(m, tok, 12, NULL, NULL), 0);
  uint64_t h[3];
  hashes_of(tok, 12, h);
  kvbm_error e;
  assert_int_equal(kvbm_manager_offload_block(m, 0, h[0], KVBM_PHASE_THINK_COMPLETE, &e), KVBM_EDISAGG);
  assert_non_null(strstr(e.msg, "disaggregation unavailable"));
  uint8_t junk[64] = {0};
  assert_int_equal(kvbm_manager_ingest_block(m, 0, junk, sizeof junk, &e), KVBM_EDISAGG);
  assert_int_equal(kvbm_manager_peer_flush(m, 0, 10, &e), KVBM_EDISAGG);
  assert_string_equal(kvbm_status_name(KVBM_EDISAGG), "KVBM_EDISAGG");
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(m, h[1], &loc), KVBM_OK);
  assert_false(loc.remote);
  assert_true(loc.held);
  assert_int_equal(loc.tier, KVBM_TIER_G1);
  assert_int_equal(kvbm_manager_block_location(m, 12345, &loc), KVBM_OK);
  assert_false(loc.remote);
  assert_false(loc.held);
  free(tok);
  kvbm_manager_destroy(m);
}

/* ---- phases ---- */

static void test_phase_labels(void **state) {
  (void)state;
  kvbm_manager *m = make(32, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0);
  uint32_t *tok = tu_prompt(7, 64);
  kvbm_mreq *r;
  kvbm_error e;
  /* prompt: 2 full blocks (+2 tokens) */
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, tok, 10, &r, NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_mreq_set_phase(r, KVBM_REQUEST_REASONING, &e), KVBM_OK);
  assert_int_equal(kvbm_mreq_append(r, tok + 10, 14), KVBM_OK); /* blocks 2..5 fill while reasoning */
  assert_int_equal(kvbm_mreq_set_phase(r, KVBM_REQUEST_EXIT_THINK, &e), KVBM_OK);
  assert_int_equal(kvbm_mreq_append(r, tok + 24, 3), KVBM_OK); /* 27 tokens: block 6 not full */
  assert_int_equal(kvbm_mreq_set_phase(r, KVBM_REQUEST_OUTPUT, &e), KVBM_OK);
  assert_int_equal(kvbm_mreq_append(r, tok + 27, 5), KVBM_OK); /* 32 tokens: blocks 6, 7 */
  static const kvbm_frame_phase want[8] = {
      KVBM_PHASE_OUTPUT_CRITICAL, KVBM_PHASE_OUTPUT_CRITICAL, KVBM_PHASE_THINK_COMPLETE,
      KVBM_PHASE_THINK_COMPLETE,  KVBM_PHASE_THINK_COMPLETE,  KVBM_PHASE_THINK_COMPLETE,
      KVBM_PHASE_OUTPUT_CRITICAL, KVBM_PHASE_OUTPUT_CRITICAL};
  for (size_t k = 0; k < 8; k++) {
    kvbm_frame_phase ph;
    assert_int_equal(kvbm_mreq_block_phase(r, k, &ph), KVBM_OK);
    if (ph != want[k]) fail_msg("block %zu: %s, want %s", k, kvbm_frame_phase_name(ph), kvbm_frame_phase_name(want[k]));
  }
  kvbm_frame_phase ph;
  assert_int_equal(kvbm_mreq_block_phase(r, 8, &ph), KVBM_ERANGE);
  assert_int_equal(kvbm_mreq_set_phase(r, KVBM_REQUEST_REASONING, &e), KVBM_ESTATE);
  assert_int_equal(kvbm_mreq_set_phase(r, (kvbm_request_phase)9, &e), KVBM_EINVAL);
  kvbm_mreq_destroy(r);

  /* while reasoning, before ExitThink: ThinkActive */
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, tok + 32, 4, &r, NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_mreq_set_phase(r, KVBM_REQUEST_REASONING, &e), KVBM_OK);
  assert_int_equal(kvbm_mreq_append(r, tok + 36, 4), KVBM_OK);
  assert_int_equal(kvbm_mreq_block_phase(r, 1, &ph), KVBM_OK);
  assert_int_equal(ph, KVBM_PHASE_THINK_ACTIVE);
  kvbm_mreq_destroy(r);
  free(tok);
  kvbm_manager_destroy(m);
}

/* A request: prompt of `np` tokens, reasoning of `nr`, ExitThink, output
 * of `no`, committed after each step (its KV written). */
static kvbm_mreq *reasoning_request(kvbm_manager *m, const uint32_t *tok, size_t np, size_t nr, size_t no) {
  kvbm_mreq *r;
  kvbm_mreq_info info;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, tok, np, &r, NULL, NULL), KVBM_OK);
  kvbm_mreq_wait(r, -1, &info);
  tu_compute(m, r, info.matched_tokens / 4);
  assert_int_equal(kvbm_mreq_commit(r), KVBM_OK);
  assert_int_equal(kvbm_mreq_set_phase(r, KVBM_REQUEST_REASONING, NULL), KVBM_OK);
  assert_int_equal(kvbm_mreq_append(r, tok + np, nr), KVBM_OK);
  tu_compute(m, r, np / 4);
  assert_int_equal(kvbm_mreq_commit(r), KVBM_OK);
  assert_int_equal(kvbm_mreq_set_phase(r, KVBM_REQUEST_EXIT_THINK, NULL), KVBM_OK);
  assert_int_equal(kvbm_mreq_set_phase(r, KVBM_REQUEST_OUTPUT, NULL), KVBM_OK);
  if (no) {
    assert_int_equal(kvbm_mreq_append(r, tok + np + nr, no), KVBM_OK);
    tu_compute(m, r, (np + nr) / 4);
    assert_int_equal(kvbm_mreq_commit(r), KVBM_OK);
  }
  return r;
}

/* Prefills tok[0..n) on m and returns the settled match; the matched
 * blocks' bytes are checked (*good). */
static size_t match_on(kvbm_manager *m, const uint32_t *tok, size_t n, size_t *good) {
  kvbm_mreq *r;
  kvbm_mreq_info info;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, tok, n, &r, NULL, NULL), KVBM_OK);
  kvbm_mreq_wait(r, -1, &info);
  if (good) *good = tu_verify(m, r, info.matched_tokens / 4);
  kvbm_mreq_destroy(r);
  return info.matched_tokens / 4;
}

static void test_exit_think_batch(void **state) {
  (void)state;
  for (int mode = 0; mode < 2; mode++) {
    pair p = {.a = make(32, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0), .b = make(32, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0)};
    kvbm_peer_config c = kvbm_peer_config_default();
    c.mode = mode ? KVBM_DISAGG_PUT : KVBM_DISAGG_PUSH;
    pair_attach(&p, &c, &c);
    assert_int_equal(p.rc_a, KVBM_OK);
    assert_int_equal(p.rc_b, KVBM_OK);
    uint32_t *tok = tu_prompt(300, 64);
    /* 2 reasoning blocks: below the threshold of 3, nothing pushed */
    kvbm_mreq *r = reasoning_request(p.a, tok, 8, 8, 0);
    kvbm_peer_stats st;
    kvbm_manager_peer_stats_get(p.a, 0, &st);
    assert_int_equal(st.exit_think_batches, 0);
    assert_int_equal(st.sent_blocks, 0);
    kvbm_mreq_destroy(r);
    /* 4 reasoning blocks: pushed in one batch at ExitThink */
    r = reasoning_request(p.a, tok + 16, 8, 16, 4);
    assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
    kvbm_manager_peer_stats_get(p.a, 0, &st);
    assert_int_equal(st.exit_think_batches, 1);
    assert_int_equal(st.exit_think_blocks, 4);
    assert_int_equal(st.sent_blocks, 4);
    assert_int_equal(st.acked_blocks, 4);
    kvbm_peer_stats sb;
    kvbm_manager_peer_stats_get(p.b, 0, &sb);
    assert_int_equal(sb.ingested, 4);
    if (mode) assert_int_equal(sb.grants_given, 4);
    /* the decode side holds blocks 2..5 of that request, bytes intact; a
     * prefill there of the request's tokens finds them once the prompt's
     * blocks (not pushed: OutputCritical) are there too */
    uint64_t h[7];
    hashes_of(tok + 16, 28, h);
    for (int k = 2; k < 6; k++) {
      kvbm_block_location loc;
      kvbm_manager_block_location(p.b, h[k], &loc);
      assert_true(loc.held && loc.tier == KVBM_TIER_G1);
    }
    kvbm_block_location loc;
    kvbm_manager_block_location(p.b, h[0], &loc);
    assert_false(loc.held);
    kvbm_mreq_destroy(r);
    /* ThinkComplete blocks are first out of G1 once the request ended:
     * fill G1 with other blocks; the prompt and output blocks outlive
     * the reasoning blocks */
    uint32_t *other = tu_prompt(90000, 4 * 26 + 1);
    assert_int_equal(tu_run(p.a, other, 4 * 26 + 1, NULL, NULL), 0);
    for (int k = 2; k < 6; k++) {
      kvbm_manager_block_location(p.a, h[k], &loc);
      assert_false(loc.held);
      assert_true(loc.remote); /* evicted here, acknowledged by the peer */
      assert_int_equal(loc.peer, 0);
    }
    kvbm_manager_block_location(p.a, h[0], &loc);
    assert_true(loc.held);
    kvbm_manager_block_location(p.a, h[6], &loc);
    assert_true(loc.held);
    free(other);
    free(tok);
    pair_free(&p);
  }
}

/* Offload of a whole prompt, both modes, layouts of other kinds and
 * alignments: the decode side's prefill matches every full block, bytes
 * right. One block corrupted in flight is refused and ends the match. */
static void offload_prompt(kvbm_disagg_mode mode, kvbm_layout_kind ka, kvbm_layout_kind kb, uint64_t corrupt) {
  pair p = {.a = make(32, ka, 256, corrupt), .b = make(32, kb, 64, 0)};
  kvbm_peer_config c = kvbm_peer_config_default();
  c.mode = mode;
  c.landing_blocks = 3; /* fewer than the blocks: grants are reused */
  pair_attach(&p, &c, &c);
  assert_int_equal(p.rc_a, KVBM_OK);
  uint32_t *tok = tu_prompt(5000, 33);
  assert_int_equal(tu_run(p.a, tok, 33, NULL, NULL), 0);
  uint64_t h[8];
  hashes_of(tok, 33, h);
  for (int k = 0; k < 8; k++)
    assert_int_equal(kvbm_manager_offload_block(p.a, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
  kvbm_peer_stats sa, sb;
  kvbm_manager_peer_stats_get(p.a, 0, &sa);
  kvbm_manager_peer_stats_get(p.b, 0, &sb);
  size_t good = 0, matched = match_on(p.b, tok, 33, &good);
  if (!corrupt) {
    assert_int_equal(sa.acked_blocks, 8);
    assert_int_equal(sb.ingested, 8);
    assert_int_equal(matched, 8);
    assert_int_equal(good, 8);
  } else {
    /* bit 3: the 4th block */
    assert_int_equal(sa.acked_blocks, 7);
    assert_int_equal(sa.peer_refused, 1);
    assert_int_equal(sb.refused_checksum, 1);
    assert_non_null(strstr(sb.last_refusal, "KVBM_ECHECKSUM"));
    assert_int_equal(matched, 3);
    assert_int_equal(good, 3);
    kvbm_block_location loc;
    kvbm_manager_block_location(p.b, h[3], &loc);
    assert_false(loc.held);
  }
  free(tok);
  pair_free(&p);
}

static void test_offload_push(void **state) {
  (void)state;
  offload_prompt(KVBM_DISAGG_PUSH, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_FULLY_CONTIGUOUS, 0);
  offload_prompt(KVBM_DISAGG_PUSH, KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_FULLY_CONTIGUOUS, 0);
  offload_prompt(KVBM_DISAGG_PUSH, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_FULLY_CONTIGUOUS, 1u << 3);
}

static void test_offload_put(void **state) {
  (void)state;
  offload_prompt(KVBM_DISAGG_PUT, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_FULLY_CONTIGUOUS, 0);
  offload_prompt(KVBM_DISAGG_PUT, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_LAYER_SEPARATE, 0);
  offload_prompt(KVBM_DISAGG_PUT, KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_FULLY_CONTIGUOUS, 0);
  offload_prompt(KVBM_DISAGG_PUT, KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_LAYER_SEPARATE, 1u << 3);
}

static void test_shape_mismatch_refused(void **state) {
  (void)state;
  kvbm_manager *b;
  kvbm_manager_config c = tu_config(NULL, 16, 0, 0);
  c.layout.inner_dim = 16; /* another shape */
  assert_int_equal(kvbm_manager_create(&c, &b, NULL), KVBM_OK);
  pair p = {.a = make(16, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0), .b = b};
  kvbm_peer_config pc = kvbm_peer_config_default();
  pc.timeout_ms = 2000;
  pair_attach(&p, &pc, &pc);
  assert_int_equal(p.rc_a, KVBM_EUNSUPPORTED);
  assert_non_null(strstr(p.ea.msg, "layout mismatch: inner_dim 8 here, 16 at the peer"));
  assert_int_equal(p.rc_b, KVBM_EUNSUPPORTED);
  assert_non_null(strstr(p.eb.msg, "inner_dim 16 here, 8 at the peer"));
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &st), KVBM_ENOTFOUND);
  pair_free(&p);
}

/* ---- a hostile peer: a raw fabric end that speaks the protocol ---- */

typedef struct hostile {
  kvbm_fabric *f;
  kvbm_fabric_remote_set *rs; /* the manager's landing zone */
  uint64_t land_id;
  kvbm_storage *s;
  kvbm_fabric_local_set *ls;
  uint32_t version; /* its hello's protocol version (0: 1) */
} hostile;

static void *hostile_hello(void *arg) {
  hostile *h = arg;
  /* its own landing zone (the shape of the test config), then its hello */
  kvbm_layout_config lc = {.num_blocks = 2, .num_layers = 3, .outer_dim = 2, .page_size = 4, .inner_dim = 8,
                           .dtype_size = 2, .alignment = 256};
  kvbm_layout lay;
  kvbm_layout_init(&lay, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, NULL);
  kvbm_layout_desc d = {0};
  uint8_t *wire;
  size_t wlen;
  if (kvbm_fabric_storage_create(h->f, &lay, &h->s, NULL) || kvbm_storage_describe(h->s, &lay, 7, &d, NULL) ||
      kvbm_fabric_register(h->f, &d, &h->ls, NULL) || kvbm_fabric_export(h->ls, &wire, &wlen, NULL))
    return NULL;
  kvbm_layout_desc_release(&d);
  uint8_t *msg = calloc(1, 32 + wlen);
  memcpy(msg, "KVPH", 4);
  msg[4] = (uint8_t)(h->version ? h->version : 1);
  msg[8] = 1; /* mode PUT */
  for (int i = 0; i < 8; i++) msg[24 + i] = (uint8_t)((uint64_t)wlen >> (8 * i));
  memcpy(msg + 32, wire, wlen);
  kvbm_fabric_push(h->f, msg, 32 + wlen, NULL, NULL);
  free(msg);
  free(wire);
  kvbm_fabric_handle hd;
  size_t len;
  if (kvbm_fabric_next(h->f, 5000, &hd, &len, NULL)) return NULL;
  uint8_t *buf = malloc(len);
  kvbm_fabric_pull(h->f, hd, buf, len, &len, 1000, NULL);
  if (kvbm_fabric_import(h->f, buf + 32, len - 32, &h->rs, NULL) == KVBM_OK)
    h->land_id = kvbm_fabric_remote_desc(h->rs)->block_set_id;
  free(buf);
  return NULL;
}

/* Sends one message and returns the manager's acknowledgement status. */
static int hostile_send(hostile *h, const uint8_t *msg, size_t len) {
  assert_int_equal(kvbm_fabric_push(h->f, msg, len, NULL, NULL), KVBM_OK);
  for (;;) {
    kvbm_fabric_handle hd;
    size_t n;
    assert_int_equal(kvbm_fabric_next(h->f, 5000, &hd, &n, NULL), KVBM_OK);
    uint8_t buf[64];
    assert_true(n <= sizeof buf);
    assert_int_equal(kvbm_fabric_pull(h->f, hd, buf, sizeof buf, &n, 1000, NULL), KVBM_OK);
    if (n == 16 && memcmp(buf, "KVAC", 4) == 0) {
      int32_t st;
      memcpy(&st, buf + 4, 4);
      return st;
    }
    if (n >= 8 && memcmp(buf, "KVGR", 4) == 0) return 1000 + buf[4]; /* a grant reply: n granted */
  }
}

static size_t make_block_msg(hostile *h, const uint32_t *tok, uint64_t hash, uint64_t parent, bool has_parent,
                             const uint8_t *body, size_t body_len, bool placed, uint64_t block_id, uint8_t *out,
                             size_t cap) {
  kvbm_block_msg m = {.seq_hash = hash, .parent_hash = parent, .has_parent = has_parent, .num_tokens = 4,
                      .tokens = tok, .tier = KVBM_TIER_G1, .layout_id = h->land_id,
                      .phase = KVBM_PHASE_OUTPUT_CRITICAL, .body = body, .body_len = body_len, .placed = placed,
                      .block_id = block_id};
  size_t len = 0;
  assert_int_equal(kvbm_block_msg_encode(&m, out, cap, &len, NULL), KVBM_OK);
  return len;
}

static void test_hostile_peer(void **state) {
  (void)state;
  kvbm_manager *d = make(16, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0);
  hostile h = {0};
  kvbm_fabric *fd;
  assert_int_equal(kvbm_fabric_inproc_pair("evil", "decode", &h.f, &fd, NULL), KVBM_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, hostile_hello, &h), 0);
  kvbm_peer_config pc = kvbm_peer_config_default();
  pc.landing_blocks = 2;
  uint32_t peer;
  kvbm_error e;
  assert_int_equal(kvbm_manager_attach(d, fd, &pc, &peer, &e), KVBM_OK);
  pthread_join(th, NULL);
  assert_non_null(h.rs);

  const size_t bb = kvbm_manager_block_bytes(d);
  uint8_t *body = malloc(bb + 8), msg[4096];
  uint32_t tok[4] = {11, 12, 13, 14};
  uint64_t hash = kvbm_hash_next(KVBM_HASH_NATIVE, 0, 0, false, tok, 4);
  for (size_t i = 0; i < bb + 8; i++) body[i] = (uint8_t)(i * 7);
  kvbm_tier_stats before, after;
  kvbm_manager_stats_get(d, KVBM_TIER_G1, &before);

  /* a placed frame for a landing block never granted */
  size_t len = make_block_msg(&h, tok, hash, 0, false, body, bb, true, 1, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EPROTO);
  /* ... and for one past the zone */
  len = make_block_msg(&h, tok, hash, 0, false, body, bb, true, 99, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EPROTO);
  /* wrong length: a body longer, and one shorter, than a block */
  len = make_block_msg(&h, tok, hash, 0, false, body, bb + 8, false, 0, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_ETOOLONG);
  len = make_block_msg(&h, tok, hash, 0, false, body, bb - 8, false, 0, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EFORMAT);
  /* a bad checksum: one body byte changed after framing */
  len = make_block_msg(&h, tok, hash, 0, false, body, bb, false, 0, msg, sizeof msg);
  msg[len - 5] ^= 1;
  assert_int_equal(hostile_send(&h, msg, len), KVBM_ECHECKSUM);
  /* a stale layout: laid out for another landing zone */
  h.land_id ^= 0x100;
  len = make_block_msg(&h, tok, hash, 0, false, body, bb, false, 0, msg, sizeof msg);
  h.land_id ^= 0x100;
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EPROTO);
  /* a hash that does not follow from the tokens */
  len = make_block_msg(&h, tok, hash ^ 1, 0, false, body, bb, false, 0, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EPROTO);
  /* a granted landing block whose bytes were changed after framing */
  uint8_t req[8] = {'K', 'V', 'R', 'Q', 1, 0, 0, 0};
  assert_int_equal(hostile_send(&h, req, sizeof req), 1001);
  uint32_t slot = 0; /* the first free: 0 */
  body[3] ^= 0xFF;
  assert_int_equal(kvbm_fabric_write_block(h.f, h.rs, slot, body, bb, NULL), KVBM_OK);
  body[3] ^= 0xFF;
  len = make_block_msg(&h, tok, hash, 0, false, body, bb, true, slot, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_ECHECKSUM);
  /* garbage */
  uint8_t junk[60] = "KVBB";
  assert_int_equal(hostile_send(&h, junk, sizeof junk), KVBM_EVERSION);

  /* none of it reached the cache */
  kvbm_manager_stats_get(d, KVBM_TIER_G1, &after);
  assert_int_equal(after.allocated, before.allocated);
  assert_int_equal(after.free, before.free);
  assert_int_equal(after.cached, before.cached);
  kvbm_block_location loc;
  kvbm_manager_block_location(d, hash, &loc);
  assert_false(loc.held);
  kvbm_peer_stats st;
  kvbm_manager_peer_stats_get(d, peer, &st);
  assert_int_equal(st.refused_not_granted, 2);
  assert_int_equal(st.refused_length, 2);
  assert_int_equal(st.refused_checksum, 2);
  assert_int_equal(st.refused_stale_layout, 1);
  assert_int_equal(st.refused_hash, 1);
  assert_int_equal(st.ingested, 0);
  assert_false(st.closed);

  /* the same landing block, granted again, with the right bytes: taken */
  assert_int_equal(hostile_send(&h, req, sizeof req), 1001);
  assert_int_equal(kvbm_fabric_write_block(h.f, h.rs, slot, body, bb, NULL), KVBM_OK);
  len = make_block_msg(&h, tok, hash, 0, false, body, bb, true, slot, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_OK);
  kvbm_manager_block_location(d, hash, &loc);
  assert_true(loc.held);
  /* the direct form of ingest, same checks */
  len = make_block_msg(&h, tok, hash, 0, false, body, bb, false, 0, msg, sizeof msg);
  msg[len - 1] ^= 1;
  assert_int_equal(kvbm_manager_ingest_block(d, peer, msg, len, &e), KVBM_ECHECKSUM);
  assert_int_equal(kvbm_manager_ingest_block(d, 5, msg, len, &e), KVBM_ENOTFOUND);

  kvbm_manager_destroy(d); /* detaches: releases its fabric memory first */
  kvbm_fabric_remote_set_release(h.rs);
  kvbm_fabric_local_set_release(h.ls);
  kvbm_storage_release(h.s);
  kvbm_fabric_destroy(h.f);
  kvbm_fabric_destroy(fd);
  free(body);
}

/* ---- acknowledgements: only for blocks sent and awaited ---- */

/* A manager attached to a hostile peer (mode PUSH: it pushes its blocks). */
static kvbm_manager *hostile_pair(hostile *h, kvbm_fabric **fd, uint32_t remote_index_blocks) {
  kvbm_manager *d = make(16, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0);
  memset(h, 0, sizeof *h);
  assert_int_equal(kvbm_fabric_inproc_pair("evil", "prefill", &h->f, fd, NULL), KVBM_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, hostile_hello, h), 0);
  kvbm_peer_config pc = kvbm_peer_config_default();
  pc.landing_blocks = 4;
  pc.remote_index_blocks = remote_index_blocks;
  uint32_t peer = 9;
  kvbm_error e;
  if (kvbm_manager_attach(d, *fd, &pc, &peer, &e)) fail_msg("attach: %s", e.msg);
  pthread_join(th, NULL);
  assert_non_null(h->rs);
  assert_int_equal(peer, 0);
  return d;
}

static void hostile_pair_free(hostile *h, kvbm_manager *d, kvbm_fabric *fd) {
  kvbm_manager_destroy(d);
  kvbm_fabric_remote_set_release(h->rs);
  kvbm_fabric_local_set_release(h->ls);
  kvbm_storage_release(h->s);
  kvbm_fabric_destroy(h->f);
  kvbm_fabric_destroy(fd);
}

/* The next block message the manager pushed to the hostile peer: its hash. */
static uint64_t hostile_take_block(hostile *h) {
  kvbm_fabric_handle hd;
  size_t n;
  assert_int_equal(kvbm_fabric_next(h->f, 5000, &hd, &n, NULL), KVBM_OK);
  uint8_t *buf = malloc(n);
  assert_int_equal(kvbm_fabric_pull(h->f, hd, buf, n, &n, 1000, NULL), KVBM_OK);
  assert_true(n >= 16 && memcmp(buf, KVBM_BLOCK_MSG_MAGIC, 4) == 0);
  uint64_t hash = 0;
  for (int i = 0; i < 8; i++) hash |= (uint64_t)buf[8 + i] << (8 * i);
  free(buf);
  return hash;
}

static void hostile_ack(hostile *h, int32_t status, uint64_t hash) {
  uint8_t b[16] = {'K', 'V', 'A', 'C'};
  memcpy(b + 4, &status, 4);
  for (int i = 0; i < 8; i++) b[8 + i] = (uint8_t)(hash >> (8 * i));
  assert_int_equal(kvbm_fabric_push(h->f, b, sizeof b, NULL, NULL), KVBM_OK);
}

/* Every message pushed before it has been served once the manager grants
 * a landing block: its link thread serves them in order. */
static void hostile_barrier(hostile *h) {
  uint8_t req[8] = {'K', 'V', 'R', 'Q', 1, 0, 0, 0};
  assert_int_equal(hostile_send(h, req, sizeof req), 1001);
}

/* What block_location says of h: 'L' held here, 'R' remote, '-' neither. */
static char where(kvbm_manager *m, uint64_t h) {
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(m, h, &loc), KVBM_OK);
  if (loc.remote) assert_int_equal(loc.peer, 0);
  return loc.held ? 'L' : loc.remote ? 'R' : '-';
}

/* A peer acknowledges a hash it was never sent (one not held here, one
 * held here, a refusal of a third) and the same block twice: only the
 * block sent, once, counts. The rest is refused and counted, and changes
 * nothing: no "remote" for the forged hashes (on the old code, "remote"
 * for both, and a peer_flush that returned before the block sent was
 * answered). */
static void test_forged_acks_refused(void **state) {
  (void)state;
  hostile h;
  kvbm_fabric *fd;
  kvbm_manager *d = hostile_pair(&h, &fd, 64);
  uint32_t *tok = tu_prompt(4242, 13), *other = tu_prompt(777000, 61);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(d, tok, 13, NULL, NULL), 0);
  assert_int_equal(kvbm_manager_offload_block(d, 0, hs[0], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_true(hostile_take_block(&h) == hs[0]);
  kvbm_error e;
  assert_int_equal(kvbm_manager_peer_flush(d, 0, 0, &e), KVBM_ETIMEDOUT); /* awaited */

  const uint64_t forged = 0xF00DF00DF00Dull, forged_refusal = 0xBADull;
  hostile_ack(&h, KVBM_OK, forged);
  hostile_ack(&h, KVBM_OK, hs[1]); /* held here, never sent */
  hostile_ack(&h, KVBM_EPROTO, forged_refusal);
  hostile_barrier(&h);
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(d, 0, &st), KVBM_OK);
  assert_int_equal(st.acks_unexpected, 3);
  assert_int_equal(st.acked_blocks, 0);
  assert_int_equal(st.peer_refused, 0);
  assert_int_equal(where(d, forged), '-');
  /* the block sent is still awaited: forged answers do not end a flush */
  assert_int_equal(kvbm_manager_peer_flush(d, 0, 0, &e), KVBM_ETIMEDOUT);
  assert_non_null(strstr(e.msg, "1 blocks not acknowledged"));

  /* another prompt takes all of G1 (16 blocks): ours are evicted here,
   * and the one never sent is not believed to be at the peer */
  assert_int_equal(tu_run(d, other, 61, NULL, NULL), 0);
  assert_int_equal(where(d, hs[1]), '-');
  assert_int_equal(where(d, hs[0]), '-'); /* not answered yet */

  /* the genuine answer counts, once */
  hostile_ack(&h, KVBM_OK, hs[0]);
  hostile_ack(&h, KVBM_OK, hs[0]);
  hostile_barrier(&h);
  assert_int_equal(kvbm_manager_peer_flush(d, 0, 5000, &e), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_stats_get(d, 0, &st), KVBM_OK);
  assert_int_equal(st.acked_blocks, 1);
  assert_int_equal(st.acks_unexpected, 4);
  assert_int_equal(st.acks_forgotten, 0);
  assert_false(st.closed);
  assert_int_equal(where(d, hs[0]), 'R');
  assert_int_equal(where(d, hs[1]), '-');
  free(tok);
  free(other);
  hostile_pair_free(&h, d, fd);
}

/* At most remote_index_blocks hashes are awaited: beyond, the oldest is
 * forgotten (counted), a flush no longer waits for it, and its answer,
 * when it comes, is refused like any unexpected one. */
static void test_awaited_acks_bounded(void **state) {
  (void)state;
  hostile h;
  kvbm_fabric *fd;
  kvbm_manager *d = hostile_pair(&h, &fd, 2);
  uint32_t *tok = tu_prompt(5151, 13), *other = tu_prompt(888000, 61);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(d, tok, 13, NULL, NULL), 0);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(kvbm_manager_offload_block(d, 0, hs[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
    assert_true(hostile_take_block(&h) == hs[k]);
  }
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(d, 0, &st), KVBM_OK);
  assert_int_equal(st.sent_blocks, 3);
  assert_int_equal(st.acks_forgotten, 1);
  kvbm_error e;
  assert_int_equal(kvbm_manager_peer_flush(d, 0, 0, &e), KVBM_ETIMEDOUT);
  assert_non_null(strstr(e.msg, "2 blocks not acknowledged"));
  for (int k = 0; k < 3; k++) hostile_ack(&h, KVBM_OK, hs[k]);
  hostile_barrier(&h);
  assert_int_equal(kvbm_manager_peer_flush(d, 0, 5000, &e), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_stats_get(d, 0, &st), KVBM_OK);
  assert_int_equal(st.acked_blocks, 2);
  assert_int_equal(st.acks_unexpected, 1);
  assert_int_equal(tu_run(d, other, 61, NULL, NULL), 0); /* evicts ours here */
  assert_int_equal(where(d, hs[0]), '-');
  assert_int_equal(where(d, hs[1]), 'R');
  assert_int_equal(where(d, hs[2]), 'R');
  free(tok);
  free(other);
  hostile_pair_free(&h, d, fd);
}

/* An acknowledgement costs O(1) probes of the peer's indexes, the remote
 * index full and evicting: counted by the test seam, not timed. The old
 * remote_add scanned every slot (2 x remote_index_blocks) per ack. */
static void test_ack_cost_constant(void **state) {
  (void)state;
  enum { LIMIT = 256, BLOCKS = 4 * LIMIT, BATCH = 128 };
  pair p = {.a = make(BLOCKS + 16, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0),
            .b = make(64, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0)};
  kvbm_peer_config c = kvbm_peer_config_default();
  c.remote_index_blocks = LIMIT;
  pair_attach(&p, &c, NULL);
  assert_int_equal(p.rc_a, KVBM_OK);
  assert_int_equal(p.rc_b, KVBM_OK);
  uint32_t *tok = tu_prompt(31337, 4 * BLOCKS + 1);
  uint64_t *h = malloc(BLOCKS * sizeof *h);
  hashes_of(tok, 4 * BLOCKS, h);
  assert_int_equal(tu_run(p.a, tok, 4 * BLOCKS + 1, NULL, NULL), 0);
  uint64_t probes0 = 0, probes1 = 0;
  for (size_t k = 0; k < BLOCKS; k++) {
    if (k == LIMIT) { /* the index is full from here on */
      assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 10000, NULL), KVBM_OK);
      assert_int_equal(kvbm__peer_index_probes(p.a, 0, &probes0), KVBM_OK);
    }
    assert_int_equal(kvbm_manager_offload_block(p.a, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
    if (k % BATCH == BATCH - 1) assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 10000, NULL), KVBM_OK);
  }
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 10000, NULL), KVBM_OK);
  assert_int_equal(kvbm__peer_index_probes(p.a, 0, &probes1), KVBM_OK);
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &st), KVBM_OK);
  assert_int_equal(st.acked_blocks, BLOCKS);
  assert_int_equal(st.acks_unexpected, 0);
  assert_int_equal(st.acks_forgotten, 0);
  /* each ack: awaited (add), answered (take), remembered (lookup, add,
   * the oldest evicted): about 16 probes in all at half full (2.5 for a
   * miss), whatever the size; the bound leaves room for unlucky seeds */
  const uint64_t acks = BLOCKS - LIMIT, per_ack = (probes1 - probes0) / acks;
  print_message("%.2f probes per ack, the remote index full (%u slots)\n", (double)(probes1 - probes0) / (double)acks,
                2 * LIMIT);
  if (probes1 - probes0 > 64 * acks)
    fail_msg("%llu probes for %llu acks (%llu each); the index has %u slots", (unsigned long long)(probes1 - probes0),
             (unsigned long long)acks, (unsigned long long)per_ack, 2 * LIMIT);
  free(h);
  free(tok);
  pair_free(&p);
}

/* ---- OutputCritical pull ---- */

static void pull_case(bool on) {
  kvbm_manager_config c = tu_config(NULL, 12, 0, 0);
  c.output_pull = on;
  c.pull_timeout_ms = 5000;
  c.offload_threshold_blocks = 0;
  kvbm_manager *a = NULL;
  assert_int_equal(kvbm_manager_create(&c, &a, NULL), KVBM_OK);
  pair p = {.a = a, .b = make(32, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0)};
  pair_attach(&p, NULL, NULL);
  assert_int_equal(p.rc_a, KVBM_OK);
  uint32_t *tok = tu_prompt(777, 25);
  assert_int_equal(tu_run(p.a, tok, 25, NULL, NULL), 0);
  uint64_t h[6];
  hashes_of(tok, 25, h);
  for (int k = 0; k < 6; k++)
    assert_int_equal(kvbm_manager_offload_block(p.a, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
  /* G1 (12 blocks) is taken by other prompts: ours are gone here */
  uint32_t *other = tu_prompt(40000, 45);
  assert_int_equal(tu_run(p.a, other, 45, NULL, NULL), 0);
  kvbm_block_location loc;
  kvbm_manager_block_location(p.a, h[0], &loc);
  assert_true(loc.remote && !loc.held);
  size_t good = 0, matched = match_on(p.a, tok, 25, &good);
  kvbm_peer_stats st;
  kvbm_manager_peer_stats_get(p.a, 0, &st);
  if (on) {
    assert_int_equal(matched, 6); /* pulled back: (25 - 1) / 4 */
    assert_int_equal(good, 6);
    assert_int_equal(st.pulls_asked, 1);
    assert_int_equal(st.pulled_blocks, 6);
  } else {
    assert_int_equal(matched, 0); /* recomputed */
    assert_int_equal(st.pulls_asked, 0);
  }
  free(tok);
  free(other);
  pair_free(&p);
}

static void test_output_pull(void **state) {
  (void)state;
  pull_case(false);
  pull_case(true);
}

/* One request's life at priority `prio` (tu_run's is 0). */
static void run_prio(kvbm_manager *m, const uint32_t *tok, size_t n, uint8_t prio) {
  kvbm_mreq *r;
  kvbm_mreq_info info;
  assert_int_equal(kvbm_manager_prefill(m, 0, prio, tok, n, &r, NULL, NULL), KVBM_OK);
  kvbm_mreq_wait(r, -1, &info);
  tu_compute(m, r, info.matched_tokens / 4);
  assert_int_equal(kvbm_mreq_commit(r), KVBM_OK);
  kvbm_mreq_destroy(r);
}

/* Offloads h[0..n) to peer 0, tail first: each offload re-releases its
 * block, so the head ends up the most recently used, as a request's
 * release leaves it. */
static void offload_all(kvbm_manager *m, const uint64_t *h, size_t n) {
  for (size_t k = n; k-- > 0;)
    assert_int_equal(kvbm_manager_offload_block(m, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(m, 0, 5000, NULL), KVBM_OK);
}

static bool held_in_g1(kvbm_manager *m, uint64_t h) {
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(m, h, &loc), KVBM_OK);
  return loc.held && !loc.remote && loc.tier == KVBM_TIER_G1;
}

enum { PULL_OFF, PULL_REASONING, PULL_OUTPUT };

/* G1 (16 blocks) with no free block, built so that eviction order is
 *   TC (2 ThinkComplete, demoted, at the peer), Q0 Q1 (the prompt's
 *   head, at the peer), X (7, here only), R0 R1 (a prompt, here only)
 *   | P (3, priority 9, at the peer),
 * and Q2..Q5 held only at the peer. A prefill of Q (7 blocks) then needs
 * 5 blocks. With the pull, for an output-phase request: TC and P are
 * dropped for room (5), Q0 Q1 kept (pinned hits), Q2..Q5 pulled into the
 * free blocks, X and R untouched. The old pull (no room made, hits not
 * pinned) let the landing evict TC, Q1, Q0: the walk then matched nothing;
 * without room but with pins it evicts X. A reasoning request, or
 * output_pull off: no pull, no drop, the match stops at Q2. */
static void room_case(int mode) {
  kvbm_manager_config c = tu_config(NULL, 16, 0, 0);
  c.output_pull = mode != PULL_OFF;
  c.pull_timeout_ms = 5000;
  c.offload_threshold_blocks = 2;
  kvbm_manager *a = NULL;
  assert_int_equal(kvbm_manager_create(&c, &a, NULL), KVBM_OK);
  pair p = {.a = a, .b = make(64, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0)};
  pair_attach(&p, NULL, NULL);
  assert_int_equal(p.rc_a, KVBM_OK);
  assert_int_equal(p.rc_b, KVBM_OK);
  uint32_t *rt = tu_prompt(5000, 16), *pt = tu_prompt(6000, 12), *qt = tu_prompt(7000, 25),
           *xt = tu_prompt(8000, 28);
  uint64_t rh[4], ph[3], qh[6], xh[7];
  hashes_of(rt, 16, rh);
  hashes_of(pt, 12, ph);
  hashes_of(qt, 25, qh);
  hashes_of(xt, 28, xh);
  /* R reasons over 2 blocks after a 2-block prompt: ExitThink pushes the
   * 2 ThinkComplete blocks; R stays alive (its blocks active) for now. */
  kvbm_mreq *r = reasoning_request(p.a, rt, 8, 8, 0);
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
  kvbm_peer_stats st;
  kvbm_manager_peer_stats_get(p.a, 0, &st);
  assert_int_equal(st.exit_think_blocks, 2);
  run_prio(p.a, pt, 12, 9);
  offload_all(p.a, ph, 3);
  run_prio(p.a, pt, 12, 9); /* an offload re-releases at priority 0 */
  assert_int_equal(tu_run(p.a, qt, 25, NULL, NULL), 0);
  offload_all(p.a, qh, 6);
  assert_int_equal(tu_run(p.a, xt, 28, NULL, NULL), 0); /* evicts Q5..Q2 */
  kvbm_mreq_destroy(r);                                  /* TC demoted */
  kvbm_tier_stats s;
  assert_int_equal(kvbm_manager_stats_get(p.a, KVBM_TIER_G1, &s), KVBM_OK);
  assert_int_equal(s.free, 0);
  for (int k = 0; k < 2; k++) assert_true(held_in_g1(p.a, qh[k]));
  for (int k = 2; k < 6; k++) assert_false(held_in_g1(p.a, qh[k]));
  for (int k = 2; k < 4; k++) assert_true(held_in_g1(p.a, rh[k]));

  /* counts from here on (X's prefill made room too: Q5..Q2) */
  kvbm_manager_peer_stats_get(p.a, 0, &st);
  const kvbm_peer_stats before = st;
  kvbm_mreq *q;
  kvbm_mreq_info info;
  kvbm_request_phase phase = mode == PULL_REASONING ? KVBM_REQUEST_REASONING : KVBM_REQUEST_OUTPUT;
  assert_int_equal(kvbm_manager_prefill_phase(p.a, 0, 0, phase, qt, 25, &q, NULL, NULL), KVBM_OK);
  kvbm_mreq_wait(q, -1, &info);
  size_t matched = info.matched_tokens / 4, good = tu_verify(p.a, q, matched);
  kvbm_manager_peer_stats_get(p.a, 0, &st);
  if (mode == PULL_OUTPUT) {
    assert_int_equal(matched, 6);
    assert_int_equal(good, 6); /* every byte right */
    assert_int_equal(st.pulls_asked - before.pulls_asked, 1);
    assert_int_equal(st.pulled_blocks - before.pulled_blocks, 4);
    assert_int_equal(st.dropped_for_room - before.dropped_for_room, 5);
    for (int k = 2; k < 4; k++) assert_false(held_in_g1(p.a, rh[k])); /* ThinkComplete: dropped */
    for (int k = 0; k < 3; k++) assert_false(held_in_g1(p.a, ph[k]));
    kvbm_block_location loc;
    kvbm_manager_block_location(p.a, rh[2], &loc);
    assert_true(loc.remote); /* can be pulled back later */
  } else {
    assert_int_equal(matched, 2); /* Q0 Q1; Q2.. to be computed */
    assert_int_equal(good, 2);
    assert_int_equal(st.pulls_asked - before.pulls_asked, 0);
    assert_int_equal(st.pulled_blocks - before.pulled_blocks, 0);
    assert_int_equal(st.dropped_for_room - before.dropped_for_room, 0);
    for (int k = 0; k < 3; k++) assert_true(held_in_g1(p.a, ph[k])); /* priority 9: not evicted */
  }
  /* blocks held only here are never dropped for room */
  if (mode == PULL_OUTPUT) {
    for (int k = 0; k < 7; k++) assert_true(held_in_g1(p.a, xh[k]));
    for (int k = 0; k < 2; k++) assert_true(held_in_g1(p.a, rh[k]));
  }
  kvbm_mreq_destroy(q);
  free(rt);
  free(pt);
  free(qt);
  free(xt);
  pair_free(&p);
}

static void test_pull_off(void **state) {
  (void)state;
  room_case(PULL_OFF);
}
static void test_pull_reasoning_never(void **state) {
  (void)state;
  room_case(PULL_REASONING);
}
static void test_pull_room_from_peer_copies(void **state) {
  (void)state;
  room_case(PULL_OUTPUT);
}

/* G1 with free blocks: nothing is dropped, even with blocks a peer holds
 * cached here; the pull still brings back what the walk needs. */
static void test_pull_no_room_needed(void **state) {
  (void)state;
  kvbm_manager_config c = tu_config(NULL, 32, 0, 0);
  c.output_pull = true;
  c.pull_timeout_ms = 5000;
  c.offload_threshold_blocks = 0;
  kvbm_manager *a = NULL;
  assert_int_equal(kvbm_manager_create(&c, &a, NULL), KVBM_OK);
  pair p = {.a = a, .b = make(64, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0)};
  pair_attach(&p, NULL, NULL);
  assert_int_equal(p.rc_a, KVBM_OK);
  uint32_t *pt = tu_prompt(6000, 12), *qt = tu_prompt(9000, 9);
  uint64_t ph[3];
  hashes_of(pt, 12, ph);
  assert_int_equal(tu_run(p.a, pt, 12, NULL, NULL), 0);
  offload_all(p.a, ph, 3);
  assert_int_equal(tu_run(p.a, qt, 9, NULL, NULL), 0);
  kvbm_peer_stats st;
  kvbm_manager_peer_stats_get(p.a, 0, &st);
  assert_int_equal(st.dropped_for_room, 0);
  for (int k = 0; k < 3; k++) assert_true(held_in_g1(p.a, ph[k]));
  free(pt);
  free(qt);
  pair_free(&p);
}

/* ---- what a peer holds (issue 23) ---- */

/* a's word from b reaches a: a message a sends b after b's evictions is
 * answered after b's removes (b's link thread sends them first). */
static void peer_barrier(kvbm_manager *a, uint64_t held_here) {
  assert_int_equal(kvbm_manager_offload_block(a, 0, held_here, KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(a, 0, 5000, NULL), KVBM_OK);
}

/* b evicts the blocks a offloaded to it: b tells a, and a's block_location
 * no longer says remote (the old code: remote forever). */
static void test_peer_eviction_told(void **state) {
  (void)state;
  pair p = {.a = make(16, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0), .b = make(8, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0)};
  pair_attach(&p, NULL, NULL);
  assert_int_equal(p.rc_a, KVBM_OK);
  assert_int_equal(p.rc_b, KVBM_OK);
  uint32_t *pt = tu_prompt(1000, 12), *ot = tu_prompt(2000, 61), *yt = tu_prompt(3000, 32);
  uint64_t ph[3], oh[15];
  hashes_of(pt, 12, ph);
  hashes_of(ot, 60, oh);
  assert_int_equal(tu_run(p.a, pt, 12, NULL, NULL), 0);
  offload_all(p.a, ph, 3);
  assert_int_equal(tu_run(p.a, ot, 61, NULL, NULL), 0); /* P evicted here */
  for (int k = 0; k < 3; k++) assert_int_equal(where(p.a, ph[k]), 'R');
  assert_int_equal(tu_run(p.b, yt, 32, NULL, NULL), 0); /* P evicted at the peer */
  kvbm_block_location loc;
  for (int k = 0; k < 3; k++) {
    assert_int_equal(kvbm_manager_block_location(p.b, ph[k], &loc), KVBM_OK);
    assert_false(loc.held);
  }
  peer_barrier(p.a, oh[14]);
  for (int k = 0; k < 3; k++) assert_int_equal(where(p.a, ph[k]), '-');
  assert_int_equal(where(p.a, oh[14]), 'L');
  kvbm_peer_stats sa, sb;
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &sa), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_stats_get(p.b, 0, &sb), KVBM_OK);
  assert_int_equal(sa.peer_version, 3);
  assert_true(sb.removes_sent >= 3);
  assert_true(sa.forgotten_removed >= 3);
  free(pt);
  free(ot);
  free(yt);
  pair_free(&p);
}

static void hostile_push(hostile *h, const uint8_t *b, size_t n) {
  assert_int_equal(kvbm_fabric_push(h->f, b, n, NULL, NULL), KVBM_OK);
}

/* Offloads hs[0..n) to the hostile peer, which acknowledges each, then
 * evicts them here: every one 'R'. */
static void hostile_holds(hostile *h, kvbm_manager *d, const uint64_t *hs, size_t n, const uint32_t *other) {
  for (size_t k = 0; k < n; k++) {
    assert_int_equal(kvbm_manager_offload_block(d, 0, hs[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
    assert_true(hostile_take_block(h) == hs[k]);
    hostile_ack(h, KVBM_OK, hs[k]);
  }
  hostile_barrier(h);
  assert_int_equal(kvbm_manager_peer_flush(d, 0, 5000, NULL), KVBM_OK);
  assert_int_equal(tu_run(d, other, 61, NULL, NULL), 0);
  for (size_t k = 0; k < n; k++) assert_int_equal(where(d, hs[k]), 'R');
}

/* The peer's "not held" (a pull's miss) and its remove message each take
 * back its word; a malformed remove is refused, counted, and harmless. */
static void test_peer_not_held_and_remove(void **state) {
  (void)state;
  hostile h;
  kvbm_fabric *fd;
  kvbm_manager *d = hostile_pair(&h, &fd, 64);
  uint32_t *tok = tu_prompt(4343, 13), *other = tu_prompt(979000, 61);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(d, tok, 13, NULL, NULL), 0);
  hostile_holds(&h, d, hs, 3, other);
  uint8_t miss[12] = {'K', 'V', 'P', 'M'};
  for (int i = 0; i < 8; i++) miss[4 + i] = (uint8_t)(hs[0] >> (8 * i));
  hostile_push(&h, miss, sizeof miss);
  uint8_t rm[24] = {'K', 'V', 'R', 'M', 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 8; i++) rm[16 + i] = (uint8_t)(hs[1] >> (8 * i));
  uint8_t bad[24];
  memcpy(bad, rm, sizeof bad);
  bad[8] = 2; /* says 2 hashes, carries 1 */
  for (int i = 0; i < 8; i++) bad[16 + i] = (uint8_t)(hs[2] >> (8 * i));
  hostile_push(&h, bad, sizeof bad);
  hostile_push(&h, rm, sizeof rm);
  hostile_barrier(&h);
  assert_int_equal(where(d, hs[0]), '-');
  assert_int_equal(where(d, hs[1]), '-');
  assert_int_equal(where(d, hs[2]), 'R'); /* the malformed remove changed nothing */
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(d, 0, &st), KVBM_OK);
  assert_int_equal(st.forgotten_removed, 2);
  assert_int_equal(st.refused_other, 1);
  assert_int_equal(st.peer_version, 1);
  assert_false(st.closed);
  /* "forget them all" */
  rm[4] = 1;
  rm[8] = 0;
  hostile_push(&h, rm, 16);
  hostile_barrier(&h);
  assert_int_equal(where(d, hs[2]), '-');
  free(tok);
  free(other);
  hostile_pair_free(&h, d, fd);
}

/* The peer's end closes (it died, or left): nothing it said stands. */
static void test_peer_closed_forgotten(void **state) {
  (void)state;
  hostile h;
  kvbm_fabric *fd;
  kvbm_manager *d = hostile_pair(&h, &fd, 64);
  uint32_t *tok = tu_prompt(4545, 13), *other = tu_prompt(989000, 61);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(d, tok, 13, NULL, NULL), 0);
  hostile_holds(&h, d, hs, 2, other);
  kvbm_fabric_remote_set_release(h.rs);
  kvbm_fabric_local_set_release(h.ls);
  kvbm_storage_release(h.s);
  kvbm_fabric_destroy(h.f);
  h = (hostile){0};
  kvbm_peer_stats st = {0};
  for (int i = 0; i < 1000 && !st.closed; i++) {
    assert_int_equal(kvbm_manager_peer_stats_get(d, 0, &st), KVBM_OK);
    if (!st.closed) usleep(5000);
  }
  assert_true(st.closed);
  assert_int_equal(where(d, hs[0]), '-');
  assert_int_equal(where(d, hs[1]), '-');
  assert_int_equal(st.forgotten_closed, 2);
  free(tok);
  free(other);
  hostile_pair_free(&h, d, fd);
}

/* A word is believed for lease_ms from its answer, no longer; a new
 * answer renews it. The lease clock is moved by the test seam. */
static void test_peer_lease(void **state) {
  (void)state;
  hostile h;
  kvbm_fabric *fd;
  kvbm_manager *d = hostile_pair(&h, &fd, 64);
  uint32_t *tok = tu_prompt(4747, 13), *other = tu_prompt(999000, 61);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(d, tok, 13, NULL, NULL), 0);
  const int64_t lease = kvbm_peer_config_default().lease_ms;
  assert_true(lease >= 1000);
  /* hs[0] answered at 0 and again at lease/2; hs[1] at 0 only */
  for (int k = 0; k < 2; k++) {
    assert_int_equal(kvbm_manager_offload_block(d, 0, hs[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
    assert_true(hostile_take_block(&h) == hs[k]);
    hostile_ack(&h, KVBM_OK, hs[k]);
  }
  hostile_barrier(&h);
  assert_int_equal(kvbm__peer_skew_clock(d, 0, lease / 2), KVBM_OK);
  assert_int_equal(kvbm_manager_offload_block(d, 0, hs[0], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_true(hostile_take_block(&h) == hs[0]);
  hostile_ack(&h, KVBM_OK, hs[0]);
  hostile_barrier(&h);
  assert_int_equal(tu_run(d, other, 61, NULL, NULL), 0); /* evicted here */
  /* a second of margin for the real time the test takes: it only ages */
  assert_int_equal(kvbm__peer_skew_clock(d, 0, lease / 2 - 1000), KVBM_OK);
  assert_int_equal(where(d, hs[0]), 'R');
  assert_int_equal(where(d, hs[1]), 'R'); /* about lease - 1 s old */
  assert_int_equal(kvbm__peer_skew_clock(d, 0, 1000), KVBM_OK);
  assert_int_equal(where(d, hs[1]), '-'); /* lease old: not believed */
  assert_int_equal(where(d, hs[0]), 'R'); /* renewed */
  assert_int_equal(kvbm__peer_skew_clock(d, 0, lease / 2), KVBM_OK);
  assert_int_equal(where(d, hs[0]), '-');
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(d, 0, &st), KVBM_OK);
  assert_int_equal(st.forgotten_expired, 2);
  free(tok);
  free(other);
  hostile_pair_free(&h, d, fd);
}

/* A lease below 1 is refused by name; 0 is the default. Hellos of
 * version 4 are refused, 1 and 2 accepted (3 is ours: every pair test). */
static void test_peer_lease_config_and_versions(void **state) {
  (void)state;
  kvbm_manager *d = make(16, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0);
  kvbm_fabric *fa, *fb;
  assert_int_equal(kvbm_fabric_inproc_pair("x", "y", &fa, &fb, NULL), KVBM_OK);
  kvbm_peer_config c = kvbm_peer_config_default();
  c.lease_ms = -5;
  uint32_t peer;
  kvbm_error e = {0};
  assert_int_equal(kvbm_manager_attach(d, fa, &c, &peer, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "lease_ms"));
  kvbm_manager_destroy(d);
  kvbm_fabric_destroy(fa);
  kvbm_fabric_destroy(fb);

  d = make(16, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0);
  hostile h = {.version = 4};
  assert_int_equal(kvbm_fabric_inproc_pair("evil", "d", &h.f, &fb, NULL), KVBM_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, hostile_hello, &h), 0);
  c = kvbm_peer_config_default();
  c.timeout_ms = 2000;
  assert_int_equal(kvbm_manager_attach(d, fb, &c, &peer, &e), KVBM_EPROTO);
  assert_non_null(strstr(e.msg, "version 1..3"));
  pthread_join(th, NULL);
  kvbm_manager_destroy(d);
  kvbm_fabric_remote_set_release(h.rs);
  kvbm_fabric_local_set_release(h.ls);
  kvbm_storage_release(h.s);
  kvbm_fabric_destroy(h.f);
  kvbm_fabric_destroy(fb);
}

enum { WORD_TAKEN_BACK, WORD_EXPIRED };

/* G1 of a full (16 blocks, none free): X (13, here only, oldest), P (3,
 * offloaded to b), X0 (offloaded to b last). Then either b evicts P and
 * says so, or the lease clock passes P's word. An output-phase prefill
 * of a new prompt needing 7 blocks then makes room: P, the last copy in
 * the cluster (or one whose holder's word is too old), is not dropped;
 * X0, still held by b within its lease, is (taken back: the one drop).
 * The old code dropped P's three copies too. */
static void room_word_case(int how) {
  kvbm_manager_config c = tu_config(NULL, 16, 0, 0);
  c.output_pull = true;
  c.pull_timeout_ms = 5000;
  c.offload_threshold_blocks = 0;
  kvbm_manager *a = NULL;
  assert_int_equal(kvbm_manager_create(&c, &a, NULL), KVBM_OK);
  pair p = {.a = a, .b = make(8, KVBM_LAYOUT_FULLY_CONTIGUOUS, 256, 0)};
  pair_attach(&p, NULL, NULL);
  assert_int_equal(p.rc_a, KVBM_OK);
  assert_int_equal(p.rc_b, KVBM_OK);
  uint32_t *pt = tu_prompt(1100, 12), *xt = tu_prompt(2200, 52), *yt = tu_prompt(3300, 32), *qt = tu_prompt(4400, 25);
  uint64_t ph[3], xh[13];
  hashes_of(pt, 12, ph);
  hashes_of(xt, 52, xh);
  assert_int_equal(tu_run(p.a, pt, 12, NULL, NULL), 0);
  assert_int_equal(tu_run(p.a, xt, 52, NULL, NULL), 0);
  offload_all(p.a, ph, 3);
  if (how == WORD_TAKEN_BACK) {
    assert_int_equal(tu_run(p.b, yt, 32, NULL, NULL), 0); /* P evicted at b */
    peer_barrier(p.a, xh[0]);
  } else {
    peer_barrier(p.a, xh[0]);
    assert_int_equal(kvbm__peer_skew_clock(p.a, 0, kvbm_peer_config_default().lease_ms), KVBM_OK);
    /* a word given now is fresh: X0 again */
    peer_barrier(p.a, xh[0]);
  }
  kvbm_tier_stats s;
  assert_int_equal(kvbm_manager_stats_get(p.a, KVBM_TIER_G1, &s), KVBM_OK);
  assert_int_equal(s.free, 0);
  for (int k = 0; k < 3; k++) assert_true(held_in_g1(p.a, ph[k]));
  kvbm_peer_stats before, st;
  kvbm_manager_peer_stats_get(p.a, 0, &before);
  kvbm_mreq *q;
  kvbm_mreq_info info;
  assert_int_equal(kvbm_manager_prefill_phase(p.a, 0, 0, KVBM_REQUEST_OUTPUT, qt, 25, &q, NULL, NULL), KVBM_OK);
  kvbm_mreq_wait(q, -1, &info);
  kvbm_manager_peer_stats_get(p.a, 0, &st);
  for (int k = 0; k < 3; k++) assert_true(held_in_g1(p.a, ph[k])); /* never dropped */
  assert_int_equal(st.dropped_for_room - before.dropped_for_room, 1); /* X0 only */
  assert_false(held_in_g1(p.a, xh[0]));
  kvbm_mreq_destroy(q);
  free(pt);
  free(xt);
  free(yt);
  free(qt);
  pair_free(&p);
}

static void test_pull_room_not_on_taken_back_word(void **state) {
  (void)state;
  room_word_case(WORD_TAKEN_BACK);
}
static void test_pull_room_not_on_expired_word(void **state) {
  (void)state;
  room_word_case(WORD_EXPIRED);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_fabric_defaults), cmocka_unit_test(test_phase_labels),
      cmocka_unit_test(test_exit_think_batch),   cmocka_unit_test(test_offload_push),
      cmocka_unit_test(test_offload_put),        cmocka_unit_test(test_shape_mismatch_refused),
      cmocka_unit_test(test_hostile_peer),       cmocka_unit_test(test_output_pull),
      cmocka_unit_test(test_pull_off),           cmocka_unit_test(test_pull_reasoning_never),
      cmocka_unit_test(test_pull_room_from_peer_copies), cmocka_unit_test(test_pull_no_room_needed),
      cmocka_unit_test(test_forged_acks_refused), cmocka_unit_test(test_awaited_acks_bounded),
      cmocka_unit_test(test_ack_cost_constant),
      cmocka_unit_test(test_peer_eviction_told), cmocka_unit_test(test_peer_not_held_and_remove),
      cmocka_unit_test(test_peer_closed_forgotten), cmocka_unit_test(test_peer_lease),
      cmocka_unit_test(test_peer_lease_config_and_versions),
      cmocka_unit_test(test_pull_room_not_on_taken_back_word),
      cmocka_unit_test(test_pull_room_not_on_expired_word),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
