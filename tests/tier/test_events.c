/* SPDX-License-Identifier: Apache-2.0 */
/* Tier events: each tier's pool reports through kvbm_pool_link to one
 * publisher with its medium (G1 GPU, G2 CPU, G3 DISK), as the router and
 * the storage advisor expect them. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kvbm/events.h"
#include "kvbm/storage_events.h"
#include "tier_testutil.h"

typedef struct seen {
  pthread_mutex_t mu;
  size_t stored[6], removed[6];
  uint64_t g2_hashes[16];
  size_t ng2;
  int g2_tokens_ok;
} seen;

static void on_batch(void *user, const kvbm_event_batch *b) {
  seen *s = user;
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < b->num_events; i++) {
    const kvbm_event *e = &b->events[i];
    if (e->type == KVBM_EVENT_STORED) {
      s->stored[e->medium]++;
      if (e->medium == KVBM_MEDIUM_CPU && s->ng2 < 16) {
        s->g2_hashes[s->ng2++] = e->block_hashes[0];
        /* A's tokens are 1000, 1001, ...: block k holds 1000 + 4k .. */
        if (e->num_tokens != 4 || e->token_ids[1] != e->token_ids[0] + 1) s->g2_tokens_ok = 0;
      }
    } else if (e->type == KVBM_EVENT_REMOVED) {
      s->removed[e->medium] += e->num_block_hashes;
    }
  }
  pthread_mutex_unlock(&s->mu);
}

