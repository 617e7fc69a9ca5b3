/* SPDX-License-Identifier: Apache-2.0 */
/* test_publisher.c: the batching publisher through its callback sink:
 * ids, order, batching by count and by time, flush, both overflow
 * policies, shutdown that sends everything accepted, batches from
 * elsewhere keeping their dp_rank and every carried field, bad calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvbm/events.h"

/* What the callback saw. */
typedef struct seen {
  pthread_mutex_t mu;
  uint64_t batches, events, next_seq, next_id;
  uint64_t max_batch;
  uint64_t hash_sum;
  bool order_ok;
  int sleep_us; /* slow consumer */
  uint64_t last_hash;
} seen;

static void on_batch(void *user, const kvbm_event_batch *b) {
  seen *s = user;
  pthread_mutex_lock(&s->mu);
  if (b->seq != s->next_seq) s->order_ok = false;
  s->next_seq = b->seq + 1;
  s->batches++;
  s->events += b->num_events;
  if (b->num_events > s->max_batch) s->max_batch = b->num_events;
  if (!b->has_dp_rank || b->dp_rank != 7) s->order_ok = false;
  for (size_t i = 0; i < b->num_events; i++) {
    const kvbm_event *e = &b->events[i];
    if (e->event_id != s->next_id + 1) s->order_ok = false;
    s->next_id = e->event_id;
    if (e->type == KVBM_EVENT_STORED) {
      /* the test's events: hash h, tokens h..h+3, parent h-1 */
      uint64_t h = e->block_hashes[0];
      if (e->num_tokens != 4 || e->token_ids[0] != (uint32_t)h || e->token_ids[3] != (uint32_t)h + 3 ||
          !e->has_parent || e->parent_hash != h - 1 || e->block_size != 4 ||
          e->medium != KVBM_MEDIUM_CPU || strcmp(e->medium_name, "CPU"))
        s->order_ok = false;
      if (h != s->last_hash + 1) s->order_ok = false;
      s->last_hash = h;
      s->hash_sum += h;
    }
  }
  int us = s->sleep_us;
  pthread_mutex_unlock(&s->mu);
  if (us) usleep((useconds_t)us);
}

static void seen_init(seen *s) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  s->order_ok = true;
}

static kvbm_publisher *make(seen *s, kvbm_publisher_config o) {
  kvbm_publisher *p;
  kvbm_error err;
  o.dp_rank = 7;
  if (kvbm_publisher_create(&o, &p, &err)) fail_msg("%s", err.msg);
  assert_int_equal(kvbm_publisher_add_callback(p, on_batch, s, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  return p;
}

/* A started publisher with batches of `batch` events, a delay of
 * `delay_us` and a queue of `queue` events (0: the default). */
static kvbm_publisher *make_batched(seen *s, size_t batch, uint32_t delay_us, size_t queue) {
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = batch;
  o.max_batch_delay_us = delay_us;
  if (queue) o.queue_events = queue;
  return make(s, o);
}

static int stored(kvbm_publisher *p, uint64_t h, uint64_t *id) {
  uint32_t tok[4] = {(uint32_t)h, (uint32_t)h + 1, (uint32_t)h + 2, (uint32_t)h + 3};
  uint64_t parent = h - 1;
  return kvbm_publisher_publish_stored(p, &h, 1, &parent, tok, 4, 4, NULL, KVBM_MEDIUM_CPU, id,
                                       NULL);
}

static uint64_t get(seen *s, uint64_t *field) {
  pthread_mutex_lock(&s->mu);
  uint64_t v = *field;
  pthread_mutex_unlock(&s->mu);
  return v;
}

/* Count trigger: a long delay, batches of 10; 95 events give 9 full
 * batches at once and the 5 left only on flush. Ids go 1, 2, 3, ... */
static void test_batch_by_count_and_flush(void **st) {
  (void)st;
  seen s;
  seen_init(&s);
  kvbm_publisher *p = make_batched(&s, 10, 60u * 1000 * 1000, 0);
  for (uint64_t i = 1; i <= 95; i++) {
    uint64_t id;
    assert_int_equal(stored(p, i, &id), KVBM_OK);
    assert_int_equal(id, i);
  }
  for (int t = 0; t < 2000 && get(&s, &s.events) < 90; t++) usleep(1000);
  usleep(20000);
  assert_int_equal(get(&s, &s.events), 90); /* the last 5 wait for the time or a flush */
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK);
  assert_int_equal(get(&s, &s.events), 95);
  assert_int_equal(get(&s, &s.batches), 10);
  assert_int_equal(get(&s, &s.max_batch), 10);
  assert_true(s.order_ok);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, 95);
  assert_int_equal(ps.sent_events, 95);
  assert_int_equal(ps.batches, 10);
  assert_int_equal(ps.dropped, 0);
  kvbm_publisher_destroy(p);
}

