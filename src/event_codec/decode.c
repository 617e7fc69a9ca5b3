/* SPDX-License-Identifier: Apache-2.0 */
/*
 * decode.c: KV event batches from the engines' msgpack payload (the
 * encoder is codec.c).
 *
 * The codec knows bytes only; sockets live in the events module. Decoding
 * uses the bounds-checked reader of common/msgpack.h (see there why not
 * msgpack-c) and writes into arenas the decoder keeps between calls:
 * events, hashes, tokens, strings (with extra_keys' raw bytes) and the raw
 * bytes of the fields kvbm does not name. While a payload is read the
 * events record offsets into the arenas (which may move as they grow);
 * the pointers are set from them at the end, unless every event was read
 * by the quick path and no arena moved. In steady state a decode
 * allocates nothing.
 *
 * Two readers. The general one reads any shape below, value by value,
 * and names what is wrong. The quick path (its section below says more)
 * reads the few byte layouts nearly every stream carries (vLLM's maps in
 * msgspec's key order, the positional arrays, the three-key remove) from
 * the bytes, and hands whatever else it meets to the general reader's
 * functions, so that it never decides otherwise; a subscriber decoding
 * vLLM's stream spends about half the instructions it did (issue 22,
 * docs/areas/events.md "Session 11: the subscriber").
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
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define KVBM__DEC_MIX4 1 /* tok_mix4: x86 only (SSSE3, chosen at run time) */
#include <tmmintrin.h>
#endif

#include "common/msgpack.h"
#include "common/vec.h"
#include "event_codec/fields.h"
#include "event_codec/internal.h"
#include "kvbm/event_codec.h"

static const char *const kFieldName[] = {
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window", "locality", "ownership", "cache_salt",
    "lora_name or metadata", "extra field", "field"};

/* ------------------------------------------------------------- decoding */

/* Unaligned loads in the machine's order. */
static inline uint64_t ld64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static inline uint16_t ld16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static inline uint32_t ld32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* Where an event's variable parts sit in the arenas while a payload is
 * read (the arenas may move); SIZE_MAX = none. */
typedef struct ev_off {
  size_t h, t, mname, lname, salt, kind, loc, own, ekeys, extras;
  bool plain; /* read by the quick path, all of it: only h and t are
               * offsets, every other pointer of the event is final (NULL
               * or a static medium name) and the rest above unset */
} ev_off;

static const ev_off kNoOff = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX,
                              SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, false};

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
  bool general_only;      /* tests: no quick path (kvbm__event_decoder_general) */
  bool all_plain;         /* every event of this payload read whole by the quick path */
  const char *static_name[KVBM_MEDIUM_OTHER + 1]; /* kvbm_medium_name's */
};

void kvbm__event_decoder_general(kvbm_event_decoder *dec, bool on) {
  if (dec) dec->general_only = on;
}

bool kvbm__event_decoder_plain(const kvbm_event_decoder *dec, size_t i) {
  return dec && i < dec->ev_n && dec->off[i].plain;
}

int kvbm_event_decoder_create(kvbm_event_decoder **out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "events: decoder: NULL out");
  kvbm_event_decoder *d = calloc(1, sizeof *d);
  if (!d) return kvbm_error_set(err, KVBM_ENOMEM, "events: no memory for a decoder");
  for (int m = 0; m <= KVBM_MEDIUM_OTHER; m++) d->static_name[m] = kvbm_medium_name((kvbm_medium)m);
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

/* Four ids of mixed widths a step (issue 22, docs/areas/events.md
 * "Session 13: the subscriber's token ids"). Ids uniform over a vocabulary
 * above 65536 (Llama-3's 128256, gpt-oss' 201088) are uint16 (0xcd + 2
 * bytes) or uint32 (0xce + 4 bytes) at random, so tok_fast's runs of one
 * width are four ids long about one time in eight, and one id a step
 * branches on a tag it mispredicts about half the time. Here the four
 * tags are found in one 16-byte load (they sit at offsets 0..15 whatever
 * the widths: the widths before each fix where it is, so the offsets are
 * followed in sequence, on two 16-bit masks, with no branch), the four
 * widths pick one of 16 layouts, and two byte shuffles of the (at most
 * 20) bytes gather the four ids, byte-swapped, into one 16-byte store.
 * Whatever is not four 0xcd/0xce tags (a fixint, 0xcc, a bad tag, fewer
 * than four ids left) goes back to tok_fast's scalar path unread, which
 * stays the reference: the ids read and where a bad tag stops the read
 * are the same. SSSE3 is chosen at run time (the build targets plain
 * x86-64), as the encoder's put_tokens_x4 does; the encoder's table
 * (kTok4) is its inverse and test_decode_diff.c proves the two against
 * each other. tok_fast calls it only where a run breaks on the other
 * width's tag, so that a run broken by a fixint or 0xcc (the few small
 * ids of a 32000 vocabulary) pays for no step that would fail; once in,
 * it stays while the tags are 0xcd/0xce. Its cost is the chain from one
 * step's p to the next (load, compare, the widths in sequence): ~29 ns
 * a 16-block event's block against the scalar path's 54-70 ns, whose
 * width branches mispredict on a stream they have not seen
 * (bench/events_bisect/dectok.c, V 128256 and 201088). Where tok_fast
 * enters it moves the runs' code: entered here (in the runs' step) K=16
 * is unchanged at V 0 and 32000 and K=1 ~1.4 ns (8%) slower; entered
 * from one place after the runs' loops (5665819) K=1 is unchanged and
 * K=16 ~0.5-1.2 ns slower; vLLM sends K=16, so here. */
typedef struct tok4_step {
  const uint8_t *p;
  uint32_t n; /* ids written */
} tok4_step;

#ifdef KVBM__DEC_MIX4
typedef struct tok4_layout {
  _Alignas(16) uint8_t lo[16]; /* output byte i from input byte lo[i] of p[0..15]; X = 0 */
  uint8_t hi[16]; /* or from byte hi[i] of p[4..19] (bytes 16..19) */
  uint16_t tags;  /* the bits of the four tags' offsets (the 4th id's own width does not move them) */
  uint8_t len;    /* the four ids' bytes */
} tok4_layout;

#define X 0x80
/* Entry b0 | b1 << 1 | b2 << 2 | b3 << 3, bi = 1 when id i is a uint32.
 * A uint16 at offset q gives the output bytes q+2, q+1, 0, 0; a uint32 gives
 * q+4, q+3, q+2, q+1 (big-endian in, little-endian out). */
