/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_frame.c: MRDN v1 frames: exact header bytes, round trips, every
 * decoder error with its own status and message, the streaming path, and
 * single-byte corruption anywhere being caught.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvbm/blake3.h"
#include "kvbm/frame.h"

static uint8_t *make_body(size_t n, uint32_t seed) {
  uint8_t *b = malloc(n ? n : 1);
  assert_non_null(b);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    b[i] = (uint8_t)(seed >> 16);
  }
  return b;
}

/* A whole frame for `body`, malloc'ed. */
static uint8_t *make_frame(kvbm_frame_phase phase, const uint8_t *body,
                           size_t n, size_t *len) {
  assert_int_equal(kvbm_frame_encode(phase, body, n, NULL, 0, len, NULL), 0);
  uint8_t *f = malloc(*len);
  assert_non_null(f);
  size_t got = 0;
  assert_int_equal(kvbm_frame_encode(phase, body, n, f, *len, &got, NULL), 0);
  assert_int_equal(got, *len);
  return f;
}

/* The header of an empty body, phase ThinkActive (1), byte for byte: the
 * checksum is the first half of BLAKE3("") from the official vectors. */
static void test_exact_header_bytes(void **state) {
  (void)state;
  static const uint8_t want[32] = {
      'M',  'R',  'D',  'N',  1,    0,    0,    0,    0,    0,    0,
      0,    1,    0,    0,    0,    0xaf, 0x13, 0x49, 0xb9, 0xf5, 0xf9,
      0xa1, 0xa6, 0xa0, 0x40, 0x4d, 0xea, 0x36, 0xdc, 0xc9, 0x49};
  uint8_t hdr[32];
  assert_int_equal(
      kvbm_frame_encode_header(KVBM_PHASE_THINK_ACTIVE, NULL, 0, hdr, NULL), 0);
  assert_memory_equal(hdr, want, 32);

  /* Length and phase fields are little-endian at their offsets; the
   * phases are numbered in the ADR's order. */
  uint8_t *body = make_body(0x010203, 7);
  assert_int_equal(
      kvbm_frame_encode_header(KVBM_PHASE_OUTPUT_CRITICAL, body, 0x010203, hdr, NULL),
      0);
  assert_int_equal(hdr[8], 0x03);
  assert_int_equal(hdr[9], 0x02);
  assert_int_equal(hdr[10], 0x01);
  assert_int_equal(hdr[11], 0x00);
  assert_int_equal(hdr[12], 2);
  uint8_t sum[32];
  kvbm_blake3_hash(body, 0x010203, sum, 32);
  assert_memory_equal(hdr + 16, sum, 16);
  assert_int_equal(kvbm_frame_encode_header(KVBM_PHASE_THINK_COMPLETE, body, 1, hdr, NULL), 0);
  assert_int_equal(hdr[12], 0);
  assert_int_equal(kvbm_frame_encode_header(KVBM_PHASE_THINK_ACTIVE, body, 1, hdr, NULL), 0);
  assert_int_equal(hdr[12], 1);
  free(body);
}

static void test_round_trips(void **state) {
  (void)state;
  static const size_t sizes[] = {0, 1, 31, 32, 33, 1000, 1024, 65536,
                                 (1u << 20) + 7};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    for (int phase = 0; phase < KVBM_FRAME_PHASE_COUNT; phase++) {
      uint8_t *body = make_body(sizes[s], (uint32_t)(s * 4 + (size_t)phase));
      size_t len;
      uint8_t *f = make_frame((kvbm_frame_phase)phase, body, sizes[s], &len);
      assert_int_equal(len, 32 + sizes[s]);
      kvbm_frame_header hdr;
      const uint8_t *out = NULL;
      kvbm_error err;
      int rc = kvbm_frame_decode(f, len, KVBM_FRAME_DEFAULT_MAX_BODY, &hdr,
                                 &out, &err);
      if (rc) fail_msg("size %zu: %s", sizes[s], err.msg);
      assert_ptr_equal(out, f + 32);
      assert_int_equal(hdr.body_len, sizes[s]);
      assert_int_equal(hdr.version, 1);
      assert_int_equal(hdr.phase, phase);
      assert_memory_equal(out, body, sizes[s]);
      free(f);
      free(body);
    }
  }
  assert_string_equal(kvbm_frame_phase_name(KVBM_PHASE_THINK_COMPLETE), "ThinkComplete");
  assert_string_equal(kvbm_frame_phase_name(KVBM_PHASE_THINK_ACTIVE), "ThinkActive");
  assert_string_equal(kvbm_frame_phase_name(KVBM_PHASE_OUTPUT_CRITICAL), "OutputCritical");
  assert_string_equal(kvbm_frame_phase_name(3), "?");
  assert_string_equal(kvbm_frame_phase_name(-1), "?");
}

