/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_advisor.c: the advisor's index and hints on event sequences whose
 * right answer is known: a cold block used twice is demoted, a cold block
 * used once dropped, a block kept in G1 never; a hot family's block below
 * is promoted; a thinned slow volume is compacted; a hinted block is not
 * hinted again within rehint_ms; onboards count as uses. Bounds: a flood of
 * distinct blocks keeps at most max_blocks entries (forgetting counted),
 * volumes over max_volumes and event-id jumps are counted. The hints'
 * msgpack codec round trips and refuses truncation at every byte.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/advisor.h"
#include "kvbm/router.h"

static void store(kvbm_advisor *a, const char *vol, int tier, uint64_t h, uint64_t prefix,
                  bool remove, uint64_t id, uint64_t now) {
  kvbm_storage_event e = {.type = remove ? KVBM_STORAGE_REMOVE : KVBM_STORAGE_STORE,
                          .event_id = id, .sequence_hash = h, .prefix_hash = prefix,
                          .block_size = 4096, .location = vol, .location_len = strlen(vol),
                          .tier = tier};
  kvbm_storage_batch b = {.source = "m", .source_len = 1, .events = &e, .num_events = 1};
  assert_int_equal(kvbm_advisor_storage(a, &b, now), KVBM_OK);
}

static void gpu(kvbm_advisor *a, kvbm_event_type type, uint64_t h, uint64_t now) {
  kvbm_event e = {.type = type, .block_hashes = &h, .num_block_hashes = 1, .medium = KVBM_MEDIUM_GPU};
  kvbm_event_batch b = {.events = &e, .num_events = 1};
  assert_int_equal(kvbm_advisor_kv(a, &b, now), KVBM_OK);
}

static const kvbm_hint *find(const kvbm_hint *h, size_t n, uint64_t seq, kvbm_hint_kind kind) {
  for (size_t i = 0; i < n; i++)
    if (h[i].sequence_hash == seq && h[i].kind == kind) return &h[i];
  return NULL;
}

static int vol_index(kvbm_advisor *a, const char *name) {
  for (size_t i = 0; i < kvbm_advisor_volume_count(a); i++) {
    kvbm_advisor_volume_info v;
    kvbm_advisor_volume_get(a, i, &v);
    if (!strcmp(v.name, name)) return (int)i;
  }
  return -1;
}

/* host (G2) learns an eviction age of 10 s: ten blocks used at t=0 and
 * evicted at t=10000. */
static kvbm_advisor *setup(uint64_t *id) {
  kvbm_advisor_config c = kvbm_advisor_config_default();
  c.demote_fraction = 0.7; /* cold: idle >= 3 s */
  c.compact_min_blocks = 100;
  kvbm_advisor *a;
  kvbm_error err = {0};
  assert_int_equal(kvbm_advisor_create(&c, &a, &err), KVBM_OK);
  assert_int_equal(kvbm_advisor_volume_tier(a, "disk", KVBM_TIER_G3, &err), KVBM_OK);
  *id = 1;
  for (uint64_t x = 1000; x < 1010; x++) {
    store(a, "host", KVBM_TIER_G2, x, 77, false, (*id)++, 0);
    gpu(a, KVBM_EVENT_STORED, x, 0);
    gpu(a, KVBM_EVENT_REMOVED, x, 0);
  }
  for (uint64_t x = 1000; x < 1010; x++) store(a, "host", KVBM_TIER_G2, x, 0, true, (*id)++, 10000);
  kvbm_advisor_volume_info v;
  kvbm_advisor_volume_get(a, (size_t)vol_index(a, "host"), &v);
  assert_int_equal(v.tier, KVBM_TIER_G2); /* from the events' metadata */
  assert_true(v.eviction_age_ms > 9999 && v.eviction_age_ms < 10001);
  assert_int_equal(v.live_blocks, 0);
  return a;
}

