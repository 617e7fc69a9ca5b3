/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec.c: KV event batches to the engines' msgpack payload, and the
 * check of an event before it is written. (Decoding is decode.c.)
 *
 * The codec knows bytes only; sockets live in the events module. Encoding
 * writes each event straight into a reusable buffer with the cursor
 * writers of common/msgpack.h, one capacity check an event.
 *
 * Forms: a batch is [ts, events, dp_rank?]; an event is a tagged array
 * (positional, msgspec's array_like) or a map with a "type" key (vLLM's
 * today, the default), exactly the keys vLLM writes.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "event_codec/fields.h"
#include "event_codec/internal.h"
#include "common/msgpack.h"
#include "kvbm/event_codec.h"
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <tmmintrin.h>
#endif

/* ------------------------------------------------------------- checking */

static bool names_medium(const char *name, kvbm_medium m) {
  return kvbm_medium_from_name(name, strlen(name)) == m;
}

/* Whether [p, p+len) is exactly `values` msgpack values, or, with
 * `keyed`, that many pairs of a string key kvbm does not name and a value. */
static bool raw_ok(const uint8_t *p, size_t len, uint32_t values, bool keyed) {
  kvbm__mpr r = {p, p + len};
  for (uint32_t i = 0; i < values; i++) {
    if (keyed) {
      const uint8_t *k;
      size_t kl;
      if (kvbm__mpr_peek(&r) != KVBM__MPR_STR || kvbm__mpr_bytes(&r, false, &k, &kl)) return false;
      if ((kl == 4 && !memcmp(k, "type", 4)) || kvbm__event_key_field(k, kl) != F_EXTRA) return false;
    }
    if (kvbm__mpr_skip(&r)) return false;
  }
  return r.p == r.end;
}

kvbm_event_encoder_config kvbm_event_encoder_config_default(void) {
  return (kvbm_event_encoder_config){.form = KVBM_FORM_MAP, .signed_hashes = false};
}

int kvbm_event_check(const kvbm_event *ev, const kvbm_event_encoder_config *cfg,
                     kvbm_error *err) {
  if (!ev) return kvbm_error_set(err, KVBM_EINVAL, "events: NULL event");
  if (ev->type == KVBM_EVENT_CLEARED) return KVBM_OK;
  if (ev->type != KVBM_EVENT_STORED && ev->type != KVBM_EVENT_REMOVED)
    return kvbm_error_set(err, KVBM_EINVAL, "events: event has unknown type %d", (int)ev->type);
#define T_ kvbm_event_type_name(ev->type)
  if ((unsigned)ev->medium > KVBM_MEDIUM_OTHER)
    return kvbm_error_set(err, KVBM_EINVAL, "events: %s: unknown medium %d", T_, (int)ev->medium);
  if (ev->medium == KVBM_MEDIUM_OTHER && !ev->medium_name)
    return kvbm_error_set(err, KVBM_EINVAL, "events: %s: medium OTHER without a name", T_);
  if (ev->medium_name && !names_medium(ev->medium_name, ev->medium))
    return kvbm_error_set(err, KVBM_EINVAL, "events: %s: medium_name \"%.40s\" does not name medium %d",
                          T_, ev->medium_name, (int)ev->medium);
  if ((ev->num_block_hashes | ev->num_tokens) > UINT32_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "events: %s: more than 2^32 elements", T_);
  if ((ev->num_block_hashes && !ev->block_hashes) ||
      (ev->type == KVBM_EVENT_STORED && ev->num_tokens && !ev->token_ids))
    return kvbm_error_set(err, KVBM_EINVAL, "events: %s: NULL array with a count", T_);
  if ((ev->num_extras || ev->extras_len) &&
      (!ev->extras || !raw_ok(ev->extras, ev->extras_len, ev->num_extras, true)))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: %s: extras are not %u pairs of a key kvbm does not name "
                          "and a value", T_, ev->num_extras);
  if (ev->type != KVBM_EVENT_STORED) return KVBM_OK;
  if (ev->token_pairs && ev->num_tokens == 1)
    return kvbm_error_set(err, KVBM_EINVAL, "events: %s: token pairs need 2 tokens or none", T_);
  if (ev->extra_keys && !raw_ok(ev->extra_keys, ev->extra_keys_len, 1, false))
    return kvbm_error_set(err, KVBM_EINVAL, "events: %s: extra_keys is not one msgpack value", T_);
  if (ev->lora_name && ev->cache_salt && (cfg ? cfg->form : KVBM_FORM_MAP) == KVBM_FORM_POSITIONAL)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: %s: the positional form holds a lora_name or a cache_salt "
                          "at index 7, not both (use the map form)", T_);
