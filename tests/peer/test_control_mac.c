/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_control_mac.c: MACs on a keyed peer link's control messages
 * (issue 23: "the same holds for the fabric's frames between peers that
 * share a key"; "no drop may rely on a peer's word older than its
 * lease").
 *
 * A keyed manager is attached to a raw peer (rawpeer.h: the wire written
 * from its description) that holds the same key; what the raw peer seals
 * is believed, what it forges is not:
 *   - a forged "holds" (an acknowledgement with no MAC, one under another
 *     key, one under the frame key instead of the control key, one changed
 *     after sealing) makes no block remote and ends no flush: after an
 *     eviction here, block_location says "not held", and no G1 copy may
 *     be dropped on that word;
 *   - a forged "remove", "forget them all" or "not held" forgets nothing;
 *   - a forged pull sends nothing back, a forged grant request grants
 *     nothing;
 *   - a genuine message replayed on its link (its sequence number seen),
 *     or on another link (other nonces), is refused;
 * each refused one counted (refused_control, refused_replayed, the
 * metric's reason "control") and the link still up, the genuine messages
 * after it believed (their sequence numbers skip those the forgeries
 * used: gaps are allowed). A manager and a raw peer that disagree on
 * holding a key are refused at the hello, by name, both ways; so are a
 * hello reflecting the manager's own nonce and a confirmation naming
 * another hello than the one sent. Two keyed managers
 * still tell each other their evictions (removes under the MAC).
 *
 * On the code before this change a keyed hello (flags 1, a nonce) was a
 * malformed hello and every test here failed at attach; the control
 * messages themselves were never MAC'd, so each forgery above was
 * believed (test_disagg.c's hostile peer shows what an unkeyed link
 * still believes, as it should: unkeyed links are unchanged).
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

/* A keyed manager and the raw peer at the other end of its link. */
typedef struct fx {
  kvbm_manager *m;
  kvbm_fabric *fm;
  rawpeer r;
  int rc;
  kvbm_error e;
} fx;

static kvbm_manager *make(void) {
  kvbm_manager_config c = tu_config(NULL, 16, 0, 0);
  c.metrics.enabled = true;
  c.metrics.host = "127.0.0.1";
  c.metrics.port = 0;
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

/* Attaches a manager keyed with mkey (NULL: none) to a raw peer keyed
 * with rkey; x->rc is the manager's attach status. */
static void fx_attach_opts(fx *x, const uint8_t *mkey, const uint8_t *rkey, bool reflect, bool lie) {
  memset(x, 0, sizeof *x);
  x->r.reflect = reflect;
  x->r.lie = lie;
  x->m = make();
  assert_int_equal(kvbm_fabric_inproc_pair("raw", "prefill", &x->r.f, &x->fm, NULL), KVBM_OK);
  x->r.secret = rkey;
  x->r.secret_len = rkey ? 32 : 0;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, rp_hello, &x->r), 0);
  kvbm_peer_config pc = kvbm_peer_config_default();
  pc.landing_blocks = 4;
  pc.timeout_ms = 2000;
  if (mkey) {
    pc.key = mkey;
    pc.key_len = 32;
  }
  uint32_t peer = 9;
  x->rc = kvbm_manager_attach(x->m, x->fm, &pc, &peer, &x->e);
  pthread_join(th, NULL);
}

static void fx_attach(fx *x, const uint8_t *mkey, const uint8_t *rkey) { fx_attach_opts(x, mkey, rkey, false, false); }

static void fx_keyed(fx *x) {
  fx_attach(x, KEY1, KEY1);
  if (x->rc) fail_msg("attach: %s", x->e.msg);
  assert_true(x->r.ok);
}

static void fx_free(fx *x) {
  kvbm_manager_destroy(x->m);
  rp_free(&x->r);
  kvbm_fabric_destroy(x->fm);
}

static void hashes_of(const uint32_t *tok, size_t n, uint64_t *h) {
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, n, 4, h, n / 4);
}

