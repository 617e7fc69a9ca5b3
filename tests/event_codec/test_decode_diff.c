/* SPDX-License-Identifier: Apache-2.0 */
/* test_decode_diff.c: the decoder's quick path against its general reader
 * (decode.c). The quick path reads the usual layouts (vLLM's maps in
 * msgspec's key order, the positional arrays, the three-key remove) from
 * the bytes and hands anything else to the general reader's functions; it
 * must never decide otherwise. Each payload below is decoded by two
 * decoders, one with the quick path (the default) and one without
 * (kvbm__event_decoder_general), and the two results compared field by
 * field: the status and message of a refused payload, and of a decoded
 * one the batch (ts, dp_rank, skipped and its reason) and every event
 * (hashes, tokens, scalars, every name, extra_keys, extras).
 *  - the engines' payloads: every profile of tests/events/engine_peer.py
 *    (vLLM v0.8 to today's maps, SGLang positional and maps, Dynamo), int
 *    and bytes hashes, batch arrays and maps, bad events mixed in;
 *  - our encoder's: random events, plain and with every optional field,
 *    both forms, unsigned and signed hashes;
 *  - each of those mutated (a byte changed, bytes cut off or inserted),
 *    so that the quick path meets every way an input leaves its layouts;
 *  - a few layouts written by hand at the quick path's edges.
 * The test also checks that the quick path took most events of the
 * unmutated payloads (it is not vacuous). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event_codec/internal.h"
#include "kvbm/event_codec.h"

#define GEN "/usr/bin/python3 " KVBM_SOURCE_DIR "/tests/event_codec/engine_payloads.py"

typedef struct diff {
  kvbm_event_decoder *quick, *general;
  size_t payloads, events, plain, refused;
  uint64_t rng;
} diff;

static uint64_t next(diff *d) { /* xorshift64 */
  d->rng ^= d->rng << 13;
  d->rng ^= d->rng >> 7;
  d->rng ^= d->rng << 17;
  return d->rng;
}

static void same_str(const char *a, const char *b) {
  assert_true(!a == !b);
  if (a) assert_string_equal(a, b);
}

static void same_bytes(const void *a, size_t al, const void *b, size_t bl) {
  assert_int_equal(al, bl);
  assert_true(!a == !b);
  if (al) assert_memory_equal(a, b, al);
}

static void same_event(const kvbm_event *x, const kvbm_event *y) {
  assert_int_equal(x->type, y->type);
  assert_true(x->event_id == y->event_id);
  same_bytes(x->block_hashes, 8 * x->num_block_hashes, y->block_hashes, 8 * y->num_block_hashes);
  assert_int_equal(x->has_parent, y->has_parent);
  assert_true(x->parent_hash == y->parent_hash);
  same_bytes(x->token_ids, 4 * x->num_tokens, y->token_ids, 4 * y->num_tokens);
  assert_int_equal(x->block_size, y->block_size);
  assert_int_equal(x->has_lora_id, y->has_lora_id);
  assert_true(x->lora_id == y->lora_id);
  assert_int_equal(x->medium, y->medium);
  same_str(x->medium_name, y->medium_name);
  same_str(x->lora_name, y->lora_name);
  assert_int_equal(x->has_group_idx, y->has_group_idx);
  assert_true(x->group_idx == y->group_idx);
  same_str(x->cache_salt, y->cache_salt);
  assert_int_equal(x->token_pairs, y->token_pairs);
  same_str(x->kv_cache_spec_kind, y->kv_cache_spec_kind);
  assert_int_equal(x->has_sliding_window, y->has_sliding_window);
  assert_true(x->sliding_window == y->sliding_window);
  same_str(x->locality, y->locality);
  same_str(x->ownership, y->ownership);
  same_bytes(x->extra_keys, x->extra_keys_len, y->extra_keys, y->extra_keys_len);
  same_bytes(x->extras, x->extras_len, y->extras, y->extras_len);
  assert_int_equal(x->num_extras, y->num_extras);
}

