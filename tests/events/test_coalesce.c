/* SPDX-License-Identifier: Apache-2.0 */
/* test_coalesce.c: the publisher's `coalesce` option, through a ZMQ sink
 * and our subscriber (tcp loopback). One-block BlockStored events that
 * chain (parent = the last hash, whole blocks, the same medium, group,
 * LoRA and size) leave as one multi-block BlockStored with the blocks'
 * tokens in order and the first one's parent, as vLLM sends a step;
 * consecutive one-block BlockRemoved of one medium and group as one
 * BlockRemoved. Anything else ends a run: a break in the chain, another
 * medium, group, rank or type, a partial block, an event with a name, a
 * full batch (max_batch_events counts publishes). Off (the default) every
 * publish is its own event. Coalescing beside a callback sink is refused
 * at start. A pool's link, publishing one block at a time, gets a prompt's
 * blocks as one event. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvbm/events.h"

typedef struct pair {
  kvbm_publisher *p;
  kvbm_subscriber *s;
} pair;

/* A publisher with one ZMQ sink (and its replay socket) and a subscriber
 * that replays from batch 0, so that no batch is lost to the
 * subscription's start. */
static pair open_pair(bool coalesce, size_t max_batch) {
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = max_batch;
  o.max_batch_delay_us = 60u * 1000 * 1000; /* batches leave on flush or when full */
  o.coalesce = coalesce;
  pair r;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(&o, &r.p, &err), KVBM_OK);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.mode = KVBM_ZMQ_BIND;
  zo.replay_endpoint = "tcp://127.0.0.1:*";
  if (kvbm_publisher_add_zmq(r.p, &zo, &err)) fail_msg("%s", err.msg);
  char ep[256], rep[256];
  assert_int_equal(kvbm_publisher_zmq_endpoint(r.p, 0, false, ep, sizeof ep), KVBM_OK);
  assert_int_equal(kvbm_publisher_zmq_endpoint(r.p, 0, true, rep, sizeof rep), KVBM_OK);
  if (kvbm_publisher_start(r.p, &err)) fail_msg("%s", err.msg);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.replay_endpoint = rep;
  so.start_seq = 0;
  assert_int_equal(kvbm_subscriber_create(&so, &r.s, NULL), KVBM_OK);
  /* Replay covers what was sent before the subscription reached the PUB
   * socket only up to the last batch received: a batch lost after it
   * shows only when a later one comes. So the subscription must be live
   * before the first publish (as in test_zmq). */
  usleep(300000);
  return r;
}

static void close_pair(pair *r) {
  kvbm_subscriber_destroy(r->s);
  kvbm_publisher_destroy(r->p);
}

/* A one-block store of hash h (parent `parent` unless NO_PARENT), block
 * size 4, tokens 4h..4h+3 (ntok of them). */
#define NO_PARENT UINT64_MAX
static uint32_t g_tok[64][4];
static uint64_t g_h[64];
static kvbm_event store(uint64_t h, uint64_t parent, size_t ntok) {
  size_t slot = h % 64;
  g_h[slot] = h;
  for (uint32_t j = 0; j < 4; j++) g_tok[slot][j] = (uint32_t)(4 * h + j);
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_hashes = &g_h[slot], .num_block_hashes = 1,
                   .token_ids = g_tok[slot], .num_tokens = ntok, .block_size = 4,
                   .medium = KVBM_MEDIUM_GPU};
  if (parent != NO_PARENT) ev.has_parent = true, ev.parent_hash = parent;
  return ev;
}

static kvbm_event removed(uint64_t h) {
  size_t slot = h % 64;
  g_h[slot] = h;
  return (kvbm_event){.type = KVBM_EVENT_REMOVED, .block_hashes = &g_h[slot],
                      .num_block_hashes = 1, .medium = KVBM_MEDIUM_GPU};
}

static void pub(kvbm_publisher *p, kvbm_event ev) {
  kvbm_error err;
  if (kvbm_publisher_publish(p, &ev, NULL, &err)) fail_msg("%s", err.msg);
}

static kvbm_event_batch recv_batch(kvbm_subscriber *s) {
  kvbm_event_batch b;
  kvbm_error err;
  if (kvbm_subscriber_recv(s, 5000, &b, &err)) fail_msg("%s", err.msg);
  assert_int_equal(b.lost_before, 0);
  return b;
}