static void test_demote_drop_keep(void **state) {
  (void)state;
  uint64_t id;
  kvbm_advisor *a = setup(&id);
  /* A: used twice, out of G1 at 11000. B: used once, out at 11000.
   * C: used twice, still in G1. D: used twice, out at 13500 (not cold yet). */
  uint64_t A = 1, B = 2, C = 3, D = 4;
  for (uint64_t h = A; h <= D; h++) store(a, "host", KVBM_TIER_G2, h, 50, false, id++, 10500);
  gpu(a, KVBM_EVENT_STORED, A, 10500);
  gpu(a, KVBM_EVENT_REMOVED, A, 10600);
  gpu(a, KVBM_EVENT_STORED, A, 10700);
  gpu(a, KVBM_EVENT_REMOVED, A, 11000);
  gpu(a, KVBM_EVENT_STORED, B, 10500);
  gpu(a, KVBM_EVENT_REMOVED, B, 11000);
  gpu(a, KVBM_EVENT_STORED, C, 10500);
  gpu(a, KVBM_EVENT_REMOVED, C, 10600);
  gpu(a, KVBM_EVENT_STORED, C, 10700);
  gpu(a, KVBM_EVENT_STORED, D, 10500);
  gpu(a, KVBM_EVENT_REMOVED, D, 10600);
  gpu(a, KVBM_EVENT_STORED, D, 13000);
  gpu(a, KVBM_EVENT_REMOVED, D, 13500);
  kvbm_hint h[64];
  size_t n;
  assert_int_equal(kvbm_advisor_hints(a, 15000, h, 64, &n), KVBM_OK);
  const kvbm_hint *x = find(h, n, A, KVBM_HINT_DEMOTE);
  assert_non_null(x);
  assert_int_equal(x->from_volume, vol_index(a, "host"));
  assert_int_equal(x->to_volume, vol_index(a, "disk"));
  assert_int_equal(x->uses, 2);
  assert_int_equal(x->idle_ms, 4000);
  assert_int_equal(x->prefix_hash, 50);
  x = find(h, n, B, KVBM_HINT_DROP);
  assert_non_null(x);
  assert_int_equal(x->to_volume, -1);
  for (size_t i = 0; i < n; i++) {
    assert_true(h[i].sequence_hash != C); /* in G1: in use */
    assert_true(h[i].sequence_hash != D); /* idle 1.5 s < 3 s */
  }
  assert_int_equal(n, 2);
  /* Demotions come before drops. */
  assert_int_equal(h[0].kind, KVBM_HINT_DEMOTE);
  /* Not again within rehint_ms; D goes cold later. */
  assert_int_equal(kvbm_advisor_hints(a, 17000, h, 64, &n), KVBM_OK);
  assert_int_equal(n, 1);
  assert_int_equal(h[0].sequence_hash, D);
  assert_int_equal(h[0].kind, KVBM_HINT_DEMOTE);
  /* The manager applies A's demotion: the removal it asked for does not
   * teach the eviction age. */
  store(a, "disk", KVBM_TIER_G3, A, 50, false, id++, 17100);
  store(a, "host", KVBM_TIER_G2, A, 0, true, id++, 17100);
  kvbm_advisor_volume_info v;
  kvbm_advisor_volume_get(a, (size_t)vol_index(a, "host"), &v);
  assert_true(v.eviction_age_ms > 9999 && v.eviction_age_ms < 10001);
  assert_int_equal(v.live_blocks, 3);
  kvbm_advisor_stats st;
  kvbm_advisor_stats_get(a, &st);
  assert_int_equal(st.hints[KVBM_HINT_DEMOTE], 2);
  assert_int_equal(st.hints[KVBM_HINT_DROP], 1);
  assert_int_equal(st.lost_events, 0);
  /* A GPU store of A (now in disk) is an onboard: a use. */
  uint64_t before = st.onboard_uses;
  gpu(a, KVBM_EVENT_STORED, A, 18000);
  kvbm_advisor_stats_get(a, &st);
  assert_int_equal(st.onboard_uses, before + 1);
  kvbm_advisor_destroy(a);
}

