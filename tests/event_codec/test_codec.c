/* SPDX-License-Identifier: Apache-2.0 */
/* test_codec.c: the event codec: round trips in both forms (and with
 * signed hashes), the shapes today's and older engines send (vLLM's tagged
 * maps, SGLang's salted positional BlockStored, token pairs, the media
 * names), one bad event costing only itself, and malformed payloads of
 * every kind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "common/msgpack.h"
#include "event_codec/internal.h"
#include "kvbm/event_codec.h"

static void assert_event_eq(const kvbm_event *a, const kvbm_event *b) {
  assert_int_equal(a->type, b->type);
  assert_int_equal(a->num_block_hashes, b->num_block_hashes);
  for (size_t i = 0; i < a->num_block_hashes; i++)
    assert_true(a->block_hashes[i] == b->block_hashes[i]);
  assert_int_equal(a->has_parent, b->has_parent);
  if (a->has_parent) assert_true(a->parent_hash == b->parent_hash);
  assert_int_equal(a->num_tokens, b->num_tokens);
  for (size_t i = 0; i < a->num_tokens; i++) assert_int_equal(a->token_ids[i], b->token_ids[i]);
  assert_int_equal(a->block_size, b->block_size);
  assert_int_equal(a->has_lora_id, b->has_lora_id);
  if (a->has_lora_id) assert_int_equal(a->lora_id, b->lora_id);
  assert_int_equal(a->medium, b->medium);
  if (a->medium == KVBM_MEDIUM_OTHER) assert_string_equal(a->medium_name, b->medium_name);
  if (a->lora_name || b->lora_name) {
    assert_non_null(a->lora_name);
    assert_non_null(b->lora_name);
    assert_string_equal(a->lora_name, b->lora_name);
  }
  assert_int_equal(a->has_group_idx, b->has_group_idx);
  if (a->has_group_idx) assert_int_equal(a->group_idx, b->group_idx);
}

static void assert_str_same(const char *a, const char *b) {
  if (!a || !b) {
    assert_true(!a && !b);
    return;
  }
  assert_string_equal(a, b);
}

static void assert_bytes_same(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
  assert_int_equal(alen, blen);
  assert_true(!a == !b);
  if (alen) assert_memory_equal(a, b, alen);
}

/* What the codec carries beyond kvbm's own fields; `positional` leaves
 * out what that form has no place for (locality, ownership, and the
 * extras unless a salt's metadata map holds them). */
static void assert_carried_eq(const kvbm_event *a, const kvbm_event *b, bool positional) {
  if (a->type == KVBM_EVENT_CLEARED) return;
  if (a->type == KVBM_EVENT_STORED) {
    assert_str_same(a->cache_salt, b->cache_salt);
    assert_int_equal(a->token_pairs, b->token_pairs);
    assert_str_same(a->kv_cache_spec_kind, b->kv_cache_spec_kind);
    assert_int_equal(a->has_sliding_window, b->has_sliding_window);
    if (a->has_sliding_window) assert_int_equal(a->sliding_window, b->sliding_window);
    assert_bytes_same(a->extra_keys, a->extra_keys_len, b->extra_keys, b->extra_keys_len);
  }
  if (positional) return;
  assert_str_same(a->locality, b->locality);
  assert_str_same(a->ownership, b->ownership);
  assert_int_equal(a->num_extras, b->num_extras);
  assert_bytes_same(a->extras, a->extras_len, b->extras, b->extras_len);
}

static const uint64_t kH[] = {0, 1, 127, 128, 0xffffffffull, 0x8000000000000000ull,
                              0xffffffffffffffffull};
static const uint32_t kTok[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 0xffffffffu, 7,
                                8, 9, 10, 11};

/* msgpack of extra_keys [["mm", 3], nil] and of an extra "session_id":
 * "s-1", "remaining_copy_counts": [0] */
static const uint8_t kEkeys[] = {0x92, 0x92, 0xa2, 'm', 'm', 0x03, 0xc0};
static const uint8_t kExtras[] = {0xaa, 's', 'e', 's', 's', 'i', 'o', 'n', '_', 'i', 'd',
                                  0xa3, 's', '-', '1', 0xb5, 'r', 'e', 'm', 'a', 'i', 'n',
                                  'i', 'n', 'g', '_', 'c', 'o', 'p', 'y', '_', 'c', 'o',
                                  'u', 'n', 't', 's', 0x91, 0x00};

static size_t sample_events(kvbm_event *ev) {
  memset(ev, 0, 7 * sizeof *ev);
  ev[0] = (kvbm_event){.type = KVBM_EVENT_STORED, .block_hashes = kH, .num_block_hashes = 7,
                       .parent_hash = 0xdeadbeefcafef00dull, .has_parent = true,
                       .token_ids = kTok, .num_tokens = 14, .block_size = 2,
                       .lora_id = -5, .has_lora_id = true, .medium = KVBM_MEDIUM_GPU,
                       .medium_name = "GPU"};
  ev[1] = (kvbm_event){.type = KVBM_EVENT_STORED, .block_hashes = kH + 3, .num_block_hashes = 1,
                       .token_ids = kTok, .num_tokens = 16, .block_size = 16,
                       .medium = KVBM_MEDIUM_OTHER, .medium_name = "NVME_tier\"x",
                       .lora_name = "my-lora", .group_idx = 3, .has_group_idx = true};
  ev[1].num_tokens = 14;
  ev[2] = (kvbm_event){.type = KVBM_EVENT_REMOVED, .block_hashes = kH, .num_block_hashes = 2,
                       .medium = KVBM_MEDIUM_DISK, .medium_name = "DISK"};
  ev[3] = (kvbm_event){.type = KVBM_EVENT_REMOVED, .block_hashes = kH + 5,
                       .num_block_hashes = 2, .group_idx = 1, .has_group_idx = true};
  ev[4] = (kvbm_event){.type = KVBM_EVENT_CLEARED};
  /* today's vLLM: extra_keys, a group's kind and window, locality and
   * ownership; SGLang: a salt, token pairs, a session id */
  ev[5] = (kvbm_event){.type = KVBM_EVENT_STORED, .block_hashes = kH + 4, .num_block_hashes = 2,
                       .token_ids = kTok, .num_tokens = 4, .block_size = 2,
                       .medium = KVBM_MEDIUM_DISK, .medium_name = "STORAGE",
                       .lora_name = "l", .extra_keys = kEkeys,
                       .extra_keys_len = sizeof kEkeys, .group_idx = 1, .has_group_idx = true,
                       .kv_cache_spec_kind = "sliding_window", .sliding_window = 4096,
                       .has_sliding_window = true, .locality = "LOCAL", .ownership = "kvcr"};
  ev[6] = (kvbm_event){.type = KVBM_EVENT_STORED, .block_hashes = kH, .num_block_hashes = 2,
                       .token_ids = kTok + 6, .num_tokens = 5, .block_size = 2,
                       .has_parent = true, .parent_hash = 77, .medium = KVBM_MEDIUM_CPU,
                       .medium_name = "CPU_PINNED", .cache_salt = "tenant-a",
                       .token_pairs = true, .extras = kExtras, .extras_len = sizeof kExtras,
                       .num_extras = 2};
  return 7;
}

static void roundtrip(kvbm_event_form form, bool sgn) {
  kvbm_event ev[7];
  size_t n = sample_events(ev);
  kvbm_event_batch b = {.ts = 1712345678.25, .dp_rank = 3, .has_dp_rank = true,
                        .events = ev, .num_events = n};
  kvbm_event_encoder_config ec = {.form = form, .signed_hashes = sgn};
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_encoder_create(&ec, &enc, NULL), KVBM_OK);
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  const uint8_t *data;
  size_t len;
  kvbm_error err;
  int rc = kvbm_event_encode(enc, &b, &data, &len, &err);
  if (rc) fail_msg("%s", err.msg);
  /* hash 2^63 is 0xcf 80 00.. unsigned, 0xd3 80 00.. (int64 min) signed */
  static const uint8_t u63[] = {0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0};
  static const uint8_t s63[] = {0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0};
  bool found_u = false, found_s = false;
  for (size_t i = 0; i + 9 <= len; i++) {
    found_u |= !memcmp(data + i, u63, 9);
    found_s |= !memcmp(data + i, s63, 9);
  }
  assert_true(sgn ? found_s && !found_u : found_u && !found_s);
  kvbm_event_batch out;
  assert_int_equal(kvbm_event_decode(dec, data, len, 42, &out, &err), KVBM_OK);
  assert_int_equal(out.seq, 42);
  assert_int_equal(out.skipped, 0);
  assert_true(out.ts == b.ts);
  assert_true(out.has_dp_rank);
  assert_int_equal(out.dp_rank, 3);
  assert_int_equal(out.num_events, n);
  for (size_t i = 0; i < n; i++) {
    assert_event_eq(&out.events[i], &ev[i]);
    /* the wire text of the medium comes back as it went */
    if (ev[i].medium_name) assert_string_equal(out.events[i].medium_name, ev[i].medium_name);
    bool pos = form == KVBM_FORM_POSITIONAL;
    assert_carried_eq(&out.events[i], &ev[i], pos && !ev[i].cache_salt);
    if (pos && !ev[i].cache_salt) assert_int_equal(out.events[i].num_extras, 0);
  }
  /* Without dp_rank the array has two elements. */
  b.has_dp_rank = false;
  assert_int_equal(kvbm_event_encode(enc, &b, &data, &len, &err), KVBM_OK);
  assert_int_equal(data[0], 0x92);
  assert_int_equal(kvbm_event_decode(dec, data, len, 0, &out, &err), KVBM_OK);
  assert_false(out.has_dp_rank);
  kvbm_event_encoder_destroy(enc);
  kvbm_event_decoder_destroy(dec);
}

