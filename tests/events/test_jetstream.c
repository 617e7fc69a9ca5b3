/* SPDX-License-Identifier: Apache-2.0 */
/* test_jetstream.c: the durable event plane against a real nats-server
 * with JetStream (started here on a free loopback port with its store in
 * a fresh directory, stopped at the end):
 *  - the publisher's JetStream sink adds the stream and every batch lands
 *    in it, in order, with its Kvbm-Seq;
 *  - a durable consumer reads part, acks, stops; the publisher goes on;
 *    the consumer, opened again, goes on exactly where it stopped (no
 *    batch twice, none missing) without any replay request;
 *  - batches delivered but not acked before a stop come again at once and
 *    in order; resume_after re-binds at a given stream position;
 *  - two consumers with two names each read the whole stream, and decode
 *    the same batches (replicas);
 *  - the stream survives a server restart (file storage), and bad
 *    messages (no Kvbm-Seq, a payload that does not decode) are errors the
 *    consumer gets past. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvbm/events.h"
#include "common/nats_testutil.h"

static nt_server srv;

static int start_server(void **state) {
  (void)state;
  return nt_start(&srv, true);
}

static int stop_server(void **state) {
  (void)state;
  nt_stop(&srv);
  nats_Close();
  return 0;
}

/* A publisher into stream `stream` on `subject`, one event per batch:
 * batch k's event removes hash `base + k`, of KV cache group hash % 3
 * (hybrid models: the group survives the durable plane). */
static kvbm_publisher *js_publisher(const char *stream, const char *subject) {
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 1;
  o.max_batch_delay_us = 0;
  kvbm_publisher *p;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_OK);
  kvbm_jetstream_config jc = kvbm_jetstream_config_default(srv.url, stream, subject);
  jc.stream_subjects = "kv.>";
  if (kvbm_publisher_add_jetstream(p, &jc, &err)) fail_msg("%s", err.msg);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  return p;
}

static void publish_range(kvbm_publisher *p, uint64_t from, uint64_t to) {
  kvbm_error err;
  for (uint64_t h = from; h < to; h++) {
    kvbm_event ev = {.type = KVBM_EVENT_REMOVED, .block_hashes = &h, .num_block_hashes = 1,
                     .medium = KVBM_MEDIUM_GPU, .group_idx = (int64_t)(h % 3), .has_group_idx = true};
    assert_int_equal(kvbm_publisher_publish(p, &ev, NULL, &err), KVBM_OK);
  }
  assert_int_equal(kvbm_publisher_flush(p, 5000, &err), KVBM_OK);
}

static kvbm_js_consumer *consumer(const char *name, uint64_t resume_after) {
  kvbm_js_consumer_config c = kvbm_js_consumer_config_default(srv.url, "KV", name);
  c.resume_after = resume_after;
  c.fetch = 7; /* several pulls per test */
  kvbm_js_consumer *jc;
  kvbm_error err;
  if (kvbm_js_consumer_create(&c, &jc, &err)) fail_msg("%s", err.msg);
  return jc;
}

/* Reads n batches: batch i must hold the remove of hash first + i, with
 * Kvbm-Seq seq0 + i. */
static void expect_batches(kvbm_js_consumer *c, uint64_t first, uint64_t seq0, int n) {
  for (int i = 0; i < n; i++) {
    kvbm_event_batch b;
    kvbm_js_msg m;
    kvbm_error err;
    int rc = kvbm_js_consumer_recv(c, 5000, &b, &m, &err);
    if (rc) fail_msg("batch %d of %d: %s", i, n, err.msg);
    assert_int_equal(b.num_events, 1);
    assert_int_equal(b.events[0].type, KVBM_EVENT_REMOVED);
    assert_true(b.events[0].has_group_idx && b.events[0].group_idx == (int64_t)((first + (uint64_t)i) % 3));
    if (b.events[0].block_hashes[0] != first + (uint64_t)i || b.seq != seq0 + (uint64_t)i)
      fail_msg("batch %d: hash %llu seq %llu, expected %llu and %llu", i,
               (unsigned long long)b.events[0].block_hashes[0], (unsigned long long)b.seq,
               (unsigned long long)(first + (uint64_t)i), (unsigned long long)(seq0 + (uint64_t)i));
    assert_string_equal(m.subject, "kv.w1");
    assert_true(m.stream_seq > 0);
  }
}

