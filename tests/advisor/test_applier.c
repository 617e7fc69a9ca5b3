/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_applier.c: the loop the seed describes, with a known answer. A
 * manager (G1 8, G2 8, G3 64 blocks) publishes its KV events and its
 * storage events; the advisor's core indexes them; request A runs four
 * times between runs of B, so A's family is hot (its first run is a store,
 * not a use), and the last B pushes 3
 * of A's blocks out of G2 (they stay in G3). The advisor's hints go over a
 * real nats-server (msgpack, Kvbm-Seq) to a kvbm_hint_applier subscribed
 * for the manager, which promotes them into G2 on its own thread: the next
 * prefill of A reads at most one block from G3 (three without), and its
 * bytes are A's. Hints about
 * another engine's volumes are left alone; a batch that does not decode
 * and a Kvbm-Seq gap are counted.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include "kvbm/advisor.h"
#include "kvbm/events.h"
#include "kvbm/group.h"
#include "kvbm/hash.h"
#include "kvbm/manager.h"
#include "kvbm/storage_events.h"
#include "../tier/tier_testutil.h"
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

/* The advisor, fed from the publishers' threads at the test's clock. */
typedef struct feed {
  pthread_mutex_t mu;
  kvbm_advisor *a;
  uint64_t now;
} feed;

static void on_kv(void *user, const kvbm_event_batch *b) {
  feed *f = user;
  pthread_mutex_lock(&f->mu);
  assert_int_equal(kvbm_advisor_kv(f->a, b, f->now), KVBM_OK);
  pthread_mutex_unlock(&f->mu);
}

static void on_storage(void *user, const kvbm_storage_batch *b, const uint8_t *p, size_t n) {
  (void)p;
  (void)n;
  feed *f = user;
  pthread_mutex_lock(&f->mu);
  assert_int_equal(kvbm_advisor_storage(f->a, b, f->now), KVBM_OK);
  pthread_mutex_unlock(&f->mu);
}

static void publish(natsConnection *nc, const char *subject, uint64_t seq, const uint8_t *p,
                    size_t n) {
  natsMsg *msg;
  char v[24];
  snprintf(v, sizeof v, "%llu", (unsigned long long)seq);
  assert_int_equal(natsMsg_Create(&msg, subject, NULL, (const char *)p, (int)n), NATS_OK);
  assert_int_equal(natsMsgHeader_Set(msg, "Kvbm-Seq", v), NATS_OK);
  assert_int_equal(natsConnection_PublishMsg(nc, msg), NATS_OK);
  natsMsg_Destroy(msg);
}

static void wait_batches(kvbm_hint_applier *ap, uint64_t n) {
  kvbm_hint_applier_stats st;
  for (int i = 0; i < 600; i++) { /* 30 s at most: a loaded machine */
    kvbm_hint_applier_stats_get(ap, &st);
    if (st.batches + st.bad_batches >= n) return;
    usleep(50000);
  }
  fail_msg("the applier received %llu of %llu batches",
           (unsigned long long)(st.batches + st.bad_batches), (unsigned long long)n);
}