/* Decodes one payload both ways and compares. */
static void diff_one(diff *d, const uint8_t *data, size_t len) {
  kvbm_event_batch a, b;
  kvbm_error ea = {0}, eb = {0};
  int ra = kvbm_event_decode(d->quick, data, len, 9, &a, &ea);
  int rb = kvbm_event_decode(d->general, data, len, 9, &b, &eb);
  d->payloads++;
  assert_int_equal(ra, rb);
  if (ra) {
    assert_int_equal(ea.code, eb.code);
    assert_string_equal(ea.msg, eb.msg);
    d->refused++;
    return;
  }
  assert_true(a.seq == b.seq);
  assert_memory_equal(&a.ts, &b.ts, sizeof a.ts);
  assert_int_equal(a.has_dp_rank, b.has_dp_rank);
  assert_int_equal(a.dp_rank, b.dp_rank);
  assert_int_equal(a.num_events, b.num_events);
  assert_int_equal(a.skipped, b.skipped);
  assert_string_equal(kvbm_event_decoder_skip_reason(d->quick),
                      kvbm_event_decoder_skip_reason(d->general));
  for (size_t i = 0; i < a.num_events; i++) {
    same_event(&a.events[i], &b.events[i]);
    assert_false(kvbm__event_decoder_plain(d->general, i));
    d->plain += kvbm__event_decoder_plain(d->quick, i);
  }
  d->events += a.num_events;
}

/* The payload, then `rounds` mutations of it: a byte set to a random
 * value (often one of msgpack's type bytes), the tail cut off, or a byte
 * inserted. */
static void diff_mutated(diff *d, const uint8_t *data, size_t len, int rounds) {
  diff_one(d, data, len);
  static const uint8_t kBytes[] = {0xc0, 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd3, 0xa3, 0x90,
                                   0x91, 0xdc, 0x80, 0x88, 0xc4, 0xff, 0x00, 'G',  'x'};
  uint8_t *m = malloc(len + 1);
  assert_non_null(m);
  for (int r = 0; r < rounds; r++) {
    size_t at = len ? next(d) % len : 0, n = len;
    memcpy(m, data, len);
    switch (next(d) % 4) {
      case 0: m[at] = (uint8_t)next(d); break;
      case 1: m[at] = kBytes[next(d) % sizeof kBytes]; break;
      case 2: n = at; break;
      default:
        memmove(m + at + 1, m + at, len - at);
        m[at] = kBytes[next(d) % sizeof kBytes];
        n = len + 1;
    }
    diff_one(d, m, n);
  }
  free(m);
}

static int setup(void **state) {
  diff *d = calloc(1, sizeof *d);
  assert_non_null(d);
  assert_int_equal(kvbm_event_decoder_create(&d->quick, NULL), 0);
  assert_int_equal(kvbm_event_decoder_create(&d->general, NULL), 0);
  kvbm__event_decoder_general(d->general, true);
  d->rng = 0x9e3779b97f4a7c15ull;
  *state = d;
  return 0;
}

static int teardown(void **state) {
  diff *d = *state;
  kvbm_event_decoder_destroy(d->quick);
  kvbm_event_decoder_destroy(d->general);
  free(d);
  return 0;
}

static void test_engine_payloads(void **state) {
  diff *d = *state;
  FILE *f = popen(GEN " 60", "r");
  assert_non_null(f);
  size_t n = 0, events = 0, plain = 0;
  uint8_t hdr[4];
  while (fread(hdr, 1, 4, f) == 4) {
    size_t len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
    uint8_t *p = malloc(len ? len : 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, len, f), len);
    size_t e0 = d->events, p0 = d->plain;
    diff_one(d, p, len);
    events += d->events - e0;
    plain += d->plain - p0;
    diff_mutated(d, p, len, 12);
    free(p);
    n++;
  }
  assert_int_equal(pclose(f), 0);
  assert_int_equal(n, 7 * 2 * 60);
  /* many generated events carry names, salts, pairs or extras (the
   * general reader's); the rest, a good share, went the quick way */
  print_message("engine payloads: %zu, events %zu, read whole by the quick path %zu; "
                "mutated ones refused %zu of %zu\n", n, events, plain, d->refused, d->payloads);
  assert_true(plain * 5 > events);
}

