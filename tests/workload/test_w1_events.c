/* SPDX-License-Identifier: Apache-2.0 */
/* test_w1.c: W1 (the bundled trace, 200 requests, B 16, C 8192 so blocks
 * get evicted) replayed with events on: the pool's listener feeds a
 * publisher over ZMQ (ipc, with replay); our subscriber, applying the
 * BlockStored / BlockRemoved / AllBlocksCleared it decodes, ends up with
 * exactly the pool's registered set; with the publisher's `coalesce`
 * option too (the pool's one-block events grouped into multi-block ones:
 * fewer events, the same set). */
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
#include "workload/w1.h"
#include "workload/trace.h"

typedef struct u64v {
  uint64_t *v;
  size_t n, cap;
} u64v;

static void push(u64v *a, uint64_t x) {
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 1024;
    a->v = realloc(a->v, a->cap * sizeof *a->v);
    assert_non_null(a->v);
  }
  a->v[a->n++] = x;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void add_registered(void *user, uint32_t id, uint64_t seq_hash) {
  (void)id;
  push(user, seq_hash);
}

static void on_finish(void *user, const kvbm_pool *pool) {
  kvbm_pool_foreach_registered(pool, add_registered, user);
}

/* One operation on a hash, in stream order. */
typedef struct op {
  uint64_t hash, order;
  int add;
} op;

static int cmp_op(const void *a, const void *b) {
  const op *x = a, *y = b;
  if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

static void w1_events(bool coalesce) {
  kvsim_trace *trace;
  kvbm_error err;
  if (kvsim_trace_load(KVBM_SOURCE_DIR "/data/mooncake_conversation_trace.jsonl.gz", 200, &trace,
                      &err))
    fail_msg("%s", err.msg);
  char ep[128], rep[128];
  snprintf(ep, sizeof ep, "ipc:///tmp/kvbm-w1-%d-%d.pub", (int)getpid(), coalesce);
  snprintf(rep, sizeof rep, "ipc:///tmp/kvbm-w1-%d-%d.rep", (int)getpid(), coalesce);
  kvbm_publisher *p;
  kvbm_publisher_config po = kvbm_publisher_config_default();
  po.coalesce = coalesce;
  assert_int_equal(kvbm_publisher_create(&po, &p, &err), KVBM_OK);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default(ep);
  zo.replay_endpoint = rep;
  zo.replay_batches = 1000000;
  zo.hwm = 0; /* nothing may drop on the live path either */
  if (kvbm_publisher_add_zmq(p, &zo, &err)) fail_msg("%s", err.msg);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.replay_endpoint = rep;
  so.start_seq = 0;
  kvbm_subscriber *sub;
  assert_int_equal(kvbm_subscriber_create(&so, &sub, &err), KVBM_OK);

  kvsim_w1_config ro = kvsim_w1_config_default();
  ro.block_size = 16;
  ro.capacity = 8192;
  kvbm_pool_link link = {.pub = p, .medium = KVBM_MEDIUM_GPU, .block_size = 16};
  ro.listener = kvbm_pool_link_listener;
  ro.listener_user = &link;
  u64v truth = {0};
  ro.on_finish = on_finish;
  ro.finish_user = &truth;
  kvsim_w1_result res;
  if (kvsim_w1_run(trace, &ro, &res, &err)) fail_msg("%s", err.msg);
  assert_int_equal(res.requests, 200);
  assert_int_equal(link.failed, 0);
  assert_int_equal(kvbm_publisher_flush(p, 30000, &err), KVBM_OK);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.accepted, link.forwarded);

  op *ops = NULL;
  size_t nops = 0, cap = 0;
  uint64_t order = 0, last_clear = 0, stored = 0, removed = 0, events = 0, clears = 0;
  for (uint64_t want = 0; want < ps.batches; want++) {
    kvbm_event_batch b;
    int rc = kvbm_subscriber_recv(sub, 10000, &b, &err);
    if (rc) fail_msg("batch %llu of %llu: %s", (unsigned long long)want,
                     (unsigned long long)ps.batches, err.msg);
    assert_int_equal(b.seq, want);
    assert_int_equal(b.lost_before, 0);
    for (size_t i = 0; i < b.num_events; i++) {
      const kvbm_event *e = &b.events[i];
      events++;
      order++;
      if (e->type == KVBM_EVENT_CLEARED) {
        last_clear = order;
        clears++;
        continue;
      }
      assert_int_equal(e->medium, KVBM_MEDIUM_GPU);
      if (e->type == KVBM_EVENT_STORED) {
        stored++;
        assert_int_equal(e->block_size, 16);
        assert_int_equal(e->num_tokens, 16 * e->num_block_hashes);
      } else {
        removed++;
      }
      for (size_t k = 0; k < e->num_block_hashes; k++) {
        if (nops == cap) {
          cap = cap ? cap * 2 : 4096;
          ops = realloc(ops, cap * sizeof *ops);
          assert_non_null(ops);
        }
        ops[nops++] = (op){e->block_hashes[k], order, e->type == KVBM_EVENT_STORED};
      }
    }
  }
  if (coalesce) { /* every publish's block is on the wire once, in fewer events */
    assert_int_equal(nops + clears, ps.accepted);
    assert_true(events < ps.accepted);
  } else {
    assert_int_equal(events, ps.accepted);
  }
  assert_true(removed > 0); /* the capacity forced evictions */
  qsort(ops, nops, sizeof *ops, cmp_op);
  u64v rebuilt = {0};
  for (size_t i = 0; i < nops; i++) {
    bool last = i + 1 == nops || ops[i + 1].hash != ops[i].hash;
    if (last && ops[i].add && ops[i].order > last_clear) push(&rebuilt, ops[i].hash);
  }
  qsort(truth.v, truth.n, sizeof *truth.v, cmp_u64);
  assert_true(truth.n > 1000);
  assert_int_equal(rebuilt.n, truth.n);
  for (size_t i = 0; i < truth.n; i++) assert_true(rebuilt.v[i] == truth.v[i]);
  fprintf(stderr, "w1 events%s: %llu publishes, %llu events (%llu stored, %llu removed), %zu "
          "registered at the end\n", coalesce ? " (coalesced)" : "",
          (unsigned long long)ps.accepted, (unsigned long long)events,
          (unsigned long long)stored, (unsigned long long)removed, truth.n);
  free(ops);
  free(rebuilt.v);
  free(truth.v);
  kvbm_subscriber_destroy(sub);
  kvbm_publisher_destroy(p);
  kvsim_trace_destroy(trace);
}

static void test_w1_events_rebuild_registered_set(void **st) {
  (void)st;
  w1_events(false);
}

static void test_w1_events_coalesced(void **st) {
  (void)st;
  w1_events(true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_w1_events_rebuild_registered_set),
      cmocka_unit_test(test_w1_events_coalesced),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
