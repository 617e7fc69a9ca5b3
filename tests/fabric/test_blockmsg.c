/* SPDX-License-Identifier: Apache-2.0 */
/* test_blockmsg.c: the block message codec: round trip, a flipped byte
 * anywhere in the body caught by the frame's BLAKE3, every truncation and
 * every malformed envelope refused with its own error; a sender's kept
 * checksum framed without hashing, and a stale one refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "fabric/fabric_util.h"
#include "kvbm/fabric.h"

#define NT 16
#define BODY 3000

static uint8_t g_body[BODY];
static uint32_t g_tokens[NT];

static size_t encode(uint8_t *out, size_t cap) {
  test_pattern(g_body, BODY, 3);
  for (uint32_t i = 0; i < NT; i++) g_tokens[i] = 1000 + i;
  kvbm_block_msg m = {.seq_hash = 0x1122334455667788ull, .parent_hash = 42, .salt_hash = 7, .has_parent = 1,
                      .num_tokens = NT, .tokens = g_tokens, .tier = KVBM_TIER_G2,
                      .layout_id = 0xA1B2C3D4E5F60718ull, .phase = KVBM_PHASE_OUTPUT_CRITICAL, .body = g_body, .body_len = BODY};
  size_t len = 0;
  assert_int_equal(kvbm_block_msg_encode(&m, out, cap, &len, NULL), KVBM_OK);
  assert_int_equal(len, kvbm_block_msg_size(NT, BODY));
  return len;
}

static void test_roundtrip(void **state) {
  (void)state;
  uint8_t buf[4000];
  size_t len = encode(buf, sizeof buf);
  uint32_t toks[NT];
  kvbm_block_msg m;
  kvbm_error e;
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY, toks, &m, &e), KVBM_OK);
  assert_int_equal(m.seq_hash, 0x1122334455667788ull);
  assert_int_equal(m.parent_hash, 42);
  assert_int_equal(m.salt_hash, 7);
  assert_true(m.has_parent);
  assert_int_equal(m.num_tokens, NT);
  assert_memory_equal(m.tokens, g_tokens, sizeof g_tokens);
  assert_int_equal(m.tier, KVBM_TIER_G2);
  assert_int_equal(m.phase, KVBM_PHASE_OUTPUT_CRITICAL);
  assert_int_equal(m.layout_id, 0xA1B2C3D4E5F60718ull);
  assert_int_equal(buf[40], 0x18); /* little-endian at byte 40 */
  assert_int_equal(buf[36], KVBM_TIER_G2);                        /* the tier, in the envelope */
  assert_int_equal(buf[52 + 4 * NT + 12], KVBM_PHASE_OUTPUT_CRITICAL); /* the phase, in the frame */
  assert_int_equal(m.body_len, BODY);
  assert_ptr_equal(m.body, buf + len - BODY);
  assert_memory_equal(m.body, g_body, BODY);
  /* limits */
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT - 1, BODY, toks, &m, &e), KVBM_ETOOLONG);
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY - 1, toks, &m, &e), KVBM_ETOOLONG);
  /* encoder refusals */
  size_t out;
  kvbm_block_msg bad = {.num_tokens = 1, .tokens = NULL};
  assert_int_equal(kvbm_block_msg_encode(&bad, buf, sizeof buf, &out, &e), KVBM_EINVAL);
  kvbm_block_msg ok = {.tier = KVBM_TIER_G1, .body = g_body, .body_len = BODY};
  assert_int_equal(kvbm_block_msg_encode(&ok, buf, 100, &out, &e), KVBM_ENOSPC);
  ok.tier = (kvbm_tier)4;
  assert_int_equal(kvbm_block_msg_encode(&ok, buf, sizeof buf, &out, &e), KVBM_ETIER);
  ok.tier = KVBM_TIER_G4;
  ok.phase = (kvbm_frame_phase)3;
  assert_int_equal(kvbm_block_msg_encode(&ok, buf, sizeof buf, &out, &e), KVBM_EPHASE);
  ok.phase = KVBM_PHASE_THINK_COMPLETE;
  assert_int_equal(kvbm_block_msg_encode(&ok, buf, sizeof buf, &out, &e), KVBM_OK);
}

