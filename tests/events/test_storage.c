/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_storage.c: storage events (kvbm/storage_events.h). The codec round
 * trips and refuses every malformed kind (truncation at every byte, every
 * byte corrupted, absurd counts, bad fields, trailing bytes) without a
 * crash; the publisher batches by size and by period, numbers batches and
 * events densely, drops and counts when full; over ZMQ a late subscriber
 * (raw mode) recovers earlier batches through replay; over a real
 * nats-server every batch arrives with its Kvbm-Seq header.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvbm/storage_events.h"
#include "common/nats_testutil.h"

static const uint8_t kMeta[] = {0x82, 0xa4, 't', 'i', 'e', 'r', 0xa2, 'G', '3',
                                0xa4, 'z', 'o', 'n', 'e', 0x07};

static kvbm_storage_event ev(int i) {
  kvbm_storage_event e = {.type = i % 3 == 2 ? KVBM_STORAGE_REMOVE : KVBM_STORAGE_STORE,
                          .event_id = (uint64_t)i + 1,
                          .sequence_hash = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1),
                          .prefix_hash = (uint64_t)i / 4 * 1000003,
                          .block_size = 2u << 20,
                          .location = i % 2 ? "disk:///var/kvbm" : "host",
                          .tier = -1};
  e.location_len = strlen(e.location);
  if (i % 4 == 1) {
    e.extra_metadata = kMeta;
    e.extra_metadata_len = sizeof kMeta;
  } else if (i % 4 == 2) {
    e.tier = KVBM_TIER_G2;
  }
  return e;
}

static void encode(const kvbm_storage_event *evs, size_t n, uint8_t **buf, size_t *len) {
  size_t cap = 0;
  *buf = NULL;
  *len = 0;
  kvbm_storage_batch b = {.ts = 1.5, .source = "worker-7", .source_len = 8, .events = evs, .num_events = n};
  kvbm_error err = {0};
  assert_int_equal(kvbm_storage_encode(&b, buf, len, &cap, &err), KVBM_OK);
}

static void test_round_trip(void **state) {
  (void)state;
  kvbm_storage_event evs[12];
  for (int i = 0; i < 12; i++) evs[i] = ev(i);
  uint8_t *buf;
  size_t len;
  encode(evs, 12, &buf, &len);
  assert_true(len < 12 * 100); /* the seed's "about 100 bytes" an event */
  kvbm_storage_decoder *d;
  kvbm_error err = {0};
  assert_int_equal(kvbm_storage_decoder_create(&d, &err), KVBM_OK);
  kvbm_storage_batch b;
  assert_int_equal(kvbm_storage_decode(d, buf, len, 42, &b, &err), KVBM_OK);
  assert_int_equal(b.seq, 42);
  assert_true(b.ts == 1.5);
  assert_int_equal(b.num_events, 12);
  assert_int_equal(b.source_len, 8);
  assert_memory_equal(b.source, "worker-7", 8);
  for (int i = 0; i < 12; i++) {
    const kvbm_storage_event *x = &b.events[i];
    assert_int_equal(x->type, evs[i].type);
    assert_int_equal(x->event_id, evs[i].event_id);
    assert_int_equal(x->sequence_hash, evs[i].sequence_hash);
    assert_int_equal(x->prefix_hash, evs[i].prefix_hash);
    assert_int_equal(x->block_size, evs[i].block_size);
    assert_int_equal(x->location_len, evs[i].location_len);
    assert_memory_equal(x->location, evs[i].location, x->location_len);
    if (i % 4 == 1) {
      assert_int_equal(x->tier, KVBM_TIER_G3);
      assert_int_equal(x->extra_metadata_len, sizeof kMeta);
      assert_memory_equal(x->extra_metadata, kMeta, sizeof kMeta);
    } else if (i % 4 == 2) {
      assert_int_equal(x->tier, KVBM_TIER_G2); /* written as {"tier": "G2"} */
      assert_non_null(x->extra_metadata);
    } else {
      assert_int_equal(x->tier, -1);
      assert_null(x->extra_metadata);
    }
  }
  char json[512];
  size_t n = kvbm_storage_event_to_json(&b.events[1], json, sizeof json);
  assert_true(n < sizeof json);
  assert_non_null(strstr(json, "\"type\":\"Store\""));
  assert_non_null(strstr(json, "\"tier\":\"G3\""));
  assert_non_null(strstr(json, "\"extra_metadata\":{\"tier\":\"G3\",\"zone\":7}"));
  assert_non_null(strstr(json, "\"storage_location\":\"disk:///var/kvbm\""));
  /* Empty batch, no source. */
  size_t cap = 0;
  free(buf);
  buf = NULL;
  len = 0;
  kvbm_storage_batch e0 = {0};
  assert_int_equal(kvbm_storage_encode(&e0, &buf, &len, &cap, &err), KVBM_OK);
  assert_int_equal(kvbm_storage_decode(d, buf, len, 0, &b, &err), KVBM_OK);
  assert_int_equal(b.num_events, 0);
  free(buf);
  kvbm_storage_decoder_destroy(d);
}

