/* SPDX-License-Identifier: Apache-2.0 */
/* test_slow_reader.c: a subscriber far slower than its publisher (it
 * sleeps between receives) behind the default byte budget (a SUB queue of
 * 8 messages) and a publisher whose PUB never drops (hwm = 0): what
 * events.md promises is that a full SUB queue pushes back on the TCP
 * connection, so nothing is lost; and were anything lost, every lost batch
 * must be counted (gaps, lost, lost_before) or recovered by replay. The
 * test checks both: every batch arrives, once, in order, and the counters
 * agree with what arrived. A second run with a small PUB hwm makes the
 * publisher drop for real: then every batch is either delivered (live or
 * replayed) or counted lost, none silently. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "kvbm/events.h"

static uint64_t NB = 600;      /* batches of the run */
static uint32_t NTOK = 16384;  /* tokens a batch: 64 KiB, or 16 (small) */

static kvbm_publisher *start_pub(int hwm, size_t replay_batches, char *ep, char *rep) {
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 1;
  o.max_batch_delay_us = 0;
  kvbm_publisher *p;
  kvbm_error err;
  if (kvbm_publisher_create(&o, &p, &err)) fail_msg("%s", err.msg);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.hwm = hwm;
  zo.replay_endpoint = "tcp://127.0.0.1:*";
  zo.replay_batches = replay_batches;
  if (kvbm_publisher_add_zmq(p, &zo, &err)) fail_msg("%s", err.msg);
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, false, ep, 256), KVBM_OK);
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, true, rep, 256), KVBM_OK);
  if (kvbm_publisher_start(p, &err)) fail_msg("%s", err.msg);
  return p;
}

/* Batch i: one BlockStored of hash i with NTOK tokens: at 64 KiB the
 * kernel's socket buffers hold few batches and push-back on TCP is
 * exercised at once; small batches fill libzmq's own buffers first. */
static void publish_all(kvbm_publisher *p) {
  static uint32_t tok[16384];
  for (uint64_t i = 0; i < NB; i++) {
    tok[0] = (uint32_t)i;
    assert_int_equal(kvbm_publisher_publish_stored(p, &i, 1, NULL, tok, NTOK, NTOK, NULL,
                                                   KVBM_MEDIUM_GPU, NULL, NULL),
                     KVBM_OK);
  }
  assert_int_equal(kvbm_publisher_flush(p, 30000, NULL), KVBM_OK);
}

static void nap_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* The writer runs beside the reader, as an engine does, and starts once
 * the subscriber had time to connect and subscribe (were it late, its
 * start_seq = 0 replay would cover the start, and the test would say so:
 * replayed counts it). */
static void *writer(void *p) {
  nap_us(300000);
  publish_all(p);
  return NULL;
}

typedef struct tally {
  uint64_t delivered, replayed, lost_before, next_hash;
  bool in_order;
} tally;

/* Reads until every batch is accounted for (delivered or reported lost),
 * sleeping `nap` us after each receive. */
static void read_slowly(kvbm_subscriber *s, long nap, tally *t) {
  *t = (tally){.in_order = true};
  int idle = 0;
  while (t->next_hash < NB && idle < 30) {
    kvbm_event_batch b;
    kvbm_error err;
    int rc = kvbm_subscriber_recv(s, 100, &b, &err);
    if (rc == KVBM_ETIMEDOUT) {
      idle++;
      continue;
    }
    if (rc) fail_msg("recv: %s", err.msg);
    idle = 0;
    assert_int_equal(b.num_events, 1);
    uint64_t h = b.events[0].block_hashes[0];
    /* the hash says which batch this is: those before it that never came
     * must be exactly the ones reported lost just before it */
    if (h != t->next_hash + b.lost_before) t->in_order = false;
    t->lost_before += b.lost_before;
    t->delivered++;
    t->replayed += b.replayed;
    t->next_hash = h + 1;
    nap_us(nap);
  }
}

/* PUB hwm 0 (never drops) and the default subscriber budget: a reader
 * ~100x slower than the writer loses nothing, with large batches and with
 * small ones. */
static void slow_reader_loses_nothing(uint64_t nb, uint32_t ntok, long nap) {
  NB = nb;
  NTOK = ntok;
  char ep[256], rep[256];
  kvbm_publisher *p = start_pub(0, 16, ep, rep);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.replay_endpoint = rep;
  so.start_seq = 0;
  kvbm_subscriber *s;
  kvbm_error err;
  if (kvbm_subscriber_create(&so, &s, &err)) fail_msg("%s", err.msg);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, writer, p), 0);
  tally t;
  read_slowly(s, nap, &t);
  pthread_join(th, NULL);
  kvbm_subscriber_stats ss;
  kvbm_subscriber_stats_get(s, &ss);
  print_message("slow reader, hwm 0, %u tokens: delivered %llu replayed %llu lost %llu gaps %llu "
                "overflow %llu\n", ntok, (unsigned long long)t.delivered, (unsigned long long)t.replayed,
                (unsigned long long)ss.lost, (unsigned long long)ss.gaps,
                (unsigned long long)ss.overflow);
  assert_true(t.in_order);
  assert_int_equal(t.next_hash, NB);
  assert_int_equal(t.lost_before, 0);
  assert_int_equal(ss.lost, 0);
  assert_int_equal(ss.overflow, 0);
  assert_int_equal(ss.gaps, 0);      /* not even a recovered drop */
  assert_int_equal(t.delivered, NB);
  kvbm_subscriber_destroy(s);
  kvbm_publisher_destroy(p);
}

static void test_slow_reader_large_batches(void **st) {
  (void)st;
  slow_reader_loses_nothing(600, 16384, 2000);
}

static void test_slow_reader_small_batches(void **st) {
  (void)st;
  slow_reader_loses_nothing(6000, 16, 200);
}

/* PUB hwm 4 and a replay buffer of 16: the publisher drops for real while
 * the reader sleeps. Every batch is delivered (live or replayed) or
 * reported lost, and the counters say so: nothing disappears silently. */
static void test_dropped_batches_all_counted(void **st) {
  (void)st;
  NB = 600;
  NTOK = 16384;
  char ep[256], rep[256];
  kvbm_publisher *p = start_pub(4, 16, ep, rep);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.replay_endpoint = rep;
  so.start_seq = 0;
  kvbm_subscriber *s;
  kvbm_error err;
  if (kvbm_subscriber_create(&so, &s, &err)) fail_msg("%s", err.msg);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, writer, p), 0);
  tally t;
  read_slowly(s, 2000, &t);
  pthread_join(th, NULL);
  kvbm_subscriber_stats ss;
  kvbm_subscriber_stats_get(s, &ss);
  print_message("slow reader, hwm 4: delivered %llu replayed %llu lost %llu gaps %llu\n",
                (unsigned long long)t.delivered, (unsigned long long)t.replayed,
                (unsigned long long)ss.lost, (unsigned long long)ss.gaps);
  assert_true(t.in_order);
  assert_int_equal(t.delivered + t.lost_before, t.next_hash);
  assert_int_equal(ss.lost, t.lost_before);
  assert_int_equal(ss.replayed, t.replayed);
  if (t.lost_before) assert_true(ss.gaps > 0);
  kvbm_subscriber_destroy(s);
  kvbm_publisher_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slow_reader_large_batches),
      cmocka_unit_test(test_slow_reader_small_batches),
      cmocka_unit_test(test_dropped_batches_all_counted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
