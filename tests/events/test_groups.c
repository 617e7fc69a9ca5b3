/* SPDX-License-Identifier: Apache-2.0 */
/* test_groups.c: KV events carry their group as vLLM's do
 * (vllm/distributed/kv_events.py: BlockStored ends with group_idx,
 * kv_cache_spec_kind, kv_cache_spec_sliding_window; BlockRemoved with
 * group_idx), over the real wire:
 *   - a pool of two groups (full + sliding window 128) linked to a
 *     publisher with a ZMQ sink on tcp loopback: the subscriber reads each
 *     event's group_idx, kind and window, in the map and positional forms;
 *   - the same stream relayed (kvbm_relay) to a second publisher keeps them;
 *   - a pool of one group publishes the bytes an encoder writes for the
 *     group-less event (kvbm before groups), byte for byte;
 *   - hostile group lists on the link are refused with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kvbm/events.h"

static kvbm_publisher *start_pub(kvbm_event_form form, char *ep, char *rep) {
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 64;
  o.form = form;
  kvbm_publisher *p;
  kvbm_error err;
  if (kvbm_publisher_create(&o, &p, &err)) fail_msg("%s", err.msg);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.replay_endpoint = "tcp://127.0.0.1:*";
  zo.replay_batches = 100;
  if (kvbm_publisher_add_zmq(p, &zo, &err)) fail_msg("%s", err.msg);
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, false, ep, 256), KVBM_OK);
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 0, true, rep, 256), KVBM_OK);
  if (kvbm_publisher_start(p, &err)) fail_msg("%s", err.msg);
  return p;
}

/* A subscriber from seq 0: replay fills in whatever it joined too late for. */
static kvbm_subscriber *sub_from_start(const char *ep, const char *rep) {
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.replay_endpoint = rep;
  so.start_seq = 0;
  kvbm_subscriber *s;
  kvbm_error err;
  if (kvbm_subscriber_create(&so, &s, &err)) fail_msg("%s", err.msg);
  return s;
}

typedef struct want {
  kvbm_event_type type;
  uint64_t hash;
  int64_t group;       /* -1: no group_idx */
  const char *kind;    /* NULL: none */
  int64_t window;      /* -1: none */
} want;

static void check_event(const kvbm_event *e, const want *w) {
  assert_int_equal(e->type, w->type);
  if (w->type != KVBM_EVENT_CLEARED) {
    assert_int_equal(e->num_block_hashes, 1);
    assert_true(e->block_hashes[0] == w->hash);
  }
  assert_int_equal(e->has_group_idx, w->group >= 0);
  if (w->group >= 0) assert_int_equal(e->group_idx, w->group);
  if (w->kind)
    assert_string_equal(e->kv_cache_spec_kind, w->kind);
  else
    assert_null(e->kv_cache_spec_kind);
  assert_int_equal(e->has_sliding_window, w->window >= 0);
  if (w->window >= 0) assert_int_equal(e->sliding_window, w->window);
}

/* Reads n events from s (any batching) and checks each against w[]. */
static void expect_events(kvbm_subscriber *s, const want *w, size_t n) {
  size_t got = 0;
  for (int t = 0; t < 100 && got < n; t++) {
    kvbm_event_batch b;
    kvbm_error err;
    int rc = kvbm_subscriber_recv(s, 100, &b, &err);
    if (rc == KVBM_ETIMEDOUT) continue;
    if (rc) fail_msg("recv: %s", err.msg);
    assert_int_equal(b.lost_before, 0);
    assert_int_equal(b.skipped, 0);
    for (size_t i = 0; i < b.num_events; i++) {
      assert_true(got < n);
      check_event(&b.events[i], &w[got++]);
    }
  }
  assert_int_equal(got, n);
}

/* Drives a two-group pool: a full-attention block and a sliding-window
 * block stored, the window's block evicted, then every block cleared. */
static void drive_two_groups(kvbm_pool *pool) {
  uint32_t a, b, out;
  const uint32_t t1[2] = {1, 2}, t2[2] = {1, 2};
  assert_int_equal(kvbm_pool_alloc_group(pool, 0, 1, &a), KVBM_OK);
  assert_int_equal(kvbm_block_fill(pool, a, 0, 0, false, t1, 100, &out), KVBM_OK);
  assert_int_equal(kvbm_pool_alloc_group(pool, 1, 1, &b), KVBM_OK);
  assert_int_equal(kvbm_block_fill(pool, b, 0, 0, false, t2, 100, &out), KVBM_OK);
  assert_int_equal(kvbm_block_release(pool, b, 0), KVBM_OK);
  uint32_t c;
  assert_int_equal(kvbm_pool_alloc_group(pool, 0, 1, &c), KVBM_OK); /* evicts b (group 1) */
  assert_int_equal(kvbm_block_release(pool, c, 0), KVBM_OK);
  assert_int_equal(kvbm_block_release(pool, a, 0), KVBM_OK);
  assert_int_equal(kvbm_pool_clear_cache(pool), KVBM_OK);
}

