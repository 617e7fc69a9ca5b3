/* SPDX-License-Identifier: Apache-2.0 */
/* test_stage.c: a producer's stage (kvbm_publisher_stage_*, issue 22).
 * What it promises: the bytes on the wire are those of the same events
 * published one at a time (a raw ZMQ SUB compares the payloads, all but
 * each batch's timestamp); a staged event is not accepted (no count, no
 * flush, no send) until the stage is handed over, by its flush, by the
 * publish that fills it or by its destroy; a hand-over's events leave
 * together and in order, beside other threads' stages and plain
 * publishes; a hand-over that finds the queue's byte bound full drops
 * the rest and counts it (DROP) or waits for room (BLOCK); bad calls and
 * bad events are refused with nothing staged; where the publisher does
 * not encode on publish (a callback sink) or coalesces, a stage
 * publishes at once. And kvbm_publisher_publish's lean path for a plain
 * event (publish_plain) and its ways back to the general one: ids one
 * after the other across batch ends and a queue's first event, an event
 * above queue_bytes refused, a full queue dropping under DROP, nothing
 * after shutdown began. And kvbm_publisher_publish_batch, which takes the
 * lock once for a group of events: every good event queued in order, the
 * first refusal in the batch's order reported. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kvbm/events.h"

/* A wire-mode publisher (one ZMQ sink, tcp loopback) that sends batches
 * on flush or when full. */
static kvbm_publisher *open_pub(kvbm_publisher_config o, char *ep, size_t cap) {
  kvbm_publisher *p;
  kvbm_error err;
  if (kvbm_publisher_create(&o, &p, &err)) fail_msg("%s", err.msg);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.mode = KVBM_ZMQ_BIND;
  zo.hwm = 0;
  if (kvbm_publisher_add_zmq(p, &zo, &err)) fail_msg("%s", err.msg);
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, false, ep, cap), KVBM_OK);
  if (kvbm_publisher_start(p, &err)) fail_msg("%s", err.msg);
  return p;
}

static kvbm_publisher_config slow_batches(size_t max_batch) {
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = max_batch;
  o.max_batch_delay_us = 60u * 1000 * 1000; /* on flush or when full only */
  return o;
}

/* A raw SUB on ep, live before the first publish. */
static void *raw_sub(void *ctx, const char *ep) {
  void *s = zmq_socket(ctx, ZMQ_SUB);
  int hwm = 0, to = 5000;
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
  zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
  assert_int_equal(zmq_connect(s, ep), 0);
  usleep(300000);
  return s;
}

/* The next message's third frame (vLLM's [topic, seq, payload]) into
 * buf; its length. */
static size_t recv_payload(void *s, uint8_t *buf, size_t cap) {
  int frames = 0;
  size_t len = 0;
  for (int more = 1; more; frames++) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0) fail_msg("recv: %s", zmq_strerror(zmq_errno()));
    if (frames == 2) {
      len = zmq_msg_size(&m);
      assert_true(len <= cap);
      memcpy(buf, zmq_msg_data(&m), len);
    }
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  assert_int_equal(frames, 3);
  return len;
}

/* Event i of a mixed stream: plain one- and three-block stores, removes,
 * a clear, and events that take the full encoder (a LoRA name, a medium
 * name, a group index). */
static uint64_t g_h[3];
static uint32_t g_t[48];
static kvbm_event mixed(unsigned i) {
  unsigned nb = i % 5 == 1 ? 3 : 1;
  for (unsigned j = 0; j < nb; j++) g_h[j] = 0x9e3779b97f4a7c15ull * (i * 4 + j + 1);
  for (unsigned j = 0; j < 16 * nb; j++) g_t[j] = i * 1000u + j * 77u;
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_hashes = g_h, .num_block_hashes = nb,
                   .token_ids = g_t, .num_tokens = 16 * nb, .block_size = 16,
                   .medium = KVBM_MEDIUM_GPU, .has_parent = i % 3 != 0, .parent_hash = i};
  switch (i % 9) {
    case 2: ev = (kvbm_event){.type = KVBM_EVENT_REMOVED, .block_hashes = g_h,
                              .num_block_hashes = 1, .medium = KVBM_MEDIUM_CPU};
            break;
    case 4: ev.lora_name = "adapter"; ev.lora_id = 5; ev.has_lora_id = true; break;
    case 5: ev.medium_name = "CPU_PINNED"; ev.medium = KVBM_MEDIUM_CPU; break;
    case 6: ev.group_idx = 1; ev.has_group_idx = true; break;
    case 7: ev = (kvbm_event){.type = KVBM_EVENT_CLEARED}; break;
    default: break;
  }
  return ev;
}