static void expect_nothing(kvbm_js_consumer *c) {
  kvbm_event_batch b;
  kvbm_error err;
  assert_int_equal(kvbm_js_consumer_recv(c, 300, &b, NULL, &err), KVBM_ETIMEDOUT);
}

static void test_durable_resume_and_replicas(void **state) {
  (void)state;
  kvbm_publisher *p = js_publisher("KV", "kv.w1");
  publish_range(p, 1000, 1050); /* seq 0..49 */
  /* a router reads 20, acks, stops */
  kvbm_js_consumer *r1 = consumer("router-a", 0);
  expect_batches(r1, 1000, 0, 20);
  kvbm_error err;
  assert_int_equal(kvbm_js_consumer_ack(r1, &err), KVBM_OK);
  kvbm_js_consumer_destroy(r1);
  /* the workers keep publishing while it is away */
  publish_range(p, 1050, 1080); /* seq 50..79 */
  /* back: exactly where it stopped, through to the end, nothing more */
  r1 = consumer("router-a", 0);
  expect_batches(r1, 1020, 20, 60);
  expect_nothing(r1);
  /* read 10 more but ack none, then stop: those 10 come again, now, in order */
  publish_range(p, 1080, 1100); /* seq 80..99 */
  expect_batches(r1, 1080, 80, 10);
  kvbm_js_consumer_stats st;
  kvbm_js_consumer_stats_get(r1, &st);
  assert_int_equal(st.malformed, 0);
  kvbm_js_consumer_destroy(r1);
  r1 = consumer("router-a", 0);
  kvbm_js_consumer_stats_get(r1, &st);
  assert_int_equal(st.rebinds, 1);
  expect_batches(r1, 1020, 20, 80); /* acked up to seq 19 only */
  expect_nothing(r1);
  assert_int_equal(kvbm_js_consumer_ack(r1, &err), KVBM_OK);
  kvbm_js_consumer_destroy(r1);
  /* a replica with its own name reads the whole stream */
  kvbm_js_consumer *r2 = consumer("router-b", 0);
  expect_batches(r2, 1000, 0, 100);
  expect_nothing(r2);
  kvbm_js_consumer_destroy(r2);
  /* a snapshot that held stream positions up to 60: resume there */
  r2 = consumer("router-b", 60);
  expect_batches(r2, 1060, 60, 40);
  kvbm_js_consumer_destroy(r2);
  /* the stream outlives the server: restart it, read it again */
  kvbm_publisher_destroy(p);
  nt_kill(&srv);
  assert_int_equal(nt_launch(&srv), 0);
  kvbm_js_consumer *r3 = consumer("router-c", 0);
  expect_batches(r3, 1000, 0, 100);
  kvbm_js_consumer_destroy(r3);
}

