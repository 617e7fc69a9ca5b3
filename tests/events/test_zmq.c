/* SPDX-License-Identifier: Apache-2.0 */
/* test_zmq.c: our publisher and subscriber over ZMQ on loopback: a late
 * joiner and a subscriber behind a lossy link recover every batch through
 * the replay socket; malformed messages of each kind are counted, reported
 * and skipped; a batch over max_payload is refused and counted with the
 * connection kept; malformed replay requests do not disturb the publisher; ipc
 * works; the relay republishes an engine's stream on our own endpoint. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kvbm/events.h"

/* Waits until a subscriber's subscription reaches an XPUB socket. */
static void wait_subscribed(void *xpub) {
  int to = 10000;
  zmq_setsockopt(xpub, ZMQ_RCVTIMEO, &to, sizeof to);
  uint8_t buf[64];
  do /* a subscribe message (after a reconnect, the old one's unsubscribe first) */
    assert_true(zmq_recv(xpub, buf, sizeof buf, 0) >= 1);
  while (buf[0] != 1);
}

static bool g_legacy; /* start_pub's replay answers in the shape before vLLM #45177 */

static kvbm_publisher *start_pub(const char *ep, const char *rep, size_t replay_batches,
                                 char *pub_ep, char *rep_ep, kvbm_event_form form) {
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 4;
  o.max_batch_delay_us = 60u * 1000 * 1000;
  o.form = form;
  kvbm_publisher *p;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_OK);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default(ep);
  zo.replay_endpoint = rep;
  zo.replay_batches = replay_batches;
  zo.topic = "kv@w1";
  zo.replay_legacy = g_legacy;
  if (kvbm_publisher_add_zmq(p, &zo, &err)) fail_msg("%s", err.msg);
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, false, pub_ep, 256), KVBM_OK);
  if (rep) assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, true, rep_ep, 256), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  return p;
}

/* Publishes batch number i: four BlockStored events with hashes 4i..4i+3. */
static void publish_batch(kvbm_publisher *p, uint64_t i) {
  for (uint64_t k = 0; k < 4; k++) {
    uint64_t h = 4 * i + k;
    uint32_t tok[2] = {(uint32_t)h, 1};
    assert_int_equal(kvbm_publisher_publish_stored(p, &h, 1, NULL, tok, 2, 2, NULL,
                                                   KVBM_MEDIUM_GPU, NULL, NULL),
                     KVBM_OK);
  }
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK);
}

static void expect_batch(kvbm_subscriber *s, uint64_t i, bool *replayed) {
  kvbm_event_batch b;
  kvbm_error err;
  int rc = kvbm_subscriber_recv(s, 5000, &b, &err);
  if (rc) fail_msg("batch %llu: %s", (unsigned long long)i, err.msg);
  assert_int_equal(b.seq, i);
  assert_int_equal(b.lost_before, 0);
  assert_int_equal(b.num_events, 4);
  for (uint64_t k = 0; k < 4; k++) {
    assert_int_equal(b.events[k].type, KVBM_EVENT_STORED);
    assert_true(b.events[k].block_hashes[0] == 4 * i + k);
    assert_int_equal(b.events[k].medium, KVBM_MEDIUM_GPU);
  }
  if (replayed) *replayed = b.replayed;
}