/* Size query, short buffer, body already in place, body overlapping the
 * header's bytes. */
static void test_encode_buffers(void **state) {
  (void)state;
  uint8_t *body = make_body(100, 3), want[132], buf[200];
  size_t len = 0;
  assert_int_equal(
      kvbm_frame_encode(KVBM_PHASE_THINK_COMPLETE, body, 100, NULL, 0, &len, NULL), 0);
  assert_int_equal(len, 132);
  assert_int_equal(
      kvbm_frame_encode(KVBM_PHASE_THINK_COMPLETE, body, 100, want, 132, &len, NULL),
      0);
  kvbm_error err;
  assert_int_equal(kvbm_frame_encode(KVBM_PHASE_THINK_COMPLETE, body, 100, buf, 131,
                                     &len, &err),
                   KVBM_ENOSPC);
  assert_int_equal(len, 132);
  assert_non_null(strstr(err.msg, "needs 132"));

  memcpy(buf + 32, body, 100); /* in place */
  assert_int_equal(
      kvbm_frame_encode(KVBM_PHASE_THINK_COMPLETE, buf + 32, 100, buf, 200, &len, NULL),
      0);
  assert_memory_equal(buf, want, 132);

  memcpy(buf + 5, body, 100); /* overlapping the header */
  assert_int_equal(
      kvbm_frame_encode(KVBM_PHASE_THINK_COMPLETE, buf + 5, 100, buf, 200, &len, NULL),
      0);
  assert_memory_equal(buf, want, 132);
  free(body);
}

static void test_encode_errors(void **state) {
  (void)state;
  uint8_t hdr[32];
  size_t len;
  kvbm_error err;
  assert_int_equal(
      kvbm_frame_encode_header((kvbm_frame_phase)3, "x", 1, hdr, &err),
      KVBM_EPHASE);
  assert_non_null(strstr(err.msg, "phase 3"));
  assert_int_equal(
      kvbm_frame_encode_header((kvbm_frame_phase)-1, "x", 1, hdr, &err),
      KVBM_EPHASE);
  assert_int_equal(kvbm_frame_encode_header(KVBM_PHASE_THINK_COMPLETE, NULL, 5, hdr,
                                            &err),
                   KVBM_EINVAL);
  if (sizeof(size_t) > 4) {
    assert_int_equal(
        kvbm_frame_encoded_len((size_t)UINT32_MAX + 1, &len, &err),
        KVBM_ETOOLONG);
    assert_non_null(strstr(err.msg, "u32"));
  }
  assert_int_equal(kvbm_frame_encoded_len(UINT32_MAX, &len, NULL), 0);
  assert_int_equal(
      kvbm_frame_encode(KVBM_PHASE_THINK_COMPLETE, "x", 1, NULL, 0, NULL, &err),
      KVBM_EINVAL);
}

/* Decodes `f` expecting status `code` and a message containing `words`. */
static void expect(const uint8_t *f, size_t len, uint32_t max, int code,
                   const char *words) {
  kvbm_frame_header hdr;
  const uint8_t *body = NULL;
  kvbm_error err;
  kvbm_error_clear(&err);
  int rc = kvbm_frame_decode(f, len, max, &hdr, &body, &err);
  if (rc != code)
    fail_msg("want %s, got %s (%s)", kvbm_status_name(code),
             kvbm_status_name(rc), err.msg);
  assert_int_equal(err.code, code);
  if (!strstr(err.msg, words))
    fail_msg("message '%s' lacks '%s'", err.msg, words);
  if (code != KVBM_OK) assert_null(body);
}

