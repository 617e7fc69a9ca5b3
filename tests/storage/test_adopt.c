/* SPDX-License-Identifier: Apache-2.0 */
/* test_adopt.c: kvbm_storage_adopt() over host memory the test owns: the
 * storage addresses exactly the caller's bytes, every refusal names its
 * reason, and release leaves the memory alive and untouched. Device and
 * pinned adoption are refused without CUDA; with the toolkit but no GPU
 * they are KVBM_EDEVICE (a device run is tests/tier/test_gpu_adopt.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/storage.h"

static kvbm_layout make_layout(kvbm_layout_kind kind, uint64_t blocks) {
  kvbm_layout_config c = {.num_blocks = blocks, .num_layers = 3, .outer_dim = 2,
                          .page_size = 4, .inner_dim = 8, .dtype_size = 2, .alignment = 256};
  kvbm_layout l;
  kvbm_error e;
  if (kvbm_layout_init(&l, kind, &c, &e) != KVBM_OK) fail_msg("%s", e.msg);
  return l;
}

/* Regions of the caller, with random bytes. */
static void **alloc_regions(const kvbm_layout *l, unsigned seed) {
  void **b = calloc(l->num_regions, sizeof *b);
  assert_non_null(b);
  srand(seed);
  for (uint64_t r = 0; r < l->num_regions; r++) {
    assert_int_equal(posix_memalign(&b[r], 4096, l->region_size), 0);
    for (uint64_t i = 0; i < l->region_size; i++) ((uint8_t *)b[r])[i] = (uint8_t)rand();
  }
  return b;
}

static void free_regions(const kvbm_layout *l, void **b) {
  for (uint64_t r = 0; r < l->num_regions; r++) free(b[r]);
  free(b);
}

/* The adopted storage's slices are the caller's bytes, in place. */
static void adopt_addresses_the_callers_bytes(kvbm_layout_kind kind) {
  kvbm_layout l = make_layout(kind, 5);
  void **b = alloc_regions(&l, 7);
  uint8_t *before = malloc(l.num_regions * l.region_size);
  assert_non_null(before);
  for (uint64_t r = 0; r < l.num_regions; r++)
    memcpy(before + r * l.region_size, b[r], l.region_size);
  kvbm_storage *s = NULL;
  kvbm_error e = {0};
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_SYSTEM, 3, &l, b, l.num_regions, &s, &e),
                   KVBM_OK);
  assert_true(kvbm_storage_is_adopted(s));
  assert_string_equal(kvbm_storage_name(s), "adopted system");
  assert_int_equal(kvbm_storage_memory_type(s), KVBM_MEMORY_SYSTEM);
  assert_int_equal(kvbm_storage_device_id(s), -1); /* the id is DEVICE's only */
  assert_int_equal(kvbm_storage_num_regions(s), l.num_regions);
  assert_int_equal(kvbm_storage_region_size(s), l.region_size);
  assert_int_equal(kvbm_storage_check_layout(s, &l, &e), KVBM_OK);
  /* Adoption neither zeroes nor writes. */
  for (uint64_t r = 0; r < l.num_regions; r++) {
    assert_ptr_equal(kvbm_storage_region_base(s, r), b[r]);
    assert_memory_equal(b[r], before + r * l.region_size, l.region_size);
  }
  /* A slice address is inside the caller's region, where the layout puts it. */
  for (uint64_t blk = 0; blk < 5; blk++)
    for (uint64_t ly = 0; ly < 3; ly++) {
      void *p;
      size_t n;
      kvbm_slice sl;
      assert_int_equal(kvbm_storage_slice_ptr(s, &l, blk, ly, 1, &p, &n, &e), KVBM_OK);
      assert_int_equal(kvbm_layout_slice(&l, blk, ly, 1, &sl, &e), KVBM_OK);
      assert_ptr_equal(p, (uint8_t *)b[sl.region] + sl.offset);
      memset(p, (int)(blk * 3 + ly + 1), n);
    }
  /* Release frees the wrapper only: the memory is still the caller's,
   * readable and writable (ASan would report a use after free here). */
  uint8_t *keep = malloc(l.num_regions * l.region_size);
  assert_non_null(keep);
  for (uint64_t r = 0; r < l.num_regions; r++)
    memcpy(keep + r * l.region_size, b[r], l.region_size);
  kvbm_storage_release(s);
  for (uint64_t r = 0; r < l.num_regions; r++) {
    assert_memory_equal(b[r], keep + r * l.region_size, l.region_size);
    memset(b[r], 0xC5, l.region_size); /* a canary after release */
    assert_int_equal(((uint8_t *)b[r])[l.region_size - 1], 0xC5);
    assert_int_equal(((uint8_t *)b[r])[0], 0xC5);
  }
  free(keep);
  free(before);
  free_regions(&l, b);
}

static void adopt_fully_contiguous(void **state) {
  (void)state;
  adopt_addresses_the_callers_bytes(KVBM_LAYOUT_FULLY_CONTIGUOUS);
}

static void adopt_layer_separate(void **state) {
  (void)state;
  adopt_addresses_the_callers_bytes(KVBM_LAYOUT_LAYER_SEPARATE);
}