/* The same 61 events through kvbm_publisher_publish and through a stage,
 * in both forms: equal payloads but for the timestamp (bytes 1..9), in
 * equal batches (8 events, the last 5 on flush). */
static void same_bytes(kvbm_event_form form) {
  void *ctx = zmq_ctx_new();
  kvbm_publisher_config o = slow_batches(8);
  o.form = form;
  char ep_a[256], ep_b[256];
  kvbm_publisher *a = open_pub(o, ep_a, sizeof ep_a), *b = open_pub(o, ep_b, sizeof ep_b);
  void *sa = raw_sub(ctx, ep_a), *sb = raw_sub(ctx, ep_b);
  kvbm_publisher_stage *st;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_stage_create(b, 0, &st, &err), KVBM_OK);
  for (unsigned i = 0; i < 61; i++) {
    kvbm_event ev = mixed(i);
    if (kvbm_publisher_publish(a, &ev, NULL, &err)) fail_msg("publish %u: %s", i, err.msg);
    ev = mixed(i);
    if (kvbm_publisher_stage_publish(st, &ev, &err)) fail_msg("stage %u: %s", i, err.msg);
  }
  assert_int_equal(kvbm_publisher_stage_count(st), 61 % 8);
  assert_int_equal(kvbm_publisher_stage_flush(st, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_stage_count(st), 0);
  assert_int_equal(kvbm_publisher_flush(a, 5000, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_flush(b, 5000, NULL), KVBM_OK);
  static uint8_t pa[1 << 16], pb[1 << 16];
  for (int m = 0; m < 8; m++) {
    size_t la = recv_payload(sa, pa, sizeof pa), lb = recv_payload(sb, pb, sizeof pb);
    assert_int_equal(la, lb);
    assert_true(la > 10 && pa[0] == 0x93 && pa[1] == 0xcb); /* [ts, events, rank] */
    assert_memory_equal(pa + 10, pb + 10, la - 10);
    assert_int_equal(pa[10], 0x90 | (m < 7 ? 8 : 5)); /* the batch's events */
  }
  kvbm_publisher_stats sa_st, sb_st;
  kvbm_publisher_stats_get(a, &sa_st);
  kvbm_publisher_stats_get(b, &sb_st);
  assert_int_equal(sb_st.accepted, 61);
  assert_int_equal(sb_st.batches, sa_st.batches);
  kvbm_publisher_stage_destroy(st);
  zmq_close(sa);
  zmq_close(sb);
  kvbm_publisher_destroy(a);
  kvbm_publisher_destroy(b);
  zmq_ctx_term(ctx);
}

static void test_same_bytes_map(void **s) {
  (void)s;
  same_bytes(KVBM_FORM_MAP);
}

static void test_same_bytes_positional(void **s) {
  (void)s;
  same_bytes(KVBM_FORM_POSITIONAL);
}

static kvbm_event store1(uint64_t *h, uint32_t *t, uint64_t v) {
  *h = v;
  for (uint32_t j = 0; j < 4; j++) t[j] = (uint32_t)v * 4 + j;
  return (kvbm_event){.type = KVBM_EVENT_STORED, .block_hashes = h, .num_block_hashes = 1,
                      .token_ids = t, .num_tokens = 4, .block_size = 4,
                      .medium = KVBM_MEDIUM_GPU};
}

/* Staged events are not accepted until a hand-over: no count, a flush of
 * the publisher does not wait for them, nothing is sent; then they are. */
static void test_not_accepted_until_handover(void **s) {
  (void)s;
  char ep[256];
  kvbm_publisher *p = open_pub(slow_batches(256), ep, sizeof ep);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  kvbm_subscriber *sub;
  assert_int_equal(kvbm_subscriber_create(&so, &sub, NULL), KVBM_OK);
  usleep(300000);
  kvbm_publisher_stage *st;
  assert_int_equal(kvbm_publisher_stage_create(p, 16, &st, NULL), KVBM_OK);
  uint64_t h;
  uint32_t t[4];
  for (uint64_t v = 1; v <= 5; v++) {
    kvbm_event ev = store1(&h, t, v);
    assert_int_equal(kvbm_publisher_stage_publish(st, &ev, NULL), KVBM_OK);
  }
  assert_int_equal(kvbm_publisher_stage_count(st), 5);
  assert_int_equal(kvbm_publisher_flush(p, 1000, NULL), KVBM_OK);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, 0);
  assert_int_equal(ps.sent_events, 0);
  kvbm_event_batch b;
  assert_int_equal(kvbm_subscriber_recv(sub, 200, &b, NULL), KVBM_ETIMEDOUT);
  assert_int_equal(kvbm_publisher_stage_flush(st, NULL), KVBM_OK);
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, 5);
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK);
  kvbm_error err;
  if (kvbm_subscriber_recv(sub, 5000, &b, &err)) fail_msg("%s", err.msg);
  assert_int_equal(b.num_events, 5);
  for (size_t i = 0; i < 5; i++) {
    assert_true(b.events[i].block_hashes[0] == i + 1);
    assert_int_equal(b.events[i].token_ids[3], 4 * (i + 1) + 3);
  }
  /* destroy hands over what is left */
  kvbm_event ev = store1(&h, t, 6);
  assert_int_equal(kvbm_publisher_stage_publish(st, &ev, NULL), KVBM_OK);
  kvbm_publisher_stage_destroy(st);
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, 6);
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK);
  if (kvbm_subscriber_recv(sub, 5000, &b, &err)) fail_msg("%s", err.msg);
  assert_int_equal(b.num_events, 1);
  assert_true(b.events[0].block_hashes[0] == 6);
  kvbm_subscriber_destroy(sub);
  kvbm_publisher_destroy(p);
}

