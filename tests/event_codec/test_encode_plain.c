/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_encode_plain.c: the plain event's template encoder
 * (kvbm__event_put_plain, what the publisher writes for a plain event)
 * against the general encoder (kvbm__event_put, itself held to msgpack-c
 * and the engines' decoders by test_codec.c) over random events.
 *
 * test_codec.c's test_plain_same_bytes walks a fixed grid; this draws
 * 40,000 events from a seeded stream so that the fields' widths combine
 * freely: every msgpack width of a hash, a parent, a token id, the block
 * size and the LoRA id (negative ones too, at each signed width), with
 * and without a parent or LoRA id, every medium, one to 40 blocks (one
 * most often, as a pool link publishes), stores with and without tokens,
 * removes (whose token fields the wire drops), both forms, signed hashes
 * on and off, and token ids of one width (a vocabulary's ids mostly are:
 * the encoder writes four such a step) with a stray one of another width
 * now and then. For each: the same bytes and length, within
 * kvbm__event_plain_bound, nothing written at or past that bound (the
 * templates' fixed-size copies write a little past the event's end), and
 * the bytes are one msgpack value, as msgpack-c reads it.
 */
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

static uint64_t rnd(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

/* An unsigned value of a random msgpack width: fixint, uint8, uint16,
 * uint32 or uint64, often at a width's edge. */
static uint64_t any_width(uint64_t *s, int max_class) {
  static const uint64_t lo[] = {0, 128, 256, 65536, 1ull << 32};
  static const uint64_t hi[] = {127, 255, 65535, 0xffffffffull, ~0ull};
  int c = (int)(rnd(s) % (uint64_t)(max_class + 1));
  switch (rnd(s) % 4) {
    case 0: return lo[c];
    case 1: return hi[c];
    default: return lo[c] + rnd(s) % (hi[c] - lo[c] + (c < 4));
  }
}

/* A LoRA id: any width, either sign. */
static int64_t any_signed(uint64_t *s) {
  static const int64_t neg[] = {-1, -32, -33, -128, -129, -32768, -32769, INT32_MIN,
                                (int64_t)INT32_MIN - 1, INT64_MIN};
  if (rnd(s) % 2) return neg[rnd(s) % 10];
  return (int64_t)(any_width(s, 4) >> (rnd(s) % 2)); /* up to INT64_MAX */
}

/* A hash: mostly a full 64-bit value (as real hashes are), else any width. */
static uint64_t any_hash(uint64_t *s) { return rnd(s) % 4 ? rnd(s) : any_width(s, 4); }

static void test_random_plain_same_bytes(void **st) {
  (void)st;
  enum { N = 40000, MAXB = 40, CAP = 8192 };
  static uint64_t h[MAXB];
  static uint32_t t[16 * MAXB];
  static uint8_t wa[CAP], wb[CAP];
  uint64_t s = 0x9e3779b97f4a7c15ull;
  size_t one_block = 0, stores = 0, wide = 0, narrow = 0, wide_ids = 0, narrow_ids = 0;
  for (int i = 0; i < N; i++) {
    size_t nb = rnd(&s) % 3 ? 1 : 1 + rnd(&s) % MAXB;
    for (size_t j = 0; j < nb; j++) h[j] = any_hash(&s);
    size_t nt = rnd(&s) % 8 == 0 ? rnd(&s) % (16 * nb + 1) : 16 * nb;
    int tok_class = (int)(rnd(&s) % 4) + 1; /* ids up to uint16 .. uint32 */
    /* half the events have ids of one width, as a vocabulary's mostly
     * are (all >= 65536, or all in [256, 65536)): the encoder's four-a-
     * step path; now and then one id of another width among them */
    int one_width = rnd(&s) % 2 ? 2 + (int)(rnd(&s) % 2) : -1;
    for (size_t j = 0; j < nt; j++) {
      if (one_width < 0 || rnd(&s) % 64 == 0) {
        t[j] = (uint32_t)any_width(&s, tok_class > 3 ? 3 : tok_class);
      } else {
        static const uint32_t lo[] = {0, 128, 256, 65536}, hi[] = {127, 255, 65535, 0xffffffffu};
        uint32_t l = lo[one_width], w = hi[one_width] - l;
        t[j] = rnd(&s) % 8 == 0 ? (rnd(&s) % 2 ? l : hi[one_width]) : l + (uint32_t)(rnd(&s) % ((uint64_t)w + 1));
      }
    }
    kvbm_event_encoder_config ec = {.form = rnd(&s) % 2 ? KVBM_FORM_MAP : KVBM_FORM_POSITIONAL,
                                    .signed_hashes = rnd(&s) % 4 == 0};
    kvbm_event ev = {.type = rnd(&s) % 3 ? KVBM_EVENT_STORED : KVBM_EVENT_REMOVED,
                     .block_hashes = h, .num_block_hashes = nb,
                     .token_ids = nt ? t : NULL, .num_tokens = nt,
                     .block_size = rnd(&s) % 2 ? 16 : (uint32_t)any_width(&s, 3),
                     .medium = (kvbm_medium)(rnd(&s) % KVBM_MEDIUM_OTHER)};
    if (ev.block_size == 0) ev.block_size = 1;
    if (rnd(&s) % 4) ev.has_parent = true, ev.parent_hash = any_hash(&s);
    if (rnd(&s) % 4 == 0) ev.has_lora_id = true, ev.lora_id = any_signed(&s);
    kvbm_event full = ev;
    if (ev.type == KVBM_EVENT_REMOVED) full.token_ids = NULL, full.num_tokens = 0;
    assert_int_equal(kvbm_event_check(&full, &ec, NULL), KVBM_OK);

    size_t bound = kvbm__event_plain_bound(ev.num_block_hashes, ev.num_tokens);
    assert_true(bound <= CAP);
    memset(wa, 0xab, CAP);
    size_t la = (size_t)(kvbm__event_put_plain(wa, &ev, &ec) - wa);
    size_t lb = (size_t)(kvbm__event_put(wb, &full, &ec) - wb);
    assert_int_equal(la, lb);
    assert_memory_equal(wa, wb, la);
    assert_true(la <= bound);
    for (size_t j = bound; j < CAP; j++) assert_int_equal(wa[j], 0xab);

    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&u, (const char *)wa, la, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, la);
    assert_int_equal(u.data.type, ec.form == KVBM_FORM_MAP ? MSGPACK_OBJECT_MAP : MSGPACK_OBJECT_ARRAY);
    msgpack_unpacked_destroy(&u);

    one_block += nb == 1;
    stores += ev.type == KVBM_EVENT_STORED;
    wide_ids += one_width == 3 && ev.type == KVBM_EVENT_STORED && nt >= 4;
    narrow_ids += one_width == 2 && ev.type == KVBM_EVENT_STORED && nt >= 4;
    wide += ev.block_hashes[0] > 0xffffffffull;
    narrow += ev.block_hashes[0] <= 0xffffffffull;
  }
  /* the draw covers what it claims to: one-block events, stores, both
   * kinds of hash */
  assert_true(one_block > N / 2 && one_block < N);
  assert_true(stores > N / 2 && stores < N);
  assert_true(wide > N / 2 && narrow > N / 10);
  /* and stores whose ids are of one width (uint32, uint16) */
  assert_true(wide_ids > N / 10 && narrow_ids > N / 10);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_plain_same_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
