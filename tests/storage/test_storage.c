/* SPDX-License-Identifier: Apache-2.0 */
/* test_storage.c: system storage through layouts; CUDA kinds report what
 * this machine has; describing a storage for a peer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/storage.h"

/* The huge-allocation test must see ENOMEM, not a sanitizer report. */
const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
const char *__tsan_default_options(void);
__attribute__((visibility("default"))) const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }

static kvbm_layout make_layout(kvbm_layout_kind kind, kvbm_layout_config c) {
  kvbm_layout l;
  kvbm_error e;
  if (kvbm_layout_init(&l, kind, &c, &e) != KVBM_OK) fail_msg("%s", e.msg);
  return l;
}

static uint8_t pattern(uint64_t b, uint64_t l, uint64_t o, uint64_t i) {
  return (uint8_t)(b * 131 + l * 31 + o * 7 + i * 3 + 1);
}

/* Writes a distinct pattern through every slice pointer, then reads every
 * slice back: any overlap or misplaced slice shows as a wrong byte. */
static void pattern_round_trip(kvbm_layout_kind kind, kvbm_layout_config c) {
  kvbm_layout l = make_layout(kind, c);
  kvbm_storage *s;
  kvbm_error e;
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &l, NULL, &s, &e), KVBM_OK);
  kvbm_storage_config dc = kvbm_storage_config_default();
  assert_true(dc.alignment == 0 && dc.zero == 0 && dc.device_id == 0);
  assert_string_equal(kvbm_storage_name(s), "system");
  assert_int_equal(kvbm_storage_memory_type(s), KVBM_MEMORY_SYSTEM);
  assert_int_equal(kvbm_storage_device_id(s), -1);
  assert_int_equal(kvbm_storage_num_regions(s), l.num_regions);
  assert_int_equal(kvbm_storage_region_size(s), l.region_size);
  assert_int_equal(kvbm_storage_check_layout(s, &l, &e), KVBM_OK);
  for (uint64_t r = 0; r < l.num_regions; r++) {
    uintptr_t base = (uintptr_t)kvbm_storage_region_base(s, r);
    assert_true(base != 0);
    assert_int_equal(base % c.alignment, 0);
  }
  assert_null(kvbm_storage_region_base(s, l.num_regions));

  for (uint64_t b = 0; b < c.num_blocks; b++)
    for (uint64_t ly = 0; ly < c.num_layers; ly++)
      for (uint64_t o = 0; o < c.outer_dim; o++) {
        void *p;
        size_t n;
        assert_int_equal(kvbm_storage_slice_ptr(s, &l, b, ly, o, &p, &n, &e), KVBM_OK);
        assert_int_equal(n, l.outer_stride);
        /* Inside its region. */
        uint64_t r = kind == KVBM_LAYOUT_FULLY_CONTIGUOUS ? 0 : ly;
        uint8_t *base = kvbm_storage_region_base(s, r);
        assert_true((uint8_t *)p >= base && (uint8_t *)p + n <= base + l.region_size);
        if (o == 0 && (ly == 0 || kind == KVBM_LAYOUT_LAYER_SEPARATE))
          assert_int_equal((uintptr_t)p % c.alignment, 0); /* block starts aligned */
        for (size_t i = 0; i < n; i++) ((uint8_t *)p)[i] = pattern(b, ly, o, i);
      }
  for (uint64_t b = 0; b < c.num_blocks; b++)
    for (uint64_t ly = 0; ly < c.num_layers; ly++) {
      void *bl;
      size_t bn;
      assert_int_equal(kvbm_storage_block_layer_ptr(s, &l, b, ly, &bl, &bn, NULL), KVBM_OK);
      assert_int_equal(bn, c.outer_dim * l.outer_stride);
      for (uint64_t o = 0; o < c.outer_dim; o++) {
        void *p;
        size_t n;
        assert_int_equal(kvbm_storage_slice_ptr(s, &l, b, ly, o, &p, &n, NULL), KVBM_OK);
        assert_ptr_equal(p, (uint8_t *)bl + o * n);
        for (size_t i = 0; i < n; i++)
          if (((uint8_t *)p)[i] != pattern(b, ly, o, i))
            fail_msg("block %llu layer %llu outer %llu byte %zu overwritten",
                     (unsigned long long)b, (unsigned long long)ly, (unsigned long long)o, i);
      }
    }
  kvbm_storage_release(s);
}