/* Producers side by side: two threads with stages of 8, one publishing
 * one event at a time. Every event arrives once; each thread's in its
 * order; a staged thread's events in runs of 8 (one hand-over each). */
enum { PER_THREAD = 4000 };
typedef struct prod {
  kvbm_publisher *p;
  unsigned id;
  bool staged;
} prod;

static void *producer(void *arg) {
  prod *x = arg;
  kvbm_publisher_stage *st = NULL;
  if (x->staged && kvbm_publisher_stage_create(x->p, 8, &st, NULL)) return (void *)1;
  uint64_t h;
  uint32_t t[4];
  for (uint64_t i = 0; i < PER_THREAD; i++) {
    kvbm_event ev = store1(&h, t, ((uint64_t)x->id << 32) | i);
    int rc = st ? kvbm_publisher_stage_publish(st, &ev, NULL)
                : kvbm_publisher_publish(x->p, &ev, NULL, NULL);
    if (rc) return (void *)1;
  }
  if (st && kvbm_publisher_stage_flush(st, NULL)) return (void *)1;
  kvbm_publisher_stage_destroy(st);
  return NULL;
}

static void test_threads(void **s) {
  (void)s;
  char ep[256];
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_delay_us = 200;
  kvbm_publisher *p = open_pub(o, ep, sizeof ep);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  kvbm_subscriber *sub;
  assert_int_equal(kvbm_subscriber_create(&so, &sub, NULL), KVBM_OK);
  usleep(300000);
  pthread_t th[3];
  prod x[3];
  for (unsigned i = 0; i < 3; i++) {
    x[i] = (prod){.p = p, .id = i, .staged = i < 2};
    assert_int_equal(pthread_create(&th[i], NULL, producer, &x[i]), 0);
  }
  for (unsigned i = 0; i < 3; i++) {
    void *r;
    pthread_join(th[i], &r);
    assert_null(r);
  }
  assert_int_equal(kvbm_publisher_flush(p, 10000, NULL), KVBM_OK);
  uint64_t next[3] = {0}, got = 0;
  unsigned run_thread = 3, run_len = 0;
  while (got < 3 * PER_THREAD) {
    kvbm_event_batch b;
    kvbm_error err;
    if (kvbm_subscriber_recv(sub, 5000, &b, &err)) fail_msg("after %llu: %s", (unsigned long long)got, err.msg);
    assert_int_equal(b.lost_before, 0);
    for (size_t i = 0; i < b.num_events; i++, got++) {
      uint64_t h = b.events[i].block_hashes[0];
      unsigned id = (unsigned)(h >> 32);
      assert_true(id < 3);
      assert_true((h & 0xffffffffu) == next[id]); /* each thread's order, none lost */
      next[id]++;
      if (id == run_thread) {
        run_len++;
      } else {
        if (run_thread < 2) assert_int_equal(run_len % 8, 0); /* whole hand-overs */
        run_thread = id;
        run_len = 1;
      }
    }
  }
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, 3 * PER_THREAD);
  kvbm_subscriber_destroy(sub);
  kvbm_publisher_destroy(p);
}

