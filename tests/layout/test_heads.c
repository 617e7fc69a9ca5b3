/* SPDX-License-Identifier: Apache-2.0 */
/* test_heads.c: the layout's KV-heads descriptor (TP-portable blocks).
 *
 * Pins vLLM's head rule (split when tp_size divides the heads, replicate
 * when the heads divide tp_size), the checks of kvbm_layout_attach_heads
 * against the layout, and the serialized form: a layout without heads is
 * still version 1 byte for byte (older peers read it), one with heads is
 * version 2 with a 40-byte trailer, and every malformed trailer has its own
 * error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/layout.h"

enum { O_VERSION = 4, O_BASES = 128 };
enum { T_MAGIC = 0, T_DTYPE = 4, T_FP = 8, T_HEADS = 16, T_HDIM = 20, T_RANK = 24, T_TP = 28, T_RES = 32 };

static void put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static kvbm_layout_heads heads(uint32_t h, uint32_t hd, uint32_t rank, uint32_t tp) {
  return (kvbm_layout_heads){.model_fingerprint = 0xfeedface12345678ull, .dtype_id = 3, .num_kv_heads = h,
                             .head_dim = hd, .tp_rank = rank, .tp_size = tp};
}

static void expect_err(int rc, const kvbm_error *e, int code, const char *field) {
  if (rc != code) fail_msg("got %s (%s), want %s", kvbm_status_name(rc), e->msg, kvbm_status_name(code));
  if (field && !strstr(e->msg, field)) fail_msg("message \"%s\" does not name %s", e->msg, field);
}

/* vLLM's rule, split and replicated, every rank of a few deployments. */
static void local_heads_follow_vllm(void **state) {
  (void)state;
  uint32_t first, count;
  for (uint32_t tp = 1; tp <= 8; tp *= 2)
    for (uint32_t r = 0; r < tp; r++) {
      kvbm_layout_heads h = heads(8, 64, r, tp);
      assert_int_equal(kvbm_layout_heads_local(&h, &first, &count, NULL), KVBM_OK);
      assert_int_equal(count, 8 / tp);
      assert_int_equal(first, r * (8 / tp));
    }
  /* 4 KV heads on TP=8: each head on 2 ranks, rank r holds head r / 2. */
  for (uint32_t r = 0; r < 8; r++) {
    kvbm_layout_heads h = heads(4, 64, r, 8);
    assert_int_equal(kvbm_layout_heads_local(&h, &first, &count, NULL), KVBM_OK);
    assert_int_equal(count, 1);
    assert_int_equal(first, r / 2);
  }
  /* MQA: 1 head on TP=4, every rank holds it. */
  kvbm_layout_heads mqa = heads(1, 128, 3, 4);
  assert_int_equal(kvbm_layout_heads_local(&mqa, &first, &count, NULL), KVBM_OK);
  assert_int_equal(first, 0);
  assert_int_equal(count, 1);
}

static void invalid_descriptors_name_the_field(void **state) {
  (void)state;
  kvbm_error e;
  uint32_t first = 77, count = 77;
  kvbm_layout_heads h = heads(6, 64, 0, 4); /* neither divides the other */
  expect_err(kvbm_layout_heads_local(&h, &first, &count, &e), &e, KVBM_EINVAL, "tp_size");
  assert_int_equal(first, 77);
  h = heads(4, 64, 0, 6);
  expect_err(kvbm_layout_heads_validate(&h, &e), &e, KVBM_EINVAL, "num_kv_heads");
  h = heads(8, 64, 2, 2);
  expect_err(kvbm_layout_heads_validate(&h, &e), &e, KVBM_ERANGE, "tp_rank");
  h = heads(0, 64, 0, 1);
  expect_err(kvbm_layout_heads_validate(&h, &e), &e, KVBM_EINVAL, "num_kv_heads");
  h = heads(8, 0, 0, 1);
  expect_err(kvbm_layout_heads_validate(&h, &e), &e, KVBM_EINVAL, "head_dim");
  h = heads(8, 64, 0, 0);
  expect_err(kvbm_layout_heads_validate(&h, &e), &e, KVBM_EINVAL, "tp_size");
  h = heads(8, 64, 0, 1);
  h.dtype_id = 9;
  expect_err(kvbm_layout_heads_validate(&h, &e), &e, KVBM_ERANGE, "dtype_id");
  h.dtype_id = 0;
  expect_err(kvbm_layout_heads_validate(&h, &e), &e, KVBM_ERANGE, "dtype_id");
  h = heads(8, 64, 0, 1);
  h.model_fingerprint = 0;
  expect_err(kvbm_layout_heads_validate(&h, &e), &e, KVBM_EINVAL, "model_fingerprint");
  expect_err(kvbm_layout_heads_validate(NULL, &e), &e, KVBM_EINVAL, NULL);
}