/* Every prefix of a valid payload is refused; every single corrupted byte
 * either decodes or is refused, never a crash (ASan watches). */
static void test_truncation_and_corruption(void **state) {
  (void)state;
  kvbm_storage_event evs[5];
  for (int i = 0; i < 5; i++) evs[i] = ev(i);
  uint8_t *buf;
  size_t len;
  encode(evs, 5, &buf, &len);
  kvbm_storage_decoder *d;
  kvbm_storage_decoder_create(&d, NULL);
  kvbm_storage_batch b;
  kvbm_error err;
  for (size_t cut = 0; cut < len; cut++) {
    uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any overread */
    memcpy(copy, buf, cut);
    if (kvbm_storage_decode(d, copy, cut, 0, &b, &err) == KVBM_OK) fail_msg("a %zu-byte prefix decoded", cut);
    free(copy);
  }
  uint8_t *copy = malloc(len);
  for (size_t i = 0; i < len; i++)
    for (int v = 0; v < 256; v += 17) {
      memcpy(copy, buf, len);
      copy[i] = (uint8_t)v;
      (void)kvbm_storage_decode(d, copy, len, 0, &b, &err);
    }
  free(copy);
  /* trailing bytes */
  uint8_t *more = malloc(len + 1);
  memcpy(more, buf, len);
  more[len] = 0xc0;
  assert_int_equal(kvbm_storage_decode(d, more, len + 1, 0, &b, &err), KVBM_EFORMAT);
  assert_non_null(strstr(err.msg, "trailing"));
  free(more);
  free(buf);
  kvbm_storage_decoder_destroy(d);
}

static void expect_refused(const void *p, size_t n, const char *why) {
  kvbm_storage_decoder *d;
  kvbm_storage_decoder_create(&d, NULL);
  kvbm_storage_batch b;
  kvbm_error err = {0};
  int rc = kvbm_storage_decode(d, p, n, 0, &b, &err);
  if (rc == KVBM_OK) fail_msg("decoded, wanted a refusal naming '%s'", why);
  if (!strstr(err.msg, why)) fail_msg("refusal '%s' does not name '%s'", err.msg, why);
  kvbm_storage_decoder_destroy(d);
}