static const tok4_layout kTok4Dec[16] = {
    {{2, 1, X, X, 5, 4, X, X, 8, 7, X, X, 11, 10, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x0249, 12}, /* u16 u16 u16 u16 */
    {{4, 3, 2, 1, 7, 6, X, X, 10, 9, X, X, 13, 12, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x0921, 14}, /* u32 u16 u16 u16 */
    {{2, 1, X, X, 7, 6, 5, 4, 10, 9, X, X, 13, 12, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x0909, 14}, /* u16 u32 u16 u16 */
    {{4, 3, 2, 1, 9, 8, 7, 6, 12, 11, X, X, 15, 14, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x2421, 16}, /* u32 u32 u16 u16 */
    {{2, 1, X, X, 5, 4, X, X, 10, 9, 8, 7, 13, 12, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x0849, 14}, /* u16 u16 u32 u16 */
    {{4, 3, 2, 1, 7, 6, X, X, 12, 11, 10, 9, 15, 14, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x2121, 16}, /* u32 u16 u32 u16 */
    {{2, 1, X, X, 7, 6, 5, 4, 12, 11, 10, 9, 15, 14, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x2109, 16}, /* u16 u32 u32 u16 */
    {{4, 3, 2, 1, 9, 8, 7, 6, 14, 13, 12, 11, X, X, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, 13, 12, X, X}, 0x8421, 18}, /* u32 u32 u32 u16 */
    {{2, 1, X, X, 5, 4, X, X, 8, 7, X, X, 13, 12, 11, 10},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x0249, 14}, /* u16 u16 u16 u32 */
    {{4, 3, 2, 1, 7, 6, X, X, 10, 9, X, X, 15, 14, 13, 12},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x0921, 16}, /* u32 u16 u16 u32 */
    {{2, 1, X, X, 7, 6, 5, 4, 10, 9, X, X, 15, 14, 13, 12},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x0909, 16}, /* u16 u32 u16 u32 */
    {{4, 3, 2, 1, 9, 8, 7, 6, 12, 11, X, X, X, X, 15, 14},
     {X, X, X, X, X, X, X, X, X, X, X, X, 13, 12, X, X}, 0x2421, 18}, /* u32 u32 u16 u32 */
    {{2, 1, X, X, 5, 4, X, X, 10, 9, 8, 7, 15, 14, 13, 12},
     {X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X}, 0x0849, 16}, /* u16 u16 u32 u32 */
    {{4, 3, 2, 1, 7, 6, X, X, 12, 11, 10, 9, X, X, 15, 14},
     {X, X, X, X, X, X, X, X, X, X, X, X, 13, 12, X, X}, 0x2121, 18}, /* u32 u16 u32 u32 */
    {{2, 1, X, X, 7, 6, 5, 4, 12, 11, 10, 9, X, X, 15, 14},
     {X, X, X, X, X, X, X, X, X, X, X, X, 13, 12, X, X}, 0x2109, 18}, /* u16 u32 u32 u32 */
    {{4, 3, 2, 1, 9, 8, 7, 6, 14, 13, 12, 11, X, X, X, X},
     {X, X, X, X, X, X, X, X, X, X, X, X, 15, 14, 13, 12}, 0x8421, 20}, /* u32 u32 u32 u32 */
};
#undef X

/* Reads four ids a step from p while at least four are left before oe4
 * and the next four tags are each 0xcd or 0xce; the caller proved 5 bytes
 * an id readable, so the 20 bytes of four ids are. */
__attribute__((target("ssse3"), noinline)) static tok4_step tok_mix4(const uint8_t *p, uint32_t *o,
                                                                     uint32_t quads) {
  const __m128i cd = _mm_set1_epi8((char)0xcd), ce = _mm_set1_epi8((char)0xce);
  uint32_t n = 0;
  for (; quads; quads--, n += 4) {
    __m128i lo = _mm_loadu_si128((const __m128i *)p);
    unsigned m32 = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(lo, ce));
    unsigned any = m32 | (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(lo, cd));
    /* the widths in sequence: each tag's offset follows from the ones before */
    unsigned b0 = m32 & 1, q1 = 3 + 2 * b0;
    unsigned b1 = m32 >> q1 & 1, q2 = q1 + 3 + 2 * b1;
    unsigned b2 = m32 >> q2 & 1, q3 = q2 + 3 + 2 * b2;
    unsigned b3 = m32 >> q3 & 1;
    const tok4_layout *l = &kTok4Dec[b0 | b1 << 1 | b2 << 2 | b3 << 3];
    if ((any & l->tags) != l->tags) break; /* one of the four is no 0xcd/0xce */
    __m128i hi = _mm_loadu_si128((const __m128i *)(p + 4));
    __m128i v = _mm_or_si128(_mm_shuffle_epi8(lo, _mm_load_si128((const __m128i *)l->lo)),
                             _mm_shuffle_epi8(hi, _mm_load_si128((const __m128i *)l->hi)));
    _mm_storeu_si128((__m128i *)(o + n), v);
    p += q3 + 3 + 2 * b3; /* l->len, but no load on the chain from one step's p to the next */
  }
  return (tok4_step){p, n};
}
#endif /* KVBM__DEC_MIX4 */

/* n flat token ids at p when the input surely holds them (5 bytes each at
 * most, so no id read can pass the end: the caller checks): no bounds
 * check per token, each form one load, the widest first (real
 * vocabularies put most ids at or above 256: uint16 and uint32), a
 * pointer for the output so that the loop keeps one counter, and a run
 * of one width read four ids a step (three tag tests, four loads and
 * stores, one step of each pointer; callgrind, deccost.sh: ~6.5
 * instructions an id in a run against ~9.5 one id a step) or one a step
 * near its end. Stops at the first id in another form (or none left);
 * returns where it stopped and sets *got to the ids read. Shared by the
 * general reader, the quick path and the templates. */
static inline __attribute__((always_inline)) const uint8_t *tok_fast(const uint8_t *p, uint32_t n,
                                                                      uint32_t *out, uint32_t *got) {
  uint32_t *o = out, *const oe = out + n;
  uint32_t *const oe4 = n >= 4 ? oe - 3 : out; /* o < oe4: four ids left at least */
#define BE16(q) (uint32_t) __builtin_bswap16(ld16(q))
  /* a run of one width broken: four mixed ids a step where the CPU can */
#ifdef KVBM__DEC_MIX4
#define TOK_MIX4() \
  (__builtin_cpu_supports("ssse3") ? tok_mix4(p, o, (uint32_t)(oe - o) / 4) : (tok4_step){p, 0})
#else /* elsewhere (not x86) the scalar path only */
#define TOK_MIX4() ((tok4_step){p, 0})
#endif
  tok4_step s4;
  while (o != oe) {
    uint8_t tag = *p;
    if (tag == 0xce) { /* a run of them */
      do {
        if (o < oe4 && p[5] == 0xce && p[10] == 0xce && p[15] == 0xce) {
          o[0] = __builtin_bswap32(ld32(p + 1));
          o[1] = __builtin_bswap32(ld32(p + 6));
          o[2] = __builtin_bswap32(ld32(p + 11));
          o[3] = __builtin_bswap32(ld32(p + 16));
          o += 4, p += 20;
        } else if (o < oe4 && p[5] == 0xcd && (s4 = TOK_MIX4()).n) { /* the width changes */
          o += s4.n, p = s4.p;
        } else {
          *o++ = __builtin_bswap32(ld32(p + 1));
          p += 5;
        }
      } while (o != oe && *p == 0xce);
    } else if (tag == 0xcd) {
      do {
        /* p[3] lies within this id's 5 bytes: tested before the count */
        if (p[3] == 0xcd && o < oe4 && p[6] == 0xcd && p[9] == 0xcd) {
          o[0] = BE16(p + 1);
          o[1] = BE16(p + 4);
          o[2] = BE16(p + 7);
          o[3] = BE16(p + 10);
          o += 4, p += 12;
        } else if (o < oe4 && p[3] == 0xce && (s4 = TOK_MIX4()).n) { /* the width changes */
          o += s4.n, p = s4.p;
        } else {
          *o++ = BE16(p + 1);
          p += 3;
        }
      } while (o != oe && *p == 0xcd);
    } else if (tag <= 0x7f) {
      *o++ = tag;
      p += 1;
    } else if (tag == 0xcc) {
      *o++ = p[1];
      p += 2;
    } else {
      break;
    }
  }
#undef BE16
#undef TOK_MIX4
  *got = (uint32_t)(o - out);
  return p;
}

static inline __attribute__((always_inline)) uint32_t read_tokens_fast(dctx *c, uint32_t n,
                                                                        uint32_t *out) {
  uint32_t got;
  if ((size_t)(c->r.end - c->r.p) / 5 < n) return 0;
  c->r.p = tok_fast(c->r.p, n, out, &got);
  return got;
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
    else if ((kl == 4 && !memcmp(k, "type", 4)) || kvbm__event_key_field(k, kl) != F_EXTRA)
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

/* Keys i..n-1 of a map event, any order, any key: the general loop. */
static int map_keys(dctx *c, kvbm_event *ev, ev_off *o, uint32_t i, uint32_t n, unsigned *seen,
                    bool *have_type) {
  for (; i < n; i++) {
    const uint8_t *from, *k = NULL;
    size_t kl = 0;
    int rc;
    c->field = "key";
    if ((rc = read_str(c, "a string key", &from, &k, &kl))) return rc;
    if (kl == 4 && !memcmp(k, "type", 4)) {
      c->field = "type";
      rc = read_tag(c, ev);
      *have_type = true;
    } else {
      int f = kvbm__event_key_field(k, kl);
      *seen |= 1u << f;
      rc = f == F_EXTRA ? keep_extra(c, from, ev, o) : read_field(c, f, ev, o);
    }
    if (rc) return rc;
  }
  return 0;
}

/* After the keys: a tag, and the fields its type requires. The message
 * for what is missing; map_required below is the check. */
static int map_missing(dctx *c, const kvbm_event *ev, unsigned seen, bool have_type,
                       unsigned need) {
  if (!have_type) return fail(c, KVBM_EFORMAT, "event map has no \"type\"");
  for (int f = 0; f < F_NAMED; f++) {
    if ((need >> f & 1) && !(seen >> f & 1)) {
      c->field = kvbm_event_type_name(ev->type);
      char msg[80];
      snprintf(msg, sizeof msg, "missing field \"%s\"", kFieldName[f]);
      return fail(c, KVBM_EFORMAT, msg);
    }
  }
  return 0;
}

static inline int map_required(dctx *c, const kvbm_event *ev, unsigned seen, bool have_type) {
  c->field = NULL;
  unsigned need = 0;
  if (ev->type == KVBM_EVENT_STORED) need = 1u << F_HASHES | 1u << F_TOKENS | 1u << F_BSIZE;
  if (ev->type == KVBM_EVENT_REMOVED) need = 1u << F_HASHES;
  if (have_type && !(need & ~seen)) return 0;
  return map_missing(c, ev, seen, have_type, need);
}

static int read_map_event(dctx *c, kvbm_event *ev, ev_off *o) {
  uint32_t n;
  int rc = kvbm__mpr_map(&c->r, &n);
  if (rc) return fail(c, rc, "bad map");
  unsigned seen = 0;
  uint32_t first = read_keys_in_order(c, ev, o, n, &seen, &rc);
  if (rc) return rc;
  bool have_type = first > 0;
  if (first < n && (rc = map_keys(c, ev, o, first, n, &seen, &have_type))) return rc;
  return map_required(c, ev, seen, have_type);
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

/* ------------------------------------------------------------ quick path */

/* Nearly every event on a stream is one of a few byte layouts: vLLM's
 * tagged maps with the keys in msgspec's declaration order (the tag, then
 * block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
 * lora_name), the positional arrays of older vLLM and SGLang, and the
 * three-key remove. The quick path reads those from the bytes: the
 * constant runs (a map's header, tag and first key; each later key) are
 * compared as a few 8-byte words, each value's usual encoding (a 0xcf
 * hash, a fixint block size, nil for the absent LoRA, a fixstr "GPU") is
 * taken inline, and an event it read whole needs no offsets but its
 * hashes' and tokens' (ev_off.plain): nothing to set up before it and
 * two pointers to fix after it.
 *
 * It never decides anything the general reader would decide otherwise.
 * It declines an event only at its first bytes (nothing read yet: the
 * general reader starts there), and anything past those it does not take
 * inline goes to the general reader's own function for that value, or,
 * from the first key out of order or unknown, to the general loop over
 * the keys left (map_keys), with the same field names in c->field; so a
 * value decodes to the same event and a bad one fails with the same
 * message. tests/event_codec/test_decode_diff.c holds the two paths to
 * that (kvbm__event_decoder_general turns this one off), on every shape
 * the engines send and on mutated ones; the fuzz target does too. */

#define QUICK_NO 1 /* not a layout the quick path knows: the general reader */


/* Whether the n bytes at p (all there) are the literal s, 4 <= n <= 32:
 * overlapping word compares, folded to constants when s is a literal;
 * from 17 bytes on two overlapping 16-byte compares (SSE2: two loads, two
 * byte compares against the literal in memory, one mask; ~8 instructions
 * where three or four words took ~12-17). */
static inline bool same(const uint8_t *p, const char *s, size_t n) {
  const uint8_t *l = (const uint8_t *)s;
#if defined(__SSE2__)
  if (n > 16) {
    __m128i a = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)p),
                               _mm_loadu_si128((const __m128i *)(const void *)l));
    __m128i b = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + n - 16)),
                               _mm_loadu_si128((const __m128i *)(const void *)(l + n - 16)));
    return _mm_movemask_epi8(_mm_and_si128(a, b)) == 0xffff;
  }
#endif
  if (n < 8) return ((ld32(p) ^ ld32(l)) | (ld32(p + n - 4) ^ ld32(l + n - 4))) == 0;
  uint64_t x = (ld64(p) ^ ld64(l)) | (ld64(p + n - 8) ^ ld64(l + n - 8));
  if (n > 16) x |= ld64(p + 8) ^ ld64(l + 8);
  if (n > 24) x |= ld64(p + 16) ^ ld64(l + 16);
  return x == 0;
}

/* An event zeroed with 16-byte stores: memset of its 216 bytes became
 * `rep stosq`, 27 iterations, the largest single cost of a quick event. */
static inline void zero_event(kvbm_event *ev) {
#if defined(__SSE2__)
  _Static_assert(sizeof(kvbm_event) <= 256, "zero_event stores 16 x 16 bytes at most");
  __m128i z = _mm_setzero_si128();
  char *p = (char *)ev;
  /* written out: a loop of these is turned back into the memset */
#define Z(i) if (((i) + 1) * 16 <= sizeof *ev) _mm_storeu_si128((__m128i *)(void *)(p + (i) * 16), z)
  Z(0); Z(1); Z(2); Z(3); Z(4); Z(5); Z(6); Z(7);
  Z(8); Z(9); Z(10); Z(11); Z(12); Z(13); Z(14); Z(15);
#undef Z
  if (sizeof *ev % 16) memset(p + sizeof *ev / 16 * 16, 0, sizeof *ev % 16);
#else
  memset(ev, 0, sizeof *ev);
#endif
}

/* A literal `same` can compare (4 to 32 bytes), or no compile. */
#define LIT_LEN(s) (sizeof(char[sizeof(s) - 1 >= 4 && sizeof(s) - 1 <= 32 ? 1 : -1]) * (sizeof(s) - 1))

/* The reader is at the literal s (a key with its fixstr header): passes it. */
#define QLIT(c, s)                                                                       \
  ((size_t)((c)->r.end - (c)->r.p) >= LIT_LEN(s) && same((c)->r.p, (s), LIT_LEN(s)) && \
   ((c)->r.p += LIT_LEN(s), true))

/* The event leaves the quick path's bookkeeping for the general one: all
 * offsets as read_event keeps them (the medium's static name included). */
static void to_general(kvbm_event *ev, ev_off *o) {
  if (!o->plain) return;
  size_t h = o->h, t = o->t;
  *o = kNoOff;
  o->h = h;
  o->t = t;
  if (ev->medium_name) o->mname = MNAME_STATIC(ev->medium);
}

/* A fixarray or array16 header whose count the bytes left can hold; 0
 * (the reader not moved) for any other header, which the general
 * function then reads (and refuses as it would). */
static inline size_t q_array(const dctx *c, uint32_t *n) {
  const uint8_t *p = c->r.p;
  size_t left = (size_t)(c->r.end - p);
  if (left >= 1 && (*p & 0xf0) == 0x90) {
    *n = *p & 0x0f;
    return *n <= left - 1 ? 1 : 0;
  }
  if (left >= 3 && *p == 0xdc) {
    *n = (uint32_t)p[1] << 8 | p[2];
    return *n <= left - 3 ? 3 : 0;
  }
  return 0;
}

/* Hashes and tokens are most of an event: inlined where each layout reads them. */
#define QINLINE static inline __attribute__((always_inline))

QINLINE int q_hashes(dctx *c, kvbm_event *ev, ev_off *o) {
  uint32_t n;
  size_t hdr = q_array(c, &n);
  kvbm_event_decoder *d = c->d;
  if (!hdr) {
    c->field = kFieldName[F_HASHES]; /* only the general functions name it */
    int rc = read_hashes(c, &o->h, &ev->num_block_hashes);
    if (!rc && ev->num_block_hashes) ev->block_hashes = d->h + o->h;
    return rc;
  }
  if (d->h_cap - d->h_n <= n) RESERVE(d->h, d->h_cap, d->h_n + n);
  uint64_t *out = d->h + d->h_n;
  const uint8_t *p = c->r.p + hdr, *e = c->r.end;
  uint32_t i = 0;
  if ((size_t)(e - p) / 9 >= n) /* room for n full hashes: no bounds check each */
    for (; i < n && *p == 0xcf; i++, p += 9) out[i] = __builtin_bswap64(ld64(p + 1));
  for (; i < n; i++) {
    if (e - p >= 9 && *p == 0xcf) {
      out[i] = __builtin_bswap64(ld64(p + 1));
      p += 9;
      continue;
    }
    c->r.p = p;
    c->field = kFieldName[F_HASHES];
    int rc = read_hash(c, &out[i]);
    if (rc) return rc;
    p = c->r.p;
  }
  c->r.p = p;
  o->h = d->h_n;
  d->h_n += n;
  ev->num_block_hashes = n;
  if (n) ev->block_hashes = out; /* final unless the arena moves (fix_pointers) */
  return 0;
}

static inline int q_parent(dctx *c, kvbm_event *ev) {
  const uint8_t *p = c->r.p;
  if (c->r.end - p >= 9 && *p == 0xcf) {
    ev->parent_hash = __builtin_bswap64(ld64(p + 1));
    ev->has_parent = true;
    c->r.p = p + 9;
    return 0;
  }
  c->field = kFieldName[F_PARENT];
  return read_parent(c, ev);
}

QINLINE int q_tokens(dctx *c, kvbm_event *ev, ev_off *o) {
  uint32_t n;
  size_t hdr = q_array(c, &n);
  /* token pairs (an array first) are the general function's */
  kvbm_event_decoder *d = c->d;
  if (!hdr || (n && ((c->r.p[hdr] & 0xf0) == 0x90 || (c->r.p[hdr] & 0xfe) == 0xdc))) {
    c->field = kFieldName[F_TOKENS];
    int rc = read_tokens(c, ev, &o->t);
    if (!rc && ev->num_tokens) ev->token_ids = d->t + o->t;
    return rc;
  }
  if (d->t_cap - d->t_n <= n) RESERVE(d->t, d->t_cap, d->t_n + n);
  uint32_t *out = d->t + d->t_n;
  c->r.p += hdr;
  for (uint32_t i = read_tokens_fast(c, n, out); i < n; i++) {
    c->field = kFieldName[F_TOKENS];
    int rc = read_token(c, &out[i]);
    if (rc) return rc;
  }
  o->t = d->t_n;
  d->t_n += n;
  ev->num_tokens = n;
  if (n) ev->token_ids = out;
  return 0;
}

static inline int q_u32(dctx *c, uint32_t *out) {
  const uint8_t *p = c->r.p;
  if (p < c->r.end && *p <= 0x7f) {
    *out = *p;
    c->r.p = p + 1;
    return 0;
  }
  c->field = kFieldName[F_BSIZE];
  return read_u32(c, out);
}

/* lora_id, group_idx: nil inline. */
static inline int q_opt_i64(dctx *c, int f, int64_t *out, bool *has) {
  if (kvbm__mpr_nil(&c->r)) return 0; /* *has is false already */
  c->field = kFieldName[f];
  return read_opt_i64(c, out, has);
}

static inline int q_medium(dctx *c, kvbm_event *ev, ev_off *o) {
  const uint8_t *p = c->r.p;
  if (c->r.end - p >= 4 && p[0] == 0xa3 && p[2] == 'P' && p[3] == 'U' &&
      (p[1] == 'G' || p[1] == 'C')) {
    ev->medium = p[1] == 'G' ? KVBM_MEDIUM_GPU : KVBM_MEDIUM_CPU;
    ev->medium_name = c->d->static_name[ev->medium];
    c->r.p = p + 4;
    return 0;
  }
  if (kvbm__mpr_nil(&c->r)) return 0; /* NONE, no name: as it is */
  c->field = kFieldName[F_MEDIUM];
  to_general(ev, o);
  return read_medium(c, ev, o);
}

/* lora_name (map) or positional index 7: nil inline. */
static inline int q_slot(dctx *c, int f, kvbm_event *ev, ev_off *o) {
  if (kvbm__mpr_nil(&c->r)) return 0;
  c->field = kFieldName[f];
  to_general(ev, o);
  return f == F_SLOT7 ? read_slot7(c, ev, o) : read_opt_str(c, &o->lname, NULL, NULL);
}

/* A store's usual last three keys and values (vLLM without LoRA, on the
 * device): compared at once, and the medium set. */
#define GPU_TAIL "\xa7" "lora_id" "\xc0" "\xa6" "medium" "\xa3" "GPU" "\xa9" "lora_name" "\xc0"
static inline void gpu(const dctx *c, kvbm_event *ev) {
  ev->medium = KVBM_MEDIUM_GPU;
  ev->medium_name = c->d->static_name[KVBM_MEDIUM_GPU];
}

/* Which fields a map event read in vLLM's order has seen after i keys. */
static unsigned seen_after(const int *order, uint32_t i) {
  unsigned seen = 0;
  for (uint32_t k = 1; k < i; k++) seen |= 1u << order[k - 1];
  return seen;
}

static const int kStoredMapOrder[] = {F_HASHES, F_PARENT, F_TOKENS, F_BSIZE,
                                      F_LORA,   F_MEDIUM, F_LNAME};

/* The keys past the ones read in order (i of n): the general loop, then
 * the required fields. */
static int q_map_rest(dctx *c, kvbm_event *ev, ev_off *o, uint32_t i, uint32_t n,
                      const int *order) {
  unsigned seen = seen_after(order, i);
  bool have_type = true;
  int rc;
  if (i < n) {
    to_general(ev, o);
    if ((rc = map_keys(c, ev, o, i, n, &seen, &have_type))) return rc;
  }
  if ((rc = map_required(c, ev, seen, have_type))) return rc;
  /* a later "type" key may have made it another type (found by fuzz) */
  keep_own_fields(ev, o);
  return 0;
}

/* A map event past "type", its tag and the "block_hashes" key. */
static int q_map_stored(dctx *c, kvbm_event *ev, ev_off *o, uint32_t n) {
  int rc;
  uint32_t i = 2;
#define QNEXT(lit, call)                   \
  do {                                     \
    if (i == n || !QLIT(c, lit)) goto rest; \
    if ((rc = (call))) return rc;          \
    i++;                                   \
  } while (0)
  if ((rc = q_hashes(c, ev, o))) return rc;
  QNEXT("\xb1" "parent_block_hash", q_parent(c, ev));
  QNEXT("\xa9" "token_ids", q_tokens(c, ev, o));
  QNEXT("\xaa" "block_size", q_u32(c, &ev->block_size));
  if (n - i >= 3 && QLIT(c, GPU_TAIL)) { /* no LoRA, "GPU": the usual rest at once */
    gpu(c, ev);
    i += 3;
    goto rest;
  }
  QNEXT("\xa7" "lora_id", q_opt_i64(c, F_LORA, &ev->lora_id, &ev->has_lora_id));
  QNEXT("\xa6" "medium", q_medium(c, ev, o));
  QNEXT("\xa9" "lora_name", q_slot(c, F_LNAME, ev, o));
rest:
  if (i == n && i >= 5) return 0; /* all read, hashes .. block_size among them */
  return q_map_rest(c, ev, o, i, n, kStoredMapOrder);
}

static const int kRemovedMapOrder[] = {F_HASHES, F_MEDIUM};

static int q_map_removed(dctx *c, kvbm_event *ev, ev_off *o, uint32_t n) {
  int rc;
  uint32_t i = 2;
  if ((rc = q_hashes(c, ev, o))) return rc;
  if (n - i >= 1 && QLIT(c, "\xa6" "medium" "\xa3" "GPU")) {
    gpu(c, ev);
    i++;
    goto rest;
  }
  QNEXT("\xa6" "medium", q_medium(c, ev, o));
rest:
  if (i == n) return 0; /* all read (plain), hashes among them */
  return q_map_rest(c, ev, o, i, n, kRemovedMapOrder);
}
#undef QNEXT

/* A positional store past its tag: m fields (4 required, checked). */
static int q_pos_stored(dctx *c, kvbm_event *ev, ev_off *o, uint32_t m) {
  int rc;
  if ((rc = q_hashes(c, ev, o)) || (rc = q_parent(c, ev)) || (rc = q_tokens(c, ev, o)) ||
      (rc = q_u32(c, &ev->block_size)))
    return rc;
  if (m > 6 && QLIT(c, "\xc0" "\xa3" "GPU" "\xc0")) { /* no LoRA id, "GPU", no name */
    gpu(c, ev);
  } else {
    if (m > 4 && (rc = q_opt_i64(c, F_LORA, &ev->lora_id, &ev->has_lora_id))) return rc;
    if (m > 5 && (rc = q_medium(c, ev, o))) return rc;
    if (m > 6 && (rc = q_slot(c, F_SLOT7, ev, o))) return rc;
  }
  for (uint32_t k = 7; k < m; k++) {
    to_general(ev, o);
    if ((rc = read_field(c, k < 11 ? kStoredOrder[k] : F_SKIP, ev, o))) return rc;
  }
  return 0;
}

/* A positional remove past its tag: m >= 1 fields. */
static int q_pos_removed(dctx *c, kvbm_event *ev, ev_off *o, uint32_t m) {
  int rc;
  if ((rc = q_hashes(c, ev, o))) return rc;
  if (m > 1 && QLIT(c, "\xa3" "GPU")) gpu(c, ev);
  else if (m > 1 && (rc = q_medium(c, ev, o))) return rc;
  if (m > 2 && (rc = q_opt_i64(c, F_GROUP, &ev->group_idx, &ev->has_group_idx))) return rc;
  for (uint32_t k = 3; k < m; k++)
    if ((rc = read_field(c, F_SKIP, ev, o))) return rc;
  if (!o->plain) keep_own_fields(ev, o);
  return 0;
}

/* The first bytes of each layout after the map or array header: the tag
 * (with its "type" key) and, in a map, the "block_hashes" key. */
#define MAP_STORED "\xa4" "type" "\xab" "BlockStored" "\xac" "block_hashes"
#define MAP_REMOVED "\xa4" "type" "\xac" "BlockRemoved" "\xac" "block_hashes"
#define MAP_CLEARED "\xa4" "type" "\xb0" "AllBlocksCleared"
#define POS_STORED "\xab" "BlockStored"
#define POS_REMOVED "\xac" "BlockRemoved"
#define POS_CLEARED "\xb0" "AllBlocksCleared"

/* One event by the quick path, or QUICK_NO (the reader not moved) when its
 * first bytes are none of the layouts above. */
static int read_quick(dctx *c, kvbm_event *ev, ev_off *o) {
  const uint8_t *p = c->r.p;
  size_t left = (size_t)(c->r.end - p);
  if (left < 2) return QUICK_NO;
  uint8_t head = p[0];
  kvbm_event_type type;
  int form; /* 1 map, 0 positional */
  size_t skip;
#define HEAD_IS(lit) (left > LIT_LEN(lit) && same(p + 1, (lit), LIT_LEN(lit)) && \
                      (skip = LIT_LEN(lit) + 1, true))
  if (head >= 0x82 && head <= 0x8f && HEAD_IS(MAP_STORED)) {
    type = KVBM_EVENT_STORED, form = 1;
  } else if (head >= 0x82 && head <= 0x8f && HEAD_IS(MAP_REMOVED)) {
    type = KVBM_EVENT_REMOVED, form = 1;
  } else if (head >= 0x95 && head <= 0x9f && HEAD_IS(POS_STORED)) {
    type = KVBM_EVENT_STORED, form = 0;
  } else if (head >= 0x92 && head <= 0x9f && HEAD_IS(POS_REMOVED)) {
    type = KVBM_EVENT_REMOVED, form = 0;
  } else if ((head == 0x81 && HEAD_IS(MAP_CLEARED)) || (head == 0x91 && HEAD_IS(POS_CLEARED))) {
    zero_event(ev);
    ev->type = KVBM_EVENT_CLEARED;
    o->h = o->t = 0;
    o->plain = true;
    c->r.p = p + skip;
    return 0;
  } else {
    return QUICK_NO;
  }
#undef HEAD_IS
  uint32_t n = head & 0x0f;
  /* the count the bytes left cannot hold: the general reader says so */
  if ((size_t)n * (form ? 2 : 1) > left - 1) return QUICK_NO;
  zero_event(ev);
  ev->type = type;
  o->h = o->t = 0;
  o->plain = true;
  c->r.p = p + skip;
  if (form)
    return type == KVBM_EVENT_STORED ? q_map_stored(c, ev, o, n) : q_map_removed(c, ev, o, n);
  return type == KVBM_EVENT_STORED ? q_pos_stored(c, ev, o, n - 1) : q_pos_removed(c, ev, o, n - 1);
}

/* ------------------------------------------------------------- templates */

/* The layouts kvbm's publisher and vLLM write for nearly every event,
 * matched whole: a map store of exactly vLLM's eight keys in msgspec's
 * order with no LoRA on "GPU" or "CPU", its three-key remove, and the positional
 * store (8 fields) and remove (3) of the same values. Each is a few
 * constant byte runs (map keys, the tag, the tail of nil LoRA id,
 * "GPU" or "CPU", nil LoRA name) compared as words against literals (`same`),
 * with the variable parts between them: an array header, 0xcf hashes,
 * a nil or 0xcf parent, token ids (tok_fast), a fixint block size.
 *
 * Why beside the quick path: the quick path keeps its cursor and arena
 * counts in the decoding context and sets up each event's rollback
 * marks, since it may hand any value to the general reader halfway.
 * A template never hands over halfway: it reads into the arenas past
 * their counts, with the cursor, the counts and the capacities in
 * locals (registers), and commits the event only when every byte
 * matched; at the first byte that differs (or an arena without room)
 * it declines with nothing kept, and the quick path reads the event
 * from its first byte. So a template decides nothing the general
 * reader would decide otherwise: what it takes is a valid event of one
 * fixed shape, read as the general reader reads it (test_decode_diff
 * and the fuzz target compare the two), and what it declines costs the
 * bytes it compared. Callgrind per block event, K = 1 map, decoder
 * alone: docs/areas/events.md "Session 12: the subscriber". */

typedef struct tcur {
  const uint8_t *end;
  uint64_t *h, *hp, *he; /* the hash arena: its base, the next slot, its end */
  uint32_t *t, *tp, *te; /* the token arena, the same */
  const char *const *names; /* kvbm_medium_name's, by medium */
} tcur;

#define TINLINE static inline __attribute__((always_inline))

/* An array header (fixarray or array16) at p, 3 bytes readable: its
 * count, and the byte after it; NULL for any other header. */
TINLINE const uint8_t *t_array(const uint8_t *p, uint32_t *n) {
  if ((*p & 0xf0) == 0x90) {
    *n = *p & 0x0f;
    return p + 1;
  }
  if (*p != 0xdc) return NULL;
  *n = (uint32_t)p[1] << 8 | p[2];
  return p + 3;
}

/* The block hashes at p (3 bytes readable): an array of 0xcf hashes
 * into the arena past hn (not yet counted); NULL if another form or no
 * room. */
TINLINE const uint8_t *t_hashes(const tcur *t, const uint8_t *p, uint32_t *count) {
  uint32_t n;
  if (*p == 0x91 && t->end - p >= 10 && p[1] == 0xcf && t->he > t->hp) { /* one: K = 1 */
    *t->hp = __builtin_bswap64(ld64(p + 2));
    *count = 1;
    return p + 10;
  }
  if (!(p = t_array(p, &n))) return NULL;
  /* n < 2^16 (the header's count): 9 * n does not wrap */
  if ((size_t)(t->end - p) < (size_t)n * 9 || (size_t)(t->he - t->hp) < n) return NULL;
  for (uint64_t *o = t->hp, *oe = o + n; o != oe; o++, p += 9) {
    if (*p != 0xcf) return NULL;
    *o = __builtin_bswap64(ld64(p + 1));
  }
  *count = n;
  return p;
}

/* Token ids at p (3 bytes readable), an array of flat ids (no pairs)
 * that the input holds at 5 bytes an id; NULL otherwise, or an id in a
 * form tok_fast does not take, or no room. */
TINLINE const uint8_t *t_tokens(const tcur *t, const uint8_t *p, uint32_t *count) {
  uint32_t n, got;
  if (!(p = t_array(p, &n))) return NULL;
  if ((size_t)(t->end - p) < (size_t)n * 5 || (size_t)(t->te - t->tp) < n) return NULL;
  p = tok_fast(p, n, t->tp, &got);
  *count = n;
  return got == n ? p : NULL;
}

/* The parent hash at p (9 bytes readable: nil or 0xcf). */
TINLINE const uint8_t *t_parent(const uint8_t *p, kvbm_event *ev) {
  if (*p == 0xc0) return p + 1;
  if (*p != 0xcf) return NULL;
  ev->has_parent = true;
  ev->parent_hash = __builtin_bswap64(ld64(p + 1));
  return p + 1 + 8;
}

/* Bytes left at p: at least n, or the template declines. */
#define T_NEED(p, n) \
  if ((size_t)(t->end - (p)) < (size_t)(n)) return NULL

#define T_MAP_STORED "\xa4" "type" "\xab" "BlockStored" "\xac" "block_hashes"
#define T_MAP_REMOVED "\xa4" "type" "\xac" "BlockRemoved" "\xac" "block_hashes"
#define T_PARENT "\xb1" "parent_block_hash"
#define T_TOKENS "\xa9" "token_ids"
#define T_BSIZE "\xaa" "block_size"
#define T_POS_STORED "\xab" "BlockStored"
#define T_POS_REMOVED "\xac" "BlockRemoved"
#define T_POS_TAIL "\xc0" "\xa3" "GPU" "\xc0" /* lora_id nil, "GPU", lora_name nil */
#define T_MAP_GPU "\xa6" "medium" "\xa3" "GPU"
/* the same with "CPU" (vLLM's offloaded blocks), tried when "GPU" is not there */
#define T_CPU_TAIL "\xa7" "lora_id" "\xc0" "\xa6" "medium" "\xa3" "CPU" "\xa9" "lora_name" "\xc0"
#define T_POS_CPU_TAIL "\xc0" "\xa3" "CPU" "\xc0"
#define T_MAP_CPU "\xa6" "medium" "\xa3" "CPU"

/* A store past its head: hashes, [key] parent, [key] tokens, [key]
 * block size (a fixint), then the tail literal; `map` says whether keys
 * come between. */
TINLINE const uint8_t *t_stored(tcur *t, const uint8_t *p, kvbm_event *ev, ev_off *o, bool map) {
  uint32_t nh, nt;
  if (!(p = t_hashes(t, p, &nh))) return NULL;
  /* the parent's key and value (at most 9 bytes), the tokens' key and
   * array header: bytes every store of this layout has after its hashes */
  T_NEED(p, (map ? LIT_LEN(T_PARENT) + LIT_LEN(T_TOKENS) : 0) + 9 + 3);
  if (map) {
    if (!same(p, T_PARENT, LIT_LEN(T_PARENT))) return NULL;
    p += LIT_LEN(T_PARENT);
  }
  if (!(p = t_parent(p, ev))) return NULL;
  if (map) {
    if (!same(p, T_TOKENS, LIT_LEN(T_TOKENS))) return NULL;
    p += LIT_LEN(T_TOKENS);
  }
  if (!(p = t_tokens(t, p, &nt))) return NULL;
  if (map) {
    T_NEED(p, LIT_LEN(T_BSIZE) + 1 + LIT_LEN(GPU_TAIL));
    if (!same(p, T_BSIZE, LIT_LEN(T_BSIZE))) return NULL;
    p += LIT_LEN(T_BSIZE);
  } else {
    T_NEED(p, 1 + LIT_LEN(T_POS_TAIL));
  }
  if (*p > 0x7f) return NULL;
  ev->block_size = *p++;
  if (map ? same(p, GPU_TAIL, LIT_LEN(GPU_TAIL)) : same(p, T_POS_TAIL, LIT_LEN(T_POS_TAIL)))
    ev->medium = KVBM_MEDIUM_GPU;
  else if (map ? same(p, T_CPU_TAIL, LIT_LEN(T_CPU_TAIL))
               : same(p, T_POS_CPU_TAIL, LIT_LEN(T_POS_CPU_TAIL)))
    ev->medium = KVBM_MEDIUM_CPU;
  else
    return NULL;
  p += map ? LIT_LEN(GPU_TAIL) : LIT_LEN(T_POS_TAIL);
  ev->type = KVBM_EVENT_STORED;
  ev->num_block_hashes = nh;
  if (nh) ev->block_hashes = t->hp;
  ev->num_tokens = nt;
  if (nt) ev->token_ids = t->tp;
  o->t = (size_t)(t->tp - t->t);
  t->tp += nt;
  o->h = (size_t)(t->hp - t->h);
  t->hp += nh;
  return p;
}

/* A remove past its head: hashes, then "GPU" (with its key in a map). */
TINLINE const uint8_t *t_removed(tcur *t, const uint8_t *p, kvbm_event *ev, ev_off *o, bool map) {
  uint32_t nh;
  if (!(p = t_hashes(t, p, &nh))) return NULL;
  if (map) {
    T_NEED(p, LIT_LEN(T_MAP_GPU));
    if (same(p, T_MAP_GPU, LIT_LEN(T_MAP_GPU))) ev->medium = KVBM_MEDIUM_GPU;
    else if (same(p, T_MAP_CPU, LIT_LEN(T_MAP_CPU))) ev->medium = KVBM_MEDIUM_CPU;
    else return NULL;
    p += LIT_LEN(T_MAP_GPU);
  } else {
    T_NEED(p, 4);
    if (ld32(p) == ld32((const uint8_t *)"\xa3" "GPU")) ev->medium = KVBM_MEDIUM_GPU;
    else if (ld32(p) == ld32((const uint8_t *)"\xa3" "CPU")) ev->medium = KVBM_MEDIUM_CPU;
    else return NULL;
    p += 4;
  }
  ev->type = KVBM_EVENT_REMOVED;
  ev->num_block_hashes = nh;
  if (nh) ev->block_hashes = t->hp;
  o->t = 0;
  o->h = (size_t)(t->hp - t->h);
  t->hp += nh;
  return p;
}

/* One event at p by a template: the byte after it, with *ev and *o set
 * and the arena counts in t advanced; or NULL (nothing kept: *ev may
 * hold some values, which the next reader zeroes). */
TINLINE const uint8_t *t_event(tcur *t, const uint8_t *p, kvbm_event *ev, ev_off *o) {
  /* the longest head and the hashes' array header (3 bytes): every
   * layout but a short positional remove at a payload's end has them (that
   * one goes the quick way) */
  T_NEED(p, 1 + LIT_LEN(T_MAP_REMOVED) + 3);
  uint8_t head = *p;
  const uint8_t *q;
  zero_event(ev);
  if (head == 0x88 && same(p + 1, T_MAP_STORED, LIT_LEN(T_MAP_STORED)))
    q = t_stored(t, p + 1 + LIT_LEN(T_MAP_STORED), ev, o, true);
  else if (head == 0x83 && same(p + 1, T_MAP_REMOVED, LIT_LEN(T_MAP_REMOVED)))
    q = t_removed(t, p + 1 + LIT_LEN(T_MAP_REMOVED), ev, o, true);
  else if (head == 0x98 && same(p + 1, T_POS_STORED, LIT_LEN(T_POS_STORED)))
    q = t_stored(t, p + 1 + LIT_LEN(T_POS_STORED), ev, o, false);
  else if (head == 0x93 && same(p + 1, T_POS_REMOVED, LIT_LEN(T_POS_REMOVED)))
    q = t_removed(t, p + 1 + LIT_LEN(T_POS_REMOVED), ev, o, false);
  else
    return NULL;
  if (!q) return NULL;
  ev->medium_name = t->names[ev->medium];
  o->plain = true;
  return q;
}
#undef T_NEED

/* Events i.. of n by the templates, as long as they match and the event
 * arrays have room: the cursor, the arena counts and the capacities in
 * locals, written back once. Returns the index of the first event not
 * read (n when all were). */
static uint32_t read_templates(dctx *c, uint32_t i, uint32_t n, size_t *kept) {
  kvbm_event_decoder *d = c->d;
  /* arrays and arenas not allocated yet are the quick path's to grow */
  if (!d->ev || !d->off || !d->h || !d->t) return i;
  tcur t = {c->r.end, d->h, d->h + d->h_n, d->h + d->h_cap, d->t, d->t + d->t_n,
            d->t + d->t_cap, d->static_name};
  size_t k = *kept, cap = d->ev_cap < d->off_cap ? d->ev_cap : d->off_cap;
  size_t todo = n - i < cap - k ? n - i : cap - k;
  kvbm_event *ev = d->ev + k, *const ee = ev + todo;
  ev_off *o = d->off + k;
  const uint8_t *p = c->r.p;
  for (; ev != ee; ev++, o++) {
    const uint8_t *q = t_event(&t, p, ev, o);
    if (!q) break;
    p = q;
  }
  size_t done = (size_t)(ev - (d->ev + k));
  c->r.p = p;
  d->h_n = (size_t)(t.hp - t.h);
  d->t_n = (size_t)(t.tp - t.t);
  d->ev_n = *kept = k + done;
  return i + (uint32_t)done;
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
    /* the usual layouts first, as many in a row as come */
    if (!d->general_only && (i = read_templates(c, i, n, &kept)) == n) break;
    if (kept >= d->ev_cap) RESERVE(d->ev, d->ev_cap, kept + 1);
    if (kept >= d->off_cap) RESERVE(d->off, d->off_cap, kept + 1);
    kvbm_event *ev = &d->ev[kept];
    ev_off *o = &d->off[kept];
    c->idx = i;
    const uint8_t *start = c->r.p;
    size_t h0 = d->h_n, t0 = d->t_n, s0 = d->s_n, x0 = d->x_n;
    c->err = &d->ev_err;
    rc = d->general_only ? QUICK_NO : read_quick(c, ev, o);
    if (rc == QUICK_NO) {
      memset(ev, 0, sizeof *ev);
      *o = kNoOff;
      rc = read_event(c, ev, o);
    }
    c->err = caller;
    if (rc == 0) {
      d->all_plain &= o->plain;
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
    if (o->plain) continue; /* its other pointers are final */
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
  dec->all_plain = true;
  uintptr_t h_base = (uintptr_t)dec->h, t_base = (uintptr_t)dec->t;
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
  /* events read whole by the quick path point into the arenas already;
   * only when one moved since (or another event needs it) are the
   * pointers set from the offsets */
  if (!dec->all_plain || (uintptr_t)dec->h != h_base || (uintptr_t)dec->t != t_base)
    fix_pointers(dec);
  out->seq = seq;
  out->events = dec->ev_n ? dec->ev : NULL;
  out->num_events = dec->ev_n;
  return KVBM_OK;
}