static void test_corruption(void **state) {
  (void)state;
  uint8_t buf[4000], copy[4000];
  size_t len = encode(buf, sizeof buf);
  uint32_t toks[NT];
  kvbm_block_msg m;
  kvbm_error e;
  /* a flipped bit anywhere in the body */
  for (size_t i = len - BODY; i < len; i += 97) {
    memcpy(copy, buf, len);
    copy[i] ^= 0x01;
    int rc = kvbm_block_msg_decode(copy, len, NT, BODY, toks, &m, &e);
    if (rc != KVBM_ECHECKSUM) fail_msg("flip at %zu: %s", i, kvbm_status_name(rc));
  }
  /* every truncation */
  for (size_t n = 0; n < len; n++) {
    int rc = kvbm_block_msg_decode(buf, n, NT, BODY, toks, &m, &e);
    if (rc != KVBM_ETRUNCATED) fail_msg("truncated to %zu: %s (%s)", n, kvbm_status_name(rc), e.msg);
  }
  memcpy(copy, buf, len);
  copy[len] = 0;
  assert_int_equal(kvbm_block_msg_decode(copy, len + 1, NT, BODY, toks, &m, &e), KVBM_ETOOLONG);
  struct {
    size_t off;
    uint8_t val;
    int want;
  } cases[] = {
      {0, 'X', KVBM_EMAGIC},   {4, 1, KVBM_EVERSION}, {4, 3, KVBM_EVERSION}, {32, 4, KVBM_EPADDING},
      {36, 4, KVBM_ETIER},     {36, 0xFF, KVBM_ETIER}, /* storage tier above G4 */
      {37, 1, KVBM_EPADDING},  {39, 0x80, KVBM_EPADDING},
      {48, 200, KVBM_ETOOLONG}, /* 200 tokens > limit */
      {52 + 4 * NT, 'X', KVBM_EMAGIC},   /* the frame's magic */
      {52 + 4 * NT + 4, 4, KVBM_EVERSION}, {52 + 4 * NT + 12, 3, KVBM_EPHASE},
      {52 + 4 * NT + 4, 2, KVBM_EAUTH},    {52 + 4 * NT + 4, 3, KVBM_EAUTH}, /* keyed, sealed: no key here */
      {52 + 4 * NT + 12, 9, KVBM_EPHASE},  /* what a v1 sender wrote for G4 was 3 */
      {52 + 4 * NT + 13, 1, KVBM_EPADDING}, {52 + 4 * NT + 20, 0xAA, KVBM_ECHECKSUM},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    memcpy(copy, buf, len);
    copy[cases[i].off] = cases[i].val;
    int rc = kvbm_block_msg_decode(copy, len, NT, BODY, toks, &m, &e);
    if (rc != cases[i].want) fail_msg("case %zu: %s (%s)", i, kvbm_status_name(rc), e.msg);
  }
  assert_int_equal(kvbm_block_msg_decode(NULL, 0, NT, BODY, toks, &m, &e), KVBM_ETRUNCATED);
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY, NULL, &m, &e), KVBM_EINVAL);
}

/* A placed message: the header travels, the bytes went ahead into block
 * block_id; the receiver checks them there against the header. */
static void test_placed(void **state) {
  (void)state;
  test_pattern(g_body, BODY, 9);
  for (uint32_t i = 0; i < NT; i++) g_tokens[i] = 7 * i;
  kvbm_block_msg m = {.seq_hash = 99, .num_tokens = NT, .tokens = g_tokens, .tier = KVBM_TIER_G1,
                      .phase = KVBM_PHASE_THINK_ACTIVE, .body = g_body, .body_len = BODY, .placed = 1, .block_id = 12345};
  uint8_t buf[512];
  size_t len;
  assert_int_equal(kvbm_block_msg_encode(&m, buf, sizeof buf, &len, NULL), KVBM_OK);
  assert_int_equal(len, kvbm_block_msg_placed_size(NT));
  assert_int_equal(len, 52 + 4 * NT + 8 + 32);
  uint32_t toks[NT];
  kvbm_block_msg d;
  kvbm_error e;
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY, toks, &d, &e), KVBM_OK);
  assert_true(d.placed);
  assert_int_equal(d.block_id, 12345);
  assert_int_equal(d.tier, KVBM_TIER_G1);
  assert_int_equal(d.phase, KVBM_PHASE_THINK_ACTIVE);
  assert_null(d.body);
  assert_int_equal(d.body_len, BODY);
  assert_int_equal(d.seq_hash, 99);
  assert_false(d.has_parent);
  assert_memory_equal(toks, g_tokens, sizeof toks);
  /* the bytes, where they landed: intact, then with one byte flipped */
  assert_int_equal(kvbm_frame_verify_body(&d.frame, g_body, BODY, &e), KVBM_OK);
  g_body[BODY / 3] ^= 0x40;
  assert_int_equal(kvbm_frame_verify_body(&d.frame, g_body, BODY, &e), KVBM_ECHECKSUM);
  /* limits, truncation, trailing bytes */
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY - 1, toks, &d, &e), KVBM_ETOOLONG);
  for (size_t n = 0; n < len; n++) {
    int rc = kvbm_block_msg_decode(buf, n, NT, BODY, toks, &d, &e);
    if (rc != KVBM_ETRUNCATED) fail_msg("placed, truncated to %zu: %s", n, kvbm_status_name(rc));
  }
  buf[len] = 0;
  assert_int_equal(kvbm_block_msg_decode(buf, len + 1, NT, BODY, toks, &d, &e), KVBM_ETOOLONG);
  assert_int_equal(kvbm_block_msg_encode(&m, buf, len - 1, &len, &e), KVBM_ENOSPC);

  /* placed, the checksum computed by the caller (body NULL): the same bytes */
  g_body[BODY / 3] ^= 0x40; /* back to what the first message framed */
  uint8_t again[512];
  size_t len2;
  kvbm_block_msg pre = m;
  pre.body = NULL;
  kvbm_blake3_hash(g_body, BODY, pre.frame.checksum, 16);
  assert_int_equal(kvbm_block_msg_encode(&pre, again, sizeof again, &len2, &e), KVBM_OK);
  assert_int_equal(kvbm_block_msg_encode(&m, buf, sizeof buf, &len, &e), KVBM_OK);
  assert_int_equal(len2, len);
  assert_memory_equal(again, buf, len);
  /* not placed, a body is still required */
  pre.placed = 0;
  assert_int_equal(kvbm_block_msg_encode(&pre, again, sizeof again, &len2, &e), KVBM_EINVAL);
}