static kvbm_peer_stats stats(kvbm_manager *m) {
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(m, 0, &st), KVBM_OK);
  return st;
}

/* What block_location says of h: 'L' held here, 'R' remote, '-' neither. */
static char where(kvbm_manager *m, uint64_t h) {
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(m, h, &loc), KVBM_OK);
  return loc.held ? 'L' : loc.remote ? 'R' : '-';
}

/* The next message the manager sent the raw peer, checked and unsealed;
 * it must start with `magic`. Returns the u64 at offset 8 (a block
 * message's hash). */
static uint64_t take(fx *x, const char *magic) {
  static uint8_t buf[1 << 16];
  bool bad = false;
  long n = rp_next(&x->r, buf, sizeof buf, 5000, &bad);
  assert_false(bad);
  assert_true(n >= 4);
  if (memcmp(buf, magic, 4) != 0) fail_msg("expected a %s message, got %.4s", magic, (const char *)buf);
  return n >= 16 ? rp_get64(buf + 8) : 0;
}

/* Every message the raw peer pushed before it was served: the manager
 * answers a (genuine) grant request in order, and that answer must be
 * the next thing it sends (a forged pull or grant request before it would
 * have been answered first). */
static void barrier(fx *x) {
  uint8_t req[8] = {'K', 'V', 'R', 'Q', 1, 0, 0, 0};
  assert_true(rp_send(&x->r, req, sizeof req, NULL) > 0);
  take(x, "KVGR");
}

static size_t ack_msg(uint8_t b[16], int32_t status, uint64_t h) {
  memcpy(b, "KVAC", 4);
  memcpy(b + 4, &status, 4);
  rp_le64(b + 8, h);
  return 16;
}

static size_t remove_msg(uint8_t b[24], uint32_t flags, uint64_t h) {
  memset(b, 0, 24);
  memcpy(b, "KVRM", 4);
  b[4] = (uint8_t)flags;
  if (flags & 1u) return 16; /* forget them all: no hashes */
  b[8] = 1;
  rp_le64(b + 16, h);
  return 24;
}

/* The raw peer's sealing, but under the direction key made from another
 * control key (another cluster key, or the frame key used as one). */
static size_t seal_under(fx *x, const uint8_t ctl[32], const uint8_t *m, size_t len, uint8_t *out) {
  uint8_t in[68], dir[32];
  memcpy(in, "KVPD", 4);
  memcpy(in + 4, x->r.nonce, 32);
  memcpy(in + 36, x->r.theirs, 32);
  kvbm_blake3_keyed_hash(ctl, in, sizeof in, dir, 32);
  return rp_seal_with(dir, m, len, x->r.tx_seq++, out);
}

/* The forgeries of one message m: unsealed (the old wire), sealed under
 * another cluster key, sealed under the frame key (a block MAC's key
 * passing for a control MAC's), and sealed genuinely then changed on the
 * way. Returns how many were pushed (4). */
static unsigned push_forgeries(fx *x, const uint8_t *m, size_t len) {
  uint8_t out[256], other[32], frame[32];
  assert_int_equal(rp_push_raw(&x->r, m, len), KVBM_OK);
  kvbm_blake3_derive_key(RP_CTX, KEY2, sizeof KEY2, other, 32);
  assert_int_equal(rp_push_raw(&x->r, out, seal_under(x, other, m, len, out)), KVBM_OK);
  assert_int_equal(kvbm_fabric_frame_key(KEY1, sizeof KEY1, frame, NULL), KVBM_OK);
  assert_int_equal(rp_push_raw(&x->r, out, seal_under(x, frame, m, len, out)), KVBM_OK);
  size_t n = rp_seal_with(x->r.tx, m, len, x->r.tx_seq++, out);
  out[len - 1] ^= 1; /* the message's last byte (a hash's) changed after sealing */
  assert_int_equal(rp_push_raw(&x->r, out, n), KVBM_OK);
  return 4;
}

/* Offloads hs[0..n) to the raw peer, which acknowledges each (sealed),
 * then evicts them here (a prompt of 61 tokens fills the 16-block G1):
 * every one 'R'. */