static void late_joiner(const char *ep, const char *rep, kvbm_event_form form) {
  char pub_ep[256], rep_ep[256];
  kvbm_publisher *p = start_pub(ep, rep, 1000, pub_ep, rep_ep, form);
  for (uint64_t i = 0; i < 30; i++) publish_batch(p, i); /* nobody listens yet */
  kvbm_subscriber_config so = kvbm_subscriber_config_default(pub_ep);
  so.replay_endpoint = rep_ep;
  so.start_seq = 0;
  so.topic = "kv@";
  kvbm_subscriber *s;
  assert_int_equal(kvbm_subscriber_create(&so, &s, NULL), KVBM_OK);
  for (uint64_t i = 0; i < 30; i++) {
    bool rp;
    expect_batch(s, i, &rp);
    assert_true(rp);
  }
  usleep(200000); /* let the subscription reach the publisher */
  for (uint64_t i = 30; i < 40; i++) publish_batch(p, i);
  for (uint64_t i = 30; i < 40; i++) expect_batch(s, i, NULL);
  kvbm_subscriber_stats st;
  kvbm_subscriber_stats_get(s, &st);
  assert_int_equal(st.delivered, 40);
  assert_int_equal(st.replayed, 30);
  assert_int_equal(st.lost, 0);
  assert_int_equal(st.replay_requests, 1);
  /* both reply shapes read: with the topic (default), without (legacy) */
  assert_int_equal(st.replay_topic, g_legacy ? 0 : 30);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.replay_requests, 1);
  kvbm_subscriber_destroy(s);
  kvbm_publisher_destroy(p);
}

static void test_late_joiner_tcp(void **st) {
  (void)st;
  late_joiner("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", KVBM_FORM_POSITIONAL);
}

static void test_late_joiner_ipc(void **st) {
  (void)st;
  char ep[128], rep[128];
  snprintf(ep, sizeof ep, "ipc:///tmp/kvbm-ev-%d.pub", (int)getpid());
  snprintf(rep, sizeof rep, "ipc:///tmp/kvbm-ev-%d.rep", (int)getpid());
  late_joiner(ep, rep, KVBM_FORM_MAP);
  g_legacy = true; /* a server that answers as vLLM did before #45177 */
  late_joiner(ep, rep, KVBM_FORM_MAP);
  g_legacy = false;
}

/* A lossy link: a proxy forwards our publisher's messages to the
 * subscriber but drops some; the subscriber fills the holes by replay. A
 * replay buffer of 8 batches cannot cover an old hole: that shows as lost. */
static void test_lossy_link_replay(void **st) {
  (void)st;
  char pub_ep[256], rep_ep[256];
  kvbm_publisher *p = start_pub("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 8, pub_ep, rep_ep,
                                KVBM_FORM_POSITIONAL);
  void *ctx = zmq_ctx_new();
  void *in = zmq_socket(ctx, ZMQ_SUB);
  zmq_setsockopt(in, ZMQ_SUBSCRIBE, "", 0);
  assert_int_equal(zmq_connect(in, pub_ep), 0);
  int to = 10000; /* fail rather than hang if the proxy hears nothing */
  zmq_setsockopt(in, ZMQ_RCVTIMEO, &to, sizeof to);
  void *out = zmq_socket(ctx, ZMQ_XPUB);
  assert_int_equal(zmq_bind(out, "tcp://127.0.0.1:*"), 0);
  char out_ep[256];
  size_t sz = sizeof out_ep;
  zmq_getsockopt(out, ZMQ_LAST_ENDPOINT, out_ep, &sz);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(out_ep);
  so.replay_endpoint = rep_ep;
  kvbm_subscriber *s;
  assert_int_equal(kvbm_subscriber_create(&so, &s, NULL), KVBM_OK);
  wait_subscribed(out);
  usleep(300000); /* and the proxy's own subscription to our publisher */
  /* batches 0..29; the proxy drops 5, 6, 7 and 20; the subscriber reads
   * as they come (the replay buffer is short) */
  uint64_t next = 0;
  for (uint64_t i = 0; i < 30; i++) {
    publish_batch(p, i);
    zmq_msg_t f[3];
    for (int k = 0; k < 3; k++) {
      zmq_msg_init(&f[k]);
      assert_true(zmq_msg_recv(&f[k], in, 0) >= 0);
    }
    bool drop = i == 5 || i == 6 || i == 7 || i == 20;
    for (int k = 0; k < 3; k++) {
      if (!drop) assert_true(zmq_msg_send(&f[k], out, k < 2 ? ZMQ_SNDMORE : 0) >= 0);
      else zmq_msg_close(&f[k]);
    }
    if (!drop)
      for (; next <= i; next++) expect_batch(s, next, NULL);
  }
  assert_int_equal(next, 30);
  kvbm_subscriber_stats sst;
  kvbm_subscriber_stats_get(s, &sst);
  assert_int_equal(sst.gaps, 2);
  assert_true(sst.replayed >= 4);
  assert_int_equal(sst.lost, 0);
  /* the replay server sends everything it keeps from the start asked for,
   * including the live batch that revealed each gap: only the missing
   * range is taken, so nothing comes twice */
  assert_int_equal(sst.duplicates, 0);
  assert_true(sst.replay_refused >= 2);

  /* Now a hole older than the replay buffer: drop 30..39 and send 40. */
  for (uint64_t i = 30; i < 41; i++) {
    publish_batch(p, i);
    zmq_msg_t f[3];
    for (int k = 0; k < 3; k++) {
      zmq_msg_init(&f[k]);
      assert_true(zmq_msg_recv(&f[k], in, 0) >= 0);
    }
    for (int k = 0; k < 3; k++) {
      if (i == 40) assert_true(zmq_msg_send(&f[k], out, k < 2 ? ZMQ_SNDMORE : 0) >= 0);
      else zmq_msg_close(&f[k]);
    }
  }
  /* The buffer holds 33..40: 30..32 are lost, the rest comes back. */
  kvbm_event_batch b;
  assert_int_equal(kvbm_subscriber_recv(s, 5000, &b, NULL), KVBM_OK);
  assert_int_equal(b.seq, 33);
  assert_int_equal(b.lost_before, 3);
  for (uint64_t i = 34; i <= 40; i++) expect_batch(s, i, NULL);
  kvbm_subscriber_stats_get(s, &sst);
  assert_int_equal(sst.lost, 3);
  kvbm_subscriber_destroy(s);
  zmq_close(in);
  zmq_close(out);
  zmq_ctx_term(ctx);
  kvbm_publisher_destroy(p);
}