/* A pushed message framed with the checksum the sender kept (issue 22):
 * the same bytes as a hashing encode when the sum is right; the body is
 * not hashed (a sum that is not the body's travels as given); a body
 * gathered in place is not moved; and a stale sum (the bytes changed
 * after it was computed) is refused by the receiver's one hash. */
static void test_sum_given(void **state) {
  (void)state;
  uint8_t ref[4000], buf[4000];
  size_t rlen = encode(ref, sizeof ref), len = 0;
  kvbm_block_msg m = {.seq_hash = 0x1122334455667788ull, .parent_hash = 42, .salt_hash = 7, .has_parent = 1,
                      .num_tokens = NT, .tokens = g_tokens, .tier = KVBM_TIER_G2,
                      .layout_id = 0xA1B2C3D4E5F60718ull, .phase = KVBM_PHASE_OUTPUT_CRITICAL, .body = g_body,
                      .body_len = BODY, .sum_given = 1};
  kvbm_blake3_hash(g_body, BODY, m.frame.checksum, 16); /* kept at "commit" */
  kvbm_error e;
  assert_int_equal(kvbm_block_msg_encode(&m, buf, sizeof buf, &len, &e), KVBM_OK);
  assert_int_equal(len, rlen);
  assert_memory_equal(buf, ref, len);

  /* gathered where the body goes: framed in place, same bytes */
  uint8_t *at = buf + 52 + 4 * NT + KVBM_FRAME_HEADER_LEN;
  memset(buf, 0xEE, sizeof buf);
  memcpy(at, g_body, BODY);
  kvbm_block_msg inplace = m;
  inplace.body = at;
  assert_int_equal(kvbm_block_msg_encode(&inplace, buf, sizeof buf, &len, &e), KVBM_OK);
  assert_memory_equal(buf, ref, rlen);

  /* nothing hashed: the header carries the given sum, whatever the body */
  kvbm_block_msg given = m;
  memset(given.frame.checksum, 0xAB, 16);
  assert_int_equal(kvbm_block_msg_encode(&given, buf, sizeof buf, &len, &e), KVBM_OK);
  uint8_t want[16];
  memset(want, 0xAB, 16);
  assert_memory_equal(buf + 52 + 4 * NT + 16, want, 16);
  uint32_t toks[NT];
  kvbm_block_msg d;
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY, toks, &d, &e), KVBM_ECHECKSUM);

  /* stale: the bytes changed after their sum was kept; the sender frames
   * what it holds, the receiver refuses it */
  g_body[BODY / 2] ^= 0x01;
  assert_int_equal(kvbm_block_msg_encode(&m, buf, sizeof buf, &len, &e), KVBM_OK);
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY, toks, &d, &e), KVBM_ECHECKSUM);
  /* placed, with the body at hand and the sum given: the sum is framed */
  kvbm_block_msg placed = m;
  placed.placed = 1;
  placed.block_id = 3;
  assert_int_equal(kvbm_block_msg_encode(&placed, buf, sizeof buf, &len, &e), KVBM_OK);
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY, toks, &d, &e), KVBM_OK);
  assert_memory_equal(d.frame.checksum, m.frame.checksum, 16);
  assert_int_equal(kvbm_frame_verify_body(&d.frame, g_body, BODY, &e), KVBM_ECHECKSUM);
  g_body[BODY / 2] ^= 0x01;
  assert_int_equal(kvbm_frame_verify_body(&d.frame, g_body, BODY, &e), KVBM_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_corruption),
      cmocka_unit_test(test_placed),
      cmocka_unit_test(test_sum_given),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