/* Event e is a BlockStored of blocks first..first+n-1 (hashes = numbers),
 * parent `parent`, their 4 tokens each. */
static void expect_stored(const kvbm_event *e, uint64_t first, size_t n, uint64_t parent) {
  assert_int_equal(e->type, KVBM_EVENT_STORED);
  assert_int_equal(e->num_block_hashes, n);
  for (size_t i = 0; i < n; i++) assert_true(e->block_hashes[i] == first + i);
  if (parent == NO_PARENT) {
    assert_false(e->has_parent);
  } else {
    assert_true(e->has_parent);
    assert_true(e->parent_hash == parent);
  }
  assert_int_equal(e->block_size, 4);
  assert_int_equal(e->num_tokens, 4 * n);
  for (size_t i = 0; i < 4 * n; i++) assert_int_equal(e->token_ids[i], 4 * first + i);
}

static void expect_removed(const kvbm_event *e, uint64_t first, size_t n) {
  assert_int_equal(e->type, KVBM_EVENT_REMOVED);
  assert_int_equal(e->num_block_hashes, n);
  for (size_t i = 0; i < n; i++) assert_true(e->block_hashes[i] == first + i);
}

/* A chain, removes, then each thing that ends a run. */
static void test_runs_and_breaks(void **st) {
  (void)st;
  pair r = open_pair(true, 256);
  pub(r.p, store(10, 9, 4)); /* a chain of 5: 10..14, parent 9 */
  for (uint64_t h = 11; h < 15; h++) pub(r.p, store(h, h - 1, 4));
  for (uint64_t h = 10; h < 13; h++) pub(r.p, removed(h)); /* 3 removes, one event */
  pub(r.p, store(20, 5, 4)); /* not chained to 12: a new run (20, 21) */
  pub(r.p, store(21, 20, 4));
  kvbm_event cpu = store(22, 21, 4); /* chained but another medium */
  cpu.medium = KVBM_MEDIUM_CPU;
  pub(r.p, cpu);
  pub(r.p, store(23, 22, 2)); /* a partial block: alone */
  kvbm_event named = store(24, 23, 4); /* a name: alone, and ends the run */
  named.lora_name = "adapter";
  pub(r.p, named);
  pub(r.p, store(25, 24, 4)); /* after it: a new run 25, 26 */
  pub(r.p, store(26, 25, 4));
  kvbm_event grp = store(27, 26, 4); /* another group */
  grp.has_group_idx = true;
  grp.group_idx = 1;
  pub(r.p, grp);
  kvbm_event cleared = {.type = KVBM_EVENT_CLEARED};
  pub(r.p, cleared);
  pub(r.p, store(30, NO_PARENT, 4)); /* a root block starts a run too */
  pub(r.p, store(31, 30, 4));
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  kvbm_event_batch b = recv_batch(r.s);
  assert_int_equal(b.num_events, 10);
  expect_stored(&b.events[0], 10, 5, 9);
  expect_removed(&b.events[1], 10, 3);
  expect_stored(&b.events[2], 20, 2, 5);
  expect_stored(&b.events[3], 22, 1, 21);
  assert_int_equal(b.events[3].medium, KVBM_MEDIUM_CPU);
  assert_int_equal(b.events[4].num_tokens, 2); /* 23, partial */
  assert_string_equal(b.events[5].lora_name, "adapter");
  expect_stored(&b.events[6], 25, 2, 24);
  assert_false(b.events[6].has_group_idx);
  expect_stored(&b.events[7], 27, 1, 26);
  assert_true(b.events[7].has_group_idx);
  assert_int_equal(b.events[7].group_idx, 1);
  assert_int_equal(b.events[8].type, KVBM_EVENT_CLEARED);
  expect_stored(&b.events[9], 30, 2, NO_PARENT);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(r.p, &ps);
  assert_int_equal(ps.accepted, 19); /* ids and counts are per publish */
  assert_int_equal(ps.sent_events, 19);
  assert_int_equal(ps.batches, 1);
  close_pair(&r);
}