/* The publisher's path (each event encoded once when published, batches
 * framed from those bytes later, by a copy or in place) writes exactly
 * what kvbm_event_encode writes, in both forms, signed or not, with and
 * without a dp rank, and no event takes more than its bound. */
static void test_encode_once_then_frame(void **s) {
  (void)s;
  kvbm_event ev[7];
  size_t n = sample_events(ev);
  static const int32_t ranks[] = {0, 3, -1, -40000, 2000000000};
  for (int form = 0; form < 2; form++) {
    for (int sgn = 0; sgn < 2; sgn++) {
      kvbm_event_encoder_config ec = {.form = form ? KVBM_FORM_MAP : KVBM_FORM_POSITIONAL,
                                      .signed_hashes = sgn};
      kvbm_event_encoder *enc, *framer;
      assert_int_equal(kvbm_event_encoder_create(&ec, &enc, NULL), KVBM_OK);
      assert_int_equal(kvbm_event_encoder_create(&ec, &framer, NULL), KVBM_OK);
      uint8_t wire[4096], *p = wire;
      for (size_t i = 0; i < n; i++) {
        size_t bound = kvbm__event_wire_bound(&ev[i]);
        assert_true((size_t)(p - wire) + bound <= sizeof wire);
        uint8_t *e = kvbm__event_put(p, &ev[i], &ec);
        assert_true(e > p && (size_t)(e - p) <= bound);
        p = e;
      }
      for (size_t r = 0; r < sizeof ranks / sizeof *ranks; r++) {
        for (int has = 0; has < 2; has++) {
          kvbm_event_batch b = {.ts = 1712345678.25 + (double)r, .dp_rank = ranks[r],
                                .has_dp_rank = has, .events = ev, .num_events = n};
          const uint8_t *want, *got;
          size_t wlen, glen;
          assert_int_equal(kvbm_event_encode(enc, &b, &want, &wlen, NULL), KVBM_OK);
          assert_int_equal(kvbm__event_frame(framer, b.ts, has, ranks[r], n, wire,
                                             (size_t)(p - wire), &got, &glen),
                           KVBM_OK);
          assert_int_equal(glen, wlen);
          assert_memory_equal(got, want, wlen);
          /* in place, as the publisher frames its batch buffers: the head
           * written right before the events, the rank after them */
          uint8_t inplace[KVBM__EVENT_HEAD_MAX + sizeof wire + KVBM__MP_SCALAR_MAX];
          uint8_t *events = inplace + KVBM__EVENT_HEAD_MAX;
          memcpy(events, wire, (size_t)(p - wire));
          uint8_t *start = kvbm__event_head_before(events, b.ts, has, n);
          uint8_t *end = events + (p - wire);
          if (has) end = kvbm__mp_put_int(end, ranks[r]);
          assert_true(start >= inplace);
          assert_int_equal((size_t)(end - start), wlen);
          assert_memory_equal(start, want, wlen);
        }
      }
      /* an empty batch frames as an empty event array */
      const uint8_t *got;
      size_t glen;
      assert_int_equal(kvbm__event_frame(framer, 1.0, true, 0, 0, wire, 0, &got, &glen), KVBM_OK);
      assert_int_equal(glen, 1 + 9 + 1 + 1);
      assert_int_equal(got[10], 0x90);
      kvbm_event_encoder_destroy(enc);
      kvbm_event_encoder_destroy(framer);
    }
  }
}

/* The encoder's bytes are msgpack-c's: the batch head and the integers
 * it writes (the ts as float64, the dp rank in its shortest form). */
static void test_batch_head_as_msgpack_c(void **s) {
  (void)s;
  static const int32_t ranks[] = {0, 127, 128, -1, -33, -129, 70000, -70000};
  kvbm_event_encoder *enc;
  assert_int_equal(kvbm_event_encoder_create(NULL, &enc, NULL), KVBM_OK);
  for (size_t r = 0; r < sizeof ranks / sizeof *ranks; r++) {
    kvbm_event_batch b = {.ts = 0.5 + (double)r, .dp_rank = ranks[r], .has_dp_rank = true};
    const uint8_t *data;
    size_t len;
    assert_int_equal(kvbm_event_encode(enc, &b, &data, &len, NULL), KVBM_OK);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, b.ts);
    msgpack_pack_array(&pk, 0);
    msgpack_pack_int32(&pk, b.dp_rank);
    assert_int_equal(len, sb.size);
    assert_memory_equal(data, sb.data, len);
    msgpack_sbuffer_destroy(&sb);
  }
  kvbm_event_encoder_destroy(enc);
}

static void test_roundtrip_positional(void **s) { (void)s; roundtrip(KVBM_FORM_POSITIONAL, false); }
static void test_roundtrip_map(void **s) { (void)s; roundtrip(KVBM_FORM_MAP, false); }
static void test_roundtrip_signed(void **s) {
  (void)s;
  roundtrip(KVBM_FORM_MAP, true);
  roundtrip(KVBM_FORM_POSITIONAL, true);
}

/* The default encoder writes tagged maps in an array batch, as vLLM does
 * since PR #42892: [ts, [{"type": ...}], dp_rank]. */
static void test_default_form_is_map(void **s) {
  (void)s;
  kvbm_event_encoder_config dc = kvbm_event_encoder_config_default();
  assert_int_equal(dc.form, KVBM_FORM_MAP);
  assert_false(dc.signed_hashes);
  kvbm_event_encoder *enc;
  assert_int_equal(kvbm_event_encoder_create(NULL, &enc, NULL), KVBM_OK);
  uint64_t h = 5;
  kvbm_event ev = {.type = KVBM_EVENT_REMOVED, .block_hashes = &h, .num_block_hashes = 1,
                   .medium = KVBM_MEDIUM_GPU};
  kvbm_event_batch b = {.ts = 1.0, .dp_rank = 0, .has_dp_rank = true, .events = &ev,
                        .num_events = 1};
  const uint8_t *data;
  size_t len;
  assert_int_equal(kvbm_event_encode(enc, &b, &data, &len, NULL), KVBM_OK);
  /* 0x93 [ts float64 (9 bytes), 0x91 [ 0x83 {"type": "BlockRemoved", ... */
  assert_int_equal(data[0], 0x93);
  assert_int_equal(data[10], 0x91);
  assert_int_equal(data[11], 0x83);
  assert_int_equal(data[12], 0xa4);
  assert_memory_equal(data + 13, "type", 4);
  kvbm_event_encoder_destroy(enc);
  kvbm_event_encoder_config bad = {.form = (kvbm_event_form)7};
  kvbm_error err;
  assert_int_equal(kvbm_event_encoder_create(&bad, &enc, &err), KVBM_EINVAL);
}

/* Packs with msgpack-c, as another sender would. */
typedef struct pk {
  msgpack_sbuffer sb;
  msgpack_packer p;
} pk;
static void pk_init(pk *k) {
  msgpack_sbuffer_init(&k->sb);
  msgpack_packer_init(&k->p, &k->sb, msgpack_sbuffer_write);
}
static void pk_str(pk *k, const char *s) {
  msgpack_pack_str(&k->p, strlen(s));
  msgpack_pack_str_body(&k->p, s, strlen(s));
}

static int decode_pk(pk *k, kvbm_event_batch *out, kvbm_error *err, kvbm_event_decoder *dec) {
  return kvbm_event_decode(dec, k->sb.data, k->sb.size, 7, out, err);
}

/* vLLM bytes hashes (low 64 bits, big-endian), negative int hashes, a map
 * batch, unknown fields in both forms, old SGLang-style short events. */