/* Malformed messages from a raw PUB: each kind is reported, counted and
 * skipped, and a good message after them still arrives. */
static void send_frames(void *sock, int n, const void *const *data, const size_t *len) {
  for (int i = 0; i < n; i++)
    assert_true(zmq_send(sock, data[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

static void test_malformed_messages(void **st) {
  (void)st;
  void *ctx = zmq_ctx_new();
  void *pub = zmq_socket(ctx, ZMQ_XPUB);
  int one = 1; /* every subscription is reported, a repeated one too */
  zmq_setsockopt(pub, ZMQ_XPUB_VERBOSE, &one, sizeof one);
  assert_int_equal(zmq_bind(pub, "tcp://127.0.0.1:*"), 0);
  char ep[256];
  size_t sz = sizeof ep;
  zmq_getsockopt(pub, ZMQ_LAST_ENDPOINT, ep, &sz);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.max_payload = 1000;
  kvbm_subscriber *s;
  assert_int_equal(kvbm_subscriber_create(&so, &s, NULL), KVBM_OK);
  wait_subscribed(pub);
  /* a payload that fails to decode still uses up its sequence number, so
   * each of those cases has its own */
  const uint8_t seq0[8] = {0}, seq1[8] = {0, 0, 0, 0, 0, 0, 0, 1},
                seq2[8] = {0, 0, 0, 0, 0, 0, 0, 2}, seq3[8] = {0, 0, 0, 0, 0, 0, 0, 3};
  const uint8_t good[] = {0x93, 0x00, 0x91, 0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k',
                          's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0x05};
  static uint8_t big[2001];
  struct {
    int n;
    const void *d[4];
    size_t l[4];
    int want;
    const char *needle;
  } cases[] = {
      {2, {"", seq0}, {0, 8}, KVBM_EFORMAT, "2 frames"},
      {4, {"", seq0, good, "x"}, {0, 8, sizeof good, 1}, KVBM_EFORMAT, "4 frames"},
      {1, {good}, {sizeof good}, KVBM_EFORMAT, "1 frames"},
      {3, {"", seq0, good}, {0, 4, sizeof good}, KVBM_EFORMAT, "4 bytes, expected 8"},
      {3, {"", seq0, "\xc1"}, {0, 8, 1}, KVBM_EFORMAT, "decode"},
      {3, {"", seq1, "\x93\x00"}, {0, 8, 2}, KVBM_ETRUNCATED, "decode"},
      {3, {"", seq2, "\x92\x00\xdd\xff\xff\xff\xff"}, {0, 8, 7}, KVBM_ETRUNCATED, "decode"},
  };
  size_t ncases = sizeof cases / sizeof cases[0];
  for (size_t i = 0; i < ncases; i++) {
    send_frames(pub, cases[i].n, cases[i].d, cases[i].l);
    kvbm_event_batch b;
    kvbm_error err = {0};
    int rc = kvbm_subscriber_recv(s, 5000, &b, &err);
    if (rc != cases[i].want)
      fail_msg("case %zu: got %s (%s)", i, kvbm_status_name(rc), err.msg);
    if (!strstr(err.msg, cases[i].needle))
      fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, cases[i].needle);
  }
  /* a payload over twice max_payload (libzmq's ceiling) never reaches
   * the subscriber's memory: libzmq drops the connection at its header
   * (ZMQ_MAXMSGSIZE), the subscriber reconnects and subscribes again
   * (test_oversized_refused: one under the ceiling is refused and counted,
   * the connection kept) */
  const void *bd[3] = {"", seq3, big};
  size_t bl[3] = {0, 8, sizeof big};
  send_frames(pub, 3, bd, bl);
  for (int t = 0;; t++) { /* the subscriber redials while it waits */
    kvbm_event_batch b;
    assert_int_equal(kvbm_subscriber_recv(s, 50, &b, NULL), KVBM_ETIMEDOUT);
    uint8_t buf[64];
    int n = zmq_recv(pub, buf, sizeof buf, ZMQ_DONTWAIT);
    if (n >= 1 && buf[0] == 1) break;
    assert_true(t < 400);
  }
  const void *gd[3] = {"", seq3, good};
  size_t gl[3] = {0, 8, sizeof good};
  send_frames(pub, 3, gd, gl);
  kvbm_event_batch b;
  assert_int_equal(kvbm_subscriber_recv(s, 5000, &b, NULL), KVBM_OK);
  assert_int_equal(b.seq, 3);
  assert_int_equal(b.lost_before, 0);
  assert_int_equal(b.dp_rank, 5);
  assert_int_equal(b.num_events, 1);
  assert_int_equal(b.events[0].type, KVBM_EVENT_CLEARED);
  kvbm_subscriber_stats sst;
  kvbm_subscriber_stats_get(s, &sst);
  assert_int_equal(sst.malformed, ncases);
  assert_int_equal(sst.bad_frames, 3);
  assert_int_equal(sst.bad_seq, 1);
  assert_int_equal(sst.bad_payload, 3);
  assert_int_equal(sst.too_large, 0);
  assert_true(sst.reconnects >= 1);
  assert_int_equal(sst.delivered, 1);
  kvbm_subscriber_destroy(s);
  zmq_close(pub);
  zmq_ctx_term(ctx);
}

/* A real publisher sends a batch over the subscriber's max_payload: it is
 * refused with its reason (too_large, KVBM_ETOOLONG naming the sizes), the
 * connection stays up, and the next batch arrives, the refused one counted
 * lost before it. (On the code before, libzmq cut the connection at the
 * frame: a reconnect, no refusal counted.) */
static void test_oversized_refused(void **st) {
  (void)st;
  char pub_ep[256], rep_ep[256];
  kvbm_publisher *p = start_pub("tcp://127.0.0.1:*", NULL, 0, pub_ep, rep_ep, KVBM_FORM_MAP);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(pub_ep);
  so.max_payload = 1000;
  so.max_queue_bytes = 64000;
  kvbm_subscriber *s;
  assert_int_equal(kvbm_subscriber_create(&so, &s, NULL), KVBM_OK);
  /* until the subscription is in place, batches are dropped at the PUB */
  kvbm_event_batch b;
  kvbm_error err = {0};
  uint64_t n = 0;
  for (;; n++) {
    assert_true(n < 500);
    publish_batch(p, n);
    if (kvbm_subscriber_recv(s, 100, &b, &err) == KVBM_OK) break;
  }
  n++;
  /* one BlockStored of 300 five-byte tokens: about 1.6 KB */
  uint32_t tok[300];
  for (size_t i = 0; i < 300; i++) tok[i] = 100000 + (uint32_t)i;
  uint64_t h = 99;
  assert_int_equal(kvbm_publisher_publish_stored(p, &h, 1, NULL, tok, 300, 300, NULL,
                                                 KVBM_MEDIUM_GPU, NULL, NULL),
                   KVBM_OK);
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK); /* batch n */
  publish_batch(p, n + 1);
  int rc;
  do /* what the warm-up left on the way, then the big batch */
    rc = kvbm_subscriber_recv(s, 5000, &b, &err);
  while (rc == KVBM_OK && b.seq < n);
  if (rc != KVBM_ETOOLONG) fail_msg("got %s (%s)", kvbm_status_name(rc), err.msg);
  assert_non_null(strstr(err.msg, "over the limit 1000"));
  assert_int_equal(kvbm_subscriber_recv(s, 5000, &b, &err), KVBM_OK);
  assert_int_equal(b.seq, n + 1);
  assert_int_equal(b.lost_before, 1);
  assert_int_equal(b.num_events, 4);
  assert_true(b.events[0].block_hashes[0] == 4 * (n + 1));
  kvbm_subscriber_stats sst;
  kvbm_subscriber_stats_get(s, &sst);
  assert_int_equal(sst.too_large, 1);
  assert_int_equal(sst.malformed, 1);
  assert_int_equal(sst.reconnects, 0);
  assert_int_equal(sst.lost, 1);
  kvbm_subscriber_destroy(s);
  kvbm_publisher_destroy(p);
}

/* The publisher's stats once its thread counted a replay request (it
 * adds its counts after answering), waiting up to 5 s. */
static kvbm_publisher_stats stats_after_replay(kvbm_publisher *p) {
  kvbm_publisher_stats ps;
  for (int i = 0; kvbm_publisher_stats_get(p, &ps), ps.replay_requests == 0 && i < 500; i++)
    usleep(10000);
  return ps;
}

/* Closes a test's DEALER without lingering, and its context. */
static void dealer_close(void *ctx, void *d) {
  int zero = 0;
  zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
  zmq_close(d);
  zmq_ctx_term(ctx);
}

/* Bad replay requests are ignored and counted; a good one still works,
 * answered with the topic (vLLM today: [id, "", topic, seq, payload], end
 * [id, "", "", -1, ""]) or, legacy, without it. */
static void bad_replay_requests(bool legacy) {
  g_legacy = legacy;
  char pub_ep[256], rep_ep[256];
  kvbm_publisher *p = start_pub("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 100, pub_ep, rep_ep,
                                KVBM_FORM_POSITIONAL);
  publish_batch(p, 0);
  publish_batch(p, 1);
  void *ctx = zmq_ctx_new();
  void *d = zmq_socket(ctx, ZMQ_DEALER);
  assert_int_equal(zmq_connect(d, rep_ep), 0);
  zmq_send(d, "", 0, 0);                    /* [id, ""] */
  zmq_send(d, "", 0, ZMQ_SNDMORE);
  zmq_send(d, "abc", 3, 0);                 /* start of 3 bytes */
  zmq_send(d, "x", 1, ZMQ_SNDMORE);
  zmq_send(d, "12345678", 8, 0);            /* delimiter not empty */
  zmq_send(d, "", 0, ZMQ_SNDMORE);          /* a good one: from 1 */
  const uint8_t one[8] = {0, 0, 0, 0, 0, 0, 0, 1};
  zmq_send(d, one, 8, 0);
  int timeout = 5000;
  zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
  uint8_t buf[4096];
  assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 0); /* delimiter */
  if (!legacy) {
    assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 5); /* the topic */
    assert_memory_equal(buf, "kv@w1", 5);
  }
  assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 8);
  assert_memory_equal(buf, one, 8);
  assert_true(zmq_recv(d, buf, sizeof buf, 0) > 0);      /* payload of batch 1 */
  int more = 0;
  size_t ml = sizeof more;
  zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ml);
  assert_int_equal(more, 0);
  assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 0);
  if (!legacy) assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 0); /* empty topic */
  assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 8);
  const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  assert_memory_equal(buf, end, 8);
  assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 0); /* empty payload */
  kvbm_publisher_stats ps = stats_after_replay(p);
  assert_int_equal(ps.replay_bad, 3);
  assert_int_equal(ps.replay_requests, 1);
  dealer_close(ctx, d);
  kvbm_publisher_destroy(p);
  g_legacy = false;
}

