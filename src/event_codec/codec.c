/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec.c: KV event batches to and from the engines' msgpack payload.
 *
 * The codec knows bytes only; sockets live in the events module. Encoding
 * writes each event straight into a reusable buffer with the cursor
 * writers of common/msgpack.h, one capacity check an event. Decoding
 * uses the bounds-checked reader of common/msgpack.h (see there why not msgpack-c)
 * and writes into arenas the decoder keeps between calls: events, hashes,
 * tokens, strings (with extra_keys' raw bytes) and the raw bytes of the
 * fields kvbm does not name. While a payload is read the events record
 * offsets into the arenas (which may move as they grow); the pointers are
 * set once at the end. In steady state a decode allocates nothing.
 *
 * Forms: a batch is [ts, events, dp_rank?] or a map with those names; an
 * event is a tagged array (positional, msgspec's array_like) or a map with
 * a "type" key. Positional fields are read by position up to the last one
 * kvbm knows and the rest skipped, as msgspec does for newer senders; map
 * keys kvbm does not name are kept, as bytes, for whoever relays the event.
 *
 * Why an event that fails does not fail its batch: a batch is one step of
 * an engine, and its sequence number is used up whatever it holds. Dynamo
 * already sees tags it does not know ("Ignored"), and the engines keep
 * adding fields; refusing the batch for one odd event would lose every
 * other store and remove in it for good. So an event is read in place; if
 * it is wrong (a tag kvbm does not know, a field of the wrong type, a
 * required field missing), the reader goes back to the event's first byte,
 * skips the value whole (which checks it is well-formed msgpack), rolls
 * the arenas back and counts it. Only msgpack that is not well-formed, or a
 * batch of the wrong shape, costs the payload: then the event boundaries
 * themselves are unknown. The rewind costs nothing on the good path.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "event_codec/internal.h"
#include "common/msgpack.h"
#include "kvbm/event_codec.h"

/* Field ids shared by both forms and by kvbm_event_check. */
enum {
  F_HASHES, F_PARENT, F_TOKENS, F_BSIZE, F_LORA, F_MEDIUM, F_LNAME, F_EKEYS, F_GROUP,
  F_KIND, F_SWIN, F_LOCALITY, F_OWNERSHIP, F_SALT,
  F_NAMED,            /* fields above have a name in the map form */
  F_SLOT7 = F_NAMED,  /* positional index 7: lora_name or SGLang's metadata map */
  F_EXTRA,            /* a key kvbm does not name: kept as bytes */
  F_SKIP,             /* a positional field past the known ones */
};
static const char *const kFieldName[] = {
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window", "locality", "ownership", "cache_salt",
    "lora_name or metadata", "extra field", "field"};

/* The field a map key names (F_EXTRA for one kvbm does not name), by
 * length first: this runs for every key of every event. */
static int key_field(const uint8_t *k, size_t n) {
#define K(str, f) \
  if (n == sizeof(str) - 1 && !memcmp(k, str, n)) return f
  switch (n) {
    case 6: K("medium", F_MEDIUM); break;
    case 7: K("lora_id", F_LORA); break;
    case 8: K("locality", F_LOCALITY); break;
    case 9:
      K("token_ids", F_TOKENS);
      K("lora_name", F_LNAME);
      K("group_idx", F_GROUP);
      K("ownership", F_OWNERSHIP);
      break;
    case 10:
      K("block_size", F_BSIZE);
      K("extra_keys", F_EKEYS);
      K("cache_salt", F_SALT);
      break;
    case 12: K("block_hashes", F_HASHES); break;
    case 17: K("parent_block_hash", F_PARENT); break;
    case 18: K("kv_cache_spec_kind", F_KIND); break;
    case 28: K("kv_cache_spec_sliding_window", F_SWIN); break;
  }
#undef K
  return F_EXTRA;
}

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
      if ((kl == 4 && !memcmp(k, "type", 4)) || key_field(k, kl) != F_EXTRA) return false;
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

static inline uint8_t *put_hashes_plain(uint8_t *p, const uint64_t *h, size_t n, bool sgn) {
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

/* Two ids a step: half the loop's own compares and increments. */
static inline uint8_t *put_tokens_plain(uint8_t *p, const uint32_t *t, size_t n) {
  p = kvbm__mp_put_hdr(p, n, false);
  size_t i = 0;
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

/* ------------------------------------------------------------- decoding */

/* Where an event's variable parts sit in the arenas while a payload is
 * read (the arenas may move); SIZE_MAX = none. */
typedef struct ev_off {
  size_t h, t, mname, lname, salt, kind, loc, own, ekeys, extras;
} ev_off;

static const ev_off kNoOff = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX,
                              SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};

struct kvbm_event_decoder {
  kvbm_event *ev;
  ev_off *off;
  size_t ev_n, ev_cap, off_cap;
  uint64_t *h;
  size_t h_n, h_cap;
  uint32_t *t;
  size_t t_n, t_cap;
  char *s; /* names (NUL-terminated) and extra_keys' bytes */
  size_t s_n, s_cap;
  uint8_t *x; /* the fields kvbm does not name: contiguous per event */
  size_t x_n, x_cap;
  kvbm_error ev_err;      /* the event being read: its failure */
  char skip_reason[KVBM_ERROR_MSG_MAX];
};

int kvbm_event_decoder_create(kvbm_event_decoder **out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "events: decoder: NULL out");
  kvbm_event_decoder *d = calloc(1, sizeof *d);
  if (!d) return kvbm_error_set(err, KVBM_ENOMEM, "events: no memory for a decoder");
  *out = d;
  return KVBM_OK;
}

void kvbm_event_decoder_destroy(kvbm_event_decoder *dec) {
  if (!dec) return;
  free(dec->ev);
  free(dec->off);
  free(dec->h);
  free(dec->t);
  free(dec->s);
  free(dec->x);
  free(dec);
}

size_t kvbm_event_decoder_footprint(const kvbm_event_decoder *d) {
  if (!d) return 0;
  return d->ev_cap * sizeof *d->ev + d->off_cap * sizeof *d->off + d->h_cap * sizeof *d->h +
         d->t_cap * sizeof *d->t + d->s_cap * sizeof *d->s + d->x_cap * sizeof *d->x;
}

/* Arenas up to this size stay between decodes whatever comes next. */
#define ARENA_KEEP ((size_t)256 << 10)

/* Whether an arena of cap elements of `size` bytes is larger than
 * ARENA_KEEP and more than four times what a payload of `len` bytes can
 * need from it (one element per `div` payload bytes at most: an event kept
 * takes >= 13 bytes, a hash, a token or a string byte >= 1). Such an arena
 * is given back before the decode: one oversized message does not pin its
 * memory, while a stream of similar messages keeps its arenas and
 * allocates nothing. */
static bool oversized(size_t cap, size_t size, size_t len, size_t div) {
  return cap * size > ARENA_KEEP && cap > 4 * (len / div + 64);
}

#define SHRINK(arr, cap, len, div)                           \
  do {                                                       \
    if (oversized((cap), sizeof *(arr), (len), (div))) {     \
      free(arr);                                             \
      (arr) = NULL;                                          \
      (cap) = 0;                                             \
    }                                                        \
  } while (0)

static void shrink_all(kvbm_event_decoder *d, size_t len) {
  SHRINK(d->ev, d->ev_cap, len, 13);
  SHRINK(d->off, d->off_cap, len, 13);
  SHRINK(d->h, d->h_cap, len, 1);
  SHRINK(d->t, d->t_cap, len, 1);
  SHRINK(d->s, d->s_cap, len, 1);
  SHRINK(d->x, d->x_cap, len, 1);
}

const char *kvbm_event_decoder_skip_reason(const kvbm_event_decoder *dec) {
  return dec ? dec->skip_reason : "";
}

/* Grows arr (a T *, its capacity `cap`) to hold `need` elements, at least
 * 1 so that a decoded array is never NULL, doubling from 64; any failure (the old array kept) is
 * KVBM_ENOMEM to the caller. */
#define RESERVE(arr, cap, need)                                                        \
  do {                                                                                 \
    size_t need_ = (need);                                                             \
    if (kvbm__vec_reserve_of(&(arr), &(cap), need_ ? need_ : 1, 64, KVBM__VEC_NO_LIMIT)) \
      return fail(c, KVBM_ENOMEM, "");                                                 \
  } while (0)

/* Decoding context: the reader, the decoder, where we are (for messages). */
typedef struct dctx {
  kvbm__mpr r;
  kvbm_event_decoder *d;
  kvbm_error *err;   /* the caller's, or the decoder's ev_err inside an event */
  size_t idx;        /* event index on the wire */
  const char *field; /* field being read */
} dctx;

static int fail(dctx *c, int rc, const char *what) {
  if (rc == KVBM_ENOMEM) return kvbm_error_set(c->err, rc, "events: decode: out of memory");
  char where[96] = "";
  if (c->field) snprintf(where, sizeof where, "event %zu: %s: ", c->idx, c->field);
  const char *trunc =
      rc == KVBM_ETRUNCATED ? "input ends early or declares more than it holds" : NULL;
  bool have = what && *what;
  if (have && trunc)
    return kvbm_error_set(c->err, rc, "events: decode: %s%s (%s)", where, what, trunc);
  return kvbm_error_set(c->err, rc, "events: decode: %s%s", where,
                        have ? what : trunc ? trunc : "malformed value");
}

static int fail_type(dctx *c, const char *want) {
  char msg[160];
  snprintf(msg, sizeof msg, "expected %s, got %s", want, kvbm__mpr_kind_name(kvbm__mpr_peek(&c->r)));
  return fail(c, kvbm__mpr_peek(&c->r) == KVBM__MPR_END ? KVBM_ETRUNCATED : KVBM_EFORMAT, msg);
}

/* A hash: an integer, or bytes whose low 64 bits (big-endian) are taken. */
static int read_hash(dctx *c, uint64_t *out) {
  const uint8_t *p = c->r.p;
  if (c->r.end - p >= 9 && *p == 0xcf) { /* the common case: a full 64-bit hash */
    *out = kvbm__get_be(p + 1, 8);
    c->r.p = p + 9;
    return 0;
  }
  kvbm__mpr_kind k = kvbm__mpr_peek(&c->r);
  if (k == KVBM__MPR_INT) {
    bool neg;
    int rc = kvbm__mpr_int(&c->r, out, &neg);
    return rc ? fail(c, rc, "bad integer") : 0;
  }
  if (k == KVBM__MPR_BIN) {
    const uint8_t *b;
    size_t n;
    int rc = kvbm__mpr_bytes(&c->r, true, &b, &n);
    if (rc) return fail(c, rc, "bad bytes");
    size_t take = n < 8 ? n : 8;
    *out = kvbm__get_be(b + n - take, (int)take);
    return 0;
  }
  return fail_type(c, "a hash (integer or bytes)");
}

static int read_hashes(dctx *c, size_t *off, size_t *count) {
  uint32_t n;
  int rc = kvbm__mpr_array(&c->r, &n);
  if (rc) return rc == KVBM_EFORMAT ? fail_type(c, "an array of hashes") : fail(c, rc, "");
  kvbm_event_decoder *d = c->d;
  RESERVE(d->h, d->h_cap, d->h_n + n);
  *off = d->h_n;
  for (uint32_t i = 0; i < n; i++) {
    rc = read_hash(c, &d->h[d->h_n]);
    if (rc) return rc;
    d->h_n++;
  }
  *count = n;
  return 0;
}

/* A token id that is not one of the common encodings. */
static int read_token_slow(dctx *c, uint32_t *out) {
  uint64_t u;
  bool neg;
  if (kvbm__mpr_peek(&c->r) != KVBM__MPR_INT) return fail_type(c, "a token id (integer)");
  int rc = kvbm__mpr_int(&c->r, &u, &neg);
  if (rc) return fail(c, rc, "bad integer");
  if (neg || u > UINT32_MAX) return fail(c, KVBM_EFORMAT, "token id outside 0..2^32-1");
  *out = (uint32_t)u;
  return 0;
}

/* The common encodings of a token id, inline: fixint, uint8/16/32. */
static inline int read_token(dctx *c, uint32_t *out) {
  const uint8_t *p = c->r.p;
  size_t left = (size_t)(c->r.end - p);
  if (left >= 1 && *p <= 0x7f) { *out = *p; c->r.p = p + 1; return 0; }
  if (left >= 5 && *p == 0xce) {
    *out = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
    c->r.p = p + 5;
    return 0;
  }
  if (left >= 3 && *p == 0xcd) { *out = (uint32_t)p[1] << 8 | p[2]; c->r.p = p + 3; return 0; }
  if (left >= 2 && *p == 0xcc) { *out = p[1]; c->r.p = p + 2; return 0; }
  return read_token_slow(c, out);
}

/* SGLang's bigram tokens: n pairs [t_i, t_i+1] that must chain, kept as
 * the n+1 tokens t_0..t_n (Dynamo's reading of them). */
static int read_token_pairs(dctx *c, uint32_t n, uint32_t *out) {
  for (uint32_t i = 0; i < n; i++) {
    uint32_t two, a = 0, b = 0; /* set by read_token; 0 keeps every compiler sure of it */
    int rc = kvbm__mpr_array(&c->r, &two);
    if (rc) return rc == KVBM_EFORMAT ? fail_type(c, "a token pair [t, t+1]") : fail(c, rc, "");
    if (two != 2) return fail(c, KVBM_EFORMAT, "a token pair has other than 2 ids");
    if ((rc = read_token(c, &a)) || (rc = read_token(c, &b))) return rc;
    if (i == 0) out[0] = a;
    else if (out[i] != a) return fail(c, KVBM_EFORMAT, "token pairs do not chain");
    out[i + 1] = b;
  }
  return 0;
}

/* n flat token ids when the input surely holds them (5 bytes each at
 * most): no bounds check per token, each form one load. Stops at the
 * first id in another form (or none left); returns how many it read. */
static uint32_t read_tokens_fast(dctx *c, uint32_t n, uint32_t *out) {
  const uint8_t *p = c->r.p;
  if ((size_t)(c->r.end - p) / 5 < n) return 0;
  uint32_t i = 0;
  for (; i < n; i++) {
    uint8_t tag = *p;
    if (tag == 0xce) {
      uint32_t be;
      memcpy(&be, p + 1, 4);
      out[i] = __builtin_bswap32(be);
      p += 5;
    } else if (tag <= 0x7f) {
      out[i] = tag;
      p += 1;
    } else if (tag == 0xcd) {
      uint16_t be;
      memcpy(&be, p + 1, 2);
      out[i] = __builtin_bswap16(be);
      p += 3;
    } else if (tag == 0xcc) {
      out[i] = p[1];
      p += 2;
    } else {
      break;
    }
  }
  c->r.p = p;
  return i;
}

static int read_tokens(dctx *c, kvbm_event *ev, size_t *off) {
  uint32_t n;
  int rc = kvbm__mpr_array(&c->r, &n);
  if (rc) return rc == KVBM_EFORMAT ? fail_type(c, "an array of token ids") : fail(c, rc, "");
  kvbm_event_decoder *d = c->d;
  bool pairs = n && kvbm__mpr_peek(&c->r) == KVBM__MPR_ARRAY;
  RESERVE(d->t, d->t_cap, d->t_n + n + pairs);
  *off = d->t_n;
  uint32_t *out = d->t + d->t_n;
  if (pairs) {
    if ((rc = read_token_pairs(c, n, out))) return rc;
    n++;
  } else {
    for (uint32_t i = read_tokens_fast(c, n, out); i < n; i++)
      if ((rc = read_token(c, &out[i]))) return rc;
  }
  d->t_n += n;
  ev->num_tokens = n;
  ev->token_pairs = pairs;
  return 0;
}

static int read_u32(dctx *c, uint32_t *out) {
  if (kvbm__mpr_peek(&c->r) != KVBM__MPR_INT) return fail_type(c, "an integer");
  uint64_t u;
  bool neg;
  int rc = kvbm__mpr_int(&c->r, &u, &neg);
  if (rc) return fail(c, rc, "bad integer");
  if (neg || u > UINT32_MAX) return fail(c, KVBM_EFORMAT, "integer outside 0..2^32-1");
  *out = (uint32_t)u;
  return 0;
}

/* nil -> *has = false; an int64 otherwise. */
static int read_opt_i64(dctx *c, int64_t *out, bool *has) {
  if (kvbm__mpr_nil(&c->r)) { *has = false; return 0; }
  if (kvbm__mpr_peek(&c->r) != KVBM__MPR_INT) return fail_type(c, "an integer or nil");
  uint64_t u;
  bool neg;
  int rc = kvbm__mpr_int(&c->r, &u, &neg);
  if (rc) return fail(c, rc, "bad integer");
  if (!neg && u > INT64_MAX) return fail(c, KVBM_EFORMAT, "integer beyond int64");
  *out = (int64_t)u;
  *has = true;
  return 0;
}

/* A string (a key, a tag, a name; `want` says which for the message);
 * *from is where it began. These are short: a fixstr is read inline. */
static inline int read_str(dctx *c, const char *want, const uint8_t **from,
                           const uint8_t **k, size_t *kl) {
  const uint8_t *p = c->r.p;
  *from = p;
  *k = NULL;
  *kl = 0;
  if (p < c->r.end && (*p & 0xe0) == 0xa0 && (size_t)(c->r.end - p) > (size_t)(*p & 0x1f)) {
    *kl = *p & 0x1f;
    *k = p + 1;
    c->r.p = p + 1 + *kl;
    return 0;
  }
  if (kvbm__mpr_peek(&c->r) != KVBM__MPR_STR) return fail_type(c, want);
  int rc = kvbm__mpr_bytes(&c->r, false, k, kl);
  return rc ? fail(c, rc, "bad string") : 0;
}

/* Copies n bytes into the string arena (NUL-terminated); *off its place. */
static int put_s(dctx *c, const uint8_t *b, size_t n, size_t *off) {
  kvbm_event_decoder *d = c->d;
  RESERVE(d->s, d->s_cap, d->s_n + n + 1);
  if (n) memcpy(d->s + d->s_n, b, n);
  d->s[d->s_n + n] = '\0';
  *off = d->s_n;
  d->s_n += n + 1;
  return 0;
}

/* nil -> SIZE_MAX; a str is copied into the string arena, NUL-terminated. */
static int read_opt_str(dctx *c, size_t *off, const uint8_t **raw, size_t *rawlen) {
  if (kvbm__mpr_nil(&c->r)) { *off = SIZE_MAX; return 0; }
  const uint8_t *b;
  size_t n;
  const uint8_t *from;
  int rc = read_str(c, "a string or nil", &from, &b, &n);
  if (rc) return rc;
  /* Names reach C callers as NUL-terminated strings: an inner NUL would
   * silently cut them. (Names are short: a loop beats a call.) */
  bool nul = false;
  if (n < 16) {
    for (size_t i = 0; i < n; i++) nul |= b[i] == 0;
  } else {
    nul = memchr(b, 0, n) != NULL;
  }
  if (nul) return fail(c, KVBM_EFORMAT, "string contains a NUL byte");
  if (raw) { *raw = b; *rawlen = n; }
  return put_s(c, b, n, off);
}

/* One msgpack value kept as its bytes (extra_keys); nil is absent. */
static int read_raw(dctx *c, size_t *off, size_t *len) {
  if (kvbm__mpr_nil(&c->r)) { *off = SIZE_MAX; *len = 0; return 0; }
  const uint8_t *p = c->r.p;
  int rc = kvbm__mpr_skip(&c->r);
  if (rc) return fail(c, rc, "malformed value");
  *len = (size_t)(c->r.p - p);
  return put_s(c, p, *len, off);
}

/* Appends the key/value pair that started at `from` (the reader is past
 * the key) to the event's extras. */
static int keep_extra(dctx *c, const uint8_t *from, kvbm_event *ev, ev_off *o) {
  int rc = kvbm__mpr_skip(&c->r);
  if (rc) return fail(c, rc, "malformed value");
  size_t n = (size_t)(c->r.p - from);
  kvbm_event_decoder *d = c->d;
  RESERVE(d->x, d->x_cap, d->x_n + n);
  memcpy(d->x + d->x_n, from, n);
  if (o->extras == SIZE_MAX) o->extras = d->x_n;
  d->x_n += n;
  ev->extras_len += n;
  ev->num_extras++;
  return 0;
}

static int read_parent(dctx *c, kvbm_event *ev) {
  if (kvbm__mpr_nil(&c->r)) { ev->has_parent = false; return 0; }
  ev->has_parent = true;
  return read_hash(c, &ev->parent_hash);
}

/* o->mname for a medium whose wire text is exactly its name in the
 * static table (kvbm_medium_name): nothing copied, the pointer is the
 * table's (the same text; valid for longer than the arena would be). */
#define MNAME_STATIC(m) (SIZE_MAX - 1 - (size_t)(m))
#define MNAME_IS_STATIC(off) ((off) >= MNAME_STATIC(KVBM_MEDIUM_REMOTE) && (off) < SIZE_MAX)

/* "GPU" (vLLM's G1, nearly every event) and "CPU" as fixstrs, read at
 * once; anything else, or the same text in another encoding, goes the
 * general way. */
static bool read_medium_fast(dctx *c, kvbm_event *ev, ev_off *o) {
  const uint8_t *p = c->r.p;
  if (c->r.end - p < 4 || p[0] != 0xa3 || p[2] != 'P' || p[3] != 'U') return false;
  if (p[1] == 'G') ev->medium = KVBM_MEDIUM_GPU;
  else if (p[1] == 'C') ev->medium = KVBM_MEDIUM_CPU;
  else return false;
  o->mname = MNAME_STATIC(ev->medium);
  c->r.p = p + 4;
  return true;
}

static int read_medium(dctx *c, kvbm_event *ev, ev_off *o) {
  if (read_medium_fast(c, ev, o)) return 0;
  const uint8_t *raw = NULL;
  size_t n = 0;
  int rc = read_opt_str(c, &o->mname, &raw, &n);
  if (rc) return rc;
  ev->medium = o->mname == SIZE_MAX ? KVBM_MEDIUM_NONE
                                    : kvbm_medium_from_name((const char *)raw, n);
  return 0;
}

/* Positional index 7: vLLM's lora_name (string or nil), or SGLang's
 * BlockStoredMetadata map: its cache_salt, and any other key (session_id)
 * kept with the extras. */
static int read_slot7(dctx *c, kvbm_event *ev, ev_off *o) {
  if (kvbm__mpr_peek(&c->r) != KVBM__MPR_MAP) return read_opt_str(c, &o->lname, NULL, NULL);
  uint32_t n;
  int rc = kvbm__mpr_map(&c->r, &n);
  if (rc) return fail(c, rc, "bad map");
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *from, *k = NULL;
    size_t kl = 0;
    if ((rc = read_str(c, "a string key", &from, &k, &kl))) return rc;
    if (kl == 10 && !memcmp(k, "cache_salt", 10)) rc = read_opt_str(c, &o->salt, NULL, NULL);
    /* A key the map form names itself ("block_size", "type", ...) cannot be
     * carried: written back as an extra it would make a map with the key
     * twice. No engine sends one; the event is skipped (found by fuzz). */
    else if ((kl == 4 && !memcmp(k, "type", 4)) || key_field(k, kl) != F_EXTRA)
      rc = fail(c, KVBM_EFORMAT, "the metadata map has a key that names an event field");
    else rc = keep_extra(c, from, ev, o);
    if (rc) return rc;
  }
  return 0;
}

static int read_field(dctx *c, int f, kvbm_event *ev, ev_off *o) {
  c->field = kFieldName[f];
  switch (f) {
    case F_HASHES: return read_hashes(c, &o->h, &ev->num_block_hashes);
    case F_PARENT: return read_parent(c, ev);
    case F_TOKENS: return read_tokens(c, ev, &o->t);
    case F_BSIZE: return read_u32(c, &ev->block_size);
    case F_LORA: return read_opt_i64(c, &ev->lora_id, &ev->has_lora_id);
    case F_MEDIUM: return read_medium(c, ev, o);
    case F_LNAME: return read_opt_str(c, &o->lname, NULL, NULL);
    case F_EKEYS: return read_raw(c, &o->ekeys, &ev->extra_keys_len);
    case F_GROUP: return read_opt_i64(c, &ev->group_idx, &ev->has_group_idx);
    case F_KIND: return read_opt_str(c, &o->kind, NULL, NULL);
    case F_SWIN: return read_opt_i64(c, &ev->sliding_window, &ev->has_sliding_window);
    case F_LOCALITY: return read_opt_str(c, &o->loc, NULL, NULL);
    case F_OWNERSHIP: return read_opt_str(c, &o->own, NULL, NULL);
    case F_SALT: return read_opt_str(c, &o->salt, NULL, NULL);
    case F_SLOT7: return read_slot7(c, ev, o);
    default: {
      int rc = kvbm__mpr_skip(&c->r);
      return rc ? fail(c, rc, "malformed value") : 0;
    }
  }
}

static int tag_type(const uint8_t *s, size_t n, kvbm_event_type *t) {
  if (n == 11 && !memcmp(s, "BlockStored", 11)) *t = KVBM_EVENT_STORED;
  else if (n == 12 && !memcmp(s, "BlockRemoved", 12)) *t = KVBM_EVENT_REMOVED;
  else if (n == 16 && !memcmp(s, "AllBlocksCleared", 16)) *t = KVBM_EVENT_CLEARED;
  else return -1;
  return 0;
}

static int read_tag(dctx *c, kvbm_event *ev) {
  const uint8_t *s, *from;
  size_t n;
  int rc = read_str(c, "the event tag (a string)", &from, &s, &n);
  if (rc) return rc;
  if (tag_type(s, n, &ev->type)) {
    char msg[120];
    snprintf(msg, sizeof msg, "unknown event tag \"%.*s\"", (int)(n > 40 ? 40 : n), (const char *)s);
    return fail(c, KVBM_EFORMAT, msg);
  }
  return 0;
}

/* Positional field order after the tag, by event type (see the header). */
static const int kStoredOrder[] = {F_HASHES, F_PARENT, F_TOKENS, F_BSIZE, F_LORA, F_MEDIUM,
                                   F_SLOT7, F_EKEYS, F_GROUP, F_KIND, F_SWIN};
static const int kRemovedOrder[] = {F_HASHES, F_MEDIUM, F_GROUP};

static int read_positional(dctx *c, kvbm_event *ev, ev_off *o) {
  uint32_t n;
  int rc = kvbm__mpr_array(&c->r, &n);
  if (rc) return fail(c, rc, "bad array");
  if (n < 1) return fail(c, KVBM_EFORMAT, "empty event array (no tag)");
  rc = read_tag(c, ev);
  if (rc) return rc;
  const int *order = NULL;
  size_t known = 0, required = 0;
  if (ev->type == KVBM_EVENT_STORED) { order = kStoredOrder; known = 11; required = 4; }
  if (ev->type == KVBM_EVENT_REMOVED) { order = kRemovedOrder; known = 3; required = 1; }
  if (n - 1 < required) {
    char msg[96];
    snprintf(msg, sizeof msg, "%s has %u fields, needs at least %zu",
             kvbm_event_type_name(ev->type), n - 1, required);
    return fail(c, KVBM_EFORMAT, msg);
  }
  for (uint32_t i = 1; i < n; i++) {
    rc = read_field(c, i - 1 < known ? order[i - 1] : F_SKIP, ev, o);
    if (rc) return rc;
  }
  return 0;
}

/* Whether the bytes at the reader are `lit` (a key with its fixstr
 * header, or a key and the tag after it); if so the reader passes them.
 * `lit` is a literal, so the compare is a few loads. */
#define AT(c, lit)                                                          \
  ((size_t)((c)->r.end - (c)->r.p) >= sizeof(lit) - 1 &&                  \
   !memcmp((c)->r.p, (lit), sizeof(lit) - 1) && ((c)->r.p += sizeof(lit) - 1, true))

/* The keys vLLM writes, in its order (msgspec writes a struct's fields in
 * declaration order, the tag first): BlockStored's required ones, then
 * BlockRemoved's. A map event whose keys come so is read without looking
 * its keys up; from the first key that differs (an optional one, another
 * order, another sender) the general loop goes on. */
static uint32_t read_keys_in_order(dctx *c, kvbm_event *ev, ev_off *o, uint32_t n,
                                   unsigned *seen, int *rc) {
  uint32_t i = 0;
#define NEXT(lit, f, call)                                \
  if (i == n || !AT(c, lit)) return i;                    \
  c->field = kFieldName[f];                               \
  if ((*rc = (call))) return i;                           \
  *seen |= 1u << (f);                                     \
  i++
  if (n >= 2 && AT(c, "\xa4type\xab" "BlockStored")) {
    ev->type = KVBM_EVENT_STORED;
    i = 1;
    NEXT("\xac" "block_hashes", F_HASHES, read_hashes(c, &o->h, &ev->num_block_hashes));
    NEXT("\xb1" "parent_block_hash", F_PARENT, read_parent(c, ev));
    NEXT("\xa9" "token_ids", F_TOKENS, read_tokens(c, ev, &o->t));
    NEXT("\xaa" "block_size", F_BSIZE, read_u32(c, &ev->block_size));
    NEXT("\xa7" "lora_id", F_LORA, read_opt_i64(c, &ev->lora_id, &ev->has_lora_id));
    NEXT("\xa6" "medium", F_MEDIUM, read_medium(c, ev, o));
    NEXT("\xa9" "lora_name", F_LNAME, read_opt_str(c, &o->lname, NULL, NULL));
  } else if (n >= 2 && AT(c, "\xa4type\xac" "BlockRemoved")) {
    ev->type = KVBM_EVENT_REMOVED;
    i = 1;
    NEXT("\xac" "block_hashes", F_HASHES, read_hashes(c, &o->h, &ev->num_block_hashes));
    NEXT("\xa6" "medium", F_MEDIUM, read_medium(c, ev, o));
  }
#undef NEXT
  return i;
}

static int read_map_event(dctx *c, kvbm_event *ev, ev_off *o) {
  uint32_t n;
  int rc = kvbm__mpr_map(&c->r, &n);
  if (rc) return fail(c, rc, "bad map");
  unsigned seen = 0;
  uint32_t first = read_keys_in_order(c, ev, o, n, &seen, &rc);
  if (rc) return rc;
  bool have_type = first > 0;
  for (uint32_t i = first; i < n; i++) {
    const uint8_t *from, *k = NULL;
    size_t kl = 0;
    c->field = "key";
    if ((rc = read_str(c, "a string key", &from, &k, &kl))) return rc;
    if (kl == 4 && !memcmp(k, "type", 4)) {
      c->field = "type";
      rc = read_tag(c, ev);
      have_type = true;
    } else {
      int f = key_field(k, kl);
      seen |= 1u << f;
      rc = f == F_EXTRA ? keep_extra(c, from, ev, o) : read_field(c, f, ev, o);
    }
    if (rc) return rc;
  }
  c->field = NULL;
  if (!have_type) return fail(c, KVBM_EFORMAT, "event map has no \"type\"");
  unsigned need = 0;
  if (ev->type == KVBM_EVENT_STORED) need = 1u << F_HASHES | 1u << F_TOKENS | 1u << F_BSIZE;
  if (ev->type == KVBM_EVENT_REMOVED) need = 1u << F_HASHES;
  for (int f = 0; (need & ~seen) && f < F_NAMED; f++) {
    if ((need >> f & 1) && !(seen >> f & 1)) {
      c->field = kvbm_event_type_name(ev->type);
      char msg[80];
      snprintf(msg, sizeof msg, "missing field \"%s\"", kFieldName[f]);
      return fail(c, KVBM_EFORMAT, msg);
    }
  }
  return 0;
}

/* What an event of its type does not carry is dropped (the map form
 * could name any key on any event), so that a decoded event is what
 * encoding it writes. */
static void keep_own_fields(kvbm_event *ev, ev_off *o) {
  if (ev->type == KVBM_EVENT_STORED) return;
  if (ev->type == KVBM_EVENT_CLEARED) {
    *ev = (kvbm_event){.type = KVBM_EVENT_CLEARED};
    *o = kNoOff;
    return;
  }
  ev->has_parent = ev->has_lora_id = ev->token_pairs = ev->has_sliding_window = false;
  ev->num_tokens = ev->extra_keys_len = 0;
  ev->block_size = 0;
  o->t = o->lname = o->salt = o->kind = o->ekeys = SIZE_MAX;
}

static int read_event(dctx *c, kvbm_event *ev, ev_off *o) {
  c->field = "event";
  kvbm__mpr_kind k = kvbm__mpr_peek(&c->r);
  int rc;
  if (k == KVBM__MPR_ARRAY) rc = read_positional(c, ev, o);
  else if (k == KVBM__MPR_MAP) rc = read_map_event(c, ev, o);
  else return fail_type(c, "an event (array or map)");
  if (!rc) keep_own_fields(ev, o);
  return rc;
}

/* Reads the events array. A failed event is skipped whole when it is
 * well-formed msgpack (see the top of this file); otherwise its error is
 * the payload's. */
static int read_events(dctx *c, kvbm_event_batch *out) {
  uint32_t n;
  int rc = kvbm__mpr_array(&c->r, &n);
  if (rc) return rc == KVBM_EFORMAT ? fail_type(c, "the events array") : fail(c, rc, "the events array");
  kvbm_event_decoder *d = c->d;
  kvbm_error *caller = c->err;
  size_t kept = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (kept >= d->ev_cap) RESERVE(d->ev, d->ev_cap, kept + 1);
    if (kept >= d->off_cap) RESERVE(d->off, d->off_cap, kept + 1);
    kvbm_event *ev = &d->ev[kept];
    ev_off *o = &d->off[kept];
    memset(ev, 0, sizeof *ev);
    *o = kNoOff;
    c->idx = i;
    const uint8_t *start = c->r.p;
    size_t h0 = d->h_n, t0 = d->t_n, s0 = d->s_n, x0 = d->x_n;
    c->err = &d->ev_err;
    rc = read_event(c, ev, o);
    c->err = caller;
    if (rc == 0) {
      d->ev_n = ++kept;
      continue;
    }
    c->r.p = start;
    if (rc == KVBM_ENOMEM || kvbm__mpr_skip(&c->r)) { /* the payload's error */
      if (caller) *caller = d->ev_err;
      return rc;
    }
    d->h_n = h0, d->t_n = t0, d->s_n = s0, d->x_n = x0;
    if (!out->skipped++) snprintf(d->skip_reason, sizeof d->skip_reason, "%s", d->ev_err.msg);
  }
  c->field = NULL;
  return 0;
}

