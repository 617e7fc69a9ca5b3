/* SPDX-License-Identifier: Apache-2.0 */
/* test_nats.c: batches through a real nats-server (started here on a free
 * loopback port, stopped at the end): a NATS subscriber receives every
 * batch, with its sequence header, and the payload decodes to exactly what
 * was published. Also the relay from a ZMQ engine to NATS. */
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
  return nt_start(&srv, false);
}

static int stop_server(void **state) {
  (void)state;
  nt_stop(&srv);
  nats_Close();
  return 0;
}

/* Receives n batches on sub and checks them against the pattern of
 * publish_pattern: batch i holds events 3i, 3i+1, 3i+2. */
static void check_nats(natsSubscription *sub, uint64_t n, uint64_t first_seq) {
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  for (uint64_t i = 0; i < n; i++) {
    natsMsg *m = NULL;
    natsStatus s = natsSubscription_NextMsg(&m, sub, 5000);
    if (s != NATS_OK) fail_msg("batch %llu: %s", (unsigned long long)i, natsStatus_GetText(s));
    const char *seq = NULL;
    assert_int_equal(natsMsgHeader_Get(m, "Kvbm-Seq", &seq), NATS_OK);
    assert_int_equal(strtoull(seq, NULL, 10), first_seq + i);
    kvbm_event_batch b;
    kvbm_error err;
    int rc = kvbm_event_decode(dec, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                               first_seq + i, &b, &err);
    if (rc) fail_msg("%s", err.msg);
    assert_int_equal(b.num_events, 3);
    for (uint64_t k = 0; k < 3; k++) {
      const kvbm_event *e = &b.events[k];
      uint64_t id = 3 * i + k;
      if (k == 2) {
        assert_int_equal(e->type, KVBM_EVENT_REMOVED);
        assert_int_equal(e->medium, KVBM_MEDIUM_DISK);
      } else {
        assert_int_equal(e->type, KVBM_EVENT_STORED);
        assert_int_equal(e->num_tokens, 4);
        assert_int_equal(e->token_ids[3], (uint32_t)id + 3);
        assert_int_equal(e->medium, KVBM_MEDIUM_REMOTE);
      }
      assert_true(e->block_hashes[0] == id * 0x9e3779b97f4a7c15ull);
    }
    natsMsg_Destroy(m);
  }
  kvbm_event_decoder_destroy(dec);
}

static void publish_pattern(kvbm_publisher *p, uint64_t nbatches) {
  for (uint64_t i = 0; i < nbatches; i++) {
    for (uint64_t k = 0; k < 3; k++) {
      uint64_t id = 3 * i + k;
      uint64_t h = id * 0x9e3779b97f4a7c15ull;
      uint32_t tok[4] = {(uint32_t)id, (uint32_t)id + 1, (uint32_t)id + 2, (uint32_t)id + 3};
      int rc = k == 2 ? kvbm_publisher_publish_removed(p, &h, 1, KVBM_MEDIUM_DISK, NULL, NULL)
                      : kvbm_publisher_publish_stored(p, &h, 1, NULL, tok, 4, 4, NULL,
                                                      KVBM_MEDIUM_REMOTE, NULL, NULL);
      assert_int_equal(rc, KVBM_OK);
    }
  }
}

static kvbm_publisher *nats_publisher(kvbm_event_form form) {
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 3;
  o.max_batch_delay_us = 60u * 1000 * 1000;
  o.form = form;
  kvbm_publisher *p;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_OK);
  if (kvbm_publisher_add_nats(p, srv.url, "kvbm.events.w0", &err)) fail_msg("%s", err.msg);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  return p;
}

static void test_nats_roundtrip(void **state) {
  (void)state;
  natsConnection *nc;
  natsSubscription *sub;
  assert_int_equal(natsConnection_ConnectTo(&nc, srv.url), NATS_OK);
  assert_int_equal(natsConnection_SubscribeSync(&sub, nc, "kvbm.events.*"), NATS_OK);
  assert_int_equal(natsConnection_Flush(nc), NATS_OK);
  for (int form = 0; form < 2; form++) {
    kvbm_publisher *p = nats_publisher((kvbm_event_form)form);
    publish_pattern(p, 50);
    kvbm_publisher_destroy(p); /* shutdown flushes to the server */
    check_nats(sub, 50, 0);
  }
  natsSubscription_Destroy(sub);
  natsConnection_Destroy(nc);
}

/* engine (kvbm publisher on ZMQ) -> relay -> NATS */
static void test_relay_to_nats(void **state) {
  (void)state;
  natsConnection *nc;
  natsSubscription *sub;
  assert_int_equal(natsConnection_ConnectTo(&nc, srv.url), NATS_OK);
  assert_int_equal(natsConnection_SubscribeSync(&sub, nc, "kvbm.events.w0"), NATS_OK);
  assert_int_equal(natsConnection_Flush(nc), NATS_OK);
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 3;
  o.max_batch_delay_us = 60u * 1000 * 1000;
  kvbm_publisher *engine;
  assert_int_equal(kvbm_publisher_create(&o, &engine, NULL), KVBM_OK);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.replay_endpoint = "tcp://127.0.0.1:*";
  assert_int_equal(kvbm_publisher_add_zmq(engine, &zo, NULL), KVBM_OK);
  char ep[256], rep[256];
  kvbm_publisher_zmq_endpoint(engine, 0, false, ep, sizeof ep);
  kvbm_publisher_zmq_endpoint(engine, 0, true, rep, sizeof rep);
  assert_int_equal(kvbm_publisher_start(engine, NULL), KVBM_OK);
  kvbm_publisher *out = nats_publisher(KVBM_FORM_MAP);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.replay_endpoint = rep;
  so.start_seq = 0;
  kvbm_relay *r;
  assert_int_equal(kvbm_relay_create(&so, out, &r, NULL), KVBM_OK);
  publish_pattern(engine, 20);
  assert_int_equal(kvbm_publisher_flush(engine, 5000, NULL), KVBM_OK);
  size_t got = 0;
  for (int t = 0; t < 200 && got < 20; t++) {
    size_t nb;
    int rc = kvbm_relay_poll(r, 100, &nb, NULL);
    assert_true(rc == KVBM_OK || rc == KVBM_ETIMEDOUT);
    got += nb;
  }
  assert_int_equal(got, 20);
  assert_int_equal(kvbm_publisher_flush(out, 5000, NULL), KVBM_OK);
  check_nats(sub, 20, 0);
  kvbm_relay_destroy(r);
  kvbm_publisher_destroy(out);
  kvbm_publisher_destroy(engine);
  natsSubscription_Destroy(sub);
  natsConnection_Destroy(nc);
}

static void test_nats_unreachable(void **state) {
  (void)state;
  kvbm_publisher *p;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(NULL, &p, &err), KVBM_OK);
  char bad[64];
  snprintf(bad, sizeof bad, "nats://127.0.0.1:%d", nt_free_port());
  assert_int_equal(kvbm_publisher_add_nats(p, bad, "x", &err), KVBM_EIO);
  assert_non_null(strstr(err.msg, bad));
  kvbm_publisher_destroy(p);
}

int main(void) {
  if (!nt_installed()) {
    fprintf(stderr, "no %s\n", NT_SERVER);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nats_roundtrip),
      cmocka_unit_test(test_relay_to_nats),
      cmocka_unit_test(test_nats_unreachable),
  };
  return cmocka_run_group_tests(tests, start_server, stop_server);
}