static kvbm_layout make_layout(kvbm_layout_kind kind, uint64_t inner, uint64_t dtype_size) {
  kvbm_layout l;
  kvbm_layout_config c = {.num_blocks = 6, .num_layers = 3, .outer_dim = 2, .page_size = 16,
                          .inner_dim = inner, .dtype_size = dtype_size, .alignment = 256};
  assert_int_equal(kvbm_layout_init(&l, kind, &c, NULL), KVBM_OK);
  assert_int_equal(l.has_heads, 0);
  return l;
}

static void attach_checks_the_layout(void **state) {
  (void)state;
  kvbm_error e;
  kvbm_layout l = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 2 * 64, 2);
  const kvbm_layout before = l;
  uint64_t fp = kvbm_layout_fingerprint(&l);
  kvbm_layout_heads h = heads(8, 64, 1, 4); /* 2 heads of 64 */
  assert_int_equal(kvbm_layout_attach_heads(&l, &h, &e), KVBM_OK);
  assert_int_equal(l.has_heads, 1);
  assert_memory_equal(&l.heads, &h, sizeof h);
  /* The descriptor says what the bytes mean, not where they are. */
  assert_int_equal(kvbm_layout_fingerprint(&l), fp);
  assert_int_equal(l.block_stride, before.block_stride);
  assert_int_equal(l.region_size, before.region_size);

  kvbm_layout m = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 2 * 64, 2);
  h = heads(8, 64, 1, 2); /* 4 heads: inner_dim 256, not 128 */
  expect_err(kvbm_layout_attach_heads(&m, &h, &e), &e, KVBM_EINVAL, "inner_dim");
  assert_int_equal(m.has_heads, 0);
  h = heads(8, 64, 1, 4);
  h.dtype_id = 1; /* float32 is 4 bytes, the layout's 2 */
  expect_err(kvbm_layout_attach_heads(&m, &h, &e), &e, KVBM_EINVAL, "dtype");
  assert_int_equal(m.has_heads, 0);
  /* Replicated: 1 head held. */
  kvbm_layout r = make_layout(KVBM_LAYOUT_LAYER_SEPARATE, 64, 1);
  h = heads(2, 64, 3, 8);
  h.dtype_id = 4; /* float8_e4m3fn */
  assert_int_equal(kvbm_layout_attach_heads(&r, &h, &e), KVBM_OK);
  /* NULL detaches. */
  assert_int_equal(kvbm_layout_attach_heads(&l, NULL, &e), KVBM_OK);
  assert_int_equal(l.has_heads, 0);
  assert_int_equal(kvbm_layout_dtype_bytes(3), 2);
  assert_int_equal(kvbm_layout_dtype_bytes(8), 8);
  assert_int_equal(kvbm_layout_dtype_bytes(99), 0);
}

typedef struct sample {
  kvbm_layout_desc d;
  uint64_t bases[8];
  uint8_t buf[512];
  size_t len;
} sample;

