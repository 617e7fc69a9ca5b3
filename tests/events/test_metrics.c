/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_metrics.c: the event plane's collectors (kvbm/metrics.h): a
 * publisher's counters on the page equal its stats after real publishing,
 * a subscriber's, a relay's and a JetStream consumer's snapshots are
 * written with their labels, and every family is
 * in docs/areas/observability.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvbm/events.h"
#include "kvbm/metrics.h"
#include "metrics/page_testutil.h"

static void on_batch(void *user, const kvbm_event_batch *b) {
  (void)user;
  (void)b;
}

static void test_publisher(void **st) {
  (void)st;
  kvbm_publisher_config pc = kvbm_publisher_config_default();
  pc.max_batch_events = 4;
  kvbm_publisher *pub;
  assert_int_equal(kvbm_publisher_create(&pc, &pub, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(pub, on_batch, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(pub, NULL), KVBM_OK);
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  uint64_t id;
  assert_int_equal(kvbm_metrics_register(r, kvbm_publisher_metrics_collect, pub,
                                         (kvbm_metric_label[]){{"engine", "e0"}}, 1, &id, NULL),
                   KVBM_OK);
  for (uint64_t i = 0; i < 10; i++) {
    uint64_t h = 100 + i;
    uint32_t tok[4] = {1, 2, 3, (uint32_t)i};
    assert_int_equal(kvbm_publisher_publish_stored(pub, &h, 1, NULL, tok, 4, 4, NULL,
                                                   KVBM_MEDIUM_GPU, NULL, NULL), KVBM_OK);
  }
  assert_int_equal(kvbm_publisher_flush(pub, 10000, NULL), KVBM_OK);
  kvbm_publisher_stats s;
  kvbm_publisher_stats_get(pub, &s);
  char *t = page_render(r);
  assert_non_null(t);
  assert_true(page_value(t, "kvbm_events_accepted_total{engine=\"e0\"}") == 10);
  assert_true(page_value(t, "kvbm_events_published_total{engine=\"e0\"}") == 10);
  assert_true(page_value(t, "kvbm_event_batches_published_total{engine=\"e0\"}") == s.batches);
  assert_true(s.batches >= 3);
  assert_true(page_value(t, "kvbm_events_dropped_total{engine=\"e0\",reason=\"queue_full\"}") == 0);
  char missing[256];
  if (page_undocumented(t, missing, sizeof missing)) fail_msg("%s is not documented", missing);
  kvbm_metrics_text_free(t);
  /* unregistered before the publisher goes */
  assert_int_equal(kvbm_metrics_unregister(r, id), KVBM_OK);
  kvbm_publisher_destroy(pub);
  t = page_render(r);
  assert_null(strstr(t, "kvbm_events_"));
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

static void sub_collect(void *user, kvbm_metrics_writer *w) {
  kvbm_subscriber_metrics_write(w, user, (kvbm_metric_label[]){{"source", "w\"1"}}, 1);
}

static void test_subscriber(void **st) {
  (void)st;
  kvbm_subscriber_stats s = {.messages = 7, .delivered = 6, .events = 60, .gaps = 2,
                             .replayed = 3, .lost = 1, .malformed = 4, .bad_frames = 1,
                             .bad_seq = 1, .bad_payload = 1, .too_large = 1,
                             .queued_bytes = 512, .peak_bytes = 4096};
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(r, sub_collect, &s, NULL, 0, NULL, NULL), KVBM_OK);
  char *t = page_render(r);
  assert_true(page_value(t, "kvbm_subscriber_messages_total{source=\"w\\\"1\"}") == 7);
  assert_true(page_value(t, "kvbm_subscriber_batches_total{source=\"w\\\"1\"}") == 6);
  assert_true(page_value(t, "kvbm_subscriber_gaps_total{source=\"w\\\"1\"}") == 2);
  assert_true(page_value(t, "kvbm_subscriber_lost_batches_total{source=\"w\\\"1\"}") == 1);
  assert_true(page_value(t, "kvbm_subscriber_malformed_total{reason=\"payload\",source=\"w\\\"1\"}") == 1);
  assert_true(page_value(t, "kvbm_subscriber_peak_queued_bytes{source=\"w\\\"1\"}") == 4096);
  assert_true(page_value(t, "kvbm_metrics_errors_total") == 0);
  char missing[256];
  if (page_undocumented(t, missing, sizeof missing)) fail_msg("%s is not documented", missing);
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

static void relay_collect(void *user, kvbm_metrics_writer *w) {
  kvbm_relay_metrics_write(w, user, (kvbm_metric_label[]){{"engine", "e1"}}, 1);
}

static void js_collect(void *user, kvbm_metrics_writer *w) {
  kvbm_js_consumer_metrics_write(w, user, NULL, 0);
}

/* The relay's and a JetStream consumer's snapshots, written as given (the
 * relay's counters from real traffic: tests/events/test_cli.sh and the
 * Prometheus proof; the consumer's: tests/events/test_jetstream.c). */
static void test_relay_and_js(void **st) {
  (void)st;
  kvbm_relay_stats rs = {.batches = 5, .events = 40, .skipped = 3, .refused = 2};
  kvbm_js_consumer_stats js = {.messages = 9, .delivered = 8, .events = 70, .redelivered = 1,
                               .malformed = 1, .acks = 4, .rebinds = 1};
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(r, relay_collect, &rs, NULL, 0, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(r, js_collect, &js, NULL, 0, NULL, NULL), KVBM_OK);
  char *t = page_render(r);
  assert_true(page_value(t, "kvbm_relay_batches_total{engine=\"e1\"}") == 5);
  assert_true(page_value(t, "kvbm_relay_events_total{engine=\"e1\"}") == 40);
  assert_true(page_value(t, "kvbm_relay_skipped_events_total{engine=\"e1\"}") == 3);
  assert_true(page_value(t, "kvbm_relay_refused_events_total{engine=\"e1\"}") == 2);
  assert_true(page_value(t, "kvbm_js_consumer_messages_total") == 9);
  assert_true(page_value(t, "kvbm_js_consumer_batches_total") == 8);
  assert_true(page_value(t, "kvbm_js_consumer_events_total") == 70);
  assert_true(page_value(t, "kvbm_js_consumer_redelivered_total") == 1);
  assert_true(page_value(t, "kvbm_js_consumer_acks_total") == 4);
  assert_true(page_value(t, "kvbm_js_consumer_rebinds_total") == 1);
  assert_true(page_value(t, "kvbm_metrics_errors_total") == 0);
  char missing[256];
  if (page_undocumented(t, missing, sizeof missing)) fail_msg("%s is not documented", missing);
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_publisher),
      cmocka_unit_test(test_subscriber),
      cmocka_unit_test(test_relay_and_js),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