static void test_wire_variants(void **s) {
  (void)s;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  pk k;
  pk_init(&k);
  msgpack_pack_map(&k.p, 4);
  pk_str(&k, "ts");
  msgpack_pack_int(&k.p, 17); /* an integer timestamp is accepted */
  pk_str(&k, "future_field");
  msgpack_pack_array(&k.p, 2);
  msgpack_pack_nil(&k.p);
  msgpack_pack_map(&k.p, 0);
  pk_str(&k, "events");
  msgpack_pack_array(&k.p, 4);
  /* positional, 32-byte hash, negative parent, trailing unknown fields */
  msgpack_pack_array(&k.p, 13);
  pk_str(&k, "BlockStored");
  msgpack_pack_array(&k.p, 2);
  uint8_t h32[32];
  for (int i = 0; i < 32; i++) h32[i] = (uint8_t)(i + 1);
  msgpack_pack_bin(&k.p, 32);
  msgpack_pack_bin_body(&k.p, h32, 32);
  msgpack_pack_bin(&k.p, 3);
  msgpack_pack_bin_body(&k.p, h32, 3);
  msgpack_pack_int64(&k.p, -2);
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_uint32(&k.p, 99);
  msgpack_pack_uint32(&k.p, 1);
  msgpack_pack_nil(&k.p);     /* lora_id */
  pk_str(&k, "cpu");          /* medium, lower case */
  msgpack_pack_nil(&k.p);     /* lora_name */
  msgpack_pack_array(&k.p, 1);/* extra_keys: kept as bytes */
  msgpack_pack_nil(&k.p);
  msgpack_pack_int(&k.p, 2);  /* group_idx */
  pk_str(&k, "kind");         /* kv_cache_spec_kind */
  msgpack_pack_int(&k.p, 0);  /* kv_cache_spec_sliding_window */
  msgpack_pack_map(&k.p, 1);  /* past the known fields: skipped */
  msgpack_pack_int(&k.p, 1);
  msgpack_pack_int(&k.p, 2);
  /* old 5-field BlockStored (no medium) */
  msgpack_pack_array(&k.p, 5);
  pk_str(&k, "BlockStored");
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_uint64(&k.p, 5);
  msgpack_pack_nil(&k.p);
  msgpack_pack_array(&k.p, 0);
  msgpack_pack_int(&k.p, 16);
  /* map event with unknown keys, type not first */
  msgpack_pack_map(&k.p, 4);
  pk_str(&k, "block_hashes");
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_int64(&k.p, -1);
  pk_str(&k, "whatever");
  msgpack_pack_array(&k.p, 3);
  msgpack_pack_true(&k.p);
  msgpack_pack_double(&k.p, 1.5);
  msgpack_pack_bin(&k.p, 0);
  pk_str(&k, "type");
  pk_str(&k, "BlockRemoved");
  pk_str(&k, "medium");
  msgpack_pack_nil(&k.p);
  /* cleared with a trailing field */
  msgpack_pack_array(&k.p, 2);
  pk_str(&k, "AllBlocksCleared");
  msgpack_pack_int(&k.p, 1);
  pk_str(&k, "data_parallel_rank");
  msgpack_pack_int(&k.p, -1);

  kvbm_event_batch b;
  kvbm_error err;
  int rc = decode_pk(&k, &b, &err, dec);
  if (rc) fail_msg("%s", err.msg);
  assert_true(b.ts == 17.0);
  assert_true(b.has_dp_rank);
  assert_int_equal(b.dp_rank, -1);
  assert_int_equal(b.num_events, 4);
  const kvbm_event *e = &b.events[0];
  assert_int_equal(e->type, KVBM_EVENT_STORED);
  assert_true(e->block_hashes[0] == 0x191a1b1c1d1e1f20ull);
  assert_true(e->block_hashes[1] == 0x010203ull);
  assert_true(e->has_parent && e->parent_hash == 0xfffffffffffffffeull);
  assert_int_equal(e->medium, KVBM_MEDIUM_CPU);
  assert_string_equal(e->medium_name, "cpu");
  assert_false(e->has_lora_id);
  assert_null(e->lora_name);
  assert_true(e->has_group_idx && e->group_idx == 2);
  assert_int_equal(e->extra_keys_len, 2);
  assert_memory_equal(e->extra_keys, "\x91\xc0", 2);
  assert_string_equal(e->kv_cache_spec_kind, "kind");
  assert_true(e->has_sliding_window && e->sliding_window == 0);
  assert_int_equal(e->num_extras, 0);
  e = &b.events[1];
  assert_int_equal(e->type, KVBM_EVENT_STORED);
  assert_int_equal(e->block_size, 16);
  assert_int_equal(e->num_tokens, 0);
  assert_int_equal(e->medium, KVBM_MEDIUM_NONE);
  assert_false(e->has_parent);
  e = &b.events[2];
  assert_int_equal(e->type, KVBM_EVENT_REMOVED);
  assert_true(e->block_hashes[0] == UINT64_MAX);
  /* the unknown key is kept, as its bytes, for a relay */
  assert_int_equal(e->num_extras, 1);
  assert_int_equal(e->extras_len, 1 + 8 + 1 + 1 + 9 + 2);
  assert_int_equal(e->extras[0], 0xa8);
  assert_memory_equal(e->extras + 1, "whatever", 8);
  assert_int_equal(b.events[3].type, KVBM_EVENT_CLEARED);
  msgpack_sbuffer_destroy(&k.sb);
  kvbm_event_decoder_destroy(dec);
}

/* Each malformed payload gives the expected error and a message. */
static void expect_bad(kvbm_event_decoder *dec, const void *data, size_t len, int want,
                       const char *needle) {
  kvbm_event_batch b;
  kvbm_error err = {0};
  int rc = kvbm_event_decode(dec, data, len, 0, &b, &err);
  if (rc != want) fail_msg("got %s (%s), want %s", kvbm_status_name(rc), err.msg, kvbm_status_name(want));
  assert_int_equal(err.code, want);
  if (needle && !strstr(err.msg, needle)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, needle);
}

static void test_malformed(void **s) {
  (void)s;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  /* absurd lengths: arrays, maps, strings, bins that claim 4 billion */
  const uint8_t huge_arr[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
  expect_bad(dec, huge_arr, sizeof huge_arr, KVBM_ETRUNCATED, "ends early");
  const uint8_t huge_events[] = {0x92, 0x00, 0xdd, 0x10, 0x00, 0x00, 0x00, 0xc0, 0xc0};
  expect_bad(dec, huge_events, sizeof huge_events, KVBM_ETRUNCATED, "events array");
  const uint8_t huge_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0x00};
  expect_bad(dec, huge_map, sizeof huge_map, KVBM_ETRUNCATED, NULL);
  const uint8_t huge_str[] = {0x92, 0x00, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff, 'B'};
  expect_bad(dec, huge_str, sizeof huge_str, KVBM_ETRUNCATED, NULL);
  const uint8_t huge_hashes[] = {0x92, 0x00, 0x91, 0x92, 0xab, 'B', 'l', 'o', 'c', 'k', 'R',
                                 'e', 'm', 'o', 'v', 'e', 0xdd, 0x10, 0, 0, 0, 1};
  expect_bad(dec, huge_hashes, sizeof huge_hashes, KVBM_EFORMAT, "unknown event tag");
  /* not msgpack at all / reserved byte / empty */
  expect_bad(dec, "\xc1", 1, KVBM_EFORMAT, NULL);
  expect_bad(dec, "", 0, KVBM_ETRUNCATED, "empty");
  expect_bad(dec, "hello", 5, KVBM_EFORMAT, "batch");
  /* truncated in the middle of a float */
  const uint8_t trunc_ts[] = {0x93, 0xcb, 0x41, 0xd9};
  expect_bad(dec, trunc_ts, sizeof trunc_ts, KVBM_ETRUNCATED, NULL);
  /* trailing garbage after a complete batch */
  const uint8_t trailing[] = {0x92, 0x00, 0x90, 0x00};
  expect_bad(dec, trailing, sizeof trailing, KVBM_ETOOLONG, "after the batch");
  /* a batch with only a timestamp */
  const uint8_t short_batch[] = {0x91, 0x00};
  expect_bad(dec, short_batch, sizeof short_batch, KVBM_EFORMAT, "fewer than 2");

  /* an event that is not well-formed msgpack costs the payload: its
   * end is unknown */
  const uint8_t bad_event[] = {0x92, 0x00, 0x92, 0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c',
                               'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0x92, 0xc1, 0x00};
  expect_bad(dec, bad_event, sizeof bad_event, KVBM_EFORMAT, "event 1");
  const uint8_t dp_str[] = {0x93, 0x00, 0x90, 0xa1, 'x'};
  expect_bad(dec, dp_str, sizeof dp_str, KVBM_EFORMAT, "dp_rank");
  const uint8_t ts_str[] = {0x92, 0xa1, 'x', 0x90};
  expect_bad(dec, ts_str, sizeof ts_str, KVBM_EFORMAT, "timestamp");
  /* deep nesting in a skipped field does not recurse */
  size_t deep = 100000;
  uint8_t *d = malloc(deep + 32);
  size_t n = 0;
  d[n++] = 0x92;
  d[n++] = 0x00;
  d[n++] = 0x91;
  d[n++] = 0x92;
  d[n++] = 0xb0;
  memcpy(d + n, "AllBlocksCleared", 16);
  n += 16;
  for (size_t i = 0; i < deep; i++) d[n++] = 0x91;
  d[n++] = 0xc0;
  kvbm_event_batch b;
  assert_int_equal(kvbm_event_decode(dec, d, n, 0, &b, NULL), KVBM_OK);
  assert_int_equal(b.num_events, 1);
  /* every truncation of a good payload fails cleanly */
  kvbm_event ev[7];
  size_t ne = sample_events(ev);
  kvbm_event_batch gb = {.ts = 1.0, .events = ev, .num_events = ne, .has_dp_rank = true};
  for (int form = 0; form < 2; form++) {
    kvbm_event_encoder_config ec = {.form = (kvbm_event_form)form};
    kvbm_event_encoder *enc;
    assert_int_equal(kvbm_event_encoder_create(&ec, &enc, NULL), KVBM_OK);
    const uint8_t *data;
    size_t len;
    assert_int_equal(kvbm_event_encode(enc, &gb, &data, &len, NULL), 0);
    uint8_t *copy = malloc(len);
    memcpy(copy, data, len);
    for (size_t cut = 0; cut < len; cut++) {
      /* a fresh copy of exactly `cut` bytes so ASan sees any overread */
      uint8_t *t = malloc(cut ? cut : 1);
      memcpy(t, copy, cut);
      int rc = kvbm_event_decode(dec, t, cut, 0, &b, NULL);
      assert_true(rc == KVBM_ETRUNCATED || rc == KVBM_EFORMAT);
      free(t);
    }
    /* and every single-byte corruption either decodes or fails cleanly */
    for (size_t pos = 0; pos < len; pos++) {
      uint8_t saved = copy[pos];
      for (int v = 0; v < 256; v += 17) {
        copy[pos] = (uint8_t)v;
        int rc = kvbm_event_decode(dec, copy, len, 0, &b, NULL);
        assert_true(rc == KVBM_OK || rc == KVBM_ETRUNCATED || rc == KVBM_EFORMAT ||
                    rc == KVBM_ETOOLONG);
      }
      copy[pos] = saved;
    }
    free(copy);
    kvbm_event_encoder_destroy(enc);
  }
  free(d);
  kvbm_event_decoder_destroy(dec);
}

static void expect_reject(kvbm_event_encoder *enc, const kvbm_event *ev, const char *needle) {
  kvbm_event_batch b = {.events = ev, .num_events = 1};
  const uint8_t *data;
  size_t len;
  kvbm_error err = {0};
  assert_int_equal(kvbm_event_encode(enc, &b, &data, &len, &err), KVBM_EINVAL);
  if (!strstr(err.msg, needle)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, needle);
}

static void test_encode_rejects(void **s) {
  (void)s;
  kvbm_event_encoder *enc, *penc;
  assert_int_equal(kvbm_event_encoder_create(NULL, &enc, NULL), KVBM_OK);
  kvbm_event_encoder_config pc = {.form = KVBM_FORM_POSITIONAL};
  assert_int_equal(kvbm_event_encoder_create(&pc, &penc, NULL), KVBM_OK);
  uint64_t h = 1;
  uint32_t t[2] = {1, 2};
  kvbm_event ev = {.type = (kvbm_event_type)9};
  expect_reject(enc, &ev, "unknown type");
  ev = (kvbm_event){.type = KVBM_EVENT_REMOVED, .medium = KVBM_MEDIUM_OTHER};
  expect_reject(enc, &ev, "medium");
  ev = (kvbm_event){.type = KVBM_EVENT_REMOVED, .block_hashes = &h, .num_block_hashes = 1,
                    .medium = KVBM_MEDIUM_GPU, .medium_name = "DISK"};
  expect_reject(enc, &ev, "does not name");
  kvbm_event st = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1,
                   .token_ids = t, .num_tokens = 1, .block_size = 1, .token_pairs = true};
  expect_reject(enc, &st, "pairs");
  st.token_pairs = false;
  st.lora_name = "l";
  st.cache_salt = "s";
  expect_reject(penc, &st, "not both");
  assert_int_equal(kvbm_event_check(&st, NULL, NULL), KVBM_OK); /* the map form has both */
  st.cache_salt = NULL;
  static const uint8_t two[] = {0x01, 0x02};
  st.extra_keys = two;
  st.extra_keys_len = 2;
  expect_reject(enc, &st, "extra_keys");
  st.extra_keys_len = 1;
  assert_int_equal(kvbm_event_check(&st, NULL, NULL), KVBM_OK);
  static const uint8_t named[] = {0xa6, 'm', 'e', 'd', 'i', 'u', 'm', 0xc0};
  st.extras = named;
  st.extras_len = sizeof named;
  st.num_extras = 1;
  expect_reject(enc, &st, "extras");
  static const uint8_t intkey[] = {0x01, 0xc0};
  st.extras = intkey;
  st.extras_len = sizeof intkey;
  expect_reject(enc, &st, "extras");
  static const uint8_t ok[] = {0xa1, 'z', 0xc0};
  st.extras = ok;
  st.extras_len = sizeof ok;
  assert_int_equal(kvbm_event_check(&st, NULL, NULL), KVBM_OK);
  st.num_extras = 2;
  expect_reject(enc, &st, "extras");
  kvbm_event_encoder_destroy(enc);
  kvbm_event_encoder_destroy(penc);
}