static void slices_hold_their_own_bytes(void **state) {
  (void)state;
  const kvbm_layout_config cases[] = {
      {4, 3, 2, 16, 8, 2, 256},
      {5, 2, 1, 3, 5, 1, 64},
      {3, 4, 2, 7, 3, 4, 4096},
      {1, 1, 1, 1, 1, 1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pattern_round_trip(KVBM_LAYOUT_FULLY_CONTIGUOUS, cases[i]);
    pattern_round_trip(KVBM_LAYOUT_LAYER_SEPARATE, cases[i]);
  }
}

static void zero_and_alignment_options(void **state) {
  (void)state;
  kvbm_layout l = make_layout(KVBM_LAYOUT_LAYER_SEPARATE, (kvbm_layout_config){8, 3, 2, 16, 32, 2, 64});
  kvbm_storage_config o = {4096, 1, -1};
  kvbm_storage *s;
  kvbm_error e;
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &l, &o, &s, &e), KVBM_OK);
  for (uint64_t r = 0; r < l.num_regions; r++) {
    uint8_t *p = kvbm_storage_region_base(s, r);
    assert_int_equal((uintptr_t)p % 4096, 0);
    for (uint64_t i = 0; i < l.region_size; i++) assert_int_equal(p[i], 0);
  }
  kvbm_storage_release(s);

  const uint64_t bad[] = {32, 48, 3};
  for (size_t i = 0; i < 3; i++) {
    o.alignment = bad[i];
    s = (kvbm_storage *)&o; /* must be reset to NULL on failure */
    assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &l, &o, &s, &e), KVBM_EINVAL);
    assert_non_null(strstr(e.msg, "alignment"));
    assert_null(s);
  }
}

static void bad_queries_are_errors(void **state) {
  (void)state;
  kvbm_layout_config c = {4, 3, 2, 16, 8, 2, 256};
  kvbm_layout fc = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, c);
  kvbm_layout ls = make_layout(KVBM_LAYOUT_LAYER_SEPARATE, c);
  kvbm_storage *s;
  kvbm_error e;
  void *p = NULL;
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &fc, NULL, &s, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_slice_ptr(s, &fc, 4, 0, 0, &p, NULL, &e), KVBM_ERANGE);
  assert_int_equal(kvbm_storage_slice_ptr(s, &fc, 0, 3, 0, &p, NULL, &e), KVBM_ERANGE);
  assert_int_equal(kvbm_storage_slice_ptr(s, &fc, 0, 0, 2, &p, NULL, &e), KVBM_ERANGE);
  assert_int_equal(kvbm_storage_block_layer_ptr(s, &fc, 4, 0, &p, NULL, &e), KVBM_ERANGE);
  assert_null(p);
  /* A layout the storage cannot hold. */
  assert_int_equal(kvbm_storage_slice_ptr(s, &ls, 0, 0, 0, &p, NULL, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "regions"));
  assert_int_equal(kvbm_storage_check_layout(s, &ls, NULL), KVBM_EINVAL);
  kvbm_layout bigger = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, (kvbm_layout_config){5, 3, 2, 16, 8, 2, 256});
  assert_int_equal(kvbm_storage_slice_ptr(s, &bigger, 0, 0, 0, &p, NULL, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "region size"));
  /* A smaller layout over the same bytes is fine (a view). */
  kvbm_layout smaller = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, (kvbm_layout_config){2, 3, 2, 16, 8, 2, 256});
  assert_int_equal(kvbm_storage_slice_ptr(s, &smaller, 1, 2, 1, &p, NULL, NULL), KVBM_OK);
  /* A hand-edited layout that claims to fit cannot reach outside. */
  kvbm_layout forged_stride = fc;
  forged_stride.block_stride *= 2;
  assert_int_equal(kvbm_storage_slice_ptr(s, &forged_stride, 1, 0, 0, &p, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_storage_slice_ptr(s, &forged_stride, 2, 0, 0, &p, NULL, &e), KVBM_ERANGE);
  assert_non_null(strstr(e.msg, "outside"));
  forged_stride.block_stride = UINT64_MAX / 2;
  assert_int_equal(kvbm_storage_slice_ptr(s, &forged_stride, 3, 0, 0, &p, NULL, NULL), KVBM_ERANGE);
  assert_int_equal(kvbm_storage_slice_ptr(NULL, &fc, 0, 0, 0, &p, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_storage_slice_ptr(s, NULL, 0, 0, 0, &p, NULL, NULL), KVBM_EINVAL);
  kvbm_storage_release(s);
  kvbm_storage_release(NULL);

  /* A hand-edited layout is refused at creation. */
  kvbm_layout forged = fc;
  forged.region_size *= 2;
  s = NULL;
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &forged, NULL, &s, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "strides"));
  forged = fc;
  forged.config.alignment = 3;
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &forged, NULL, &s, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, NULL, NULL, &s, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &fc, NULL, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_storage_create((kvbm_memory_type)0, &fc, NULL, &s, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_storage_create((kvbm_memory_type)6, &fc, NULL, &s, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_DISK, &fc, NULL, &s, &e), KVBM_EUNSUPPORTED);
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_REMOTE, &fc, NULL, &s, &e), KVBM_EUNSUPPORTED);
  assert_null(s);
}

