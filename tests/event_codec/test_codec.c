/* test_codec.c: the event codec: round trips in both forms, the wire
 * variants other senders use, and malformed payloads of every kind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

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

static const uint64_t kH[] = {0, 1, 127, 128, 0xffffffffull, 0x8000000000000000ull,
                              0xffffffffffffffffull};
static const uint32_t kTok[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 0xffffffffu, 7,
                                8, 9, 10, 11};

static size_t sample_events(kvbm_event *ev) {
  memset(ev, 0, 5 * sizeof *ev);
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
  return 5;
}

static void roundtrip(kvbm_event_form form) {
  kvbm_event ev[5];
  size_t n = sample_events(ev);
  kvbm_event_batch b = {.ts = 1712345678.25, .dp_rank = 3, .has_dp_rank = true,
                        .events = ev, .num_events = n};
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_encoder_create(&enc, NULL), KVBM_OK);
  assert_int_equal(kvbm_event_decoder_create(&dec, NULL), KVBM_OK);
  const uint8_t *data;
  size_t len;
  kvbm_error err;
  assert_int_equal(kvbm_event_encode(enc, &b, form, &data, &len, &err), KVBM_OK);
  kvbm_event_batch out;
  assert_int_equal(kvbm_event_decode(dec, data, len, 42, &out, &err), KVBM_OK);
  assert_int_equal(out.seq, 42);
  assert_true(out.ts == b.ts);
  assert_true(out.has_dp_rank);
  assert_int_equal(out.dp_rank, 3);
  assert_int_equal(out.num_events, n);
  for (size_t i = 0; i < n; i++) assert_event_eq(&out.events[i], &ev[i]);
  /* Without dp_rank the array has two elements. */
  b.has_dp_rank = false;
  assert_int_equal(kvbm_event_encode(enc, &b, form, &data, &len, &err), KVBM_OK);
  assert_int_equal(data[0], 0x92);
  assert_int_equal(kvbm_event_decode(dec, data, len, 0, &out, &err), KVBM_OK);
  assert_false(out.has_dp_rank);
  kvbm_event_encoder_destroy(enc);
  kvbm_event_decoder_destroy(dec);
}

static void test_roundtrip_positional(void **s) { (void)s; roundtrip(KVBM_FORM_POSITIONAL); }
static void test_roundtrip_map(void **s) { (void)s; roundtrip(KVBM_FORM_MAP); }

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
  msgpack_pack_array(&k.p, 1);/* extra_keys: skipped */
  msgpack_pack_nil(&k.p);
  msgpack_pack_int(&k.p, 2);  /* group_idx */
  pk_str(&k, "kind");         /* kv_cache_spec_kind etc.: skipped */
  msgpack_pack_int(&k.p, 0);
  msgpack_pack_map(&k.p, 1);
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
  e = &b.events[1];
  assert_int_equal(e->type, KVBM_EVENT_STORED);
  assert_int_equal(e->block_size, 16);
  assert_int_equal(e->num_tokens, 0);
  assert_int_equal(e->medium, KVBM_MEDIUM_NONE);
  assert_false(e->has_parent);
  e = &b.events[2];
  assert_int_equal(e->type, KVBM_EVENT_REMOVED);
  assert_true(e->block_hashes[0] == UINT64_MAX);
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
  const uint8_t huge_events[] = {0x92, 0x00, 0xdc, 0x00, 0x05, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0};
  expect_bad(dec, huge_events, sizeof huge_events, KVBM_ETRUNCATED, "events declared");
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

  pk k;
  /* wrong types: a string where the hashes go */
  pk_init(&k);
  msgpack_pack_array(&k.p, 2);
  msgpack_pack_double(&k.p, 1.0);
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_array(&k.p, 5);
  pk_str(&k, "BlockStored");
  pk_str(&k, "not hashes");
  msgpack_pack_nil(&k.p);
  msgpack_pack_array(&k.p, 0);
  msgpack_pack_int(&k.p, 16);
  expect_bad(dec, k.sb.data, k.sb.size, KVBM_EFORMAT, "block_hashes");
  msgpack_sbuffer_destroy(&k.sb);
  /* a token id beyond 32 bits, then a negative one, then a float */
  for (int variant = 0; variant < 3; variant++) {
    pk_init(&k);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_double(&k.p, 1.0);
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 5);
    pk_str(&k, "BlockStored");
    msgpack_pack_array(&k.p, 0);
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 1);
    if (variant == 0) msgpack_pack_uint64(&k.p, 1ull << 32);
    else if (variant == 1) msgpack_pack_int(&k.p, -3);
    else msgpack_pack_double(&k.p, 2.0);
    msgpack_pack_int(&k.p, 16);
    expect_bad(dec, k.sb.data, k.sb.size, KVBM_EFORMAT, "token");
    msgpack_sbuffer_destroy(&k.sb);
  }
  /* missing required fields: positional and map */
  pk_init(&k);
  msgpack_pack_array(&k.p, 2);
  msgpack_pack_double(&k.p, 1.0);
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_array(&k.p, 2);
  pk_str(&k, "BlockStored");
  msgpack_pack_array(&k.p, 0);
  expect_bad(dec, k.sb.data, k.sb.size, KVBM_EFORMAT, "at least 4");
  msgpack_sbuffer_destroy(&k.sb);
  pk_init(&k);
  msgpack_pack_array(&k.p, 2);
  msgpack_pack_double(&k.p, 1.0);
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_map(&k.p, 1);
  pk_str(&k, "block_hashes");
  msgpack_pack_array(&k.p, 0);
  expect_bad(dec, k.sb.data, k.sb.size, KVBM_EFORMAT, "no \"type\"");
  msgpack_sbuffer_destroy(&k.sb);
  pk_init(&k);
  msgpack_pack_array(&k.p, 2);
  msgpack_pack_double(&k.p, 1.0);
  msgpack_pack_array(&k.p, 1);
  msgpack_pack_map(&k.p, 1);
  pk_str(&k, "type");
  pk_str(&k, "BlockRemoved");
  expect_bad(dec, k.sb.data, k.sb.size, KVBM_EFORMAT, "block_hashes");
  msgpack_sbuffer_destroy(&k.sb);
  /* an event that is a number; a string hash; dp_rank a string */
  const uint8_t ev_num[] = "\x92\x00\x91\xaeNotAnEventAbcd";
  expect_bad(dec, ev_num, sizeof ev_num - 1, KVBM_EFORMAT, "event 0");
  const uint8_t dp_str[] = {0x93, 0x00, 0x90, 0xa1, 'x'};
  expect_bad(dec, dp_str, sizeof dp_str, KVBM_EFORMAT, "dp_rank");
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
  kvbm_event ev[5];
  size_t ne = sample_events(ev);
  kvbm_event_batch gb = {.ts = 1.0, .events = ev, .num_events = ne, .has_dp_rank = true};
  kvbm_event_encoder *enc;
  assert_int_equal(kvbm_event_encoder_create(&enc, NULL), KVBM_OK);
  for (int form = 0; form < 2; form++) {
    const uint8_t *data;
    size_t len;
    assert_int_equal(kvbm_event_encode(enc, &gb, (kvbm_event_form)form, &data, &len, NULL), 0);
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
  }
  kvbm_event_encoder_destroy(enc);
  free(d);
  kvbm_event_decoder_destroy(dec);
}

