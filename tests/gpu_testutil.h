/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu_testutil.h: how a GPU test (label gpu, see cmake/gpu.cmake) decides
 * whether it can run.
 *
 * kvbm_test_gpu_or_skip() returns the number of CUDA devices when this is
 * a CUDA build and a device answers. Otherwise it prints why and exits 77,
 * which ctest reports as a skip, unless KVBM_REQUIRE_GPU=1 is set (as
 * scripts/gpu-check.sh does on a lent device machine): then a missing
 * device is a failure (exit 1), so a broken driver or build cannot pass as
 * "skipped" where a GPU was promised.
 */
#ifndef KVBM_TESTS_GPU_TESTUTIL_H
#define KVBM_TESTS_GPU_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static inline void kvbm_test_gpu_skip(const char *why) {
  const char *req = getenv("KVBM_REQUIRE_GPU");
  if (req && strcmp(req, "1") == 0) {
    fprintf(stderr, "GPU required (KVBM_REQUIRE_GPU=1) but %s\n", why);
    exit(1);
  }
  fprintf(stderr, "skipped: %s\n", why);
  exit(77);
}

static inline int kvbm_test_gpu_or_skip(void) {
#ifdef KVBM_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    char why[256];
    snprintf(why, sizeof why, "no CUDA device (%s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
    kvbm_test_gpu_skip(why);
  }
  return n;
#else
  kvbm_test_gpu_skip("this build has no CUDA runtime");
  return 0;
#endif
}

#endif
