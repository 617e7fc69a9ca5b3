/* SPDX-License-Identifier: Apache-2.0 */
/* test_layout.c: layout configs, strides, slice offsets, fingerprints.
 *
 * Offsets are checked against an independent walk (a cursor that lays the
 * slices out one after the other, padding each block start up to the
 * alignment) and by marking every byte each slice claims: slices are
 * disjoint, inside their region, block starts aligned, and together they
 * cover exactly num_blocks * num_layers * outer_dim slices. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/layout.h"

static kvbm_layout_config cfg(uint64_t nb, uint64_t nl, uint64_t od, uint64_t ps,
                              uint64_t id, uint64_t ds, uint64_t al) {
  kvbm_layout_config c = {nb, nl, od, ps, id, ds, al};
  return c;
}

static void a_llama_like_config_has_the_documented_strides(void **state) {
  (void)state;
  /* 32 layers, K and V, 16 tokens per block, 8 heads x 128, bf16. */
  kvbm_layout_config c = cfg(1024, 32, 2, 16, 1024, 2, 256);
  kvbm_layout fc, ls;
  assert_int_equal(kvbm_layout_init(&fc, KVBM_LAYOUT_FULLY_CONTIGUOUS, &c, NULL), KVBM_OK);
  assert_int_equal(fc.outer_stride, 16 * 1024 * 2);
  assert_int_equal(fc.layer_stride, 2 * 16 * 1024 * 2);
  assert_int_equal(fc.block_stride, 32 * 65536);
  assert_int_equal(fc.num_regions, 1);
  assert_int_equal(fc.region_size, 1024ull * 2 * 1024 * 1024);
  assert_int_equal(kvbm_layout_total_size(&fc), 2ull << 30);
  assert_int_equal(kvbm_layout_init(&ls, KVBM_LAYOUT_LAYER_SEPARATE, &c, NULL), KVBM_OK);
  assert_int_equal(ls.block_stride, 65536);
  assert_int_equal(ls.num_regions, 32);
  assert_int_equal(ls.region_size, 1024ull * 65536);
  assert_int_equal(kvbm_layout_total_size(&ls), 2ull << 30);

  kvbm_slice s;
  assert_int_equal(kvbm_layout_slice(&fc, 3, 5, 1, &s, NULL), KVBM_OK);
  assert_int_equal(s.region, 0);
  assert_int_equal(s.offset, 3ull * 2097152 + 5 * 65536 + 32768);
  assert_int_equal(s.size, 32768);
  assert_int_equal(kvbm_layout_slice(&ls, 3, 5, 1, &s, NULL), KVBM_OK);
  assert_int_equal(s.region, 5);
  assert_int_equal(s.offset, 3ull * 65536 + 32768);
  assert_int_equal(kvbm_layout_block(&fc, 7, &s, NULL), KVBM_OK);
  assert_int_equal(s.offset, 7ull * 2097152);
  assert_int_equal(s.size, 2097152);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Expected (region, offset) of every slice by walking a cursor, not by
 * multiplying strides; then the byte-marking checks. */