static void make(sample *s, kvbm_layout_kind kind, int with_heads) {
  memset(s, 0, sizeof *s);
  s->d.layout = make_layout(kind, 2 * 64, 2);
  if (with_heads) {
    kvbm_layout_heads h = heads(8, 64, 3, 4);
    assert_int_equal(kvbm_layout_attach_heads(&s->d.layout, &h, NULL), KVBM_OK);
  }
  s->d.memory = KVBM_MEMORY_SYSTEM;
  s->d.device_id = -1;
  s->d.block_set_id = 42;
  s->d.num_regions = s->d.layout.num_regions;
  for (int i = 0; i < 8; i++) s->bases[i] = 0x7f0000000000ull + (uint64_t)i * 0x1000000;
  s->d.region_base = s->bases;
  kvbm_error e;
  assert_int_equal(kvbm_layout_desc_encode(&s->d, s->buf, sizeof s->buf, &s->len, &e), KVBM_OK);
  assert_int_equal(s->len, kvbm_layout_desc_encoded_size(&s->d));
}

static void expect_decode(const uint8_t *buf, size_t len, int code, const char *field) {
  kvbm_layout_desc out;
  kvbm_error e;
  kvbm_error_clear(&e);
  int rc = kvbm_layout_desc_decode(buf, len, &out, &e);
  if (rc != code)
    fail_msg("decode of %zu bytes: %s (%s), want %s", len, kvbm_status_name(rc), e.msg, kvbm_status_name(code));
  if (code == KVBM_OK) {
    kvbm_layout_desc_release(&out);
    return;
  }
  assert_null(out.region_base);
  if (field && !strstr(e.msg, field)) fail_msg("message \"%s\" does not name %s", e.msg, field);
}

/* Without heads nothing changed: version 1, 128 + 8n bytes, decodes with
 * no heads. With heads: version 2, a trailer, and a round trip. */
static void versions_and_round_trip(void **state) {
  (void)state;
  for (int kind = KVBM_LAYOUT_FULLY_CONTIGUOUS; kind <= KVBM_LAYOUT_LAYER_SEPARATE; kind++) {
    sample v1, v2;
    make(&v1, (kvbm_layout_kind)kind, 0);
    make(&v2, (kvbm_layout_kind)kind, 1);
    assert_int_equal(get_le(v1.buf + O_VERSION, 2), 1);
    assert_int_equal(v1.len, 128 + 8 * v1.d.num_regions);
    assert_int_equal(get_le(v2.buf + O_VERSION, 2), 2);
    assert_int_equal(v2.len, 128 + 8 * v2.d.num_regions + KVBM_LAYOUT_WIRE_HEADS_TRAILER);
    /* The first 128 + 8n bytes are the same but for the version. */
    put_le(v2.buf + O_VERSION, 1, 2);
    assert_memory_equal(v1.buf, v2.buf, v1.len);
    put_le(v2.buf + O_VERSION, 2, 2);
    const uint8_t *t = v2.buf + v1.len;
    assert_memory_equal(t + T_MAGIC, "KVHD", 4);
    assert_int_equal(get_le(t + T_DTYPE, 4), 3);
    assert_int_equal(get_le(t + T_FP, 8), 0xfeedface12345678ull);
    assert_int_equal(get_le(t + T_HEADS, 4), 8);
    assert_int_equal(get_le(t + T_HDIM, 4), 64);
    assert_int_equal(get_le(t + T_RANK, 4), 3);
    assert_int_equal(get_le(t + T_TP, 4), 4);
    assert_int_equal(get_le(t + T_RES, 8), 0);

    kvbm_layout_desc out;
    assert_int_equal(kvbm_layout_desc_decode(v1.buf, v1.len, &out, NULL), KVBM_OK);
    assert_int_equal(out.layout.has_heads, 0);
    kvbm_layout_desc_release(&out);
    assert_int_equal(kvbm_layout_desc_decode(v2.buf, v2.len, &out, NULL), KVBM_OK);
    assert_int_equal(out.layout.has_heads, 1);
    assert_memory_equal(&out.layout.heads, &v2.d.layout.heads, sizeof out.layout.heads);
    assert_memory_equal(out.region_base, v2.bases, 8 * out.num_regions);
    uint8_t again[512];
    size_t n = 0;
    assert_int_equal(kvbm_layout_desc_encode(&out, again, sizeof again, &n, NULL), KVBM_OK);
    assert_int_equal(n, v2.len);
    assert_memory_equal(again, v2.buf, n);
    kvbm_layout_desc_release(&out);
  }
}