#undef T_
  return KVBM_OK;
}

/* ------------------------------------------------------------- encoding */

struct kvbm_event_encoder {
  uint8_t *buf; /* the last payload */
  size_t len, cap;
  kvbm_event_encoder_config cfg;
};

int kvbm_event_encoder_create(const kvbm_event_encoder_config *cfg, kvbm_event_encoder **out,
                              kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "events: encoder: NULL out");
  kvbm_event_encoder_config c = cfg ? *cfg : kvbm_event_encoder_config_default();
  if (c.form != KVBM_FORM_POSITIONAL && c.form != KVBM_FORM_MAP)
    return kvbm_error_set(err, KVBM_EINVAL, "events: encoder: unknown form %d", (int)c.form);
  kvbm_event_encoder *e = calloc(1, sizeof *e);
  if (!e) return kvbm_error_set(err, KVBM_ENOMEM, "events: no memory for an encoder");
  e->cfg = c;
  *out = e;
  return KVBM_OK;
}

void kvbm_event_encoder_destroy(kvbm_event_encoder *enc) {
  if (!enc) return;
  free(enc->buf);
  free(enc);
}

/* Events are written straight into the buffer with common/msgpack.h's
 * cursor writers: one capacity check per event, for a bound on its size
 * (event_bound), then plain stores. msgpack-c's packer made one write
 * callback per value, which for the tagged maps (a dozen keys and values
 * per event) was most of the cost. The bytes are the shortest encoding of
 * each value, as msgpack-c (and msgspec) write them. */
static uint8_t *enc_reserve(kvbm_event_encoder *enc, size_t need) {
  if (enc->cap - enc->len >= need) return enc->buf + enc->len;
  if (need > SIZE_MAX / 2 - enc->len ||
      kvbm__vec_reserve_of(&enc->buf, &enc->cap, enc->len + need, 8192, KVBM__VEC_NO_LIMIT))
    return NULL;
  return enc->buf + enc->len;
}

/* A hash: unsigned, or (signed_hashes) the int64 with the same bits: a
 * hash >= 2^63 becomes a negative int64, the others are the same
 * non-negative integer either way. */
static inline uint8_t *put_hash(uint8_t *p, uint64_t v, bool sgn) {
  return sgn ? kvbm__mp_put_int(p, (int64_t)v) : kvbm__mp_put_uint(p, v);
}

static inline uint8_t *put_opt_str(uint8_t *p, const char *s) {
  return s ? kvbm__mp_put_str(p, s, strlen(s)) : kvbm__mp_put_nil(p);
}

/* A key or tag known at compile time (all under 32 bytes): a fixstr. */
#define LIT(p, s) kvbm__mp_put_str((p), (s), sizeof(s) - 1)

static inline uint8_t *put_opt_i64(uint8_t *p, bool has, int64_t v) {
  return has ? kvbm__mp_put_int(p, v) : kvbm__mp_put_nil(p);
}

/* kvbm_medium_name(m) as msgpack (nil for NONE), for the usual event
 * that names no medium text of its own: one 8-byte copy, no strlen
 * (test_medium_bytes holds it to kvbm_medium_name). */
static const struct {
  char b[7];
  uint8_t len;
} kMediumWire[] = {{"\xc0", 1}, {"\xa3GPU", 4}, {"\xa3" "CPU", 4}, {"\xa4" "DISK", 5},
                   {"\xa6REMOTE", 7}};

static uint8_t *put_medium(uint8_t *p, const kvbm_event *ev) {
  if (!ev->medium_name && (size_t)ev->medium < sizeof kMediumWire / sizeof *kMediumWire) {
    memcpy(p, kMediumWire[ev->medium].b, 7); /* the bound leaves room past a short name */
    return p + kMediumWire[ev->medium].len;
  }
  const char *name = ev->medium_name ? ev->medium_name : kvbm_medium_name(ev->medium);
  return put_opt_str(p, name);
}

static uint8_t *put_hashes(uint8_t *p, const uint64_t *h, size_t n, bool sgn) {
  p = kvbm__mp_put_hdr(p, n, false);
  for (size_t i = 0; i < n; i++) p = put_hash(p, h[i], sgn);
  return p;
}

