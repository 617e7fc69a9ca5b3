/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_hybrid_events.c: a manager of several KV cache groups publishes its
 * tiers' events as vLLM does (issue 20, "Every KV event carries its group
 * and spec kind"; docs/areas/hybrid.md, "Tiers: the manager with groups").
 *
 * The manager registers group g's blocks under a mixed key in every tier
 * (kvbm__group_key). Its events must not show that key: a router indexing
 * them would see hashes no engine ever computed. What the test holds it to,
 * on the wire (every KV batch encoded and decoded again, every storage
 * batch decoded):
 *   - every BlockStored of G1 (GPU), G2 (CPU) and G3 (DISK) carries the
 *     block's own sequence hash, its parent's, group_idx, and the group's
 *     kv_cache_spec_kind (and the window for sw:W): both groups of one
 *     prompt publish the same hashes, told apart by group_idx;
 *   - every BlockRemoved (G1 and G2 evictions) names a hash of the prompt
 *     and the group of the block that left;
 *   - storage events (G2, G3) carry the plain hash and, in extra_metadata,
 *     group_idx and kv_cache_spec_kind (the advisor keeps groups apart by
 *     group_idx).
 * A one-group manager's bytes are checked unchanged by test_events.c.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/event_codec.h"
#include "kvbm/events.h"
#include "kvbm/hash.h"
#include "kvbm/storage_events.h"
#include "tier_testutil.h"

#define B 4
#define MAXREC 256

typedef struct rec {
  int type;          /* KVBM_EVENT_STORED, KVBM_EVENT_REMOVED */
  int medium;
  uint64_t hash, parent;
  bool has_parent;
  int64_t group;     /* -1: none on the wire */
  char kind[32];
  int64_t window;    /* -1: none */
} rec;

typedef struct seen {
  pthread_mutex_t mu;
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  rec r[MAXREC];
  size_t n, bad;
} seen;

/* Each batch through the real wire: encoded, decoded again, recorded. */
static void on_batch(void *user, const kvbm_event_batch *b0) {
  seen *s = user;
  pthread_mutex_lock(&s->mu);
  const uint8_t *data;
  size_t len;
  kvbm_event_batch b;
  if (kvbm_event_encode(s->enc, b0, &data, &len, NULL) ||
      kvbm_event_decode(s->dec, data, len, 0, &b, NULL) || b.num_events != b0->num_events) {
    s->bad++;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  for (size_t i = 0; i < b.num_events; i++) {
    const kvbm_event *e = &b.events[i];
    if (e->type != KVBM_EVENT_STORED && e->type != KVBM_EVENT_REMOVED) continue;
    for (size_t h = 0; h < e->num_block_hashes && s->n < MAXREC; h++) {
      rec *r = &s->r[s->n++];
      memset(r, 0, sizeof *r);
      r->type = e->type;
      r->medium = e->medium;
      r->hash = e->block_hashes[h];
      r->parent = e->parent_hash;
      r->has_parent = e->has_parent;
      r->group = e->has_group_idx ? e->group_idx : -1;
      if (e->kv_cache_spec_kind) snprintf(r->kind, sizeof r->kind, "%s", e->kv_cache_spec_kind);
      r->window = e->has_sliding_window ? (int64_t)e->sliding_window : -1;
    }
  }
  pthread_mutex_unlock(&s->mu);
}

typedef struct srec {
  int type, tier;
  uint64_t hash;
  int64_t group; /* extra_metadata's group_idx, -1: none */
  bool kind_ok;
} srec;

typedef struct sseen {
  pthread_mutex_t mu;
  kvbm_storage_decoder *dec;
  srec r[MAXREC];
  size_t n, bad;
} sseen;

/* The positive fixint after key `key` in a msgpack map (-1: absent). */
static int64_t meta_uint(const uint8_t *p, size_t n, const char *key) {
  size_t kn = strlen(key);
  for (size_t i = 0; i + kn + 2 <= n; i++)
    if (p[i] == (0xA0 | kn) && !memcmp(p + i + 1, key, kn))
      return p[i + 1 + kn] < 0x80 ? p[i + 1 + kn] : -1;
  return -1;
}

/* Whether msgpack string s is in p[0..n). */
static bool has_str(const uint8_t *p, size_t n, const char *s) {
  size_t sn = strlen(s);
  for (size_t i = 0; i + sn + 1 <= n; i++)
    if (p[i] == (0xA0 | sn) && !memcmp(p + i + 1, s, sn)) return true;
  return false;
}

static void on_storage(void *user, const kvbm_storage_batch *b0, const uint8_t *payload,
                       size_t len) {
  sseen *s = user;
  kvbm_storage_batch b;
  pthread_mutex_lock(&s->mu);
  if (kvbm_storage_decode(s->dec, payload, len, b0->seq, &b, NULL) != KVBM_OK) {
    s->bad++;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  for (size_t i = 0; i < b.num_events && s->n < MAXREC; i++) {
    const kvbm_storage_event *e = &b.events[i];
    srec *r = &s->r[s->n++];
    r->type = e->type;
    r->tier = e->tier;
    r->hash = e->sequence_hash;
    r->group = e->extra_metadata
                   ? meta_uint(e->extra_metadata, e->extra_metadata_len, "group_idx")
                   : -1;
    const char *kinds[2] = {"full_attention", "sliding_window"};
    r->kind_ok = false;
    if (r->group == 0 || r->group == 1) {
      const char *k = kinds[r->group];
      r->kind_ok = has_str(e->extra_metadata, e->extra_metadata_len, k);
    }
  }
  pthread_mutex_unlock(&s->mu);
}

/* prefill, commit (every block computed: nothing is hit), flush. */
static void hrun(kvbm_manager *m, const uint32_t *tok, size_t n) {
  kvbm_hreq *r = NULL;
  size_t hit = 1;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, tok, n, &r, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 0);
  assert_int_equal(kvbm_hreq_wait(r, -1, NULL), KVBM_OK);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_hreq_destroy(r);
}

/* The index of h in hs[0..n) (-1: none). */
static int index_of(const uint64_t *hs, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++)
    if (hs[i] == h) return (int)i;
  return -1;
}

