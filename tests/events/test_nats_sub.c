/* SPDX-License-Identifier: Apache-2.0 */
/* test_nats_sub.c: kvbm_subscriber on NATS, against a real nats-server
 * (started here on a free loopback port, stopped at the end). The test
 * publishes kvbm's NATS messages by hand (the payload as the body, the
 * number in the Kvbm-Seq header) so that it can leave numbers out, go
 * back, or send garbage; a ZMQ replay ROUTER run by a thread here answers
 * with the real protocol. Checked: batches in order, a gap filled from the
 * replay socket, a gap without one counted lost, a restart (a step back is
 * a new stream), bad messages of each kind counted and skipped without
 * losing the ones after them, libnats' drops past the byte budget counted
 * as overflow and as lost numbers, raw mode (bodies undecoded, the same
 * rules and replay), and the options refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kvbm/events.h"
#include "common/nats_testutil.h"

static nt_server srv;
static natsConnection *pub_nc;
static int subject_n; /* a fresh subject per test */

static int start_server(void **state) {
  (void)state;
  if (nt_start(&srv, false)) return -1;
  if (natsConnection_ConnectTo(&pub_nc, srv.url) == NATS_OK) return 0;
  fprintf(stderr, "could not connect to %s\n", srv.url);
  nt_stop(&srv);
  return -1;
}

static int stop_server(void **state) {
  (void)state;
  natsConnection_Destroy(pub_nc);
  nt_stop(&srv);
  nats_Close();
  return 0;
}

/* ------------------------------------------------------------- payloads */

/* A batch of one BlockStored whose hash is `tag`, padded with `pad`
 * tokens (the caller frees). */
static uint8_t *payload(uint64_t tag, size_t pad, size_t *len) {
  size_t ntok = 4 + pad;
  uint32_t *tok = calloc(ntok, sizeof *tok);
  for (size_t i = 4; i < ntok; i++) tok[i] = 70000; /* 5 bytes each on the wire */
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_hashes = &tag, .num_block_hashes = 1,
                   .token_ids = tok, .num_tokens = ntok, .block_size = (uint32_t)ntok,
                   .medium = KVBM_MEDIUM_GPU};
  kvbm_event_batch b = {.ts = 1.5, .events = &ev, .num_events = 1};
  kvbm_event_encoder *enc;
  assert_int_equal(kvbm_event_encoder_create(NULL, &enc, NULL), KVBM_OK);
  const uint8_t *data;
  kvbm_error err;
  if (kvbm_event_encode(enc, &b, &data, len, &err)) fail_msg("%s", err.msg);
  uint8_t *out = malloc(*len);
  memcpy(out, data, *len);
  kvbm_event_encoder_destroy(enc);
  free(tok);
  return out;
}

/* Publishes one message on subject: hdr the Kvbm-Seq header's value (NULL:
 * none). */
static void pub_raw(const char *subject, const char *hdr, const void *data, size_t len) {
  natsMsg *m = NULL;
  assert_int_equal(natsMsg_Create(&m, subject, NULL, data, (int)len), NATS_OK);
  if (hdr) assert_int_equal(natsMsgHeader_Set(m, "Kvbm-Seq", hdr), NATS_OK);
  assert_int_equal(natsConnection_PublishMsg(pub_nc, m), NATS_OK);
  natsMsg_Destroy(m);
}

/* Batch `seq` with hash `tag`, as kvbm's NATS sink sends it. */
static void pub(const char *subject, uint64_t seq, uint64_t tag) {
  char h[24];
  snprintf(h, sizeof h, "%llu", (unsigned long long)seq);
  size_t len;
  uint8_t *p = payload(tag, 0, &len);
  pub_raw(subject, h, p, len);
  free(p);
}

static void flush(void) { assert_int_equal(natsConnection_FlushTimeout(pub_nc, 5000), NATS_OK); }

static const char *new_subject(void) {
  static char s[32];
  snprintf(s, sizeof s, "kv.test.%d", ++subject_n);
  return s;
}

/* ------------------------------------------------------- replay server */

/* A worker's replay ROUTER keeping batches [keep_from, keep_to): batch k
 * has hash k + 1000 (so a replayed batch is told from a live one). */