static const want k_two_groups[] = {
    {KVBM_EVENT_STORED, 100, 0, "full_attention", -1},
    {KVBM_EVENT_STORED, 100, 1, "sliding_window", 128},
    {KVBM_EVENT_REMOVED, 100, 1, NULL, -1},
    {KVBM_EVENT_CLEARED, 0, -1, NULL, -1},
};

static void pool_to_wire(kvbm_event_form form) {
  char ep[256], rep[256], out_ep[256], out_rep[256];
  kvbm_publisher *engine = start_pub(form, ep, rep);
  /* the relay writes the other form: a field that survives both is kept */
  kvbm_event_form other = form == KVBM_FORM_MAP ? KVBM_FORM_POSITIONAL : KVBM_FORM_MAP;
  kvbm_publisher *ours = start_pub(other, out_ep, out_rep);
  kvbm_pool_config cfg = kvbm_pool_config_default(2, 2);
  cfg.num_groups = 2;
  kvbm_pool *pool;
  kvbm_error err;
  if (kvbm_pool_create(&cfg, &pool, &err)) fail_msg("%s", err.msg);
  kvbm_pool_link link;
  assert_int_equal(kvbm_pool_link_attach(&link, pool, engine, KVBM_MEDIUM_GPU, &err), KVBM_OK);
  const kvbm_group_spec specs[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 128}};
  if (kvbm_pool_link_set_groups(&link, specs, 2, &err)) fail_msg("%s", err.msg);
  drive_two_groups(pool);
  assert_int_equal(link.failed, 0);
  assert_int_equal(link.forwarded, 4);
  assert_int_equal(kvbm_publisher_flush(engine, 5000, NULL), KVBM_OK);

  kvbm_subscriber *s = sub_from_start(ep, rep);
  expect_events(s, k_two_groups, 4);

  kvbm_subscriber_config src = kvbm_subscriber_config_default(ep);
  src.replay_endpoint = rep;
  src.start_seq = 0;
  kvbm_relay *r;
  if (kvbm_relay_create(&src, ours, &r, &err)) fail_msg("%s", err.msg);
  kvbm_relay_stats rs = {0};
  for (int t = 0; t < 100 && rs.events < 4; t++) {
    int rc = kvbm_relay_poll(r, 100, NULL, NULL);
    assert_true(rc == KVBM_OK || rc == KVBM_ETIMEDOUT);
    kvbm_relay_stats_get(r, &rs);
  }
  assert_int_equal(rs.events, 4);
  assert_int_equal(rs.refused + rs.skipped, 0);
  assert_int_equal(kvbm_publisher_flush(ours, 5000, NULL), KVBM_OK);
  kvbm_subscriber *s2 = sub_from_start(out_ep, out_rep);
  expect_events(s2, k_two_groups, 4);

  kvbm_subscriber_destroy(s2);
  kvbm_subscriber_destroy(s);
  kvbm_relay_destroy(r);
  kvbm_pool_destroy(pool);
  kvbm_publisher_destroy(ours);
  kvbm_publisher_destroy(engine);
}

static void test_two_groups_map(void **st) {
  (void)st;
  pool_to_wire(KVBM_FORM_MAP);
}

static void test_two_groups_positional(void **st) {
  (void)st;
  pool_to_wire(KVBM_FORM_POSITIONAL);
}

/* A pool of one group: no group on the wire, and the payload's bytes are
 * exactly the encoder's for the group-less events with the same ts and
 * rank (what kvbm published before groups). */