/* Decodes one batch of the events packed by `fill`; checks the skipped
 * count and, when skip_needle is set, the first skip's reason. */
typedef void (*fill_fn)(pk *k);
static kvbm_event_batch decode_events(kvbm_event_decoder *dec, pk *k, uint32_t nev, fill_fn fill,
                                      size_t want_skipped, const char *skip_needle) {
  pk_init(k);
  msgpack_pack_array(&k->p, 3);
  msgpack_pack_double(&k->p, 2.5);
  msgpack_pack_array(&k->p, nev);
  fill(k);
  msgpack_pack_int(&k->p, 5);
  kvbm_event_batch b;
  kvbm_error err;
  int rc = kvbm_event_decode(dec, k->sb.data, k->sb.size, 3, &b, &err);
  if (rc) fail_msg("%s", err.msg);
  assert_int_equal(b.skipped, want_skipped);
  if (skip_needle && !strstr(kvbm_event_decoder_skip_reason(dec), skip_needle))
    fail_msg("skip reason \"%s\" lacks \"%s\"", kvbm_event_decoder_skip_reason(dec), skip_needle);
  if (!want_skipped) assert_string_equal(kvbm_event_decoder_skip_reason(dec), "");
  return b;
}

static void pack_sglang_stored(pk *k, uint64_t h, const char *medium, const char *salt,
                               const char *session) {
  msgpack_pack_array(&k->p, salt ? 8 : 7);
  pk_str(k, "BlockStored");
  msgpack_pack_array(&k->p, 1);
  msgpack_pack_uint64(&k->p, h);
  msgpack_pack_nil(&k->p);
  msgpack_pack_array(&k->p, 2);
  msgpack_pack_int(&k->p, 11);
  msgpack_pack_int(&k->p, 12);
  msgpack_pack_int(&k->p, 2);
  msgpack_pack_nil(&k->p);
  pk_str(k, medium);
  if (!salt) return;
  msgpack_pack_map(&k->p, session ? 2 : 1);
  pk_str(k, "cache_salt");
  pk_str(k, salt);
  if (session) {
    pk_str(k, "session_id");
    pk_str(k, session);
  }
}

static void fill_sglang(pk *k) {
  pack_sglang_stored(k, 1, "GPU", NULL, NULL);            /* unsalted: 7 long */
  pack_sglang_stored(k, 2, "CPU_PINNED", "tenant-a", NULL); /* BlockStoredWithMetadata */
  pack_sglang_stored(k, 3, "GPU", "tenant-b", "sess-9");   /* + session_id (#37482) */
  msgpack_pack_array(&k->p, 3);                            /* BlockRemoved with a medium */
  pk_str(k, "BlockRemoved");
  msgpack_pack_array(&k->p, 1);
  msgpack_pack_uint64(&k->p, 2);
  pk_str(k, "CPU_PINNED");
}

/* SGLang's salted BlockStored: a map at positional index 7 holds the salt
 * (where vLLM has lora_name). It decodes, the salt is carried, and the
 * batch and its sequence number are not lost. */
static void test_sglang_salted_positional(void **s) {
  (void)s;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  pk k;
  kvbm_event_batch b = decode_events(dec, &k, 4, fill_sglang, 0, NULL);
  assert_int_equal(b.num_events, 4);
  assert_true(b.has_dp_rank && b.dp_rank == 5);
  assert_null(b.events[0].cache_salt);
  assert_null(b.events[0].lora_name);
  assert_string_equal(b.events[1].cache_salt, "tenant-a");
  assert_null(b.events[1].lora_name);
  assert_int_equal(b.events[1].num_extras, 0);
  assert_int_equal(b.events[1].medium, KVBM_MEDIUM_CPU);
  assert_int_equal(kvbm_medium_tier(b.events[1].medium), KVBM_TIER_G2);
  assert_string_equal(b.events[2].cache_salt, "tenant-b");
  assert_int_equal(b.events[2].num_extras, 1); /* session_id, kept */
  assert_int_equal(b.events[3].type, KVBM_EVENT_REMOVED);
  assert_int_equal(kvbm_medium_tier(b.events[3].medium), KVBM_TIER_G2);
  /* and back: the positional form writes the metadata map at index 7 again,
   * the map form a "cache_salt" key; both read back the same */
  for (int form = 0; form < 2; form++) {
    kvbm_event_encoder_config ec = {.form = (kvbm_event_form)form};
    kvbm_event_encoder *enc;
    assert_int_equal(kvbm_event_encoder_create(&ec, &enc, NULL), KVBM_OK);
    const uint8_t *data;
    size_t len;
    assert_int_equal(kvbm_event_encode(enc, &b, &data, &len, NULL), KVBM_OK);
    uint8_t *copy = malloc(len);
    memcpy(copy, data, len);
    kvbm_event_decoder *d2;
    assert_int_equal(kvbm_event_decoder_create(&d2, NULL), KVBM_OK);
    kvbm_event_batch b2;
    assert_int_equal(kvbm_event_decode(d2, copy, len, 0, &b2, NULL), KVBM_OK);
    assert_int_equal(b2.num_events, 4);
    for (size_t i = 0; i < 4; i++) {
      assert_event_eq(&b2.events[i], &b.events[i]);
      assert_carried_eq(&b2.events[i], &b.events[i], false);
    }
    kvbm_event_decoder_destroy(d2);
    kvbm_event_encoder_destroy(enc);
    free(copy);
  }
  msgpack_sbuffer_destroy(&k.sb);
  kvbm_event_decoder_destroy(dec);
}

static void pack_good_removed(pk *k, uint64_t h) {
  msgpack_pack_map(&k->p, 3);
  pk_str(k, "type");
  pk_str(k, "BlockRemoved");
  pk_str(k, "block_hashes");
  msgpack_pack_array(&k->p, 1);
  msgpack_pack_uint64(&k->p, h);
  pk_str(k, "medium");
  pk_str(k, "GPU");
}

