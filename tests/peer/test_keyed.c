/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_keyed.c: keyed frames on the manager's peer links (issue 23: "the
 * same holds for the fabric's frames between peers that share a key").
 *
 * Two managers that share a cluster key (given as bytes, as a key file,
 * or through KVBM_PEER_KEY_FILE) move blocks both ways, PUSH and PUT, and
 * every byte is right; the sender frames its tier's kept sum, which is
 * then the keyed MAC (a block is hashed once, a second send hashes
 * nothing), and a block pulled back is not hashed at its sender either.
 * A peer without the key, or with another key, is refused at attach
 * (KVBM_EAUTH, named: the hello says who holds a key, the confirmation
 * proves which; test_control_mac.c has the control messages). A hostile
 * peer that holds the link's key and forges frames (an unkeyed frame with
 * its checksum recomputed over altered bytes, as the G4 probe did; a
 * frame MAC'd under a guessed key; a keyed frame whose bytes were changed
 * after) is refused with KVBM_EAUTH, counted (refused_auth), and the block
 * is not in the receiver's cache; a genuine frame relabelled on the way
 * (another hash, no tokens) fails the link's MAC. Keys that cannot be used are
 * refused by name at attach: both forms, a short one, a key file others
 * can read, a second peer with another key or none.
 *
 * On the code before this change every one of these frames was an
 * unkeyed MRDN v1 frame: the forged and unkeyed blocks were ingested (the
 * checksum matched the altered bytes), which these tests refuse.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kvbm/blake3.h"
#include "kvbm/fabric.h"
#include "kvbm/hash.h"
#include "kvbm/metrics.h"
#include "kvbm/peer.h"
#include "peer/rawpeer.h"
#include "tier/tier_testutil.h"

static const uint8_t KEY1[32] = "a cluster key of 32 bytes......";
static const uint8_t KEY2[32] = "another key, also of 32 bytes..";

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

typedef struct pair {
  kvbm_manager *a, *b;
  kvbm_fabric *fa, *fb;
  int rc_a, rc_b;
  kvbm_error ea, eb;
} pair;

static kvbm_manager *make(uint32_t g1, uint32_t g2, bool metrics) {
  kvbm_manager_config c = tu_config(NULL, g1, g2, 0);
  c.offload_threshold_blocks = 0;
  if (metrics) {
    c.metrics.enabled = true;
    c.metrics.host = "127.0.0.1";
    c.metrics.port = 0;
  }
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

static void pair_attach(pair *p, const kvbm_peer_config *ca, const kvbm_peer_config *cb) {
  assert_int_equal(kvbm_fabric_inproc_pair("prefill", "decode", &p->fa, &p->fb, NULL), KVBM_OK);
  attach_job jb = {.m = p->b, .f = p->fb, .cfg = *cb};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, attach_thread, &jb), 0);
  uint32_t peer = 99;
  p->rc_a = kvbm_manager_attach(p->a, p->fa, ca, &peer, &p->ea);
  pthread_join(th, NULL);
  p->rc_b = jb.rc;
  p->eb = jb.e;
}

static void pair_free(pair *p) {
  kvbm_manager_destroy(p->a);
  kvbm_manager_destroy(p->b);
  kvbm_fabric_destroy(p->fa);
  kvbm_fabric_destroy(p->fb);
}

static kvbm_peer_config keyed(const uint8_t *key, kvbm_disagg_mode mode) {
  kvbm_peer_config c = kvbm_peer_config_default();
  c.mode = mode;
  c.landing_blocks = 3;
  c.timeout_ms = 5000;
  if (key) {
    c.key = key;
    c.key_len = 32;
  }
  return c;
}

static void hashes_of(const uint32_t *tok, size_t n, uint64_t *h) {
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, n, 4, h, n / 4);
}

/* How many of the prompt's blocks m matches, *good of them with the
 * right bytes. */
static size_t match_on(kvbm_manager *m, const uint32_t *tok, size_t n, size_t *good) {
  kvbm_mreq *r;
  kvbm_mreq_info info;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, tok, n, &r, NULL, NULL), KVBM_OK);
  kvbm_mreq_wait(r, -1, &info);
  if (good) *good = tu_verify(m, r, info.matched_tokens / 4);
  kvbm_mreq_destroy(r);
  return info.matched_tokens / 4;
}

static kvbm_peer_stats stats(kvbm_manager *m) {
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(m, 0, &st), KVBM_OK);
  return st;
}