#define HDR 0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0 /* [ts, */
static void test_refusals(void **state) {
  (void)state;
  /* a batch claiming 2^32 - 1 events in a few bytes */
  expect_refused((uint8_t[]){HDR, 0xdd, 0xff, 0xff, 0xff, 0xff, 0xa0}, 16, "claims more");
  expect_refused((uint8_t[]){HDR, 0xdd, 0, 0, 0, 3, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0}, 20, "cannot fit");
  expect_refused((uint8_t[]){0x92, 0xc0, 0x90}, 3, "ts");
  expect_refused((uint8_t[]){0xc1}, 1, "not an array");
  expect_refused((uint8_t[]){HDR, 0x91, 0x96, 0xa5, 'S', 't', 'o', 'r', 'e', 1, 2, 3, 4, 0xa1, 'v', 0xa0},
                 26, "7");
  uint8_t tag[] = {HDR, 0x91, 0x97, 0xa4, 'M', 'o', 'v', 'e', 1, 2, 3, 4, 0xa1, 'v', 0xc0, 0xa0};
  expect_refused(tag, sizeof tag, "unknown tag");
  uint8_t neg[] = {HDR, 0x91, 0x97, 0xa5, 'S', 't', 'o', 'r', 'e', 1, 0xff, 3, 4, 0xa1, 'v', 0xc0, 0xa0};
  expect_refused(neg, sizeof neg, "sequence_hash");
  uint8_t empty_loc[] = {HDR, 0x91, 0x97, 0xa5, 'S', 't', 'o', 'r', 'e', 1, 2, 3, 4, 0xa0, 0xc0, 0xa0};
  expect_refused(empty_loc, sizeof empty_loc, "storage_location");
  uint8_t ctl_loc[] = {HDR, 0x91, 0x97, 0xa5, 'S', 't', 'o', 'r', 'e', 1, 2, 3, 4, 0xa2, 'v', '\n', 0xc0, 0xa0};
  expect_refused(ctl_loc, sizeof ctl_loc, "control");
  uint8_t nested[] = {HDR, 0x91, 0x97, 0xa5, 'S', 't', 'o', 'r', 'e', 1, 2, 3, 4, 0xa1, 'v',
                      0x81, 0xa1, 'k', 0x90, 0xa0};
  expect_refused(nested, sizeof nested, "not a scalar");
  uint8_t tier[] = {HDR, 0x91, 0x97, 0xa5, 'S', 't', 'o', 'r', 'e', 1, 2, 3, 4, 0xa1, 'v',
                    0x81, 0xa4, 't', 'i', 'e', 'r', 0xa2, 'G', '9', 0xa0};
  expect_refused(tier, sizeof tier, "tier");
  uint8_t not_map[] = {HDR, 0x91, 0x97, 0xa5, 'S', 't', 'o', 'r', 'e', 1, 2, 3, 4, 0xa1, 'v', 0x05, 0xa0};
  expect_refused(not_map, sizeof not_map, "not a map");
  /* a metadata map of 17 entries */
  uint8_t many[128] = {HDR, 0x91, 0x97, 0xa5, 'S', 't', 'o', 'r', 'e', 1, 2, 3, 4, 0xa1, 'v', 0xde, 0, 17};
  size_t k = 27;
  for (int i = 0; i < 17; i++) many[k++] = 0xa1, many[k++] = (uint8_t)('a' + i), many[k++] = 0;
  many[k++] = 0xa0;
  expect_refused(many, k, "16 entries");
  /* a 100000-deep nesting in an extra field: skipped without recursion */
  size_t dn = 40 + 100000;
  uint8_t *deep = calloc(dn, 1);
  uint8_t pre[] = {0x94, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0xa0};
  memcpy(deep, pre, sizeof pre);
  for (size_t i = sizeof pre; i < dn; i++) deep[i] = 0x91;
  expect_refused(deep, dn, "truncated");
  free(deep);
  /* encoder refusals */
  kvbm_storage_event e = ev(0);
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  kvbm_error err = {0};
  kvbm_storage_batch b = {.events = &e, .num_events = 1};
  e.type = 7;
  assert_int_equal(kvbm_storage_encode(&b, &buf, &len, &cap, &err), KVBM_EINVAL);
  e = ev(0);
  e.location_len = 0;
  assert_int_equal(kvbm_storage_encode(&b, &buf, &len, &cap, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "storage_location"));
  e = ev(0);
  e.extra_metadata = (const uint8_t *)"\x91\x01";
  e.extra_metadata_len = 2;
  assert_int_equal(kvbm_storage_encode(&b, &buf, &len, &cap, &err), KVBM_EINVAL);
  assert_int_equal(len, 0);
  free(buf);
}

/* ---- the publisher ---- */

typedef struct seen {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t batches, events, next_seq, next_id;
  size_t sizes[64];
  bool hold;       /* the callback waits while set */
  bool bad;
} seen;