static void test_every_decode_error(void **state) {
  (void)state;
  uint8_t *body = make_body(500, 11);
  size_t len;
  uint8_t *good = make_frame(KVBM_PHASE_OUTPUT_CRITICAL, body, 500, &len);
  uint8_t *f = malloc(len + 1);
  assert_non_null(f);
  const uint32_t max = KVBM_FRAME_DEFAULT_MAX_BODY;

  for (size_t n = 0; n < 32; n++)
    expect(good, n, max, KVBM_ETRUNCATED, "header truncated");

  for (int i = 0; i < 4; i++) {
    memcpy(f, good, len);
    f[i] ^= 0x20;
    expect(f, len, max, KVBM_EMAGIC, "magic");
  }
  static const uint32_t versions[] = {0, 4, 0x01000000u, 0xFFFFFFFFu};
  for (size_t i = 0; i < 4; i++) {
    memcpy(f, good, len);
    f[4] = (uint8_t)versions[i];
    f[5] = (uint8_t)(versions[i] >> 8);
    f[6] = (uint8_t)(versions[i] >> 16);
    f[7] = (uint8_t)(versions[i] >> 24);
    expect(f, len, max, KVBM_EVERSION, "version");
  }
  for (int i = 13; i < 16; i++) {
    memcpy(f, good, len);
    f[i] = 1;
    expect(f, len, max, KVBM_EPADDING, "padding");
  }
  /* Every byte other than the ADR's three labels; 3 is what kvbm wrote
   * for G4 before the byte was the phase. */
  for (int v = KVBM_FRAME_PHASE_COUNT; v < 256; v++) {
    memcpy(f, good, len);
    f[12] = (uint8_t)v;
    char words[32];
    snprintf(words, sizeof words, "unknown phase %d", v);
    expect(f, len, max, KVBM_EPHASE, words);
  }
  /* Body shorter than declared: one byte short, and header only. */
  expect(good, len - 1, max, KVBM_ETRUNCATED, "body truncated");
  expect(good, 32, max, KVBM_ETRUNCATED, "body truncated");
  /* Body longer than declared: a trailing byte. */
  memcpy(f, good, len);
  f[len] = 0;
  expect(f, len + 1, max, KVBM_ETOOLONG, "body longer than declared");
  /* Declared length above the caller's limit: refused from the header. */
  expect(good, len, 499, KVBM_ETOOLONG, "exceeds the limit 499");
  memcpy(f, good, len);
  f[11] = 0xFF; /* a 4 GiB claim on a 532-byte buffer */
  expect(f, len, max, KVBM_ETOOLONG, "limit");
  /* Checksum: a flipped body bit, a flipped checksum bit. */
  memcpy(f, good, len);
  f[32 + 250] ^= 1;
  expect(f, len, max, KVBM_ECHECKSUM, "checksum mismatch");
  memcpy(f, good, len);
  f[31] ^= 0x80;
  expect(f, len, max, KVBM_ECHECKSUM, "checksum mismatch");

  /* Checks run in header order: bad version and bad phase -> version;
   * bad padding and bad phase -> padding; bad phase and a length above
   * the limit -> phase. */
  memcpy(f, good, len);
  f[4] = 9;
  f[12] = 9;
  expect(f, len, max, KVBM_EVERSION, "version");
  memcpy(f, good, len);
  f[13] = 1;
  f[12] = 7;
  expect(f, len, max, KVBM_EPADDING, "padding");
  memcpy(f, good, len);
  f[12] = 7;
  expect(f, len, 10, KVBM_EPHASE, "phase");
  /* The good frame still decodes (the helper did not damage it). */
  expect(good, len, max, KVBM_OK, "");
  free(f);
  free(good);
  free(body);
}

/* Any single changed byte is caught, except the phase byte turned into
 * another valid phase (the label is not covered by the checksum). */
static void test_single_byte_corruption(void **state) {
  (void)state;
  uint8_t *body = make_body(3000, 5);
  size_t len;
  uint8_t *good = make_frame(KVBM_PHASE_THINK_COMPLETE, body, 3000, &len);
  uint8_t *f = malloc(len);
  assert_non_null(f);
  uint32_t seed = 99;
  for (int trial = 0; trial < 3000; trial++) {
    seed = seed * 1664525u + 1013904223u;
    size_t at = trial < 64 ? (size_t)trial : (seed >> 8) % len;
    uint8_t delta = (uint8_t)(1 + (seed >> 24) % 255);
    memcpy(f, good, len);
    f[at] ^= delta;
    kvbm_frame_header hdr;
    const uint8_t *out;
    int rc = kvbm_frame_decode(f, len, KVBM_FRAME_DEFAULT_MAX_BODY, &hdr, &out,
                               NULL);
    if (at == 12 && f[12] < KVBM_FRAME_PHASE_COUNT) {
      assert_int_equal(rc, KVBM_OK);
    } else if (rc == KVBM_OK) {
      fail_msg("byte %zu ^ %02x not caught", at, delta);
    }
  }
  free(f);
  free(good);
  free(body);
}