/* Offloads the 8 full blocks of a 33-token prompt from a to b; returns
 * the blocks b then matches with the right bytes. */
static size_t offload_8(pair *p, uint32_t base, uint64_t *h) {
  uint32_t *tok = tu_prompt(base, 33);
  assert_int_equal(tu_run(p->a, tok, 33, NULL, NULL), 0);
  kvbm_manager_flush(p->a); /* its offloads to G2 (and their kept sums) done */
  hashes_of(tok, 33, h);
  for (int k = 0; k < 8; k++)
    assert_int_equal(kvbm_manager_offload_block(p->a, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  int rc = kvbm_manager_peer_flush(p->a, 0, 5000, NULL);
  assert_int_equal(rc, KVBM_OK);
  size_t good = 0, matched = match_on(p->b, tok, 33, &good);
  free(tok);
  assert_int_equal(good, matched);
  return good;
}

/* ---- the same key: blocks move and verify, hashed once ---- */

static void same_key(kvbm_disagg_mode mode, uint32_t g2) {
  pair p = {.a = make(32, g2, false), .b = make(32, g2, false)};
  kvbm_peer_config c = keyed(KEY1, mode);
  pair_attach(&p, &c, &c);
  assert_int_equal(p.rc_a, KVBM_OK);
  assert_int_equal(p.rc_b, KVBM_OK);
  uint64_t h[8];
  assert_int_equal(offload_8(&p, 7000 + 100 * mode + g2, h), 8);
  kvbm_peer_stats sa = stats(p.a), sb = stats(p.b);
  assert_true(sa.keyed);
  assert_true(sb.keyed);
  assert_int_equal(sa.acked_blocks, 8);
  assert_int_equal(sb.ingested, 8);
  assert_int_equal(sb.refused_auth, 0);
  /* Hashed once: with G2 the host worker kept each block's MAC at its
   * offload, so the sends hashed nothing; without, the first send hashed
   * and kept it. A second send of the same blocks hashes nothing. */
  uint64_t hashed = sa.sent_hashed_bytes;
  assert_int_equal(hashed + sa.sent_sums_kept * kvbm_manager_block_bytes(p.a), 8 * kvbm_manager_block_bytes(p.a));
  if (g2) assert_int_equal(hashed, 0);
  for (int k = 0; k < 8; k++)
    assert_int_equal(kvbm_manager_offload_block(p.a, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(p.a, 0, 5000, NULL), KVBM_OK);
  sa = stats(p.a);
  assert_int_equal(sa.sent_hashed_bytes, hashed);
  assert_int_equal(sa.acked_blocks, 16);
  /* b sends them back (it kept the MAC it checked): it hashes nothing,
   * and a accepts them (already held: no change, acknowledged). */
  for (int k = 0; k < 8; k++)
    assert_int_equal(kvbm_manager_offload_block(p.b, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(p.b, 0, 5000, NULL), KVBM_OK);
  sb = stats(p.b);
  assert_int_equal(sb.acked_blocks, 8);
  assert_int_equal(sb.sent_hashed_bytes, 0);
  assert_int_equal(sb.sent_sums_kept, 8);
  assert_int_equal(stats(p.a).refused_auth, 0);
  pair_free(&p);
}

static void test_same_key_push(void **state) {
  (void)state;
  same_key(KVBM_DISAGG_PUSH, 0);
  same_key(KVBM_DISAGG_PUSH, 16);
}

static void test_same_key_put(void **state) {
  (void)state;
  same_key(KVBM_DISAGG_PUT, 0);
  same_key(KVBM_DISAGG_PUT, 16);
}

/* ---- no key, another key: refused at attach, by name ---- */

/* Before keyed control messages, these links attached and every block
 * was refused by its frame (KVBM_EAUTH, counted); now the hello says
 * whether a side holds a key and the confirmation proves which, so the
 * link is never made: both sides' attach fail, naming why. */
static void refused(const uint8_t *ka, const uint8_t *kb, kvbm_disagg_mode mode, const char *why_a,
                    const char *why_b) {
  pair p = {.a = make(32, 0, false), .b = make(32, 0, true)};
  kvbm_peer_config ca = keyed(ka, mode), cb = keyed(kb, mode);
  pair_attach(&p, &ca, &cb);
  assert_int_equal(p.rc_a, KVBM_EAUTH);
  assert_int_equal(p.rc_b, KVBM_EAUTH);
  if (!strstr(p.ea.msg, why_a)) fail_msg("a: \"%s\" does not say \"%s\"", p.ea.msg, why_a);
  if (!strstr(p.eb.msg, why_b)) fail_msg("b: \"%s\" does not say \"%s\"", p.eb.msg, why_b);
  /* nothing attached: no peer, offloads have nowhere to go */
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(p.a, 0, &st), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_manager_offload_block(p.a, 0, 1, KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_EDISAGG);
  pair_free(&p);
}

static void test_peer_without_key_refused(void **state) {
  (void)state;
  refused(NULL, KEY1, KVBM_DISAGG_PUSH, "the peer holds a cluster key and this side none",
          "this side holds a cluster key (key, key_file or KVBM_PEER_KEY_FILE) and the peer none");
  refused(KEY1, NULL, KVBM_DISAGG_PUT, "this side holds a cluster key", "the peer holds a cluster key");
}

static void test_wrong_key_refused(void **state) {
  (void)state;
  refused(KEY2, KEY1, KVBM_DISAGG_PUSH, "another cluster key", "another cluster key");
  refused(KEY2, KEY1, KVBM_DISAGG_PUT, "another cluster key", "another cluster key");
}

/* ---- a peer holding the link's key but forging frames ---- */

/* Sends one message (sealed: the link's MAC is right) and returns the
 * manager's acknowledgement status. */
static int hostile_send(rawpeer *r, const uint8_t *msg, size_t len) {
  assert_true(rp_send(r, msg, len, NULL) > 0);
  for (;;) {
    uint8_t buf[64];
    bool bad;
    long n = rp_next(r, buf, sizeof buf, 5000, &bad);
    assert_false(bad);
    assert_true(n > 0);
    if (n == 16 && memcmp(buf, "KVAC", 4) == 0) {
      int32_t st;
      memcpy(&st, buf + 4, 4);
      return st;
    }
  }
}

static size_t frame(rawpeer *h, const uint8_t *key, const uint32_t *tok, uint64_t hash, const uint8_t *body,
                    size_t bb, uint8_t *out, size_t cap) {
  kvbm_block_msg m = {.seq_hash = hash, .num_tokens = 4, .tokens = tok, .tier = KVBM_TIER_G1,
                      .layout_id = h->land_id, .phase = KVBM_PHASE_OUTPUT_CRITICAL, .body = body, .body_len = bb,
                      .mac_key = key};
  size_t len = 0;
  assert_int_equal(kvbm_block_msg_encode(&m, out, cap, &len, NULL), KVBM_OK);
  return len;
}

/* The link's MAC binds a pushed block's envelope and frame header, the
 * frame's own MAC its bytes: a peer with the link's key still cannot
 * slip in a frame that fails the frame MAC. */
static void test_forged_frames_refused(void **state) {
  (void)state;
  kvbm_manager *d = make(16, 0, false);
  rawpeer h = {.secret = KEY1, .secret_len = sizeof KEY1};
  kvbm_fabric *fd;
  assert_int_equal(kvbm_fabric_inproc_pair("evil", "decode", &h.f, &fd, NULL), KVBM_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, rp_hello, &h), 0);
  kvbm_peer_config pc = keyed(KEY1, KVBM_DISAGG_PUSH);
  uint32_t peer;
  kvbm_error e;
  assert_int_equal(kvbm_manager_attach(d, fd, &pc, &peer, &e), KVBM_OK);
  pthread_join(th, NULL);
  assert_true(h.ok);

  const size_t bb = kvbm_manager_block_bytes(d);
  uint8_t *body = malloc(bb), msg[4096], mac[32], guess[32];
  uint32_t tok[4] = {21, 22, 23, 24};
  uint64_t hash = kvbm_hash_next(KVBM_HASH_NATIVE, 0, 0, false, tok, 4);
  for (size_t i = 0; i < bb; i++) body[i] = (uint8_t)(i * 13);
  assert_int_equal(kvbm_fabric_frame_key(KEY1, sizeof KEY1, mac, NULL), KVBM_OK);
  assert_int_equal(kvbm_fabric_frame_key(KEY2, sizeof KEY2, guess, NULL), KVBM_OK);

  /* the probe's attack: bytes replaced, the (unkeyed) checksum recomputed */
  body[0] ^= 0xFF;
  size_t len = frame(&h, NULL, tok, hash, body, bb, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EAUTH);
  /* MAC'd under a guessed key */
  len = frame(&h, guess, tok, hash, body, bb, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EAUTH);
  /* MAC'd under the cluster key, then a byte of the body changed (the
   * link's MAC does not cover a pushed body: the frame's does) */
  len = frame(&h, mac, tok, hash, body, bb, msg, sizeof msg);
  msg[len - 3] ^= 1;
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EAUTH);
  /* ... and a MAC changed (the frame header's sum) */
  len = frame(&h, mac, tok, hash, body, bb, msg, sizeof msg);
  msg[len - bb - 16] ^= 1;
  assert_int_equal(hostile_send(&h, msg, len), KVBM_EAUTH);
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(d, hash, &loc), KVBM_OK);
  assert_false(loc.held);
  kvbm_peer_stats st = stats(d);
  assert_int_equal(st.refused_auth, 4);
  assert_int_equal(st.refused_control, 0);
  assert_int_equal(st.ingested, 0);
  /* the control: the same frame under the cluster key is ingested, and
   * served with its bytes */
  len = frame(&h, mac, tok, hash, body, bb, msg, sizeof msg);
  assert_int_equal(hostile_send(&h, msg, len), KVBM_OK);
  assert_int_equal(kvbm_manager_block_location(d, hash, &loc), KVBM_OK);
  assert_true(loc.held);
  uint8_t *got = malloc(bb);
  const kvbm_layout *L = kvbm_manager_layout(d, KVBM_TIER_G1);
  uint32_t ids[1];
  kvbm_block_ref b;
  uint32_t tk[4];
  assert_int_equal(kvbm_manager_block_pin(d, hash, tk, &b), KVBM_OK);
  ids[0] = b.id;
  for (uint32_t l = 0; l < L->config.num_layers; l++)
    assert_int_equal(kvbm_manager_block_read(d, KVBM_TIER_G1, ids[0], l, got + l * L->layer_stride, L->layer_stride,
                                             NULL), KVBM_OK);
  assert_memory_equal(got, body, bb);
  /* its kept sum is the MAC it was checked against */
  uint8_t kept[16], want[16];
  assert_int_equal(kvbm_manager_block_sum(d, b.tier, b.id, kept), KVBM_OK);
  assert_int_equal(kvbm_blake3_keyed_hash(mac, body, bb, want, 16), KVBM_OK);
  assert_memory_equal(kept, want, 16);
  kvbm_manager_block_unpin(d, &b, 1);
  assert_int_equal(stats(d).refused_auth, 4);
  /* the same genuine frame relabelled on the way (another hash, no
   * tokens, so no hash check could catch it): the link's MAC covers the
   * envelope, so it is refused unread, not registered under the lie */
  const uint64_t lie = 0x11E11E11E11Eull;
  kvbm_block_msg m0 = {.seq_hash = hash, .num_tokens = 0, .tier = KVBM_TIER_G1, .layout_id = h.land_id,
                       .phase = KVBM_PHASE_OUTPUT_CRITICAL, .body = body, .body_len = bb, .mac_key = mac};
  assert_int_equal(kvbm_block_msg_encode(&m0, msg, sizeof msg, &len, NULL), KVBM_OK);
  uint8_t *wire = malloc(len + 24);
  size_t wlen = rp_seal_with(h.tx, msg, len, h.tx_seq++, wire);
  for (int i = 0; i < 8; i++) wire[8 + i] = (uint8_t)(lie >> (8 * i));
  assert_int_equal(rp_push_raw(&h, wire, wlen), KVBM_OK);
  uint8_t rq[8] = {'K', 'V', 'R', 'Q', 1, 0, 0, 0};
  assert_true(rp_send(&h, rq, sizeof rq, NULL) > 0);
  uint8_t buf[64];
  long n = rp_next(&h, buf, sizeof buf, 5000, NULL); /* the grant, not an ack of the relabelled block */
  assert_true(n >= 4 && memcmp(buf, "KVGR", 4) == 0);
  assert_int_equal(kvbm_manager_block_location(d, lie, &loc), KVBM_OK);
  assert_false(loc.held);
  assert_int_equal(stats(d).refused_control, 1);
  free(wire);
  free(got);
  free(body);
  kvbm_manager_destroy(d);
  rp_free(&h);
  kvbm_fabric_destroy(fd);
}

/* ---- the key's forms and the keys refused by name ---- */

static char *key_file(const char *tag, const uint8_t *key, mode_t mode) {
  char *p = malloc(512);
  snprintf(p, 512, "%s/peer-key-%s-%d", KVBM_BINARY_DIR, tag, (int)getpid());
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  fwrite(key, 1, 32, f);
  fputc('\n', f); /* one trailing newline is not the key's */
  fclose(f);
  assert_int_equal(chmod(p, mode), 0);
  return p;
}

/* A pulled block (KVPB, protocol version 3, issue 22) is read only
 * where this side asked for it, that is where the peer's zone is mapped
 * here (UCX shared memory; tests/peer/test_pull_ucx.c reads them): on
 * the in-process fabric none is, so a version 3 peer that sends one
 * anyway, with a right frame MAC, is refused (KVBM_EPROTO) before any
 * read or flush, counted, nothing cached. */
static void test_unasked_pulled_block_refused(void **state) {
  (void)state;
  kvbm_manager *d = make(16, 0, false);
  rawpeer h = {.secret = KEY1, .secret_len = sizeof KEY1, .version = 3};
  kvbm_fabric *fd;
  assert_int_equal(kvbm_fabric_inproc_pair("evil", "decode", &h.f, &fd, NULL), KVBM_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, rp_hello, &h), 0);
  kvbm_peer_config pc = keyed(KEY1, KVBM_DISAGG_PUSH);
  uint32_t peer;
  kvbm_error e;
  assert_int_equal(kvbm_manager_attach(d, fd, &pc, &peer, &e), KVBM_OK);
  pthread_join(th, NULL);
  assert_true(h.ok);
  assert_int_equal(stats(d).peer_version, 3);

  const size_t bb = kvbm_manager_block_bytes(d);
  uint8_t *body = malloc(bb), mac[32], msg[4096];
  uint32_t tok[4] = {31, 32, 33, 34};
  uint64_t hash = kvbm_hash_next(KVBM_HASH_NATIVE, 0, 0, false, tok, 4);
  for (size_t i = 0; i < bb; i++) body[i] = (uint8_t)(i * 7);
  assert_int_equal(kvbm_fabric_frame_key(KEY1, sizeof KEY1, mac, NULL), KVBM_OK);
  /* its zone's block 0 holds the bytes, the frame their MAC */
  void *ptr;
  size_t size;
  kvbm_layout_config lc = {.num_blocks = 2, .num_layers = 3, .outer_dim = 2, .page_size = 4, .inner_dim = 8,
                           .dtype_size = 2, .alignment = 256};
  kvbm_layout lay;
  assert_int_equal(kvbm_layout_init(&lay, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, NULL), KVBM_OK);
  for (uint32_t l = 0; l < 3; l++) {
    assert_int_equal(kvbm_storage_block_layer_ptr(h.s, &lay, 0, l, &ptr, &size, NULL), KVBM_OK);
    memcpy(ptr, body + l * size, size);
  }
  kvbm_blake3_hasher hs;
  kvbm_blake3_hasher_init_keyed(&hs, mac);
  kvbm_blake3_hasher_update(&hs, body, bb);
  kvbm_block_msg m = {.seq_hash = hash, .num_tokens = 4, .tokens = tok, .tier = KVBM_TIER_G1,
                      .layout_id = 7 /* rawpeer.h's zone */, .phase = KVBM_PHASE_OUTPUT_CRITICAL,
                      .body_len = bb, .placed = 1, .block_id = 0, .mac_key = mac};
  kvbm_blake3_hasher_finalize(&hs, m.frame.checksum, 16);
  size_t len = 0;
  memcpy(msg, "KVPB", 4);
  assert_int_equal(kvbm_block_msg_encode(&m, msg + 4, sizeof msg - 4, &len, NULL), KVBM_OK);
  assert_int_equal(hostile_send(&h, msg, 4 + len), KVBM_EPROTO);
  /* and a block out of its zone's range: the same refusal, before any read */
  m.block_id = 99;
  assert_int_equal(kvbm_block_msg_encode(&m, msg + 4, sizeof msg - 4, &len, NULL), KVBM_OK);
  assert_int_equal(hostile_send(&h, msg, 4 + len), KVBM_EPROTO);
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(d, hash, &loc), KVBM_OK);
  assert_false(loc.held);
  kvbm_peer_stats st = stats(d);
  assert_int_equal(st.received, 2);
  assert_int_equal(st.ingested, 0);
  assert_int_equal(st.refused_other, 2);
  assert_int_equal(st.received_hashed_bytes, 0); /* refused before any read */
  assert_non_null(strstr(st.last_refusal, "never asks for"));
  free(body);
  kvbm_manager_destroy(d);
  rp_free(&h);
  kvbm_fabric_destroy(fd);
}