static uint64_t rand_hash(diff *d) {
  switch (next(d) % 4) {
    case 0: return next(d) % 200; /* small: fixint, uint8 */
    case 1: return next(d) >> 20;
    default: return next(d);      /* most: 0xcf, or a negative int64 when signed */
  }
}

static uint32_t rand_token(diff *d) {
  switch (next(d) % 8) {
    case 0: return (uint32_t)(next(d) % 128);
    case 1: return (uint32_t)(next(d) % 256);
    case 2: return (uint32_t)next(d);
    default: return (uint32_t)(next(d) % 200000);
  }
}

static void same_array(const void *a, size_t al, const void *b, size_t bl) {
  assert_int_equal(al, bl);
  if (al) assert_memory_equal(a, b, al);
}

/* Both paths share the hash and token readers: the decoded events are
 * also checked against what was encoded, field by field. */
static void same_as_sent(kvbm_event_decoder *dec, const uint8_t *p, size_t len,
                         const kvbm_event_batch *sent) {
  kvbm_event_batch b;
  assert_int_equal(kvbm_event_decode(dec, p, len, 0, &b, NULL), 0);
  assert_int_equal(b.num_events, sent->num_events);
  assert_int_equal(b.skipped, 0);
  for (size_t i = 0; i < b.num_events; i++) {
    const kvbm_event *x = &b.events[i], *y = &sent->events[i];
    assert_int_equal(x->type, y->type);
    if (x->type == KVBM_EVENT_CLEARED) continue;
    same_array(x->block_hashes, 8 * x->num_block_hashes, y->block_hashes, 8 * y->num_block_hashes);
    assert_int_equal(x->medium, y->medium);
    assert_int_equal(x->has_group_idx, y->has_group_idx);
    assert_true(x->group_idx == y->group_idx);
    if (x->type != KVBM_EVENT_STORED) continue;
    same_array(x->token_ids, 4 * x->num_tokens, y->token_ids, 4 * y->num_tokens);
    assert_int_equal(x->block_size, y->block_size);
    assert_int_equal(x->has_parent, y->has_parent);
    assert_true(x->parent_hash == y->parent_hash);
    assert_int_equal(x->has_lora_id, y->has_lora_id);
    assert_true(x->lora_id == y->lora_id);
    same_str(x->lora_name, y->lora_name);
  }
}

/* Batch b encoded by our encoder in each form, then decoded by every path
 * and compared (diff_one), checked against what was sent (the quick
 * decoder, and the general one with `general`), cut at every length with
 * `cuts`, and `mutations` rounds of diff_mutated; adds the events decoded
 * and those read whole by the quick path or a template to *events and
 * *plain. */
static void diff_both_forms(diff *d, const kvbm_event_batch *b, bool cuts, bool general, int mutations,
                            size_t *events, size_t *plain) {
  for (int form = 0; form < 2; form++) {
    kvbm_event_encoder_config cfg = {.form = (kvbm_event_form)form};
    kvbm_event_encoder *enc;
    assert_int_equal(kvbm_event_encoder_create(&cfg, &enc, NULL), 0);
    const uint8_t *p;
    size_t len;
    assert_int_equal(kvbm_event_encode(enc, b, &p, &len, NULL), 0);
    size_t e0 = d->events, p0 = d->plain;
    diff_one(d, p, len);
    *events += d->events - e0;
    *plain += d->plain - p0;
    same_as_sent(d->quick, p, len, b);
    if (general) same_as_sent(d->general, p, len, b);
    if (cuts)
      for (size_t cut = 0; cut < len; cut++) diff_one(d, p, cut);
    diff_mutated(d, p, len, mutations);
    kvbm_event_encoder_destroy(enc);
  }
}