static void one_group_bytes(kvbm_event_form form) {
  char ep[256], rep[256];
  kvbm_publisher *p = start_pub(form, ep, rep);
  kvbm_pool *pool;
  kvbm_pool_config cfg = kvbm_pool_config_default(2, 2);
  assert_int_equal(kvbm_pool_create(&cfg, &pool, NULL), KVBM_OK);
  kvbm_pool_link link;
  assert_int_equal(kvbm_pool_link_attach(&link, pool, p, KVBM_MEDIUM_GPU, NULL), KVBM_OK);
  uint32_t a, out;
  const uint32_t t1[2] = {7, 8};
  assert_int_equal(kvbm_pool_alloc(pool, 1, &a), KVBM_OK);
  assert_int_equal(kvbm_block_fill(pool, a, 0, 41, true, t1, 42, &out), KVBM_OK);
  assert_int_equal(kvbm_publisher_flush(p, 5000, NULL), KVBM_OK);
  kvbm_subscriber *s = sub_from_start(ep, rep);
  kvbm_event_batch b;
  const uint8_t *raw = NULL;
  size_t raw_len = 0;
  int rc = KVBM_ETIMEDOUT;
  for (int t = 0; t < 100 && rc == KVBM_ETIMEDOUT; t++)
    rc = kvbm_subscriber_recv_raw(s, 100, &b, &raw, &raw_len, NULL);
  assert_int_equal(rc, KVBM_OK);
  assert_int_equal(b.num_events, 1);
  assert_false(b.events[0].has_group_idx);
  assert_null(b.events[0].kv_cache_spec_kind);

  const uint64_t h = 42;
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1,
                   .parent_hash = 41, .has_parent = true, .token_ids = t1, .num_tokens = 2,
                   .block_size = 2, .medium = KVBM_MEDIUM_GPU};
  kvbm_event_batch mine = {.ts = b.ts, .dp_rank = b.dp_rank, .has_dp_rank = b.has_dp_rank,
                           .events = &ev, .num_events = 1};
  kvbm_event_encoder_config ec = kvbm_event_encoder_config_default();
  ec.form = form;
  kvbm_event_encoder *enc;
  assert_int_equal(kvbm_event_encoder_create(&ec, &enc, NULL), KVBM_OK);
  const uint8_t *data;
  size_t len;
  assert_int_equal(kvbm_event_encode(enc, &mine, &data, &len, NULL), KVBM_OK);
  assert_int_equal(len, raw_len);
  assert_memory_equal(data, raw, len);
  kvbm_event_encoder_destroy(enc);
  kvbm_subscriber_destroy(s);
  kvbm_pool_destroy(pool);
  kvbm_publisher_destroy(p);
}

static void test_one_group_bytes_unchanged(void **st) {
  (void)st;
  one_group_bytes(KVBM_FORM_MAP);
  one_group_bytes(KVBM_FORM_POSITIONAL);
}

static void test_link_groups_refused(void **st) {
  (void)st;
  kvbm_pool_link link = {0};
  kvbm_error err;
  kvbm_group_spec g[KVBM_GROUPS_MAX + 1] = {{KVBM_GROUP_FULL, 0}};
  assert_int_equal(kvbm_pool_link_set_groups(&link, g, KVBM_GROUPS_MAX + 1, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "at most"));
  g[1] = (kvbm_group_spec){KVBM_GROUP_SLIDING_WINDOW, 0};
  assert_int_equal(kvbm_pool_link_set_groups(&link, g, 2, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "group 1 (sliding_window)"));
  g[1] = (kvbm_group_spec){(kvbm_group_kind)99, 4};
  assert_int_equal(kvbm_pool_link_set_groups(&link, g, 2, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "unknown kind 99"));
  g[1] = (kvbm_group_spec){KVBM_GROUP_MAMBA, 4};
  assert_int_equal(kvbm_pool_link_set_groups(&link, g, 2, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "group 1 (mamba)"));
  assert_int_equal(kvbm_pool_link_set_groups(&link, NULL, 1, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_link_set_groups(NULL, g, 1, &err), KVBM_EINVAL);
  assert_int_equal(link.num_groups, 0); /* unchanged by every refusal */
  assert_false(link.with_groups);
  g[1] = (kvbm_group_spec){KVBM_GROUP_CHUNKED_LOCAL, 8192};
  assert_int_equal(kvbm_pool_link_set_groups(&link, g, 2, &err), KVBM_OK);
  assert_int_equal(link.num_groups, 2);
  assert_true(link.with_groups);
  assert_int_equal(kvbm_pool_link_set_groups(&link, NULL, 0, &err), KVBM_OK);
  assert_false(link.with_groups);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_groups_map),
      cmocka_unit_test(test_two_groups_positional),
      cmocka_unit_test(test_one_group_bytes_unchanged),
      cmocka_unit_test(test_link_groups_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