static void test_key_file_and_env(void **state) {
  (void)state;
  char *path = key_file("ok", KEY1, 0600);
  /* a: the key as bytes; b: the same key from the file named by the
   * environment */
  char envvar[600];
  snprintf(envvar, sizeof envvar, "KVBM_PEER_KEY_FILE=%s", path);
  const char *env[] = {"OTHER=1", envvar, NULL};
  kvbm_peer_config cb = keyed(NULL, KVBM_DISAGG_PUSH);
  assert_int_equal(kvbm_peer_config_env(&cb, env, NULL), KVBM_OK);
  assert_string_equal(cb.key_file, path);
  const char *empty[] = {"KVBM_PEER_KEY_FILE=", NULL};
  kvbm_error e;
  kvbm_peer_config junk = kvbm_peer_config_default();
  assert_int_equal(kvbm_peer_config_env(&junk, empty, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "KVBM_PEER_KEY_FILE"));
  pair p = {.a = make(32, 0, false), .b = make(32, 0, false)};
  kvbm_peer_config ca = keyed(KEY1, KVBM_DISAGG_PUSH);
  pair_attach(&p, &ca, &cb);
  assert_int_equal(p.rc_a, KVBM_OK);
  assert_int_equal(p.rc_b, KVBM_OK);
  uint64_t h[8];
  assert_int_equal(offload_8(&p, 9500, h), 8);
  assert_true(stats(p.b).keyed);
  assert_int_equal(stats(p.b).refused_auth, 0);
  pair_free(&p);
  unlink(path);
  free(path);
}