static void test_own_encoder(void **state) {
  diff *d = *state;
  static const kvbm_medium kMedia[] = {KVBM_MEDIUM_GPU, KVBM_MEDIUM_GPU, KVBM_MEDIUM_CPU,
                                       KVBM_MEDIUM_NONE, KVBM_MEDIUM_DISK, KVBM_MEDIUM_REMOTE};
  uint64_t hashes[64][20];
  uint32_t tokens[64][20 * 16 + 1];
  uint8_t ekeys[] = {0x92, 0xc0, 0x91, 0xa2, 'm', 'm'};
  uint8_t extras[] = {0xaa, 's', 'e', 's', 's', 'i', 'o', 'n', '_', 'i', 'd', 0x07};
  size_t events = 0, plain = 0;
  for (int round = 0; round < 400; round++) {
    kvbm_event ev[64];
    size_t n = 1 + next(d) % 64;
    bool fancy = round % 3 == 0; /* optional fields too */
    for (size_t i = 0; i < n; i++) {
      kvbm_event *e = &ev[i];
      *e = (kvbm_event){.type = (kvbm_event_type)(1 + next(d) % 3)};
      if (next(d) % 8 == 0) e->type = KVBM_EVENT_CLEARED;
      else if (e->type == KVBM_EVENT_CLEARED) e->type = KVBM_EVENT_STORED;
      if (e->type == KVBM_EVENT_CLEARED) continue;
      size_t nb = next(d) % 5 == 0 ? next(d) % 20 : 1 + next(d) % 3;
      for (size_t j = 0; j < nb; j++) hashes[i][j] = rand_hash(d);
      e->block_hashes = hashes[i];
      e->num_block_hashes = nb;
      e->medium = kMedia[next(d) % 6];
      if (fancy && next(d) % 2) e->has_group_idx = true, e->group_idx = (int64_t)(next(d) % 4);
      if (fancy && next(d) % 4 == 0) e->locality = "LOCAL";
      if (fancy && next(d) % 5 == 0) e->extras = extras, e->extras_len = sizeof extras, e->num_extras = 1;
      if (e->type != KVBM_EVENT_STORED) continue;
      size_t nt = nb * 16;
      for (size_t j = 0; j < nt; j++) tokens[i][j] = rand_token(d);
      e->token_ids = tokens[i];
      e->num_tokens = nt;
      e->block_size = next(d) % 9 == 0 ? 300 : 16;
      e->has_parent = next(d) % 2;
      e->parent_hash = e->has_parent ? rand_hash(d) : 0;
      e->has_lora_id = next(d) % 4 == 0;
      e->lora_id = e->has_lora_id ? (int64_t)(next(d) % 50) - 10 : 0;
      if (next(d) % 6 == 0) e->lora_name = "adapter-a";
      if (fancy && next(d) % 4 == 0) e->cache_salt = NULL, e->kv_cache_spec_kind = "full_attention";
      if (fancy && next(d) % 4 == 0) e->extra_keys = ekeys, e->extra_keys_len = sizeof ekeys;
      if (fancy && next(d) % 5 == 0) e->has_sliding_window = true, e->sliding_window = 4096;
    }
    kvbm_event_batch b = {.ts = 1.7e9 + round, .events = ev, .num_events = n,
                          .has_dp_rank = round % 2, .dp_rank = round % 4};
    for (int v = 0; v < 4; v++) {
      kvbm_event_encoder_config cfg = {.form = (kvbm_event_form)(v & 1), .signed_hashes = v >> 1};
      kvbm_event_encoder *enc;
      assert_int_equal(kvbm_event_encoder_create(&cfg, &enc, NULL), 0);
      const uint8_t *p;
      size_t len;
      kvbm_error err;
      assert_int_equal(kvbm_event_encode(enc, &b, &p, &len, &err), 0);
      size_t e0 = d->events, p0 = d->plain;
      diff_one(d, p, len);
      events += d->events - e0;
      plain += d->plain - p0;
      same_as_sent(d->quick, p, len, &b);
      diff_mutated(d, p, len, 6);
      kvbm_event_encoder_destroy(enc);
    }
  }
  print_message("own encoder: events %zu, read whole by the quick path %zu\n", events, plain);
  assert_true(plain * 2 > events);
}

/* The templates (decode.c: the usual layouts matched whole, the token
 * ids four a step in runs of one width): events of our encoder in both
 * forms whose token ids come in runs of every width (fixint, uint8,
 * uint16, uint32) and length 0..9 around the four-a-step boundary,
 * 0..20 hashes (fixarray and array16 headers), a parent or none, "GPU"
 * or "CPU"; each
 * payload and its every prefix and mutations against the general reader,
 * and the events against what was sent. */