static void test_promote(void **state) {
  (void)state;
  uint64_t id;
  kvbm_advisor *a = setup(&id);
  store(a, "host", KVBM_TIER_G2, 500, 0, false, id++, 10000); /* host exists */
  /* P is in disk only, its family F used at three moments; Q in disk, its
   * family used once (not hot). */
  uint64_t F = 9000, P = 9001, G = 9100, Q = 9101;
  store(a, "disk", -1, F, F, false, id++, 10000);
  store(a, "disk", -1, P, F, false, id++, 10000);
  store(a, "disk", -1, G, G, false, id++, 10000);
  store(a, "disk", -1, Q, G, false, id++, 10000);
  gpu(a, KVBM_EVENT_STORED, F, 11000);
  gpu(a, KVBM_EVENT_STORED, F, 12000);
  gpu(a, KVBM_EVENT_STORED, F, 12050);
  gpu(a, KVBM_EVENT_STORED, F, 12050); /* the same moment: one use of the family */
  gpu(a, KVBM_EVENT_STORED, G, 11000);
  kvbm_hint h[64];
  size_t n;
  assert_int_equal(kvbm_advisor_hints(a, 12100, h, 64, &n), KVBM_OK);
  const kvbm_hint *x = find(h, n, P, KVBM_HINT_PROMOTE);
  assert_non_null(x);
  assert_int_equal(x->from_volume, vol_index(a, "disk"));
  assert_int_equal(x->to_volume, vol_index(a, "host"));
  assert_null(find(h, n, Q, KVBM_HINT_PROMOTE));
  kvbm_advisor_prefix_info pi;
  assert_int_equal(kvbm_advisor_prefix_get(a, F, 0, 12100, &pi), KVBM_OK);
  assert_int_equal(pi.blocks[vol_index(a, "disk")], 2);
  assert_true(pi.score > 2.9 && pi.score <= 3.0);
  assert_int_equal(kvbm_advisor_prefix_get(a, 424242, 0, 12100, &pi), KVBM_ENOTFOUND);
  kvbm_advisor_destroy(a);
}

/* Namespaces (issue 11's cache_salt / LoRA name): tenants a and b hold
 * the same hashes on disk (their storage events say so in extra_metadata);
 * only a's family is used, through KV events salted "a". Only a's block is
 * promoted, and the hint names a's namespace; b's family stays cold. */
static void store_ns(kvbm_advisor *a, const char *vol, uint64_t h, uint64_t prefix, char salt,
                     uint64_t id, uint64_t now) {
  uint8_t meta[] = {0x81, 0xaa, 'c', 'a', 'c', 'h', 'e', '_', 's', 'a', 'l', 't', 0xa1, (uint8_t)salt};
  kvbm_storage_event e = {.type = KVBM_STORAGE_STORE, .event_id = id, .sequence_hash = h,
                          .prefix_hash = prefix, .block_size = 4096, .location = vol,
                          .location_len = strlen(vol), .extra_metadata = meta,
                          .extra_metadata_len = sizeof meta, .tier = -1};
  kvbm_storage_batch b = {.source = "m", .source_len = 1, .events = &e, .num_events = 1};
  assert_int_equal(kvbm_advisor_storage(a, &b, now), KVBM_OK);
}

static void gpu_salted(kvbm_advisor *a, uint64_t h, const char *salt, uint64_t now) {
  kvbm_event e = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1,
                  .medium = KVBM_MEDIUM_GPU, .cache_salt = salt};
  kvbm_event_batch b = {.events = &e, .num_events = 1};
  assert_int_equal(kvbm_advisor_kv(a, &b, now), KVBM_OK);
}