/* A version-1 encoding made by hand (what an older kvbm sends) decodes. */
static void old_encoding_still_decodes(void **state) {
  (void)state;
  uint8_t b[128 + 8] = {0};
  memcpy(b, "KVLY", 4);
  put_le(b + 4, 1, 2);
  put_le(b + 8, KVBM_LAYOUT_FULLY_CONTIGUOUS, 4);
  put_le(b + 12, KVBM_MEMORY_SYSTEM, 4);
  put_le(b + 16, (uint32_t)-1, 4);
  put_le(b + 24, 7, 8);
  /* 2 blocks, 1 layer, outer 2, page 4, inner 8, dtype 2, align 64 */
  const uint64_t f[] = {2, 1, 2, 4, 8, 2, 64, 64, 128, 128, 256, 1};
  for (int i = 0; i < 12; i++) put_le(b + 32 + 8 * i, f[i], 8);
  put_le(b + 128, 0x10000, 8);
  kvbm_layout_desc out;
  kvbm_error e;
  int rc = kvbm_layout_desc_decode(b, sizeof b, &out, &e);
  if (rc) fail_msg("%s", e.msg);
  assert_int_equal(out.layout.has_heads, 0);
  assert_int_equal(out.layout.config.inner_dim, 8);
  kvbm_layout_desc_release(&out);
}

static void patch(const sample *s, size_t off, int width, uint64_t v, int code, const char *field) {
  uint8_t b[512];
  memcpy(b, s->buf, s->len);
  put_le(b + off, v, width);
  expect_decode(b, s->len, code, field);
}

static void hostile_trailers(void **state) {
  (void)state;
  sample s1, s;
  make(&s1, KVBM_LAYOUT_LAYER_SEPARATE, 0);
  make(&s, KVBM_LAYOUT_LAYER_SEPARATE, 1);
  const size_t t = 128 + 8 * s.d.num_regions;
  /* Every cut of a version 2 form is truncated; so is version 2 without
   * its trailer (a version 1 body with the version bumped). */
  for (size_t n = 6; n < s.len; n++) expect_decode(s.buf, n, KVBM_ETRUNCATED, NULL);
  patch(&s1, O_VERSION, 2, 2, KVBM_ETRUNCATED, "heads trailer");
  /* A trailer on a version 1 form is bytes after the end. */
  uint8_t b[512];
  memcpy(b, s.buf, s.len);
  put_le(b + O_VERSION, 1, 2);
  expect_decode(b, s.len, KVBM_ETOOLONG, NULL);
  /* One more byte after the trailer. */
  memcpy(b, s.buf, s.len);
  b[s.len] = 0;
  expect_decode(b, s.len + 1, KVBM_ETOOLONG, NULL);
  patch(&s, O_VERSION, 2, 3, KVBM_EVERSION, NULL);
  patch(&s, t + T_MAGIC, 4, 0x44485643 /* "CVHD" */, KVBM_EMAGIC, "KVHD");
  patch(&s, t + T_RES, 8, 1, KVBM_EPADDING, "trailer");
  patch(&s, t + T_RES + 7, 1, 0x80, KVBM_EPADDING, "trailer");
  patch(&s, t + T_RANK, 4, 4, KVBM_ERANGE, "tp_rank");
  patch(&s, t + T_RANK, 4, 0xffffffffu, KVBM_ERANGE, "tp_rank");
  patch(&s, t + T_TP, 4, 6, KVBM_EINVAL, "tp_size");
  patch(&s, t + T_TP, 4, 0, KVBM_EINVAL, "tp_size");
  patch(&s, t + T_HEADS, 4, 0, KVBM_EINVAL, "num_kv_heads");
  patch(&s, t + T_HEADS, 4, 16, KVBM_EINVAL, "inner_dim"); /* 4 heads held, inner_dim is 2 */
  patch(&s, t + T_HDIM, 4, 32, KVBM_EINVAL, "inner_dim");
  patch(&s, t + T_HDIM, 4, 0, KVBM_EINVAL, "head_dim");
  patch(&s, t + T_DTYPE, 4, 1, KVBM_EINVAL, "dtype");
  patch(&s, t + T_DTYPE, 4, 200, KVBM_ERANGE, "dtype_id");
  patch(&s, t + T_FP, 8, 0, KVBM_EINVAL, "model_fingerprint");
  /* Still valid: another rank of another TP size that holds 2 heads. */
  patch(&s, t + T_RANK, 4, 0, KVBM_OK, NULL);
  /* 2 heads on TP=4 are replicated: 1 head held, inner_dim wants 64. */
  patch(&s, t + T_HEADS, 4, 2, KVBM_EINVAL, "inner_dim");
}