typedef struct rserver {
  void *ctx, *router;
  char ep[64];
  uint64_t keep_from, keep_to;
  _Atomic int stop, requests;
  pthread_t th;
} rserver;

static void send_reply(void *router, zmq_msg_t *id, int64_t seq, const void *p, size_t len) {
  uint8_t sb[8];
  for (int i = 7; i >= 0; i--, seq >>= 8) sb[i] = (uint8_t)seq;
  zmq_send(router, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE);
  zmq_send(router, "", 0, ZMQ_SNDMORE);
  zmq_send(router, p ? "kv" : "", p ? 2 : 0, ZMQ_SNDMORE); /* vLLM's shape with the topic */
  zmq_send(router, sb, 8, ZMQ_SNDMORE);
  zmq_send(router, p, len, 0);
}

static void *rserver_main(void *arg) {
  rserver *r = arg;
  zmq_pollitem_t it = {.socket = r->router, .events = ZMQ_POLLIN};
  while (!atomic_load(&r->stop)) {
    if (zmq_poll(&it, 1, 100) <= 0) continue;
    zmq_msg_t f[3];
    for (int i = 0; i < 3; i++) {
      zmq_msg_init(&f[i]);
      zmq_msg_recv(&f[i], r->router, 0);
    }
    atomic_fetch_add(&r->requests, 1);
    uint64_t start = 0;
    for (int i = 0; i < 8; i++) start = start << 8 | ((uint8_t *)zmq_msg_data(&f[2]))[i];
    for (uint64_t k = start > r->keep_from ? start : r->keep_from; k < r->keep_to; k++) {
      size_t len;
      uint8_t *p = payload(k + 1000, 0, &len);
      send_reply(r->router, &f[0], (int64_t)k, p, len);
      free(p);
    }
    send_reply(r->router, &f[0], -1, NULL, 0);
    for (int i = 0; i < 3; i++) zmq_msg_close(&f[i]);
  }
  return NULL;
}

static void rserver_start(rserver *r, uint64_t keep_from, uint64_t keep_to) {
  r->keep_from = keep_from;
  r->keep_to = keep_to;
  r->ctx = zmq_ctx_new();
  r->router = zmq_socket(r->ctx, ZMQ_ROUTER);
  int zero = 0;
  zmq_setsockopt(r->router, ZMQ_LINGER, &zero, sizeof zero);
  assert_int_equal(zmq_bind(r->router, "tcp://127.0.0.1:*"), 0);
  size_t sz = sizeof r->ep;
  zmq_getsockopt(r->router, ZMQ_LAST_ENDPOINT, r->ep, &sz);
  assert_int_equal(pthread_create(&r->th, NULL, rserver_main, r), 0);
}

static void rserver_stop(rserver *r) {
  atomic_store(&r->stop, 1);
  pthread_join(r->th, NULL);
  zmq_close(r->router);
  zmq_ctx_term(r->ctx);
}

/* ----------------------------------------------------------- subscriber */

static kvbm_subscriber *subscribe(const char *subject, const char *replay,
                                  kvbm_subscriber_config *o_in) {
  kvbm_subscriber_config o = o_in ? *o_in : kvbm_subscriber_config_default(srv.url);
  o.endpoint = srv.url;
  o.subject = subject;
  o.replay_endpoint = replay;
  kvbm_subscriber *s;
  kvbm_error err;
  if (kvbm_subscriber_create(&o, &s, &err)) fail_msg("%s", err.msg);
  return s;
}

/* The next batch: number seq, hash tag. */
static kvbm_event_batch expect(kvbm_subscriber *s, uint64_t seq, uint64_t tag) {
  kvbm_event_batch b;
  kvbm_error err;
  int rc = kvbm_subscriber_recv(s, 10000, &b, &err);
  if (rc) fail_msg("batch %llu: %s", (unsigned long long)seq, err.msg);
  assert_int_equal(b.seq, seq);
  assert_int_equal(b.num_events, 1);
  assert_int_equal(b.events[0].type, KVBM_EVENT_STORED);
  assert_true(b.events[0].block_hashes[0] == tag);
  return b;
}