static void test_namespaces(void **state) {
  (void)state;
  uint64_t id;
  kvbm_advisor *a = setup(&id);
  store(a, "host", KVBM_TIER_G2, 500, 0, false, id++, 10000);
  uint64_t F = 9000, P = 9001;
  for (char t = 'a'; t <= 'b'; t++) {
    store_ns(a, "disk", F, F, t, id++, 10000);
    store_ns(a, "disk", P, F, t, id++, 10000);
  }
  gpu_salted(a, F, "a", 11000);
  gpu_salted(a, F, "a", 12000);
  gpu_salted(a, F, "a", 12050);
  kvbm_hint h[64];
  size_t n;
  assert_int_equal(kvbm_advisor_hints(a, 12100, h, 64, &n), KVBM_OK);
  uint64_t nsa = kvbm_index_namespace("a", NULL), nsb = kvbm_index_namespace("b", NULL);
  assert_true(nsa != 0 && nsa != nsb);
  size_t promoted = 0;
  for (size_t i = 0; i < n; i++)
    if (h[i].kind == KVBM_HINT_PROMOTE && h[i].sequence_hash == P) {
      promoted++;
      assert_int_equal(h[i].ns, nsa);
    }
  assert_int_equal(promoted, 1);
  kvbm_advisor_prefix_info pa, pb;
  assert_int_equal(kvbm_advisor_prefix_get(a, F, nsa, 12100, &pa), KVBM_OK);
  assert_int_equal(kvbm_advisor_prefix_get(a, F, nsb, 12100, &pb), KVBM_OK);
  assert_true(pa.score > 2.9);
  assert_true(pb.score < 0.5);
  assert_int_equal(pa.blocks[vol_index(a, "disk")], 2);
  assert_int_equal(pb.blocks[vol_index(a, "disk")], 2);
  /* The default namespace never saw F. */
  assert_int_equal(kvbm_advisor_prefix_get(a, F, 0, 12100, &pa), KVBM_ENOTFOUND);
  kvbm_advisor_destroy(a);
}

static void test_compact(void **state) {
  (void)state;
  uint64_t id;
  kvbm_advisor *a = setup(&id);
  for (uint64_t x = 0; x < 200; x++) store(a, "disk", -1, 50000 + x, 1, false, id++, 11000);
  kvbm_hint h[16];
  size_t n;
  assert_int_equal(kvbm_advisor_hints(a, 11000, h, 16, &n), KVBM_OK);
  for (size_t i = 0; i < n; i++) assert_true(h[i].kind != KVBM_HINT_COMPACT);
  for (uint64_t x = 0; x < 150; x++) store(a, "disk", -1, 50000 + x, 1, true, id++, 12000);
  assert_int_equal(kvbm_advisor_hints(a, 12000, h, 16, &n), KVBM_OK);
  assert_true(n >= 1);
  assert_int_equal(h[0].kind, KVBM_HINT_COMPACT);
  assert_int_equal(h[0].from_volume, vol_index(a, "disk"));
  assert_int_equal(h[0].live_blocks, 50);
  assert_int_equal(h[0].high_water, 200);
  /* Asked once: not again until it thins out again. */
  assert_int_equal(kvbm_advisor_hints(a, 13000, h, 16, &n), KVBM_OK);
  for (size_t i = 0; i < n; i++) assert_true(h[i].kind != KVBM_HINT_COMPACT);
  kvbm_advisor_destroy(a);
}