/* Time trigger: 3 events, batches of 1000, delay 20 ms: they leave
 * together within a few delays, without a flush. */
static void test_batch_by_time(void **st) {
  (void)st;
  seen s;
  seen_init(&s);
  kvbm_publisher *p = make_batched(&s, 1000, 20000, 0);
  struct timespec t0, t1, tp;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint64_t i = 1; i <= 3; i++) assert_int_equal(stored(p, i, NULL), KVBM_OK);
  clock_gettime(CLOCK_MONOTONIC, &tp);
  for (int t = 0; t < 5000 && get(&s, &s.events) < 3; t++) usleep(1000);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  assert_int_equal(get(&s, &s.events), 3);
  double publishing = (double)(tp.tv_sec - t0.tv_sec) + (double)(tp.tv_nsec - t0.tv_nsec) * 1e-9;
  /* together (unless publishing three alone took a delay: a machine this
   * slow proves nothing about batching), and not before the delay: */
  if (publishing < 0.015) assert_int_equal(get(&s, &s.batches), 1);
  double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  assert_true(waited >= 0.019);
  kvbm_publisher_destroy(p);
}

static double since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* The time trigger after a busy spell. A thread that has just sent a
 * batch sleeps at most max_batch_delay_us and is not woken by the event
 * that opens the next queue (publisher.c, thread_main): that event still
 * leaves by the timer, no sooner than the delay after it; and once a
 * timed sleep passes with nothing queued the thread sleeps until woken,
 * so the event after that wakes it and leaves too. No flush anywhere. */
static void test_batch_by_time_after_busy(void **st) {
  (void)st;
  seen s;
  seen_init(&s);
  kvbm_publisher *p = make_batched(&s, 10, 20000, 0);
  uint64_t h = 1;
  for (; h <= 10; h++) assert_int_equal(stored(p, h, NULL), KVBM_OK);
  for (int t = 0; t < 5000 && get(&s, &s.events) < 10; t++) usleep(1000);
  assert_int_equal(get(&s, &s.events), 10);
  for (int round = 0; round < 3; round++) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t want = get(&s, &s.events) + 3;
    for (int i = 0; i < 3; i++, h++) assert_int_equal(stored(p, h, NULL), KVBM_OK);
    for (int t = 0; t < 5000 && get(&s, &s.events) < want; t++) usleep(1000);
    assert_int_equal(get(&s, &s.events), want);
    assert_true(since(&t0) >= 0.019); /* the timer, not a wake per event */
    usleep(round == 1 ? 100000 : 0);  /* round 2 starts after the timed sleep ran out */
  }
  assert_true(s.order_ok);
  kvbm_publisher_destroy(p);
}

/* A steady stream of full batches. While each of the thread's wakes
 * finds a full batch, producers stop waking it for one and it wakes on a
 * short timer of its own (publisher.c, stream_poll_us): every batch still
 * leaves without a flush, long before the (here: one minute) delay, in
 * order. The queue is large enough that no producer waits for room
 * (which would wake the thread). */
static void test_stream_of_full_batches(void **st) {
  (void)st;
  seen s;
  seen_init(&s);
  kvbm_publisher *p = make_batched(&s, 10, 60u * 1000 * 1000, 1u << 20);
  const uint64_t n = 100000;
  for (uint64_t h = 1; h <= n; h++) assert_int_equal(stored(p, h, NULL), KVBM_OK);
  for (int t = 0; t < 10000 && get(&s, &s.events) < n; t++) usleep(1000);
  assert_int_equal(get(&s, &s.events), n);
  assert_int_equal(get(&s, &s.max_batch), 10);
  assert_true(s.order_ok);
  kvbm_publisher_destroy(p);
}