static void expect_error(kvbm_subscriber *s, int want) {
  kvbm_event_batch b;
  kvbm_error err = {0};
  int rc = kvbm_subscriber_recv(s, 10000, &b, &err);
  if (rc != want)
    fail_msg("expected status %d, got %d (%s; seq %llu)", want, rc, err.msg,
             rc ? 0ull : (unsigned long long)b.seq);
  assert_true(err.msg[0] != '\0');
}

static kvbm_subscriber_stats stats(const kvbm_subscriber *s) {
  kvbm_subscriber_stats st;
  kvbm_subscriber_stats_get(s, &st);
  return st;
}

static void test_in_order(void **state) {
  (void)state;
  const char *subj = new_subject();
  kvbm_subscriber *s = subscribe(subj, NULL, NULL);
  for (uint64_t i = 0; i < 10; i++) pub(subj, i, i);
  flush();
  for (uint64_t i = 0; i < 10; i++) {
    kvbm_event_batch b = expect(s, i, i);
    assert_false(b.replayed || b.reset);
    assert_int_equal(b.lost_before, 0);
  }
  kvbm_event_batch b;
  assert_int_equal(kvbm_subscriber_recv(s, 50, &b, NULL), KVBM_ETIMEDOUT);
  kvbm_subscriber_stats st = stats(s);
  assert_int_equal(st.messages, 10);
  assert_int_equal(st.delivered, 10);
  assert_int_equal(st.events, 10);
  assert_int_equal(st.lost + st.gaps + st.malformed + st.overflow + st.resets, 0);
  kvbm_subscriber_destroy(s);
}

static void test_gap_replayed(void **state) {
  (void)state;
  const char *subj = new_subject();
  rserver r = {0};
  rserver_start(&r, 0, 100);
  kvbm_subscriber *s = subscribe(subj, r.ep, NULL);
  pub(subj, 0, 0);
  pub(subj, 1, 1);
  pub(subj, 2, 2);
  pub(subj, 5, 5); /* 3 and 4 never came on NATS */
  pub(subj, 6, 6);
  flush();
  for (uint64_t i = 0; i < 3; i++) expect(s, i, i);
  for (uint64_t i = 3; i < 5; i++) {
    kvbm_event_batch b = expect(s, i, i + 1000); /* the replay server's */
    assert_true(b.replayed);
    assert_int_equal(b.lost_before, 0);
  }
  kvbm_event_batch b = expect(s, 5, 5);
  assert_false(b.replayed);
  assert_int_equal(b.lost_before, 0);
  expect(s, 6, 6);
  kvbm_subscriber_stats st = stats(s);
  assert_int_equal(st.gaps, 1);
  assert_int_equal(st.replay_requests, 1);
  assert_int_equal(st.replayed, 2);
  /* the server sends all it keeps from 3 on (as vLLM's does): only 3 and
   * 4 are taken */
  assert_int_equal(st.replay_refused, 95);
  assert_int_equal(st.lost, 0);
  assert_int_equal(st.delivered, 7);
  assert_int_equal(atomic_load(&r.requests), 1);
  kvbm_subscriber_destroy(s);
  rserver_stop(&r);
}

/* The replay server no longer keeps 10: what it gives comes, the rest is
 * lost, and the live batch after the gap still comes. */
static void test_gap_partly_replayed(void **state) {
  (void)state;
  const char *subj = new_subject();
  rserver r = {0};
  rserver_start(&r, 11, 100);
  kvbm_subscriber *s = subscribe(subj, r.ep, NULL);
  for (uint64_t i = 0; i < 10; i++) pub(subj, i, i);
  pub(subj, 13, 13);
  flush();
  for (uint64_t i = 0; i < 10; i++) expect(s, i, i);
  kvbm_event_batch b = expect(s, 11, 1011);
  assert_true(b.replayed);
  assert_int_equal(b.lost_before, 1); /* 10 */
  expect(s, 12, 1012);
  b = expect(s, 13, 13);
  assert_int_equal(b.lost_before, 0);
  kvbm_subscriber_stats st = stats(s);
  assert_int_equal(st.lost, 1);
  assert_int_equal(st.replayed, 2);
  kvbm_subscriber_destroy(s);
  rserver_stop(&r);
}