/* A hand-over larger than the queue's byte bound: DROP queues what fits
 * (the lock is held throughout, so the thread cannot make room) and
 * counts the rest; BLOCK waits and queues all. */
static void overflow(kvbm_overflow policy) {
  char ep[256];
  kvbm_publisher_config o = slow_batches(8);
  o.queue_bytes = 3 * (8 + 16); /* three one-block stores of 4 tokens */
  o.overflow = policy;
  kvbm_publisher *p = open_pub(o, ep, sizeof ep);
  kvbm_publisher_stage *st;
  assert_int_equal(kvbm_publisher_stage_create(p, 8, &st, NULL), KVBM_OK);
  uint64_t h;
  uint32_t t[4];
  kvbm_error err;
  for (uint64_t v = 1; v <= 7; v++) {
    kvbm_event ev = store1(&h, t, v);
    assert_int_equal(kvbm_publisher_stage_publish(st, &ev, &err), KVBM_OK);
  }
  kvbm_event ev = store1(&h, t, 8);
  int rc = kvbm_publisher_stage_publish(st, &ev, &err); /* fills it: the hand-over */
  assert_int_equal(kvbm_publisher_stage_count(st), 0);
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  if (policy == KVBM_OVERFLOW_DROP) {
    assert_int_equal(rc, KVBM_EAGAIN);
    assert_non_null(strstr(err.msg, "5 events dropped"));
    assert_int_equal(ps.accepted, 3);
    assert_int_equal(ps.dropped, 5);
    assert_int_equal(ps.sent_events, 3);
  } else {
    assert_int_equal(rc, KVBM_OK);
    assert_int_equal(ps.accepted, 8);
    assert_int_equal(ps.sent_events, 8);
    assert_true(ps.blocked >= 1);
  }
  kvbm_publisher_stage_destroy(st);
  kvbm_publisher_destroy(p);
}

static void test_overflow_drop(void **s) {
  (void)s;
  overflow(KVBM_OVERFLOW_DROP);
}

static void test_overflow_block(void **s) {
  (void)s;
  overflow(KVBM_OVERFLOW_BLOCK);
}

/* The lean publish and the general one it falls back to: ids 1, 2, ...
 * across new batches (max_batch_events 4) and the first event of an
 * empty queue, mixed with events that take the general path; the bytes
 * bound; DROP when the queue is full (the thread cannot send: the queue
 * holds one event less than a batch and the timer is long). */