/* Header first, then the body in pieces of assorted sizes. */
static void test_streaming(void **state) {
  (void)state;
  uint8_t *body = make_body(100000, 17);
  size_t len;
  uint8_t *f = make_frame(KVBM_PHASE_THINK_ACTIVE, body, 100000, &len);
  kvbm_frame_header hdr;
  kvbm_error err;
  /* The header alone is enough to learn (and bound) the body length. */
  assert_int_equal(kvbm_frame_parse_header(f, 32, 100000, &hdr, &err), 0);
  assert_int_equal(hdr.body_len, 100000);
  assert_int_equal(kvbm_frame_parse_header(f, 32, 99999, &hdr, &err),
                   KVBM_ETOOLONG);
  assert_int_equal(kvbm_frame_parse_header(f, 32, 100000, &hdr, &err), 0);
  assert_int_equal(kvbm_frame_verify_body(&hdr, f + 32, 100000, &err), 0);

  kvbm_frame_verifier v;
  static const size_t pieces[] = {1, 63, 64, 1000, 1024, 4097, 30000};
  size_t off = 0;
  assert_int_equal(kvbm_frame_verifier_init(&v, &hdr, &err), 0);
  for (size_t i = 0; off < 100000; i++) {
    size_t n = pieces[i % 7];
    if (n > 100000 - off) n = 100000 - off;
    assert_int_equal(kvbm_frame_verifier_update(&v, f + 32 + off, n, &err), 0);
    off += n;
  }
  assert_int_equal(kvbm_frame_verifier_finish(&v, &err), 0);

  /* Short. */
  kvbm_frame_verifier_init(&v, &hdr, NULL);
  kvbm_frame_verifier_update(&v, f + 32, 99999, NULL);
  assert_int_equal(kvbm_frame_verifier_finish(&v, &err), KVBM_ETRUNCATED);
  assert_non_null(strstr(err.msg, "body truncated"));
  /* Long: refused at the piece that overflows, then the verifier is dead. */
  kvbm_frame_verifier_init(&v, &hdr, NULL);
  assert_int_equal(kvbm_frame_verifier_update(&v, f + 32, 99999, &err), 0);
  assert_int_equal(kvbm_frame_verifier_update(&v, f + 32, 2, &err),
                   KVBM_ETOOLONG);
  assert_non_null(strstr(err.msg, "longer than declared"));
  assert_int_equal(kvbm_frame_verifier_update(&v, f + 32, 1, &err),
                   KVBM_ESTATE);
  assert_int_equal(kvbm_frame_verifier_finish(&v, &err), KVBM_ESTATE);
  /* Corrupt piece. */
  f[32 + 77777] ^= 4;
  kvbm_frame_verifier_init(&v, &hdr, NULL);
  kvbm_frame_verifier_update(&v, f + 32, 100000, NULL);
  assert_int_equal(kvbm_frame_verifier_finish(&v, &err), KVBM_ECHECKSUM);
  assert_int_equal(kvbm_frame_verify_body(&hdr, f + 32, 100000, &err),
                   KVBM_ECHECKSUM);
  free(f);
  free(body);
}

static uint8_t *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  uint8_t *buf = malloc(1 << 16);
  assert_non_null(buf);
  *len = fread(buf, 1, 1 << 16, f);
  fclose(f);
  return buf;
}

/* Frames assembled by a shell script with Debian's b3sum computing the
 * checksum (the fuzz seeds): an outside check of the format. */
static void test_frames_built_with_b3sum(void **state) {
  (void)state;
  size_t len;
  kvbm_frame_header hdr;
  const uint8_t *body;
  kvbm_error err;
  uint8_t *f = read_all(KVBM_SOURCE_DIR "/fuzz/corpus/frame/small_think_active", &len);
  assert_int_equal(kvbm_frame_decode(f, len, 1000, &hdr, &body, &err), 0);
  assert_int_equal(hdr.phase, KVBM_PHASE_THINK_ACTIVE);
  assert_int_equal(hdr.body_len, 14);
  assert_memory_equal(body, "hello kv block", 14);
  free(f);
  f = read_all(KVBM_SOURCE_DIR "/fuzz/corpus/frame/chunk_output_critical", &len);
  assert_int_equal(kvbm_frame_decode(f, len, 1 << 20, &hdr, &body, &err), 0);
  assert_int_equal(hdr.phase, KVBM_PHASE_OUTPUT_CRITICAL);
  assert_int_equal(hdr.body_len, 1500);
  free(f);
  f = read_all(KVBM_SOURCE_DIR "/fuzz/corpus/frame/empty_think_complete", &len);
  assert_int_equal(kvbm_frame_decode(f, len, 0, &hdr, &body, &err), 0);
  assert_int_equal(hdr.phase, KVBM_PHASE_THINK_COMPLETE);
  assert_int_equal(hdr.body_len, 0);
  free(f);
  /* A frame of the old kvbm, G4 in the phase byte: refused, not misread. */
  f = read_all(KVBM_SOURCE_DIR "/fuzz/corpus/frame/old_tier_g4", &len);
  assert_int_equal(kvbm_frame_decode(f, len, 1 << 20, &hdr, &body, &err), KVBM_EPHASE);
  assert_non_null(strstr(err.msg, "unknown phase 3"));
  free(f);
}