static void fill_mixed(pk *k) {
  pack_good_removed(k, 100);
  msgpack_pack_map(&k->p, 1); /* Dynamo's "Ignored" */
  pk_str(k, "type");
  pk_str(k, "Ignored");
  msgpack_pack_array(&k->p, 5); /* hashes of the wrong type */
  pk_str(k, "BlockStored");
  pk_str(k, "not hashes");
  msgpack_pack_nil(&k->p);
  msgpack_pack_array(&k->p, 0);
  msgpack_pack_int(&k->p, 16);
  pack_good_removed(k, 101);
  msgpack_pack_map(&k->p, 3); /* a token id that is a float */
  pk_str(k, "type");
  pk_str(k, "BlockStored");
  pk_str(k, "block_hashes");
  msgpack_pack_array(&k->p, 0);
  pk_str(k, "token_ids");
  msgpack_pack_array(&k->p, 1);
  msgpack_pack_double(&k->p, 2.0);
  msgpack_pack_int(&k->p, 42); /* not an event at all */
  msgpack_pack_array(&k->p, 1); /* an unknown positional tag */
  pk_str(k, "BlockMoved");
  msgpack_pack_map(&k->p, 2); /* a required field missing */
  pk_str(k, "type");
  pk_str(k, "BlockStored");
  pk_str(k, "block_hashes");
  msgpack_pack_array(&k->p, 0);
  msgpack_pack_array(&k->p, 6); /* token ids beyond 32 bits, negative */
  pk_str(k, "BlockStored");
  msgpack_pack_array(&k->p, 0);
  msgpack_pack_nil(&k->p);
  msgpack_pack_array(&k->p, 2);
  msgpack_pack_uint64(&k->p, 1ull << 32);
  msgpack_pack_int(&k->p, -3);
  msgpack_pack_int(&k->p, 16);
  msgpack_pack_nil(&k->p);
  msgpack_pack_array(&k->p, 3); /* a name with a NUL byte */
  pk_str(k, "BlockRemoved");
  msgpack_pack_array(&k->p, 0);
  msgpack_pack_str(&k->p, 3);
  msgpack_pack_str_body(&k->p, "G\0U", 3);
  pack_good_removed(k, 102);
}

/* One bad event never costs the batch: unknown tags, fields of the wrong
 * type, missing fields, are skipped and counted; the rest is applied. */
static void test_bad_event_skipped(void **s) {
  (void)s;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  pk k;
  kvbm_event_batch b = decode_events(dec, &k, 11, fill_mixed, 8, "unknown event tag \"Ignored\"");
  assert_int_equal(b.num_events, 3);
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(b.events[i].type, KVBM_EVENT_REMOVED);
    assert_int_equal(b.events[i].num_block_hashes, 1);
    assert_true(b.events[i].block_hashes[0] == 100 + i);
  }
  assert_int_equal(b.seq, 3);
  msgpack_sbuffer_destroy(&k.sb);
  kvbm_event_decoder_destroy(dec);
}

/* One BlockStored map event written by msgpack-c: its keys in the order
 * `order` names (indices into vLLM's 8 keys; vLLM's order is 0..7), the
 * medium's text as `medium` (str8 when `str8`), and `extra` optional
 * keys after the first `extra_at` keys. */
static void pk_stored_map(pk *k, const int *order, const char *medium, bool str8, int extra_at) {
  msgpack_pack_map(&k->p, 8 + (extra_at >= 0));
  for (int j = 0; j < 8; j++) {
    if (j == extra_at) {
      pk_str(k, "group_idx");
      msgpack_pack_int(&k->p, 3);
    }
    switch (order[j]) {
      case 0: pk_str(k, "type"); pk_str(k, "BlockStored"); break;
      case 1:
        pk_str(k, "block_hashes");
        msgpack_pack_array(&k->p, 2);
        msgpack_pack_uint64(&k->p, 0x9e3779b97f4a7c15ull);
        msgpack_pack_uint64(&k->p, 7);
        break;
      case 2: pk_str(k, "parent_block_hash"); msgpack_pack_uint64(&k->p, 1ull << 63); break;
      case 3:
        pk_str(k, "token_ids");
        msgpack_pack_array(&k->p, 4);
        for (uint32_t t = 0; t < 4; t++) msgpack_pack_uint32(&k->p, t * 70000u);
        break;
      case 4: pk_str(k, "block_size"); msgpack_pack_int(&k->p, 2); break;
      case 5: pk_str(k, "lora_id"); msgpack_pack_nil(&k->p); break;
      case 6:
        pk_str(k, "medium");
        if (str8) {
          static const uint8_t h[2] = {0xd9, 3}; /* "GPU" as str8: the same text */
          msgpack_sbuffer_write(&k->sb, (const char *)h, 2);
          msgpack_sbuffer_write(&k->sb, medium, 3);
        } else {
          pk_str(k, medium);
        }
        break;
      case 7: pk_str(k, "lora_name"); msgpack_pack_nil(&k->p); break;
    }
  }
  if (extra_at == 8) { /* after the required keys, as vLLM writes it */
    pk_str(k, "group_idx");
    msgpack_pack_int(&k->p, 3);
  }
}

/* The decoder reads map events whose keys come in vLLM's order without
 * looking each key up, and a "GPU"/"CPU" medium without copying it. Any
 * other order, an optional key in the middle, another encoding of the
 * same text, a medium in other case: the same event, read the general
 * way from the first key that differs; a bad field on the quick path
 * costs that event only, with the field named. */
static void test_map_key_orders(void **s) {
  (void)s;
  static const int vllm[8] = {0, 1, 2, 3, 4, 5, 6, 7}, rev[8] = {7, 6, 5, 4, 3, 2, 1, 0},
                   swap[8] = {0, 1, 3, 2, 4, 5, 6, 7}, late_type[8] = {1, 0, 2, 3, 4, 5, 6, 7};
  static const struct {
    const int *order;
    const char *medium;
    bool str8;
    int extra_at;
    kvbm_medium want;
  } kCases[] = {
      {vllm, "GPU", false, -1, KVBM_MEDIUM_GPU}, {rev, "GPU", false, -1, KVBM_MEDIUM_GPU},
      {swap, "CPU", false, -1, KVBM_MEDIUM_CPU}, {late_type, "GPU", false, -1, KVBM_MEDIUM_GPU},
      {vllm, "GPU", true, -1, KVBM_MEDIUM_GPU},  {vllm, "gpu", false, -1, KVBM_MEDIUM_GPU},
      {vllm, "GPU", false, 3, KVBM_MEDIUM_GPU},  {vllm, "GPX", false, -1, KVBM_MEDIUM_OTHER},
      {vllm, "CPU", false, 8, KVBM_MEDIUM_CPU},
  };
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  for (size_t c = 0; c < sizeof kCases / sizeof kCases[0]; c++) {
    pk k;
    pk_init(&k);
    msgpack_pack_array(&k.p, 3);
    msgpack_pack_double(&k.p, 1.0);
    msgpack_pack_array(&k.p, 2);
    pk_stored_map(&k, kCases[c].order, kCases[c].medium, kCases[c].str8, kCases[c].extra_at);
    msgpack_pack_map(&k.p, 3); /* a BlockRemoved in vLLM's order */
    pk_str(&k, "type");
    pk_str(&k, "BlockRemoved");
    pk_str(&k, "block_hashes");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_uint64(&k.p, 7);
    pk_str(&k, "medium");
    pk_str(&k, kCases[c].medium);
    msgpack_pack_int(&k.p, 0);
    kvbm_event_batch b;
    kvbm_error err;
    if (decode_pk(&k, &b, &err, dec)) fail_msg("case %zu: %s", c, err.msg);
    assert_int_equal(b.num_events, 2);
    assert_int_equal(b.skipped, 0);
    const kvbm_event *e = &b.events[0];
    assert_int_equal(e->type, KVBM_EVENT_STORED);
    assert_int_equal(e->num_block_hashes, 2);
    assert_true(e->block_hashes[0] == 0x9e3779b97f4a7c15ull && e->block_hashes[1] == 7);
    assert_true(e->has_parent && e->parent_hash == 1ull << 63);
    assert_int_equal(e->num_tokens, 4);
    for (uint32_t t = 0; t < 4; t++) assert_int_equal(e->token_ids[t], t * 70000u);
    assert_int_equal(e->block_size, 2);
    assert_false(e->has_lora_id);
    assert_null(e->lora_name);
    assert_int_equal(e->medium, kCases[c].want);
    assert_string_equal(e->medium_name, kCases[c].medium); /* the text as it came */
    assert_int_equal(e->has_group_idx, kCases[c].extra_at >= 0);
    if (e->has_group_idx) assert_int_equal(e->group_idx, 3);
    e = &b.events[1];
    assert_int_equal(e->type, KVBM_EVENT_REMOVED);
    assert_int_equal(e->num_block_hashes, 1);
    assert_int_equal(e->medium, kCases[c].want);
    assert_string_equal(e->medium_name, kCases[c].medium);
    msgpack_sbuffer_destroy(&k.sb);
  }
  /* in vLLM's order, block_size a string: that event is skipped, named */
  pk k;
  pk_init(&k);
  msgpack_pack_array(&k.p, 2);
  msgpack_pack_double(&k.p, 1.0);
  msgpack_pack_array(&k.p, 2);
  msgpack_pack_map(&k.p, 5);
  pk_str(&k, "type");
  pk_str(&k, "BlockStored");
  pk_str(&k, "block_hashes");
  msgpack_pack_array(&k.p, 0);
  pk_str(&k, "parent_block_hash");
  msgpack_pack_nil(&k.p);
  pk_str(&k, "token_ids");
  msgpack_pack_array(&k.p, 0);
  pk_str(&k, "block_size");
  pk_str(&k, "16");
  pk_stored_map(&k, vllm, "GPU", false, -1);
  kvbm_event_batch b;
  kvbm_error err;
  if (decode_pk(&k, &b, &err, dec)) fail_msg("%s", err.msg);
  assert_int_equal(b.num_events, 1);
  assert_int_equal(b.skipped, 1);
  assert_non_null(strstr(kvbm_event_decoder_skip_reason(dec), "block_size"));
  assert_int_equal(b.events[0].block_size, 2);
  msgpack_sbuffer_destroy(&k.sb);
  kvbm_event_decoder_destroy(dec);
}

