/* SPDX-License-Identifier: Apache-2.0 */
/* test_codec.c: the serialized layout, round trips and every malformed-input
 * class with its own error.
 *
 * Malformed inputs are made by patching one field of a valid encoding at the
 * offset the format documents (layout_codec.c, docs/areas/layout-storage.md),
 * so these tests also pin the byte layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/layout.h"

enum {
  O_MAGIC = 0, O_VERSION = 4, O_RES16 = 6, O_KIND = 8, O_MEMORY = 12, O_DEVICE = 16,
  O_RES32 = 20, O_SET = 24, O_NUM_BLOCKS = 32, O_NUM_LAYERS = 40, O_OUTER_DIM = 48,
  O_PAGE = 56, O_INNER = 64, O_DTYPE = 72, O_ALIGN = 80, O_OUTER_STRIDE = 88,
  O_LAYER_STRIDE = 96, O_BLOCK_STRIDE = 104, O_REGION_SIZE = 112, O_NUM_REGIONS = 120,
  O_BASES = 128,
};

static void put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

typedef struct sample {
  kvbm_layout_desc d;
  uint64_t bases[8];
  uint8_t buf[256];
  size_t len;
} sample;

/* A valid desc and its encoding: layer-separate over 5 layers, device 3. */
static void make(sample *s, kvbm_layout_kind kind) {
  memset(s, 0, sizeof *s);
  kvbm_layout_config c = {10, 5, 2, 16, 12, 2, 512};
  assert_int_equal(kvbm_layout_init(&s->d.layout, kind, &c, NULL), KVBM_OK);
  s->d.memory = KVBM_MEMORY_DEVICE;
  s->d.device_id = 3;
  s->d.block_set_id = 0x1122334455667788ull;
  s->d.num_regions = s->d.layout.num_regions;
  for (int i = 0; i < 8; i++) s->bases[i] = 0x7f0000000000ull + (uint64_t)i * 0x100000;
  s->d.region_base = s->bases;
  kvbm_error e;
  assert_int_equal(kvbm_layout_desc_encode(&s->d, s->buf, sizeof s->buf, &s->len, &e), KVBM_OK);
  assert_int_equal(s->len, kvbm_layout_desc_encoded_size(&s->d));
  assert_int_equal(s->len, 128 + 8 * s->d.num_regions);
}

/* Decodes and expects `code`; checks the failure contract. */
static void expect(const uint8_t *buf, size_t len, int code) {
  kvbm_layout_desc out;
  kvbm_error e;
  kvbm_error_clear(&e);
  int rc = kvbm_layout_desc_decode(buf, len, &out, &e);
  if (rc != code)
    fail_msg("decode of %zu bytes: %s (%s), want %s", len, kvbm_status_name(rc), e.msg,
             kvbm_status_name(code));
  if (code != KVBM_OK) {
    assert_int_equal(e.code, code);
    assert_true(strlen(e.msg) > 0);
    assert_null(out.region_base);
  } else {
    kvbm_layout_desc_release(&out);
  }
}

static void patched(kvbm_layout_kind kind, size_t off, int width, uint64_t v, int code) {
  sample s;
  make(&s, kind);
  put_le(s.buf + off, v, width);
  expect(s.buf, s.len, code);
}