/* A store run and a remove run open at once (a pool at capacity evicts
 * one block for each it registers): the runs leave in the order they
 * opened. A block that would join the run leaving first while its hash
 * is in the other closes both first, so that a hash stored and removed
 * (or removed and stored again) keeps its order. */
static void test_interleaved(void **st) {
  (void)st;
  pair r = open_pair(true, 256);
  pub(r.p, removed(50)); /* evict, register, evict, register, ... */
  pub(r.p, store(1, 0, 4));
  pub(r.p, removed(51));
  pub(r.p, store(2, 1, 4));
  pub(r.p, removed(52));
  pub(r.p, store(3, 2, 4));
  pub(r.p, removed(3));     /* 3 is in the store run, which leaves second: both close */
  pub(r.p, store(4, 3, 4)); /* a new store run after a new remove run */
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  kvbm_event_batch b = recv_batch(r.s);
  assert_int_equal(b.num_events, 4);
  expect_removed(&b.events[0], 50, 3); /* opened first, leaves first */
  expect_stored(&b.events[1], 1, 3, 0);
  expect_removed(&b.events[2], 3, 1); /* after its store, as published: 3 ends removed */
  expect_stored(&b.events[3], 4, 1, 3);
  /* Stores opened first: a remove of 7 joins the remove run (leaving
   * second) freely; a store of 7 into the store run (leaving first)
   * would put it before its remove, so both close first. */
  pub(r.p, store(6, 5, 4));
  pub(r.p, removed(6)); /* stored then removed: the order the runs keep */
  pub(r.p, removed(7));
  pub(r.p, store(7, 6, 4));
  pub(r.p, store(8, 7, 4));
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  b = recv_batch(r.s);
  assert_int_equal(b.num_events, 3);
  expect_stored(&b.events[0], 6, 1, 5);
  expect_removed(&b.events[1], 6, 2);
  expect_stored(&b.events[2], 7, 2, 6); /* 7 ends stored, as published */
  close_pair(&r);
}

/* max_batch_events counts publishes: a chain of 10 in batches of 4 is
 * events of 4, 4 and 2 blocks, each continuing the last. */
static void test_batch_bound(void **st) {
  (void)st;
  pair r = open_pair(true, 4);
  for (uint64_t h = 100; h < 110; h++) pub(r.p, store(h, h - 1, 4));
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  for (uint64_t i = 0; i < 3; i++) {
    kvbm_event_batch b = recv_batch(r.s);
    assert_int_equal(b.seq, i);
    assert_int_equal(b.num_events, 1);
    expect_stored(&b.events[0], 100 + 4 * i, i < 2 ? 4 : 2, 99 + 4 * i);
  }
  close_pair(&r);
}

/* A run never spans a flush: what was sent is not reopened. */
static void test_flush_ends_run(void **st) {
  (void)st;
  pair r = open_pair(true, 256);
  pub(r.p, store(1, 0, 4));
  pub(r.p, store(2, 1, 4));
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  pub(r.p, store(3, 2, 4));
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  kvbm_event_batch b = recv_batch(r.s);
  assert_int_equal(b.num_events, 1);
  expect_stored(&b.events[0], 1, 2, 0);
  b = recv_batch(r.s);
  assert_int_equal(b.num_events, 1);
  expect_stored(&b.events[0], 3, 1, 2);
  close_pair(&r);
}

