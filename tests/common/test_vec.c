/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_vec.c: the growable-array helper (common/vec.h): growth from the
 * first size by doubling, reuse while the capacity holds, the bound
 * (max_items; elem_size * n past PTRDIFF_MAX, or wrapping) refused before
 * any allocation, a failed realloc that keeps the old array, zero sizes;
 * and the exact sizings (kvbm__vec_resize, kvbm__vec_fit: a decoder's
 * array sized to the message, given back when far too large).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/vec.h"

/* The failed-allocation test must see ENOMEM, not a sanitizer report. */
const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void) {
  return "allocator_may_return_null=1";
}
const char *__tsan_default_options(void);
__attribute__((visibility("default"))) const char *__tsan_default_options(void) {
  return "allocator_may_return_null=1";
}

/* Sizes through a volatile, so that the compiler does not see a constant
 * huge realloc and warn about it (-Walloc-size-larger-than). */
static size_t opaque(size_t v) {
  volatile size_t x = v;
  return x;
}

static void test_growth_doubles_from_min(void **state) {
  (void)state;
  uint32_t *a = NULL;
  size_t cap = 0;
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 1, 8, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_non_null(a);
  assert_int_equal(cap, 8);
  for (uint32_t i = 0; i < 1000; i++) {
    assert_int_equal(kvbm__vec_reserve_of(&a, &cap, (size_t)i + 1, 8, KVBM__VEC_NO_LIMIT), KVBM_OK);
    a[i] = i; /* ASan checks the room is there */
  }
  assert_int_equal(cap, 1024); /* 8 doubled seven times */
  for (uint32_t i = 0; i < 1000; i++) assert_int_equal(a[i], i);
  /* A jump past several doublings lands on the first power that holds it. */
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 5000, 8, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 8192);
  for (uint32_t i = 0; i < 1000; i++) assert_int_equal(a[i], i); /* kept across growth */
  free(a);
}

static void test_exact_capacity_reuses(void **state) {
  (void)state;
  char *b = NULL;
  size_t cap = 0;
  assert_int_equal(kvbm__vec_reserve_of(&b, &cap, 100, 64, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 128);
  char *was = b;
  /* need == cap and need < cap: no realloc, the same array. */
  assert_int_equal(kvbm__vec_reserve_of(&b, &cap, 128, 64, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_ptr_equal(b, was);
  assert_int_equal(cap, 128);
  assert_int_equal(kvbm__vec_reserve_of(&b, &cap, 3, 64, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_ptr_equal(b, was);
  assert_int_equal(cap, 128);
  free(b);
}

static void test_max_refused_and_reached(void **state) {
  (void)state;
  uint64_t *a = NULL;
  size_t cap = 0;
  /* Past max_items: refused before any allocation. */
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 101, 16, 100), KVBM_EOVERFLOW);
  assert_null(a);
  assert_int_equal(cap, 0);
  /* Doubling stops at the bound: 16, 32, 64, then 100, not 128. */
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 65, 16, 100), KVBM_OK);
  assert_int_equal(cap, 100);
  a[99] = 7;
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 100, 16, 100), KVBM_OK);
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 101, 16, 100), KVBM_EOVERFLOW);
  assert_int_equal(cap, 100);
  assert_int_equal(a[99], 7);
  free(a);
  /* A first size above the bound is cut to it. */
  a = NULL;
  cap = 0;
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 1, 4096, 10), KVBM_OK);
  assert_int_equal(cap, 10);
  free(a);
}