static void round_trip_both_kinds(void **state) {
  (void)state;
  for (int k = KVBM_LAYOUT_FULLY_CONTIGUOUS; k <= KVBM_LAYOUT_LAYER_SEPARATE; k++) {
    sample s;
    make(&s, (kvbm_layout_kind)k);
    kvbm_layout_desc out;
    kvbm_error e;
    assert_int_equal(kvbm_layout_desc_decode(s.buf, s.len, &out, &e), KVBM_OK);
    assert_memory_equal(&out.layout, &s.d.layout, sizeof out.layout);
    assert_int_equal(out.memory, KVBM_MEMORY_DEVICE);
    assert_int_equal(out.device_id, 3);
    assert_int_equal(out.block_set_id, 0x1122334455667788ull);
    assert_int_equal(out.num_regions, k == KVBM_LAYOUT_FULLY_CONTIGUOUS ? 1 : 5);
    assert_memory_equal(out.region_base, s.bases, 8 * out.num_regions);
    assert_int_equal(kvbm_layout_fingerprint(&out.layout), kvbm_layout_fingerprint(&s.d.layout));
    /* Re-encoding gives the same bytes. */
    uint8_t again[256];
    size_t n;
    assert_int_equal(kvbm_layout_desc_encode(&out, again, sizeof again, &n, NULL), KVBM_OK);
    assert_int_equal(n, s.len);
    assert_memory_equal(again, s.buf, n);
    kvbm_layout_desc_release(&out);
    assert_null(out.region_base);
    kvbm_layout_desc_release(&out); /* twice is fine */
    kvbm_layout_desc_release(NULL);
  }
  /* Every memory type and device id -1 round-trip too. */
  for (int m = KVBM_MEMORY_SYSTEM; m <= KVBM_MEMORY_REMOTE; m++) {
    sample s;
    make(&s, KVBM_LAYOUT_FULLY_CONTIGUOUS);
    s.d.memory = (kvbm_memory_type)m;
    s.d.device_id = m == KVBM_MEMORY_DEVICE ? 0 : -1;
    assert_int_equal(kvbm_layout_desc_encode(&s.d, s.buf, sizeof s.buf, &s.len, NULL), KVBM_OK);
    kvbm_layout_desc out;
    assert_int_equal(kvbm_layout_desc_decode(s.buf, s.len, &out, NULL), KVBM_OK);
    assert_int_equal(out.memory, m);
    assert_int_equal(out.device_id, s.d.device_id);
    kvbm_layout_desc_release(&out);
  }
}

static void bytes_are_where_the_format_says(void **state) {
  (void)state;
  sample s;
  make(&s, KVBM_LAYOUT_LAYER_SEPARATE);
  assert_memory_equal(s.buf, "KVLY", 4);
  assert_int_equal(get_le(s.buf + O_VERSION, 2), 1);
  assert_int_equal(get_le(s.buf + O_RES16, 2), 0);
  assert_int_equal(get_le(s.buf + O_KIND, 4), 2);
  assert_int_equal(get_le(s.buf + O_MEMORY, 4), 3);
  assert_int_equal(get_le(s.buf + O_DEVICE, 4), 3);
  assert_int_equal(get_le(s.buf + O_RES32, 4), 0);
  assert_int_equal(get_le(s.buf + O_SET, 8), 0x1122334455667788ull);
  assert_int_equal(s.buf[O_SET], 0x88); /* little-endian */
  const uint64_t cfgv[] = {10, 5, 2, 16, 12, 2, 512};
  for (int i = 0; i < 7; i++) assert_int_equal(get_le(s.buf + O_NUM_BLOCKS + 8 * i, 8), cfgv[i]);
  assert_int_equal(get_le(s.buf + O_OUTER_STRIDE, 8), 16 * 12 * 2);
  assert_int_equal(get_le(s.buf + O_LAYER_STRIDE, 8), 2 * 16 * 12 * 2);
  assert_int_equal(get_le(s.buf + O_BLOCK_STRIDE, 8), 1024); /* 768 aligned to 512 */
  assert_int_equal(get_le(s.buf + O_REGION_SIZE, 8), 10 * 1024);
  assert_int_equal(get_le(s.buf + O_NUM_REGIONS, 8), 5);
  for (int r = 0; r < 5; r++) assert_int_equal(get_le(s.buf + O_BASES + 8 * r, 8), s.bases[r]);
  sample f;
  make(&f, KVBM_LAYOUT_FULLY_CONTIGUOUS);
  assert_int_equal(get_le(f.buf + O_BLOCK_STRIDE, 8), 4096); /* 5 * 768 aligned to 512 */
  assert_int_equal(f.len, 136);
}

