/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device.c: what this build and this machine offer on the GPU side.
 *
 * The cuda module (src/cuda/) holds kvbm's own GPU code: the copy engine
 * between device G1 and host G2 (copy.c and its kernels), and the device
 * integrity check (checksum.c). It is C against the CUDA runtime API when
 * the toolkit was found (KVBM_HAVE_CUDA), plus kernels in *.cu when nvcc
 * was found too (KVBM_HAVE_CUDA_KERNELS; cmake/library/cuda.cmake). Every
 * public call exists in every build, so callers need no #ifdef: without
 * the runtime they say KVBM_EUNSUPPORTED, without a device KVBM_EDEVICE.
 *
 * This file is the one question every caller asks first: is there a
 * device, and were the kernels built. Asking costs one
 * cudaGetDeviceCount(); CUDA's sticky error from a failed ask is cleared so
 * that a later call is judged on its own.
 */
#include "kvbm/cuda.h"

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int kvbm_cuda_available(int *devices, int *kernels, kvbm_error *err) {
  if (devices) *devices = 0;
#ifdef KVBM_HAVE_CUDA_KERNELS
  if (kernels) *kernels = 1;
#else
  if (kernels) *kernels = 0;
#endif
#ifdef KVBM_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return kvbm_error_set(err, KVBM_EDEVICE, "cuda: no CUDA device (%s)", cudaGetErrorString(e));
  }
  if (n <= 0) return kvbm_error_set(err, KVBM_EDEVICE, "cuda: no CUDA device (count 0)");
  if (devices) *devices = n;
  return KVBM_OK;
#else
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "cuda: this build has no CUDA runtime");
#endif
}