static void on_batch(void *user, const kvbm_storage_batch *b, const uint8_t *payload, size_t len) {
  seen *s = user;
  pthread_mutex_lock(&s->mu);
  while (s->hold) pthread_cond_wait(&s->cv, &s->mu);
  /* the payload decodes to the batch */
  kvbm_storage_decoder *d;
  kvbm_storage_decoder_create(&d, NULL);
  kvbm_storage_batch x;
  if (kvbm_storage_decode(d, payload, len, b->seq, &x, NULL) || x.num_events != b->num_events) s->bad = true;
  kvbm_storage_decoder_destroy(d);
  if (b->seq != s->next_seq) s->bad = true;
  for (size_t i = 0; i < b->num_events; i++)
    if (b->events[i].event_id != ++s->next_id) s->bad = true;
  if (s->batches < 64) s->sizes[s->batches] = b->num_events;
  s->next_seq++;
  s->batches++;
  s->events += b->num_events;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static bool wait_events(seen *s, uint64_t n, int seconds) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += seconds;
  pthread_mutex_lock(&s->mu);
  while (s->events < n)
    if (pthread_cond_timedwait(&s->cv, &s->mu, &dl)) break;
  bool ok = s->events >= n;
  pthread_mutex_unlock(&s->mu);
  return ok;
}

static kvbm_storage_publisher *make_pub(uint32_t period_ms, size_t batch, size_t queue, seen *s) {
  kvbm_storage_publisher_config c = kvbm_storage_publisher_config_default();
  c.period_ms = period_ms;
  c.max_batch_events = batch;
  c.queue_events = queue;
  c.source = "w1";
  kvbm_storage_publisher *p;
  kvbm_error err = {0};
  assert_int_equal(kvbm_storage_publisher_create(&c, &p, &err), KVBM_OK);
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  assert_int_equal(kvbm_storage_publisher_add_callback(p, on_batch, s, &err), KVBM_OK);
  return p;
}

static void test_publisher_batches(void **state) {
  (void)state;
  seen s;
  kvbm_error err = {0};
  /* By size: a period far away, batches of 3. */
  kvbm_storage_publisher *p = make_pub(600000, 3, 64, &s);
  kvbm_storage_event e = ev(0);
  assert_int_equal(kvbm_storage_publish(p, &e, NULL, &err), KVBM_ESTATE);
  assert_int_equal(kvbm_storage_publisher_start(p, &err), KVBM_OK);
  uint64_t id = 0;
  for (int i = 0; i < 7; i++) {
    e = ev(i);
    assert_int_equal(kvbm_storage_publish(p, &e, &id, &err), KVBM_OK);
    assert_int_equal(id, (uint64_t)i + 1);
  }
  assert_true(wait_events(&s, 6, 30)); /* two full batches leave by size */
  assert_int_equal(kvbm_storage_publisher_flush(p, 30000, &err), KVBM_OK); /* the seventh */
  pthread_mutex_lock(&s.mu);
  assert_int_equal(s.events, 7);
  assert_int_equal(s.batches, 3);
  assert_int_equal(s.sizes[0], 3);
  assert_int_equal(s.sizes[1], 3);
  assert_int_equal(s.sizes[2], 1);
  assert_false(s.bad);
  pthread_mutex_unlock(&s.mu);
  /* refused fields are named and take no id */
  e = ev(0);
  e.location_len = 0;
  assert_int_equal(kvbm_storage_publish(p, &e, NULL, &err), KVBM_EINVAL);
  kvbm_storage_publisher_stats st;
  kvbm_storage_publisher_stats_get(p, &st);
  assert_int_equal(st.published, 7);
  assert_int_equal(st.batches, 3);
  kvbm_storage_publisher_destroy(p);

  /* By period: one event leaves on its own after 200 ms (waited for up to
   * 30 s: the machine may be slow, never fast). */
  p = make_pub(200, 4096, 65536, &s);
  assert_int_equal(kvbm_storage_publisher_start(p, &err), KVBM_OK);
  e = ev(0);
  assert_int_equal(kvbm_storage_publish(p, &e, NULL, &err), KVBM_OK);
  assert_true(wait_events(&s, 1, 30));
  kvbm_storage_publisher_destroy(p);

  /* Destroy sends what was accepted. */
  p = make_pub(600000, 4096, 65536, &s);
  assert_int_equal(kvbm_storage_publisher_start(p, &err), KVBM_OK);
  for (int i = 0; i < 100; i++) {
    e = ev(i);
    assert_int_equal(kvbm_storage_publish(p, &e, NULL, &err), KVBM_OK);
  }
  kvbm_storage_publisher_destroy(p);
  assert_int_equal(s.events, 100);
  assert_false(s.bad);
}