/* Turns the arena offsets into pointers, now that the arenas stopped moving. */
static void fix_pointers(kvbm_event_decoder *d) {
#define STR(off) ((off) == SIZE_MAX ? NULL : d->s + (off))
  for (size_t i = 0; i < d->ev_n; i++) {
    kvbm_event *ev = &d->ev[i];
    const ev_off *o = &d->off[i];
    ev->block_hashes = ev->num_block_hashes ? d->h + o->h : NULL;
    ev->token_ids = ev->num_tokens ? d->t + o->t : NULL;
    ev->medium_name = MNAME_IS_STATIC(o->mname) ? kvbm_medium_name(ev->medium) : STR(o->mname);
    ev->lora_name = STR(o->lname);
    ev->cache_salt = STR(o->salt);
    ev->kv_cache_spec_kind = STR(o->kind);
    ev->locality = STR(o->loc);
    ev->ownership = STR(o->own);
    ev->extra_keys = (const uint8_t *)STR(o->ekeys);
    ev->extras = o->extras == SIZE_MAX ? NULL : d->x + o->extras;
  }
#undef STR
}

static int read_dp_rank(dctx *c, kvbm_event_batch *out) {
  int64_t v;
  bool has;
  c->field = NULL;
  if (kvbm__mpr_nil(&c->r)) return 0;
  if (kvbm__mpr_peek(&c->r) != KVBM__MPR_INT) return fail_type(c, "dp_rank (an integer or nil)");
  int rc = read_opt_i64(c, &v, &has);
  if (rc) return rc;
  if (v < INT32_MIN || v > INT32_MAX) return fail(c, KVBM_EFORMAT, "dp_rank beyond 32 bits");
  out->dp_rank = (int32_t)v;
  out->has_dp_rank = true;
  return 0;
}