static void test_templates(void **state) {
  diff *d = *state;
  static const uint32_t kWidth[] = {5, 200, 7919, 71271}; /* fixint, uint8, uint16, uint32 */
  uint64_t hashes[8][21];
  uint32_t tokens[8][21 * 16];
  size_t events = 0, plain = 0;
  for (int round = 0; round < 300; round++) {
    kvbm_event ev[8];
    size_t n = 1 + next(d) % 8;
    for (size_t i = 0; i < n; i++) {
      kvbm_event *e = &ev[i];
      size_t nb = round < 21 ? (size_t)round : next(d) % 4 == 0 ? next(d) % 21 : 1;
      for (size_t j = 0; j < nb; j++) hashes[i][j] = next(d) | 1ull << 63;
      *e = (kvbm_event){.type = i % 2 ? KVBM_EVENT_REMOVED : KVBM_EVENT_STORED,
                        .block_hashes = hashes[i], .num_block_hashes = nb,
                        .medium = next(d) % 3 ? KVBM_MEDIUM_GPU : KVBM_MEDIUM_CPU};
      if (e->type != KVBM_EVENT_STORED) continue;
      size_t nt = next(d) % 3 == 0 ? next(d) % 16 : 16 * nb; /* fixarray or array16 */
      for (size_t j = 0; j < nt;) { /* runs of one width, 1..9 long */
        size_t run = 1 + next(d) % 9;
        uint32_t w = kWidth[next(d) % 4];
        for (size_t r = 0; r < run && j < nt; r++, j++) tokens[i][j] = w + (uint32_t)(next(d) % 50);
      }
      e->token_ids = tokens[i];
      e->num_tokens = nt;
      e->block_size = 16;
      e->has_parent = next(d) % 2;
      e->parent_hash = e->has_parent ? next(d) | 1ull << 63 : 0;
    }
    kvbm_event_batch b = {.ts = 1.7e9, .events = ev, .num_events = n, .has_dp_rank = true};
    diff_both_forms(d, &b, round % 10 == 0, false, 20, &events, &plain);
  }
  print_message("templates: events %zu, read whole by the quick path or a template %zu\n", events,
                plain);
  assert_int_equal(plain, events); /* every one of these is a usual layout */
}