static void test_publisher_drop(void **state) {
  (void)state;
  seen s;
  kvbm_error err = {0};
  kvbm_storage_publisher *p = make_pub(600000, 2, 4, &s);
  s.hold = true; /* the thread will sit in the callback */
  assert_int_equal(kvbm_storage_publisher_start(p, &err), KVBM_OK);
  kvbm_storage_event e = ev(0);
  int accepted = 0, dropped = 0;
  for (int i = 0; i < 40; i++) {
    int rc = kvbm_storage_publish(p, &e, NULL, &err);
    if (rc == KVBM_OK) accepted++;
    else if (rc == KVBM_EAGAIN) dropped++;
    else fail_msg("publish: %s", err.msg);
  }
  /* at most one batch in the callback and a full queue: the rest dropped */
  assert_true(accepted <= 2 + 4);
  assert_int_equal(accepted + dropped, 40);
  kvbm_storage_publisher_stats st;
  kvbm_storage_publisher_stats_get(p, &st);
  assert_int_equal(st.dropped, (uint64_t)dropped);
  assert_int_equal(st.published, (uint64_t)accepted);
  pthread_mutex_lock(&s.mu);
  s.hold = false;
  pthread_cond_broadcast(&s.cv);
  pthread_mutex_unlock(&s.mu);
  kvbm_storage_publisher_destroy(p);
  assert_int_equal(s.events, (uint64_t)accepted);
  assert_false(s.bad); /* ids dense: dropped events took none */
  kvbm_storage_publisher_config c = kvbm_storage_publisher_config_default();
  c.queue_events = 1;
  c.max_batch_events = 2;
  assert_int_equal(kvbm_storage_publisher_create(&c, &p, &err), KVBM_EINVAL);
}

/* ZMQ: a subscriber joining late asks for replay from batch 0 and gets
 * every batch, decoded with the storage codec (raw mode). */
static void test_zmq_replay(void **state) {
  (void)state;
  kvbm_storage_publisher_config c = kvbm_storage_publisher_config_default();
  c.max_batch_events = 5;
  kvbm_storage_publisher *p;
  kvbm_error err = {0};
  assert_int_equal(kvbm_storage_publisher_create(&c, &p, &err), KVBM_OK);
  kvbm_zmq_sink_config z = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  z.replay_endpoint = "tcp://127.0.0.1:*";
  assert_int_equal(kvbm_storage_publisher_add_zmq(p, &z, &err), KVBM_OK);
  char pub_ep[128], rep_ep[128];
  assert_int_equal(kvbm_storage_publisher_zmq_endpoint(p, 0, false, pub_ep, sizeof pub_ep), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_zmq_endpoint(p, 0, true, rep_ep, sizeof rep_ep), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_start(p, &err), KVBM_OK);
  for (int i = 0; i < 20; i++) {
    kvbm_storage_event e = ev(i);
    assert_int_equal(kvbm_storage_publish(p, &e, NULL, &err), KVBM_OK);
  }
  assert_int_equal(kvbm_storage_publisher_flush(p, 30000, &err), KVBM_OK); /* 4 batches out, unseen */
  kvbm_subscriber_config sc = kvbm_subscriber_config_default(pub_ep);
  sc.replay_endpoint = rep_ep;
  sc.start_seq = 0;
  sc.raw = true;
  sc.replay_timeout_ms = 20000;
  kvbm_subscriber *sub;
  assert_int_equal(kvbm_subscriber_create(&sc, &sub, &err), KVBM_OK);
  kvbm_storage_decoder *d;
  kvbm_storage_decoder_create(&d, NULL);
  uint64_t next_id = 1;
  int batches = 0;
  for (int tries = 0; batches < 4 && tries < 600; tries++) {
    kvbm_event_batch b;
    const uint8_t *payload;
    size_t len;
    int rc = kvbm_subscriber_recv_raw(sub, 100, &b, &payload, &len, &err);
    if (rc == KVBM_ETIMEDOUT) continue;
    assert_int_equal(rc, KVBM_OK);
    assert_int_equal(b.num_events, 0); /* raw: not KV events */
    assert_int_equal(b.seq, (uint64_t)batches);
    kvbm_storage_batch sb;
    assert_int_equal(kvbm_storage_decode(d, payload, len, b.seq, &sb, &err), KVBM_OK);
    assert_int_equal(sb.num_events, 5);
    for (size_t k = 0; k < sb.num_events; k++) assert_int_equal(sb.events[k].event_id, next_id++);
    batches++;
  }
  assert_int_equal(batches, 4);
  kvbm_subscriber_stats ss;
  kvbm_subscriber_stats_get(sub, &ss);
  assert_int_equal(ss.replayed, 4);
  assert_int_equal(ss.lost, 0);
  kvbm_storage_decoder_destroy(d);
  kvbm_subscriber_destroy(sub);
  kvbm_storage_publisher_destroy(p);
}