/* The encoder refuses what the decoder would. */
static void encoder_checks_heads(void **state) {
  (void)state;
  sample s;
  make(&s, KVBM_LAYOUT_FULLY_CONTIGUOUS, 1);
  kvbm_error e;
  uint8_t b[512];
  kvbm_layout_desc d = s.d;
  d.layout.heads.tp_size = 6;
  expect_err(kvbm_layout_desc_encode(&d, b, sizeof b, NULL, &e), &e, KVBM_EINVAL, "tp_size");
  d = s.d;
  d.layout.heads.head_dim = 32;
  expect_err(kvbm_layout_desc_encode(&d, b, sizeof b, NULL, &e), &e, KVBM_EINVAL, "inner_dim");
  d = s.d;
  d.layout.has_heads = 2;
  expect_err(kvbm_layout_desc_encode(&d, b, sizeof b, NULL, &e), &e, KVBM_EINVAL, "has_heads");
  d = s.d;
  expect_err(kvbm_layout_desc_encode(&d, b, s.len - 1, NULL, &e), &e, KVBM_ENOSPC, NULL);
}

/* Flipped bytes anywhere in a version 2 form: never a crash, and whatever
 * decodes re-encodes to the same bytes (nothing is dropped or invented). */
static void flipped_bytes(void **state) {
  (void)state;
  sample s;
  make(&s, KVBM_LAYOUT_LAYER_SEPARATE, 1);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  int ok = 0;
  for (int i = 0; i < 20000; i++) {
    uint8_t b[512];
    memcpy(b, s.buf, s.len);
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t at = 128 + (size_t)(x % (s.len - 128)); /* the regions and the trailer */
    b[at] ^= (uint8_t)(1u << ((x >> 32) & 7));
    kvbm_layout_desc out;
    if (kvbm_layout_desc_decode(b, s.len, &out, NULL) == KVBM_OK) {
      uint8_t again[512];
      size_t n = 0;
      assert_int_equal(kvbm_layout_desc_encode(&out, again, sizeof again, &n, NULL), KVBM_OK);
      assert_int_equal(n, s.len);
      assert_memory_equal(again, b, n);
      kvbm_layout_desc_release(&out);
      ok++;
    }
  }
  assert_true(ok > 0); /* some flips (fingerprint, high base bits) are valid */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(local_heads_follow_vllm),
      cmocka_unit_test(invalid_descriptors_name_the_field),
      cmocka_unit_test(attach_checks_the_layout),
      cmocka_unit_test(versions_and_round_trip),
      cmocka_unit_test(old_encoding_still_decodes),
      cmocka_unit_test(hostile_trailers),
      cmocka_unit_test(encoder_checks_heads),
      cmocka_unit_test(flipped_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