static void test_overflow_refused(void **state) {
  (void)state;
  uint64_t *a = NULL;
  size_t cap = 0;
  /* 8 * need wraps size_t: refused, even with no limit of the caller's. */
  size_t wraps = SIZE_MAX / 8 + 1;
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, opaque(wraps), 8, KVBM__VEC_NO_LIMIT),
                   KVBM_EOVERFLOW);
  assert_null(a);
  assert_int_equal(cap, 0);
  assert_int_equal(kvbm__vec_reserve(&a, &cap, opaque(SIZE_MAX), opaque(SIZE_MAX), 1,
                                     KVBM__VEC_NO_LIMIT),
                   KVBM_EOVERFLOW);
  /* From a large capacity, doubling would wrap: it stops at the bound
   * instead (the request then fails in realloc, not in arithmetic). */
  struct big { char b[1 << 20]; } *g = NULL;
  size_t was = opaque((size_t)PTRDIFF_MAX / sizeof *g / 2 + 1); /* doubling passes the bound */
  size_t gcap = was;
  assert_int_equal(kvbm__vec_reserve_of(&g, &gcap, gcap + 1, 1, KVBM__VEC_NO_LIMIT), KVBM_ENOMEM);
  assert_null(g);
  assert_int_equal(gcap, was);
}