static void test_bad_replay_requests(void **st) {
  (void)st;
  bad_replay_requests(false);
  bad_replay_requests(true);
}

/* A producer that keeps full batches coming until told to stop. */
typedef struct streamer {
  kvbm_publisher *p;
  atomic_bool stop, done;
} streamer;

static void *stream_main(void *arg) {
  streamer *sm = arg;
  for (uint64_t h = 1; !atomic_load(&sm->stop); h++) {
    uint32_t tok[2] = {(uint32_t)h, 1};
    if (kvbm_publisher_publish_stored(sm->p, &h, 1, NULL, tok, 2, 2, NULL, KVBM_MEDIUM_GPU, NULL,
                                      NULL))
      break;
  }
  atomic_store(&sm->done, true);
  return NULL;
}

/* A replay request is answered while full batches keep coming: the
 * publisher thread then "streams" (publisher.c, stream_poll_us), waiting
 * on its eventfd alone, and looks at the replay socket at each wake. The
 * delay is a minute and nothing flushes, so only full batches leave, and
 * the producer never pauses while the request waits. */
static void test_replay_while_streaming(void **st) {
  (void)st;
  char pub_ep[256], rep_ep[256];
  kvbm_publisher *p = start_pub("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 64, pub_ep, rep_ep,
                                KVBM_FORM_MAP);
  streamer sm = {.p = p};
  atomic_init(&sm.stop, false);
  atomic_init(&sm.done, false);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, stream_main, &sm), 0);
  kvbm_publisher_stats ps;
  for (int i = 0; kvbm_publisher_stats_get(p, &ps), ps.batches < 1000 && i < 500; i++) usleep(10000);
  assert_true(ps.batches >= 1000); /* streaming by now */
  void *ctx = zmq_ctx_new();
  void *d = zmq_socket(ctx, ZMQ_DEALER);
  assert_int_equal(zmq_connect(d, rep_ep), 0);
  const uint8_t from0[8] = {0};
  zmq_send(d, "", 0, ZMQ_SNDMORE);
  zmq_send(d, from0, 8, 0);
  int timeout = 5000;
  zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
  uint8_t buf[64];
  assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 0);  /* the reply's delimiter, in time */
  assert_false(atomic_load(&sm.done));                    /* while the stream went on */
  atomic_store(&sm.stop, true);
  pthread_join(t, NULL);
  assert_int_equal(zmq_recv(d, buf, sizeof buf, 0), 5);  /* its topic */
  assert_memory_equal(buf, "kv@w1", 5);
  ps = stats_after_replay(p);
  assert_int_equal(ps.replay_requests, 1);
  dealer_close(ctx, d);
  kvbm_publisher_destroy(p);
}