/* Flat token ids, or (token_pairs) the n-1 pairs [t_i, t_i+1] they chain. */
static uint8_t *put_tokens(uint8_t *p, const uint32_t *t, size_t n, bool pairs) {
  if (!pairs) {
    p = kvbm__mp_put_hdr(p, n, false);
    for (size_t i = 0; i < n; i++) p = kvbm__mp_put_u32(p, t[i]);
    return p;
  }
  size_t items = n ? n - 1 : 0;
  p = kvbm__mp_put_hdr(p, items, false);
  for (size_t i = 0; i < items; i++) {
    *p++ = 0x92;
    p = kvbm__mp_put_u32(p, t[i]);
    p = kvbm__mp_put_u32(p, t[i + 1]);
  }
  return p;
}

static size_t str_bound(const char *s) { return s ? strlen(s) + 5 : 1; }

/* Bytes event `ev` can take at most, keys and headers included. */
static size_t event_bound(const kvbm_event *ev) {
  size_t n = 400 + 9 * ev->num_block_hashes + (ev->token_pairs ? 11 : 5) * ev->num_tokens;
  /* the usual event (the pool link's, an engine's plain store): no names */
  if (!((uintptr_t)ev->medium_name | (uintptr_t)ev->lora_name | (uintptr_t)ev->cache_salt |
        (uintptr_t)ev->kv_cache_spec_kind | (uintptr_t)ev->locality | (uintptr_t)ev->ownership))
    return n + 6 + ev->extra_keys_len + ev->extras_len;
  n += str_bound(ev->medium_name) + str_bound(ev->lora_name) + str_bound(ev->cache_salt) +
       str_bound(ev->kv_cache_spec_kind) + str_bound(ev->locality) + str_bound(ev->ownership);
  return n + ev->extra_keys_len + ev->extras_len;
}

/* The optional keys of the map form that `ev` has, after the required ones. */
static size_t map_optionals(const kvbm_event *ev) {
  size_t n = ev->num_extras + !!ev->locality + !!ev->ownership + ev->has_group_idx;
  if (ev->type == KVBM_EVENT_STORED)
    n += !!ev->extra_keys + !!ev->kv_cache_spec_kind + ev->has_sliding_window + !!ev->cache_salt;
  return n;
}

/* Written only when present (vLLM's omit_defaults); the extras last. */
static uint8_t *put_map_optionals(uint8_t *p, const kvbm_event *ev) {
  bool st = ev->type == KVBM_EVENT_STORED;
  if (st && ev->extra_keys) p = kvbm__mp_put_raw(LIT(p, "extra_keys"), ev->extra_keys, ev->extra_keys_len);
  if (ev->has_group_idx) p = kvbm__mp_put_int(LIT(p, "group_idx"), ev->group_idx);
  if (st && ev->kv_cache_spec_kind)
    p = put_opt_str(LIT(p, "kv_cache_spec_kind"), ev->kv_cache_spec_kind);
  if (st && ev->has_sliding_window)
    p = kvbm__mp_put_int(LIT(p, "kv_cache_spec_sliding_window"), ev->sliding_window);
  if (ev->locality) p = put_opt_str(LIT(p, "locality"), ev->locality);
  if (ev->ownership) p = put_opt_str(LIT(p, "ownership"), ev->ownership);
  if (st && ev->cache_salt) p = put_opt_str(LIT(p, "cache_salt"), ev->cache_salt);
  if (ev->num_extras) p = kvbm__mp_put_raw(p, ev->extras, ev->extras_len);
  return p;
}