static void test_lean_publish(void **s) {
  (void)s;
  char ep[256];
  kvbm_publisher_config o = slow_batches(4);
  o.queue_events = 4;
  o.queue_bytes = 3 * (8 + 16) + 8 + 11; /* three one-block stores of 4 tokens, a named remove */
  o.overflow = KVBM_OVERFLOW_DROP;
  kvbm_publisher *p = open_pub(o, ep, sizeof ep);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  kvbm_subscriber *sub;
  assert_int_equal(kvbm_subscriber_create(&so, &sub, NULL), KVBM_OK);
  usleep(300000);
  uint64_t h, id, want = 1;
  uint32_t t[4];
  kvbm_error err;
  for (uint64_t round = 0; round < 3; round++) {
    for (uint64_t v = 1; v <= 3; v++) { /* plain: lean but for the first */
      kvbm_event ev = store1(&h, t, round * 10 + v);
      assert_int_equal(kvbm_publisher_publish(p, &ev, &id, &err), KVBM_OK);
      assert_true(id == want++);
    }
    kvbm_event full = store1(&h, t, 99); /* the bytes bound is reached */
    assert_int_equal(kvbm_publisher_publish(p, &full, &id, &err), KVBM_EAGAIN);
    assert_non_null(strstr(err.msg, "queue full"));
    kvbm_event named = {.type = KVBM_EVENT_REMOVED, .block_hashes = &h, .num_block_hashes = 1,
                        .medium = KVBM_MEDIUM_CPU, .medium_name = "CPU_PINNED"}; /* general */
    h = round * 10 + 4;
    assert_int_equal(kvbm_publisher_publish(p, &named, &id, &err), KVBM_OK);
    assert_true(id == want++);
    kvbm_event_batch b;
    if (kvbm_subscriber_recv(sub, 5000, &b, &err)) fail_msg("%s", err.msg); /* full: sent */
    assert_int_equal(b.num_events, 4);
    for (size_t i = 0; i < 4; i++) assert_true(b.events[i].block_hashes[0] == round * 10 + i + 1);
    assert_int_equal(b.events[3].type, KVBM_EVENT_REMOVED);
    for (int w = 0; w < 500; w++) { /* the thread has taken it: the queue is empty again */
      kvbm_publisher_stats ps;
      kvbm_publisher_stats_get(p, &ps);
      if (ps.sent_events == want - 1) break;
      usleep(1000);
    }
  }
  uint32_t big[64] = {0};
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1,
                   .token_ids = big, .num_tokens = 64, .block_size = 64};
  assert_int_equal(kvbm_publisher_publish(p, &ev, &id, &err), KVBM_ETOOLONG);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, 12);
  assert_int_equal(ps.dropped, 3);
  kvbm_subscriber_destroy(sub);
  kvbm_publisher_destroy(p);
}

/* publish_batch over more than one group (32) with refused events inside:
 * the good ones leave in order, the first refusal (event 5's) is the one
 * reported, and a full queue under DROP is reported before a later bad
 * event. */
static void test_publish_batch_groups(void **s) {
  (void)s;
  char ep[256];
  kvbm_publisher *p = open_pub(slow_batches(256), ep, sizeof ep);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  kvbm_subscriber *sub;
  assert_int_equal(kvbm_subscriber_create(&so, &sub, NULL), KVBM_OK);
  usleep(300000);
  static uint64_t hs[100];
  static uint32_t ts[100][4];
  kvbm_event evs[100];
  for (uint64_t i = 0; i < 100; i++) evs[i] = store1(&hs[i], ts[i], i + 1);
  evs[5].block_size = 0;                   /* refused: no block size */
  evs[40].type = (kvbm_event_type)99;      /* refused: unknown type */
  evs[70].num_block_hashes = 0;            /* refused: no blocks */
  kvbm_event_batch in = {.events = evs, .num_events = 100};
  size_t queued = 0;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_publish_batch(p, &in, &queued, &err), KVBM_EINVAL);
  assert_int_equal(queued, 97);
  assert_non_null(strstr(err.msg, "block size")); /* event 5's, the first */
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK);
  kvbm_event_batch b;
  if (kvbm_subscriber_recv(sub, 5000, &b, &err)) fail_msg("%s", err.msg);
  assert_int_equal(b.num_events, 97);
  for (size_t i = 0, want = 1; i < 97; i++, want++) {
    if (want == 6 || want == 41 || want == 71) want++;
    assert_true(b.events[i].block_hashes[0] == want);
  }
  kvbm_subscriber_destroy(sub);
  kvbm_publisher_destroy(p);

  kvbm_publisher_config o = slow_batches(8);
  o.queue_events = 8;
  o.overflow = KVBM_OVERFLOW_DROP;
  p = open_pub(o, ep, sizeof ep);
  for (uint64_t i = 0; i < 20; i++) evs[i] = store1(&hs[i], ts[i], i + 1);
  evs[15].block_size = 0;
  in.num_events = 20;
  assert_int_equal(kvbm_publisher_publish_batch(p, &in, &queued, &err), KVBM_EAGAIN);
  assert_non_null(strstr(err.msg, "queue full"));
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_true(queued >= 8);
  assert_int_equal(ps.accepted, queued);
  assert_int_equal(queued + ps.dropped, 19);
  kvbm_publisher_destroy(p);
}