static void check_kind(const kvbm_layout_config *c, kvbm_layout_kind kind) {
  kvbm_layout l;
  kvbm_error e;
  assert_int_equal(kvbm_layout_init(&l, kind, c, &e), KVBM_OK);
  const uint64_t slice = c->page_size * c->inner_dim * c->dtype_size;
  const uint64_t nreg = kind == KVBM_LAYOUT_FULLY_CONTIGUOUS ? 1 : c->num_layers;
  assert_int_equal(l.num_regions, nreg);

  uint64_t *cursor = calloc(nreg, sizeof *cursor);
  uint64_t n = c->num_blocks * c->num_layers * c->outer_dim;
  uint64_t *exp_region = calloc(n, 8), *exp_off = calloc(n, 8);
  assert_non_null(cursor);
  assert_non_null(exp_region);
  assert_non_null(exp_off);
#define IDX(b, ly, o) (((b) * c->num_layers + (ly)) * c->outer_dim + (o))
  for (uint64_t b = 0; b < c->num_blocks; b++) {
    for (uint64_t r = 0; r < nreg; r++) cursor[r] = align_up(cursor[r], c->alignment);
    for (uint64_t ly = 0; ly < c->num_layers; ly++)
      for (uint64_t o = 0; o < c->outer_dim; o++) {
        uint64_t r = kind == KVBM_LAYOUT_FULLY_CONTIGUOUS ? 0 : ly;
        exp_region[IDX(b, ly, o)] = r;
        exp_off[IDX(b, ly, o)] = cursor[r];
        cursor[r] += slice;
      }
  }
  for (uint64_t r = 0; r < nreg; r++)
    assert_true(align_up(cursor[r], c->alignment) == l.region_size);

  uint8_t *mark = calloc(nreg * l.region_size, 1);
  assert_non_null(mark);
  uint64_t claimed = 0;
  for (uint64_t b = 0; b < c->num_blocks; b++)
    for (uint64_t ly = 0; ly < c->num_layers; ly++) {
      kvbm_slice bl;
      assert_int_equal(kvbm_layout_block_layer(&l, b, ly, &bl, NULL), KVBM_OK);
      assert_int_equal(bl.size, c->outer_dim * slice);
      for (uint64_t o = 0; o < c->outer_dim; o++) {
        kvbm_slice s;
        assert_int_equal(kvbm_layout_slice(&l, b, ly, o, &s, &e), KVBM_OK);
        assert_int_equal(s.region, exp_region[IDX(b, ly, o)]);
        assert_int_equal(s.offset, exp_off[IDX(b, ly, o)]);
        assert_int_equal(s.size, slice);
        assert_true(s.offset + s.size <= l.region_size);
        /* Outer slices of one (block, layer) are the block_layer range. */
        assert_int_equal(s.region, bl.region);
        assert_int_equal(s.offset, bl.offset + o * slice);
        if (ly == 0 || kind == KVBM_LAYOUT_LAYER_SEPARATE)
          if (o == 0) assert_int_equal(s.offset % c->alignment, 0);
        for (uint64_t i = 0; i < s.size; i++) {
          uint8_t *m = &mark[s.region * l.region_size + s.offset + i];
          assert_int_equal(*m, 0); /* disjoint */
          *m = 1;
        }
        claimed += s.size;
      }
    }
  assert_int_equal(claimed, n * slice); /* covers the whole element count */
  if (kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    for (uint64_t b = 0; b < c->num_blocks; b++) {
      kvbm_slice s;
      assert_int_equal(kvbm_layout_block(&l, b, &s, NULL), KVBM_OK);
      assert_int_equal(s.offset, exp_off[IDX(b, 0, 0)]);
      assert_int_equal(s.size, c->num_layers * c->outer_dim * slice);
    }
#undef IDX
  free(mark);
  free(cursor);
  free(exp_region);
  free(exp_off);
}

static void every_slice_is_where_a_walk_puts_it(void **state) {
  (void)state;
  const kvbm_layout_config cases[] = {
      cfg(1, 1, 1, 1, 1, 1, 1),       cfg(5, 3, 2, 4, 3, 2, 64),
      cfg(7, 4, 1, 3, 5, 1, 16),      cfg(3, 2, 2, 16, 8, 2, 4096),
      cfg(9, 5, 3, 2, 7, 4, 8),       cfg(4, 6, 2, 1, 1, 1, 1),
      cfg(2, 1, 2, 8, 8, 4, 256),     cfg(6, 3, 2, 5, 5, 3, 32),
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    check_kind(&cases[i], KVBM_LAYOUT_FULLY_CONTIGUOUS);
    check_kind(&cases[i], KVBM_LAYOUT_LAYER_SEPARATE);
  }
}

static void expect_reject(kvbm_layout_config c, int code, const char *needle) {
  kvbm_error e;
  kvbm_layout l;
  memset(&l, 0xab, sizeof l);
  kvbm_layout before = l;
  kvbm_error_clear(&e);
  assert_int_equal(kvbm_layout_config_validate(&c, &e), code);
  assert_int_equal(e.code, code);
  if (!strstr(e.msg, needle)) fail_msg("message \"%s\" lacks \"%s\"", e.msg, needle);
  for (int k = KVBM_LAYOUT_FULLY_CONTIGUOUS; k <= KVBM_LAYOUT_LAYER_SEPARATE; k++) {
    assert_int_equal(kvbm_layout_init(&l, (kvbm_layout_kind)k, &c, NULL), code);
    assert_memory_equal(&l, &before, sizeof l); /* untouched on failure */
  }
}

static void zero_dimensions_are_rejected_one_by_one(void **state) {
  (void)state;
  const kvbm_layout_config ok = cfg(8, 4, 2, 16, 64, 2, 256);
  static const char *const names[] = {"num_blocks", "num_layers", "outer_dim",
                                      "page_size",  "inner_dim",  "dtype_size"};
  assert_int_equal(kvbm_layout_config_validate(&ok, NULL), KVBM_OK);
  kvbm_layout_config d = kvbm_layout_config_default(8, 16);
  assert_int_equal(kvbm_layout_config_validate(&d, NULL), KVBM_OK);
  assert_true(d.num_blocks == 8 && d.page_size == 16 && d.outer_dim == 2);
  for (int i = 0; i < 6; i++) {
    kvbm_layout_config c = ok;
    uint64_t *f[] = {&c.num_blocks, &c.num_layers, &c.outer_dim,
                     &c.page_size,  &c.inner_dim,  &c.dtype_size};
    *f[i] = 0;
    expect_reject(c, KVBM_EINVAL, names[i]);
  }
  kvbm_layout_config c = ok;
  c.num_layers = KVBM_LAYOUT_MAX_LAYERS + 1;
  expect_reject(c, KVBM_EINVAL, "num_layers");
  c.num_layers = KVBM_LAYOUT_MAX_LAYERS;
  c.num_blocks = 1;
  assert_int_equal(kvbm_layout_config_validate(&c, NULL), KVBM_OK);
}

static void bad_alignments_are_rejected(void **state) {
  (void)state;
  const uint64_t bad[] = {0, 3, 6, 24, 100, 4097, (1ull << 63) + 1, UINT64_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kvbm_layout_config c = cfg(8, 4, 2, 16, 64, 2, bad[i]);
    expect_reject(c, KVBM_EINVAL, "alignment");
  }
  for (int s = 0; s < 20; s++) {
    kvbm_layout_config c = cfg(8, 4, 2, 16, 64, 2, 1ull << s);
    assert_int_equal(kvbm_layout_config_validate(&c, NULL), KVBM_OK);
  }
}

static void every_overflowing_product_is_rejected(void **state) {
  (void)state;
  /* page_size * inner_dim * dtype_size */
  expect_reject(cfg(1, 1, 1, 1ull << 32, 1ull << 32, 1, 1), KVBM_EOVERFLOW, "page_size");
  expect_reject(cfg(1, 1, 1, 1ull << 32, 1ull << 31, 2, 1), KVBM_EOVERFLOW, "dtype_size");
  /* outer_dim * slice */
  expect_reject(cfg(1, 1, 1ull << 33, 1ull << 31, 1, 1, 1), KVBM_EOVERFLOW, "outer_dim");
  /* num_layers * layer */
  expect_reject(cfg(1, 65536, 2, 1ull << 47, 1, 1, 1), KVBM_EOVERFLOW, "num_layers");
  /* align_up(block bytes) */
  expect_reject(cfg(1, 1, 1, (1ull << 63) + 1, 1, 1, 1ull << 63), KVBM_EOVERFLOW,
                "alignment");
  /* num_blocks * block_stride */
  expect_reject(cfg(1ull << 44, 32, 2, 16, 1024, 2, 256), KVBM_EOVERFLOW, "num_blocks");
  /* Fits fully contiguous (2^50 bytes) but not layer separate (2^66):
   * rejected for both kinds, see layout.c. */
  expect_reject(cfg(1ull << 30, 65536, 1, 1, 1, 1, 1ull << 20), KVBM_EOVERFLOW,
                "num_blocks");
  /* The largest that fits is accepted. */
  kvbm_layout_config big = cfg(1ull << 20, 1, 1, 1ull << 20, 1ull << 20, 1, 1);
  assert_int_equal(kvbm_layout_config_validate(&big, NULL), KVBM_OK);
  big.num_blocks = 1ull << 24;
  assert_int_equal(kvbm_layout_config_validate(&big, NULL), KVBM_EOVERFLOW);
}

static void indices_out_of_range_are_errors(void **state) {
  (void)state;
  kvbm_layout_config c = cfg(4, 3, 2, 16, 8, 2, 64);
  for (int k = KVBM_LAYOUT_FULLY_CONTIGUOUS; k <= KVBM_LAYOUT_LAYER_SEPARATE; k++) {
    kvbm_layout l;
    kvbm_slice s;
    kvbm_error e;
    assert_int_equal(kvbm_layout_init(&l, (kvbm_layout_kind)k, &c, NULL), KVBM_OK);
    assert_int_equal(kvbm_layout_slice(&l, 3, 2, 1, &s, NULL), KVBM_OK);
    assert_int_equal(kvbm_layout_slice(&l, 4, 0, 0, &s, &e), KVBM_ERANGE);
    assert_non_null(strstr(e.msg, "block 4"));
    assert_int_equal(kvbm_layout_slice(&l, UINT64_MAX, 0, 0, &s, NULL), KVBM_ERANGE);
    assert_int_equal(kvbm_layout_slice(&l, 0, 3, 0, &s, &e), KVBM_ERANGE);
    assert_non_null(strstr(e.msg, "layer 3"));
    assert_int_equal(kvbm_layout_slice(&l, 0, 0, 2, &s, &e), KVBM_ERANGE);
    assert_non_null(strstr(e.msg, "outer 2"));
    assert_int_equal(kvbm_layout_block_layer(&l, 4, 0, &s, NULL), KVBM_ERANGE);
    assert_int_equal(kvbm_layout_block_layer(&l, 0, 3, &s, NULL), KVBM_ERANGE);
    assert_int_equal(kvbm_layout_block(&l, 4, &s, NULL), KVBM_ERANGE);
    assert_int_equal(kvbm_layout_slice(NULL, 0, 0, 0, &s, NULL), KVBM_EINVAL);
    assert_int_equal(kvbm_layout_slice(&l, 0, 0, 0, NULL, NULL), KVBM_EINVAL);
    assert_int_equal(kvbm_layout_block_layer(&l, 0, 0, NULL, NULL), KVBM_EINVAL);
  }
  kvbm_layout ls;
  kvbm_slice s;
  kvbm_error e;
  assert_int_equal(kvbm_layout_init(&ls, KVBM_LAYOUT_LAYER_SEPARATE, &c, NULL), KVBM_OK);
  assert_int_equal(kvbm_layout_block(&ls, 0, &s, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "layer-separate"));
  assert_int_equal(kvbm_layout_init(&ls, (kvbm_layout_kind)3, &c, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "kind"));
  assert_int_equal(kvbm_layout_init(&ls, (kvbm_layout_kind)0, &c, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_layout_init(NULL, KVBM_LAYOUT_LAYER_SEPARATE, &c, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_layout_init(&ls, KVBM_LAYOUT_LAYER_SEPARATE, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_layout_config_validate(NULL, NULL), KVBM_EINVAL);
}

static void fingerprint_is_stable_and_tells_configs_apart(void **state) {
  (void)state;
  kvbm_layout_config c = cfg(1024, 32, 2, 16, 1024, 2, 256);
  kvbm_layout a, b;
  assert_int_equal(kvbm_layout_init(&a, KVBM_LAYOUT_FULLY_CONTIGUOUS, &c, NULL), KVBM_OK);
  assert_int_equal(kvbm_layout_init(&b, KVBM_LAYOUT_LAYER_SEPARATE, &c, NULL), KVBM_OK);
  /* Values of the documented formula, computed with python3:
   * FNV-1a 64 of b"kvbmlay1" + 8 little-endian u64s. Stored on disk, so
   * they must never change. */
  assert_int_equal(kvbm_layout_fingerprint(&a), 0xc96b29585f228faaull);
  assert_int_equal(kvbm_layout_fingerprint(&b), 0x9507330f910c15f9ull);
  /* Every field matters. */
  for (int i = 0; i < 7; i++) {
    kvbm_layout_config d = c;
    uint64_t *f[] = {&d.num_blocks, &d.num_layers, &d.outer_dim, &d.page_size,
                     &d.inner_dim,  &d.dtype_size, &d.alignment};
    *f[i] *= 2;
    kvbm_layout x;
    assert_int_equal(kvbm_layout_init(&x, KVBM_LAYOUT_FULLY_CONTIGUOUS, &d, NULL), KVBM_OK);
    assert_int_not_equal(kvbm_layout_fingerprint(&x), kvbm_layout_fingerprint(&a));
  }
  kvbm_layout a2;
  assert_int_equal(kvbm_layout_init(&a2, KVBM_LAYOUT_FULLY_CONTIGUOUS, &c, NULL), KVBM_OK);
  assert_int_equal(kvbm_layout_fingerprint(&a2), kvbm_layout_fingerprint(&a));
}

static void names(void **state) {
  (void)state;
  assert_string_equal(kvbm_layout_kind_name(KVBM_LAYOUT_FULLY_CONTIGUOUS), "fully-contiguous");
  assert_string_equal(kvbm_layout_kind_name(KVBM_LAYOUT_LAYER_SEPARATE), "layer-separate");
  assert_string_equal(kvbm_layout_kind_name(9), "?");
  assert_string_equal(kvbm_memory_type_name(KVBM_MEMORY_SYSTEM), "system");
  assert_string_equal(kvbm_memory_type_name(KVBM_MEMORY_REMOTE), "remote");
  assert_string_equal(kvbm_memory_type_name(0), "?");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_llama_like_config_has_the_documented_strides),
      cmocka_unit_test(every_slice_is_where_a_walk_puts_it),
      cmocka_unit_test(zero_dimensions_are_rejected_one_by_one),
      cmocka_unit_test(bad_alignments_are_rejected),
      cmocka_unit_test(every_overflowing_product_is_rejected),
      cmocka_unit_test(indices_out_of_range_are_errors),
      cmocka_unit_test(fingerprint_is_stable_and_tells_configs_apart),
      cmocka_unit_test(names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