/* Relay: engine (a kvbm publisher, map form) -> relay -> our endpoint
 * (positional form) -> subscriber: same events, new ids, in order. */
static void test_relay_to_zmq(void **st) {
  (void)st;
  char eng_ep[256], eng_rep[256];
  kvbm_publisher *engine = start_pub("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 100, eng_ep,
                                     eng_rep, KVBM_FORM_MAP);
  char out_ep[256], out_rep[256];
  kvbm_publisher *ours = start_pub("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 100, out_ep,
                                   out_rep, KVBM_FORM_POSITIONAL);
  kvbm_subscriber_config src = kvbm_subscriber_config_default(eng_ep);
  src.replay_endpoint = eng_rep;
  src.start_seq = 0;
  kvbm_relay *r;
  assert_int_equal(kvbm_relay_create(&src, ours, &r, NULL), KVBM_OK);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(out_ep);
  so.replay_endpoint = out_rep;
  so.start_seq = 0;
  kvbm_subscriber *s;
  assert_int_equal(kvbm_subscriber_create(&so, &s, NULL), KVBM_OK);
  for (uint64_t i = 0; i < 10; i++) publish_batch(engine, i);
  size_t got = 0;
  for (int t = 0; t < 100 && got < 10; t++) {
    size_t nb;
    int rc = kvbm_relay_poll(r, 100, &nb, NULL);
    assert_true(rc == KVBM_OK || rc == KVBM_ETIMEDOUT);
    got += nb;
  }
  assert_int_equal(got, 10);
  assert_int_equal(kvbm_publisher_flush(ours, 5000, NULL), KVBM_OK);
  /* ours batches by 4 too, so its batches line up with the engine's */
  for (uint64_t i = 0; i < 10; i++) expect_batch(s, i, NULL);
  const kvbm_subscriber *rs = kvbm_relay_subscriber(r);
  kvbm_subscriber_stats rst;
  kvbm_subscriber_stats_get(rs, &rst);
  assert_int_equal(rst.delivered, 10);
  kvbm_subscriber_destroy(s);
  kvbm_relay_destroy(r);
  kvbm_publisher_destroy(ours);
  kvbm_publisher_destroy(engine);
}