static void test_bad_messages_and_calls(void **state) {
  (void)state;
  kvbm_publisher *p = js_publisher("KV", "kv.w1"); /* the stream exists: used as it is */
  natsConnection *nc;
  jsCtx *js;
  assert_int_equal(natsConnection_ConnectTo(&nc, srv.url), NATS_OK);
  assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
  jsPubAck *pa = NULL;
  natsMsg *m;
  /* no header; a header that is not a number; a payload that is not msgpack */
  assert_int_equal(natsMsg_Create(&m, "kv.w9", NULL, "x", 1), NATS_OK);
  assert_int_equal(js_PublishMsg(&pa, js, m, NULL, NULL), NATS_OK);
  jsPubAck_Destroy(pa);
  natsMsg_Destroy(m);
  assert_int_equal(natsMsg_Create(&m, "kv.w9", NULL, "x", 1), NATS_OK);
  natsMsgHeader_Set(m, "Kvbm-Seq", "-4");
  assert_int_equal(js_PublishMsg(&pa, js, m, NULL, NULL), NATS_OK);
  jsPubAck_Destroy(pa);
  natsMsg_Destroy(m);
  assert_int_equal(natsMsg_Create(&m, "kv.w9", NULL, "\xc1", 1), NATS_OK);
  natsMsgHeader_Set(m, "Kvbm-Seq", "7");
  assert_int_equal(js_PublishMsg(&pa, js, m, NULL, NULL), NATS_OK);
  jsPubAck_Destroy(pa);
  natsMsg_Destroy(m);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  kvbm_js_consumer_config c = kvbm_js_consumer_config_default(srv.url, "KV", "odd");
  c.filter = "kv.w9";
  kvbm_js_consumer *jc;
  kvbm_error err;
  assert_int_equal(kvbm_js_consumer_create(&c, &jc, &err), KVBM_OK);
  kvbm_event_batch b;
  kvbm_js_msg info;
  assert_int_equal(kvbm_js_consumer_recv(jc, 5000, &b, &info, &err), KVBM_EFORMAT);
  assert_non_null(strstr(err.msg, "Kvbm-Seq"));
  assert_int_equal(kvbm_js_consumer_recv(jc, 5000, &b, &info, &err), KVBM_EFORMAT);
  assert_int_equal(kvbm_js_consumer_recv(jc, 5000, &b, &info, &err), KVBM_EFORMAT);
  assert_string_equal(info.subject, "kv.w9");
  assert_int_equal(kvbm_js_consumer_recv(jc, 200, &b, &info, &err), KVBM_ETIMEDOUT);
  kvbm_js_consumer_stats st;
  kvbm_js_consumer_stats_get(jc, &st);
  assert_int_equal(st.malformed, 3);
  assert_int_equal(kvbm_js_consumer_ack(jc, &err), KVBM_OK);
  kvbm_js_consumer_destroy(jc);
  /* bad configurations */
  c = kvbm_js_consumer_config_default(srv.url, "KV", "a.b");
  assert_int_equal(kvbm_js_consumer_create(&c, &jc, &err), KVBM_EINVAL);
  c = kvbm_js_consumer_config_default(srv.url, "NOPE", "x");
  assert_int_equal(kvbm_js_consumer_create(&c, &jc, &err), KVBM_EIO);
  c = kvbm_js_consumer_config_default(srv.url, NULL, "x");
  assert_int_equal(kvbm_js_consumer_create(&c, &jc, &err), KVBM_EINVAL);
  kvbm_publisher *q;
  kvbm_publisher_config o = kvbm_publisher_config_default();
  assert_int_equal(kvbm_publisher_create(&o, &q, &err), KVBM_OK);
  kvbm_jetstream_config jcfg = kvbm_jetstream_config_default(srv.url, "KV", "kv.*");
  assert_int_equal(kvbm_publisher_add_jetstream(q, &jcfg, &err), KVBM_EINVAL);
  jcfg = kvbm_jetstream_config_default(srv.url, "OTHER", "other.x");
  jcfg.create = false;
  assert_int_equal(kvbm_publisher_add_jetstream(q, &jcfg, &err), KVBM_ENOTFOUND);
  jcfg = kvbm_jetstream_config_default("nats://127.0.0.1:1", "KV", "kv.w1");
  assert_int_equal(kvbm_publisher_add_jetstream(q, &jcfg, &err), KVBM_EIO);
  kvbm_publisher_destroy(q);
  kvbm_publisher_destroy(p);
}

int main(void) {
  if (!nt_installed()) {
    fprintf(stderr, "no %s\n", NT_SERVER);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_durable_resume_and_replicas),
      cmocka_unit_test(test_bad_messages_and_calls),
  };
  return cmocka_run_group_tests(tests, start_server, stop_server);
}