static uint8_t *put_stored(uint8_t *p, const kvbm_event *ev, kvbm_event_form form, bool sgn) {
  if (form == KVBM_FORM_POSITIONAL) {
    /* vLLM's order; index 7 is vLLM's lora_name or SGLang's metadata map
     * (the salt, and the fields kvbm does not name, as SGLang sends
     * them); the tail stops after its last present field, nil before. */
    size_t last = 7;
    if (ev->extra_keys) last = 8;
    if (ev->has_group_idx) last = 9;
    if (ev->kv_cache_spec_kind) last = 10;
    if (ev->has_sliding_window) last = 11;
    p = kvbm__mp_put_hdr(p, last + 1, false);
    p = LIT(p, "BlockStored");
    p = put_hashes(p, ev->block_hashes, ev->num_block_hashes, sgn);
    p = ev->has_parent ? put_hash(p, ev->parent_hash, sgn) : kvbm__mp_put_nil(p);
    p = put_tokens(p, ev->token_ids, ev->num_tokens, ev->token_pairs);
    p = kvbm__mp_put_uint(p, ev->block_size);
    p = put_opt_i64(p, ev->has_lora_id, ev->lora_id);
    p = put_medium(p, ev);
    if (ev->lora_name || !ev->cache_salt) {
      p = put_opt_str(p, ev->lora_name);
    } else {
      p = kvbm__mp_put_hdr(p, 1 + ev->num_extras, true);
      p = put_opt_str(LIT(p, "cache_salt"), ev->cache_salt);
      p = kvbm__mp_put_raw(p, ev->extras, ev->extras_len);
    }
    if (last >= 8) p = ev->extra_keys ? kvbm__mp_put_raw(p, ev->extra_keys, ev->extra_keys_len) : kvbm__mp_put_nil(p);
    if (last >= 9) p = put_opt_i64(p, ev->has_group_idx, ev->group_idx);
    if (last >= 10) p = put_opt_str(p, ev->kv_cache_spec_kind);
    if (last >= 11) p = kvbm__mp_put_int(p, ev->sliding_window);
    return p;
  }
  size_t opt = map_optionals(ev);
  p = kvbm__mp_put_hdr(p, 8 + opt, true);
  p = LIT(LIT(p, "type"), "BlockStored");
  p = put_hashes(LIT(p, "block_hashes"), ev->block_hashes, ev->num_block_hashes, sgn);
  p = LIT(p, "parent_block_hash");
  p = ev->has_parent ? put_hash(p, ev->parent_hash, sgn) : kvbm__mp_put_nil(p);
  p = put_tokens(LIT(p, "token_ids"), ev->token_ids, ev->num_tokens, ev->token_pairs);
  p = kvbm__mp_put_uint(LIT(p, "block_size"), ev->block_size);
  p = put_opt_i64(LIT(p, "lora_id"), ev->has_lora_id, ev->lora_id);
  p = put_medium(LIT(p, "medium"), ev);
  p = put_opt_str(LIT(p, "lora_name"), ev->lora_name);
  return opt ? put_map_optionals(p, ev) : p;
}

static uint8_t *put_removed(uint8_t *p, const kvbm_event *ev, kvbm_event_form form, bool sgn) {
  if (form == KVBM_FORM_POSITIONAL) {
    p = kvbm__mp_put_hdr(p, ev->has_group_idx ? 4 : 3, false);
    p = LIT(p, "BlockRemoved");
    p = put_hashes(p, ev->block_hashes, ev->num_block_hashes, sgn);
    p = put_medium(p, ev);
    if (ev->has_group_idx) p = kvbm__mp_put_int(p, ev->group_idx);
    return p;
  }
  size_t opt = map_optionals(ev);
  p = kvbm__mp_put_hdr(p, 3 + opt, true);
  p = LIT(LIT(p, "type"), "BlockRemoved");
  p = put_hashes(LIT(p, "block_hashes"), ev->block_hashes, ev->num_block_hashes, sgn);
  p = put_medium(LIT(p, "medium"), ev);
  return opt ? put_map_optionals(p, ev) : p;
}

static uint8_t *put_cleared(uint8_t *p, kvbm_event_form form) {
  if (form == KVBM_FORM_POSITIONAL) return LIT(kvbm__mp_put_hdr(p, 1, false), "AllBlocksCleared");
  return LIT(LIT(kvbm__mp_put_hdr(p, 1, true), "type"), "AllBlocksCleared");
}

size_t kvbm__event_wire_bound(const kvbm_event *ev) { return event_bound(ev); }

/* The plain event's encoder (see internal.h): the keys and tags between
 * the variable fields are constant, so each run of them is one copy of a
 * pre-encoded template (the bytes put_stored/put_removed write for them,
 * test_codec_plain holds the two to each other), and the variable fields
 * are written straight in: no map_optionals, no tail logic, no optional
 * strings. Callgrind, map K=1: ~286 -> see events.md "Session 9b". */
#define TPL(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) + sizeof(s) - 1)

/* A hash, its common case first: an unsigned one past 32 bits (a 64-bit
 * hash is below 2^32 once in 4 billion) as 0xcf and 8 bytes, without the
 * four narrower compares of kvbm__mp_put_uint; the same bytes. */
