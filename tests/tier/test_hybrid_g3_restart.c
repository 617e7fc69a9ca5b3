/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_hybrid_g3_restart.c: a G3 warm restart keeps the KV cache groups of
 * a hybrid model's blocks (issue 20; docs/areas/hybrid.md, "G3 warm
 * restart"; the slot format in docs/areas/tiers.md).
 *
 * A manager of groups files group g's block under a mixed key
 * (kvbm__group_key); its events carry the block's own hash and group_idx.
 * The slot file now keeps the group in each slot (a v2 record's tag) and
 * the group list in its superblock (the label). What the tests hold it to:
 *   - a 3-group manager (full, sw:8, mamba) fills G3 and is destroyed; a
 *     new one on the same directory re-announces every G3 block with the
 *     group_idx, spec kind and plain hash of the original BlockStored
 *     events (through the real wire: encoded and decoded again), and its
 *     storage events say the same; a hybrid prefill then hits from G3 with
 *     the per-group onboards (full 4, sw:8 2, mamba 1) and the bytes written
 *     before the restart. Before the slot tag, the restored blocks said
 *     group 0 and their mixed keys;
 *   - a manager of another group list (or of none) on that file is
 *     refused at create, naming both lists, and the file is left whole;
 *   - a file written without groups (v1 slots, no label, as every kvbm
 *     wrote before) still loads in a manager of groups, as group 0.
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
#define NTOK 17 /* 4 full blocks and a partial one */

typedef struct rec {
  int type, medium;
  uint64_t hash;
  int64_t group; /* -1: none on the wire */
  char kind[32];
} rec;

typedef struct seen {
  pthread_mutex_t mu;
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  kvbm_storage_decoder *sdec;
  rec r[MAXREC];
  size_t n, bad;
  uint64_t s_hash[MAXREC];
  int64_t s_group[MAXREC];
  size_t sn;
} seen;

/* KV batches through the real wire: encoded, decoded, recorded. */
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
      r->group = e->has_group_idx ? e->group_idx : -1;
      if (e->kv_cache_spec_kind) snprintf(r->kind, sizeof r->kind, "%s", e->kv_cache_spec_kind);
    }
  }
  pthread_mutex_unlock(&s->mu);
}

/* The positive fixint after key `key` in a msgpack map (-1: absent). */
static int64_t meta_uint(const uint8_t *p, size_t n, const char *key) {
  size_t kn = strlen(key);
  for (size_t i = 0; i + kn + 2 <= n; i++)
    if (p[i] == (0xA0 | kn) && !memcmp(p + i + 1, key, kn))
      return p[i + 1 + kn] < 0x80 ? p[i + 1 + kn] : -1;
  return -1;
}