static void test_gap_lost(void **state) {
  (void)state;
  const char *subj = new_subject();
  kvbm_subscriber *s = subscribe(subj, NULL, NULL);
  pub(subj, 0, 0);
  pub(subj, 1, 1);
  pub(subj, 4, 4);
  pub(subj, 5, 5);
  flush();
  expect(s, 0, 0);
  expect(s, 1, 1);
  kvbm_event_batch b = expect(s, 4, 4);
  assert_int_equal(b.lost_before, 2);
  assert_false(b.replayed);
  b = expect(s, 5, 5);
  assert_int_equal(b.lost_before, 0);
  kvbm_subscriber_stats st = stats(s);
  assert_int_equal(st.gaps, 1);
  assert_int_equal(st.lost, 2);
  assert_int_equal(st.replay_requests, 0);
  assert_int_equal(st.delivered, 4);
  kvbm_subscriber_destroy(s);
}

/* The engine restarts: its numbers begin again at 0. */
static void test_restart(void **state) {
  (void)state;
  const char *subj = new_subject();
  kvbm_subscriber *s = subscribe(subj, NULL, NULL);
  for (uint64_t i = 0; i < 5; i++) pub(subj, i, i);
  pub(subj, 0, 100);
  pub(subj, 1, 101);
  pub(subj, 1, 101); /* a repeat: skipped */
  pub(subj, 2, 102);
  flush();
  for (uint64_t i = 0; i < 5; i++) expect(s, i, i);
  kvbm_event_batch b = expect(s, 0, 100);
  assert_true(b.reset);
  assert_int_equal(b.lost_before, 0);
  b = expect(s, 1, 101);
  assert_false(b.reset);
  expect(s, 2, 102);
  kvbm_subscriber_stats st = stats(s);
  assert_int_equal(st.resets, 1);
  assert_int_equal(st.duplicates, 1);
  assert_int_equal(st.lost, 0);
  kvbm_subscriber_destroy(s);
}

/* A stray number far ahead is not believed: the stream goes on. */
static void test_stray(void **state) {
  (void)state;
  const char *subj = new_subject();
  kvbm_subscriber *s = subscribe(subj, NULL, NULL);
  pub(subj, 0, 0);
  pub(subj, (uint64_t)1 << 63, 7);
  pub(subj, 1, 1);
  flush();
  expect(s, 0, 0);
  kvbm_event_batch b = expect(s, 1, 1);
  assert_false(b.reset);
  assert_int_equal(b.lost_before, 0);
  assert_int_equal(stats(s).jumps, 1);
  kvbm_subscriber_destroy(s);
}

/* Bad messages of each kind: each is one error, counted, and the batches
 * after it still come. */
static void test_malformed(void **state) {
  (void)state;
  const char *subj = new_subject();
  kvbm_subscriber_config o = kvbm_subscriber_config_default(srv.url);
  o.max_payload = 4096;
  o.max_queue_bytes = 1 << 20;
  kvbm_subscriber *s = subscribe(subj, NULL, &o);
  size_t len;
  uint8_t *good = payload(1, 0, &len);
  pub(subj, 0, 0);
  pub_raw(subj, NULL, good, len);   /* no Kvbm-Seq */
  pub_raw(subj, "abc", good, len);  /* not a number */
  pub_raw(subj, "-1", good, len);   /* negative */
  pub_raw(subj, "1x", good, len);   /* not only digits */
  pub_raw(subj, "18446744073709551616", good, len); /* 2^64 */
  pub_raw(subj, "1", "\xc1\x00garbage", 9); /* does not decode */
  pub(subj, 2, 2);
  size_t biglen;
  uint8_t *big = payload(3, 2000, &biglen); /* over max_payload */
  assert_true(biglen > 4096);
  pub_raw(subj, "3", big, biglen);
  pub(subj, 4, 4);
  flush();
  expect(s, 0, 0);
  for (int i = 0; i < 5; i++) expect_error(s, KVBM_EFORMAT);
  kvbm_event_batch b;
  kvbm_error err;
  assert_int_not_equal(kvbm_subscriber_recv(s, 10000, &b, &err), KVBM_OK);
  b = expect(s, 2, 2);
  assert_int_equal(b.lost_before, 0); /* 1 came, undecodable: not lost */
  expect_error(s, KVBM_ETOOLONG);
  b = expect(s, 4, 4);
  assert_int_equal(b.lost_before, 1); /* 3 was refused: a hole */
  kvbm_subscriber_stats st = stats(s);
  assert_int_equal(st.malformed, 7);
  assert_int_equal(st.bad_seq, 5);
  assert_int_equal(st.bad_payload, 1);
  assert_int_equal(st.too_large, 1);
  assert_int_equal(st.delivered, 3);
  assert_int_equal(st.messages, 10);
  free(good);
  free(big);
  kvbm_subscriber_destroy(s);
}