static void huge_storage_is_enomem_not_a_crash(void **state) {
  (void)state;
  /* 2^52 bytes per region: valid arithmetic, but beyond any x86-64 or
   * arm64 user address space, so it fails whatever the overcommit policy. */
  kvbm_layout l = make_layout(KVBM_LAYOUT_LAYER_SEPARATE, (kvbm_layout_config){1ull << 36, 4, 2, 16, 1024, 2, 4096});
  kvbm_storage *s = NULL;
  kvbm_error e;
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &l, NULL, &s, &e), KVBM_ENOMEM);
  assert_non_null(strstr(e.msg, "region 0"));
  assert_null(s);
}

static void cuda_kinds_say_what_this_machine_has(void **state) {
  (void)state;
  kvbm_layout l = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, (kvbm_layout_config){4, 2, 2, 16, 8, 2, 256});
  const kvbm_memory_type kinds[] = {KVBM_MEMORY_PINNED, KVBM_MEMORY_DEVICE};
  for (int i = 0; i < 2; i++) {
    kvbm_storage *s = NULL;
    kvbm_error e;
    kvbm_storage_config o = {0, 1, 0};
    int rc = kvbm_storage_create(kinds[i], &l, &o, &s, &e);
    if (!kvbm_storage_have_cuda()) {
      assert_int_equal(rc, KVBM_EUNSUPPORTED);
      assert_non_null(strstr(e.msg, "CUDA"));
      assert_null(s);
    } else if (rc == KVBM_EDEVICE) {
      /* Toolkit present, no GPU (the machines this project runs on). */
      assert_non_null(strstr(e.msg, "device"));
      assert_null(s);
    } else {
      /* A real GPU: the storage must look right. */
      assert_int_equal(rc, KVBM_OK);
      assert_int_equal(kvbm_storage_memory_type(s), kinds[i]);
      assert_int_equal(kvbm_storage_check_layout(s, &l, NULL), KVBM_OK);
      if (kinds[i] == KVBM_MEMORY_PINNED) {
        void *p;
        size_t n;
        assert_int_equal(kvbm_storage_slice_ptr(s, &l, 3, 1, 1, &p, &n, NULL), KVBM_OK);
        memset(p, 0x5a, n);
      } else {
        assert_int_equal(kvbm_storage_device_id(s), 0);
      }
      kvbm_storage_release(s);
    }
  }
}

static void describe_then_serialize_round_trip(void **state) {
  (void)state;
  kvbm_layout l = make_layout(KVBM_LAYOUT_LAYER_SEPARATE, (kvbm_layout_config){6, 4, 2, 16, 8, 2, 512});
  kvbm_storage *s;
  assert_int_equal(kvbm_storage_create(KVBM_MEMORY_SYSTEM, &l, NULL, &s, NULL), KVBM_OK);
  kvbm_layout_desc d;
  kvbm_error e;
  assert_int_equal(kvbm_storage_describe(s, &l, 42, &d, &e), KVBM_OK);
  assert_int_equal(d.memory, KVBM_MEMORY_SYSTEM);
  assert_int_equal(d.device_id, -1);
  assert_int_equal(d.block_set_id, 42);
  assert_int_equal(d.num_regions, 4);
  size_t len = kvbm_layout_desc_encoded_size(&d);
  uint8_t *buf = malloc(len);
  assert_int_equal(kvbm_layout_desc_encode(&d, buf, len, NULL, &e), KVBM_OK);
  kvbm_layout_desc back;
  assert_int_equal(kvbm_layout_desc_decode(buf, len, &back, &e), KVBM_OK);
  /* A peer can compute our slice addresses from the description alone. */
  for (uint64_t ly = 0; ly < 4; ly++) {
    kvbm_slice sl;
    void *p;
    assert_int_equal(kvbm_layout_slice(&back.layout, 5, ly, 1, &sl, NULL), KVBM_OK);
    assert_int_equal(kvbm_storage_slice_ptr(s, &l, 5, ly, 1, &p, NULL, NULL), KVBM_OK);
    assert_int_equal(back.region_base[sl.region] + sl.offset, (uint64_t)(uintptr_t)p);
  }
  kvbm_layout_desc_release(&back);
  kvbm_layout_desc_release(&d);
  free(buf);
  kvbm_layout fc = make_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, l.config);
  assert_int_equal(kvbm_storage_describe(s, &fc, 1, &d, &e), KVBM_EINVAL);
  assert_null(d.region_base);
  kvbm_storage_release(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(slices_hold_their_own_bytes),
      cmocka_unit_test(zero_and_alignment_options),
      cmocka_unit_test(bad_queries_are_errors),
      cmocka_unit_test(huge_storage_is_enomem_not_a_crash),
      cmocka_unit_test(cuda_kinds_say_what_this_machine_has),
      cmocka_unit_test(describe_then_serialize_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