/* A checksum computed elsewhere (a pool's threads) makes the same header,
 * and checks a body the same way, as the frame's own hashing. */
static void test_precomputed_checksums(void **state) {
  (void)state;
  uint8_t *body = make_body(3 << 20, 23);
  kvbm_blake3_pool *p;
  assert_int_equal(kvbm_blake3_pool_create(2, 0, &p, NULL), 0);
  uint8_t sum[16], a[32], b[32];
  assert_int_equal(kvbm_blake3_pool_hash(p, body, 3 << 20, sum, 16, NULL), 0);
  assert_int_equal(kvbm_frame_encode_header(KVBM_PHASE_OUTPUT_CRITICAL, body, 3 << 20, a, NULL), 0);
  assert_int_equal(kvbm_frame_encode_header_sum(KVBM_PHASE_OUTPUT_CRITICAL, 3 << 20, sum, b, NULL), 0);
  assert_memory_equal(a, b, 32);
  kvbm_frame_header hdr;
  kvbm_error err;
  assert_int_equal(kvbm_frame_parse_header(a, 32, 4 << 20, &hdr, &err), 0);
  assert_int_equal(kvbm_frame_check_sum(&hdr, 3 << 20, sum, &err), 0);
  assert_int_equal(kvbm_frame_check_sum(&hdr, (3 << 20) - 1, sum, &err), KVBM_ETRUNCATED);
  assert_int_equal(kvbm_frame_check_sum(&hdr, (3 << 20) + 1, sum, &err), KVBM_ETOOLONG);
  body[12345] ^= 1;
  assert_int_equal(kvbm_blake3_pool_hash(p, body, 3 << 20, sum, 16, NULL), 0);
  assert_int_equal(kvbm_frame_check_sum(&hdr, 3 << 20, sum, &err), KVBM_ECHECKSUM);
  assert_non_null(strstr(err.msg, "checksum mismatch"));
  assert_int_equal(kvbm_frame_encode_header_sum((kvbm_frame_phase)3, 1, sum, b, &err), KVBM_EPHASE);
  assert_int_equal(kvbm_frame_encode_header_sum(KVBM_PHASE_THINK_ACTIVE, 1, NULL, b, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_frame_check_sum(&hdr, 1, NULL, &err), KVBM_EINVAL);
  kvbm_blake3_pool_destroy(p);
  free(body);
}

static void test_null_arguments(void **state) {
  (void)state;
  kvbm_frame_header hdr;
  const uint8_t *body;
  uint8_t buf[32] = {0};
  assert_int_equal(kvbm_frame_parse_header(NULL, 32, 10, &hdr, NULL),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_frame_parse_header(buf, 32, 10, NULL, NULL),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_frame_decode(buf, 32, 10, &hdr, NULL, NULL),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_frame_decode(NULL, 0, 10, &hdr, &body, NULL),
                   KVBM_ETRUNCATED);
  assert_int_equal(kvbm_frame_verify_body(NULL, buf, 1, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_frame_verifier_init(NULL, &hdr, NULL), KVBM_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_header_bytes),
      cmocka_unit_test(test_round_trips),
      cmocka_unit_test(test_encode_buffers),
      cmocka_unit_test(test_encode_errors),
      cmocka_unit_test(test_every_decode_error),
      cmocka_unit_test(test_single_byte_corruption),
      cmocka_unit_test(test_streaming),
      cmocka_unit_test(test_frames_built_with_b3sum),
      cmocka_unit_test(test_precomputed_checksums),
      cmocka_unit_test(test_null_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