static void test_bounds(void **state) {
  (void)state;
  kvbm_advisor_config c = kvbm_advisor_config_default();
  c.max_blocks = 64;
  c.max_prefixes = 16;
  c.max_volumes = 2;
  kvbm_advisor *a;
  assert_int_equal(kvbm_advisor_create(&c, &a, NULL), KVBM_OK);
  /* a flood of distinct blocks and families */
  for (uint64_t x = 1; x <= 100000; x++) store(a, "host", KVBM_TIER_G2, x * 7919, x, false, x, x);
  kvbm_advisor_stats st;
  kvbm_advisor_stats_get(a, &st);
  assert_true(st.entries <= 64);
  assert_int_equal(st.forgotten_blocks, 100000 - st.entries);
  assert_true(st.prefixes <= 16);
  assert_true(st.memory_bytes < 256 * 1024); /* the tables' first sizes; 10^5 blocks would take MBs */
  kvbm_advisor_volume_info v;
  kvbm_advisor_volume_get(a, 0, &v);
  assert_int_equal(v.live_blocks, 100000); /* the volume's count is kept apart from the index */
  assert_int_equal(v.indexed, st.entries);
  /* a third volume is refused */
  store(a, "disk", KVBM_TIER_G3, 1, 1, false, 100001, 100001);
  store(a, "remote", KVBM_TIER_G4, 1, 1, false, 100002, 100001);
  kvbm_advisor_stats_get(a, &st);
  assert_int_equal(st.refused_volume, 1);
  assert_int_equal(kvbm_advisor_volume_count(a), 2);
  /* event ids: a jump is lost events, a step back a restart */
  store(a, "host", KVBM_TIER_G2, 5, 1, false, 100010, 100002);
  store(a, "host", KVBM_TIER_G2, 6, 1, false, 3, 100003);
  kvbm_advisor_stats_get(a, &st);
  assert_int_equal(st.lost_events, 7);
  assert_int_equal(st.source_restarts, 1);
  /* removes of unknown blocks are counted, never negative counts */
  store(a, "disk", KVBM_TIER_G3, 123456789, 1, true, 4, 100004);
  store(a, "disk", KVBM_TIER_G3, 123456789, 1, true, 5, 100004);
  kvbm_advisor_stats_get(a, &st);
  assert_true(st.unknown_removes >= 1);
  kvbm_advisor_volume_get(a, 1, &v);
  assert_int_equal(v.live_blocks, 0);
  /* bad settings */
  kvbm_error err = {0};
  kvbm_advisor *bad;
  c = kvbm_advisor_config_default();
  c.demote_fraction = 1;
  assert_int_equal(kvbm_advisor_create(&c, &bad, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "demote_fraction"));
  c = kvbm_advisor_config_default();
  c.max_volumes = 33;
  assert_int_equal(kvbm_advisor_create(&c, &bad, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_advisor_volume_tier(a, "x", KVBM_TIER_G1 - 1, &err), KVBM_EINVAL);
  kvbm_advisor_destroy(a);
}

static void test_hint_codec(void **state) {
  (void)state;
  kvbm_wire_hint in[3] = {
      {.kind = KVBM_HINT_DEMOTE, .sequence_hash = UINT64_MAX, .prefix_hash = 7, .from = "host",
       .from_len = 4, .to = "disk:///var/kvbm", .to_len = 16, .uses = 3, .idle_ms = 4000},
      {.kind = KVBM_HINT_DROP, .sequence_hash = 1, .from = "host", .from_len = 4, .group = 15},
      {.kind = KVBM_HINT_COMPACT, .from = "disk:///var/kvbm", .from_len = 16, .live_blocks = 50,
       .high_water = 200},
  };
  kvbm_hint_batch b = {.ts = 2.5, .source = "adv", .source_len = 3, .hints = in, .num_hints = 3};
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  kvbm_error err = {0};
  assert_int_equal(kvbm_hints_encode(&b, &buf, &len, &cap, &err), KVBM_OK);
  kvbm_hint_decoder *d;
  assert_int_equal(kvbm_hint_decoder_create(&d, &err), KVBM_OK);
  kvbm_hint_batch out;
  assert_int_equal(kvbm_hint_decode(d, buf, len, 9, &out, &err), KVBM_OK);
  assert_int_equal(out.num_hints, 3);
  assert_int_equal(out.seq, 9);
  assert_int_equal(out.hints[0].kind, KVBM_HINT_DEMOTE);
  assert_int_equal(out.hints[0].sequence_hash, UINT64_MAX);
  assert_int_equal(out.hints[0].to_len, 16);
  assert_memory_equal(out.hints[0].to, "disk:///var/kvbm", 16);
  assert_null(out.hints[1].to);
  assert_int_equal(out.hints[0].group, 0);
  assert_int_equal(out.hints[1].group, 15); /* the group travels */
  assert_int_equal(out.hints[2].high_water, 200);
  char json[512];
  assert_true(kvbm_wire_hint_to_json(&out.hints[0], json, sizeof json) < sizeof json);
  assert_non_null(strstr(json, "\"kind\":\"Demote\""));
  assert_non_null(strstr(json, "\"to\":\"disk:///var/kvbm\""));
  assert_non_null(strstr(json, "\"sequence_hash\":18446744073709551615"));
  assert_true(kvbm_wire_hint_to_json(&out.hints[1], json, sizeof json) < sizeof json);
  assert_non_null(strstr(json, "\"group\":15}"));
  for (size_t cut = 0; cut < len; cut++) {
    uint8_t *c = malloc(cut ? cut : 1);
    memcpy(c, buf, cut);
    if (kvbm_hint_decode(d, c, cut, 0, &out, &err) == KVBM_OK) fail_msg("a %zu-byte prefix decoded", cut);
    free(c);
  }
  uint8_t *c = malloc(len);
  for (size_t i = 0; i < len; i++)
    for (int v = 0; v < 256; v += 13) {
      memcpy(c, buf, len);
      c[i] = (uint8_t)v;
      (void)kvbm_hint_decode(d, c, len, 0, &out, &err);
    }
  free(c);
  static const uint8_t flood[] = {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff, 0xa0};
  assert_int_equal(kvbm_hint_decode(d, flood, sizeof flood, 0, &out, &err), KVBM_ETRUNCATED);
  /* a hint from an advisor that predates groups (10 fields) is group 0 */
  static const uint8_t ten[] = {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x9a, 0xa4, 'D', 'r', 'o', 'p',
                                0x01, 0x00, 0xa1, 'h', 0xc0, 0, 0, 0, 0, 0, 0xa0};
  assert_int_equal(kvbm_hint_decode(d, ten, sizeof ten, 0, &out, &err), KVBM_OK);
  assert_int_equal(out.num_hints, 1);
  assert_int_equal(out.hints[0].kind, KVBM_HINT_DROP);
  assert_int_equal(out.hints[0].group, 0);
  /* a group of 16 or more is refused, naming the field, on both sides */
  uint8_t eleven[sizeof ten + 1];
  memcpy(eleven, ten, sizeof ten);
  eleven[11] = 0x9b;                              /* 11 fields */
  memmove(eleven + 28, eleven + 27, sizeof ten - 27);
  eleven[27] = 16;                                /* group 16, after the namespace */
  assert_int_equal(kvbm_hint_decode(d, eleven, sizeof eleven, 0, &out, &err), KVBM_EFORMAT);
  assert_non_null(strstr(err.msg, "group 16"));
  eleven[27] = 3;
  assert_int_equal(kvbm_hint_decode(d, eleven, sizeof eleven, 0, &out, &err), KVBM_OK);
  assert_int_equal(out.hints[0].group, 3);
  in[1].group = 16;
  len = 0;
  assert_int_equal(kvbm_hints_encode(&b, &buf, &len, &cap, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "group 16"));
  in[1].group = 15;
  in[0].kind = 9;
  len = 0;
  assert_int_equal(kvbm_hints_encode(&b, &buf, &len, &cap, &err), KVBM_EINVAL);
  in[0].kind = KVBM_HINT_DEMOTE;
  in[0].from_len = 0;
  assert_int_equal(kvbm_hints_encode(&b, &buf, &len, &cap, &err), KVBM_EINVAL);
  free(buf);
  kvbm_hint_decoder_destroy(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_demote_drop_keep), cmocka_unit_test(test_promote),
      cmocka_unit_test(test_namespaces),
      cmocka_unit_test(test_compact),          cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_hint_codec),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