static void holds(fx *x, const uint64_t *hs, size_t n, const uint32_t *other) {
  for (size_t k = 0; k < n; k++) {
    assert_int_equal(kvbm_manager_offload_block(x->m, 0, hs[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
    assert_true(take(x, "KVBB") == hs[k]);
    uint8_t a[16];
    assert_true(rp_send(&x->r, a, ack_msg(a, KVBM_OK, hs[k]), NULL) > 0);
  }
  barrier(x);
  assert_int_equal(kvbm_manager_peer_flush(x->m, 0, 5000, NULL), KVBM_OK);
  assert_int_equal(tu_run(x->m, other, 61, NULL, NULL), 0);
  for (size_t k = 0; k < n; k++) assert_int_equal(where(x->m, hs[k]), 'R');
}

static void assert_metric(kvbm_manager *m, unsigned control) {
  char *text, want[96];
  size_t len;
  assert_int_equal(kvbm_metrics_render(kvbm_manager_metrics(m), &text, &len, NULL), KVBM_OK);
  snprintf(want, sizeof want, "kvbm_peer_refused_total{peer=\"0\",reason=\"control\"} %u", control);
  if (!strstr(text, want)) fail_msg("no \"%s\" in the metrics", want);
  kvbm_metrics_text_free(text);
}

/* ---- a forged "holds" ---- */

static void test_forged_holds_refused(void **state) {
  (void)state;
  fx x;
  fx_keyed(&x);
  uint32_t *tok = tu_prompt(5100, 13), *other = tu_prompt(515000, 61);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(x.m, tok, 13, NULL, NULL), 0);
  assert_int_equal(kvbm_manager_offload_block(x.m, 0, hs[0], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_true(take(&x, "KVBB") == hs[0]); /* sealed: take checked its MAC */
  uint8_t a[16];
  unsigned forged = push_forgeries(&x, a, ack_msg(a, KVBM_OK, hs[0]));
  barrier(&x);
  kvbm_peer_stats st = stats(x.m);
  assert_int_equal(st.refused_control, forged);
  assert_int_equal(st.refused_replayed, 0);
  assert_int_equal(st.acked_blocks, 0);
  assert_int_equal(st.acks_unexpected, 0); /* not even read */
  assert_false(st.closed);
  assert_non_null(strstr(st.last_refusal, "KVBM_EAUTH"));
  kvbm_error e;
  assert_int_equal(kvbm_manager_peer_flush(x.m, 0, 0, &e), KVBM_ETIMEDOUT); /* still awaited */
  /* evicted here: no forged word makes it remote */
  assert_int_equal(tu_run(x.m, other, 61, NULL, NULL), 0);
  assert_int_equal(where(x.m, hs[0]), '-');
  assert_metric(x.m, forged);
  /* the genuine acknowledgement, after all that, is believed */
  assert_true(rp_send(&x.r, a, ack_msg(a, KVBM_OK, hs[0]), NULL) > 0);
  barrier(&x);
  assert_int_equal(kvbm_manager_peer_flush(x.m, 0, 5000, NULL), KVBM_OK);
  assert_int_equal(where(x.m, hs[0]), 'R');
  st = stats(x.m);
  assert_int_equal(st.acked_blocks, 1);
  assert_int_equal(st.refused_control, forged);
  free(tok);
  free(other);
  fx_free(&x);
}

/* ---- a forged "remove", "forget them all", "not held" ---- */

static void test_forged_remove_refused(void **state) {
  (void)state;
  fx x;
  fx_keyed(&x);
  uint32_t *tok = tu_prompt(5200, 13), *other = tu_prompt(525000, 61);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(x.m, tok, 13, NULL, NULL), 0);
  holds(&x, hs, 3, other);
  uint8_t m[24];
  unsigned forged = push_forgeries(&x, m, remove_msg(m, 0, hs[0]));
  forged += push_forgeries(&x, m, remove_msg(m, 1, 0));
  uint8_t miss[12] = {'K', 'V', 'P', 'M'};
  rp_le64(miss + 4, hs[1]);
  forged += push_forgeries(&x, miss, sizeof miss);
  barrier(&x);
  for (int k = 0; k < 3; k++) assert_int_equal(where(x.m, hs[k]), 'R'); /* nothing forgotten */
  kvbm_peer_stats st = stats(x.m);
  assert_int_equal(st.refused_control, forged);
  assert_int_equal(st.forgotten_removed, 0);
  assert_false(st.closed);
  /* the genuine remove of hs[0] is believed, only it */
  assert_true(rp_send(&x.r, m, remove_msg(m, 0, hs[0]), NULL) > 0);
  barrier(&x);
  assert_int_equal(where(x.m, hs[0]), '-');
  assert_int_equal(where(x.m, hs[1]), 'R');
  assert_int_equal(where(x.m, hs[2]), 'R');
  assert_int_equal(stats(x.m).forgotten_removed, 1);
  free(tok);
  free(other);
  fx_free(&x);
}

/* ---- a forged pull, a forged grant request: nothing sent back ---- */

static void test_forged_pull_and_grant_refused(void **state) {
  (void)state;
  fx x;
  fx_keyed(&x);
  uint32_t *tok = tu_prompt(5300, 13);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(x.m, tok, 13, NULL, NULL), 0);
  uint8_t pull[16] = {'K', 'V', 'P', 'L', 1, 0, 0, 0};
  rp_le64(pull + 8, hs[0]); /* held here: a believed pull pushes it back */
  unsigned forged = push_forgeries(&x, pull, sizeof pull);
  uint8_t rq[8] = {'K', 'V', 'R', 'Q', 4, 0, 0, 0};
  forged += push_forgeries(&x, rq, sizeof rq);
  barrier(&x); /* its KVGR is the first answer: no block, no grant came before it */
  kvbm_peer_stats st = stats(x.m);
  assert_int_equal(st.refused_control, forged);
  assert_int_equal(st.grants_given, 1); /* the barrier's */
  assert_int_equal(st.sent_blocks, 0);
  /* the genuine pull is served */
  assert_true(rp_send(&x.r, pull, sizeof pull, NULL) > 0);
  assert_true(take(&x, "KVBB") == hs[0]);
  free(tok);
  fx_free(&x);
}

/* ---- replays: on the same link, and on another ---- */

static void test_replay_refused(void **state) {
  (void)state;
  fx x;
  fx_keyed(&x);
  uint32_t *tok = tu_prompt(5400, 13), *other = tu_prompt(545000, 61);
  uint64_t hs[3];
  hashes_of(tok, 13, hs);
  assert_int_equal(tu_run(x.m, tok, 13, NULL, NULL), 0);
  /* hs[0] acknowledged (its wire kept), then removed (kept too) */
  assert_int_equal(kvbm_manager_offload_block(x.m, 0, hs[0], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_true(take(&x, "KVBB") == hs[0]);
  uint8_t a[16], ack_wire[64], m[24], rm_wire[64];
  size_t ack_len = rp_send(&x.r, a, ack_msg(a, KVBM_OK, hs[0]), ack_wire);
  size_t rm_len = rp_send(&x.r, m, remove_msg(m, 0, hs[0]), rm_wire);
  barrier(&x);
  assert_int_equal(kvbm_manager_peer_flush(x.m, 0, 5000, NULL), KVBM_OK);
  assert_int_equal(stats(x.m).forgotten_removed, 1);
  /* sent again and acknowledged again, then evicted here: remote */
  assert_int_equal(kvbm_manager_offload_block(x.m, 0, hs[0], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_true(take(&x, "KVBB") == hs[0]);
  assert_true(rp_send(&x.r, a, ack_msg(a, KVBM_OK, hs[0]), NULL) > 0);
  barrier(&x);
  assert_int_equal(kvbm_manager_peer_flush(x.m, 0, 5000, NULL), KVBM_OK);
  assert_int_equal(tu_run(x.m, other, 61, NULL, NULL), 0);
  assert_int_equal(where(x.m, hs[0]), 'R');
  /* the old remove, replayed as it was: refused, hs[0] stays remote */
  assert_int_equal(rp_push_raw(&x.r, rm_wire, rm_len), KVBM_OK);
  /* ... and with a fresh sequence number written over the old: its MAC fails */
  uint8_t bumped[64];
  memcpy(bumped, rm_wire, rm_len);
  rp_le64(bumped + rm_len - 24, x.r.tx_seq + 100);
  assert_int_equal(rp_push_raw(&x.r, bumped, rm_len), KVBM_OK);
  barrier(&x);
  assert_int_equal(where(x.m, hs[0]), 'R');
  kvbm_peer_stats st = stats(x.m);
  assert_int_equal(st.refused_replayed, 1);
  assert_int_equal(st.refused_control, 2);
  assert_int_equal(st.forgotten_removed, 1);
  assert_non_null(strstr(st.last_refusal, "fails the link's MAC"));

  /* another link of the same key: the first link's acknowledgement,
   * replayed there while the same block is awaited, is refused (other
   * nonces, other keys), and the block is not believed remote */
  fx y;
  fx_keyed(&y);
  assert_int_equal(tu_run(y.m, tok, 13, NULL, NULL), 0);
  assert_int_equal(kvbm_manager_offload_block(y.m, 0, hs[0], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_true(take(&y, "KVBB") == hs[0]);
  assert_int_equal(rp_push_raw(&y.r, ack_wire, ack_len), KVBM_OK);
  barrier(&y);
  st = stats(y.m);
  assert_int_equal(st.refused_control, 1);
  assert_int_equal(st.acked_blocks, 0);
  kvbm_error e;
  assert_int_equal(kvbm_manager_peer_flush(y.m, 0, 0, &e), KVBM_ETIMEDOUT);
  assert_int_equal(tu_run(y.m, other, 61, NULL, NULL), 0);
  assert_int_equal(where(y.m, hs[0]), '-');
  fx_free(&y);
  free(tok);
  free(other);
  fx_free(&x);
}

/* ---- keyed and unkeyed, and other keys: refused at attach ---- */

static void test_key_mismatch_refused_at_hello(void **state) {
  (void)state;
  fx x;
  fx_attach(&x, KEY1, NULL); /* the manager keyed, the peer not */
  assert_int_equal(x.rc, KVBM_EAUTH);
  assert_non_null(strstr(x.e.msg, "this side holds a cluster key"));
  assert_false(x.r.ok);
  fx_free(&x);
  fx_attach(&x, NULL, KEY1); /* the peer keyed, the manager not */
  assert_int_equal(x.rc, KVBM_EAUTH);
  assert_non_null(strstr(x.e.msg, "the peer holds a cluster key"));
  fx_free(&x);
  fx_attach(&x, KEY1, KEY2); /* both keyed, other keys */
  assert_int_equal(x.rc, KVBM_EAUTH);
  assert_non_null(strstr(x.e.msg, "another cluster key"));
  assert_false(x.r.ok); /* the manager's confirmation failed the raw peer's check too */
  fx_free(&x);
  /* a confirmation, sealed right, naming another hello than the one the
   * manager sent (changed on the way): refused */
  memset(&x, 0, sizeof x);
  fx_attach_opts(&x, KEY1, KEY1, false, true);
  assert_int_equal(x.rc, KVBM_EAUTH);
  assert_non_null(strstr(x.e.msg, "other hellos"));
  fx_free(&x);
  /* a hello that sends the manager's own nonce back (a reflection: both
   * directions would share a key): refused before anything is imported */
  fx_attach_opts(&x, KEY1, KEY1, true, false);
  assert_int_equal(x.rc, KVBM_EAUTH);
  assert_non_null(strstr(x.e.msg, "reflected"));
  fx_free(&x);
  /* unkeyed both: the old wire, attached (test_disagg.c has the rest) */
  fx_attach(&x, NULL, NULL);
  assert_int_equal(x.rc, KVBM_OK);
  assert_true(x.r.ok);
  assert_false(stats(x.m).keyed);
  fx_free(&x);
}

/* ---- two keyed managers: evictions told under the MAC ---- */

typedef struct attach_job {
  kvbm_manager *m;
  kvbm_fabric *f;
  kvbm_peer_config cfg;
  int rc;
} attach_job;

static void *attach_thread(void *arg) {
  attach_job *j = arg;
  uint32_t peer;
  j->rc = kvbm_manager_attach(j->m, j->f, &j->cfg, &peer, NULL);
  return NULL;
}

static void test_keyed_pair_removes(void **state) {
  (void)state;
  kvbm_manager_config ca = tu_config(NULL, 16, 0, 0), cb = tu_config(NULL, 8, 0, 0);
  kvbm_manager *a = tu_create(&ca), *b = tu_create(&cb);
  kvbm_fabric *fa, *fb;
  assert_int_equal(kvbm_fabric_inproc_pair("prefill", "decode", &fa, &fb, NULL), KVBM_OK);
  kvbm_peer_config pc = kvbm_peer_config_default();
  pc.key = KEY1;
  pc.key_len = 32;
  attach_job jb = {.m = b, .f = fb, .cfg = pc};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, attach_thread, &jb), 0);
  uint32_t peer;
  assert_int_equal(kvbm_manager_attach(a, fa, &pc, &peer, NULL), KVBM_OK);
  pthread_join(th, NULL);
  assert_int_equal(jb.rc, KVBM_OK);
  uint32_t *pt = tu_prompt(5500, 12), *ot = tu_prompt(555000, 61), *yt = tu_prompt(556000, 32);
  uint64_t ph[3], oh[15];
  hashes_of(pt, 12, ph);
  hashes_of(ot, 60, oh);
  assert_int_equal(tu_run(a, pt, 12, NULL, NULL), 0);
  for (int k = 0; k < 3; k++)
    assert_int_equal(kvbm_manager_offload_block(a, 0, ph[k], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(a, 0, 5000, NULL), KVBM_OK);
  assert_int_equal(tu_run(a, ot, 61, NULL, NULL), 0); /* evicted at a */
  for (int k = 0; k < 3; k++) assert_int_equal(where(a, ph[k]), 'R');
  assert_int_equal(tu_run(b, yt, 32, NULL, NULL), 0); /* evicted at b: b tells a */
  /* a message a sends b after b's evictions is answered after b's removes */
  assert_int_equal(kvbm_manager_offload_block(a, 0, oh[14], KVBM_PHASE_OUTPUT_CRITICAL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_flush(a, 0, 5000, NULL), KVBM_OK);
  for (int k = 0; k < 3; k++) assert_int_equal(where(a, ph[k]), '-');
  kvbm_peer_stats sa, sb;
  assert_int_equal(kvbm_manager_peer_stats_get(a, 0, &sa), KVBM_OK);
  assert_int_equal(kvbm_manager_peer_stats_get(b, 0, &sb), KVBM_OK);
  assert_true(sa.keyed && sb.keyed);
  assert_true(sb.removes_sent >= 3);
  assert_true(sa.forgotten_removed >= 3);
  assert_int_equal(sa.acked_blocks, 4);
  assert_int_equal(sa.refused_control + sb.refused_control, 0);
  assert_int_equal(sa.refused_auth + sb.refused_auth, 0);
  free(pt);
  free(ot);
  free(yt);
  kvbm_manager_destroy(a);
  kvbm_manager_destroy(b);
  kvbm_fabric_destroy(fa);
  kvbm_fabric_destroy(fb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forged_holds_refused),
      cmocka_unit_test(test_forged_remove_refused),
      cmocka_unit_test(test_forged_pull_and_grant_refused),
      cmocka_unit_test(test_replay_refused),
      cmocka_unit_test(test_key_mismatch_refused_at_hello),
      cmocka_unit_test(test_keyed_pair_removes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