/* ---- NATS ---- */

static void test_nats(void **state) {
  (void)state;
  if (!nt_installed()) skip();
  nt_server srv;
  assert_int_equal(nt_start(&srv, false), 0);
  const char *url = srv.url;
  natsConnection *nc = NULL;
  assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
  natsSubscription *ns;
  assert_int_equal(natsConnection_SubscribeSync(&ns, nc, "kvbm.storage"), NATS_OK);
  assert_int_equal(natsConnection_FlushTimeout(nc, 5000), NATS_OK);
  kvbm_storage_publisher_config c = kvbm_storage_publisher_config_default();
  c.max_batch_events = 4;
  kvbm_storage_publisher *p;
  kvbm_error err = {0};
  assert_int_equal(kvbm_storage_publisher_create(&c, &p, &err), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_add_nats(p, url, "kvbm.storage", &err), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_start(p, &err), KVBM_OK);
  for (int i = 0; i < 12; i++) {
    kvbm_storage_event e = ev(i);
    assert_int_equal(kvbm_storage_publish(p, &e, NULL, &err), KVBM_OK);
  }
  assert_int_equal(kvbm_storage_publisher_flush(p, 30000, &err), KVBM_OK);
  kvbm_storage_decoder *d;
  kvbm_storage_decoder_create(&d, NULL);
  uint64_t next_id = 1;
  for (int k = 0; k < 3; k++) {
    natsMsg *m = NULL;
    assert_int_equal(natsSubscription_NextMsg(&m, ns, 30000), NATS_OK);
    const char *seq = NULL;
    assert_int_equal(natsMsgHeader_Get(m, "Kvbm-Seq", &seq), NATS_OK);
    assert_int_equal(strtoull(seq, NULL, 10), (unsigned long long)k);
    kvbm_storage_batch b;
    assert_int_equal(kvbm_storage_decode(d, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), k, &b, &err),
                     KVBM_OK);
    assert_int_equal(b.num_events, 4);
    for (size_t i = 0; i < 4; i++) assert_int_equal(b.events[i].event_id, next_id++);
    natsMsg_Destroy(m);
  }
  kvbm_storage_decoder_destroy(d);
  kvbm_storage_publisher_destroy(p);
  natsSubscription_Destroy(ns);
  natsConnection_Destroy(nc);
  nt_stop(&srv);
  nats_Close();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_truncation_and_corruption),
      cmocka_unit_test(test_refusals),         cmocka_unit_test(test_publisher_batches),
      cmocka_unit_test(test_publisher_drop),   cmocka_unit_test(test_zmq_replay),
      cmocka_unit_test(test_nats),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