/* Layouts at the quick path's edges, written out. */
static void test_edges(void **state) {
  diff *d = *state;
#define H "\xcf\x01\x02\x03\x04\x05\x06\x07\x08"
#define STORED_HEAD "\xa4type\xab" "BlockStored\xac" "block_hashes\x91" H
#define REST "\xb1parent_block_hash\xc0\xa9token_ids\x92\x05\xcd\x01\x00\xaa" "block_size\x02" \
             "\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0"
  static const struct {
    const char *bytes;
    size_t len;
  } kCases[] = {
#define C(s) {s, sizeof(s) - 1}
      C("\x92\xcb\x41\xd9\x00\x00\x00\x00\x00\x00\x91\x88" STORED_HEAD REST),
      /* an optional key after vLLM's eight, then one kvbm does not know */
      C("\x92\x01\x91\x8a" STORED_HEAD REST "\xa9group_idx\x01\xa3zzz\x90"),
      /* block_size before token_ids: the general loop from there */
      C("\x92\x01\x91\x88" STORED_HEAD "\xb1parent_block_hash\xc0\xaa" "block_size\x02"
        "\xa9token_ids\x92\x05\x06\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0"),
      /* a required key missing (the map says 3) */
      C("\x92\x01\x91\x83" STORED_HEAD "\xb1parent_block_hash\xc0"),
      /* media the quick path does not take inline, a LoRA name, a salt */
      C("\x92\x01\x93\x83\xa4type\xac" "BlockRemoved\xac" "block_hashes\x91\x05\xa6medium\xa4" "DISK"
        "\x83\xa4type\xac" "BlockRemoved\xac" "block_hashes\x91\x05\xa6medium\xa3gpu"
        "\x84\xa4type\xac" "BlockRemoved\xac" "block_hashes\x91\x05\xa6medium\xd9\x03GPU"
        "\xa9token_ids\x91\x01"),
      C("\x92\x01\x91\x88" STORED_HEAD "\xb1parent_block_hash\xc0\xa9token_ids\x90\xaa"
        "block_size\x02\xa7lora_id\xd0\xf6\xa6medium\xc0\xa9lora_name\xa3" "abc"),
      /* positional: 5 (v0.8), 7 (SGLang), 8 with a salt map, 12 fields */
      C("\x92\x01\x93\x96\xab" "BlockStored\x91\x05\xc0\x90\x10\xc0"
        "\x98\xab" "BlockStored\x91\x05\xc0\x90\x10\xc0\xaa" "CPU_PINNED\x81\xaa" "cache_salt\xa1s"
        "\x9d\xab" "BlockStored\x91\x05\xc0\x90\x10\x07\xa3GPU\xc0\xc0\x02\xa4" "full\xcd\x10\x00\xc0"),
      /* token pairs; pairs that do not chain; an id beyond 32 bits */
      C("\x93\x01\x93\x98\xab" "BlockStored\x91\x05\xc0\x92\x92\x01\x02\x92\x02\x03\x02\xc0\xa3GPU\xc0"
        "\x98\xab" "BlockStored\x91\x05\xc0\x92\x92\x01\x02\x92\x05\x03\x02\xc0\xa3GPU\xc0"
        "\x98\xab" "BlockStored\x91\x05\xc0\x91\xcf\x00\x00\x00\x01\x00\x00\x00\x00\x02\xc0\xa3GPU\xc0"
        "\x00"),
      /* hashes in every form, bytes among them */
      C("\x92\x01\x91\x93\xac" "BlockRemoved\x95\x05\xcc\xff\xd3\xff\xff\xff\xff\xff\xff\xff\xfe"
        "\xc4\x03\x01\x02\x03" H "\xa3GPU"),
      /* a remove with a store's fields (dropped), a cleared with fields */
      C("\x92\x01\x92\x85\xa4type\xac" "BlockRemoved\xac" "block_hashes\x91\x05\xa6medium\xa3GPU"
        "\xa9token_ids\x91\x01\xaa" "block_size\x01\x92\xb0" "AllBlocksCleared\x01"),
      C("\x92\x01\x92\x81\xa4type\xb0" "AllBlocksCleared\x91\xb0" "AllBlocksCleared"),
      /* a second "type" after the keys read in order: the last one counts,
       * and what that type does not carry is dropped (found by fuzz) */
      C("\x92\x01\x93\x8a" STORED_HEAD "\xb1parent_block_hash\xc0\xa9token_ids\x91\x05\xaa"
        "block_size\x02\xa7lora_id\x07\xa6medium\xa3" "CPU\xa9lora_name\xa1l"
        "\xa4type\xac" "BlockRemoved\xa9group_idx\x01"
        "\x89" STORED_HEAD REST "\xa4type\xb0" "AllBlocksCleared"
        "\x84\xa4type\xac" "BlockRemoved\xac" "block_hashes\x91\x05\xa6medium\xa3GPU"
        "\xa4type\xab" "BlockStored"),
      /* a template's layout with one value it does not take: a uint64
       * token id, bytes hashes, a parent as a small integer, a block size
       * above fixint, "CPU": declined at that byte, the quick path reads it */
      C("\x92\x01\x91\x88" STORED_HEAD "\xb1parent_block_hash\xc0\xa9token_ids\x93\x05\xcf\x00\x00"
        "\x00\x00\x00\x00\x00\x07\xcd\x01\x00\xaa" "block_size\x02"
        "\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0"),
      C("\x92\x01\x92\x98\xab" "BlockStored\x91\xc4\x02\x01\x02\x07\x90\xcd\x01\x00\xc0\xa3GPU\xc0"
        "\x93\xac" "BlockRemoved\x91" H "\xa3" "CPU"),
      C("\x92\x01\x91\x98\xab" "BlockStored\x91" H "\xc0\x94\xce\x00\x01\x00\x00\xce\x00\x01\x00\x01"
        "\xce\x00\x01\x00\x02\xd0\x01\x10\xc0\xa3GPU\xc0"),
      /* truncated inside the quick path's literals and values */
      C("\x92\x01\x91\x88" STORED_HEAD "\xb1parent_block_h"),
      C("\x92\x01\x91\x88" STORED_HEAD "\xb1parent_block_hash\xcf\x01\x02"),
      C("\x92\x01\x91\x88\xa4type\xab" "BlockStored\xac" "block_hashes\xdc\x00\x05\xcf"),
  };
#undef C
  for (size_t i = 0; i < sizeof kCases / sizeof *kCases; i++) {
    for (size_t cut = 0; cut <= kCases[i].len; cut++) /* and every prefix */
      diff_one(d, (const uint8_t *)kCases[i].bytes, cut);
    diff_mutated(d, (const uint8_t *)kCases[i].bytes, kCases[i].len, 300);
  }
  /* the first case is vLLM's plain store: read whole by the quick path */
  kvbm_event_batch b;
  assert_int_equal(kvbm_event_decode(d->quick, kCases[0].bytes, kCases[0].len, 0, &b, NULL), 0);
  assert_int_equal(b.num_events, 1);
  assert_true(kvbm__event_decoder_plain(d->quick, 0));
  assert_int_equal(b.events[0].token_ids[1], 256);
  assert_string_equal(b.events[0].medium_name, "GPU");
}