static void test_encode_rejects(void **s) {
  (void)s;
  kvbm_event_encoder *enc;
  assert_int_equal(kvbm_event_encoder_create(&enc, NULL), KVBM_OK);
  kvbm_event ev = {.type = (kvbm_event_type)9};
  kvbm_event_batch b = {.events = &ev, .num_events = 1};
  const uint8_t *data;
  size_t len;
  kvbm_error err;
  assert_int_equal(kvbm_event_encode(enc, &b, KVBM_FORM_MAP, &data, &len, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "unknown type"));
  ev = (kvbm_event){.type = KVBM_EVENT_REMOVED, .medium = KVBM_MEDIUM_OTHER};
  assert_int_equal(kvbm_event_encode(enc, &b, KVBM_FORM_MAP, &data, &len, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "medium"));
  kvbm_event_encoder_destroy(enc);
}

/* Encodes one BlockStored of `ntok` tokens; the payload stays in enc. */
static void one_stored(kvbm_event_encoder *enc, size_t ntok, const uint8_t **data, size_t *len) {
  uint32_t *tok = calloc(ntok, sizeof *tok);
  assert_non_null(tok);
  uint64_t h = 1;
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_hashes = &h, .num_block_hashes = 1,
                   .token_ids = tok, .num_tokens = ntok, .block_size = (uint32_t)ntok};
  kvbm_event_batch b = {.events = &ev, .num_events = 1};
  assert_int_equal(kvbm_event_encode(enc, &b, KVBM_FORM_POSITIONAL, data, len, NULL), KVBM_OK);
  free(tok);
}

/* One oversized payload does not pin the decoder's memory: its arenas go
 * back at the next, small decode; small payloads in a row keep theirs. */
static void test_decoder_shrinks(void **s) {
  (void)s;
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  assert_int_equal(kvbm_event_encoder_create(&enc, NULL), KVBM_OK);
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
  char buf[512];
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
  assert_int_equal(kvbm_medium_from_name("remote", 6), KVBM_MEDIUM_REMOTE);
  assert_int_equal(kvbm_medium_from_name("GPUX", 4), KVBM_MEDIUM_OTHER);
  assert_string_equal(kvbm_medium_name(KVBM_MEDIUM_DISK), "DISK");
  assert_null(kvbm_medium_name(KVBM_MEDIUM_NONE));
  assert_string_equal(kvbm_event_type_name(KVBM_EVENT_CLEARED), "AllBlocksCleared");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_positional), cmocka_unit_test(test_roundtrip_map),
      cmocka_unit_test(test_wire_variants),       cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_encode_rejects),      cmocka_unit_test(test_json_and_names),
      cmocka_unit_test(test_decoder_shrinks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