static void test_events_per_tier(void **st) {
  (void)st;
  seen s = {.g2_tokens_ok = 1};
  pthread_mutex_init(&s.mu, NULL);
  kvbm_publisher_config po = kvbm_publisher_config_default();
  po.overflow = KVBM_OVERFLOW_DROP; /* listeners run under the manager lock */
  kvbm_publisher *pub;
  assert_int_equal(kvbm_publisher_create(&po, &pub, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(pub, on_batch, &s, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(pub, NULL), KVBM_OK);
  kvbm_pool_link links[3] = {
      {.pub = pub, .medium = KVBM_MEDIUM_GPU, .block_size = 4},
      {.pub = pub, .medium = KVBM_MEDIUM_CPU, .block_size = 4},
      {.pub = pub, .medium = KVBM_MEDIUM_DISK, .block_size = 4},
  };
  char *dir = tu_tmpdir("events");
  kvbm_manager_config c = tu_config(dir, 8, 8, 64);
  for (int t = 0; t < 3; t++) {
    c.listener[t] = kvbm_pool_link_listener;
    c.listener_user[t] = &links[t];
  }
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq *r;
  tu_run(m, a, 17, NULL, &r);
  uint64_t ha[4];
  for (int k = 0; k < 4; k++) kvbm_mreq_block_hash(r, (size_t)k, &ha[k]);
  kvbm_mreq_destroy(r);
  tu_run(m, b, 29, NULL, NULL);
  kvbm_manager_destroy(m);
  assert_int_equal(kvbm_publisher_flush(pub, 5000, NULL), KVBM_OK);
  pthread_mutex_lock(&s.mu);
  assert_int_equal(s.stored[KVBM_MEDIUM_GPU], 4 + 7);
  assert_int_equal(s.stored[KVBM_MEDIUM_CPU], 4 + 7);
  assert_int_equal(s.stored[KVBM_MEDIUM_DISK], 4 + 7);
  assert_int_equal(s.removed[KVBM_MEDIUM_GPU], 4);  /* A's blocks leave G1 for B */
  assert_int_equal(s.removed[KVBM_MEDIUM_CPU], 3);  /* and 3 of them leave G2 */
  assert_int_equal(s.removed[KVBM_MEDIUM_DISK], 0); /* G3 keeps everything */
  for (int k = 0; k < 4; k++) assert_int_equal(s.g2_hashes[k], ha[k]);
  assert_true(s.g2_tokens_ok);
  pthread_mutex_unlock(&s.mu);
  for (int t = 0; t < 3; t++) assert_int_equal(links[t].failed, 0);
  kvbm_publisher_destroy(pub);
  pthread_mutex_destroy(&s.mu);
  free(a);
  free(b);
  tu_rmdir(dir);
}

/* Storage events: the manager sends a Store per block it registers in G2,
 * G3 and G4 (file://) and a Remove per block leaving them, each naming its volume, with
 * the request's first block as prefix_hash and the block's bytes. Checked
 * on the wire form (each batch decoded again). */
typedef struct sseen {
  pthread_mutex_t mu;
  kvbm_storage_decoder *dec;
  size_t store[KVBM_TIER_COUNT], remove[KVBM_TIER_COUNT], bad;
  uint64_t g2_prefix[16], g3_prefix[16], g3_hash[16], bytes;
  size_t ng2, ng3;
  char g3_loc[KVBM_STORAGE_MAX_LOCATION + 1], g4_loc[KVBM_STORAGE_MAX_LOCATION + 1];
  uint64_t g4_prefix0;
} sseen;

static void on_storage(void *user, const kvbm_storage_batch *b0, const uint8_t *payload,
                       size_t len) {
  (void)b0;
  sseen *s = user;
  kvbm_storage_batch b;
  pthread_mutex_lock(&s->mu);
  if (kvbm_storage_decode(s->dec, payload, len, b0->seq, &b, NULL) != KVBM_OK) {
    s->bad++;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  for (size_t i = 0; i < b.num_events; i++) {
    const kvbm_storage_event *e = &b.events[i];
    if (e->tier < KVBM_TIER_G2 || e->tier >= KVBM_TIER_COUNT) {
      s->bad++;
      continue;
    }
    if (s->bytes && e->block_size != s->bytes) s->bad++;
    s->bytes = e->block_size;
    if (e->type == KVBM_STORAGE_REMOVE) {
      s->remove[e->tier]++;
      continue;
    }
    s->store[e->tier]++;
    if (e->tier == KVBM_TIER_G2) {
      if (e->location_len != 7 || memcmp(e->location, "host-g2", 7)) s->bad++;
      if (s->ng2 < 16) s->g2_prefix[s->ng2++] = e->prefix_hash;
    } else if (e->tier == KVBM_TIER_G4) {
      if (!s->g4_loc[0]) s->g4_prefix0 = e->prefix_hash;
      memcpy(s->g4_loc, e->location, e->location_len);
      s->g4_loc[e->location_len] = 0;
    } else if (e->tier == KVBM_TIER_G3 && s->ng3 < 16) {
      memcpy(s->g3_loc, e->location, e->location_len);
      s->g3_loc[e->location_len] = 0;
      s->g3_hash[s->ng3] = e->sequence_hash;
      s->g3_prefix[s->ng3++] = e->prefix_hash;
    }
  }
  pthread_mutex_unlock(&s->mu);
}

static void test_storage_events(void **st) {
  (void)st;
  sseen s = {0};
  pthread_mutex_init(&s.mu, NULL);
  assert_int_equal(kvbm_storage_decoder_create(&s.dec, NULL), KVBM_OK);
  kvbm_storage_publisher_config pc = kvbm_storage_publisher_config_default();
  pc.source = "engine-1";
  kvbm_storage_publisher *pub;
  assert_int_equal(kvbm_storage_publisher_create(&pc, &pub, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_add_callback(pub, on_storage, &s, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_start(pub, NULL), KVBM_OK);
  char *dir = tu_tmpdir("sevents"), *dir4 = tu_tmpdir("sevents-g4");
  char url4[600];
  snprintf(url4, sizeof url4, "file://%s", dir4);
  kvbm_manager_config c = tu_config(dir, 8, 8, 64);
  c.g4_url = url4;
  c.storage_events = pub;
  c.g2_volume_name = "host-g2";
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq *r;
  tu_run(m, a, 17, NULL, &r);
  uint64_t ha[4];
  for (int k = 0; k < 4; k++) kvbm_mreq_block_hash(r, (size_t)k, &ha[k]);
  kvbm_mreq_destroy(r);
  tu_run(m, b, 29, NULL, &r);
  uint64_t hb0;
  kvbm_mreq_block_hash(r, 0, &hb0);
  kvbm_mreq_destroy(r);
  kvbm_manager_destroy(m);
  assert_int_equal(kvbm_storage_publisher_flush(pub, 5000, NULL), KVBM_OK);
  pthread_mutex_lock(&s.mu);
  assert_int_equal(s.bad, 0);
  assert_int_equal(s.store[KVBM_TIER_G1], 0);
  assert_int_equal(s.store[KVBM_TIER_G2], 4 + 7);
  assert_int_equal(s.store[KVBM_TIER_G3], 4 + 7);
  assert_int_equal(s.store[KVBM_TIER_G4], 4 + 7);
  assert_int_equal(s.remove[KVBM_TIER_G4], 0);
  assert_int_equal(s.g4_prefix0, ha[0]);
  assert_true(strlen(s.g4_loc) > 0);
  assert_string_not_equal(s.g4_loc, s.g3_loc);
  assert_int_equal(s.remove[KVBM_TIER_G2], 3); /* B's 7 blocks push 3 of A's out of 8 */
  assert_int_equal(s.remove[KVBM_TIER_G3], 0);
  assert_int_equal(s.bytes, 3 * 2 * 4 * 8 * 2); /* layers x outer x page x inner x dtype */
  for (size_t k = 0; k < 4; k++) {
    assert_int_equal(s.g2_prefix[k], ha[0]);
    assert_int_equal(s.g3_prefix[k], ha[0]);
    assert_int_equal(s.g3_hash[k], ha[k]);
  }
  for (size_t k = 4; k < 11; k++) {
    assert_int_equal(s.g2_prefix[k], hb0);
    assert_int_equal(s.g3_prefix[k], hb0);
  }
  assert_true(strlen(s.g3_loc) > 0);
  assert_string_not_equal(s.g3_loc, "host-g2");
  pthread_mutex_unlock(&s.mu);
  kvbm_storage_publisher_stats ps;
  kvbm_storage_publisher_stats_get(pub, &ps);
  assert_int_equal(ps.published, 3 * (4 + 7) + 3);
  assert_int_equal(ps.dropped, 0);
  kvbm_storage_publisher_destroy(pub);
  kvbm_storage_decoder_destroy(s.dec);
  pthread_mutex_destroy(&s.mu);
  free(a);
  free(b);
  tu_rmdir(dir);
  tu_rmdir(dir4);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_events_per_tier),
                                     cmocka_unit_test(test_storage_events)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
