/* SPDX-License-Identifier: Apache-2.0 */
/* test_publish_order.c: kvbm_publisher_publish from several threads at
 * once, the contract of events.h: ids are given on acceptance, one after
 * the other with no holes, and the wire carries events in id order, so
 * the k-th event a subscriber reads is the one whose publish returned id
 * k; each thread's own events keep its order; every event arrives whole
 * (its hash, parent, tokens, block size as published).
 *
 * Why a test of its own: a plain event is encoded before the publisher's
 * lock (publish_plain, on the producer's stack) and copied into the batch
 * under it, so the encode order of two threads and their queue order can
 * differ; only the queue order, where the id is given, may show on the
 * wire. The events mix one-block stores and removes (the lean path),
 * events of 3 blocks, events too large for the stack buffer (24 blocks of
 * 16 tokens, encoded under the lock) and events that take the general
 * path (a medium name), with batches cut by count (16) and by the timer.
 * Runs under TSan too (label tsan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvbm/events.h"

#define THREADS 4
#define PER_THREAD 3000
#define MAXB 24

typedef struct {
  kvbm_publisher *p;
  unsigned id;
  uint64_t *hash_of_id; /* [id - 1]: the first hash of the event given that id */
} prod;

/* Event n of thread th: its shape, and hashes that name (th, n). */
static unsigned blocks_of(unsigned n) { return n % 97 == 5 ? MAXB : n % 7 == 3 ? 3 : 1; }
static uint64_t hash_of(unsigned th, unsigned n, unsigned j) {
  return ((uint64_t)th << 56) | ((uint64_t)n << 8) | j | (1ull << 40);
}
static uint32_t token_of(uint64_t h, unsigned j) { return (uint32_t)(h * 31 + j * 7919); }

static void *producer(void *arg) {
  prod *x = arg;
  uint64_t h[MAXB];
  uint32_t t[16 * MAXB];
  for (unsigned n = 0; n < PER_THREAD; n++) {
    unsigned nb = blocks_of(n);
    for (unsigned j = 0; j < nb; j++) h[j] = hash_of(x->id, n, j);
    for (unsigned j = 0; j < 16 * nb; j++) t[j] = token_of(h[0], j);
    kvbm_event ev = {.type = n % 2 ? KVBM_EVENT_REMOVED : KVBM_EVENT_STORED, .block_hashes = h,
                     .num_block_hashes = nb, .medium = KVBM_MEDIUM_GPU};
    if (ev.type == KVBM_EVENT_STORED) {
      ev.token_ids = t;
      ev.num_tokens = 16 * nb;
      ev.block_size = 16;
      ev.has_parent = true;
      ev.parent_hash = ~h[0];
    }
    if (n % 13 == 0) ev.medium = KVBM_MEDIUM_CPU, ev.medium_name = "CPU"; /* the general path */
    uint64_t id = 0;
    kvbm_error err;
    if (kvbm_publisher_publish(x->p, &ev, &id, &err)) return (void *)"publish failed";
    if (id == 0 || id > THREADS * PER_THREAD || x->hash_of_id[id - 1]) return (void *)"bad id";
    x->hash_of_id[id - 1] = h[0];
  }
  return NULL;
}

static void test_ids_follow_the_wire(void **s) {
  (void)s;
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 16;
  o.max_batch_delay_us = 500;
  kvbm_publisher *p;
  kvbm_error err;
  if (kvbm_publisher_create(&o, &p, &err)) fail_msg("%s", err.msg);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.mode = KVBM_ZMQ_BIND;
  zo.hwm = 0;
  if (kvbm_publisher_add_zmq(p, &zo, &err)) fail_msg("%s", err.msg);
  char ep[256];
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, false, ep, sizeof ep), KVBM_OK);
  if (kvbm_publisher_start(p, &err)) fail_msg("%s", err.msg);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  kvbm_subscriber *sub;
  assert_int_equal(kvbm_subscriber_create(&so, &sub, NULL), KVBM_OK);
  usleep(300000);

  uint64_t *hash_of_id = calloc(THREADS * PER_THREAD, sizeof *hash_of_id);
  assert_non_null(hash_of_id);
  pthread_t th[THREADS];
  prod x[THREADS];
  for (unsigned i = 0; i < THREADS; i++) {
    x[i] = (prod){.p = p, .id = i, .hash_of_id = hash_of_id};
    assert_int_equal(pthread_create(&th[i], NULL, producer, &x[i]), 0);
  }
  for (unsigned i = 0; i < THREADS; i++) {
    void *r;
    pthread_join(th[i], &r);
    if (r) fail_msg("thread %u: %s", i, (const char *)r);
  }
  assert_int_equal(kvbm_publisher_flush(p, 10000, NULL), KVBM_OK);

  unsigned next[THREADS] = {0};
  uint64_t got = 0;
  while (got < THREADS * PER_THREAD) {
    kvbm_event_batch b;
    if (kvbm_subscriber_recv(sub, 5000, &b, &err)) fail_msg("after %llu: %s", (unsigned long long)got, err.msg);
    assert_int_equal(b.lost_before, 0);
    for (size_t i = 0; i < b.num_events; i++, got++) {
      const kvbm_event *e = &b.events[i];
      uint64_t h0 = e->block_hashes[0];
      assert_true(h0 == hash_of_id[got]); /* the (got+1)-th on the wire has id got+1 */
      unsigned t = (unsigned)(h0 >> 56), n = (unsigned)(h0 >> 8) & 0xffffffffu;
      assert_true(t < THREADS);
      assert_int_equal(n, next[t]); /* each thread's order, none lost */
      next[t]++;
      unsigned nb = blocks_of(n);
      assert_int_equal(e->num_block_hashes, nb);
      for (unsigned j = 0; j < nb; j++) assert_true(e->block_hashes[j] == hash_of(t, n, j));
      assert_int_equal(e->type, n % 2 ? KVBM_EVENT_REMOVED : KVBM_EVENT_STORED);
      assert_int_equal(e->medium, n % 13 == 0 ? KVBM_MEDIUM_CPU : KVBM_MEDIUM_GPU);
      if (e->type == KVBM_EVENT_STORED) {
        assert_int_equal(e->num_tokens, 16 * nb);
        for (unsigned j = 0; j < 16 * nb; j++) assert_int_equal(e->token_ids[j], token_of(h0, j));
        assert_int_equal(e->block_size, 16);
        assert_true(e->has_parent && e->parent_hash == ~h0);
      }
    }
  }
  for (unsigned i = 0; i < THREADS; i++) assert_int_equal(next[i], PER_THREAD);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, THREADS * PER_THREAD);
  assert_int_equal(ps.sent_events, THREADS * PER_THREAD);
  free(hash_of_id);
  kvbm_subscriber_destroy(sub);
  kvbm_publisher_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ids_follow_the_wire),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