static int read_ts(dctx *c, double *ts) {
  kvbm__mpr_kind k = kvbm__mpr_peek(&c->r);
  if (k != KVBM__MPR_FLOAT && k != KVBM__MPR_INT) return fail_type(c, "the timestamp (a number)");
  int rc = kvbm__mpr_double(&c->r, ts);
  return rc ? fail(c, rc, "bad timestamp") : 0;
}

static int read_batch(dctx *c, kvbm_event_batch *out) {
  kvbm__mpr_kind k = kvbm__mpr_peek(&c->r);
  uint32_t n;
  int rc;
  if (k == KVBM__MPR_ARRAY) {
    rc = kvbm__mpr_array(&c->r, &n);
    if (rc) return fail(c, rc, "bad batch array");
    if (n < 2) return fail(c, KVBM_EFORMAT, "batch array has fewer than 2 elements [ts, events]");
    if ((rc = read_ts(c, &out->ts)) || (rc = read_events(c, out))) return rc;
    if (n >= 3 && (rc = read_dp_rank(c, out))) return rc;
    for (uint32_t i = 3; i < n; i++)
      if ((rc = kvbm__mpr_skip(&c->r))) return fail(c, rc, "malformed trailing batch field");
    return 0;
  }
  if (k == KVBM__MPR_MAP) {
    rc = kvbm__mpr_map(&c->r, &n);
    if (rc) return fail(c, rc, "bad batch map");
    bool have_ts = false, have_events = false;
    for (uint32_t i = 0; i < n; i++) {
      const uint8_t *key;
      size_t kl;
      c->field = NULL;
      if (kvbm__mpr_peek(&c->r) != KVBM__MPR_STR) return fail_type(c, "a string key in the batch map");
      if ((rc = kvbm__mpr_bytes(&c->r, false, &key, &kl))) return fail(c, rc, "bad key");
      if (kl == 2 && !memcmp(key, "ts", 2)) { rc = read_ts(c, &out->ts); have_ts = true; }
      else if (kl == 6 && !memcmp(key, "events", 6)) {
        /* a repeated "events" key replaces the earlier events */
        c->d->ev_n = 0;
        out->skipped = 0;
        rc = read_events(c, out);
        have_events = true;
      } else if (kl == 18 && !memcmp(key, "data_parallel_rank", 18)) rc = read_dp_rank(c, out);
      else if ((rc = kvbm__mpr_skip(&c->r))) rc = fail(c, rc, "malformed batch field");
      if (rc) return rc;
    }
    c->field = NULL;
    if (!have_ts || !have_events) return fail(c, KVBM_EFORMAT, "batch map lacks \"ts\" or \"events\"");
    return 0;
  }
  return fail_type(c, "a batch (array [ts, events, dp_rank] or map)");
}