static void test_subscriber_bad_options(void **st) {
  (void)st;
  kvbm_subscriber *s;
  kvbm_error err;
  kvbm_subscriber_config so = kvbm_subscriber_config_default(NULL);
  assert_int_equal(kvbm_subscriber_create(&so, &s, &err), KVBM_EINVAL);
  so = kvbm_subscriber_config_default("nonsense");
  assert_int_equal(kvbm_subscriber_create(&so, &s, &err), KVBM_EIO);
  assert_non_null(strstr(err.msg, "nonsense"));
  so = kvbm_subscriber_config_default("tcp://127.0.0.1:1");
  so.start_seq = -2;
  assert_int_equal(kvbm_subscriber_create(&so, &s, &err), KVBM_EINVAL);
  /* a replay endpoint nobody serves: the join replay times out, counted */
  so = kvbm_subscriber_config_default("tcp://127.0.0.1:1");
  so.replay_endpoint = "tcp://127.0.0.1:2";
  so.replay_timeout_ms = 50;
  so.start_seq = 0;
  assert_int_equal(kvbm_subscriber_create(&so, &s, &err), KVBM_OK);
  kvbm_event_batch b;
  assert_int_equal(kvbm_subscriber_recv(s, 10, &b, &err), KVBM_ETIMEDOUT);
  kvbm_subscriber_stats sst;
  kvbm_subscriber_stats_get(s, &sst);
  assert_int_equal(sst.replay_failures, 1);
  kvbm_subscriber_destroy(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_late_joiner_tcp),      cmocka_unit_test(test_late_joiner_ipc),
      cmocka_unit_test(test_lossy_link_replay),    cmocka_unit_test(test_malformed_messages),
      cmocka_unit_test(test_oversized_refused),
      cmocka_unit_test(test_bad_replay_requests),  cmocka_unit_test(test_relay_to_zmq),
      cmocka_unit_test(test_replay_while_streaming),
      cmocka_unit_test(test_subscriber_bad_options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