static void every_truncation_is_truncated(void **state) {
  (void)state;
  for (int k = KVBM_LAYOUT_FULLY_CONTIGUOUS; k <= KVBM_LAYOUT_LAYER_SEPARATE; k++) {
    sample s;
    make(&s, (kvbm_layout_kind)k);
    for (size_t n = 0; n < s.len; n++) {
      /* A fresh heap copy of exactly n bytes, so ASan sees any overread. */
      uint8_t *p = malloc(n ? n : 1);
      memcpy(p, s.buf, n);
      expect(p, n, KVBM_ETRUNCATED);
      free(p);
    }
    expect(s.buf, s.len, KVBM_OK);
  }
  expect(NULL, 0, KVBM_ETRUNCATED);
}

static void trailing_bytes_are_too_long(void **state) {
  (void)state;
  for (int k = KVBM_LAYOUT_FULLY_CONTIGUOUS; k <= KVBM_LAYOUT_LAYER_SEPARATE; k++) {
    sample s;
    make(&s, (kvbm_layout_kind)k);
    for (size_t extra = 1; extra <= 64 && s.len + extra <= sizeof s.buf; extra++)
      expect(s.buf, s.len + extra, KVBM_ETOOLONG);
  }
}

static void magic_version_and_padding(void **state) {
  (void)state;
  for (int i = 0; i < 4; i++) {
    sample s;
    make(&s, KVBM_LAYOUT_LAYER_SEPARATE);
    s.buf[i] ^= 0x20;
    expect(s.buf, s.len, KVBM_EMAGIC);
    expect(s.buf, (size_t)i + 1, KVBM_EMAGIC); /* a wrong prefix is not "truncated" */
  }
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_VERSION, 2, 0, KVBM_EVERSION);
  /* 2 is the version with a heads trailer (test_heads.c); a version 1
   * body marked 2 lacks it. */
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_VERSION, 2, 2, KVBM_ETRUNCATED);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_VERSION, 2, 3, KVBM_EVERSION);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_VERSION, 2, 0x100, KVBM_EVERSION);
  {
    /* A future version is reported as such even when short. */
    sample s;
    make(&s, KVBM_LAYOUT_LAYER_SEPARATE);
    put_le(s.buf + O_VERSION, 3, 2);
    expect(s.buf, 6, KVBM_EVERSION);
  }
  for (int i = 0; i < 2; i++) patched(KVBM_LAYOUT_LAYER_SEPARATE, O_RES16 + i, 1, 1, KVBM_EPADDING);
  for (int i = 0; i < 4; i++) patched(KVBM_LAYOUT_LAYER_SEPARATE, O_RES32 + i, 1, 0x80, KVBM_EPADDING);
}

static void out_of_range_values(void **state) {
  (void)state;
  const uint64_t kinds[] = {0, 3, 0xff, 0xffffffff};
  for (size_t i = 0; i < 4; i++) patched(KVBM_LAYOUT_LAYER_SEPARATE, O_KIND, 4, kinds[i], KVBM_ERANGE);
  const uint64_t mems[] = {0, 6, 0x80000000};
  for (size_t i = 0; i < 3; i++) patched(KVBM_LAYOUT_LAYER_SEPARATE, O_MEMORY, 4, mems[i], KVBM_ERANGE);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_DEVICE, 4, (uint32_t)-2, KVBM_ERANGE);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_DEVICE, 4, 0x80000000u, KVBM_ERANGE);
  /* An absurd region count is refused before anything else is believed. */
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_NUM_REGIONS, 8, KVBM_LAYOUT_MAX_LAYERS + 1, KVBM_ERANGE);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_NUM_REGIONS, 8, UINT64_MAX, KVBM_ERANGE);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_NUM_REGIONS, 8, 1ull << 61, KVBM_ERANGE);
  /* A region reaching past 2^64 (aligned base, 10 KiB region). */
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_BASES + 8 * 4, 8, UINT64_MAX - 511, KVBM_ERANGE);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_BASES, 8, (UINT64_MAX - 10 * 1024 + 1) & ~511ull, KVBM_ERANGE);
  /* The highest base that still fits is fine. */
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_BASES, 8, (UINT64_MAX - 10 * 1024) & ~511ull, KVBM_OK);
}