/* A subscriber that does not read while its engine floods: libnats keeps
 * max_queue_bytes / 2 and drops the rest, which is counted as overflow
 * and, once the stream goes on, as lost. */
static void test_budget(void **state) {
  (void)state;
  const char *subj = new_subject();
  kvbm_subscriber_config o = kvbm_subscriber_config_default(srv.url);
  o.max_payload = 4096;
  o.max_queue_bytes = 2 * 4096; /* libnats keeps 4096 bytes */
  kvbm_subscriber *s = subscribe(subj, NULL, &o);
  const uint64_t n = 1000;
  for (uint64_t i = 0; i < n; i++) {
    char h[24];
    snprintf(h, sizeof h, "%llu", (unsigned long long)i);
    size_t len;
    uint8_t *p = payload(i, 200, &len); /* ~ 1 KB */
    pub_raw(subj, h, p, len);
    free(p);
  }
  flush();
  /* read until every message is accounted for: taken or dropped (libnats
   * may still be receiving while this reads: which ones it drops is not
   * fixed, only that none vanishes) */
  uint64_t got = 0;
  for (uint64_t tries = 0; tries < n + 600 && got + stats(s).overflow < n; tries++) {
    kvbm_event_batch b;
    int rc = kvbm_subscriber_recv(s, 50, &b, NULL);
    if (rc == KVBM_OK) got++;
    else assert_int_equal(rc, KVBM_ETIMEDOUT);
  }
  kvbm_subscriber_stats st = stats(s);
  assert_int_equal(got + st.overflow, n);
  assert_true(st.overflow > 0); /* 1 MB flooded into 4 KB */
  assert_int_equal(st.delivered, got);
  pub(subj, n, n);
  flush();
  expect(s, n, n);
  st = stats(s);
  assert_int_equal(st.lost, st.overflow); /* every dropped number is a hole */
  assert_true(st.peak_bytes <= o.max_queue_bytes / 2);
  kvbm_subscriber_destroy(s);
}

/* Raw mode (payloads that are not KV events, as the advisor's storage
 * sources read): the bodies come undecoded with their numbers, the
 * sequence rules and replay work as in normal mode, and what raw mode
 * cannot judge (the header, the size) is still refused. */
static void raw_expect(kvbm_subscriber *s, uint64_t seq, const void *data, size_t len,
                       bool replayed, uint64_t lost_before) {
  kvbm_event_batch b;
  const uint8_t *p = NULL;
  size_t plen = 0;
  kvbm_error err;
  int rc = kvbm_subscriber_recv_raw(s, 10000, &b, &p, &plen, &err);
  if (rc) fail_msg("raw batch %llu: %s", (unsigned long long)seq, err.msg);
  assert_int_equal(b.seq, seq);
  assert_int_equal(b.num_events, 0);
  assert_int_equal(b.replayed, replayed);
  assert_int_equal(b.lost_before, lost_before);
  assert_int_equal(plen, len);
  assert_memory_equal(p, data, len);
}