/* Session 13 (issue 22): token ids of a large vocabulary, uint16 and
 * uint32 at random (decode.c reads them four a step where it can), by
 * every path against the general reader and against what was sent:
 *  - our encoder's events (both forms, 1..40 blocks or 0..19 ids) whose
 *    ids are random below 300, 32000, 65536, 128256, 201088 or 2^32, or
 *    drawn from the edges 0, 127, 128, 255, 256, 65535, 65536,
 *    0xffffffff;
 *  - events written here byte by byte: ids of random width (0xcd or
 *    0xce) with one id in another form at each of the four lanes of a
 *    step and near the end (a fixint, 0xcc, a uint64, or a bad tag:
 *    0xc1, an int8, a string), as a map and as a positional event, each
 *    cut short and mutated; a valid id must read as written. */
static const uint32_t kEdgeIds[] = {0, 127, 128, 255, 256, 65535, 65536, 0xffffffffu};

static uint32_t vocab_token(diff *d, uint32_t v) {
  if (v == 1) return kEdgeIds[next(d) % 8];
  return v ? (uint32_t)(next(d) % v) : (uint32_t)next(d);
}

static void test_mixed_widths(void **state) {
  diff *d = *state;
  static const uint32_t kVocab[] = {300, 32000, 65536, 128256, 201088, 0 /* 2^32 */, 1 /* edges */};
  uint64_t hashes[4][40];
  uint32_t tokens[4][40 * 16];
  size_t events = 0, plain = 0;
  for (int round = 0; round < 400; round++) {
    kvbm_event ev[4];
    size_t n = 1 + next(d) % 4;
    for (size_t i = 0; i < n; i++) {
      size_t nb = 1 + next(d) % 40;
      for (size_t j = 0; j < nb; j++) hashes[i][j] = next(d) | 1ull << 63;
      size_t nt = next(d) % 4 == 0 ? next(d) % 20 : 16 * nb;
      uint32_t v = kVocab[next(d) % 7];
      for (size_t j = 0; j < nt; j++) tokens[i][j] = vocab_token(d, v);
      ev[i] = (kvbm_event){.type = KVBM_EVENT_STORED, .block_hashes = hashes[i], .num_block_hashes = nb,
                           .medium = KVBM_MEDIUM_GPU, .token_ids = tokens[i], .num_tokens = nt,
                           .block_size = 16, .has_parent = next(d) % 2};
      ev[i].parent_hash = ev[i].has_parent ? 7 : 0;
    }
    kvbm_event_batch b = {.ts = 1.7e9, .events = ev, .num_events = n, .has_dp_rank = true};
    diff_both_forms(d, &b, false, true, 4, &events, &plain);
  }
  print_message("mixed widths: events %zu, read whole by the quick path or a template %zu\n", events,
                plain);
  assert_int_equal(plain, events);
}

