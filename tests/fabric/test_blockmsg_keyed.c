/* SPDX-License-Identifier: Apache-2.0 */
/* test_blockmsg_keyed.c: block messages between peers that share a fabric
 * secret (issue 23). Their frames carry a MAC under a key derived from the
 * secret (kvbm_fabric_frame_key, its own context: not the side channel's
 * key); a receiver with the key accepts them, and refuses (KVBM_EAUTH) an
 * unkeyed message, a message framed under another secret, and a forgery
 * (other bytes, a valid plain BLAKE3 recomputed, version 2 claimed); a
 * receiver without the key refuses keyed messages. A sender's kept MAC
 * frames the same bytes as hashing does (still one hash per block), and a
 * placed keyed header is checked by the keyed verifier. */
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
static const char SECRET_A[] = "fabric secret A: 32 bytes long!!";
static const char SECRET_B[] = "fabric secret B: 32 bytes long!!";

static kvbm_block_msg msg(const uint8_t *key) {
  test_pattern(g_body, BODY, 5);
  for (uint32_t i = 0; i < NT; i++) g_tokens[i] = 2000 + i;
  kvbm_block_msg m = {.seq_hash = 99, .num_tokens = NT, .tokens = g_tokens, .tier = KVBM_TIER_G2,
                      .layout_id = 7, .phase = KVBM_PHASE_THINK_ACTIVE, .body = g_body, .body_len = BODY,
                      .mac_key = key};
  return m;
}

static size_t encode(const uint8_t *key, uint8_t *out, size_t cap) {
  kvbm_block_msg m = msg(key);
  size_t len = 0;
  assert_int_equal(kvbm_block_msg_encode(&m, out, cap, &len, NULL), KVBM_OK);
  return len;
}

static void test_keyed_kinds(void **state) {
  (void)state;
  uint8_t ka[32], kb[32];
  assert_int_equal(kvbm_fabric_frame_key(SECRET_A, strlen(SECRET_A), ka, NULL), KVBM_OK);
  assert_int_equal(kvbm_fabric_frame_key(SECRET_B, strlen(SECRET_B), kb, NULL), KVBM_OK);
  assert_memory_not_equal(ka, kb, 32);
  kvbm_error e = {0};
  assert_int_equal(kvbm_fabric_frame_key("short", 5, ka + 0, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_frame_key(SECRET_A, strlen(SECRET_A), ka, NULL), KVBM_OK);
  uint8_t buf[4000], plain[4000];
  uint32_t toks[NT];
  kvbm_block_msg d;
  size_t len = encode(ka, buf, sizeof buf);
  assert_int_equal(kvbm_block_msg_decode_keyed(ka, buf, len, NT, BODY, toks, &d, &e), KVBM_OK);
  assert_memory_equal(d.body, g_body, BODY);
  assert_int_equal(d.frame.version, KVBM_FRAME_VERSION_KEYED);
  /* no key, another key */
  assert_int_equal(kvbm_block_msg_decode(buf, len, NT, BODY, toks, &d, &e), KVBM_EAUTH);
  assert_int_equal(kvbm_block_msg_decode_keyed(kb, buf, len, NT, BODY, toks, &d, &e), KVBM_EAUTH);
  /* an unkeyed message to a keyed receiver */
  size_t plen = encode(NULL, plain, sizeof plain);
  assert_int_equal(kvbm_block_msg_decode(plain, plen, NT, BODY, toks, &d, &e), KVBM_OK);
  assert_int_equal(kvbm_block_msg_decode_keyed(ka, plain, plen, NT, BODY, toks, &d, &e), KVBM_EAUTH);
  /* a forgery on the path: other bytes, the plain sum recomputed over them,
   * the header claiming to be keyed */
  size_t foff = len - BODY - KVBM_FRAME_HEADER_LEN;
  buf[foff + KVBM_FRAME_HEADER_LEN + 10] ^= 0x5A;
  size_t fl;
  assert_int_equal(kvbm_frame_encode(KVBM_PHASE_THINK_ACTIVE, buf + foff + KVBM_FRAME_HEADER_LEN, BODY, buf + foff,
                                     BODY + KVBM_FRAME_HEADER_LEN, &fl, NULL),
                   KVBM_OK);
  buf[foff + 4] = KVBM_FRAME_VERSION_KEYED;
  assert_int_equal(kvbm_block_msg_decode_keyed(ka, buf, len, NT, BODY, toks, &d, &e), KVBM_EAUTH);
  assert_non_null(strstr(e.msg, "MAC"));
}

static void test_kept_mac_and_placed(void **state) {
  (void)state;
  uint8_t ka[32];
  assert_int_equal(kvbm_fabric_frame_key(SECRET_A, strlen(SECRET_A), ka, NULL), KVBM_OK);
  uint8_t hashed[4000], kept[4000];
  size_t hl = encode(ka, hashed, sizeof hashed);
  /* the sender kept the block's MAC: framed, not hashed, same bytes */
  kvbm_block_msg m = msg(ka);
  kvbm_blake3_keyed_hash(ka, g_body, BODY, m.frame.checksum, KVBM_FRAME_CHECKSUM_LEN);
  m.sum_given = 1;
  size_t kl;
  assert_int_equal(kvbm_block_msg_encode(&m, kept, sizeof kept, &kl, NULL), KVBM_OK);
  assert_int_equal(kl, hl);
  assert_memory_equal(kept, hashed, hl);
  /* placed: the keyed header alone; the receiver verifies keyed */
  m = msg(ka);
  m.placed = 1;
  m.block_id = 3;
  uint8_t pb[500];
  size_t pl;
  assert_int_equal(kvbm_block_msg_encode(&m, pb, sizeof pb, &pl, NULL), KVBM_OK);
  uint32_t toks[NT];
  kvbm_block_msg d;
  assert_int_equal(kvbm_block_msg_decode(pb, pl, NT, BODY, toks, &d, NULL), KVBM_EAUTH);
  assert_int_equal(kvbm_block_msg_decode_keyed(ka, pb, pl, NT, BODY, toks, &d, NULL), KVBM_OK);
  kvbm_frame_verifier v;
  assert_int_equal(kvbm_frame_verifier_init_keyed(&v, &d.frame, ka, NULL), KVBM_OK);
  assert_int_equal(kvbm_frame_verifier_update(&v, g_body, BODY, NULL), KVBM_OK);
  assert_int_equal(kvbm_frame_verifier_finish(&v, NULL), KVBM_OK);
  /* an unkeyed placed header to a keyed receiver */
  m = msg(NULL);
  m.placed = 1;
  m.block_id = 3;
  assert_int_equal(kvbm_block_msg_encode(&m, pb, sizeof pb, &pl, NULL), KVBM_OK);
  assert_int_equal(kvbm_block_msg_decode_keyed(ka, pb, pl, NT, BODY, toks, &d, NULL), KVBM_EAUTH);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_keyed_kinds),
      cmocka_unit_test(test_kept_mac_and_placed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