static void test_raw(void **state) {
  (void)state;
  const char *subj = new_subject();
  rserver r = {0};
  rserver_start(&r, 2, 4); /* keeps 2 and 3 */
  kvbm_subscriber_config o = kvbm_subscriber_config_default(srv.url);
  o.raw = true;
  o.max_payload = 4096;
  o.max_queue_bytes = 1 << 20;
  kvbm_subscriber *s = subscribe(subj, r.ep, &o);
  static const char b0[] = "\xc1 not msgpack", b1[] = "\x93\x01\x02", b4[] = "storage 4";
  pub_raw(subj, "0", b0, sizeof b0);
  pub_raw(subj, "1", b1, sizeof b1);
  pub_raw(subj, "4", b4, sizeof b4); /* 2 and 3 from the replay socket */
  pub_raw(subj, "4", b4, sizeof b4); /* a repeat */
  pub_raw(subj, NULL, b4, sizeof b4); /* no Kvbm-Seq */
  static uint8_t big[5000];
  pub_raw(subj, "5", big, sizeof big); /* over max_payload */
  pub_raw(subj, "8", b0, sizeof b0);   /* 5..7 lost: nothing to replay */
  flush();
  raw_expect(s, 0, b0, sizeof b0, false, 0);
  raw_expect(s, 1, b1, sizeof b1, false, 0);
  for (uint64_t k = 2; k < 4; k++) {
    size_t len;
    uint8_t *p = payload(k + 1000, 0, &len); /* the replay server's, undecoded */
    raw_expect(s, k, p, len, true, 0);
    free(p);
  }
  raw_expect(s, 4, b4, sizeof b4, false, 0);
  kvbm_event_batch b;
  const uint8_t *p;
  size_t plen;
  kvbm_error err = {0};
  assert_int_equal(kvbm_subscriber_recv_raw(s, 10000, &b, &p, &plen, &err), KVBM_EFORMAT);
  assert_int_equal(kvbm_subscriber_recv_raw(s, 10000, &b, &p, &plen, &err), KVBM_ETOOLONG);
  raw_expect(s, 8, b0, sizeof b0, false, 3);
  kvbm_subscriber_stats st = stats(s);
  assert_int_equal(st.delivered, 6);
  assert_int_equal(st.events, 0);
  assert_int_equal(st.replayed, 2);
  assert_int_equal(st.duplicates, 1);
  assert_int_equal(st.bad_seq, 1);
  assert_int_equal(st.too_large, 1);
  assert_int_equal(st.bad_payload, 0);
  assert_int_equal(st.lost, 3);
  kvbm_subscriber_destroy(s);
  rserver_stop(&r);
}

static void refused(const char *endpoint, const char *subject, bool bind, int want) {
  kvbm_subscriber_config o = kvbm_subscriber_config_default(endpoint);
  o.subject = subject;
  o.bind = bind;
  kvbm_subscriber *s = NULL;
  kvbm_error err = {0};
  int rc = kvbm_subscriber_create(&o, &s, &err);
  if (rc != want) fail_msg("%s %s: expected %d, got %d (%s)", endpoint, subject ? subject : "-",
                           want, rc, err.msg);
  assert_null(s);
  assert_true(err.msg[0] != '\0');
}

static void test_options(void **state) {
  (void)state;
  refused(srv.url, NULL, false, KVBM_EINVAL);        /* no subject */
  refused(srv.url, "", false, KVBM_EINVAL);
  refused(srv.url, "kv.*", false, KVBM_EINVAL);      /* wildcards */
  refused(srv.url, "kv.>", false, KVBM_EINVAL);
  refused(srv.url, "kv w", false, KVBM_EINVAL);
  refused(srv.url, "kv.w", true, KVBM_EINVAL);       /* bind is ZMQ's */
  refused("tcp://127.0.0.1:5555", "kv.w", false, KVBM_EINVAL); /* subject without NATS */
  refused("nats://127.0.0.1:1", "kv.w", false, KVBM_EIO); /* nobody there */
  /* a subject with '*' inside a token is a literal one */
  kvbm_subscriber *s = subscribe("kv.w*x", NULL, NULL);
  kvbm_subscriber_destroy(s);
}

int main(void) {
  if (!nt_installed()) {
    printf("nats-server not installed: skipped\n");
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_in_order),   cmocka_unit_test(test_gap_replayed),
      cmocka_unit_test(test_gap_partly_replayed), cmocka_unit_test(test_gap_lost),
      cmocka_unit_test(test_restart),    cmocka_unit_test(test_stray),
      cmocka_unit_test(test_malformed),  cmocka_unit_test(test_budget),
      cmocka_unit_test(test_raw),        cmocka_unit_test(test_options),
  };
  return cmocka_run_group_tests(tests, start_server, stop_server);
}