static inline uint8_t *put_hash_wide(uint8_t *p, uint64_t v, bool sgn) {
  if (sgn || v <= UINT32_MAX) return put_hash(p, v, sgn);
  uint64_t be = __builtin_bswap64(v);
  p[0] = 0xcf;
  memcpy(p + 1, &be, 8);
  return p + 9;
}

/* One block (a pool link's every event) has a one-byte header and no
 * loop: ~8 instructions a K = 1 event less (callgrind). */
static inline uint8_t *put_hashes_plain(uint8_t *p, const uint64_t *h, size_t n, bool sgn) {
  if (n == 1) {
    *p = 0x91;
    return put_hash_wide(p + 1, h[0], sgn);
  }
  p = kvbm__mp_put_hdr(p, n, false);
  for (size_t i = 0; i < n; i++) p = put_hash_wide(p, h[i], sgn);
  return p;
}

static inline uint8_t *put_parent(uint8_t *p, const kvbm_event *ev, bool sgn) {
  return ev->has_parent ? put_hash_wide(p, ev->parent_hash, sgn) : kvbm__mp_put_nil(p);
}

/* One token id as kvbm__mp_put_u32 writes it, the widest case tested
 * first: ids of real vocabularies (32k-152k) are almost all >= 256, so
 * most take one or two compares, not three or four. */