/* Another dp_rank (publish_batch keeps a batch's own) ends a run. */
static void test_rank_ends_run(void **st) {
  (void)st;
  pair r = open_pair(true, 256);
  pub(r.p, store(1, 0, 4));
  kvbm_event other = store(2, 1, 4);
  kvbm_event_batch in = {.has_dp_rank = true, .dp_rank = 3, .events = &other, .num_events = 1};
  assert_int_equal(kvbm_publisher_publish_batch(r.p, &in, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  kvbm_event_batch b = recv_batch(r.s);
  assert_int_equal(b.dp_rank, 0);
  assert_int_equal(b.num_events, 1);
  expect_stored(&b.events[0], 1, 1, 0);
  b = recv_batch(r.s);
  assert_int_equal(b.dp_rank, 3);
  expect_stored(&b.events[0], 2, 1, 1);
  close_pair(&r);
}

/* Off (the default): each publish is its own event, as before. */
static void test_off_by_default(void **st) {
  (void)st;
  assert_false(kvbm_publisher_config_default().coalesce);
  pair r = open_pair(false, 256);
  for (uint64_t h = 10; h < 15; h++) pub(r.p, store(h, h - 1, 4));
  for (uint64_t h = 10; h < 13; h++) pub(r.p, removed(h));
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  kvbm_event_batch b = recv_batch(r.s);
  assert_int_equal(b.num_events, 8);
  for (uint64_t i = 0; i < 5; i++) expect_stored(&b.events[i], 10 + i, 1, 9 + i);
  for (uint64_t i = 0; i < 3; i++) expect_removed(&b.events[5 + i], 10 + i, 1);
  close_pair(&r);
}

/* The pool link's one-block events (what coalescing is for): a prompt's
 * blocks registered in order leave as one BlockStored of those blocks,
 * the evictions that make room for the next one as one BlockRemoved. */
static void test_pool_link_runs(void **st) {
  (void)st;
  pair r = open_pair(true, 256);
  kvbm_pool_config cfg = kvbm_pool_config_default(3, 2);
  kvbm_pool *pool;
  kvbm_error err;
  if (kvbm_pool_create(&cfg, &pool, &err)) fail_msg("%s", err.msg);
  kvbm_pool_link link;
  assert_int_equal(kvbm_pool_link_attach(&link, pool, r.p, KVBM_MEDIUM_GPU, &err), KVBM_OK);
  uint32_t ids[3], out;
  assert_int_equal(kvbm_pool_alloc(pool, 3, ids), KVBM_OK);
  const uint32_t t[3][2] = {{1, 2}, {3, 4}, {5, 6}};
  for (uint32_t i = 0; i < 3; i++)
    assert_int_equal(kvbm_block_fill(pool, ids[i], 0, 100 * i, i > 0, t[i], 100 * (i + 1), &out),
                     KVBM_OK);
  for (uint32_t i = 0; i < 3; i++) assert_int_equal(kvbm_block_release(pool, ids[2 - i], 0), KVBM_OK);
  assert_int_equal(kvbm_pool_alloc(pool, 3, ids), KVBM_OK); /* evicts all three */
  assert_int_equal(kvbm_publisher_flush(r.p, 5000, NULL), KVBM_OK);
  assert_int_equal(link.forwarded, 6);
  kvbm_event_batch b = recv_batch(r.s);
  assert_int_equal(b.num_events, 2);
  const kvbm_event *e = &b.events[0];
  assert_int_equal(e->type, KVBM_EVENT_STORED);
  assert_int_equal(e->num_block_hashes, 3);
  assert_false(e->has_parent);
  assert_int_equal(e->block_size, 2);
  assert_int_equal(e->num_tokens, 6);
  for (uint32_t i = 0; i < 3; i++) {
    assert_true(e->block_hashes[i] == 100 * (i + 1));
    assert_int_equal(e->token_ids[2 * i], t[i][0]);
    assert_int_equal(e->token_ids[2 * i + 1], t[i][1]);
  }
  e = &b.events[1];
  assert_int_equal(e->type, KVBM_EVENT_REMOVED);
  assert_int_equal(e->num_block_hashes, 3);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < 3; i++) sum += e->block_hashes[i];
  assert_true(sum == 600);
  kvbm_pool_destroy(pool);
  close_pair(&r);
}

static void on_batch(void *user, const kvbm_event_batch *b) {
  (void)user;
  (void)b;
}

/* A callback gets the events as published: coalescing beside one is
 * refused, with a message, and the publisher can still be freed. */
static void test_refused_with_callback(void **st) {
  (void)st;
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.coalesce = true;
  kvbm_publisher *p;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(p, on_batch, NULL, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "coalesce"));
  kvbm_publisher_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_and_breaks),  cmocka_unit_test(test_batch_bound),
      cmocka_unit_test(test_flush_ends_run),   cmocka_unit_test(test_rank_ends_run),
      cmocka_unit_test(test_off_by_default),   cmocka_unit_test(test_refused_with_callback),
      cmocka_unit_test(test_pool_link_runs),   cmocka_unit_test(test_interleaved),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