/* G3's storage Store events: plain hash and extra_metadata's group_idx. */
static void on_storage(void *user, const kvbm_storage_batch *b0, const uint8_t *payload, size_t len) {
  seen *s = user;
  kvbm_storage_batch b;
  pthread_mutex_lock(&s->mu);
  if (kvbm_storage_decode(s->sdec, payload, len, b0->seq, &b, NULL) != KVBM_OK) {
    s->bad++;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  for (size_t i = 0; i < b.num_events && s->sn < MAXREC; i++) {
    const kvbm_storage_event *e = &b.events[i];
    if (e->type != KVBM_STORAGE_STORE || e->tier != KVBM_TIER_G3) continue;
    s->s_hash[s->sn] = e->sequence_hash;
    s->s_group[s->sn++] =
        e->extra_metadata ? meta_uint(e->extra_metadata, e->extra_metadata_len, "group_idx") : -1;
  }
  pthread_mutex_unlock(&s->mu);
}

/* Publishers and codecs for one manager's life. */
typedef struct wire {
  seen s;
  kvbm_publisher *pub;
  kvbm_storage_publisher *spub;
  kvbm_pool_link links[3];
} wire;

static const kvbm_group_spec GROUPS[3] = {
    {KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}, {KVBM_GROUP_MAMBA, 0}};
static const char *const KINDS[3] = {"full_attention", "sliding_window", "mamba"};

static void wire_start(wire *w, const kvbm_group_spec *g, size_t ng) {
  memset(w, 0, sizeof *w);
  pthread_mutex_init(&w->s.mu, NULL);
  kvbm_event_encoder_config ec = kvbm_event_encoder_config_default();
  assert_int_equal(kvbm_event_encoder_create(&ec, &w->s.enc, NULL), KVBM_OK);
  assert_int_equal(kvbm_event_decoder_create(&w->s.dec, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_decoder_create(&w->s.sdec, NULL), KVBM_OK);
  kvbm_publisher_config po = kvbm_publisher_config_default();
  po.overflow = KVBM_OVERFLOW_DROP;
  assert_int_equal(kvbm_publisher_create(&po, &w->pub, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(w->pub, on_batch, &w->s, NULL), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(w->pub, NULL), KVBM_OK);
  kvbm_storage_publisher_config spc = kvbm_storage_publisher_config_default();
  spc.source = "engine-r";
  assert_int_equal(kvbm_storage_publisher_create(&spc, &w->spub, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_add_callback(w->spub, on_storage, &w->s, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_start(w->spub, NULL), KVBM_OK);
  const int md[3] = {KVBM_MEDIUM_GPU, KVBM_MEDIUM_CPU, KVBM_MEDIUM_DISK};
  for (int t = 0; t < 3; t++) {
    w->links[t] = (kvbm_pool_link){.pub = w->pub, .medium = md[t], .block_size = B};
    if (ng) assert_int_equal(kvbm_pool_link_set_groups(&w->links[t], g, ng, NULL), KVBM_OK);
  }
}

/* Waits for what was published, then frees the publishers. */
static void wire_stop(wire *w) {
  assert_int_equal(kvbm_publisher_flush(w->pub, 5000, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_flush(w->spub, 5000, NULL), KVBM_OK);
  kvbm_publisher_destroy(w->pub);
  kvbm_storage_publisher_destroy(w->spub);
  kvbm_event_encoder_destroy(w->s.enc);
  kvbm_event_decoder_destroy(w->s.dec);
  kvbm_storage_decoder_destroy(w->s.sdec);
  pthread_mutex_destroy(&w->s.mu);
}

/* A persistent-G3 manager of ng groups (0: none) reporting to w: G1 of
 * 40, no G2 (a hit after the restart comes from G3), G3 of 64. */
static kvbm_manager_config config(const char *dir, const kvbm_group_spec *g, size_t ng, wire *w) {
  kvbm_manager_config c = tu_config(dir, 40, 0, 64);
  c.g3_persist = true;
  c.groups = ng ? g : NULL;
  c.num_groups = ng;
  c.storage_events = w->spub;
  for (int t = 0; t < 3; t++) {
    c.listener[t] = kvbm_pool_link_listener;
    c.listener_user[t] = &w->links[t];
  }
  return c;
}

/* The bytes of group g's block with hash h. */
static uint64_t content_key(uint64_t h, uint32_t g) { return tu_mix(h ^ ((uint64_t)g << 56)); }

/* Writes (check 0) or checks (check 1) G1 block id's bytes for key. */
static int block_bytes_of(kvbm_manager *m, uint32_t id, uint64_t key, int check) {
  const kvbm_layout *L = kvbm_manager_layout(m, KVBM_TIER_G1);
  for (uint32_t l = 0; l < L->config.num_layers; l++) {
    void *p;
    size_t sz;
    if (kvbm_manager_block_layer(m, KVBM_TIER_G1, id, l, &p, &sz)) return 0;
    if (!tu_layer(p, sz, key, l, check)) return 0;
  }
  return 1;
}

/* One hybrid request: prefill, wait, write what it must compute, commit,
 * flush. *info: its counts. */
static void hrun(kvbm_manager *m, const uint32_t *tok, const uint64_t *h, kvbm_hreq_info *info) {
  kvbm_hreq *r = NULL;
  kvbm_error e = {0};
  if (kvbm_manager_hprefill(m, 0, 0, tok, NTOK, &r, NULL, &e)) fail_msg("hprefill: %s", e.msg);
  assert_int_equal(kvbm_hreq_wait(r, -1, info), KVBM_OK);
  for (uint32_t g = 0; g < kvbm_manager_num_groups(m); g++) {
    const uint32_t *ids;
    size_t nb;
    assert_int_equal(kvbm_hreq_table(r, g, &ids, &nb), KVBM_OK);
    for (size_t k = 0; k < NTOK / B; k++) {
      if (ids[k] == KVBM_HREQ_NULL) continue;
      if (kvbm_hreq_must_compute(r, g, k))
        assert_true(block_bytes_of(m, ids[k], content_key(h[k], g), 0));
      else /* a hit: the bytes written before the restart */
        assert_true(block_bytes_of(m, ids[k], content_key(h[k], g), 1));
    }
  }
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_hreq_destroy(r);
}

/* Counts G3 (DISK) BlockStored records of hash hs[k], group g, with the
 * group's spec kind; fails on any other G3 record. */
static void disk_stored(seen *s, const uint64_t *hs, size_t ng, size_t count[][4]) {
  pthread_mutex_lock(&s->mu);
  assert_int_equal(s->bad, 0);
  for (size_t i = 0; i < s->n; i++) {
    const rec *r = &s->r[i];
    if (r->medium != KVBM_MEDIUM_DISK) continue;
    assert_int_equal(r->type, KVBM_EVENT_STORED);
    assert_true(r->group >= 0 && (size_t)r->group < ng);
    assert_string_equal(r->kind, KINDS[r->group]);
    size_t k = 0;
    while (k < 4 && hs[k] != r->hash) k++;
    assert_true(k < 4); /* a hash the engine computed, never a mixed key */
    count[r->group][k]++;
  }
  pthread_mutex_unlock(&s->mu);
}

static void hashes_of(const uint32_t *tok, uint64_t *h) {
  kvbm_manager_config d = kvbm_manager_config_default();
  for (size_t k = 0; k < 4; k++) h[k] = kvbm_hash_next(d.scheme, 0, k ? h[k - 1] : 0, k > 0, tok + k * B, B);
}

static void test_restart_keeps_groups(void **st) {
  (void)st;
  char *dir = tu_tmpdir("hg3-restart");
  uint32_t *a = tu_prompt(700, NTOK);
  uint64_t h[4];
  hashes_of(a, h);

  /* Before: every group's 4 blocks offloaded to G3, announced once. */
  wire w1;
  wire_start(&w1, GROUPS, 3);
  kvbm_manager_config c = config(dir, GROUPS, 3, &w1);
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  kvbm_hreq_info info;
  hrun(m, a, h, &info);
  assert_int_equal(info.hit_tokens, 0);
  assert_int_equal(tu_stats(m, KVBM_TIER_G3).offloaded_blocks, 12);
  kvbm_manager_destroy(m);
  wire_stop(&w1);
  size_t before[3][4] = {{0}};
  disk_stored(&w1.s, h, 3, before);
  for (int g = 0; g < 3; g++)
    for (int k = 0; k < 4; k++) assert_int_equal(before[g][k], 1);

  /* After: the restart re-announces the same (hash, group) pairs, on the
   * KV wire and as storage events. */
  wire w2;
  wire_start(&w2, GROUPS, 3);
  c = config(dir, GROUPS, 3, &w2);
  m = tu_create(&c);
  assert_non_null(m);
  kvbm_tier_stats g3 = tu_stats(m, KVBM_TIER_G3);
  assert_int_equal(g3.restored_blocks, 12);
  assert_int_equal(g3.restore_skipped, 0);
  assert_int_equal(kvbm_publisher_flush(w2.pub, 5000, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_publisher_flush(w2.spub, 5000, NULL), KVBM_OK);
  size_t after[3][4] = {{0}};
  disk_stored(&w2.s, h, 3, after);
  for (int g = 0; g < 3; g++)
    for (int k = 0; k < 4; k++) assert_int_equal(after[g][k], before[g][k]);
  pthread_mutex_lock(&w2.s.mu);
  assert_int_equal(w2.s.sn, 12);
  size_t sseen[3][4] = {{0}};
  for (size_t i = 0; i < w2.s.sn; i++) {
    size_t k = 0;
    while (k < 4 && h[k] != w2.s.s_hash[i]) k++;
    assert_true(k < 4);
    assert_true(w2.s.s_group[i] >= 0 && w2.s.s_group[i] < 3);
    sseen[w2.s.s_group[i]][k]++;
  }
  pthread_mutex_unlock(&w2.s.mu);
  for (int g = 0; g < 3; g++)
    for (int k = 0; k < 4; k++) assert_int_equal(sseen[g][k], 1);

  /* The hybrid prefill hits from G3: 16 tokens, each group onboarding what
   * it needs (full every block, the window of 8 two, Mamba its state). */
  hrun(m, a, h, &info);
  assert_int_equal(info.hit_tokens, 16);
  assert_int_equal(info.onboarded[0], 4);
  assert_int_equal(info.onboarded[1], 2);
  assert_int_equal(info.onboarded[2], 1);
  assert_int_equal(info.onboarded_from[KVBM_TIER_G3], 7);
  for (int g = 0; g < 3; g++) assert_int_equal(info.hit_g1[g], 0);
  kvbm_manager_destroy(m);
  wire_stop(&w2);
  free(a);
  tu_rmdir(dir);
}

/* A manager of another group list on the file: refused at create, naming
 * both; the file is untouched (the right list still restores it all). */
static void test_other_groups_refused(void **st) {
  (void)st;
  char *dir = tu_tmpdir("hg3-other");
  uint32_t *a = tu_prompt(900, NTOK);
  uint64_t h[4];
  hashes_of(a, h);
  wire w;
  wire_start(&w, GROUPS, 3);
  kvbm_manager_config c = config(dir, GROUPS, 3, &w);
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  kvbm_hreq_info info;
  hrun(m, a, h, &info);
  kvbm_manager_destroy(m);

  const kvbm_group_spec other[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 16}};
  struct {
    const kvbm_group_spec *g;
    size_t n;
    const char *names;
  } cases[] = {{other, 2, "full,sw:16"}, {NULL, 0, "(no label)"}, {GROUPS, 2, "full,sw:8 "}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    kvbm_manager_config o = config(dir, cases[i].g, cases[i].n, &w);
    kvbm_error e = {0};
    m = NULL;
    assert_int_equal(kvbm_manager_create(&o, &m, &e), KVBM_EFORMAT);
    assert_null(m);
    assert_non_null(strstr(e.msg, "full,sw:8,mamba"));
    assert_non_null(strstr(e.msg, cases[i].names));
    assert_non_null(strstr(e.msg, "g3"));
  }
  m = tu_create(&c);
  assert_non_null(m);
  assert_int_equal(tu_stats(m, KVBM_TIER_G3).restored_blocks, 12);
  kvbm_manager_destroy(m);
  wire_stop(&w);
  free(a);
  tu_rmdir(dir);
}

/* A file of a manager without groups (v1 slots, no label: what every kvbm
 * wrote before the tag) loads in a manager of groups as group 0, and takes
 * its label: the one-group manager is then the one refused. */
static void test_old_file_as_group0(void **st) {
  (void)st;
  char *dir = tu_tmpdir("hg3-old");
  uint32_t *a = tu_prompt(300, NTOK);
  uint64_t h[4];
  hashes_of(a, h);
  wire w1;
  wire_start(&w1, NULL, 0);
  kvbm_manager_config c = config(dir, NULL, 0, &w1);
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  assert_int_equal(tu_run(m, a, NTOK, NULL, NULL), 0);
  assert_int_equal(tu_stats(m, KVBM_TIER_G3).offloaded_blocks, 4);
  kvbm_manager_destroy(m);
  wire_stop(&w1);

  wire w2;
  wire_start(&w2, GROUPS, 3);
  c = config(dir, GROUPS, 3, &w2);
  m = tu_create(&c);
  assert_non_null(m);
  assert_int_equal(tu_stats(m, KVBM_TIER_G3).restored_blocks, 4);
  assert_int_equal(kvbm_publisher_flush(w2.pub, 5000, NULL), KVBM_OK);
  size_t after[3][4] = {{0}};
  disk_stored(&w2.s, h, 3, after);
  for (int k = 0; k < 4; k++) {
    assert_int_equal(after[0][k], 1);
    assert_int_equal(after[1][k] + after[2][k], 0);
  }
  kvbm_manager_destroy(m);
  wire_stop(&w2);
  wire_start(&w1, NULL, 0);
  c = config(dir, NULL, 0, &w1);
  kvbm_error e = {0};
  m = NULL;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EFORMAT);
  wire_stop(&w1);
  free(a);
  tu_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restart_keeps_groups),
      cmocka_unit_test(test_other_groups_refused),
      cmocka_unit_test(test_old_file_as_group0),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