static void rejected_configs(void **state) {
  (void)state;
  for (int i = 0; i < 6; i++) patched(KVBM_LAYOUT_LAYER_SEPARATE, O_NUM_BLOCKS + 8 * i, 8, 0, KVBM_EINVAL);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_ALIGN, 8, 0, KVBM_EINVAL);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_ALIGN, 8, 768, KVBM_EINVAL);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_NUM_LAYERS, 8, KVBM_LAYOUT_MAX_LAYERS + 1, KVBM_EINVAL);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_PAGE, 8, 1ull << 62, KVBM_EOVERFLOW);
  patched(KVBM_LAYOUT_FULLY_CONTIGUOUS, O_NUM_BLOCKS, 8, UINT64_MAX, KVBM_EOVERFLOW);
}

static void inconsistent_fields(void **state) {
  (void)state;
  const size_t strides[] = {O_OUTER_STRIDE, O_LAYER_STRIDE, O_BLOCK_STRIDE, O_REGION_SIZE};
  for (int k = KVBM_LAYOUT_FULLY_CONTIGUOUS; k <= KVBM_LAYOUT_LAYER_SEPARATE; k++)
    for (size_t i = 0; i < 4; i++) {
      sample s;
      make(&s, (kvbm_layout_kind)k);
      uint64_t v = get_le(s.buf + strides[i], 8);
      patched((kvbm_layout_kind)k, strides[i], 8, v + 1, KVBM_EFORMAT);
      patched((kvbm_layout_kind)k, strides[i], 8, v - 1, KVBM_EFORMAT);
      patched((kvbm_layout_kind)k, strides[i], 8, 0, KVBM_EFORMAT);
    }
  /* Kind flipped: strides and region count are those of the other kind. */
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_KIND, 4, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_EFORMAT);
  patched(KVBM_LAYOUT_FULLY_CONTIGUOUS, O_KIND, 4, KVBM_LAYOUT_LAYER_SEPARATE, KVBM_EFORMAT);
  /* A config field changed: the strides no longer follow. */
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_PAGE, 8, 17, KVBM_EFORMAT);
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_DTYPE, 8, 4, KVBM_EFORMAT);
  patched(KVBM_LAYOUT_FULLY_CONTIGUOUS, O_NUM_BLOCKS, 8, 11, KVBM_EFORMAT);
  /* Region count off by one, with the input length matching the claim, so
   * only the consistency rule can catch it. */
  {
    sample s;
    make(&s, KVBM_LAYOUT_LAYER_SEPARATE);
    put_le(s.buf + O_NUM_REGIONS, 4, 8);
    expect(s.buf, s.len - 8, KVBM_EFORMAT);
    put_le(s.buf + O_NUM_REGIONS, 6, 8);
    expect(s.buf, s.len + 8, KVBM_EFORMAT);
  }
  /* Unaligned base. */
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_BASES + 8 * 2, 8, 0x7f0000000100ull, KVBM_EFORMAT);
  patched(KVBM_LAYOUT_FULLY_CONTIGUOUS, O_BASES, 8, 1, KVBM_EFORMAT);
  /* Device memory needs a device. */
  patched(KVBM_LAYOUT_LAYER_SEPARATE, O_DEVICE, 4, (uint32_t)-1, KVBM_EFORMAT);
  /* ...other memory may have none. */
  {
    sample s;
    make(&s, KVBM_LAYOUT_LAYER_SEPARATE);
    put_le(s.buf + O_MEMORY, KVBM_MEMORY_PINNED, 4);
    put_le(s.buf + O_DEVICE, (uint32_t)-1, 4);
    expect(s.buf, s.len, KVBM_OK);
  }
}