/* One id at out in the form `form` (0: random 0xcd/0xce; 1..7 others). */
static size_t put_odd_id(diff *d, uint8_t *out, int form, uint32_t *id) {
  static const uint8_t kBad[][3] = {{0xc1}, {0xd0, 0xff}, {0xa1, 'x'}};
  uint32_t x = (uint32_t)next(d);
  switch (form) {
    case 0:
      if (next(d) % 2) {
        *id = 256 + x % 65280;
        out[0] = 0xcd, out[1] = (uint8_t)(*id >> 8), out[2] = (uint8_t)*id;
        return 3;
      }
      *id = next(d) % 4 ? 65536 + x % 200000 : x;
      out[0] = 0xce, out[1] = (uint8_t)(*id >> 24), out[2] = (uint8_t)(*id >> 16);
      out[3] = (uint8_t)(*id >> 8), out[4] = (uint8_t)*id;
      return 5;
    case 1: *id = x % 128, out[0] = (uint8_t)*id; return 1;
    case 2: *id = x % 256, out[0] = 0xcc, out[1] = (uint8_t)*id; return 2;
    case 3: *id = x, memcpy(out, "\xcf\x00\x00\x00\x00", 5), out[5] = (uint8_t)(x >> 24),
            out[6] = (uint8_t)(x >> 16), out[7] = (uint8_t)(x >> 8), out[8] = (uint8_t)x; return 9;
    default: memcpy(out, kBad[form - 4], 2); return form == 4 ? 1 : 2;
  }
}

static void test_mixed_lanes(void **state) {
  diff *d = *state;
  static const char kMapHead[] = "\x92\x01\x91\x88" STORED_HEAD "\xb1parent_block_hash\xc0\xa9token_ids\xdc";
  static const char kMapTail[] = "\xaa" "block_size\x10\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0";
  static const char kPosHead[] = "\x92\x01\x91\x98\xab" "BlockStored\x91" H "\xc0\xdc";
  static const char kPosTail[] = "\x10\xc0\xa3GPU\xc0";
  uint8_t buf[64 + 40 * 9 + 64];
  uint32_t ids[40];
  size_t read = 0;
  for (int round = 0; round < 3000; round++) {
    size_t nt = 1 + next(d) % 40, odd = next(d) % nt; /* the id in another form: any lane, any step */
    int form = 1 + (int)(next(d) % 6), pos = round % 2;
    const char *head = pos ? kPosHead : kMapHead, *tail = pos ? kPosTail : kMapTail;
    size_t hl = pos ? sizeof kPosHead - 1 : sizeof kMapHead - 1, tl = pos ? sizeof kPosTail - 1 : sizeof kMapTail - 1;
    memcpy(buf, head, hl);
    size_t len = hl;
    buf[len++] = 0, buf[len++] = (uint8_t)nt;
    for (size_t j = 0; j < nt; j++) len += put_odd_id(d, buf + len, j == odd && round % 7 ? form : 0, &ids[j]);
    memcpy(buf + len, tail, tl);
    len += tl;
    diff_one(d, buf, len);
    kvbm_event_batch b;
    if (kvbm_event_decode(d->quick, buf, len, 0, &b, NULL) == 0 && b.num_events == 1) {
      assert_int_equal(b.events[0].num_tokens, nt); /* a valid id in any form reads as written */
      assert_memory_equal(b.events[0].token_ids, ids, 4 * nt);
      read++;
    } else {
      assert_true(round % 7 && form >= 4); /* only a bad tag refuses the event */
    }
    for (size_t cut = len - tl - 3; cut < len; cut++) diff_one(d, buf, cut);
    diff_mutated(d, buf, len, 3);
  }
  print_message("mixed lanes: events read %zu of 3000\n", read);
  assert_true(read > 1500);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_engine_payloads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_own_encoder, setup, teardown),
      cmocka_unit_test_setup_teardown(test_templates, setup, teardown),
      cmocka_unit_test_setup_teardown(test_edges, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mixed_widths, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mixed_lanes, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