int kvbm_event_decode(kvbm_event_decoder *dec, const void *data, size_t len,
                      uint64_t seq, kvbm_event_batch *out, kvbm_error *err) {
  if (!dec || !out || (!data && len))
    return kvbm_error_set(err, KVBM_EINVAL, "events: decode: NULL argument");
  dec->ev_n = dec->h_n = dec->t_n = dec->s_n = dec->x_n = 0;
  dec->skip_reason[0] = '\0';
  shrink_all(dec, len);
  memset(out, 0, sizeof *out);
  dctx c = {.r = {data, (const uint8_t *)data + len}, .d = dec, .err = err};
  if (len == 0) return kvbm_error_set(err, KVBM_ETRUNCATED, "events: decode: empty payload");
  int rc = read_batch(&c, out);
  if (rc) {
    dec->ev_n = 0;
    out->skipped = 0;
    return rc;
  }
  if (c.r.p != c.r.end) {
    dec->ev_n = 0;
    out->skipped = 0;
    return kvbm_error_set(err, KVBM_ETOOLONG, "events: decode: %zu bytes after the batch",
                          kvbm__mpr_left(&c.r));
  }
  fix_pointers(dec);
  out->seq = seq;
  out->events = dec->ev_n ? dec->ev : NULL;
  out->num_events = dec->ev_n;
  return KVBM_OK;
}