static void encoder_checks_too(void **state) {
  (void)state;
  sample s;
  make(&s, KVBM_LAYOUT_LAYER_SEPARATE);
  uint8_t small[256];
  size_t n = 99;
  kvbm_error e;
  assert_int_equal(kvbm_layout_desc_encode(&s.d, small, s.len - 1, &n, &e), KVBM_ENOSPC);
  assert_int_equal(n, 99);
  assert_int_equal(kvbm_layout_desc_encode(&s.d, NULL, 0, &n, NULL), KVBM_ENOSPC);
  assert_int_equal(kvbm_layout_desc_encode(&s.d, small, s.len, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_layout_desc_encode(NULL, small, sizeof small, NULL, NULL), KVBM_EINVAL);

  kvbm_layout_desc d = s.d;
  d.layout.block_stride += 512;
  assert_int_equal(kvbm_layout_desc_encode(&d, small, sizeof small, NULL, &e), KVBM_EFORMAT);
  assert_non_null(strstr(e.msg, "block_stride"));
  d = s.d;
  d.num_regions = 4;
  assert_int_equal(kvbm_layout_desc_encode(&d, small, sizeof small, NULL, NULL), KVBM_EFORMAT);
  d = s.d;
  d.memory = (kvbm_memory_type)9;
  assert_int_equal(kvbm_layout_desc_encode(&d, small, sizeof small, NULL, NULL), KVBM_ERANGE);
  d = s.d;
  d.region_base = NULL;
  assert_int_equal(kvbm_layout_desc_encode(&d, small, sizeof small, NULL, NULL), KVBM_EINVAL);
  d = s.d;
  uint64_t bad[5] = {0, 0, 3, 0, 0};
  d.region_base = bad;
  assert_int_equal(kvbm_layout_desc_encode(&d, small, sizeof small, NULL, NULL), KVBM_EFORMAT);
  d = s.d;
  d.num_regions = KVBM_LAYOUT_MAX_LAYERS + 1ull;
  assert_int_equal(kvbm_layout_desc_encoded_size(&d), 0);
  assert_int_equal(kvbm_layout_desc_encode(&d, small, sizeof small, NULL, NULL), KVBM_ERANGE);
  assert_int_equal(kvbm_layout_desc_decode(s.buf, s.len, NULL, NULL), KVBM_EINVAL);
}

/* The biggest legal message (65536 regions) decodes; its allocation is
 * bounded by the input length. */
static void largest_region_count(void **state) {
  (void)state;
  kvbm_layout_desc d;
  memset(&d, 0, sizeof d);
  kvbm_layout_config c = {2, KVBM_LAYOUT_MAX_LAYERS, 1, 1, 1, 1, 1};
  assert_int_equal(kvbm_layout_init(&d.layout, KVBM_LAYOUT_LAYER_SEPARATE, &c, NULL), KVBM_OK);
  d.memory = KVBM_MEMORY_SYSTEM;
  d.device_id = -1;
  d.num_regions = KVBM_LAYOUT_MAX_LAYERS;
  d.region_base = calloc(KVBM_LAYOUT_MAX_LAYERS, 8);
  for (uint64_t r = 0; r < d.num_regions; r++) d.region_base[r] = r * 64;
  size_t len = kvbm_layout_desc_encoded_size(&d);
  assert_int_equal(len, 128 + 8 * (size_t)KVBM_LAYOUT_MAX_LAYERS);
  uint8_t *buf = malloc(len);
  assert_int_equal(kvbm_layout_desc_encode(&d, buf, len, NULL, NULL), KVBM_OK);
  kvbm_layout_desc out;
  assert_int_equal(kvbm_layout_desc_decode(buf, len, &out, NULL), KVBM_OK);
  assert_memory_equal(out.region_base, d.region_base, 8 * (size_t)d.num_regions);
  kvbm_layout_desc_release(&out);
  expect(buf, len - 1, KVBM_ETRUNCATED);
  free(buf);
  free(d.region_base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip_both_kinds),
      cmocka_unit_test(bytes_are_where_the_format_says),
      cmocka_unit_test(every_truncation_is_truncated),
      cmocka_unit_test(trailing_bytes_are_too_long),
      cmocka_unit_test(magic_version_and_padding),
      cmocka_unit_test(out_of_range_values),
      cmocka_unit_test(rejected_configs),
      cmocka_unit_test(inconsistent_fields),
      cmocka_unit_test(encoder_checks_too),
      cmocka_unit_test(largest_region_count),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