/* Shutdown sends everything accepted, from several threads at once. */
typedef struct prod {
  kvbm_publisher *p;
  int n;
  uint64_t ok;
} prod;

static void *producer(void *arg) {
  prod *pr = arg;
  for (int i = 0; i < pr->n; i++) {
    uint64_t h = 5;
    if (kvbm_publisher_publish_removed(pr->p, &h, 1, KVBM_MEDIUM_GPU, NULL, NULL) == KVBM_OK)
      pr->ok++;
  }
  return NULL;
}

static void test_shutdown_loses_nothing(void **st) {
  (void)st;
  seen s;
  seen_init(&s);
  s.sleep_us = 200; /* a slow sink, so the queue fills and producers block */
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 64;
  o.queue_events = 128;
  kvbm_publisher *p = make(&s, o);
  prod pr[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    pr[i] = (prod){p, 3000, 0};
    pthread_create(&th[i], NULL, producer, &pr[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, 12000);
  assert_true(ps.blocked > 0);
  assert_int_equal(ps.dropped, 0);
  kvbm_publisher_destroy(p); /* no flush: free must send what is queued */
  assert_int_equal(s.events, 12000);
  assert_int_equal(s.next_id, 12000);
  assert_true(s.order_ok);
  pthread_mutex_destroy(&s.mu);
}

/* DROP: a stalled sink, a queue of 16: the rest is dropped, counted and
 * reported; ids stay dense; after the stall everything accepted arrives. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
  uint64_t events;
  uint64_t next_id;
  bool dense;
} gate;

static void gated(void *user, const kvbm_event_batch *b) {
  gate *g = user;
  pthread_mutex_lock(&g->mu);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  for (size_t i = 0; i < b->num_events; i++) {
    if (b->events[i].event_id != ++g->next_id) g->dense = false;
  }
  g->events += b->num_events;
  pthread_mutex_unlock(&g->mu);
}

static void test_overflow_drop(void **st) {
  (void)st;
  gate g = {.open = false, .dense = true};
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 4;
  o.max_batch_delay_us = 0;
  o.queue_events = 16;
  o.overflow = KVBM_OVERFLOW_DROP;
  kvbm_publisher *p;
  assert_int_equal(kvbm_publisher_create(&o, &p, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(p, gated, &g, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, NULL), KVBM_OK);
  uint64_t ok = 0, dropped = 0;
  kvbm_error err;
  for (int i = 0; i < 200; i++) {
    int rc = kvbm_publisher_publish_cleared(p, NULL, &err);
    if (rc == KVBM_OK) ok++;
    else {
      assert_int_equal(rc, KVBM_EAGAIN);
      assert_non_null(strstr(err.msg, "dropped"));
      dropped++;
    }
  }
  /* the thread holds at most one drained batch set plus a full queue */
  assert_true(dropped > 0);
  assert_true(ok >= 16 && ok <= 16 + 16);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.dropped, dropped);
  assert_int_equal(ps.accepted, ok);
  pthread_mutex_lock(&g.mu);
  g.open = true;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  kvbm_publisher_destroy(p);
  assert_int_equal(g.events, ok);
  assert_true(g.dense);
  pthread_cond_destroy(&g.cv);
  pthread_mutex_destroy(&g.mu);
}