static void test_groups_on_every_tier(void **st) {
  (void)st;
  seen s = {0};
  sseen ss = {0};
  pthread_mutex_init(&s.mu, NULL);
  pthread_mutex_init(&ss.mu, NULL);
  kvbm_event_encoder_config ec = kvbm_event_encoder_config_default();
  assert_int_equal(kvbm_event_encoder_create(&ec, &s.enc, NULL), KVBM_OK);
  assert_int_equal(kvbm_event_decoder_create(&s.dec, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_decoder_create(&ss.dec, NULL), KVBM_OK);

  kvbm_publisher_config po = kvbm_publisher_config_default();
  po.overflow = KVBM_OVERFLOW_DROP; /* listeners run under the manager lock */
  kvbm_publisher *pub;
  assert_int_equal(kvbm_publisher_create(&po, &pub, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(pub, on_batch, &s, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(pub, NULL), KVBM_OK);
  kvbm_storage_publisher_config spc = kvbm_storage_publisher_config_default();
  spc.source = "engine-h";
  kvbm_storage_publisher *spub;
  assert_int_equal(kvbm_storage_publisher_create(&spc, &spub, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_add_callback(spub, on_storage, &ss, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_start(spub, NULL), KVBM_OK);

  const kvbm_group_spec groups[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}};
  kvbm_pool_link links[3] = {
      {.pub = pub, .medium = KVBM_MEDIUM_GPU, .block_size = B},
      {.pub = pub, .medium = KVBM_MEDIUM_CPU, .block_size = B},
      {.pub = pub, .medium = KVBM_MEDIUM_DISK, .block_size = B},
  };
  char *dir = tu_tmpdir("hevents");
  /* G1 of 12: prompt A's 2 x 4 blocks leave it for B's; G2 of 8: B's 8
   * push A's 8 out; G3 keeps everything. */
  kvbm_manager_config c = tu_config(dir, 12, 8, 64);
  c.groups = groups;
  c.num_groups = 2;
  c.g2_policy = KVBM_OFFLOAD_ALL;
  c.g2_volume_name = "host-g2";
  c.storage_events = spub;
  for (int t = 0; t < 3; t++) {
    assert_int_equal(kvbm_pool_link_set_groups(&links[t], groups, 2, NULL), KVBM_OK);
    c.listener[t] = kvbm_pool_link_listener;
    c.listener_user[t] = &links[t];
  }
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 17);
  uint64_t ha[4], hb[4];
  for (size_t k = 0; k < 4; k++) {
    ha[k] = kvbm_hash_next(c.scheme, 0, k ? ha[k - 1] : 0, k > 0, a + k * B, B);
    hb[k] = kvbm_hash_next(c.scheme, 0, k ? hb[k - 1] : 0, k > 0, b + k * B, B);
  }
  hrun(m, a, 17);
  hrun(m, b, 17);
  kvbm_manager_destroy(m);
  assert_int_equal(kvbm_publisher_flush(pub, 5000, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_flush(spub, 5000, NULL), KVBM_OK);

  /* KV events: [medium][group] stored counts of A's and B's blocks, each
   * with its plain hash, parent, group and spec. */
  size_t stored[KVBM_MEDIUM_DISK + 1][2] = {{0}}, removed[KVBM_MEDIUM_DISK + 1][2] = {{0}};
  pthread_mutex_lock(&s.mu);
  assert_int_equal(s.bad, 0);
  for (size_t i = 0; i < s.n; i++) {
    const rec *r = &s.r[i];
    assert_true(r->medium >= KVBM_MEDIUM_GPU && r->medium <= KVBM_MEDIUM_DISK);
    assert_true(r->group == 0 || r->group == 1);
    int ka = index_of(ha, 4, r->hash), kb = index_of(hb, 4, r->hash);
    assert_true(ka >= 0 || kb >= 0); /* a hash some engine computed, never a mixed key */
    if (r->type == KVBM_EVENT_REMOVED) {
      assert_true(ka >= 0); /* only A's blocks are pushed out */
      removed[r->medium][r->group]++;
      continue;
    }
    int k = ka >= 0 ? ka : kb;
    const uint64_t *hs = ka >= 0 ? ha : hb;
    assert_int_equal(r->has_parent, k > 0);
    if (k > 0) assert_int_equal(r->parent, hs[k - 1]);
    assert_string_equal(r->kind, r->group ? "sliding_window" : "full_attention");
    assert_int_equal(r->window, r->group ? 8 : -1);
    stored[r->medium][r->group]++;
  }
  pthread_mutex_unlock(&s.mu);
  for (int md = KVBM_MEDIUM_GPU; md <= KVBM_MEDIUM_DISK; md++)
    for (int g = 0; g < 2; g++) assert_int_equal(stored[md][g], 8); /* A's 4 and B's 4 */
  for (int g = 0; g < 2; g++) {
    assert_int_equal(removed[KVBM_MEDIUM_CPU][g], 4); /* G2: A's 4 per group left for B's */
    assert_true(removed[KVBM_MEDIUM_GPU][g] >= 1);    /* G1 of 12 cannot hold 16 */
    assert_int_equal(removed[KVBM_MEDIUM_DISK][g], 0);
  }
  for (int t = 0; t < 3; t++) assert_int_equal(links[t].failed, 0);

  /* Storage events: plain hashes, the group in extra_metadata. */
  size_t sstore[KVBM_TIER_COUNT][2] = {{0}}, sremove[KVBM_TIER_COUNT][2] = {{0}};
  pthread_mutex_lock(&ss.mu);
  assert_int_equal(ss.bad, 0);
  for (size_t i = 0; i < ss.n; i++) {
    const srec *r = &ss.r[i];
    assert_true(r->tier == KVBM_TIER_G2 || r->tier == KVBM_TIER_G3);
    assert_true(r->group == 0 || r->group == 1);
    assert_true(r->kind_ok);
    assert_true(index_of(ha, 4, r->hash) >= 0 || index_of(hb, 4, r->hash) >= 0);
    if (r->type == KVBM_STORAGE_STORE) sstore[r->tier][r->group]++;
    else sremove[r->tier][r->group]++;
  }
  pthread_mutex_unlock(&ss.mu);
  for (int g = 0; g < 2; g++) {
    assert_int_equal(sstore[KVBM_TIER_G2][g], 8);
    assert_int_equal(sstore[KVBM_TIER_G3][g], 8);
    assert_int_equal(sremove[KVBM_TIER_G2][g], 4);
    assert_int_equal(sremove[KVBM_TIER_G3][g], 0);
  }

  kvbm_publisher_destroy(pub);
  kvbm_storage_publisher_destroy(spub);
  kvbm_event_encoder_destroy(s.enc);
  kvbm_event_decoder_destroy(s.dec);
  kvbm_storage_decoder_destroy(ss.dec);
  pthread_mutex_destroy(&s.mu);
  pthread_mutex_destroy(&ss.mu);
  free(a);
  free(b);
  tu_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_groups_on_every_tier)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