/* Token ids in every msgpack form an engine may write: the unsigned
 * forms go the quick way, a signed form (msgpack-c's int8/int16 of a
 * non-negative id) hands over to the general reader for the rest; both
 * give the same ids. A run of ids with too few bytes left is refused. */
static void test_token_forms(void **s) {
  (void)s;
  static const uint32_t want[] = {0, 127, 128, 255, 256, 65535, 65536, UINT32_MAX, 5, 300, 7,
                                  70000};
  enum { N = sizeof want / sizeof *want };
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  pk k;
  pk_init(&k);
  msgpack_pack_array(&k.p, 2);
  msgpack_pack_double(&k.p, 1.0);
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_array(&k.p, 5);
  pk_str(&k, "BlockStored");
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_uint64(&k.p, 1);
  msgpack_pack_nil(&k.p);
  msgpack_pack_array(&k.p, N);
  for (int i = 0; i < 8; i++) msgpack_pack_uint32(&k.p, want[i]); /* shortest unsigned forms */
  msgpack_pack_int8(&k.p, 5);    /* 0xd0 05 */
  msgpack_pack_int16(&k.p, 300); /* 0xd1 01 2c */
  msgpack_pack_uint32(&k.p, 7);
  msgpack_pack_uint32(&k.p, 70000);
  msgpack_pack_int(&k.p, 16);
  kvbm_event_batch b;
  kvbm_error err;
  if (kvbm_event_decode(dec, k.sb.data, k.sb.size, 0, &b, &err)) fail_msg("%s", err.msg);
  assert_int_equal(b.num_events, 1);
  assert_int_equal(b.events[0].num_tokens, N);
  for (int i = 0; i < N; i++) assert_int_equal(b.events[0].token_ids[i], want[i]);
  /* the same array declared one id longer than its bytes: refused */
  uint8_t cut[] = {0x92, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x91, 0x95, 0xab, 'B', 'l', 'o',
                   'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0x01, 0xc0, 0x93, 0xce, 0,
                   1, 0x11, 0x70, 0xce, 0, 1, 0x11, 0x70, 0x10};
  assert_int_not_equal(kvbm_event_decode(dec, cut, sizeof cut, 0, &b, &err), KVBM_OK);
  msgpack_sbuffer_destroy(&k.sb);
  kvbm_event_decoder_destroy(dec);
}

/* An event with no medium text is written with kvbm_medium_name's (nil
 * for NONE), in both forms, exactly as one that gives that text. */
static void test_medium_bytes(void **s) {
  (void)s;
  uint64_t h = 9;
  uint32_t t[2] = {1, 2};
  for (int form = 0; form < 2; form++) {
    kvbm_event_encoder_config ec = {.form = form ? KVBM_FORM_MAP : KVBM_FORM_POSITIONAL};
    for (int m = KVBM_MEDIUM_NONE; m <= KVBM_MEDIUM_REMOTE; m++) {
      for (int type = 0; type < 2; type++) {
        kvbm_event a = {.type = type ? KVBM_EVENT_REMOVED : KVBM_EVENT_STORED,
                        .block_hashes = &h, .num_block_hashes = 1, .token_ids = t,
                        .num_tokens = 2, .block_size = 2, .medium = (kvbm_medium)m};
        if (type) a.token_ids = NULL, a.num_tokens = 0, a.block_size = 0;
        kvbm_event b = a;
        b.medium_name = kvbm_medium_name((kvbm_medium)m);
        uint8_t wa[600], wb[600];
        size_t la = (size_t)(kvbm__event_put(wa, &a, &ec) - wa);
        size_t lb = (size_t)(kvbm__event_put(wb, &b, &ec) - wb);
        assert_int_equal(la, lb);
        assert_memory_equal(wa, wb, la);
        assert_true(la <= kvbm__event_wire_bound(&a));
      }
    }
  }
}

/* The publisher's template encoder writes, for every plain event, the
 * bytes of kvbm__event_put, within kvbm__event_plain_bound: both forms,
 * signed hashes, parent or not, LoRA id or not (negative too), every
 * medium, token ids at each msgpack width edge, 0..40 blocks, removes
 * (with token fields left set, which the wire drops), and the events it
 * hands back to kvbm__event_put (group index, sliding window). The
 * template bytes and the header counts are what a change could break. */
static void test_plain_same_bytes(void **s) {
  (void)s;
  static const uint32_t edge[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 151935, 0xffffffffu};
  uint64_t h[40];
  uint32_t t[640];
  for (size_t i = 0; i < 40; i++) h[i] = (i * 0x9e3779b97f4a7c15ull) >> (i % 64);
  for (size_t i = 0; i < 640; i++) t[i] = edge[i % 10] + (uint32_t)(i / 10 % 3) * (edge[i % 10] < 100);
  static uint8_t wa[16384], wb[16384];
  size_t cases = 0;
  for (int form = 0; form < 2; form++)
    for (int sgn = 0; sgn < 2; sgn++)
      for (int type = 0; type < 2; type++)
        for (size_t nb = 1; nb <= 40; nb += nb < 3 ? 1 : 13)
          for (int var = 0; var < 16; var++) {
            kvbm_event_encoder_config ec = {.form = form ? KVBM_FORM_MAP : KVBM_FORM_POSITIONAL,
                                            .signed_hashes = sgn};
            kvbm_event ev = {.type = type ? KVBM_EVENT_REMOVED : KVBM_EVENT_STORED,
                             .block_hashes = h + (40 - nb), .num_block_hashes = nb,
                             .token_ids = t + var, .num_tokens = 16 * nb, .block_size = 16,
                             .medium = (kvbm_medium)(var % 5)};
            if (var & 1) ev.has_parent = true, ev.parent_hash = ~h[var];
            if (var & 2) ev.has_lora_id = true, ev.lora_id = var & 4 ? -7 : 1ll << 40;
            if (var == 8) ev.token_ids = NULL, ev.num_tokens = 0; /* a store without tokens */
            if (var == 12) ev.has_group_idx = true, ev.group_idx = 3;
            if (var == 14) ev.has_sliding_window = true, ev.sliding_window = 128;
            kvbm_event full = ev;
            if (type) full.token_ids = NULL, full.num_tokens = 0;
            size_t la = (size_t)(kvbm__event_put_plain(wa, &ev, &ec) - wa);
            size_t lb = (size_t)(kvbm__event_put(wb, &full, &ec) - wb);
            assert_int_equal(la, lb);
            assert_memory_equal(wa, wb, la);
            assert_true(la <= kvbm__event_plain_bound(ev.num_block_hashes, ev.num_tokens));
            cases++;
          }
  assert_int_equal(cases, 2 * 2 * 2 * 5 * 16);
}

/* Found by fuzz_event_decode: SGLang's positional metadata map (index 7)
 * with a key the map form names itself ("block_size"). Kept as an extra it
 * made an event that the map form could not write (the key twice); the
 * event is skipped and the rest of the batch kept. */
static void test_metadata_key_names_a_field(void **s) {
  (void)s;
  static const uint8_t in[] = {
      0x93, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x92,
      0x98, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd',
      0x92, 0x01, 0x02, 0xc0, 0x92, 0x92, 0x01, 0x02, 0x92, 0x02, 0x03, 0x01, 0xc0,
      0xaa, 'C', 'P', 'U', '_', 'P', 'I', 'N', 'N', 'E', 'D',
      0x82, 0xaa, 'b', 'l', 'o', 'c', 'k', '_', 's', 'i', 'z', 'e', 0xa3, 't', '-', 'a',
      0xaa, 's', 'e', 's', 's', 'i', 'o', 'n', '_', 'i', 'd', 0xa1, 's',
      0x93, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0x01,
      0xa3, 'C', 'P', 'U', 0x00};
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  kvbm_event_batch b;
  kvbm_error err;
  assert_int_equal(kvbm_event_decode(dec, in, sizeof in, 1, &b, &err), KVBM_OK);
  assert_int_equal(b.skipped, 1);
  assert_non_null(strstr(kvbm_event_decoder_skip_reason(dec), "names an event field"));
  assert_int_equal(b.num_events, 1);
  assert_int_equal(b.events[0].type, KVBM_EVENT_REMOVED);
  for (int form = 0; form < 2; form++) {
    kvbm_event_encoder_config ec = {.form = (kvbm_event_form)form};
    assert_int_equal(kvbm_event_check(&b.events[0], &ec, NULL), KVBM_OK);
  }
  kvbm_event_decoder_destroy(dec);
}

static void fill_pairs(pk *k) {
  for (int v = 0; v < 2; v++) {
    msgpack_pack_map(&k->p, 4);
    pk_str(k, "type");
    pk_str(k, "BlockStored");
    pk_str(k, "block_hashes");
    msgpack_pack_array(&k->p, 1);
    msgpack_pack_uint64(&k->p, 9);
    pk_str(k, "block_size");
    msgpack_pack_int(&k->p, 3);
    pk_str(k, "token_ids"); /* [[1,2],[2,3],[3,4]]; the second does not chain */
    msgpack_pack_array(&k->p, 3);
    for (int i = 0; i < 3; i++) {
      msgpack_pack_array(&k->p, 2);
      msgpack_pack_int(&k->p, 1 + i);
      msgpack_pack_int(&k->p, 2 + i + (v && i == 1));
    }
  }
}

/* SGLang with EAGLE sends token ids as pairs [t_i, t_i+1]: kept as the
 * sequence they chain, and written back as pairs. */