static void test_bad_calls(void **st) {
  (void)st;
  kvbm_publisher *p;
  kvbm_error err;
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 0;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "max_batch_events"));
  o = kvbm_publisher_config_default();
  o.queue_events = 10;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_EINVAL);
  o = kvbm_publisher_config_default();
  o.overflow = (kvbm_overflow)5;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_EINVAL);
  o = kvbm_publisher_config_default();
  o.queue_bytes = 64;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_publish_cleared(p, NULL, &err), KVBM_ESTATE);
  assert_int_equal(kvbm_publisher_flush(p, 0, &err), KVBM_ESTATE);
  assert_int_equal(kvbm_publisher_add_callback(p, NULL, NULL, &err), KVBM_EINVAL);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("bogus://x");
  assert_int_equal(kvbm_publisher_add_zmq(p, &zo, &err), KVBM_EIO);
  assert_non_null(strstr(err.msg, "bogus://x"));
  assert_int_equal(kvbm_publisher_add_nats(p, "nats://127.0.0.1:1", "a b", &err), KVBM_EINVAL);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_ESTATE);
  seen s;
  seen_init(&s);
  assert_int_equal(kvbm_publisher_add_callback(p, on_batch, &s, &err), KVBM_ESTATE);
  uint64_t h[20] = {0};
  uint32_t tok[4] = {0};
  assert_int_equal(kvbm_publisher_publish_stored(p, h, 0, NULL, tok, 4, 4, NULL, 0, NULL, &err),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_publisher_publish_stored(p, h, 1, NULL, tok, 4, 0, NULL, 0, NULL, &err),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_publisher_publish_removed(p, h, 20, KVBM_MEDIUM_GPU, NULL, &err),
                   KVBM_ETOOLONG); /* 160 bytes > queue_bytes 64 */
  kvbm_event ev = {.type = (kvbm_event_type)0};
  assert_int_equal(kvbm_publisher_publish(p, &ev, NULL, &err), KVBM_EINVAL);
  ev = (kvbm_event){.type = KVBM_EVENT_REMOVED, .block_hashes = h, .num_block_hashes = 1,
                    .medium = KVBM_MEDIUM_OTHER};
  assert_int_equal(kvbm_publisher_publish(p, &ev, NULL, &err), KVBM_EINVAL);
  ev.medium_name = "NVME"; /* a disk name: not OTHER */
  assert_int_equal(kvbm_publisher_publish(p, &ev, NULL, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "does not name"));
  ev.medium_name = "HBM3e";
  uint64_t id;
  assert_int_equal(kvbm_publisher_publish(p, &ev, &id, &err), KVBM_OK);
  assert_int_equal(id, 1);
  assert_int_equal(kvbm_publisher_flush(p, 5000, &err), KVBM_OK);
  char ep[64];
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, false, ep, sizeof ep), KVBM_ENOTFOUND);
  kvbm_publisher_destroy(p);
  kvbm_publisher_destroy(NULL);
  pthread_mutex_destroy(&s.mu);
}

/* What the relay callback saw: every event copied out, with its batch's
 * rank. */
typedef struct relayed {
  pthread_mutex_t mu;
  int32_t rank[16];
  size_t nbatch[16], batches;
  kvbm_event ev[32];
  int32_t ev_rank[32];
  size_t n;
  char text[32][64]; /* each event's cache_salt, lora_name... joined */
  uint8_t raw[32][64];
} relayed;

static void on_relayed(void *user, const kvbm_event_batch *b) {
  relayed *r = user;
  pthread_mutex_lock(&r->mu);
  if (r->batches < 16) {
    r->rank[r->batches] = b->has_dp_rank ? b->dp_rank : -99;
    r->nbatch[r->batches] = b->num_events;
  }
  r->batches++;
  for (size_t i = 0; i < b->num_events && r->n < 32; i++, r->n++) {
    const kvbm_event *e = &b->events[i];
    r->ev[r->n] = *e;
    r->ev_rank[r->n] = b->dp_rank;
    snprintf(r->text[r->n], sizeof r->text[r->n], "%s|%s|%s|%s|%s|%s|%d",
             e->medium_name ? e->medium_name : "-", e->lora_name ? e->lora_name : "-",
             e->cache_salt ? e->cache_salt : "-",
             e->kv_cache_spec_kind ? e->kv_cache_spec_kind : "-",
             e->locality ? e->locality : "-", e->ownership ? e->ownership : "-",
             (int)e->token_pairs);
    size_t k = 0;
    if (e->extra_keys && e->extra_keys_len < 32) {
      memcpy(r->raw[r->n], e->extra_keys, e->extra_keys_len);
      k = e->extra_keys_len;
    }
    if (e->extras && k + e->extras_len <= 64) memcpy(r->raw[r->n] + k, e->extras, e->extras_len);
  }
  pthread_mutex_unlock(&r->mu);
}

/* kvbm_publisher_publish_batch (the relay's path): the engine's dp_rank is
 * kept (a batch leaves with one rank: ranks are not mixed), a batch
 * without one gets the publisher's; every carried field arrives as it was
 * given; a refused event is skipped, the rest queued. */