static void test_loop(void **state) {
  (void)state;
  feed f = {.now = 0};
  pthread_mutex_init(&f.mu, NULL);
  kvbm_advisor_config ac = kvbm_advisor_config_default();
  assert_int_equal(kvbm_advisor_create(&ac, &f.a, NULL), KVBM_OK);

  kvbm_publisher_config pc = kvbm_publisher_config_default();
  kvbm_publisher *kv;
  assert_int_equal(kvbm_publisher_create(&pc, &kv, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(kv, on_kv, &f, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(kv, NULL), KVBM_OK);
  kvbm_storage_publisher_config sc = kvbm_storage_publisher_config_default();
  kvbm_storage_publisher *sp;
  assert_int_equal(kvbm_storage_publisher_create(&sc, &sp, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_add_callback(sp, on_storage, &f, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_start(sp, NULL), KVBM_OK);

  char *dir = tu_tmpdir("applier");
  kvbm_manager_config c = tu_config(dir, 8, 8, 64);
  kvbm_pool_link g1 = {.pub = kv, .medium = KVBM_MEDIUM_GPU, .block_size = 4};
  c.listener[KVBM_TIER_G1] = kvbm_pool_link_listener;
  c.listener_user[KVBM_TIER_G1] = &g1;
  c.storage_events = sp;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);

  kvbm_hint_applier_config hc = kvbm_hint_applier_config_default();
  hc.nats_url = srv.url;
  hc.subject = "kvbm.hints";
  kvbm_hint_applier *ap;
  kvbm_error err = {0};
  assert_int_equal(kvbm_hint_applier_create(&hc, m, &ap, &err), KVBM_OK);

  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  uint64_t ha[4];
  for (int step = 0; step < 8; step++) {
    pthread_mutex_lock(&f.mu);
    f.now = (uint64_t)step * 1000;
    pthread_mutex_unlock(&f.mu);
    kvbm_mreq *r;
    if (step % 2 == 0) {
      tu_run(m, a, 17, NULL, &r);
      for (int k = 0; k < 4; k++) kvbm_mreq_block_hash(r, (size_t)k, &ha[k]);
      kvbm_mreq_destroy(r);
    } else {
      tu_run(m, b, 29, NULL, NULL);
    }
    assert_int_equal(kvbm_publisher_flush(kv, 10000, NULL), KVBM_OK);
    assert_int_equal(kvbm_storage_publisher_flush(sp, 10000, NULL), KVBM_OK);
  }
  assert_int_equal(g1.failed, 0);

  /* The advisor's answer: promote A's blocks that sit in G3 only. */
  kvbm_hint h[256];
  size_t n;
  pthread_mutex_lock(&f.mu);
  assert_int_equal(kvbm_advisor_hints(f.a, 8000, h, 256, &n), KVBM_OK);
  kvbm_wire_hint w[256];
  size_t nw = 0, promotes = 0;
  for (size_t i = 0; i < n; i++) {
    if (h[i].kind != KVBM_HINT_PROMOTE) continue;
    bool of_a = false;
    for (int k = 0; k < 4; k++) of_a |= h[i].sequence_hash == ha[k];
    assert_true(of_a); /* B's family is as hot, but B is in G2 */
    assert_int_equal(kvbm_advisor_hint_wire(f.a, &h[i], &w[nw++]), KVBM_OK);
    promotes++;
  }
  pthread_mutex_unlock(&f.mu);
  assert_int_equal(promotes, 3);
  /* One hint about another engine's volumes. */
  w[nw] = w[0];
  w[nw].from = "someone-else";
  w[nw].from_len = strlen("someone-else");
  nw++;

  natsConnection *nc;
  assert_int_equal(natsConnection_ConnectTo(&nc, srv.url), NATS_OK);
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  kvbm_hint_batch hb = {.ts = 6.0, .source = "kvbm-advisor", .source_len = 12, .hints = w,
                        .num_hints = nw};
  assert_int_equal(kvbm_hints_encode(&hb, &buf, &len, &cap, NULL), KVBM_OK);
  publish(nc, "kvbm.hints", 0, buf, len);
  publish(nc, "kvbm.hints", 1, (const uint8_t *)"\xc1garbage", 8); /* does not decode */
  kvbm_hint_batch empty = {.ts = 7.0};
  len = 0;
  assert_int_equal(kvbm_hints_encode(&empty, &buf, &len, &cap, NULL), KVBM_OK);
  publish(nc, "kvbm.hints", 5, buf, len); /* 2, 3, 4 lost */
  assert_int_equal(natsConnection_Flush(nc), NATS_OK);
  wait_batches(ap, 3);
  kvbm_manager_flush(m); /* the promotions' copies */

  kvbm_hint_applier_stats as;
  kvbm_hint_applier_stats_get(ap, &as);
  assert_int_equal(as.batches, 2);
  assert_int_equal(as.bad_batches, 1);
  assert_int_equal(as.hints, 4);
  assert_int_equal(as.foreign, 1);
  assert_int_equal(as.applied, 3);
  assert_int_equal(as.lost, 3);
  kvbm_manager_hint_stats ms;
  kvbm_manager_hint_stats_get(m, &ms);
  assert_int_equal(ms.promoted, 3);

  /* A again: without the hints 3 blocks would come from G3; now at most
   * one does (a promotion takes G2's least recently used block, and that
   * may be the one block of A that G2 still held, older than B's), and
   * the bytes are A's. */
  kvbm_mreq *r;
  kvbm_mreq_info info;
  size_t opt;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 17, &r, &opt, NULL), KVBM_OK);
  assert_int_equal(kvbm_mreq_wait(r, -1, &info), KVBM_OK);
  assert_int_equal(info.matched_tokens, 16);
  size_t from_g3 = 0;
  for (size_t k = 0; k < 4; k++) from_g3 += kvbm_mreq_block_source(r, k) == KVBM_TIER_G3;
  assert_true(from_g3 <= 1);
  assert_int_equal(tu_verify(m, r, 4), 4);
  kvbm_mreq_destroy(r);

  free(buf);
  natsConnection_Destroy(nc);
  kvbm_hint_applier_destroy(ap);
  kvbm_manager_destroy(m);
  kvbm_storage_publisher_destroy(sp);
  kvbm_publisher_destroy(kv);
  kvbm_advisor_destroy(f.a);
  pthread_mutex_destroy(&f.mu);
  free(a);
  free(b);
  tu_rmdir(dir);
}

static void test_refusals(void **state) {
  (void)state;
  char *dir = tu_tmpdir("applier");
  kvbm_manager_config c = tu_config(dir, 8, 8, 64);
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  kvbm_hint_applier *ap = NULL;
  kvbm_error err = {0};
  kvbm_hint_applier_config hc = kvbm_hint_applier_config_default();
  hc.nats_url = srv.url;
  assert_int_equal(kvbm_hint_applier_create(&hc, m, &ap, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "subject"));
  char bad[64];
  snprintf(bad, sizeof bad, "nats://127.0.0.1:%d", nt_free_port());
  hc.nats_url = bad;
  hc.subject = "x";
  assert_int_equal(kvbm_hint_applier_create(&hc, m, &ap, &err), KVBM_EIO);
  assert_non_null(strstr(err.msg, bad));
  assert_null(ap);
  /* No NATS: batches applied by hand; COMPACT ignored. */
  assert_int_equal(kvbm_hint_applier_create(NULL, m, &ap, &err), KVBM_OK);
  kvbm_wire_hint w = {.kind = KVBM_HINT_COMPACT, .from = "g2", .from_len = 2};
  kvbm_hint_batch hb = {.hints = &w, .num_hints = 1};
  kvbm_hint_applier_apply(ap, &hb);
  kvbm_hint_applier_stats st;
  kvbm_hint_applier_stats_get(ap, &st);
  assert_int_equal(st.ignored, 1);
  /* another KV cache group's block is not this one-group manager's, even
   * with a hash and volume it knows */
  kvbm_wire_hint g = {.kind = KVBM_HINT_DROP, .sequence_hash = 1, .from = "g2", .from_len = 2,
                      .group = 1};
  hb.hints = &g;
  kvbm_hint_applier_apply(ap, &hb);
  kvbm_hint_applier_stats_get(ap, &st);
  assert_int_equal(st.foreign, 1);
  assert_int_equal(st.applied + st.not_applied, 0);
  kvbm_hint_applier_destroy(ap);
  kvbm_manager_destroy(m);
  tu_rmdir(dir);
}

/* A manager of two full-attention groups holds each block twice in G3,
 * once per group, under one sequence hash. A DROP hint names its group:
 * group 1's copy leaves and group 0's stays (the second drop of group 1
 * finds nothing; group 0's then still drops), and a group the manager
 * does not have is foreign. Before hints carried groups to the manager,
 * every group-1 hint was counted foreign. */
static void test_groups(void **state) {
  (void)state;
  char *dir = tu_tmpdir("applier-groups");
  kvbm_manager_config c = tu_config(dir, 8, 8, 64);
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_FULL, 0}};
  c.groups = g;
  c.num_groups = 2;
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  uint32_t *p = tu_prompt(7000, 16);
  kvbm_hreq *r = NULL;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, p, 16, &r, NULL, NULL), KVBM_OK);
  kvbm_hreq_info info;
  assert_int_equal(kvbm_hreq_wait(r, -1, &info), KVBM_OK);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_hreq_destroy(r);
  kvbm_manager_flush(m);
  uint64_t h = kvbm_hash_next(KVBM_HASH_NATIVE, 0, 0, false, p, 4);
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(m, h, &loc), KVBM_OK);
  assert_true(loc.held);
  const char *g3 = kvbm_manager_volume_id(m, KVBM_TIER_G3);
  assert_non_null(g3);

  kvbm_hint_applier *ap = NULL;
  assert_int_equal(kvbm_hint_applier_create(NULL, m, &ap, NULL), KVBM_OK);
  kvbm_wire_hint w = {.kind = KVBM_HINT_DROP, .sequence_hash = h, .from = g3,
                      .from_len = strlen(g3), .group = 1};
  kvbm_hint_batch hb = {.hints = &w, .num_hints = 1};
  kvbm_hint_applier_stats st;
  kvbm_hint_applier_apply(ap, &hb); /* group 1's copy leaves G3 */
  kvbm_hint_applier_stats_get(ap, &st);
  assert_int_equal(st.applied, 1);
  assert_int_equal(st.foreign, 0);
  kvbm_hint_applier_apply(ap, &hb); /* nothing of group 1 left to drop */
  kvbm_hint_applier_stats_get(ap, &st);
  assert_int_equal(st.applied, 1);
  assert_int_equal(st.not_applied, 1);
  w.group = 0; /* group 0's copy was never touched */
  kvbm_hint_applier_apply(ap, &hb);
  kvbm_hint_applier_stats_get(ap, &st);
  assert_int_equal(st.applied, 2);
  w.group = 2; /* no such group in this model */
  kvbm_hint_applier_apply(ap, &hb);
  kvbm_hint_applier_stats_get(ap, &st);
  assert_int_equal(st.foreign, 1);
  assert_int_equal(st.applied, 2);
  assert_int_equal(kvbm_manager_hint_group(m, KVBM_MANAGER_HINT_DROP, h, 2, KVBM_TIER_G3,
                                           KVBM_TIER_G3),
                   KVBM_EINVAL);
  kvbm_hint_applier_destroy(ap);
  kvbm_manager_destroy(m);
  free(p);
  tu_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_loop), cmocka_unit_test(test_refusals),
                                     cmocka_unit_test(test_groups)};
  return cmocka_run_group_tests(tests, start_server, stop_server);
}