static void expect_refusal(int want, kvbm_memory_type m, int32_t dev, const kvbm_layout *l,
                           void *const *b, uint64_t n, const char *needle) {
  kvbm_storage *s = (kvbm_storage *)(uintptr_t)1; /* must be reset to NULL */
  kvbm_error e = {0};
  int rc = kvbm_storage_adopt(m, dev, l, b, n, &s, &e);
  if (rc != want) fail_msg("adopt: got %d (%s), want %d", rc, e.msg, want);
  assert_null(s);
  if (!strstr(e.msg, needle)) fail_msg("message '%s' lacks '%s'", e.msg, needle);
}

static void adopt_refusals(void **state) {
  (void)state;
  kvbm_layout l = make_layout(KVBM_LAYOUT_LAYER_SEPARATE, 2);
  void **b = alloc_regions(&l, 3);
  kvbm_error e = {0};
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_SYSTEM, 0, &l, b, l.num_regions, NULL, &e),
                   KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "out is NULL"));
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, NULL, b, 3, "layout is NULL");
  kvbm_layout bad = l;
  bad.region_size += 64; /* not what kvbm_layout_init made */
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &bad, b, 3, "strides");
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &l, NULL, 3, "bases is NULL");
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &l, b, 2, "2 base pointers for a layout of 3");
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &l, b, 4, "4 base pointers");
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_DISK, 0, &l, b, 3, "not system, pinned or device");
  expect_refusal(KVBM_EINVAL, (kvbm_memory_type)99, 0, &l, b, 3, "memory type 99");
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_DEVICE, -1, &l, b, 3, "device id -1 is negative");
  void *nb[3] = {b[0], NULL, b[2]};
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &l, nb, 3, "region 1's base is NULL");
  void *mis[3] = {b[0], b[1], (uint8_t *)b[2] + 128}; /* the layout wants 256 */
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &l, mis, 3, "region 2's base");
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &l, mis, 3, "not aligned to the layout's 256");
  void *wrap[3] = {b[0], b[1], (void *)(UINTPTR_MAX & ~(uintptr_t)255)};
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &l, wrap, 3, "wraps the address space");
  /* Device and pinned adoption need CUDA to vouch for the memory: never
   * trusted without it, and host memory is never device memory. */
  if (!kvbm_storage_have_cuda()) {
    expect_refusal(KVBM_EUNSUPPORTED, KVBM_MEMORY_DEVICE, 0, &l, b, 3, "needs a CUDA build");
    expect_refusal(KVBM_EUNSUPPORTED, KVBM_MEMORY_PINNED, 0, &l, b, 3, "needs a CUDA build");
  } else {
    kvbm_storage *s = NULL;
    int rc = kvbm_storage_adopt(KVBM_MEMORY_DEVICE, 0, &l, b, 3, &s, &e);
    assert_true(rc == KVBM_EDEVICE || rc == KVBM_EINVAL); /* no GPU, or not device memory */
    assert_null(s);
    rc = kvbm_storage_adopt(KVBM_MEMORY_PINNED, 0, &l, b, 3, &s, &e);
    assert_true(rc == KVBM_EDEVICE || rc == KVBM_EINVAL);
    assert_null(s);
    if (rc == KVBM_EINVAL) assert_non_null(strstr(e.msg, "not page-locked host memory"));
  }
  /* Nothing was touched by the refusals. */
  expect_refusal(KVBM_EINVAL, KVBM_MEMORY_SYSTEM, 0, &l, b, 0, "0 base pointers");
  free_regions(&l, b);
}

/* The storage kvbm allocates says it is not adopted; NULL neither. */
static void created_is_not_adopted(void **state) {
  (void)state;
  kvbm_layout l = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 2);
  kvbm_storage *s;
  kvbm_error e;
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &l, NULL, &s, &e), KVBM_OK);
  assert_false(kvbm_storage_is_adopted(s));
  assert_false(kvbm_storage_is_adopted(NULL));
  kvbm_storage_release(s);
}

/* Adopting the same memory twice gives two wrappers over the same bytes;
 * releasing both frees neither region. */
static void adopt_twice_release_both(void **state) {
  (void)state;
  kvbm_layout l = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 2);
  void **b = alloc_regions(&l, 11);
  kvbm_storage *s1, *s2;
  kvbm_error e;
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_SYSTEM, 0, &l, b, 1, &s1, &e), KVBM_OK);
  assert_int_equal(kvbm_storage_adopt(KVBM_MEMORY_SYSTEM, 0, &l, b, 1, &s2, &e), KVBM_OK);
  assert_ptr_equal(kvbm_storage_region_base(s1, 0), kvbm_storage_region_base(s2, 0));
  kvbm_storage_release(s1);
  kvbm_storage_release(s2);
  memset(b[0], 0x5A, l.region_size);
  assert_int_equal(((uint8_t *)b[0])[l.region_size / 2], 0x5A);
  free_regions(&l, b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(adopt_fully_contiguous),
      cmocka_unit_test(adopt_layer_separate),
      cmocka_unit_test(adopt_refusals),
      cmocka_unit_test(created_is_not_adopted),
      cmocka_unit_test(adopt_twice_release_both),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