static void test_token_pairs(void **s) {
  (void)s;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  pk k;
  kvbm_event_batch b = decode_events(dec, &k, 2, fill_pairs, 1, "do not chain");
  assert_int_equal(b.num_events, 1);
  const kvbm_event *e = &b.events[0];
  assert_true(e->token_pairs);
  assert_int_equal(e->num_tokens, 4);
  for (uint32_t i = 0; i < 4; i++) assert_int_equal(e->token_ids[i], i + 1);
  assert_false(e->has_parent); /* parent_block_hash may be left out of a map */
  kvbm_event_encoder *enc;
  assert_int_equal(kvbm_event_encoder_create(NULL, &enc, NULL), KVBM_OK);
  const uint8_t *data;
  size_t len;
  kvbm_event_batch one = {.ts = 1, .events = e, .num_events = 1};
  assert_int_equal(kvbm_event_encode(enc, &one, &data, &len, NULL), KVBM_OK);
  static const uint8_t pairs[] = {0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0x93,
                                  0x92, 1, 2, 0x92, 2, 3, 0x92, 3, 4};
  bool found = false;
  for (size_t i = 0; i + sizeof pairs <= len; i++) found |= !memcmp(data + i, pairs, sizeof pairs);
  assert_true(found);
  kvbm_event_encoder_destroy(enc);
  msgpack_sbuffer_destroy(&k.sb);
  kvbm_event_decoder_destroy(dec);
}

static void test_media(void **s) {
  (void)s;
  static const struct {
    const char *name;
    kvbm_medium m;
    kvbm_tier t;
  } cases[] = {
      {"GPU", KVBM_MEDIUM_GPU, KVBM_TIER_G1},        {"gpu", KVBM_MEDIUM_GPU, KVBM_TIER_G1},
      {"DEVICE", KVBM_MEDIUM_GPU, KVBM_TIER_G1},     {"", KVBM_MEDIUM_NONE, KVBM_TIER_G1},
      {"CPU", KVBM_MEDIUM_CPU, KVBM_TIER_G2},        {"CPU_PINNED", KVBM_MEDIUM_CPU, KVBM_TIER_G2},
      {"CPU_TIER1", KVBM_MEDIUM_CPU, KVBM_TIER_G2},  {"CPU_TIER2", KVBM_MEDIUM_CPU, KVBM_TIER_G2},
      {"DISK", KVBM_MEDIUM_DISK, KVBM_TIER_G3},      {"STORAGE", KVBM_MEDIUM_DISK, KVBM_TIER_G3},
      {"FS", KVBM_MEDIUM_DISK, KVBM_TIER_G3},        {"NVME", KVBM_MEDIUM_DISK, KVBM_TIER_G3},
      {"OBJ", KVBM_MEDIUM_REMOTE, KVBM_TIER_G4},     {"EXTERNAL", KVBM_MEDIUM_REMOTE, KVBM_TIER_G4},
      {"NETWORK", KVBM_MEDIUM_REMOTE, KVBM_TIER_G4}, {"SHARED", KVBM_MEDIUM_REMOTE, KVBM_TIER_G4},
      {"REMOTE", KVBM_MEDIUM_REMOTE, KVBM_TIER_G4},  {"HBM3", KVBM_MEDIUM_OTHER, KVBM_TIER_G3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kvbm_medium m = kvbm_medium_from_name(cases[i].name, strlen(cases[i].name));
    if (m != cases[i].m) fail_msg("%s: medium %d, want %d", cases[i].name, (int)m, (int)cases[i].m);
    assert_int_equal(kvbm_medium_tier(m), cases[i].t);
  }
  assert_int_equal(kvbm_medium_from_name(NULL, 0), KVBM_MEDIUM_OTHER);
  assert_int_equal(kvbm_medium_tier(KVBM_MEDIUM_NONE), KVBM_TIER_G1);
}

/* Encodes one BlockStored of `ntok` tokens; the payload stays in enc. */
static void one_stored(kvbm_event_encoder *enc, size_t ntok, const uint8_t **data, size_t *len) {
  uint32_t *tok = calloc(ntok, sizeof *tok);
  assert_non_null(tok);
  uint64_t h = 1;
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1,
                   .token_ids = tok, .num_tokens = ntok, .block_size = (uint32_t)ntok};
  kvbm_event_batch b = {.events = &ev, .num_events = 1};
  assert_int_equal(kvbm_event_encode(enc, &b, data, len, NULL), KVBM_OK);
  free(tok);
}

/* One oversized payload does not pin the decoder's memory: its arenas go
 * back at the next, small decode; small payloads in a row keep theirs. */
static void test_decoder_shrinks(void **s) {
  (void)s;
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  kvbm_event_encoder_config ec = {.form = KVBM_FORM_POSITIONAL};
  assert_int_equal(kvbm_event_encoder_create(&ec, &enc, NULL), KVBM_OK);
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  const uint8_t *data;
  size_t len;
  kvbm_event_batch b;
  one_stored(enc, 100, &data, &len);
  assert_int_equal(kvbm_event_decode(dec, data, len, 0, &b, NULL), KVBM_OK);
  size_t small = kvbm_event_decoder_footprint(dec);
  one_stored(enc, 2000000, &data, &len); /* 2 M tokens: 8 MB of token arena */
  assert_int_equal(kvbm_event_decode(dec, data, len, 1, &b, NULL), KVBM_OK);
  assert_int_equal(b.events[0].num_tokens, 2000000);
  assert_true(kvbm_event_decoder_footprint(dec) >= 8000000);
  one_stored(enc, 100, &data, &len);
  assert_int_equal(kvbm_event_decode(dec, data, len, 2, &b, NULL), KVBM_OK);
  assert_int_equal(b.events[0].num_tokens, 100);
  size_t after = kvbm_event_decoder_footprint(dec);
  assert_true(after <= (size_t)1 << 20);
  assert_true(after >= small);
  assert_int_equal(kvbm_event_decode(dec, data, len, 3, &b, NULL), KVBM_OK);
  assert_int_equal(kvbm_event_decoder_footprint(dec), after); /* steady: nothing moves */
  kvbm_event_decoder_destroy(dec);
  kvbm_event_encoder_destroy(enc);
}

static void test_json_and_names(void **s) {
  (void)s;
  uint64_t h[2] = {1, UINT64_MAX};
  uint32_t t[2] = {5, 6};
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .event_id = 9, .block_hashes = h,
                   .num_block_hashes = 2, .token_ids = t, .num_tokens = 2, .block_size = 2,
                   .medium = KVBM_MEDIUM_REMOTE, .lora_name = "a\"b"};
  char buf[1024];
  size_t need = kvbm_event_to_json(&ev, buf, sizeof buf);
  assert_true(need < sizeof buf);
  assert_string_equal(buf,
                      "{\"type\":\"BlockStored\",\"event_id\":9,\"block_hashes\":[1,"
                      "18446744073709551615],\"parent_block_hash\":null,\"token_ids\":[5,6],"
                      "\"block_size\":2,\"lora_id\":null,\"medium\":\"REMOTE\",\"lora_name\":"
                      "\"a\\\"b\"}");
  char small[10];
  assert_int_equal(kvbm_event_to_json(&ev, small, sizeof small), need);
  assert_int_equal(strlen(small), 9);
  /* what the codec carries, extra_keys and extras as JSON */
  ev.event_id = 0;
  ev.lora_name = NULL;
  ev.medium_name = "OBJ";
  ev.cache_salt = "s";
  ev.token_pairs = true;
  ev.extra_keys = kEkeys;
  ev.extra_keys_len = sizeof kEkeys;
  ev.kv_cache_spec_kind = "full_attention";
  ev.has_sliding_window = true;
  ev.sliding_window = -1;
  ev.locality = "REMOTE";
  ev.ownership = "kvcr";
  ev.extras = kExtras;
  ev.extras_len = sizeof kExtras;
  ev.num_extras = 2;
  need = kvbm_event_to_json(&ev, buf, sizeof buf);
  assert_true(need < sizeof buf);
  assert_string_equal(buf,
                      "{\"type\":\"BlockStored\",\"block_hashes\":[1,18446744073709551615],"
                      "\"parent_block_hash\":null,\"token_ids\":[5,6],\"block_size\":2,"
                      "\"lora_id\":null,\"medium\":\"OBJ\",\"lora_name\":null,"
                      "\"token_pairs\":true,\"cache_salt\":\"s\",\"extra_keys\":[[\"mm\",3],"
                      "null],\"kv_cache_spec_kind\":\"full_attention\","
                      "\"kv_cache_spec_sliding_window\":-1,\"locality\":\"REMOTE\","
                      "\"ownership\":\"kvcr\",\"extras\":{\"session_id\":\"s-1\","
                      "\"remaining_copy_counts\":[0]}}");
  assert_int_equal(kvbm_medium_from_name("remote", 6), KVBM_MEDIUM_REMOTE);
  assert_int_equal(kvbm_medium_from_name("GPUX", 4), KVBM_MEDIUM_OTHER);
  assert_string_equal(kvbm_medium_name(KVBM_MEDIUM_DISK), "DISK");
  assert_null(kvbm_medium_name(KVBM_MEDIUM_NONE));
  assert_string_equal(kvbm_event_type_name(KVBM_EVENT_CLEARED), "AllBlocksCleared");
}

/* --- groups: the bytes vLLM writes (msgspec, omit_defaults): BlockStored
 * [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
 * medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
 * kv_cache_spec_sliding_window] with the trailing defaults left off, and
 * BlockRemoved [tag, block_hashes, medium, group_idx]; the map form has
 * the same names in the same order, the defaults left out. */

/* One BlockStored of hash 5, tokens {1, 2}, on the GPU, with `group`
 * (-1: none), `kind` (NULL: none) and `window` (-1: none). */