static void test_publish_batch_keeps_rank_and_fields(void **st) {
  (void)st;
  relayed r;
  memset(&r, 0, sizeof r);
  pthread_mutex_init(&r.mu, NULL);
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.dp_rank = 7;
  o.max_batch_events = 64;
  o.max_batch_delay_us = 60u * 1000 * 1000;
  kvbm_publisher *p;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(p, on_relayed, &r, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  static const uint8_t ekeys[] = {0x91, 0x91, 0xa4, 's', 'a', 'l', 't'};
  static const uint8_t extras[] = {0xaa, 's', 'e', 's', 's', 'i', 'o', 'n', '_', 'i', 'd', 0x01};
  uint64_t h[2] = {11, 12};
  uint32_t tok[3] = {1, 2, 3};
  kvbm_event a[3] = {
      {.type = KVBM_EVENT_STORED, .block_hashes = h, .num_block_hashes = 1, .token_ids = tok,
       .num_tokens = 3, .block_size = 2, .token_pairs = true, .medium = KVBM_MEDIUM_CPU,
       .medium_name = "CPU_PINNED", .cache_salt = "tenant-a", .extras = extras,
       .extras_len = sizeof extras, .num_extras = 1},
      {.type = KVBM_EVENT_STORED, .block_hashes = h + 1, .num_block_hashes = 1},  /* refused */
      {.type = KVBM_EVENT_STORED, .block_hashes = h + 1, .num_block_hashes = 1, .block_size = 2,
       .medium = KVBM_MEDIUM_DISK, .medium_name = "STORAGE", .lora_name = "lo",
       .kv_cache_spec_kind = "full_attention", .locality = "LOCAL", .ownership = "kvcr",
       .extra_keys = ekeys, .extra_keys_len = sizeof ekeys},
  };
  kvbm_event_batch b1 = {.dp_rank = 3, .has_dp_rank = true, .events = a, .num_events = 3};
  size_t queued = 0;
  assert_int_equal(kvbm_publisher_publish_batch(p, &b1, &queued, &err), KVBM_EINVAL);
  assert_int_equal(queued, 2);
  kvbm_event c = {.type = KVBM_EVENT_CLEARED};
  kvbm_event_batch b2 = {.has_dp_rank = false, .events = &c, .num_events = 1};
  assert_int_equal(kvbm_publisher_publish_batch(p, &b2, &queued, &err), KVBM_OK);
  assert_int_equal(queued, 1);
  kvbm_event_batch b3 = {.dp_rank = 5, .has_dp_rank = true, .events = &c, .num_events = 1};
  assert_int_equal(kvbm_publisher_publish_batch(p, &b3, &queued, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_flush(p, 5000, &err), KVBM_OK);
  pthread_mutex_lock(&r.mu);
  /* one flush, three ranks: three batches, never mixed */
  assert_int_equal(r.batches, 3);
  assert_int_equal(r.rank[0], 3);
  assert_int_equal(r.nbatch[0], 2);
  assert_int_equal(r.rank[1], 7);
  assert_int_equal(r.rank[2], 5);
  assert_int_equal(r.n, 4);
  assert_string_equal(r.text[0], "CPU_PINNED|-|tenant-a|-|-|-|1");
  assert_int_equal(r.ev[0].num_tokens, 3);
  assert_int_equal(r.ev[0].num_extras, 1);
  assert_int_equal(r.ev[0].extras_len, sizeof extras);
  assert_memory_equal(r.raw[0], extras, sizeof extras);
  assert_string_equal(r.text[1], "STORAGE|lo|-|full_attention|LOCAL|kvcr|0");
  assert_int_equal(r.ev[1].extra_keys_len, sizeof ekeys);
  assert_memory_equal(r.raw[1], ekeys, sizeof ekeys);
  assert_int_equal(r.ev[2].type, KVBM_EVENT_CLEARED);
  pthread_mutex_unlock(&r.mu);
  kvbm_publisher_destroy(p);
  pthread_mutex_destroy(&r.mu);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_by_count_and_flush),
      cmocka_unit_test(test_batch_by_time),
      cmocka_unit_test(test_batch_by_time_after_busy),
      cmocka_unit_test(test_stream_of_full_batches),
      cmocka_unit_test(test_shutdown_loses_nothing),
      cmocka_unit_test(test_overflow_drop),
      cmocka_unit_test(test_bad_calls),
      cmocka_unit_test(test_publish_batch_keeps_rank_and_fields),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