static void test_failure_keeps_old_array(void **state) {
  (void)state;
  uint8_t *b = NULL;
  size_t cap = 0;
  assert_int_equal(kvbm__vec_reserve_of(&b, &cap, 10, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  memcpy(b, "0123456789", 10);
  uint8_t *was = b;
  /* Within every bound, but more than any allocator gives. */
  assert_int_equal(kvbm__vec_reserve_of(&b, &cap, opaque(SIZE_MAX / 2), 16, KVBM__VEC_NO_LIMIT),
                   KVBM_ENOMEM);
  assert_ptr_equal(b, was);
  assert_int_equal(cap, 16);
  assert_memory_equal(b, "0123456789", 10);
  /* Still usable: the next ordinary growth works. */
  assert_int_equal(kvbm__vec_reserve_of(&b, &cap, 17, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 32);
  assert_memory_equal(b, "0123456789", 10);
  free(b);
}

static void test_zero_sizes(void **state) {
  (void)state;
  uint32_t *a = NULL;
  size_t cap = 0;
  /* need 0: nothing to do, nothing allocated. */
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 0, 8, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_null(a);
  assert_int_equal(cap, 0);
  /* min_items 0 starts at 1. */
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 1, 0, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 1);
  assert_int_equal(kvbm__vec_reserve_of(&a, &cap, 3, 0, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 4);
  /* max_items 0: any need is refused. */
  uint32_t *z = NULL;
  size_t zcap = 0;
  assert_int_equal(kvbm__vec_reserve_of(&z, &zcap, 1, 8, 0), KVBM_EOVERFLOW);
  assert_null(z);
  /* elem_size 0 and NULL arguments are the caller's mistakes. */
  assert_int_equal(kvbm__vec_reserve(&a, &cap, 9, 0, 8, KVBM__VEC_NO_LIMIT), KVBM_EINVAL);
  assert_int_equal(kvbm__vec_reserve(NULL, &cap, 9, 4, 8, KVBM__VEC_NO_LIMIT), KVBM_EINVAL);
  assert_int_equal(kvbm__vec_reserve(&a, NULL, 9, 4, 8, KVBM__VEC_NO_LIMIT), KVBM_EINVAL);
  assert_int_equal(cap, 4);
  free(a);
}

/* Two arrays kept in step with one capacity (a sequence's ids and
 * hashes): copies of the capacity grow to the same value. */
static void test_parallel_arrays(void **state) {
  (void)state;
  uint32_t *ids = NULL;
  uint64_t *h = NULL;
  size_t cap = 0;
  for (size_t need = 1; need < 300; need += 37) {
    size_t c1 = cap, c2 = cap;
    assert_int_equal(kvbm__vec_reserve_of(&ids, &c1, need, 8, KVBM__VEC_NO_LIMIT), KVBM_OK);
    assert_int_equal(kvbm__vec_reserve_of(&h, &c2, need, 8, KVBM__VEC_NO_LIMIT), KVBM_OK);
    assert_int_equal(c1, c2);
    cap = c1;
    ids[need - 1] = 1;
    h[need - 1] = 2;
  }
  free(ids);
  free(h);
}

/* resize: exactly n, up or down, the contents kept up to n; the bound and
 * a failed realloc leave everything as it was; n 0 is refused. */
static void test_resize_exact(void **state) {
  (void)state;
  uint8_t *b = NULL;
  size_t cap = 0;
  assert_int_equal(kvbm__vec_resize_of(&b, &cap, 100, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 100); /* not 128: no doubling */
  memset(b, 7, 100);
  assert_int_equal(kvbm__vec_resize_of(&b, &cap, 150, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 150);
  assert_int_equal(b[99], 7);
  assert_int_equal(kvbm__vec_resize_of(&b, &cap, 20, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 20);
  assert_int_equal(b[19], 7);
  uint8_t *was = b;
  assert_int_equal(kvbm__vec_resize_of(&b, &cap, 21, 20), KVBM_EOVERFLOW);
  assert_int_equal(kvbm__vec_resize_of(&b, &cap, opaque(SIZE_MAX / 2), KVBM__VEC_NO_LIMIT),
                   KVBM_ENOMEM);
  assert_int_equal(kvbm__vec_resize_of(&b, &cap, 0, KVBM__VEC_NO_LIMIT), KVBM_EINVAL);
  assert_ptr_equal(b, was);
  assert_int_equal(cap, 20);
  free(b);
}

/* fit: grows to exactly max(need, min_items); keeps a capacity that is
 * not far above need; gives back one above KVBM__VEC_FIT_KEEP whose need
 * fell below an eighth of it. */
static void test_fit_grows_exact_and_shrinks_far_above(void **state) {
  (void)state;
  uint64_t *a = NULL;
  size_t cap = 0;
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 0, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_null(a); /* need 0 on an empty array: nothing */
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 3, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 16);
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 17, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 17); /* exact, not 32 */
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 40000, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 40000);
  a[39999] = 1;
  uint64_t *was = a;
  /* 5000 = an eighth and more: kept, the same array. */
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 5000, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_ptr_equal(a, was);
  assert_int_equal(cap, 40000);
  a[4998] = 9;
  /* 4999 < 40000 / 8: given back, to exactly the need. */
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 4999, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 4999);
  assert_int_equal(a[4998], 9);
  /* 4999 is above KVBM__VEC_FIT_KEEP: a need of 0 shrinks it to min_items;
   * at KEEP or below nothing shrinks, however small the need. */
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 0, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, 16);
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, KVBM__VEC_FIT_KEEP, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, KVBM__VEC_FIT_KEEP);
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 1, 16, KVBM__VEC_NO_LIMIT), KVBM_OK);
  assert_int_equal(cap, KVBM__VEC_FIT_KEEP);
  /* Failures change nothing. */
  was = a;
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, 5000, 16, 4999), KVBM_EOVERFLOW);
  assert_int_equal(kvbm__vec_fit_of(&a, &cap, opaque(SIZE_MAX / 16), 16, KVBM__VEC_NO_LIMIT),
                   KVBM_ENOMEM);
  assert_int_equal(kvbm__vec_fit(&a, &cap, 5000, 0, 16, KVBM__VEC_NO_LIMIT), KVBM_EINVAL);
  assert_ptr_equal(a, was);
  assert_int_equal(cap, KVBM__VEC_FIT_KEEP);
  free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_growth_doubles_from_min),
      cmocka_unit_test(test_exact_capacity_reuses),
      cmocka_unit_test(test_max_refused_and_reached),
      cmocka_unit_test(test_overflow_refused),
      cmocka_unit_test(test_failure_keeps_old_array),
      cmocka_unit_test(test_zero_sizes),
      cmocka_unit_test(test_parallel_arrays),
      cmocka_unit_test(test_resize_exact),
      cmocka_unit_test(test_fit_grows_exact_and_shrinks_far_above),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