static void pk_stored_group(pk *k, bool map, int group, const char *kind, int window) {
  if (map) {
    msgpack_pack_map(&k->p, 8 + (group >= 0) + !!kind + (window >= 0));
    pk_str(k, "type");
  } else {
    int n = 8;
    if (group >= 0) n = 10;
    if (kind) n = 11;
    if (window >= 0) n = 12;
    msgpack_pack_array(&k->p, (size_t)n);
  }
#define KEY(name) do { if (map) pk_str(k, name); } while (0)
  pk_str(k, "BlockStored");
  KEY("block_hashes");
  msgpack_pack_array(&k->p, 1);
  msgpack_pack_uint64(&k->p, 5);
  KEY("parent_block_hash");
  msgpack_pack_nil(&k->p);
  KEY("token_ids");
  msgpack_pack_array(&k->p, 2);
  msgpack_pack_uint32(&k->p, 1);
  msgpack_pack_uint32(&k->p, 2);
  KEY("block_size");
  msgpack_pack_uint32(&k->p, 2);
  KEY("lora_id");
  msgpack_pack_nil(&k->p);
  KEY("medium");
  pk_str(k, "GPU");
  KEY("lora_name");
  msgpack_pack_nil(&k->p);
  if (!map && group >= 0) msgpack_pack_nil(&k->p); /* extra_keys */
  if (group >= 0) { KEY("group_idx"); msgpack_pack_int(&k->p, group); }
  if (kind) { KEY("kv_cache_spec_kind"); pk_str(k, kind); }
  else if (!map && window >= 0) msgpack_pack_nil(&k->p);
  if (window >= 0) { KEY("kv_cache_spec_sliding_window"); msgpack_pack_int(&k->p, window); }
}

static void pk_removed_group(pk *k, bool map, int group) {
  if (map) msgpack_pack_map(&k->p, 3 + (group >= 0)), pk_str(k, "type");
  else msgpack_pack_array(&k->p, 3 + (group >= 0));
  pk_str(k, "BlockRemoved");
  KEY("block_hashes");
  msgpack_pack_array(&k->p, 1);
  msgpack_pack_uint64(&k->p, 5);
  KEY("medium");
  pk_str(k, "GPU");
  if (group >= 0) { KEY("group_idx"); msgpack_pack_int(&k->p, group); }
#undef KEY
}

static void group_bytes(bool map) {
  pk k;
  pk_init(&k);
  msgpack_pack_array(&k.p, 3);
  msgpack_pack_double(&k.p, 1700000000.25);
  msgpack_pack_array(&k.p, 5);
  pk_stored_group(&k, map, -1, NULL, -1);              /* one group: as before */
  pk_stored_group(&k, map, 0, "full_attention", -1);
  pk_stored_group(&k, map, 1, "sliding_window", 128);
  pk_removed_group(&k, map, -1);
  pk_removed_group(&k, map, 1);
  msgpack_pack_int(&k.p, 0);

  const uint64_t h = 5;
  const uint32_t t[2] = {1, 2};
  kvbm_event st = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1,
                   .token_ids = t, .num_tokens = 2, .block_size = 2, .medium = KVBM_MEDIUM_GPU};
  kvbm_event rm = {.type = KVBM_EVENT_REMOVED, .block_hashes = &h, .num_block_hashes = 1,
                   .medium = KVBM_MEDIUM_GPU};
  kvbm_event ev[5] = {st, st, st, rm, rm};
  ev[1].has_group_idx = true;
  ev[1].kv_cache_spec_kind = "full_attention";
  ev[2].has_group_idx = true;
  ev[2].group_idx = 1;
  ev[2].kv_cache_spec_kind = "sliding_window";
  ev[2].has_sliding_window = true;
  ev[2].sliding_window = 128;
  ev[4].has_group_idx = true;
  ev[4].group_idx = 1;
  kvbm_event_batch b = {.ts = 1700000000.25, .has_dp_rank = true, .events = ev, .num_events = 5};
  kvbm_event_encoder_config cfg = {.form = map ? KVBM_FORM_MAP : KVBM_FORM_POSITIONAL};
  kvbm_event_encoder *enc;
  assert_int_equal(kvbm_event_encoder_create(&cfg, &enc, NULL), KVBM_OK);
  const uint8_t *data;
  size_t len;
  assert_int_equal(kvbm_event_encode(enc, &b, &data, &len, NULL), KVBM_OK);
  assert_int_equal(len, k.sb.size);
  assert_memory_equal(data, k.sb.data, len);

  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  kvbm_event_batch out;
  assert_int_equal(kvbm_event_decode(dec, data, len, 0, &out, NULL), KVBM_OK);
  assert_int_equal(out.num_events, 5);
  for (size_t i = 0; i < 5; i++) {
    const kvbm_event *e = &out.events[i];
    assert_event_eq(e, &ev[i]);
    assert_int_equal(e->has_group_idx, ev[i].has_group_idx);
    assert_int_equal(e->group_idx, ev[i].group_idx);
    if (ev[i].kv_cache_spec_kind) assert_string_equal(e->kv_cache_spec_kind, ev[i].kv_cache_spec_kind);
    else assert_null(e->kv_cache_spec_kind);
    assert_int_equal(e->has_sliding_window, ev[i].has_sliding_window);
    assert_int_equal(e->sliding_window, ev[i].sliding_window);
  }
  kvbm_event_decoder_destroy(dec);
  kvbm_event_encoder_destroy(enc);
  msgpack_sbuffer_destroy(&k.sb);
}

static void test_group_fields_vllm_bytes(void **s) {
  (void)s;
  group_bytes(true);
  group_bytes(false);
}

/* Hostile group_idx / window on the wire, as the decode contract says: a
 * value outside int64 or of the wrong type costs its event only (counted
 * in skipped, the reason naming the field); any int64 is carried as sent
 * (-1 included: vLLM never sends one, and the consumers that index by it,
 * such as the router, refuse it themselves). Both forms. */
static void test_group_idx_hostile(void **s) {
  (void)s;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  for (int form = 0; form < 2; form++) {
    bool map = form == 1;
    pk k;
    pk_init(&k);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_double(&k.p, 1.0);
    msgpack_pack_array(&k.p, 5);
    pk_removed_group(&k, map, -1);
    /* group_idx -1 (BlockRemoved) */
    if (map) msgpack_pack_map(&k.p, 4), pk_str(&k, "type");
    else msgpack_pack_array(&k.p, 4);
    pk_str(&k, "BlockRemoved");
    if (map) pk_str(&k, "block_hashes");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_uint64(&k.p, 6);
    if (map) pk_str(&k, "medium");
    msgpack_pack_nil(&k.p);
    if (map) pk_str(&k, "group_idx");
    msgpack_pack_int64(&k.p, -1);
    /* group_idx 2^64 - 1: outside int64 */
    if (map) msgpack_pack_map(&k.p, 4), pk_str(&k, "type");
    else msgpack_pack_array(&k.p, 4);
    pk_str(&k, "BlockRemoved");
    if (map) pk_str(&k, "block_hashes");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_uint64(&k.p, 7);
    if (map) pk_str(&k, "medium");
    msgpack_pack_nil(&k.p);
    if (map) pk_str(&k, "group_idx");
    msgpack_pack_uint64(&k.p, UINT64_MAX);
    /* group_idx a string */
    if (map) msgpack_pack_map(&k.p, 4), pk_str(&k, "type");
    else msgpack_pack_array(&k.p, 4);
    pk_str(&k, "BlockRemoved");
    if (map) pk_str(&k, "block_hashes");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_uint64(&k.p, 8);
    if (map) pk_str(&k, "medium");
    msgpack_pack_nil(&k.p);
    if (map) pk_str(&k, "group_idx");
    pk_str(&k, "1");
    /* and a good one after them: the bad ones cost only themselves */
    pk_stored_group(&k, map, 1, "sliding_window", -1);
    kvbm_event_batch b;
    kvbm_error err;
    int rc = decode_pk(&k, &b, &err, dec);
    if (rc) fail_msg("%s", err.msg);
    assert_int_equal(b.num_events, 3);
    assert_int_equal(b.skipped, 2);
    assert_non_null(strstr(kvbm_event_decoder_skip_reason(dec), "group_idx"));
    assert_false(b.events[0].has_group_idx);
    assert_true(b.events[1].has_group_idx && b.events[1].group_idx == -1);
    assert_true(b.events[1].block_hashes[0] == 6);
    assert_true(b.events[2].has_group_idx && b.events[2].group_idx == 1);
    assert_string_equal(b.events[2].kv_cache_spec_kind, "sliding_window");
    msgpack_sbuffer_destroy(&k.sb);
  }
  kvbm_event_decoder_destroy(dec);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_positional),
      cmocka_unit_test(test_roundtrip_map),
      cmocka_unit_test(test_roundtrip_signed),
      cmocka_unit_test(test_encode_once_then_frame),
      cmocka_unit_test(test_batch_head_as_msgpack_c),
      cmocka_unit_test(test_default_form_is_map),
      cmocka_unit_test(test_wire_variants),
      cmocka_unit_test(test_sglang_salted_positional),
      cmocka_unit_test(test_bad_event_skipped),
      cmocka_unit_test(test_map_key_orders),
      cmocka_unit_test(test_token_forms),
      cmocka_unit_test(test_medium_bytes),
      cmocka_unit_test(test_plain_same_bytes),
      cmocka_unit_test(test_metadata_key_names_a_field),
      cmocka_unit_test(test_token_pairs),
      cmocka_unit_test(test_media),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_encode_rejects),
      cmocka_unit_test(test_json_and_names),
      cmocka_unit_test(test_decoder_shrinks),
      cmocka_unit_test(test_group_fields_vllm_bytes),
      cmocka_unit_test(test_group_idx_hostile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