static void on_batch(void *user, const kvbm_event_batch *b) {
  (void)user;
  (void)b;
}

/* Bad calls and bad events: refused, nothing staged. */
static void test_refusals(void **s) {
  (void)s;
  kvbm_publisher *p;
  kvbm_error err;
  kvbm_publisher_stage *st = NULL;
  kvbm_publisher_config o = slow_batches(8);
  o.queue_bytes = 64;
  assert_int_equal(kvbm_publisher_create(&o, &p, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_stage_create(p, 0, &st, &err), KVBM_ESTATE);
  assert_non_null(strstr(err.msg, "not started"));
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  assert_int_equal(kvbm_publisher_add_zmq(p, &zo, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_stage_create(NULL, 0, &st, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_publisher_stage_create(p, 0, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_publisher_stage_create(p, 0, &st, NULL), KVBM_OK);
  uint64_t h = 1;
  kvbm_event bad = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1};
  assert_int_equal(kvbm_publisher_stage_publish(st, &bad, &err), KVBM_EINVAL); /* no block size */
  assert_non_null(strstr(err.msg, "block size"));
  bad = (kvbm_event){.type = (kvbm_event_type)99};
  assert_int_equal(kvbm_publisher_stage_publish(st, &bad, &err), KVBM_EINVAL);
  uint32_t t[64] = {0};
  kvbm_event big = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1,
                    .token_ids = t, .num_tokens = 64, .block_size = 64};
  assert_int_equal(kvbm_publisher_stage_publish(st, &big, &err), KVBM_ETOOLONG);
  assert_int_equal(kvbm_publisher_stage_publish(st, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_publisher_stage_publish(NULL, &big, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_publisher_stage_flush(NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_publisher_stage_count(st), 0);
  assert_int_equal(kvbm_publisher_stage_count(NULL), 0);
  assert_int_equal(kvbm_publisher_stage_flush(st, NULL), KVBM_OK); /* nothing staged */
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, 0);
  kvbm_publisher_stage_destroy(st);
  kvbm_publisher_stage_destroy(NULL);
  kvbm_publisher_destroy(p);
}

/* A callback sink, or coalescing: the stage publishes each event at once. */
static void test_direct(void **s) {
  (void)s;
  for (int mode = 0; mode < 2; mode++) {
    kvbm_publisher *p;
    kvbm_publisher_config o = slow_batches(8);
    o.coalesce = mode == 1;
    assert_int_equal(kvbm_publisher_create(&o, &p, NULL), KVBM_OK);
    if (mode == 0) {
      assert_int_equal(kvbm_publisher_add_callback(p, on_batch, NULL, NULL), KVBM_OK);
    } else {
      kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
      assert_int_equal(kvbm_publisher_add_zmq(p, &zo, NULL), KVBM_OK);
    }
    assert_int_equal(kvbm_publisher_start(p, NULL), KVBM_OK);
    kvbm_publisher_stage *st;
    assert_int_equal(kvbm_publisher_stage_create(p, 0, &st, NULL), KVBM_OK);
    uint64_t h;
    uint32_t t[4];
    kvbm_event ev = store1(&h, t, 1);
    assert_int_equal(kvbm_publisher_stage_publish(st, &ev, NULL), KVBM_OK);
    assert_int_equal(kvbm_publisher_stage_count(st), 0);
    kvbm_publisher_stats ps;
    kvbm_publisher_stats_get(p, &ps);
    assert_int_equal(ps.accepted, 1);
    kvbm_publisher_stage_destroy(st);
    kvbm_publisher_destroy(p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_bytes_map),
      cmocka_unit_test(test_same_bytes_positional),
      cmocka_unit_test(test_not_accepted_until_handover),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_overflow_drop),
      cmocka_unit_test(test_overflow_block),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_direct),
      cmocka_unit_test(test_lean_publish),
      cmocka_unit_test(test_publish_batch_groups),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