static void test_bad_keys_refused(void **state) {
  (void)state;
  kvbm_manager *m = make(16, 0, false);
  kvbm_fabric *f1, *f2;
  assert_int_equal(kvbm_fabric_inproc_pair("x", "y", &f1, &f2, NULL), KVBM_OK);
  uint32_t peer;
  kvbm_error e;
  kvbm_peer_config c = keyed(KEY1, KVBM_DISAGG_PUSH);
  c.key_file = "/nonexistent";
  assert_int_equal(kvbm_manager_attach(m, f1, &c, &peer, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "both key and key_file"));
  c = keyed(KEY1, KVBM_DISAGG_PUSH);
  c.key_len = 8;
  assert_int_equal(kvbm_manager_attach(m, f1, &c, &peer, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "16..4096 bytes, not 8"));
  char *path = key_file("open", KEY1, 0644);
  c = keyed(NULL, KVBM_DISAGG_PUSH);
  c.key_file = path;
  assert_int_equal(kvbm_manager_attach(m, f1, &c, &peer, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, path));
  unlink(path);
  free(path);
  /* one manager's peers share one key: a first keyed attach (it fails:
   * nobody answers its hello) fixes the kind; another key, or none, is
   * then refused before any fabric work */
  c = keyed(KEY1, KVBM_DISAGG_PUSH);
  c.timeout_ms = 50;
  assert_int_equal(kvbm_manager_attach(m, f1, &c, &peer, &e), KVBM_ETIMEDOUT);
  c = keyed(KEY2, KVBM_DISAGG_PUSH);
  assert_int_equal(kvbm_manager_attach(m, f1, &c, &peer, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "one key or none"));
  c = keyed(NULL, KVBM_DISAGG_PUSH);
  assert_int_equal(kvbm_manager_attach(m, f1, &c, &peer, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "one key or none"));
  kvbm_manager_destroy(m);
  kvbm_fabric_destroy(f1);
  kvbm_fabric_destroy(f2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_key_push),          cmocka_unit_test(test_same_key_put),
      cmocka_unit_test(test_peer_without_key_refused), cmocka_unit_test(test_wrong_key_refused),
      cmocka_unit_test(test_forged_frames_refused),  cmocka_unit_test(test_unasked_pulled_block_refused),  cmocka_unit_test(test_key_file_and_env),
      cmocka_unit_test(test_bad_keys_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
