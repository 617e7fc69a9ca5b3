/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_frame_keyed.c: keyed MRDN frames (version 2, issue 23). A keyed
 * frame checks under its key only; a reader with a key refuses unkeyed
 * frames (what a forger can make), one without a key refuses keyed ones,
 * a forged body with a recomputed plain sum is refused: all KVBM_EAUTH,
 * whole or in pieces; the MAC is BLAKE3 keyed (checked against the
 * library's keyed hash), and a MAC kept by the caller frames as the same
 * bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/frame.h"

static uint8_t key_a[32], key_b[32];
static uint8_t body[3000];

static void fill(void) {
  for (size_t i = 0; i < sizeof body; i++) body[i] = (uint8_t)(i * 131 + 7);
  for (int i = 0; i < 32; i++) {
    key_a[i] = (uint8_t)i;
    key_b[i] = (uint8_t)(i + 1);
  }
}

static void test_roundtrip_and_kinds(void **st) {
  (void)st;
  fill();
  uint8_t f[32 + sizeof body], g[32 + sizeof body];
  size_t fl, gl;
  assert_int_equal(kvbm_frame_encode_keyed(key_a, KVBM_PHASE_THINK_ACTIVE, body, sizeof body, f,
                                           sizeof f, &fl, NULL),
                   KVBM_OK);
  assert_int_equal(fl, sizeof f);
  assert_int_equal(f[4], KVBM_FRAME_VERSION_KEYED);
  /* the MAC is the first 16 bytes of BLAKE3 keyed */
  uint8_t mac[16];
  kvbm_blake3_keyed_hash(key_a, body, sizeof body, mac, 16);
  assert_memory_equal(f + 16, mac, 16);
  kvbm_frame_header h;
  const uint8_t *b;
  kvbm_error e = {0};
  assert_int_equal(kvbm_frame_decode_keyed(key_a, f, fl, 1 << 20, &h, &b, &e), KVBM_OK);
  assert_ptr_equal(b, f + 32);
  assert_int_equal(h.version, KVBM_FRAME_VERSION_KEYED);
  /* another key, no key */
  assert_int_equal(kvbm_frame_decode_keyed(key_b, f, fl, 1 << 20, &h, &b, &e), KVBM_EAUTH);
  assert_non_null(strstr(e.msg, "MAC mismatch"));
  assert_int_equal(kvbm_frame_decode(f, fl, 1 << 20, &h, &b, &e), KVBM_EAUTH);
  assert_non_null(strstr(e.msg, "no key"));
  /* an unkeyed frame to a keyed reader */
  assert_int_equal(kvbm_frame_encode(KVBM_PHASE_THINK_ACTIVE, body, sizeof body, g, sizeof g, &gl,
                                     NULL),
                   KVBM_OK);
  assert_int_equal(kvbm_frame_decode_keyed(key_a, g, gl, 1 << 20, &h, &b, &e), KVBM_EAUTH);
  assert_non_null(strstr(e.msg, "unkeyed"));
  assert_int_equal(kvbm_frame_decode_keyed(NULL, g, gl, 1 << 20, &h, &b, &e), KVBM_OK);
  /* a forgery: other bytes, a valid plain sum, version 2 claimed */
  g[40] ^= 1;
  assert_int_equal(kvbm_frame_encode(KVBM_PHASE_THINK_ACTIVE, g + 32, sizeof body, g, sizeof g, &gl,
                                     NULL),
                   KVBM_OK);
  g[4] = KVBM_FRAME_VERSION_KEYED;
  assert_int_equal(kvbm_frame_decode_keyed(key_a, g, gl, 1 << 20, &h, &b, &e), KVBM_EAUTH);
  /* one flipped body bit under the key */
  f[100] ^= 0x10;
  assert_int_equal(kvbm_frame_decode_keyed(key_a, f, fl, 1 << 20, &h, &b, &e), KVBM_EAUTH);
}

static void test_pieces_and_kept_mac(void **st) {
  (void)st;
  fill();
  uint8_t hdr[32], hdr2[32], mac[16];
  assert_int_equal(kvbm_frame_encode_header_keyed(key_a, KVBM_PHASE_OUTPUT_CRITICAL, body,
                                                  sizeof body, hdr, NULL),
                   KVBM_OK);
  kvbm_blake3_keyed_hash(key_a, body, sizeof body, mac, 16);
  assert_int_equal(kvbm_frame_encode_header_mac(KVBM_PHASE_OUTPUT_CRITICAL, sizeof body, mac, hdr2,
                                                NULL),
                   KVBM_OK);
  assert_memory_equal(hdr, hdr2, 32);
  kvbm_frame_header h;
  assert_int_equal(kvbm_frame_parse_header(hdr, 32, 1 << 20, &h, NULL), KVBM_OK);
  assert_int_equal(kvbm_frame_check_mac(&h, sizeof body, mac, NULL), KVBM_OK);
  assert_int_equal(kvbm_frame_check_sum(&h, sizeof body, mac, NULL), KVBM_EAUTH);
  kvbm_frame_verifier v;
  assert_int_equal(kvbm_frame_verifier_init(&v, &h, NULL), KVBM_EAUTH);
  for (int bad = 0; bad < 2; bad++) {
    assert_int_equal(kvbm_frame_verifier_init_keyed(&v, &h, bad ? key_b : key_a, NULL), KVBM_OK);
    for (size_t off = 0; off < sizeof body; off += 700) {
      size_t n = sizeof body - off < 700 ? sizeof body - off : 700;
      assert_int_equal(kvbm_frame_verifier_update(&v, body + off, n, NULL), KVBM_OK);
    }
    assert_int_equal(kvbm_frame_verifier_finish(&v, NULL), bad ? KVBM_EAUTH : KVBM_OK);
  }
  /* an unkeyed header to a keyed verifier */
  assert_int_equal(kvbm_frame_encode_header(KVBM_PHASE_OUTPUT_CRITICAL, body, sizeof body, hdr,
                                            NULL),
                   KVBM_OK);
  assert_int_equal(kvbm_frame_parse_header(hdr, 32, 1 << 20, &h, NULL), KVBM_OK);
  assert_int_equal(kvbm_frame_verifier_init_keyed(&v, &h, key_a, NULL), KVBM_EAUTH);
  assert_int_equal(kvbm_frame_check_mac(&h, sizeof body, mac, NULL), KVBM_EAUTH);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_and_kinds),
      cmocka_unit_test(test_pieces_and_kept_mac),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