static inline uint8_t *put_token_id(uint8_t *p, uint32_t v) {
  if (v >= 65536) {
    uint32_t be = __builtin_bswap32(v);
    p[0] = 0xce;
    memcpy(p + 1, &be, 4);
    return p + 5;
  }
  if (v >= 256) {
    uint16_t be = __builtin_bswap16((uint16_t)v);
    p[0] = 0xcd;
    memcpy(p + 1, &be, 2);
    return p + 3;
  }
  if (v >= 128) {
    p[0] = 0xcc;
    p[1] = (uint8_t)v;
    return p + 2;
  }
  *p = (uint8_t)v;
  return p + 1;
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define KVBM__TOKENS_X86 1
/* Four ids a step with byte shuffles (SSSE3, chosen at run time: the
 * build targets plain x86-64). Ids of 256 and up, a vocabulary's almost
 * all, are uint16 (0xcd and 2 bytes) or uint32 (0xce and 4): the four
 * ids' widths pick one of 16 layouts (kTok4, bit i set: id i is a
 * uint16), whose shuffles put each id's bytes, swapped, in place, with
 * the tags or'ed in between: the first 16 of the 12..20 bytes in one
 * store, the rest (no tag lies past byte 15) in a 4-byte one. No branch
 * on an id's width: the ids of a large vocabulary (128k and more) are of
 * both widths at random, which a branch an id mispredicts half the time.
 * A group with an id below 256 takes put_token_id, so the bytes are
 * always kvbm__mp_put_u32's (test_encode_plain compares them over random
 * widths, mixed and of one width). The stores reach up to 8 bytes past
 * the group's last byte, always within the bound the caller reserved
 * (kvbm__event_plain_bound keeps 400 bytes beyond the fields, and
 * test_encode_plain checks that nothing past it is written): the event's
 * own later fields (block_size, lora_id, medium) are written over them,
 * and what may lie past the event's end is not the event's (the caller
 * takes its length; the next event or a batch's tail goes there). At
 * K = 16 the loop of one id a
 * step was three quarters of the encoder's time (perf, bench_events
 * --k 16). Generated by the rule above: lane i's 4 little-endian bytes
 * are at 4i..4i+3 of the load; 0x80 writes a zero. */
typedef struct __attribute__((aligned(16))) tok4 {
  uint8_t lo[16];  /* shuffle of the first 16 output bytes */
  uint8_t tag[16]; /* their tag bytes */
  uint8_t hi[16];  /* shuffle of bytes 16..19 (4 used) */
  uint32_t len;    /* 12 + 2 a uint32 id */
} tok4;
static const tok4 kTok4[16] = {
    {{0x80, 0x03, 0x02, 0x01, 0x00, 0x80, 0x07, 0x06, 0x05, 0x04, 0x80, 0x0b, 0x0a, 0x09, 0x08, 0x80},
     {0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xce},
     {0x0f, 0x0e, 0x0d, 0x0c, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     20},
    {{0x80, 0x01, 0x00, 0x80, 0x07, 0x06, 0x05, 0x04, 0x80, 0x0b, 0x0a, 0x09, 0x08, 0x80, 0x0f, 0x0e},
     {0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00},
     {0x0d, 0x0c, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     18},
    {{0x80, 0x03, 0x02, 0x01, 0x00, 0x80, 0x05, 0x04, 0x80, 0x0b, 0x0a, 0x09, 0x08, 0x80, 0x0f, 0x0e},
     {0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00},
     {0x0d, 0x0c, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     18},
    {{0x80, 0x01, 0x00, 0x80, 0x05, 0x04, 0x80, 0x0b, 0x0a, 0x09, 0x08, 0x80, 0x0f, 0x0e, 0x0d, 0x0c},
     {0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     16},
    {{0x80, 0x03, 0x02, 0x01, 0x00, 0x80, 0x07, 0x06, 0x05, 0x04, 0x80, 0x09, 0x08, 0x80, 0x0f, 0x0e},
     {0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xce, 0x00, 0x00},
     {0x0d, 0x0c, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     18},
    {{0x80, 0x01, 0x00, 0x80, 0x07, 0x06, 0x05, 0x04, 0x80, 0x09, 0x08, 0x80, 0x0f, 0x0e, 0x0d, 0x0c},
     {0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     16},
    {{0x80, 0x03, 0x02, 0x01, 0x00, 0x80, 0x05, 0x04, 0x80, 0x09, 0x08, 0x80, 0x0f, 0x0e, 0x0d, 0x0c},
     {0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     16},
    {{0x80, 0x01, 0x00, 0x80, 0x05, 0x04, 0x80, 0x09, 0x08, 0x80, 0x0f, 0x0e, 0x0d, 0x0c, 0x80, 0x80},
     {0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     14},
    {{0x80, 0x03, 0x02, 0x01, 0x00, 0x80, 0x07, 0x06, 0x05, 0x04, 0x80, 0x0b, 0x0a, 0x09, 0x08, 0x80},
     {0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xcd},
     {0x0d, 0x0c, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     18},
    {{0x80, 0x01, 0x00, 0x80, 0x07, 0x06, 0x05, 0x04, 0x80, 0x0b, 0x0a, 0x09, 0x08, 0x80, 0x0d, 0x0c},
     {0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     16},
    {{0x80, 0x03, 0x02, 0x01, 0x00, 0x80, 0x05, 0x04, 0x80, 0x0b, 0x0a, 0x09, 0x08, 0x80, 0x0d, 0x0c},
     {0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     16},
    {{0x80, 0x01, 0x00, 0x80, 0x05, 0x04, 0x80, 0x0b, 0x0a, 0x09, 0x08, 0x80, 0x0d, 0x0c, 0x80, 0x80},
     {0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     14},
    {{0x80, 0x03, 0x02, 0x01, 0x00, 0x80, 0x07, 0x06, 0x05, 0x04, 0x80, 0x09, 0x08, 0x80, 0x0d, 0x0c},
     {0xce, 0x00, 0x00, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     16},
    {{0x80, 0x01, 0x00, 0x80, 0x07, 0x06, 0x05, 0x04, 0x80, 0x09, 0x08, 0x80, 0x0d, 0x0c, 0x80, 0x80},
     {0xcd, 0x00, 0x00, 0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     14},
    {{0x80, 0x03, 0x02, 0x01, 0x00, 0x80, 0x05, 0x04, 0x80, 0x09, 0x08, 0x80, 0x0d, 0x0c, 0x80, 0x80},
     {0xce, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     14},
    {{0x80, 0x01, 0x00, 0x80, 0x05, 0x04, 0x80, 0x09, 0x08, 0x80, 0x0d, 0x0c, 0x80, 0x80, 0x80, 0x80},
     {0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0xcd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
     12},
};

__attribute__((target("ssse3"))) static uint8_t *put_tokens_x4(uint8_t *p, const uint32_t *t, size_t n,
                                                                  size_t *done) {
  const __m128i zero = _mm_setzero_si128();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(t + i));
    if (_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_srli_epi32(v, 8), zero)))) {
      for (size_t j = 0; j < 4; j++) p = put_token_id(p, t[i + j]); /* an id below 256 */
      continue;
    }
    const tok4 *l = &kTok4[_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_srli_epi32(v, 16), zero)))];
    const __m128i lo = _mm_or_si128(_mm_shuffle_epi8(v, _mm_load_si128((const __m128i *)l->lo)),
                                    _mm_load_si128((const __m128i *)l->tag));
    const uint32_t hi = (uint32_t)_mm_cvtsi128_si32(_mm_shuffle_epi8(v, _mm_load_si128((const __m128i *)l->hi)));
    _mm_storeu_si128((__m128i *)p, lo);
    memcpy(p + 16, &hi, 4);
    p += l->len;
  }
  *done = i;
  return p;
}
#endif

/* A block's 16 ids have their array16 header as one 3-byte template; the
 * ids go four at a time where the CPU has SSSE3 (put_tokens_x4), else
 * (and the last n % 4) two a step: half the loop's own compares and
 * increments. */
static inline uint8_t *put_tokens_plain(uint8_t *p, const uint32_t *t, size_t n) {
  p = n == 16 ? TPL(p, "\xdc\x00\x10") : kvbm__mp_put_hdr(p, n, false);
  size_t i = 0;
#ifdef KVBM__TOKENS_X86
  if (n >= 4 && __builtin_cpu_supports("ssse3")) {
    p = put_tokens_x4(p, t, n, &i);
    t += i;
    n -= i;
    i = 0;
  }
#endif
  for (; i + 2 <= n; i += 2) p = put_token_id(put_token_id(p, t[i]), t[i + 1]);
  return i < n ? put_token_id(p, t[i]) : p;
}

/* put_medium for a plain event (a medium of kMediumWire's, no text):
 * the entry's 8 bytes in one copy, inline. */
static inline uint8_t *put_medium_plain(uint8_t *p, kvbm_medium m) {
  memcpy(p, &kMediumWire[m], 8);
  return p + kMediumWire[m].len;
}

static uint8_t *put_stored_plain(uint8_t *p, const kvbm_event *ev, bool map, bool sgn) {
  if (map) {
    p = TPL(p, "\x88\xa4type\xab" "BlockStored\xac" "block_hashes");
    p = put_hashes_plain(p, ev->block_hashes, ev->num_block_hashes, sgn);
    p = put_parent(TPL(p, "\xb1parent_block_hash"), ev, sgn);
    p = put_tokens_plain(TPL(p, "\xa9token_ids"), ev->token_ids, ev->num_tokens);
    p = kvbm__mp_put_uint(TPL(p, "\xaa" "block_size"), ev->block_size);
    p = put_opt_i64(TPL(p, "\xa7lora_id"), ev->has_lora_id, ev->lora_id);
    p = put_medium_plain(TPL(p, "\xa6medium"), ev->medium);
    return TPL(p, "\xa9lora_name\xc0");
  }
  p = TPL(p, "\x98\xab" "BlockStored");
  p = put_hashes_plain(p, ev->block_hashes, ev->num_block_hashes, sgn);
  p = put_parent(p, ev, sgn);
  p = put_tokens_plain(p, ev->token_ids, ev->num_tokens);
  p = kvbm__mp_put_uint(p, ev->block_size);
  p = put_opt_i64(p, ev->has_lora_id, ev->lora_id);
  return kvbm__mp_put_nil(put_medium_plain(p, ev->medium));
}

static uint8_t *put_removed_plain(uint8_t *p, const kvbm_event *ev, bool map, bool sgn) {
  p = map ? TPL(p, "\x83\xa4type\xac" "BlockRemoved\xac" "block_hashes")
          : TPL(p, "\x93\xac" "BlockRemoved");
  p = put_hashes_plain(p, ev->block_hashes, ev->num_block_hashes, sgn);
  return put_medium_plain(map ? TPL(p, "\xa6medium") : p, ev->medium);
}

uint8_t *kvbm__event_put_plain(uint8_t *p, const kvbm_event *ev,
                               const kvbm_event_encoder_config *cfg) {
  bool map = cfg->form == KVBM_FORM_MAP, sgn = cfg->signed_hashes;
  if (ev->has_group_idx || ev->has_sliding_window) return kvbm__event_put(p, ev, cfg);
  return ev->type == KVBM_EVENT_STORED ? put_stored_plain(p, ev, map, sgn)
                                       : put_removed_plain(p, ev, map, sgn);
}

uint8_t *kvbm__event_put(uint8_t *p, const kvbm_event *ev, const kvbm_event_encoder_config *cfg) {
  bool sgn = cfg->signed_hashes;
  switch (ev->type) {
    case KVBM_EVENT_STORED: return put_stored(p, ev, cfg->form, sgn);
    case KVBM_EVENT_REMOVED: return put_removed(p, ev, cfg->form, sgn);
    case KVBM_EVENT_CLEARED: return put_cleared(p, cfg->form);
  }
  return p;
}

/* [ts, [n events, then the dp_rank] or [ts, [n (2 items; the events follow. */
static uint8_t *put_batch_head(uint8_t *p, double ts, bool has_rank, size_t n) {
  p = kvbm__mp_put_hdr(p, has_rank ? 3 : 2, false);
  p = kvbm__mp_put_double(p, ts);
  return kvbm__mp_put_hdr(p, n, false);
}

#define BATCH_HEAD_MAX (1 + 9 + 5)
_Static_assert(BATCH_HEAD_MAX == KVBM__EVENT_HEAD_MAX, "the head room the publisher leaves");

uint8_t *kvbm__event_head_before(uint8_t *end, double ts, bool has_rank, size_t n) {
  uint8_t head[BATCH_HEAD_MAX];
  size_t len = (size_t)(put_batch_head(head, ts, has_rank, n) - head);
  memcpy(end - len, head, len);
  return end - len;
}

static int encode(kvbm_event_encoder *enc, const kvbm_event_batch *batch, const uint8_t **data,
                  size_t *len, bool check, kvbm_error *err) {
  if (!enc || !batch || !data || !len || (batch->num_events && !batch->events))
    return kvbm_error_set(err, KVBM_EINVAL, "events: encode: NULL argument");
  if (batch->num_events > UINT32_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "events: encode: more than 2^32 events");
  for (size_t i = 0; check && i < batch->num_events; i++) {
    int rc = kvbm_event_check(&batch->events[i], &enc->cfg, err);
    if (rc) return rc;
  }
  enc->len = 0;
  uint8_t *p = enc_reserve(enc, BATCH_HEAD_MAX);
  if (!p) return kvbm_error_set(err, KVBM_ENOMEM, "events: encode: out of memory");
  enc->len = (size_t)(put_batch_head(p, batch->ts, batch->has_dp_rank, batch->num_events) - enc->buf);
  for (size_t i = 0; i < batch->num_events; i++) {
    if (!(p = enc_reserve(enc, event_bound(&batch->events[i]) + KVBM__MP_SCALAR_MAX)))
      return kvbm_error_set(err, KVBM_ENOMEM, "events: encode: out of memory");
    enc->len = (size_t)(kvbm__event_put(p, &batch->events[i], &enc->cfg) - enc->buf);
  }
  if (batch->has_dp_rank) enc->len = (size_t)(kvbm__mp_put_int(enc->buf + enc->len, batch->dp_rank) - enc->buf);
  *data = enc->buf;
  *len = enc->len;
  return KVBM_OK;
}

int kvbm__event_frame(kvbm_event_encoder *enc, double ts, bool has_rank, int32_t dp_rank,
                      size_t n, const uint8_t *events, size_t events_len, const uint8_t **data,
                      size_t *len) {
  if (n > UINT32_MAX || events_len > SIZE_MAX / 2) return KVBM_EINVAL;
  enc->len = 0;
  uint8_t *p = enc_reserve(enc, BATCH_HEAD_MAX + events_len + KVBM__MP_SCALAR_MAX);
  if (!p) return KVBM_ENOMEM;
  /* the head as the in-place framing writes it, right before the events */
  uint8_t *start = kvbm__event_head_before(p + BATCH_HEAD_MAX, ts, has_rank, n);
  size_t head = (size_t)(p + BATCH_HEAD_MAX - start);
  memmove(p, start, head);
  p += head;
  p = kvbm__mp_put_raw(p, events, events_len);
  if (has_rank) p = kvbm__mp_put_int(p, dp_rank);
  enc->len = (size_t)(p - enc->buf);
  *data = enc->buf;
  *len = enc->len;
  return KVBM_OK;
}

int kvbm_event_encode(kvbm_event_encoder *enc, const kvbm_event_batch *batch,
                      const uint8_t **data, size_t *len, kvbm_error *err) {
  return encode(enc, batch, data, len, true, err);
}

int kvbm__event_encode_checked(kvbm_event_encoder *enc, const kvbm_event_batch *batch,
                               const uint8_t **data, size_t *len, kvbm_error *err) {
  return encode(enc, batch, data, len, false, err);
}
